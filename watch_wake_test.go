package jobkeys

// Tests of who a Watcher wakes (issue 11): only as many waiters as a change
// leaves slots free, in arrival order; nobody on a heartbeat; and a wake-up
// a waiter did not use passes on to the next.

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// wakeFixture is one key with MaxActive 2 and waiters on it. Not a
// wakeProc (wake_fixture_test.go): one coordinator and its Watcher, on a
// memory or a NATS store, without targeted wake-ups, whose tests subscribe
// waiters by hand.
type wakeFixture struct {
	t       *testing.T
	store   rtStore
	w       *Watcher
	jt      *JobType
	service string
	kvKey   string
	payload []byte
}

func newWakeFixture(t *testing.T, store rtStore) *wakeFixture {
	c, err := NewCoordinator(store, nil)
	require.NoError(t, err)
	service := rtService()
	jt, err := c.JobType(service, benchJobType, Policy{Key: benchPolicy.Key, MaxActive: 2, MaxQueuedPerKey: 16})
	require.NoError(t, err)
	w, err := NewWatcher(store)
	require.NoError(t, err)
	t.Cleanup(w.Close)
	payload := benchPayload(0)
	key, err := jt.Key(payload)
	require.NoError(t, err)
	return &wakeFixture{t: t, store: store, w: w, jt: jt, service: service, kvKey: key.KVKey, payload: payload}
}

func (f *wakeFixture) admit(ids ...string) {
	for _, id := range ids {
		adm, err := f.jt.Admit(context.Background(), id, f.payload)
		require.NoError(f.t, err)
		require.Equal(f.t, KindAccepted, adm.Kind, "admit %s", id)
	}
}

func (f *wakeFixture) acquire(id string) Lease {
	acq, err := f.jt.Acquire(context.Background(), id, f.payload)
	require.NoError(f.t, err)
	require.Equal(f.t, KindAcquired, acq.Kind, "acquire %s", id)
	return acq.Lease
}

// rev returns the key's revision in the store.
func (f *wakeFixture) rev() uint64 {
	_, rev, err := f.store.Get(context.Background(), f.service, f.kvKey)
	require.NoError(f.t, err)
	return rev
}

// settle waits until the Watcher has dispatched the key's change at the
// store's current revision.
func (f *wakeFixture) settle() {
	want := f.rev()
	require.Eventually(f.t, func() bool {
		f.w.mu.Lock()
		defer f.w.mu.Unlock()
		sw := f.w.watches[f.service]
		return sw != nil && sw.keys[f.kvKey] != nil && sw.keys[f.kvKey].rev >= want
	}, rtWait, time.Millisecond, "the watcher never delivered revision %d", want)
}

// waiters subscribes waiters for the jobs ids, in order, each having found
// the key busy at its current revision.
func (f *wakeFixture) waiters(ids ...string) []*Subscription {
	subs := make([]*Subscription, len(ids))
	for i := range subs {
		sub, err := f.w.subscribeWaiter(context.Background(), f.service, f.kvKey, ids[i], 2, f.jt.coord.keys)
		require.NoError(f.t, err)
		f.t.Cleanup(sub.Close)
		sub.rearm(f.rev())
		subs[i] = sub
	}
	return subs
}

// woken returns which of subs have a wake-up pending, consuming them.
func woken(subs []*Subscription) []int {
	var got []int
	for i, s := range subs {
		if pending(s.Changed()) {
			got = append(got, i)
		}
	}
	return got
}

