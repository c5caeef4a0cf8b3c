package jobkeys

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jobkeys/jobkeys/internal/natstest"
)

// newStaleWakeFixture returns a jobWakeFixture whose job types have
// policy p, and whose coordinator over store b runs an hour ahead: by its
// clock the leases store a's coordinator grants have expired.
func newStaleWakeFixture(t *testing.T, p Policy) *jobWakeFixture {
	t.Helper()
	ahead := func() time.Time { return time.Now().Add(time.Hour) }
	return newJobWakeFixtureWith(t, p, wakeProcConfig{}, wakeProcConfig{coord: &Config{Now: ahead, IgnoreClockSkew: true}})
}

// TestInTurnStaleBlockWakesTheJobAhead: under StalePolicy Block,
// with two slots, one taken by an expired lease (taken still) and one
// free, a try in turn of job-3 (a waiting Runner's), queued behind job-2,
// which waits in another process, is blocked in turn and sends job-2 the
// wake-up of the free slot. (wakeAhead counted the expired slot as free,
// found job-3 among the jobs two free slots were for, and sent nothing:
// job-2 waited for its recheck.)
func TestInTurnStaleBlockWakesTheJobAhead(t *testing.T) {
	t.Parallel()
	f := newStaleWakeFixture(t, Policy{Key: []string{"/t"}, MaxActive: 2, MaxQueuedPerKey: 5, StalePolicy: Block})
	ctx := context.Background()
	for _, id := range []string{"job-1", "job-2", "job-3"} {
		_, err := f.jta.Admit(ctx, id, jobWakePayload)
		require.NoError(t, err)
	}
	acq, err := f.jta.Acquire(ctx, "job-1", jobWakePayload)
	require.NoError(t, err)
	require.Equal(t, KindAcquired, acq.Kind)
	// The admissions and job-1's acquisition left slots free: their
	// wake-ups find nobody, nor do their resends. Let them end first.
	require.Eventually(t, func() bool {
		_, _, chains := wakeHubSize(f.a)
		return chains == 0
	}, 30*time.Second, time.Millisecond, "the wake-ups of store a end")
	wa, err := NewWatcher(f.a)
	require.NoError(t, err)
	t.Cleanup(wa.Close)
	sub2 := subscribeJobWakes(t, wa, f.jta, f.kvKey, "job-2")

	got, err := acquireInTurn(ctx, f.jtb, "job-3", jobWakePayload)
	require.NoError(t, err)
	require.Equal(t, KindBlocked, got.Kind)
	assert.Equal(t, ReasonActiveLimit, got.Reason)
	assert.Less(t, got.Active, got.Limit, "blocked with a slot free, for the job ahead")
	recv(t, sub2.Changed(), "job-2's wake-up, sent by job-3's try")
}

// TestWakeLostOutcomeFiguresStaleBlock: under StalePolicy Block the
// blocked outcome of a woken try whose write lost counts the expired
// slots as taken, as ReduceAcquire's does (Block keeps them): with both
// slots held by leases expired by its clock, Active is the limit, not 0
// ("0 active, limit 2": as if both slots were free).
func TestWakeLostOutcomeFiguresStaleBlock(t *testing.T) {
	t.Parallel()
	got, _, _ := wakeLostStaleBlock(t, "wakelostblock")
	require.Equal(t, KindBlocked, got.Kind)
	assert.Equal(t, 2, got.Limit)
	assert.Equal(t, 2, got.Active, "both slots, expired but kept under Block")
	assert.Equal(t, 2, got.Queued, "j2 and j3")
}

// wakeLostStaleBlockPolicy is the policy of wakeLostStaleBlock's key.
var wakeLostStaleBlockPolicy = Policy{Key: benchPolicy.Key, MaxActive: 2, MaxQueuedPerKey: 8, StalePolicy: Block}

