package jobkeys_test

// A randomized liveness test of the key layer's wake-up protocol, beside
// its safety checks (system_linearizability_test.go, system_model_test.go)
// and its soak (system_wake_soak_test.go, which runs one fixed, well-behaved
// workload for what it leaves behind).
//
// Each round is a seeded random schedule on one embedded server: a few
// processes (each a connection of its own with a NATSStore over wake-ups, a
// coordinator, a Watcher and a Runner), a random policy (MaxActive 1–3, a
// queue limit of 0–6, Reject, Coalesce or ReplaceOldest, FailStale or
// Block) on one or two keys, and jobs admitted at random times and run with
// Runner.Run (blocking waiters). Handlers return at once or late; some Runs
// are cancelled while they wait and run again, from a process picked at
// random; processes are closed mid-run (a crash): their slots are not
// released, so
// the leases must run out and be taken over, and their jobs are delivered
// again (WithRetry) to a process started in their place.
//
// Safety: the handlers of a key never run more at once than MaxActive
// (counted by the test from the handlers' own start and end, a crashed
// process's ending when it was closed; a handler whose Run reports its
// lease lost is not counted: that overlap is ErrLeaseLost's contract).
//
// Liveness: every Run the test did not cancel returns, either having run
// its handler or with an outcome or error that says why (rejected,
// coalesced, not queued because replaced); any other error fails the round.
// A Run the test cancelled that returned without running leaves no slot of
// its job behind, even when its acquisition's write was under way as its
// ctx ended (the acquisition undoes it: acquire_undo.go): the test reads
// the key after each such Run of a job never run on a process closed
// since (whose slot of it is left to run out).
// Every job must be done within a bound expressed in the round's work,
// counted from its last external event (an admission, a cancel, a Run
// started again, a process closed): the work of the handlers that ended
// after that event (their planned durations, summed), one lease TTL per
// process closed (its slots run out) plus one for the round trips, and one
// RecheckInterval when the round closed a process or replaced a queued job
// (what the protocol leaves to the recheck: a wake-up a process closed
// before it went out, the jobs it was to wake, a replaced job's waiter
// learning over wake-ups that it is no longer queued). A lost wake-up leaves its
// waiter to its next recheck or the expiry of a lease it saw (up to a
// TTL), so wake-ups lost as a rule overrun the bound (with publishWakes
// disabled, seeds 1, 2, 3, 4 and 6 fail within 30 rounds, 5 does not);
// with the recheck disabled too, a Run never returns, which the wall-clock
// timeout (livenessGuard), only a backstop, reports.
//
// A failing round prints its seed, its schedule and a timeline of what
// happened. Replay a run with JOBKEYS_LIVENESS_SEED=<seed> (the schedule is
// the seed's; the interleaving of the goroutines is not), one round of it
// with JOBKEYS_LIVENESS_ROUND=<round>. JOBKEYS_LIVENESS_ROUNDS sets the
// number of rounds (default livenessRoundsDefault, a few seconds):
//
//	JOBKEYS_LIVENESS_ROUNDS=200 go test -race -run TestWakeUpLiveness -v -timeout 30m

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jobkeys/jobkeys"
	"github.com/jobkeys/jobkeys/internal/natstest"
)

const (
	livenessRoundsDefault = 3
	livenessHeartbeat     = 50 * time.Millisecond
	livenessTTL           = 500 * time.Millisecond
	livenessRecheck       = time.Second
	// livenessGuard is the failure backstop of one round: a Run not
	// returned by then is reported as stuck and its process closed.
	livenessGuard = 2 * time.Minute
)

// livenessEnv reads a non-negative integer from the environment; def when
// unset.
func livenessEnv(t *testing.T, name string, def uint64) uint64 {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.ParseUint(v, 10, 64)
	require.NoError(t, err, "%s=%q is not a non-negative integer", name, v)
	return n
}

