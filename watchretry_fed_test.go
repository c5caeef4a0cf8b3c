package jobkeys

// Lost races on a key the watch feeds (internal/keycache/feedretry.go), with the writers
// as separate processes on their own connections to one embedded server:
// what TestHotKeyTrace (system_hotkey_trace_test.go) found on hot keys.

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jobkeys/jobkeys/internal/natstest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// raceHook runs a hook, once armed, before the next Create, Update or
// Delete that reaches the store it wraps: another process's write slipped in
// just before this one. It counts the store's reads and its lost
// compare-and-swaps.
type raceHook struct {
	hook      atomic.Pointer[func()]
	conflicts atomic.Int64 // Creates, Updates and Deletes that lost their compare-and-swap
	reads     atomic.Int64 // Gets
}

// wrap returns st wrapped for newWorkerProcess: a hookStore passing st's
// value limit through, running r's hook.
func (r *raceHook) wrap(st Store) Store {
	return newHookStore(st, passValueLimit).withHook(r.intercept)
}

func (r *raceHook) intercept(_ context.Context, c storeCall, call func() storeResult) storeResult {
	switch c.op {
	case opGet:
		r.reads.Add(1)
	case opCreate, opUpdate, opDelete:
		if h := r.hook.Swap(nil); h != nil {
			(*h)()
		}
		res := call()
		if errors.Is(res.err, ErrRevisionConflict) {
			r.conflicts.Add(1)
		}
		return res
	}
	return call()
}

// workerProcess is one worker process of a multi-process test: its own
// connection, store, coordinator, job type and Watcher.
type workerProcess struct {
	store *NATSStore
	coord *KeyCoordinator
	jt    *JobType
	w     *Watcher
}

func newWorkerProcess(t *testing.T, s *server.Server, service string, policy Policy, wrap func(Store) Store, cfg *Config) *workerProcess {
	t.Helper()
	_, js := natstest.Connect(t, s)
	store, err := NewNATSStore(js, WithCreateBuckets(jetstream.MemoryStorage, 1))
	require.NoError(t, err)
	var cs Store = store
	if wrap != nil {
		cs = wrap(store)
	}
	coord, err := NewCoordinator(cs, cfg)
	require.NoError(t, err)
	jt, err := coord.JobType(service, benchJobType, policy)
	require.NoError(t, err)
	w, err := NewWatcher(store)
	require.NoError(t, err)
	t.Cleanup(w.Close)
	return &workerProcess{store: store, coord: coord, jt: jt, w: w}
}

// TestReleaseLostRaceAnsweredByWatch: a release that loses its
// compare-and-swap to another process's admission on a key its watch feeds
// retries once the watch delivers that admission, instead of pausing by the
// key's backoff window while it holds the slot (with RetryBackoff an hour,
// the pause would outlast the release's timeout).
func TestReleaseLostRaceAnsweredByWatch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := natstest.Run(t)
	service := rtService()
	policy := Policy{Key: benchPolicy.Key, MaxActive: 1, MaxQueuedPerKey: 8}
	payload := benchPayload(0)

	hs := &raceHook{}
	mine := newWorkerProcess(t, s, service, policy, hs.wrap,
		&Config{RetryBackoff: time.Hour, MaxRetryBackoff: time.Hour})
	other := newWorkerProcess(t, s, service, policy, nil, nil)
	r, err := NewRunner(mine.jt, &RunnerConfig{Watcher: mine.w, ReleaseTimeout: 20 * time.Second})
	require.NoError(t, err)
	kvKey := mustKey(t, mine.jt, payload).KVKey

	// The other process holds the slot, so that mine waits for it through
	// its Watcher and its entry of the key is fed.
	_, err = other.jt.Admit(ctx, "o1", payload)
	require.NoError(t, err)
	held, err := other.jt.Acquire(ctx, "o1", payload)
	require.NoError(t, err)
	require.Equal(t, KindAcquired, held.Kind)
	_, err = mine.jt.Admit(ctx, "m1", payload)
	require.NoError(t, err)

	done := make(chan struct{})
	var res RunResult
	var runErr error
	go func() {
		defer close(done)
		res, runErr = r.Run(ctx, "m1", payload, func(context.Context, Lease) error {
			// Just before the release, the other process admits a job.
			hook := func() {
				adm, err := other.jt.Admit(ctx, "o2", payload)
				assert.NoError(t, err)
				assert.Equal(t, KindAccepted, adm.Kind)
			}
			hs.hook.Store(&hook)
			return nil
		})
	}()
	awaitOneWaiter(t, mine.w, service, kvKey, "m1 never waited")
	rel, err := other.jt.Release(ctx, held.Lease)
	require.NoError(t, err)
	require.Equal(t, KindReleased, rel.Kind)

	<-done
	require.NoError(t, runErr, "the release lost its race and paused instead of retrying on the watched admission")
	assert.Equal(t, KindReleased, res.Release)
	assert.GreaterOrEqual(t, hs.conflicts.Load(), int64(1), "the release never lost a race: the test did not test it")

	state, _, err := other.coord.read(ctx, mustKey(t, other.jt, payload))
	require.NoError(t, err)
	require.NotNil(t, state)
	assert.Empty(t, state.Active, "m1's slot is released")
	if assert.Len(t, state.Queued, 1) {
		assert.Equal(t, "o2", state.Queued[0].JobID, "the admission that won the race is kept")
	}
}

