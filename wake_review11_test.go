package jobkeys

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// newReview11Fixture is newJobWakeFixture with the connection of store a
// at hand (a test closes it).
func newReview11Fixture(t *testing.T) (*jobWakeFixture, *nats.Conn) {
	t.Helper()
	f := &jobWakeFixture{natsWakeFixture: newNATSWakeFixture(t)}
	var ncA *nats.Conn
	f.a, ncA = f.store(t, WithCreateBuckets(0, 1))
	f.b, _ = f.store(t)
	p := Policy{Key: []string{"/t"}, MaxActive: 1, MaxQueuedPerKey: 5}
	for _, x := range []struct {
		s  *NATSStore
		jt **JobType
	}{{f.a, &f.jta}, {f.b, &f.jtb}} {
		c, err := NewCoordinator(x.s, nil)
		require.NoError(t, err)
		*x.jt, err = c.JobType(f.service, "render", p)
		require.NoError(t, err)
	}
	w, err := NewWatcher(f.b)
	require.NoError(t, err)
	t.Cleanup(w.Close)
	f.wb = w
	return f, ncA
}

// TestHeldWakeUpFlushedBeforeConnectionCloses: a worker that releases its
// last slot and shuts down (FlushWakeUps, then its connection closed at
// once) still wakes the job waiting in another process for that slot. The
// release's wake-up is held for a write that may follow (wakeHold); a
// connection closed meanwhile dropped it (Close sends nothing more), and
// the waiter waited for its recheck (RecheckInterval, 5s by default; an
// hour here).
func TestHeldWakeUpFlushedBeforeConnectionCloses(t *testing.T) {
	t.Parallel()
	f, ncA := newReview11Fixture(t)
	// Held for certain while the connection closes, however loaded the
	// machine.
	f.jta.coord.wakeHold = time.Hour
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
	// Let x's wait settle (its try after subscribing).
	time.Sleep(20 * time.Millisecond)
	rel, err := f.jta.Release(ctx, acq.Lease)
	require.NoError(t, err)
	require.Equal(t, KindReleased, rel.Kind)
	f.jta.coord.FlushWakeUps()
	ncA.Close()
	require.NoError(t, recv(t, done, "x's Run, woken by the release of a worker that shut down"))
	assert.Zero(t, r.rechecks.Load(), "x was not woken by a wake-up")
	pub, _, _, _ := WakeCountsOf(f.a)
	assert.NotZero(t, pub, "the release's wake-up was published")
}
