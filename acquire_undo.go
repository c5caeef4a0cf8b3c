package jobkeys

// Taking back the slot of an acquisition whose write's outcome is unknown.
//
// An acquisition writes its slot with a compare-and-swap. When that write
// fails otherwise than by a lost race or a refusal (the caller's context
// ended while it was under way, or the store failed), the write may have
// landed, or, a request given up on by the client, may land after the
// call returned; the acquisition returns the error all the same, and no
// caller holds the slot's lease. Left alone, such a slot would keep the
// key held for a whole lease, with the job off the queue: its next
// acquisition would find its own live slot (ReasonAlreadyActive), and
// under FailStale another job could drop it once expired, leaving the job
// told ReasonNotQueued. That contradicts the answer its caller got.
//
// So before returning the error, the acquisition undoes its write with
// one more write through the key's lane, on a context of its own (the
// caller's values, not its cancellation; bounded by acquireUndoTimeout).
// The caller waits for it: when the call returns, the key holds no slot
// of the failed acquisition, which a test can check and the job's next
// acquisition relies on. It costs a read and a write, as a release does.
// The undo:
//
//   - on a state that holds the slot (this job, this token), it removes
//     the slot and, if the job was queued when it acquired, puts its queue
//     entry back at the head of the queue, unless it is queued again; the
//     write frees the slot as a release does (the lane's commit wakes the
//     waiters it frees it for);
//   - on a state without the slot, it writes the state unchanged, as a new
//     revision: the lost write was conditioned on a revision at or before
//     the one read, and a later revision makes its compare-and-swap fail
//     for good. If it lands before the undo writes, the undo's own
//     compare-and-swap fails, and its retry finds the slot and removes it;
//   - on an absent key (the lost write was a create, of a retry on a key
//     with no state, or the key was emptied since), it creates the key
//     with an empty state and deletes it at once, holding the key's lane:
//     the lost create, conditioned on the key's absence (or on the delete
//     marker read), can no longer land. If the create fails, something was
//     written: the undo starts over.
//
// An expired slot of another job the lost write dropped (FailStale) is
// not put back: it had expired, and any acquisition may drop it.
//
// The undo counts as the operation "undo_acquire" in the metrics, its
// outcome "removed" when it found the slot and "fenced" when it did not.

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// metricOpUndoAcquire is the jobkeys.operation of an undo (see
// undoAcquire); its outcomes are undoRemoved and undoFenced.
const (
	metricOpUndoAcquire = "undo_acquire"
	undoRemoved         = "removed"
	undoFenced          = "fenced"
)

// acquireUndoTimeout bounds an undo (see undoAcquire): Runner's default
// ReleaseTimeout, which bounds the similar release after a handler
// returns. It is not cut to the lease: an expired slot still keeps the
// job off the queue (and under Block keeps the key at capacity), so the
// undo is worth finishing after the lease.
const acquireUndoTimeout = ReleaseTimeoutDefault

// acquireUndoRounds bounds the undo's rounds that find the key absent and
// then fail to fence it because something was written meanwhile.
const acquireUndoRounds = 4

// undoAcquire takes back the slot that an acquisition of job jobID with
// slot token token may have taken by a write whose outcome is unknown, and
// makes sure that write can no longer land (see the file comment).
// queued is the job's queue entry in the state the write was reduced
// from, nil when it was not queued (a retry). It runs on a context that
// keeps ctx's values but not its cancellation, bounded by
// acquireUndoTimeout; its failure is logged (Config.Logger, warn), and
// leaves the slot, if taken, to expire with its lease.
func (c *KeyCoordinator) undoAcquire(ctx context.Context, key JobKey, policy Policy, jobID, token string, queued *QueuedJob) {
	uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), acquireUndoTimeout)
	defer cancel()
	start := c.obs.begin()
	outcome, err := c.undoAcquireRounds(uctx, key, policy, jobID, token, queued)
	if c.obs != nil {
		c.obs.record(uctx, metricOpUndoAcquire, key.Service, key.JobType, key.KVKey, start, outcome, err)
	}
	if err != nil && c.cfg.Logger != nil {
		c.cfg.Logger.WarnContext(uctx, "jobkeys: could not take back the slot of an acquisition whose write's outcome is unknown; if it was taken, it stays until its lease expires",
			"service", key.Service, "job_type", key.JobType, "kv_key", key.KVKey, "job_id", jobID, "error", err)
	}
}

