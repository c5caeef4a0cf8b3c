package jobkeys

// The stores the root package's tests run on: an embedded JetStream server
// shared by the subtests of a test, and a service (bucket) per test; and
// the one Store wrapper of the tests, hookStore, which runs a test's hook
// around every call that reaches the store it wraps and passes through
// exactly the optional capabilities the test chose. Counting, gating,
// slowing, recording and fault injection are hooks, not types of their own.

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jobkeys/jobkeys/internal/natstest"
)

// storeHarness makes stores for tests that run on both stores.
type storeHarness struct {
	// open returns a store and a service (bucket) that no other test uses.
	open func(t *testing.T) (Store, string)
	// openLimited is open for a bucket whose values may be at most
	// maxValueSize bytes.
	openLimited func(t *testing.T, maxValueSize int) (Store, string)
}

// jkServiceSeq makes service names unique within the test binary, so that
// every test and subtest gets its own bucket on a shared server.
var jkServiceSeq atomic.Int64

func jkService(prefix string) string {
	return prefix + "-" + strconv.FormatInt(jkServiceSeq.Add(1), 10)
}

// jkNATS is an embedded JetStream server shared by the subtests of one test.
type jkNATS struct {
	srv *server.Server
	js  jetstream.JetStream
}

func startJKNATS(t *testing.T) *jkNATS {
	t.Helper()
	s := natstest.Run(t)
	_, js := natstest.Connect(t, s)
	return &jkNATS{srv: s, js: js}
}

// store returns a NATSStore over the shared connection that creates
// missing buckets in memory with one replica.
func (n *jkNATS) store(t *testing.T) *NATSStore {
	t.Helper()
	st, err := NewNATSStore(n.js, WithCreateBuckets(jetstream.MemoryStorage, 1))
	require.NoError(t, err)
	return st
}

// createBucket creates service's bucket with a value size limit (0: none)
// and history 1, as WithCreateBuckets would, but before any store opens it.
func (n *jkNATS) createBucket(t *testing.T, service string, maxValueSize int32, history uint8) jetstream.KeyValue {
	t.Helper()
	kv, err := n.js.CreateKeyValue(context.Background(), jetstream.KeyValueConfig{
		Bucket: BucketPrefixDefault + "_" + service, History: history, MaxValueSize: maxValueSize,
		Storage: jetstream.MemoryStorage, Replicas: 1,
	})
	require.NoError(t, err, "create bucket for %s", service)
	return kv
}

func (n *jkNATS) harness() storeHarness {
	return storeHarness{
		open: func(t *testing.T) (Store, string) { return n.store(t), jkService("conf") },
		openLimited: func(t *testing.T, maxValueSize int) (Store, string) {
			svc := jkService("conf-small")
			n.createBucket(t, svc, int32(maxValueSize), 1)
			return n.store(t), svc
		},
	}
}

func memoryHarness() storeHarness {
	return storeHarness{
		open: func(t *testing.T) (Store, string) { return NewMemoryStore(), jkService("conf") },
		openLimited: func(t *testing.T, maxValueSize int) (Store, string) {
			m := NewMemoryStore()
			require.NoError(t, m.SetMaxValueSize(maxValueSize))
			return m, jkService("conf-small")
		},
	}
}

// storeOp names a call through a hookStore.
type storeOp int

const (
	opGet storeOp = iota
	opCreate
	opUpdate
	opDelete
	opWriteBatch // BatchWriter.writeBatch
	opListKeys   // ListableStore.ListKeys
	opWatchKeys  // WatchableStore.WatchKeys
)

var storeOpNames = [...]string{"get", "create", "update", "delete", "write batch", "list keys", "watch keys"}

func (o storeOp) String() string {
	if o < 0 || int(o) >= len(storeOpNames) {
		return fmt.Sprintf("storeOp(%d)", int(o))
	}
	return storeOpNames[o]
}

// writes reports whether o writes the key: Create, Update, Delete or a
// batch.
func (o storeOp) writes() bool {
	return o == opCreate || o == opUpdate || o == opDelete || o == opWriteBatch
}

