package jobkeys_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
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
	"github.com/jobkeys/jobkeys/jobs"
)

// The jobs runtime (package jobs) over targeted wake-ups, seen from the
// wake-up counters of its key stores (WakeCountsOf, watch_job_test.go):
// jobs.Client processes on connections of their own share a job bucket
// and a key bucket.

var wakeRuntimeSeq atomic.Int64

// readCountingKeys is a key store that counts its reads (Get). It embeds
// the NATSStore, so it keeps the store's wake-ups and watches.
type readCountingKeys struct {
	*jobkeys.NATSStore
	gets atomic.Int64
}

func (k *readCountingKeys) Get(ctx context.Context, service, key string) ([]byte, uint64, error) {
	k.gets.Add(1)
	return k.NATSStore.Get(ctx, service, key)
}

// waitingLog is a client's logger that closes seen when the client logs
// that job waits for its slot.
type waitingLog struct {
	job  string
	once sync.Once
	seen chan struct{}
}

func (w *waitingLog) Enabled(context.Context, slog.Level) bool { return true }
func (w *waitingLog) WithAttrs([]slog.Attr) slog.Handler       { return w }
func (w *waitingLog) WithGroup(string) slog.Handler            { return w }

func (w *waitingLog) Handle(_ context.Context, r slog.Record) error {
	if r.Message != "jobs: waiting" {
		return nil
	}
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "job" && a.Value.String() == w.job {
			w.once.Do(func() { close(w.seen) })
			return false
		}
		return true
	})
	return nil
}

// wakeRuntime is the buckets and the kind the processes of one test share.
type wakeRuntime struct {
	t       *testing.T
	srv     *server.Server
	bucket  string // the job bucket
	service string // the key layer's
	policy  jobkeys.Policy
	gate    chan struct{} // job "a" runs until it closes
	started chan string   // every job's id as its handler starts
}

func newWakeRuntime(t *testing.T) *wakeRuntime {
	n := wakeRuntimeSeq.Add(1)
	return &wakeRuntime{
		t: t, srv: natstest.Run(t), bucket: fmt.Sprintf("JOBS_WJ%d", n), service: fmt.Sprintf("wj%d", n),
		// Claims and leases last two minutes: no expiry wakes a waiter
		// during the test; the running job heartbeats every 50 ms.
		policy: jobkeys.Policy{Key: []string{"/doc"}, MaxActive: 1, MaxQueuedPerKey: 5,
			HeartbeatInterval: 50 * time.Millisecond, HeartbeatTTL: 2 * time.Minute},
		gate: make(chan struct{}), started: make(chan string, 8),
	}
}

// wakeProcess is one process: its key store and its client.
type wakeProcess struct {
	keys   *readCountingKeys
	client *jobs.Client
}

// process connects a process whose key store has wake-ups if wakeUps is
// set; its client rechecks blocked jobs every recheck. The client is
// stopped when the test ends.
func (e *wakeRuntime) process(wakeUps bool, maxWorkers int, recheck time.Duration, log slog.Handler) *wakeProcess {
	t := e.t
	_, js := natstest.Connect(t, e.srv)
	st, err := jobs.NewNATSStore(js, nil, jobs.WithBucket(e.bucket), jobs.WithCreateBucket(jetstream.MemoryStorage, 1))
	require.NoError(t, err)
	opts := []jobkeys.NATSStoreOption{jobkeys.WithCreateBuckets(jetstream.MemoryStorage, 1)}
	if wakeUps {
		opts = append(opts, jobkeys.WithWakeUps(""))
	}
	ks, err := jobkeys.NewNATSStore(js, opts...)
	require.NoError(t, err)
	keys := &readCountingKeys{NATSStore: ks}
	coord, err := jobkeys.NewCoordinator(keys, nil)
	require.NoError(t, err)
	cfg := jobs.ClientConfig{KeyStore: keys, Service: e.service, MaxWorkers: maxWorkers,
		PollInterval: 20 * time.Millisecond, RecheckInterval: recheck, ReconcileInterval: -1, StopGrace: 2 * time.Second}
	if log != nil {
		cfg.Logger = slog.New(log)
	}
	c, err := jobs.NewClient(st, coord, &cfg)
	require.NoError(t, err)
	require.NoError(t, jobs.Register(c, jobs.Kind[json.RawMessage, string]{Type: "w", Policy: e.policy,
		Work: func(ctx context.Context, run *jobs.Run, in json.RawMessage) (string, error) {
			e.started <- run.Job().ID
			if run.Job().ID == "a" {
				select {
				case <-e.gate:
				case <-ctx.Done():
				}
			}
			return "", nil
		}}))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		assert.NoError(t, c.Stop(ctx))
	})
	return &wakeProcess{keys: keys, client: c}
}

