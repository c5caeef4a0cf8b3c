// Command quickstart shows the jobkeys job system at work on an embedded
// NATS server: no setup, no ports to configure, done in seconds.
//
// Each process sets up in one call (jobs.NewNATSClient: the job bucket,
// the key bucket and the key coordinator over one JetStream context). A
// producer, whose kind has no Work (it runs nothing), enqueues a burst of
// report jobs, each with a Type and an Input only, for a handful of
// tenants under a key policy (at most 2 run per tenant, 2 more may wait,
// and a newer job replaces the oldest waiting one). Three workers, each
// with its own NATS connection as separate processes would have, run them. Some jobs fail
// once and are retried with backoff; one worker crashes in the middle of a
// job, which another worker takes over once the crashed claim runs out.
// Between the enqueues and the workers it shows the keys as the key layer
// keeps them (jobkeys.JobType.InspectKeys). At the end every job is
// accounted for: completed, or replaced (and never run), with the highest
// number of jobs that ran at once per tenant.
//
//	go run ./examples/quickstart
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sort"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jobkeys/jobkeys"
	"github.com/jobkeys/jobkeys/jobs"
)

// report is the job's input: the key template points at its tenant.
type report struct {
	Tenant string `json:"tenant"`
	N      int    `json:"n"`
}

// result is the job's artifact.
type result struct {
	Worker string `json:"worker"`
}

var policy = jobkeys.Policy{
	Key:               []string{"tenant", "/tenant"},
	MaxActive:         2,
	MaxQueuedPerKey:   2,
	WhenFull:          jobkeys.ReplaceOldest,
	HeartbeatInterval: 250 * time.Millisecond, // short, so the crash is taken over quickly
	HeartbeatTTL:      1500 * time.Millisecond,
}

// The burst each tenant sends: acme floods, the others stay in their limits.
var tenants = []struct {
	name string
	jobs int
}{{"acme", 7}, {"globex", 4}, {"initech", 3}, {"umbrella", 1}}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "quickstart:", err)
		os.Exit(1)
	}
}

func run() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv, stop, err := startServer()
	if err != nil {
		return err
	}
	defer stop()
	fmt.Printf("jobkeys quickstart: embedded NATS server at %s\n", srv.ClientURL())

	var aud audit
	producer, err := newNode(srv.ClientURL(), "producer", &aud)
	if err != nil {
		return err
	}
	defer producer.close()

	ids, err := enqueueBurst(ctx, producer, &aud)
	if err != nil {
		return err
	}

	// The key layer underneath: each tenant is one key of the job type,
	// and the enqueues above were admissions on it. Nothing runs yet, so
	// each key holds its queued jobs only.
	fmt.Println("\nthe keys, as the key layer (jobkeys.JobType.InspectKeys) sees them before any worker starts")
	fmt.Println("(a queue holds MaxQueuedPerKey jobs plus one for each free slot: 2 + 2 while none runs):")
	if err := producer.printKeys(ctx); err != nil {
		return err
	}

	fmt.Println("\nrunning three workers (each its own connection); w3 crashes mid-job:")
	workers, err := startWorkers(ctx, srv.ClientURL(), &aud)
	for _, w := range workers {
		defer w.close()
	}
	if err != nil {
		return err
	}
	if err := awaitOver(ctx, producer, ids, &aud); err != nil {
		return err
	}
	for _, w := range workers {
		if err := w.client.Stop(ctx); err != nil {
			return err
		}
	}

	if err := accountFor(ctx, producer, ids, &aud); err != nil {
		return err
	}
	ticks, twice := aud.digests()
	fmt.Printf("\nthe periodic digest (every second, declared by all three workers): %d ticks, one job each", ticks)
	if twice > 0 {
		fmt.Printf(" (%d ran again after its worker died mid-run)", twice)
	}
	fmt.Println()
	fmt.Println("\nthe keys afterwards (a key whose state is empty is deleted):")
	if err := producer.printKeys(ctx); err != nil {
		return err
	}
	fmt.Println("\nnext: examples/worker uses the key layer alone (JobType, Runner, Watcher, Sweeper)")
	fmt.Println("for jobs that live in a stream of your own; examples/jobstore the job store alone.")
	return nil
}