// A heartbeat (a renewal) wakes no waiter; a release wakes exactly as many
// waiters as there are free slots, in arrival order; a woken waiter that
// gives up without acquiring hands its wake-up to the next one.
func TestWatcherWakesOnlyForFreeSlots(t *testing.T) {
	t.Parallel()
	for name, open := range rtStores(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			f := newWakeFixture(t, open(t))
			f.admit("a", "b", "w0", "w1", "w2", "w3")
			la, lb := f.acquire("a"), f.acquire("b")
			subs := f.waiters("w0", "w1", "w2", "w3")

			_, err := f.jt.Renew(ctx, la)
			require.NoError(t, err)
			f.settle()
			assert.Empty(t, woken(subs), "a heartbeat woke waiters")

			rel, err := f.jt.Release(ctx, lb)
			require.NoError(t, err)
			require.Equal(t, KindReleased, rel.Kind)
			f.settle()
			assert.Equal(t, []int{0}, woken(subs), "one slot freed: the first waiter, and only it")

			// The woken waiter gives up without acquiring: its wake-up
			// must not be lost. Its job is still queued ahead, and may be
			// another process's to try: the next waits waiterGrace first.
			subs[0].Close()
			var next []int
			require.Eventually(t, func() bool {
				next = append(next, woken(subs[1:])...)
				return len(next) > 0
			}, rtWait, time.Millisecond, "the wake-up was lost")
			assert.Equal(t, []int{0}, next, "the next waiter (index 0 of the rest) and only it")
			time.Sleep(3 * waiterGrace)
			assert.Empty(t, woken(subs[1:]), "more waiters woken than slots free")

			_, err = f.jt.Renew(ctx, la)
			require.NoError(t, err)
			f.settle()
			assert.Empty(t, woken(subs[1:]), "a heartbeat woke waiters while one was trying")

			rel, err = f.jt.Release(ctx, la)
			require.NoError(t, err)
			require.Equal(t, KindReleased, rel.Kind)
			f.settle()
			// Two slots free, one of them already being tried by w1.
			assert.Equal(t, []int{0}, woken(subs[2:]), "two slots free with one waiter trying: one more, the next in line")
		})
	}
}

// A woken waiter whose try finds the key busy again (another process took
// the slot first) goes back to waiting without using up a later wake-up,
// and is woken again when a slot frees; one woken on a change it has
// already seen is not woken by it again.
func TestWatcherRearmAfterLostSlot(t *testing.T) {
	t.Parallel()
	for name, open := range rtStores(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			f := newWakeFixture(t, open(t))
			other, err := NewCoordinator(f.store, nil)
			require.NoError(t, err)
			otherJT, err := other.JobType(f.service, benchJobType, f.jt.Policy())
			require.NoError(t, err)
			f.admit("a", "b", "w0", "x")
			la, lb := f.acquire("a"), f.acquire("b")
			subs := f.waiters("w0")

			rel, err := f.jt.Release(ctx, lb)
			require.NoError(t, err)
			require.Equal(t, KindReleased, rel.Kind)
			f.settle()
			require.Equal(t, []int{0}, woken(subs))
			// Another process takes the slot before the waiter tries.
			acq, err := otherJT.Acquire(ctx, "x", f.payload)
			require.NoError(t, err)
			require.Equal(t, KindAcquired, acq.Kind)
			f.settle()

			// The waiter's try rests on the watched state: blocked, no read.
			wt := &waitTry{trustWatch: true}
			b, err := acquireJobTry(ctx, f.jt, wt, "w0", f.payload)
			require.NoError(t, err)
			require.Equal(t, KindBlocked, b.Kind)
			assert.Equal(t, f.rev(), wt.rev, "the blocked outcome rests on the latest revision")
			subs[0].rearm(wt.rev)
			assert.Empty(t, woken(subs), "woken again by the change it found busy")

			rel, err = f.jt.Release(ctx, la)
			require.NoError(t, err)
			require.Equal(t, KindReleased, rel.Kind)
			f.settle()
			assert.Equal(t, []int{0}, woken(subs), "a later release wakes it again")
			wt = &waitTry{trustWatch: true}
			got, err := acquireJobTry(ctx, f.jt, wt, "w0", f.payload)
			require.NoError(t, err)
			assert.Equal(t, KindAcquired, got.Kind)
		})
	}
}

