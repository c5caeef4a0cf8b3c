package jobkeys

// Fault tests: workers that crash mid-job, connections dropped by the
// client and by the server, and a nats-server restarted on its file
// storage, all under a running workload. Each run records every operation,
// drains the keys, audits every revision (audit_test.go) and checks the
// job ledger: every admitted job ends completed, replaced or removed.
// system_cluster_test.go runs the same workload on a 3-node cluster losing a node.
//
// JOBKEYS_LONG=1 runs more jobs and more faults.

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jobkeys/jobkeys/internal/natstest"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// ---- a deterministic crash and takeover, on a fake clock ----

// faultClock is a clock the test moves by hand, shared by coordinators.
type faultClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *faultClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *faultClock) set(t time.Time) {
	c.mu.Lock()
	c.now = t
	c.mu.Unlock()
}

// TestCrashedWorkerTakenOver: worker A acquires a job and crashes (stops
// renewing). Before its lease expires the key stays taken; from the
// expiry on, under FailStale another job takes the slot and reports A's
// job stale, under Block the key stays blocked until A's job is retried
// (a redelivery), which replaces its own stale slot. Either way the
// takeover is counted once, and A's late renewal and release are refused.
func TestCrashedWorkerTakenOver(t *testing.T) {
	t.Parallel()
	s := natstest.Run(t)
	for _, stale := range []StalePolicy{FailStale, Block} {
		t.Run(string(stale), func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			service := "crash_" + strings.ReplaceAll(string(stale), "-", "_")
			_, js := natstest.Connect(t, s)
			bucket := auditCreateBucket(t, ctx, js, service, 1, jetstream.FileStorage)
			clock := &faultClock{now: time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)}
			t0 := clock.Now()
			const ttl = 10 * time.Second
			keys := []linKey{newLinKey(t, service, "work", "a", Policy{MaxActive: 1, MaxQueuedPerKey: 2, StalePolicy: stale,
				HeartbeatTTL: ttl, HeartbeatInterval: 3 * time.Second})}
			rec := newLinRecorder()
			client := func(id int) *linClient {
				c := newLinClient(t, id, s.ClientURL(), service, "work", keys, rec)
				coord, err := NewCoordinator(faultNATSStore(t, c.js), &Config{InstanceID: c.instance, IgnoreClockSkew: true, Now: clock.Now})
				require.NoError(t, err)
				c.coord = coord
				return c
			}
			a, b := client(0), client(1)
			expect := func(what string, out linOutput, kind Kind, reason Reason) linOutput {
				t.Helper()
				require.NoError(t, out.err, what)
				got := out.admission.Kind + out.acquisition.Kind + out.renewal.Kind + out.release.Kind
				require.Equal(t, kind, got, what)
				require.Equal(t, reason, out.acquisition.Reason, what)
				return out
			}
			expect("admit j1", a.admit(ctx, 0, "j1", false, TraceContext{}), KindAccepted, "")
			expect("admit j2", a.admit(ctx, 0, "j2", false, TraceContext{}), KindAccepted, "")
			lease := expect("A acquires j1", a.acquire(ctx, 0, "j1", false, 1, TraceContext{}), KindAcquired, "").acquisition.Lease
			// A crashes: no more heartbeats.
			clock.set(t0.Add(ttl - time.Millisecond))
			expect("B acquires j2 1ms before the lease expires", b.acquire(ctx, 0, "j2", false, 1, TraceContext{}), KindBlocked, ReasonActiveLimit)
			clock.set(t0.Add(ttl))
			var after *KeyState
			if stale == FailStale {
				out := expect("B acquires j2 at the expiry", b.acquire(ctx, 0, "j2", false, 1, TraceContext{}), KindAcquired, "")
				require.Len(t, out.acquisition.Stale, 1, "B's acquisition reports j1's slot stale")
				require.Equal(t, "j1", out.acquisition.Stale[0].JobID)
				require.Equal(t, lease.SlotToken, out.acquisition.Stale[0].SlotToken)
				after = out.acquisition.State
				expect("B releases j2", b.release(ctx, 0, out.acquisition.Lease), KindReleased, "")
			} else {
				expect("B acquires j2 at the expiry", b.acquire(ctx, 0, "j2", false, 1, TraceContext{}), KindBlocked, ReasonStaleBlocked)
				retry := client(2) // the redelivered j1, on another worker
				out := expect("j1 redelivered", retry.acquire(ctx, 0, "j1", true, 2, TraceContext{}), KindAcquired, "")
				require.Empty(t, out.acquisition.Stale, "a retry replacing its own slot reports stale slots")
				after = out.acquisition.State
				expect("B acquires j2 while j1's retry runs", b.acquire(ctx, 0, "j2", false, 1, TraceContext{}), KindBlocked, ReasonActiveLimit)
				expect("j1's retry releases", retry.release(ctx, 0, out.acquisition.Lease), KindReleased, "")
				out = expect("B acquires j2", b.acquire(ctx, 0, "j2", false, 1, TraceContext{}), KindAcquired, "")
				expect("B releases j2", b.release(ctx, 0, out.acquisition.Lease), KindReleased, "")
			}
			assert.Equal(t, 1, after.StaleTakeoverCount, "staleTakeoverCount after one takeover")
			expect("A wakes up and renews", a.renew(ctx, 0, lease), KindLost, "")
			expect("A wakes up and releases", a.release(ctx, 0, lease), KindStaleCompletion, "")
			log := rec.log()
			linCheckClock(t, keys, log)
			sum := auditAll(t, js, bucket, log, linPolicyOf(keys), true)
			assert.Equal(t, 1, sum.TakenOver, "takeovers the audit saw")
		})
	}
}

