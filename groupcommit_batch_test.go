package jobkeys

// Batched writes (groupcommit.go, BatchWriter): over a store that writes
// successive states of a key in one step, a lane's batch writes every
// writer's own state as a revision of its own, in one call. Each test holds
// the key's lane, queues the operations behind it in a known order, lets
// them go as one batch, and compares every outcome and the stored history
// with a serial run of the same operations on a coordinator of its own
// (same fixed clock, same slot tokens).

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
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

// bcCalls counts the calls that reach a bcRig's store, single writes and
// batches apart, and can fail the next batch (after applying it, when
// applied: a lost reply).
type bcCalls struct {
	singles, groups atomic.Int64
	reads           atomic.Int64
	conflicts       atomic.Int64 // batches refused for a revision conflict
	sizes           []int        // messages per batch, guarded by mu
	mu              sync.Mutex
	fail            error
	failApplied     bool
}

// hook is the hookStore hook that counts the calls and fails the batch.
func (s *bcCalls) hook(_ context.Context, c storeCall, call func() storeResult) storeResult {
	switch c.op {
	case opGet:
		s.reads.Add(1)
	case opCreate, opUpdate, opDelete:
		s.singles.Add(1)
	case opWriteBatch:
		s.groups.Add(1)
		s.mu.Lock()
		s.sizes = append(s.sizes, len(c.values))
		fail, applied := s.fail, s.failApplied
		s.fail = nil
		s.mu.Unlock()
		if fail != nil && !applied {
			return storeResult{err: fail}
		}
		r := call()
		if errors.Is(r.err, ErrRevisionConflict) {
			s.conflicts.Add(1)
		}
		if r.err == nil && fail != nil {
			return storeResult{err: fail}
		}
		return r
	}
	return call()
}

func (s *bcCalls) failNext(err error, applied bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fail, s.failApplied = err, applied
}

// bcRig is a coordinator with a fixed clock and numbered slot tokens over
// a store, and one key whose job "held" holds a slot.
type bcRig struct {
	t       *testing.T
	store   *hookStore // over the rig's store, batches passed through
	calls   *bcCalls   // the calls that reached it
	c       *KeyCoordinator
	service string
	policy  Policy
	payload []byte
	key     JobKey
	lease   Lease
	tokens  int // slot tokens handed out
}

func newBCRig(t *testing.T, inner Store, service string, policy Policy) *bcRig {
	t.Helper()
	_, ok := inner.(BatchWriter)
	require.True(t, ok, "%T is a BatchWriter", inner)
	calls := &bcCalls{}
	st := newHookStore(inner, passBatches).withHook(calls.hook)
	r := &bcRig{t: t, store: st, calls: calls, service: service, policy: policy, payload: benchPayload(0)}
	c, err := NewCoordinator(st, &Config{InstanceID: "bc", Now: func() time.Time { return gcNow },
		NewSlotToken: func() string { r.tokens++; return "tok-" + strconv.Itoa(r.tokens) }})
	require.NoError(t, err)
	r.c = c
	r.key, err = DeriveKey(service, benchJobType, r.payload, policy.Key)
	require.NoError(t, err)
	ctx := context.Background()
	_, err = r.admit("held")(ctx, r)
	require.NoError(t, err)
	acq, err := r.acquire("held")(ctx, r)
	require.NoError(t, err)
	require.Equal(t, KindAcquired, acq.(Acquisition).Kind)
	r.lease = acq.(Acquisition).Lease
	return r
}

type bcOp func(ctx context.Context, r *bcRig) (any, error)

func (r *bcRig) admit(id string) bcOp {
	return func(ctx context.Context, r *bcRig) (any, error) {
		return r.c.Admit(ctx, AdmitRequest{Service: r.service, JobType: benchJobType, JobID: id, Payload: r.payload, Policy: r.policy})
	}
}

func (r *bcRig) acquire(id string) bcOp {
	return func(ctx context.Context, r *bcRig) (any, error) {
		return r.c.Acquire(ctx, AcquireRequest{Service: r.service, JobType: benchJobType, JobID: id, Payload: r.payload, Policy: r.policy})
	}
}

func (r *bcRig) remove(id string) bcOp {
	return func(ctx context.Context, r *bcRig) (any, error) {
		return r.c.RemoveQueued(ctx, RemoveRequest{Service: r.service, JobType: benchJobType, JobID: id, Payload: r.payload, Policy: r.policy})
	}
}