// A waiting Runner's tries read nothing the watch delivered: with 8 jobs
// queued behind one slot, each release wakes one waiter, which acquires on
// the watched state without a read.
func TestRunnerWaitersReadNothingWatched(t *testing.T) {
	t.Parallel()
	mem := NewMemoryStore()
	cs := newCountingStore(mem)
	c, err := NewCoordinator(cs, nil)
	require.NoError(t, err)
	jt, err := c.JobType(rtService(), benchJobType, Policy{Key: benchPolicy.Key, MaxActive: 1, MaxQueuedPerKey: 64})
	require.NoError(t, err)
	w, err := NewWatcher(mem)
	require.NoError(t, err)
	defer w.Close()
	r, err := NewRunner(jt, &RunnerConfig{Watcher: w, RecheckInterval: time.Minute})
	require.NoError(t, err)
	ctx := context.Background()
	payload := benchPayload(0)
	const jobs = 8
	for i := range jobs {
		_, err := jt.Admit(ctx, fmt.Sprintf("j%d", i), payload)
		require.NoError(t, err)
	}
	gate := make(chan struct{})
	errs := make(chan error, jobs)
	first := true
	for i := range jobs {
		hold := first
		first = false
		go func() {
			_, err := r.Run(ctx, fmt.Sprintf("j%d", i), payload, func(context.Context, Lease) error {
				if hold {
					<-gate // every other job queues up behind this one
				}
				return nil
			})
			errs <- err
		}()
		if hold {
			require.Eventually(t, func() bool {
				st, _, err := c.read(ctx, mustKey(t, jt, payload))
				return err == nil && st != nil && len(st.Active) == 1
			}, rtWait, time.Millisecond)
		}
	}
	// Wait until every other job is subscribed and waiting.
	key := mustKey(t, jt, payload)
	require.Eventually(t, func() bool {
		w.mu.Lock()
		defer w.mu.Unlock()
		sw := w.watches[jt.Service()]
		if sw == nil || sw.keys[key.KVKey] == nil || len(sw.keys[key.KVKey].waiters) != jobs-1 {
			return false
		}
		for _, s := range sw.keys[key.KVKey].waiters {
			if s.waiter.woken {
				return false
			}
		}
		return true
	}, rtWait, time.Millisecond)
	reads := cs.totals.reads.Load()
	close(gate)
	for range jobs {
		require.NoError(t, <-errs)
	}
	assert.LessOrEqual(t, cs.totals.reads.Load()-reads, int64(1), "reads by %d waiters woken one per release", jobs-1)
}

func mustKey(t *testing.T, jt *JobType, payload []byte) JobKey {
	key, err := jt.Key(payload)
	require.NoError(t, err)
	return key
}

// conflictUpdates returns the hook of a store that fails the next *fail
// updates with a revision conflict without writing, so that no watch event
// answers them.
func conflictUpdates(fail *atomic.Int64) storeHook {
	return func(_ context.Context, c storeCall, call func() storeResult) storeResult {
		if c.op == opUpdate && fail.Add(-1) >= 0 {
			return storeResult{err: fmt.Errorf("%w: injected", ErrRevisionConflict)}
		}
		return call()
	}
}

