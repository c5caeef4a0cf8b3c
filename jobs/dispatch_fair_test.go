package jobs_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jobkeys/jobkeys"
	"github.com/jobkeys/jobkeys/jobs"
)

type tenantIn struct {
	Tenant string `json:"tenant"`
	N      int    `json:"n"`
}

func tenantReq(typ, tenant string, n int) jobs.EnqueueRequest {
	id := fmt.Sprintf("%s-%d", tenant, n)
	in, _ := json.Marshal(tenantIn{Tenant: tenant, N: n})
	return jobs.EnqueueRequest{
		ID: id, ChannelID: "ch", Type: typ, TargetKey: id,
		IdempotencyKey: "idem-" + id, Fingerprint: "fp-" + id, Input: in,
	}
}

// startOrder records the order in which handlers start.
type startOrder struct {
	mu    sync.Mutex
	order []string // tenants, in start order
	ids   map[string]int
}

func (o *startOrder) start(tenant, id string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.order = append(o.order, tenant)
	if o.ids == nil {
		o.ids = make(map[string]int)
	}
	o.ids[id]++
}

func (o *startOrder) snapshot() ([]string, map[string]int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	ids := make(map[string]int, len(o.ids))
	for k, v := range o.ids {
		ids[k] = v
	}
	return append([]string(nil), o.order...), ids
}

// One tenant's deep backlog does not starve the others: with 300 jobs of
// tenant flood queued on a key that runs one at a time, and 3 jobs each
// of tenants b, c and d enqueued after them, every b, c and d job starts
// after at most a few flood jobs (the keys are served in turn), while the
// client's other workers would otherwise idle. Bound in work done: the
// number of flood jobs started before the last b/c/d job.
func TestDispatchFloodDoesNotStarveOtherKeys(t *testing.T) {
	t.Parallel()
	env := newRuntimeEnv(t)
	cfg := fastConfig
	cfg.MaxWorkers = 4
	n := env.newNode(cfg, nil)
	var o startOrder
	policy := jobkeys.Policy{Key: []string{"tenant", "/tenant"}, MaxActive: 1, MaxQueuedPerKey: 2000,
		HeartbeatInterval: time.Second, HeartbeatTTL: 10 * time.Second}
	require.NoError(t, jobs.Register(n.client, jobs.Kind[tenantIn, struct{}]{
		Type: "flood", Policy: policy,
		Work: func(ctx context.Context, run *jobs.Run, in tenantIn) (struct{}, error) {
			o.start(in.Tenant, run.Job().ID)
			time.Sleep(5 * time.Millisecond)
			return struct{}{}, nil
		},
	}))
	ctx := context.Background()
	const flood = 300
	for i := range flood {
		_, err := n.client.Enqueue(ctx, tenantReq("flood", "flood", i))
		require.NoError(t, err)
	}
	for _, tenant := range []string{"b", "c", "d"} {
		for i := range 3 {
			_, err := n.client.Enqueue(ctx, tenantReq("flood", tenant, i))
			require.NoError(t, err)
		}
	}
	require.NoError(t, n.client.Start(ctx))
	others := func(order []string) (started, floodBefore int) {
		for _, tenant := range order {
			if tenant == "flood" {
				floodBefore++
				continue
			}
			started++
			if started == 9 {
				return started, floodBefore
			}
		}
		return started, floodBefore
	}
	require.Eventually(t, func() bool {
		order, _ := o.snapshot()
		started, _ := others(order)
		return started == 9
	}, 60*time.Second, 10*time.Millisecond, "b, c and d did not all start")
	order, _ := o.snapshot()
	_, floodBefore := others(order)
	// b, c and d have 3 jobs each: served in turn with flood, at most
	// about one flood job starts per round, 3 rounds, and one for the
	// first announcement.
	assert.LessOrEqual(t, floodBefore, 6, "flood jobs started before the last b/c/d job: %v", order)
	require.Eventually(t, func() bool {
		_, ids := o.snapshot()
		return len(ids) == flood+9
	}, 120*time.Second, 20*time.Millisecond, "not every job ran")
	_, ids := o.snapshot()
	for id, runs := range ids {
		assert.Equal(t, 1, runs, "job %s ran %d times", id, runs)
	}
}

