package jobkeys

// A diagnostic of the hot-key workload of BenchmarkCycle's
// NworkersNconns-1key-watcher rows (issue 11): n processes, each with its
// own connection, coordinator, Watcher and Runner, loop admit → Run on ONE
// key with MaxActive 1. It records every store call of every process
// (start, end, the revision it wrote on, its result, the value) and the
// server's timestamp of each revision (from a separate connection's KV
// watch, which skips revisions superseded before it got to them: those are
// stamped when their writer got its reply). From these it reports where
// the time between consecutive revisions goes (by the two operations and
// whether one process made both), which writes lose their compare-and-swap
// and to what, whether the acquirer was the head of the queue, and the
// pauses after failed writes.
//
// It runs only with JOBKEYS_HOTKEY_TRACE=1. JOBKEYS_HOTKEY_PROCS (default
// 16) and JOBKEYS_HOTKEY_CYCLES (default 3000) size it;
// JOBKEYS_HOTKEY_IDLE adds processes whose Watchers only watch the key
// (the cost of the watch's fan-out alone, e.g. with PROCS=1 IDLE=15):
//
//	JOBKEYS_HOTKEY_TRACE=1 go test -count=1 -run TestHotKeyTrace -v .

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jobkeys/jobkeys/internal/natstest"

	"github.com/stretchr/testify/require"
)

// hotCall is one store call of one process.
type hotCall struct {
	proc       int
	op         string // "get", "create", "update", "delete"
	base       uint64 // the revision an update or delete wrote on
	start, end time.Time
	rev        uint64 // the revision read or written; 0 on failure
	conflict   bool   // a lost compare-and-swap
	value      []byte // what a create or update wrote
	what       string // the operation the caller ran (admit, run, release)
	fed        string // a read's: whether the coordinator's entry was fed, and trusted
}

// hotLog is the store calls of every process.
type hotLog struct {
	mu    sync.Mutex
	calls []hotCall
}

type hotWhatKey struct{}

// hook returns the hookStore hook that records the store calls of process
// proc in l; keys is the process's coordinator's key table, once it
// exists.
func (l *hotLog) hook(proc int, keys **keyTable) storeHook {
	return func(ctx context.Context, c storeCall, call func() storeResult) storeResult {
		start := time.Now()
		hc := hotCall{op: c.op.String(), start: start}
		switch c.op {
		case opGet:
			hc.fed = "no entry"
			if t := *keys; t != nil {
				if e := t.entry(c.key); e != nil {
					m := e.Marks()
					hc.fed = fmt.Sprintf("fed %v, trusted %v", m.Watching > 0 && m.Fresh, m.Trusted)
				}
			}
		case opCreate:
			hc.value = slices.Clone(c.value)
		case opUpdate:
			hc.base, hc.value = c.revision, slices.Clone(c.value)
		case opDelete:
			hc.base = c.revision
		default:
			return call()
		}
		r := call()
		hc.rev = r.rev
		if c.op == opDelete {
			hc.rev = c.revision + 1
		}
		hc.proc = proc
		hc.end = time.Now()
		hc.conflict = errors.Is(r.err, ErrRevisionConflict)
		if r.err != nil {
			hc.rev = 0
		}
		hc.what, _ = ctx.Value(hotWhatKey{}).(string)
		l.mu.Lock()
		l.calls = append(l.calls, hc)
		l.mu.Unlock()
		return r
	}
}

// hotRev is one revision of the key as the server stored it.
type hotRev struct {
	rev     uint64
	created time.Time // the server's timestamp
	seen    time.Time // when the trace's own watch received it
	state   *KeyState // nil: deleted
	kind    string    // admit, acquire, release, renew, delete, other
	job     string    // the job admitted, acquired or released
}

// hotJobProc returns the process of job "job-<proc>-<i>" or
// "warmup-<proc>", or -1.
func hotJobProc(job string) int {
	parts := strings.Split(job, "-")
	if len(parts) < 2 {
		return -1
	}
	p, err := strconv.Atoi(parts[1])
	if err != nil {
		return -1
	}
	return p
}