// wakeLostStaleBlock sets the scene of a woken try that loses under
// StalePolicy Block and returns its outcome, the state it lost to and the
// key.
// Coordinator b (on time) admits j0–j2 and gives j0 a slot; a, whose clock
// runs an hour ahead (every lease b grants has expired by it), learns that
// state (j0's slot expired but taken under Block, one slot free) by
// admitting j3; b takes the free slot for j1, and that state reaches a
// while a's woken try for j2, on the older state, fails.
func wakeLostStaleBlock(t *testing.T, service string) (got Acquisition, lostTo *KeyState, key JobKey) {
	t.Helper()
	s := natstest.Run(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	policy := wakeLostStaleBlockPolicy
	service = jkService(service)
	payload := benchPayload(0)

	var then func()
	pa := newWakeProc(t, s, service, policy, wakeProcConfig{
		uncounted: true,
		coord:     &Config{Now: wakeLostStaleBlockNow, IgnoreClockSkew: true},
		wrap: func(st Store) Store {
			// A bare Store: no wake-ups, batches or clock.
			return newHookStore(st, passNone).withHook(thenOnLostUpdate(&then))
		},
	})
	pb := newWakeProc(t, s, service, policy, wakeProcConfig{uncounted: true})
	a, ja, b, jb := pa.c, pa.jt, pb.c, pb.jt
	key, err := ja.Key(payload)
	require.NoError(t, err)
	for _, id := range []string{"j0", "j1", "j2"} {
		adm, err := jb.Admit(ctx, id, payload)
		require.NoError(t, err)
		require.Equal(t, KindAccepted, adm.Kind)
	}
	acq, err := jb.Acquire(ctx, "j0", payload)
	require.NoError(t, err)
	require.Equal(t, KindAcquired, acq.Kind)
	_, err = ja.Admit(ctx, "j3", payload)
	require.NoError(t, err)
	acq, err = jb.Acquire(ctx, "j1", payload)
	require.NoError(t, err)
	require.Equal(t, KindAcquired, acq.Kind)
	then = func() {
		value, rev, err := b.store.Get(ctx, service, key.KVKey)
		require.NoError(t, err)
		st, err := decodeState(value)
		require.NoError(t, err)
		lostTo = st
		e := a.keys.entry(key.KVKey)
		e.Observe(st, rev, e.FeedMark())
	}
	wt := &waitTry{wake: true}
	got, err = acquireJobTry(ctx, ja, wt, "j2", payload)
	require.NoError(t, err)
	require.NotNil(t, lostTo, "the try's write lost")
	return got, lostTo, key
}

// wakeLostStaleBlockNow is the clock of wakeLostStaleBlock's coordinator a:
// an hour ahead.
func wakeLostStaleBlockNow() time.Time { return time.Now().Add(time.Hour) }

// assertBlockKeptTheSlot checks, under StalePolicy Block with one slot
// taken by an expired lease, that store b sent no wake-up, that sub (job's
// wake-ups) was not signalled, and that job-2, first queued, is blocked by
// the expired slot Block keeps (the slot is indeed not free).
func (f *jobWakeFixture) assertBlockKeptTheSlot(t *testing.T, ctx context.Context, sub *Subscription, job string) {
	t.Helper()
	published, local, _, _ := WakeCountsOf(f.b)
	assert.Zero(t, published+local, "wake-ups sent for an expired slot Block keeps taken")
	select {
	case <-sub.Changed():
		t.Fatalf("%s was woken (before) for a slot Block keeps taken", job)
	default:
	}
	got, err := f.jtb.Acquire(ctx, "job-2", jobWakePayload)
	require.NoError(t, err)
	assert.Equal(t, KindBlocked, got.Kind)
	assert.Equal(t, ReasonStaleBlocked, got.Reason)
	select {
	case <-sub.Changed():
		t.Fatalf("%s was woken for a slot Block keeps taken", job)
	default:
	}
}

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
			sub2 := subscribeJobWakes(t, f.wb, f.jtb, f.kvKey, "job-2")

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
