package jobkeys

// Benchmarks of the coordinator against an embedded nats-server over TCP
// (memory storage), with a raw KV baseline in the same run, and tests of the
// performance contracts they rely on. BENCHMARKS.md has the figures and the
// commands that produced them:
//
//	go test -run '^$' -bench 'BenchmarkCycle|BenchmarkRawKV|BenchmarkRenew|BenchmarkReduce|BenchmarkStateCodec' \
//	    -benchmem -count 6 . | tee after.txt
//
// The memory soak runs only when JOBKEYS_MEM_SOAK=1 (see
// TestCoordinatorMemoryFlat).

import (
	"context"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"os"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jobkeys/jobkeys/internal/natstest"

	"github.com/jobkeys/jobkeys/internal/keycache"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const benchJobType = "render"

// benchPolicy keys jobs by payload field "tenant".
var benchPolicy = Policy{Key: []string{"tenant", "/tenant"}, MaxActive: 1}

// benchSeq makes a fresh service (bucket) name per benchmark run, so runs
// with different b.N do not see each other's keys.
var benchSeq atomic.Int64

func benchService() string { return "bench" + benchRun + strconv.FormatInt(benchSeq.Add(1), 10) }

// benchRun tells this process's buckets from an earlier run's on a
// standalone server (JOBKEYS_BENCH_NATS_URL), which keeps them.
var benchRun = func() string {
	if os.Getenv("JOBKEYS_BENCH_NATS_URL") == "" {
		return ""
	}
	return strconv.FormatInt(time.Now().UnixNano(), 36) + "x"
}()

func benchPayload(key int) []byte { return []byte(`{"tenant":"t-` + strconv.Itoa(key) + `"}`) }

// benchConn is one worker's connection: its own TCP connection, store and
// coordinator, as a separate worker process would have.
type benchConn struct {
	nc       *nats.Conn
	store    *NATSStore
	coord    *KeyCoordinator
	totals   *raceTotals    // the coordinator's reads and writes at the store
	rechecks *benchRechecks // the Runners' tries no change or wake-up started
}

// benchConnect connects a worker to s, with its store made with
// WithCreateBuckets and opts.
func benchConnect(b *testing.B, s *server.Server, opts ...NATSStoreOption) *benchConn {
	b.Helper()
	nc, js := natstest.ConnectURL(b, benchClientURL(s))
	store, err := NewNATSStore(js, append([]NATSStoreOption{WithCreateBuckets(jetstream.MemoryStorage, 1)}, opts...)...)
	require.NoError(b, err)
	// The coordinator writes through a countingStore, which benchContended
	// reads its lost races from.
	cs := newCountingStore(store)
	rs, rechecks := newBenchRecheckStore(cs)
	coord, err := NewCoordinator(rs, nil)
	require.NoError(b, err)
	coord.tryContext = benchTryContext
	coord.keys.probes = benchLaneProbes
	return &benchConn{nc: nc, store: store, coord: coord, totals: cs.totals, rechecks: rechecks}
}

// newBenchRecheckStore returns the store a benchConn's coordinator writes
// through: a hookStore over cs (passing its batch writes, value limit and
// wake-ups through) that also counts the tries of waiting Runs that no
// change of the key (a watch delivery, or a targeted wake-up) started: the
// Runner's safety-net recheck (RunnerConfig.RecheckInterval, or the expiry
// of a lease it saw) or a watch subscription that ended. Such a try carries
// a waitTry that does not trust the watch feed, and reaches the store at
// least once (its write, or the read that confirms a blocked outcome on
// remembered state): each is counted once, at its first store call.
func newBenchRecheckStore(cs countingStore) (*hookStore, *benchRechecks) {
	rechecks := &benchRechecks{seen: map[*waitTry]struct{}{}}
	h := newHookStore(cs, passBatches|passValueLimit|passWakes).withHook(func(ctx context.Context, c storeCall, call func() storeResult) storeResult {
		if c.op != opListKeys && c.op != opWatchKeys {
			rechecks.note(ctx)
		}
		return call()
	})
	return h, rechecks
}

// benchRechecks counts the distinct untrusting tries (see
// newBenchRecheckStore).
type benchRechecks struct {
	mu   sync.Mutex
	seen map[*waitTry]struct{} // since the last reset
	n    int64
}

// note counts the untrusting tries among the operations a store call
// made with ctx is for.
func (r *benchRechecks) note(ctx context.Context) {
	for _, ctx := range batchContexts(ctx) {
		wt, _ := ctx.Value(benchTryKey{}).(*waitTry)
		if wt == nil || wt.trustWatch || wt.wake {
			continue
		}
		r.mu.Lock()
		if _, ok := r.seen[wt]; !ok {
			r.seen[wt] = struct{}{}
			r.n++
		}
		r.mu.Unlock()
	}
}

// benchTryKey is the context key under which benchTryContext puts a try.
type benchTryKey struct{}

// benchTryContext is the KeyCoordinator.tryContext of the benchmarks'
// coordinators: it puts each try of a waiting Runner in its operation's
// context, for benchRechecks.note.
func benchTryContext(ctx context.Context, wt *waitTry) context.Context {
	return context.WithValue(ctx, benchTryKey{}, wt)
}

// reset forgets the tries counted so far (the warm-up's).
func (r *benchRechecks) reset() {
	r.mu.Lock()
	defer r.mu.Unlock()
	clear(r.seen)
	r.n = 0
}

// count returns the tries counted since the last reset.
func (r *benchRechecks) count() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.n
}

// benchWakes is what the connections' stores counted of their targeted
// wake-ups (NATSStore.wakeCounters), summed, as float64 whatever the
// counters' integer type.
type benchWakes struct {
	published, local, noResponders, retried, dropped, received, malformed float64
}

// benchWakeCounts sums the wake-up counters of conns' stores.
func benchWakeCounts(conns []*benchConn) benchWakes {
	var w benchWakes
	for _, c := range conns {
		n := c.store.wakeCounters()
		w.published += float64(n.Published)
		w.local += float64(n.Local)
		w.noResponders += float64(n.NoResponders)
		w.retried += float64(n.Retried)
		w.dropped += float64(n.Dropped)
		w.received += float64(n.Received)
		w.malformed += float64(n.Malformed)
	}
	return w
}

// since returns w less the counts in base.
func (w benchWakes) since(base benchWakes) benchWakes {
	return benchWakes{
		published:    w.published - base.published,
		local:        w.local - base.local,
		noResponders: w.noResponders - base.noResponders,
		retried:      w.retried - base.retried,
		dropped:      w.dropped - base.dropped,
		received:     w.received - base.received,
		malformed:    w.malformed - base.malformed,
	}
}

// requests is how many messages (requests) the connection has sent: each
// KV operation is one request and one reply, so this counts round trips.
func (c *benchConn) requests() uint64 { return c.nc.Stats().OutMsgs }

// benchCycle runs admit → acquire → release of one job and checks each
// outcome. It is the unit of work of the uncontended benchmarks.
func benchCycle(ctx context.Context, c *KeyCoordinator, service string, p Policy, payload []byte, jobID string) error {
	adm, err := c.Admit(ctx, AdmitRequest{Service: service, JobType: benchJobType, JobID: jobID, Payload: payload, Policy: p})
	if err != nil {
		return err
	}
	if adm.Kind != KindAccepted || adm.AlreadyPresent {
		return fmt.Errorf("admit %s: %s %s (already present %v)", jobID, adm.Kind, adm.Reason, adm.AlreadyPresent)
	}
	acq, err := c.Acquire(ctx, AcquireRequest{Service: service, JobType: benchJobType, JobID: jobID, Payload: payload, Policy: p})
	if err != nil {
		return err
	}
	if acq.Kind != KindAcquired {
		return fmt.Errorf("acquire %s: %s %s", jobID, acq.Kind, acq.Reason)
	}
	rel, err := c.Release(ctx, ReleaseRequest{Lease: acq.Lease})
	if err != nil {
		return err
	}
	if rel.Kind != KindReleased {
		return fmt.Errorf("release %s: %s", jobID, rel.Kind)
	}
	return nil
}

// benchReportRate reports ops per second under unit, from the timer.
func benchReportRate(b *testing.B, unit string) {
	if s := b.Elapsed().Seconds(); s > 0 {
		b.ReportMetric(float64(b.N)/s, unit)
	}
}