// enqueueBurst enqueues each tenant's burst through the producer and
// returns the ids of the jobs enqueued (made by Enqueue, jobs.NewID), in
// order.
func enqueueBurst(ctx context.Context, producer *node, aud *audit) ([]string, error) {
	fmt.Println("\nenqueueing (key tenant:<tenant>, 2 running + 2 waiting per tenant, replace the oldest):")
	var ids []string
	for _, t := range tenants {
		for i := 1; i <= t.jobs; i++ {
			// Type and Input are all a job needs: its id, channel
			// (jobs.ChannelDefault), target, idempotency key and
			// fingerprint default.
			res, err := producer.client.Enqueue(ctx, jobs.EnqueueRequest{
				Type: "report", Input: fmt.Appendf(nil, `{"tenant":%q,"n":%d}`, t.name, i),
			})
			label := fmt.Sprintf("%s-%02d", t.name, i)
			var rej *jobs.RejectedError
			switch {
			case errors.As(err, &rej):
				fmt.Printf("  %-12s rejected: %s (limit %d)\n", label, rej.Reason, rej.Limit)
			case err != nil:
				return nil, err
			case res.Outcome == jobs.OutcomeReplaced:
				fmt.Printf("  %-12s accepted, replacing %s (its record is superseded: it will not run)\n", label, aud.labelOf(res.Replaced.ID))
			default:
				fmt.Printf("  %-12s %s\n", label, res.Outcome)
			}
			if err == nil {
				aud.label(res.Job.ID, label)
				ids = append(ids, res.Job.ID)
			}
		}
	}
	return ids, nil
}

// startWorkers starts the three workers, each on a connection of its own;
// it returns those it made, for the caller to close, even with an error.
func startWorkers(ctx context.Context, url string, aud *audit) ([]*node, error) {
	var workers []*node
	for _, name := range []string{"w1", "w2", "w3"} {
		w, err := newNode(url, name, aud)
		if err != nil {
			return workers, err
		}
		workers = append(workers, w)
		if err := w.client.Start(ctx); err != nil {
			return workers, err
		}
	}
	return workers, nil
}

