package jobkeys

// Jobs of one key start in queue order as far as the processes allow
// (docs/keys.md, "Things to know"): a Run whose job its coordinator's watch-fed
// state has queued behind others does not take a free slot ahead of them
// on its first try, but waits its turn as a woken waiter does.

import (
	"context"
	"errors"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fifoProc is one process on a shared MemoryStore: a coordinator, its job
// type of the key, a Watcher and a Runner through it.
type fifoProc struct {
	t       *testing.T
	mem     *MemoryStore
	jt      *JobType
	w       *Watcher
	r       *Runner
	service string
	payload []byte
	kvKey   string
}

func newFIFOProc(t *testing.T, mem *MemoryStore, service string, policy Policy, cfg RunnerConfig) *fifoProc {
	t.Helper()
	c, err := NewCoordinator(mem, nil)
	require.NoError(t, err)
	jt, err := c.JobType(service, benchJobType, policy)
	require.NoError(t, err)
	w, err := NewWatcher(mem)
	require.NoError(t, err)
	t.Cleanup(w.Close)
	cfg.Watcher = w
	if cfg.RecheckInterval == 0 {
		cfg.RecheckInterval = time.Minute // no safety-net read decides these tests
	}
	r, err := NewRunner(jt, &cfg)
	require.NoError(t, err)
	p := &fifoProc{t: t, mem: mem, jt: jt, w: w, r: r, service: service, payload: benchPayload(0)}
	p.kvKey = mustKey(t, jt, p.payload).KVKey
	return p
}

var fifoPolicy = Policy{Key: benchPolicy.Key, MaxActive: 1, MaxQueuedPerKey: 16}

// feed makes p's Watcher feed the key's changes to p's coordinator, as
// while another of its workers waits on the key: a waiter that nothing
// wakes (it found the key busy at every revision).
func (p *fifoProc) feed() {
	sub, err := p.w.subscribeWaiter(context.Background(), p.service, p.kvKey, "feed", p.jt.Policy().MaxActive, p.jt.coord.keys)
	require.NoError(p.t, err)
	p.t.Cleanup(sub.Close)
	sub.rearm(math.MaxUint64)
}

// awaitTrusted waits until p's coordinator holds, trusted, the revision
// the store holds.
func (p *fifoProc) awaitTrusted() {
	p.t.Helper()
	require.Eventually(p.t, func() bool {
		_, want, err := p.mem.Get(context.Background(), p.service, p.kvKey)
		if err != nil {
			return false
		}
		e := p.jt.coord.keys.entry(p.kvKey)
		if e == nil {
			return false
		}
		m := e.Marks()
		return m.Rev >= want && m.Trusted
	}, rtWait, time.Millisecond, "the coordinator's entry never held the key's latest state, trusted")
}

// waiting reports whether a waiter of job id waits on the key through
// p's Watcher, not woken.
func (p *fifoProc) waiting(id string) bool {
	p.w.mu.Lock()
	defer p.w.mu.Unlock()
	sw := p.w.watches[p.service]
	if sw == nil || sw.keys[p.kvKey] == nil {
		return false
	}
	for _, sub := range sw.keys[p.kvKey].waiters {
		if sub.waiter.jobID == id && !sub.waiter.woken {
			return true
		}
	}
	return false
}

func (p *fifoProc) admit(ids ...string) {
	for _, id := range ids {
		adm, err := p.jt.Admit(context.Background(), id, p.payload)
		require.NoError(p.t, err)
		require.Equal(p.t, KindAccepted, adm.Kind, "admit %s", id)
	}
}

// fifoStarts records the order in which handlers start.
type fifoStarts struct {
	mu  sync.Mutex
	ids []string
}

func (s *fifoStarts) handler(id string) Handler {
	return func(context.Context, Lease) error {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.ids = append(s.ids, id)
		return nil
	}
}

func (s *fifoStarts) get() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.ids...)
}

