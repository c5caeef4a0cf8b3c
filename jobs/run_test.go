package jobs_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jobkeys/jobkeys"
	"github.com/jobkeys/jobkeys/jobs"
)

// blocker is a handler that records progress, then waits for its context
// (jobs with N > 0 return at once) and reports the cause.
type blocker struct {
	started chan string
	causes  chan error
}

func newBlocker() *blocker {
	return &blocker{started: make(chan string, 16), causes: make(chan error, 16)}
}

func (b *blocker) work(ctx context.Context, run *jobs.Run, in docIn) (docOut, error) {
	if in.N > 0 {
		return docOut{By: "quick"}, nil
	}
	if err := run.Progress("wait", "waiting for the context", jobs.ProgressStarted); err != nil {
		return docOut{}, err
	}
	b.started <- run.Job().ID
	<-ctx.Done()
	b.causes <- context.Cause(ctx)
	return docOut{}, ctx.Err()
}

func (b *blocker) waitStart(t *testing.T, id string) {
	t.Helper()
	select {
	case got := <-b.started:
		require.Equal(t, id, got)
	case <-time.After(30 * time.Second):
		t.Fatalf("job %s never started", id)
	}
}

func (b *blocker) cause(t *testing.T) error {
	t.Helper()
	select {
	case err := <-b.causes:
		return err
	case <-time.After(30 * time.Second):
		t.Fatal("the handler's context never ended")
		return nil
	}
}

// The handler's context ends with a cause that says why: paused or
// superseded from another process (seen at the next heartbeat), cancelled
// in this one (at once), a timeout (a failure), the client stopping (handed
// back without a failure). Progress goes through the run to the record.
func TestRunContextCauses(t *testing.T) {
	t.Parallel()
	env := newRuntimeEnv(t)
	worker := env.newNode(fastConfig, nil)
	other := env.newNode(fastConfig, nil)
	b := newBlocker()
	for _, n := range []*node{worker, other} {
		require.NoError(t, jobs.Register(n.client, jobs.Kind[docIn, docOut]{Type: "cause", Policy: quickPolicy, Work: b.work}))
		require.NoError(t, jobs.Register(n.client, jobs.Kind[docIn, docOut]{
			Type: "slow", Policy: quickPolicy, Timeout: 200 * time.Millisecond, MaxFailures: 1, Work: b.work,
		}))
	}
	ctx := context.Background()
	require.NoError(t, worker.client.Start(ctx))

	t.Run("paused", func(t *testing.T) {
		_, err := other.client.Enqueue(ctx, enqueueReq("cause", "p1", "tp", "dp"))
		require.NoError(t, err)
		b.waitStart(t, "p1")
		assert.Len(t, getJob(t, other, "p1").Progress, 1, "progress reached the record")
		require.Eventually(t, func() bool {
			j := getJob(t, other, "p1")
			_, err := other.client.Pause(ctx, jobs.PauseRequest{ChannelID: "ch", JobID: "p1", ExpectedRevision: j.Revision, Reason: "operator"})
			return err == nil
		}, 30*time.Second, time.Millisecond)
		require.ErrorIs(t, b.cause(t), jobs.ErrPaused)
		j := getJob(t, other, "p1")
		assert.Equal(t, jobs.StatePaused, j.State)
		assert.Equal(t, 0, j.Failures)
	})
	t.Run("cancelled", func(t *testing.T) {
		_, err := worker.client.Enqueue(ctx, enqueueReq("cause", "c1", "tc", "dc"))
		require.NoError(t, err)
		b.waitStart(t, "c1")
		_, err = worker.client.Cancel(ctx, jobs.CancelRequest{ChannelID: "ch", JobID: "c1"})
		require.NoError(t, err)
		require.ErrorIs(t, b.cause(t), jobs.ErrCancelled)
		assert.Equal(t, jobs.StateCancelled, getJob(t, worker, "c1").State)
	})
	t.Run("superseded", func(t *testing.T) {
		_, err := other.client.Enqueue(ctx, enqueueReq("cause", "s1", "ts", "ds"))
		require.NoError(t, err)
		b.waitStart(t, "s1")
		req := enqueueReq("cause", "s2", "ts", "ds2") // the same target
		req.Input = []byte(`{"doc":"ds2","n":1}`)
		_, err = other.client.Enqueue(ctx, req)
		require.NoError(t, err)
		require.ErrorIs(t, b.cause(t), jobs.ErrSuperseded)
		assert.Equal(t, jobs.StateSuperseded, getJob(t, other, "s1").State)
		waitState(t, other, "s2", jobs.StateCompleted)
	})
	t.Run("timeout", func(t *testing.T) {
		_, err := other.client.Enqueue(ctx, enqueueReq("slow", "t1", "tt", "dt"))
		require.NoError(t, err)
		b.waitStart(t, "t1")
		require.ErrorIs(t, b.cause(t), jobs.ErrTimeout)
		j := waitState(t, other, "t1", jobs.StateFailed)
		assert.Equal(t, 1, j.Failures, "a timeout counts as a failure")
		assert.Contains(t, j.Reason, "timed out")
	})
	t.Run("stopping", func(t *testing.T) {
		cfg := fastConfig
		cfg.StopGrace = 200 * time.Millisecond
		n := env.newNode(cfg, nil)
		require.NoError(t, jobs.Register(n.client, jobs.Kind[docIn, docOut]{Type: "cause", Policy: quickPolicy, Work: b.work}))
		require.NoError(t, jobs.Register(n.client, jobs.Kind[docIn, docOut]{Type: "slow", Policy: quickPolicy, Work: b.work}))
		require.NoError(t, worker.client.Stop(ctx)) // only n claims now
		require.NoError(t, n.client.Start(ctx))
		_, err := other.client.Enqueue(ctx, enqueueReq("cause", "x1", "tx", "dx"))
		require.NoError(t, err)
		b.waitStart(t, "x1")
		require.NoError(t, n.client.Stop(ctx))
		require.ErrorIs(t, b.cause(t), jobs.ErrStopping)
		j := getJob(t, other, "x1")
		assert.Equal(t, jobs.StatePending, j.State, "handed back")
		assert.Equal(t, 0, j.Failures, "without a failure")
		// The slot was released: another client runs it at once.
		require.NoError(t, other.client.Start(ctx))
		b.waitStart(t, "x1")
		_, err = other.client.Cancel(ctx, jobs.CancelRequest{ChannelID: "ch", JobID: "x1"})
		require.NoError(t, err)
		require.ErrorIs(t, b.cause(t), jobs.ErrCancelled)
	})
}

