package jobkeys

// BenchmarkCycleProcs is issue 11's target row, "16 processes on their own
// connections", with real OS processes running jobkeys itself: each worker
// is the test binary re-executed (TestCycleProcsChild) with its own
// connection, NATSStore (WithWakeUps("") for -wake), KeyCoordinator,
// Watcher and Runner, looping admit -> Runner.Run on ONE key with
// MaxActive 1 (a handler that returns at once), as benchHotKeyRow does
// with connections inside one process. The server is the parent's embedded
// one, the bucket memory storage. Run it with:
//
//	go test -c -o /tmp/pb.test . && cd /tmp && ./pb.test -test.run '^$' -test.bench 'BenchmarkCycleProcs' -test.benchtime 2s
//
// With JOBKEYS_BENCH_DELAY set (a one-way delay, "250us"), every process,
// P0's too, reaches the server through a TCP delay line, as in
// BenchmarkCycleDelayed.
//
// Rows (only row/P0 ratios within one run mean anything: other load on the
// machine drifts):
//
//	P0-rawKV            one child process doing 3 bare kv.Update per cycle on a real
//	                    state's size (BenchmarkCeiling's P0, same code)
//	P-16procs-watcher   16 child processes, the Runners waiting through the KV watch
//	P-16procs-wake      16 child processes over WithWakeUps(""): targeted wake-ups
//
// Metrics per cycle: cpu-µs/cycle is the CPU time (user+system) of the
// parent (the server) and of every child over the timed part; reads and
// writes are the coordinators' store calls (countingStore; writes count
// every attempt, failed-cas/cycle those that lost), waits the Runs
// that blocked, rechecks the Runners' tries a recheck timer started
// (Runner.rechecks), untrusted-tries the tries no change or wake-up
// started, counted at the store as the in-process hot-key rows count their
// rechecks/cycle (newBenchRecheckStore), and for -wake the stores' wake-up
// counters (NATSStore.wakeCounters). contention-errors is the count of
// ErrContention (any fails the run). B/op and allocs/op are the parent's
// only (the server's).
//
// Every run is checked (procCheck): every job admitted ran exactly once and
// was released; the key ends empty; and MaxActive 1 held across processes:
// every child logs each state its coordinator wrote with its revision, and
// in the merged history (no revision written twice, no state with more than
// one slot) every handler's slot token is a slot of its job over one
// unbroken run of revisions. A handler runs between its acquisition's
// write and its release's, so two handlers could only have overlapped if
// one of them ran on a slot that was never written, or one reappeared.

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jobkeys/jobkeys/internal/natstest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// procChildEnv carries a child process's spec (JSON).
const procChildEnv = "JOBKEYS_PROCBENCH_CHILD"

// procSpec configures one child process of BenchmarkCycleProcs.
type procSpec struct {
	URL     string `json:"url"`
	Service string `json:"service"`
	Wake    bool   `json:"wake"`    // WithWakeUps("")
	ID      int    `json:"id"`      // the child's index; its jobs are p<ID>-<i>
	Cycles  int    `json:"cycles"`  // the child's share of the cycles
	Workers int    `json:"workers"` // the number of children (the queue's limit)
	// Ready is the subject the child says it is ready on, Ctl the one it is
	// started ("start") and stopped ("stop") on, Out the file it writes its
	// stats to.
	Ready string `json:"ready"`
	Ctl   string `json:"ctl"`
	Out   string `json:"out"`
}

// procPolicy is the hot key's policy for workers processes.
func procPolicy(workers int) Policy {
	return Policy{Key: benchPolicy.Key, MaxActive: 1, MaxQueuedPerKey: workers}
}

// procRun is one job's run: its id and the slot token its handler ran
// under.
type procRun struct {
	Job   string `json:"job"`
	Token string `json:"token"`
}

// procWrite is one state a child's coordinator wrote and its revision.
// Deletes are not logged (Delete returns no revision).
type procWrite struct {
	Rev   uint64 `json:"rev"`
	Value []byte `json:"value"`
}

