package jobkeys

import (
	"context"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jobkeys/jobkeys/internal/natstest"
)

// rtWait is how long the worker runtime tests wait for an event that should
// come within milliseconds; it is generous so that a loaded machine does
// not fail them.
const rtWait = 30 * time.Second

var rtSeq atomic.Int64

// rtService returns a fresh service (bucket) name for a test.
func rtService() string { return "rt" + strconv.FormatInt(rtSeq.Add(1), 10) }

// rtNATS starts an embedded server and returns a store over it that creates
// buckets, with the connection (closed when the test ends).
func rtNATS(t testing.TB) (*NATSStore, *nats.Conn) {
	t.Helper()
	s := natstest.Run(t)
	nc, js := natstest.Connect(t, s)
	store, err := NewNATSStore(js, WithCreateBuckets(jetstream.MemoryStorage, 1))
	require.NoError(t, err)
	return store, nc
}

// rtStore is a store with the optional capabilities, for tests run against
// both implementations.
type rtStore interface {
	Store
	WatchableStore
	ListableStore
}

func rtStores(t *testing.T) map[string]func(t *testing.T) rtStore {
	return map[string]func(t *testing.T) rtStore{
		"memory": func(t *testing.T) rtStore { return NewMemoryStore() },
		"nats": func(t *testing.T) rtStore {
			store, _ := rtNATS(t)
			return store
		},
	}
}

// subscribeWaiter subscribes a blocked acquisition of job jobID whose
// policy allows limit slots, run by a coordinator whose key table is t,
// as a Runner's first subscription does (subscribeQueued, starting out
// woken).
func (w *Watcher) subscribeWaiter(ctx context.Context, service, kvKey, jobID string, limit int, t *keyTable) (*Subscription, error) {
	return w.subscribeQueued(ctx, service, kvKey, jobID, limit, t, 0, false)
}

// recv waits for a value on ch, failing the test after rtWait.
func recv[T any](t testing.TB, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(rtWait):
		t.Fatalf("timed out after %v waiting for %s", rtWait, what)
		panic("unreachable")
	}
}

// pending reports whether a value is ready on ch right now.
func pending[T any](ch <-chan T) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// clientGoroutines counts the goroutines that do not belong to an embedded
// nats-server (whose internal goroutines come and go on their own), so that a
// test can check the library and the client leave none behind.
func clientGoroutines() (int, string) {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	var kept []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		if g == "" || strings.Contains(g, "nats-server/v2/server.") {
			continue
		}
		kept = append(kept, g)
	}
	return len(kept), strings.Join(kept, "\n\n")
}