// BenchmarkCycle measures admit → acquire → release of one job (one op).
// Compare NATS/1worker with BenchmarkRawKV/1worker: three Get+Update pairs.
func BenchmarkCycle(b *testing.B) {
	b.Run("Memory/1worker", func(b *testing.B) {
		c, err := NewCoordinator(NewMemoryStore(), nil)
		require.NoError(b, err)
		ctx, service, payload := context.Background(), benchService(), benchPayload(0)
		b.ReportAllocs()
		b.ResetTimer()
		for i := range b.N {
			if err := benchCycle(ctx, c, service, benchPolicy, payload, "job-"+strconv.Itoa(i)); err != nil {
				b.Fatal(err)
			}
		}
		benchReportRate(b, "cycles/s")
	})

	s := natstest.Run(b)
	b.Run("NATS/1worker", func(b *testing.B) { benchOneWorker(b, s) })

	// The baseline of the hot-key rows below, in the same run: three bare
	// kv.Get + kv.Update pairs per op (BenchmarkRawKV/1worker).
	b.Run("NATS/rawKV-3updates", func(b *testing.B) {
		benchParallel(b, s, 1, false, "cycles/s", func(ctx context.Context, w *benchConn, worker int) func(int) error {
			return benchRawOp(ctx, b, w, benchService(), "k", benchStateBytes(b, 0))
		})
	})
	// The bare KV work of a hot-key row's cycle at its queue's length:
	// three kv.Update calls (no read: each on the revision the last one
	// returned) of a state with n jobs queued, on a key a kv.Watch
	// follows, as the hot-key rows' Watcher does. A cycle writes three
	// revisions of the key's whole state however it batches them (an
	// admission, an acquisition and a release), and a state of 64 queued
	// jobs is 17 KB against the 1-worker row's 662 bytes.
	for _, n := range []int{0, 16, 64} {
		b.Run(fmt.Sprintf("NATS/rawKV-3writes-%dqueued-watched", n), func(b *testing.B) {
			benchParallel(b, s, 1, false, "cycles/s", func(ctx context.Context, w *benchConn, worker int) func(int) error {
				return benchRawWrites(ctx, b, w, benchService(), "k", benchStateBytes(b, n))
			})
		})
	}

	// Hot keys (issue 11): n workers on ONE key with MaxActive 1, each
	// looping admit → Runner.Run (waiting on a Watcher while blocked) with
	// a handler that returns at once; all on one connection (one process)
	// or one connection, coordinator and Watcher per worker. Each -wake
	// row is the -watcher row before it with every connection's store
	// made with WithWakeUps(""): targeted wake-ups.
	for _, n := range []int{16, 64} {
		b.Run(fmt.Sprintf("NATS/%dworkers-1conn-1key-watcher", n), func(b *testing.B) {
			benchHotKey(b, s, n, 1)
		})
		if n == 16 {
			b.Run("NATS/16workers-1conn-1key-wake", func(b *testing.B) {
				benchHotKeyRow(b, s, hotKeyRow{workers: 16, conns: 1, wake: true})
			})
		}
		b.Run(fmt.Sprintf("NATS/%dworkers-%dconns-1key-watcher", n, n), func(b *testing.B) {
			benchHotKey(b, s, n, n)
		})
		b.Run(fmt.Sprintf("NATS/%dworkers-%dconns-1key-wake", n, n), func(b *testing.B) {
			benchHotKeyRow(b, s, hotKeyRow{workers: n, conns: n, wake: true})
		})
		if n == 64 {
			// 64 workers in 16 processes (4 each), on their own connections.
			b.Run("NATS/64workers-16conns-1key-wake", func(b *testing.B) {
				benchHotKeyRow(b, s, hotKeyRow{workers: 64, conns: 16, wake: true})
			})
		}
		// Each worker admits its next job while its handler holds the
		// slot: no admission of the releasing worker races the woken
		// head's acquisition.
		for _, wake := range []bool{false, true} {
			name := fmt.Sprintf("NATS/%dworkers-%dconns-1key-watcher-pipelined", n, n)
			if wake {
				name = fmt.Sprintf("NATS/%dworkers-%dconns-1key-wake-pipelined", n, n)
			}
			b.Run(name, func(b *testing.B) {
				benchHotKeyRow(b, s, hotKeyRow{workers: n, conns: n, wake: wake, pipelined: true})
			})
		}
	}
	// Several processes with several workers each: 64 workers over 4
	// connections (16 per process).
	b.Run("NATS/64workers-4conns-1key-watcher", func(b *testing.B) {
		benchHotKey(b, s, 64, 4)
	})
	b.Run("NATS/64workers-4conns-1key-wake", func(b *testing.B) {
		benchHotKeyRow(b, s, hotKeyRow{workers: 64, conns: 4, wake: true})
	})

	b.Run("NATS/16workers-16keys", func(b *testing.B) {
		service := benchService()
		benchParallel(b, s, 16, false, "cycles/s", func(ctx context.Context, w *benchConn, worker int) func(i int) error {
			payload := benchPayload(worker)
			if err := benchCycle(ctx, w.coord, service, benchPolicy, payload, fmt.Sprintf("warmup-%d", worker)); err != nil {
				b.Fatal(err)
			}
			return func(i int) error {
				return benchCycle(ctx, w.coord, service, benchPolicy, payload, fmt.Sprintf("job-%d-%d", worker, i))
			}
		})
	})

	b.Run("NATS/16workers-1key-max4", func(b *testing.B) {
		benchContended(b, s, 16, false)
	})
	b.Run("NATS/16goroutines-1conn-1key-max4", func(b *testing.B) {
		benchContended(b, s, 16, true)
	})
}

// benchHotKey runs n Runner workers over conns connections on one key
// with MaxActive 1 (see BenchmarkCycle): benchHotKeyRow without wake-ups.
func benchHotKey(b *testing.B, s *server.Server, n, conns int) {
	benchHotKeyRow(b, s, hotKeyRow{workers: n, conns: conns})
}

// hotKeyRow is one hot-key row of BenchmarkCycle: workers Runner workers
// over conns connections; wake makes every connection's store with
// WithWakeUps("").
type hotKeyRow struct {
	workers, conns int
	wake           bool
	// pipelined: each worker admits its next job while its handler holds
	// the slot, not after its Run returned, so that no admission of the
	// worker that frees the slot races the woken acquisition.
	pipelined bool
}

