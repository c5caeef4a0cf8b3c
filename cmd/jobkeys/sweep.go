package main

import (
	"context"
	"fmt"
	"time"

	"github.com/jobkeys/jobkeys"
)

// skewMarginDefault is the default of "keys sweep --skew-margin": the clock
// skew between hosts that leases of the library's default policy tolerate,
// jobkeys.HeartbeatTTLDefault − jobkeys.HeartbeatIntervalDefault (90s).
const skewMarginDefault = jobkeys.HeartbeatTTLDefault - jobkeys.HeartbeatIntervalDefault

const sweepHelp = `Lists the slots whose lease expired at least --skew-margin ago by this
host's clock (the lease expiry is in the state: no TTL is needed) and, once
confirmed, sweeps the job type's keys as the library's FailStale sweep with
that margin does (JobType.Sweep with WithSweepMargin), whatever the job
type's StalePolicy: each key is read again and the slots then expired at
least --skew-margin ago are removed with a compare-and-swap on the revision
read. Their jobs lost their slots: record them as failed (the removed slots
are listed; a slot that expired after the listing may be among them). A
corrupt key is left as it is and reported (exit code 5) once the others are
swept.

Clock skew: a lease expiry is a time of the worker that wrote it, compared
here with this host's clock. The sweep removes no live slot while this
host's clock runs less than --skew-margin ahead of the workers' clocks.
The default, 90s, is the skew the leases of the library's default policy
tolerate (HeartbeatTTL 120s − HeartbeatInterval 30s). The library itself
takes a slot over as soon as its lease expires, and relies on every host
refusing to acquire or sweep while its clock is (HeartbeatTTL −
HeartbeatInterval)/2 or more from the NATS server's; the CLI does not know
the job type's policy, so it keeps the margin instead, and checks its own
clock with it: while this host's clock is proven --skew-margin/2 or more
ahead of the server's, it refuses to sweep or list (exit code 1, nothing
written). A clock behind only keeps slots longer. Slots expired less than
the margin ago are listed as kept; --skew-margin 0 removes every expired
slot, as the library's sweep does.`

// sweptJSON is an expired slot in "keys sweep --json".
type sweptJSON struct {
	KVKey          string  `json:"kvKey"`
	Key            string  `json:"key"`
	JobID          string  `json:"jobId"`
	InstanceID     string  `json:"instanceId"`
	LeaseExpiresAt *string `json:"leaseExpiresAt"`
}

func toSweptJSON(kvKey, displayKey string, sl jobkeys.ActiveSlot) sweptJSON {
	return sweptJSON{KVKey: kvKey, Key: displayKey, JobID: sl.JobID, InstanceID: sl.InstanceID, LeaseExpiresAt: jsonTime(sl.LeaseExpiresAt)}
}

func keysSweep(ctx context.Context, c *cli, o *options, service, jobType string, dryRun bool, margin time.Duration) error {
	if margin < 0 {
		return usagef("--skew-margin %v is negative", margin)
	}
	s, err := c.connect(ctx, o)
	if err != nil {
		return err
	}
	defer s.close(ctx)
	rctx, cancel := withTimeout(ctx, o)
	defer cancel()
	infos, err := s.coord.InspectKeys(rctx, service, jobType)
	if err != nil {
		return err
	}
	if err := sweepClockCheck(rctx, s.coord, service, margin); err != nil {
		return err
	}
	var expired, kept []sweptJSON
	keys := map[string]bool{}
	for _, k := range infos {
		if k.State == nil {
			continue
		}
		for _, sl := range k.State.Active {
			switch {
			case sweepable(sl, k.ReadAt, margin):
				expired = append(expired, toSweptJSON(k.KVKey, k.DisplayKey, sl))
				keys[k.KVKey] = true
			case !sl.LeaseExpiresAt.After(k.ReadAt):
				kept = append(kept, toSweptJSON(k.KVKey, k.DisplayKey, sl))
			}
		}
	}
	now := c.clock()()
	printSlots := func(title string, slots []sweptJSON) {
		fmt.Fprintln(c.stdout, title)
		tw := c.table()
		fmt.Fprintln(tw, "  KEY\tJOB\tINSTANCE\tLEASE EXPIRED\tKV KEY")
		for _, sl := range slots {
			exp, _ := time.Parse(time.RFC3339Nano, *sl.LeaseExpiresAt)
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s ago\t%s\n", sl.Key, sl.JobID, sl.InstanceID, roundDur(now.Sub(exp)), sl.KVKey)
		}
		tw.Flush()
	}
	printKept := func() {
		if len(kept) > 0 && !o.json {
			printSlots(fmt.Sprintf("%s expired less than --skew-margin %v ago (kept):", plural(len(kept), "slot"), margin), kept)
		}
	}
	if len(expired) == 0 || dryRun {
		if o.json {
			return c.printJSON(map[string]any{"keys": len(infos), "skewMarginSeconds": margin.Seconds(), "expired": nonNil(expired),
				"kept": nonNil(kept), "removed": []sweptJSON{}, "deletedKeys": 0})
		}
		if len(expired) == 0 {
			fmt.Fprintf(c.stdout, "no expired slots in %d keys (expired --skew-margin %v ago or more)\n", len(infos), margin)
			printKept()
			return nil
		}
		printSlots(fmt.Sprintf("%s in %d of %d keys (dry run: nothing removed):", plural(len(expired), "expired slot"), len(keys), len(infos)), expired)
		printKept()
		return nil
	}
	if !o.json {
		printSlots(fmt.Sprintf("%s in %d of %d keys:", plural(len(expired), "expired slot"), len(keys), len(infos)), expired)
		printKept()
	}
	if err := c.confirm(o, fmt.Sprintf("Remove %s from %d keys of %s/%s?", plural(len(expired), "expired slot"), len(keys), service, jobType)); err != nil {
		return err
	}
	removed := []sweptJSON{}
	// sweepErr joins an error per key not swept; a corrupt key's names it
	// (exit code 5).
	rep, sweepErr := sweepMargin(ctx, s, service, jobType, margin, c.clock())
	for _, sl := range rep.Removed {
		removed = append(removed, toSweptJSON(sl.KVKey, sl.DisplayKey, sl.Slot))
	}
	deleted := rep.Deleted
	if o.json {
		if err := c.printJSON(map[string]any{"keys": len(infos), "skewMarginSeconds": margin.Seconds(), "expired": expired,
			"kept": nonNil(kept), "removed": removed, "deletedKeys": deleted}); err != nil {
			return err
		}
	} else {
		fmt.Fprintf(c.stdout, "removed %s; %d keys left empty were deleted; record their jobs as failed:\n", plural(len(removed), "expired slot"), deleted)
		for _, r := range removed {
			fmt.Fprintf(c.stdout, "  %s (instance %s, key %s)\n", r.JobID, r.InstanceID, r.Key)
		}
	}
	return sweepErr
}