// storeCall is one call through a hookStore, as its hook sees it. Fields
// that op does not take are zero.
type storeCall struct {
	op       storeOp
	service  string
	key      string   // the KV key; "" for ListKeys and WatchKeys
	jobType  string   // ListKeys, WatchKeys
	value    []byte   // Create, Update: the value written (the caller's: copy it to keep it)
	values   [][]byte // writeBatch: the values written
	revision uint64   // Update, Delete, writeBatch: the revision written on
	del      bool     // writeBatch: the last value is a delete marker
}

// storeResult is what a call through a hookStore returns; a hook may change
// it. Fields that the call does not return are zero.
type storeResult struct {
	value []byte          // Get
	rev   uint64          // Get, Create, Update: the revision; writeBatch: the last
	keys  []string        // ListKeys
	ended <-chan struct{} // WatchKeys
	err   error
}

// storeHook runs in place of a call through a hookStore: call makes it on
// the wrapped store and returns its result. A hook can act before it (hold
// it at a gate, delay it, count it), skip it (a fault that writes nothing:
// return a result without calling), or change what it returns (a lost
// reply: call, then return an error). It runs on the caller's goroutine,
// concurrently with the hooks of other calls.
type storeHook func(ctx context.Context, c storeCall, call func() storeResult) storeResult

// storeCaps is a set of the optional capabilities a hookStore passes
// through from the store it wraps.
type storeCaps uint

const (
	passList       storeCaps = 1 << iota // ListableStore
	passWatch                            // WatchableStore
	passBatches                          // BatchWriter
	passValueLimit                       // ValueLimiter
	passClock                            // ClockSource
	passWakes                            // wakeStore (and wakeAheadStore, localWaiters)

	// passNone hides every optional capability: the store is a bare
	// Store, as a struct embedding the Store interface is.
	passNone storeCaps = 0
	// passAll passes every capability the wrapped store has, as a struct
	// embedding the concrete store does.
	passAll = passList | passWatch | passBatches | passValueLimit | passClock | passWakes
)

// hookStore wraps a Store for a test: every Get, Create, Update, Delete,
// writeBatch, ListKeys and WatchKeys goes through hook (when set), and of
// the optional capabilities only those it was made with (newHookStore's
// caps) that the wrapped store has are passed through.
//
// A hidden capability behaves for the library as one the store does not
// have: batches reports false, wakeUps false, valueLimit math.MaxInt (a limit
// no state reaches), ServerClockOffset nothing known; ListKeys and WatchKeys fail
// with an error wrapping ErrInvalidRequest (where a store without them fails
// when the Sweeper, inspection or Watcher is made, this one fails at the
// first call). With the clock hidden, a coordinator reads its Config.Now once
// more per clockBounds than over a store without a clock source.
//
// Its value watch (valueWatcher) is never passed: the library uses it only
// on a *MemoryStore or *NATSStore itself (valueWatcherOf), so a Watcher over
// any wrapper watches with WatchKeys.
//
// The capability fields can be set after newHookStore, before the store is
// used (a test's fake wake-ups, say); hook too. It is safe for concurrent
// use when the wrapped store and hook are.
type hookStore struct {
	inner Store
	hook  storeHook // nil: calls go straight through

	// The capabilities passed through; nil: hidden.
	lister  ListableStore
	watcher WatchableStore
	batcher BatchWriter
	limiter ValueLimiter
	clock   ClockSource
	wakes   wakeStore
}

// A hookStore has every optional capability's methods (a hidden one's read
// as absent). The library's unexported capability interfaces are named for
// the wrapper here, in its fields and in newHookStore only.
var _ interface {
	Store
	ListableStore
	WatchableStore
	BatchWriter
	ValueLimiter
	ClockSource
	wakeStore
	wakeAheadStore
	localWaiters
} = (*hookStore)(nil)