func bcRenewHeld(ctx context.Context, r *bcRig) (any, error) {
	return r.c.Renew(ctx, RenewRequest{Lease: r.lease})
}

func bcReleaseHeld(ctx context.Context, r *bcRig) (any, error) {
	return r.c.Release(ctx, ReleaseRequest{Lease: r.lease})
}

// batched runs ops as one batch: it holds the key's lane until all are
// queued behind it, in order, then lets them go.
func (r *bcRig) batched(ops []bcOp) []gcResult {
	r.t.Helper()
	ctx := context.Background()
	e := r.c.keys.pin(r.key.KVKey)
	defer r.c.keys.unpin(r.key.KVKey, e)
	require.NoError(r.t, e.lock(ctx))
	var chans []chan gcResult
	for i, op := range ops {
		ch := make(chan gcResult, 1)
		chans = append(chans, ch)
		go func() {
			out, err := op(ctx, r)
			ch <- gcResult{out, err}
		}()
		require.Eventuallyf(r.t, func() bool {
			n, _ := e.lane.Queued()
			return n == i+1
		}, time.Minute, time.Millisecond, "%d operations queued", i+1)
	}
	e.unlock()
	var res []gcResult
	for _, ch := range chans {
		res = append(res, <-ch)
	}
	return res
}

func (r *bcRig) serial(ops []bcOp) []gcResult {
	var res []gcResult
	for _, op := range ops {
		out, err := op(context.Background(), r)
		res = append(res, gcResult{out, err})
	}
	return res
}

// wroteState returns the state an outcome says its operation wrote (empty:
// a delete), or nil.
func wroteState(out any) *KeyState {
	switch o := out.(type) {
	case Admission:
		return o.State
	case Acquisition:
		return o.State
	case Renewal:
		return o.State
	case ReleaseOutcome:
		return o.State
	case Removal:
		return o.State
	case Restoration:
		return o.State
	}
	return nil
}

// bcMemory returns a memory store that writes batches, and the history of
// its writes to service, in revision order.
func bcMemory(t *testing.T, service string) (*MemoryStore, func() []ValueChange) {
	t.Helper()
	m := NewMemoryStore()
	m.batching = true
	var mu sync.Mutex
	var hist []ValueChange
	ctx, cancel := context.WithCancel(context.Background())
	ended, err := m.WatchValues(ctx, service, func(c ValueChange) {
		mu.Lock()
		hist = append(hist, c)
		mu.Unlock()
	})
	require.NoError(t, err)
	t.Cleanup(func() { cancel(); <-ended })
	return m, func() []ValueChange {
		mu.Lock()
		defer mu.Unlock()
		return append([]ValueChange(nil), hist...)
	}
}

// bcSettled waits until hist holds m's every write to the rig's key, and
// returns how many it holds.
func bcSettled(t *testing.T, m *MemoryStore, r *bcRig, hist func() []ValueChange) int {
	t.Helper()
	m.mu.Lock()
	rev := m.buckets[r.service][r.key.KVKey].rev
	m.mu.Unlock()
	require.Eventually(t, func() bool { h := hist(); return len(h) > 0 && h[len(h)-1].Revision == rev }, time.Minute, time.Millisecond, "the watch delivers revision %d", rev)
	return len(hist())
}

// bcCheckRevisions requires the writers among res (in order) to have
// written the revisions in hist from index from on, one each and
// consecutive, each writer's State the bytes stored at its revision (a
// delete marker for an empty one).
func bcCheckRevisions(t *testing.T, res []gcResult, hist []ValueChange, from int) {
	t.Helper()
	var writers []*KeyState
	for _, got := range res {
		require.NoError(t, got.err)
		if st := wroteState(got.out); st != nil {
			writers = append(writers, st)
		}
	}
	require.Len(t, hist[from:], len(writers), "one revision per writer")
	for i, st := range writers {
		c := hist[from+i]
		if i > 0 {
			assert.Equal(t, hist[from+i-1].Revision+1, c.Revision, "writer %d's revision follows the one before", i)
		}
		if st.Empty() {
			assert.True(t, c.Deleted, "writer %d emptied the key: a delete", i)
			assert.Equal(t, len(writers)-1, i, "a delete is last")
			continue
		}
		assert.False(t, c.Deleted, "writer %d", i)
		assert.Equal(t, string(appendState(nil, st)), string(c.Value), "writer %d's State is its revision's value", i)
	}
}

