package jobs_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jobkeys/jobkeys/internal/natstest"
	"github.com/jobkeys/jobkeys/jobs"
)

// TestDispatchReconcileLeavesNoAnnouncementsBehind is the regression test
// for announcements piling up in the dispatch stream: every reconciliation
// pass announced the queued jobs of keys with room, a job not due yet
// among them; the worker that took such an announcement held it until the
// job's due time, so every pass left one more message per job not due in
// the stream (with 10,000 jobs parked a day ahead, 10,000 more every 30 s
// in every process). A job not due is now left to its one schedule (one
// per job: a newer one replaces it), and reconciliation announces only
// due jobs.
func TestDispatchReconcileLeavesNoAnnouncementsBehind(t *testing.T) {
	t.Parallel()
	env := newRuntimeEnv(t)
	cfg := fastConfig
	cfg.ReconcileInterval = time.Hour // the passes are the test's
	n := env.newNode(cfg, nil)
	require.NoError(t, jobs.Register(n.client, jobs.Kind[docIn, docOut]{Type: "later", Policy: quickPolicy, Work: noWork}))
	ctx := context.Background()
	const parked = 5
	for i := range parked {
		req := enqueueReq("later", fmt.Sprintf("p%d", i), fmt.Sprintf("p%d", i), fmt.Sprintf("k%d", i))
		req.AvailableAt = time.Now().Add(time.Hour)
		_, err := n.client.Enqueue(ctx, req)
		require.NoError(t, err)
	}
	require.NoError(t, n.client.Start(ctx))
	_, js := natstest.Connect(t, env.srv)
	stream, err := js.Stream(ctx, "JOBS_DISPATCH_"+env.service)
	require.NoError(t, err)
	cons, err := stream.Consumer(ctx, "workers")
	require.NoError(t, err)
	settled := func() {
		t.Helper()
		require.Eventually(t, func() bool {
			info, err := cons.Info(ctx)
			return err == nil && info.NumPending == 0 && info.NumAckPending == 0
		}, 30*time.Second, 10*time.Millisecond, "the workers never took every announcement")
	}
	for range 5 {
		_, err := n.client.Reconcile(ctx)
		require.NoError(t, err)
		settled()
	}
	info, err := stream.Info(ctx)
	require.NoError(t, err)
	cinfo, err := cons.Info(ctx)
	require.NoError(t, err)
	// One schedule per parked job, and the checks of the enqueues (the
	// checkers' own consumer; they end when AdmitGrace passed).
	assert.LessOrEqual(t, info.State.Msgs, uint64(2*parked), "messages left in the dispatch stream after 5 passes")
	assert.Zero(t, cinfo.NumAckPending, "announcements held by the workers")
	assert.LessOrEqual(t, cinfo.Delivered.Consumer, uint64(parked), "announcements of jobs not due taken by the workers: reconciliation announces only due jobs")
	for i := range parked {
		assert.Equal(t, jobs.StatePending, getJob(t, n, fmt.Sprintf("p%d", i)).State)
	}
}