func (e *wakeRuntime) enqueue(p *wakeProcess, id string) {
	_, err := p.client.Enqueue(context.Background(), jobs.EnqueueRequest{ID: id, ChannelID: "ch", Type: "w", TargetKey: id,
		IdempotencyKey: id, Fingerprint: id, Input: json.RawMessage(`{"doc":"d"}`)})
	require.NoError(e.t, err)
}

// startedJob returns the next job whose handler started, failing the test
// when none does within 30 s.
func (e *wakeRuntime) startedJob(what string) string {
	e.t.Helper()
	select {
	case id := <-e.started:
		return id
	case <-time.After(30 * time.Second):
		e.t.Fatalf("no job started: %s", what)
		return ""
	}
}

// kvKey is the KV key of the test's jobs.
func (e *wakeRuntime) kvKey() string {
	k, err := jobkeys.DeriveKey(e.service, "w", []byte(`{"doc":"d"}`), e.policy.Key)
	require.NoError(e.t, err)
	return k.KVKey
}

// runAThenB runs job "a" in process A (one worker: it claims nothing else
// while a runs) and queues job "b" behind it, claimed by process B, and
// returns once b waits for its slot.
func (e *wakeRuntime) runAThenB(a, b *wakeProcess, bLog *waitingLog) {
	ctx := context.Background()
	e.enqueue(a, "a")
	require.NoError(e.t, a.client.Start(ctx))
	require.Equal(e.t, "a", e.startedJob("a in process A"))
	e.enqueue(a, "b")
	require.NoError(e.t, b.client.Start(ctx))
	select {
	case <-bLog.seen:
	case <-time.After(30 * time.Second):
		e.t.Fatal("b never waited for its slot in process B")
	}
}

// TestJobsClientWokenByItsOwnWakeUp is the regression test for the jobs
// runtime over targeted wake-ups, which waited on a KV watch of the key:
// the release of the slot sent its wake-up to the queued job's subject,
// where nobody subscribed (every release then walked up to free+64 jobs
// answered "no responders", twice), and every heartbeat of the running
// job let a waiter of the key try (a read). Now the blocked job of
// process B waits for its own job's wake-up: the release in process A
// reaches it (received, not answered 503), it starts long before its
// recheck (a minute), and the heartbeats of A's running job, which free
// nothing, make B read nothing.
func TestJobsClientWokenByItsOwnWakeUp(t *testing.T) {
	t.Parallel()
	e := newWakeRuntime(t)
	bLog := &waitingLog{job: "b", seen: make(chan struct{})}
	a := e.process(true, 1, time.Minute, nil)
	b := e.process(true, 4, time.Minute, bLog)
	e.runAThenB(a, b, bLog)

	// Heartbeats of a: at least three writes of the key.
	ctx := context.Background()
	_, rev0, err := a.keys.NATSStore.Get(ctx, e.service, e.kvKey())
	require.NoError(t, err)
	reads0 := b.keys.gets.Load()
	require.Eventually(t, func() bool {
		_, rev, err := a.keys.NATSStore.Get(ctx, e.service, e.kvKey())
		return err == nil && rev >= rev0+3
	}, 30*time.Second, 10*time.Millisecond, "a's heartbeats")
	assert.Equal(t, reads0, b.keys.gets.Load(), "reads of process B while a heartbeats (b was tried)")
	select {
	case id := <-e.started:
		t.Fatalf("job %s started while a held the slot", id)
	default:
	}

	close(e.gate)
	// The recheck is a minute away: only a wake-up starts b this soon
	// (30 s, for a loaded machine).
	require.Equal(t, "b", e.startedJob("b woken by a's release"))
	published, local, noResponders, _ := jobkeys.WakeCountsOf(a.keys.NATSStore)
	_, _, _, received := jobkeys.WakeCountsOf(b.keys.NATSStore)
	t.Logf("process A: %d wake-ups published, %d local, %d answered 503; process B: %d received", published, local, noResponders, received)
	assert.Positive(t, published, "wake-ups process A published")
	assert.Positive(t, received, "wake-ups process B received")
	assert.Zero(t, noResponders, "wake-ups answered 503: sent to a job nobody waited for")
}

