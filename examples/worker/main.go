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
// (JOBKEYS_EXAMPLE_JOBS) and KV buckets (JOBS_KEYS_example-worker and
// JOBKEYS_EXAMPLE_ENDED) first.
//
// Retries: a redelivered message is run as a retry only if the job has no
// end recorded in the ENDED bucket; every way a job ends (done, failed for
// good, its worker stopped renewing) is recorded there before the message is
// acked or terminated. See "Retries" in the package docs for what the
// delivery count alone cannot tell apart.
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

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jobkeys/jobkeys"
)

const (
	service     = "example-worker"
	jobType     = "render"
	streamName  = "JOBKEYS_EXAMPLE_JOBS"
	endedBucket = "JOBKEYS_EXAMPLE_ENDED" // how each job ended, by job id
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
		srv, stopServer, err := startServer()
		if err != nil {
			return err
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

	// The library: a store over NATS KV, a coordinator, the job type's
	// handle, one watcher for the process, a runner and a sweeper.
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
	jt, err := coord.JobType(service, jobType, policy) // names and policy checked once
	if err != nil {
		return err
	}
	watcher, err := jobkeys.NewWatcher(store)
	if err != nil {
		return err
	}
	defer watcher.Close()
	ended, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: endedBucket, Storage: jetstream.FileStorage})
	if err != nil {
		return fmt.Errorf("create KV bucket %s: %w", endedBucket, err)
	}
	t := newTracker(ended, len(batch)+len(crashed))
	runner, err := newRunner(ctx, jt, watcher, t)
	if err != nil {
		return err
	}
	sweeper, err := newSweeper(ctx, jt, t)
	if err != nil {
		return err
	}

	// Workers of an earlier run crashed while they held slots: their leases
	// run out a second from now. The next globex job takes that slot over;
	// nothing else waits for hooli, so the sweeper removes that one.
	for _, c := range crashed {
		if err := simulateCrash(ctx, jt, c); err != nil {
			return err
		}
	}

	// The producer admits each job under its tenant's key, then publishes it.
	cons, err := setupStream(ctx, js)
	if err != nil {
		return err
	}
	for _, j := range batch {
		if err := publish(ctx, js, jt, t, j); err != nil {
			return err
		}
	}

	workCtx, stopWork := context.WithCancel(ctx)
	defer stopWork()
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := sweeper.Run(workCtx); err != nil && !errors.Is(err, context.Canceled) {
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

// newRunner makes the runner of the job type's handle: it waits for a
// busy tenant through watcher for up to 700 ms, says when a job waits,
// and records as failed the jobs whose expired slots it takes over.
func newRunner(ctx context.Context, jt *jobkeys.JobType, watcher *jobkeys.Watcher, t *tracker) (*jobkeys.Runner, error) {
	return jobkeys.NewRunner(jt, &jobkeys.RunnerConfig{
		Watcher: watcher,
		MaxWait: 700 * time.Millisecond, // then nak, freeing the worker for other tenants
		OnBlocked: func(jobID string, a jobkeys.Acquisition) {
			say("%-9s waits: tenant %s is busy (%s)", jobID, a.DisplayKey, a.Reason)
		},
		OnStale: func(lease jobkeys.Lease, stale []jobkeys.ActiveSlot) {
			for _, s := range stale {
				say("%-9s took over the expired slot of %s (worker %s stopped renewing): recording %s as failed",
					lease.JobID, s.JobID, s.InstanceID, s.JobID)
				if err := t.finish(ctx, s.JobID, "failed: its worker stopped renewing"); err != nil {
					say("cannot record the end of %s: %v", s.JobID, err)
				}
			}
		},
	})
}

// newSweeper makes the sweeper of the job type's keys, every 250 ms: it
// records as failed the jobs whose expired slots it removes.
func newSweeper(ctx context.Context, jt *jobkeys.JobType, t *tracker) (*jobkeys.Sweeper, error) {
	return jobkeys.NewSweeper(jt, 250*time.Millisecond, func(rep jobkeys.SweepReport, err error) {
		if err != nil && !errors.Is(err, context.Canceled) {
			say("sweeper: %v", err)
		}
		for _, s := range rep.Removed {
			say("sweeper: removed the expired slot of %s (tenant %s, worker %s): recording it as failed", s.Slot.JobID, s.DisplayKey, s.Slot.InstanceID)
			if err := t.finish(ctx, s.Slot.JobID, "failed: its worker stopped renewing"); err != nil {
				say("sweeper: cannot record the end of %s: %v", s.Slot.JobID, err)
			}
		}
	})
}

// startServer starts a NATS server with JetStream in this process, on a free
// port of 127.0.0.1, storing into a temporary directory; stop shuts it down
// and removes the directory.
func startServer() (srv *server.Server, stop func(), err error) {
	dir, err := os.MkdirTemp("", "jobkeys-worker-*")
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
		return nil, nil, errors.New("embedded NATS server: not ready after 10s")
	}
	return srv, stop, nil
}

