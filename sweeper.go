package jobkeys

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
)

// SweepOutcome is the outcome of [ReduceSweep] for one key.
type SweepOutcome struct {
	// Removed lists the expired slots that were dropped (FailStale): their
	// holders stopped renewing, so record those jobs as failed.
	Removed []ActiveSlot
	// Expired lists the expired slots that were kept (Block).
	Expired []ActiveSlot
	// State is the new key state when slots were removed, else nil. It is
	// empty (and is then deleted) when nothing else was active or queued.
	State *KeyState
}

// ReduceSweep looks for slots of state whose lease expired at or before now.
// Under FailStale it drops them, reports them in Removed and counts them in
// StaleTakeoverCount, as an acquisition that takes them over would; under
// Block it keeps them and reports them in Expired. policy must come from
// [Policy.Normalize]; only its StalePolicy is read. state may be nil. Pure:
// state is not modified.
func ReduceSweep(state *KeyState, policy Policy, now time.Time) SweepOutcome {
	var out SweepOutcome
	if state == nil {
		return out
	}
	now = jsNow(now)
	for i := range state.Active {
		if !state.Active[i].LeaseExpiresAt.After(now) {
			if policy.StalePolicy == Block {
				out.Expired = append(out.Expired, state.Active[i])
			} else {
				out.Removed = append(out.Removed, state.Active[i])
			}
		}
	}
	if len(out.Removed) == 0 {
		return out
	}
	next := state.clone()
	next.Active = next.Active[:0]
	for _, slot := range state.Active {
		if slot.LeaseExpiresAt.After(now) {
			next.Active = append(next.Active, slot)
		}
	}
	next.StaleTakeoverCount += len(out.Removed)
	next.UpdatedAt = now
	out.State = next
	return out
}

// SweptSlot is an expired slot a sweep found, with the key it was found in.
type SweptSlot struct {
	KVKey      string     // the key the slot was on
	DisplayKey string     // display key
	Slot       ActiveSlot // the expired slot
}

// SweepReport is what one sweep found and did.
type SweepReport struct {
	// Keys is how many keys were examined.
	Keys int
	// Removed lists the expired slots that were dropped (FailStale): record
	// those jobs as failed.
	Removed []SweptSlot
	// Expired lists the expired slots that were kept (Block).
	Expired []SweptSlot
	// Deleted is how many keys were deleted because the sweep left them
	// with nothing active or queued.
	Deleted int
}

// Sweep removes the slots of crashed workers from the job type's keys: it
// walks them and applies [ReduceSweep] to each with a compare-and-swap, so
// that queued jobs can run without waiting for another acquisition to take
// the stale slots over, and reports what it removed, kept and deleted. Any
// number of processes may sweep the same keys. The coordinator's store must
// list keys (implement [ListableStore], as [NATSStore] and [MemoryStore] do);
// otherwise Sweep returns an error wrapping [ErrInvalidRequest].
//
// A key whose state is corrupt, belongs to another key, or cannot be read
// or written is left as it is; the sweep goes on with the other keys and
// the returned error joins one error per such key, each naming it (a
// [*StateError] for bad state). When ctx ends, Sweep stops and returns what
// it did so far with an error wrapping ctx.Err() (joined with the errors of
// the keys before).
//
// A coordinator whose clock is proven too far from the NATS server's
// does not sweep: it returns an error wrapping [ErrClockSkew] and touches
// no key. Its clock may take live leases for expired ones (see
// [ErrClockSkew]).
//
// By default a slot goes as soon as its lease expired by the coordinator's
// clock; [WithSweepMargin] keeps it until its lease expired a margin ago.
// An option that is not valid (a negative margin) is an error wrapping
// [ErrInvalidRequest], and nothing is read or written.
func (jt *JobType) Sweep(ctx context.Context, opts ...SweepOption) (rep SweepReport, err error) {
	defer jt.coord.obs.swept(ctx, jt, jt.coord.obs.begin(), &rep, &err)
	cfg, err := newSweepConfig(opts)
	if err != nil {
		return rep, err
	}
	lister, err := jt.lister()
	if err != nil {
		return rep, err
	}
	if err := jt.sweepClockSkew(ctx, cfg.margin); err != nil {
		return rep, err
	}
	keys, err := lister.ListKeys(ctx, jt.service, jt.name)
	if err != nil {
		if ctx.Err() != nil {
			return rep, ctx.Err()
		}
		return rep, fmt.Errorf("jobkeys: sweep job type %q of service %q: %w", jt.name, jt.service, err)
	}
	var errs []error
	for _, kvKey := range keys {
		if err := ctx.Err(); err != nil {
			return rep, errors.Join(append(errs, err)...)
		}
		rep.Keys++
		key, err := parseKVKey(kvKey, jt.service, jt.name)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		var out SweepOutcome
		err = jt.coord.update(ctx, key, false, func(st *KeyState, now time.Time) *KeyState {
			out = ReduceSweep(st, jt.policy, now.Add(-cfg.margin))
			if out.State != nil && cfg.margin != 0 {
				// The state was changed now, not at the cutoff.
				out.State.UpdatedAt = jsNow(now)
			}
			if out.State != nil {
				key.DisplayKey = out.State.DisplayKey
			} else if st != nil {
				key.DisplayKey = st.DisplayKey
			}
			return out.State
		})
		if err != nil {
			if ctx.Err() != nil {
				return rep, errors.Join(append(errs, ctx.Err())...)
			}
			var se *StateError
			if !errors.As(err, &se) {
				err = fmt.Errorf("jobkeys: sweep KV key %q: %w", kvKey, err)
			}
			errs = append(errs, err)
			continue
		}
		for _, slot := range out.Removed {
			rep.Removed = append(rep.Removed, SweptSlot{KVKey: kvKey, DisplayKey: key.DisplayKey, Slot: slot})
		}
		for _, slot := range out.Expired {
			rep.Expired = append(rep.Expired, SweptSlot{KVKey: kvKey, DisplayKey: key.DisplayKey, Slot: slot})
		}
		if out.State != nil && out.State.Empty() {
			rep.Deleted++
		}
	}
	return rep, errors.Join(errs...)
}