// TestJobsClientWakeUpsFallBackToRecheck: a writer without wake-ups (a
// key store without WithWakeUps, as the TS original) releases the slot a
// job of a process with wake-ups waits for: no wake-up comes, and the job
// starts at its recheck (200 ms).
func TestJobsClientWakeUpsFallBackToRecheck(t *testing.T) {
	t.Parallel()
	e := newWakeRuntime(t)
	bLog := &waitingLog{job: "b", seen: make(chan struct{})}
	a := e.process(false, 1, time.Minute, nil)
	b := e.process(true, 4, 200*time.Millisecond, bLog)
	e.runAThenB(a, b, bLog)
	close(e.gate)
	require.Equal(t, "b", e.startedJob("b at its recheck after a's release"))
	_, _, _, received := jobkeys.WakeCountsOf(b.keys.NATSStore)
	assert.Zero(t, received, "wake-ups received from a writer without wake-ups")
}

// settleCounter is a job store that calls settled after every successful
// settle: the end of a job's cycle.
type settleCounter struct {
	jobs.Store
	settled func()
}

func (s *settleCounter) Settle(ctx context.Context, req jobs.SettleRequest) (jobs.Detail, error) {
	d, err := s.Store.Settle(ctx, req)
	if err == nil {
		s.settled()
	}
	return d, err
}