// newHookStore returns a hookStore over inner that passes through the
// capabilities in caps that inner has, with no hook. inner may be nil for
// a store whose hook answers every call without calling on.
func newHookStore(inner Store, caps storeCaps) *hookStore {
	h := &hookStore{inner: inner}
	if caps&passList != 0 {
		h.lister, _ = inner.(ListableStore)
	}
	if caps&passWatch != 0 {
		h.watcher, _ = inner.(WatchableStore)
	}
	if caps&passBatches != 0 {
		h.batcher, _ = inner.(BatchWriter)
	}
	if caps&passValueLimit != 0 {
		h.limiter, _ = inner.(ValueLimiter)
	}
	if caps&passClock != 0 {
		h.clock, _ = inner.(ClockSource)
	}
	if caps&passWakes != 0 {
		h.wakes, _ = inner.(wakeStore)
	}
	return h
}

// withHook sets h's hook and returns h.
func (h *hookStore) withHook(hook storeHook) *hookStore {
	h.hook = hook
	return h
}

// do runs call through h's hook.
func (h *hookStore) do(ctx context.Context, c storeCall, call func() storeResult) storeResult {
	if h.hook == nil {
		return call()
	}
	return h.hook(ctx, c, call)
}

func (h *hookStore) Get(ctx context.Context, service, key string) ([]byte, uint64, error) {
	r := h.do(ctx, storeCall{op: opGet, service: service, key: key}, func() storeResult {
		v, rev, err := h.inner.Get(ctx, service, key)
		return storeResult{value: v, rev: rev, err: err}
	})
	return r.value, r.rev, r.err
}

func (h *hookStore) Create(ctx context.Context, service, key string, value []byte) (uint64, error) {
	r := h.do(ctx, storeCall{op: opCreate, service: service, key: key, value: value}, func() storeResult {
		rev, err := h.inner.Create(ctx, service, key, value)
		return storeResult{rev: rev, err: err}
	})
	return r.rev, r.err
}

func (h *hookStore) Update(ctx context.Context, service, key string, value []byte, revision uint64) (uint64, error) {
	r := h.do(ctx, storeCall{op: opUpdate, service: service, key: key, value: value, revision: revision}, func() storeResult {
		rev, err := h.inner.Update(ctx, service, key, value, revision)
		return storeResult{rev: rev, err: err}
	})
	return r.rev, r.err
}

func (h *hookStore) Delete(ctx context.Context, service, key string, revision uint64) error {
	r := h.do(ctx, storeCall{op: opDelete, service: service, key: key, revision: revision}, func() storeResult {
		return storeResult{err: h.inner.Delete(ctx, service, key, revision)}
	})
	return r.err
}

// hidden returns the error of a call of a capability h hides.
func (h *hookStore) hidden(capability, service string) error {
	return fmt.Errorf("%w: service %q: the test's hookStore over %T does not pass %s through", ErrInvalidRequest, service, h.inner, capability)
}

func (h *hookStore) ListKeys(ctx context.Context, service, jobType string) ([]string, error) {
	r := h.do(ctx, storeCall{op: opListKeys, service: service, jobType: jobType}, func() storeResult {
		if h.lister == nil {
			return storeResult{err: h.hidden("ListKeys", service)}
		}
		keys, err := h.lister.ListKeys(ctx, service, jobType)
		return storeResult{keys: keys, err: err}
	})
	return r.keys, r.err
}

func (h *hookStore) WatchKeys(ctx context.Context, service, jobType string, changed func(kvKey string)) (<-chan struct{}, error) {
	r := h.do(ctx, storeCall{op: opWatchKeys, service: service, jobType: jobType}, func() storeResult {
		if h.watcher == nil {
			return storeResult{err: h.hidden("WatchKeys", service)}
		}
		ended, err := h.watcher.WatchKeys(ctx, service, jobType, changed)
		return storeResult{ended: ended, err: err}
	})
	return r.ended, r.err
}

func (h *hookStore) Batches(service, key string) bool {
	return h.batcher != nil && h.batcher.Batches(service, key)
}

func (h *hookStore) WriteBatch(ctx context.Context, service, key string, values [][]byte, revision uint64, del bool) (uint64, error) {
	c := storeCall{op: opWriteBatch, service: service, key: key, values: values, revision: revision, del: del}
	r := h.do(ctx, c, func() storeResult {
		if h.batcher == nil {
			return storeResult{err: fmt.Errorf("%w: KV key %q of service %q: the test's hookStore over %T writes no batches", ErrBatchRefused, key, service, h.inner)}
		}
		last, err := h.batcher.WriteBatch(ctx, service, key, values, revision, del)
		return storeResult{rev: last, err: err}
	})
	return r.rev, r.err
}

