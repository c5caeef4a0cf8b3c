package jobs_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jobkeys/jobkeys"
	"github.com/jobkeys/jobkeys/internal/natstest"
	"github.com/jobkeys/jobkeys/jobs"
)

// newSplitNode is newNode for a process whose job store and key store
// have a connection each; it returns the key store's, which a test closes
// to make admissions fail while records are still written.
func (e *runtimeEnv) newSplitNode(cfg jobs.ClientConfig) (*node, *nats.Conn) {
	e.t.Helper()
	_, jobsJS := natstest.Connect(e.t, e.srv)
	keysNC, keysJS := natstest.Connect(e.t, e.srv)
	st, err := jobs.NewNATSStore(jobsJS, nil, jobs.WithBucket(e.bucket), jobs.WithCreateBucket(jetstream.MemoryStorage, 1))
	require.NoError(e.t, err)
	ks, err := jobkeys.NewNATSStore(keysJS, jobkeys.WithCreateBuckets(jetstream.MemoryStorage, 1))
	require.NoError(e.t, err)
	keys := &countingKeys{NATSStore: ks}
	coord, err := jobkeys.NewCoordinator(keys, nil)
	require.NoError(e.t, err)
	cfg.KeyStore = keys
	cfg.Service = e.service
	c, err := jobs.NewClient(st, coord, &cfg)
	require.NoError(e.t, err)
	return &node{store: st, keys: keys, coord: coord, client: c}, keysNC
}

// queuedOn returns the key-layer job ids queued and active on the key
// that doc derives under typ's policy.
func queuedOn(t *testing.T, n *node, service, typ string, policy jobkeys.Policy, doc string) (queued, active []string) {
	t.Helper()
	jt, err := n.coord.JobType(service, typ, policy)
	require.NoError(t, err)
	info, err := jt.InspectKey(context.Background(), []byte(fmt.Sprintf(`{"doc":%q}`, doc)))
	if errors.Is(err, jobkeys.ErrKeyNotFound) {
		return nil, nil
	}
	require.NoError(t, err)
	require.NotNil(t, info.State)
	for _, q := range info.State.Queued {
		queued = append(queued, q.JobID)
	}
	for _, a := range info.State.Active {
		active = append(active, a.JobID)
	}
	return queued, active
}

// TestEnqueueReplayAdmitsWhatTheFirstEnqueueDidNot is the regression test
// for a replay told "accepted" of a job whose first enqueue wrote the
// record and failed to admit it (its key-layer connection was closed):
// nothing was admitted, the key then filled up with later jobs, and the
// job was rejected (under Coalesce: coalesced) when a worker repaired it
// after AdmitGrace, and never ran. The replay now makes the admission,
// so the job is queued ahead of the later jobs and runs; the first
// enqueue's error says its outcome is unknown and names the job.
func TestEnqueueReplayAdmitsWhatTheFirstEnqueueDidNot(t *testing.T) {
	t.Parallel()
	for _, when := range []jobkeys.WhenFull{jobkeys.Reject, jobkeys.Coalesce} {
		t.Run(string(when), func(t *testing.T) {
			t.Parallel()
			env := newRuntimeEnv(t)
			policy := jobkeys.Policy{Key: []string{"doc", "/doc"}, MaxActive: 2, MaxQueuedPerKey: 3, WhenFull: when}
			var l ledger
			kind := jobs.Kind[docIn, docOut]{Type: "rep", Policy: policy,
				Work: func(_ context.Context, run *jobs.Run, _ docIn) (docOut, error) {
					l.start(run)
					return docOut{}, nil
				}}
			healthy := env.newNode(fastConfig, nil)
			require.NoError(t, jobs.Register(healthy.client, kind))
			broken, keysConn := env.newSplitNode(fastConfig)
			require.NoError(t, jobs.Register(broken.client, kind))
			keysConn.Close()
			ctx := context.Background()

			req := enqueueReq("rep", "J", "tJ", "d")
			_, err := broken.client.Enqueue(ctx, req)
			require.Error(t, err)
			assert.ErrorIs(t, err, jobs.ErrOutcomeUnknown, "the record is written, the admission failed: %v", err)
			assert.Contains(t, err.Error(), `"J"`)
			assert.Contains(t, err.Error(), req.IdempotencyKey)
			assert.Equal(t, jobs.StatePending, getJob(t, healthy, "J").State)
			queued, _ := queuedOn(t, healthy, env.service, "rep", policy, "d")
			require.Empty(t, queued, "the failed enqueue admitted nothing")

			res, err := healthy.client.Enqueue(ctx, req)
			require.NoError(t, err)
			assert.True(t, res.Repeated)
			assert.Equal(t, jobs.OutcomeAccepted, res.Outcome)
			assert.Equal(t, "J", res.Job.ID)
			assert.Equal(t, "doc:d", res.Key)
			queued, _ = queuedOn(t, healthy, env.service, "rep", policy, "d")
			assert.Equal(t, []string{"ch/J"}, queued, "the replay admits the job")

			writes := healthy.keys.writes.Load()
			again, err := healthy.client.Enqueue(ctx, req)
			require.NoError(t, err)
			assert.True(t, again.Repeated)
			assert.Equal(t, jobs.OutcomeAccepted, again.Outcome)
			assert.Equal(t, writes, healthy.keys.writes.Load(), "a replay of an admitted job writes nothing")

			// Five more jobs: the key holds MaxQueuedPerKey + MaxActive = 5.
			for i := 1; i <= 5; i++ {
				id := fmt.Sprintf("K%d", i)
				res, err := healthy.client.Enqueue(ctx, enqueueReq("rep", id, "t"+id, "d"))
				if i < 5 {
					require.NoError(t, err, id)
					assert.Equal(t, jobs.OutcomeAccepted, res.Outcome, id)
					continue
				}
				if when == jobkeys.Reject {
					require.ErrorIs(t, err, jobs.ErrRejected, "the key is full: J holds a place in it")
				} else {
					require.NoError(t, err)
					assert.Equal(t, jobs.OutcomeCoalesced, res.Outcome)
					assert.Equal(t, "J", res.Job.ID, "folded into the oldest queued job, J")
				}
			}
			queued, _ = queuedOn(t, healthy, env.service, "rep", policy, "d")
			assert.Equal(t, []string{"ch/J", "ch/K1", "ch/K2", "ch/K3", "ch/K4"}, queued)

			require.NoError(t, healthy.client.Start(ctx))
			j := waitState(t, healthy, "J", jobs.StateCompleted)
			assert.Equal(t, 1, j.Attempts)
			assert.Equal(t, 1, l.count("J"), "J ran once")
			for i := 1; i <= 4; i++ {
				waitState(t, healthy, fmt.Sprintf("K%d", i), jobs.StateCompleted)
			}
		})
	}
}

