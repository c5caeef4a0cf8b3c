package jobs_test

import (
	"context"
	"errors"
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

// hungRenewStore is a job store whose claim renewals do not return,
// whatever their context, until release closes: a renewal request lost
// in a stalled connection, or a process stopped in the middle of one.
// It counts the attempts at the writes that end a claim (Settle, Fail,
// Requeue), per claim generation.
type hungRenewStore struct {
	jobs.Store
	release chan struct{}
	mu      sync.Mutex
	ends    map[uint64]int
}

func (s *hungRenewStore) Renew(ctx context.Context, req jobs.RenewRequest) (jobs.Job, error) {
	<-s.release
	return s.Store.Renew(ctx, req)
}

func (s *hungRenewStore) count(c jobs.Claim) {
	s.mu.Lock()
	s.ends[c.Generation]++
	s.mu.Unlock()
}

func (s *hungRenewStore) endsOf(generation uint64) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ends[generation]
}

func (s *hungRenewStore) Settle(ctx context.Context, req jobs.SettleRequest) (jobs.Detail, error) {
	s.count(req.Claim)
	return s.Store.Settle(ctx, req)
}

func (s *hungRenewStore) Fail(ctx context.Context, req jobs.FailRequest) (jobs.Job, error) {
	s.count(req.Claim)
	return s.Store.Fail(ctx, req)
}

func (s *hungRenewStore) Requeue(ctx context.Context, req jobs.RequeueRequest) (jobs.Job, error) {
	s.count(req.Claim)
	return s.Store.Requeue(ctx, req)
}

// deadlinePolicy has claims and slots of 1s renewed every 200ms: a local
// deadline 100ms (the margin) before the claim would expire.
var deadlinePolicy = jobkeys.Policy{
	Key: []string{"doc", "/doc"}, MaxActive: 1, MaxQueuedPerKey: 10,
	HeartbeatInterval: 200 * time.Millisecond, HeartbeatTTL: time.Second,
}

// A handler's context ends at its claim's local deadline (the start of
// the last successful renewal + TTL − margin, on the monotonic clock)
// even while the renewal that would extend it has not returned: the
// heartbeat stuck in it cannot end the context, the deadline does. The
// runtime then writes nothing for that claim (no Settle, Fail or
// Requeue is attempted), whatever the handler returns; the job runs
// again on a later claim.
func TestClaimDeadlineEndsHandlerWhileRenewalHangs(t *testing.T) {
	t.Parallel()
	for name, result := range map[string]error{"success": nil, "error": errors.New("handler failed")} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			env := newRuntimeEnv(t)
			hs := &hungRenewStore{release: make(chan struct{}), ends: map[uint64]int{}}
			n := env.newNode(fastConfig, func(s jobs.Store) jobs.Store { hs.Store = s; return hs })
			type ended struct {
				generation uint64
				cause      error
			}
			first := make(chan ended, 1)
			require.NoError(t, jobs.Register(n.client, jobs.Kind[docIn, docOut]{
				Type: "hung", Policy: deadlinePolicy, MaxFailures: 1,
				Work: func(ctx context.Context, run *jobs.Run, in docIn) (docOut, error) {
					if run.Job().Attempts > 1 {
						return docOut{By: "later"}, nil // a later claim, renewed normally
					}
					<-ctx.Done()
					first <- ended{run.Job().ClaimGeneration, context.Cause(ctx)}
					return docOut{By: "first"}, result
				},
			}))
			ctx := context.Background()
			_, err := n.client.Enqueue(ctx, enqueueReq("hung", "j1", "t", "d"))
			require.NoError(t, err)
			require.NoError(t, n.client.Start(ctx))
			var e ended
			select {
			case e = <-first:
			case <-time.After(15 * time.Second): // 15 claim TTLs
				close(hs.release)
				t.Fatal("the handler's context did not end while its claim's renewal hung")
			}
			require.ErrorIs(t, e.cause, jobs.ErrClaimLost)
			close(hs.release)
			j := waitState(t, n, "j1", jobs.StateCompleted)
			require.NoError(t, n.client.Stop(ctx))
			assert.Zero(t, hs.endsOf(e.generation), "the runtime tried to end claim %d, past its local deadline", e.generation)
			assert.Greater(t, j.ClaimGeneration, e.generation)
			d, err := n.client.Get(ctx, "ch", "j1")
			require.NoError(t, err)
			require.NotNil(t, d.Artifact)
			assert.JSONEq(t, `{"by":"later"}`, string(d.Artifact.Value))
		})
	}
}