// settleGoroutines waits until the client goroutines are back to at most
// baseline, and fails the test with their stacks if they do not.
func settleGoroutines(t testing.TB, baseline int) {
	t.Helper()
	deadline := time.Now().Add(rtWait)
	for {
		n, stacks := clientGoroutines()
		if n <= baseline {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines left, want at most %d:\n%s", n, baseline, stacks)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestStoreWatchKeys checks the WatchKeys contract on both stores: the keys
// of the watched job type written after WatchKeys returns are reported in
// the order of the writes, each for its latest change at least. The NATS
// store may leave out a change a later change of the same key replaced
// before its watch read it (see TestNATSStoreWatchKeysReplacedChange), which
// made this test flaky when it wanted every change; the memory store
// reports every one.
func TestStoreWatchKeys(t *testing.T) {
	t.Parallel()
	for name, open := range rtStores(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			store := open(t)
			svc := rtService()
			// The bucket exists before the watch (NATSStore creates it on first use).
			_, err := store.Create(ctx, svc, svc+".other.k0", []byte("x"))
			require.NoError(t, err)

			wctx, cancel := context.WithCancel(ctx)
			keys := make(chan string, 16)
			var calls atomic.Int64
			ended, err := store.WatchKeys(wctx, svc, "render", func(k string) {
				calls.Add(1)
				keys <- k
			})
			require.NoError(t, err)

			k1, k2, last := svc+".render.k1", svc+".render.k2", svc+".render.last"
			r1, err := store.Create(ctx, svc, k1, []byte("a"))
			require.NoError(t, err)
			_, err = store.Create(ctx, svc, svc+".other.k3", []byte("b")) // another job type: not reported
			require.NoError(t, err)
			_, err = store.Create(ctx, svc, k2, []byte("c"))
			require.NoError(t, err)
			require.NoError(t, store.Delete(ctx, svc, k1, r1))
			_, err = store.Create(ctx, svc, last, []byte("d"))
			require.NoError(t, err)

			writes := []string{k1, k2, k1, last}
			reports := recvUntil(t, keys, last)
			require.NoError(t, reportedInOrder(writes, reports))
			if name == "memory" {
				assert.Equal(t, writes, reports, "the memory store reports every change")
			}

			cancel()
			recv(t, ended, "the end of the watch")
			before := calls.Load()
			_, err = store.Create(ctx, svc, svc+".render.k4", []byte("d"))
			require.NoError(t, err)
			time.Sleep(50 * time.Millisecond) // a late call would show up here
			assert.Equal(t, before, calls.Load(), "changed called after the watch ended")
			assert.False(t, pending(keys), "a key reported after the watch ended")
		})
	}
}

// TestNATSStoreWatchKeysReplacedChange is the cause of the old flakiness
// of TestStoreWatchKeys/nats, made deterministic: the server's consumer of
// a KV watch reads the bucket's stream behind the writes, and on a bucket
// with history 1 a write replaced by a later one of the same key is gone
// from the stream by the time a lagging consumer gets there. Under load the
// new consumer did not read the create of k1 before its delete (three round
// trips later) replaced it. Here the consumer is paused instead, and the
// watch must still report every written key for its latest change, in
// order.
func TestNATSStoreWatchKeysReplacedChange(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store, _ := rtNATS(t)
	svc := rtService()
	_, err := store.Create(ctx, svc, svc+".other.k0", []byte("x"))
	require.NoError(t, err)

	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	keys := make(chan string, 16)
	ended, err := store.WatchKeys(wctx, svc, "render", func(k string) { keys <- k })
	require.NoError(t, err)
	defer func() {
		cancel()
		recv(t, ended, "the end of the watch")
	}()

	// The watch's consumer is the only one on the bucket's stream.
	stream, err := store.js.Stream(ctx, "KV_"+store.BucketName(svc))
	require.NoError(t, err)
	var consumers []string
	for name := range stream.ConsumerNames(ctx).Name() {
		consumers = append(consumers, name)
	}
	require.Len(t, consumers, 1, "consumers of the bucket's stream")
	_, err = stream.PauseConsumer(ctx, consumers[0], time.Now().Add(time.Hour))
	require.NoError(t, err)

	k1, k2, last := svc+".render.k1", svc+".render.k2", svc+".render.last"
	r1, err := store.Create(ctx, svc, k1, []byte("a"))
	require.NoError(t, err)
	_, err = store.Create(ctx, svc, svc+".other.k3", []byte("b"))
	require.NoError(t, err)
	_, err = store.Create(ctx, svc, k2, []byte("c"))
	require.NoError(t, err)
	require.NoError(t, store.Delete(ctx, svc, k1, r1)) // replaces the create of k1 in the stream
	assert.False(t, pending(keys), "a key reported while the watch's consumer is paused")

	_, err = stream.ResumeConsumer(ctx, consumers[0])
	require.NoError(t, err)
	_, err = store.Create(ctx, svc, last, []byte("d")) // wakes the resumed consumer
	require.NoError(t, err)

	reports := recvUntil(t, keys, last)
	require.NoError(t, reportedInOrder([]string{k1, k2, k1, last}, reports))
	assert.Equal(t, []string{k2, k1, last}, reports,
		"the create of k1 is not in the stream any more when the consumer reads it: the test did not make the watch lag")
}

// recvUntil collects the keys reported on keys up to and including last,
// failing the test after rtWait.
func recvUntil(t testing.TB, keys <-chan string, last string) []string {
	t.Helper()
	var got []string
	for {
		k := recv(t, keys, "the report of "+last+" (after "+strings.Join(got, ", ")+")")
		got = append(got, k)
		if k == last {
			return got
		}
	}
}

// reportedInOrder checks that reports, the keys a watch reported, are the
// keys of writes (in write order) less some of the writes followed by a
// later write of the same key: the changes a watch may miss when a later
// change replaces them before it reads them. The last write of every key
// must be reported.
func reportedInOrder(writes, reports []string) error {
	seen := make(map[string]bool) // keys written later than position i
	r := len(reports) - 1
	for i := len(writes) - 1; i >= 0; i-- {
		k := writes[i]
		replaced := seen[k]
		seen[k] = true
		if r >= 0 && reports[r] == k {
			r--
			continue
		}
		if !replaced {
			return fmt.Errorf("reported %q for writes %q: the last write %d of %s is not reported where it should be", reports, writes, i, k)
		}
	}
	if r >= 0 {
		return fmt.Errorf("reported %q for writes %q: %s is not a write, or out of order", reports, writes, reports[r])
	}
	return nil
}

func TestReportedInOrder(t *testing.T) {
	t.Parallel()
	writes := []string{"a", "b", "a", "c"}
	for _, ok := range [][]string{
		{"a", "b", "a", "c"},
		{"b", "a", "c"}, // the first write of a replaced before it was read
	} {
		assert.NoError(t, reportedInOrder(writes, ok), "reports %q", ok)
	}
	for _, bad := range [][]string{
		{"a", "b", "c"},           // the last write of a missing
		{"a", "a", "c"},           // b missing
		{"b", "a"},                // c missing
		{"a", "b", "a", "c", "c"}, // c twice
		{"b", "a", "a", "c"},      // a twice after b
		{"a", "a", "b", "c"},      // out of order
		{"b", "a", "x", "c"},      // x never written
		{},
	} {
		assert.Error(t, reportedInOrder(writes, bad), "reports %q", bad)
	}
}

func TestStoreWatchKeysErrors(t *testing.T) {
	t.Parallel()
	for name, open := range rtStores(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			store := open(t)
			ctx := context.Background()
			nop := func(string) {}
			_, err := store.WatchKeys(ctx, "bad.service", "", nop)
			assert.ErrorIs(t, err, ErrInvalidName)
			_, err = store.WatchKeys(ctx, rtService(), "bad type", nop)
			assert.ErrorIs(t, err, ErrInvalidName)
			_, err = store.WatchKeys(ctx, rtService(), "", nil)
			assert.ErrorIs(t, err, ErrInvalidRequest)
			_, err = store.ListKeys(ctx, "", "")
			assert.ErrorIs(t, err, ErrInvalidName)
			cancelled, cancel := context.WithCancel(ctx)
			cancel()
			_, err = store.WatchKeys(cancelled, rtService(), "", nop)
			assert.ErrorIs(t, err, context.Canceled)
		})
	}
}

