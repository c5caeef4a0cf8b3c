package jobkeys

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jobkeys/jobkeys/internal/natstest"
)

// TestWakeUpsWakeOtherProcess: a Run blocked in one process on a key
// another process holds is woken by that process's release through its
// wake-up, with no read of the key while it waits but the one the
// wake-up starts (a wake-up from another process is a hint: the woken
// try reads the revision it names) and no recheck (the recheck is an hour
// away: without the wake-up the test times out).
func TestWakeUpsWakeOtherProcess(t *testing.T) {
	t.Parallel()
	s := natstest.Run(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	policy := Policy{Key: benchPolicy.Key, MaxActive: 1, MaxQueuedPerKey: 8}
	a := newWakeProc(t, s, "wakeother", policy, wakeProcConfig{})
	b := newWakeProc(t, s, "wakeother", policy, wakeProcConfig{})

	releaseA := a.holdSlot(t, ctx, "job-a")
	heldB, doneB := b.runAsync(t, ctx, "job-b", released())
	// Wait until b's Run waits on its wake-up subscription.
	b.waitBlocked(t, ctx, "job-b")
	require.Equal(t, 1, b.w.wakeSubscriptions())
	readsBefore := b.ops.reads.Load()
	sentBefore := a.store.wakeCounters().Published
	releaseA()
	awaitRun(t, ctx, heldB, doneB, "job-b was not woken by job-a's release")
	assert.Equal(t, readsBefore+1, b.ops.reads.Load(), "reads of the key by the woken process")
	assert.Zero(t, b.r.rechecks.Load(), "rechecks")
	assert.Equal(t, uint64(1), uint64(a.store.wakeCounters().Published-sentBefore), "wake-ups published by the release")
	assert.Positive(t, b.store.wakeCounters().Received, "wake-ups received")
}

// TestWakeUpsHeartbeatWakesNobody: renewals of a full key send no wake-up;
// the release that frees one of two slots wakes exactly one of the three
// Runs waiting in another process, and the next release the next one.
func TestWakeUpsHeartbeatWakesNobody(t *testing.T) {
	t.Parallel()
	s := natstest.Run(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	policy := Policy{Key: benchPolicy.Key, MaxActive: 2, MaxQueuedPerKey: 8}
	a := newWakeProc(t, s, "wakebeat", policy, wakeProcConfig{})
	b := newWakeProc(t, s, "wakebeat", policy, wakeProcConfig{})

	payload := benchPayload(0)
	var leases []Lease
	for i := range 2 {
		id := fmt.Sprintf("held-%d", i)
		_, err := a.jt.Admit(ctx, id, payload)
		require.NoError(t, err)
		acq, err := a.jt.Acquire(ctx, id, payload)
		require.NoError(t, err)
		require.Equal(t, KindAcquired, acq.Kind)
		leases = append(leases, acq.Lease)
	}
	release := make(chan struct{})
	defer close(release)
	var held []chan struct{}
	for i := range 3 {
		h, _ := b.runAsync(t, ctx, fmt.Sprintf("waiter-%d", i), release)
		held = append(held, h)
	}
	b.waitBlocked(t, ctx, "waiter-0", "waiter-1", "waiter-2")
	require.Equal(t, 3, b.w.wakeSubscriptions())

	sent := a.store.wakeCounters().Published + a.store.wakeCounters().Local
	for range 3 {
		for _, l := range leases {
			ren, err := a.c.Renew(ctx, RenewRequest{Lease: l})
			require.NoError(t, err)
			require.Equal(t, KindRenewed, ren.Kind)
		}
	}
	assert.Equal(t, sent, a.store.wakeCounters().Published+a.store.wakeCounters().Local, "wake-ups sent by renewals of a full key")

	rel, err := a.c.Release(ctx, ReleaseRequest{Lease: leases[0]})
	require.NoError(t, err)
	require.Equal(t, KindReleased, rel.Kind)
	select {
	case <-held[0]:
	case <-ctx.Done():
		t.Fatal("the first waiter was not woken")
	}
	// The others stay blocked: nobody freed a slot for them.
	time.Sleep(200 * time.Millisecond)
	for i, h := range held[1:] {
		select {
		case <-h:
			t.Fatalf("waiter-%d ran with the key full", i+1)
		default:
		}
	}
	rel, err = a.c.Release(ctx, ReleaseRequest{Lease: leases[1]})
	require.NoError(t, err)
	require.Equal(t, KindReleased, rel.Kind)
	select {
	case <-held[1]:
	case <-ctx.Done():
		t.Fatal("the second waiter was not woken")
	}
	assert.Zero(t, b.r.rechecks.Load(), "rechecks")
}

// TestWakeUpsFallBackToRecheck: a writer without wake-ups (the TS
// original, or a process that did not turn them on) sends none; a Run
// waiting for one gets the slot at its recheck.
func TestWakeUpsFallBackToRecheck(t *testing.T) {
	t.Parallel()
	s := natstest.Run(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	policy := Policy{Key: benchPolicy.Key, MaxActive: 1, MaxQueuedPerKey: 8}
	a := newWakeProc(t, s, "wakefallback", policy, wakeProcConfig{noWakes: true})
	b := newWakeProc(t, s, "wakefallback", policy, wakeProcConfig{recheck: 200 * time.Millisecond})

	releaseA := a.holdSlot(t, ctx, "job-a")
	heldB, doneB := b.runAsync(t, ctx, "job-b", released())
	b.waitBlocked(t, ctx, "job-b")
	releaseA()
	awaitRun(t, ctx, heldB, doneB, "job-b did not get the slot at its recheck")
	assert.Positive(t, b.r.rechecks.Load(), "rechecks")
	assert.Zero(t, b.store.wakeCounters().Received, "wake-ups received")
}

// TestWakeUpsAudit runs several processes' Runners over wake-ups on one
// key and audits the key's history: one slot appears or vanishes per
// revision, every state a client was told it wrote is stored, at most
// MaxActive handlers ran at once and every job ran once.
func TestWakeUpsAudit(t *testing.T) {
	t.Parallel()
	for _, maxActive := range []int{1, 2} {
		t.Run(fmt.Sprintf("max%d", maxActive), func(t *testing.T) {
			s := natstest.Run(t)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			_, js := natstest.Connect(t, s)
			service := fmt.Sprintf("wakeaudit%d", maxActive)
			bucket := auditCreateBucket(t, ctx, js, service, 1, jetstream.MemoryStorage)
			require.NoError(t, allowAtomicPublish(ctx, js, "KV_"+bucket))
			policy := Policy{Key: benchPolicy.Key, MaxActive: maxActive, MaxQueuedPerKey: 64}
			// A missed wake-up costs a recheck, not the test.
			var procs []*wakeProc
			for range 3 {
				procs = append(procs, newWakeProc(t, s, service, policy, wakeProcConfig{recheck: time.Second}))
			}
			const workers, cycles = 3, 20
			payload := benchPayload(0)
			l := newLingerLedger(int32(maxActive))
			var wg sync.WaitGroup
			errs := make(chan error, len(procs)*workers)
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
			l.check(t, errs, len(procs)*workers*cycles)
			entries := auditRead(t, ctx, js, bucket)
			sum := auditCheck(t, entries, l.facts(), func(string) (Policy, bool) { return policy, true }, true)
			var received, rechecks int64
			for _, p := range procs {
				received += int64(p.store.wakeCounters().Received) + int64(p.store.wakeCounters().Local)
				rechecks += p.r.rechecks.Load()
			}
			assert.Positive(t, received, "wake-ups delivered")
			t.Logf("%s; %d wake-ups delivered, %d rechecks", sum, received, rechecks)
		})
	}
}

// TestWakeUpsPassOverDeadWaiter: the job at the head of the queue belongs
// to a process whose connection is gone (a crash: the server dropped its
// subscriptions); the release's wake-up finds nobody there ("no
// responders") and goes on to the next queued job, whose Run in a live
// process gets the slot without waiting for a recheck.
func TestWakeUpsPassOverDeadWaiter(t *testing.T) {
	t.Parallel()
	s := natstest.Run(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	policy := Policy{Key: benchPolicy.Key, MaxActive: 1, MaxQueuedPerKey: 8}
	a := newWakeProc(t, s, "wakedead", policy, wakeProcConfig{})
	dead := newWakeProc(t, s, "wakedead", policy, wakeProcConfig{})
	b := newWakeProc(t, s, "wakedead", policy, wakeProcConfig{})

	releaseA := a.holdSlot(t, ctx, "job-a")
	// The dead process's job is queued first and its Run waits.
	dctx, dcancel := context.WithCancel(ctx)
	never := make(chan struct{})
	_, doneDead := dead.runAsync(t, dctx, "job-dead", never)
	dead.waitBlocked(t, ctx, "job-dead")
	heldB, doneB := b.runAsync(t, ctx, "job-b", released())
	b.waitBlocked(t, ctx, "job-b")
	// The crash: its connection goes, and with it its subscriptions.
	dead.store.js.Conn().Close()
	dcancel()
	<-doneDead
	// The server drops the closed connection's subscriptions on its own
	// time: until then the head's wake-up is delivered there, not
	// answered "no responders", and goes no further.
	key, err := DeriveKey("wakedead", benchJobType, benchPayload(0), policy.Key)
	require.NoError(t, err)
	deadSubject := dead.store.wake.Subject(dead.store.BucketName("wakedead"), key.KVKey, "job-dead")
	require.Eventually(t, func() bool { return !s.GlobalAccount().SubscriptionInterest(deadSubject) }, 10*time.Second, time.Millisecond,
		"the server drops the dead process's subscription")

	releaseA()
	awaitRun(t, ctx, heldB, doneB, "job-b was not woken past the dead head of the queue")
	assert.Zero(t, b.r.rechecks.Load(), "rechecks")
	assert.Positive(t, a.store.wakeCounters().NoResponders, "the head's wake-up found nobody")
}

// TestWakeUpsNoLostWakeUp: 16 processes' Runners cycle jobs through one
// key, each Run woken only by wake-ups (the recheck is a minute away), so
// one lost wake-up stops every Run: the slot stays free and its queue's
// head waits. A wake-up that came while its Run's try was returning was
// dropped by the try's rearm (it checked for a newer wake-up, then
// drained the signal the newer one had just sent): every few thousand
// cycles the key stopped for the whole recheck interval.
func TestWakeUpsNoLostWakeUp(t *testing.T) {
	t.Parallel()
	s := natstest.Run(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	policy := Policy{Key: benchPolicy.Key, MaxActive: 1, MaxQueuedPerKey: 64}
	var procs []*wakeProc
	for range 16 {
		procs = append(procs, newWakeProc(t, s, "wakelost", policy, wakeProcConfig{recheck: time.Minute}))
	}
	cycles := 150
	if testing.Short() {
		cycles = 50
	}
	var done atomic.Int64
	var last atomic.Int64
	last.Store(time.Now().UnixNano())
	stalled := make(chan time.Duration, 1)
	stop := make(chan struct{})
	go func() {
		tk := time.NewTicker(100 * time.Millisecond)
		defer tk.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tk.C:
			}
			// The key cycles every few milliseconds, if slowly on a
			// loaded machine; a lost wake-up stops it for a minute.
			if gap := time.Since(time.Unix(0, last.Load())); gap > 5*time.Second {
				stalled <- gap
				cancel()
				return
			}
		}
	}()
	var wg sync.WaitGroup
	errs := make(chan error, len(procs))
	for p, pr := range procs {
		wg.Go(func() {
			for i := range cycles {
				id := fmt.Sprintf("job-%d-%d", p, i)
				if _, err := pr.jt.Admit(ctx, id, benchPayload(0)); err != nil {
					errs <- err
					return
				}
				if _, err := pr.r.Run(ctx, id, benchPayload(0), func(context.Context, Lease) error { return nil }); err != nil {
					errs <- err
					return
				}
				done.Add(1)
				last.Store(time.Now().UnixNano())
			}
		})
	}
	wg.Wait()
	close(stop)
	select {
	case gap := <-stalled:
		t.Fatalf("no cycle completed for %v after %d cycles: a wake-up was lost", gap, done.Load())
	default:
	}
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	assert.EqualValues(t, len(procs)*cycles, done.Load())
}

// TestWakeUpsRearmKeepsWakeUpDuringIt: a wake-up delivered while a Run's
// try rearms its subscription (between the drain of the signal from
// before the try and the check for a wake-up newer than the try's state)
// leaves the Run signalled. With the check first and the drain after, the
// drain ate that wake-up's signal (TestWakeUpsNoLostWakeUp saw the stalls
// this caused, about once in seven runs).
func TestWakeUpsRearmKeepsWakeUpDuringIt(t *testing.T) {
	s := natstest.Run(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	policy := Policy{Key: benchPolicy.Key, MaxActive: 1, MaxQueuedPerKey: 8}
	p := newWakeProc(t, s, "wakerearm", policy, wakeProcConfig{})
	payload := benchPayload(0)
	adm, err := p.jt.Admit(ctx, "job", payload)
	require.NoError(t, err)
	key, err := p.jt.key("job", payload)
	require.NoError(t, err)
	value, rev, err := p.store.Get(ctx, key.Service, key.KVKey)
	require.NoError(t, err)
	require.NotNil(t, adm.State)

	sub, err := p.w.subscribeWake(key.Service, key.KVKey, "job", p.c.keys)
	require.NoError(t, err)
	defer sub.Close()
	delivered := false
	rearmWakeHook = func(s *Subscription) {
		if s == sub && !delivered {
			delivered = true
			// This store's own waiter: delivered in memory, at once.
			p.store.publishWakes(key.Service, key.KVKey, value, rev, []string{"job"}, 1)
		}
	}
	defer func() { rearmWakeHook = nil }()
	sub.rearm(rev - 1) // the try rested on the revision before
	require.True(t, delivered, "the hook delivered a wake-up")
	select {
	case <-sub.Changed():
	default:
		t.Fatal("the wake-up delivered during the rearm left no signal")
	}
}

// TestWakeUpsPastJobsNobodyWaitsFor: 40 jobs queued ahead of a waiting Run
// have no Run waiting (admitted, their workers not there yet); the
// release's wake-up goes past all of them ("no responders" each) to the
// Run behind, which gets the slot without its recheck (an hour away). The
// walk went 16 jobs past the free slot: the Run waited for its recheck.
func TestWakeUpsPastJobsNobodyWaitsFor(t *testing.T) {
	t.Parallel()
	s := natstest.Run(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	policy := Policy{Key: benchPolicy.Key, MaxActive: 1, MaxQueuedPerKey: 64}
	a := newWakeProc(t, s, "wakepast", policy, wakeProcConfig{})
	b := newWakeProc(t, s, "wakepast", policy, wakeProcConfig{})

	releaseA := a.holdSlot(t, ctx, "job-a")
	for i := range 40 {
		adm, err := a.jt.Admit(ctx, fmt.Sprintf("unclaimed-%d", i), benchPayload(0))
		require.NoError(t, err)
		require.Equal(t, KindAccepted, adm.Kind)
	}
	heldB, doneB := b.runAsync(t, ctx, "job-b", released())
	b.waitBlocked(t, ctx, "job-b")
	releaseA()
	awaitRun(t, ctx, heldB, doneB, "job-b was not woken past the 40 jobs nobody waits for")
	assert.Zero(t, b.r.rechecks.Load(), "rechecks")
	assert.GreaterOrEqual(t, a.store.wakeCounters().NoResponders, uint64(40), "the jobs ahead answered no responders")
}

// TestWakeUpsIdleKeyBehindJobsNobodyWaitsFor: the slot is free, but the
// Run's job is queued behind 10 jobs that nobody waits for, and nobody
// writes the key: no write sends a wake-up. The Run tries when its turn
// would come by the Watcher's rule (2 ms per job ahead), not at its
// recheck (an hour away: it waited for it).
func TestWakeUpsIdleKeyBehindJobsNobodyWaitsFor(t *testing.T) {
	t.Parallel()
	s := natstest.Run(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	policy := Policy{Key: benchPolicy.Key, MaxActive: 1, MaxQueuedPerKey: 16}
	a := newWakeProc(t, s, "wakeidle", policy, wakeProcConfig{})
	for i := range 10 {
		adm, err := a.jt.Admit(ctx, fmt.Sprintf("unclaimed-%d", i), benchPayload(0))
		require.NoError(t, err)
		require.Equal(t, KindAccepted, adm.Kind)
	}
	held, done := a.runAsync(t, ctx, "job", released())
	awaitRun(t, ctx, held, done, "the Run behind 10 unclaimed jobs on an idle key did not get the free slot")
	assert.Zero(t, a.r.rechecks.Load(), "rechecks")
}

// acquireJobTry is jt.Acquire of job jobID as try wt of a waiting Runner
// (see waitTry), for tests that make one try of a Runner's by hand.
func acquireJobTry(ctx context.Context, jt *JobType, wt *waitTry, jobID string, payload any, opts ...AcquireOption) (Acquisition, error) {
	key, err := jt.key(jobID, payload)
	if err != nil {
		return Acquisition{}, err
	}
	return jt.acquire(ctx, key, jobID, opts, wt)
}

// acquireRequestTry is c.Acquire of req as try wt of a waiting Runner
// (see waitTry).
func acquireRequestTry(ctx context.Context, c *KeyCoordinator, req AcquireRequest, wt *waitTry) (Acquisition, error) {
	policy, key, err := c.prepare(req.Service, req.JobType, req.JobID, req.Payload, req.Policy)
	if err != nil {
		return Acquisition{}, err
	}
	return c.acquireKey(ctx, key, policy, req, wt)
}