// A write on the watched state that loses a race waits for the watch to
// deliver the winner; when no event comes (here the conflict wrote
// nothing) it falls back to a read after watchFallback instead of waiting
// for ever.
func TestCoordinatorWatchedConflictFallsBackToRead(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	mem := NewMemoryStore()
	var fail atomic.Int64
	// A bare Store: no batches, clock or watch of its own.
	cs := newCountingStore(newHookStore(mem, passNone).withHook(conflictUpdates(&fail)))
	c, err := NewCoordinator(cs, nil)
	require.NoError(t, err)
	jt, err := c.JobType(rtService(), benchJobType, Policy{Key: benchPolicy.Key, MaxActive: 1, MaxQueuedPerKey: 4})
	require.NoError(t, err)
	w, err := NewWatcher(mem)
	require.NoError(t, err)
	defer w.Close()
	payload := benchPayload(0)
	key := mustKey(t, jt, payload)
	sub, err := w.subscribeWaiter(ctx, jt.Service(), key.KVKey, "b", 1, c.keys)
	require.NoError(t, err)
	defer sub.Close()
	for _, id := range []string{"a", "b"} { // b stays queued: the release is an update
		_, err = jt.Admit(ctx, id, payload)
		require.NoError(t, err)
	}
	acq, err := jt.Acquire(ctx, "a", payload)
	require.NoError(t, err)
	require.Equal(t, KindAcquired, acq.Kind)
	e := c.keys.entry(key.KVKey)
	require.NotNil(t, e)
	require.True(t, e.Fed(), "the entry is fed by the watch after its own write")

	fail.Store(1)
	reads := cs.totals.reads.Load()
	start := time.Now()
	rel, err := jt.Release(ctx, acq.Lease)
	require.NoError(t, err)
	assert.Equal(t, KindReleased, rel.Kind)
	assert.GreaterOrEqual(t, time.Since(start), watchFallback, "it waited for a watch event first")
	assert.Equal(t, int64(1), cs.totals.reads.Load()-reads, "one read after the bound")
}

// The watch does not decode a coordinator's own writes: the state it keeps
// for a revision the coordinator wrote is the coordinator's own copy.
func TestWatcherReusesOwnWrites(t *testing.T) {
	t.Parallel()
	for name, open := range rtStores(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			f := newWakeFixture(t, open(t))
			f.admit("a")
			f.waiters("a")
			for _, id := range []string{"b", "c", "d"} {
				f.admit(id)
				f.settle()
				e := f.jt.coord.keys.entry(f.kvKey)
				require.NotNil(t, e)
				held, _, _ := e.Known()
				f.w.mu.Lock()
				kw := f.w.watches[f.service].keys[f.kvKey]
				got, decoded := kw.state, kw.decoded
				f.w.mu.Unlock()
				require.True(t, decoded)
				assert.Same(t, held, got, "admitting %s: the watch decoded the coordinator's own write again", id)
			}
		})
	}
}

// A Watcher over a store whose watch has no values (any WatchableStore but
// MemoryStore and NATSStore, wrappers included) feeds nothing to the
// coordinator: its entry must not count as fed, or every lost race would
// wait watchFallback for a watch event that never carries a state. Its
// waiters are woken by every change, as by Subscribe.
func TestWatcherWithoutValuesFeedsNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store := newWatchCountingStore(new(atomic.Int64))
	c, err := NewCoordinator(store, nil)
	require.NoError(t, err)
	jt, err := c.JobType(rtService(), benchJobType, Policy{Key: benchPolicy.Key, MaxActive: 1, MaxQueuedPerKey: 4})
	require.NoError(t, err)
	w, err := NewWatcher(store)
	require.NoError(t, err)
	defer w.Close()
	payload := benchPayload(0)
	key := mustKey(t, jt, payload)
	sub, err := w.subscribeWaiter(ctx, jt.Service(), key.KVKey, "b", 1, c.keys)
	require.NoError(t, err)
	defer sub.Close()
	sub.rearm(0)
	_, err = jt.Admit(ctx, "a", payload)
	require.NoError(t, err)
	recv(t, sub.Changed(), "the wake-up of a change without values")
	if e := c.keys.entry(key.KVKey); e != nil {
		assert.False(t, e.Fed(), "an entry no watch feeds counts as fed")
	}
}

