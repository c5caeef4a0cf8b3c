package jobs_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
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

var natsClientSeq atomic.Int64

// natsClientEnv is one test's buckets (memory storage) on one server.
type natsClientEnv struct {
	t   *testing.T
	srv *server.Server
	cfg jobs.ClientConfig // Service and Buckets of this test
}

func newNATSClientEnv(t *testing.T) *natsClientEnv {
	t.Helper()
	n := natsClientSeq.Add(1)
	return &natsClientEnv{t: t, srv: natstest.Run(t), cfg: jobs.ClientConfig{
		Service: fmt.Sprintf("nc%d", n),
		Buckets: jobs.Buckets{Job: fmt.Sprintf("JOBS_NC%d", n), Storage: jetstream.MemoryStorage},
	}}
}

// client makes a client of NewNATSClient on a connection of its own,
// with cfg's fields over the env's; it is stopped when the test ends.
func (e *natsClientEnv) client(cfg jobs.ClientConfig) *jobs.Client {
	e.t.Helper()
	_, js := natstest.Connect(e.t, e.srv)
	cfg.Service, cfg.Buckets = e.cfg.Service, e.cfg.Buckets
	c, err := jobs.NewNATSClient(js, &cfg)
	require.NoError(e.t, err)
	e.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		assert.NoError(e.t, c.Stop(ctx))
	})
	return c
}

func docInput(doc string) json.RawMessage {
	b, _ := json.Marshal(docIn{Doc: doc})
	return b
}

// TestNewNATSClientProducerAndWorker: two clients of NewNATSClient, each
// on its own connection, share the buckets it created: a producer whose
// kind has no Work enqueues with Type and Input only, a worker runs the
// job.
func TestNewNATSClientProducerAndWorker(t *testing.T) {
	t.Parallel()
	env := newNATSClientEnv(t)
	ctx := context.Background()
	producer := env.client(jobs.ClientConfig{})
	require.NoError(t, jobs.Register(producer, jobs.Kind[docIn, docOut]{Type: "render", Policy: docPolicy}))
	worker := env.client(jobs.ClientConfig{PollInterval: 10 * time.Millisecond})
	require.NoError(t, jobs.Register(worker, jobs.Kind[docIn, docOut]{Type: "render", Policy: docPolicy,
		Work: func(context.Context, *jobs.Run, docIn) (docOut, error) { return docOut{By: "worker"}, nil }}))
	require.NoError(t, worker.Start(ctx))

	res, err := producer.Enqueue(ctx, jobs.EnqueueRequest{Type: "render", Input: docInput("d1")})
	require.NoError(t, err)
	assert.Equal(t, jobs.OutcomeAccepted, res.Outcome)
	require.Eventually(t, func() bool {
		d, err := producer.Get(ctx, jobs.ChannelDefault, res.Job.ID)
		return err == nil && d.Job.State == jobs.StateCompleted && string(d.Artifact.Value) == `{"by":"worker"}`
	}, 60*time.Second, 20*time.Millisecond, "the worker never completed the producer's job")
}

