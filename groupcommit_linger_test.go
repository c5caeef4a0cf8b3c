package jobkeys

// Tests of the lingers of group commit (issue 11): a batch that frees a
// slot wakes this process's waiter first and its acquisition joins the
// batch (prewake); a batch right after one that took a slot lingers for
// that slot's release; an operation alone never lingers; an operation
// whose context ends while the holder lingers leaves the queue with
// nothing applied. The bounds are raised where a test needs the linger to
// last: a linger ends as soon as what it waits for arrives.

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jobkeys/jobkeys/internal/natstest"
)

// lingerRig is a coordinator over a batching MemoryStore (its calls
// counted by bcCalls), a Watcher of the store and a Runner of one job type with
// MaxActive 1.
type lingerRig struct {
	mem   *MemoryStore
	calls *bcCalls
	c     *KeyCoordinator
	jt    *JobType
	r     *Runner
}

func newLingerRig(t *testing.T) *lingerRig {
	t.Helper()
	mem := NewMemoryStore()
	mem.batching = true
	calls := &bcCalls{}
	c, err := NewCoordinator(newHookStore(mem, passBatches).withHook(calls.hook), nil)
	require.NoError(t, err)
	w, err := NewWatcher(mem)
	require.NoError(t, err)
	t.Cleanup(w.Close)
	jt, err := c.JobType("linger", benchJobType, Policy{Key: benchPolicy.Key, MaxActive: 1, MaxQueuedPerKey: 100})
	require.NoError(t, err)
	r, err := NewRunner(jt, &RunnerConfig{Watcher: w})
	require.NoError(t, err)
	return &lingerRig{mem: mem, calls: calls, c: c, jt: jt, r: r}
}

// batchSizes returns the messages of each batched write since the
// first from'th.
func (g *lingerRig) batchSizes(from int) []int {
	g.calls.mu.Lock()
	defer g.calls.mu.Unlock()
	return slices.Clone(g.calls.sizes[from:])
}

func (g *lingerRig) writes() int64 { return g.calls.singles.Load() + g.calls.groups.Load() }

// TestGroupCommitPrewakeJoinsRelease: a release that frees the slot a
// local waiter waits for wakes it before the write, and the waiter's
// acquisition joins the release's batch: one write of two revisions, the
// release's and the acquisition's.
func TestGroupCommitPrewakeJoinsRelease(t *testing.T) {
	t.Parallel()
	g := newLingerRig(t)
	g.c.keys.lingerWake = time.Minute // ends when the woken acquisition arrives
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	payload := benchPayload(0)
	lingerAdmit(t, ctx, g.jt, payload, "holder", "waiter")
	started, finish := make(chan struct{}), make(chan struct{})
	holder := goRun(ctx, g.r, "holder", payload, func(context.Context, Lease) error {
		close(started)
		<-finish
		return nil
	})
	<-started
	blocked := make(chan struct{})
	wr, err := NewRunner(g.jt, &RunnerConfig{Watcher: g.r.cfg.Watcher, OnBlocked: func(string, Acquisition) { close(blocked) }})
	require.NoError(t, err)
	var writesAtStart atomic.Int64
	waiter := goRun(ctx, wr, "waiter", payload, func(context.Context, Lease) error {
		writesAtStart.Store(g.writes())
		return nil
	})
	<-blocked
	before, sizes := g.writes(), len(g.calls.sizes)
	lingers := g.c.keys.lingers.Load()
	close(finish)
	require.NoError(t, <-holder)
	require.NoError(t, <-waiter)
	assert.Equal(t, before+1, writesAtStart.Load(), "writes from the holder's release to the waiter's start: one batch")
	got := g.batchSizes(sizes)
	require.NotEmpty(t, got)
	assert.Equal(t, 2, got[0], "the release's batch carries the waiter's acquisition: batches %v", got)
	assert.Greater(t, g.c.keys.lingers.Load(), lingers, "the release's batch lingered for the waiter")
}