// TestWakeUpLiveness runs seeded random rounds of blocking Runs over
// wake-ups with releases early and late, waiters cancelled and running
// again, and processes closed mid-run, and checks that no key ever runs
// more than MaxActive handlers at once and that every Run returns, run or
// told why, within the bound the round's work sets (see the file's comment).
//
// It does not run in parallel with the package's other tests: its bound
// allows for a loaded host, not for the whole suite beside it.
func TestWakeUpLiveness(t *testing.T) {
	const livenessExtraRounds = 10
	seed := livenessEnv(t, "JOBKEYS_LIVENESS_SEED", uint64(time.Now().UnixNano()))
	rounds := int(livenessEnv(t, "JOBKEYS_LIVENESS_ROUNDS", livenessRoundsDefault))
	first := 0
	if os.Getenv("JOBKEYS_LIVENESS_ROUND") != "" {
		first = int(livenessEnv(t, "JOBKEYS_LIVENESS_ROUND", 0))
		rounds = first + 1
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("replay with JOBKEYS_LIVENESS_SEED=%d JOBKEYS_LIVENESS_ROUNDS=%d (one round: JOBKEYS_LIVENESS_ROUND=<round>)", seed, rounds)
		}
	})
	s := natstest.Run(t)
	var waited, ran int
	// A seed's first rounds may happen to make no Run wait (coalesced or
	// rejected jobs, free keys): then more rounds of the same seed run, at
	// most livenessExtraRounds, so that waiting is exercised at all.
	last := rounds
	for round := first; round < last; round++ {
		if round == last-1 && waited == 0 && last < rounds+livenessExtraRounds && os.Getenv("JOBKEYS_LIVENESS_ROUND") == "" {
			last++
		}
		lr := newLiveRound(t, s, seed, round)
		sum := lr.run()
		waited += sum.waited
		ran += sum.ran
		if t.Failed() {
			t.Logf("seed %d round %d failed: %s\ntimeline:\n%s", seed, round, lr.describe(), strings.Join(lr.timeline, "\n"))
			return
		}
	}
	t.Logf("seed %d: %d rounds, %d handlers ran, %d Runs waited", seed, last-first, ran, waited)
	// The rounds exercised waiting at all: most Runs find their key busy.
	require.Positive(t, ran, "handlers run")
	require.Positive(t, waited, "Runs that waited for a slot")
}

// liveProc is one simulated process: its own connection, store over
// wake-ups, coordinator, Watcher and Runner. ctx ends its Runs when it is
// closed.
type liveProc struct {
	id     int
	nc     *nats.Conn
	coord  *jobkeys.KeyCoordinator
	jt     *jobkeys.JobType
	w      *jobkeys.Watcher
	r      *jobkeys.Runner
	ctx    context.Context
	cancel context.CancelFunc
	dead   atomic.Bool
	// closedAt is when the process was closed (set before its connection
	// closes); zero while it lives. Guarded by liveRound.mu.
	closedAt time.Time
}

// liveJob is one job's planned part of the schedule.
type liveJob struct {
	id      string
	key     int
	at      time.Duration   // when it is admitted, after the round's start
	hold    time.Duration   // how long its handler works
	cancels []time.Duration // its first Runs are cancelled this long after they start
	regap   time.Duration   // the pause before a cancelled Run runs again
	rng     *rand.Rand      // its process picks
}

// liveKill is a process closed mid-run.
type liveKill struct {
	at   time.Duration
	proc int // index among the live processes at that time, modulo their number
}

// liveSpan is one handler's run on a key: from its start to its end (or
// its process's close), lost when its Run reported the lease lost.
type liveSpan struct {
	key        int
	job        string
	start, end time.Time
	runEnd     time.Time     // when its Run returned
	hold       time.Duration // its planned work
	lost       bool
}

// liveEnd is how a job ended.
type liveEnd struct {
	how string // "ran", or the outcome that told why it did not run
	at  time.Time
	err error // an unexpected error
}

// liveSummary is what a round adds to the test's totals.
type liveSummary struct{ waited, ran int }