// benchHotKeyRow runs row's workers on one key with MaxActive 1 and
// reports, per cycle, the store reads and writes, the Runs that waited,
// the waits' tries no change of the key started (rechecks, see
// newBenchRecheckStore) and, with wake-ups, what the stores counted of them.
func benchHotKeyRow(b *testing.B, s *server.Server, row hotKeyRow) {
	n := row.workers
	var opts []NATSStoreOption
	if row.wake {
		opts = append(opts, WithWakeUps(""))
	}
	policy := Policy{Key: []string{"tenant", "/tenant"}, MaxActive: 1, MaxQueuedPerKey: n}
	service, payload := benchService(), benchPayload(0)
	var contention, waits atomic.Int64
	var wakes benchWakes // the counts when the timer started
	type proc struct {
		jt *JobType
		r  *Runner
	}
	procs := map[*benchConn]proc{}
	order := newBenchOrder()
	// admits[w] are worker w's Admit call durations: how long an
	// admission takes on the hot key (a process starved by another that
	// keeps winning shows in the tail).
	admits := make([][]time.Duration, n)
	procConns := benchParallelConns(b, s, n, row.conns, opts, "cycles/s", func(ctx context.Context, w *benchConn, worker int) func(int) error {
		p, ok := procs[w]
		if !ok {
			jt, err := w.coord.JobType(service, benchJobType, policy)
			require.NoError(b, err)
			wt, err := NewWatcher(w.store)
			require.NoError(b, err)
			b.Cleanup(wt.Close)
			r, err := NewRunner(jt, &RunnerConfig{Watcher: wt, OnBlocked: func(string, Acquisition) { waits.Add(1) }})
			require.NoError(b, err)
			p = proc{jt: jt, r: r}
			procs[w] = p
		}
		admit := func(jobID string) ([]QueuedJob, error) {
			began := time.Now()
			adm, err := p.jt.Admit(ctx, jobID, payload)
			admits[worker] = append(admits[worker], time.Since(began))
			if err != nil {
				return nil, fmt.Errorf("admit %s: %w", jobID, err)
			}
			if adm.Kind != KindAccepted {
				return nil, fmt.Errorf("admit %s: %s %s", jobID, adm.Kind, adm.Reason)
			}
			return benchAhead(adm.State, jobID), nil
		}
		// With row.pipelined, next is the worker's job admitted by its
		// previous cycle's handler, and its place in the queue then.
		var next string
		var nextAhead []QueuedJob
		var seq int
		cycle := func(jobID string, warm bool) error {
			var ahead []QueuedJob
			var err error
			if !row.pipelined || next == "" {
				ahead, err = admit(jobID)
			} else {
				jobID, ahead = next, nextAhead
			}
			if err != nil {
				return err
			}
			var admitErr error
			res, err := p.r.Run(ctx, jobID, payload, func(context.Context, Lease) error {
				order.start(jobID, ahead)
				if row.pipelined && !warm {
					seq++
					next = fmt.Sprintf("job-%d-p%d", worker, seq)
					nextAhead, admitErr = admit(next)
				}
				return nil
			})
			if err == nil {
				err = admitErr
			}
			if errors.Is(err, ErrContention) {
				contention.Add(1)
			}
			if err != nil {
				return fmt.Errorf("run %s: %w", jobID, err)
			}
			if res.Release != KindReleased {
				return fmt.Errorf("run %s: release %s", jobID, res.Release)
			}
			return nil
		}
		// The warm-up admits no next job: it would wait, unrun, ahead of
		// the warm-ups of the workers after it.
		if err := cycle(fmt.Sprintf("warmup-%d", worker), true); err != nil {
			b.Fatal(err)
		}
		return func(i int) error { return cycle(fmt.Sprintf("job-%d-%d", worker, i), false) }
	}, func(conns []*benchConn) {
		benchNoBatch(conns)
		for _, c := range conns {
			c.totals.reads.Store(0)
			c.totals.writes.Store(0)
			c.rechecks.reset()
		}
		waits.Store(0)
		wakes = benchWakeCounts(conns)
		order.reset()
		for w := range admits {
			admits[w] = admits[w][:0] // not the warm-up's
		}
	})
	var reads, writes, rechecks int64
	for _, c := range procConns {
		reads += c.totals.reads.Load()
		writes += c.totals.writes.Load()
		rechecks += c.rechecks.count()
	}
	perCycle := func(v float64) float64 { return v / float64(b.N) }
	b.ReportMetric(perCycle(float64(reads)), "reads/cycle")
	b.ReportMetric(perCycle(float64(writes)), "writes/cycle")
	b.ReportMetric(perCycle(float64(waits.Load())), "waits/cycle")
	b.ReportMetric(perCycle(float64(rechecks)), "rechecks/cycle")
	if row.wake {
		w := benchWakeCounts(procConns).since(wakes)
		b.ReportMetric(perCycle(w.published), "wakes-published/cycle")
		b.ReportMetric(perCycle(w.local), "wakes-local/cycle")
		b.ReportMetric(perCycle(w.noResponders), "wakes-503/cycle")
		b.ReportMetric(perCycle(w.retried), "wakes-retried/cycle")
		b.ReportMetric(perCycle(w.received), "wakes-received/cycle")
		b.ReportMetric(w.dropped, "wakes-dropped")
		b.ReportMetric(w.malformed, "wakes-malformed")
	}
	b.ReportMetric(float64(contention.Load()), "contention-errors")
	b.ReportMetric(float64(order.outOfOrder)/float64(b.N), "out-of-order/cycle")
	if all := slices.Concat(admits...); len(all) > 0 {
		slices.Sort(all)
		at := func(q float64) float64 {
			return float64(all[min(len(all)-1, int(q*float64(len(all))))].Nanoseconds()) / 1e3
		}
		b.ReportMetric(at(0.5), "admit-p50-µs")
		b.ReportMetric(at(0.99), "admit-p99-µs")
	}
}

// benchOrder counts the starts of a hot key's jobs that came out of queue
// order: a job started while a job queued ahead of it at its admission
// had not started yet. With MaxActive 1 the handlers run one at a time,
// so the order they start in is the order of the acquisitions.
type benchOrder struct {
	mu         sync.Mutex
	started    map[string]struct{}
	outOfOrder int
}

func newBenchOrder() *benchOrder { return &benchOrder{started: make(map[string]struct{})} }

// start records job jobID's start; ahead are the jobs queued ahead of it
// at its admission.
func (o *benchOrder) start(jobID string, ahead []QueuedJob) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for i := range ahead {
		if _, ok := o.started[ahead[i].JobID]; !ok {
			o.outOfOrder++
			break
		}
	}
	o.started[jobID] = struct{}{}
}

// reset forgets the count (of the warm-up), not the jobs started.
func (o *benchOrder) reset() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.outOfOrder = 0
}

// benchAhead returns the jobs st (an admission's new state, immutable)
// has queued ahead of jobID.
func benchAhead(st *KeyState, jobID string) []QueuedJob {
	if st == nil {
		return nil
	}
	if i := indexQueued(st.Queued, jobID); i > 0 {
		return st.Queued[:i]
	}
	return nil
}

// benchParallel runs b.N ops over n workers, each with its own connection,
// or all on one when shared, and reports ops per second under unit and
// round trips per op. setup runs before the timer starts and returns the
// worker's op, then beforeTimer once with the connections. It returns the
// connections used.
func benchParallel(b *testing.B, s *server.Server, n int, shared bool, unit string, setup func(ctx context.Context, w *benchConn, worker int) func(i int) error, beforeTimer ...func([]*benchConn)) []*benchConn {
	k := n
	if shared {
		k = 1
	}
	return benchParallelConns(b, s, n, k, nil, unit, setup, beforeTimer...)
}

// benchParallelConns is benchParallel with the n workers spread evenly over
// k connections (k processes), whose stores are made with opts (see
// benchConnect).
func benchParallelConns(b *testing.B, s *server.Server, n, k int, opts []NATSStoreOption, unit string, setup func(ctx context.Context, w *benchConn, worker int) func(i int) error, beforeTimer ...func([]*benchConn)) []*benchConn {
	ctx := context.Background()
	var conns []*benchConn
	ops := make([]func(int) error, n)
	for i := range ops {
		if c := i * k / n; c == len(conns) {
			conns = append(conns, benchConnect(b, s, opts...))
		}
		ops[i] = setup(ctx, conns[len(conns)-1], i)
	}
	for _, f := range beforeTimer {
		f(conns)
	}
	var start uint64
	for _, c := range conns {
		start += c.requests()
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, n)
	b.ReportAllocs()
	b.ResetTimer()
	for w := range n {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= b.N {
					return
				}
				if err := ops[w](i); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	close(errs)
	for err := range errs {
		b.Error(err)
	}
	var end uint64
	for _, c := range conns {
		end += c.requests()
	}
	benchReportRate(b, unit)
	b.ReportMetric(float64(end-start)/float64(b.N), "rt/op")
	return conns
}

// benchContended runs n workers on one key with MaxActive 4 and a queue
// long enough for every worker's job. Each worker loops admit → acquire
// (retrying while blocked) → release. shared puts all workers on one
// connection and coordinator (one process); otherwise each has its own (n
// processes). Any error, ErrContention included, fails the benchmark.
func benchContended(b *testing.B, s *server.Server, n int, shared bool) {
	policy := Policy{Key: []string{"tenant", "/tenant"}, MaxActive: 4, MaxQueuedPerKey: n}
	service, payload := benchService(), benchPayload(0)
	var contention, blocked atomic.Int64
	var races benchRaces
	benchParallel(b, s, n, shared, "cycles/s", func(ctx context.Context, w *benchConn, worker int) func(int) error {
		if err := benchCycle(ctx, w.coord, service, policy, payload, fmt.Sprintf("warmup-%d", worker)); err != nil {
			b.Fatal(err)
		}
		rng := mrand.New(mrand.NewPCG(uint64(worker), 1))
		return func(i int) error {
			jobID := fmt.Sprintf("job-%d-%d", worker, i)
			err := benchContendedCycle(ctx, w.coord, service, policy, payload, jobID, rng, &blocked, &races)
			if errors.Is(err, ErrContention) {
				contention.Add(1)
			}
			return err
		}
	})
	var lost [len(races.lost)]int64
	for i := range lost {
		lost[i] = races.lost[i].Load()
	}
	b.Logf("%d cycles: operations by races lost (0, 1, 2, ... %d+): %v", b.N, len(lost)-1, lost)
	b.ReportMetric(float64(contention.Load()), "contention-errors")
	b.ReportMetric(float64(blocked.Load())/float64(b.N), "blocked/op")
	b.ReportMetric(float64(races.conflicts.Load())/float64(b.N), "conflicts/op")
	b.ReportMetric(float64(races.staleGuesses.Load())/float64(b.N), "stale-guesses/op")
	b.ReportMetric(float64(races.maxConflicts.Load()), "max-conflicts")
	if contention.Load() != 0 {
		b.Errorf("%d cycles failed with ErrContention", contention.Load())
	}
}

// benchRaces sums what the operations of a benchmark met at the store
// (see countingStore).
type benchRaces struct {
	conflicts, staleGuesses, maxConflicts atomic.Int64
	lost                                  [16]atomic.Int64 // operations by races lost; the last bucket: that many or more
}

// op returns ctx with a counter for one operation, and the function that
// adds the operation's counts once it returned.
func (s *benchRaces) op(ctx context.Context) (context.Context, func()) {
	ctx, rc := withRaceCounter(ctx)
	return ctx, func() {
		lost, stale := rc.counts()
		s.conflicts.Add(int64(lost))
		s.staleGuesses.Add(int64(stale))
		s.lost[min(lost, len(s.lost)-1)].Add(1)
		for {
			m := s.maxConflicts.Load()
			if int64(lost) <= m || s.maxConflicts.CompareAndSwap(m, int64(lost)) {
				return
			}
		}
	}
}

func benchContendedCycle(ctx context.Context, c *KeyCoordinator, service string, p Policy, payload []byte, jobID string, rng *mrand.Rand, blocked *atomic.Int64, races *benchRaces) error {
	octx, done := races.op(ctx)
	adm, err := c.Admit(octx, AdmitRequest{Service: service, JobType: benchJobType, JobID: jobID, Payload: payload, Policy: p})
	done()
	if err != nil {
		return fmt.Errorf("admit %s: %w", jobID, err)
	}
	if adm.Kind != KindAccepted {
		return fmt.Errorf("admit %s: %s %s", jobID, adm.Kind, adm.Reason)
	}
	wait := 100 * time.Microsecond
	for {
		octx, done := races.op(ctx)
		acq, err := c.Acquire(octx, AcquireRequest{Service: service, JobType: benchJobType, JobID: jobID, Payload: payload, Policy: p})
		done()
		if err != nil {
			return fmt.Errorf("acquire %s: %w", jobID, err)
		}
		if acq.Kind == KindAcquired {
			octx, done := races.op(ctx)
			rel, err := c.Release(octx, ReleaseRequest{Lease: acq.Lease})
			done()
			if err != nil {
				return fmt.Errorf("release %s: %w", jobID, err)
			}
			if rel.Kind != KindReleased {
				return fmt.Errorf("release %s: %s", jobID, rel.Kind)
			}
			return nil
		}
		if acq.Reason != ReasonActiveLimit {
			return fmt.Errorf("acquire %s: %s %s", jobID, acq.Kind, acq.Reason)
		}
		// Blocked: a worker without wake-on-release polls, with jittered
		// exponential backoff up to 2ms.
		blocked.Add(1)
		time.Sleep(time.Duration(rng.Int64N(int64(wait))) + wait/2)
		wait = min(2*wait, 2*time.Millisecond)
	}
}

// BenchmarkRawKV is the baseline: per op, three sequential kv.Get +
// kv.Update pairs on one key, over the same kind of connection and bucket
// as BenchmarkCycle. The value is a one-slot key state.
func BenchmarkRawKV(b *testing.B) {
	s := natstest.Run(b)
	value := benchStateBytes(b, 0)
	b.Run("1worker", func(b *testing.B) {
		benchParallel(b, s, 1, false, "cycles/s", func(ctx context.Context, w *benchConn, worker int) func(int) error {
			return benchRawOp(ctx, b, w, benchService(), "k", value)
		})
	})
	b.Run("16workers-16keys", func(b *testing.B) {
		service := benchService()
		benchParallel(b, s, 16, false, "cycles/s", func(ctx context.Context, w *benchConn, worker int) func(int) error {
			return benchRawOp(ctx, b, w, service, "k"+strconv.Itoa(worker), value)
		})
	})
}

// benchRawWrites is the op of the rawKV-3writes rows of BenchmarkCycle:
// three kv.Update calls of value on key, each on the revision the one
// before it returned, with a kv.Watch of key consuming every update.
func benchRawWrites(ctx context.Context, b *testing.B, w *benchConn, service, key string, value []byte) func(int) error {
	kv, err := w.store.KeyValue(ctx, service)
	require.NoError(b, err)
	rev, err := kv.Put(ctx, key, value)
	require.NoError(b, err)
	watch, err := kv.Watch(ctx, key, jetstream.UpdatesOnly())
	require.NoError(b, err)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range watch.Updates() {
		}
	}()
	b.Cleanup(func() {
		assert.NoError(b, watch.Stop())
		<-done
	})
	return func(int) error {
		for range 3 {
			if rev, err = kv.Update(ctx, key, value, rev); err != nil {
				return err
			}
		}
		return nil
	}
}

