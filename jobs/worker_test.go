package jobs_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jobkeys/jobkeys"
	"github.com/jobkeys/jobkeys/internal/natstest"
	"github.com/jobkeys/jobkeys/jobs"
)

// freezeStore is a job store whose claim renewals hang while frozen: the
// heartbeat of a worker frozen past its claim (a stopped process, a long
// GC pause).
type freezeStore struct {
	jobs.Store
	thawed chan struct{}
}

func (s *freezeStore) Renew(ctx context.Context, req jobs.RenewRequest) (jobs.Job, error) {
	<-s.thawed
	return s.Store.Renew(ctx, req)
}

var quickPolicy = jobkeys.Policy{
	Key: []string{"doc", "/doc"}, MaxActive: 1, MaxQueuedPerKey: 10,
	// A TTL far above the interval: a loaded machine must not lose leases.
	HeartbeatInterval: 100 * time.Millisecond, HeartbeatTTL: 3 * time.Second,
}

// A worker frozen past its claim loses the job to another worker, which
// completes it; when the frozen worker wakes its handler's context ends
// with ErrClaimLost and it writes nothing.
func TestClientFrozenWorkerLosesClaim(t *testing.T) {
	t.Parallel()
	env := newRuntimeEnv(t)
	fs := &freezeStore{thawed: make(chan struct{})}
	cfgA := fastConfig
	cfgA.MaxWorkers = 1 // the frozen handler holds the only worker: no reclaim by A
	a := env.newNode(cfgA, func(s jobs.Store) jobs.Store { fs.Store = s; return fs })
	b := env.newNode(fastConfig, nil)
	startedA := make(chan struct{})
	causeA := make(chan error, 1)
	var runsB atomic.Int64
	require.NoError(t, jobs.Register(a.client, jobs.Kind[docIn, docOut]{
		Type: "frozen", Policy: quickPolicy,
		Work: func(ctx context.Context, run *jobs.Run, in docIn) (docOut, error) {
			close(startedA)
			<-ctx.Done()
			causeA <- context.Cause(ctx)
			return docOut{By: "a"}, ctx.Err()
		},
	}))
	require.NoError(t, jobs.Register(b.client, jobs.Kind[docIn, docOut]{
		Type: "frozen", Policy: quickPolicy,
		Work: func(ctx context.Context, run *jobs.Run, in docIn) (docOut, error) {
			runsB.Add(1)
			return docOut{By: "b"}, nil
		},
	}))
	ctx := context.Background()
	_, err := a.client.Enqueue(ctx, enqueueReq("frozen", "j1", "t", "d"))
	require.NoError(t, err)
	require.NoError(t, a.client.Start(ctx))
	<-startedA
	require.NoError(t, b.client.Start(ctx))
	j := waitState(t, b, "j1", jobs.StateCompleted)
	close(fs.thawed)
	select {
	case cause := <-causeA:
		require.ErrorIs(t, cause, jobs.ErrClaimLost)
	case <-time.After(30 * time.Second):
		t.Fatal("the frozen handler's context never ended")
	}
	require.NoError(t, a.client.Stop(ctx))
	d, err := b.client.Get(ctx, "ch", "j1")
	require.NoError(t, err)
	assert.Equal(t, j.Revision, d.Job.Revision, "the frozen worker wrote nothing after it woke")
	require.NotNil(t, d.Artifact)
	assert.JSONEq(t, `{"by":"b"}`, string(d.Artifact.Value))
	assert.Equal(t, int64(1), runsB.Load())
	assert.Equal(t, 0, d.Job.Failures)
}

// A job replaced in its key's queue never runs: its record is superseded,
// and every other job completes.
func TestClientReplacedJobNeverRuns(t *testing.T) {
	t.Parallel()
	env := newRuntimeEnv(t)
	producer := env.newNode(fastConfig, nil)
	worker := env.newNode(debugConfig(fastConfig), nil)
	p := quickPolicy
	p.MaxQueuedPerKey, p.WhenFull = 1, jobkeys.ReplaceOldest
	gate := make(chan struct{})
	var l ledger
	for _, n := range []*node{producer, worker} {
		require.NoError(t, jobs.Register(n.client, jobs.Kind[docIn, docOut]{
			Type: "repl", Policy: p,
			Work: func(ctx context.Context, run *jobs.Run, in docIn) (docOut, error) {
				l.start(run)
				if run.Job().ID == "r0" {
					select {
					case <-gate:
					case <-ctx.Done():
					}
				}
				return docOut{By: run.Job().ID}, nil
			},
		}))
	}
	ctx := context.Background()
	require.NoError(t, worker.client.Start(ctx))
	_, err := producer.client.Enqueue(ctx, enqueueReq("repl", "r0", "t0", "d"))
	require.NoError(t, err)
	require.Eventually(t, func() bool { return l.count("r0") == 1 }, 30*time.Second, 10*time.Millisecond)
	res, err := producer.client.Enqueue(ctx, enqueueReq("repl", "r1", "t1", "d"))
	require.NoError(t, err)
	require.Equal(t, jobs.OutcomeAccepted, res.Outcome)
	// r1 waits in the key's queue (unclaimed); r2 replaces it.
	assert.Equal(t, jobs.StatePending, getJob(t, producer, "r1").State)
	res, err = producer.client.Enqueue(ctx, enqueueReq("repl", "r2", "t2", "d"))
	require.NoError(t, err)
	require.Equal(t, jobs.OutcomeReplaced, res.Outcome)
	require.Equal(t, "r1", res.Replaced.ID)
	close(gate)
	waitState(t, producer, "r0", jobs.StateCompleted)
	waitState(t, producer, "r2", jobs.StateCompleted)
	r1 := getJob(t, producer, "r1")
	assert.Equal(t, jobs.StateSuperseded, r1.State)
	assert.Equal(t, jobs.ReasonReplaced, r1.Reason)
	require.NoError(t, worker.client.Stop(ctx))
	assert.Equal(t, 0, l.count("r1"), "the replaced job never ran")
	assert.Equal(t, 1, l.count("r2"))
	assert.Equal(t, jobs.StateSuperseded, getJob(t, producer, "r1").State, "the stopping worker did not hand r1 back")
}