// procStats is what one child did over the timed part (Writes: its whole
// life, warm-up included).
type procStats struct {
	Cycles     int         `json:"cycles"`
	Admitted   int         `json:"admitted"`
	Reads      int64       `json:"reads"`
	Writes     int64       `json:"writes"`
	Conflicts  int64       `json:"conflicts"` // writes that lost their compare-and-swap
	Waits      int64       `json:"waits"`
	Rechecks   int64       `json:"rechecks"`
	Untrusted  int64       `json:"untrusted"`
	Contention int         `json:"contention"`
	Wakes      wakeCounts  `json:"wakes"`
	CPU        int64       `json:"cpu_ns"`
	Runs       []procRun   `json:"runs"`
	Log        []procWrite `json:"log"`
}

func (s *procStats) add(o procStats) {
	s.Cycles += o.Cycles
	s.Admitted += o.Admitted
	s.Reads += o.Reads
	s.Writes += o.Writes
	s.Conflicts += o.Conflicts
	s.Waits += o.Waits
	s.Rechecks += o.Rechecks
	s.Untrusted += o.Untrusted
	s.Contention += o.Contention
	s.Wakes = addWakeCounts(s.Wakes, o.Wakes, 1)
	s.CPU += o.CPU
	s.Runs = append(s.Runs, o.Runs...)
	s.Log = append(s.Log, o.Log...)
}

// addWakeCounts returns a + sign*b, counter by counter.
func addWakeCounts(a, b wakeCounts, sign int) wakeCounts {
	f := func(x, y uint64) uint64 {
		if sign < 0 {
			return x - y
		}
		return x + y
	}
	return wakeCounts{
		Published:    f(a.Published, b.Published),
		Local:        f(a.Local, b.Local),
		NoResponders: f(a.NoResponders, b.NoResponders),
		Retried:      f(a.Retried, b.Retried),
		Dropped:      f(a.Dropped, b.Dropped),
		Received:     f(a.Received, b.Received),
		Malformed:    f(a.Malformed, b.Malformed),
		Refused:      f(a.Refused, b.Refused),
	}
}

// procWriteLog is the states a child's coordinator wrote.
type procWriteLog struct {
	mu     sync.Mutex
	writes []procWrite
}

func (l *procWriteLog) add(rev uint64, value []byte) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.writes = append(l.writes, procWrite{Rev: rev, Value: slices.Clone(value)})
}

func (l *procWriteLog) all() []procWrite {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.writes)
}

// logWrites returns the hook of a child's coordinator's store, over the
// recheck store (newBenchRecheckStore, which counts reads, writes and
// untrusting tries): it logs every state written to log.
func logWrites(log *procWriteLog) storeHook {
	return func(_ context.Context, c storeCall, call func() storeResult) storeResult {
		r := call()
		if r.err != nil {
			return r
		}
		switch c.op {
		case opCreate, opUpdate:
			log.add(r.rev, c.value)
		case opWriteBatch:
			n := uint64(len(c.values))
			for i, v := range c.values {
				if c.del && i == len(c.values)-1 {
					break // a delete marker
				}
				log.add(r.rev-n+1+uint64(i), v)
			}
		}
		return r
	}
}

// BenchmarkCycleProcs is documented at the top of this file.
func BenchmarkCycleProcs(b *testing.B) {
	s := natstest.Run(b)
	if d, ok := benchDelay(b); ok {
		// Every process, P0's too, reaches the server through a delay
		// line (see BenchmarkCycleDelayed).
		line := startDelayLine(b, benchHostPort(b, s.ClientURL()), d)
		benchURL = line.URL()
		b.Cleanup(func() { benchURL = "" })
	}
	b.Run("P0-rawKV", func(b *testing.B) {
		benchCeilingRow(b, s, ceilRow{mode: ceilRaw, workers: 1, procs: true}, benchStateBytes(b, 0))
	})
	b.Run("P-16procs-watcher", func(b *testing.B) { benchProcsRow(b, s, 16, false) })
	b.Run("P-16procs-wake", func(b *testing.B) { benchProcsRow(b, s, 16, true) })
}

