package jobkeys

// Group commit (groupcommit.go). Each test holds one write at the store's
// gate, so that the operations started after it queue on the key's lane in
// a known order, lets the writes through, and compares every outcome, and
// the stored state, with a serial run of the same operations in the same
// order on a coordinator of its own (same fixed clock, same slot tokens).
// Writes and reads are counted at the store (countingStore).

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// batchContexts returns the contexts of the operations a store call made
// with ctx writes for: those of a batch (the coordinator passes the
// store a *batchCtx for a write of more than one operation), or ctx
// alone. Store wrappers that count each operation's writes use it.
func batchContexts(ctx context.Context) []context.Context {
	b, ok := ctx.(*batchCtx)
	if !ok {
		return []context.Context{ctx}
	}
	out := make([]context.Context, len(b.ops))
	for i, op := range b.ops {
		out[i] = op.Ctx
	}
	return out
}

// gcGate holds writes at a gate while one is set: each write then signals
// entered and waits for a permit (or for the gate to open).
type gcGate struct {
	entered chan struct{}
	mu      sync.Mutex
	permits chan struct{}
}

func (g *gcGate) pass(ctx context.Context) error {
	g.mu.Lock()
	p := g.permits
	g.mu.Unlock()
	if p == nil {
		return nil
	}
	g.entered <- struct{}{}
	select {
	case <-p:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// hook is the hookStore hook of the gate: Create, Update and Delete pass
// it first.
func (g *gcGate) hook(ctx context.Context, c storeCall, call func() storeResult) storeResult {
	if c.op == opCreate || c.op == opUpdate || c.op == opDelete {
		if err := g.pass(ctx); err != nil {
			return storeResult{err: err}
		}
	}
	return call()
}

// gcRig is one coordinator over a gated, counted memory store, with a key
// whose job "held" holds a slot. Below the gate, failures can be injected
// (injectFailures).
type gcRig struct {
	t       *testing.T
	mem     *MemoryStore
	gate    *gcGate
	faults  *gcFaults
	totals  *raceTotals
	c       *KeyCoordinator
	service string
	policy  Policy
	payload []byte
	key     JobKey
	lease   Lease // job "held"'s
}

var gcNow = time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)

func newGCRig(t *testing.T, service string, policy Policy, writers int, limited bool) *gcRig {
	t.Helper()
	mem := NewMemoryStore()
	// counted → gated → failures injected → mem. The gate hides the
	// memory store's capabilities, but for its value size limit when
	// limited, so that the coordinator checks room for queued jobs
	// (checkRoom).
	faults := &gcFaults{}
	failing := newHookStore(mem, passValueLimit).withHook(faults.hook)
	gate := &gcGate{entered: make(chan struct{}, 256)}
	gateCaps := passNone
	if limited {
		gateCaps = passValueLimit
	}
	cs := newCountingStore(newHookStore(failing, gateCaps).withHook(gate.hook))
	tokens := 0
	c, err := NewCoordinator(cs, &Config{InstanceID: "gc", Now: func() time.Time { return gcNow },
		NewSlotToken: func() string { tokens++; return "tok-" + strconv.Itoa(tokens) }})
	require.NoError(t, err)
	c.groupWriters = writers
	r := &gcRig{t: t, mem: mem, gate: gate, faults: faults, totals: cs.totals, c: c, service: service, policy: policy, payload: benchPayload(0)}
	r.key, err = DeriveKey(service, benchJobType, r.payload, policy.Key)
	require.NoError(t, err)
	ctx := context.Background()
	adm, err := r.admit("held")(ctx, r)
	require.NoError(t, err)
	require.Equal(t, KindAccepted, adm.(Admission).Kind)
	acq, err := r.acquire("held")(ctx, r)
	require.NoError(t, err)
	require.Equal(t, KindAcquired, acq.(Acquisition).Kind)
	r.lease = acq.(Acquisition).Lease
	return r
}

// gcOp is one operation, run on a rig; it returns the outcome.
type gcOp func(ctx context.Context, r *gcRig) (any, error)

func (r *gcRig) admit(id string) gcOp {
	return func(ctx context.Context, r *gcRig) (any, error) {
		return r.c.Admit(ctx, AdmitRequest{Service: r.service, JobType: benchJobType, JobID: id, Payload: r.payload, Policy: r.policy})
	}
}

func (r *gcRig) acquire(id string) gcOp {
	return func(ctx context.Context, r *gcRig) (any, error) {
		return r.c.Acquire(ctx, AcquireRequest{Service: r.service, JobType: benchJobType, JobID: id, Payload: r.payload, Policy: r.policy})
	}
}

// acquireTry is acquire as try wt of a waiting Runner (see waitTry).
func (r *gcRig) acquireTry(id string, wt *waitTry) gcOp {
	return func(ctx context.Context, r *gcRig) (any, error) {
		return acquireRequestTry(ctx, r.c, AcquireRequest{Service: r.service, JobType: benchJobType, JobID: id, Payload: r.payload, Policy: r.policy}, wt)
	}
}

func (r *gcRig) remove(id string) gcOp {
	return func(ctx context.Context, r *gcRig) (any, error) {
		return r.c.RemoveQueued(ctx, RemoveRequest{Service: r.service, JobType: benchJobType, JobID: id, Payload: r.payload, Policy: r.policy})
	}
}

func gcRenewHeld(ctx context.Context, r *gcRig) (any, error) {
	return r.c.Renew(ctx, RenewRequest{Lease: r.lease})
}

func gcReleaseHeld(ctx context.Context, r *gcRig) (any, error) {
	return r.c.Release(ctx, ReleaseRequest{Lease: r.lease})
}

// gcReleaseGone releases a slot the key does not hold: a stale completion.
func gcReleaseGone(ctx context.Context, r *gcRig) (any, error) {
	l := r.lease
	l.SlotToken = "gone"
	return r.c.Release(ctx, ReleaseRequest{Lease: l})
}

type gcResult struct {
	out any
	err error
}

func (r *gcRig) hold() {
	r.gate.mu.Lock()
	defer r.gate.mu.Unlock()
	r.gate.permits = make(chan struct{})
}

// open lets every write through, those waiting at the gate too.
func (r *gcRig) open() {
	r.gate.mu.Lock()
	defer r.gate.mu.Unlock()
	close(r.gate.permits)
	r.gate.permits = nil
}

// permit lets one write waiting at the gate through.
func (r *gcRig) permit() {
	r.gate.mu.Lock()
	p := r.gate.permits
	r.gate.mu.Unlock()
	p <- struct{}{}
}

func (r *gcRig) awaitWrite() {
	r.t.Helper()
	select {
	case <-r.gate.entered:
	case <-time.After(time.Minute):
		r.t.Fatal("no write reached the gate")
	}
}

// queued returns how many operations wait on the key's lane.
func (r *gcRig) queued() int {
	e := r.c.keys.entry(r.key.KVKey)
	if e == nil {
		return 0
	}
	n, _ := e.lane.Queued()
	return n
}

func (r *gcRig) awaitQueued(n int) {
	r.t.Helper()
	require.Eventuallyf(r.t, func() bool { return r.queued() == n }, time.Minute, time.Millisecond, "%d operations queued on the lane", n)
}

func (r *gcRig) start(ctx context.Context, op gcOp) <-chan gcResult {
	done := make(chan gcResult, 1)
	go func() {
		out, err := op(ctx, r)
		done <- gcResult{out, err}
	}()
	return done
}

// batched runs ops with ops[0]'s write held at the gate until the others
// are queued behind it, in order, then lets every write through. It
// returns the results and the writes and reads made from ops[0] on.
func (r *gcRig) batched(ops []gcOp) (res []gcResult, writes, reads int64) {
	r.t.Helper()
	r.totals.writes.Store(0)
	r.totals.reads.Store(0)
	r.hold()
	ctx := context.Background()
	chans := []<-chan gcResult{r.start(ctx, ops[0])}
	r.awaitWrite()
	for i, op := range ops[1:] {
		chans = append(chans, r.start(ctx, op))
		r.awaitQueued(i + 1)
	}
	r.open()
	for _, ch := range chans {
		res = append(res, <-ch)
	}
	return res, r.totals.writes.Load(), r.totals.reads.Load()
}

// serial runs ops one after the other.
func (r *gcRig) serial(ops []gcOp) (res []gcResult) {
	for _, op := range ops {
		out, err := op(context.Background(), r)
		res = append(res, gcResult{out, err})
	}
	return res
}

func (r *gcRig) stored() []byte {
	r.t.Helper()
	v, _, err := r.mem.Get(context.Background(), r.service, r.key.KVKey)
	if errors.Is(err, ErrKeyNotFound) {
		return nil
	}
	require.NoError(r.t, err)
	return v
}

// gcSame requires the batched results and stored state to be the serial
// run's.
func gcSame(t *testing.T, batched, serial []gcResult, batchedState, serialState []byte) {
	t.Helper()
	require.Len(t, batched, len(serial))
	for i := range serial {
		assert.Equalf(t, fmt.Sprint(serial[i].err), fmt.Sprint(batched[i].err), "operation %d: error", i)
		assert.Equalf(t, serial[i].out, batched[i].out, "operation %d: outcome", i)
	}
	assert.Equal(t, string(serialState), string(batchedState), "stored state")
}

// gcKinds lists the outcomes' kinds ("error" for an error), for messages.
func gcKinds(res []gcResult) []string {
	var kinds []string
	for _, r := range res {
		if r.err != nil {
			kinds = append(kinds, "error")
			continue
		}
		switch out := r.out.(type) {
		case Admission:
			kinds = append(kinds, string(out.Kind))
		case Acquisition:
			kinds = append(kinds, string(out.Kind))
		case Renewal:
			kinds = append(kinds, string(out.Kind))
		case ReleaseOutcome:
			kinds = append(kinds, string(out.Kind))
		case Removal:
			kinds = append(kinds, string(out.Kind))
		default:
			kinds = append(kinds, fmt.Sprintf("%T", out))
		}
	}
	return kinds
}

// Operations that write nothing (blocked acquisitions, a stale
// completion, a removal of a job not queued) ride along with the one
// write of their batch: they need no read of their own, and every outcome
// is the serial run's. A second writing operation starts the next batch
// (groupWritersDefault). Before group commit each of them read the key.
func TestGroupCommitRidersNeedNoRead(t *testing.T) {
	t.Parallel()
	policy := Policy{Key: benchPolicy.Key, MaxActive: 1, MaxQueuedPerKey: 16}
	setup := func(r *gcRig) {
		for i := range 4 {
			adm, err := r.admit("w"+strconv.Itoa(i))(context.Background(), r)
			require.NoError(t, err)
			require.Equal(t, KindAccepted, adm.(Admission).Kind)
		}
	}
	ops := func(r *gcRig) []gcOp {
		return []gcOp{
			gcRenewHeld,      // held at the gate
			r.acquire("w0"),  // blocked
			r.acquire("w1"),  // blocked
			gcReleaseGone,    // stale completion
			r.remove("nope"), // not found
			gcRenewHeld,      // the batch's writer
			r.acquire("w2"),  // blocked, after the writer
			r.admit("z"),     // a second writer: the next batch
			r.acquire("w3"),  // blocked, rides with z
		}
	}
	b := newGCRig(t, "gcriders", policy, groupWritersDefault, true)
	setup(b)
	res, writes, reads := b.batched(ops(b))
	s := newGCRig(t, "gcriders", policy, groupWritersDefault, true)
	setup(s)
	gcSame(t, res, s.serial(ops(s)), b.stored(), s.stored())
	t.Logf("outcomes %v: %d writes, %d reads", gcKinds(res), writes, reads)
	assert.Equal(t, []string{"renewed", "blocked", "blocked", "stale-completion", "not-found", "renewed", "blocked", "accepted", "blocked"}, gcKinds(res))
	assert.Equal(t, int64(3), writes, "the held write, then one per writing operation")
	assert.Zero(t, reads, "operations riding along with a write need no read")
}

// With more writers allowed per batch (the engine handles them; the
// outcome contract keeps the coordinator at one, see groupcommit.go),
// admissions, acquisitions, releases and removals queued on one key are
// one write, with the serial run's outcomes and stored state.
func TestGroupCommitWritersInOneWrite(t *testing.T) {
	t.Parallel()
	policy := Policy{Key: benchPolicy.Key, MaxActive: 2, MaxQueuedPerKey: 16}
	ops := func(r *gcRig) []gcOp {
		return []gcOp{
			gcRenewHeld, // held at the gate
			r.admit("a"),
			r.admit("b"),
			r.admit("c"),
			r.acquire("a"), // the second slot
			r.acquire("b"), // blocked
			gcReleaseHeld,
			r.acquire("b"), // the slot held had
			r.remove("c"),
			r.admit("d"),
		}
	}
	b := newGCRig(t, "gcwriters", policy, groupCommitMax, true)
	res, writes, reads := b.batched(ops(b))
	s := newGCRig(t, "gcwriters", policy, groupCommitMax, true)
	gcSame(t, res, s.serial(ops(s)), b.stored(), s.stored())
	t.Logf("outcomes %v: %d writes, %d reads", gcKinds(res), writes, reads)
	assert.Equal(t, []string{"renewed", "accepted", "accepted", "accepted", "acquired", "blocked", "released", "acquired", "removed", "accepted"}, gcKinds(res))
	assert.Equal(t, int64(2), writes, "the held write and the batch's")
	assert.Zero(t, reads)

	// An operation that empties the key ends its batch with a delete; the
	// next batch creates the key again.
	ops = func(r *gcRig) []gcOp {
		return []gcOp{gcRenewHeld, gcReleaseHeld, r.admit("a"), r.admit("b")}
	}
	b = newGCRig(t, "gcdelete", policy, groupCommitMax, true)
	res, writes, _ = b.batched(ops(b))
	s = newGCRig(t, "gcdelete", policy, groupCommitMax, true)
	gcSame(t, res, s.serial(ops(s)), b.stored(), s.stored())
	assert.Equal(t, []string{"renewed", "released", "accepted", "accepted"}, gcKinds(res))
	assert.Equal(t, int64(3), writes, "the held write, the delete, the create")
}

// A batch whose state the store refuses as too large runs its operations
// again one at a time: each gets the outcome or error it would have got
// alone. A state that fails the room check fails it for the operation that
// produced it only, even when a later operation of the batch shrinks the
// state again.
func TestGroupCommitTooLargeFallsBack(t *testing.T) {
	t.Parallel()
	policy := Policy{Key: benchPolicy.Key, MaxActive: 1, MaxQueuedPerKey: 16}
	long := func(i int) string { return fmt.Sprintf("%03d-%s", i, strings.Repeat("x", 400)) }
	limit := func(r *gcRig, extra int) {
		require.NoError(t, r.mem.SetMaxValueSize(len(r.stored())+extra))
	}
	for _, tc := range []struct {
		name    string
		writers int
		limited bool // the coordinator knows the limit and checks room
		extra   int  // bytes the limit leaves over the initial state
		ops     func(r *gcRig) []gcOp
	}{
		{"store refuses the batch", groupCommitMax, false, 2500, func(r *gcRig) []gcOp {
			return []gcOp{gcRenewHeld, r.admit(long(1)), r.admit(long(2)), r.admit(long(3)), r.acquire("w")}
		}},
		{"store refuses the writer", groupWritersDefault, false, 500, func(r *gcRig) []gcOp {
			return []gcOp{gcRenewHeld, r.acquire("held"), r.admit(long(1)), r.remove("nope")}
		}},
		{"room check of one operation", groupCommitMax, true, 4000, func(r *gcRig) []gcOp {
			return []gcOp{gcRenewHeld, r.admit(long(1)), r.admit(long(2)), r.admit(long(3)), r.remove(long(1)), r.admit(long(4))}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			service := "gclarge" + strconv.Itoa(len(tc.name))
			b := newGCRig(t, service, policy, tc.writers, tc.limited)
			limit(b, tc.extra)
			res, writes, _ := b.batched(tc.ops(b))
			s := newGCRig(t, service, policy, tc.writers, tc.limited)
			limit(s, tc.extra)
			serial := s.serial(tc.ops(s))
			gcSame(t, res, serial, b.stored(), s.stored())
			t.Logf("outcomes %v: %d writes", gcKinds(res), writes)
			tooLarge, fine := 0, 0
			for _, r := range serial[1:] {
				if errors.Is(r.err, ErrStateTooLarge) {
					tooLarge++
				} else if r.err == nil {
					fine++
				}
			}
			assert.Positive(t, tooLarge, "an operation too large alone")
			assert.Positive(t, fine, "an operation that fits alone")
		})
	}
}

// An operation whose context ends while it waits on the lane leaves it with
// nothing applied; the others are unaffected. One whose context ends once
// its batch has taken it gets its outcome: the batch's write goes on while
// any of its operations' contexts lasts, and stops when all have ended.
func TestGroupCommitCancel(t *testing.T) {
	t.Parallel()
	policy := Policy{Key: benchPolicy.Key, MaxActive: 1, MaxQueuedPerKey: 16}
	bg := context.Background()
	queuedIDs := func(r *gcRig) []string {
		st, err := ParseState(r.stored())
		require.NoError(t, err)
		return auditQueuedIDs(st.Queued)
	}

	t.Run("while queued", func(t *testing.T) {
		t.Parallel()
		r := newGCRig(t, "gccancelq", policy, groupWritersDefault, true)
		r.hold()
		held := r.start(bg, gcRenewHeld)
		r.awaitWrite()
		xctx, cancel := context.WithCancel(bg)
		defer cancel()
		x := r.start(xctx, r.admit("x"))
		r.awaitQueued(1)
		y := r.start(bg, r.admit("y"))
		r.awaitQueued(2)
		cancel()
		got := <-x
		require.ErrorIs(t, got.err, context.Canceled)
		r.awaitQueued(1)
		r.open()
		require.NoError(t, (<-held).err)
		got = <-y
		require.NoError(t, got.err)
		assert.Equal(t, KindAccepted, got.out.(Admission).Kind)
		assert.Equal(t, []string{"y"}, queuedIDs(r), "only y was applied")
	})

	t.Run("in a batch", func(t *testing.T) {
		t.Parallel()
		r := newGCRig(t, "gccancelb", policy, groupCommitMax, true)
		r.hold()
		held := r.start(bg, gcRenewHeld)
		r.awaitWrite()
		xctx, cancel := context.WithCancel(bg)
		defer cancel()
		x := r.start(xctx, r.admit("x")) // leads the next batch
		r.awaitQueued(1)
		y := r.start(bg, r.admit("y"))
		r.awaitQueued(2)
		r.permit()
		require.NoError(t, (<-held).err)
		r.awaitWrite() // the batch of x and y
		cancel()
		r.open()
		for _, ch := range []<-chan gcResult{x, y} {
			got := <-ch
			require.NoError(t, got.err)
			assert.Equal(t, KindAccepted, got.out.(Admission).Kind)
		}
		assert.Equal(t, []string{"x", "y"}, queuedIDs(r), "both were applied, in one write")
	})

	t.Run("every context of a batch", func(t *testing.T) {
		t.Parallel()
		r := newGCRig(t, "gccancela", policy, groupCommitMax, true)
		before := string(r.stored())
		r.hold()
		held := r.start(bg, gcRenewHeld)
		r.awaitWrite()
		xctx, cancelX := context.WithCancel(bg)
		defer cancelX()
		yctx, cancelY := context.WithCancel(bg)
		defer cancelY()
		x := r.start(xctx, r.admit("x"))
		r.awaitQueued(1)
		y := r.start(yctx, r.admit("y"))
		r.awaitQueued(2)
		r.permit()
		require.NoError(t, (<-held).err)
		r.awaitWrite()
		cancelX()
		cancelY()
		for _, ch := range []<-chan gcResult{x, y} {
			assert.ErrorIs(t, (<-ch).err, context.Canceled)
		}
		r.open()
		after, err := ParseState(r.stored())
		require.NoError(t, err)
		assert.Empty(t, after.Queued, "nothing of the batch was applied")
		assert.Equal(t, before, string(r.stored()), "the state the held renewal wrote (the clock is fixed)")
	})
}

// A carried operation whose outcome writes nothing, ahead of the batch's
// write and on state verified for it (here a waiting acquisition on the
// state its watch feed vouches for), is done before that write: it does
// not wait for a write it does not need.
func TestGroupCommitVerifiedRiderDoneBeforeWrite(t *testing.T) {
	t.Parallel()
	policy := Policy{Key: benchPolicy.Key, MaxActive: 1, MaxQueuedPerKey: 16}
	r := newGCRig(t, "gcearly", policy, groupWritersDefault, true)
	bg := context.Background()
	for _, id := range []string{"w0", "w1"} {
		adm, err := r.admit(id)(bg, r)
		require.NoError(t, err)
		require.Equal(t, KindAccepted, adm.(Admission).Kind)
	}
	// Feed the key's entry as a Watcher would, with its current state.
	r.c.keys.attach(r.key.KVKey)
	defer r.c.keys.detach(r.key.KVKey)
	v, rev, err := r.mem.Get(bg, r.service, r.key.KVKey)
	require.NoError(t, err)
	st, err := ParseState(v)
	require.NoError(t, err)
	r.c.keys.watched(r.key.KVKey, st, rev, true)

	r.hold()
	held := r.start(bg, gcRenewHeld)
	r.awaitWrite()
	lead := r.start(bg, r.acquire("w1")) // blocked on a guess: it needs the write
	r.awaitQueued(1)
	waiter := r.start(bg, r.acquireTry("w0", &waitTry{trustWatch: true}))
	r.awaitQueued(2)
	writer := r.start(bg, gcRenewHeld)
	r.awaitQueued(3)
	r.permit()
	require.NoError(t, (<-held).err)
	r.awaitWrite() // the batch's: w1, w0 and the renewal
	select {
	case got := <-waiter:
		require.NoError(t, got.err)
		assert.Equal(t, KindBlocked, got.out.(Acquisition).Kind)
	case <-time.After(time.Minute):
		t.Error("the waiting acquisition waited for the batch's write")
	}
	r.open()
	for _, ch := range []<-chan gcResult{lead, writer} {
		require.NoError(t, (<-ch).err)
	}
}

// gcFaults fails the next write with an injected error, one that is not a
// revision conflict: before the write (nothing is written) or after it
// (the write is applied and its reply lost, as with a timeout).
type gcFaults struct {
	mu     sync.Mutex
	err    error
	after  bool
	failed int // writes failed
	// applied, when set, is called with every create or update the store
	// applied, before the write returns: a watch feed ahead of the reply.
	applied func(key string, value []byte, rev uint64)
}

// failNext makes the next write fail with err, after applying it if after.
func (f *gcFaults) failNext(err error, after bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.err, f.after = err, after
}

func (f *gcFaults) take() (error, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	err, after := f.err, f.after
	if err != nil {
		f.failed++
	}
	f.err = nil
	return err, after
}

func (f *gcFaults) failures() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.failed
}