// run runs job id through p's Runner in a goroutine; the channel gets its
// error.
func (p *fifoProc) run(ctx context.Context, id string, h Handler) <-chan error {
	return goRun(ctx, p.r, id, p.payload, h)
}

// TestRunnerFIFOOtherProcessWaiterFirst: process B's job b is queued first
// and waits; process A holds the slot, releases it and at once admits and
// runs a new job n. n must not take the slot ahead of b. B's Watcher is
// held until n's Run has either started its handler (the bug) or waits for
// its turn, so the order does not depend on timing.
func TestRunnerFIFOOtherProcessWaiterFirst(t *testing.T) {
	ctx := context.Background()
	mem := NewMemoryStore()
	service := rtService()
	a := newFIFOProc(t, mem, service, fifoPolicy, RunnerConfig{})
	b := newFIFOProc(t, mem, service, fifoPolicy, RunnerConfig{})
	a.w.grace = time.Hour // n passes b only when b takes its turn, never by the grace
	a.feed()
	var starts fifoStarts

	a.admit("h")
	acq, err := a.jt.Acquire(ctx, "h", a.payload)
	require.NoError(t, err)
	require.Equal(t, KindAcquired, acq.Kind)
	b.admit("b")
	bDone := b.run(ctx, "b", starts.handler("b"))
	require.Eventually(t, func() bool { return b.waiting("b") }, rtWait, time.Millisecond, "b never waited")
	a.awaitTrusted()

	b.w.mu.Lock() // B hears nothing of the release for now
	locked := true
	defer func() {
		if locked {
			b.w.mu.Unlock()
		}
	}()
	_, err = a.jt.Release(ctx, acq.Lease)
	require.NoError(t, err)
	a.admit("n")
	nDone := a.run(ctx, "n", starts.handler("n"))
	require.Eventually(t, func() bool { return a.waiting("n") || len(starts.get()) > 0 }, rtWait, time.Millisecond,
		"n neither started nor waited")
	b.w.mu.Unlock()
	locked = false

	require.NoError(t, <-bDone)
	require.NoError(t, <-nDone)
	assert.Equal(t, []string{"b", "n"}, starts.get(), "n took the free slot ahead of b, queued before it in another process")
}

// TestRunnerFIFOLocalWaiterFirst: in one process, a waiter queued first
// starts before a fresh Run of a job queued after it, made right after
// the release that frees the slot.
func TestRunnerFIFOLocalWaiterFirst(t *testing.T) {
	ctx := context.Background()
	p := newFIFOProc(t, NewMemoryStore(), rtService(), fifoPolicy, RunnerConfig{})
	p.feed()
	var starts fifoStarts
	p.admit("h", "a", "b")
	p.releaseToWaiterThenRun(ctx, &starts)
	assert.Equal(t, []string{"a", "b"}, starts.get(), "b's first try took the slot ahead of a, queued before it")
}

// TestRunnerFIFOLocalOrderBehindDeadHead: the head of the queue is a job
// of another process that never tries (dead). Of this process's jobs
// behind it, the waiter queued first gets the slot once the head's grace
// has passed, not a fresh Run of a job behind it, which on the old code
// took the slot at once.
func TestRunnerFIFOLocalOrderBehindDeadHead(t *testing.T) {
	ctx := context.Background()
	mem := NewMemoryStore()
	service := rtService()
	p := newFIFOProc(t, mem, service, fifoPolicy, RunnerConfig{})
	other := newFIFOProc(t, mem, service, fifoPolicy, RunnerConfig{})
	p.w.grace = 50 * time.Millisecond
	p.feed()
	var starts fifoStarts
	p.admit("h")
	other.admit("dead")
	p.admit("a", "b")
	p.releaseToWaiterThenRun(ctx, &starts)
	assert.Equal(t, []string{"a", "b"}, starts.get(), "b took the slot ahead of a")
}

