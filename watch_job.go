package jobkeys

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"time"
	"unicode/utf8"
)

// This file holds the job-level side of targeted wake-ups on a Watcher
// (see WithWakeUps), unexported since the jobs runtime stopped waiting on
// keys (docs/design/dispatch.md): a subscription to the wake-ups of one
// job with the checks of its inputs (subscribeJob), and the hand-on of a
// wake-up by a waiter that leaves without acting on it (passWakeUp). A
// Runner subscribes through Watcher.subscribeWake directly; these two
// keep the protocol's entry points that the wake-up tests drive.

// subscribeJob subscribes to the targeted wake-ups sent to job jobID on
// kvKey, a key of jt ([JobType.Key] derives it; jobID is the id the job
// was admitted under), over w's store, which must be the store jt's
// coordinator was made with and have wake-ups (Watcher.wakeUps).
//
// The subscription's Changed channel delivers a value after each wake-up
// sent to the job (coalesced, as every Subscription's): the write of any
// process with wake-ups on that left a slot free with the job among the
// first queued ones, as many as the slots it left free (a release,
// typically; but any write that leaves a slot free, a heartbeat or an
// admission too, wakes them again), or behind them when jobs ahead of it
// have no waiter anywhere (a wake-up moves on past such jobs, up to 64
// past the free slots). A write that leaves no slot free (a
// heartbeat of a full key) signals nothing, nor do wake-ups sent to other
// jobs of the key. A wake-up is a hint, never a state to write on:
// anyone allowed to publish on the wake-up subjects may have sent it. A
// wake-up from another process leaves jt's coordinator only its revision,
// so that the job's next [JobType.Acquire] reads the key first unless the
// coordinator holds that revision already (its own write, the Watcher's
// watch); one handed over in memory by a write of this store's process
// is recorded as the state seen stored, and the next Acquire writes on it
// without a read when it has a slot free (a stale one costs a failed
// write and a read; a coordinator whose Config.StateCacheSize disables
// its cache reads). Every Acquire that finds a key busy on a remembered
// state reads before it reports the key busy.
//
// A wake-up is not sent for every change a waiter needs: a writer without
// wake-ups (a store without WithWakeUps, the TS original) sends none, nor
// does a lease running out (Acquisition.NextExpiry); a waiter keeps its
// rechecks for those. A wake-up sent before the subscription reached the
// server may be lost, though one that found no waiter is sent again a
// couple of milliseconds later, and once more 8 ms after that; subscribeJob
// returns once the server has confirmed the subscription (or after about
// 10 ms without that), so a
// waiter that tries once more after subscribeJob returns misses no
// release. A job that is not queued (a retry, [WithRetry], or a job not
// admitted yet) is sent no wake-up: wait for it with [Watcher.Subscribe].
//
// Done is closed when the subscription is closed or w is. Close the
// subscription when the job stops waiting. ctx bounds the call only: a
// ctx that ends during it makes it return ctx.Err() with nothing
// subscribed.
//
// It fails with an error wrapping [ErrInvalidRequest] for a nil or zero
// Watcher or JobType, a JobType of another store than w's, a store
// without wake-ups, a kvKey that is not a key of jt, or a job id that is
// empty or not valid UTF-8; with one wrapping [ErrWatcherClosed] after
// [Watcher.Close]. It is safe for concurrent use.
func (w *Watcher) subscribeJob(ctx context.Context, jt *JobType, kvKey, jobID string) (*Subscription, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if w == nil || w.store == nil {
		return nil, fmt.Errorf("%w: subscribe to the wake-ups of job %q: the Watcher was not made by NewWatcher", ErrInvalidRequest, jobID)
	}
	if jt == nil || jt.coord == nil {
		return nil, fmt.Errorf("%w: subscribe to the wake-ups of job %q: the job type is nil or was not made by KeyCoordinator.JobType", ErrInvalidRequest, jobID)
	}
	ws := w.wakeUps()
	if ws == nil {
		return nil, fmt.Errorf("%w: subscribe to the wake-ups of job %q of %s: the Watcher's store has no wake-ups (WithWakeUps)", ErrInvalidRequest, jobID, kvKey)
	}
	if !sameStore(ws, jt.coord.wakes) {
		return nil, fmt.Errorf("%w: subscribe to the wake-ups of job %q of %s: job type %q of service %q belongs to a coordinator over another store than the Watcher's",
			ErrInvalidRequest, jobID, kvKey, jt.name, jt.service)
	}
	if !isKeyOf(jt, kvKey) {
		return nil, fmt.Errorf("%w: subscribe to the wake-ups of job %q: %q is not a KV key of job type %q of service %q (%s.%s.<key hash>)",
			ErrInvalidRequest, jobID, kvKey, jt.name, jt.service, jt.service, jt.name)
	}
	if jobID == "" || !utf8.ValidString(jobID) {
		return nil, fmt.Errorf("%w: subscribe to the wake-ups of %s: job id %q is empty or not valid UTF-8", ErrInvalidRequest, kvKey, jobID)
	}
	sub, err := w.subscribeWake(jt.service, kvKey, jobID, jt.coord.keys)
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		sub.Close()
		return nil, err
	}
	return sub, nil
}

