package jobs_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jobkeys/jobkeys"
	"github.com/jobkeys/jobkeys/internal/natstest"
	"github.com/jobkeys/jobkeys/jobs"
)

// clusterRuns is what the handlers of TestDispatchClusterLeaderMovesAndNodeLoss
// saw: every run (job and claim generation), and how many handlers ran at
// once on each key and on each job.
type clusterRuns struct {
	t       *testing.T
	limits  map[string]int // MaxActive by kind
	mu      sync.Mutex
	runs    map[string][]uint64 // claim generations run, by job id
	claims  map[string]int      // client that ran it, by "job/generation"
	active  map[string]int      // handlers running, by "kind/doc"
	peak    map[string]int      // most handlers seen at once, by "kind/doc"
	running map[string]int      // handlers running, by job id
	starts  []time.Time         // when each run started
	started atomic.Int64        // distinct jobs started
	done    atomic.Int64        // distinct jobs whose handler returned nil
	ended   map[string]bool     // jobs whose handler returned nil
}

func newClusterRuns(t *testing.T, limits map[string]int) *clusterRuns {
	return &clusterRuns{t: t, limits: limits, runs: map[string][]uint64{}, claims: map[string]int{},
		active: map[string]int{}, peak: map[string]int{}, running: map[string]int{}, ended: map[string]bool{}}
}

// begin records the start of a run of client w and checks that no other
// handler holds its claim, its job, or its key beyond MaxActive.
func (r *clusterRuns) begin(w int, kind string, job jobs.Job, doc string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	claim := fmt.Sprintf("%s/%d", job.ID, job.ClaimGeneration)
	if prev, ok := r.claims[claim]; ok {
		r.t.Errorf("claim %s run by client %d and client %d", claim, prev, w)
	}
	r.claims[claim] = w
	if len(r.runs[job.ID]) == 0 {
		r.started.Add(1)
	}
	r.runs[job.ID] = append(r.runs[job.ID], job.ClaimGeneration)
	r.starts = append(r.starts, time.Now())
	if r.running[job.ID]++; r.running[job.ID] > 1 {
		r.t.Errorf("job %s: %d handlers at once (claim generation %d starting in client %d)", job.ID, r.running[job.ID], job.ClaimGeneration, w)
	}
	key := kind + "/" + doc
	r.active[key]++
	r.peak[key] = max(r.peak[key], r.active[key])
	if r.active[key] > r.limits[kind] {
		r.t.Errorf("key %s: %d handlers at once, MaxActive %d (job %s, claim generation %d, client %d)", key, r.active[key], r.limits[kind], job.ID, job.ClaimGeneration, w)
	}
}

// end records the end of a run; ok: its handler returned nil.
func (r *clusterRuns) end(kind string, job jobs.Job, doc string, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.running[job.ID]--
	r.active[kind+"/"+doc]--
	if ok && !r.ended[job.ID] {
		r.ended[job.ID] = true
		r.done.Add(1)
	}
}

// clusterJob is one job of the test: its kind and its key's doc.
type clusterJob struct {
	id, kind, doc string
}

// clusterJobs lists the test's jobs, keys interleaved so that a key's jobs
// are queued behind each other while others run: kind "one" (MaxActive 1)
// on 30 keys of 5 jobs and 60 keys of one, kind "two" (MaxActive 2) on 15
// keys of 6 jobs, enqueued two by two.
func clusterJobs() []clusterJob {
	var out []clusterJob
	for round := range 6 {
		for k := range 30 {
			if round < 5 {
				out = append(out, clusterJob{fmt.Sprintf("one-hot%02d-%d", k, round), "one", fmt.Sprintf("hot%02d", k)})
			}
			if k < 15 && round < 3 {
				// Two at a time, so that both of the key's slots are
				// announced at once.
				for n := range 2 {
					out = append(out, clusterJob{fmt.Sprintf("two-pair%02d-%d", k, 2*round+n), "two", fmt.Sprintf("pair%02d", k)})
				}
			}
			if round < 2 {
				n := round*30 + k
				out = append(out, clusterJob{fmt.Sprintf("one-single%02d", n), "one", fmt.Sprintf("single%02d", n)})
			}
		}
	}
	return out
}

