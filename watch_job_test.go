package jobkeys

import (
	"context"
	"github.com/nats-io/nats.go"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jobkeys/jobkeys/internal/natstest"
)

// WakeCountsOf returns the wake-up counters of s (NATSStore.wakeCounters)
// for the tests of package jobkeys_test, which run the jobs runtime over
// wake-ups (watch_job_runtime_test.go).
func WakeCountsOf(s *NATSStore) (published, local, noResponders, received uint64) {
	n := s.wakeCounters()
	return n.Published, n.Local, n.NoResponders, n.Received
}

// jobWakeFixture is the natsWakeFixture's key with a coordinator and a job
// type over each of two wake-up stores on connections of their own: a
// writer (a) and a waiter (b) process.
type jobWakeFixture struct {
	*natsWakeFixture
	a, b     *NATSStore
	ncA      *nats.Conn // a's connection
	jta, jtb *JobType
	wb       *Watcher // over b
}

var jobWakePayload = []byte(`{"t":"acme"}`)

func newJobWakeFixture(t *testing.T) *jobWakeFixture {
	t.Helper()
	f := &jobWakeFixture{natsWakeFixture: newNATSWakeFixture(t)}
	f.a, f.ncA = f.store(t, WithCreateBuckets(0, 1))
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
	return f
}

// TestSubscribeJobRefusesBadInput: every input subscribeJob cannot use is
// an error saying which, never a panic or a subscription that is never
// signalled.
func TestSubscribeJobRefusesBadInput(t *testing.T) {
	t.Parallel()
	f := newJobWakeFixture(t)
	ctx := context.Background()

	// A store without wake-ups, and a coordinator over another store.
	_, js := natstest.Connect(t, f.srv)
	plain, err := NewNATSStore(js)
	require.NoError(t, err)
	wPlain, err := NewWatcher(plain)
	require.NoError(t, err)
	defer wPlain.Close()
	assert.Nil(t, wPlain.wakeUps())
	assert.NotNil(t, f.wb.wakeUps())
	assert.Nil(t, (*Watcher)(nil).wakeUps())
	assert.Nil(t, (&Watcher{}).wakeUps())
	other, err := DeriveKey(f.service, "other", jobWakePayload, []string{"/t"})
	require.NoError(t, err)

	for _, tc := range []struct {
		name  string
		w     *Watcher
		jt    *JobType
		kvKey string
		job   string
		want  string
	}{
		{"nil watcher", nil, f.jtb, f.kvKey, "j", "not made by NewWatcher"},
		{"zero watcher", &Watcher{}, f.jtb, f.kvKey, "j", "not made by NewWatcher"},
		{"nil job type", f.wb, nil, f.kvKey, "j", "job type is nil"},
		{"zero job type", f.wb, &JobType{}, f.kvKey, "j", "job type is nil"},
		{"no wake-ups", wPlain, f.jtb, f.kvKey, "j", "has no wake-ups"},
		{"job type of another store", f.wb, f.jta, f.kvKey, "j", "another store"},
		{"key of another job type", f.wb, f.jtb, other.KVKey, "j", "is not a KV key of job type"},
		{"not a key", f.wb, f.jtb, f.service + ".render.xyz", "j", "is not a KV key of job type"},
		{"upper-case hash", f.wb, f.jtb, f.service + ".render." + "ABCDEF0123456789ABCDEF0123456789ABCDEF0123456789ABCDEF0123456789", "j", "is not a KV key"},
		{"empty job id", f.wb, f.jtb, f.kvKey, "", "empty or not valid UTF-8"},
		{"job id not UTF-8", f.wb, f.jtb, f.kvKey, "j\xff", "empty or not valid UTF-8"},
	} {
		sub, err := tc.w.subscribeJob(ctx, tc.jt, tc.kvKey, tc.job)
		require.ErrorIs(t, err, ErrInvalidRequest, tc.name)
		assert.ErrorContains(t, err, tc.want, tc.name)
		assert.Nil(t, sub, tc.name)
	}

	cctx, cancel := context.WithCancel(ctx)
	cancel()
	_, err = f.wb.subscribeJob(cctx, f.jtb, f.kvKey, "j")
	require.ErrorIs(t, err, context.Canceled)

	w, err := NewWatcher(f.b)
	require.NoError(t, err)
	w.Close()
	_, err = w.subscribeJob(ctx, f.jtb, f.kvKey, "j")
	require.ErrorIs(t, err, ErrWatcherClosed)
	assert.Zero(t, f.wb.wakeSubscriptions(), "a refused subscription is not kept")
}

