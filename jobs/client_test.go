package jobs_test

import (
	"context"
	"encoding/json"
	"fmt"
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

// runtimeEnv is one test's buckets on one server: every node made from it
// is a process of its own (its own connection).
type runtimeEnv struct {
	t       *testing.T
	srv     *server.Server
	bucket  string // the job store's bucket
	service string // the key layer's service
}

var runtimeSeq atomic.Int64

func newRuntimeEnv(t *testing.T) *runtimeEnv {
	t.Helper()
	n := runtimeSeq.Add(1)
	return &runtimeEnv{t: t, srv: natstest.Run(t), bucket: fmt.Sprintf("JOBS_RT%d", n), service: fmt.Sprintf("rt%d", n)}
}

// node is one process's view: its stores, its coordinator, its client.
type node struct {
	store  jobs.Store
	keys   *countingKeys
	coord  *jobkeys.KeyCoordinator
	client *jobs.Client
}

// countingKeys is the key store with its writes counted.
type countingKeys struct {
	*jobkeys.NATSStore
	writes atomic.Int64
}

func (k *countingKeys) Create(ctx context.Context, service, key string, value []byte) (uint64, error) {
	k.writes.Add(1)
	return k.NATSStore.Create(ctx, service, key, value)
}

func (k *countingKeys) Update(ctx context.Context, service, key string, value []byte, rev uint64) (uint64, error) {
	k.writes.Add(1)
	return k.NATSStore.Update(ctx, service, key, value, rev)
}

func (k *countingKeys) Delete(ctx context.Context, service, key string, rev uint64) error {
	k.writes.Add(1)
	return k.NATSStore.Delete(ctx, service, key, rev)
}

// newNode connects a new process; wrap, if not nil, wraps its job store.
// The client is stopped when the test ends.
func (e *runtimeEnv) newNode(cfg jobs.ClientConfig, wrap func(jobs.Store) jobs.Store) *node {
	e.t.Helper()
	_, js := natstest.Connect(e.t, e.srv)
	st, err := jobs.NewNATSStore(js, nil, jobs.WithBucket(e.bucket), jobs.WithCreateBucket(jetstream.MemoryStorage, 1))
	require.NoError(e.t, err)
	ks, err := jobkeys.NewNATSStore(js, jobkeys.WithCreateBuckets(jetstream.MemoryStorage, 1))
	require.NoError(e.t, err)
	keys := &countingKeys{NATSStore: ks}
	coord, err := jobkeys.NewCoordinator(keys, nil)
	require.NoError(e.t, err)
	var store jobs.Store = st
	if wrap != nil {
		store = wrap(st)
	}
	cfg.KeyStore = keys
	cfg.Service = e.service
	cfg.JetStream = js
	c, err := jobs.NewClient(store, coord, &cfg)
	require.NoError(e.t, err)
	e.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		assert.NoError(e.t, c.Stop(ctx))
	})
	return &node{store: store, keys: keys, coord: coord, client: c}
}

type docIn struct {
	Doc string `json:"doc"`
	N   int    `json:"n"`
}

type docOut struct {
	By string `json:"by"`
}

var docPolicy = jobkeys.Policy{Key: []string{"doc", "/doc"}, MaxActive: 1, MaxQueuedPerKey: 1}

func enqueueReq(typ, id, target, doc string) jobs.EnqueueRequest {
	in, _ := json.Marshal(docIn{Doc: doc})
	return jobs.EnqueueRequest{
		ID: id, ChannelID: "ch", Type: typ, Origin: "test", TargetKey: target,
		IdempotencyKey: "idem-" + id, Fingerprint: "fp-" + id, Input: in,
	}
}

func noWork(context.Context, *jobs.Run, docIn) (docOut, error) { return docOut{}, nil }

func getJob(t *testing.T, n *node, id string) jobs.Job {
	t.Helper()
	d, err := n.client.Get(context.Background(), "ch", id)
	require.NoError(t, err)
	return d.Job
}

// waitState waits until job id is in state want.
func waitState(t *testing.T, n *node, id string, want jobs.State) jobs.Job {
	t.Helper()
	var j jobs.Job
	require.Eventuallyf(t, func() bool {
		j = getJob(t, n, id)
		return j.State == want
	}, 60*time.Second, 20*time.Millisecond, "job %s never became %s", id, want)
	return j
}

