package jobkeys

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A Run waiting through a Watcher for a slot, whose job leaves the queue
// without taking one (removed, by another process or its own coordinator),
// returns as soon as that change arrives, with ReasonNotQueued: the change
// wakes its waiter though it frees no slot. The Runner's recheck is a
// minute and the slot's lease longer, so nothing else can end the wait
// before the failure guard.
func TestWatcherWakesWaiterWhoseJobLeftTheQueue(t *testing.T) {
	for name, own := range map[string]bool{"removed by another process": false, "removed by its own coordinator": true} {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			mem := NewMemoryStore()
			p := newTwoProcesses(t, mem, mem)
			for _, id := range []string{"h", "a", "b"} {
				_, err := p.otherJT.Admit(ctx, id, p.payload)
				require.NoError(t, err)
			}
			held, err := p.otherJT.Acquire(ctx, "h", p.payload)
			require.NoError(t, err)
			require.Equal(t, KindAcquired, held.Kind)

			done := make(chan error, 1)
			go func() {
				_, err := p.r.Run(ctx, "a", p.payload, func(context.Context, Lease) error { return nil })
				done <- err
			}()
			p.awaitWaiter(t)

			remover := p.otherJT
			if own {
				remover = p.jt
			}
			rm, err := remover.RemoveQueued(ctx, "a", p.payload)
			require.NoError(t, err)
			require.Equal(t, KindRemoved, rm.Kind)

			awaitNotQueued(t, done)
		})
	}
}

// A retry (WithRetry) waits for a slot with its job not queued: a change
// that frees no slot does not wake it, though its job is not in the queue,
// while the same change wakes a queued waiter whose job it removes.
func TestWatcherLeavesRetryWaiterAsleep(t *testing.T) {
	ctx := context.Background()
	mem := NewMemoryStore()
	p := newTwoProcesses(t, mem, mem)
	for _, id := range []string{"h", "a"} {
		_, err := p.otherJT.Admit(ctx, id, p.payload)
		require.NoError(t, err)
	}
	held, err := p.otherJT.Acquire(ctx, "h", p.payload)
	require.NoError(t, err)
	require.Equal(t, KindAcquired, held.Kind)

	handler := func(context.Context, Lease) error { return nil }
	retried := make(chan error, 1)
	go func() {
		_, err := p.r.Run(ctx, "r", p.payload, handler, WithRetry())
		retried <- err
	}()
	p.awaitWaiter(t)
	queued := make(chan error, 1)
	go func() {
		_, err := p.r.Run(ctx, "a", p.payload, handler)
		queued <- err
	}()
	awaitWaiters(t, p.w, p.service, p.key.KVKey, 2, "the two Runs never waited")

	// retryWoken returns the change the retry's waiter was last woken
	// at (keyWatch.seq).
	retryWoken := func() uint64 {
		p.w.mu.Lock()
		defer p.w.mu.Unlock()
		for _, sub := range p.w.watches[p.service].keys[p.key.KVKey].waiters {
			if sub.waiter.retry {
				return sub.waiter.wokenAt
			}
		}
		t.Fatal("the retry no longer waits")
		return 0
	}
	// Both wait, not woken (their tries found the key busy).
	require.Eventually(t, func() bool { return asleep(p.w, p.service, p.key.KVKey) == 2 }, rtWait, time.Millisecond,
		"both waiters back asleep")
	retryBefore := retryWoken()

	rm, err := p.otherJT.RemoveQueued(ctx, "a", p.payload)
	require.NoError(t, err)
	require.Equal(t, KindRemoved, rm.Kind)
	awaitNotQueued(t, queued)
	retryAfter := retryWoken()
	assert.Equal(t, retryBefore, retryAfter, "the removal, which frees no slot, woke the retry")
	assert.Equal(t, 1, asleep(p.w, p.service, p.key.KVKey), "the retry still waits, asleep")

	_, err = p.otherJT.Release(ctx, held.Lease)
	require.NoError(t, err)
	select {
	case err := <-retried:
		require.NoError(t, err, "the retry runs once the slot is free")
	case <-time.After(rtWait):
		t.Fatal("the retry was not woken by the release")
	}
}

// awaitWaiters waits until exactly n waiters wait on kvKey through w; msg
// says what failed if they never do.
func awaitWaiters(t *testing.T, w *Watcher, service, kvKey string, n int, msg string) {
	t.Helper()
	require.Eventually(t, func() bool {
		w.mu.Lock()
		defer w.mu.Unlock()
		sw := w.watches[service]
		return sw != nil && sw.keys[kvKey] != nil && len(sw.keys[kvKey].waiters) == n
	}, rtWait, time.Millisecond, msg)
}

// asleep returns how many waiters on kvKey through w are not woken.
func asleep(w *Watcher, service, kvKey string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	if sw := w.watches[service]; sw != nil && sw.keys[kvKey] != nil {
		for _, sub := range sw.keys[kvKey].waiters {
			if !sub.waiter.woken {
				n++
			}
		}
	}
	return n
}

// awaitNotQueued waits for the error of a Run whose job was removed from
// the queue while it waited: a BlockedError with ReasonNotQueued. It fails
// the test when the Run still waits after rtWait: its waiter was not woken.
func awaitNotQueued(t *testing.T, done <-chan error) {
	t.Helper()
	select {
	case err := <-done:
		var blocked *BlockedError
		require.True(t, errors.As(err, &blocked), "the Run returned %v, not a BlockedError", err)
		assert.Equal(t, ReasonNotQueued, blocked.Acquisition.Reason)
	case <-time.After(rtWait):
		t.Fatal("the Run whose job was removed still waits: its waiter was not woken")
	}
}