func benchProcsRow(b *testing.B, s *server.Server, procs int, wake bool) {
	total := procRunRow(b, s, procs, wake, b.N)
	benchReportRate(b, "cycles/s")
	per := func(v float64) float64 { return v / float64(b.N) }
	b.ReportMetric(per(float64(total.CPU)/1e3), "cpu-µs/cycle")
	b.ReportMetric(per(float64(total.Reads)), "reads/cycle")
	b.ReportMetric(per(float64(total.Writes)), "writes/cycle")
	b.ReportMetric(per(float64(total.Conflicts)), "failed-cas/cycle")
	b.ReportMetric(per(float64(total.Waits)), "waits/cycle")
	b.ReportMetric(per(float64(total.Rechecks)), "rechecks/cycle")
	b.ReportMetric(per(float64(total.Untrusted)), "untrusted-tries/cycle")
	b.ReportMetric(float64(total.Contention), "contention-errors")
	if wake {
		w := total.Wakes
		b.ReportMetric(per(float64(w.Published)), "wakes-published/cycle")
		b.ReportMetric(per(float64(w.Local)), "wakes-local/cycle")
		b.ReportMetric(per(float64(w.NoResponders)), "wakes-503/cycle")
		b.ReportMetric(per(float64(w.Retried)), "wakes-retried/cycle")
		b.ReportMetric(per(float64(w.Received)), "wakes-received/cycle")
		b.ReportMetric(float64(w.Dropped), "wakes-dropped")
		b.ReportMetric(float64(w.Malformed), "wakes-malformed")
	}
}

// procRunRow runs cycles cycles of admit -> Run on one key by procs child
// processes (each its share), checks the run (procCheck) and returns the
// children's stats summed, CPU including the parent's (the server's).
func procRunRow(tb testing.TB, s *server.Server, procs int, wake bool, cycles int) procStats {
	tb.Helper()
	ctx := context.Background()
	nc, js := natstest.ConnectURL(tb, benchClientURL(s))
	service := benchService()
	policy := procPolicy(procs)
	payload := benchPayload(0)
	// The parent creates the bucket, so that the children do not race to.
	store, err := NewNATSStore(js, WithCreateBuckets(jetstream.MemoryStorage, 1))
	require.NoError(tb, err)
	coord, err := NewCoordinator(store, nil)
	require.NoError(tb, err)
	require.NoError(tb, benchCycle(ctx, coord, service, policy, payload, "warmup-parent"))
	tb.Cleanup(func() { _ = js.DeleteKeyValue(context.Background(), store.BucketName(service)) })

	specs := make([]procSpec, procs)
	for i := range specs {
		c := cycles / procs
		if i < cycles%procs {
			c++
		}
		specs[i] = procSpec{URL: benchClientURL(s), Service: service, Wake: wake, ID: i, Cycles: c, Workers: procs}
	}
	total := procRunChildren(tb, nc, specs)

	jt, err := coord.JobType(service, benchJobType, policy)
	require.NoError(tb, err)
	key, err := jt.Key(payload)
	require.NoError(tb, err)
	final, _, err := coord.read(ctx, key)
	require.NoError(tb, err)
	require.NoError(tb, procCheck(total, cycles, final))
	return total
}

