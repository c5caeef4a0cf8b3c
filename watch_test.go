package jobkeys

import (
	"context"
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

			k1, k2 := svc+".render.k1", svc+".render.k2"
			r1, err := store.Create(ctx, svc, k1, []byte("a"))
			require.NoError(t, err)
			_, err = store.Create(ctx, svc, svc+".other.k3", []byte("b")) // another job type: not reported
			require.NoError(t, err)
			_, err = store.Create(ctx, svc, k2, []byte("c"))
			require.NoError(t, err)
			require.NoError(t, store.Delete(ctx, svc, k1, r1))

			assert.Equal(t, k1, recv(t, keys, "create of k1"))
			assert.Equal(t, k2, recv(t, keys, "create of k2"))
			assert.Equal(t, k1, recv(t, keys, "delete of k1"))

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
	store := &countingWatchStore{MemoryStore: NewMemoryStore()}
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
	assert.Equal(t, int64(1), store.watches.Load())
	putKey(t, store, "svc", "svc.t.k", []byte("v"))
	for _, s := range subs {
		recv(t, s.Changed(), "a change")
		s.Close()
	}
}

type countingWatchStore struct {
	*MemoryStore
	watches atomic.Int64
}

func (s *countingWatchStore) WatchKeys(ctx context.Context, service, jobType string, changed func(string)) (<-chan struct{}, error) {
	s.watches.Add(1)
	return s.MemoryStore.WatchKeys(ctx, service, jobType, changed)
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