// liveRound is one round: its schedule, its processes and what it saw.
type liveRound struct {
	t       *testing.T
	srv     *server.Server
	seed    uint64
	round   int
	service string
	policy  jobkeys.Policy
	keys    int
	jobs    []*liveJob
	kills   []liveKill
	waited  atomic.Int64

	mu        sync.Mutex
	nextProc  int
	procs     []*liveProc // live
	all       []*liveProc
	lastEvent time.Time
	closes    int
	spans     []liveSpan
	replaced  map[string]bool
	unknown   int // admissions whose outcome was lost with their process
	// cancelled counts the Runs the test cancelled that returned without
	// running.
	cancelled int
	ends      map[string]liveEnd
	start     time.Time
	timeline  []string // what happened when, printed when the round fails
}

func newLiveRound(t *testing.T, s *server.Server, seed uint64, round int) *liveRound {
	rng := rand.New(rand.NewPCG(seed, uint64(round)))
	whenFull := []jobkeys.WhenFull{jobkeys.Reject, jobkeys.Coalesce, jobkeys.ReplaceOldest}
	stale := []jobkeys.StalePolicy{jobkeys.FailStale, jobkeys.Block}
	lr := &liveRound{
		t: t, srv: s, seed: seed, round: round,
		service: fmt.Sprintf("live%d", round),
		policy: jobkeys.Policy{
			Key:               []string{"tenant", "/tenant"},
			MaxActive:         1 + rng.IntN(3),
			HeartbeatInterval: livenessHeartbeat,
			HeartbeatTTL:      livenessTTL,
			StalePolicy:       stale[rng.IntN(len(stale))],
			MaxQueuedPerKey:   rng.IntN(7),
			WhenFull:          whenFull[rng.IntN(len(whenFull))],
		},
		keys:     1 + rng.IntN(2),
		replaced: map[string]bool{},
		ends:     map[string]liveEnd{},
	}
	for i := range 6 + rng.IntN(11) {
		j := &liveJob{
			id:    fmt.Sprintf("r%d-job-%d", round, i),
			key:   rng.IntN(lr.keys),
			at:    time.Duration(rng.IntN(100)) * time.Millisecond,
			regap: time.Duration(rng.IntN(20)) * time.Millisecond,
			rng:   rand.New(rand.NewPCG(seed, uint64(1000*(round+1)+i))),
		}
		if rng.IntN(3) == 0 {
			j.hold = time.Duration(20+rng.IntN(60)) * time.Millisecond // a late release
		} else {
			j.hold = time.Duration(rng.IntN(3)) * time.Millisecond // an early one
		}
		for rng.IntN(4) == 0 && len(j.cancels) < 2 {
			j.cancels = append(j.cancels, time.Duration(2+rng.IntN(60))*time.Millisecond)
		}
		lr.jobs = append(lr.jobs, j)
	}
	for range rng.IntN(3) {
		lr.kills = append(lr.kills, liveKill{
			at:   time.Duration(10+rng.IntN(150)) * time.Millisecond,
			proc: rng.IntN(8),
		})
		_ = rng.IntN(2) // drawn as when closes chose to flush held wake-ups: each seed keeps its schedule
	}
	return lr
}

func (lr *liveRound) describe() string {
	p := lr.policy
	var b strings.Builder
	fmt.Fprintf(&b, "policy MaxActive %d, MaxQueuedPerKey %d, %s, %s; %d keys; %d jobs; %d processes closed",
		p.MaxActive, p.MaxQueuedPerKey, p.WhenFull, p.StalePolicy, lr.keys, len(lr.jobs), len(lr.kills))
	for _, j := range lr.jobs {
		fmt.Fprintf(&b, "\n  %s key %d at %v hold %v cancels %v", j.id, j.key, j.at, j.hold, j.cancels)
	}
	for _, k := range lr.kills {
		fmt.Fprintf(&b, "\n  close process #%d at %v", k.proc, k.at)
	}
	return b.String()
}

