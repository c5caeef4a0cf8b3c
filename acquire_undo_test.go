package jobkeys

// An acquisition whose write's outcome is unknown leaves no slot behind
// (acquire_undo.go). The caller's context is cancelled while the
// acquisition's write is under way; the write lands before the reply
// (the store hook makes it on the wrapped store and answers
// context.Canceled), or is held and lands only after the undo read the
// key, or after the undo wrote it. Every time the acquisition returns
// context.Canceled, and afterwards the key holds no slot of the job, the
// job is queued where it was (at the head) unless it was a retry, and a
// new acquisition of it takes a slot at once, not after a lease.

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// lostWriteMode says when a lostWrite hook makes the write it intercepts.
type lostWriteMode int

const (
	landBeforeReply    lostWriteMode = iota // at once, then the reply is lost
	landAfterNextRead                       // held until the next Get has returned
	landAfterNextWrite                      // held until the next write has returned
)

// lostWrite is a hookStore hook that, once armed, intercepts the next
// Create or Update (op), cancels the caller's context and answers
// context.Canceled: the write is made on the wrapped store as mode says,
// on a context of its own.
type lostWrite struct {
	inner Store
	op    storeOp
	mode  lostWriteMode

	mu      sync.Mutex
	cancel  context.CancelFunc // set by arm; nil: not armed
	held    *storeCall         // the intercepted write, until made
	landed  bool               // the intercepted write was made
	landErr error              // its error
}

// arm makes h intercept the next write of its op, cancelling cancel.
func (h *lostWrite) arm(cancel context.CancelFunc) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.cancel = cancel
}

// land makes the held write, if any, on the wrapped store. h.mu is held.
func (h *lostWrite) land() {
	c := h.held
	if c == nil {
		return
	}
	h.held = nil
	h.landed = true
	ctx := context.Background()
	if c.op == opCreate {
		_, h.landErr = h.inner.Create(ctx, c.service, c.key, c.value)
	} else {
		_, h.landErr = h.inner.Update(ctx, c.service, c.key, c.value, c.revision)
	}
}

// result returns whether the intercepted write was made, and its error.
func (h *lostWrite) result() (landed bool, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.landed, h.landErr
}

// flush makes a write still held: the acquisition returned without a read
// or write that would have released it.
func (h *lostWrite) flush() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.land()
}

func (h *lostWrite) hook(ctx context.Context, c storeCall, call func() storeResult) storeResult {
	h.mu.Lock()
	if h.cancel != nil && c.op == h.op {
		cancel := h.cancel
		h.cancel = nil
		held := c
		held.value = slices.Clone(c.value)
		h.held = &held
		if h.mode == landBeforeReply {
			h.land()
		}
		h.mu.Unlock()
		cancel()
		return storeResult{err: context.Canceled}
	}
	release := h.held != nil && (h.mode == landAfterNextRead && c.op == opGet || h.mode == landAfterNextWrite && c.op.writes())
	h.mu.Unlock()
	r := call()
	if release {
		h.mu.Lock()
		h.land()
		h.mu.Unlock()
	}
	return r
}

// undoFixture is a job type over a NATS store whose writes a lostWrite
// hook can intercept. Not a wakeProc (wake_fixture_test.go): one
// coordinator, no wake-ups, Watcher or Runner.
type undoFixture struct {
	lost  *lostWrite
	inner Store
	jt    *JobType
	mr    *metricsReader // the coordinator's metrics
}

func newUndoFixture(t *testing.T, n *jkNATS, op storeOp, mode lostWriteMode) undoFixture {
	t.Helper()
	inner := n.store(t)
	lost := &lostWrite{inner: inner, op: op, mode: mode}
	store := newHookStore(inner, passNone).withHook(lost.hook)
	mr := newMetricsReader(t)
	coord, err := NewCoordinator(store, &Config{MeterProvider: mr.mp})
	require.NoError(t, err)
	// A lease far longer than the test: a slot left behind would block
	// the job's next acquisition (ReasonAlreadyActive).
	return undoFixture{lost: lost, inner: inner, jt: rtJobType(t, coord, jkService("undo"), rtPolicy(time.Minute, time.Hour)), mr: mr}
}