func TestClientEnqueueOutcomes(t *testing.T) {
	t.Parallel()
	env := newRuntimeEnv(t)
	n := env.newNode(jobs.ClientConfig{}, nil)
	for typ, when := range map[string]jobkeys.WhenFull{"rej": jobkeys.Reject, "coal": jobkeys.Coalesce, "repl": jobkeys.ReplaceOldest} {
		p := docPolicy
		p.WhenFull = when
		require.NoError(t, jobs.Register(n.client, jobs.Kind[docIn, docOut]{Type: typ, Policy: p, Work: noWork}))
	}
	ctx := context.Background()
	// Each key takes MaxQueuedPerKey + MaxActive = 2 queued jobs.
	for _, typ := range []string{"rej", "coal", "repl"} {
		for i := 1; i <= 2; i++ {
			res, err := n.client.Enqueue(ctx, enqueueReq(typ, fmt.Sprintf("%s%d", typ, i), fmt.Sprintf("%s-t%d", typ, i), "d"))
			require.NoError(t, err)
			assert.Equal(t, jobs.OutcomeAccepted, res.Outcome)
			assert.Equal(t, jobs.StatePending, res.Job.State)
			assert.Equal(t, "doc:d", res.Key)
		}
	}

	t.Run("rejected", func(t *testing.T) {
		_, err := n.client.Enqueue(ctx, enqueueReq("rej", "rej3", "rej-t3", "d"))
		require.ErrorIs(t, err, jobs.ErrRejected)
		var rej *jobs.RejectedError
		require.ErrorAs(t, err, &rej)
		assert.Equal(t, jobkeys.ReasonQueueDepth, rej.Reason)
		assert.Equal(t, 2, rej.Limit)
		assert.Equal(t, "rej3", rej.Job.ID)
		j := getJob(t, n, "rej3")
		assert.Equal(t, jobs.StateSuperseded, j.State, "no pending record is left")
		assert.Equal(t, jobs.ReasonRejected, j.Reason)
	})
	t.Run("coalesced", func(t *testing.T) {
		res, err := n.client.Enqueue(ctx, enqueueReq("coal", "coal3", "coal-t3", "d"))
		require.NoError(t, err)
		assert.Equal(t, jobs.OutcomeCoalesced, res.Outcome)
		assert.Equal(t, "coal1", res.Job.ID, "the existing job is returned")
		j := getJob(t, n, "coal3")
		assert.Equal(t, jobs.StateSuperseded, j.State)
		assert.Equal(t, jobs.ReasonCoalesced, j.Reason)
	})
	t.Run("replaced", func(t *testing.T) {
		res, err := n.client.Enqueue(ctx, enqueueReq("repl", "repl3", "repl-t3", "d"))
		require.NoError(t, err)
		assert.Equal(t, jobs.OutcomeReplaced, res.Outcome)
		assert.Equal(t, "repl3", res.Job.ID)
		require.NotNil(t, res.Replaced)
		assert.Equal(t, "repl1", res.Replaced.ID)
		j := getJob(t, n, "repl1")
		assert.Equal(t, jobs.StateSuperseded, j.State)
		assert.Equal(t, jobs.ReasonReplaced, j.Reason)
		assert.Equal(t, jobs.StatePending, getJob(t, n, "repl3").State)
	})
	t.Run("repeated", func(t *testing.T) {
		before := getJob(t, n, "repl3")
		res, err := n.client.Enqueue(ctx, enqueueReq("repl", "repl3", "repl-t3", "d"))
		require.NoError(t, err)
		assert.True(t, res.Repeated)
		assert.Equal(t, before, res.Job, "a replay changes nothing")
	})
	t.Run("target supersede frees the queue", func(t *testing.T) {
		// rej's key is full (rej1, rej2); a newer job for rej1's target
		// supersedes rej1, whose queue entry is pruned to admit it.
		res, err := n.client.Enqueue(ctx, enqueueReq("rej", "rej4", "rej-t1", "d"))
		require.NoError(t, err)
		assert.Equal(t, jobs.OutcomeAccepted, res.Outcome)
		assert.Equal(t, jobs.StateSuperseded, getJob(t, n, "rej1").State)
	})
	t.Run("unknown kind", func(t *testing.T) {
		_, err := n.client.Enqueue(ctx, enqueueReq("nope", "x1", "x", "d"))
		require.ErrorIs(t, err, jobs.ErrUnknownKind)
	})
	t.Run("bad key", func(t *testing.T) {
		req := enqueueReq("rej", "bad1", "bad", "d")
		req.Input = json.RawMessage(`{"doc":{"nested":true}}`)
		_, err := n.client.Enqueue(ctx, req)
		require.ErrorIs(t, err, jobkeys.ErrInvalidKey)
		j := getJob(t, n, "bad1")
		assert.Equal(t, jobs.StateSuperseded, j.State)
		assert.Equal(t, jobs.ReasonBadKey, j.Reason)
	})
}

