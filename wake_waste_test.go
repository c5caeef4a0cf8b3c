package jobkeys

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestPublishWakesStaleBlockFreesNoSlot: under StalePolicy Block an expired
// slot stays taken (ReduceAcquire blocks with ReasonStaleBlocked), so a
// write that leaves the key with that slot and jobs queued has no slot to
// wake them for: it sends no wake-up. Under FailStale the same expired
// slot is free, and the write wakes the queue's head (the control).
// (publishWakes counted only live slots as taken, and woke the head for a
// slot that was not free.)
func TestPublishWakesStaleBlockFreesNoSlot(t *testing.T) {
	t.Parallel()
	for _, stale := range []StalePolicy{Block, FailStale} {
		t.Run(string(stale), func(t *testing.T) {
			t.Parallel()
			f := newStaleWakeFixture(t, Policy{Key: []string{"/t"}, MaxActive: 1, MaxQueuedPerKey: 5, StalePolicy: stale})
			ctx := context.Background()
			for _, id := range []string{"job-1", "job-2", "job-3"} {
				_, err := f.jta.Admit(ctx, id, jobWakePayload)
				require.NoError(t, err)
			}
			acq, err := f.jta.Acquire(ctx, "job-1", jobWakePayload)
			require.NoError(t, err)
			require.Equal(t, KindAcquired, acq.Kind)
			// The admissions left a slot free: their wake-ups find nobody,
			// nor do their resends. Let them end first.
			require.Eventually(t, func() bool {
				_, _, chains := wakeHubSize(f.a)
				return chains == 0
			}, 30*time.Second, time.Millisecond, "the wake-ups of store a end")
			sub2, err := f.wb.subscribeJob(ctx, f.jtb, f.kvKey, "job-2")
			require.NoError(t, err)
			defer sub2.Close()

			// b (an hour ahead: job-1's lease expired by its clock) admits
			// job-4: its write leaves job-1's slot and job-2 first queued.
			adm, err := f.jtb.Admit(ctx, "job-4", jobWakePayload)
			require.NoError(t, err)
			require.Equal(t, KindAccepted, adm.Kind)
			if stale == FailStale {
				recv(t, sub2.Changed(), "job-2's wake-up: job-1's expired slot is free under FailStale")
				return
			}
			f.assertBlockKeptTheSlot(t, ctx, sub2, "job-2")
		})
	}
}

// TestWakeLostOutcomeAgreesWithReducerStaleBlock: the blocked outcome of a
// woken try whose write lost says what ReduceAcquire says on the state the
// coordinator holds: under StalePolicy Block, with every slot held and one
// of them expired, the reason is ReasonStaleBlocked, not
// ReasonActiveLimit, and the figures are the reducer's.
func TestWakeLostOutcomeAgreesWithReducerStaleBlock(t *testing.T) {
	t.Parallel()
	got, held, key := wakeLostStaleBlock(t, "wakelostreason")
	want := ReduceAcquire(held, key, AcquireRequest{Service: key.Service, JobType: key.JobType, JobID: "j2"}, wakeLostStaleBlockPolicy, wakeLostStaleBlockNow(), "t")
	require.Equal(t, KindBlocked, want.Kind)
	assert.Equal(t, KindBlocked, got.Kind)
	assert.Equal(t, ReasonStaleBlocked, want.Reason)
	assert.Equal(t, want.Reason, got.Reason)
	assert.Equal(t, want.Active, got.Active)
	assert.Equal(t, want.Queued, got.Queued)
	assert.Equal(t, want.Limit, got.Limit)
	assert.Equal(t, want.NextExpiry, got.NextExpiry)
}

// TestWakeUpsAgainNoSecondCopy: a wake-up of a revision sent again (a Run
// blocked in turn, see KeyCoordinator.wakeAhead) while this store's
// wake-up of that revision is still out to the job ahead, which has a
// waiter, does not wake that job a second time for the same state (the
// releasing worker's next Run sent it again to the head the release or
// admission had just woken); nor the job behind.
func TestWakeUpsAgainNoSecondCopy(t *testing.T) {
	t.Parallel()
	f := newNATSWakeFixture(t)
	a, ncA := f.store(t)
	b, ncB := f.store(t)
	l, _ := f.wait(t, b, ncB, "j1")
	ll, _ := f.wait(t, a, ncA, "j2")
	a.publishWakes(f.service, f.kvKey, []byte("s"), 1, []string{"j1"}, 1)
	got := l.next(t, "j1's wake-up")
	assert.Equal(t, uint64(1), got.rev)
	a.publishWakesAgain(f.service, f.kvKey, []byte("s"), 1, []string{"j1", "j2"}, 1)
	// A marker of a later revision: once j1 has it, a second copy of
	// revision 1 sent before it would have come first.
	a.publishWakes(f.service, f.kvKey, []byte("m"), 2, []string{"j1"}, 1)
	got = l.next(t, "the marker")
	assert.Equal(t, uint64(2), got.rev, "j1 was woken twice for revision 1")
	assert.Equal(t, uint64(2), a.wakeCounters().Published)
	assert.False(t, pending(ll.ch), "j2 was woken")
}

// TestWakeUpsAgainMovesOnPastJobAhead: a wake-up sent again while this
// store's wake-up of that revision awaits the answer of a job ahead that
// has no waiter reaches the job that sent it again: the "no responders"
// answer moves it on.
func TestWakeUpsAgainMovesOnPastJobAhead(t *testing.T) {
	t.Parallel()
	f := newNATSWakeFixture(t)
	a, ncA := f.store(t)
	ll, _ := f.wait(t, a, ncA, "j2")
	a.publishWakes(f.service, f.kvKey, []byte("s"), 1, []string{"j1"}, 1)
	a.publishWakesAgain(f.service, f.kvKey, []byte("s"), 1, []string{"j1", "j2"}, 1)
	got := ll.next(t, "j2's wake-up, past j1, which has no waiter")
	assert.Equal(t, uint64(1), got.rev)
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