// reset deletes the example's stream and buckets, left over from an earlier
// run against the same server.
func reset(ctx context.Context, js jetstream.JetStream, bucket string) error {
	if err := js.DeleteStream(ctx, streamName); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
		return fmt.Errorf("delete stream %s: %w", streamName, err)
	}
	for _, b := range []string{bucket, endedBucket} {
		if err := js.DeleteKeyValue(ctx, b); err != nil && !errors.Is(err, jetstream.ErrBucketNotFound) {
			return fmt.Errorf("delete KV bucket %s: %w", b, err)
		}
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
		Durable:   "workers",
		AckPolicy: jetstream.AckExplicitPolicy,
		AckWait:   10 * time.Second,
		// Naks of busy tenants count as deliveries. A message that runs out
		// of them leaves its job queued: make MaxDeliver generous.
		MaxDeliver: 50,
	})
	if err != nil {
		return nil, fmt.Errorf("create consumer of %s: %w", streamName, err)
	}
	return cons, nil
}

// publish admits j, and publishes it only if it was queued; if the publish
// fails the job is taken out of the queue again.
func publish(ctx context.Context, js jetstream.JetStream, jt *jobkeys.JobType, t *tracker, j job) error {
	data, err := json.Marshal(j)
	if err != nil {
		return err
	}
	adm, err := jt.Admit(ctx, j.ID, data)
	if err != nil {
		return fmt.Errorf("admit %s: %w", j.ID, err)
	}
	switch adm.Kind {
	case jobkeys.KindAccepted:
	case jobkeys.KindReplaced:
		// (Not with this policy.) The oldest waiting job was dropped for
		// this one: record its end, so that a redelivery of its message is
		// not run as a retry.
		if err := t.finish(ctx, adm.Replaced.ID, "replaced by "+j.ID); err != nil {
			_, rsErr := jt.RestoreReplaced(ctx, j.ID, data, *adm.Replaced)
			return errors.Join(fmt.Errorf("record the end of %s: %w", adm.Replaced.ID, err), rsErr)
		}
	default:
		// With Reject (the default WhenFull) a full queue rejects; this
		// batch fits, so it would be a bug here.
		return fmt.Errorf("admit %s: %s (%s, %d queued, limit %d)", j.ID, adm.Kind, adm.Reason, adm.Queued, adm.Limit)
	}
	if _, err := js.Publish(ctx, subject, data, jetstream.WithMsgID(j.ID)); err != nil {
		_, rmErr := jt.RemoveQueued(ctx, j.ID, data)
		return errors.Join(fmt.Errorf("publish %s: %w", j.ID, err), rmErr)
	}
	say("queued    %-9s tenant %s", j.ID, j.Tenant)
	return nil
}