// procRunChildren runs each spec as a child process (this test binary
// running TestCycleProcsChild), started together once all are ready, and
// returns their stats summed with the parent's CPU time over the run. nc
// is the parent's connection. Under a benchmark the timer covers the run
// only. Any child's failure stops the others and fails tb.
func procRunChildren(tb testing.TB, nc *nats.Conn, specs []procSpec) procStats {
	tb.Helper()
	b, _ := tb.(*testing.B)
	exe, err := os.Executable()
	require.NoError(tb, err)
	prefix := "procbench.ctl." + nats.NewInbox()[len("_INBOX."):]
	ready := make(chan *nats.Msg, len(specs))
	sub, err := nc.ChanSubscribe(prefix+".ready", ready)
	require.NoError(tb, err)
	defer func() { _ = sub.Unsubscribe() }()
	require.NoError(tb, nc.Flush())
	dir := tb.TempDir()
	stop := func() {
		_ = nc.Publish(prefix+".ctl", []byte("stop"))
		_ = nc.Flush()
	}
	// failed carries every child's exit, first come first.
	type exit struct {
		id  int
		err error
	}
	exits := make(chan exit, len(specs))
	started := 0
	waited := 0
	defer func() {
		// A failure before the end: stop the others and wait for them.
		if waited < started {
			stop()
			for ; waited < started; waited++ {
				<-exits
			}
		}
	}()
	for i := range specs {
		sp := specs[i]
		sp.Ready, sp.Ctl, sp.Out = prefix+".ready", prefix+".ctl", fmt.Sprintf("%s/%d.json", dir, i)
		specs[i] = sp
		spec, err := json.Marshal(sp)
		require.NoError(tb, err)
		cmd := exec.Command(exe, "-test.run=^TestCycleProcsChild$", "-test.count=1", "-test.timeout=10m")
		cmd.Env = append(os.Environ(), procChildEnv+"="+string(spec))
		var output bytes.Buffer
		cmd.Stdout, cmd.Stderr = &output, &output
		require.NoError(tb, cmd.Start())
		started++
		go func() {
			err := cmd.Wait()
			if err != nil {
				err = fmt.Errorf("procbench: child %d: %w\n%s", sp.ID, err, output.String())
			}
			exits <- exit{id: sp.ID, err: err}
		}()
	}
	t := time.NewTimer(time.Minute)
	defer t.Stop()
	for range specs {
		select {
		case <-ready:
		case e := <-exits:
			waited++
			tb.Fatalf("procbench: child %d exited before it was ready: %v", e.id, e.err)
		case <-t.C:
			tb.Fatal("procbench: the child processes were not ready within a minute")
		}
	}
	if b != nil {
		b.ReportAllocs()
	}
	cpu0 := ceilCPU(tb)
	if b != nil {
		b.ResetTimer()
	}
	require.NoError(tb, nc.Publish(prefix+".ctl", []byte("start")))
	require.NoError(tb, nc.Flush())
	var errs []error
	for range specs {
		e := <-exits
		waited++
		if e.err != nil {
			if len(errs) == 0 {
				stop() // the others may wait for this child's jobs forever
			}
			errs = append(errs, e.err)
		}
	}
	if b != nil {
		b.StopTimer()
	}
	cpu := ceilCPU(tb) - cpu0
	if len(errs) > 0 {
		tb.Fatal(errors.Join(errs...))
	}
	var total procStats
	for _, sp := range specs {
		data, err := os.ReadFile(sp.Out)
		require.NoError(tb, err)
		var st procStats
		require.NoError(tb, json.Unmarshal(data, &st), "stats of child %d", sp.ID)
		total.add(st)
	}
	total.CPU += int64(cpu)
	return total
}

