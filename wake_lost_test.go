package jobkeys

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestHeldWakeUpFlushedBeforeConnectionCloses: a worker that releases its
// last slot and shuts down (FlushWakeUps, then its connection closed at
// once) still wakes the job waiting in another process for that slot. The
// release's wake-up is held for a write that may follow (wakeHold); a
// connection closed meanwhile dropped it (Close sends nothing more), and
// the waiter waited for its recheck (RecheckInterval, 5s by default; an
// hour here).
func TestHeldWakeUpFlushedBeforeConnectionCloses(t *testing.T) {
	t.Parallel()
	f := newJobWakeFixture(t)
	// Held for certain while the connection closes, however loaded the
	// machine.
	f.jta.coord.wakeHold = time.Hour
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	acq, r, done := f.holdAndWaitBehind(t, ctx, time.Hour)
	rel, err := f.jta.Release(ctx, acq.Lease)
	require.NoError(t, err)
	require.Equal(t, KindReleased, rel.Kind)
	f.jta.coord.FlushWakeUps()
	f.ncA.Close()
	require.NoError(t, recv(t, done, "x's Run, woken by the release of a worker that shut down"))
	assert.Zero(t, r.rechecks.Load(), "x was not woken by a wake-up")
	pub, _, _, _ := WakeCountsOf(f.a)
	assert.NotZero(t, pub, "the release's wake-up was published")
}

// gateUpdates returns the hook of a store whose next Update, once armed
// is set, closes entered, waits for its context to end and fails with its
// error, writing nothing.
func gateUpdates(armed *atomic.Bool, entered chan<- struct{}) storeHook {
	return func(ctx context.Context, c storeCall, call func() storeResult) storeResult {
		if c.op == opUpdate && armed.CompareAndSwap(true, false) {
			close(entered)
			<-ctx.Done()
			return storeResult{err: ctx.Err()}
		}
		return call()
	}
}

// TestHeldWakeUpSentWhenFollowingWriteFails: a release's wake-up held
// while a write of the same coordinator that began meanwhile is under way
// (see wakeHold) is sent once that write fails, writing nothing, after
// the hold passed: the job waiting in another process for the slot gets
// it, and not from its recheck.
func TestHeldWakeUpSentWhenFollowingWriteFails(t *testing.T) {
	t.Parallel()
	armed, entered := new(atomic.Bool), make(chan struct{})
	f := newJobWakeFixtureWith(t, jobWakePolicy, wakeProcConfig{wrap: func(st Store) Store {
		return newHookStore(st, passAll).withHook(gateUpdates(armed, entered))
	}}, wakeProcConfig{})
	ca := f.pa.c
	require.NotNil(t, ca.wakes, "the coordinator has the store's wake-ups")
	ca.wakeHold = 5 * time.Millisecond

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := f.jta.Admit(ctx, "h", jobWakePayload)
	require.NoError(t, err)
	acq, err := f.jta.Acquire(ctx, "h", jobWakePayload)
	require.NoError(t, err)
	require.Equal(t, KindAcquired, acq.Kind)
	_, err = f.jtb.Admit(ctx, "x", jobWakePayload)
	require.NoError(t, err)
	r, err := NewRunner(f.jtb, &RunnerConfig{Watcher: f.wb, RecheckInterval: time.Hour})
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() {
		_, err := r.Run(ctx, "x", jobWakePayload, func(context.Context, Lease) error { return nil })
		done <- err
	}()
	require.Eventually(t, func() bool { return f.wb.wakeSubscriptions() == 1 }, rtWait, time.Millisecond, "x waits")
	time.Sleep(20 * time.Millisecond) // x's try after subscribing
	// The coordinator knows the key: the release writes without a read,
	// and so does the admission that follows (an Update each).
	rel, err := f.jta.Release(ctx, acq.Lease)
	require.NoError(t, err)
	require.Equal(t, KindReleased, rel.Kind)
	e := ca.keys.entry(f.kvKey)
	require.NotNil(t, e)
	armed.Store(true)
	actx, acancel := context.WithCancel(ctx)
	admitted := make(chan error, 1)
	go func() {
		_, err := f.jta.Admit(actx, "y", jobWakePayload)
		admitted <- err
	}()
	recv(t, entered, "the admission's write")
	select {
	case err := <-done:
		t.Fatalf("x's Run ended (%v) while the release's wake-up was held", err)
	default:
	}
	// Past the hold: the write under way keeps it held.
	require.Eventually(t, func() bool {
		e.wakeMu.Lock()
		defer e.wakeMu.Unlock()
		return e.held != nil && e.held.expired
	}, rtWait, time.Millisecond, "the hold passes during the admission's write")
	acancel()
	require.ErrorIs(t, recv(t, admitted, "the admission"), context.Canceled)
	require.NoError(t, recv(t, done, "x's Run, woken by the held wake-up once the write failed"))
	assert.Zero(t, r.rechecks.Load(), "x was not woken by a wake-up")
}