// Processes wake by one queue: of two processes (each its own coordinator
// and Watcher) waiting on one slot, only the process whose job is first in
// the queue is woken by the release; the other's waiter stays asleep while
// the first may still take the slot, and goes on waiting once it has. Should
// the first never try (its process crashed), the other is woken after the
// grace.
func TestWatcherProcessesWakeInQueueOrder(t *testing.T) {
	t.Parallel()
	for name, open := range rtStores(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			store := open(t)
			policy := Policy{Key: benchPolicy.Key, MaxActive: 1, MaxQueuedPerKey: 8}
			service := rtService()
			type proc struct {
				jt *JobType
				w  *Watcher
			}
			newProc := func(grace time.Duration) proc {
				c, err := NewCoordinator(store, nil)
				require.NoError(t, err)
				jt, err := c.JobType(service, benchJobType, policy)
				require.NoError(t, err)
				w, err := NewWatcher(store)
				require.NoError(t, err)
				t.Cleanup(w.Close)
				w.grace = grace
				return proc{jt: jt, w: w}
			}
			// a holds the slot; b's job b0 is queued ahead of a's job a1.
			a, b := newProc(time.Hour), newProc(time.Hour)
			payload := benchPayload(0)
			key := mustKey(t, a.jt, payload)
			admit := func(p proc, id string) {
				adm, err := p.jt.Admit(ctx, id, payload)
				require.NoError(t, err)
				require.Equal(t, KindAccepted, adm.Kind, "admit %s", id)
			}
			admit(a, "h")
			admit(b, "b0")
			admit(a, "a1")
			acq, err := a.jt.Acquire(ctx, "h", payload)
			require.NoError(t, err)
			require.Equal(t, KindAcquired, acq.Kind)
			wait := func(p proc, id string) *Subscription {
				sub, err := p.w.subscribeWaiter(ctx, service, key.KVKey, id, 1, p.jt.coord.keys)
				require.NoError(t, err)
				t.Cleanup(sub.Close)
				_, rev, err := store.Get(ctx, service, key.KVKey)
				require.NoError(t, err)
				sub.rearm(rev)
				return sub
			}
			subB, subA := wait(b, "b0"), wait(a, "a1")
			settled := func(p proc) {
				_, want, err := store.Get(ctx, service, key.KVKey)
				require.NoError(t, err)
				require.Eventually(t, func() bool {
					p.w.mu.Lock()
					defer p.w.mu.Unlock()
					sw := p.w.watches[service]
					return sw != nil && sw.keys[key.KVKey] != nil && sw.keys[key.KVKey].rev >= want
				}, rtWait, time.Millisecond)
			}

			rel, err := a.jt.Release(ctx, acq.Lease)
			require.NoError(t, err)
			require.Equal(t, KindReleased, rel.Kind)
			settled(a)
			settled(b)
			recv(t, subB.Changed(), "the wake-up of the first queued job's process")
			assert.False(t, pending(subA.Changed()), "a process whose job is second in the queue was woken while the first may take the slot")

			// b takes the slot: a goes on waiting.
			got, err := acquireJobTry(ctx, b.jt, &waitTry{trustWatch: true}, "b0", payload)
			require.NoError(t, err)
			require.Equal(t, KindAcquired, got.Kind)
			settled(a)
			assert.False(t, pending(subA.Changed()), "woken when the slot was taken")

			// b releases and crashes without waiting again: a1 is first
			// in the queue now and is woken at once.
			rel, err = b.jt.Release(ctx, got.Lease)
			require.NoError(t, err)
			require.Equal(t, KindReleased, rel.Kind)
			recv(t, subA.Changed(), "the wake-up of the job first in the queue")
		})
	}
}