// The writers of a batch over a batching store write one batch, each its
// own state at a revision of its own, consecutive, in their order; riders
// write nothing; every outcome and the stored state are the serial run's.
// A release and the acquisition it lets in are two revisions.
func TestGroupCommitBatchWritersOwnRevisions(t *testing.T) {
	t.Parallel()
	policy := Policy{Key: benchPolicy.Key, MaxActive: 1, MaxQueuedPerKey: 16}
	ops := func(r *bcRig) []bcOp {
		return []bcOp{r.admit("a"), r.acquire("a"), bcRenewHeld, r.admit("b"), r.remove("nope"), bcReleaseHeld, r.acquire("a"), r.admit("c"), r.acquire("b")}
	}
	mem, hist := bcMemory(t, "bcown")
	b := newBCRig(t, mem, "bcown", policy)
	from := bcSettled(t, mem, b, hist)
	singles := b.calls.singles.Load()
	res := b.batched(ops(b))
	t.Logf("outcomes %v, batches %v", gcKinds(res), b.calls.sizes)
	assert.Equal(t, singles, b.calls.singles.Load(), "no single write")
	require.Equal(t, int64(1), b.calls.groups.Load(), "one batch")
	bcSettled(t, mem, b, hist)
	bcCheckRevisions(t, res, hist(), from)
	assert.GreaterOrEqual(t, b.calls.sizes[0], 5, "admit a, renew, admit b, release, acquire a, admit c write")

	sm, _ := bcMemory(t, "bcown")
	sm.batching = false
	s := newBCRig(t, sm, "bcown", policy)
	want := s.serial(ops(s))
	gcSame(t, res, want, bcStored(t, b), bcStored(t, s))
}

func bcStored(t *testing.T, r *bcRig) []byte {
	t.Helper()
	v, _, err := r.store.Get(context.Background(), r.service, r.key.KVKey)
	if errors.Is(err, ErrKeyNotFound) {
		return nil
	}
	require.NoError(t, err)
	return v
}

// A batch whose last writer empties the key ends in a delete, the last
// revision; the next operation creates the key again without a read.
func TestGroupCommitBatchEndsInDelete(t *testing.T) {
	t.Parallel()
	policy := Policy{Key: benchPolicy.Key, MaxActive: 1, MaxQueuedPerKey: 16}
	ops := func(r *bcRig) []bcOp {
		return []bcOp{r.admit("a"), r.remove("a"), bcReleaseHeld, r.admit("z"), r.acquire("z")}
	}
	mem, hist := bcMemory(t, "bcdel")
	b := newBCRig(t, mem, "bcdel", policy)
	from := bcSettled(t, mem, b, hist)
	res := b.batched(ops(b))
	t.Logf("outcomes %v, batches %v", gcKinds(res), b.calls.sizes)
	require.Equal(t, []int{3}, b.calls.sizes, "admit, remove, release: one batch ending in the delete")
	bcSettled(t, mem, b, hist)
	bcCheckRevisions(t, res[:3], hist()[:from+3], from)

	sm, _ := bcMemory(t, "bcdel")
	sm.batching = false
	s := newBCRig(t, sm, "bcdel", policy)
	gcSame(t, res, s.serial(ops(s)), bcStored(t, b), bcStored(t, s))
}