func TestStoreListKeys(t *testing.T) {
	t.Parallel()
	for name, open := range rtStores(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			store := open(t)
			svc := rtService()

			keys, err := store.ListKeys(ctx, svc, "render")
			require.NoError(t, err)
			assert.Empty(t, keys, "keys in a new bucket")

			for _, k := range []string{"render.c", "render.a", "other.x", "render.b"} {
				_, err := store.Create(ctx, svc, svc+"."+k, []byte("v"))
				require.NoError(t, err)
			}
			_, rev, err := store.Get(ctx, svc, svc+".render.b")
			require.NoError(t, err)
			require.NoError(t, store.Delete(ctx, svc, svc+".render.b", rev))

			keys, err = store.ListKeys(ctx, svc, "render")
			require.NoError(t, err)
			assert.Equal(t, []string{svc + ".render.a", svc + ".render.c"}, keys)

			keys, err = store.ListKeys(ctx, svc, "")
			require.NoError(t, err)
			assert.Equal(t, []string{svc + ".other.x", svc + ".render.a", svc + ".render.c"}, keys)
		})
	}
}

// putKey writes value at key, whatever is there.
func putKey(t testing.TB, store Store, svc, key string, value []byte) {
	t.Helper()
	ctx := context.Background()
	if _, rev, err := store.Get(ctx, svc, key); err == nil {
		_, err = store.Update(ctx, svc, key, value, rev)
		require.NoError(t, err)
		return
	}
	_, err := store.Create(ctx, svc, key, value)
	require.NoError(t, err)
}