// A process whose first queued job never tries (its process crashed with
// the job queued) does not keep the others' waiters asleep: the next is
// woken after the grace.
func TestWatcherPassesADeadQueueHead(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store := NewMemoryStore()
	c, err := NewCoordinator(store, nil)
	require.NoError(t, err)
	jt, err := c.JobType(rtService(), benchJobType, Policy{Key: benchPolicy.Key, MaxActive: 1, MaxQueuedPerKey: 8})
	require.NoError(t, err)
	w, err := NewWatcher(store)
	require.NoError(t, err)
	defer w.Close()
	w.grace = 20 * time.Millisecond
	payload := benchPayload(0)
	key := mustKey(t, jt, payload)
	for _, id := range []string{"h", "dead", "live"} {
		_, err := jt.Admit(ctx, id, payload)
		require.NoError(t, err)
	}
	acq, err := jt.Acquire(ctx, "h", payload)
	require.NoError(t, err)
	require.Equal(t, KindAcquired, acq.Kind)
	sub, err := w.subscribeWaiter(ctx, jt.Service(), key.KVKey, "live", 1, c.keys)
	require.NoError(t, err)
	defer sub.Close()
	_, rev, err := store.Get(ctx, jt.Service(), key.KVKey)
	require.NoError(t, err)
	sub.rearm(rev)
	start := time.Now()
	_, err = jt.Release(ctx, acq.Lease)
	require.NoError(t, err)
	recv(t, sub.Changed(), "the wake-up after the dead head's grace")
	assert.GreaterOrEqual(t, time.Since(start), w.grace, "woken before the head's grace ran out")
	got, err := acquireJobTry(ctx, jt, &waitTry{trustWatch: true}, "live", payload)
	require.NoError(t, err)
	assert.Equal(t, KindAcquired, got.Kind, "the job behind the dead head takes the slot")
}

// A Watcher decodes a watched value only for keys its waiters wait on, and
// never one whose revision a coordinator it feeds wrote: changes of other
// keys, and a waiter's own process's writes, cost it no decoding.
func TestWatcherDecodesOnlyWhatWaitersNeed(t *testing.T) {
	t.Parallel()
	for name, open := range rtStores(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			store := open(t)
			mine, err := NewCoordinator(store, nil)
			require.NoError(t, err)
			other, err := NewCoordinator(store, nil)
			require.NoError(t, err)
			service := rtService()
			policy := Policy{Key: benchPolicy.Key, MaxActive: 1, MaxQueuedPerKey: 8}
			jt, err := mine.JobType(service, benchJobType, policy)
			require.NoError(t, err)
			otherJT, err := other.JobType(service, benchJobType, policy)
			require.NoError(t, err)
			w, err := NewWatcher(store)
			require.NoError(t, err)
			defer w.Close()
			watched, unwatched := benchPayload(0), benchPayload(1)
			key := mustKey(t, jt, watched)
			_, err = jt.Admit(ctx, "a", watched)
			require.NoError(t, err)
			sub, err := w.subscribeWaiter(ctx, service, key.KVKey, "a", 1, mine.keys)
			require.NoError(t, err)
			defer sub.Close()
			decodes := func() uint64 {
				w.mu.Lock()
				defer w.mu.Unlock()
				return w.decodes
			}
			// settle waits until the watch has dispatched the watched
			// key's latest change, and so every change before it.
			settle := func() {
				_, want, err := store.Get(ctx, service, key.KVKey)
				require.NoError(t, err)
				require.Eventually(t, func() bool {
					w.mu.Lock()
					defer w.mu.Unlock()
					kw := w.watches[service].keys[key.KVKey]
					return kw != nil && kw.rev >= want
				}, rtWait, time.Millisecond)
			}

			// Another process's writes to a key nobody here waits on.
			for i := range 3 {
				_, err := otherJT.Admit(ctx, fmt.Sprintf("u%d", i), unwatched)
				require.NoError(t, err)
			}
			// This process's own writes to the watched key.
			for _, id := range []string{"b", "c"} {
				_, err := jt.Admit(ctx, id, watched)
				require.NoError(t, err)
			}
			settle()
			assert.Zero(t, decodes(), "decoded changes of an unwatched key or its own writes")

			// Another process's write to the watched key is decoded, once.
			_, err = otherJT.Admit(ctx, "d", watched)
			require.NoError(t, err)
			settle()
			assert.Equal(t, uint64(1), decodes(), "another process's write to the watched key")
		})
	}
}