// hook is the hookStore hook that fails Create, Update and Delete.
func (f *gcFaults) hook(_ context.Context, c storeCall, call func() storeResult) storeResult {
	if c.op != opCreate && c.op != opUpdate && c.op != opDelete {
		return call()
	}
	err, after := f.take()
	if err != nil && !after {
		return storeResult{err: err}
	}
	r := call()
	if r.err == nil && c.op != opDelete && f.applied != nil {
		f.applied(c.key, c.value, r.rev)
	}
	if err != nil {
		return storeResult{err: err}
	}
	return r
}

// injectFailures returns the failure injector between r's gate and its
// memory store (idle until failNext). Set its applied before r runs
// operations concurrently.
func (r *gcRig) injectFailures() *gcFaults {
	return r.faults
}

// gateBatch holds first's write at the gate, queues ops behind it in
// order, each with its context, lets that write through, and once
// the write of the batch the ops form is at the gate, calls between, then
// opens the gate. No operation may return before the gate opens: each is
// carried by the held batch. It returns the results and the writes made
// from first on.
func (r *gcRig) gateBatch(first gcOp, ctxs []context.Context, ops []gcOp, between func()) ([]gcResult, int64) {
	r.t.Helper()
	r.totals.writes.Store(0)
	r.hold()
	held := r.start(context.Background(), first)
	r.awaitWrite()
	var chans []<-chan gcResult
	for i, op := range ops {
		chans = append(chans, r.start(ctxs[i], op))
		r.awaitQueued(i + 1)
	}
	r.permit()
	require.NoError(r.t, (<-held).err)
	r.awaitWrite() // the batch's
	between()
	time.Sleep(20 * time.Millisecond) // room for an operation that would return early
	for i, ch := range chans {
		select {
		case got := <-ch:
			r.t.Errorf("operation %d returned %v, %v before its batch's write ended", i, got.out, got.err)
			ch2 := make(chan gcResult, 1)
			ch2 <- got
			chans[i] = ch2
		default:
		}
	}
	r.open()
	var res []gcResult
	for _, ch := range chans {
		select {
		case got := <-ch:
			res = append(res, got)
		case <-time.After(time.Minute):
			r.t.Fatal("an operation of the batch never returned")
		}
	}
	return res, r.totals.writes.Load()
}

