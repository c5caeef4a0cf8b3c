package jobkeys

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// WakeCountsOf returns the wake-up counters of s (NATSStore.wakeCounters).
func WakeCountsOf(s *NATSStore) (published, local, noResponders, received uint64) {
	n := s.wakeCounters()
	return n.Published, n.Local, n.NoResponders, n.Received
}

// Targeted wake-ups of one job (wake.go: Watcher.subscribeWake, the
// subscription a Runner waiting over wake-ups makes; wakeAhead, the
// wake-up a Runner's try blocked in turn sends the jobs ahead), between
// two processes.

// subscribeJobWakes subscribes, on w, to the targeted wake-ups of job
// jobID on kvKey, a key of jt, for jt's coordinator, as a Runner waiting
// over wake-ups does (Watcher.subscribeWake).
func subscribeJobWakes(t *testing.T, w *Watcher, jt *JobType, kvKey, jobID string) *Subscription {
	t.Helper()
	sub, err := w.subscribeWake(jt.service, kvKey, jobID, jt.coord.keys)
	require.NoError(t, err)
	t.Cleanup(sub.Close)
	return sub
}

// wakeSubscriptions returns how many subscriptions of subscribeWake are
// open on w: the Runs waiting for wake-ups.
func (w *Watcher) wakeSubscriptions() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, subs := range w.wakeSubs {
		n += len(subs)
	}
	return n
}

// acquireInTurn is a try in turn of job jobID (waitTry.inTurn), as a
// Runner waiting over wake-ups makes at its first try and right after
// subscribing: blocked in turn behind jobs ahead, it sends them the
// state's wake-up (wakeAhead), as the Runner does.
func acquireInTurn(ctx context.Context, jt *JobType, jobID string, payload any, opts ...AcquireOption) (Acquisition, error) {
	key, err := jt.key(jobID, payload)
	if err != nil {
		return Acquisition{}, err
	}
	wt := &waitTry{inTurn: true}
	acq, err := jt.acquire(ctx, key, jobID, opts, wt)
	if err == nil && wt.ahead > 0 {
		c := jt.coord
		c.wakeAhead(jt.service, key.KVKey, c.keys.entry(key.KVKey), wt.rev, jobID, jt.policy)
	}
	return acq, err
}

// TestWakeUpSignalsOnlyItsJob: a job's wake-up subscription (a waiting
// Runner's) in one process is signalled by the release another process makes that
// frees a slot for its job, and not by a heartbeat (which frees nothing)
// nor by the wake-ups of other jobs; the wake-up, from another process,
// leaves the waiter's coordinator the release's revision as a hint (its
// next Acquire reads), not the state it carries; Close and Watcher.Close
// end such subscriptions.
func TestWakeUpSignalsOnlyItsJob(t *testing.T) {
	t.Parallel()
	f := newJobWakeFixture(t)
	ctx := context.Background()
	// job-1 runs before the others are queued: no write before the
	// release leaves a slot free with a job queued, so none sends a
	// wake-up (whose retry could come at any time).
	_, err := f.jta.Admit(ctx, "job-1", jobWakePayload)
	require.NoError(t, err)
	acq, err := f.jta.Acquire(ctx, "job-1", jobWakePayload)
	require.NoError(t, err)
	require.Equal(t, KindAcquired, acq.Kind)
	for _, id := range []string{"job-2", "job-3"} {
		_, err := f.jta.Admit(ctx, id, jobWakePayload)
		require.NoError(t, err)
	}

	sub2 := subscribeJobWakes(t, f.wb, f.jtb, f.kvKey, "job-2")
	sub3 := subscribeJobWakes(t, f.wb, f.jtb, f.kvKey, "job-3")
	assert.Equal(t, 2, f.wb.wakeSubscriptions())

	// A heartbeat frees nothing: no wake-up is sent (publishWakes runs
	// before the write's call returns).
	published0, local0, noResponders0, _ := WakeCountsOf(f.a)
	require.Zero(t, published0+local0, "wake-ups before the heartbeat")
	ren, err := f.jta.Renew(ctx, acq.Lease)
	require.NoError(t, err)
	require.Equal(t, KindRenewed, ren.Kind)
	published, local, _, _ := WakeCountsOf(f.a)
	assert.Zero(t, published+local-published0-local0, "wake-ups sent by a heartbeat")

	rel, err := f.jta.Release(ctx, acq.Lease)
	require.NoError(t, err)
	require.Equal(t, KindReleased, rel.Kind)
	recv(t, sub2.Changed(), "job-2's wake-up")
	_, rev, err := f.b.Get(ctx, f.service, f.kvKey)
	require.NoError(t, err)
	hint := sub2.wake.entry.Marks().Hint
	assert.Equal(t, rev, hint, "the revision job-2's coordinator was hinted is the release's")
	published, _, noResponders, _ := WakeCountsOf(f.a)
	assert.Equal(t, uint64(1), published-published0, "one slot freed: one wake-up")
	assert.Equal(t, noResponders0, noResponders, "job-2's subject has a subscriber")
	require.Eventually(t, func() bool { _, _, _, r := WakeCountsOf(f.b); return r == 1 }, rtWait, time.Millisecond)
	select {
	case <-sub3.Changed():
		t.Fatal("job-3 was signalled by job-2's wake-up")
	default:
	}

	// job-2 acquires, on the state a read returns.
	acq2, err := f.jtb.Acquire(ctx, "job-2", jobWakePayload)
	require.NoError(t, err)
	require.Equal(t, KindAcquired, acq2.Kind)

	sub2.Close()
	recv(t, sub2.Done(), "the end of job-2's closed subscription")
	assert.Equal(t, 1, f.wb.wakeSubscriptions())
	f.wb.Close()
	recv(t, sub3.Done(), "the end of job-3's subscription at Watcher.Close")
	assert.Zero(t, f.wb.wakeSubscriptions())
}