// TestRunnerFIFODeadHeadPassed: a Run queued behind a dead head (a job
// whose worker never tries) with the slot free waits for its turn, and
// gets the slot after the head's grace: it is not held back for good.
func TestRunnerFIFODeadHeadPassed(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	mem := NewMemoryStore()
	service := rtService()
	var blocked []Acquisition
	p := newFIFOProc(t, mem, service, fifoPolicy, RunnerConfig{
		OnBlocked: func(_ string, acq Acquisition) { blocked = append(blocked, acq) },
	})
	other := newFIFOProc(t, mem, service, fifoPolicy, RunnerConfig{})
	p.feed()
	other.admit("dead")
	p.admit("n")
	p.awaitTrusted()

	ran := false
	_, err := p.r.Run(ctx, "n", p.payload, func(context.Context, Lease) error { ran = true; return nil })
	require.NoError(t, err, "the run behind the dead head")
	assert.True(t, ran)
	require.Len(t, blocked, 1, "the run did not wait for its turn behind the head")
	assert.Equal(t, ReasonActiveLimit, blocked[0].Reason)
	assert.Equal(t, 0, blocked[0].Active, "the slot was free")
	assert.Equal(t, 2, blocked[0].Queued)
}

// TestRunnerFIFOFirstFreeQueuedTry: with MaxActive 2 and both slots free,
// the first two queued jobs may try at once, the third waits: after the
// second took a slot, it waits behind the first (which never tries) for
// as long as one slot is free, and tries once the second's release frees
// the other.
func TestRunnerFIFOFirstFreeQueuedTry(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	mem := NewMemoryStore()
	service := rtService()
	policy := fifoPolicy
	policy.MaxActive = 2
	p := newFIFOProc(t, mem, service, policy, RunnerConfig{})
	other := newFIFOProc(t, mem, service, policy, RunnerConfig{})
	p.w.grace = time.Hour // never passed by the grace
	p.feed()
	other.admit("x")
	p.admit("y", "z")
	p.awaitTrusted()

	started, finish := make(chan struct{}), make(chan struct{})
	yDone := p.run(ctx, "y", func(context.Context, Lease) error {
		close(started)
		<-finish
		return nil
	})
	recv(t, started, "y, second in the queue with two slots free, never started")
	zRan := make(chan struct{})
	zDone := p.run(ctx, "z", func(context.Context, Lease) error { close(zRan); return nil })
	require.Eventually(t, func() bool { return p.waiting("z") }, rtWait, time.Millisecond,
		"z, behind x with one slot free, did not wait for its turn")
	select {
	case <-zRan:
		t.Fatal("z took the slot free for x, queued before it")
	default:
	}
	close(finish)
	require.NoError(t, <-yDone)
	require.NoError(t, <-zDone, "z, behind x with two slots free")
}

// TestRunnerFIFOTryRunAndRetryTryAtOnce: TryRun's answer is final, so it
// does not wait for turns: behind a dead head with the slot free it takes
// the slot. Nor does a retry (WithRetry), which the reducer lets take a
// slot whether queued or not.
func TestRunnerFIFOTryRunAndRetryTryAtOnce(t *testing.T) {
	ctx := context.Background()
	mem := NewMemoryStore()
	service := rtService()
	blockedRuns := 0
	p := newFIFOProc(t, mem, service, fifoPolicy, RunnerConfig{
		OnBlocked: func(string, Acquisition) { blockedRuns++ },
	})
	other := newFIFOProc(t, mem, service, fifoPolicy, RunnerConfig{})
	p.w.grace = time.Hour
	p.feed()
	other.admit("dead")
	p.admit("t", "r")
	p.awaitTrusted()

	res, err := p.r.TryRun(ctx, "t", p.payload, func(context.Context, Lease) error { return nil })
	var be *BlockedError
	require.False(t, errors.As(err, &be), "TryRun blocked behind the dead head: %v", err)
	require.NoError(t, err)
	assert.Equal(t, KindReleased, res.Release)

	p.awaitTrusted()
	res, err = p.r.Run(ctx, "r", p.payload, func(context.Context, Lease) error { return nil }, WithRetry())
	require.NoError(t, err)
	assert.Equal(t, KindReleased, res.Release)
	assert.Zero(t, blockedRuns, "a retry waited for its turn")
}