func gcBackgrounds(n int) []context.Context {
	ctxs := make([]context.Context, n)
	for i := range ctxs {
		ctxs[i] = context.Background()
	}
	return ctxs
}

// gcSetupWaiting admits jobs w0 and w1, which wait behind job "held".
func gcSetupWaiting(t *testing.T, r *gcRig) {
	t.Helper()
	for _, id := range []string{"w0", "w1"} {
		adm, err := r.admit(id)(context.Background(), r)
		require.NoError(t, err)
		require.Equal(t, KindAccepted, adm.(Admission).Kind)
	}
}

// A batch's write that fails with an error other than a revision conflict
// (the store unavailable, a permission denied, a timeout of the store's
// own), be it an update, a create or a delete, fails every operation of
// the batch with that error, once, naming the key; nothing is retried.
// When the failure wrote nothing, the stored state is the one before the
// batch; when the write was applied and only its reply lost, it is the
// batch's state. Either way the key works afterwards: the operations run
// again, and later ones, have the outcomes and stored state of a run where
// the write never failed (on a coordinator of its own).
func TestGroupCommitWriteErrorFailsBatch(t *testing.T) {
	t.Parallel()
	policy := Policy{Key: benchPolicy.Key, MaxActive: 1, MaxQueuedPerKey: 16}
	errDown := errors.New("gc test: store unavailable")
	errPerm := fmt.Errorf("%w: gc test: publish to $KV denied", ErrPermission)
	errTimeout := fmt.Errorf("gc test: nats: timeout: %w", context.DeadlineExceeded)
	batches := []struct {
		name    string
		writers int
		waiting bool // jobs w0 and w1 wait behind job "held"
		first   gcOp // the write held at the gate, before the batch
		ops     func(r *gcRig) []gcOp
	}{
		{"update, one writer", groupWritersDefault, true, gcRenewHeld, func(r *gcRig) []gcOp {
			return []gcOp{r.admit("x"), r.acquire("w0"), gcReleaseGone, r.remove("nope"), r.acquire("w1")}
		}},
		{"update, writers", groupCommitMax, true, gcRenewHeld, func(r *gcRig) []gcOp {
			return []gcOp{r.admit("x"), r.admit("y"), r.acquire("w0"), r.remove("w1"), gcReleaseGone, r.remove("x")}
		}},
		{"delete, writers", groupCommitMax, false, gcRenewHeld, func(r *gcRig) []gcOp {
			return []gcOp{r.admit("x"), r.remove("x"), gcReleaseHeld}
		}},
		{"create, one writer", groupWritersDefault, false, gcReleaseHeld, func(r *gcRig) []gcOp {
			return []gcOp{r.admit("x"), r.remove("nope"), gcReleaseGone, gcRenewHeld}
		}},
	}
	follow := func(r *gcRig) []gcOp {
		return []gcOp{gcRenewHeld, r.admit("z"), r.acquire("w0"), r.remove("z"), gcReleaseHeld, r.admit("z2"), r.remove("y")}
	}
	for _, bc := range batches {
		for _, fc := range []struct {
			name string
			err  error
		}{{"unavailable", errDown}, {"permission", errPerm}, {"timeout", errTimeout}} {
			for _, after := range []bool{false, true} {
				name := bc.name + "/" + fc.name + "/nothing written"
				if after {
					name = bc.name + "/" + fc.name + "/written, reply lost"
				}
				t.Run(name, func(t *testing.T) {
					t.Parallel()
					service := "gcfail" + strconv.Itoa(len(name))
					b := newGCRig(t, service, policy, bc.writers, true)
					f := b.injectFailures()
					if bc.waiting {
						gcSetupWaiting(t, b)
					}
					ops := bc.ops(b)
					var before []byte
					res, writes := b.gateBatch(bc.first, gcBackgrounds(len(ops)), ops, func() {
						before = b.stored()
						f.failNext(fc.err, after)
					})
					t.Logf("outcomes %v", gcKinds(res))
					require.Len(t, res, len(ops))
					for i, got := range res {
						require.Errorf(t, got.err, "operation %d", i)
						assert.ErrorIsf(t, got.err, fc.err, "operation %d", i)
						assert.NotErrorIsf(t, got.err, ErrRevisionConflict, "operation %d", i)
						assert.Containsf(t, got.err.Error(), b.key.KVKey, "operation %d: the error names the key", i)
						assert.Zerof(t, got.out, "operation %d: no outcome with the error", i)
					}
					assert.Equal(t, 1, f.failures(), "one failed write")
					assert.Equal(t, int64(2), writes, "the held write and the batch's, not retried")

					// The run where the write did not fail.
					s := newGCRig(t, service, policy, bc.writers, true)
					if bc.waiting {
						gcSetupWaiting(t, s)
					}
					_, err := bc.first(context.Background(), s)
					require.NoError(t, err)
					require.Equal(t, string(before), string(s.stored()), "the rigs agree before the batch")
					serialOps := s.serial(bc.ops(s))
					if after {
						assert.Equal(t, string(s.stored()), string(b.stored()), "the batch's state, written")
					} else {
						assert.Equal(t, string(before), string(b.stored()), "nothing of the batch written")
						again := b.serial(bc.ops(b))
						gcSame(t, again, serialOps, b.stored(), s.stored())
					}
					// Slot tokens differ after a successful acquisition (the
					// failed batch drew some): the follow-ups acquire none.
					gcSame(t, b.serial(follow(b)), s.serial(follow(s)), b.stored(), s.stored())
					assert.Equal(t, 1, f.failures())
				})
			}
		}
	}
}