// event records that an external event of the schedule happened now.
func (lr *liveRound) event(format string, args ...any) {
	lr.mu.Lock()
	lr.lastEvent = time.Now()
	lr.logLocked("event: "+format, args...)
	lr.mu.Unlock()
}

// log adds a line to the round's timeline.
func (lr *liveRound) log(format string, args ...any) {
	lr.mu.Lock()
	lr.logLocked(format, args...)
	lr.mu.Unlock()
}

func (lr *liveRound) logLocked(format string, args ...any) {
	lr.timeline = append(lr.timeline, fmt.Sprintf("%8.1fms ", float64(time.Since(lr.start).Microseconds())/1000)+fmt.Sprintf(format, args...))
}

// spawn starts a process. It fails the test (without stopping the
// goroutine: it may not be the test's) when it cannot.
func (lr *liveRound) spawn() *liveProc {
	lr.mu.Lock()
	id := lr.nextProc
	lr.nextProc++
	lr.mu.Unlock()
	p := &liveProc{id: id}
	var err error
	defer func() {
		if err != nil {
			lr.t.Errorf("round %d: start process %d: %v", lr.round, id, err)
			if p.nc != nil {
				p.nc.Close()
			}
		}
	}()
	if p.nc, err = nats.Connect(lr.srv.ClientURL()); err != nil {
		return nil
	}
	js, err := jetstream.New(p.nc)
	if err != nil {
		return nil
	}
	store, err := jobkeys.NewNATSStore(js, jobkeys.WithCreateBuckets(jetstream.MemoryStorage, 1), jobkeys.WithWakeUps(""))
	if err != nil {
		return nil
	}
	if p.coord, err = jobkeys.NewCoordinator(store, &jobkeys.Config{InstanceID: fmt.Sprintf("proc-%d", id)}); err != nil {
		return nil
	}
	if p.jt, err = p.coord.JobType(lr.service, "work", lr.policy); err != nil {
		return nil
	}
	if p.w, err = jobkeys.NewWatcher(store); err != nil {
		return nil
	}
	p.r, err = jobkeys.NewRunner(p.jt, &jobkeys.RunnerConfig{
		Watcher:         p.w,
		RecheckInterval: livenessRecheck,
		ReleaseTimeout:  livenessTTL,
		OnBlocked:       func(string, jobkeys.Acquisition) { lr.waited.Add(1) },
	})
	if err != nil {
		p.w.Close()
		return nil
	}
	p.ctx, p.cancel = context.WithCancel(context.Background())
	lr.mu.Lock()
	lr.procs = append(lr.procs, p)
	lr.all = append(lr.all, p)
	lr.mu.Unlock()
	return p
}

// pick returns a live process, chosen by rng.
func (lr *liveRound) pick(rng *rand.Rand) *liveProc {
	lr.mu.Lock()
	defer lr.mu.Unlock()
	if len(lr.procs) == 0 {
		return nil
	}
	return lr.procs[rng.IntN(len(lr.procs))]
}

// close closes p as a process that stops: its wake-ups flushed or not,
// its connection closed (nothing of it is released), its Runs ended.
func (lr *liveRound) close(p *liveProc) {
	lr.mu.Lock()
	if p.dead.Load() {
		lr.mu.Unlock()
		return
	}
	p.closedAt = time.Now()
	p.dead.Store(true)
	lr.procs = slices.DeleteFunc(lr.procs, func(q *liveProc) bool { return q == p })
	lr.mu.Unlock()
	p.nc.Close()
	p.cancel()
	p.w.Close()
}

func (lr *liveRound) payload(key int) []byte {
	return []byte(`{"tenant":"t` + strconv.Itoa(key) + `"}`)
}

