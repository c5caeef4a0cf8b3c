package jobkeys

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Operator operations work on a KV key as listed or watched, without the
// job's payload or policy: for the cases the normal operations cannot
// reach, a producer that died between Admit and publishing its job (a queue
// entry whose job never arrives blocks its key), and a value that cannot be
// read (the coordinator never overwrites what it cannot read). Each is a
// compare-and-swap and honours ctx; they go through the key's lane like
// every other operation of the coordinator.

// QueueEntryRef names one queued job by where it is stored.
type QueueEntryRef struct {
	Service string // the service whose bucket holds the key
	KVKey   string // the KV key, "<service>.<jobType>.<keyHash>"
	JobID   string // the queued job
}

// RemoveQueuedEntry removes the queued job ref.JobID from the key stored at
// ref.KVKey, or reports [KindNotFound] when it is not queued there. Unlike
// RemoveQueued it needs no payload or policy, so an operator can clear an
// entry whose job is gone. State that cannot be read is an error (see
// [KeyCoordinator.Repair]).
func (c *KeyCoordinator) RemoveQueuedEntry(ctx context.Context, ref QueueEntryRef) (Removal, error) {
	key, err := operatorKey(ref.Service, ref.KVKey)
	if err != nil {
		return Removal{}, err
	}
	if ref.JobID == "" {
		return Removal{}, fmt.Errorf("%w: JobID is empty", ErrInvalidRequest)
	}
	var out Removal
	defer c.obs.end(ctx, metricOpRemove, &key, c.obs.begin(), &out.Kind, &err)
	err = c.update(ctx, key, false, func(st *KeyState, now time.Time) *KeyState {
		out = ReduceRemoveQueued(st, ref.JobID, now)
		return out.State
	})
	if err != nil {
		return Removal{}, err
	}
	return out, nil
}

// Inspection is what a KV key holds, as an operator sees it before a
// repair.
type Inspection struct {
	// Revision is the value's revision; pass it to Repair. 0 when the key
	// is absent.
	Revision uint64
	Value    []byte    // the stored bytes; nil when the key is absent
	State    *KeyState // the value as key state; nil when absent or unusable
	// Problem says why the value cannot be used: an error wrapping
	// [ErrCorruptState] or [ErrForeignState]. Nil when State is set or the
	// key is absent.
	Problem error
}

// Inspect reads the KV key kvKey of service's bucket as it is, whether or
// not it holds usable key state. A missing key is an Inspection with
// Revision 0, not an error.
func (c *KeyCoordinator) Inspect(ctx context.Context, service, kvKey string) (Inspection, error) {
	key, err := operatorKey(service, kvKey)
	if err != nil {
		return Inspection{}, err
	}
	value, rev, err := c.store.Get(ctx, key.Service, key.KVKey)
	switch {
	case errors.Is(err, ErrKeyNotFound):
		return Inspection{}, nil
	case err != nil && ctx.Err() != nil:
		return Inspection{}, ctx.Err()
	case err != nil:
		return Inspection{}, err
	}
	in := Inspection{Revision: rev, Value: value}
	in.State, in.Problem = decodeFor(key, value, rev)
	return in, nil
}

// RepairRequest asks to replace or delete the value of a KV key that the
// operator inspected.
type RepairRequest struct {
	Service string // the service whose bucket holds the key
	KVKey   string // the KV key, "<service>.<jobType>.<keyHash>"
	// Revision is the revision the operator inspected (Inspection.Revision):
	// the repair applies only while the key is still at it, so nothing is
	// overwritten that the operator did not see. Required.
	Revision uint64
	// Replacement is the state to write instead. Its Service, JobType and
	// KeyHash must be the KV key's. Nil, or a state without slots or queued
	// jobs, deletes the value.
	Replacement *KeyState
}

// RepairOutcome says what a repair changed.
type RepairOutcome struct {
	Previous []byte // the value that was replaced or deleted
	Deleted  bool   // the value was deleted
	// Revision is the replacement's revision; 0 when the value was deleted.
	Revision uint64
}