// TestNewNATSClientBuckets: NoCreate finds missing buckets and names
// them; a bad Buckets field or a KeyStore is refused, as is Buckets in
// NewClient.
func TestNewNATSClientBuckets(t *testing.T) {
	t.Parallel()
	env := newNATSClientEnv(t)
	_, js := natstest.Connect(t, env.srv)
	cfg := env.cfg
	cfg.Buckets.NoCreate = true
	_, err := jobs.NewNATSClient(js, &cfg)
	require.ErrorIs(t, err, jobs.ErrNotFound, "no job bucket")
	assert.ErrorContains(t, err, cfg.Buckets.Job)

	// The job bucket alone: the key bucket is missing.
	st, err := jobs.NewNATSStore(js, nil, jobs.WithBucket(cfg.Buckets.Job), jobs.WithCreateBucket(jetstream.MemoryStorage, 1))
	require.NoError(t, err)
	require.NoError(t, st.Close(context.Background()))
	_, err = jobs.NewNATSClient(js, &cfg)
	require.ErrorIs(t, err, jobkeys.ErrBucketNotFound, "no key bucket")
	assert.ErrorContains(t, err, "JOBS_KEYS_"+cfg.Service)

	// Created once (by a client that may create: the key bucket at its
	// first use), both are found.
	maker := env.client(jobs.ClientConfig{})
	require.NoError(t, jobs.Register(maker, jobs.Kind[docIn, docOut]{Type: "render", Policy: docPolicy}))
	_, err = maker.Enqueue(context.Background(), jobs.EnqueueRequest{Type: "render", Input: docInput("d1")})
	require.NoError(t, err)
	c, err := jobs.NewNATSClient(js, &cfg)
	require.NoError(t, err, "both buckets exist")
	require.NoError(t, c.Stop(context.Background()))

	for name, bad := range map[string]jobs.ClientConfig{
		"Replicas": {Buckets: jobs.Buckets{Replicas: 6}},
		"Storage":  {Buckets: jobs.Buckets{Storage: 7}},
		"KeyStore": {KeyStore: jobkeys.NewMemoryStore()},
		"Owner":    {Owner: string([]byte{0xff})},
	} {
		_, err := jobs.NewNATSClient(js, &bad)
		assert.ErrorContainsf(t, err, name, "a bad %s", name)
	}
	_, err = jobs.NewNATSClient(nil, nil)
	assert.Error(t, err, "nil JetStream")

	store, err := jobs.NewMemoryStore(nil)
	require.NoError(t, err)
	keys := jobkeys.NewMemoryStore()
	coord, err := jobkeys.NewCoordinator(keys, nil)
	require.NoError(t, err)
	_, err = jobs.NewClient(store, coord, &jobs.ClientConfig{KeyStore: keys, Buckets: jobs.Buckets{NoCreate: true}})
	assert.ErrorContains(t, err, "Buckets", "NewClient with Buckets")
}

// TestEnqueueDefaults: a request with Type and Input only gets a new id
// (NewID's), the default channel, its id as target and idempotency key,
// and the fingerprint of its type, version and input; each such request
// is a new job that supersedes nothing. An idempotency key given replays,
// and with another input it is a conflict.
func TestEnqueueDefaults(t *testing.T) {
	t.Parallel()
	env := newNATSClientEnv(t)
	ctx := context.Background()
	c := env.client(jobs.ClientConfig{})
	require.NoError(t, jobs.Register(c, jobs.Kind[docIn, docOut]{Type: "render", Version: 3,
		Policy: jobkeys.Policy{Key: []string{"doc", "/doc"}, MaxActive: 1, MaxQueuedPerKey: 10}}))

	in := docInput("d1")
	first, err := c.Enqueue(ctx, jobs.EnqueueRequest{Type: "render", Input: in})
	require.NoError(t, err)
	second, err := c.Enqueue(ctx, jobs.EnqueueRequest{Type: "render", Input: in})
	require.NoError(t, err)
	for i, res := range []jobs.EnqueueResult{first, second} {
		j := res.Job
		assert.Equal(t, jobs.OutcomeAccepted, res.Outcome, i)
		assert.False(t, res.Repeated, i)
		assert.Empty(t, res.Superseded, i)
		assert.Len(t, j.ID, jobs.IDLength, i)
		assert.Equal(t, jobs.ChannelDefault, j.ChannelID, i)
		assert.Equal(t, j.ID, j.TargetKey, i)
		assert.Equal(t, j.ID, j.IdempotencyKey, i)
		assert.Equal(t, 3, j.Version, i)
		assert.Equal(t, jobs.Fingerprint("render", 3, in), j.Fingerprint, i)
		assert.Equal(t, jobs.StatePending, j.State, i)
		d, err := c.Get(ctx, jobs.ChannelDefault, j.ID)
		require.NoError(t, err)
		assert.Equal(t, j, d.Job, "the record as Enqueue returned it")
	}
	assert.Less(t, first.Job.ID, second.Job.ID, "ids ordered by time")

	keyed := jobs.EnqueueRequest{Type: "render", Input: in, IdempotencyKey: "report-7"}
	a, err := c.Enqueue(ctx, keyed)
	require.NoError(t, err)
	keyed.Input = json.RawMessage(` { "doc" : "d1", "n" : 0 } `) // the same input, spaced
	b, err := c.Enqueue(ctx, keyed)
	require.NoError(t, err)
	assert.True(t, b.Repeated, "a replay of the idempotency key")
	assert.Equal(t, a.Job.ID, b.Job.ID)
	keyed.Input = docInput("d2")
	_, err = c.Enqueue(ctx, keyed)
	require.ErrorIs(t, err, jobs.ErrConflict, "the idempotency key again with another input")

	// An ID given is the target and the idempotency key too.
	byID := jobs.EnqueueRequest{Type: "render", Input: in, ID: "job-9", ChannelID: "other"}
	r, err := c.Enqueue(ctx, byID)
	require.NoError(t, err)
	assert.Equal(t, "job-9", r.Job.TargetKey)
	assert.Equal(t, "job-9", r.Job.IdempotencyKey)
	assert.Equal(t, "other", r.Job.ChannelID)
	again, err := c.Enqueue(ctx, byID)
	require.NoError(t, err)
	assert.True(t, again.Repeated, "the same ID replays")
}