// simulateCrash admits and acquires j with another instance id, and never
// renews or releases it.
func simulateCrash(ctx context.Context, jt *jobkeys.JobType, j job) error {
	payload, err := json.Marshal(j)
	if err != nil {
		return err
	}
	if _, err := jt.Admit(ctx, j.ID, payload); err != nil {
		return fmt.Errorf("admit %s: %w", j.ID, err)
	}
	acq, err := jt.Acquire(ctx, j.ID, payload, jobkeys.WithInstanceID("crashed-worker"))
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
	// A job whose end is recorded is over: this is a redelivery after a
	// lost ack, or after its worker stopped renewing and its slot was
	// taken over.
	end, err := w.tracker.ended(ctx, j.ID)
	switch {
	case err != nil:
		say("worker %d: %-9s cannot read its record (%v): nak", w.id, j.ID, err)
		w.settle(msg, func() error { return msg.NakWithDelay(time.Second) }, "nak", j.ID)
		return
	case end != "":
		say("worker %d: %-9s ended already (%s): dropping the message", w.id, j.ID, end)
		w.settle(msg, msg.Ack, "ack", j.ID)
		return
	}
	attempt := int(meta.NumDelivered)
	opts := []jobkeys.AcquireOption{jobkeys.WithTries(attempt)}
	if attempt > 1 {
		// Delivered before and not ended: the earlier attempt failed and
		// released its slot, or its worker froze or died (then the slot
		// is taken over once its lease expires). The job runs again.
		opts = append(opts, jobkeys.WithRetry())
	}
	started := time.Now()
	res, err := w.runner.Run(ctx, j.ID, msg.Data(), func(ctx context.Context, lease jobkeys.Lease) error {
		// Keep the message from being redelivered to another worker while
		// this one is alive and holds the lease.
		defer keepInProgress(ctx, msg, policy.HeartbeatInterval)()
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
	}, opts...)

	var blocked *jobkeys.BlockedError
	switch {
	case errors.As(err, &blocked) && blocked.Acquisition.Reason == jobkeys.ReasonNotQueued:
		say("worker %d: %-9s is not queued (removed, replaced or never admitted): dropping the message", w.id, j.ID)
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
		w.end(ctx, msg, msg.Ack, "ack", j.ID, "done (stale completion)")
	case err != nil && attempt >= maxAttempts:
		say("worker %d: %-9s failed for good: %v", w.id, j.ID, err)
		w.end(ctx, msg, msg.Term, "term", j.ID, "failed: "+err.Error())
	case err != nil:
		say("worker %d: %-9s failed (%v): nak, retry in %v", w.id, j.ID, err, nakDelay)
		w.settle(msg, func() error { return msg.NakWithDelay(nakDelay) }, "nak", j.ID)
	default:
		waited := ""
		if res.Waited > time.Millisecond {
			waited = fmt.Sprintf(", waited %v for the slot", res.Waited.Round(time.Millisecond))
		}
		say("worker %d: %-9s done   (%v%s)", w.id, j.ID, time.Since(started).Round(time.Millisecond), waited)
		w.end(ctx, msg, msg.Ack, "ack", j.ID, "done")
	}
}

// keepInProgress tells the server every interval that msg is still being
// worked on, until the returned function is called.
func keepInProgress(ctx context.Context, msg jetstream.Msg, interval time.Duration) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				_ = msg.InProgress() // a failure shows as a redelivery, which the record handles
			}
		}
	}()
	return func() {
		cancel()
		<-done
	}
}

// end records how job jobID ended, then settles its message. If the record
// cannot be written the message is not settled: it is redelivered and
// retried.
func (w *worker) end(ctx context.Context, msg jetstream.Msg, op func() error, what, jobID, result string) {
	if err := w.tracker.finish(ctx, jobID, result); err != nil {
		say("worker %d: %s: cannot record its end (%v): leaving the message to be redelivered", w.id, jobID, err)
		return
	}
	w.settle(msg, op, what, jobID)
}

// settle acks, naks or terminates a message and reports a failure to do so
// (the message is then redelivered after AckWait).
func (w *worker) settle(msg jetstream.Msg, op func() error, what, jobID string) {
	if err := op(); err != nil {
		say("worker %d: %s of %s failed: %v (it will be redelivered)", w.id, what, jobID, err)
	}
}

// tracker records how each job ended, in the ENDED bucket (which every
// worker process reads before running a job) and in memory for the summary,
// and checks that no tenant ever ran two jobs at once.
type tracker struct {
	kv      jetstream.KeyValue
	mu      sync.Mutex
	want    int
	results map[string]string
	active  map[string]int
	peak    map[string]int
	done    chan struct{}
}

func newTracker(kv jetstream.KeyValue, want int) *tracker {
	return &tracker{kv: kv, want: want, results: map[string]string{}, active: map[string]int{}, peak: map[string]int{}, done: make(chan struct{})}
}

func (t *tracker) running(tenant string, delta int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.active[tenant] += delta
	t.peak[tenant] = max(t.peak[tenant], t.active[tenant])
}

// ended returns how job jobID ended, or "" if it has not.
func (t *tracker) ended(ctx context.Context, jobID string) (string, error) {
	e, err := t.kv.Get(ctx, jobID)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	return string(e.Value()), nil
}

// finish records that job jobID ended with result; the first end recorded
// stays (the sweeper and a takeover may both see a crash).
func (t *tracker) finish(ctx context.Context, jobID, result string) error {
	if _, err := t.kv.Create(ctx, jobID, []byte(result)); err != nil && !errors.Is(err, jetstream.ErrKeyExists) {
		return err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.results[jobID]; ok {
		return nil
	}
	t.results[jobID] = result
	if len(t.results) == t.want {
		close(t.done)
	}
	return nil
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