func TestWatcherFanOut(t *testing.T) {
	t.Parallel()
	for name, open := range rtStores(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			store := open(t)
			svc := rtService()
			putKey(t, store, svc, svc+".t.seed", []byte("x")) // the bucket exists
			w, err := NewWatcher(store)
			require.NoError(t, err)
			defer w.Close()

			ka, kb, kc := svc+".t.a", svc+".t.b", svc+".t.c"
			a1, err := w.Subscribe(ctx, svc, ka)
			require.NoError(t, err)
			a2, err := w.Subscribe(ctx, svc, ka)
			require.NoError(t, err)
			b, err := w.Subscribe(ctx, svc, kb)
			require.NoError(t, err)
			c, err := w.Subscribe(ctx, svc, kc)
			require.NoError(t, err)

			putKey(t, store, svc, ka, []byte("1"))
			putKey(t, store, svc, ka, []byte("2")) // coalesced with the first
			putKey(t, store, svc, kc, []byte("1"))
			recv(t, a1.Changed(), "a change of a (first subscriber)")
			recv(t, a2.Changed(), "a change of a (second subscriber)")
			recv(t, c.Changed(), "a change of c")
			// Changes are dispatched in order, so b would have been signalled
			// by now if a change of another key could reach it.
			assert.False(t, pending(b.Changed()), "b signalled by changes of other keys")

			b.Close()
			b.Close() // idempotent
			recv(t, b.Done(), "b's end")
			putKey(t, store, svc, kb, []byte("1"))
			putKey(t, store, svc, kc, []byte("2"))
			recv(t, c.Changed(), "the second change of c")
			assert.False(t, pending(b.Changed()), "a closed subscription signalled")

			for _, s := range []*Subscription{a1, a2, c} {
				s.Close()
			}
			w.mu.Lock()
			assert.Empty(t, w.watches[svc].subs, "closed subscriptions are remembered")
			assert.Len(t, w.watches, 1, "the service's one watch")
			w.mu.Unlock()
		})
	}
}

func TestWatcherSubscribeErrors(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, err := NewWatcher(nil)
	assert.ErrorIs(t, err, ErrInvalidRequest)

	w, err := NewWatcher(NewMemoryStore())
	require.NoError(t, err)
	_, err = w.Subscribe(ctx, "svc", "other.t.k")
	assert.ErrorIs(t, err, ErrInvalidRequest)
	_, err = w.Subscribe(ctx, "bad.svc", "bad.svc.t.k")
	assert.ErrorIs(t, err, ErrInvalidName)
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	_, err = w.Subscribe(cancelled, "svc", "svc.t.k")
	assert.Equal(t, context.Canceled, err, "Subscribe with a cancelled context returns ctx.Err() unchanged")
	w.mu.Lock()
	assert.Empty(t, w.watches, "a failed start left a watch behind")
	w.mu.Unlock()

	sub, err := w.Subscribe(ctx, "svc", "svc.t.k")
	require.NoError(t, err)
	w.Close()
	recv(t, sub.Done(), "the end of a subscription when the watcher closes")
	w.Close() // idempotent
	_, err = w.Subscribe(ctx, "svc", "svc.t.k")
	assert.ErrorIs(t, err, ErrWatcherClosed)
}

// TestWatcherConcurrentSubscribe starts one service's watch from many
// goroutines at once: exactly one watch must start.
func TestWatcherConcurrentSubscribe(t *testing.T) {
	t.Parallel()
	var watches atomic.Int64
	store := newWatchCountingStore(&watches)
	w, err := NewWatcher(store)
	require.NoError(t, err)
	defer w.Close()
	var wg sync.WaitGroup
	subs := make([]*Subscription, 32)
	errs := make([]error, len(subs))
	for i := range subs {
		wg.Go(func() { subs[i], errs[i] = w.Subscribe(context.Background(), "svc", "svc.t.k") })
	}
	wg.Wait()
	for i := range subs {
		require.NoError(t, errs[i])
	}
	assert.Equal(t, int64(1), watches.Load())
	putKey(t, store, "svc", "svc.t.k", []byte("v"))
	for _, s := range subs {
		recv(t, s.Changed(), "a change")
		s.Close()
	}
}

