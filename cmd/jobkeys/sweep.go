package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jobkeys/jobkeys"
)

// skewMarginDefault is the default of "keys sweep --skew-margin": the clock
// skew between hosts that leases of the library's default policy tolerate,
// jobkeys.HeartbeatTTLDefault − jobkeys.HeartbeatIntervalDefault (90s).
const skewMarginDefault = jobkeys.HeartbeatTTLDefault - jobkeys.HeartbeatIntervalDefault

// sweepAttempts bounds the compare-and-swaps of one key's sweep: a key
// that changes under every one of them is reported, not swept.
const sweepAttempts = 5

const sweepHelp = `Lists the slots whose lease expired at least --skew-margin ago by this
host's clock (the lease expiry is in the state: no TTL is needed) and, once
confirmed, removes them with a compare-and-swap per key on the revision
read, whatever the job type's StalePolicy (as the library's FailStale sweep
does). Their jobs lost their slots: record them as failed. A corrupt key is
left as it is and reported (exit code 5) once the others are swept.

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
	deleted := 0
	var errs []error
	for _, k := range infos {
		if k.Corrupt() {
			errs = append(errs, k.Problem) // names the KV key; exit code 5
			continue
		}
		if !keys[k.KVKey] {
			continue
		}
		wctx, cancel := withTimeout(ctx, o)
		slots, gone, err := sweepKey(wctx, s.coord, service, k.KVKey, k.Inspection, margin, c.clock())
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				errs = append(errs, ctx.Err())
				break
			}
			errs = append(errs, err)
			continue
		}
		for _, sl := range slots {
			removed = append(removed, toSweptJSON(k.KVKey, k.DisplayKey, sl))
		}
		if gone {
			deleted++
		}
	}
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
	return errors.Join(errs...)
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

// sweepKey removes the slots of the key at kvKey whose lease expired margin
// ago or more, starting from the inspection in, with a compare-and-swap
// (Repair) on the revision read; the key is deleted when nothing is left in
// it. A key that changed is read again, up to sweepAttempts times. It
// returns the slots removed and whether the key was deleted.
func sweepKey(ctx context.Context, coord *jobkeys.KeyCoordinator, service, kvKey string, in jobkeys.Inspection, margin time.Duration,
	now func() time.Time) ([]jobkeys.ActiveSlot, bool, error) {
	for attempt := 1; ; attempt++ {
		switch {
		case in.Revision == 0:
			return nil, false, nil // deleted meanwhile
		case in.State == nil:
			return nil, false, in.Problem
		}
		at := now()
		out := jobkeys.ReduceSweep(in.State, jobkeys.Policy{StalePolicy: jobkeys.FailStale}, at.Add(-margin))
		if len(out.Removed) == 0 {
			return nil, false, nil // renewed or released meanwhile
		}
		next := out.State
		next.UpdatedAt = at.UTC().Truncate(time.Millisecond) // not the shifted time ReduceSweep wrote
		rep, err := coord.Repair(ctx, jobkeys.RepairRequest{Service: service, KVKey: kvKey, Revision: in.Revision, Replacement: next})
		if err == nil {
			return out.Removed, rep.Deleted, nil
		}
		if !errors.Is(err, jobkeys.ErrRevisionConflict) || attempt == sweepAttempts {
			return nil, false, fmt.Errorf("sweep KV key %q (attempt %d of %d): %w", kvKey, attempt, sweepAttempts, err)
		}
		if in, err = coord.Inspect(ctx, service, kvKey); err != nil {
			return nil, false, fmt.Errorf("sweep KV key %q: read it again: %w", kvKey, err)
		}
	}
}