// runJob takes job j through admission and Runs until it ran or was told
// why not, and records how it ended.
func (lr *liveRound) runJob(start time.Time, j *liveJob) {
	time.Sleep(time.Until(start.Add(j.at)))
	payload := lr.payload(j.key)
	end := func(how string, err error) {
		lr.mu.Lock()
		lr.ends[j.id] = liveEnd{how: how, at: time.Now(), err: err}
		lr.logLocked("%s ended: %s %v", j.id, how, err)
		lr.mu.Unlock()
	}
	admitted, retry := false, false
	for attempt := 0; ; attempt++ {
		p := lr.pick(j.rng)
		if p == nil {
			end("", errors.New("no process left"))
			return
		}
		if !admitted {
			adm, err := p.jt.Admit(p.ctx, j.id, payload)
			lr.event("%s admitted on process %d: %s %s (err %v)", j.id, p.id, adm.Kind, adm.Reason, err)
			if err != nil {
				if p.dead.Load() {
					// Its process was closed: admit again elsewhere (Admit is
					// idempotent). The lost admission may have replaced a job
					// that nobody was told of.
					lr.mu.Lock()
					lr.unknown++
					lr.mu.Unlock()
					continue
				}
				end("", fmt.Errorf("admit on process %d: %w", p.id, err))
				return
			}
			if adm.Replaced != nil {
				lr.mu.Lock()
				lr.replaced[adm.Replaced.ID] = true
				lr.mu.Unlock()
			}
			switch adm.Kind {
			case jobkeys.KindAccepted, jobkeys.KindReplaced:
				admitted = true
			default:
				end(string(adm.Kind), nil) // rejected or coalesced: told why
				return
			}
		}
		runCtx, cancelRun := context.WithCancel(p.ctx)
		var cancelled atomic.Bool
		cancelTimer := time.AfterFunc(time.Hour, func() {
			cancelled.Store(true)
			lr.event("%s: its Run cancelled", j.id)
			cancelRun()
		})
		cancelTimer.Stop()
		if attempt < len(j.cancels) {
			cancelTimer.Reset(j.cancels[attempt])
		}
		var started, ended time.Time
		var opts []jobkeys.AcquireOption
		if retry {
			opts = append(opts, jobkeys.WithRetry())
		}
		lr.log("%s: Run on process %d (retry %v)", j.id, p.id, retry)
		res, err := p.r.Run(runCtx, j.id, payload, func(ctx context.Context, _ jobkeys.Lease) error {
			started = time.Now()
			lr.log("%s: handler starts on process %d", j.id, p.id)
			select {
			case <-time.After(j.hold):
			case <-ctx.Done():
			}
			ended = time.Now()
			lr.log("%s: handler ends", j.id)
			return nil
		}, opts...)
		cancelTimer.Stop()
		cancelRun()
		if started.IsZero() {
			lr.log("%s: Run on process %d returned without running: %v", j.id, p.id, err)
		}
		for _, st := range res.Stale {
			lr.log("%s: took over the expired slot of %s", j.id, st.JobID)
		}
		if !started.IsZero() {
			lr.mu.Lock()
			if !p.closedAt.IsZero() && p.closedAt.Before(ended) {
				ended = p.closedAt // a crashed process's handler runs no more
			}
			lost := res.LeaseLost != nil || errors.Is(err, jobkeys.ErrStaleCompletion)
			lr.spans = append(lr.spans, liveSpan{key: j.key, job: j.id, start: started, end: ended, runEnd: time.Now(), hold: j.hold, lost: lost && !p.dead.Load()})
			lr.mu.Unlock()
		}
		var blocked *jobkeys.BlockedError
		switch {
		case !started.IsZero() && err == nil:
			end("ran", nil)
			return
		case p.dead.Load():
			// Its process was closed mid-run: the job is delivered again,
			// as a retry, for it may hold a slot (which runs out).
			retry = true
			lr.event("%s: delivered again (its process %d was closed)", j.id, p.id)
		case !started.IsZero():
			// Ran, cancelled by the test or with its lease lost.
			end("ran", nil)
			return
		case cancelled.Load() && errors.Is(err, context.Canceled):
			// Cancelled before it ran: it holds no slot, even if its
			// acquisition's write was under way as its ctx ended; unless
			// it ran, or tried, on a process closed since (a retry),
			// whose slot of it runs out.
			lr.mu.Lock()
			lr.cancelled++
			lr.mu.Unlock()
			if !retry {
				lr.noSlotLeft(p, j, payload)
			}
			time.Sleep(j.regap) // and it waits again
			lr.event("%s: runs again", j.id)
		case errors.As(err, &blocked) && blocked.Acquisition.Reason == jobkeys.ReasonNotQueued:
			end(string(jobkeys.ReasonNotQueued), nil)
			return
		default:
			end("", fmt.Errorf("run on process %d: %w", p.id, err))
			return
		}
	}
}