// sweepable reports whether the sweep removes sl at now: its lease expired
// margin ago or more.
func sweepable(sl jobkeys.ActiveSlot, now time.Time, margin time.Duration) bool {
	return !sl.LeaseExpiresAt.Add(margin).After(now)
}

// sweepClockCheck refuses a sweep while this host's clock is proven margin/2
// or more ahead of the clock of the NATS server of service's bucket (see
// sweepHelp): such a host may be the whole margin ahead of a worker.
func sweepClockCheck(ctx context.Context, coord *jobkeys.KeyCoordinator, service string, margin time.Duration) error {
	off, err := coord.ClockOffset(ctx, service)
	if err != nil {
		return err
	}
	// off is server − local: this host is ahead by at least −off.Max.
	if !off.MaxKnown || off.Max >= 0 || -off.Max < margin/2 {
		return nil
	}
	return fmt.Errorf("%w: sweep refused, nothing written: this host's clock is at least %v ahead of the clock of the NATS server of service %q's bucket, and a sweep with --skew-margin %v needs it less than %v ahead (fix this host's time sync, or sweep from another host)",
		jobkeys.ErrClockSkew, -off.Max, service, margin, margin/2)
}

// sweepMargin sweeps the keys of service's jobType with the library's
// sweep (jobkeys.JobType.Sweep) under margin: it removes the slots whose
// lease expired margin ago or more by now, whatever the job type's
// StalePolicy, with a compare-and-swap per key (attempts bounded, a key
// whose state changed is read again), and deletes the keys it leaves
// empty. A corrupt key is left as it is and reported in the error (with
// one error per other key it could not sweep). It checks this host's
// clock first (sweepClockCheck, again: the listing's check may be a
// confirmation old), and the library's own check, which knows only the
// default policy, is off: the CLI does not know the job type's policy.
func sweepMargin(ctx context.Context, s *session, service, jobType string, margin time.Duration, now func() time.Time) (jobkeys.SweepReport, error) {
	rctx, cancel := context.WithTimeout(ctx, s.timeout)
	err := sweepClockCheck(rctx, s.coord, service, margin)
	cancel()
	if err != nil {
		return jobkeys.SweepReport{}, err
	}
	coord, err := jobkeys.NewCoordinator(s.keys, &jobkeys.Config{InstanceID: "jobkeys-cli", Now: now, IgnoreClockSkew: true})
	if err != nil {
		return jobkeys.SweepReport{}, err
	}
	// The sweep reads only the policy's StalePolicy; the key template
	// derives nothing here.
	jt, err := coord.JobType(service, jobType, jobkeys.Policy{Key: []string{"sweep"}, StalePolicy: jobkeys.FailStale})
	if err != nil {
		return jobkeys.SweepReport{}, err
	}
	// Each request is bounded by --timeout (the JetStream context's
	// default), not the whole sweep.
	return jt.Sweep(ctx, jobkeys.WithSweepMargin(margin))
}