func faultNATSStore(t testing.TB, js jetstream.JetStream) *NATSStore {
	t.Helper()
	st, err := NewNATSStore(js)
	require.NoError(t, err)
	return st
}

// linCheckClock checks a history whose coordinators used a fake clock:
// the recorded [lo, hi] bounds are then the wall clock's, so they are
// replaced by the fake clock's reading, which did not move during any call.
func linCheckClock(t testing.TB, keys []linKey, log []*linOp) {
	t.Helper()
	fixed := make([]*linOp, 0, len(log))
	for _, op := range log {
		cp := *op
		if st := cp.state(); st != nil {
			cp.in.lo, cp.in.hi = modelMs(st.UpdatedAt), modelMs(st.UpdatedAt)
		} else {
			cp.in.lo, cp.in.hi = -1<<62, 1<<62
		}
		fixed = append(fixed, &cp)
	}
	linCheck(t, keys, fixed, 30*time.Second)
}

// ---- the fault workload ----

// faultJob is a job on its way to a worker.
type faultJob struct {
	id    string
	key   int
	retry bool // a redelivery: its earlier attempt crashed or its outcome is unknown
	tries int
}

// faultLedger tracks every job's fate. Safe for concurrent use.
type faultLedger struct {
	mu        sync.Mutex
	admitted  map[string]bool   // the job entered the queue (for sure, or maybe)
	maybe     map[string]bool   // the admission's outcome was unknown and then refused
	settled   map[string]string // how it ended: completed, replaced, removed, gone
	reasons   map[string]string // replaced or removed, whenever it was reported
	stale     map[string]int    // times a job's slot was reported stale to a taker
	counts    map[string]int
	pending   sync.WaitGroup
	unsettled atomic.Int64
}

func newFaultLedger() *faultLedger {
	return &faultLedger{admitted: map[string]bool{}, maybe: map[string]bool{}, settled: map[string]string{}, reasons: map[string]string{},
		stale: map[string]int{}, counts: map[string]int{}}
}

func (l *faultLedger) count(what string) {
	l.mu.Lock()
	l.counts[what]++
	l.mu.Unlock()
}

// admit records that job entered the queue; it reports whether this is the
// first time, so that the job is handed to a worker once.
func (l *faultLedger) admit(job string, maybe bool) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.admitted[job] {
		return false
	}
	l.admitted[job] = true
	if maybe {
		l.maybe[job] = true
	}
	if _, done := l.settled[job]; done {
		return false // replaced before its own admission's reply came back
	}
	l.pending.Add(1)
	l.unsettled.Add(1)
	return true
}

// settle records how job ended, once.
func (l *faultLedger) settle(job, how string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if how == "replaced" || how == "removed" {
		l.reasons[job] = how
	}
	if _, done := l.settled[job]; done {
		return
	}
	l.settled[job] = how
	l.counts["jobs "+how]++
	if l.admitted[job] {
		l.pending.Done()
		l.unsettled.Add(-1)
	}
}