// A producer killed between the job record and its admission (here: its
// key-layer connection closed, so the admission fails after the record is
// written) leaves a pending job without a queue entry: a worker admits it
// after AdmitGrace, on the announcement the producer made before the
// record, and runs it. A queue entry whose job never arrived is removed by
// reconciliation.
func TestClientRepairsProducerKilledBetweenRecordAndAdmission(t *testing.T) {
	t.Parallel()
	env := newRuntimeEnv(t)
	producer, keysConn := env.newSplitNode(fastConfig)
	n := env.newNode(fastConfig, nil)
	var l ledger
	p := quickPolicy
	p.MaxQueuedPerKey, p.WhenFull = 1, jobkeys.Reject
	for _, c := range []*jobs.Client{producer.client, n.client} {
		require.NoError(t, jobs.Register(c, jobs.Kind[docIn, docOut]{
			Type: "orphan", Policy: p,
			Work: func(ctx context.Context, run *jobs.Run, in docIn) (docOut, error) {
				l.start(run)
				return docOut{}, nil
			},
		}))
	}
	ctx := context.Background()
	// The record of o1, then the crash: no admission.
	keysConn.Close()
	_, err := producer.client.Enqueue(ctx, enqueueReq("orphan", "o1", "t1", "a"))
	require.ErrorIs(t, err, jobs.ErrOutcomeUnknown)
	require.Equal(t, jobs.StatePending, getJob(t, n, "o1").State, "the record was written")
	// An admission whose record never came (the key layer's own user, or
	// a record deleted since), on another key.
	jt, err := n.coord.JobType(env.service, "orphan", p)
	require.NoError(t, err)
	_, err = jt.Admit(ctx, "ch/ghost", []byte(`{"doc":"b"}`))
	require.NoError(t, err)
	ghostKey, err := jt.Key([]byte(`{"doc":"b"}`))
	require.NoError(t, err)

	require.NoError(t, n.client.Start(ctx))
	waitState(t, n, "o1", jobs.StateCompleted)
	assert.Equal(t, 1, l.count("o1"))
	require.Eventually(t, func() bool {
		_, _, err := n.keys.Get(ctx, env.service, ghostKey.KVKey)
		return errors.Is(err, jobkeys.ErrKeyNotFound)
	}, 30*time.Second, 20*time.Millisecond, "the ghost's queue entry was never removed")
}

// Per-key concurrency never exceeds MaxActive across three clients on
// their own connections, audited from the handlers' own start and end
// times, and every job completes exactly once.
func TestClientPerKeyConcurrencyAcrossClients(t *testing.T) {
	t.Parallel()
	env := newRuntimeEnv(t)
	p := jobkeys.Policy{Key: []string{"doc", "/doc"}, MaxActive: 2, MaxQueuedPerKey: 100}
	audit := newKeyAudit()
	nodes := make([]*node, 3)
	for i := range nodes {
		cfg := fastConfig
		cfg.MaxWorkers = 4
		nodes[i] = env.newNode(cfg, nil)
		require.NoError(t, jobs.Register(nodes[i].client, jobs.Kind[docIn, docOut]{
			Type: "work", Policy: p,
			Work: audit.work(fmt.Sprint(i)),
		}))
	}
	ctx := context.Background()
	var ids []string
	for i := range 30 {
		req := enqueueReq("work", fmt.Sprintf("w%02d", i), fmt.Sprintf("t%d", i), fmt.Sprintf("k%d", i%3))
		req.Input = []byte(fmt.Sprintf(`{"doc":"k%d","n":%d}`, i%3, i))
		_, err := nodes[0].client.Enqueue(ctx, req)
		require.NoError(t, err)
		ids = append(ids, req.ID)
	}
	for _, n := range nodes {
		require.NoError(t, n.client.Start(ctx))
	}
	for _, id := range ids {
		waitState(t, nodes[0], id, jobs.StateCompleted)
	}
	audit.check(t, ids, []string{"k0", "k1", "k2"}, p.MaxActive)
}