// stepDown asks the cluster through nc to move the leader of stream (and,
// when consumer is set, of that consumer of it) to another node, trying
// again while the cluster cannot answer.
func stepDown(ctx context.Context, t *testing.T, nc *nats.Conn, stream, consumer string) {
	t.Helper()
	subject := "$JS.API.STREAM.LEADER.STEPDOWN." + stream
	if consumer != "" {
		subject = "$JS.API.CONSUMER.LEADER.STEPDOWN." + stream + "." + consumer
	}
	for {
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		msg, err := nc.RequestWithContext(rctx, subject, nil)
		cancel()
		var resp struct {
			Success bool `json:"success"`
			Error   *struct {
				Description string `json:"description"`
			} `json:"error"`
		}
		if err == nil {
			if err = json.Unmarshal(msg.Data, &resp); err == nil && !resp.Success {
				err = fmt.Errorf("refused: %s", string(msg.Data))
			}
		}
		if err == nil {
			return
		}
		require.NoError(t, ctx.Err(), "step down %s: %v", subject, err)
		t.Logf("step down %s: %v; again", subject, err)
		time.Sleep(500 * time.Millisecond)
	}
}

// TestDispatchClusterLeaderMovesAndNodeLoss runs the runtime on a 3-node
// cluster: the job bucket, the key bucket and the dispatch stream all R3
// file (the dispatch stream takes the job bucket's replicas, which the
// test checks), three clients each connected to a node of its own
// (MaxWorkers 8, reconciliation at its default). They drain 300 jobs of
// two kinds: 30 keys of MaxActive 1 with 5 jobs each (a release hands the
// slot to the next job, in any client), 60 keys of one job, 15 keys of
// MaxActive 2 with 6 jobs each. 200 jobs are enqueued before the clients
// start, the other 100 while the cluster is disturbed (each Enqueue
// replayed until it stands): after 50 jobs have started, the leaders of
// the three streams and of the two dispatch consumers are stepped down;
// after 150 have started, the node leading the dispatch stream is shut
// down (it stays down). It logs how many jobs ran more than once, how many
// MaxActive 2 keys ran two at once, and the longest time no job started.
//
// What it asserts:
//   - none lost: every job's record ends completed;
//   - committed once: the completed record's claim generation (the claim
//     whose settle was the one write that completed it) is one a handler
//     ran, and the highest any handler ran for the job (no handler ran
//     after the commit); every other run of the job had a lower
//     generation, a claim the store took from it (expired, or handed
//     back) before it granted the next, so that run committed nothing;
//   - no claim (job and generation) was run by two handlers, and no two
//     handlers of one job overlapped;
//   - no key ever had more handlers running than its MaxActive.
//
// The waits are bounded by work done (jobs started, jobs completed), with
// a generous failure timeout. It needs a cluster, so it runs only with
// JOBKEYS_CLUSTER=1.
func TestDispatchClusterLeaderMovesAndNodeLoss(t *testing.T) {
	if os.Getenv("JOBKEYS_CLUSTER") != "1" {
		t.Skip("3-node cluster test: set JOBKEYS_CLUSTER=1 to run it (about a minute)")
	}
	c := natstest.StartCluster(t, natstest.ClusterOptions{Nodes: 3})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute) // failure guard only
	defer cancel()
	const bucket, service = "JOBS_DCLUSTER", "dcluster"
	policy := func(maxActive int) jobkeys.Policy {
		// A claim outlives an election (a few seconds) with room to
		// spare, so a lost claim is the exception, not the rule.
		return jobkeys.Policy{Key: []string{"doc", "/doc"}, MaxActive: maxActive, MaxQueuedPerKey: 20,
			HeartbeatInterval: 500 * time.Millisecond, HeartbeatTTL: 10 * time.Second}
	}
	limits := map[string]int{"one": 1, "two": 2}
	// Long enough runs of kind two that its keys' two slots are used at
	// once, which the MaxActive check needs to mean something.
	durations := map[string]time.Duration{"one": 100 * time.Millisecond, "two": 500 * time.Millisecond}
	rec := newClusterRuns(t, limits)
	var warnings atomic.Int64
	type client struct {
		js     jetstream.JetStream
		store  *jobs.NATSStore
		client *jobs.Client
	}
	clients := make([]client, c.Size())
	for i := range clients {
		// Node i first, not shuffled: each client starts on a node of
		// its own.
		nc, js := natstest.ConnectURL(t, c.URLs(i), nats.DontRandomize())
		require.Equal(t, c.URL(i), nc.ConnectedUrl(), "client %d's node", i)
		var st *jobs.NATSStore
		var keys *jobkeys.NATSStore
		for {
			var err error
			st, err = jobs.NewNATSStore(js, nil, jobs.WithBucket(bucket), jobs.WithCreateBucket(jetstream.FileStorage, 3))
			if err == nil {
				keys, err = jobkeys.NewNATSStore(js, jobkeys.WithCreateBuckets(jetstream.FileStorage, 3))
			}
			if err == nil {
				break
			}
			require.NoError(t, ctx.Err(), "open the R3 buckets through node %d: %v", i, err)
			time.Sleep(200 * time.Millisecond)
		}
		coord, err := jobkeys.NewCoordinator(keys, nil)
		require.NoError(t, err)
		cl, err := jobs.NewClient(st, coord, &jobs.ClientConfig{
			// Reconciliation at its default (30s): the drain is
			// dispatch's, not the passes'.
			KeyStore: keys, Service: service, MaxWorkers: 8, StopGrace: 5 * time.Second,
			Logger: slog.New(&countingHandler{t: t, n: &warnings, client: i}),
		})
		require.NoError(t, err)
		t.Cleanup(func() {
			sctx, scancel := context.WithTimeout(context.Background(), time.Minute)
			defer scancel()
			assert.NoError(t, cl.Stop(sctx))
		})
		for kind, maxActive := range limits {
			require.NoError(t, jobs.Register(cl, jobs.Kind[docIn, docOut]{
				Type: kind, Policy: policy(maxActive),
				Work: func(ctx context.Context, run *jobs.Run, in docIn) (docOut, error) {
					job := run.Job()
					rec.begin(i, kind, job, in.Doc)
					work := time.NewTimer(durations[kind])
					defer work.Stop()
					select {
					case <-work.C:
						rec.end(kind, job, in.Doc, true)
						return docOut{By: fmt.Sprint(i)}, nil
					case <-ctx.Done():
						rec.end(kind, job, in.Doc, false)
						return docOut{}, context.Cause(ctx)
					}
				},
			}))
		}
		clients[i] = client{js: js, store: st, client: cl}
	}

	all := clusterJobs()
	require.Len(t, all, 300)
	enqueue := func(from int, jobsToEnqueue []clusterJob) error {
		for _, j := range jobsToEnqueue {
			in, _ := json.Marshal(docIn{Doc: j.doc})
			req := jobs.EnqueueRequest{ID: j.id, ChannelID: "ch", Type: j.kind, TargetKey: j.id,
				IdempotencyKey: "idem-" + j.id, Fingerprint: "fp-" + j.id, Input: in}
			for {
				// A request that reached a node going away is never
				// answered: each try has its own timeout, and the same
				// request is replayed until it stands.
				ectx, ecancel := context.WithTimeout(ctx, 10*time.Second)
				res, err := clients[from].client.Enqueue(ectx, req)
				ecancel()
				if err == nil {
					if res.Outcome != jobs.OutcomeAccepted {
						return fmt.Errorf("enqueue %s: outcome %v, want accepted", j.id, res.Outcome)
					}
					break
				}
				if ctx.Err() != nil {
					return fmt.Errorf("enqueue %s: %w", j.id, err)
				}
				var rej *jobs.RejectedError
				if errors.As(err, &rej) {
					return fmt.Errorf("enqueue %s: %w", j.id, err)
				}
				time.Sleep(100 * time.Millisecond)
			}
		}
		return nil
	}
	require.NoError(t, enqueue(0, all[:200]))

	// The dispatch stream is made by the first client to open it, with the
	// job bucket's storage and replicas.
	disp, err := clients[0].js.Stream(ctx, "JOBS_DISPATCH_"+service)
	require.NoError(t, err)
	assert.Equal(t, 3, disp.CachedInfo().Config.Replicas, "the dispatch stream's replicas")
	assert.Equal(t, jetstream.FileStorage, disp.CachedInfo().Config.Storage, "the dispatch stream's storage")

	start := time.Now()
	for _, cl := range clients {
		require.NoError(t, cl.client.Start(ctx))
	}
	waitStarted := func(n int64) {
		t.Helper()
		for rec.started.Load() < n {
			require.NoError(t, ctx.Err(), "only %d jobs started, waiting for %d", rec.started.Load(), n)
			time.Sleep(10 * time.Millisecond)
		}
	}

	admin, _ := natstest.ConnectURL(t, c.URLs(2))
	streams := []string{"KV_" + bucket, "KV_JOBS_KEYS_" + service, "JOBS_DISPATCH_" + service}
	leaders := func() string {
		s := ""
		for _, name := range streams {
			s += fmt.Sprintf(" %s:n%d", name, c.StreamLeader(natstest.GlobalAccount, name))
		}
		return s
	}
	waitStarted(50)
	before := leaders()
	for _, name := range streams {
		stepDown(ctx, t, admin, name, "")
	}
	for _, consumer := range []string{"workers", "checkers"} {
		stepDown(ctx, t, admin, "JOBS_DISPATCH_"+service, consumer)
	}
	t.Logf("after %d jobs started (%d done): stepped down every leader:%s →%s", rec.started.Load(), rec.done.Load(), before, leaders())

	enqueued := make(chan error, 1)
	go func() { enqueued <- enqueue(1, all[200:]) }()

	waitStarted(150)
	victim := c.StreamLeader(natstest.GlobalAccount, "JOBS_DISPATCH_"+service)
	if victim < 0 {
		victim = 0 // no leader this instant: any node
	}
	c.Stop(victim)
	t.Logf("after %d jobs started (%d done): shut down node n%d, the dispatch stream's leader", rec.started.Load(), rec.done.Load(), victim)
	require.NoError(t, <-enqueued)

	// Every job completed, read from the store through a live node.
	live := clients[(victim+1)%len(clients)].store
	records := map[string]jobs.Job{}
	var left []string
	for {
		left = left[:0]
		for _, j := range all {
			if r, ok := records[j.id]; ok && r.State == jobs.StateCompleted {
				continue
			}
			gctx, gcancel := context.WithTimeout(ctx, 5*time.Second)
			d, err := live.Get(gctx, "ch", j.id)
			gcancel()
			if err != nil {
				left = append(left, j.id+" ("+err.Error()+")")
				continue
			}
			records[j.id] = d.Job
			if d.Job.State != jobs.StateCompleted {
				left = append(left, j.id+" "+string(d.Job.State))
			}
		}
		if len(left) == 0 || ctx.Err() != nil {
			break
		}
		time.Sleep(time.Second)
	}
	require.Empty(t, left, "jobs not completed (%d handlers returned)", rec.done.Load())
	t.Logf("every job completed %v after Start; %d warnings logged", time.Since(start).Round(time.Second), warnings.Load())

	rec.mu.Lock()
	defer rec.mu.Unlock()
	rerun := 0
	for _, j := range all {
		gens := append([]uint64(nil), rec.runs[j.id]...)
		sort.Slice(gens, func(a, b int) bool { return gens[a] < gens[b] })
		committed := records[j.id].ClaimGeneration
		if !assert.NotEmpty(t, gens, "job %s completed without a handler run", j.id) {
			continue
		}
		assert.Equal(t, committed, gens[len(gens)-1],
			"job %s: completed by claim generation %d, but handlers ran generations %v", j.id, committed, gens)
		if len(gens) > 1 {
			rerun++
			t.Logf("job %s ran %d times, claim generations %v, completed by %d", j.id, len(gens), gens, committed)
		}
	}
	full := 0 // keys of kind two that ran two jobs at once
	for _, n := range rec.peak {
		if n == 2 {
			full++
		}
	}
	var gap time.Duration // the longest time no run started, after the first
	for i := 1; i < len(rec.starts); i++ {
		gap = max(gap, rec.starts[i].Sub(rec.starts[i-1]))
	}
	t.Logf("%d of %d jobs ran more than once; %d keys of MaxActive 2 ran two at once; longest time without a start %v",
		rerun, len(all), full, gap.Round(time.Millisecond))
}

// countingHandler counts the clients' warnings and logs the first few.
type countingHandler struct {
	t      *testing.T
	n      *atomic.Int64
	client int
	attrs  []slog.Attr
}

func (h *countingHandler) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }

func (h *countingHandler) Handle(_ context.Context, r slog.Record) error {
	if h.n.Add(1) <= 30 {
		s := fmt.Sprintf("client %d: %s", h.client, r.Message)
		r.Attrs(func(a slog.Attr) bool { s += " " + a.String(); return true })
		h.t.Log(s)
	}
	return nil
}

func (h *countingHandler) WithAttrs(as []slog.Attr) slog.Handler {
	c := *h
	c.attrs = append(append([]slog.Attr(nil), h.attrs...), as...)
	return &c
}

func (h *countingHandler) WithGroup(string) slog.Handler { return h }