func (l *faultLedger) isSettled(job string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, done := l.settled[job]
	return done
}

// faultRun is one workload: producers admit jobs, workers acquire, run
// (renewing their lease) and release them, and crash now and then; chaos
// is injected by the test.
type faultRun struct {
	t        *testing.T
	ctx      context.Context
	url      string // one URL, or a comma-separated list for a cluster
	service  string
	jobType  string
	keys     []linKey
	rec      *linRecorder
	ledger   *faultLedger
	queue    chan faultJob
	stop     chan struct{}
	gate     sync.RWMutex // held shared by every operation; the chaos takes it to quiesce
	nextID   atomic.Int64
	crashPct int           // chance per job that its worker crashes mid-job
	opWait   time.Duration // per-operation timeout

	mu       sync.Mutex
	clients  map[int]*linClient // live workers and producers
	workers  sync.WaitGroup
	chaos    sync.WaitGroup // fault injectors; finish waits for them after stopping the run
	inflight atomic.Int64
	faults   map[string]int
}

func newFaultRun(t *testing.T, ctx context.Context, url, service string, keys []linKey) *faultRun {
	return &faultRun{t: t, ctx: ctx, url: url, service: service, jobType: "work", keys: keys, rec: newLinRecorder(),
		ledger: newFaultLedger(), queue: make(chan faultJob, 1<<16), stop: make(chan struct{}),
		crashPct: 5, opWait: 3 * time.Second, clients: map[int]*linClient{}, faults: map[string]int{}}
}

func (f *faultRun) fault(what string) {
	f.mu.Lock()
	f.faults[what]++
	f.mu.Unlock()
}

// client opens a new client with its own connection.
func (f *faultRun) client() *linClient {
	id := int(f.nextID.Add(1))
	c := &linClient{id: id, service: f.service, jobType: f.jobType, keys: f.keys, rec: f.rec, instance: fmt.Sprintf("client-%d", id)}
	var err error
	if c.nc, c.js, c.coord, err = linDial(f.url, c.instance); err != nil {
		f.t.Errorf("client %d: %v", id, err)
		return nil
	}
	f.mu.Lock()
	f.clients[id] = c
	f.mu.Unlock()
	return c
}

func (f *faultRun) forget(c *linClient) {
	f.mu.Lock()
	delete(f.clients, c.id)
	f.mu.Unlock()
	c.close()
}

// randomClient returns a live client, or nil.
func (f *faultRun) randomClient(rng *rand.Rand) *linClient {
	f.mu.Lock()
	defer f.mu.Unlock()
	ids := make([]int, 0, len(f.clients))
	for id := range f.clients {
		ids = append(ids, id)
	}
	if len(ids) == 0 {
		return nil
	}
	sort.Ints(ids)
	return f.clients[ids[rng.IntN(len(ids))]]
}

// op runs one operation under the gate with the per-operation timeout.
func (f *faultRun) op(run func(ctx context.Context) linOutput) linOutput {
	f.gate.RLock()
	defer f.gate.RUnlock()
	f.inflight.Add(1)
	defer f.inflight.Add(-1)
	ctx, cancel := context.WithTimeout(f.ctx, f.opWait)
	defer cancel()
	return run(ctx)
}

// later puts j back on the queue after d.
func (f *faultRun) later(j faultJob, d time.Duration) {
	time.AfterFunc(d, func() {
		select {
		case f.queue <- j:
		case <-f.stop:
		}
	})
}

func (f *faultRun) sleep(d time.Duration) bool {
	select {
	case <-time.After(d):
		return true
	case <-f.stop:
		return false
	case <-f.ctx.Done():
		return false
	}
}

