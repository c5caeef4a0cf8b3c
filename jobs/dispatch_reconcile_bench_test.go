package jobs_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jobkeys/jobkeys"
	"github.com/jobkeys/jobkeys/jobs"
)

// BenchmarkDispatchReconcile is the cost of one reconciliation pass
// (Client.Reconcile) over a backlog: JOBKEYS_BENCH_RECONCILE_N jobs
// (10,000) parked a day ahead on 1,000 keys (queued, never due), memory
// storage, on the bench server; the client is never started, so the pass
// is alone. A pass reads every key of the kind and the record of every
// queued job. Reported: ms per pass, and CPU and messages per queued job.
// Run with
//
//	go test -run '^$' -bench 'DispatchReconcile' -benchtime 1x ./jobs/
func BenchmarkDispatchReconcile(b *testing.B) {
	s := startBenchServer(b)
	n := envInt(b, "JOBKEYS_BENCH_RECONCILE_N", 10000)
	ctx := context.Background()
	bucket, svc := benchBuckets()
	rt := newDispatchClient(b, s, bucket, svc, jetstream.MemoryStorage, 1)
	require.NoError(b, jobs.Register(rt.client, jobs.Kind[benchIn, struct{}]{
		Type: "parked", Policy: jobkeys.Policy{Key: []string{"k", "/k"}, MaxActive: 1, MaxQueuedPerKey: 1000},
		Work: func(context.Context, *jobs.Run, benchIn) (struct{}, error) { return struct{}{}, nil },
	}))
	later := time.Now().Add(24 * time.Hour)
	require.NoError(b, parallel(n, 16, func(i int) error {
		req := benchReq("parked", i, 1000, time.Now())
		req.AvailableAt = later
		_, err := rt.client.Enqueue(ctx, req)
		return err
	}))
	var cost benchCost
	b.ResetTimer()
	for range b.N {
		from := s.sample(b)
		_, err := rt.client.Reconcile(ctx)
		require.NoError(b, err)
		to := s.sample(b)
		cost.add(n, from, to)
	}
	b.ReportMetric(float64(cost.elapsed.Milliseconds())/float64(b.N), "ms/pass")
	cost.report(b, true)
	dropBuckets(b, rt.js, bucket, svc)
}
