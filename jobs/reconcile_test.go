package jobs_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jobkeys/jobkeys"
	"github.com/jobkeys/jobkeys/jobs"
)

// Reconcile sweeps expired slots and removes queue entries whose job is
// over, or missing past AdmitGrace; the entries of live jobs, of missing
// jobs still in their grace, and of key-layer users stay.
func TestClientReconcile(t *testing.T) {
	t.Parallel()
	env := newRuntimeEnv(t)
	cfg := fastConfig
	cfg.AdmitGrace = 2 * time.Second
	n := env.newNode(cfg, nil)
	p := jobkeys.Policy{Key: []string{"/doc"}, MaxActive: 1, MaxQueuedPerKey: 10,
		HeartbeatInterval: 100 * time.Millisecond, HeartbeatTTL: 300 * time.Millisecond}
	require.NoError(t, jobs.Register(n.client, jobs.Kind[docIn, docOut]{Type: "rec", Policy: p, Work: noWork}))
	jt, err := n.coord.JobType(env.service, "rec", p)
	require.NoError(t, err)
	ctx := context.Background()

	for _, id := range []string{"live", "done"} {
		_, err := n.client.Enqueue(ctx, enqueueReq("rec", id, id, "q"))
		require.NoError(t, err)
	}
	// "done" is cancelled in the store alone: its queue entry is left.
	_, err = n.store.Cancel(ctx, jobs.CancelRequest{ChannelID: "ch", JobID: "done"})
	require.NoError(t, err)
	q := []byte(`{"doc":"q"}`)
	_, err = jt.Admit(ctx, "ch/fresh-ghost", q) // missing, within its grace
	require.NoError(t, err)
	_, err = jt.Admit(ctx, "plain-key-layer-job", q) // not the runtime's
	require.NoError(t, err)
	// A crashed worker's slot on another key.
	acq, err := jt.Acquire(ctx, "ch/crashed", []byte(`{"doc":"s"}`), jobkeys.WithRetry())
	require.NoError(t, err)
	require.Equal(t, jobkeys.KindAcquired, acq.Kind)
	time.Sleep(p.HeartbeatTTL + 50*time.Millisecond)

	rep, err := n.client.Reconcile(ctx)
	require.NoError(t, err)
	assert.Equal(t, 1, rep.SlotsSwept)
	assert.Equal(t, 1, rep.QueueEntriesRemoved, "only the finished job's entry")
	queued := func() []string {
		key, err := jt.Key(q)
		require.NoError(t, err)
		val, _, err := n.keys.Get(ctx, env.service, key.KVKey)
		require.NoError(t, err)
		st, err := jobkeys.ParseState(val)
		require.NoError(t, err)
		var ids []string
		for _, e := range st.Queued {
			ids = append(ids, e.JobID)
		}
		return ids
	}
	assert.Equal(t, []string{"ch/live", "ch/fresh-ghost", "plain-key-layer-job"}, queued())

	time.Sleep(cfg.AdmitGrace)
	rep, err = n.client.Reconcile(ctx)
	require.NoError(t, err)
	assert.Equal(t, 1, rep.QueueEntriesRemoved, "the ghost, past its grace")
	assert.Equal(t, []string{"ch/live", "plain-key-layer-job"}, queued())
}

// hangingGetStore is a job store whose Get of one job hangs until its
// context ends: a reconciliation pass stuck on a slow or partitioned store.
type hangingGetStore struct {
	jobs.Store
	jobID   string
	entered chan struct{}
}

func (s *hangingGetStore) Get(ctx context.Context, channelID, jobID string) (jobs.Detail, error) {
	if jobID == s.jobID {
		select {
		case s.entered <- struct{}{}:
		default:
		}
		<-ctx.Done()
		return jobs.Detail{}, ctx.Err()
	}
	return s.Store.Get(ctx, channelID, jobID)
}

// TestClientStopEndsReconciliation is the regression test for a Stop that
// waited for a reconciliation pass in flight: the pass ran under a context
// nothing cancelled before every goroutine had returned, so a pass stuck on
// a slow store held Stop past StopGrace until the caller's ctx ended (and
// left the pass running after it). Stop now ends the pass.
func TestClientStopEndsReconciliation(t *testing.T) {
	t.Parallel()
	env := newRuntimeEnv(t)
	hs := &hangingGetStore{jobID: "ghost", entered: make(chan struct{}, 1)}
	cfg := fastConfig
	cfg.StopGrace = 100 * time.Millisecond
	n := env.newNode(cfg, func(s jobs.Store) jobs.Store { hs.Store = s; return hs })
	p := jobkeys.Policy{Key: []string{"/doc"}, MaxActive: 1, MaxQueuedPerKey: 10}
	require.NoError(t, jobs.Register(n.client, jobs.Kind[docIn, docOut]{Type: "rec", Policy: p, Work: noWork}))
	jt, err := n.coord.JobType(env.service, "rec", p)
	require.NoError(t, err)
	ctx := context.Background()
	_, err = jt.Admit(ctx, "ch/ghost", []byte(`{"doc":"q"}`)) // a queue entry reconciliation checks
	require.NoError(t, err)
	require.NoError(t, n.client.Start(ctx))
	select {
	case <-hs.entered:
	case <-time.After(60 * time.Second):
		t.Fatal("reconciliation never read the queue entry's job")
	}
	sctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	assert.NoError(t, n.client.Stop(sctx), "Stop waited for the stuck reconciliation")
}
