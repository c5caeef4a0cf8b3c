package jobkeys

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestReleaseWakeUpSentBeforeConnectionCloses: a worker that releases its
// last slot and shuts down (its connection closed at once) still wakes the
// job waiting in another process for that slot: the release's wake-up is
// published before Release returns. Without it the waiter would wait for
// its recheck (RecheckInterval, 5s by default; an hour here).
func TestReleaseWakeUpSentBeforeConnectionCloses(t *testing.T) {
	t.Parallel()
	f := newJobWakeFixture(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	acq, r, done := f.holdAndWaitBehind(t, ctx, time.Hour)
	rel, err := f.jta.Release(ctx, acq.Lease)
	require.NoError(t, err)
	require.Equal(t, KindReleased, rel.Kind)
	f.ncA.Close()
	require.NoError(t, recv(t, done, "x's Run, woken by the release of a worker that shut down"))
	assert.Zero(t, r.rechecks.Load(), "x was not woken by a wake-up")
	pub, _, _, _ := WakeCountsOf(f.a)
	assert.NotZero(t, pub, "the release's wake-up was published")
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
