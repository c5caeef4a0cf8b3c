// Command worker is a small worker service built on jobkeys: jobs arrive on
// a JetStream work-queue stream, each runs under a lease that keeps at most
// one job per tenant running at a time, and is acked when done.
//
// It starts an embedded NATS server unless NATS_URL is set, publishes a
// batch of jobs for three tenants, runs them with four worker goroutines,
// prints what happens, and exits when every job is finished (a few seconds).
//
//	go run ./examples/worker
//	NATS_URL=nats://127.0.0.1:4222 go run ./examples/worker
//
// With NATS_URL the example deletes and recreates its own stream
// (JOBKEYS_EXAMPLE_JOBS) and KV bucket (JOBS_KEYS_example-worker) first.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/signal"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jobkeys/jobkeys"
	"github.com/jobkeys/jobkeys/internal/natstest"
)

const (
	service     = "example-worker"
	jobType     = "render"
	streamName  = "JOBKEYS_EXAMPLE_JOBS"
	subject     = "jobkeys.example.jobs"
	workers     = 4
	maxAttempts = 5
	nakDelay    = 300 * time.Millisecond // when a tenant stays busy, or a job failed
)

// policy: one running job per tenant; up to ten more may wait per tenant.
// Leases are short so that the crashed worker below is noticed quickly;
// production values are seconds to minutes.
var policy = jobkeys.Policy{
	Key:               []string{"/tenant"},
	MaxActive:         1,
	MaxQueuedPerKey:   10,
	HeartbeatInterval: 250 * time.Millisecond,
	HeartbeatTTL:      time.Second,
	StalePolicy:       jobkeys.FailStale,
}

// job is the message body.
type job struct {
	ID     string `json:"id"`
	Tenant string `json:"tenant"`
	WorkMS int    `json:"workMs"`
	// FailOnce makes the first attempt fail, to show a retry.
	FailOnce bool `json:"failOnce,omitempty"`
}

// crashed are jobs whose worker died holding their slot.
var crashed = []job{{ID: "globex-0", Tenant: "globex"}, {ID: "hooli-0", Tenant: "hooli"}}

var batch = []job{
	{ID: "acme-1", Tenant: "acme", WorkMS: 300},
	{ID: "acme-2", Tenant: "acme", WorkMS: 250},
	{ID: "globex-1", Tenant: "globex", WorkMS: 200},
	{ID: "acme-3", Tenant: "acme", WorkMS: 300},
	{ID: "initech-1", Tenant: "initech", WorkMS: 250, FailOnce: true},
	{ID: "acme-4", Tenant: "acme", WorkMS: 200},
	{ID: "globex-2", Tenant: "globex", WorkMS: 300},
	{ID: "initech-2", Tenant: "initech", WorkMS: 200},
	{ID: "acme-5", Tenant: "acme", WorkMS: 250},
	{ID: "globex-3", Tenant: "globex", WorkMS: 200},
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		os.Exit(1)
	}
}