func benchRawOp(ctx context.Context, b *testing.B, w *benchConn, service, key string, value []byte) func(int) error {
	kv, err := w.store.KeyValue(ctx, service)
	require.NoError(b, err)
	if _, err := kv.Put(ctx, key, value); err != nil {
		b.Fatal(err)
	}
	return func(int) error {
		for range 3 {
			e, err := kv.Get(ctx, key)
			if err != nil {
				return err
			}
			if _, err := kv.Update(ctx, key, value, e.Revision()); err != nil {
				return err
			}
		}
		return nil
	}
}

// BenchmarkRenew measures renew-only heartbeats: one op is one Renew of a
// held lease.
func BenchmarkRenew(b *testing.B) {
	s := natstest.Run(b)
	for _, n := range []int{1, 16} {
		b.Run(fmt.Sprintf("NATS/%dworkers-%dkeys", n, n), func(b *testing.B) {
			service := benchService()
			policy := benchPolicy
			benchParallel(b, s, n, false, "renews/s", func(ctx context.Context, w *benchConn, worker int) func(int) error {
				payload := benchPayload(worker)
				jobID := "job-" + strconv.Itoa(worker)
				if _, err := w.coord.Admit(ctx, AdmitRequest{Service: service, JobType: benchJobType, JobID: jobID, Payload: payload, Policy: policy}); err != nil {
					b.Fatal(err)
				}
				acq, err := w.coord.Acquire(ctx, AcquireRequest{Service: service, JobType: benchJobType, JobID: jobID, Payload: payload, Policy: policy})
				if err != nil || acq.Kind != KindAcquired {
					b.Fatalf("acquire: %v %v", acq.Kind, err)
				}
				return func(int) error {
					r, err := w.coord.Renew(ctx, RenewRequest{Lease: acq.Lease})
					if err == nil && r.Kind != KindRenewed {
						err = fmt.Errorf("renew: %s", r.Kind)
					}
					return err
				}
			})
		})
	}
}

// benchQueuedState returns a state with one active slot and queued queued
// jobs, as Acquire and Admit would write it.
func benchQueuedState(tb testing.TB, queued int) (*KeyState, JobKey, Policy) {
	tb.Helper()
	policy, err := Policy{Key: benchPolicy.Key, MaxActive: 4, MaxQueuedPerKey: 2000}.Normalize()
	require.NoError(tb, err)
	key, err := DeriveKey("bench", benchJobType, benchPayload(0), policy.Key)
	require.NoError(tb, err)
	now := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	var st *KeyState
	for i := range queued + 1 {
		out := ReduceAdmission(st, key, AdmitRequest{JobID: fmt.Sprintf("queued-%08d", i)}, policy, now)
		if out.Kind != KindAccepted {
			tb.Fatalf("admit %d: %s", i, out.Kind)
		}
		st = out.State
	}
	acq := ReduceAcquire(st, key, AcquireRequest{JobID: "queued-00000000", InstanceID: "host-1"}, policy, now, newUUID())
	if acq.Kind != KindAcquired {
		tb.Fatalf("acquire: %s %s", acq.Kind, acq.Reason)
	}
	return acq.State, key, policy
}

func benchStateBytes(tb testing.TB, queued int) []byte {
	st, _, _ := benchQueuedState(tb, queued)
	return appendState(nil, st)
}

var benchQueueLengths = []int{0, 10, 100, 1000}

// BenchmarkReduce measures the pure reducers on a state with one active
// slot and n queued jobs.
func BenchmarkReduce(b *testing.B) {
	now := time.Date(2025, 1, 2, 3, 4, 6, 0, time.UTC)
	for _, n := range benchQueueLengths {
		st, key, policy := benchQueuedState(b, n)
		size := float64(len(appendState(nil, st)))
		b.Run(fmt.Sprintf("Admission/queued=%d", n), func(b *testing.B) {
			req := AdmitRequest{JobID: "new-job"}
			b.ReportAllocs()
			for b.Loop() {
				if out := ReduceAdmission(st, key, req, policy, now); out.Kind != KindAccepted {
					b.Fatal(out.Kind)
				}
			}
			b.ReportMetric(size, "state-B")
		})
		b.Run(fmt.Sprintf("Acquire/queued=%d", n), func(b *testing.B) {
			req := AcquireRequest{JobID: "retry-job", Retry: true, InstanceID: "host-2"}
			if n > 0 {
				req = AcquireRequest{JobID: st.Queued[len(st.Queued)/2].JobID, InstanceID: "host-2"}
			}
			token := newUUID()
			b.ReportAllocs()
			for b.Loop() {
				if out := ReduceAcquire(st, key, req, policy, now, token); out.Kind != KindAcquired {
					b.Fatal(out.Kind, out.Reason)
				}
			}
			b.ReportMetric(size, "state-B")
		})
		b.Run(fmt.Sprintf("Release/queued=%d", n), func(b *testing.B) {
			slot := st.Active[0]
			lease := Lease{JobID: slot.JobID, SlotToken: slot.SlotToken}
			b.ReportAllocs()
			for b.Loop() {
				if out := ReduceRelease(st, lease, now); out.Kind != KindReleased {
					b.Fatal(out.Kind)
				}
			}
			b.ReportMetric(size, "state-B")
		})
	}
}

