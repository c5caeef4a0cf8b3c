package jobs_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jobkeys/jobkeys"
	"github.com/jobkeys/jobkeys/jobs"
)

// TestDispatchJobWhoseStaleSlotWasDroppedRunsAtOnce is the regression test
// for a job left behind by a worker that died between its slot and its
// claim (the quickstart's crashed worker did so in one run in three): the
// acquisition of another job of the key dropped the dead slot as stale
// (FailStale), so the job was neither queued nor holding a slot, and the
// worker that took its announcement again treated it as a job whose
// producer died before admitting it, to be admitted after AdmitGrace (30 s
// in the quickstart; here an hour). A slot dropped as stale now puts its
// job back at the head of its key's queue.
func TestDispatchJobWhoseStaleSlotWasDroppedRunsAtOnce(t *testing.T) {
	t.Parallel()
	env := newRuntimeEnv(t)
	cfg := fastConfig
	cfg.AdmitGrace, cfg.ReconcileInterval = time.Hour, time.Hour
	n := env.newNode(cfg, nil)
	dead := env.newNode(cfg, nil) // a worker that takes two slots and dies
	p := quickPolicy
	p.MaxActive = 2
	ran := make(chan string, 4)
	require.NoError(t, jobs.Register(n.client, jobs.Kind[docIn, docOut]{Type: "stale", Policy: p,
		Work: func(_ context.Context, run *jobs.Run, _ docIn) (docOut, error) {
			ran <- run.Job().ID
			return docOut{}, nil
		}}))
	ctx := context.Background()
	for _, id := range []string{"s1", "s2"} {
		_, err := n.client.Enqueue(ctx, enqueueReq("stale", id, id, "a"))
		require.NoError(t, err)
	}
	jt, err := dead.coord.JobType(env.service, "stale", p)
	require.NoError(t, err)
	for _, id := range []string{"s1", "s2"} {
		acq, err := jt.Acquire(ctx, "ch/"+id, []byte(`{"doc":"a"}`))
		require.NoError(t, err)
		require.Equal(t, jobkeys.KindAcquired, acq.Kind, "the dead worker's slot of %s", id)
	}
	// The worker takes the announcements made at enqueue, waits out the
	// dead slots, and the first job to take its own expired slot back
	// drops the other's as stale.
	require.NoError(t, n.client.Start(ctx))
	got := map[string]bool{}
	for len(got) < 2 {
		select {
		case id := <-ran:
			got[id] = true
		case <-time.After(60 * time.Second):
			t.Fatalf("ran %v: a job whose dead slot was dropped waited for AdmitGrace", got)
		}
	}
}