// TestSubscribeJobSignalledByItsOwnWakeUps: a subscription of subscribeJob
// in one process is signalled by the release another process makes that
// frees a slot for its job, and not by a heartbeat (which frees nothing)
// nor by the wake-ups of other jobs; the wake-up, from another process,
// leaves the waiter's coordinator the release's revision as a hint (its
// next Acquire reads), not the state it carries; Close and Watcher.Close
// end such subscriptions.
func TestSubscribeJobSignalledByItsOwnWakeUps(t *testing.T) {
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

	sub2, err := f.wb.subscribeJob(ctx, f.jtb, f.kvKey, "job-2")
	require.NoError(t, err)
	defer sub2.Close()
	sub3, err := f.wb.subscribeJob(ctx, f.jtb, f.kvKey, "job-3")
	require.NoError(t, err)
	defer sub3.Close()
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
	sub2.wake.entry.mu.Lock()
	hint := sub2.wake.entry.hint
	sub2.wake.entry.mu.Unlock()
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

// taggedWakeStore is a store of a comparable type whose values == cannot
// compare: its tags hold a slice.
type taggedWakeStore struct {
	*NATSStore
	tags any
}

// TestSubscribeJobUncomparableStoreNoPanic: a Watcher and a coordinator
// over a wrapped store whose type is comparable but whose value holds
// something == cannot compare are refused (subscribeJob cannot tell them
// the same store), not a panic.
func TestSubscribeJobUncomparableStoreNoPanic(t *testing.T) {
	t.Parallel()
	f := newJobWakeFixture(t)
	s := taggedWakeStore{NATSStore: f.b, tags: []string{"b"}}
	c, err := NewCoordinator(s, nil)
	require.NoError(t, err)
	jt, err := c.JobType(f.service, "render", Policy{Key: []string{"/t"}, MaxActive: 1, MaxQueuedPerKey: 5})
	require.NoError(t, err)
	w, err := NewWatcher(s)
	require.NoError(t, err)
	defer w.Close()
	require.NotNil(t, w.wakeUps())
	var sub *Subscription
	require.NotPanics(t, func() { sub, err = w.subscribeJob(context.Background(), jt, f.kvKey, "job-1") })
	require.ErrorIs(t, err, ErrInvalidRequest)
	assert.ErrorContains(t, err, "another store")
	assert.Nil(t, sub)
	assert.Zero(t, w.wakeSubscriptions())
}

// TestPassWakeUpWakesTheJobsAfterALeavingWaiter: job-2, woken by the
// release that freed the only slot, leaves without acquiring it (its
// queue entry stays: paused, its process stopping) and hands its wake-up
// on with passWakeUp: job-3, queued behind it, is woken with the state at
// the release's revision. passWakeUp sends nothing while no slot is free,
// nor for a job that is not queued, and refuses bad input.
func TestPassWakeUpWakesTheJobsAfterALeavingWaiter(t *testing.T) {
	t.Parallel()
	f := newJobWakeFixture(t)
	ctx := context.Background()
	_, err := f.jta.Admit(ctx, "job-1", jobWakePayload)
	require.NoError(t, err)
	acq, err := f.jta.Acquire(ctx, "job-1", jobWakePayload)
	require.NoError(t, err)
	require.Equal(t, KindAcquired, acq.Kind)
	for _, id := range []string{"job-2", "job-3"} {
		_, err := f.jta.Admit(ctx, id, jobWakePayload)
		require.NoError(t, err)
	}
	sub2, err := f.wb.subscribeJob(ctx, f.jtb, f.kvKey, "job-2")
	require.NoError(t, err)
	defer sub2.Close()
	sub3, err := f.wb.subscribeJob(ctx, f.jtb, f.kvKey, "job-3")
	require.NoError(t, err)
	defer sub3.Close()

	// The key is full: nothing to hand on.
	require.NoError(t, f.jtb.passWakeUp(ctx, "job-2", jobWakePayload))
	published, local, _, _ := WakeCountsOf(f.b)
	assert.Zero(t, published+local, "wake-ups handed on while the key is full")

	rel, err := f.jta.Release(ctx, acq.Lease)
	require.NoError(t, err)
	require.Equal(t, KindReleased, rel.Kind)
	recv(t, sub2.Changed(), "job-2's wake-up")
	select {
	case <-sub3.Changed():
		t.Fatal("job-3 was woken by the release of the only slot, which is job-2's")
	default:
	}
	_, rev, err := f.b.Get(ctx, f.service, f.kvKey)
	require.NoError(t, err)

	// Not queued: its removal would have woken the next job.
	require.NoError(t, f.jtb.passWakeUp(ctx, "job-9", jobWakePayload))
	published, local, _, _ = WakeCountsOf(f.b)
	assert.Zero(t, published+local, "wake-ups handed on for a job that is not queued")

	sub2.Close()
	require.NoError(t, f.jtb.passWakeUp(ctx, "job-2", jobWakePayload))
	recv(t, sub3.Changed(), "job-3's wake-up, handed on by job-2")
	got, _ := sub3.wake.entry.seen()
	assert.Equal(t, rev, got, "the state handed on is the release's")
	acq3, err := f.jtb.Acquire(ctx, "job-3", jobWakePayload)
	require.NoError(t, err)
	assert.Equal(t, KindAcquired, acq3.Kind, "job-3 takes the slot job-2 left")

	for _, tc := range []struct {
		name string
		jt   *JobType
		job  string
		want error
	}{
		{"nil job type", nil, "job-2", ErrInvalidRequest},
		{"zero job type", &JobType{}, "job-2", ErrInvalidRequest},
		{"empty job id", f.jtb, "", ErrInvalidRequest},
		{"invalid UTF-8 job id", f.jtb, "\xff", ErrInvalidRequest},
	} {
		assert.ErrorIs(t, tc.jt.passWakeUp(ctx, tc.job, jobWakePayload), tc.want, tc.name)
	}
	assert.ErrorIs(t, f.jtb.passWakeUp(ctx, "job-2", []byte(`{}`)), ErrInvalidKey, "a payload without the key's field")
}

// getCountingStore counts its store's Gets.
type getCountingStore struct {
	Store
	gets atomic.Int64
}

func (s *getCountingStore) Get(ctx context.Context, service, key string) ([]byte, uint64, error) {
	s.gets.Add(1)
	return s.Store.Get(ctx, service, key)
}

// TestPassWakeUpWithoutWakeUpsDoesNothing: over a store without wake-ups
// passWakeUp reads nothing (and has nothing to send).
func TestPassWakeUpWithoutWakeUpsDoesNothing(t *testing.T) {
	t.Parallel()
	st := &getCountingStore{Store: NewMemoryStore()}
	c, err := NewCoordinator(st, nil)
	require.NoError(t, err)
	jt, err := c.JobType("svc", "render", Policy{Key: []string{"/t"}})
	require.NoError(t, err)
	ctx := context.Background()
	_, err = jt.Admit(ctx, "job-1", jobWakePayload)
	require.NoError(t, err)
	gets := st.gets.Load()
	assert.NoError(t, jt.passWakeUp(ctx, "job-1", jobWakePayload))
	assert.Equal(t, gets, st.gets.Load(), "reads of passWakeUp without wake-ups")
}

// TestWithQueueTurnKeepsTheQueueOrder: with queueTurn, an acquisition
// of job-3, queued behind job-2, which waits for its wake-ups in another
// process, finds the only slot free and writes nothing: it is blocked
// (the slot is free, for job-2) and sends job-2 the wake-up of that
// state; without the option it takes the slot. A retry is not held back.
func TestWithQueueTurnKeepsTheQueueOrder(t *testing.T) {
	t.Parallel()
	f := newJobWakeFixture(t)
	ctx := context.Background()
	for _, id := range []string{"job-2", "job-3"} {
		_, err := f.jta.Admit(ctx, id, jobWakePayload)
		require.NoError(t, err)
	}
	wa, err := NewWatcher(f.a)
	require.NoError(t, err)
	t.Cleanup(wa.Close)
	sub2, err := wa.subscribeJob(ctx, f.jta, f.kvKey, "job-2")
	require.NoError(t, err)
	defer sub2.Close()
	_, rev, err := f.b.Get(ctx, f.service, f.kvKey)
	require.NoError(t, err)

	acq, err := f.jtb.Acquire(ctx, "job-3", jobWakePayload, queueTurn())
	require.NoError(t, err)
	assert.Equal(t, KindBlocked, acq.Kind)
	assert.Equal(t, ReasonActiveLimit, acq.Reason)
	assert.Less(t, acq.Active, acq.Limit, "blocked with the slot free, for the job ahead")
	_, now, err := f.b.Get(ctx, f.service, f.kvKey)
	require.NoError(t, err)
	assert.Equal(t, rev, now, "a try blocked in turn writes nothing")
	recv(t, sub2.Changed(), "job-2's wake-up, sent by job-3's try")

	// A retry is not queued: it takes the slot.
	acq, err = f.jtb.Acquire(ctx, "job-9", jobWakePayload, WithRetry(), queueTurn())
	require.NoError(t, err)
	require.Equal(t, KindAcquired, acq.Kind, "a retry with queueTurn")
	_, err = f.jtb.Release(ctx, acq.Lease)
	require.NoError(t, err)

	acq, err = f.jtb.Acquire(ctx, "job-3", jobWakePayload)
	require.NoError(t, err)
	assert.Equal(t, KindAcquired, acq.Kind, "without queueTurn the reducer lets job-3 take the slot")
}