// A batch the store refuses for a revision conflict writes nothing (all or
// nothing); its operations retry and end as in the serial run from the
// state that won.
func TestGroupCommitBatchConflictWritesNothing(t *testing.T) {
	t.Parallel()
	m := NewMemoryStore()
	m.batching = true
	ctx := context.Background()
	rev, err := m.Create(ctx, "s", "k", []byte("v0"))
	require.NoError(t, err)
	_, err = m.WriteBatch(ctx, "s", "k", [][]byte{[]byte("v1"), []byte("v2")}, rev+1, false)
	require.ErrorIs(t, err, ErrRevisionConflict)
	v, got, err := m.Get(ctx, "s", "k")
	require.NoError(t, err)
	assert.Equal(t, [2]any{"v0", rev}, [2]any{string(v), got}, "nothing written")
	_, err = m.WriteBatch(ctx, "s", "k", [][]byte{[]byte("v1"), make([]byte, MemoryStoreMaxValueSizeDefault+1)}, rev, false)
	require.ErrorIs(t, err, ErrStateTooLarge)
	_, got, err = m.Get(ctx, "s", "k")
	require.NoError(t, err)
	assert.Equal(t, rev, got, "nothing written")

	// Through the engine: another writer moves the key on first.
	policy := Policy{Key: benchPolicy.Key, MaxActive: 1, MaxQueuedPerKey: 16}
	mem, _ := bcMemory(t, "bcconf")
	b := newBCRig(t, mem, "bcconf", policy)
	other, err := NewCoordinator(mem, &Config{InstanceID: "other", Now: func() time.Time { return gcNow }})
	require.NoError(t, err)
	_, err = other.Admit(ctx, AdmitRequest{Service: b.service, JobType: benchJobType, JobID: "o", Payload: b.payload, Policy: policy})
	require.NoError(t, err)
	res := b.batched([]bcOp{b.admit("a"), b.admit("b"), b.admit("c")})
	for i, got := range res {
		require.NoError(t, got.err, "operation %d", i)
		assert.Equal(t, KindAccepted, got.out.(Admission).Kind)
	}
	st, _, err := b.c.read(ctx, b.key)
	require.NoError(t, err)
	var queued []string
	for _, q := range st.Queued {
		queued = append(queued, q.JobID)
	}
	require.NotEmpty(t, queued)
	assert.Equal(t, "o", queued[0], "the admission that won")
	assert.ElementsMatch(t, []string{"o", "a", "b", "c"}, queued, "each admission once (after a lost race each retries on its own, in any order)")
	assert.Equal(t, int64(1), b.calls.conflicts.Load(), "the batch lost its race")
}

// A batch written whose reply is lost fails each of its operations with
// the error, as a single write does; the key works afterwards from the
// state written (read again), and later operations end as in a run where
// the write never failed.
func TestGroupCommitBatchReplyLost(t *testing.T) {
	t.Parallel()
	policy := Policy{Key: benchPolicy.Key, MaxActive: 1, MaxQueuedPerKey: 16}
	errDown := errors.New("bc test: reply lost")
	ops := func(r *bcRig) []bcOp { return []bcOp{r.admit("a"), bcRenewHeld, r.admit("b"), r.acquire("b")} }
	follow := func(r *bcRig) []bcOp {
		return []bcOp{bcReleaseHeld, r.acquire("a"), r.admit("c"), r.remove("b"), r.acquire("c")}
	}
	for _, tc := range []struct{ applied, fed bool }{{true, false}, {false, false}, {true, true}, {false, true}} {
		t.Run(fmt.Sprintf("applied=%v,fed=%v", tc.applied, tc.fed), func(t *testing.T) {
			t.Parallel()
			applied := tc.applied
			svc := "bclost" + strconv.FormatBool(applied) + strconv.FormatBool(tc.fed)
			mem, hist := bcMemory(t, svc)
			b := newBCRig(t, mem, svc, policy)
			before := bcSettled(t, mem, b, hist)
			if tc.fed {
				// The coordinator's watch feed of the key, as a Watcher
				// gives it: the batch's revisions reach it although the
				// reply is lost.
				b.c.keys.attach(b.key.KVKey)
				defer b.c.keys.detach(b.key.KVKey)
				v, rev, err := mem.Get(context.Background(), svc, b.key.KVKey)
				require.NoError(t, err)
				b.c.keys.watchedValue(b.key.KVKey, svc, v, rev)
				ctx, cancel := context.WithCancel(context.Background())
				ended, err := mem.WatchValues(ctx, svc, func(c ValueChange) {
					if c.Deleted {
						b.c.keys.watched(c.KVKey, nil, c.Revision, true)
					} else {
						b.c.keys.watchedValue(c.KVKey, svc, c.Value, c.Revision)
					}
				})
				require.NoError(t, err)
				defer func() { cancel(); <-ended }()
			}
			b.calls.failNext(errDown, applied)
			res := b.batched(ops(b))
			for i, got := range res {
				if wroteState(got.out) != nil || got.err != nil {
					assert.ErrorIsf(t, got.err, errDown, "operation %d", i)
				}
			}
			require.Equal(t, int64(1), b.calls.groups.Load())

			sm, _ := bcMemory(t, svc)
			sm.batching = false
			s := newBCRig(t, sm, svc, policy)
			if applied {
				s.serial(ops(s))
				assert.Equal(t, before+3, bcSettled(t, mem, b, hist), "three writers, three revisions")
			} else {
				assert.Equal(t, before, bcSettled(t, mem, b, hist), "nothing written")
			}
			s.tokens = b.tokens // the batch's acquisition took one
			assert.Equal(t, string(bcStored(t, s)), string(bcStored(t, b)), "the stored state")
			if tc.fed && applied {
				_, last, err := mem.Get(context.Background(), svc, b.key.KVKey)
				require.NoError(t, err)
				e := b.c.keys.entry(b.key.KVKey)
				require.Eventually(t, func() bool {
					return e.Marks().WatchRev == last
				}, time.Minute, time.Millisecond, "the feed delivers the batch")
				m := e.Marks()
				known, rev := m.Known, m.Rev
				assert.Equal(t, [2]any{true, last}, [2]any{known, rev}, "the entry holds the batch's last revision, from the feed")
			}
			reads := b.calls.reads.Load()
			gcSame(t, b.serial(follow(b)), s.serial(follow(s)), bcStored(t, b), bcStored(t, s))
			t.Logf("%d reads after the failure", b.calls.reads.Load()-reads)
		})
	}
}

