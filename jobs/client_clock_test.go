package jobs_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jobkeys/jobkeys"
	"github.com/jobkeys/jobkeys/internal/natstest"
	"github.com/jobkeys/jobkeys/jobs"
)

// skewLog is a slog.Handler that keeps the messages of its records.
type skewLog struct {
	mu   sync.Mutex
	msgs []string
}

func (h *skewLog) Enabled(context.Context, slog.Level) bool { return true }
func (h *skewLog) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *skewLog) WithGroup(string) slog.Handler            { return h }
func (h *skewLog) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	h.msgs = append(h.msgs, r.Message)
	h.mu.Unlock()
	return nil
}

// count returns how many messages contain s.
func (h *skewLog) count(s string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, m := range h.msgs {
		if strings.Contains(m, s) {
			n++
		}
	}
	return n
}

// newClockNode is newNode for a process whose clock is now: its job
// store, its coordinator and its client all read it. coordCfg, if not
// nil, is the coordinator's config (its Now is set to now).
func (e *runtimeEnv) newClockNode(cfg jobs.ClientConfig, now func() time.Time, coordCfg *jobkeys.Config) *node {
	e.t.Helper()
	_, js := natstest.Connect(e.t, e.srv)
	st, err := jobs.NewNATSStore(js, &jobs.Config{Now: now}, jobs.WithBucket(e.bucket), jobs.WithCreateBucket(jetstream.MemoryStorage, 1))
	require.NoError(e.t, err)
	ks, err := jobkeys.NewNATSStore(js, jobkeys.WithCreateBuckets(jetstream.MemoryStorage, 1))
	require.NoError(e.t, err)
	keys := &countingKeys{NATSStore: ks}
	if coordCfg == nil {
		coordCfg = &jobkeys.Config{}
	}
	coordCfg.Now = now
	coord, err := jobkeys.NewCoordinator(keys, coordCfg)
	require.NoError(e.t, err)
	cfg.KeyStore = keys
	cfg.Service = e.service
	cfg.Now = now
	c, err := jobs.NewClient(st, coord, &cfg)
	require.NoError(e.t, err)
	e.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		assert.NoError(e.t, c.Stop(ctx))
	})
	return &node{store: st, keys: keys, coord: coord, client: c}
}

// skewPolicy (quickPolicy, named for what these tests rely on) has claims of 3s renewed every 100ms (a running job) or
// 1.5s (a waiting one): a client refuses to claim while its clock is
// proven (3s − 1.5s) / 2 = 750ms or more from the server's.
var skewPolicy = quickPolicy