// failingSupersede is a job store whose Supersede of job failID fails
// while armed, as a store that went away for that one write.
type failingSupersede struct {
	jobs.Store
	failID string
	armed  atomic.Bool
}

func (f *failingSupersede) Supersede(ctx context.Context, req jobs.SupersedeRequest) (jobs.Job, error) {
	if f.armed.Load() && req.JobID == f.failID {
		return jobs.Job{}, fmt.Errorf("%w: supersede job %q: injected failure", jobs.ErrUnavailable, req.JobID)
	}
	return f.Store.Supersede(ctx, req)
}

// TestEnqueueReplacedJobNotSupersededIsUndone is the regression test for
// an enqueue whose admission replaced the oldest queued job R and whose
// supersede of R's record then failed: the error said so, and R was left
// pending without a queue entry (a worker re-admitted it after AdmitGrace,
// replacing another job), which a replay of the enqueue did not change.
// The replacement is now undone (R queued again, the new job's entry
// removed), the error matches ErrOutcomeUnknown, and a replay makes the
// replacement and supersedes R.
func TestEnqueueReplacedJobNotSupersededIsUndone(t *testing.T) {
	t.Parallel()
	env := newRuntimeEnv(t)
	var fs *failingSupersede
	n := env.newNode(jobs.ClientConfig{}, func(st jobs.Store) jobs.Store {
		fs = &failingSupersede{Store: st, failID: "R"}
		return fs
	})
	policy := jobkeys.Policy{Key: []string{"doc", "/doc"}, MaxActive: 1, MaxQueuedPerKey: 1, WhenFull: jobkeys.ReplaceOldest}
	require.NoError(t, jobs.Register(n.client, jobs.Kind[docIn, docOut]{Type: "repl", Policy: policy, Work: noWork}))
	ctx := context.Background()
	for _, id := range []string{"R", "X"} {
		_, err := n.client.Enqueue(ctx, enqueueReq("repl", id, "t"+id, "d"))
		require.NoError(t, err)
	}

	fs.armed.Store(true)
	req := enqueueReq("repl", "B", "tB", "d")
	_, err := n.client.Enqueue(ctx, req)
	require.ErrorIs(t, err, jobs.ErrOutcomeUnknown)
	t.Logf("the enqueue's error: %v", err)
	assert.Contains(t, err.Error(), `"R"`)
	assert.Contains(t, err.Error(), req.IdempotencyKey)
	queued, _ := queuedOn(t, n, env.service, "repl", policy, "d")
	assert.Equal(t, []string{"ch/R", "ch/X"}, queued, "the replacement is undone")
	assert.Equal(t, jobs.StatePending, getJob(t, n, "R").State)
	assert.Equal(t, jobs.StatePending, getJob(t, n, "B").State)

	fs.armed.Store(false)
	res, err := n.client.Enqueue(ctx, req)
	require.NoError(t, err)
	assert.True(t, res.Repeated)
	assert.Equal(t, jobs.OutcomeReplaced, res.Outcome, "the replay makes the replacement")
	require.NotNil(t, res.Replaced)
	assert.Equal(t, "R", res.Replaced.ID)
	r := getJob(t, n, "R")
	assert.Equal(t, jobs.StateSuperseded, r.State)
	assert.Equal(t, jobs.ReasonReplaced, r.Reason)
	queued, _ = queuedOn(t, n, env.service, "repl", policy, "d")
	assert.Equal(t, []string{"ch/X", "ch/B"}, queued)
}