// The engine batches only over a store that says it pays: over a memory
// store without batches the same operations are single writes.
func TestGroupCommitBatchOnlyWhereItPays(t *testing.T) {
	t.Parallel()
	policy := Policy{Key: benchPolicy.Key, MaxActive: 1, MaxQueuedPerKey: 16}
	m := NewMemoryStore()
	b := newBCRig(t, m, "bcoff", policy)
	singles := b.calls.singles.Load()
	res := b.batched([]bcOp{b.admit("a"), b.admit("b"), bcRenewHeld})
	for _, got := range res {
		require.NoError(t, got.err)
	}
	assert.Zero(t, b.calls.groups.Load(), "no batch")
	assert.Equal(t, singles+3, b.calls.singles.Load(), "three single writes")
}

// natsAtomicBucket creates service's bucket with history 64 on storage
// with replicas 1, atomic publish allowed when allow.
func natsAtomicBucket(t testing.TB, ctx context.Context, js jetstream.JetStream, service string, storage jetstream.StorageType, allow bool) string {
	t.Helper()
	bucket := BucketPrefixDefault + "_" + service
	_, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: bucket, History: 64, Storage: storage})
	require.NoError(t, err)
	if allow {
		require.NoError(t, allowAtomicPublish(ctx, js, "KV_"+bucket))
	}
	return bucket
}

// bcNATSHistory reads every message of stream from seq from to its last,
// with headers.
func bcNATSHistory(t *testing.T, ctx context.Context, nc *nats.Conn, js jetstream.JetStream, stream string, from uint64) ([]ValueChange, []nats.Header) {
	t.Helper()
	st, err := js.Stream(ctx, stream)
	require.NoError(t, err)
	info, err := st.Info(ctx)
	require.NoError(t, err)
	var hist []ValueChange
	var hdrs []nats.Header
	for seq := from; seq <= info.State.LastSeq; seq++ {
		m := natstest.ReadStored(t, nc, stream, seq)
		hdr, err := nats.DecodeHeadersMsg(m.Hdrs)
		require.NoError(t, err)
		hist = append(hist, ValueChange{Revision: seq, Value: m.Data, Deleted: hdr.Get("KV-Operation") == "DEL"})
		hdrs = append(hdrs, hdr)
	}
	return hist, hdrs
}