func (h *hookStore) MaxValueSize(ctx context.Context, service string) (int, error) {
	if h.limiter == nil {
		return math.MaxInt, nil
	}
	return h.limiter.MaxValueSize(ctx, service)
}

func (h *hookStore) ServerClockOffset(ctx context.Context, service string) (ClockOffset, time.Time) {
	if h.clock == nil {
		return ClockOffset{}, time.Now()
	}
	return h.clock.ServerClockOffset(ctx, service)
}

func (h *hookStore) wakeUps() bool {
	return h.wakes != nil && h.wakes.wakeUps()
}

func (h *hookStore) publishWakes(service, kvKey string, value []byte, rev uint64, targets []string, free int) {
	if h.wakes != nil {
		h.wakes.publishWakes(service, kvKey, value, rev, targets, free)
	}
}

func (h *hookStore) subscribeWake(service, kvKey, jobID string, fn func(value []byte, rev uint64)) (stop func(), err error) {
	if h.wakes == nil {
		return nil, fmt.Errorf("%w: KV key %q of service %q: the test's hookStore over %T carries no wake-ups", ErrInvalidRequest, kvKey, service, h.inner)
	}
	return h.wakes.subscribeWake(service, kvKey, jobID, fn)
}

func (h *hookStore) publishWakesAgain(service, kvKey string, value []byte, rev uint64, targets []string, free int) {
	if again, ok := h.wakes.(wakeAheadStore); ok {
		again.publishWakesAgain(service, kvKey, value, rev, targets, free)
	}
}

func (h *hookStore) waitsFor(service, kvKey, jobID string) bool {
	l, ok := h.wakes.(localWaiters)
	return ok && l.waitsFor(service, kvKey, jobID)
}

// clockFunc is a ClockSource made of a function (tests).
type clockFunc func(ctx context.Context, service string) (ClockOffset, time.Time)

func (f clockFunc) ServerClockOffset(ctx context.Context, service string) (ClockOffset, time.Time) {
	return f(ctx, service)
}

// A hookStore passes through exactly the capabilities it was made with: a
// hidden one reads as absent (no batches, no wake-ups, no value limit,
// nothing known of the clock; listing and watching refused with
// ErrInvalidRequest), a passed one answers as the wrapped store does.
func TestHookStorePassesOnlyChosenCapabilities(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	mem := NewMemoryStore()
	mem.batching = true
	require.NoError(t, mem.SetMaxValueSize(1000))
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	inner := newHookStore(mem, passAll)
	inner.clock = clockFunc(func(context.Context, string) (ClockOffset, time.Time) {
		return clockBounds{lo: -time.Second, hasLo: true}.offset(), at
	})
	inner.wakes = &benchFakeWakes{}
	const svc, kvKey = "svc", "svc.t.k"

	for _, tc := range []struct {
		name string
		cap  storeCaps
		// passed reports whether h passes the capability through; it
		// fails t where h answers neither as the wrapped store nor as a
		// store without it.
		passed func(t *testing.T, h *hookStore) bool
	}{
		{"list", passList, func(t *testing.T, h *hookStore) bool {
			keys, err := h.ListKeys(ctx, svc, "")
			if err != nil {
				require.ErrorIs(t, err, ErrInvalidRequest)
				return false
			}
			assert.Empty(t, keys)
			return true
		}},
		{"watch", passWatch, func(t *testing.T, h *hookStore) bool {
			wctx, cancel := context.WithCancel(ctx)
			defer cancel()
			ended, err := h.WatchKeys(wctx, svc, "", func(string) {})
			if err != nil {
				require.ErrorIs(t, err, ErrInvalidRequest)
				return false
			}
			cancel()
			<-ended
			return true
		}},
		{"batches", passBatches, func(t *testing.T, h *hookStore) bool {
			if h.Batches(svc, kvKey) {
				return true
			}
			_, err := h.WriteBatch(ctx, svc, kvKey, [][]byte{[]byte("v")}, 1, false)
			require.ErrorIs(t, err, ErrBatchRefused)
			return false
		}},
		{"value limit", passValueLimit, func(t *testing.T, h *hookStore) bool {
			n, err := h.MaxValueSize(ctx, svc)
			require.NoError(t, err)
			if n == math.MaxInt {
				return false
			}
			assert.Equal(t, 1000, n)
			return true
		}},
		{"clock", passClock, func(t *testing.T, h *hookStore) bool {
			off, got := h.ServerClockOffset(ctx, svc)
			b := boundsOf(off)
			if b == (clockBounds{}) {
				return false
			}
			assert.Equal(t, clockBounds{lo: -time.Second, hasLo: true}, b)
			assert.Equal(t, at, got)
			return true
		}},
		{"wake-ups", passWakes, func(t *testing.T, h *hookStore) bool {
			if wakeStoreOf(h) == nil {
				_, err := h.subscribeWake(svc, kvKey, "j", func([]byte, uint64) {})
				require.ErrorIs(t, err, ErrInvalidRequest)
				return false
			}
			return true
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.False(t, tc.passed(t, newHookStore(inner, passNone)), "passed by passNone")
			assert.False(t, tc.passed(t, newHookStore(inner, passAll&^tc.cap)), "passed by passAll without it")
			assert.True(t, tc.passed(t, newHookStore(inner, tc.cap)), "hidden when chosen")
			assert.True(t, tc.passed(t, newHookStore(inner, passAll)), "hidden by passAll")
		})
	}
}