// Registration refuses what cannot work, and Start needs a kind, each
// with a Work.
func TestClientRegisterAndStartErrors(t *testing.T) {
	t.Parallel()
	env := newRuntimeEnv(t)
	n := env.newNode(fastConfig, nil)
	require.Error(t, n.client.Start(context.Background()), "no kind")
	require.NoError(t, jobs.Register(n.client, jobs.Kind[docIn, docOut]{Type: "p", Policy: docPolicy}), "no Work: a producer's kind")
	require.Error(t, jobs.Register(n.client, jobs.Kind[docIn, docOut]{Type: "a.b", Policy: docPolicy, Work: noWork}), "bad type")
	require.NoError(t, jobs.Register(n.client, jobs.Kind[docIn, docOut]{Type: "x", Policy: docPolicy, Work: noWork}))
	err := jobs.Register(n.client, jobs.Kind[docIn, docOut]{Type: "x", Policy: docPolicy, Work: noWork})
	require.Error(t, err, "twice")
	_, err = jobs.NewClient(n.store, n.coord, &jobs.ClientConfig{})
	require.Error(t, err, "no KeyStore")
	_, err = jobs.NewClient(n.store, n.coord, &jobs.ClientConfig{KeyStore: n.keys, MaxWorkers: -1})
	require.True(t, err != nil && !errors.Is(err, jobs.ErrConflict), fmt.Sprint(err))
	require.ErrorContains(t, n.client.Start(context.Background()), `kind "p" has no Work`)
}

// A kind whose HeartbeatTTL is shorter than another kind's keeps its claim
// across heartbeats (claims last the client's longest TTL; renewing one for
// the shorter TTL would not extend it, and lost it).
func TestRunKeepsClaimUnderShorterTTLKind(t *testing.T) {
	t.Parallel()
	env := newRuntimeEnv(t)
	n := env.newNode(fastConfig, nil)
	long := quickPolicy
	long.HeartbeatInterval, long.HeartbeatTTL = time.Second, time.Minute
	require.NoError(t, jobs.Register(n.client, jobs.Kind[docIn, docOut]{Type: "long", Policy: long, Work: noWork}))
	var cause error
	require.NoError(t, jobs.Register(n.client, jobs.Kind[docIn, docOut]{
		Type: "short", Policy: quickPolicy,
		Work: func(ctx context.Context, run *jobs.Run, in docIn) (docOut, error) {
			select {
			case <-ctx.Done(): // lost
				cause = context.Cause(ctx)
			case <-time.After(5 * quickPolicy.HeartbeatInterval):
			}
			return docOut{}, nil
		},
	}))
	ctx := context.Background()
	_, err := n.client.Enqueue(ctx, enqueueReq("short", "k1", "t", "d"))
	require.NoError(t, err)
	require.NoError(t, n.client.Start(ctx))
	j := waitState(t, n, "k1", jobs.StateCompleted)
	require.NoError(t, n.client.Stop(ctx))
	require.NoError(t, cause)
	assert.Equal(t, 1, j.Attempts)
}

// outageStore is a job store whose renewals fail as during an outage.
type outageStore struct {
	jobs.Store
	down atomic.Bool
}