// TestInTurnKeepsTheQueueOrder: a try in turn (a waiting Runner's) of
// job-3, queued behind job-2, which waits for its wake-ups in another
// process, finds the only slot free and writes nothing: it is blocked
// (the slot is free, for job-2) and sends job-2 the wake-up of that
// state; a try not in turn takes the slot. A retry is not held back.
func TestInTurnKeepsTheQueueOrder(t *testing.T) {
	t.Parallel()
	f := newJobWakeFixture(t)
	ctx := context.Background()
	for _, id := range []string{"job-2", "job-3"} {
		_, err := f.jta.Admit(ctx, id, jobWakePayload)
		require.NoError(t, err)
	}
	// The admissions left the slot free: their wake-ups find nobody, nor
	// do their resends. Let them end first, so that job-2's signal below
	// is job-3's try's.
	require.Eventually(t, func() bool {
		_, _, chains := wakeHubSize(f.a)
		return chains == 0
	}, 30*time.Second, time.Millisecond, "the wake-ups of store a end")
	wa, err := NewWatcher(f.a)
	require.NoError(t, err)
	t.Cleanup(wa.Close)
	sub2 := subscribeJobWakes(t, wa, f.jta, f.kvKey, "job-2")
	_, rev, err := f.b.Get(ctx, f.service, f.kvKey)
	require.NoError(t, err)

	acq, err := acquireInTurn(ctx, f.jtb, "job-3", jobWakePayload)
	require.NoError(t, err)
	assert.Equal(t, KindBlocked, acq.Kind)
	assert.Equal(t, ReasonActiveLimit, acq.Reason)
	assert.Less(t, acq.Active, acq.Limit, "blocked with the slot free, for the job ahead")
	_, now, err := f.b.Get(ctx, f.service, f.kvKey)
	require.NoError(t, err)
	assert.Equal(t, rev, now, "a try blocked in turn writes nothing")
	recv(t, sub2.Changed(), "job-2's wake-up, sent by job-3's try")

	// A retry is not queued: it takes the slot.
	acq, err = acquireInTurn(ctx, f.jtb, "job-9", jobWakePayload, WithRetry())
	require.NoError(t, err)
	require.Equal(t, KindAcquired, acq.Kind, "a retry tried in turn")
	_, err = f.jtb.Release(ctx, acq.Lease)
	require.NoError(t, err)

	acq, err = f.jtb.Acquire(ctx, "job-3", jobWakePayload)
	require.NoError(t, err)
	assert.Equal(t, KindAcquired, acq.Kind, "out of turn the reducer lets job-3 take the slot")
}