// produce admits n jobs, spread over the keys, retrying an admission whose
// outcome is unknown with the same job id, and now and then cancels a job
// it admitted (RemoveQueued).
func (f *faultRun) produce(p, n int, rng *rand.Rand) {
	c := f.client()
	if c == nil {
		return
	}
	defer f.forget(c)
	var mine []faultJob
	for i := range n {
		j := faultJob{id: fmt.Sprintf("p%d-%d", p, i), key: rng.IntN(len(f.keys))}
		strict := rng.IntN(5) == 0
		uncertain := false
		for {
			if f.ctx.Err() != nil {
				return
			}
			out := f.op(func(ctx context.Context) linOutput { return c.admit(ctx, j.key, j.id, strict, TraceContext{}) })
			if out.err != nil {
				uncertain = true
				f.ledger.count("admit errors")
				f.sleep(time.Duration(10+rng.IntN(20)) * time.Millisecond)
				continue
			}
			a := out.admission
			f.ledger.count("admit " + string(a.Kind))
			if a.Replaced != nil {
				f.ledger.settle(a.Replaced.ID, "replaced")
			}
			switch {
			case a.Kind == KindAccepted || a.Kind == KindReplaced:
				if f.ledger.admit(j.id, false) {
					f.queue <- j
					mine = append(mine, j)
				}
			case uncertain:
				// Refused now, but an earlier attempt may have got in.
				if f.ledger.admit(j.id, true) {
					f.queue <- j
				}
			}
			break
		}
		if len(mine) > 0 && rng.IntN(12) == 0 {
			v := mine[rng.IntN(len(mine))]
			out := f.op(func(ctx context.Context) linOutput { return c.remove(ctx, v.key, v.id) })
			switch {
			case out.err == nil && out.removal.Kind == KindRemoved:
				f.ledger.settle(v.id, "removed")
			case out.err != nil:
				// Unknown outcome: the removal may have landed, and
				// nobody was told.
				f.ledger.count("remove errors")
				f.ledger.mu.Lock()
				f.ledger.reasons[v.id] = "removed, outcome unknown"
				f.ledger.mu.Unlock()
			}
		}
		f.sleep(time.Duration(rng.IntN(6)) * time.Millisecond)
	}
}

// work runs jobs from the queue until the run stops or the worker crashes;
// a crashed worker is replaced by a new one with a new connection.
func (f *faultRun) work(rng *rand.Rand) {
	defer f.workers.Done()
	c := f.client()
	if c == nil {
		return
	}
	for {
		var j faultJob
		select {
		case <-f.stop:
			f.forget(c)
			return
		case j = <-f.queue:
		}
		if f.ledger.isSettled(j.id) {
			continue
		}
		if crashed := f.run(c, j, rng); crashed {
			f.forget(c)
			f.workers.Add(1)
			go f.work(rand.New(rand.NewPCG(rng.Uint64(), rng.Uint64())))
			return
		}
	}
}

// run takes one job through acquire, work with renewals, and release. It
// reports whether the worker crashed.
func (f *faultRun) run(c *linClient, j faultJob, rng *rand.Rand) bool {
	pol := f.keys[j.key].policy
	j.tries++
	out := f.op(func(ctx context.Context) linOutput {
		return c.acquire(ctx, j.key, j.id, j.retry, j.tries, TraceContext{})
	})
	if out.err != nil {
		// Unknown outcome: the slot may be ours. Retry as a redelivery;
		// an own live slot blocks it until it expires, then it is replaced.
		f.ledger.count("acquire errors")
		j.retry = true
		f.later(j, 20*time.Millisecond)
		return false
	}
	a := out.acquisition
	for _, st := range a.Stale {
		f.ledger.mu.Lock()
		f.ledger.stale[st.JobID]++
		f.ledger.mu.Unlock()
	}
	switch a.Kind {
	case KindBlocked:
		f.ledger.count("acquire blocked " + string(a.Reason))
		switch a.Reason {
		case ReasonNotQueued:
			// Left the queue: replaced or removed (the report may reach
			// the producer a moment later; finish checks), or lost.
			f.ledger.settle(j.id, "gone")
		case ReasonAlreadyActive:
			f.later(j, pol.HeartbeatTTL/2)
		default:
			f.later(j, time.Duration(5+rng.IntN(20))*time.Millisecond)
		}
		return false
	case KindAcquired:
	default:
		f.t.Errorf("acquire %s: outcome %s", j.id, a.Kind)
		return false
	}
	f.ledger.count("acquired")
	lease := a.Lease
	if rng.IntN(100) < f.crashPct {
		// Crash mid-job: never renew or release. The message is
		// redelivered once its lease could have expired.
		f.fault("worker crashes")
		j.retry = true
		f.later(j, pol.HeartbeatTTL+time.Duration(rng.IntN(50))*time.Millisecond)
		return true
	}
	for range 1 + rng.IntN(3) {
		if !f.sleep(time.Duration(rng.Int64N(int64(pol.HeartbeatInterval)))) {
			break
		}
		r := f.op(func(ctx context.Context) linOutput { return c.renew(ctx, j.key, lease) })
		if r.err == nil && r.renewal.Kind == KindLost {
			// Taken over while this worker was slow (its lease lapsed):
			// abandon the run; the message is redelivered.
			f.ledger.count("renew lost")
			j.retry = true
			f.later(j, 10*time.Millisecond)
			return false
		}
		if r.err != nil {
			f.ledger.count("renew errors")
		}
	}
	uncertain := false
	for attempt := 0; ; attempt++ {
		r := f.op(func(ctx context.Context) linOutput { return c.release(ctx, j.key, lease) })
		switch {
		case r.err != nil:
			f.ledger.count("release errors")
			uncertain = true
			if !f.sleep(20 * time.Millisecond) {
				return false
			}
			continue
		case r.release.Kind == KindReleased, uncertain:
			// After an unknown outcome a stale completion may be our own
			// earlier release: the job is done either way.
			f.ledger.settle(j.id, "completed")
		default:
			// Taken over before the release: run it again.
			f.ledger.count("release stale-completion")
			j.retry = true
			f.later(j, 10*time.Millisecond)
		}
		return false
	}
}