func (s *outageStore) Renew(ctx context.Context, req jobs.RenewRequest) (jobs.Job, error) {
	if s.down.Load() {
		return jobs.Job{}, fmt.Errorf("%w: simulated outage", jobs.ErrUnavailable)
	}
	return s.Store.Renew(ctx, req)
}

// A handler whose claim cannot be renewed is stopped before the claim
// lapses (the local deadline), not when the store answers again: by then
// another worker may have taken the job over.
func TestRunStopsBeforeUnrenewedClaimLapses(t *testing.T) {
	t.Parallel()
	env := newRuntimeEnv(t)
	outage := &outageStore{}
	n := env.newNode(fastConfig, func(s jobs.Store) jobs.Store { outage.Store = s; return outage })
	type stopped struct {
		cause error
		at    time.Time
	}
	got := make(chan stopped, 1)
	require.NoError(t, jobs.Register(n.client, jobs.Kind[docIn, docOut]{
		Type: "outage", Policy: quickPolicy, MaxFailures: 1,
		Work: func(ctx context.Context, run *jobs.Run, in docIn) (docOut, error) {
			outage.down.Store(true)
			select {
			case <-ctx.Done():
			case <-time.After(time.Minute):
			}
			got <- stopped{context.Cause(ctx), time.Now()}
			return docOut{}, ctx.Err()
		},
	}))
	ctx := context.Background()
	_, err := n.client.Enqueue(ctx, enqueueReq("outage", "o1", "t", "d"))
	require.NoError(t, err)
	require.NoError(t, n.client.Start(ctx))
	var s stopped
	select {
	case s = <-got:
	case <-time.After(30 * time.Second):
		t.Fatal("the handler was never stopped")
	}
	require.ErrorIs(t, s.cause, jobs.ErrClaimLost)
	j := getJob(t, n, "o1")
	require.Equal(t, jobs.StateRunning, j.State, "nothing was written")
	assert.True(t, s.at.Before(j.ClaimExpiresAt), "stopped at %v, claim lapses at %v", s.at, j.ClaimExpiresAt)
	outage.down.Store(false)
}

// TestClientRefusesUnusableInput is the regression test for two inputs the
// runtime took without a word: Register on a nil client panicked (a nil
// pointer dereference), and an Owner that is not valid UTF-8 made a client
// whose every claim the store refused, forever, in a log line only. Both
// are errors now, naming what was wrong.
func TestClientRefusesUnusableInput(t *testing.T) {
	t.Parallel()
	env := newRuntimeEnv(t)
	n := env.newNode(fastConfig, nil)
	var nilClient *jobs.Client
	var err error
	require.NotPanics(t, func() {
		err = jobs.Register(nilClient, jobs.Kind[docIn, docOut]{Type: "x", Policy: docPolicy, Work: noWork})
	})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "nil")
	_, err = jobs.NewClient(n.store, n.coord, &jobs.ClientConfig{KeyStore: n.keys, Owner: "w\xff"})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "Owner")
}

// TestRunSupersededByLocalEnqueueStopsAtOnce is the regression test for a
// job running in a client whose enqueue of a newer job for the same target
// superseded it: the handler went on until its next heartbeat (30 s by
// default) and learnt it then, although the client had just written the
// change. Its context now ends at once with ErrSuperseded, as a local
// Supersede does.
func TestRunSupersededByLocalEnqueueStopsAtOnce(t *testing.T) {
	t.Parallel()
	env := newRuntimeEnv(t)
	n := env.newNode(fastConfig, nil)
	slow := jobkeys.Policy{Key: []string{"/doc"}, MaxActive: 2, MaxQueuedPerKey: 5,
		HeartbeatInterval: time.Minute, HeartbeatTTL: 3 * time.Minute} // no heartbeat during the test
	b := newBlocker()
	require.NoError(t, jobs.Register(n.client, jobs.Kind[docIn, docOut]{Type: "sup", Policy: slow, Work: b.work}))
	ctx := context.Background()
	_, err := n.client.Enqueue(ctx, enqueueReq("sup", "v1", "target", "d"))
	require.NoError(t, err)
	require.NoError(t, n.client.Start(ctx))
	b.waitStart(t, "v1")
	req := enqueueReq("sup", "v2", "target", "d")
	req.Input = json.RawMessage(`{"doc":"d","n":1}`) // returns at once
	_, err = n.client.Enqueue(ctx, req)
	require.NoError(t, err)
	select {
	case cause := <-b.causes:
		assert.ErrorIs(t, cause, jobs.ErrSuperseded)
	case <-time.After(10 * time.Second):
		t.Fatal("the superseded job's handler went on")
	}
	assert.Equal(t, jobs.StateSuperseded, getJob(t, n, "v1").State)
	waitState(t, n, "v2", jobs.StateCompleted)
}