// A hookStore's hook sees every call with its arguments, in place of the
// call: it can skip it (nothing reaches the store) or change its result.
func TestHookStoreHookRunsInPlaceOfEachCall(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	mem := NewMemoryStore()
	mem.batching = true
	errSkipped := errors.New("skipped by the hook")
	var seen []storeCall
	h := newHookStore(mem, passAll).withHook(func(_ context.Context, c storeCall, call func() storeResult) storeResult {
		seen = append(seen, c)
		if c.op == opCreate && string(c.value) == "skip" {
			return storeResult{err: errSkipped}
		}
		r := call()
		if c.op == opGet {
			r.value = append([]byte("seen:"), r.value...)
		}
		return r
	})
	_, err := h.Create(ctx, "svc", "svc.t.a", []byte("skip"))
	require.ErrorIs(t, err, errSkipped)
	_, _, err = mem.Get(ctx, "svc", "svc.t.a")
	require.ErrorIs(t, err, ErrKeyNotFound, "a skipped create reached the store")

	rev, err := h.Create(ctx, "svc", "svc.t.a", []byte("v1"))
	require.NoError(t, err)
	rev, err = h.Update(ctx, "svc", "svc.t.a", []byte("v2"), rev)
	require.NoError(t, err)
	v, got, err := h.Get(ctx, "svc", "svc.t.a")
	require.NoError(t, err)
	assert.Equal(t, "seen:v2", string(v))
	assert.Equal(t, rev, got)
	last, err := h.WriteBatch(ctx, "svc", "svc.t.a", [][]byte{[]byte("v3"), nil}, rev, true)
	require.NoError(t, err)
	require.NoError(t, h.Delete(ctx, "svc", "svc.t.a", last))
	keys, err := h.ListKeys(ctx, "svc", "t")
	require.NoError(t, err)
	assert.Empty(t, keys)

	want := []storeCall{
		{op: opCreate, service: "svc", key: "svc.t.a", value: []byte("skip")},
		{op: opCreate, service: "svc", key: "svc.t.a", value: []byte("v1")},
		{op: opUpdate, service: "svc", key: "svc.t.a", value: []byte("v2"), revision: rev - 1},
		{op: opGet, service: "svc", key: "svc.t.a"},
		{op: opWriteBatch, service: "svc", key: "svc.t.a", values: [][]byte{[]byte("v3"), nil}, revision: rev, del: true},
		{op: opDelete, service: "svc", key: "svc.t.a", revision: last},
		{op: opListKeys, service: "svc", jobType: "t"},
	}
	assert.Equal(t, want, seen)
}