// newWatchCountingStore returns a store over a new memory store that
// passes its watch through, and no other capability, and counts in watches
// the watches a Watcher starts. A wrapper, it has no value watch (a
// Watcher watches through its WatchKeys).
func newWatchCountingStore(watches *atomic.Int64) *hookStore {
	return newHookStore(NewMemoryStore(), passWatch).withHook(func(_ context.Context, c storeCall, call func() storeResult) storeResult {
		if c.op == opWatchKeys {
			watches.Add(1)
		}
		return call()
	})
}

// TestWatcherConnectionClosed: when the store stops watching (its connection
// closed), subscribers learn it from Done and the watch is forgotten.
func TestWatcherConnectionClosed(t *testing.T) {
	t.Parallel()
	s := natstest.Run(t)
	nc, js := natstest.Connect(t, s)
	store, err := NewNATSStore(js, WithCreateBuckets(jetstream.MemoryStorage, 1))
	require.NoError(t, err)
	svc := rtService()
	w, err := NewWatcher(store)
	require.NoError(t, err)
	defer w.Close()
	sub, err := w.Subscribe(context.Background(), svc, svc+".t.k")
	require.NoError(t, err)
	nc.Close()
	recv(t, sub.Done(), "the end of the subscription after the connection closed")
	w.mu.Lock()
	assert.Empty(t, w.watches, "the ended watch is remembered")
	w.mu.Unlock()
	_, err = w.Subscribe(context.Background(), svc, svc+".t.k")
	assert.Error(t, err, "subscribe over a closed connection")
	assert.NotErrorIs(t, err, ErrWatcherClosed, "subscribe over a closed connection: want the store's error")
}

// TestWatcherNoGoroutineLeak is not parallel: it counts the process's goroutines.
func TestWatcherNoGoroutineLeak(t *testing.T) {
	store, _ := rtNATS(t)
	svc := rtService()
	putKey(t, store, svc, svc+".t.seed", []byte("x"))
	_, err := store.ListKeys(context.Background(), svc, "")
	require.NoError(t, err)
	baseline, _ := clientGoroutines()

	w, err := NewWatcher(store)
	require.NoError(t, err)
	var subs []*Subscription
	for i := range 3 {
		sub, err := w.Subscribe(context.Background(), svc, svc+".t.k"+strconv.Itoa(i))
		require.NoError(t, err)
		subs = append(subs, sub)
	}
	putKey(t, store, svc, svc+".t.k1", []byte("v"))
	recv(t, subs[1].Changed(), "a change")
	subs[0].Close()
	n, _ := clientGoroutines()
	assert.Greater(t, n, baseline, "a running watch has no goroutines of its own: this test proves nothing")
	w.Close()
	settleGoroutines(t, baseline)

	// The memory store's watch too.
	mem := NewMemoryStore()
	baseline, _ = clientGoroutines()
	mw, err := NewWatcher(mem)
	require.NoError(t, err)
	_, err = mw.Subscribe(context.Background(), "svc", "svc.t.k")
	require.NoError(t, err)
	mw.Close()
	settleGoroutines(t, baseline)
	mem.mu.Lock()
	assert.Empty(t, mem.watchers, "the memory store remembers a stopped watch")
	mem.mu.Unlock()

	// And a listing.
	baseline, _ = clientGoroutines()
	keys, err := store.ListKeys(context.Background(), svc, "t")
	require.NoError(t, err)
	assert.Equal(t, []string{svc + ".t.k1", svc + ".t.seed"}, keys)
	settleGoroutines(t, baseline)
}

// TestWatcherZeroValue: a Watcher not made by NewWatcher has no store;
// Subscribe fails with ErrInvalidRequest instead of panicking, and Close
// does nothing.
func TestWatcherZeroValue(t *testing.T) {
	t.Parallel()
	var w Watcher
	require.NotPanics(t, func() {
		sub, err := w.Subscribe(context.Background(), "svc", "svc.t.k")
		assert.Nil(t, sub)
		assert.ErrorIs(t, err, ErrInvalidRequest)
		assert.ErrorContains(t, err, "NewWatcher")
	})
	require.NotPanics(t, w.Close)
	require.NotPanics(t, w.Close)
	_, err := w.Subscribe(context.Background(), "svc", "svc.t.k")
	assert.ErrorIs(t, err, ErrWatcherClosed, "Subscribe after Close")

	var sub Subscription
	require.NotPanics(t, sub.Close)
	assert.False(t, pending(sub.Changed()), "a zero Subscription signalled")
}