// requireUndone requires one undo, of outcome outcome, in the metrics.
func (f undoFixture) requireUndone(t *testing.T, outcome string) {
	t.Helper()
	ms := f.mr.collect()
	op := attrOperation.String(metricOpUndoAcquire)
	assert.Equal(t, int64(1), valueWhere(t, ms, "jobkeys.key.operations", op), "undos")
	assert.Equal(t, int64(1), valueWhere(t, ms, "jobkeys.key.operations", op, attrOutcome.String(outcome)), "undos with outcome %s", outcome)
}

// acquireLost runs an acquisition of id whose write the fixture's hook
// intercepts, and requires it to return context.Canceled.
func (f undoFixture) acquireLost(t *testing.T, id string, opts ...AcquireOption) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f.lost.arm(cancel)
	acq, err := f.jt.Acquire(ctx, id, rtPayload, opts...)
	f.lost.flush()
	require.ErrorIs(t, err, context.Canceled, "acquisition %+v", acq)
}

// requireFreeAndQueued requires the key to hold no slot and exactly the
// queue wantQueued (nil: the key absent), and a new acquisition of id to
// take a slot at once.
func (f undoFixture) requireFreeAndQueued(t *testing.T, id string, wantQueued []string, opts ...AcquireOption) {
	t.Helper()
	st := rtState(t, f.inner, f.jt)
	if wantQueued == nil {
		assert.Nil(t, st, "the key should be absent")
	} else if assert.NotNil(t, st, "the key should hold the queue") {
		assert.Empty(t, activeIDs(st), "slots left behind")
		var queued []string
		for _, q := range st.Queued {
			queued = append(queued, q.JobID)
		}
		assert.Equal(t, wantQueued, queued, "the queue")
	}
	acq, err := f.jt.Acquire(context.Background(), id, rtPayload, opts...)
	require.NoError(t, err)
	assert.Equal(t, KindAcquired, acq.Kind, "the job's next acquisition: %s", acq.Reason)
}

// TestAcquireCancelledWhileItsWriteLandsLeavesNoSlot: the acquisition's
// write lands, its reply is lost to the cancelled context. Before the undo
// (acquire_undo.go) the key kept the slot for the whole lease, the job off
// the queue, and its next acquisition was blocked (ReasonAlreadyActive).
func TestAcquireCancelledWhileItsWriteLandsLeavesNoSlot(t *testing.T) {
	t.Parallel()
	n := startJKNATS(t)
	t.Run("queued job", func(t *testing.T) {
		t.Parallel()
		f := newUndoFixture(t, n, opUpdate, landBeforeReply)
		rtAdmit(t, f.jt, "a")
		rtAdmit(t, f.jt, "b")
		f.acquireLost(t, "a")
		landed, err := f.lost.result()
		require.True(t, landed)
		require.NoError(t, err, "the intercepted write")
		f.requireUndone(t, undoRemoved)
		f.requireFreeAndQueued(t, "a", []string{"a", "b"})
	})
	t.Run("retry on an absent key", func(t *testing.T) {
		t.Parallel()
		f := newUndoFixture(t, n, opCreate, landBeforeReply)
		f.acquireLost(t, "r", WithRetry())
		landed, err := f.lost.result()
		require.True(t, landed)
		require.NoError(t, err, "the intercepted write")
		f.requireUndone(t, undoRemoved)
		f.requireFreeAndQueued(t, "r", nil, WithRetry())
	})
	t.Run("Runner.Run", func(t *testing.T) {
		t.Parallel()
		f := newUndoFixture(t, n, opUpdate, landBeforeReply)
		r := rtRunner(t, f.jt, nil)
		rtAdmit(t, f.jt, "a")
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		f.lost.arm(cancel)
		ran := false
		_, err := r.Run(ctx, "a", rtPayload, func(context.Context, Lease) error { ran = true; return nil })
		require.ErrorIs(t, err, context.Canceled)
		require.False(t, ran, "the handler ran")
		landed, lerr := f.lost.result()
		require.True(t, landed)
		require.NoError(t, lerr, "the intercepted write")
		st := rtState(t, f.inner, f.jt)
		require.NotNil(t, st)
		assert.Empty(t, activeIDs(st), "slots left behind")
		require.Len(t, st.Queued, 1)
		assert.Equal(t, "a", st.Queued[0].JobID)
		f.requireUndone(t, undoRemoved)
		res, err := r.Run(context.Background(), "a", rtPayload, func(context.Context, Lease) error { ran = true; return nil })
		require.NoError(t, err)
		assert.True(t, ran, "the next Run ran the handler")
		assert.Zero(t, res.Waited, "the next Run waited")
	})
}