// Repair replaces or deletes the value of req.KVKey, whatever it holds,
// with a compare-and-swap on req.Revision: the explicit operation for state
// the coordinator refuses to overwrite (corrupt, or another key's). When
// the key is no longer at req.Revision nothing is written and the error
// wraps [ErrRevisionConflict]: inspect it again. Deleting state that holds
// live slots lets their jobs' keys run more jobs than MaxActive until
// those jobs finish; the operator decides. A replacement that leaves
// slots free wakes the queued jobs they are for, as any write does
// (targeted wake-ups included, see [WithWakeUps]).
func (c *KeyCoordinator) Repair(ctx context.Context, req RepairRequest) (_ RepairOutcome, err error) {
	defer c.obs.repaired(ctx, req.Service, req.KVKey, c.obs.begin(), req.Replacement == nil || req.Replacement.Empty(), &err)
	key, err := operatorKey(req.Service, req.KVKey)
	if err != nil {
		return RepairOutcome{}, err
	}
	if req.Revision == 0 {
		return RepairOutcome{}, fmt.Errorf("%w: Revision is 0: give the revision of the value you inspected", ErrInvalidRequest)
	}
	var value []byte
	if r := req.Replacement; r != nil && !r.Empty() {
		if r.Service != key.Service || r.JobType != key.JobType || r.KeyHash != key.KeyHash {
			return RepairOutcome{}, fmt.Errorf("%w: Replacement holds service %q, job type %q, key hash %q, not those of KV key %q",
				ErrInvalidRequest, r.Service, r.JobType, r.KeyHash, key.KVKey)
		}
		if err := checkTimes(key.KVKey, r, c.cfg.Now); err != nil {
			return RepairOutcome{}, err
		}
		value = appendState(nil, r)
		if _, err := decodeState(value); err != nil {
			return RepairOutcome{}, fmt.Errorf("%w: Replacement is not valid key state: %w", ErrInvalidRequest, err)
		}
	}

	e := c.keys.pin(key.KVKey)
	defer c.keys.unpin(key.KVKey, e)
	if err := e.lock(ctx); err != nil {
		return RepairOutcome{}, err
	}
	defer e.unlock()
	prev, rev, err := c.store.Get(ctx, key.Service, key.KVKey)
	switch {
	case errors.Is(err, ErrKeyNotFound):
		return RepairOutcome{}, fmt.Errorf("%w: KV key %q is absent, not at revision %d: inspect it again", ErrRevisionConflict, key.KVKey, req.Revision)
	case err != nil && ctx.Err() != nil:
		return RepairOutcome{}, ctx.Err()
	case err != nil:
		return RepairOutcome{}, err
	case rev != req.Revision:
		return RepairOutcome{}, fmt.Errorf("%w: KV key %q is at revision %d, not %d: inspect it again", ErrRevisionConflict, key.KVKey, rev, req.Revision)
	}
	out := RepairOutcome{Previous: prev}
	if value == nil {
		err = c.store.Delete(ctx, key.Service, key.KVKey, rev)
	} else {
		out.Revision, err = c.store.Update(ctx, key.Service, key.KVKey, value, rev)
	}
	if err != nil {
		e.Conflict()
		if ctx.Err() != nil {
			return RepairOutcome{}, ctx.Err()
		}
		return RepairOutcome{}, fmt.Errorf("jobkeys: repair of KV key %q at revision %d: %w", key.KVKey, rev, err)
	}
	if value == nil {
		out.Deleted = true
		e.Commit(nil, 0, c.cfg.RetryBackoff)
	} else {
		st := snapshot(req.Replacement)
		e.Commit(st, out.Revision, c.cfg.RetryBackoff)
		// Slots the replacement frees wake the jobs they are for, as any
		// write's do: waiters on a watch by its delivery, others by their
		// wake-ups.
		if c.wakes != nil {
			// The jobs queued before are those of the value replaced; all
			// of the replacement's when that did not decode (corrupt).
			before, err := decodeState(prev)
			if err != nil {
				before = st
			}
			c.publishWakes(key, before, st, out.Revision, value)
		}
	}
	return out, nil
}

// operatorKey returns the key of kvKey in service's bucket; its display key
// is unknown (empty), which only a state created anew would need.
func operatorKey(service, kvKey string) (JobKey, error) {
	if err := validateService(service); err != nil {
		return JobKey{}, err
	}
	rest, ok := strings.CutPrefix(kvKey, service+".")
	jobType, keyHash, ok2 := strings.Cut(rest, ".")
	if !ok || !ok2 {
		return JobKey{}, fmt.Errorf("%w: KV key %q is not \"%s.<jobType>.<keyHash>\"", ErrInvalidRequest, kvKey, service)
	}
	if err := validateJobType(jobType); err != nil {
		return JobKey{}, fmt.Errorf("KV key %q: %w", kvKey, err)
	}
	if !isKeyHash(keyHash) {
		return JobKey{}, fmt.Errorf("%w: KV key %q: key hash %q is not 64 lowercase hex digits", ErrInvalidRequest, kvKey, keyHash)
	}
	return JobKey{Service: service, JobType: jobType, KeyHash: keyHash, KVKey: kvKey}, nil
}

// Config returns the configuration the coordinator runs with: the one it
// was made with, each zero field replaced by its default (InstanceID, the
// retry bounds, StateCacheSize, Now, NewSlotToken). The copy is the
// caller's: changing it changes nothing in the coordinator. Runtimes built
// on the coordinator read their settings from it (package jobs honours
// Config.IgnoreClockSkew in its claim check). Safe for concurrent use.
func (c *KeyCoordinator) Config() Config { return c.cfg }

// ClockOffset returns what the coordinator's store knows of the offset
// between the clock of the NATS server that stamps service's bucket and
// the coordinator's clock (Config.Now), the measure behind [ErrClockSkew]:
// an acquisition or sweep under a policy p is refused while the offset is
// proven to be at least (p.HeartbeatTTL − p.HeartbeatInterval) / 2 either
// way. A [NATSStore] measures it from the server times it sees (when it
// opens the bucket, on reads and watches, and by a stream info request
// when its measurement is older than ten seconds, which this call may
// make); a store that cannot ([MemoryStore]) returns the zero ClockOffset,
// nothing known. It is safe for concurrent use.
func (c *KeyCoordinator) ClockOffset(ctx context.Context, service string) (ClockOffset, error) {
	if err := validateService(service); err != nil {
		return ClockOffset{}, err
	}
	b := c.clockBounds(ctx, service)
	if err := ctx.Err(); err != nil {
		return ClockOffset{}, err
	}
	return b.offset(), nil
}