// On NATS, the batch is one JetStream atomic batch on a memory bucket that
// allows atomic publish: the writers' revisions are consecutive stream
// sequences, each message holds its writer's State, only the first
// carries the revision condition, and all carry one batch id. An R1 file
// bucket that allows atomic publish, and a memory bucket that does not,
// get single writes, kv.Update's messages.
func TestNATSStoreBatchedWrites(t *testing.T) {
	t.Parallel()
	srv := natstest.Run(t)
	policy := Policy{Key: benchPolicy.Key, MaxActive: 1, MaxQueuedPerKey: 16}
	for _, tc := range []struct {
		name    string
		storage jetstream.StorageType
		allow   bool
		batches bool
	}{
		{"memory-atomic", jetstream.MemoryStorage, true, true},
		{"file-R1-atomic", jetstream.FileStorage, true, false},
		{"memory", jetstream.MemoryStorage, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			nc, js := natstest.Connect(t, srv)
			service := "bcnats" + strconv.Itoa(int(tc.storage)) + strconv.FormatBool(tc.allow)
			bucket := natsAtomicBucket(t, ctx, js, service, tc.storage, tc.allow)
			st, err := NewNATSStore(js)
			require.NoError(t, err)
			b := newBCRig(t, st, service, policy)
			require.Equal(t, tc.batches, st.Batches(service, b.key.KVKey), "the store batches")
			si, err := js.Stream(ctx, "KV_"+bucket)
			require.NoError(t, err)
			from := si.CachedInfo().State.LastSeq + 1
			prev := from - 1
			singles := b.calls.singles.Load()
			reqs := nc.Stats().OutMsgs
			res := b.batched([]bcOp{b.admit("a"), bcRenewHeld, b.admit("b"), bcReleaseHeld, b.acquire("a")})
			sent := nc.Stats().OutMsgs - reqs
			hist, hdrs := bcNATSHistory(t, ctx, nc, js, "KV_"+bucket, from)
			bcCheckRevisions(t, res, hist, 0)
			t.Logf("outcomes %v, batches %v, %d messages sent", gcKinds(res), b.calls.sizes, sent)
			assert.Equal(t, uint64(5), sent, "one message per writer")
			if !tc.batches {
				assert.Zero(t, b.calls.groups.Load(), "no batch")
				assert.Equal(t, singles+5, b.calls.singles.Load(), "five single writes")
				for i, h := range hdrs {
					assert.Equal(t, strconv.FormatUint(prev+uint64(i), 10), h.Get(jetstream.ExpectedLastSubjSeqHeader), "write %d: kv.Update's condition", i)
					assert.Empty(t, h.Get("Nats-Batch-Id"), "write %d: not in a batch", i)
				}
				return
			}
			require.Equal(t, []int{5}, b.calls.sizes, "one batch of five")
			assert.Equal(t, singles, b.calls.singles.Load(), "no single write")
			for i, h := range hdrs {
				if i == 0 {
					assert.Equal(t, strconv.FormatUint(prev, 10), h.Get(jetstream.ExpectedLastSubjSeqHeader), "the first message's condition")
				} else {
					assert.Empty(t, h.Values(jetstream.ExpectedLastSubjSeqHeader), "message %d: no condition", i)
				}
				assert.Equal(t, hdrs[0].Get("Nats-Batch-Id"), h.Get("Nats-Batch-Id"), "message %d: one batch", i)
				assert.Equal(t, strconv.Itoa(i+1), h.Get("Nats-Batch-Sequence"))
			}
			assert.NotEmpty(t, hdrs[0].Get("Nats-Batch-Id"))

			// A batch whose first condition fails writes nothing.
			last := from + uint64(len(hist)) - 1
			_, err = st.WriteBatch(ctx, service, b.key.KVKey, [][]byte{[]byte(`x`), []byte(`y`)}, last-1, false)
			require.ErrorIs(t, err, ErrRevisionConflict)
			info, err := si.Info(ctx)
			require.NoError(t, err)
			assert.Equal(t, last, info.State.LastSeq, "nothing written")
		})
	}
}

// WithCreateBuckets allows atomic publish on the buckets it creates: a
// memory bucket batches.
func TestNATSStoreCreatesAtomicBucket(t *testing.T) {
	t.Parallel()
	srv := natstest.Run(t)
	_, js := natstest.Connect(t, srv)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st, err := NewNATSStore(js, WithCreateBuckets(jetstream.MemoryStorage, 1))
	require.NoError(t, err)
	_, err = st.Create(ctx, "bccreate", "bccreate.t.k", []byte("v"))
	require.NoError(t, err)
	s, err := js.Stream(ctx, "KV_"+st.BucketName("bccreate"))
	require.NoError(t, err)
	assert.True(t, s.CachedInfo().Config.AllowAtomicPublish)
	assert.True(t, st.Batches("bccreate", "bccreate.t.k"))
	assert.False(t, st.Batches("other", "other.t.k"), "a bucket not opened")

	fst, err := NewNATSStore(js, WithBucketPrefix("FILE_KEYS"), WithCreateBuckets(jetstream.FileStorage, 1))
	require.NoError(t, err)
	_, err = fst.Create(ctx, "bccreate", "bccreate.t.k", []byte("v"))
	require.NoError(t, err)
	s, err = js.Stream(ctx, "KV_"+fst.BucketName("bccreate"))
	require.NoError(t, err)
	assert.True(t, s.CachedInfo().Config.AllowAtomicPublish)
	assert.False(t, fst.Batches("bccreate", "bccreate.t.k"), "R1 file storage does not batch")
}

