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

// stopWaiterOnly marks the waiters of job's wake-up subject on store s
// stopped without unsubscribing: the state of a Run whose wait ends (its
// context, or a try its recheck started) while its UNSUB is not at the
// server yet. A wake-up the server delivers to the subscription then is
// handed to nobody.
func (f *natsWakeFixture) stopWaiterOnly(t *testing.T, s *NATSStore, job string) {
	t.Helper()
	h := s.wake
	h.mu.Lock()
	e := h.subs[h.subject(s.BucketName(f.service), f.kvKey, job)]
	require.NotNil(t, e, "job %s waits on the store", job)
	ws := append([]*wakeWaiter(nil), e.waiters...)
	h.mu.Unlock()
	for _, w := range ws {
		w.mu.Lock()
		w.stopped = true
		w.mu.Unlock()
	}
}

// TestWakeUpHandedToNobodyMovesOn: a wake-up the server delivers to a
// subscription whose waiters all stopped (their UNSUB not at the server
// yet) is answered as "no responders" by the store that has it, so that
// it moves on to the next job, which waits: the server answers nothing
// for a subscription it still has, and the wake-up stayed with a job
// nobody waits for until its delivery state expired.
func TestWakeUpHandedToNobodyMovesOn(t *testing.T) {
	t.Parallel()
	f := newNATSWakeFixture(t)
	a, _ := f.store(t)
	b, ncB := f.store(t)
	f.wait(t, b, ncB, "j1")
	l2, _ := f.wait(t, b, ncB, "j2")
	f.stopWaiterOnly(t, b, "j1")
	a.publishWakes(f.service, f.kvKey, []byte("s"), 1, []string{"j1", "j2"}, 1)
	got := l2.next(t, "j2's wake-up, past j1, whose waiter stopped")
	assert.Equal(t, uint64(1), got.rev)
}

// TestWakeUpsAgainAfterCopyHandedToNobody: a wake-up sent again (a Run
// blocked in turn behind j1, see KeyCoordinator.wakeAhead) after the
// first copy of that revision was handed to nobody at j1 (its waiter
// stopped before its UNSUB reached the server; it is gone now) reaches
// the job that sent it again. It was taken for a copy still out to j1
// (coveredLocked), and not sent at all.
func TestWakeUpsAgainAfterCopyHandedToNobody(t *testing.T) {
	t.Parallel()
	f := newNATSWakeFixture(t)
	a, _ := f.store(t)
	b, ncB := f.store(t)
	_, stop1 := f.wait(t, b, ncB, "j1")
	l2, _ := f.wait(t, b, ncB, "j2")
	f.stopWaiterOnly(t, b, "j1")
	// A marker on another key: once its waiter on b has it, b had the
	// copy to j1 first (one connection's messages reach b in order, and
	// b's dispatcher hands them over in order).
	other, err := DeriveKey(f.service, "render", []byte(`{"t":"other"}`), []string{"/t"})
	require.NoError(t, err)
	lm := newNATSWakeLog()
	stopM, err := b.subscribeWake(f.service, other.KVKey, "m", lm.fn)
	require.NoError(t, err)
	defer stopM()
	require.NoError(t, ncB.Flush())
	a.publishWakes(f.service, f.kvKey, []byte("s"), 1, []string{"j1"}, 1)
	a.publishWakes(f.service, other.KVKey, []byte("m"), 1, []string{"m"}, 1)
	lm.next(t, "the marker")
	stop1()
	require.NoError(t, ncB.Flush())
	a.publishWakesAgain(f.service, f.kvKey, []byte("s"), 1, []string{"j1", "j2"}, 1)
	got := l2.next(t, "j2's wake-up, sent again past j1")
	assert.Equal(t, uint64(1), got.rev)
}

// TestLocalWakeUpHandedToNobodyMovesOn: a wake-up handed in memory to a
// job whose waiters of this store all stopped between the walk that chose
// them and the hand-over moves on to the next job, which waits, as a "no
// responders" answer would move it: it counted as delivered, and stayed
// with a job nobody waits for.
func TestLocalWakeUpHandedToNobodyMovesOn(t *testing.T) {
	t.Parallel()
	f := newNATSWakeFixture(t)
	a, ncA := f.store(t)
	f.wait(t, a, ncA, "j1")
	l2, _ := f.wait(t, a, ncA, "j2")
	f.stopWaiterOnly(t, a, "j1")
	a.publishWakes(f.service, f.kvKey, []byte("s"), 1, []string{"j1", "j2"}, 1)
	got := l2.next(t, "j2's wake-up, past j1, whose waiter stopped")
	assert.Equal(t, uint64(1), got.rev)
	assert.Equal(t, uint64(1), a.wakeCounters().Local, "wake-ups handed over in memory")
}

// gateStore is a NATSStore (its wake-ups too) whose next Update, once
// armed, waits for its context to end and fails with its error, writing
// nothing.
type gateStore struct {
	*NATSStore
	armed   *atomic.Bool
	entered chan struct{}
}

func (s gateStore) Update(ctx context.Context, service, key string, value []byte, revision uint64) (uint64, error) {
	if s.armed.CompareAndSwap(true, false) {
		close(s.entered)
		<-ctx.Done()
		return 0, ctx.Err()
	}
	return s.NATSStore.Update(ctx, service, key, value, revision)
}

// TestHeldWakeUpSentWhenFollowingWriteFails: a release's wake-up held
// while a write of the same coordinator that began meanwhile is under way
// (see wakeHold) is sent once that write fails, writing nothing, after
// the hold passed: the job waiting in another process for the slot gets
// it, and not from its recheck.
func TestHeldWakeUpSentWhenFollowingWriteFails(t *testing.T) {
	t.Parallel()
	f := &jobWakeFixture{natsWakeFixture: newNATSWakeFixture(t)}
	f.a, _ = f.store(t, WithCreateBuckets(0, 1))
	f.b, _ = f.store(t)
	p := Policy{Key: []string{"/t"}, MaxActive: 1, MaxQueuedPerKey: 5}
	gate := gateStore{NATSStore: f.a, armed: new(atomic.Bool), entered: make(chan struct{})}
	ca, err := NewCoordinator(gate, nil)
	require.NoError(t, err)
	require.NotNil(t, ca.wakes, "the coordinator has the store's wake-ups")
	ca.wakeHold = 5 * time.Millisecond
	f.jta, err = ca.JobType(f.service, "render", p)
	require.NoError(t, err)
	cb, err := NewCoordinator(f.b, nil)
	require.NoError(t, err)
	f.jtb, err = cb.JobType(f.service, "render", p)
	require.NoError(t, err)
	f.wb, err = NewWatcher(f.b)
	require.NoError(t, err)
	t.Cleanup(f.wb.Close)

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err = f.jta.Admit(ctx, "h", jobWakePayload)
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
	gate.armed.Store(true)
	actx, acancel := context.WithCancel(ctx)
	admitted := make(chan error, 1)
	go func() {
		_, err := f.jta.Admit(actx, "y", jobWakePayload)
		admitted <- err
	}()
	recv(t, gate.entered, "the admission's write")
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