func TestDefaultBackoff(t *testing.T) {
	t.Parallel()
	for n, want := range map[int]time.Duration{
		0: time.Second, 1: time.Second, 2: 2 * time.Second, 3: 4 * time.Second,
		9: 256 * time.Second, 10: 5 * time.Minute, 1000: 5 * time.Minute,
	} {
		assert.Equal(t, want, jobs.DefaultBackoff(n), "failures %d", n)
	}
}

// ledger records what handlers did.
type ledger struct {
	mu   sync.Mutex
	runs map[string]int
	seen []jobs.Job // run.Job() at each start
}

func (l *ledger) start(run *jobs.Run) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.runs == nil {
		l.runs = make(map[string]int)
	}
	j := run.Job()
	l.runs[j.ID]++
	l.seen = append(l.seen, j)
}

func (l *ledger) count(id string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.runs[id]
}

var fastConfig = jobs.ClientConfig{
	PollInterval: 50 * time.Millisecond, RecheckInterval: 200 * time.Millisecond,
	AdmitGrace: 300 * time.Millisecond, ReconcileInterval: 200 * time.Millisecond,
	StopGrace: 2 * time.Second,
}

func TestClientRetriesWithBackoffAndFailsAtBudget(t *testing.T) {
	t.Parallel()
	env := newRuntimeEnv(t)
	var mu sync.Mutex
	var backoffs []int
	cfg := fastConfig
	cfg.Backoff = func(n int) time.Duration {
		mu.Lock()
		backoffs = append(backoffs, n)
		mu.Unlock()
		return time.Duration(n) * 20 * time.Millisecond
	}
	n := env.newNode(cfg, nil)
	var l ledger
	require.NoError(t, jobs.Register(n.client, jobs.Kind[docIn, docOut]{
		Type: "flaky", Policy: docPolicy, MaxFailures: 3,
		Work: func(ctx context.Context, run *jobs.Run, in docIn) (docOut, error) {
			l.start(run)
			return docOut{}, fmt.Errorf("boom %d", run.Job().Attempts)
		},
	}))
	ctx := context.Background()
	_, err := n.client.Enqueue(ctx, enqueueReq("flaky", "f1", "t", "d"))
	require.NoError(t, err)
	require.NoError(t, n.client.Start(ctx))
	j := waitState(t, n, "f1", jobs.StateFailed)
	assert.Equal(t, 3, j.Failures)
	assert.Equal(t, 3, j.Attempts)
	assert.Equal(t, "boom 3", j.Reason)
	mu.Lock()
	assert.Equal(t, []int{1, 2}, backoffs, "backoff after each failure but the last")
	mu.Unlock()
	l.mu.Lock()
	defer l.mu.Unlock()
	require.Len(t, l.seen, 3)
	for i, s := range l.seen {
		assert.Equal(t, i, s.Failures, "attempt %d sees the failures from the record", i+1)
		assert.Equal(t, i+1, s.Attempts)
	}
}

// A coalescing key whose only slot is held by a job that is over (settled,
// its slot not released yet: a worker that crashed between the two holds
// it until its lease runs out) does not fold a new job into the finished
// one, which never runs it: the enqueue is rejected, typed.
func TestClientEnqueueDoesNotCoalesceIntoFinishedJob(t *testing.T) {
	t.Parallel()
	env := newRuntimeEnv(t)
	n := env.newNode(jobs.ClientConfig{}, nil)
	policy := jobkeys.Policy{Key: []string{"doc", "/doc"}, MaxActive: 1, MaxQueuedPerKey: 0, WhenFull: jobkeys.Coalesce}
	require.NoError(t, jobs.Register(n.client, jobs.Kind[docIn, docOut]{Type: "coald", Policy: policy, Work: noWork}))
	ctx := context.Background()
	res, err := n.client.Enqueue(ctx, enqueueReq("coald", "j1", "t1", "d"))
	require.NoError(t, err)
	require.Equal(t, jobs.OutcomeAccepted, res.Outcome)

	// A worker claims j1, takes its slot, settles it, and dies.
	claimed, err := n.store.Claim(ctx, jobs.ClaimRequest{Owner: "w", Count: 1, TTL: time.Minute})
	require.NoError(t, err)
	require.Len(t, claimed, 1)
	jt, err := n.coord.JobType(env.service, "coald", policy)
	require.NoError(t, err)
	acq, err := jt.Acquire(ctx, "ch/j1", claimed[0].Input)
	require.NoError(t, err)
	require.Equal(t, jobkeys.KindAcquired, acq.Kind)
	_, err = n.store.Settle(ctx, jobs.SettleRequest{Claim: jobs.ClaimOf(claimed[0])})
	require.NoError(t, err)

	res, err = n.client.Enqueue(ctx, enqueueReq("coald", "j2", "t2", "d"))
	if err == nil {
		assert.NotEqualf(t, jobs.OutcomeCoalesced, res.Outcome, "j2 folded into %s, which is %s", res.Job.ID, res.Job.State)
	}
	require.ErrorIs(t, err, jobs.ErrRejected)
	var rej *jobs.RejectedError
	require.ErrorAs(t, err, &rej)
	assert.Equal(t, jobkeys.ReasonActiveLimit, rej.Reason)
	j := getJob(t, n, "j2")
	assert.Equal(t, jobs.StateSuperseded, j.State, "no pending record is left")
	assert.Equal(t, jobs.ReasonRejected, j.Reason)
}