// A client whose clock runs an hour ahead of the NATS server's claims
// nothing, though every claim looks expired to it: a job another client
// runs keeps running there and completes (no ErrClaimLost), a job
// enqueued meanwhile runs on the unskewed client, and the skewed client
// logs the refusal once, not at every claim pass; once its clock is set
// right it claims again. Without the check it takes the running job over
// at its first pass.
func TestClientSkewedClockClaimsNothing(t *testing.T) {
	t.Parallel()
	env := newRuntimeEnv(t)
	var skew atomic.Int64 // B's clock's offset
	skew.Store(int64(time.Hour))
	ahead := func() time.Time { return time.Now().Add(time.Duration(skew.Load())) }
	a := env.newNode(fastConfig, nil)
	var logB skewLog
	cfgB := fastConfig
	cfgB.Logger = slog.New(&logB)
	b := env.newClockNode(cfgB, ahead, nil)

	startedA := make(chan string, 2)
	release := make(chan struct{})
	causeA := make(chan error, 2)
	require.NoError(t, jobs.Register(a.client, jobs.Kind[docIn, docOut]{
		Type: "skew", Policy: skewPolicy,
		Work: func(ctx context.Context, run *jobs.Run, in docIn) (docOut, error) {
			startedA <- run.Job().ID
			if run.Job().ID == "j1" {
				select {
				case <-release:
				case <-ctx.Done():
				}
			}
			causeA <- context.Cause(ctx)
			return docOut{By: "a"}, context.Cause(ctx)
		},
	}))
	var runsB atomic.Int64
	require.NoError(t, jobs.Register(b.client, jobs.Kind[docIn, docOut]{
		Type: "skew", Policy: skewPolicy,
		Work: func(ctx context.Context, run *jobs.Run, in docIn) (docOut, error) {
			runsB.Add(1)
			return docOut{By: "b"}, nil
		},
	}))
	ctx := context.Background()
	_, err := a.client.Enqueue(ctx, enqueueReq("skew", "j1", "t1", "d1"))
	require.NoError(t, err)
	require.NoError(t, a.client.Start(ctx))
	require.Equal(t, "j1", <-startedA)

	// B's coordinator proves its clock an hour ahead of the server's.
	off, err := b.coord.ClockOffset(ctx, env.service)
	require.NoError(t, err)
	require.True(t, off.MaxKnown, "opening the key bucket measures the server's clock")
	require.Less(t, off.Max, -59*time.Minute)

	require.NoError(t, b.client.Start(ctx))
	// Some 20 claim passes of B, and as many of A's claim renewals, pass:
	// j1 stays A's.
	time.Sleep(time.Second)
	j1 := getJob(t, a, "j1")
	require.Equal(t, jobs.StateRunning, j1.State)
	require.Equal(t, a.client.Owner(), j1.ClaimOwner, "the skewed client took no claim")
	require.Equal(t, 1, j1.Attempts, "j1 was claimed once")
	// A job enqueued meanwhile runs on A.
	_, err = a.client.Enqueue(ctx, enqueueReq("skew", "j2", "t2", "d2"))
	require.NoError(t, err)
	waitState(t, a, "j2", jobs.StateCompleted)
	d, err := a.client.Get(ctx, "ch", "j2")
	require.NoError(t, err)
	require.NotNil(t, d.Artifact)
	assert.JSONEq(t, `{"by":"a"}`, string(d.Artifact.Value), "the unskewed client ran it")

	close(release)
	waitState(t, a, "j1", jobs.StateCompleted)
	require.NoError(t, <-causeA) // j2's
	require.NoError(t, <-causeA, "j1's run was never interrupted")
	d, err = a.client.Get(ctx, "ch", "j1")
	require.NoError(t, err)
	require.NotNil(t, d.Artifact)
	assert.JSONEq(t, `{"by":"a"}`, string(d.Artifact.Value))
	assert.Equal(t, 1, d.Job.Attempts, "j1 ran once")
	assert.Equal(t, int64(0), runsB.Load())
	assert.Equal(t, 1, logB.count("clock skew"), "the skewed client logs the refusal once per state change, not at each pass")

	// B's clock is set right: it claims again (A is stopped, so B must).
	require.NoError(t, a.client.Stop(ctx))
	skew.Store(0)
	_, err = b.client.Enqueue(ctx, enqueueReq("skew", "j3", "t3", "d3"))
	require.NoError(t, err)
	waitState(t, b, "j3", jobs.StateCompleted)
	assert.Equal(t, int64(1), runsB.Load())
	assert.Equal(t, 1, logB.count("claiming again"), "the end of the refusal is logged once")
	assert.Equal(t, 2, logB.count("clock skew"))
}

// With its coordinator's IgnoreClockSkew a client an
// hour ahead claims again: it takes over a job another client still
// runs, which is what the check prevents.
func TestClientIgnoreClockSkewClaims(t *testing.T) {
	t.Parallel()
	env := newRuntimeEnv(t)
	ahead := func() time.Time { return time.Now().Add(time.Hour) }
	a := env.newNode(fastConfig, nil)
	b := env.newClockNode(fastConfig, ahead, &jobkeys.Config{IgnoreClockSkew: true})
	startedA := make(chan struct{})
	causeA := make(chan error, 1)
	require.NoError(t, jobs.Register(a.client, jobs.Kind[docIn, docOut]{
		Type: "skew", Policy: skewPolicy,
		Work: func(ctx context.Context, run *jobs.Run, in docIn) (docOut, error) {
			close(startedA)
			<-ctx.Done()
			causeA <- context.Cause(ctx)
			return docOut{}, ctx.Err()
		},
	}))
	require.NoError(t, jobs.Register(b.client, jobs.Kind[docIn, docOut]{
		Type: "skew", Policy: skewPolicy,
		Work: func(ctx context.Context, run *jobs.Run, in docIn) (docOut, error) {
			return docOut{By: "b"}, nil
		},
	}))
	ctx := context.Background()
	_, err := a.client.Enqueue(ctx, enqueueReq("skew", "j1", "t1", "d1"))
	require.NoError(t, err)
	require.NoError(t, a.client.Start(ctx))
	<-startedA
	require.NoError(t, b.client.Start(ctx))
	select {
	case cause := <-causeA:
		// b sees a's slot (and claim) expired: its reconciliation sweeps
		// the slot, or its workers take the claim over.
		require.True(t, errors.Is(cause, jobs.ErrClaimLost) || errors.Is(cause, jobs.ErrSlotLost), "cause %v", cause)
	case <-time.After(60 * time.Second):
		t.Fatal("the skewed client never took the claim over")
	}
}