// gcEnding is a context that a test ends, by a cancel or a deadline.
type gcEnding struct {
	context.Context
	done chan struct{}
	mu   sync.Mutex
	err  error
}

func newGCEnding() *gcEnding {
	return &gcEnding{Context: context.Background(), done: make(chan struct{})}
}

func (c *gcEnding) Done() <-chan struct{} { return c.done }

func (c *gcEnding) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// end ends c with err (context.Canceled or context.DeadlineExceeded).
func (c *gcEnding) end(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err == nil {
		c.err = err
		close(c.done)
	}
}

// When the context of one operation of a batch ends while the batch's
// write is in flight (the lead's, with the riders' still live, or a
// rider's, with the lead's live), the write goes on: every operation,
// the one whose context ended too, has the write's result. A write that
// succeeds gives each its outcome, the serial run's, and stores the serial
// run's state; one that fails with an error other than a revision conflict
// gives each that error and stores nothing. The key works afterwards.
func TestGroupCommitContextEndsDuringWrite(t *testing.T) {
	t.Parallel()
	policy := Policy{Key: benchPolicy.Key, MaxActive: 1, MaxQueuedPerKey: 16}
	errDown := errors.New("gc test: store unavailable")
	ops := func(r *gcRig) []gcOp {
		return []gcOp{r.admit("x"), r.acquire("w0"), r.remove("nope"), gcReleaseGone, r.acquire("w1")}
	}
	follow := func(r *gcRig) []gcOp {
		return []gcOp{gcRenewHeld, r.admit("z"), r.acquire("w0"), r.remove("x"), r.remove("z"), gcReleaseHeld}
	}
	for _, tc := range []struct {
		name  string
		ended int // the operation whose context ends
		why   error
		fails bool
	}{
		{"lead cancelled, write succeeds", 0, context.Canceled, false},
		{"lead cancelled, write fails", 0, context.Canceled, true},
		{"lead's deadline, write succeeds", 0, context.DeadlineExceeded, false},
		{"lead's deadline, write fails", 0, context.DeadlineExceeded, true},
		{"rider cancelled, write succeeds", 2, context.Canceled, false},
		{"rider cancelled, write fails", 2, context.Canceled, true},
		{"rider's deadline, write succeeds", 4, context.DeadlineExceeded, false},
		{"rider's deadline, write fails", 4, context.DeadlineExceeded, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			service := "gcend" + strconv.Itoa(len(tc.name)) + strconv.Itoa(tc.ended)
			b := newGCRig(t, service, policy, groupWritersDefault, true)
			f := b.injectFailures()
			gcSetupWaiting(t, b)
			ctxs := gcBackgrounds(len(ops(b)))
			ending := newGCEnding()
			ctxs[tc.ended] = ending
			var before []byte
			res, writes := b.gateBatch(gcRenewHeld, ctxs, ops(b), func() {
				before = b.stored()
				ending.end(tc.why)
				if tc.fails {
					f.failNext(errDown, false)
				}
			})
			t.Logf("outcomes %v", gcKinds(res))
			assert.Equal(t, int64(2), writes, "the held write and the batch's, not retried")

			s := newGCRig(t, service, policy, groupWritersDefault, true)
			gcSetupWaiting(t, s)
			_, err := gcRenewHeld(context.Background(), s)
			require.NoError(t, err)
			require.Equal(t, string(before), string(s.stored()), "the rigs agree before the batch")
			if tc.fails {
				for i, got := range res {
					assert.ErrorIsf(t, got.err, errDown, "operation %d", i)
					assert.Zerof(t, got.out, "operation %d", i)
				}
				assert.Equal(t, string(before), string(b.stored()), "nothing of the batch written")
				gcSame(t, b.serial(ops(b)), s.serial(ops(s)), b.stored(), s.stored())
			} else {
				assert.Equal(t, []string{"accepted", "blocked", "not-found", "stale-completion", "blocked"}, gcKinds(res))
				gcSame(t, res, s.serial(ops(s)), b.stored(), s.stored())
			}
			gcSame(t, b.serial(follow(b)), s.serial(follow(s)), b.stored(), s.stored())
			assert.Equal(t, map[bool]int{false: 0, true: 1}[tc.fails], f.failures())
		})
	}
}