func run() error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, time.Minute) // a demo should never hang
	defer cancel()

	url := os.Getenv("NATS_URL")
	if url == "" {
		srv, stopServer, err := natstest.Start(natstest.Options{})
		if err != nil {
			return fmt.Errorf("start embedded NATS server: %w", err)
		}
		defer stopServer()
		url = srv.ClientURL()
		say("started an embedded NATS server at %s (set NATS_URL to use another)", url)
	}
	nc, err := nats.Connect(url, nats.Name("jobkeys example worker"))
	if err != nil {
		return fmt.Errorf("connect to %s: %w", url, err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("jetstream: %w", err)
	}

	// The library: a store over NATS KV, a coordinator, one watcher for the
	// process, a runner and a sweeper.
	store, err := jobkeys.NewNATSStore(js, jobkeys.WithCreateBuckets(jetstream.FileStorage, 1))
	if err != nil {
		return err
	}
	if err := reset(ctx, js, store.BucketName(service)); err != nil {
		return err
	}
	coord, err := jobkeys.NewCoordinator(store, nil)
	if err != nil {
		return err
	}
	watcher, err := jobkeys.NewWatcher(store)
	if err != nil {
		return err
	}
	defer watcher.Close()
	t := newTracker(len(batch) + len(crashed))
	runner, err := jobkeys.NewRunner(coord, &jobkeys.RunnerConfig{
		Watcher: watcher,
		MaxWait: 700 * time.Millisecond, // then nak, freeing the worker for other tenants
		OnBlocked: func(req jobkeys.AcquireRequest, a jobkeys.Acquisition) {
			say("%-9s waits: tenant %s is busy (%s)", req.JobID, a.Key, a.Reason)
		},
		OnStale: func(lease jobkeys.Lease, stale []jobkeys.ActiveSlot) {
			for _, s := range stale {
				say("%-9s took over the expired slot of %s (worker %s stopped renewing): recording %s as failed",
					lease.JobID, s.JobID, s.InstanceID, s.JobID)
				t.finish(s.JobID, "failed: its worker stopped renewing")
			}
		},
	})
	if err != nil {
		return err
	}
	sweeper, err := jobkeys.NewSweeper(coord)
	if err != nil {
		return err
	}

	// Workers of an earlier run crashed while they held slots: their leases
	// run out a second from now. The next globex job takes that slot over;
	// nothing else waits for hooli, so the sweeper removes that one.
	for _, c := range crashed {
		if err := simulateCrash(ctx, coord, c); err != nil {
			return err
		}
	}

	// The producer admits each job under its tenant's key, then publishes it.
	cons, err := setupStream(ctx, js)
	if err != nil {
		return err
	}
	for _, j := range batch {
		if err := publish(ctx, js, coord, j); err != nil {
			return err
		}
	}

	workCtx, stopWork := context.WithCancel(ctx)
	defer stopWork()
	var wg sync.WaitGroup
	wg.Go(func() {
		err := sweeper.Run(workCtx, jobkeys.SweepRequest{Service: service, JobType: jobType, Policy: policy}, 250*time.Millisecond,
			func(rep jobkeys.SweepReport, err error) {
				if err != nil {
					say("sweeper: %v", err)
				}
				for _, s := range rep.Removed {
					say("sweeper: removed the expired slot of %s (tenant %s, worker %s): recording it as failed", s.Slot.JobID, s.Key, s.Slot.InstanceID)
					t.finish(s.Slot.JobID, "failed: its worker stopped renewing")
				}
			})
		if err != nil && !errors.Is(err, context.Canceled) {
			say("sweeper stopped: %v", err)
		}
	})
	for i := 1; i <= workers; i++ {
		w := &worker{id: i, runner: runner, tracker: t}
		wg.Go(func() { w.loop(workCtx, cons) })
	}

	select {
	case <-t.done:
	case <-ctx.Done():
	}
	stopWork()
	wg.Wait()
	if ctx.Err() != nil {
		return fmt.Errorf("stopped before every job finished: %w", context.Cause(ctx))
	}
	t.summary()
	return nil
}

// reset deletes the example's stream and bucket, left over from an earlier
// run against the same server.
func reset(ctx context.Context, js jetstream.JetStream, bucket string) error {
	if err := js.DeleteStream(ctx, streamName); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
		return fmt.Errorf("delete stream %s: %w", streamName, err)
	}
	if err := js.DeleteKeyValue(ctx, bucket); err != nil && !errors.Is(err, jetstream.ErrBucketNotFound) {
		return fmt.Errorf("delete KV bucket %s: %w", bucket, err)
	}
	return nil
}

func setupStream(ctx context.Context, js jetstream.JetStream) (jetstream.Consumer, error) {
	_, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name:      streamName,
		Subjects:  []string{subject},
		Retention: jetstream.WorkQueuePolicy,
		Storage:   jetstream.FileStorage,
	})
	if err != nil {
		return nil, fmt.Errorf("create stream %s: %w", streamName, err)
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, streamName, jetstream.ConsumerConfig{
		Durable:    "workers",
		AckPolicy:  jetstream.AckExplicitPolicy,
		AckWait:    10 * time.Second,
		MaxDeliver: 50, // naks of busy tenants count as deliveries
	})
	if err != nil {
		return nil, fmt.Errorf("create consumer of %s: %w", streamName, err)
	}
	return cons, nil
}

