package jobs_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jobkeys/jobkeys"
	"github.com/jobkeys/jobkeys/jobs"
)

// BenchmarkEnqueueMany is the rate of Client.EnqueueMany against
// Client.Enqueue called in a loop, one request after the other, in the
// same run: N (JOBKEYS_BENCH_MANY_N, 1,000) two-field requests (Type and
// Input) spread over 1,000, 100 or 1 keys (MaxActive 1, a queue that
// takes them all: every job is accepted), on R1 file storage, through a
// client never started, against a server in its own process. Reported:
// jobs/s, ratio-to-one-by-one (the loop's rate on the same keys), CPU and
// messages per job. Run with
//
//	go test -run '^$' -bench 'EnqueueMany' -benchtime 1x ./jobs/
func BenchmarkEnqueueMany(b *testing.B) {
	s := startBenchServer(b)
	n := envInt(b, "JOBKEYS_BENCH_MANY_N", 1000)
	var base benchBaseline
	for _, st := range []jetstream.StorageType{jetstream.MemoryStorage, jetstream.FileStorage} {
		for _, keys := range []int{1000, 100, 1} {
			for _, mode := range []string{"one-by-one", "many"} {
				b.Run(fmt.Sprintf("storage=%s/keys=%d/%s", st, keys, mode), func(b *testing.B) {
					var cost benchCost
					for range b.N {
						from, to := enqueueManyRow(b, s, st, mode, n, keys)
						cost.add(n, from, to)
					}
					cost.report(b, false)
					name := fmt.Sprintf("%s/keys=%d", st, keys)
					if mode == "one-by-one" {
						base.set(name, cost.rate())
						return
					}
					base.ratio(b, name, cost.rate(), "ratio-to-one-by-one")
				})
			}
		}
	}
}

func enqueueManyRow(b *testing.B, s *benchServer, st jetstream.StorageType, mode string, n, keys int) (from, to benchSample) {
	ctx := context.Background()
	bucket, svc := benchBuckets()
	rt := newDispatchClient(b, s, bucket, svc, st, 1)
	require.NoError(b, jobs.Register(rt.client, jobs.Kind[benchIn, struct{}]{
		Type: "bench", Policy: jobkeys.Policy{Key: []string{"k", "/k"}, MaxActive: 1, MaxQueuedPerKey: n},
	}))
	reqs := make([]jobs.EnqueueRequest, n)
	now := time.Now()
	for i := range reqs {
		reqs[i] = jobs.EnqueueRequest{Type: "bench", Input: benchBody(i, keys, now)}
	}
	from = s.sample(b)
	if mode == "one-by-one" {
		for i, req := range reqs {
			res, err := rt.client.Enqueue(ctx, req)
			require.NoError(b, err, "request %d", i)
			require.Equal(b, jobs.OutcomeAccepted, res.Outcome)
		}
	} else {
		for i, r := range rt.client.EnqueueMany(ctx, reqs) {
			require.NoError(b, r.Err, "request %d", i)
			require.Equal(b, jobs.OutcomeAccepted, r.Result.Outcome)
		}
	}
	to = s.sample(b)
	require.NoError(b, rt.store.Close(ctx))
	dropBuckets(b, rt.js, bucket, svc)
	return from, to
}