// start launches the producers and workers.
func (f *faultRun) start(producers, jobsEach, workers int, seed uint64) *sync.WaitGroup {
	var prod sync.WaitGroup
	for p := range producers {
		prod.Go(func() { f.produce(p, jobsEach, rand.New(rand.NewPCG(seed, uint64(1000+p)))) })
	}
	for w := range workers {
		f.workers.Add(1)
		go f.work(rand.New(rand.NewPCG(seed, uint64(w))))
	}
	return &prod
}

// finish waits for the producers and for every admitted job to settle,
// stops the workers, drains the keys and audits the bucket.
func (f *faultRun) finish(prod *sync.WaitGroup, js jetstream.JetStream, bucket string) auditSummary {
	t := f.t
	t.Helper()
	prod.Wait()
	settled := make(chan struct{})
	go func() { f.ledger.pending.Wait(); close(settled) }()
	select {
	case <-settled:
	case <-f.ctx.Done():
		f.ledger.mu.Lock()
		var open []string
		for job := range f.ledger.admitted {
			if _, ok := f.ledger.settled[job]; !ok {
				open = append(open, job)
			}
		}
		f.ledger.mu.Unlock()
		sort.Strings(open)
		t.Fatalf("%d jobs never settled: %v", len(open), open)
	}
	close(f.stop)
	f.workers.Wait()
	f.chaos.Wait()
	drainer := f.client()
	if drainer == nil {
		t.FailNow() // client reported why
	}
	defer f.forget(drainer)
	drainer.drain(t, f.ctx)
	log := f.rec.log()
	actx, acancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer acancel()
	entries := auditRead(t, actx, js, bucket)
	sum := auditCheck(t, entries, newAuditFacts(log), linPolicyOf(f.keys), true)
	t.Logf("audit of %s: %v", bucket, sum)
	// The admissions whose outcome stayed unknown: if one of them replaced
	// a job, nobody was told.
	failedAdmits := map[string]bool{}
	for _, op := range log {
		if op.in.kind == opAdmit && op.out.err != nil {
			failedAdmits[op.in.job] = true
		}
	}
	f.ledger.mu.Lock()
	defer f.ledger.mu.Unlock()
	var lost []string
	for job := range f.ledger.admitted {
		switch how := f.ledger.settled[job]; {
		case how == "completed", how == "replaced", how == "removed":
		case how == "gone" && (f.ledger.reasons[job] != "" || f.ledger.maybe[job]):
		case how == "gone":
			joined, desc := auditDeparture(entries, job)
			if len(joined) == 1 && failedAdmits[joined[0]] {
				// Replaced by an admission whose reply was lost: see
				// RELIABILITY.md, "replaced while the reply is lost".
				f.ledger.counts["jobs replaced, report lost with a failed admission"]++
				t.Logf("job %s was replaced by %s, whose admission failed (outcome unknown): %s", job, joined[0], desc)
				continue
			}
			lost = append(lost, fmt.Sprintf("%s (%s)", job, desc))
		default:
			lost = append(lost, job+" ("+how+")")
		}
	}
	sort.Strings(lost)
	assert.Empty(t, lost, "admitted jobs that were lost: neither completed, nor replaced, nor removed")
	errs := 0
	for _, op := range log {
		if op.out.err != nil {
			errs++
		}
	}
	t.Logf("%d operations (%d failed and were retried), faults %v; ledger: %d jobs admitted, %v; stale reports for %d jobs",
		len(log), errs, f.faults, len(f.ledger.admitted), f.ledger.counts, len(f.ledger.stale))
	return sum
}