func (lr *liveRound) run() liveSummary {
	t := lr.t
	for range 2 + lr.rngProcs() {
		if lr.spawn() == nil {
			return liveSummary{}
		}
	}
	defer func() {
		lr.mu.Lock()
		all := slices.Clone(lr.all)
		lr.mu.Unlock()
		for _, p := range all {
			lr.close(p)
		}
	}()
	start := time.Now()
	lr.start = start
	lr.event("round starts")
	var jobs, kills sync.WaitGroup
	for _, j := range lr.jobs {
		jobs.Go(func() { lr.runJob(start, j) })
	}
	kills.Go(func() {
		for _, k := range lr.kills {
			time.Sleep(time.Until(start.Add(k.at)))
			lr.mu.Lock()
			if len(lr.procs) == 0 {
				lr.mu.Unlock()
				return // a process failed to start: the test has failed
			}
			p := lr.procs[k.proc%len(lr.procs)]
			lr.closes++
			lr.mu.Unlock()
			lr.close(p)
			lr.spawn() // in its place
			lr.event("process %d closed", p.id)
		}
	})
	kills.Wait()
	done := make(chan struct{})
	go func() { jobs.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(livenessGuard):
		lr.mu.Lock()
		var stuck []string
		for _, j := range lr.jobs {
			if _, ok := lr.ends[j.id]; !ok {
				stuck = append(stuck, j.id)
			}
		}
		lr.mu.Unlock()
		t.Errorf("round %d: Runs of %v still not returned after %v", lr.round, stuck, livenessGuard)
		lr.mu.Lock()
		all := slices.Clone(lr.all)
		lr.mu.Unlock()
		for _, p := range all {
			lr.close(p)
		}
		<-done
		return liveSummary{}
	}
	return lr.check()
}

// rngProcs is how many processes beyond two the round starts with.
func (lr *liveRound) rngProcs() int {
	return rand.New(rand.NewPCG(lr.seed, uint64(lr.round)+1<<32)).IntN(3)
}