// publish admits j, and publishes it only if it was queued; if the publish
// fails the job is taken out of the queue again.
func publish(ctx context.Context, js jetstream.JetStream, coord *jobkeys.KeyCoordinator, j job) error {
	data, err := json.Marshal(j)
	if err != nil {
		return err
	}
	adm, err := coord.Admit(ctx, jobkeys.AdmitRequest{Service: service, JobType: jobType, JobID: j.ID, Payload: data, Policy: policy})
	if err != nil {
		return fmt.Errorf("admit %s: %w", j.ID, err)
	}
	if adm.Kind != jobkeys.KindAccepted {
		// With Reject (the default WhenFull) a full queue rejects; this
		// batch fits, so it would be a bug here.
		return fmt.Errorf("admit %s: %s (%s, %d queued, limit %d)", j.ID, adm.Kind, adm.Reason, adm.Queued, adm.Limit)
	}
	if _, err := js.Publish(ctx, subject, data, jetstream.WithMsgID(j.ID)); err != nil {
		_, rmErr := coord.RemoveQueued(ctx, jobkeys.RemoveRequest{Service: service, JobType: jobType, JobID: j.ID, Payload: data, Policy: policy})
		return errors.Join(fmt.Errorf("publish %s: %w", j.ID, err), rmErr)
	}
	say("queued    %-9s tenant %s", j.ID, j.Tenant)
	return nil
}

// simulateCrash admits and acquires j with another instance id, and never
// renews or releases it.
func simulateCrash(ctx context.Context, coord *jobkeys.KeyCoordinator, j job) error {
	payload, err := json.Marshal(j)
	if err != nil {
		return err
	}
	if _, err := coord.Admit(ctx, jobkeys.AdmitRequest{Service: service, JobType: jobType, JobID: j.ID, Payload: payload, Policy: policy}); err != nil {
		return fmt.Errorf("admit %s: %w", j.ID, err)
	}
	acq, err := coord.Acquire(ctx, jobkeys.AcquireRequest{Service: service, JobType: jobType, JobID: j.ID, Payload: payload, Policy: policy, InstanceID: "crashed-worker"})
	if err != nil {
		return fmt.Errorf("acquire for %s: %w", j.ID, err)
	}
	if acq.Kind != jobkeys.KindAcquired {
		return fmt.Errorf("acquire for %s: %s (%s)", j.ID, acq.Kind, acq.Reason)
	}
	say("%-9s holds tenant %s, but its worker crashed: the lease lapses at %s", j.ID, j.Tenant, acq.Lease.LeaseExpiresAt.Format("15:04:05.000"))
	return nil
}

type worker struct {
	id      int
	runner  *jobkeys.Runner
	tracker *tracker
}

// loop takes messages one at a time until ctx ends.
func (w *worker) loop(ctx context.Context, cons jetstream.Consumer) {
	it, err := cons.Messages(jetstream.PullMaxMessages(1))
	if err != nil {
		say("worker %d: cannot consume: %v", w.id, err)
		return
	}
	defer it.Stop()
	for {
		msg, err := it.Next(jetstream.NextContext(ctx))
		if ctx.Err() != nil {
			if msg != nil {
				w.settle(msg, msg.Nak, "nak (shutting down)", "a message")
			}
			return
		}
		if err != nil {
			say("worker %d: next message: %v", w.id, err)
			continue
		}
		w.handle(ctx, msg)
	}
}