// An operation alone in its batch whose context ends while its write is in
// flight gets its context's error once the store gives up the write;
// nothing is written, and the key works afterwards.
func TestGroupCommitLoneContextEndsDuringWrite(t *testing.T) {
	t.Parallel()
	policy := Policy{Key: benchPolicy.Key, MaxActive: 1, MaxQueuedPerKey: 16}
	for _, why := range []error{context.Canceled, context.DeadlineExceeded} {
		t.Run(why.Error(), func(t *testing.T) {
			t.Parallel()
			r := newGCRig(t, "gclone"+strconv.Itoa(len(why.Error())), policy, groupWritersDefault, true)
			before := string(r.stored())
			r.hold()
			ending := newGCEnding()
			x := r.start(ending, r.admit("x"))
			r.awaitWrite()
			ending.end(why)
			var got gcResult
			select {
			case got = <-x:
			case <-time.After(time.Minute):
				t.Fatal("the operation never returned")
			}
			assert.ErrorIs(t, got.err, why)
			assert.Zero(t, got.out)
			r.open()
			assert.Equal(t, before, string(r.stored()), "nothing written")
			adm, err := r.admit("x")(context.Background(), r)
			require.NoError(t, err)
			assert.Equal(t, KindAccepted, adm.(Admission).Kind)
			st, err := ParseState(r.stored())
			require.NoError(t, err)
			assert.Equal(t, []string{"x"}, auditQueuedIDs(st.Queued))
		})
	}
}