// SweepOption changes how [JobType.Sweep] (and a [Sweeper]) sweeps.
type SweepOption interface {
	applySweep(c sweepConfig) sweepConfig // as AdmitOption's applyAdmit
}

// sweepConfig is what the options of one sweep set.
type sweepConfig struct {
	margin time.Duration // WithSweepMargin; 0: none
}

type sweepMarginOption time.Duration

func (o sweepMarginOption) applySweep(c sweepConfig) sweepConfig {
	c.margin = time.Duration(o)
	return c
}

// WithSweepMargin makes a sweep keep every slot whose lease expired less
// than margin ago by the coordinator's clock (Config.Now): it removes
// (FailStale) or reports as expired (Block) only the slots whose lease
// expired margin ago or more. A margin tolerates clock skew: a sweeping
// host whose clock runs up to margin ahead of a worker's takes none of
// that worker's live leases for expired ones, beyond what the policy's
// leases already tolerate (see [ErrClockSkew]); so a sweep with a margin
// refuses only while the coordinator's clock is proven
// (HeartbeatTTL − HeartbeatInterval)/2 + margin or more from the NATS
// server's. The keys are written as by a sweep without one (updatedAt is
// the time of the sweep). margin must not be negative; 0 is the default,
// a sweep of every expired slot.
func WithSweepMargin(margin time.Duration) SweepOption { return sweepMarginOption(margin) }

// newSweepConfig applies opts, and checks what they set.
func newSweepConfig(opts []SweepOption) (sweepConfig, error) {
	var c sweepConfig
	for _, o := range opts {
		if o == nil {
			return c, fmt.Errorf("%w: sweep option is nil", ErrInvalidRequest)
		}
		c = o.applySweep(c)
	}
	if c.margin < 0 {
		return c, fmt.Errorf("%w: sweep margin %v is negative (WithSweepMargin)", ErrInvalidRequest, c.margin)
	}
	return c, nil
}