// passWakeUp hands on the targeted wake-up of job jobID (admitted with
// payload) for a waiter of Watcher.subscribeJob that stops waiting
// without acquiring a slot: paused, or its process stopping, while its
// queue entry stays. A write that frees slots wakes as many queued jobs
// as it freed; one that was woken and leaves would keep the next queued
// job waiting for its recheck. passWakeUp reads the key (one read; it
// writes nothing) and, if its state leaves a slot free with jobID queued
// where a wake-up may reach it (among the first jobs the free slots are
// for, or up to 64 past them), sends that state's wake-up to the other
// queued jobs, as the write taking jobID out of the queue would: to as
// many as slots are free, passing over those with no waiter. It sends
// nothing when jobID is not queued (its removal woke the next job) or no
// slot is free, and does nothing over a store without wake-ups. Call it
// after closing the job's subscription.
//
// A job id that is empty or not valid UTF-8 is an error wrapping
// [ErrInvalidRequest], a payload the key template cannot resolve one
// wrapping [ErrInvalidKey]; a failed read is returned wrapped, with the
// KV key. It is safe for concurrent use.
func (jt *JobType) passWakeUp(ctx context.Context, jobID string, payload any) error {
	if jt == nil || jt.coord == nil {
		return fmt.Errorf("%w: pass on the wake-up of job %q: the job type is nil or was not made by KeyCoordinator.JobType", ErrInvalidRequest, jobID)
	}
	key, err := jt.key(jobID, payload)
	if err != nil {
		return err
	}
	c := jt.coord
	if c.wakes == nil {
		return nil
	}
	value, rev, err := c.store.Get(ctx, key.Service, key.KVKey)
	if errors.Is(err, ErrKeyNotFound) {
		return nil
	}
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("jobkeys: pass on the wake-up of job %q of %s: %w", jobID, key.KVKey, err)
	}
	st, err := decodeFor(key, value, rev)
	if err != nil {
		return fmt.Errorf("jobkeys: pass on the wake-up of job %q of %s: %w", jobID, key.KVKey, err)
	}
	targets, free := passTargets(st, jobID, jt.policy, c.cfg.Now())
	if len(targets) == 0 {
		return nil
	}
	if again, ok := c.wakes.(wakeAheadStore); ok {
		// This store may have sent a wake-up of rev already (its own
		// write), to jobID among others.
		again.publishWakesAgain(key.Service, key.KVKey, value, rev, targets, free)
		return nil
	}
	c.wakes.publishWakes(key.Service, key.KVKey, value, rev, targets, free)
	return nil
}

// passTargets returns the targets of the wake-up passWakeUp hands on for
// job jobID from state st, and the slots free for them: the queued jobs
// but jobID, in order, up to the targets' bound; none when no slot is
// free or no wake-up of st can reach jobID. policy is the job type's (see
// freeSlots).
func passTargets(st *KeyState, jobID string, policy Policy, now time.Time) ([]string, int) {
	free := freeSlots(st, policy, now)
	i := indexQueued(st.Queued, jobID)
	if free <= 0 || i < 0 || i >= free+wakeTargetsMax || len(st.Queued) < 2 {
		return nil, 0
	}
	targets := make([]string, 0, min(len(st.Queued)-1, free+wakeTargetsMax))
	for k := range st.Queued {
		if k == i {
			continue
		}
		targets = append(targets, st.Queued[k].JobID)
		if len(targets) == free+wakeTargetsMax {
			break
		}
	}
	return targets, free
}

// isKeyOf reports whether kvKey is a KV key of jt: its service, its name
// and a key hash (lowercase hex SHA-256).
func isKeyOf(jt *JobType, kvKey string) bool {
	hash, ok := strings.CutPrefix(kvKey, jt.service+"."+jt.name+".")
	if !ok || len(hash) != 64 {
		return false
	}
	for i := range len(hash) {
		if c := hash[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// sameStore reports whether a and b are the same store; values == cannot
// compare (of such a type, or holding such a value in an interface) are
// never the same.
func sameStore(a, b wakeStore) bool {
	if a == nil || b == nil {
		return false
	}
	va, vb := reflect.ValueOf(a), reflect.ValueOf(b)
	return va.Type() == vb.Type() && va.Comparable() && vb.Comparable() && a == b
}