// MaxWorkers bounds the handlers of one client, whatever the keys allow.
func TestClientMaxWorkers(t *testing.T) {
	t.Parallel()
	env := newRuntimeEnv(t)
	cfg := fastConfig
	cfg.MaxWorkers = 2
	n := env.newNode(cfg, nil)
	var cur, peak atomic.Int64
	require.NoError(t, jobs.Register(n.client, jobs.Kind[docIn, docOut]{
		Type: "mw", Policy: jobkeys.Policy{Key: []string{"/doc"}, MaxActive: 10},
		Work: func(ctx context.Context, run *jobs.Run, in docIn) (docOut, error) {
			c := cur.Add(1)
			for {
				p := peak.Load()
				if c <= p || peak.CompareAndSwap(p, c) {
					break
				}
			}
			time.Sleep(30 * time.Millisecond)
			cur.Add(-1)
			return docOut{}, nil
		},
	}))
	ctx := context.Background()
	for i := range 8 {
		_, err := n.client.Enqueue(ctx, enqueueReq("mw", fmt.Sprintf("m%d", i), fmt.Sprintf("t%d", i), fmt.Sprintf("d%d", i)))
		require.NoError(t, err)
	}
	require.NoError(t, n.client.Start(ctx))
	for i := range 8 {
		waitState(t, n, fmt.Sprintf("m%d", i), jobs.StateCompleted)
	}
	assert.LessOrEqual(t, peak.Load(), int64(2))
	assert.Positive(t, peak.Load())
}

// countingStore counts the writes of a job store.
type countingStore struct {
	jobs.Store
	writes atomic.Int64
}

func (s *countingStore) Claim(ctx context.Context, req jobs.ClaimRequest) ([]jobs.Job, error) {
	js, err := s.Store.Claim(ctx, req)
	if len(js) > 0 {
		s.writes.Add(1)
	}
	return js, err
}

func (s *countingStore) Renew(ctx context.Context, req jobs.RenewRequest) (jobs.Job, error) {
	s.writes.Add(1)
	return s.Store.Renew(ctx, req)
}

func (s *countingStore) Requeue(ctx context.Context, req jobs.RequeueRequest) (jobs.Job, error) {
	s.writes.Add(1)
	return s.Store.Requeue(ctx, req)
}

func (s *countingStore) Settle(ctx context.Context, req jobs.SettleRequest) (jobs.Detail, error) {
	s.writes.Add(1)
	return s.Store.Settle(ctx, req)
}

// A key at capacity costs no writes, to the job store or the key bucket,
// while its jobs wait, unclaimed, in its queue; the release announces the
// next (the recheck is a minute away).
func TestClientFullKeyWaitsWithoutWrites(t *testing.T) {
	t.Parallel()
	env := newRuntimeEnv(t)
	cs := &countingStore{}
	cfg := fastConfig
	cfg.ReconcileInterval = -1
	cfg.RecheckInterval = time.Minute // only the watch can wake them in time
	n := env.newNode(cfg, func(s jobs.Store) jobs.Store { cs.Store = s; return cs })
	gate := make(chan struct{})
	var l ledger
	require.NoError(t, jobs.Register(n.client, jobs.Kind[docIn, docOut]{
		Type: "full", Policy: jobkeys.Policy{Key: []string{"/doc"}, MaxActive: 1, MaxQueuedPerKey: 5},
		Work: func(ctx context.Context, run *jobs.Run, in docIn) (docOut, error) {
			l.start(run)
			if run.Job().ID == "a" {
				select {
				case <-gate:
				case <-ctx.Done():
				}
			}
			return docOut{}, nil
		},
	}))
	ctx := context.Background()
	_, err := n.client.Enqueue(ctx, enqueueReq("full", "a", "a", "d"))
	require.NoError(t, err)
	require.NoError(t, n.client.Start(ctx))
	require.Eventually(t, func() bool { return l.count("a") == 1 }, 30*time.Second, 10*time.Millisecond)
	for _, id := range []string{"b", "c"} {
		_, err := n.client.Enqueue(ctx, enqueueReq("full", id, id, "d"))
		require.NoError(t, err)
	}
	time.Sleep(100 * time.Millisecond) // b and c wait in the key's queue
	jobWrites, keyWrites := cs.writes.Load(), n.keys.writes.Load()
	time.Sleep(500 * time.Millisecond)
	assert.Equal(t, jobWrites, cs.writes.Load(), "job store writes while the key is full")
	assert.Equal(t, keyWrites, n.keys.writes.Load(), "key writes while the key is full")
	assert.Equal(t, 0, l.count("b")+l.count("c"))
	close(gate)
	waitState(t, n, "b", jobs.StateCompleted)
	waitState(t, n, "c", jobs.StateCompleted)
	j := getJob(t, n, "b")
	assert.Equal(t, 1, j.Attempts, "b was claimed once, when its turn came")
}

// A job paused in another process while it waits in its key's queue does
// not start when the slot frees; it runs after it is resumed.
func TestClientWaitingJobPausedElsewhereDoesNotStart(t *testing.T) {
	t.Parallel()
	env := newRuntimeEnv(t)
	worker := env.newNode(fastConfig, nil)
	control := env.newNode(fastConfig, nil)
	gate := make(chan struct{})
	var l ledger
	for _, n := range []*node{worker, control} {
		require.NoError(t, jobs.Register(n.client, jobs.Kind[docIn, docOut]{
			Type: "pw", Policy: jobkeys.Policy{Key: []string{"/doc"}, MaxActive: 1, MaxQueuedPerKey: 5},
			Work: func(ctx context.Context, run *jobs.Run, in docIn) (docOut, error) {
				l.start(run)
				if run.Job().ID == "a" {
					select {
					case <-gate:
					case <-ctx.Done():
					}
				}
				return docOut{}, nil
			},
		}))
	}
	ctx := context.Background()
	require.NoError(t, worker.client.Start(ctx))
	_, err := control.client.Enqueue(ctx, enqueueReq("pw", "a", "a", "d"))
	require.NoError(t, err)
	require.Eventually(t, func() bool { return l.count("a") == 1 }, 30*time.Second, 10*time.Millisecond)
	_, err = control.client.Enqueue(ctx, enqueueReq("pw", "b", "b", "d"))
	require.NoError(t, err)
	b := getJob(t, control, "b")
	_, err = control.client.Pause(ctx, jobs.PauseRequest{ChannelID: "ch", JobID: "b", ExpectedRevision: b.Revision, Reason: "operator"})
	require.NoError(t, err)
	close(gate)
	waitState(t, control, "a", jobs.StateCompleted)
	time.Sleep(3 * fastConfig.RecheckInterval) // the release woke b's wait
	assert.Equal(t, 0, l.count("b"), "the paused job started")
	b = getJob(t, control, "b")
	require.Equal(t, jobs.StatePaused, b.State)
	_, err = control.client.Resume(ctx, jobs.ResumeRequest{ChannelID: "ch", JobID: "b", ExpectedRevision: b.Revision})
	require.NoError(t, err)
	waitState(t, control, "b", jobs.StateCompleted)
	assert.Equal(t, 1, l.count("b"))
}