// TestRunnerFIFOWatcherLaggingBehindEntry: the coordinator's entry holds
// the job's own admission (its write) before the Watcher's watch delivers
// it. The Watcher's older state does not have the job queued, and with a
// free slot would let it try at once; the waiter must instead wait until
// the Watcher holds the state its Run decided on, and then take its turn
// behind the head.
func TestRunnerFIFOWatcherLaggingBehindEntry(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	mem := NewMemoryStore()
	service := rtService()
	hw := heldMemoryWatcher(t, mem, service)
	hw.grace = time.Hour // the dead head is never passed here
	c, err := NewCoordinator(mem, nil)
	require.NoError(t, err)
	jt, err := c.JobType(service, benchJobType, fifoPolicy)
	require.NoError(t, err)
	r, err := NewRunner(jt, &RunnerConfig{Watcher: hw.Watcher, RecheckInterval: time.Minute})
	require.NoError(t, err)
	p := &fifoProc{t: t, mem: mem, jt: jt, w: hw.Watcher, r: r, service: service, payload: benchPayload(0)}
	p.kvKey = mustKey(t, jt, p.payload).KVKey
	other := newFIFOProc(t, mem, service, fifoPolicy, RunnerConfig{})

	// A waiter came and left: the feed lingers, and with no waiter the
	// coordinator's writes are not handed to the Watcher.
	sub, err := hw.subscribeWaiter(ctx, service, p.kvKey, "feed", fifoPolicy.MaxActive, jt.coord.keys)
	require.NoError(t, err)
	sub.rearm(math.MaxUint64)
	other.admit("dead")
	p.awaitTrusted()
	sub.Close()
	hw.hold()
	p.admit("n")
	e := jt.coord.keys.entry(p.kvKey)
	require.NotNil(t, e)
	m := e.Marks()
	trusted, rev := m.Trusted, m.Rev
	if !trusted {
		t.Skip("the lingering feed ended before the test used it (machine too slow)")
	}

	done := p.run(ctx, "n", func(context.Context, Lease) error { return nil })
	require.Eventually(t, func() bool { return p.waiting("n") }, rtWait, time.Millisecond,
		"n tried although the Watcher's state, older than its admission, was all it had to take turns by")
	hw.release()
	require.Eventually(t, func() bool {
		var got uint64
		hw.mu.Lock()
		if sw := hw.watches[service]; sw != nil && sw.keys[p.kvKey] != nil {
			got = sw.keys[p.kvKey].rev
		}
		hw.mu.Unlock()
		return got >= rev
	}, rtWait, time.Millisecond, "the Watcher never got the admission")
	assert.True(t, p.waiting("n"), "n was woken ahead of the head of the queue")
	cancel()
	require.ErrorIs(t, <-done, context.Canceled)
}

// releaseToWaiterThenRun holds the slot for job h, lets job a (queued
// before b) wait for it through p's Watcher until p's entry is fed and
// trusted, releases h's slot and at once runs b: the order a and b start
// in is in starts.
func (p *fifoProc) releaseToWaiterThenRun(ctx context.Context, starts *fifoStarts) {
	t := p.t
	t.Helper()
	acq, err := p.jt.Acquire(ctx, "h", p.payload)
	require.NoError(t, err)
	require.Equal(t, KindAcquired, acq.Kind)
	aDone := p.run(ctx, "a", starts.handler("a"))
	require.Eventually(t, func() bool { return p.waiting("a") }, rtWait, time.Millisecond, "a never waited")
	p.awaitTrusted()

	_, err = p.jt.Release(ctx, acq.Lease)
	require.NoError(t, err)
	_, err = p.r.Run(ctx, "b", p.payload, starts.handler("b"))
	require.NoError(t, err)
	require.NoError(t, <-aDone)
}