// procCheck checks a run of cycles cycles (see the file comment): every
// job admitted once and run once on a slot of its own, every slot's run of
// revisions unbroken in the children's merged write history, no revision
// with more than one slot or written twice, no ErrContention, and final
// (the key's state at the end, nil when deleted) empty.
func procCheck(total procStats, cycles int, final *KeyState) error {
	if total.Cycles != cycles || total.Admitted != cycles || len(total.Runs) != cycles {
		return fmt.Errorf("procbench: %d cycles, %d admitted, %d runs; want %d each", total.Cycles, total.Admitted, len(total.Runs), cycles)
	}
	if total.Contention != 0 {
		return fmt.Errorf("procbench: %d ErrContention", total.Contention)
	}
	if final != nil && !final.Empty() {
		return fmt.Errorf("procbench: the key ends with %d slots and %d queued jobs, want it empty", len(final.Active), len(final.Queued))
	}
	jobOf := make(map[string]string, len(total.Runs)) // slot token -> job
	ran := make(map[string]bool, len(total.Runs))
	for _, r := range total.Runs {
		if ran[r.Job] {
			return fmt.Errorf("procbench: job %s ran twice", r.Job)
		}
		ran[r.Job] = true
		if _, dup := jobOf[r.Token]; dup || r.Token == "" {
			return fmt.Errorf("procbench: job %s ran on slot token %q, not a slot of its own", r.Job, r.Token)
		}
		jobOf[r.Token] = r.Job
	}
	log := slices.Clone(total.Log)
	slices.SortFunc(log, func(a, b procWrite) int { return cmp.Compare(a.Rev, b.Rev) })
	// A slot's state: absent from 0 until it appears, live while it is
	// in the revisions, gone once it has left; it never comes back.
	const (
		live = 1
		gone = 2
	)
	slot := map[string]int{}
	var prev map[string]bool
	for i, w := range log {
		if i > 0 && log[i-1].Rev == w.Rev {
			return fmt.Errorf("procbench: two processes were told they wrote revision %d", w.Rev)
		}
		st, err := ParseState(w.Value)
		if err != nil {
			return fmt.Errorf("procbench: revision %d: %w", w.Rev, err)
		}
		if len(st.Active) > 1 {
			return fmt.Errorf("procbench: revision %d holds %d slots: MaxActive 1 exceeded", w.Rev, len(st.Active))
		}
		cur := map[string]bool{}
		for _, a := range st.Active {
			cur[a.SlotToken] = true
			switch slot[a.SlotToken] {
			case gone:
				return fmt.Errorf("procbench: slot %s of job %s is back at revision %d after it left", a.SlotToken, a.JobID, w.Rev)
			case 0:
				if j, ok := jobOf[a.SlotToken]; ok && j != a.JobID {
					return fmt.Errorf("procbench: revision %d gives job %s's slot %s to job %s", w.Rev, j, a.SlotToken, a.JobID)
				}
				slot[a.SlotToken] = live
			}
		}
		for tok := range prev {
			if !cur[tok] {
				slot[tok] = gone
			}
		}
		prev = cur
	}
	for tok, job := range jobOf {
		if slot[tok] == 0 {
			return fmt.Errorf("procbench: job %s ran on slot %s, which no revision holds", job, tok)
		}
	}
	return nil
}

