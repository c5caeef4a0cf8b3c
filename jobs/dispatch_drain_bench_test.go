package jobs_test

import (
	"context"
	"os"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jobkeys/jobkeys"
	"github.com/jobkeys/jobkeys/jobs"
)

// BenchmarkDispatchDrain is the drain rate by backlog (issue 23, row 1):
// N jobs (2,000; key = job index % 1,000, MaxActive 1, a no-op handler)
// are enqueued first, then one client with MaxWorkers 16 starts and runs
// them all; memory storage, every interval its default. The time runs
// from Start to the last handler's return. Rows:
//
//	empty                           the N jobs alone: the baseline
//	pending=10000                   beside 10,000 jobs of another
//	                                registered kind ("parked", its own
//	                                keys), enqueued through the client
//	                                with AvailableAt a day ahead: pending,
//	                                admitted, never due
//	completed=100000/pending=10000  the same after 100,000 jobs of the same
//	                                channel went pending → running →
//	                                completed through the store (Claim,
//	                                Settle); only with JOBKEYS_BENCH_LARGE=1
//	                                (seeding takes minutes)
//
// Each row reports jobs/s, its ratio to empty's rate in the same run
// (ratio-to-empty; target ≥ 0.8), and CPU and messages per drained job.
// The seeding is outside the measured part. JOBKEYS_BENCH_DRAIN_N sets N
// for every row, JOBKEYS_BENCH_BACKLOG_N for the two backlog rows only
// (the claim loop before issue 23 drains them at 15–20 jobs/s, so
// its figures were taken with 200). Run with
//
//	go test -run '^$' -bench 'DispatchDrain' -benchtime 1x ./jobs/
//	JOBKEYS_BENCH_LARGE=1 go test -run '^$' -bench 'DispatchDrain' -benchtime 1x -timeout 60m ./jobs/
func BenchmarkDispatchDrain(b *testing.B) {
	s := startBenchServer(b)
	n := envInt(b, "JOBKEYS_BENCH_DRAIN_N", 2000)
	nBacklog := envInt(b, "JOBKEYS_BENCH_BACKLOG_N", n)
	var base benchBaseline
	b.Run("empty", func(b *testing.B) {
		c := drainRow(b, s, n, 0, 0)
		c.report(b, false)
		base.set("empty", c.rate())
	})
	b.Run("pending=10000", func(b *testing.B) {
		c := drainRow(b, s, nBacklog, 10000, 0)
		c.report(b, false)
		base.ratio(b, "empty", c.rate(), "ratio-to-empty")
	})
	if os.Getenv("JOBKEYS_BENCH_LARGE") == "" {
		return
	}
	b.Run("completed=100000/pending=10000", func(b *testing.B) {
		c := drainRow(b, s, nBacklog, 10000, 100000)
		c.report(b, false)
		base.ratio(b, "empty", c.rate(), "ratio-to-empty")
	})
}

// drainRow runs the drain b.N times, each on fresh buckets, after seeding
// completed finished and pending parked jobs.
func drainRow(b *testing.B, s *benchServer, n, pending, completed int) benchCost {
	var cost benchCost
	ctx := context.Background()
	for range b.N {
		bucket, svc := benchBuckets()
		rt := newDispatchClient(b, s, bucket, svc, jetstream.MemoryStorage, 16)
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
		require.NoError(b, jobs.Register(rt.client, jobs.Kind[benchIn, struct{}]{
			Type: "parked", Policy: jobkeys.Policy{Key: []string{"p", "/k"}, MaxActive: 1, MaxQueuedPerKey: 100},
			Work: func(context.Context, *jobs.Run, benchIn) (struct{}, error) { return struct{}{}, nil },
		}))
		seedCompleted(b, rt.store, completed)
		later := time.Now().Add(24 * time.Hour)
		require.NoError(b, parallel(pending, 16, func(i int) error {
			req := benchReq("parked", i, 1000, time.Now())
			req.AvailableAt = later
			_, err := rt.client.Enqueue(ctx, req)
			return err
		}))
		require.NoError(b, parallel(n, 16, func(i int) error {
			_, err := rt.client.Enqueue(ctx, benchReq("bench", i, 1000, time.Now()))
			return err
		}))
		from := s.sample(b)
		require.NoError(b, rt.client.Start(ctx))
		<-done
		to := s.sample(b)
		cost.add(n, from, to)
		sctx, cancel := context.WithTimeout(ctx, time.Minute)
		require.NoError(b, rt.client.Stop(sctx))
		cancel()
		dropBuckets(b, rt.js, bucket, svc)
	}
	return cost
}

// seedCompleted takes n jobs of channel "bench" (type "done") through the
// store alone: enqueue, claim, settle, on 16 goroutines.
func seedCompleted(b *testing.B, st *jobs.NATSStore, n int) {
	if n == 0 {
		return
	}
	ctx := context.Background()
	start := time.Now()
	var settled atomic.Int64
	settle := func() error {
		got, err := st.Claim(ctx, jobs.ClaimRequest{ChannelID: "bench", Owner: "seed", Count: 4, TTL: time.Hour})
		if err != nil {
			return err
		}
		for _, j := range got {
			if _, err := st.Settle(ctx, jobs.SettleRequest{Claim: jobs.ClaimOf(j), Artifact: []byte(`{}`)}); err != nil {
				return err
			}
			settled.Add(1)
		}
		return nil
	}
	require.NoError(b, parallel(n, 16, func(i int) error {
		id := "done" + strconv.Itoa(i)
		if _, err := st.Enqueue(ctx, jobs.EnqueueRequest{ID: id, ChannelID: "bench", Type: "done", Version: 1,
			TargetKey: id, IdempotencyKey: id, Fingerprint: id, Input: benchBody(i, 1000, time.Now())}); err != nil {
			return err
		}
		return settle()
	}))
	for settled.Load() < int64(n) { // what the goroutines' claims missed
		require.NoError(b, settle())
	}
	b.Logf("seeded %d completed jobs in %v", n, time.Since(start).Round(time.Second))
}