// fedProcesses is two worker processes on one key: mine, whose store
// hooks and counts (with a backoff window of an hour, so that any pause
// by it outlasts the test), and other; mine's entry of the key is fed by
// a waiter's subscription to its Watcher.
type fedProcesses struct {
	hs           *raceHook
	mine, other  *workerProcess
	key          JobKey
	payload      []byte
	service      string
	subscription *Subscription
}

func newFedProcesses(t *testing.T) *fedProcesses {
	t.Helper()
	s := natstest.Run(t)
	service := rtService()
	policy := Policy{Key: benchPolicy.Key, MaxActive: 1, MaxQueuedPerKey: 8}
	p := &fedProcesses{hs: &raceHook{}, payload: benchPayload(0), service: service}
	p.mine = newWorkerProcess(t, s, service, policy, p.hs.wrap,
		&Config{RetryBackoff: time.Hour, MaxRetryBackoff: time.Hour})
	p.other = newWorkerProcess(t, s, service, policy, nil, nil)
	p.key = mustKey(t, p.mine.jt, p.payload)
	sub, err := p.mine.w.subscribeWaiter(context.Background(), service, p.key.KVKey, "nobody", policy.MaxActive, p.mine.coord.keys)
	require.NoError(t, err)
	t.Cleanup(sub.Close)
	p.subscription = sub
	return p
}

// entry returns mine's entry of the key.
func (p *fedProcesses) entry(t *testing.T) *keyEntry {
	t.Helper()
	e := p.mine.coord.keys.entry(p.key.KVKey)
	require.NotNil(t, e, "a fed key has an entry")
	return e
}

// awaitFed waits until mine's entry holds, trusted, the key's stored
// revision (or, with the key absent, its absence).
func (p *fedProcesses) awaitFed(t *testing.T) {
	t.Helper()
	e := p.entry(t)
	require.Eventually(t, func() bool {
		_, rev, err := p.other.store.Get(context.Background(), p.service, p.key.KVKey)
		m := e.Marks()
		if errors.Is(err, ErrKeyNotFound) {
			return m.Watching > 0 && m.Fresh && !m.Known && m.WatchRev > 0
		}
		return err == nil && m.Trusted && m.Rev == rev
	}, rtWait, time.Millisecond, "mine's entry is never fed the key's latest state")
}

// armOtherAdmits makes the other process admit jobID just before mine's
// next write (see otherAdmits).
func (p *fedProcesses) armOtherAdmits(t *testing.T, jobID string) {
	hook := func() { p.otherAdmits(t, jobID) }
	p.hs.hook.Store(&hook)
}

// otherAdmits has the other process admit jobID, then waits until mine's
// feed has delivered that write (the write mine's is about to lose to),
// so that a loaded machine's slow delivery does not send mine to a read
// after watchFallback.
func (p *fedProcesses) otherAdmits(t *testing.T, jobID string) {
	ctx := context.Background()
	adm, err := p.other.jt.Admit(ctx, jobID, p.payload)
	assert.NoError(t, err)
	assert.Equal(t, KindAccepted, adm.Kind)
	assert.False(t, adm.AlreadyPresent)
	_, rev, err := p.other.store.Get(ctx, p.service, p.key.KVKey)
	assert.NoError(t, err)
	e := p.mine.coord.keys.entry(p.key.KVKey)
	assert.Eventually(t, func() bool {
		return e.Marks().WatchRev >= rev
	}, rtWait, time.Millisecond, "mine's feed never delivers the other's admission")
}