// check checks the round's invariants on what it recorded.
func (lr *liveRound) check() liveSummary {
	t := lr.t
	lr.mu.Lock()
	defer lr.mu.Unlock()
	sum := liveSummary{waited: int(lr.waited.Load())}
	// Liveness: every job ended, run or told why, within the bound.
	bound := lr.bound()
	deadline := lr.lastEvent.Add(bound)
	hows := map[string]int{}
	for _, j := range lr.jobs {
		e, ok := lr.ends[j.id]
		if !assert.True(t, ok, "round %d: job %s did not end", lr.round, j.id) {
			continue
		}
		hows[e.how]++
		if e.how == "ran" {
			sum.ran++
		}
		assert.NoError(t, e.err, "round %d: job %s", lr.round, j.id)
		assert.False(t, e.at.After(deadline), "round %d: job %s ended %v after the round's last event, past the bound of %v (work %v, %d processes closed)",
			lr.round, j.id, e.at.Sub(lr.lastEvent), bound, lr.workAfter(), lr.closes)
		if e.how == string(jobkeys.ReasonNotQueued) {
			// Replaced and told the admitting caller; or an admission whose
			// reply was lost may have replaced it.
			assert.True(t, lr.replaced[j.id] || lr.unknown > 0 && lr.policy.WhenFull == jobkeys.ReplaceOldest,
				"round %d: job %s was not queued, yet no admission replaced it", lr.round, j.id)
		}
	}
	// Safety: at most MaxActive handlers at once on a key.
	type edge struct {
		at    time.Time
		delta int
		job   string
	}
	for key := range lr.keys {
		var edges []edge
		for _, s := range lr.spans {
			if s.key == key && !s.lost {
				edges = append(edges, edge{s.start, 1, s.job}, edge{s.end, -1, s.job})
			}
		}
		sort.Slice(edges, func(a, b int) bool {
			if !edges[a].at.Equal(edges[b].at) {
				return edges[a].at.Before(edges[b].at)
			}
			return edges[a].delta < edges[b].delta // an end before a start at the same instant
		})
		running := 0
		var at []string
		for _, e := range edges {
			running += e.delta
			if e.delta > 0 {
				at = append(at, e.job)
			} else {
				at = slices.DeleteFunc(at, func(j string) bool { return j == e.job })
			}
			if running > lr.policy.MaxActive {
				t.Errorf("round %d: key %d runs %d handlers at once (%v), MaxActive %d", lr.round, key, running, at, lr.policy.MaxActive)
				break
			}
		}
	}
	t.Logf("round %d: %s; jobs ended %v, %d Runs waited, %d Runs cancelled before running, work %v, bound %v, last job done %v after the last event",
		lr.round, lr.policySummary(), hows, sum.waited, lr.cancelled, lr.workAfter(), bound, lr.lastDone().Sub(lr.lastEvent).Round(time.Millisecond))
	return sum
}

func (lr *liveRound) policySummary() string {
	p := lr.policy
	return fmt.Sprintf("MaxActive %d, MaxQueuedPerKey %d, %s, %s, %d keys, %d jobs, %d processes closed",
		p.MaxActive, p.MaxQueuedPerKey, p.WhenFull, p.StalePolicy, lr.keys, len(lr.jobs), lr.closes)
}

// workAfter is the work of the handlers that ended after the round's last
// event: at most what was left to do then. lr.mu is held.
func (lr *liveRound) workAfter() time.Duration {
	var d time.Duration
	for _, s := range lr.spans {
		if s.runEnd.After(lr.lastEvent) {
			d += s.hold
		}
	}
	return d
}

// noSlotLeft checks that job j, whose Run on p just returned ctx.Err()
// without running its handler, holds no slot: an acquisition whose write
// was under way as its ctx ended takes back the slot it may have taken
// before it returns.
func (lr *liveRound) noSlotLeft(p *liveProc, j *liveJob, payload []byte) {
	ctx, cancel := context.WithTimeout(p.ctx, 10*time.Second)
	defer cancel()
	info, err := p.jt.InspectKey(ctx, payload)
	if err != nil || info.State == nil || p.dead.Load() {
		return // no key, or its process was closed (its slots run out, which the bound allows for)
	}
	for _, a := range info.State.Active {
		if a.JobID == j.id {
			lr.mu.Lock()
			lr.logLocked("%s: its cancelled Run left a slot behind (lease until %v)", j.id, a.LeaseExpiresAt.Format("15:04:05.000"))
			lr.mu.Unlock()
			lr.t.Errorf("round %d: job %s: its Run returned context.Canceled without running, yet the key holds a slot of it (token %s)", lr.round, j.id, a.SlotToken)
			return
		}
	}
}

// bound is how long after the round's last event every job must be done
// (see the file's comment). lr.mu is held.
func (lr *liveRound) bound() time.Duration {
	b := lr.workAfter() + time.Duration(lr.closes+1)*livenessTTL
	if lr.closes > 0 || len(lr.replaced) > 0 {
		b += livenessRecheck
	}
	return b
}

// lastDone is when the last job ended. lr.mu is held.
func (lr *liveRound) lastDone() time.Time {
	var last time.Time
	for _, e := range lr.ends {
		if e.at.After(last) {
			last = e.at
		}
	}
	return last
}