// A stream that stops allowing atomic publish refuses the next batch: its
// operations are written one at a time, and the bucket batches no more.
func TestNATSStoreBatchDisabledFallsBack(t *testing.T) {
	t.Parallel()
	srv := natstest.Run(t)
	_, js := natstest.Connect(t, srv)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	policy := Policy{Key: benchPolicy.Key, MaxActive: 1, MaxQueuedPerKey: 16}
	bucket := natsAtomicBucket(t, ctx, js, "bcdis", jetstream.MemoryStorage, true)
	st, err := NewNATSStore(js)
	require.NoError(t, err)
	b := newBCRig(t, st, "bcdis", policy)
	require.True(t, st.Batches("bcdis", b.key.KVKey))
	s, err := js.Stream(ctx, "KV_"+bucket)
	require.NoError(t, err)
	cfg := s.CachedInfo().Config
	cfg.AllowAtomicPublish = false
	_, err = js.UpdateStream(ctx, cfg)
	require.NoError(t, err)
	singles := b.calls.singles.Load()
	res := b.batched([]bcOp{b.admit("a"), b.admit("b"), b.admit("c")})
	for i, got := range res {
		require.NoError(t, got.err, "operation %d", i)
		assert.Equal(t, KindAccepted, got.out.(Admission).Kind)
	}
	assert.Equal(t, int64(1), b.calls.groups.Load(), "one batch tried")
	assert.Equal(t, singles+3, b.calls.singles.Load(), "then one write each")
	assert.False(t, st.Batches("bcdis", b.key.KVKey), "the bucket batches no more")
}

// TestLinearizableBatched is TestLinearizableUnderConcurrency on a memory
// bucket that allows atomic publish, with more clients sharing
// coordinators, so that lanes batch writers: the history is linearizable,
// the audit of every revision holds, and batches were written.
func TestLinearizableBatched(t *testing.T) {
	t.Parallel()
	seed := reliabilitySeed(t)
	clients, sharing, opsPerClient, timeout := 4, 8, 200, 30*time.Second
	if reliabilityLong() {
		clients, sharing, opsPerClient, timeout = 8, 24, 1000, 5*time.Minute
	}
	s := linServer(t)
	const service, jobType = "linb", "work"
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	nc, js := natstest.Connect(t, s)
	bucket := auditCreateBucket(t, ctx, js, service, 1, jetstream.MemoryStorage)
	require.NoError(t, allowAtomicPublish(ctx, js, "KV_"+bucket))
	ttl := 150 * time.Millisecond
	keys := []linKey{
		newLinKey(t, service, jobType, "a", Policy{MaxActive: 1, MaxQueuedPerKey: 1, WhenFull: ReplaceOldest, StalePolicy: FailStale, HeartbeatTTL: ttl, HeartbeatInterval: ttl / 3}),
		newLinKey(t, service, jobType, "b", Policy{MaxActive: 2, MaxQueuedPerKey: 1, WhenFull: Coalesce, StalePolicy: Block, HeartbeatTTL: ttl, HeartbeatInterval: ttl / 3}),
		newLinKey(t, service, jobType, "c", Policy{MaxActive: 1, MaxQueuedPerKey: 0, WhenFull: Reject, StalePolicy: FailStale, HeartbeatTTL: ttl, HeartbeatInterval: ttl / 3}),
	}
	log := linRunShared(t, ctx, func(int) string { return s.ClientURL() }, service, jobType, keys, clients, sharing, opsPerClient, seed)
	t.Logf("%d clients (%d connections and coordinators), %d operations: %v", clients+sharing, clients, len(log), linCountOutcomes(log))
	linCheck(t, keys, log, timeout)
	auditAll(t, js, bucket, log, linPolicyOf(keys), true)

	// Batches were written, each at consecutive sequences with the
	// condition on its first message only. The history is read with a
	// context of its own: under JOBKEYS_LONG the run and porcupine's
	// timeout together outlast the run's.
	hctx, hcancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer hcancel()
	_, hdrs := bcNATSHistory(t, hctx, nc, js, "KV_"+bucket, 1)
	batched, batches := 0, 0
	for i, h := range hdrs {
		id := h.Get("Nats-Batch-Id")
		if id == "" {
			continue
		}
		batched++
		seq := h.Get("Nats-Batch-Sequence")
		if seq == "1" {
			batches++
			assert.NotEmpty(t, h.Get(jetstream.ExpectedLastSubjSeqHeader), "sequence %d: a batch's first message has the condition", i+1)
			continue
		}
		assert.Empty(t, h.Values(jetstream.ExpectedLastSubjSeqHeader), "sequence %d: a later message has none", i+1)
		if assert.Positive(t, i) {
			assert.Equal(t, id, hdrs[i-1].Get("Nats-Batch-Id"), "sequence %d: a batch's messages are consecutive", i+1)
		}
	}
	t.Logf("%d of %d revisions in %d batches", batched, len(hdrs), batches)
	assert.Positive(t, batches, "lanes wrote batches")
}