// TestCycleProcsChild is one worker process of BenchmarkCycleProcs and
// TestCycleProcs; it skips unless they started it.
func TestCycleProcsChild(t *testing.T) {
	env := os.Getenv(procChildEnv)
	if env == "" {
		t.Skip("a child process of BenchmarkCycleProcs")
	}
	var sp procSpec
	require.NoError(t, json.Unmarshal([]byte(env), &sp))
	ctx, cancel := context.WithTimeout(context.Background(), 9*time.Minute)
	defer cancel()

	ctl, err := nats.Connect(sp.URL)
	require.NoError(t, err)
	defer ctl.Close()
	start := make(chan struct{})
	var startOnce sync.Once
	var stopped atomic.Bool
	cmds, err := ctl.Subscribe(sp.Ctl, func(m *nats.Msg) {
		if string(m.Data) == "start" {
			startOnce.Do(func() { close(start) })
			return
		}
		stopped.Store(true)
		cancel()
	})
	require.NoError(t, err)
	defer func() { _ = cmds.Unsubscribe() }()
	require.NoError(t, ctl.Flush())

	_, js := natstest.ConnectURL(t, sp.URL)
	opts := []NATSStoreOption{WithCreateBuckets(jetstream.MemoryStorage, 1)}
	if sp.Wake {
		opts = append(opts, WithWakeUps(""))
	}
	store, err := NewNATSStore(js, opts...)
	require.NoError(t, err)
	cs := newCountingStore(store)
	rs, rechecks := newBenchRecheckStore(cs)
	written := &procWriteLog{}
	ls := newHookStore(rs, passBatches|passValueLimit|passWakes).withHook(logWrites(written))
	coord, err := NewCoordinator(ls, nil)
	require.NoError(t, err)
	coord.tryContext = benchTryContext
	require.Equal(t, sp.Wake, coord.wakes != nil, "the coordinator sees the store's wake-ups")
	jt, err := coord.JobType(sp.Service, benchJobType, procPolicy(sp.Workers))
	require.NoError(t, err)
	wt, err := NewWatcher(store)
	require.NoError(t, err)
	defer wt.Close()
	var waits atomic.Int64
	r, err := NewRunner(jt, &RunnerConfig{Watcher: wt, OnBlocked: func(string, Acquisition) { waits.Add(1) }})
	require.NoError(t, err)

	payload := benchPayload(0)
	var st procStats
	cycle := func(jobID string) error {
		adm, err := jt.Admit(ctx, jobID, payload)
		if errors.Is(err, ErrContention) {
			st.Contention++
		}
		if err != nil {
			return fmt.Errorf("admit %s: %w", jobID, err)
		}
		if adm.Kind != KindAccepted || adm.AlreadyPresent {
			return fmt.Errorf("admit %s: %s %s (already present %v)", jobID, adm.Kind, adm.Reason, adm.AlreadyPresent)
		}
		var run procRun
		runs := 0
		res, err := r.Run(ctx, jobID, payload, func(_ context.Context, l Lease) error {
			runs++
			run = procRun{Job: jobID, Token: l.SlotToken}
			return nil
		})
		if errors.Is(err, ErrContention) {
			st.Contention++
		}
		if err != nil {
			return fmt.Errorf("run %s: %w", jobID, err)
		}
		if res.Release != KindReleased || runs != 1 {
			return fmt.Errorf("run %s: release %q after %d handler calls", jobID, res.Release, runs)
		}
		st.Admitted++
		st.Runs = append(st.Runs, run)
		return nil
	}
	require.NoError(t, cycle(fmt.Sprintf("warmup-p%d", sp.ID)))
	// The counts of the timed part only.
	st = procStats{}
	cs.totals.reads.Store(0)
	cs.totals.writes.Store(0)
	cs.totals.lost.Store(0)
	cs.totals.stale.Store(0)
	rechecks.reset()
	waits.Store(0)
	rechecks0, wakes0 := r.rechecks.Load(), store.wakeCounters()

	require.NoError(t, ctl.Publish(sp.Ready, nil))
	require.NoError(t, ctl.Flush())
	select {
	case <-start:
	case <-ctx.Done():
		if stopped.Load() {
			return // the parent failed before the start
		}
		t.Fatal("procbench: no start")
	}
	cpu0 := ceilCPU(t)
	for i := range sp.Cycles {
		err := cycle(fmt.Sprintf("p%d-%d", sp.ID, i))
		if err != nil && stopped.Load() {
			t.Logf("procbench: child %d stopped by the parent at cycle %d: %v", sp.ID, i, err)
			return
		}
		require.NoError(t, err)
		st.Cycles++
	}
	st.CPU = int64(ceilCPU(t) - cpu0)
	st.Reads, st.Writes = cs.totals.reads.Load(), cs.totals.writes.Load()
	st.Conflicts = cs.totals.lost.Load() + cs.totals.stale.Load()
	st.Waits, st.Untrusted = waits.Load(), rechecks.count()
	st.Rechecks = r.rechecks.Load() - rechecks0
	st.Wakes = addWakeCounts(store.wakeCounters(), wakes0, -1)
	st.Log = written.all()
	data, err := json.Marshal(st)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(sp.Out, data, 0o600))
}

// TestCycleProcs runs BenchmarkCycleProcs's two jobkeys rows briefly (4
// processes x 20 cycles) and checks them as the benchmark does: its
// machinery and checks must work, and neither wait must deadlock across
// processes.
func TestCycleProcs(t *testing.T) {
	t.Parallel()
	s := natstest.Run(t)
	const procs, cycles = 4, 20
	for _, wake := range []bool{false, true} {
		t.Run(fmt.Sprintf("wake=%v", wake), func(t *testing.T) {
			total := procRunRow(t, s, procs, wake, procs*cycles)
			assert.Equal(t, procs*cycles, total.Cycles)
			assert.Zero(t, total.Contention, "ErrContention")
			if wake {
				w := total.Wakes
				assert.Positive(t, w.Published+w.Local, "wake-ups sent")
				assert.Positive(t, w.Received+w.Local, "wake-ups delivered")
				assert.Zero(t, w.Malformed, "malformed wake-ups")
			}
			t.Logf("%d cycles: %d reads, %d writes, %d waits, %d rechecks, wake-ups %+v", total.Cycles, total.Reads, total.Writes, total.Waits, total.Rechecks, total.Wakes)
		})
	}
}