// TestAcquireCancelledWriteLandingLateLeavesNoSlot: the acquisition's write
// is held, and lands only after the undo read the key (the undo's own
// write then loses its compare-and-swap, and its retry removes the slot),
// or after the undo wrote it (the held write then fails its
// compare-and-swap).
func TestAcquireCancelledWriteLandingLateLeavesNoSlot(t *testing.T) {
	t.Parallel()
	n := startJKNATS(t)
	t.Run("after the undo's read", func(t *testing.T) {
		t.Parallel()
		f := newUndoFixture(t, n, opUpdate, landAfterNextRead)
		rtAdmit(t, f.jt, "a")
		rtAdmit(t, f.jt, "b")
		f.acquireLost(t, "a")
		landed, err := f.lost.result()
		require.True(t, landed)
		require.NoError(t, err, "the held write, made after the undo's read")
		f.requireUndone(t, undoRemoved)
		f.requireFreeAndQueued(t, "a", []string{"a", "b"})
	})
	t.Run("after the undo's write", func(t *testing.T) {
		t.Parallel()
		f := newUndoFixture(t, n, opUpdate, landAfterNextWrite)
		rtAdmit(t, f.jt, "a")
		rtAdmit(t, f.jt, "b")
		f.acquireLost(t, "a")
		landed, err := f.lost.result()
		require.True(t, landed)
		require.ErrorIs(t, err, ErrRevisionConflict, "the held write, made after the undo's write")
		f.requireUndone(t, undoFenced)
		f.requireFreeAndQueued(t, "a", []string{"a", "b"})
	})
	t.Run("create after the undo's fence", func(t *testing.T) {
		t.Parallel()
		f := newUndoFixture(t, n, opCreate, landAfterNextWrite)
		f.acquireLost(t, "r", WithRetry())
		landed, err := f.lost.result()
		require.True(t, landed)
		require.ErrorIs(t, err, ErrRevisionConflict, "the held create, made after the undo's fence")
		f.requireUndone(t, undoFenced)
		f.requireFreeAndQueued(t, "r", nil, WithRetry())
	})
}

// TestReduceUndoAcquire: the undo's reducer removes only the slot of the
// job and token, puts the queue entry back at the head once, and writes a
// state without the slot unchanged.
func TestReduceUndoAcquire(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	entry := QueuedJob{JobID: "a", CreatedAt: now.Add(-time.Minute), RequestID: "req-a"}
	state := &KeyState{Service: "s", JobType: "t", KeyHash: "h", MaxActive: 2, MaxQueuedPerKey: 4, UpdatedAt: now.Add(-time.Second),
		Active: []ActiveSlot{{JobID: "x", SlotToken: "tx"}, {JobID: "a", SlotToken: "ta"}},
		Queued: []QueuedJob{{JobID: "b"}}}

	next, removed := reduceUndoAcquire(state, "a", "ta", &entry, now)
	require.True(t, removed)
	assert.Equal(t, []string{"x"}, activeIDs(next))
	assert.Equal(t, []QueuedJob{entry, {JobID: "b"}}, next.Queued)
	assert.Equal(t, now, next.UpdatedAt)
	assert.Len(t, state.Active, 2, "the input changed")

	next, removed = reduceUndoAcquire(state, "a", "ta", nil, now)
	require.True(t, removed, "a retry's slot")
	assert.Equal(t, []QueuedJob{{JobID: "b"}}, next.Queued, "a retry that was not queued is not queued back")

	requeued := snapshot(state)
	requeued.Queued = append(requeued.Queued, QueuedJob{JobID: "a"})
	next, _ = reduceUndoAcquire(requeued, "a", "ta", &entry, now)
	assert.Equal(t, []string{"b", "a"}, []string{next.Queued[0].JobID, next.Queued[1].JobID}, "a job queued again is not queued twice")
	assert.Len(t, next.Queued, 2)

	next, removed = reduceUndoAcquire(state, "a", "other-token", &entry, now)
	require.False(t, removed, "another slot of the job")
	assert.Equal(t, state, next, "a state without the slot is written unchanged")
	assert.NotSame(t, state, next)

	next, removed = reduceUndoAcquire(nil, "a", "ta", &entry, now)
	assert.False(t, removed)
	assert.Nil(t, next, "an absent key")
}