// TestClusterLinearizableBatched runs the workload of TestLinearizableBatched
// on an R3 file bucket that allows atomic publish (batches staged in memory:
// they pay there), clients spread over the three nodes: the history is
// linearizable, the audit holds, and batches were written.
func TestClusterLinearizableBatched(t *testing.T) {
	clusterEnabled(t)
	c := natstest.StartCluster(t, natstest.ClusterOptions{Nodes: 3})
	seed := reliabilitySeed(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const service, jobType = "clusterlinb", "work"
	nc, js := clusterConnect(t, c.URLs(0))
	bucket := clusterBucket(t, ctx, js, service)
	require.NoError(t, allowAtomicPublish(ctx, js, "KV_"+bucket))
	ttl := 300 * time.Millisecond
	keys := []linKey{
		newLinKey(t, service, jobType, "a", Policy{MaxActive: 1, MaxQueuedPerKey: 1, WhenFull: ReplaceOldest, StalePolicy: FailStale, HeartbeatTTL: ttl, HeartbeatInterval: ttl / 3}),
		newLinKey(t, service, jobType, "b", Policy{MaxActive: 2, MaxQueuedPerKey: 1, WhenFull: Coalesce, StalePolicy: Block, HeartbeatTTL: ttl, HeartbeatInterval: ttl / 3}),
	}
	clients, sharing, ops := 3, 6, 200
	log := linRunShared(t, ctx, func(i int) string { return c.URLs(i % 3) }, service, jobType, keys, clients, sharing, ops, seed)
	t.Logf("%d clients on 3 nodes, %d operations: %v", clients+sharing, len(log), linCountOutcomes(log))
	linCheck(t, keys, log, time.Minute)
	actx, acancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer acancel()
	entries := auditRead(t, actx, js, bucket)
	t.Logf("audit of %s: %v", bucket, auditCheck(t, entries, newAuditFacts(log), linPolicyOf(keys), true))
	_, hdrs := bcNATSHistory(t, actx, nc, js, "KV_"+bucket, 1)
	batches := 0
	for _, h := range hdrs {
		if h.Get("Nats-Batch-Sequence") == "1" {
			batches++
		}
	}
	t.Logf("%d batches in %d revisions", batches, len(hdrs))
	assert.Positive(t, batches, "lanes wrote batches")
}

// linRunShared runs the random workload of the linearizability tests with
// clients connections and coordinators (client i dialling url(i)) and
// sharing more clients on those coordinators (their connections, state
// caches and lanes, as goroutines of worker processes), drains the keys,
// fails the test on any error but ErrContention, and returns the log.
func linRunShared(t *testing.T, ctx context.Context, url func(int) string, service, jobType string, keys []linKey, clients, sharing, ops int, seed uint64) []*linOp {
	t.Helper()
	rec := newLinRecorder()
	pool := &linPool{jobs: make([][]string, len(keys))}
	cs := make([]*linClient, clients)
	for i := range cs {
		cs[i] = newLinClient(t, i, url(i), service, jobType, keys, rec)
	}
	for i := range sharing {
		owner := cs[i%clients]
		cs = append(cs, &linClient{id: clients + i, service: service, jobType: jobType, keys: keys, rec: rec,
			instance: fmt.Sprintf("client-%d", clients+i), coord: owner.coord, nc: owner.nc, js: owner.js})
	}
	var wg sync.WaitGroup
	for i, c := range cs {
		wg.Go(func() { linRandomClient(ctx, c, pool, rand.New(rand.NewPCG(seed, uint64(i))), ops) })
	}
	wg.Wait()
	cs[0].drain(t, ctx)
	log := rec.log()
	for _, op := range log {
		if op.out.err != nil && !errors.Is(op.out.err, ErrContention) {
			t.Errorf("client %d: %s %s: %v", op.client, op.in.kind, op.in.job, op.out.err)
		}
	}
	return log
}
