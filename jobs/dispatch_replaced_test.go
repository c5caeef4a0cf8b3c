package jobs_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jobkeys/jobkeys"
	"github.com/jobkeys/jobkeys/jobs"
)

// TestDispatchReplacedJobsPassTheirRoomOn is the regression test for a key
// whose announcements all named replaced jobs: with MaxActive 2, the first
// two admissions are announced and the rest queue; newer admissions then
// replace the announced ones (ReplaceOldest). A worker taking such an
// announcement found its job superseded and its queue entry gone, and
// announced nothing, so the jobs queued behind waited for reconciliation
// (30 s in the quickstart; here an hour). The room an announcement stood
// for now goes to the key's next queued jobs.
func TestDispatchReplacedJobsPassTheirRoomOn(t *testing.T) {
	t.Parallel()
	env := newRuntimeEnv(t)
	cfg := fastConfig
	cfg.ReconcileInterval = time.Hour
	n := env.newNode(cfg, nil)
	p := quickPolicy
	p.MaxActive, p.MaxQueuedPerKey, p.WhenFull = 2, 2, jobkeys.ReplaceOldest
	require.NoError(t, jobs.Register(n.client, jobs.Kind[docIn, docOut]{Type: "burst", Policy: p, Work: noWork}))
	ctx := context.Background()
	var kept []string
	for i := 1; i <= 7; i++ {
		id := fmt.Sprintf("b%d", i)
		res, err := n.client.Enqueue(ctx, enqueueReq("burst", id, id, "a"))
		require.NoError(t, err)
		if res.Replaced != nil {
			t.Logf("%s replaced %s", id, res.Replaced.ID)
		}
		kept = append(kept, id)
	}
	require.NoError(t, n.client.Start(ctx))
	for _, id := range kept[3:] { // b1..b3 were replaced
		waitState(t, n, id, jobs.StateCompleted)
	}
}