// TestEnqueueReportsSuperseded: a job for a target supersedes the
// target's older active job, and the enqueue says which, as stored.
func TestEnqueueReportsSuperseded(t *testing.T) {
	t.Parallel()
	env := newNATSClientEnv(t)
	ctx := context.Background()
	c := env.client(jobs.ClientConfig{})
	require.NoError(t, jobs.Register(c, jobs.Kind[docIn, docOut]{Type: "render",
		Policy: jobkeys.Policy{Key: []string{"doc", "/doc"}, MaxActive: 1, MaxQueuedPerKey: 10}}))

	first, err := c.Enqueue(ctx, jobs.EnqueueRequest{Type: "render", Input: docInput("d1"), TargetKey: "report-d1"})
	require.NoError(t, err)
	assert.Empty(t, first.Superseded)
	other, err := c.Enqueue(ctx, jobs.EnqueueRequest{Type: "render", Input: docInput("d2"), TargetKey: "report-d2"})
	require.NoError(t, err)
	second, err := c.Enqueue(ctx, jobs.EnqueueRequest{Type: "render", Input: docInput("d1"), TargetKey: "report-d1"})
	require.NoError(t, err)
	require.Len(t, second.Superseded, 1)
	d, err := c.Get(ctx, jobs.ChannelDefault, first.Job.ID)
	require.NoError(t, err)
	assert.Equal(t, jobs.StateSuperseded, d.Job.State)
	assert.Equal(t, d.Job, second.Superseded[0], "Superseded holds the record as stored")
	d, err = c.Get(ctx, jobs.ChannelDefault, other.Job.ID)
	require.NoError(t, err)
	assert.Equal(t, jobs.StatePending, d.Job.State, "another target's job is untouched")

	replay, err := c.Enqueue(ctx, jobs.EnqueueRequest{Type: "render", Input: docInput("d1"), TargetKey: "report-d1", IdempotencyKey: second.Job.ID})
	require.NoError(t, err)
	assert.True(t, replay.Repeated)
	assert.Empty(t, replay.Superseded, "a replay supersedes nothing")
}

// TestStartRefusesKindWithoutWork: a kind without Work registers and
// enqueues; Start refuses the client, naming the kind, and starts nothing.
func TestStartRefusesKindWithoutWork(t *testing.T) {
	t.Parallel()
	env := newNATSClientEnv(t)
	ctx := context.Background()
	c := env.client(jobs.ClientConfig{})
	require.NoError(t, jobs.Register(c, jobs.Kind[docIn, docOut]{Type: "render", Policy: docPolicy, Work: noWork}))
	require.NoError(t, jobs.Register(c, jobs.Kind[docIn, docOut]{Type: "print", Policy: docPolicy}))
	_, err := c.Enqueue(ctx, jobs.EnqueueRequest{Type: "print", Input: docInput("d1")})
	require.NoError(t, err, "a kind without Work enqueues")
	err = c.Start(ctx)
	require.Error(t, err)
	assert.ErrorContains(t, err, `"print"`)
	assert.ErrorContains(t, err, "no Work")
	assert.NotContains(t, err.Error(), `"render"`)
	// Nothing started: Register still works, and Start once every kind runs.
	require.NoError(t, jobs.Register(c, jobs.Kind[docIn, docOut]{Type: "scan", Policy: docPolicy, Work: noWork}))
	if err := c.Start(ctx); !assert.Error(t, err) {
		return
	}
	_, err = c.Enqueue(ctx, jobs.EnqueueRequest{Type: "render", Input: docInput("d1")})
	assert.NoError(t, err)
	if errors.Is(err, jobs.ErrUnknownKind) {
		t.Fatal("the kinds were dropped")
	}
}