// awaitOver waits until every job of ids is over: completed, failed or
// superseded.
func awaitOver(ctx context.Context, producer *node, ids []string, aud *audit) error {
	for _, id := range ids {
		for {
			d, err := producer.client.Get(ctx, jobs.ChannelDefault, id)
			if err != nil {
				return err
			}
			if !d.Job.State.Active() {
				break
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("job %s still %s: %w", aud.labelOf(id), d.Job.State, ctx.Err())
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
	return nil
}

// accountFor prints what happened to every job of ids and the most jobs
// that ran at once per tenant; it fails when a tenant ran more than the
// policy allows, or a job is neither completed nor replaced before it ran.
func accountFor(ctx context.Context, producer *node, ids []string, aud *audit) error {
	fmt.Println("\nwhat happened to every job (attempts count claims, so a job the crashed w3 had")
	fmt.Println("claimed counts an attempt even if it never ran there):")
	lost := 0
	for _, id := range ids {
		d, err := producer.client.Get(ctx, jobs.ChannelDefault, id)
		if err != nil {
			return err
		}
		line, ok := aud.outcome(id, d)
		if !ok {
			lost++
		}
		fmt.Println(line)
	}
	fmt.Println("\nthe most jobs that ran at once, per tenant (the limit is 2):")
	peaks := aud.peaks()
	names := make([]string, 0, len(peaks))
	for t := range peaks {
		names = append(names, t)
	}
	sort.Strings(names)
	for _, t := range names {
		fmt.Printf("  %-10s %d\n", t, peaks[t])
		if peaks[t] > policy.MaxActive {
			return fmt.Errorf("tenant %s ran %d jobs at once", t, peaks[t])
		}
	}
	if lost > 0 {
		return fmt.Errorf("%d jobs were not accounted for", lost)
	}
	fmt.Println("\nevery job is accounted for; none ran after it was replaced.")
	return nil
}

// outcome is the line that says what happened to job id (d), and
// whether it is accounted for: completed, or superseded without having
// run.
func (a *audit) outcome(id string, d jobs.Detail) (line string, ok bool) {
	j := d.Job
	line = fmt.Sprintf("  %-12s %-10s ran %d, attempts %d, failures %d", a.labelOf(id), j.State, a.runCount(id), j.Attempts, j.Failures)
	switch {
	case j.State == jobs.StateCompleted:
		return line + ", done by " + string(d.Artifact.Value), true
	case j.State == jobs.StateSuperseded && a.ran(id):
		return line + ", " + j.Reason + " (but it ran!)", false
	case j.State == jobs.StateSuperseded:
		return line + ", " + j.Reason, true
	default:
		return line, false
	}
}

// node is one process: its connection and its client.
type node struct {
	name   string
	nc     *nats.Conn
	keys   *jobkeys.JobType // the key layer's handle of the job type, for inspection
	client *jobs.Client
}

// printKeys lists the job type's keys: who runs, who waits, against the
// policy's limits.
func (n *node) printKeys(ctx context.Context) error {
	infos, err := n.keys.InspectKeys(ctx)
	if err != nil {
		return err
	}
	if len(infos) == 0 {
		fmt.Println("  (no keys)")
	}
	sort.Slice(infos, func(i, j int) bool { return infos[i].DisplayKey < infos[j].DisplayKey })
	for _, k := range infos {
		fmt.Printf("  %-16s running %d of %d, waiting %d of %d\n", k.DisplayKey, k.Active, k.MaxActive, k.Queued, k.QueueLimit)
	}
	return nil
}

func newNode(url, name string, aud *audit) (*node, error) {
	nc, err := nats.Connect(url, nats.Name(name))
	if err != nil {
		return nil, err
	}
	n := &node{name: name, nc: nc}
	if err := n.setup(aud); err != nil {
		nc.Close()
		return nil, err
	}
	return n, nil
}

func (n *node) setup(aud *audit) error {
	js, err := jetstream.New(n.nc)
	if err != nil {
		return err
	}
	// The whole setup: the job bucket and the key bucket (created when
	// missing; memory storage for the demonstration, file storage by
	// default) and the key coordinator, over one JetStream context.
	cfg := &jobs.ClientConfig{
		Service:    "quickstart",
		Owner:      n.name,
		MaxWorkers: 2,
		// Quick retries and polls for the demonstration; the defaults are
		// 1 s · 2^(n−1) and 1 s.
		Backoff:      jobs.ExponentialBackoff(200*time.Millisecond, 5*time.Second),
		PollInterval: 100 * time.Millisecond,
		StopGrace:    2 * time.Second,
		Buckets:      jobs.Buckets{Storage: jetstream.MemoryStorage},
		// Finished jobs are deleted by the server after their retention
		// (the defaults: 24 h, failed jobs 7 days).
		Retention: jobs.Retention{Completed: time.Hour},
	}
	if n.name != "producer" {
		// A periodic job: every worker declares it, and each tick makes
		// one job whatever the number of workers (its id names the tick).
		cfg.Periodic = []jobs.Periodic{{Name: "digest", Type: "digest", Input: []byte(`{"scope":"all"}`), Every: time.Second}}
	}
	n.client, err = jobs.NewNATSClient(js, cfg)
	if err != nil {
		return err
	}
	if n.name == "producer" {
		if err := n.inspector(js); err != nil {
			return err
		}
		// The producer enqueues and runs nothing: its kind has no Work.
		return jobs.Register(n.client, jobs.Kind[report, result]{Type: "report", Policy: policy})
	}
	type digest struct {
		Scope string `json:"scope"`
	}
	if err := jobs.Register(n.client, jobs.Kind[digest, struct{}]{
		Type: "digest", Policy: jobkeys.Policy{Key: []string{"digest", "/scope"}, MaxActive: 1, MaxQueuedPerKey: 1,
			HeartbeatInterval: policy.HeartbeatInterval, HeartbeatTTL: policy.HeartbeatTTL},
		Work: func(ctx context.Context, run *jobs.Run, _ digest) (struct{}, error) {
			aud.digested(run.Job().ID)
			return struct{}{}, nil
		},
	}); err != nil {
		return err
	}
	return jobs.Register(n.client, jobs.Kind[report, result]{
		Type: "report", Version: 1, Policy: policy, MaxFailures: 3, Timeout: 10 * time.Second,
		Work: func(ctx context.Context, run *jobs.Run, in report) (result, error) {
			job := run.Job()
			label := aud.labelOf(job.ID)
			end := aud.start(in.Tenant, job.ID)
			defer end()
			fmt.Printf("  %s runs %-12s (attempt %d)\n", n.name, label, job.Attempts)
			if n.name == "w3" && job.Attempts == 1 && !aud.crashed() {
				// The crash: the connection drops mid-job, nothing is
				// written. Another worker claims the job once its claim
				// runs out.
				fmt.Printf("  %s crashes while running %s\n", n.name, label)
				n.nc.Close()
				<-ctx.Done()
				return result{}, context.Cause(ctx)
			}
			if in.N%3 == 0 && job.Failures == 0 {
				// An error is a failed attempt: the client requeues the
				// job with backoff and counts a failure (it fails the job
				// for good at MaxFailures).
				fmt.Printf("  %s fails %-11s (simulated error): requeued with backoff\n", n.name, label)
				return result{}, fmt.Errorf("the report service timed out for %s", label)
			}
			if err := run.Progress("render", "rendering the report", jobs.ProgressStarted); err != nil {
				return result{}, err
			}
			select {
			case <-time.After(time.Duration(50+in.N*20) * time.Millisecond):
			case <-ctx.Done():
				return result{}, context.Cause(ctx)
			}
			return result{Worker: n.name}, nil
		},
	})
}

// inspector makes the key layer's handle of the job type, only to look
// at the keys (an operator's view, as "jobkeys keys ls" has): the same
// service, job type and policy as the kind.
func (n *node) inspector(js jetstream.JetStream) error {
	keys, err := jobkeys.NewNATSStore(js)
	if err != nil {
		return err
	}
	coord, err := jobkeys.NewCoordinator(keys, &jobkeys.Config{InstanceID: n.name + "-inspector"})
	if err != nil {
		return err
	}
	n.keys, err = coord.JobType("quickstart", "report", policy)
	return err
}

// close stops the client (which closes the job store it made, after its
// background purges) and closes the connection.
func (n *node) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := n.client.Stop(ctx); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", n.name, err)
	}
	n.nc.Close()
}

// audit records, from the handlers themselves, who ran and how many jobs
// of a tenant ran at once.
type audit struct {
	mu      sync.Mutex
	running map[string]int
	peak    map[string]int
	runs    map[string]int
	labels  map[string]string // job id → tenant-n, for the output
	crash   bool
	digest  map[string]int // runs of each periodic digest job
}

// digested records a run of periodic digest job id.
func (a *audit) digested(id string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.digest == nil {
		a.digest = make(map[string]int)
	}
	a.digest[id]++
}

// digests returns how many digest jobs ran, and how many ran more than
// once.
func (a *audit) digests() (ticks, twice int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, n := range a.digest {
		ticks++
		if n > 1 {
			twice++
		}
	}
	return ticks, twice
}

// label names job id for the output.
func (a *audit) label(id, label string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.labels == nil {
		a.labels = map[string]string{}
	}
	a.labels[id] = label
}

// labelOf is the name of job id in the output (its id if it has none).
func (a *audit) labelOf(id string) string {
	a.mu.Lock()
	defer a.mu.Unlock()
	if l, ok := a.labels[id]; ok {
		return l
	}
	return id
}

func (a *audit) start(tenant, id string) (end func()) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.running == nil {
		a.running, a.peak, a.runs = map[string]int{}, map[string]int{}, map[string]int{}
	}
	a.running[tenant]++
	a.peak[tenant] = max(a.peak[tenant], a.running[tenant])
	a.runs[id]++
	return func() {
		a.mu.Lock()
		a.running[tenant]--
		a.mu.Unlock()
	}
}

func (a *audit) crashed() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	c := a.crash
	a.crash = true
	return c
}

func (a *audit) ran(id string) bool {
	return a.runCount(id) > 0
}

// runCount is how many times a handler started on the job.
func (a *audit) runCount(id string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.runs[id]
}

func (a *audit) peaks() map[string]int {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make(map[string]int, len(a.peak))
	for k, v := range a.peak {
		out[k] = v
	}
	return out
}

// startServer starts a NATS server with JetStream in this process, on a free
// port of 127.0.0.1, storing into a temporary directory; stop shuts it down
// and removes the directory.
func startServer() (srv *server.Server, stop func(), err error) {
	dir, err := os.MkdirTemp("", "jobkeys-quickstart-*")
	if err != nil {
		return nil, nil, err
	}
	srv, err = server.NewServer(&server.Options{
		Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: dir, NoLog: true, NoSigs: true})
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, nil, fmt.Errorf("embedded NATS server: %w", err)
	}
	stop = func() {
		srv.Shutdown()
		srv.WaitForShutdown()
		_ = os.RemoveAll(dir)
	}
	go srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		stop()
		return nil, nil, fmt.Errorf("embedded NATS server: not ready after 10s")
	}
	return srv, stop, nil
}