// TestReleaseWakeUpHeldForFollowingAdmission: a release that frees the
// slot for a job waiting in another process, followed at once by an
// admission of the same coordinator (a worker admitting its next job),
// sends that job one wake-up, the admission's, on which its acquisition
// wins: not the release's first, whose state the admission changed, so
// that the woken job's write lost to it (a wasted write, and a second
// wake-up). Without a write following, the release's wake-up goes out
// once the hold has passed (the control).
func TestReleaseWakeUpHeldForFollowingAdmission(t *testing.T) {
	t.Parallel()
	for _, follow := range []bool{true, false} {
		t.Run(fmt.Sprintf("admission=%v", follow), func(t *testing.T) {
			t.Parallel()
			f := newJobWakeFixture(t)
			if follow {
				// Long enough for the admission to begin on a loaded machine.
				f.jta.coord.wakeHold = time.Minute
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			acq, r, done := f.holdAndWaitBehind(t, ctx, time.Minute)
			pubBefore, _, _, _ := WakeCountsOf(f.a)
			_, _, _, recvBefore := WakeCountsOf(f.b)
			rel, err := f.jta.Release(ctx, acq.Lease)
			require.NoError(t, err)
			require.Equal(t, KindReleased, rel.Kind)
			if follow {
				adm, err := f.jta.Admit(ctx, "y", jobWakePayload)
				require.NoError(t, err)
				require.Equal(t, KindAccepted, adm.Kind)
			}
			require.NoError(t, recv(t, done, "x's Run"))
			pub, _, _, _ := WakeCountsOf(f.a)
			assert.Equal(t, uint64(1), pub-pubBefore, "wake-ups sent to x")
			_, _, _, got := WakeCountsOf(f.b)
			assert.Equal(t, uint64(1), got-recvBefore, "wake-ups x received")
			assert.Zero(t, r.rechecks.Load(), "x was not woken by a wake-up")
		})
	}
}

// holdAndWaitBehind has a hold job "h"'s slot and b run job "x", queued
// behind it, in a Run with recheck, until x waits for its wake-ups. It
// returns h's acquisition, x's Runner and the channel of the Run's error.
func (f *jobWakeFixture) holdAndWaitBehind(t *testing.T, ctx context.Context, recheck time.Duration) (Acquisition, *Runner, chan error) {
	t.Helper()
	_, err := f.jta.Admit(ctx, "h", jobWakePayload)
	require.NoError(t, err)
	acq, err := f.jta.Acquire(ctx, "h", jobWakePayload)
	require.NoError(t, err)
	require.Equal(t, KindAcquired, acq.Kind)
	_, err = f.jtb.Admit(ctx, "x", jobWakePayload)
	require.NoError(t, err)
	r, err := NewRunner(f.jtb, &RunnerConfig{Watcher: f.wb, RecheckInterval: recheck})
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() {
		_, err := r.Run(ctx, "x", jobWakePayload, func(context.Context, Lease) error { return nil })
		done <- err
	}()
	require.Eventually(t, func() bool { return f.wb.wakeSubscriptions() == 1 }, rtWait, time.Millisecond, "x waits")
	// Let x's wait settle (its try after subscribing).
	time.Sleep(20 * time.Millisecond)
	return acq, r, done
}