// A job of a type the client has no kind for is left to the clients that
// run it: the client does not claim it (no write); a handler that panics
// fails its attempt like an error.
func TestClientUnknownKindAndPanic(t *testing.T) {
	t.Parallel()
	env := newRuntimeEnv(t)
	n := env.newNode(fastConfig, nil)
	producer := env.newNode(fastConfig, nil)
	require.NoError(t, jobs.Register(n.client, jobs.Kind[docIn, docOut]{
		Type: "panics", Policy: docPolicy, MaxFailures: 1,
		Work: func(ctx context.Context, run *jobs.Run, in docIn) (docOut, error) { panic("handler bug") },
	}))
	for _, typ := range []string{"panics", "other"} {
		require.NoError(t, jobs.Register(producer.client, jobs.Kind[docIn, docOut]{Type: typ, Policy: docPolicy, Work: noWork}))
	}
	ctx := context.Background()
	_, err := producer.client.Enqueue(ctx, enqueueReq("other", "u1", "u", "d"))
	require.NoError(t, err)
	_, err = producer.client.Enqueue(ctx, enqueueReq("panics", "p1", "p", "d"))
	require.NoError(t, err)
	require.NoError(t, n.client.Start(ctx))
	p := waitState(t, n, "p1", jobs.StateFailed)
	assert.Contains(t, p.Reason, "panicked: handler bug")
	// u1 was announced before p1, and p1 ran: n saw u1 first and left it.
	u := getJob(t, n, "u1")
	assert.Equal(t, jobs.StatePending, u.State)
	assert.Equal(t, 0, u.Attempts, "a client without the kind claimed it")
}

// A job whose input derives no key under the worker's policy (a producer
// with another policy admitted it) is superseded with reason "bad-key" by
// the worker it is announced to, not left to come back forever.
func TestClientBadKeyRecordIsSuperseded(t *testing.T) {
	t.Parallel()
	env := newRuntimeEnv(t)
	producer := env.newNode(fastConfig, nil)
	n := env.newNode(fastConfig, nil)
	require.NoError(t, jobs.Register(producer.client, jobs.Kind[docIn, docOut]{Type: "bk", Policy: docPolicy, Work: noWork}))
	other := docPolicy
	other.Key = []string{"/missing"}
	require.NoError(t, jobs.Register(n.client, jobs.Kind[docIn, docOut]{Type: "bk", Policy: other, Work: noWork}))
	ctx := context.Background()
	_, err := producer.client.Enqueue(ctx, enqueueReq("bk", "b1", "b", "d"))
	require.NoError(t, err)
	require.NoError(t, n.client.Start(ctx))
	j := waitState(t, n, "b1", jobs.StateSuperseded)
	assert.Equal(t, jobs.ReasonBadKey, j.Reason)
	assert.Equal(t, 0, j.Attempts)
}

// The one window Enqueue leaves: a producer killed after its admission
// replaced a job but before it superseded that job's record. The replaced
// job is pending without an admission, is admitted again by the worker
// that claims it, and runs: it is not lost (see Client.Enqueue).
func TestClientProducerKilledBeforeSupersedingReplaced(t *testing.T) {
	t.Parallel()
	env := newRuntimeEnv(t)
	n := env.newNode(fastConfig, nil)
	p := quickPolicy
	p.MaxQueuedPerKey, p.WhenFull = 0, jobkeys.ReplaceOldest // one queued job per key
	var l ledger
	require.NoError(t, jobs.Register(n.client, jobs.Kind[docIn, docOut]{
		Type: "rk", Policy: p,
		Work: func(ctx context.Context, run *jobs.Run, in docIn) (docOut, error) { l.start(run); return docOut{}, nil },
	}))
	ctx := context.Background()
	_, err := n.client.Enqueue(ctx, enqueueReq("rk", "old", "t-old", "d"))
	require.NoError(t, err)
	// The producer of "new": the record, the admission that replaces
	// "old", then the crash.
	req := enqueueReq("rk", "new", "t-new", "d")
	req.Version = 1
	_, err = n.store.Enqueue(ctx, req)
	require.NoError(t, err)
	jt, err := n.coord.JobType(env.service, "rk", p)
	require.NoError(t, err)
	adm, err := jt.Admit(ctx, "ch/new", req.Input)
	require.NoError(t, err)
	require.Equal(t, jobkeys.KindReplaced, adm.Kind)
	require.Equal(t, "ch/old", adm.Replaced.ID)

	require.NoError(t, n.client.Start(ctx))
	waitState(t, n, "new", jobs.StateCompleted)
	waitState(t, n, "old", jobs.StateCompleted)
	assert.Equal(t, 1, l.count("new"))
	assert.Equal(t, 1, l.count("old"))
}