// BenchmarkStateCodec measures encoding and decoding a key state with one
// active slot and n queued jobs: the CPU work of every read and write, and
// decoding on every core at once.
func BenchmarkStateCodec(b *testing.B) {
	for _, n := range benchQueueLengths {
		st, _, _ := benchQueuedState(b, n)
		data := appendState(nil, st)
		b.Run(fmt.Sprintf("Encode/queued=%d", n), func(b *testing.B) {
			var buf []byte
			b.ReportAllocs()
			b.SetBytes(int64(len(data)))
			for b.Loop() {
				buf = appendState(buf[:0], st)
			}
			b.ReportMetric(float64(len(data)), "state-B")
		})
		b.Run(fmt.Sprintf("Decode/queued=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(data)))
			for b.Loop() {
				if _, err := decodeState(data); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(len(data)), "state-B")
		})
		// Every woken waiter of a hot key decodes the same state at once.
		b.Run(fmt.Sprintf("DecodeParallel/queued=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(data)))
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := decodeState(data); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}

// BenchmarkCycleQueued measures one cycle (admit → acquire → release of a
// new job) on a key that already has n queued jobs waiting (and one
// active slot, so the queued jobs stay queued), over NATS with one worker.
func BenchmarkCycleQueued(b *testing.B) {
	s := natstest.Run(b)
	for _, n := range benchQueueLengths {
		b.Run(fmt.Sprintf("NATS/queued=%d", n), func(b *testing.B) {
			w := benchConnect(b, s)
			ctx, service, payload := context.Background(), benchService(), benchPayload(0)
			policy := Policy{Key: benchPolicy.Key, MaxActive: 2, MaxQueuedPerKey: 2000}
			// One job holds a slot; n wait behind it.
			for i := range n + 1 {
				adm, err := w.coord.Admit(ctx, AdmitRequest{Service: service, JobType: benchJobType, JobID: fmt.Sprintf("queued-%08d", i), Payload: payload, Policy: policy})
				if err != nil || adm.Kind != KindAccepted {
					b.Fatalf("preload %d: %s %v", i, adm.Kind, err)
				}
			}
			acq, err := w.coord.Acquire(ctx, AcquireRequest{Service: service, JobType: benchJobType, JobID: "queued-00000000", Payload: payload, Policy: policy})
			if err != nil || acq.Kind != KindAcquired {
				b.Fatalf("preload acquire: %s %v", acq.Kind, err)
			}
			// The cycling job takes the second slot by retry, ahead of the queue.
			b.ReportAllocs()
			start := w.requests()
			b.ResetTimer()
			for i := range b.N {
				if err := benchCycle(ctx, w.coord, service, policy, payload, "job-"+strconv.Itoa(i)); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			benchReportRate(b, "cycles/s")
			b.ReportMetric(float64(w.requests()-start)/float64(b.N), "rt/op")
			b.ReportMetric(float64(len(benchStateBytes(b, n))), "state-B")
		})
	}
}

// TestCoordinatorMemoryFlat runs a million cycles on a MemoryStore (and a
// shorter run over NATS) and checks that the heap after GC stays flat. It
// logs the curve. It runs only with JOBKEYS_MEM_SOAK=1:
//
//	JOBKEYS_MEM_SOAK=1 go test -run TestCoordinatorMemoryFlat -v -timeout 30m
//
// JOBKEYS_MEM_SOAK_CYCLES and JOBKEYS_MEM_SOAK_NATS_CYCLES override the
// cycle counts (defaults 1000000 and 100000; at least 100).
func TestCoordinatorMemoryFlat(t *testing.T) {
	if os.Getenv("JOBKEYS_MEM_SOAK") != "1" {
		t.Skip("set JOBKEYS_MEM_SOAK=1 to run the memory soak")
	}
	cycles := benchEnvInt(t, "JOBKEYS_MEM_SOAK_CYCLES", 1_000_000)
	natsCycles := benchEnvInt(t, "JOBKEYS_MEM_SOAK_NATS_CYCLES", 100_000)

	t.Run("Memory", func(t *testing.T) {
		c, err := NewCoordinator(NewMemoryStore(), nil)
		require.NoError(t, err)
		benchSoak(t, c, cycles)
	})
	t.Run("NATS", func(t *testing.T) {
		s := natstest.Run(t)
		_, js := natstest.Connect(t, s)
		store, err := NewNATSStore(js, WithCreateBuckets(jetstream.MemoryStorage, 1))
		require.NoError(t, err)
		c, err := NewCoordinator(store, nil)
		require.NoError(t, err)
		benchSoak(t, c, natsCycles)
	})
}

func benchEnvInt(t *testing.T, name string, def int) int {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 100 {
		t.Fatalf("%s=%q: want an integer >= 100", name, v)
	}
	return n
}

// benchSoak runs cycles over min(10,000, cycles/10) keys in turn (so the
// store holds a bounded key set while the coordinator sees ever new job
// ids and more keys than its table keeps), sampling HeapAlloc after GC ten
// times. The heap includes the store (and, over NATS, the embedded
// server). It fails if the heap grew by more than 4 MiB between the sample
// after the first pass over the keys and the end.
func benchSoak(t *testing.T, c *KeyCoordinator, cycles int) {
	keys := min(10_000, cycles/10)
	ctx, service := context.Background(), "soak"
	payloads := make([][]byte, keys)
	for i := range payloads {
		payloads[i] = benchPayload(i)
	}
	heap := func() uint64 {
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc
	}
	step := cycles / 10
	var samples []uint64
	start := time.Now()
	sample := func(i int) {
		h := heap()
		samples = append(samples, h)
		entries := c.keys.len()
		t.Logf("cycle %8d: HeapAlloc %7.2f MiB, %5d key table entries (%v)", i, float64(h)/(1<<20), entries, time.Since(start).Round(time.Millisecond))
	}
	for i := range cycles {
		if i%step == 0 {
			sample(i)
		}
		if err := benchCycle(ctx, c, service, benchPolicy, payloads[i%keys], "job-"+strconv.Itoa(i)); err != nil {
			t.Fatalf("cycle %d: %v", i, err)
		}
	}
	sample(cycles)
	base, final := samples[1], samples[len(samples)-1] // after the first pass over the keys
	if final > base+4<<20 {
		t.Errorf("heap grew from %d to %d bytes over %d cycles", base, final, cycles)
	}
	runtime.KeepAlive(c)
	runtime.KeepAlive(payloads)
}

// The tests below check the performance contracts the benchmarks rely on;
// they are quick and run by default.

// An uncontended cycle over NATS is three round trips: admit creates the
// key over the delete marker the previous release left (one conditional
// write, not kv.Create's three), acquire and release write on the state
// the coordinator remembers.
func TestCycleRoundTrips(t *testing.T) {
	t.Parallel()
	s := natstest.Run(t)
	ctx, service, payload := context.Background(), "roundtrips", benchPayload(0)
	nc, js := natstest.Connect(t, s)
	store, err := NewNATSStore(js, WithCreateBuckets(jetstream.MemoryStorage, 1))
	require.NoError(t, err)
	c, err := NewCoordinator(store, nil)
	require.NoError(t, err)
	require.NoError(t, benchCycle(ctx, c, service, benchPolicy, payload, "warmup"))
	const cycles = 20
	before := nc.Stats().OutMsgs
	for i := range cycles {
		require.NoError(t, benchCycle(ctx, c, service, benchPolicy, payload, "job-"+strconv.Itoa(i)))
	}
	if got := nc.Stats().OutMsgs - before; got != 3*cycles {
		t.Errorf("%d cycles sent %d requests, want %d", cycles, got, 3*cycles)
	}

	// Another process creates the key over the marker this store
	// remembers: admission here must queue behind its job, not overwrite it.
	_, js2 := natstest.Connect(t, s)
	other, err := NewNATSStore(js2)
	require.NoError(t, err)
	oc, err := NewCoordinator(other, nil)
	require.NoError(t, err)
	policy := Policy{Key: benchPolicy.Key, MaxQueuedPerKey: 5}
	admit := func(c *KeyCoordinator, jobID string) Admission {
		t.Helper()
		adm, err := c.Admit(ctx, AdmitRequest{Service: service, JobType: benchJobType, JobID: jobID, Payload: payload, Policy: policy})
		require.NoErrorf(t, err, "admit %s: %v %v", jobID, adm.Kind, err)
		require.Equalf(t, KindAccepted, adm.Kind, "admit %s: %v %v", jobID, adm.Kind, err)
		return adm
	}
	admit(oc, "held")
	adm := admit(c, "mine")
	if adm.State == nil || len(adm.State.Queued) != 2 || adm.State.Queued[0].JobID != "held" {
		t.Fatalf("admission over another process's key: %+v", adm.State)
	}
	value, _, err := store.Get(ctx, service, kvKeyFor(service, benchJobType, adm.KeyHash))
	require.NoError(t, err)
	if st, err := ParseState(value); err != nil || len(st.Queued) != 2 {
		t.Fatalf("stored state: %v %+v", err, st)
	}

	// This store deletes the key, the other recreates and deletes it: the
	// remembered marker is stale, and admission still creates the key.
	for _, rm := range []struct {
		c  *KeyCoordinator
		id string
	}{{oc, "held"}, {c, "mine"}} {
		out, err := rm.c.RemoveQueued(ctx, RemoveRequest{Service: service, JobType: benchJobType, JobID: rm.id, Payload: payload, Policy: policy})
		require.NoErrorf(t, err, "remove %s: %v %v", rm.id, out.Kind, err)
		require.Equalf(t, KindRemoved, out.Kind, "remove %s: %v %v", rm.id, out.Kind, err)
	}
	require.NoError(t, benchCycle(ctx, oc, service, benchPolicy, payload, "other"))
	require.NoError(t, benchCycle(ctx, c, service, benchPolicy, payload, "after-other"))
}

// Goroutines of one coordinator on one key never race each other: each
// operation starts from the state the one before it wrote.
func TestCoordinatorLanesNoSelfRaces(t *testing.T) {
	t.Parallel()
	ctx, service, payload := context.Background(), "lanes", benchPayload(0)
	store := NewMemoryStore()
	counting := newCountingStore(store)
	c, err := NewCoordinator(counting, nil)
	require.NoError(t, err)
	const workers, jobs = 16, 20
	policy := Policy{Key: benchPolicy.Key, MaxActive: 4, MaxQueuedPerKey: workers * jobs}
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Go(func() {
			for j := range jobs {
				adm, err := c.Admit(ctx, AdmitRequest{Service: service, JobType: benchJobType, JobID: fmt.Sprintf("job-%d-%d", w, j), Payload: payload, Policy: policy})
				if err == nil && adm.Kind != KindAccepted {
					err = fmt.Errorf("admit: %s %s", adm.Kind, adm.Reason)
				}
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	assert.Zero(t, counting.totals.lost.Load(), "lost races among goroutines of one coordinator")
	assert.Zero(t, counting.totals.stale.Load(), "stale guesses among goroutines of one coordinator")
	key, err := DeriveKey(service, benchJobType, payload, policy.Key)
	require.NoError(t, err)
	value, _, err := store.Get(ctx, service, key.KVKey)
	require.NoError(t, err)
	st, err := ParseState(value)
	require.NoError(t, err)
	if len(st.Queued) != workers*jobs {
		t.Errorf("%d jobs queued, want %d", len(st.Queued), workers*jobs)
	}
}

// A read does not hold the key's lane: while an acquisition that finds the
// slot taken waits for its read, the slot's holder can still renew.
func TestCoordinatorReadsOutsideLane(t *testing.T) {
	t.Parallel()
	ctx, service, payload := context.Background(), "readlane", benchPayload(0)
	// The store holds every Get until gate is closed, after signalling
	// entered.
	entered, gate := make(chan struct{}, 1), make(chan struct{})
	gated := newHookStore(NewMemoryStore(), passNone).withHook(func(ctx context.Context, c storeCall, call func() storeResult) storeResult {
		if c.op != opGet {
			return call()
		}
		select {
		case entered <- struct{}{}:
		default:
		}
		select {
		case <-gate:
		case <-ctx.Done():
			return storeResult{err: ctx.Err()}
		}
		return call()
	})
	c, err := NewCoordinator(gated, nil)
	require.NoError(t, err)
	policy := Policy{Key: benchPolicy.Key, MaxQueuedPerKey: 1}
	for _, id := range []string{"a", "b"} {
		if adm, err := c.Admit(ctx, AdmitRequest{Service: service, JobType: benchJobType, JobID: id, Payload: payload, Policy: policy}); err != nil || adm.Kind != KindAccepted {
			t.Fatalf("admit %s: %v %v", id, adm.Kind, err)
		}
	}
	acq, err := c.Acquire(ctx, AcquireRequest{Service: service, JobType: benchJobType, JobID: "a", Payload: payload, Policy: policy})
	require.NoErrorf(t, err, "acquire a: %v %v", acq.Kind, err)
	require.Equalf(t, KindAcquired, acq.Kind, "acquire a: %v %v", acq.Kind, err)
	type result struct {
		acq Acquisition
		err error
	}
	done := make(chan result, 1)
	go func() {
		b, err := c.Acquire(ctx, AcquireRequest{Service: service, JobType: benchJobType, JobID: "b", Payload: payload, Policy: policy})
		done <- result{b, err}
	}()
	<-entered // b checks the slot with a read
	renewCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	r, err := c.Renew(renewCtx, RenewRequest{Lease: acq.Lease})
	if err != nil || r.Kind != KindRenewed {
		t.Errorf("renew while another operation reads the key: %v %v", r.Kind, err)
	}
	close(gate)
	if res := <-done; res.err != nil || res.acq.Kind != KindBlocked {
		t.Errorf("acquire b: %v %v, want blocked", res.acq.Kind, res.err)
	}
}

// The backoff window doubles per lost race up to MaxRetryBackoff, halves
// per successful write down to zero, and is forgotten on a quiet key.
func TestCoordinatorBackoffWindow(t *testing.T) {
	t.Parallel()
	c, err := NewCoordinator(NewMemoryStore(), &Config{RetryBackoff: time.Microsecond, MaxRetryBackoff: 8 * time.Microsecond})
	require.NoError(t, err)
	ctx := context.Background()
	e := &keyEntry{}
	var grown []time.Duration
	for range 5 {
		require.NoError(t, keycache.SleepJitter(ctx, e.Lose(c.cfg.RetryBackoff, c.cfg.MaxRetryBackoff, time.Now())))
		grown = append(grown, e.Marks().Window)
	}
	var settled []time.Duration
	for range 4 {
		e.Commit(nil, 0, c.cfg.RetryBackoff)
		settled = append(settled, e.Marks().Window)
	}
	us := time.Microsecond
	assert.Equal(t, []time.Duration{2 * us, 4 * us, 8 * us, 8 * us, 8 * us}, grown, "window after lost races")
	assert.Equal(t, []time.Duration{4 * us, 2 * us, 1 * us, 0}, settled, "window after successful writes")

	// While a key's window is open, operations on it are paced: with an
	// hour-long window a call with a short deadline runs out of time. A key
	// whose last lost race is long past is cold: no pacing.
	payload := benchPayload(0)
	key, err := DeriveKey("window", benchJobType, payload, benchPolicy.Key)
	require.NoError(t, err)
	heat := func(lostAt time.Time) {
		e := c.keys.pin(key.KVKey)
		defer c.keys.unpin(key.KVKey, e)
		e.Lose(time.Hour, time.Hour, lostAt) // an hour-long window, last widened at lostAt
	}
	admit := func(timeout time.Duration, jobID string) error {
		ctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		_, err := c.Admit(ctx, AdmitRequest{Service: "window", JobType: benchJobType, JobID: jobID, Payload: payload, Policy: benchPolicy})
		return err
	}
	heat(time.Now())
	assert.ErrorIs(t, admit(50*time.Millisecond, "paced"), context.DeadlineExceeded, "admission on a key with an open hour-long window")
	heat(time.Now().Add(-keycache.WindowMemory*time.Hour - time.Second))
	assert.NoErrorf(t, admit(time.Minute, "cold"), "admission on a key quiet for %d windows", keycache.WindowMemory)
}

// The coordinator's per-key table stays within StateCacheSize idle
// entries however many keys pass through.
func TestCoordinatorKeyTableBounded(t *testing.T) {
	t.Parallel()
	const size, keys = 64, 1000
	c, err := NewCoordinator(NewMemoryStore(), &Config{StateCacheSize: size})
	require.NoError(t, err)
	ctx := context.Background()
	policy := Policy{Key: benchPolicy.Key, MaxQueuedPerKey: 1}
	for i := range keys {
		// Admit only, so every key keeps state the table could remember.
		adm, err := c.Admit(ctx, AdmitRequest{Service: "bounded", JobType: benchJobType, JobID: "j", Payload: benchPayload(i), Policy: policy})
		require.NoErrorf(t, err, "admit %d: %v %v", i, adm.Kind, err)
		require.Equalf(t, KindAccepted, adm.Kind, "admit %d: %v %v", i, adm.Kind, err)
	}
	n := c.keys.len()
	assert.LessOrEqualf(t, n, size, "entries after %d keys", keys)
}

// BenchmarkUncontended measures the uncontended cycle (one worker, one key,
// admit → acquire → release: three compare-and-swap writes) beside three
// bare writes in the same run (issue 11's target: the cycle at ≥ 0.85× of
// three bare kv.Update calls, client CPU within 1.3× of theirs):
//
//   - JobType: the cycle through a [JobType] handle;
//   - requests: the cycle through the request-struct methods
//     (BenchmarkCycle/NATS/1worker);
//   - store-3updates: three NATSStore.Update calls on the revision the last
//     one returned (the store's write path without the coordinator);
//   - rawKV-3updates: three bare kv.Update calls (nats.go's KV layer);
//   - conn-3requests: three requests on the connection carrying the same
//     message kv.Update sends, with the reply's sequence read by hand (the
//     round trip with no KV layer: what the KV layer costs is the
//     difference to rawKV-3updates).
//
// Each row reports cpu-µs/op, the process's CPU time (user and system) per
// op. With the server embedded that includes the server's CPU; set
// JOBKEYS_BENCH_NATS_URL to a standalone nats-server (JetStream enabled)
// to measure the client alone.
func BenchmarkUncontended(b *testing.B) {
	url := os.Getenv("JOBKEYS_BENCH_NATS_URL")
	if url == "" {
		url = natstest.Run(b).ClientURL()
	}
	// A standalone server keeps the buckets of earlier runs.
	u := &uncontended{url: url, run: strconv.FormatInt(time.Now().UnixNano(), 36), ctx: context.Background(),
		payload: benchPayload(0), value: benchStateBytes(b, 0)}
	connect, service, ctx, payload, value := u.connect, u.service, u.ctx, u.payload, u.value

	b.Run("NATS/JobType", u.jobType)
	b.Run("NATS/paired", u.paired)
	b.Run("NATS/paired-writes", u.pairedWrites)
	b.Run("NATS/requests", func(b *testing.B) {
		_, _, coord := connect(b)
		svc := service()
		require.NoError(b, benchCycle(ctx, coord, svc, benchPolicy, payload, "warmup"))
		benchCPU(b, func(i int) error {
			return benchCycle(ctx, coord, svc, benchPolicy, payload, "job-"+strconv.Itoa(i))
		})
	})
	b.Run("NATS/store-3updates", func(b *testing.B) {
		_, store, _ := connect(b)
		svc := service()
		rev, err := store.Create(ctx, svc, "k", value)
		require.NoError(b, err)
		benchCPU(b, func(int) error {
			for range 3 {
				if rev, err = store.Update(ctx, svc, "k", value, rev); err != nil {
					return err
				}
			}
			return nil
		})
	})
	b.Run("NATS/rawKV-3updates", func(b *testing.B) {
		_, store, _ := connect(b)
		kv, err := store.KeyValue(ctx, service())
		require.NoError(b, err)
		rev, err := kv.Create(ctx, "k", value)
		require.NoError(b, err)
		benchCPU(b, func(int) error {
			for range 3 {
				if rev, err = kv.Update(ctx, "k", value, rev); err != nil {
					return err
				}
			}
			return nil
		})
	})
	b.Run("NATS/conn-3requests", func(b *testing.B) {
		nc, store, _ := connect(b)
		kv, err := store.KeyValue(ctx, service())
		require.NoError(b, err)
		rev, err := kv.Create(ctx, "k", value)
		require.NoError(b, err)
		subject := "$KV." + kv.Bucket() + ".k"
		benchCPU(b, func(int) error {
			for range 3 {
				m := &nats.Msg{Subject: subject, Data: value,
					Header: nats.Header{jetstream.ExpectedLastSubjSeqHeader: []string{strconv.FormatUint(rev, 10)}}}
				rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				resp, err := nc.RequestMsgWithContext(rctx, m)
				cancel()
				if err != nil {
					return err
				}
				if rev, err = benchAckSeq(resp.Data); err != nil {
					return err
				}
			}
			return nil
		})
	})
}

// uncontended is what the rows of BenchmarkUncontended share: the server's
// URL, a run id for the names of buckets (a standalone server keeps those
// of earlier runs), and the payload and state value the rows write.
type uncontended struct {
	url     string
	run     string
	ctx     context.Context
	payload []byte
	value   []byte
}

// connect makes a connection, a store over it that creates its buckets,
// and a coordinator over the store.
func (u *uncontended) connect(b *testing.B) (*nats.Conn, *NATSStore, *KeyCoordinator) {
	nc, js := natstest.ConnectURL(b, u.url)
	store, err := NewNATSStore(js, WithCreateBuckets(jetstream.MemoryStorage, 1))
	require.NoError(b, err)
	coord, err := NewCoordinator(store, nil)
	require.NoError(b, err)
	return nc, store, coord
}

// service returns a service name of this run no other row uses.
func (u *uncontended) service() string { return benchService() + "-" + u.run }

// jobType is the row NATS/JobType: admit, acquire and release through a
// JobType handle.
func (u *uncontended) jobType(b *testing.B) {
	_, _, coord := u.connect(b)
	jt, err := coord.JobType(u.service(), benchJobType, benchPolicy)
	require.NoError(b, err)
	cycle := func(jobID string) error {
		adm, err := jt.Admit(u.ctx, jobID, u.payload)
		if err != nil {
			return err
		}
		if adm.Kind != KindAccepted || adm.AlreadyPresent {
			return fmt.Errorf("admit %s: %s %s", jobID, adm.Kind, adm.Reason)
		}
		acq, err := jt.Acquire(u.ctx, jobID, u.payload)
		if err != nil {
			return err
		}
		if acq.Kind != KindAcquired {
			return fmt.Errorf("acquire %s: %s %s", jobID, acq.Kind, acq.Reason)
		}
		rel, err := jt.Release(u.ctx, acq.Lease)
		if err != nil {
			return err
		}
		if rel.Kind != KindReleased {
			return fmt.Errorf("release %s: %s", jobID, rel.Kind)
		}
		return nil
	}
	require.NoError(b, cycle("warmup"))
	benchCPU(b, func(i int) error { return cycle("job-" + strconv.Itoa(i)) })
}

// paired is the row NATS/paired: each op runs one JobType cycle and then
// three bare kv.Update calls, timing each half (wall clock and process
// CPU), so that both see the same load on a shared machine; it reports the
// cycle's rate relative to the three updates' (cycle/raw-rate) and the
// cycle's CPU relative to theirs (cycle/raw-cpu).
func (u *uncontended) paired(b *testing.B) {
	_, store, coord := u.connect(b)
	jt, err := coord.JobType(u.service(), benchJobType, benchPolicy)
	require.NoError(b, err)
	kv, err := store.KeyValue(u.ctx, u.service())
	require.NoError(b, err)
	rev, err := kv.Create(u.ctx, "k", u.value)
	require.NoError(b, err)
	cycle := func(jobID string) error {
		if _, err := jt.Admit(u.ctx, jobID, u.payload); err != nil {
			return err
		}
		acq, err := jt.Acquire(u.ctx, jobID, u.payload)
		if err != nil {
			return err
		}
		if acq.Kind != KindAcquired {
			return fmt.Errorf("acquire %s: %s %s", jobID, acq.Kind, acq.Reason)
		}
		rel, err := jt.Release(u.ctx, acq.Lease)
		if err == nil && rel.Kind != KindReleased {
			err = fmt.Errorf("release %s: %s", jobID, rel.Kind)
		}
		return err
	}
	require.NoError(b, cycle("warmup"))
	var cycleWall, rawWall, cycleCPU, rawCPU time.Duration
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		t0, c0 := time.Now(), benchProcessCPU(b)
		if err := cycle("job-" + strconv.Itoa(i)); err != nil {
			b.Fatal(err)
		}
		t1, c1 := time.Now(), benchProcessCPU(b)
		for range 3 {
			if rev, err = kv.Update(u.ctx, "k", u.value, rev); err != nil {
				b.Fatal(err)
			}
		}
		t2, c2 := time.Now(), benchProcessCPU(b)
		cycleWall, rawWall = cycleWall+t1.Sub(t0), rawWall+t2.Sub(t1)
		cycleCPU, rawCPU = cycleCPU+c1-c0, rawCPU+c2-c1
	}
	b.StopTimer()
	b.ReportMetric(float64(rawWall)/float64(cycleWall), "cycle/raw-rate")
	b.ReportMetric(float64(cycleCPU)/float64(rawCPU), "cycle/raw-cpu")
	b.ReportMetric(float64(cycleCPU.Microseconds())/float64(b.N), "cycle-cpu-µs")
	b.ReportMetric(float64(rawCPU.Microseconds())/float64(b.N), "raw-cpu-µs")
}

// pairedWrites is the row NATS/paired-writes: each op is three writes by
// each of NATSStore.Update, kv.Update and a request on the connection (as
// conn-3requests), each third timed on its own: what the KV layer and the
// store cost per write beyond the round trip, under the same load.
func (u *uncontended) pairedWrites(b *testing.B) {
	nc, store, _ := u.connect(b)
	svc := u.service()
	kv, err := store.KeyValue(u.ctx, svc)
	require.NoError(b, err)
	storeRev, err := store.Create(u.ctx, svc, "s", u.value)
	require.NoError(b, err)
	kvRev, err := kv.Create(u.ctx, "k", u.value)
	require.NoError(b, err)
	connRev, err := kv.Create(u.ctx, "c", u.value)
	require.NoError(b, err)
	subject := "$KV." + kv.Bucket() + ".c"
	var cpu [3]time.Duration
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		c0 := benchProcessCPU(b)
		for range 3 {
			if storeRev, err = store.Update(u.ctx, svc, "s", u.value, storeRev); err != nil {
				b.Fatal(err)
			}
		}
		c1 := benchProcessCPU(b)
		for range 3 {
			if kvRev, err = kv.Update(u.ctx, "k", u.value, kvRev); err != nil {
				b.Fatal(err)
			}
		}
		c2 := benchProcessCPU(b)
		for range 3 {
			m := &nats.Msg{Subject: subject, Data: u.value,
				Header: nats.Header{jetstream.ExpectedLastSubjSeqHeader: []string{strconv.FormatUint(connRev, 10)}}}
			rctx, cancel := context.WithTimeout(u.ctx, 5*time.Second)
			resp, err := nc.RequestMsgWithContext(rctx, m)
			cancel()
			if err != nil {
				b.Fatal(err)
			}
			if connRev, err = benchAckSeq(resp.Data); err != nil {
				b.Fatal(err)
			}
		}
		c3 := benchProcessCPU(b)
		cpu[0], cpu[1], cpu[2] = cpu[0]+c1-c0, cpu[1]+c2-c1, cpu[2]+c3-c2
	}
	b.StopTimer()
	per := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 / float64(3*b.N) }
	b.ReportMetric(per(cpu[0]), "store-cpu-µs/write")
	b.ReportMetric(per(cpu[1]), "kv-cpu-µs/write")
	b.ReportMetric(per(cpu[2]), "conn-cpu-µs/write")
}

// benchAckSeq returns the "seq" of a publish ack, read by hand.
func benchAckSeq(ack []byte) (uint64, error) {
	const field = `"seq":`
	for i := 0; i+len(field) <= len(ack); i++ {
		if string(ack[i:i+len(field)]) != field {
			continue
		}
		j := i + len(field)
		var n uint64
		for ; j < len(ack) && ack[j] >= '0' && ack[j] <= '9'; j++ {
			n = n*10 + uint64(ack[j]-'0')
		}
		return n, nil
	}
	return 0, fmt.Errorf("publish ack without a sequence: %s", ack)
}

// benchCPU runs op b.N times and reports ops per second and the process's
// CPU time per op (see BenchmarkUncontended).
func benchCPU(b *testing.B, op func(i int) error) {
	b.ReportAllocs()
	cpu0 := benchProcessCPU(b)
	b.ResetTimer()
	for i := range b.N {
		if err := op(i); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	benchReportRate(b, "ops/s")
	b.ReportMetric(float64((benchProcessCPU(b)-cpu0).Microseconds())/float64(b.N), "cpu-µs/op")
}

// benchProcessCPU returns the user and system CPU time the process used.
func benchProcessCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	require.NoError(b, syscall.Getrusage(syscall.RUSAGE_SELF, &ru))
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// The hot-key rows' rechecks/cycle counts the tries of a waiting Run that
// its recheck started, and not those a change of the key woke: a Run
// waiting with a short RecheckInterval is counted, one woken by the
// release of the slot it waits for is not.
func TestBenchRecheckStoreCounts(t *testing.T) {
	t.Parallel()
	ctx, payload := context.Background(), benchPayload(0)
	policy := Policy{Key: benchPolicy.Key, MaxActive: 1, MaxQueuedPerKey: 4}
	for _, tc := range []struct {
		name     string
		interval time.Duration
		woken    bool // the wait ends by the release, not by a recheck
	}{
		{"rechecks", 5 * time.Millisecond, false},
		{"woken", time.Hour, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			mem := NewMemoryStore()
			rs, rechecks := newBenchRecheckStore(newCountingStore(mem))
			coord, err := NewCoordinator(rs, nil)
			require.NoError(t, err)
			coord.tryContext = benchTryContext
			jt, err := coord.JobType("recheck-"+tc.name, benchJobType, policy)
			require.NoError(t, err)
			wt, err := NewWatcher(mem)
			require.NoError(t, err)
			defer wt.Close()
			blocked := make(chan struct{})
			r, err := NewRunner(jt, &RunnerConfig{Watcher: wt, RecheckInterval: tc.interval,
				OnBlocked: func(string, Acquisition) { close(blocked) }})
			require.NoError(t, err)
			for _, id := range []string{"holder", "waiter"} {
				adm, err := jt.Admit(ctx, id, payload)
				require.NoError(t, err)
				require.Equal(t, KindAccepted, adm.Kind, "admit %s", id)
			}
			held, err := jt.Acquire(ctx, "holder", payload)
			require.NoError(t, err)
			require.Equal(t, KindAcquired, held.Kind)
			done := make(chan error, 1)
			go func() {
				_, err := r.Run(ctx, "waiter", payload, func(context.Context, Lease) error { return nil })
				done <- err
			}()
			<-blocked
			if !tc.woken {
				require.Eventually(t, func() bool { return rechecks.count() >= 2 }, time.Minute, time.Millisecond,
					"a Run waiting with RecheckInterval %v", tc.interval)
			}
			rel, err := jt.Release(ctx, held.Lease)
			require.NoError(t, err)
			require.Equal(t, KindReleased, rel.Kind)
			require.NoError(t, <-done)
			if tc.woken {
				assert.Zero(t, rechecks.count(), "rechecks of a Run woken by the release")
			}
		})
	}
}

// benchFakeWakes records the wake-up calls made to it (a wakeStore with
// wake-ups on). It is no Store: a hookStore carries it as its wake-ups.
type benchFakeWakes struct {
	published []string // "service kvKey rev free targets..."
	delivered func(value []byte, rev uint64)
}

func (s *benchFakeWakes) wakeUps() bool { return true }

func (s *benchFakeWakes) publishWakes(service, kvKey string, value []byte, rev uint64, targets []string, free int) {
	s.published = append(s.published, fmt.Sprint(service, " ", kvKey, " ", string(value), " ", rev, " ", free, " ", targets))
}

func (s *benchFakeWakes) subscribeWake(service, kvKey, jobID string, fn func(value []byte, rev uint64)) (func(), error) {
	s.delivered = fn
	return func() { s.delivered = nil }, nil
}

// A countingStore (and the benchmarks' recheck store over it,
// newBenchRecheckStore) passes the wake-ups of the store it wraps through,
// and has none over a store without them.
func TestCountingStoreForwardsWakes(t *testing.T) {
	t.Parallel()
	fake := &benchFakeWakes{}
	wakeful := newHookStore(NewMemoryStore(), passAll)
	wakeful.wakes = fake
	recheck, _ := newBenchRecheckStore(newCountingStore(wakeful))
	for name, ws := range map[string]wakeStore{
		"counting": newCountingStore(wakeful),
		"recheck":  recheck,
	} {
		fake.published = nil
		require.True(t, ws.wakeUps(), name)
		ws.publishWakes("svc", "svc.render.h", []byte("v"), 7, []string{"a", "b"}, 1)
		assert.Equal(t, []string{"svc svc.render.h v 7 1 [a b]"}, fake.published, name)
		var got []string
		stop, err := ws.subscribeWake("svc", "svc.render.h", "a", func(value []byte, rev uint64) {
			got = append(got, fmt.Sprint(string(value), " ", rev))
		})
		require.NoError(t, err, name)
		require.NotNil(t, fake.delivered, name)
		fake.delivered([]byte("w"), 9)
		stop()
		assert.Nil(t, fake.delivered, "%s: stop did not reach the wrapped store", name)
		assert.Equal(t, []string{"w 9"}, got, name)
	}

	plain := newCountingStore(NewMemoryStore())
	assert.False(t, plain.wakeUps(), "wake-ups over a store without them")
	plain.publishWakes("svc", "svc.render.h", []byte("v"), 7, []string{"a"}, 1) // does nothing
	stop, err := plain.subscribeWake("svc", "svc.render.h", "a", func([]byte, uint64) {})
	require.ErrorIs(t, err, ErrInvalidRequest)
	assert.Nil(t, stop)
}