// A job whose key is full holds no claim while it waits: its record stays
// pending (no attempt counted) until the slot frees, and then it runs.
func TestDispatchNoClaimHeldOnAFullKey(t *testing.T) {
	t.Parallel()
	env := newRuntimeEnv(t)
	n := env.newNode(fastConfig, nil)
	gate := make(chan struct{})
	var l ledger
	require.NoError(t, jobs.Register(n.client, jobs.Kind[docIn, docOut]{
		Type: "full", Policy: quickPolicy,
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
	require.NoError(t, n.client.Start(ctx))
	_, err := n.client.Enqueue(ctx, enqueueReq("full", "a", "a", "k"))
	require.NoError(t, err)
	require.Eventually(t, func() bool { return l.count("a") == 1 }, 30*time.Second, 5*time.Millisecond)
	_, err = n.client.Enqueue(ctx, enqueueReq("full", "b", "b", "k"))
	require.NoError(t, err)
	// c, on another key, enqueued after b, completes: a worker was free
	// to take b before c (a claim loop takes due jobs oldest first), and a
	// reconciliation pass ran; b stays unclaimed.
	_, err = n.client.Enqueue(ctx, enqueueReq("full", "c", "c", "other"))
	require.NoError(t, err)
	waitState(t, n, "c", jobs.StateCompleted)
	_, err = n.client.Reconcile(ctx)
	require.NoError(t, err)
	b := getJob(t, n, "b")
	assert.Equal(t, jobs.StatePending, b.State, "b was claimed while its key was full")
	assert.Equal(t, 0, b.Attempts)
	close(gate)
	b = waitState(t, n, "b", jobs.StateCompleted)
	assert.Equal(t, 1, b.Attempts)
}

// A hot key hands its slot from process to process without a recheck or a
// poll: two clients on their own connections, recheck and poll an hour,
// reconciliation off, run 30 jobs of one MaxActive 1 key to completion.
func TestDispatchHotKeyHandsOffAcrossProcesses(t *testing.T) {
	t.Parallel()
	env := newRuntimeEnv(t)
	cfg := fastConfig
	cfg.PollInterval, cfg.RecheckInterval, cfg.ReconcileInterval = time.Hour, time.Hour, -1
	cfg.MaxWorkers = 1
	a := env.newNode(cfg, nil)
	b := env.newNode(cfg, nil)
	hot := quickPolicy
	hot.MaxQueuedPerKey = 100
	var mu sync.Mutex
	ran := map[string]int{}
	for _, n := range []*node{a, b} {
		name := fmt.Sprintf("%p", n)
		require.NoError(t, jobs.Register(n.client, jobs.Kind[docIn, docOut]{
			Type: "hot", Policy: hot,
			Work: func(ctx context.Context, run *jobs.Run, in docIn) (docOut, error) {
				mu.Lock()
				ran[name]++
				mu.Unlock()
				return docOut{}, nil
			},
		}))
	}
	ctx := context.Background()
	require.NoError(t, a.client.Start(ctx))
	require.NoError(t, b.client.Start(ctx))
	const total = 30
	for i := range total {
		_, err := a.client.Enqueue(ctx, enqueueReq("hot", fmt.Sprint(i), fmt.Sprint(i), "one"))
		require.NoError(t, err)
	}
	for i := range total {
		waitState(t, a, fmt.Sprint(i), jobs.StateCompleted)
	}
	mu.Lock()
	defer mu.Unlock()
	sum := 0
	for _, n := range ran {
		sum += n
	}
	assert.Equal(t, total, sum)
}