// After its waiter took the slot, a process keeps being fed the key's
// changes for feedLinger, undecoded: its release and its next admission
// start from the watched state without a read, although another process
// wrote the key meanwhile, and the Watcher decodes nothing while no waiter
// waits.
func TestWatcherFeedLingersAfterTheWait(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	mem := NewMemoryStore()
	cs := newCountingStore(mem)
	p := newTwoProcesses(t, mem, cs)
	c, jt, otherJT, w, r, service, payload, key := p.mine, p.jt, p.otherJT, p.w, p.r, p.service, p.payload, p.key
	for _, id := range []string{"h", "a"} {
		_, err := otherJT.Admit(ctx, id, payload)
		require.NoError(t, err)
	}
	held, err := otherJT.Acquire(ctx, "h", payload)
	require.NoError(t, err)
	require.Equal(t, KindAcquired, held.Kind)
	decodes := func() uint64 {
		w.mu.Lock()
		defer w.mu.Unlock()
		return w.decodes
	}
	// fed reports whether the coordinator's entry was fed the key's
	// latest change.
	fed := func() bool {
		_, want, err := mem.Get(ctx, service, key.KVKey)
		if err != nil {
			return false
		}
		e := c.keys.entry(key.KVKey)
		if e == nil {
			return false
		}
		return e.Marks().WatchRev >= want
	}

	var reads, decoded uint64
	done := make(chan error, 1)
	go func() {
		_, err := r.Run(ctx, "a", payload, func(context.Context, Lease) error {
			// Another process writes the key while the job runs.
			decoded = decodes()
			_, err := otherJT.Admit(ctx, "x", payload)
			if err != nil {
				return err
			}
			if !assert.Eventually(t, fed, rtWait, time.Millisecond, "the feed never delivered the other process's admission") {
				return errors.New("not fed")
			}
			reads = uint64(cs.totals.reads.Load())
			return nil
		})
		done <- err
	}()
	p.awaitWaiter(t)
	_, err = otherJT.Release(ctx, held.Lease)
	require.NoError(t, err)
	require.NoError(t, <-done)
	// The release (after the other process's admission) and the next
	// admission read nothing.
	adm, err := jt.Admit(ctx, "b", payload)
	require.NoError(t, err)
	require.Equal(t, KindAccepted, adm.Kind)
	assert.Equal(t, reads, uint64(cs.totals.reads.Load()), "reads by the release and the next admission")
	assert.Equal(t, decoded, decodes(), "the Watcher decoded changes with no waiter waiting")
	st, _, err := c.read(ctx, key)
	require.NoError(t, err)
	require.NotNil(t, st)
	assert.Equal(t, []string{"x", "b"}, []string{st.Queued[0].JobID, st.Queued[1].JobID}, "the queue after the release and the admission")
}

// A lingering feed ends feedLinger after the last waiter left: the Watcher
// forgets the key and the coordinator's entry is no longer fed nor kept.
func TestWatcherFeedLingerEnds(t *testing.T) {
	t.Parallel()
	f := newWakeFixture(t, NewMemoryStore())
	f.admit("a")
	sub := f.waiters("a")[0]
	sub.Close()
	kept := func() (bool, int) {
		f.w.mu.Lock()
		defer f.w.mu.Unlock()
		watching := 0
		if e := f.jt.coord.keys.entry(f.kvKey); e != nil {
			watching = e.Marks().Watching
		}
		return f.w.watches[f.service].keys[f.kvKey] != nil, watching
	}
	lingering, watching := kept()
	require.True(t, lingering, "the feed ended with the last waiter")
	require.Equal(t, 1, watching)
	require.Eventually(t, func() bool {
		lingering, watching := kept()
		return !lingering && watching == 0
	}, rtWait, 10*time.Millisecond, "the lingering feed never ended")
}