// hangingKeys is a key store whose updates, once armed, do not return,
// whatever their context, until release closes: the slot's renewal hangs.
type hangingKeys struct {
	*jobkeys.NATSStore
	armed   atomic.Bool
	release chan struct{}
}

func (k *hangingKeys) Update(ctx context.Context, service, key string, value []byte, rev uint64) (uint64, error) {
	if k.armed.Load() {
		<-k.release
	}
	return k.NATSStore.Update(ctx, service, key, value, rev)
}

// A handler's context ends at its slot's local deadline, with
// ErrSlotLost, when that comes before the claim's: here the slot's
// renewal hangs while the claim was renewed just before it. The job is
// handed back without a failure.
func TestSlotDeadlineEndsHandlerWhileSlotRenewalHangs(t *testing.T) {
	t.Parallel()
	env := newRuntimeEnv(t)
	_, js := natstest.Connect(t, env.srv)
	st, err := jobs.NewNATSStore(js, nil, jobs.WithBucket(env.bucket), jobs.WithCreateBucket(jetstream.MemoryStorage, 1))
	require.NoError(t, err)
	ks, err := jobkeys.NewNATSStore(js, jobkeys.WithCreateBuckets(jetstream.MemoryStorage, 1))
	require.NoError(t, err)
	keys := &hangingKeys{NATSStore: ks, release: make(chan struct{})}
	coord, err := jobkeys.NewCoordinator(keys, nil)
	require.NoError(t, err)
	cfg := fastConfig
	cfg.KeyStore, cfg.Service = keys, env.service
	client, err := jobs.NewClient(st, coord, &cfg)
	require.NoError(t, err)
	causes := make(chan error, 1)
	require.NoError(t, jobs.Register(client, jobs.Kind[docIn, docOut]{
		Type: "slot", Policy: deadlinePolicy, MaxFailures: 1,
		Work: func(ctx context.Context, run *jobs.Run, in docIn) (docOut, error) {
			if run.Job().Attempts > 1 {
				return docOut{By: "later"}, nil
			}
			keys.armed.Store(true)
			<-ctx.Done()
			causes <- context.Cause(ctx)
			return docOut{}, context.Cause(ctx)
		},
	}))
	ctx := context.Background()
	_, err = client.Enqueue(ctx, enqueueReq("slot", "j1", "t", "d"))
	require.NoError(t, err)
	require.NoError(t, client.Start(ctx))
	select {
	case cause := <-causes:
		require.ErrorIs(t, cause, jobs.ErrSlotLost)
	case <-time.After(15 * time.Second): // 15 lease TTLs
		close(keys.release)
		require.NoError(t, client.Stop(ctx))
		t.Fatal("the handler's context did not end while its slot's renewal hung")
	}
	keys.armed.Store(false)
	close(keys.release)
	require.Eventually(t, func() bool {
		d, err := client.Get(ctx, "ch", "j1")
		require.NoError(t, err)
		return d.Job.State == jobs.StateCompleted
	}, time.Minute, 20*time.Millisecond, "the job never completed")
	require.NoError(t, client.Stop(ctx))
	d, err := client.Get(ctx, "ch", "j1")
	require.NoError(t, err)
	assert.Equal(t, 0, d.Job.Failures, "the lost slot counted a failure")
	assert.Equal(t, 2, d.Job.Attempts)
}