// faultKeys are the keys of the fault workloads: one per stale policy and
// queue-full behaviour, with short leases so crashed slots expire mid-run.
func faultKeys(t testing.TB, service string, ttl time.Duration) []linKey {
	return []linKey{
		newLinKey(t, service, "work", "a", Policy{MaxActive: 2, MaxQueuedPerKey: 3, WhenFull: ReplaceOldest, StalePolicy: FailStale, HeartbeatTTL: ttl, HeartbeatInterval: ttl / 4}),
		newLinKey(t, service, "work", "b", Policy{MaxActive: 1, MaxQueuedPerKey: 4, WhenFull: Reject, StalePolicy: Block, HeartbeatTTL: ttl, HeartbeatInterval: ttl / 4}),
		newLinKey(t, service, "work", "c", Policy{MaxActive: 3, MaxQueuedPerKey: 2, WhenFull: Coalesce, StalePolicy: FailStale, HeartbeatTTL: ttl, HeartbeatInterval: ttl / 4}),
	}
}

// faultSize returns the workload size: producers, jobs per producer, workers.
func faultSize() (int, int, int) {
	if reliabilityLong() {
		return 4, 300, 10
	}
	return 2, 40, 5
}

// TestFaultCrashingWorkers: one job in six crashes its worker mid-job
// (no more heartbeats, no release); the message is redelivered after the
// lease could have expired. Every job still completes, slots are taken
// over only after their lease expired, and the audit holds.
func TestFaultCrashingWorkers(t *testing.T) {
	t.Parallel()
	seed := reliabilitySeed(t)
	s := natstest.Run(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const service = "faultcrash"
	_, js := natstest.Connect(t, s)
	bucket := auditCreateBucket(t, ctx, js, service, 1, jetstream.FileStorage)
	f := newFaultRun(t, ctx, s.ClientURL(), service, faultKeys(t, service, 200*time.Millisecond))
	f.crashPct = 16
	producers, jobs, workers := faultSize()
	sum := f.finish(f.start(producers, jobs, workers, seed), js, bucket)
	assert.NotZero(t, f.faults["worker crashes"], "no worker crashed: the test proved nothing")
	assert.NotZero(t, sum.TakenOver, "no slot was taken over: the test proved nothing")
}

// TestFaultConnectionsDropped: while the workload runs, clients lose their
// connection: some close it and carry on with a new connection (and a new
// coordinator, so an empty state cache), some are disconnected by the
// server and reconnect on their own. Operations in flight fail or
// succeed; every job completes and the audit holds.
func TestFaultConnectionsDropped(t *testing.T) {
	t.Parallel()
	seed := reliabilitySeed(t)
	s := natstest.Run(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const service = "faultconn"
	_, js := natstest.Connect(t, s)
	bucket := auditCreateBucket(t, ctx, js, service, 1, jetstream.FileStorage)
	f := newFaultRun(t, ctx, s.ClientURL(), service, faultKeys(t, service, 300*time.Millisecond))
	producers, jobs, workers := faultSize()
	prod := f.start(producers, jobs, workers, seed)
	f.chaos.Go(func() {
		rng := rand.New(rand.NewPCG(seed, 99))
		for f.sleep(time.Duration(30+rng.IntN(60)) * time.Millisecond) {
			c := f.randomClient(rng)
			if c == nil {
				continue
			}
			if rng.IntN(2) == 0 {
				// Client side: drop the connection, carry on with a new one.
				if err := c.redial(f.url); err != nil {
					t.Errorf("reconnect client %d: %v", c.id, err)
					return
				}
				f.fault("client closed its connection")
			} else {
				// Server side: kick the client; it reconnects by itself.
				id, err := c.conn().GetClientID()
				if err != nil {
					continue
				}
				if err := s.DisconnectClientByID(id); err == nil {
					f.fault("server disconnected a client")
				}
			}
		}
	})
	f.finish(prod, js, bucket)
	assert.NotZero(t, f.faults["client closed its connection"], "faults injected: %v", f.faults)
	assert.NotZero(t, f.faults["server disconnected a client"], "faults injected: %v", f.faults)
}

// TestFaultServerRestart: the nats-server (file storage) is restarted
// twice mid-run on the same store directory and port: once with the
// workload paused, where every key's value and revision and the stream's
// last sequence must be the same afterwards, and once abruptly, with
// operations in flight. Clients reconnect by themselves; every job
// completes and the audit, which reads the history from the restarted
// server, holds: no acknowledged write was lost.
func TestFaultServerRestart(t *testing.T) {
	t.Parallel()
	seed := reliabilitySeed(t)
	dir := t.TempDir()
	s, stop, err := natstest.Start(natstest.Options{StoreDir: dir})
	require.NoError(t, err)
	var mu sync.Mutex
	current := func() (*server.Server, func()) {
		mu.Lock()
		defer mu.Unlock()
		return s, stop
	}
	t.Cleanup(func() { _, st := current(); st() })
	port := s.Addr().(*net.TCPAddr).Port
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const service = "faultrestart"
	_, js := natstest.Connect(t, s)
	bucket := auditCreateBucket(t, ctx, js, service, 1, jetstream.FileStorage)
	f := newFaultRun(t, ctx, s.ClientURL(), service, faultKeys(t, service, 400*time.Millisecond))
	f.opWait = 2 * time.Second
	producers, jobs, workers := faultSize()
	prod := f.start(producers, jobs, workers, seed)
	restart := func() error {
		_, st := current()
		st()
		ns, nstop, err := natstest.Start(natstest.Options{StoreDir: dir, Port: port})
		if err != nil {
			return err
		}
		mu.Lock()
		s, stop = ns, nstop
		mu.Unlock()
		return nil
	}
	restarts := 2
	if reliabilityLong() {
		restarts = 6
	}
	chaosDone := make(chan struct{})
	go func() {
		defer close(chaosDone)
		for i := range restarts {
			if !f.sleep(150 * time.Millisecond) {
				return
			}
			if i%2 == 0 {
				// Paused: what is stored before must be there after.
				f.gate.Lock()
				before, err := faultSnapshot(ctx, js, bucket)
				if err == nil {
					err = restart()
				}
				var after map[string]uint64
				if err == nil {
					after, err = faultSnapshotRetry(ctx, js, bucket)
				}
				f.gate.Unlock()
				if err != nil {
					t.Errorf("paused restart: %v", err)
					return
				}
				assert.Equal(t, before, after, "state across a restart")
				f.fault("server restarts (paused, state compared)")
			} else {
				for f.inflight.Load() == 0 { // operations in flight
					if !f.sleep(time.Millisecond) {
						return
					}
				}
				if err := restart(); err != nil {
					t.Errorf("restart: %v", err)
					return
				}
				f.fault("server restarts (operations in flight)")
			}
		}
	}()
	<-chaosDone
	f.finish(prod, js, bucket)
	assert.NotZero(t, f.faults["server restarts (paused, state compared)"], "faults injected: %v", f.faults)
	assert.NotZero(t, f.faults["server restarts (operations in flight)"], "faults injected: %v", f.faults)
}

// faultSnapshot returns the revision of every key of bucket and the
// stream's last sequence (as key "#last").
func faultSnapshot(ctx context.Context, js jetstream.JetStream, bucket string) (map[string]uint64, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	kv, err := js.KeyValue(ctx, bucket)
	if err != nil {
		return nil, err
	}
	stream, err := js.Stream(ctx, "KV_"+bucket)
	if err != nil {
		return nil, err
	}
	info, err := stream.Info(ctx)
	if err != nil {
		return nil, err
	}
	snap := map[string]uint64{"#last": info.State.LastSeq}
	keys, err := kv.ListKeys(ctx)
	if err != nil {
		return nil, err
	}
	for k := range keys.Keys() {
		e, err := kv.Get(ctx, k)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		snap[k] = e.Revision()
	}
	return snap, nil
}

// faultSnapshotRetry takes a snapshot once the client has reconnected.
func faultSnapshotRetry(ctx context.Context, js jetstream.JetStream, bucket string) (map[string]uint64, error) {
	var err error
	for range 100 {
		var snap map[string]uint64
		if snap, err = faultSnapshot(ctx, js, bucket); err == nil {
			return snap, nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return nil, err
}