// queued returns the ids of the jobs queued on the key, read by the other
// process.
func (p *fedProcesses) queued(t *testing.T) []string {
	t.Helper()
	st, _, err := p.other.coord.read(context.Background(), p.key)
	require.NoError(t, err)
	require.NotNil(t, st)
	var ids []string
	for _, q := range st.Queued {
		ids = append(ids, q.JobID)
	}
	return ids
}

// TestFedCreateLostToCreateStartsFromDelivery: the key emptied (deleted),
// the delete delivered to mine's fed entry; mine's admission creates it
// without a read and loses to the other process's create. It retries from
// the watch's delivery of that create, not from a read (the old code read).
func TestFedCreateLostToCreateStartsFromDelivery(t *testing.T) {
	t.Parallel()
	p := newFedProcesses(t)
	ctx := context.Background()
	_, err := p.other.jt.Admit(ctx, "o1", p.payload)
	require.NoError(t, err)
	acq, err := p.other.jt.Acquire(ctx, "o1", p.payload)
	require.NoError(t, err)
	require.Equal(t, KindAcquired, acq.Kind)
	rel, err := p.other.jt.Release(ctx, acq.Lease)
	require.NoError(t, err)
	require.Equal(t, KindReleased, rel.Kind)
	p.awaitFed(t) // absent, the delete delivered

	p.armOtherAdmits(t, "o2")
	reads := p.hs.reads.Load()
	actx, cancel := context.WithTimeout(ctx, rtWait)
	defer cancel()
	adm, err := p.mine.jt.Admit(actx, "m1", p.payload)
	require.NoError(t, err)
	assert.Equal(t, KindAccepted, adm.Kind)
	assert.Equal(t, int64(1), p.hs.conflicts.Load(), "one create lost to the other's: the test did not test it, or the retry lost again")
	assert.Equal(t, reads, p.hs.reads.Load(), "the retry started from the watch's delivery of the other's create, not a read")
	assert.Equal(t, []string{"o2", "m1"}, p.queued(t))
}

// TestFedAdmitAlreadyPresentReadsAtOnce: an admission of a job already
// queued, on a key its watch feeds, finds it queued in the fed state,
// which writes nothing and may be stale, so it reads to confirm: at once,
// with no pause (the old code took that outcome for a lost race and
// paused by the key's window, an hour here).
func TestFedAdmitAlreadyPresentReadsAtOnce(t *testing.T) {
	t.Parallel()
	p := newFedProcesses(t)
	_, err := p.other.jt.Admit(context.Background(), "o1", p.payload)
	require.NoError(t, err)
	p.awaitFed(t)

	reads := p.hs.reads.Load()
	ctx, cancel := context.WithTimeout(context.Background(), rtWait)
	defer cancel()
	adm, err := p.mine.jt.Admit(ctx, "o1", p.payload)
	require.NoError(t, err, "the admission paused instead of reading")
	assert.Equal(t, KindAccepted, adm.Kind)
	assert.True(t, adm.AlreadyPresent)
	assert.Equal(t, reads+1, p.hs.reads.Load(), "one read confirms the outcome")
	assert.Zero(t, p.hs.conflicts.Load())
}