// sweepClockSkew returns the error that refuses a sweep with margin while
// the coordinator's clock is proven clockSkewLimit + margin or more from
// the server's (see WithSweepMargin), else nil. Without a margin it is the
// check of every acquisition (clockSkew).
func (jt *JobType) sweepClockSkew(ctx context.Context, margin time.Duration) error {
	what := fmt.Sprintf("sweep of job type %q of service %q", jt.name, jt.service)
	if margin == 0 {
		if refuse := jt.coord.clockSkew(ctx, jt.service, jt.policy); refuse != nil {
			return refuse(what)
		}
		return nil
	}
	if jt.coord.cfg.IgnoreClockSkew {
		return nil
	}
	b := jt.coord.clockBounds(ctx, jt.service)
	limit := clockSkewLimit(jt.policy)
	if margin > math.MaxInt64-limit {
		limit = math.MaxInt64 // a margin of centuries: no bound is reached
	} else {
		limit += margin
	}
	got := b.minAbs()
	if got == 0 || got < limit {
		return nil
	}
	dir := "behind"
	if b.hasHi && b.hi < 0 {
		dir = "ahead of"
	}
	return fmt.Errorf("%w: %s refused, nothing written: this host's clock (Config.Now) is at least %v %s the clock of the NATS server of service %q's bucket (offset server − local %s); a sweep with margin %v of leases of HeartbeatTTL %v and HeartbeatInterval %v is refused from %v off the server's clock (fix the host's time sync, or set Config.IgnoreClockSkew if the server's clock is the one that is wrong)",
		ErrClockSkew, what, got, dir, jt.service, b, margin, jt.policy.HeartbeatTTL, jt.policy.HeartbeatInterval, limit)
}

// lister returns the coordinator's store as a ListableStore, or an error saying
// it cannot list keys.
func (jt *JobType) lister() (ListableStore, error) {
	lister, ok := jt.coord.store.(ListableStore)
	if !ok {
		return nil, fmt.Errorf("%w: store %T cannot list keys (it does not implement ListableStore)", ErrInvalidRequest, jt.coord.store)
	}
	return lister, nil
}

// Sweeper sweeps one job type's keys ([JobType.Sweep]) now and then, so
// that the slots of crashed workers are removed from keys nobody asks for.
// Create it with [NewSweeper] and call [Sweeper.Run]; one per job type and
// process is plenty, and several processes may sweep the same keys. A
// Sweeper holds no state of its own and is safe for concurrent use (two Runs
// of one Sweeper call its report function concurrently). The zero value is
// not usable.
type Sweeper struct {
	jt       *JobType
	interval time.Duration
	report   func(SweepReport, error)
	opts     []SweepOption
}

// NewSweeper returns a sweeper of jt's keys every interval, which reports
// the outcome of every sweep to report. report must not be nil, since it is
// the only way to learn which jobs lost their slots; it is called from
// Run's goroutine. jt's coordinator's store must list keys (implement
// [ListableStore]). Every sweep takes opts (see [JobType.Sweep]); an
// option that is not valid is an error wrapping [ErrInvalidRequest] here.
func NewSweeper(jt *JobType, interval time.Duration, report func(SweepReport, error), opts ...SweepOption) (*Sweeper, error) {
	switch {
	case jt == nil:
		return nil, fmt.Errorf("%w: job type is nil", ErrInvalidRequest)
	case interval <= 0:
		return nil, fmt.Errorf("%w: sweep interval %v is not positive", ErrInvalidRequest, interval)
	case report == nil:
		return nil, fmt.Errorf("%w: sweep report function is nil", ErrInvalidRequest)
	}
	if _, err := newSweepConfig(opts); err != nil {
		return nil, err
	}
	if _, err := jt.lister(); err != nil {
		return nil, err
	}
	return &Sweeper{jt: jt, interval: interval, report: report, opts: slices.Clone(opts)}, nil
}

// Run sweeps now and then every interval until ctx ends, and returns
// ctx.Err(). Every sweep is reported, one that ctx cut short included (its
// error then wraps ctx.Err()): the slots it removed are known to nobody
// else.
func (s *Sweeper) Run(ctx context.Context) error {
	t := time.NewTicker(s.interval)
	defer t.Stop()
	for {
		s.report(s.jt.Sweep(ctx, s.opts...))
		if ctx.Err() != nil {
			return ctx.Err()
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

// parseKVKey splits a KV key of service's bucket into its job key; a key
// that is not <service>.<jobType>.<key hash> is reported as foreign.
func parseKVKey(kvKey, service, jobType string) (JobKey, error) {
	hash, ok := strings.CutPrefix(kvKey, service+"."+jobType+".")
	if !ok || !isKeyHash(hash) {
		return JobKey{}, &StateError{KVKey: kvKey, Err: ErrForeignState,
			Reason: fmt.Sprintf("not a key state key of job type %q of service %q (<service>.<jobType>.<64 lowercase hex digits>)", jobType, service)}
	}
	return JobKey{Service: service, JobType: jobType, KeyHash: hash, KVKey: kvKey}, nil
}