// hotDiff names the operation that turned prev into cur.
func hotDiff(prev, cur *KeyState) (kind, job string) {
	ids := func(st *KeyState) (active, queued map[string]bool) {
		active, queued = map[string]bool{}, map[string]bool{}
		if st != nil {
			for _, a := range st.Active {
				active[a.JobID] = true
			}
			for _, q := range st.Queued {
				queued[q.JobID] = true
			}
		}
		return active, queued
	}
	pa, pq := ids(prev)
	ca, cq := ids(cur)
	for j := range ca {
		if !pa[j] {
			return "acquire", j
		}
	}
	for j := range pa {
		if !ca[j] {
			return "release", j
		}
	}
	for j := range cq {
		if !pq[j] {
			return "admit", j
		}
	}
	if cur == nil {
		return "delete", ""
	}
	if len(pq) == len(cq) && len(pa) == len(ca) {
		return "renew", ""
	}
	return "other", ""
}

func TestHotKeyTrace(t *testing.T) {
	if os.Getenv("JOBKEYS_HOTKEY_TRACE") == "" {
		t.Skip("a diagnostic: set JOBKEYS_HOTKEY_TRACE=1 to run it")
	}
	procs := 16
	if v := os.Getenv("JOBKEYS_HOTKEY_PROCS"); v != "" {
		n, err := strconv.Atoi(v)
		require.NoError(t, err)
		procs = n
	}
	cycles := benchEnvInt(t, "JOBKEYS_HOTKEY_CYCLES", 3000)

	s := natstest.Run(t)
	ctx := context.Background()
	service := rtService()
	payload := benchPayload(0)
	policy := Policy{Key: []string{"tenant", "/tenant"}, MaxActive: 1, MaxQueuedPerKey: procs}
	log := &hotLog{}

	type proc struct {
		jt *JobType
		r  *Runner
	}
	ps := make([]proc, procs)
	for i := range ps {
		_, js := natstest.Connect(t, s)
		store, err := NewNATSStore(js, WithCreateBuckets(jetstream.MemoryStorage, 1))
		require.NoError(t, err)
		keys := new(*keyTable)
		coord, err := NewCoordinator(newHookStore(store, passValueLimit).withHook(log.hook(i, keys)), nil)
		require.NoError(t, err)
		*keys = coord.keys
		jt, err := coord.JobType(service, benchJobType, policy)
		require.NoError(t, err)
		w, err := NewWatcher(store)
		require.NoError(t, err)
		t.Cleanup(w.Close)
		r, err := NewRunner(jt, &RunnerConfig{Watcher: w})
		require.NoError(t, err)
		ps[i] = proc{jt: jt, r: r}
	}
	key, err := ps[0].jt.Key(payload)
	require.NoError(t, err)
	// Idle processes only watch the key (JOBKEYS_HOTKEY_IDLE of them): the
	// cost of the watch's fan-out alone.
	if v := os.Getenv("JOBKEYS_HOTKEY_IDLE"); v != "" {
		idle, err := strconv.Atoi(v)
		require.NoError(t, err)
		for range idle {
			_, js := natstest.Connect(t, s)
			store, err := NewNATSStore(js, WithCreateBuckets(jetstream.MemoryStorage, 1))
			require.NoError(t, err)
			w, err := NewWatcher(store)
			require.NoError(t, err)
			t.Cleanup(w.Close)
			sub, err := w.Subscribe(ctx, service, key.KVKey)
			require.NoError(t, err)
			t.Cleanup(sub.Close)
		}
	}

	noop := func(context.Context, Lease) error { return nil }
	var waitedMu sync.Mutex
	var waited []time.Duration   // each Run's RunResult.Waited
	var admitted []time.Duration // each Admit call's duration
	cycle := func(p proc, jobID string) error {
		began := time.Now()
		adm, err := p.jt.Admit(context.WithValue(ctx, hotWhatKey{}, "admit"), jobID, payload)
		if err != nil {
			return err
		}
		took := time.Since(began)
		waitedMu.Lock()
		admitted = append(admitted, took)
		waitedMu.Unlock()
		if adm.Kind != KindAccepted {
			return fmt.Errorf("admit %s: %s %s", jobID, adm.Kind, adm.Reason)
		}
		res, err := p.r.Run(context.WithValue(ctx, hotWhatKey{}, "run"), jobID, payload, noop)
		if err != nil {
			return err
		}
		waitedMu.Lock()
		waited = append(waited, res.Waited)
		waitedMu.Unlock()
		if res.Release != KindReleased {
			return fmt.Errorf("run %s: release %s", jobID, res.Release)
		}
		return nil
	}
	for i, p := range ps {
		require.NoError(t, cycle(p, fmt.Sprintf("warmup-%d", i)))
	}

	// The server's view: every revision, with its timestamp.
	_, js := natstest.Connect(t, s)
	kv, err := js.KeyValue(ctx, "JOBS_KEYS_"+service)
	require.NoError(t, err)
	watch, err := kv.Watch(ctx, key.KVKey, jetstream.UpdatesOnly())
	require.NoError(t, err)
	var revs []hotRev
	var watchMu sync.Mutex
	var watchDone sync.WaitGroup
	watchDone.Go(func() {
		for e := range watch.Updates() {
			if e == nil {
				continue
			}
			r := hotRev{rev: e.Revision(), created: e.Created(), seen: time.Now()}
			if e.Operation() == jetstream.KeyValuePut {
				st, err := decodeState(e.Value())
				if err != nil {
					r.kind = "undecodable"
				}
				r.state = st
			}
			watchMu.Lock()
			revs = append(revs, r)
			watchMu.Unlock()
		}
	})
	log.mu.Lock()
	log.calls = nil
	log.mu.Unlock()

	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, procs)
	began, cpu0 := time.Now(), hotCPU(t)
	for i, p := range ps {
		wg.Go(func() {
			for {
				n := int(next.Add(1)) - 1
				if n >= cycles {
					return
				}
				if err := cycle(p, fmt.Sprintf("job-%d-%d", i, n)); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	elapsed, cpu := time.Since(began), hotCPU(t)-cpu0
	t.Logf("process CPU %v over %v: %.0f%% of one core, %.0f µs per cycle", cpu.Round(time.Millisecond), elapsed.Round(time.Millisecond),
		100*cpu.Seconds()/elapsed.Seconds(), float64(cpu.Microseconds())/float64(cycles))
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	last, err := kv.Get(ctx, key.KVKey)
	if err == nil {
		require.Eventually(t, func() bool {
			watchMu.Lock()
			defer watchMu.Unlock()
			return len(revs) > 0 && revs[len(revs)-1].rev >= last.Revision()
		}, 30*time.Second, 10*time.Millisecond, "the trace's watch delivers every revision")
	} else {
		time.Sleep(time.Second) // deleted: the watch's last revisions
	}
	require.NoError(t, watch.Stop())
	watchDone.Wait()

	waitedMu.Lock()
	waited = waited[procs:] // not the warmups
	admitted = admitted[procs:]
	waitedMu.Unlock()
	t.Logf("Admit call: %s", hotDist(admitted))
	t.Logf("Run's wait for its slot (RunResult.Waited): %s", hotDist(waited))
	hotReport(t, procs, cycles, elapsed, revs, log.calls)
}

// hotReport analyses one run of TestHotKeyTrace.
func hotReport(t *testing.T, procs, cycles int, elapsed time.Duration, revs []hotRev, calls []hotCall) {
	require.NotEmpty(t, revs)
	// The trace's watch skips revisions superseded before it got to them
	// (the bucket keeps one per key): the revisions are the processes'
	// successful writes, stamped by the server where the watch saw them,
	// else when the writer got its reply.
	var lag []time.Duration
	stamps := map[uint64]time.Time{}
	for _, r := range revs {
		lag = append(lag, r.seen.Sub(r.created))
		stamps[r.rev] = r.created
	}
	t.Logf("the trace's watch saw %d revisions from %d to %d; server stamp → its receipt: %s", len(revs), revs[0].rev, revs[len(revs)-1].rev, hotDist(lag))
	revs = revs[:0]
	stamped := 0
	for _, c := range calls {
		if c.op == "get" || c.conflict || c.rev == 0 {
			continue
		}
		r := hotRev{rev: c.rev, created: c.end}
		if at, ok := stamps[c.rev]; ok {
			r.created = at
			stamped++
		}
		if c.op != "delete" {
			st, err := decodeState(c.value)
			require.NoError(t, err)
			r.state = st
		}
		revs = append(revs, r)
	}
	slices.SortFunc(revs, func(a, b hotRev) int { return cmp.Compare(a.rev, b.rev) })
	t.Logf("%d revisions written, %d of them stamped by the server", len(revs), stamped)
	var toServer, fromServer []time.Duration
	for _, c := range calls {
		if at, ok := stamps[c.rev]; ok && c.op != "get" && !c.conflict && c.rev != 0 {
			toServer = append(toServer, at.Sub(c.start))
			fromServer = append(fromServer, c.end.Sub(at))
		}
	}
	t.Logf("successful write: client start → server stamp %s; server stamp → client reply %s", hotDist(toServer), hotDist(fromServer))
	qlen := map[int]int{}
	for _, r := range revs {
		if r.state != nil {
			qlen[len(r.state.Queued)]++
		} else {
			qlen[0]++
		}
	}
	t.Logf("queue length over revisions: %v", qlen)
	byRev := map[uint64]int{}
	var prev *KeyState
	for i := range revs {
		r := &revs[i]
		if r.kind == "" {
			r.kind, r.job = hotDiff(prev, r.state)
		}
		prev = r.state
		byRev[r.rev] = i
	}
	kinds := map[string]int{}
	for _, r := range revs {
		kinds[r.kind]++
	}
	t.Logf("%d processes, %d cycles in %v: %.0f cycles/s, %.1f µs/cycle; %d revisions %v",
		procs, cycles, elapsed.Round(time.Millisecond), float64(cycles)/elapsed.Seconds(),
		float64(elapsed.Microseconds())/float64(cycles), len(revs), kinds)

	h := &hotTrace{t: t, procs: procs, cycles: cycles, elapsed: elapsed, revs: revs, calls: calls, byRev: byRev, byProc: map[int][]hotCall{}}
	for _, c := range calls {
		if c.op != "get" {
			h.byProc[c.proc] = append(h.byProc[c.proc], c)
		}
	}
	for p := range h.byProc {
		slices.SortFunc(h.byProc[p], func(a, b hotCall) int { return a.start.Compare(b.start) })
	}
	h.logGaps()
	h.logStoreCalls()
	h.logCycles()
	h.logReads()
	h.logRetries()
	h.logTimeline()
}

// hotTrace is what hotReport's sections share: the run's figures, its
// revisions (with their kinds), the store calls, each revision's index in
// revs, and each process's writes in start order.
type hotTrace struct {
	t       *testing.T
	procs   int
	cycles  int
	elapsed time.Duration
	revs    []hotRev
	calls   []hotCall
	byRev   map[uint64]int
	byProc  map[int][]hotCall // writes (not reads), in start order
}

// logGaps reports where the time goes: each gap between consecutive
// revisions, by the two operations and whether one process made both.
func (h *hotTrace) logGaps() {
	// Where the time goes: each gap between consecutive revisions, by the
	// two operations and whether one process made both.
	type gapClass struct {
		n   int
		sum time.Duration
		ds  []time.Duration
	}
	gaps := map[string]*gapClass{}
	var gapTotal time.Duration
	for i := 1; i < len(h.revs); i++ {
		a, b := h.revs[i-1], h.revs[i]
		who := "other"
		if hotJobProc(a.job) == hotJobProc(b.job) {
			who = "same"
		}
		qa := 0
		if a.state != nil {
			qa = len(a.state.Queued)
		}
		k := fmt.Sprintf("%s→%s (%s process)", a.kind, b.kind, who)
		if a.kind == "release" && qa == 0 {
			k = fmt.Sprintf("release, queue empty→%s (%s process)", b.kind, who)
		}
		g := gaps[k]
		if g == nil {
			g = &gapClass{}
			gaps[k] = g
		}
		d := b.created.Sub(a.created)
		g.n++
		g.sum += d
		g.ds = append(g.ds, d)
		gapTotal += d
	}
	gk := slices.Collect(maps.Keys(gaps))
	slices.SortFunc(gk, func(x, y string) int { return cmp.Compare(gaps[y].sum, gaps[x].sum) })
	var gb strings.Builder
	for _, k := range gk {
		g := gaps[k]
		fmt.Fprintf(&gb, "\n  %5.1f%% %-48s %s", 100*g.sum.Seconds()/gapTotal.Seconds(), k, hotDist(g.ds))
	}
	h.t.Logf("time between consecutive revisions (server stamps), %v in all:%s", gapTotal.Round(time.Millisecond), gb.String())
}

// logStoreCalls reports the store calls: writes, failed writes by intent
// and by what won their revision, reads.
func (h *hotTrace) logStoreCalls() {
	var writes, fails, reads int
	readsBy := map[string]int{}   // the caller's operation
	failsBy := map[string]int{}   // what a failed write meant to do → count
	lostTo := map[string]int{}    // intended → what took the revision after its base
	failsWhat := map[string]int{} // the caller's operation
	for _, c := range h.calls {
		switch c.op {
		case "get":
			reads++
			readsBy[c.what]++
			continue
		}
		writes++
		if !c.conflict {
			continue
		}
		fails++
		intent := "?"
		if i, ok := h.byRev[c.base]; ok && c.op == "update" {
			var st *KeyState
			if s, err := decodeState(c.value); err == nil {
				st = s
			}
			intent, _ = hotDiff(h.revs[i].state, st)
			winner := "?"
			if i+1 < len(h.revs) && h.revs[i+1].rev > c.base {
				w := h.revs[i+1]
				winner = w.kind
				if hotJobProc(w.job) == c.proc {
					winner += "(own)"
				}
			}
			lostTo[intent+"→lost to "+winner]++
		} else {
			lostTo[c.op+" on unknown base"]++
		}
		failsBy[intent]++
		failsWhat[c.what]++
	}
	h.t.Logf("store calls: %d writes (%.2f/cycle), %d failed (%.2f/cycle), %d reads (%.2f/cycle)",
		writes, float64(writes)/float64(h.cycles), fails, float64(fails)/float64(h.cycles), reads, float64(reads)/float64(h.cycles))
	h.t.Logf("failed writes by intent: %v; by caller: %v; reads by caller: %v", failsBy, failsWhat, readsBy)
	h.t.Logf("failed writes, intent → what won its revision: %v", lostTo)
}

// logCycles reports, per cycle, release → next acquisition and
// acquisition → its release, and who took the slot a release freed.
func (h *hotTrace) logCycles() {
	// Per cycle: release → next acquisition; acquisition → its release.
	var relToAcq, acqToRel, relToFirstTry, acqLatency []time.Duration
	var between []int
	notHead, heads, barged, sameProcHead := 0, 0, 0, 0
	betweenKinds := map[string]int{}
	var lastRel = -1
	for i, r := range h.revs {
		switch r.kind {
		case "release":
			lastRel = i
		case "acquire":
			if lastRel < 0 {
				continue
			}
			rel := h.revs[lastRel]
			relToAcq = append(relToAcq, r.created.Sub(rel.created))
			between = append(between, i-lastRel-1)
			for _, m := range h.revs[lastRel+1 : i] {
				betweenKinds[m.kind]++
			}
			if rel.state != nil && len(rel.state.Queued) > 0 {
				if rel.state.Queued[0].JobID == r.job {
					heads++
				} else {
					notHead++
					// Admitted after the release (a Run's first try right
					// after its admission), or queued behind the head?
					fresh := false
					for _, m := range h.revs[lastRel+1 : i] {
						fresh = fresh || m.kind == "admit" && m.job == r.job
					}
					if fresh {
						barged++
					} else if hotJobProc(rel.state.Queued[0].JobID) == hotJobProc(r.job) {
						sameProcHead++
					}
				}
			}
			// The acquirer's first write after the release.
			p := hotJobProc(r.job)
			for _, c := range h.byProc[p] {
				if c.start.After(rel.created) && c.what == "run" {
					relToFirstTry = append(relToFirstTry, c.start.Sub(rel.created))
					break
				}
			}
			lastRel = -1
		}
	}
	// acquisition → release of the same job
	acqAt := map[string]time.Time{}
	for _, r := range h.revs {
		switch r.kind {
		case "acquire":
			acqAt[r.job] = r.created
		case "release":
			if at, ok := acqAt[r.job]; ok {
				acqToRel = append(acqToRel, r.created.Sub(at))
			}
		}
	}
	// write latency of successful writes
	for _, c := range h.calls {
		if c.op != "get" && !c.conflict {
			acqLatency = append(acqLatency, c.end.Sub(c.start))
		}
	}
	h.t.Logf("release → next acquisition (server stamps): %s", hotDist(relToAcq))
	h.t.Logf("acquisition → its release (server stamps): %s", hotDist(acqToRel))
	h.t.Logf("release → the acquirer's first write after it (client start): %s", hotDist(relToFirstTry))
	h.t.Logf("successful write round trip (client): %s", hotDist(acqLatency))
	h.t.Logf("acquisitions of the queue's head at the release: %d, of another job: %d (%d of them admitted after the release, %d queued behind a head of the same process)",
		heads, notHead, barged, sameProcHead)
	h.t.Logf("revisions between a release and the next acquisition: mean %.2f; kinds %v", hotMean(between), betweenKinds)
}

// logReads reports what each read followed: the process's previous store
// call.
func (h *hotTrace) logReads() {
	// What each read followed: the process's previous store call.
	readAfter := map[string]int{}
	var readWait []time.Duration
	allByProc := map[int][]hotCall{}
	for _, c := range h.calls {
		allByProc[c.proc] = append(allByProc[c.proc], c)
	}
	for _, cs := range allByProc {
		slices.SortFunc(cs, func(a, b hotCall) int { return a.start.Compare(b.start) })
		for i, c := range cs {
			if c.op != "get" {
				continue
			}
			k := c.what + " read, first call"
			if i > 0 {
				p := cs[i-1]
				res := "ok"
				if p.conflict {
					res = "conflict"
					readWait = append(readWait, c.start.Sub(p.end))
				}
				k = fmt.Sprintf("%s read after %s %s %s (%s)", c.what, p.what, p.op, res, c.fed)
			}
			readAfter[k]++
		}
	}
	h.t.Logf("reads, by the process's call before: %v; failed write → read: %s", readAfter, hotDist(readWait))
}

// logRetries reports, for failed writes, the pause until the process's
// next write.
func (h *hotTrace) logRetries() {
	// Failed writes and what the process did next: the pause from the
	// failed write's end to its next write's start.
	retryGap := map[string][]time.Duration{}
	for _, cs := range h.byProc {
		for i, c := range cs {
			if !c.conflict || i+1 >= len(cs) {
				continue
			}
			n := cs[i+1]
			intent := c.what
			if j, ok := h.byRev[c.base]; ok && c.op == "update" {
				if st, err := decodeState(c.value); err == nil {
					intent, _ = hotDiff(h.revs[j].state, st)
				}
			}
			retryGap[intent] = append(retryGap[intent], n.start.Sub(c.end))
		}
	}
	for what, d := range retryGap {
		h.t.Logf("failed %s write → next write of the process: %s", what, hotDist(d))
	}
}

// logTimeline logs a sample of the timeline: revisions (server stamps)
// and failed writes and reads (client start), in time order.
func (h *hotTrace) logTimeline() {
	// Timeline sample: revisions (server stamps) and failed writes (client
	// start and end), in time order.
	var b strings.Builder
	if len(h.revs) > 100 {
		from, to := h.revs[len(h.revs)/2].created, h.revs[len(h.revs)/2+60].created
		type line struct {
			at time.Time
			s  string
		}
		var lines []line
		for _, r := range h.revs[len(h.revs)/2 : len(h.revs)/2+60] {
			q := 0
			if r.state != nil {
				q = len(r.state.Queued)
			}
			lines = append(lines, line{r.created, fmt.Sprintf("rev %d %-7s %-12s (proc %d) queue %d", r.rev, r.kind, r.job, hotJobProc(r.job), q)})
		}
		for _, c := range h.calls {
			if c.start.After(from) && c.start.Before(to) && (c.conflict || c.op == "get") {
				lines = append(lines, line{c.start, fmt.Sprintf("        proc %2d %-6s %s on %d: failed (%.0fµs)", c.proc, c.what, c.op, c.base, float64(c.end.Sub(c.start).Microseconds()))})
			}
		}
		slices.SortFunc(lines, func(x, y line) int { return x.at.Compare(y.at) })
		for _, l := range lines {
			fmt.Fprintf(&b, "\n  +%7.0fµs %s", float64(l.at.Sub(from).Microseconds()), l.s)
		}
	}
	h.t.Logf("timeline sample (revisions, failed writes and reads):%s", b.String())
}

// hotCPU returns the user and system CPU time the process used.
func hotCPU(t *testing.T) time.Duration {
	var ru syscall.Rusage
	require.NoError(t, syscall.Getrusage(syscall.RUSAGE_SELF, &ru))
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func hotMean(xs []int) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := 0
	for _, x := range xs {
		s += x
	}
	return float64(s) / float64(len(xs))
}

// hotDist formats the distribution of ds.
func hotDist(ds []time.Duration) string {
	if len(ds) == 0 {
		return "none"
	}
	ds = slices.Clone(ds)
	slices.Sort(ds)
	var sum time.Duration
	for _, d := range ds {
		sum += d
	}
	q := func(f float64) time.Duration {
		return ds[min(len(ds)-1, int(f*float64(len(ds))))].Round(time.Microsecond)
	}
	return fmt.Sprintf("n %d mean %v p10 %v p50 %v p90 %v p99 %v max %v", len(ds), (sum / time.Duration(len(ds))).Round(time.Microsecond),
		q(0.1), q(0.5), q(0.9), q(0.99), ds[len(ds)-1].Round(time.Microsecond))
}