// TestClientEnqueueReplayKeepsOutcome is the regression test for a replayed
// enqueue (the same idempotency key and fingerprint: a producer retrying
// after a lost answer) of a job its key policy had rejected, coalesced or
// found no key for: the replay reported OutcomeAccepted, with no error,
// for a record that is superseded and will never run. A replay now reports
// what the record says: the rejection (ErrRejected), the coalescing, the
// bad key.
func TestClientEnqueueReplayKeepsOutcome(t *testing.T) {
	t.Parallel()
	env := newRuntimeEnv(t)
	n := env.newNode(jobs.ClientConfig{}, nil)
	for typ, when := range map[string]jobkeys.WhenFull{"rej": jobkeys.Reject, "coal": jobkeys.Coalesce} {
		p := docPolicy
		p.WhenFull = when
		require.NoError(t, jobs.Register(n.client, jobs.Kind[docIn, docOut]{Type: typ, Policy: p, Work: noWork}))
	}
	ctx := context.Background()
	for _, typ := range []string{"rej", "coal"} {
		for i := 1; i <= 2; i++ {
			_, err := n.client.Enqueue(ctx, enqueueReq(typ, fmt.Sprintf("%s%d", typ, i), fmt.Sprintf("%s-t%d", typ, i), "d"))
			require.NoError(t, err)
		}
	}

	_, err := n.client.Enqueue(ctx, enqueueReq("rej", "rej3", "rej-t3", "d"))
	require.ErrorIs(t, err, jobs.ErrRejected)
	_, err = n.client.Enqueue(ctx, enqueueReq("rej", "rej3", "rej-t3", "d"))
	require.ErrorIs(t, err, jobs.ErrRejected, "a replay of a rejected enqueue")
	var rej *jobs.RejectedError
	require.ErrorAs(t, err, &rej)
	assert.Equal(t, "rej3", rej.Job.ID)
	assert.Equal(t, jobs.StateSuperseded, rej.Job.State)

	first, err := n.client.Enqueue(ctx, enqueueReq("coal", "coal3", "coal-t3", "d"))
	require.NoError(t, err)
	require.Equal(t, jobs.OutcomeCoalesced, first.Outcome)
	again, err := n.client.Enqueue(ctx, enqueueReq("coal", "coal3", "coal-t3", "d"))
	require.NoError(t, err)
	assert.True(t, again.Repeated)
	assert.Equal(t, jobs.OutcomeCoalesced, again.Outcome, "a replay of a coalesced enqueue")
	assert.Equal(t, "coal3", again.Job.ID, "a replay returns the job it enqueued")

	bad := enqueueReq("rej", "bad1", "bad", "d")
	bad.Input = json.RawMessage(`{"doc":{"nested":true}}`)
	_, err = n.client.Enqueue(ctx, bad)
	require.ErrorIs(t, err, jobkeys.ErrInvalidKey)
	_, err = n.client.Enqueue(ctx, bad)
	require.ErrorIs(t, err, jobkeys.ErrInvalidKey, "a replay of an enqueue whose input derives no key")

	ok, err := n.client.Enqueue(ctx, enqueueReq("rej", "rej1", "rej-t1", "d"))
	require.NoError(t, err)
	assert.True(t, ok.Repeated)
	assert.Equal(t, jobs.OutcomeAccepted, ok.Outcome)
	assert.Equal(t, jobs.StatePending, ok.Job.State)
}