// debugConfig logs the client's debug lines to stderr when JOBS_DEBUG is
// set.
func debugConfig(cfg jobs.ClientConfig) jobs.ClientConfig {
	if os.Getenv("JOBS_DEBUG") != "" {
		cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return cfg
}

// failingRenewStore is a job store whose claim renewals fail at once with
// a transient error, recording the deadline each renewal was given.
type failingRenewStore struct {
	jobs.Store
	mu        sync.Mutex
	deadlines []time.Time
}

func (s *failingRenewStore) Renew(ctx context.Context, req jobs.RenewRequest) (jobs.Job, error) {
	d, _ := ctx.Deadline()
	s.mu.Lock()
	s.deadlines = append(s.deadlines, d)
	s.mu.Unlock()
	return jobs.Job{}, errors.New("renew: store unavailable (test)")
}

// A claim renewal after earlier ones failed may take until the local
// deadline (a margin before the claim expires), no longer: a renewal
// allowed a full heartbeat interval runs past it, and the handler with it,
// up to the moment another worker may claim the job.
func TestClientRenewalBoundedByLocalDeadline(t *testing.T) {
	t.Parallel()
	env := newRuntimeEnv(t)
	fs := &failingRenewStore{}
	n := env.newNode(fastConfig, func(s jobs.Store) jobs.Store { fs.Store = s; return fs })
	// Renewals at 350ms and 700ms after the claim; the local deadline is
	// 1s − 175ms: the second renewal has 125ms left, less than the interval.
	policy := jobkeys.Policy{
		Key: []string{"doc", "/doc"}, MaxActive: 1, MaxQueuedPerKey: 10,
		HeartbeatInterval: 350 * time.Millisecond, HeartbeatTTL: time.Second,
	}
	margin := 175 * time.Millisecond
	var once sync.Once
	expires := make(chan time.Time, 1)
	causes := make(chan error, 1)
	require.NoError(t, jobs.Register(n.client, jobs.Kind[docIn, docOut]{
		Type: "renew", Policy: policy, MaxFailures: 1,
		Work: func(ctx context.Context, run *jobs.Run, in docIn) (docOut, error) {
			<-ctx.Done()
			once.Do(func() {
				expires <- run.Job().ClaimExpiresAt
				causes <- context.Cause(ctx)
			})
			return docOut{}, ctx.Err()
		},
	}))
	ctx := context.Background()
	_, err := n.client.Enqueue(ctx, enqueueReq("renew", "j1", "t", "d"))
	require.NoError(t, err)
	require.NoError(t, n.client.Start(ctx))
	var exp time.Time
	select {
	case exp = <-expires:
	case <-time.After(30 * time.Second):
		t.Fatal("the handler's context never ended")
	}
	assert.ErrorIs(t, <-causes, jobs.ErrClaimLost)
	fs.mu.Lock()
	defer fs.mu.Unlock()
	require.NotEmpty(t, fs.deadlines)
	for i, d := range fs.deadlines {
		require.False(t, d.IsZero(), "renewal %d has no deadline", i)
		assert.Falsef(t, d.After(exp.Add(-margin+25*time.Millisecond)),
			"renewal %d may run until %v, past the local deadline %v", i, d, exp.Add(-margin))
	}
}

// A waiting job whose queue entry a producer's admission just replaced is
// not admitted again in a way that replaces the new job while that
// producer supersedes it: the repair of a missing admission admits
// strictly (never replacing), and a full queue leaves it to try again.
// Re-admitting it under the policy replaced the new job, and with the
// producer's supersede of the old one both were lost.
func TestClientWaitingReplacedJobNotReadmittedDuringSupersede(t *testing.T) {
	t.Parallel()
	env := newRuntimeEnv(t)
	cfg := fastConfig
	cfg.AdmitGrace = time.Second
	n := env.newNode(cfg, nil)
	p := jobkeys.Policy{
		Key: []string{"doc", "/doc"}, MaxActive: 1, MaxQueuedPerKey: 1, WhenFull: jobkeys.ReplaceOldest,
		HeartbeatInterval: 100 * time.Millisecond, HeartbeatTTL: 30 * time.Second,
	}
	var l ledger
	require.NoError(t, jobs.Register(n.client, jobs.Kind[docIn, docOut]{
		Type: "rw", Policy: p,
		Work: func(ctx context.Context, run *jobs.Run, in docIn) (docOut, error) { l.start(run); return docOut{}, nil },
	}))
	ctx := context.Background()
	jt, err := n.coord.JobType(env.service, "rw", p)
	require.NoError(t, err)
	// Another job holds the key's only slot.
	in, _ := json.Marshal(docIn{Doc: "d"})
	held, err := jt.Acquire(ctx, "other/holder", in, jobkeys.WithRetry())
	require.NoError(t, err)
	require.Equal(t, jobkeys.KindAcquired, held.Kind)

	_, err = n.client.Enqueue(ctx, enqueueReq("rw", "old", "t-old", "d"))
	require.NoError(t, err)
	time.Sleep(cfg.AdmitGrace) // "old" is older than the grace
	require.NoError(t, n.client.Start(ctx))

	// A producer enqueues "new": the record, the admission replacing
	// "old" (which wakes old's worker), then, a moment later, the
	// supersede of "old".
	req := enqueueReq("rw", "new", "t-new", "d")
	req.Version = 1
	_, err = n.store.Enqueue(ctx, req)
	require.NoError(t, err)
	adm, err := jt.Admit(ctx, "ch/new", req.Input)
	require.NoError(t, err)
	require.Equal(t, jobkeys.KindReplaced, adm.Kind)
	time.Sleep(100 * time.Millisecond)
	old := getJob(t, n, "old")
	_, err = n.store.Supersede(ctx, jobs.SupersedeRequest{ChannelID: "ch", JobID: "old", ExpectedRevision: old.Revision, Reason: jobs.ReasonReplaced})
	require.NoError(t, err)

	_, err = jt.Release(ctx, held.Lease)
	require.NoError(t, err)
	var j jobs.Job
	require.Eventually(t, func() bool {
		j = getJob(t, n, "new")
		return j.State == jobs.StateCompleted || j.State == jobs.StateSuperseded
	}, 30*time.Second, 20*time.Millisecond)
	require.Equalf(t, jobs.StateCompleted, j.State, "new is lost: %s (%s)", j.State, j.Reason)
	assert.Equal(t, 1, l.count("new"))
	assert.Equal(t, 0, l.count("old"))
}

// A result over ArtifactSizeLimit cannot be settled: the attempt is a
// failure (here the budget's last), not a job left running until its claim
// runs out and then run again, without end.
func TestClientOversizedResultIsAFailure(t *testing.T) {
	t.Parallel()
	env := newRuntimeEnv(t)
	n := env.newNode(fastConfig, nil)
	var runs atomic.Int64
	big := make([]byte, jobs.ArtifactSizeLimit)
	for i := range big {
		big[i] = 'x'
	}
	require.NoError(t, jobs.Register(n.client, jobs.Kind[docIn, docOut]{
		Type: "big", Policy: quickPolicy, MaxFailures: 1,
		Work: func(ctx context.Context, run *jobs.Run, in docIn) (docOut, error) {
			runs.Add(1)
			return docOut{By: string(big)}, nil
		},
	}))
	ctx := context.Background()
	_, err := n.client.Enqueue(ctx, enqueueReq("big", "j1", "t", "d"))
	require.NoError(t, err)
	require.NoError(t, n.client.Start(ctx))
	var j jobs.Job
	assert.Eventually(t, func() bool {
		j = getJob(t, n, "j1")
		return j.State == jobs.StateFailed
	}, 20*time.Second, 20*time.Millisecond)
	require.Equalf(t, jobs.StateFailed, j.State, "the job never failed (runs %d)", runs.Load())
	assert.Contains(t, j.Reason, "ArtifactSizeLimit")
	assert.Equal(t, int64(1), runs.Load())
}

// A handler error that is not valid UTF-8 still counts as a failure: the
// store refuses such a reason, which left the job running until its claim
// ran out, to be run again without a failure counted, without end.
func TestClientInvalidUTF8ErrorIsAFailure(t *testing.T) {
	t.Parallel()
	env := newRuntimeEnv(t)
	n := env.newNode(fastConfig, nil)
	var runs atomic.Int64
	require.NoError(t, jobs.Register(n.client, jobs.Kind[docIn, docOut]{
		Type: "utf", Policy: quickPolicy, MaxFailures: 1,
		Work: func(ctx context.Context, run *jobs.Run, in docIn) (docOut, error) {
			runs.Add(1)
			return docOut{}, errors.New("bad byte \xff here")
		},
	}))
	ctx := context.Background()
	_, err := n.client.Enqueue(ctx, enqueueReq("utf", "j1", "t", "d"))
	require.NoError(t, err)
	require.NoError(t, n.client.Start(ctx))
	var j jobs.Job
	assert.Eventually(t, func() bool {
		j = getJob(t, n, "j1")
		return j.State == jobs.StateFailed
	}, 20*time.Second, 20*time.Millisecond)
	require.Equalf(t, jobs.StateFailed, j.State, "the job never failed (runs %d)", runs.Load())
	assert.Contains(t, j.Reason, "bad byte")
	assert.Equal(t, int64(1), runs.Load())
}

// gatedKeys is a key store whose next update, once armed, waits for
// release: a slot acquisition in flight.
type gatedKeys struct {
	*jobkeys.NATSStore
	armed   atomic.Bool
	entered chan struct{}
	release chan struct{}
}

func (k *gatedKeys) Update(ctx context.Context, service, key string, value []byte, rev uint64) (uint64, error) {
	if k.armed.CompareAndSwap(true, false) {
		close(k.entered)
		<-k.release
	}
	return k.NATSStore.Update(ctx, service, key, value, rev)
}

// A job whose slot is acquired as Stop begins does not start: Stop hands
// it back at once (without a failure) and releases the slot, rather than
// starting a handler it then cancels at the end of the grace.
func TestClientStopDuringSlotAcquisitionDoesNotStart(t *testing.T) {
	t.Parallel()
	g := startGatedJob(t)
	c, keys, runs, ctx := g.c, g.keys, &g.runs, context.Background()
	stopped := make(chan error, 1)
	go func() { stopped <- c.Stop(ctx) }()
	time.Sleep(100 * time.Millisecond) // Stop has begun
	close(keys.release)
	select {
	case err := <-stopped:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("Stop never returned")
	}
	assert.Equal(t, int64(0), runs.Load(), "a handler started after Stop began")
	d, err := c.Get(ctx, "ch", "j1")
	require.NoError(t, err)
	assert.Equal(t, jobs.StatePending, d.Job.State)
	assert.Equal(t, 0, d.Job.Failures)
}

// flakySettleStore is a job store whose first settles fail as a store
// briefly out of reach does (a leader election, a reconnect).
type flakySettleStore struct {
	jobs.Store
	failures atomic.Int64 // settles still to fail
}

func (s *flakySettleStore) Settle(ctx context.Context, req jobs.SettleRequest) (jobs.Detail, error) {
	if s.failures.Add(-1) >= 0 {
		return jobs.Detail{}, fmt.Errorf("%w: settle: no responders", jobs.ErrUnavailable)
	}
	return s.Store.Settle(ctx, req)
}

// TestClientSettleRetriesWhileClaimHolds is the regression test for a
// success whose settle met a store briefly out of reach: the runtime logged
// it and dropped the result, the claim ran out and the job ran again from
// the start. The settle is now retried while the claim holds.
func TestClientSettleRetriesWhileClaimHolds(t *testing.T) {
	t.Parallel()
	env := newRuntimeEnv(t)
	fs := &flakySettleStore{}
	fs.failures.Store(2)
	n := env.newNode(fastConfig, func(s jobs.Store) jobs.Store { fs.Store = s; return fs })
	var l ledger
	require.NoError(t, jobs.Register(n.client, jobs.Kind[docIn, docOut]{
		Type: "flaky", Policy: quickPolicy,
		Work: func(ctx context.Context, run *jobs.Run, in docIn) (docOut, error) {
			l.start(run)
			return docOut{By: "once"}, nil
		},
	}))
	ctx := context.Background()
	_, err := n.client.Enqueue(ctx, enqueueReq("flaky", "j", "t", "d"))
	require.NoError(t, err)
	require.NoError(t, n.client.Start(ctx))
	j := waitState(t, n, "j", jobs.StateCompleted)
	assert.Equal(t, 1, j.Attempts, "the result was dropped and the job ran again")
	assert.Equal(t, 1, l.count("j"))
}

// TestClientPausedDuringSlotAcquisitionDoesNotStart is the regression test
// for a job this client paused while its slot acquisition was in flight:
// the handler was started anyway, with its context already ended, so a
// handler that does not look at its context first did the work of a
// paused job. It is not started now: the slot is taken before the claim,
// the claim of a paused job is refused, the slot is given back and the
// job stays paused.
func TestClientPausedDuringSlotAcquisitionDoesNotStart(t *testing.T) {
	t.Parallel()
	g := startGatedJob(t)
	c, keys, runs, ctx := g.c, g.keys, &g.runs, context.Background()
	released := false
	defer func() {
		if !released {
			close(keys.release)
		}
		assert.NoError(t, g.c.Stop(context.Background()))
	}()
	env, ks, coord := g.env, g.ks, g.coord
	d, err := c.Get(ctx, "ch", "j1")
	require.NoError(t, err)
	require.Equal(t, jobs.StatePending, d.Job.State, "claimed before its slot")
	_, err = c.Pause(ctx, jobs.PauseRequest{ChannelID: "ch", JobID: "j1", ExpectedRevision: d.Job.Revision, Reason: "hold"})
	require.NoError(t, err)
	close(keys.release)
	released = true
	jt, err := coord.JobType(env.service, "gate", quickPolicy)
	require.NoError(t, err)
	require.Eventually(t, func() bool { // the slot is given back
		key, err := jt.Key([]byte(`{"doc":"d"}`))
		require.NoError(t, err)
		val, _, err := ks.Get(ctx, env.service, key.KVKey)
		if errors.Is(err, jobkeys.ErrKeyNotFound) {
			return true // emptied and deleted
		}
		require.NoError(t, err)
		s, err := jobkeys.ParseState(val)
		require.NoError(t, err)
		return len(s.Active) == 0
	}, 30*time.Second, 10*time.Millisecond)
	time.Sleep(200 * time.Millisecond)
	assert.Equal(t, int64(0), runs.Load(), "the handler of a paused job was started")
	d, err = c.Get(ctx, "ch", "j1")
	require.NoError(t, err)
	assert.Equal(t, jobs.StatePaused, d.Job.State)
}

// TestClientResultTheStoreRefusesIsAFailure is the regression test for a
// result within ArtifactSizeLimit that the store refuses (its record is
// over the server's max_payload): the refusal was logged and nothing
// written, so the job stayed running until its claim ran out, ran again,
// and so on for ever, never counting against its failure budget. The
// refusal is now the attempt's failure.
func TestClientResultTheStoreRefusesIsAFailure(t *testing.T) {
	t.Parallel()
	n := runtimeSeq.Add(1)
	env := &runtimeEnv{t: t, bucket: fmt.Sprintf("JOBS_RT%d", n), service: fmt.Sprintf("rt%d", n),
		srv: natstest.RunWith(t, natstest.Options{Configure: func(o *server.Options) { o.MaxPayload = 64 << 10 }})}
	node := env.newNode(fastConfig, nil)
	var runs atomic.Int64
	big := strings.Repeat("x", 100<<10) // under ArtifactSizeLimit, over the server's max_payload
	require.NoError(t, jobs.Register(node.client, jobs.Kind[docIn, string]{
		Type: "big", Policy: quickPolicy, MaxFailures: 1,
		Work: func(ctx context.Context, run *jobs.Run, in docIn) (string, error) {
			runs.Add(1)
			return big, nil
		},
	}))
	ctx := context.Background()
	_, err := node.client.Enqueue(ctx, enqueueReq("big", "j", "t", "d"))
	require.NoError(t, err)
	require.NoError(t, node.client.Start(ctx))
	var j jobs.Job
	assert.Eventually(t, func() bool {
		j = getJob(t, node, "j")
		return j.State == jobs.StateFailed
	}, 20*time.Second, 20*time.Millisecond, "the job never failed")
	assert.Equal(t, 1, j.Failures)
	assert.Contains(t, j.Reason, "max_payload")
	assert.Equal(t, int64(1), runs.Load())
}

// gatedJob is a client whose key store holds job j1's slot acquisition at
// the gate (gatedKeys) until the test closes keys.release.
type gatedJob struct {
	env   *runtimeEnv
	ks    *jobkeys.NATSStore
	keys  *gatedKeys
	coord *jobkeys.KeyCoordinator
	c     *jobs.Client
	runs  atomic.Int64 // handler runs of kind "gate"
}

// startGatedJob starts a client with kind "gate", enqueues j1 and returns
// once j1's slot acquisition has reached the gate. The caller stops the
// client.
func startGatedJob(t *testing.T) *gatedJob {
	t.Helper()
	g := &gatedJob{env: newRuntimeEnv(t)}
	_, js := natstest.Connect(t, g.env.srv)
	st, err := jobs.NewNATSStore(js, nil, jobs.WithBucket(g.env.bucket), jobs.WithCreateBucket(jetstream.MemoryStorage, 1))
	require.NoError(t, err)
	g.ks, err = jobkeys.NewNATSStore(js, jobkeys.WithCreateBuckets(jetstream.MemoryStorage, 1))
	require.NoError(t, err)
	g.keys = &gatedKeys{NATSStore: g.ks, entered: make(chan struct{}), release: make(chan struct{})}
	g.coord, err = jobkeys.NewCoordinator(g.keys, nil)
	require.NoError(t, err)
	cfg := fastConfig
	cfg.KeyStore, cfg.Service, cfg.ReconcileInterval = g.keys, g.env.service, -1
	g.c, err = jobs.NewClient(st, g.coord, &cfg)
	require.NoError(t, err)
	require.NoError(t, jobs.Register(g.c, jobs.Kind[docIn, docOut]{
		Type: "gate", Policy: quickPolicy,
		Work: func(ctx context.Context, run *jobs.Run, in docIn) (docOut, error) {
			g.runs.Add(1)
			return docOut{}, nil
		},
	}))
	ctx := context.Background()
	_, err = g.c.Enqueue(ctx, enqueueReq("gate", "j1", "t", "d"))
	require.NoError(t, err)
	g.keys.armed.Store(true)
	require.NoError(t, g.c.Start(ctx))
	select {
	case <-g.keys.entered:
	case <-time.After(30 * time.Second):
		t.Fatal("the slot was never acquired")
	}
	return g
}

// keySpan is when a handler of a job of key ran.
type keySpan struct {
	key        string
	start, end time.Time
}

// keyAudit records the runs of the handlers its work makes: when each ran
// on which key, and how often each job ran.
type keyAudit struct {
	mu    sync.Mutex
	spans []keySpan
	runs  map[string]int
}

func newKeyAudit() *keyAudit { return &keyAudit{runs: map[string]int{}} }

// work is a handler that sleeps 5 to 20 ms and records its run, answering
// by.
func (a *keyAudit) work(by string) func(context.Context, *jobs.Run, docIn) (docOut, error) {
	return func(ctx context.Context, run *jobs.Run, in docIn) (docOut, error) {
		s := keySpan{key: in.Doc, start: time.Now()}
		time.Sleep(time.Duration(5+in.N%4*5) * time.Millisecond)
		s.end = time.Now()
		a.mu.Lock()
		a.spans = append(a.spans, s)
		a.runs[run.Job().ID]++
		a.mu.Unlock()
		return docOut{By: by}, nil
	}
}

// check checks that every job of ids ran once and that at no instant more
// than limit handlers ran on any of keys.
func (a *keyAudit) check(t *testing.T, ids, keys []string, limit int) {
	t.Helper()
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, id := range ids {
		assert.Equal(t, 1, a.runs[id], "job %s", id)
	}
	assertKeyPeaks(t, a.spans, keys, limit)
}

// assertKeyPeaks checks that at no instant more than limit of spans of each
// of keys overlapped (an end and a start at one instant do not).
func assertKeyPeaks(t *testing.T, spans []keySpan, keys []string, limit int) {
	t.Helper()
	peak := map[string]int{}
	for _, key := range keys {
		type ev struct {
			at time.Time
			d  int
		}
		var evs []ev
		for _, s := range spans {
			if s.key == key {
				evs = append(evs, ev{s.start, 1}, ev{s.end, -1})
			}
		}
		sort.Slice(evs, func(i, j int) bool {
			if evs[i].at.Equal(evs[j].at) {
				return evs[i].d < evs[j].d
			}
			return evs[i].at.Before(evs[j].at)
		})
		cur := 0
		for _, e := range evs {
			cur += e.d
			peak[key] = max(peak[key], cur)
		}
		assert.LessOrEqual(t, peak[key], limit, "key %s", key)
	}
	t.Logf("per-key peaks: %v", peak)
}
