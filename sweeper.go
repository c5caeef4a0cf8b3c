package jobkeys

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Sweep is the outcome of [ReduceSweep] for one key.
type Sweep struct {
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
func ReduceSweep(state *KeyState, policy Policy, now time.Time) Sweep {
	var out Sweep
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

// SweepRequest selects the keys a [Sweeper] sweeps: those of one job type of
// one service, under that job type's policy.
type SweepRequest struct {
	Service string // the service whose bucket is swept
	JobType string // the job type whose keys are swept
	Policy  Policy // the job type's policy; its StalePolicy decides
}

// SweptSlot is an expired slot a sweep found, with the key it was found in.
type SweptSlot struct {
	KVKey string     // the key the slot was on
	Key   string     // display key
	Slot  ActiveSlot // the expired slot
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

// Sweeper removes the slots of crashed workers: it walks a service's keys and
// applies [ReduceSweep] to each through the coordinator's compare-and-swap
// loop, so that queued jobs can run without waiting for another acquisition
// to take the stale slots over. Create it with [NewSweeper]. It is safe for
// concurrent use, and several processes may sweep the same keys.
type Sweeper struct {
	coord  *KeyCoordinator
	lister KeyLister
}

// NewSweeper returns a sweeper over coord, whose store must implement
// [KeyLister] (as [NATSStore] and [MemoryStore] do).
func NewSweeper(coord *KeyCoordinator) (*Sweeper, error) {
	if coord == nil {
		return nil, fmt.Errorf("%w: coordinator is nil", ErrInvalidRequest)
	}
	lister, ok := coord.store.(KeyLister)
	if !ok {
		return nil, fmt.Errorf("%w: store %T cannot list keys (it does not implement KeyLister)", ErrInvalidRequest, coord.store)
	}
	return &Sweeper{coord: coord, lister: lister}, nil
}

// Sweep sweeps req's keys once and reports what it removed, kept and
// deleted. A key whose state is corrupt, belongs to another key, or cannot
// be read or written is left as it is; the sweep goes on with the other keys
// and the returned error joins one error per such key, each naming it (a
// [*StateError] for bad state). When ctx ends, Sweep stops and returns what
// it did so far with an error wrapping ctx.Err() (joined with the errors of
// the keys before).
func (s *Sweeper) Sweep(ctx context.Context, req SweepRequest) (SweepReport, error) {
	var rep SweepReport
	policy, err := req.Policy.Normalize()
	if err != nil {
		return rep, err
	}
	if err := validateJobType(req.JobType); err != nil {
		return rep, err
	}
	keys, err := s.lister.ListKeys(ctx, req.Service, req.JobType)
	if err != nil {
		return rep, fmt.Errorf("jobkeys: sweep job type %q of service %q: %w", req.JobType, req.Service, err)
	}
	var errs []error
	for _, kvKey := range keys {
		if err := ctx.Err(); err != nil {
			return rep, errors.Join(append(errs, err)...)
		}
		rep.Keys++
		key, err := parseKVKey(kvKey, req.Service, req.JobType)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		var out Sweep
		err = s.coord.update(ctx, key, false, func(st *KeyState, now time.Time) *KeyState {
			out = ReduceSweep(st, policy, now)
			if out.State != nil {
				key.Key = out.State.Key
			} else if st != nil {
				key.Key = st.Key
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
			rep.Removed = append(rep.Removed, SweptSlot{KVKey: kvKey, Key: key.Key, Slot: slot})
		}
		for _, slot := range out.Expired {
			rep.Expired = append(rep.Expired, SweptSlot{KVKey: kvKey, Key: key.Key, Slot: slot})
		}
		if out.State != nil && out.State.Empty() {
			rep.Deleted++
		}
	}
	return rep, errors.Join(errs...)
}

// Run sweeps req's keys now and then every interval until ctx ends, and
// returns ctx.Err(). report is called with the outcome of every sweep (from
// Run's goroutine), a sweep that ctx cut short included (its error then
// wraps ctx.Err()); it must not be nil, since it is the only way to learn
// which jobs lost their slots.
func (s *Sweeper) Run(ctx context.Context, req SweepRequest, interval time.Duration, report func(SweepReport, error)) error {
	if interval <= 0 {
		return fmt.Errorf("%w: sweep interval %v is not positive", ErrInvalidRequest, interval)
	}
	if report == nil {
		return fmt.Errorf("%w: sweep report function is nil", ErrInvalidRequest)
	}
	if _, err := req.Policy.Normalize(); err != nil {
		return err
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		rep, err := s.Sweep(ctx, req)
		// A sweep cut short by ctx is reported too: the slots it removed
		// are known to nobody else.
		report(rep, err)
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