// TestProcCheck feeds procCheck histories a broken protocol could leave
// and checks that it refuses each one, and passes a sound one.
func TestProcCheck(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	p1, err := procPolicy(4).Normalize()
	require.NoError(t, err)
	p2 := p1
	p2.MaxActive = 2
	key, err := DeriveKey("procbench", benchJobType, benchPayload(0), p1.Key)
	require.NoError(t, err)
	admit := func(st *KeyState, job string, p Policy) *KeyState {
		out := ReduceAdmission(st, key, AdmitRequest{JobID: job}, p, now)
		require.Equal(t, KindAccepted, out.Kind, "admit %s", job)
		return out.State
	}
	acquire := func(st *KeyState, job, token string, p Policy) *KeyState {
		out := ReduceAcquire(st, key, AcquireRequest{JobID: job, InstanceID: "host"}, p, now, token)
		require.Equal(t, KindAcquired, out.Kind, "acquire %s", job)
		return out.State
	}
	release := func(st *KeyState, token string) *KeyState {
		for _, a := range st.Active {
			if a.SlotToken == token {
				out := ReduceRelease(st, Lease{JobID: a.JobID, SlotToken: token}, now)
				require.Equal(t, KindReleased, out.Kind)
				return out.State
			}
		}
		t.Fatalf("no slot %s", token)
		return nil
	}
	enc := func(rev uint64, st *KeyState) procWrite { return procWrite{Rev: rev, Value: appendState(nil, st)} }

	// a and b queued, a runs, a leaves, b runs, b leaves (a delete).
	s1 := admit(admit(nil, "a", p1), "b", p1)
	s2 := acquire(s1, "a", "ta", p1)
	s3 := release(s2, "ta")
	s4 := acquire(s3, "b", "tb", p1)
	good := procStats{Cycles: 2, Admitted: 2,
		Runs: []procRun{{Job: "a", Token: "ta"}, {Job: "b", Token: "tb"}},
		Log:  []procWrite{enc(4, s4), enc(1, s1), enc(3, s3), enc(2, s2)}}
	require.NoError(t, procCheck(good, 2, nil))

	// Both at once, as a key written under MaxActive 2 holds them.
	both := acquire(acquire(admit(admit(nil, "a", p2), "b", p2), "a", "ta", p2), "b", "tb", p2)
	// a's slot again after it left.
	back := acquire(admit(s3, "a", p1), "a", "ta", p1)
	for name, tc := range map[string]struct {
		stats  procStats
		cycles int
		final  *KeyState
		want   string // in the error
	}{
		"cycles short":        {good, 3, nil, "want 3 each"},
		"key not empty":       {good, 2, s1, "want it empty"},
		"contention":          {procStats{Cycles: 2, Admitted: 2, Contention: 1, Runs: good.Runs, Log: good.Log}, 2, nil, "ErrContention"},
		"ran twice":           {procStats{Cycles: 2, Admitted: 2, Runs: []procRun{{"a", "ta"}, {"a", "tb"}}, Log: good.Log}, 2, nil, "ran twice"},
		"shared slot":         {procStats{Cycles: 2, Admitted: 2, Runs: []procRun{{"a", "ta"}, {"b", "ta"}}, Log: good.Log}, 2, nil, "not a slot of its own"},
		"slot never held":     {procStats{Cycles: 2, Admitted: 2, Runs: []procRun{{"a", "ta"}, {"b", "tx"}}, Log: good.Log}, 2, nil, "which no revision holds"},
		"two slots":           {procStats{Cycles: 2, Admitted: 2, Runs: good.Runs, Log: []procWrite{enc(1, both)}}, 2, nil, "MaxActive 1 exceeded"},
		"slot back":           {procStats{Cycles: 2, Admitted: 2, Runs: good.Runs, Log: append(slices.Clone(good.Log), enc(5, back))}, 2, nil, "is back at revision 5"},
		"revision twice":      {procStats{Cycles: 2, Admitted: 2, Runs: good.Runs, Log: append(slices.Clone(good.Log), enc(3, s3))}, 2, nil, "wrote revision 3"},
		"slot of another job": {procStats{Cycles: 2, Admitted: 2, Runs: []procRun{{"a", "tb"}, {"b", "ta"}}, Log: good.Log}, 2, nil, "to job a"},
	} {
		assert.ErrorContains(t, procCheck(tc.stats, tc.cycles, tc.final), tc.want, name)
	}
}