// undoAcquireRounds is undoAcquire's work on uctx; it returns the undo's
// outcome for the metrics (undoRemoved or undoFenced).
func (c *KeyCoordinator) undoAcquireRounds(uctx context.Context, key JobKey, policy Policy, jobID, token string, queued *QueuedJob) (string, error) {
	for range acquireUndoRounds {
		removed, absent := false, false
		err := c.run(uctx, key, retry{stale: policy.StalePolicy}, func(st *KeyState, now time.Time) *KeyState {
			var next *KeyState
			next, removed = reduceUndoAcquire(st, jobID, token, queued, now)
			absent = st == nil
			return next
		})
		switch {
		case err != nil:
			return "", err
		case removed:
			return undoRemoved, nil
		case !absent:
			return undoFenced, nil
		}
		err = c.fenceAbsent(uctx, key, policy)
		if !errors.Is(err, ErrRevisionConflict) {
			return undoFenced, err
		}
		// The key was written since it was read absent, perhaps by the
		// lost write: undo again.
	}
	return "", fmt.Errorf("%w: KV key %q: the undo of job %q's acquisition found the key absent and then written, %d times",
		ErrContention, key.KVKey, jobID, acquireUndoRounds)
}

// fenceAbsent makes key, found absent, present and absent again, holding
// its lane: a create of the key sent before, conditioned on its absence
// (or on the delete marker it had), can no longer land. An error wrapping
// ErrRevisionConflict says the key was written meanwhile.
func (c *KeyCoordinator) fenceAbsent(ctx context.Context, key JobKey, policy Policy) error {
	e := c.keys.pin(key.KVKey)
	defer c.keys.unpin(key.KVKey, e)
	if err := e.lock(ctx); err != nil {
		return err
	}
	defer e.unlock()
	value := appendState(nil, emptyState(key, policy, jsNow(c.cfg.Now())))
	rev, err := c.store.Create(ctx, key.Service, key.KVKey, value)
	if err == nil {
		err = c.store.Delete(ctx, key.Service, key.KVKey, rev)
	}
	if err != nil {
		e.Conflict()
		if ctx.Err() != nil && !errors.Is(err, ErrRevisionConflict) {
			return ctx.Err()
		}
		return fmt.Errorf("jobkeys: KV key %q: fencing the absent key after an acquisition's lost write: %w", key.KVKey, err)
	}
	e.Commit(nil, 0, c.cfg.RetryBackoff)
	return nil
}

// reduceUndoAcquire returns the state that takes back job jobID's slot of
// token token from state, and reports whether it held one (see
// undoAcquire): without the slot, state unchanged, to be written as a new
// revision all the same; the slot removed, and the job's queue entry
// queued (nil: none) put back at the head of the queue unless the job is
// queued. An absent key (nil) gives nil: nothing to write. Pure.
func reduceUndoAcquire(state *KeyState, jobID, token string, queued *QueuedJob, now time.Time) (next *KeyState, removed bool) {
	if state == nil {
		return nil, false
	}
	i := -1
	for k := range state.Active {
		if a := &state.Active[k]; a.JobID == jobID && a.SlotToken == token {
			i = k
			break
		}
	}
	if i < 0 {
		return state.clone(), false
	}
	next = state.rebuilt(len(state.Active)-1, len(state.Queued)+1)
	next.Active = append(next.Active, state.Active[:i]...)
	next.Active = append(next.Active, state.Active[i+1:]...)
	if queued != nil && indexQueued(state.Queued, jobID) < 0 {
		next.Queued = append(next.Queued, *queued)
	}
	next.Queued = append(next.Queued, state.Queued...)
	next.UpdatedAt = jsNow(now)
	return next, true
}