// TestFedAdmitMaxAttempts: on a key its watch feeds, an admission whose
// every write loses to another process's still fails with ErrContention
// after Config.MaxAttempts lost races, each retried from the watch's
// delivery of the write that won, with no read.
func TestFedAdmitMaxAttempts(t *testing.T) {
	t.Parallel()
	const attempts = 8
	s := natstest.Run(t)
	service := rtService()
	policy := Policy{Key: benchPolicy.Key, MaxActive: 1, MaxQueuedPerKey: 4 * attempts}
	payload := benchPayload(0)
	hs := &raceHook{}
	mine := newWorkerProcess(t, s, service, policy, hs.wrap,
		&Config{MaxAttempts: attempts, RetryBackoff: time.Millisecond, MaxRetryBackoff: 2 * time.Millisecond})
	other := newWorkerProcess(t, s, service, policy, nil, nil)
	key := mustKey(t, mine.jt, payload)
	sub, err := mine.w.subscribeWaiter(context.Background(), service, key.KVKey, "nobody", policy.MaxActive, mine.coord.keys)
	require.NoError(t, err)
	defer sub.Close()
	p := &fedProcesses{hs: hs, mine: mine, other: other, key: key, payload: payload, service: service}
	_, err = other.jt.Admit(context.Background(), "o0", payload)
	require.NoError(t, err)
	p.awaitFed(t)

	// Before each of mine's writes, the other process admits a job.
	var n atomic.Int64
	var hook func()
	hook = func() {
		p.otherAdmits(t, fmt.Sprintf("o%d", n.Add(1)))
		hs.hook.Store(&hook)
	}
	hs.hook.Store(&hook)
	defer hs.hook.Store(nil)
	reads := hs.reads.Load()
	ctx, cancel := context.WithTimeout(context.Background(), rtWait)
	defer cancel()
	_, err = mine.jt.Admit(ctx, "m1", payload)
	require.ErrorIs(t, err, ErrContention)
	assert.ErrorContains(t, err, fmt.Sprintf("%d compare-and-swap attempts lost", attempts))
	assert.Equal(t, int64(attempts), hs.conflicts.Load(), "one write per attempt")
	assert.Equal(t, reads, hs.reads.Load(), "every retry started from the watch's delivery, not a read")
	assert.NotContains(t, p.queued(t), "m1")
}

// A release on a key the Watcher feeds (3c67174: it does not pause after a
// lost race there) whose lost races the watch never answers, since nothing
// was written: it falls back to a read after watchFallback each time, not
// a busy loop, and succeeds once the races stop, not held up by the key's
// backoff window (an hour here).
func TestFedReleaseLostRacesWithoutDelivery(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	mem := NewMemoryStore()
	// While armed, the store fails every Update with a conflict that
	// writes nothing, and counts them.
	var armed atomic.Bool
	var fakeConflicts atomic.Int64
	st := newHookStore(mem, passAll).withHook(func(_ context.Context, c storeCall, call func() storeResult) storeResult {
		if c.op == opUpdate && armed.Load() {
			fakeConflicts.Add(1)
			return storeResult{err: fmt.Errorf("%w: injected by the test", ErrRevisionConflict)}
		}
		return call()
	})
	c := cCoordinator(t, st, &Config{RetryBackoff: time.Hour, MaxRetryBackoff: time.Hour})
	w, err := NewWatcher(mem)
	require.NoError(t, err)
	t.Cleanup(w.Close)
	svc := jkService("nodeliver")
	p := Policy{Key: cPolicy().Key, MaxActive: 1, MaxQueuedPerKey: 4, HeartbeatInterval: time.Second, HeartbeatTTL: time.Minute}
	key := cKey(t, svc)

	// A waiter's subscription feeds the key's changes to c's entry.
	sub, err := w.subscribeWaiter(ctx, svc, key.KVKey, "other", p.MaxActive, c.keys)
	require.NoError(t, err)
	defer sub.Close()
	for _, id := range []string{"j1", "j2"} { // j2 stays queued: the release is an Update
		_, err = c.Admit(ctx, cAdmit(svc, id, p))
		require.NoError(t, err)
	}
	acq, err := c.Acquire(ctx, cAcquire(svc, "j1", p, false))
	require.NoError(t, err)
	require.Equal(t, KindAcquired, acq.Kind)
	e := c.keys.entry(key.KVKey)
	require.NotNil(t, e)
	require.Eventually(t, e.Fed, rtWait, time.Millisecond, "the entry is never fed")

	const racing = 500 * time.Millisecond
	armed.Store(true)
	time.AfterFunc(racing, func() { armed.Store(false) })
	rctx, cancel := context.WithTimeout(ctx, rtWait)
	defer cancel()
	start := time.Now()
	rel, err := c.Release(rctx, ReleaseRequest{Lease: acq.Lease})
	took := time.Since(start)
	require.NoError(t, err, "the release paused by the key's window (an hour) after %v", took)
	assert.Equal(t, KindReleased, rel.Kind)
	fakes := fakeConflicts.Load()
	t.Logf("%d lost races in %v", fakes, took)
	require.Positive(t, fakes, "the release never lost a race: the test did not test it")
	// One attempt per watchFallback at most (and the first at once), with
	// room for a loaded machine's late timers: not a loop without pauses.
	assert.LessOrEqual(t, fakes, int64(2+racing/watchFallback), "attempts while the races lasted")
}
