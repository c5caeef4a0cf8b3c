package jobs_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jobkeys/jobkeys"
	"github.com/jobkeys/jobkeys/internal/natstest"
	"github.com/jobkeys/jobkeys/jobs"
)

// The end of a run on a hot key is a hand-off: the worker settles its job,
// releases the key's slot (a key write that leaves the key's room in its
// state), announces the job queued next, and acknowledges the announcement
// it ran on. A worker that dies at any of these boundaries loses no job
// and never lets the key run more than MaxActive: the surviving worker
// runs every other job of the key once. What covers each boundary:
//   - settled (slot held, announcement not acknowledged): the announcement
//     comes back after AckWait and its job is over, or reconciliation
//     sweeps the slot once its lease lapses; either announces the room;
//   - released (room in the key, nobody told): reconciliation finds the
//     room and announces the next job, as does the redelivered
//     announcement;
//   - announced (the next job announced, the own announcement not
//     acknowledged): the next job runs; the redelivered announcement finds
//     its job over and costs a read.
func TestDispatchHandOffSurvivesACrashAtEveryBoundary(t *testing.T) {
	t.Parallel()
	for _, point := range []string{"settled", "released", "announced"} {
		t.Run(point, func(t *testing.T) {
			t.Parallel()
			testHandOffCrash(t, point)
		})
	}
}

func testHandOffCrash(t *testing.T, point string) {
	env := newRuntimeEnv(t)
	ctx := context.Background()
	p := quickPolicy // MaxActive 1, leases of 3 s renewed every 100 ms
	audit := newKeyAudit()

	dying := newDyingNode(t, env, point)
	survivor := env.newNode(fastConfig, nil)
	for name, c := range map[string]*jobs.Client{"dying": dying.client, "survivor": survivor.client} {
		require.NoError(t, jobs.Register(c, jobs.Kind[docIn, docOut]{Type: "hot", Policy: p, Work: audit.work(name)}))
	}
	// Only the dying worker runs at first: it takes the first job, and
	// dies at point once that job is settled.
	require.NoError(t, dying.client.Start(ctx))
	const n = 6
	var ids []string
	for i := range n {
		req := enqueueReq("hot", fmt.Sprintf("h%d", i), fmt.Sprintf("t%d", i), "a")
		req.Input = []byte(fmt.Sprintf(`{"doc":"a","n":%d}`, i))
		_, err := survivor.client.Enqueue(ctx, req)
		require.NoError(t, err)
		ids = append(ids, req.ID)
	}
	select {
	case <-dying.dead:
	case <-time.After(60 * time.Second):
		t.Fatalf("the dying worker never reached %q", point)
	}
	require.NoError(t, survivor.client.Start(ctx))
	for _, id := range ids {
		waitState(t, survivor, id, jobs.StateCompleted)
	}
	audit.check(t, ids, []string{"a"}, p.MaxActive)
	require.Equal(t, int64(1), dying.settled.Load(), "the dying worker settled one job before it died")
}

// dyingNode is a worker process that dies at a boundary of the end of its
// first run: its three connections (job store, key store, dispatch) are
// closed there, so nothing it does afterwards reaches the server, as if
// it had been killed.
type dyingNode struct {
	client  *jobs.Client
	dead    chan struct{}
	settled atomic.Int64
}

func newDyingNode(t *testing.T, env *runtimeEnv, point string) *dyingNode {
	t.Helper()
	jobsNC, jobsJS := natstest.Connect(t, env.srv)
	keysNC, keysJS := natstest.Connect(t, env.srv)
	dispNC, dispJS := natstest.Connect(t, env.srv)
	d := &dyingNode{dead: make(chan struct{})}
	var once sync.Once
	var armed atomic.Bool // the first job is settled: the next boundary kills
	die := func() {
		once.Do(func() {
			dispNC.Close()
			keysNC.Close()
			jobsNC.Close()
			close(d.dead)
		})
	}
	st, err := jobs.NewNATSStore(jobsJS, nil, jobs.WithBucket(env.bucket), jobs.WithCreateBucket(jetstream.MemoryStorage, 1))
	require.NoError(t, err)
	ks, err := jobkeys.NewNATSStore(keysJS, jobkeys.WithCreateBuckets(jetstream.MemoryStorage, 1))
	require.NoError(t, err)
	keys := &boundaryKeys{NATSStore: ks, after: func() {
		if point == "released" && armed.Load() {
			die()
		}
	}}
	coord, err := jobkeys.NewCoordinator(keys, nil)
	require.NoError(t, err)
	cfg := fastConfig
	cfg.MaxWorkers = 1 // one run at a time: the key write after a settle is its release
	cfg.KeyStore = keys
	cfg.Service = env.service
	cfg.JetStream = &boundaryJS{JetStream: dispJS, after: func(subject string) {
		if point == "announced" && armed.Load() && strings.Contains(subject, ".ready.") {
			die()
		}
	}}
	store := &boundaryStore{Store: st, settled: func() {
		if d.settled.Add(1) > 1 {
			return
		}
		if point == "settled" {
			die()
			return
		}
		armed.Store(true)
	}}
	c, err := jobs.NewClient(store, coord, &cfg)
	require.NoError(t, err)
	d.client = c
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = c.Stop(ctx) // its connections are closed: errors are expected
	})
	return d
}

// boundaryStore calls settled after each successful Settle.
type boundaryStore struct {
	jobs.Store
	settled func()
}

func (s *boundaryStore) Settle(ctx context.Context, req jobs.SettleRequest) (jobs.Detail, error) {
	d, err := s.Store.Settle(ctx, req)
	if err == nil {
		s.settled()
	}
	return d, err
}

// boundaryKeys calls after each successful key update.
type boundaryKeys struct {
	*jobkeys.NATSStore
	after func()
}

func (k *boundaryKeys) Update(ctx context.Context, service, key string, value []byte, rev uint64) (uint64, error) {
	r, err := k.NATSStore.Update(ctx, service, key, value, rev)
	if err == nil {
		k.after()
	}
	return r, err
}

// boundaryJS calls after with the subject of each successful publish.
type boundaryJS struct {
	jetstream.JetStream
	after func(subject string)
}

func (j *boundaryJS) PublishMsg(ctx context.Context, msg *nats.Msg, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	ack, err := j.JetStream.PublishMsg(ctx, msg, opts...)
	if err == nil {
		j.after(msg.Subject)
	}
	return ack, err
}