// TestGroupCommitLoneOperationNeverLingers: one worker's cycles on a key,
// through a Runner with a Watcher and through the coordinator's methods,
// never linger: no other operation of the process is expected on the key.
func TestGroupCommitLoneOperationNeverLingers(t *testing.T) {
	t.Parallel()
	g := newLingerRig(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// A Run that waited through the Watcher first, on another key: the
	// coordinator hands its writes to the Watcher (and prewakes) from now.
	busy := benchPayload(2)
	lingerAdmit(t, ctx, g.jt, busy, "busy-a", "busy-b")
	held := lingerAcquire(t, ctx, g.jt, "busy-a", busy)
	blocked := make(chan struct{})
	wr, err := NewRunner(g.jt, &RunnerConfig{Watcher: g.r.cfg.Watcher, OnBlocked: func(string, Acquisition) { close(blocked) }})
	require.NoError(t, err)
	waited := goRun(ctx, wr, "busy-b", busy, func(context.Context, Lease) error { return nil })
	select {
	case <-blocked:
	case err := <-waited:
		t.Fatalf("the Run on the busy key did not wait: %v", err)
	}
	_, err = g.jt.Release(ctx, held.Lease)
	require.NoError(t, err)
	require.NoError(t, <-waited)
	require.NotNil(t, g.c.keys.feeds.Load(), "the coordinator hands its writes to the Watcher")
	lingers := g.c.keys.lingers.Load()
	// Were they to linger, the cycles would take a minute each.
	g.c.keys.lingerWake, g.c.keys.lingerRelease = time.Minute, time.Minute

	payload := benchPayload(0)
	const cycles = 20
	writes := g.writes()
	for i := range cycles {
		id := fmt.Sprintf("run-%d", i)
		lingerAdmit(t, ctx, g.jt, payload, id)
		res, err := g.r.Run(ctx, id, payload, func(context.Context, Lease) error { return nil })
		require.NoError(t, err)
		require.Equal(t, KindReleased, res.Release)
	}
	other := benchPayload(1)
	for i := range cycles {
		id := fmt.Sprintf("call-%d", i)
		lingerAdmit(t, ctx, g.jt, other, id)
		acq := lingerAcquire(t, ctx, g.jt, id, other)
		rel, err := g.jt.Release(ctx, acq.Lease)
		require.NoError(t, err)
		require.Equal(t, KindReleased, rel.Kind)
	}
	assert.Equal(t, lingers, g.c.keys.lingers.Load(), "lingers of lone operations")
	assert.Equal(t, writes+6*cycles, g.writes(), "three writes per cycle")
}

// laneLingering reports whether e's lane holder lingers, and how many
// operations wait in its queue.
func laneLingering(e *keyEntry) (bool, int) {
	n, lingering := e.lane.Queued()
	return lingering, n
}

// TestGroupCommitLingerForRelease: right after an acquisition, the next
// batch (an admission) lingers for the slot's release, which joins it;
// an admission that queued during the linger and whose context ended
// there leaves with its context's error and nothing applied.
func TestGroupCommitLingerForRelease(t *testing.T) {
	t.Parallel()
	g := newLingerRig(t)
	g.c.keys.lingerRelease = time.Minute // ends when the release arrives
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	payload := benchPayload(0)
	lingerAdmit(t, ctx, g.jt, payload, "held")
	acq := lingerAcquire(t, ctx, g.jt, "held", payload)
	e := g.c.keys.entry(kvKeyFor(acq.Lease.Service, acq.Lease.JobType, acq.Lease.KeyHash))
	require.NotNil(t, e)

	sizes := len(g.calls.sizes)
	first := make(chan error, 1)
	go func() {
		_, err := g.jt.Admit(ctx, "first", payload)
		first <- err
	}()
	require.Eventually(t, func() bool { l, _ := laneLingering(e); return l }, 30*time.Second, time.Millisecond, "the admission lingers for the release")

	cctx, ccancel := context.WithCancel(ctx)
	gone := make(chan error, 1)
	go func() {
		_, err := g.jt.Admit(cctx, "gone", payload)
		gone <- err
	}()
	require.Eventually(t, func() bool { _, n := laneLingering(e); return n == 1 }, 30*time.Second, time.Millisecond, "the second admission queues")
	ccancel()
	require.ErrorIs(t, <-gone, context.Canceled)
	lingering, queued := laneLingering(e)
	require.True(t, lingering, "still lingering: the release has not come")
	require.Zero(t, queued, "the cancelled admission left the queue")

	rel, err := g.jt.Release(ctx, acq.Lease)
	require.NoError(t, err)
	assert.Equal(t, KindReleased, rel.Kind)
	require.NoError(t, <-first)
	assert.Equal(t, []int{2}, g.batchSizes(sizes), "the admission and the release: one batch")

	value, _, err := g.mem.Get(ctx, "linger", kvKeyFor(acq.Lease.Service, acq.Lease.JobType, acq.Lease.KeyHash))
	require.NoError(t, err)
	st, err := ParseState(value)
	require.NoError(t, err)
	assert.Equal(t, []string{"first"}, auditQueuedIDs(st.Queued), "the cancelled admission applied nothing")
	assert.Empty(t, st.Active)
}

// TestGroupCommitLingerAudit: workers of one process loop Admit → Run on
// one key of a NATS bucket that keeps every revision, so that releases
// wake their waiters ahead of the write and lingers carry the next
// operations along; every revision is then checked as the audit checks
// them (one slot appears or vanishes per revision, never two slots, a
// slot vanishes only by its release, a queued job leaves only by taking a
// slot), the handlers never overlap, and every job ran once.
func TestGroupCommitLingerAudit(t *testing.T) {
	t.Parallel()
	s := natstest.Run(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	_, js := natstest.Connect(t, s)
	const service = "lingeraudit"
	bucket := auditCreateBucket(t, ctx, js, service, 1, jetstream.MemoryStorage)
	require.NoError(t, allowAtomicPublish(ctx, js, "KV_"+bucket))
	store, err := NewNATSStore(js)
	require.NoError(t, err)
	c, err := NewCoordinator(store, nil)
	require.NoError(t, err)
	w, err := NewWatcher(store)
	require.NoError(t, err)
	t.Cleanup(w.Close)
	policy := Policy{Key: benchPolicy.Key, MaxActive: 1, MaxQueuedPerKey: 64}
	jt, err := c.JobType(service, benchJobType, policy)
	require.NoError(t, err)
	r, err := NewRunner(jt, &RunnerConfig{Watcher: w})
	require.NoError(t, err)

	const workers, cycles = 8, 25
	payload := benchPayload(0)
	l := newLingerLedger(1)
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for k := range workers {
		wg.Go(func() {
			for i := range cycles {
				if err := l.cycle(ctx, jt, r, fmt.Sprintf("job-%d-%d", k, i), payload); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	l.check(t, errs, workers*cycles)
	assert.Positive(t, c.keys.lingers.Load(), "lingers")
	key, err := jt.key("job-0-0", payload)
	require.NoError(t, err)
	assert.True(t, store.Batches(service, key.KVKey), "the store writes atomic batches")

	entries := auditRead(t, ctx, js, bucket)
	sum := auditCheck(t, entries, l.facts(), func(string) (Policy, bool) { return jt.Policy(), true }, true)
	t.Logf("%s; %d lingers", sum, c.keys.lingers.Load())
}

// TestGroupCommitNoLingerWithoutBatches: over a store that writes one
// state per write, a batch carries one writer, so no release or woken
// acquisition could join it: nothing lingers.
func TestGroupCommitNoLingerWithoutBatches(t *testing.T) {
	t.Parallel()
	g := newLingerRig(t)
	g.mem.batching = false
	// Were they to linger, the operations would take a minute each.
	g.c.keys.lingerWake, g.c.keys.lingerRelease = time.Minute, time.Minute
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	payload := benchPayload(0)
	lingerAdmit(t, ctx, g.jt, payload, "held", "next")
	acq := lingerAcquire(t, ctx, g.jt, "held", payload)
	lingerAdmit(t, ctx, g.jt, payload, "later") // right after an acquisition
	rel, err := g.jt.Release(ctx, acq.Lease)
	require.NoError(t, err)
	require.Equal(t, KindReleased, rel.Kind)
	assert.Zero(t, g.c.keys.lingers.Load(), "lingers")
	assert.Zero(t, g.calls.groups.Load(), "batched writes")
}

// TestGroupCommitLingerAuditTwoProcesses is TestGroupCommitLingerAudit
// with two slots and two coordinators on their own connections, each with
// its Watcher: a release prewakes only its own coordinator's waiters, and
// stops at the first waiter of the other (which cannot join the batch),
// while that one's jobs are queued ahead. Every revision passes the audit,
// at most two handlers run at once, and every job runs once.
func TestGroupCommitLingerAuditTwoProcesses(t *testing.T) {
	t.Parallel()
	s := natstest.Run(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	_, js := natstest.Connect(t, s)
	const service = "lingeraudit2"
	bucket := auditCreateBucket(t, ctx, js, service, 1, jetstream.MemoryStorage)
	require.NoError(t, allowAtomicPublish(ctx, js, "KV_"+bucket))
	policy := Policy{Key: benchPolicy.Key, MaxActive: 2, MaxQueuedPerKey: 64}
	type proc struct {
		c  *KeyCoordinator
		jt *JobType
		r  *Runner
	}
	var procs []proc
	for range 2 {
		_, pjs := natstest.Connect(t, s)
		store, err := NewNATSStore(pjs)
		require.NoError(t, err)
		c, err := NewCoordinator(store, nil)
		require.NoError(t, err)
		w, err := NewWatcher(store)
		require.NoError(t, err)
		t.Cleanup(w.Close)
		jt, err := c.JobType(service, benchJobType, policy)
		require.NoError(t, err)
		r, err := NewRunner(jt, &RunnerConfig{Watcher: w})
		require.NoError(t, err)
		procs = append(procs, proc{c: c, jt: jt, r: r})
	}

	const workers, cycles = 4, 20
	payload := benchPayload(0)
	l := newLingerLedger(2)
	var wg sync.WaitGroup
	errs := make(chan error, 2*workers)
	for p, pr := range procs {
		for k := range workers {
			wg.Go(func() {
				for i := range cycles {
					if err := l.cycle(ctx, pr.jt, pr.r, fmt.Sprintf("job-%d-%d-%d", p, k, i), payload); err != nil {
						errs <- err
						return
					}
				}
			})
		}
	}
	wg.Wait()
	l.check(t, errs, 2*workers*cycles)
	entries := auditRead(t, ctx, js, bucket)
	sum := auditCheck(t, entries, l.facts(), func(string) (Policy, bool) { return procs[0].jt.Policy(), true }, true)
	t.Logf("%s; %d and %d lingers", sum, procs[0].c.keys.lingers.Load(), procs[1].c.keys.lingers.Load())
}

// lingerLedger records the linger audits' cycles: the handlers running at
// once (at most maxActive), how often each job ran, and the slot tokens
// released, for auditFacts.
type lingerLedger struct {
	maxActive         int32
	running, overlaps atomic.Int32
	mu                sync.Mutex
	tokens            map[string]bool
	ran               map[string]int
}

func newLingerLedger(maxActive int32) *lingerLedger {
	return &lingerLedger{maxActive: maxActive, tokens: map[string]bool{}, ran: map[string]int{}}
}

// cycle admits job id and runs it through r with a handler that records it.
func (l *lingerLedger) cycle(ctx context.Context, jt *JobType, r *Runner, id string, payload []byte) error {
	adm, err := jt.Admit(ctx, id, payload)
	if err == nil && adm.Kind != KindAccepted {
		err = fmt.Errorf("admit %s: %s %s", id, adm.Kind, adm.Reason)
	}
	if err != nil {
		return err
	}
	res, err := r.Run(ctx, id, payload, func(context.Context, Lease) error {
		if l.running.Add(1) > l.maxActive {
			l.overlaps.Add(1)
		}
		defer l.running.Add(-1)
		l.mu.Lock()
		l.ran[id]++
		l.mu.Unlock()
		return nil
	})
	if err == nil && res.Release != KindReleased {
		err = fmt.Errorf("release %s", res.Release)
	}
	if err != nil {
		return fmt.Errorf("run %s: %w", id, err)
	}
	l.mu.Lock()
	l.tokens[res.Lease.SlotToken] = true
	l.mu.Unlock()
	return nil
}

// check closes errs and asserts no cycle failed, no more than maxActive
// handlers ran at once and each of the jobs ran once.
func (l *lingerLedger) check(t *testing.T, errs chan error, jobs int) {
	t.Helper()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	assert.Zero(t, l.overlaps.Load(), "handlers that ran while the %d slots were held", l.maxActive)
	assert.Len(t, l.ran, jobs)
	for id, n := range l.ran {
		assert.Equal(t, 1, n, "runs of %s", id)
	}
}

// facts returns the audit's facts of the cycles: every slot acquired was
// released by its Run.
func (l *lingerLedger) facts() auditFacts {
	return auditFacts{releaseCalled: l.tokens, acquiredTokens: l.tokens, removeCalled: map[string]bool{}, restoreCalled: map[string]bool{},
		replacedReported: map[string]bool{}, staleReported: map[string]bool{}, uncertain: map[opKind]int{}}
}

// lingerAdmit admits the jobs ids on jt with payload and requires each
// accepted.
func lingerAdmit(t *testing.T, ctx context.Context, jt *JobType, payload []byte, ids ...string) {
	t.Helper()
	for _, id := range ids {
		adm, err := jt.Admit(ctx, id, payload)
		require.NoError(t, err)
		require.Equal(t, KindAccepted, adm.Kind, "admission of %s", id)
	}
}

// lingerAcquire acquires a slot for job id on jt and requires it taken.
func lingerAcquire(t *testing.T, ctx context.Context, jt *JobType, id string, payload []byte) Acquisition {
	t.Helper()
	acq, err := jt.Acquire(ctx, id, payload)
	require.NoError(t, err)
	require.Equal(t, KindAcquired, acq.Kind, "acquisition of %s", id)
	return acq
}
