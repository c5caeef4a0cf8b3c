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

// BenchmarkDispatchEnqueue is the enqueue rate by storage (issue 23, row
// 6): N jobs through client.Enqueue (a client never started; 1,000 keys,
// MaxActive 1) against N acknowledged js.Publish calls of the same bodies
// to a work-queue stream, 16 goroutines each, on memory and R1 file
// storage. N is 2,000 on memory, JOBKEYS_BENCH_FILE_N (500) on file.
// Reported: jobs/s, ratio-to-jetstream (same storage), for file/jobs also
// ratio-to-memory (memory/jobs of the same run), CPU and messages per job.
// Run with
//
//	go test -run '^$' -bench 'DispatchEnqueue' -benchtime 1x ./jobs/
func BenchmarkDispatchEnqueue(b *testing.B) {
	s := startBenchServer(b)
	var base benchBaseline
	for _, st := range []jetstream.StorageType{jetstream.MemoryStorage, jetstream.FileStorage} {
		n := 2000
		if st == jetstream.FileStorage {
			n = envInt(b, "JOBKEYS_BENCH_FILE_N", 500)
		}
		for _, sys := range []string{"jetstream", "jobs"} {
			b.Run(fmt.Sprintf("storage=%s/%s", st, sys), func(b *testing.B) {
				var cost benchCost
				for range b.N {
					from, to := enqueueRow(b, s, st, sys, n)
					cost.add(n, from, to)
				}
				cost.report(b, false)
				if sys == "jetstream" {
					base.set(st.String()+"/jetstream", cost.rate())
					return
				}
				base.ratio(b, st.String()+"/jetstream", cost.rate(), "ratio-to-jetstream")
				if st == jetstream.MemoryStorage {
					base.set("memory/jobs", cost.rate())
				} else {
					base.ratio(b, "memory/jobs", cost.rate(), "ratio-to-memory")
				}
			})
		}
	}
}

func enqueueRow(b *testing.B, s *benchServer, st jetstream.StorageType, sys string, n int) (from, to benchSample) {
	ctx := context.Background()
	if sys == "jetstream" {
		_, js := s.connect(b)
		name := fmt.Sprintf("WQ%d", dispatchSeq.Add(1))
		benchStream(b, js, name, st)
		from = s.sample(b)
		require.NoError(b, parallel(n, 16, func(i int) error {
			_, err := js.Publish(ctx, name, benchBody(i, 1000, time.Now()))
			return err
		}))
		to = s.sample(b)
		require.NoError(b, js.DeleteStream(ctx, name))
		return from, to
	}
	bucket, svc := benchBuckets()
	rt := newDispatchClient(b, s, bucket, svc, st, 1)
	require.NoError(b, jobs.Register(rt.client, jobs.Kind[benchIn, struct{}]{
		Type: "bench", Policy: jobkeys.Policy{Key: []string{"k", "/k"}, MaxActive: 1, MaxQueuedPerKey: 100},
		Work: func(context.Context, *jobs.Run, benchIn) (struct{}, error) { return struct{}{}, nil },
	}))
	from = s.sample(b)
	require.NoError(b, parallel(n, 16, func(i int) error {
		_, err := rt.client.Enqueue(ctx, benchReq("bench", i, 1000, time.Now()))
		return err
	}))
	to = s.sample(b)
	dropBuckets(b, rt.js, bucket, svc)
	return from, to
}