// On a key a watch feed keeps (here fed every write before its reply, as
// a watch can be), a batch's write whose reply is lost after the store
// applied it fails every operation with the error; what the feed
// delivered stays what the coordinator knows, and later operations, a
// waiting acquisition trusting the feed among them, have the outcomes and
// stored state of a run where the write never failed.
func TestGroupCommitWriteErrorFedKey(t *testing.T) {
	t.Parallel()
	policy := Policy{Key: benchPolicy.Key, MaxActive: 1, MaxQueuedPerKey: 16}
	errDown := errors.New("gc test: store unavailable")
	bg := context.Background()
	ops := func(r *gcRig) []gcOp {
		return []gcOp{r.admit("x"), r.acquire("w0"), gcReleaseGone, r.remove("nope")}
	}
	waiter := func(id string) gcOp {
		return func(ctx context.Context, r *gcRig) (any, error) {
			return r.acquireTry(id, &waitTry{trustWatch: true})(ctx, r)
		}
	}
	follow := func(r *gcRig) []gcOp {
		return []gcOp{waiter("w0"), gcRenewHeld, waiter("w1"), r.admit("z"), r.remove("x"), waiter("z")}
	}

	b := newGCRig(t, "gcfed", policy, groupWritersDefault, true)
	f := b.injectFailures()
	gcSetupWaiting(t, b)
	b.c.keys.attach(b.key.KVKey)
	defer b.c.keys.detach(b.key.KVKey)
	v, rev, err := b.mem.Get(bg, b.service, b.key.KVKey)
	require.NoError(t, err)
	b.c.keys.watchedValue(b.key.KVKey, b.service, slices.Clone(v), rev)
	f.applied = func(key string, value []byte, rev uint64) {
		b.c.keys.watchedValue(key, b.service, slices.Clone(value), rev)
	}

	res, writes := b.gateBatch(gcRenewHeld, gcBackgrounds(len(ops(b))), ops(b), func() { f.failNext(errDown, true) })
	t.Logf("outcomes %v", gcKinds(res))
	for i, got := range res {
		assert.ErrorIsf(t, got.err, errDown, "operation %d", i)
	}
	assert.Equal(t, int64(2), writes)

	s := newGCRig(t, "gcfed", policy, groupWritersDefault, true)
	gcSetupWaiting(t, s)
	_, err = gcRenewHeld(bg, s)
	require.NoError(t, err)
	s.serial(ops(s))
	assert.Equal(t, string(s.stored()), string(b.stored()), "the batch's state, written")
	b.totals.reads.Store(0)
	gcSame(t, b.serial(follow(b)), s.serial(follow(s)), b.stored(), s.stored())
	t.Logf("%d reads after the failure", b.totals.reads.Load())
	assert.Equal(t, 1, f.failures())
}
