package main

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jobkeys/jobkeys"
	"github.com/jobkeys/jobkeys/internal/natstest"
	"github.com/jobkeys/jobkeys/jobs"
)

// TestJobsResumeAndRetryAnnounceTheJob is the regression test for "jobs
// resume" and "jobs retry" under the runtime's dispatch: they wrote the
// record through the job store alone, so no worker was told the job was
// pending again, and a resumed job waited for reconciliation (here an
// hour away) however idle the workers. Both commands now go through the
// runtime's client, which announces the job.
func TestJobsResumeAndRetryAnnounceTheJob(t *testing.T) {
	t.Parallel()
	srv := natstest.Run(t)
	_, js := natstest.Connect(t, srv)
	st, err := jobs.NewNATSStore(js, nil, jobs.WithCreateBucket(jetstream.MemoryStorage, 1))
	require.NoError(t, err)
	ks, err := jobkeys.NewNATSStore(js, jobkeys.WithCreateBuckets(jetstream.MemoryStorage, 1))
	require.NoError(t, err)
	coord, err := jobkeys.NewCoordinator(ks, nil)
	require.NoError(t, err)
	worker, err := jobs.NewClient(st, coord, &jobs.ClientConfig{KeyStore: ks, ReconcileInterval: time.Hour}) // service "jobs"
	require.NoError(t, err)
	type in struct {
		Doc string `json:"doc"`
	}
	ran := make(chan string, 4)
	require.NoError(t, jobs.Register(worker, jobs.Kind[in, struct{}]{Type: "render",
		Policy: jobkeys.Policy{Key: []string{"doc", "/doc"}, MaxActive: 1, MaxQueuedPerKey: 3},
		Work: func(_ context.Context, run *jobs.Run, _ in) (struct{}, error) {
			ran <- run.Job().ID
			return struct{}{}, nil
		}}))
	ctx := context.Background()
	r := newRunner(t, srv.ClientURL())
	for _, id := range []string{"R1", "R2"} {
		_, err := worker.Enqueue(ctx, jobs.EnqueueRequest{ID: id, ChannelID: "ch", Type: "render", TargetKey: "t-" + id,
			IdempotencyKey: "idem-" + id, Fingerprint: "fp", Input: json.RawMessage(`{"doc":"` + id + `"}`)})
		require.NoError(t, err)
		res := r.run("jobs", "pause", "ch", id)
		require.Equal(t, exitOK, res.code, res.stderr)
	}
	require.NoError(t, worker.Start(ctx))
	t.Cleanup(func() {
		sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		require.NoError(t, worker.Stop(sctx))
	})
	// The worker takes the announcements made at enqueue and drops them:
	// the jobs are paused.
	cons, err := js.Consumer(ctx, "JOBS_DISPATCH_jobs", "workers")
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		info, err := cons.Info(ctx)
		return err == nil && info.NumPending == 0 && info.NumAckPending == 0 && info.Delivered.Consumer >= 2
	}, 30*time.Second, 10*time.Millisecond, "the worker never took the announcements made at enqueue")

	res := r.run("jobs", "resume", "ch", "R1")
	require.Equal(t, exitOK, res.code, res.stderr)
	res = r.run("jobs", "retry", "ch", "R2")
	require.Equal(t, exitOK, res.code, res.stderr)
	got := map[string]bool{}
	for len(got) < 2 {
		select {
		case id := <-ran:
			got[id] = true
		case <-time.After(60 * time.Second):
			t.Fatalf("ran %v; a resumed or retried job was never announced", got)
		}
	}
}