// BenchmarkJobsClientWakeUps is the jobs runtime's job cycle (enqueue →
// claim + acquire → settle + release) on one key (MaxActive 1) with 16
// workers in two clients on connections of their own, over key stores
// with wake-ups, reporting per job the key stores' reads and their
// wake-ups: published to the other process, answered "no responders"
// (503: nobody subscribed to the job's subject) and received, and the
// acquisitions out of queue order (see queueOrder). Run with
//
//	go test -run '^$' -bench JobsClientWakeUps -benchtime 2000x .
func BenchmarkJobsClientWakeUps(b *testing.B) {
	srv := natstest.Run(b)
	n := wakeRuntimeSeq.Add(1)
	bucket, service := fmt.Sprintf("JOBS_WB%d", n), fmt.Sprintf("wb%d", n)
	const workers, procs = 16, 2
	inflight := make(chan struct{}, 4*workers)
	var done, total atomic.Int64
	finished := make(chan struct{})
	keys := make([]*readCountingKeys, procs)
	clients := make([]*jobs.Client, procs)
	ctx := context.Background()
	for i := range clients {
		_, js := natstest.Connect(b, srv)
		st, err := jobs.NewNATSStore(js, nil, jobs.WithBucket(bucket), jobs.WithCreateBucket(jetstream.MemoryStorage, 1))
		require.NoError(b, err)
		ks, err := jobkeys.NewNATSStore(js, jobkeys.WithCreateBuckets(jetstream.MemoryStorage, 1), jobkeys.WithWakeUps(""))
		require.NoError(b, err)
		keys[i] = &readCountingKeys{NATSStore: ks}
		coord, err := jobkeys.NewCoordinator(keys[i], nil)
		require.NoError(b, err)
		signal := &settleCounter{Store: st, settled: func() {
			<-inflight
			if done.Add(1) == total.Load() {
				close(finished)
			}
		}}
		c, err := jobs.NewClient(signal, coord, &jobs.ClientConfig{KeyStore: keys[i], Service: service,
			MaxWorkers: workers / procs, PollInterval: 10 * time.Millisecond, ReconcileInterval: -1})
		require.NoError(b, err)
		require.NoError(b, jobs.Register(c, jobs.Kind[json.RawMessage, string]{Type: "bench",
			Policy: jobkeys.Policy{Key: []string{"/doc"}, MaxActive: 1, MaxQueuedPerKey: 4 * workers},
			Work:   func(ctx context.Context, run *jobs.Run, in json.RawMessage) (string, error) { return "", nil }}))
		require.NoError(b, c.Start(ctx))
		b.Cleanup(func() { require.NoError(b, c.Stop(ctx)) })
		clients[i] = c
	}
	// The order watch costs the server a delivery per write: turn it off
	// (JOBKEYS_BENCH_ORDER=off) to compare with a build without it.
	var order *queueOrder
	if os.Getenv("JOBKEYS_BENCH_ORDER") != "off" {
		order = watchQueueOrder(b, srv, service)
	}
	type counts struct{ reads, published, noResponders, received uint64 }
	sum := func() (s counts) {
		for _, k := range keys {
			p, _, nr, r := jobkeys.WakeCountsOf(k.NATSStore)
			s.reads += uint64(k.gets.Load())
			s.published += p
			s.noResponders += nr
			s.received += r
		}
		return s
	}
	total.Store(int64(b.N))
	b.ReportAllocs()
	b.ResetTimer()
	base := sum()
	var next atomic.Int64
	errs := make(chan error, workers)
	for range workers {
		go func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= b.N {
					errs <- nil
					return
				}
				inflight <- struct{}{}
				id := fmt.Sprint(i)
				if _, err := clients[0].Enqueue(ctx, jobs.EnqueueRequest{ID: id, ChannelID: "ch", Type: "bench", TargetKey: id,
					IdempotencyKey: id, Fingerprint: id, Input: json.RawMessage(`{"doc":"d"}`)}); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	for range workers {
		if err := <-errs; err != nil {
			b.Fatal(err)
		}
	}
	<-finished
	b.StopTimer()
	got := sum()
	per := func(v, from uint64) float64 { return float64(v-from) / float64(b.N) }
	b.ReportMetric(per(got.reads, base.reads), "key-reads/op")
	b.ReportMetric(per(got.published, base.published), "wakes-published/op")
	b.ReportMetric(per(got.noResponders, base.noResponders), "wakes-503/op")
	b.ReportMetric(per(got.received, base.received), "wakes-received/op")
	if order != nil {
		ooo, pairs := order.counts(b)
		b.ReportMetric(float64(ooo)/float64(b.N), "out-of-order/op")
		b.ReportMetric(float64(pairs)/float64(b.N), "order-checked/op")
	}
}

// queueOrder counts, from a watch of a service's key bucket on a
// connection of its own, the acquisitions that came out of queue order:
// a write that gave a slot to a queued job while another was queued ahead
// of it in the state it wrote over. Only consecutive revisions are
// compared (the bucket keeps a key's latest revision only: a watch may
// miss one); with one key in the bucket every write is one revision.
type queueOrder struct {
	mu         sync.Mutex
	prev       *jobkeys.KeyState
	prevRev    uint64
	pairs      int // consecutive revisions compared
	outOfOrder int
	stream     jetstream.Stream
	cancel     context.CancelFunc
	done       chan struct{}
}

func watchQueueOrder(b *testing.B, srv *server.Server, service string) *queueOrder {
	b.Helper()
	_, js := natstest.Connect(b, srv)
	ks, err := jobkeys.NewNATSStore(js, jobkeys.WithCreateBuckets(jetstream.MemoryStorage, 1))
	require.NoError(b, err)
	ctx, cancel := context.WithCancel(context.Background())
	kv, err := ks.KeyValue(ctx, service)
	require.NoError(b, err)
	w, err := kv.WatchAll(ctx, jetstream.UpdatesOnly())
	require.NoError(b, err)
	stream, err := js.Stream(ctx, "KV_"+ks.BucketName(service))
	require.NoError(b, err)
	o := &queueOrder{stream: stream, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(o.done)
		defer func() { _ = w.Stop() }()
		for {
			select {
			case <-ctx.Done():
				return
			case e, ok := <-w.Updates():
				if !ok {
					return
				}
				if e != nil {
					o.observe(e)
				}
			}
		}
	}()
	b.Cleanup(func() {
		cancel()
		<-o.done
	})
	return o
}

func (o *queueOrder) observe(e jetstream.KeyValueEntry) {
	st, err := jobkeys.ParseState(e.Value())
	if err != nil {
		st = nil
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.prev != nil && st != nil && e.Revision() == o.prevRev+1 {
		o.pairs++
		held := make(map[string]bool, len(o.prev.Active))
		for _, a := range o.prev.Active {
			held[a.JobID] = true
		}
		for _, a := range st.Active {
			if held[a.JobID] || len(o.prev.Queued) == 0 || o.prev.Queued[0].JobID == a.JobID {
				continue
			}
			for _, q := range o.prev.Queued[1:] {
				if q.JobID == a.JobID {
					o.outOfOrder++ // queued behind another job that was not given the slot
					break
				}
			}
		}
	}
	o.prev, o.prevRev = st, e.Revision()
}

// counts waits until the watch has seen the bucket's last revision, and
// returns the out-of-order acquisitions and the pairs compared.
func (o *queueOrder) counts(b *testing.B) (outOfOrder, pairs int) {
	b.Helper()
	info, err := o.stream.Info(context.Background())
	require.NoError(b, err)
	last := info.State.LastSeq
	require.Eventually(b, func() bool {
		o.mu.Lock()
		defer o.mu.Unlock()
		return o.prevRev >= last
	}, 30*time.Second, time.Millisecond, "the order watch sees revision %d", last)
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.outOfOrder, o.pairs
}

// A worker runtime of its own waits for a slot as a Runner does over
// targeted wake-ups: its blocked job subscribes to its own job's
// wake-ups, tries once more (a release may have come before the
// subscription) in the queue's order (WithQueueTurn), and tries again at
// each wake-up, keeping a recheck for writers without wake-ups; leaving
// without the slot, it hands its wake-up on (JobType.PassWakeUp).
func ExampleWatcher_SubscribeJob() {
	dir, err := os.MkdirTemp("", "jobkeys-example")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer os.RemoveAll(dir)
	srv, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: dir, NoLog: true, NoSigs: true})
	if err != nil {
		fmt.Println(err)
		return
	}
	srv.Start()
	defer srv.WaitForShutdown()
	defer srv.Shutdown()
	if !srv.ReadyForConnections(10 * time.Second) {
		fmt.Println("the server did not start")
		return
	}
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		fmt.Println(err)
		return
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		fmt.Println(err)
		return
	}
	store, err := jobkeys.NewNATSStore(js, jobkeys.WithWakeUps(""), jobkeys.WithCreateBuckets(jetstream.MemoryStorage, 1))
	if err != nil {
		fmt.Println(err)
		return
	}
	coord, err := jobkeys.NewCoordinator(store, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	// Before the connection closes, send the wake-ups a release holds back.
	defer coord.FlushWakeUps()
	jt, err := coord.JobType("billing", "sync", jobkeys.Policy{Key: []string{"/tenant"}, MaxActive: 1, MaxQueuedPerKey: 1})
	if err != nil {
		fmt.Println(err)
		return
	}
	watcher, err := jobkeys.NewWatcher(store)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer watcher.Close()
	ctx := context.Background()
	payload := []byte(`{"tenant":"acme"}`)
	for _, id := range []string{"sync-1", "sync-2"} {
		if _, err := jt.Admit(ctx, id, payload); err != nil {
			fmt.Println(err)
			return
		}
	}
	first, err := jt.Acquire(ctx, "sync-1", payload)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("sync-1:", first.Kind)

	// sync-2 is blocked: it waits for its own wake-ups.
	fmt.Println("wake-ups:", watcher.WakeUps())
	key, err := jt.Key(payload)
	if err != nil {
		fmt.Println(err)
		return
	}
	sub, err := watcher.SubscribeJob(ctx, jt, key.KVKey, "sync-2")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer sub.Close()
	released := make(chan error, 1)
	go func() { // another worker finishes sync-1
		_, err := jt.Release(ctx, first.Lease)
		released <- err
	}()
	recheck := time.NewTimer(5 * time.Second)
	defer recheck.Stop()
	// The try right after subscribing keeps the queue's order
	// (WithQueueTurn): it takes no slot freed for a job queued ahead of
	// it; the tries a wake-up or the recheck starts are its turn.
	opts := []jobkeys.AcquireOption{jobkeys.WithQueueTurn()}
	for {
		acq, err := jt.Acquire(ctx, "sync-2", payload, opts...) // once more after subscribing, then at each wake-up
		if err != nil {
			fmt.Println(err)
			return
		}
		if acq.Kind == jobkeys.KindAcquired {
			fmt.Println("sync-2:", acq.Kind)
			break
		}
		opts = nil
		select {
		case <-sub.Changed():
		case <-recheck.C: // a writer without wake-ups, or an expired lease
			recheck.Reset(5 * time.Second)
		case <-ctx.Done():
			// Leaving without the slot (here: cancelled): close the
			// subscription and hand a wake-up it may have had on to
			// the jobs after it.
			sub.Close()
			if err := jt.PassWakeUp(context.Background(), "sync-2", payload); err != nil {
				fmt.Println(err)
			}
			return
		}
	}
	if err := <-released; err != nil {
		fmt.Println(err)
	}
	// Output:
	// sync-1: acquired
	// wake-ups: true
	// sync-2: acquired
}