func (w *worker) handle(ctx context.Context, msg jetstream.Msg) {
	var j job
	if err := json.Unmarshal(msg.Data(), &j); err != nil || j.ID == "" {
		say("worker %d: bad message %q (%v): terminating it", w.id, msg.Data(), err)
		w.settle(msg, msg.Term, "term", "a bad message")
		return
	}
	meta, err := msg.Metadata()
	if err != nil {
		say("worker %d: %s: no metadata (%v): nak", w.id, j.ID, err)
		w.settle(msg, msg.Nak, "nak", j.ID)
		return
	}
	attempt := int(meta.NumDelivered)
	req := jobkeys.AcquireRequest{
		Service: service, JobType: jobType, JobID: j.ID, Payload: msg.Data(), Policy: policy,
		// A redelivered job whose earlier run failed is no longer queued:
		// it acquires as a retry.
		Retry: attempt > 1,
		Tries: attempt,
	}
	started := time.Now()
	res, err := w.runner.Run(ctx, req, func(ctx context.Context, lease jobkeys.Lease) error {
		w.tracker.running(j.Tenant, +1)
		defer w.tracker.running(j.Tenant, -1)
		say("worker %d: %-9s runs   (tenant %s, attempt %d)", w.id, j.ID, j.Tenant, attempt)
		if j.FailOnce && attempt == 1 {
			return errors.New("simulated failure")
		}
		select {
		case <-time.After(time.Duration(j.WorkMS) * time.Millisecond):
			return nil
		case <-ctx.Done():
			return context.Cause(ctx) // lease lost, or shutting down
		}
	})

	var blocked *jobkeys.BlockedError
	switch {
	case errors.As(err, &blocked) && blocked.Acquisition.Reason == jobkeys.ReasonNotQueued:
		say("worker %d: %-9s is not queued (finished or removed already): dropping the message", w.id, j.ID)
		w.settle(msg, msg.Ack, "ack", j.ID)
	case errors.As(err, &blocked):
		say("worker %d: %-9s still blocked after %v: nak, retry in %v", w.id, j.ID, time.Since(started).Round(time.Millisecond), nakDelay)
		w.settle(msg, func() error { return msg.NakWithDelay(nakDelay) }, "nak", j.ID)
	case ctx.Err() != nil:
		say("worker %d: %-9s interrupted: %v", w.id, j.ID, err)
		w.settle(msg, msg.Nak, "nak", j.ID)
	case res.Lease.JobID == "": // the acquisition failed: the store is unreachable or the state is bad
		say("worker %d: %-9s could not acquire: %v", w.id, j.ID, err)
		w.settle(msg, func() error { return msg.NakWithDelay(time.Second) }, "nak", j.ID)
	case errors.Is(err, jobkeys.ErrStaleCompletion):
		// The work was done, but the slot had been taken over meanwhile:
		// another run of the tenant may have overlapped. Keep the result,
		// and make it visible.
		say("worker %d: %-9s WARNING: %v", w.id, j.ID, err)
		w.settle(msg, msg.Ack, "ack", j.ID)
		w.tracker.finish(j.ID, "done (stale completion)")
	case err != nil && attempt >= maxAttempts:
		say("worker %d: %-9s failed for good: %v", w.id, j.ID, err)
		w.settle(msg, msg.Term, "term", j.ID)
		w.tracker.finish(j.ID, "failed: "+err.Error())
	case err != nil:
		say("worker %d: %-9s failed (%v): nak, retry in %v", w.id, j.ID, err, nakDelay)
		w.settle(msg, func() error { return msg.NakWithDelay(nakDelay) }, "nak", j.ID)
	default:
		waited := ""
		if res.Waited > time.Millisecond {
			waited = fmt.Sprintf(", waited %v for the slot", res.Waited.Round(time.Millisecond))
		}
		say("worker %d: %-9s done   (%v%s)", w.id, j.ID, time.Since(started).Round(time.Millisecond), waited)
		w.settle(msg, msg.Ack, "ack", j.ID)
		w.tracker.finish(j.ID, "done")
	}
}

// settle acks, naks or terminates a message and reports a failure to do so
// (the message is then redelivered after AckWait).
func (w *worker) settle(msg jetstream.Msg, op func() error, what, jobID string) {
	if err := op(); err != nil {
		say("worker %d: %s of %s failed: %v (it will be redelivered)", w.id, what, jobID, err)
	}
}

// tracker records how each job ended and checks that no tenant ever ran two
// jobs at once.
type tracker struct {
	mu      sync.Mutex
	want    int
	results map[string]string
	active  map[string]int
	peak    map[string]int
	done    chan struct{}
}

func newTracker(want int) *tracker {
	return &tracker{want: want, results: map[string]string{}, active: map[string]int{}, peak: map[string]int{}, done: make(chan struct{})}
}

func (t *tracker) running(tenant string, delta int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.active[tenant] += delta
	t.peak[tenant] = max(t.peak[tenant], t.active[tenant])
}

func (t *tracker) finish(jobID, result string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.results[jobID]; ok {
		return // reported twice (the sweeper and a takeover may both see a crash)
	}
	t.results[jobID] = result
	if len(t.results) == t.want {
		close(t.done)
	}
}

func (t *tracker) summary() {
	t.mu.Lock()
	defer t.mu.Unlock()
	say("all %d jobs finished:", len(t.results))
	for _, j := range append(crashed[:len(crashed):len(crashed)], batch...) {
		say("  %-9s %s", j.ID, t.results[j.ID])
	}
	for _, tenant := range slices.Sorted(maps.Keys(t.peak)) {
		say("  tenant %-8s at most %d job(s) at once (policy: %d)", tenant, t.peak[tenant], policy.MaxActive)
	}
}

var (
	sayMu sync.Mutex
	start = time.Now()
)

// say prints one line of progress with the time since the start.
func say(format string, args ...any) {
	sayMu.Lock()
	defer sayMu.Unlock()
	fmt.Printf("[%5.2fs] %s\n", time.Since(start).Seconds(), fmt.Sprintf(format, args...))
}
