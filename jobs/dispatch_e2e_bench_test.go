package jobs_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jobkeys/jobkeys"
	"github.com/jobkeys/jobkeys/jobs"
)

// BenchmarkDispatchEndToEnd is the runtime end to end against a plain
// JetStream work queue (issue 23, row 4), per storage (memory, R1 file):
//
//	jetstream  N messages published (js.Publish, acknowledged, 16
//	           goroutines) to a work-queue stream, then fetched by 16
//	           goroutines on one pull consumer (Fetch of up to 16) and
//	           acked (Ack, flushed at the end): the baseline
//	jobs       N jobs enqueued (client.Enqueue, 16 goroutines; 1,000
//	           keys, MaxActive 1), then drained by the same client started
//	           with MaxWorkers 16 and a no-op handler, every interval its
//	           default
//
// with the same bodies ({"k":"k<i>","t":<ns>}, 31–33 bytes). N is 2,000
// on memory, JOBKEYS_BENCH_FILE_N (500) on file. The time runs from the
// first enqueue (publish) to the last handler's return (ack). Reported:
// jobs/s end to end, enqueue-jobs/s and drain-jobs/s of the two phases,
// ratio-to-jetstream (end to end, same storage, same run), CPU and
// messages per job. Run with
//
//	go test -run '^$' -bench 'DispatchEndToEnd' -benchtime 1x ./jobs/
func BenchmarkDispatchEndToEnd(b *testing.B) {
	s := startBenchServer(b)
	var base benchBaseline
	for _, st := range []jetstream.StorageType{jetstream.MemoryStorage, jetstream.FileStorage} {
		n := 2000
		if st == jetstream.FileStorage {
			n = envInt(b, "JOBKEYS_BENCH_FILE_N", 500)
		}
		for _, sys := range []string{"jetstream", "jobs"} {
			b.Run(fmt.Sprintf("storage=%s/%s", st, sys), func(b *testing.B) {
				var cost, enq, drain benchCost
				for range b.N {
					var from, mid, to benchSample
					if sys == "jetstream" {
						from, mid, to = e2eJetStream(b, s, st, n)
					} else {
						from, mid, to = e2eJobs(b, s, st, n)
					}
					cost.add(n, from, to)
					enq.add(n, from, mid)
					drain.add(n, mid, to)
				}
				cost.report(b, false)
				b.ReportMetric(enq.rate(), "enqueue-jobs/s")
				b.ReportMetric(drain.rate(), "drain-jobs/s")
				if sys == "jetstream" {
					base.set(st.String(), cost.rate())
					return
				}
				base.ratio(b, st.String(), cost.rate(), "ratio-to-jetstream")
			})
		}
	}
}

func e2eJobs(b *testing.B, s *benchServer, st jetstream.StorageType, n int) (from, mid, to benchSample) {
	ctx := context.Background()
	bucket, svc := benchBuckets()
	rt := newDispatchClient(b, s, bucket, svc, st, 16)
	var ended atomic.Int64
	done := make(chan struct{})
	require.NoError(b, jobs.Register(rt.client, jobs.Kind[benchIn, struct{}]{
		Type: "bench", Policy: jobkeys.Policy{Key: []string{"k", "/k"}, MaxActive: 1, MaxQueuedPerKey: 100},
		Work: func(context.Context, *jobs.Run, benchIn) (struct{}, error) {
			if ended.Add(1) == int64(n) {
				close(done)
			}
			return struct{}{}, nil
		},
	}))
	from = s.sample(b)
	require.NoError(b, parallel(n, 16, func(i int) error {
		_, err := rt.client.Enqueue(ctx, benchReq("bench", i, 1000, time.Now()))
		return err
	}))
	mid = s.sample(b)
	require.NoError(b, rt.client.Start(ctx))
	<-done
	to = s.sample(b)
	sctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	require.NoError(b, rt.client.Stop(sctx))
	dropBuckets(b, rt.js, bucket, svc)
	return from, mid, to
}

// benchStream makes a work-queue stream on subject name.
func benchStream(b *testing.B, js jetstream.JetStream, name string, st jetstream.StorageType) jetstream.Stream {
	stream, err := js.CreateStream(context.Background(), jetstream.StreamConfig{
		Name: name, Subjects: []string{name}, Retention: jetstream.WorkQueuePolicy, Storage: st,
	})
	require.NoError(b, err)
	return stream
}

func e2eJetStream(b *testing.B, s *benchServer, st jetstream.StorageType, n int) (from, mid, to benchSample) {
	ctx := context.Background()
	nc, js := s.connect(b)
	name := fmt.Sprintf("WQ%d", dispatchSeq.Add(1))
	stream := benchStream(b, js, name, st)
	cons, err := stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "W", AckPolicy: jetstream.AckExplicitPolicy})
	require.NoError(b, err)
	from = s.sample(b)
	require.NoError(b, parallel(n, 16, func(i int) error {
		_, err := js.Publish(ctx, name, benchBody(i, 1000, time.Now()))
		return err
	}))
	mid = s.sample(b)
	var got atomic.Int64
	require.NoError(b, parallel(16, 16, func(int) error {
		for got.Load() < int64(n) {
			batch, err := cons.Fetch(16, jetstream.FetchMaxWait(100*time.Millisecond))
			if err != nil {
				return err
			}
			for m := range batch.Messages() {
				if err := m.Ack(); err != nil {
					return err
				}
				got.Add(1)
			}
			if err := batch.Error(); err != nil {
				return err
			}
		}
		return nil
	}))
	require.NoError(b, nc.Flush())
	to = s.sample(b)
	require.NoError(b, js.DeleteStream(ctx, name))
	return from, mid, to
}
