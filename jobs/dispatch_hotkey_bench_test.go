package jobs_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jobkeys/jobkeys"
	"github.com/jobkeys/jobkeys/jobs"
)

// BenchmarkDispatchHotKey streams N jobs (no-op handler) through one
// key against the same jobs on 1,000 keys (issue 23, row 3), 16 workers
// in all: in one process (procs=1: the test's client, MaxWorkers 16, also
// enqueues) or in four worker processes of internal/jobsbench
// (procs=4: MaxWorkers 4 each; the test process enqueues through a client
// it never starts). The workers start first; the time runs from the first
// enqueue (16 goroutines) to the last handler's return. Memory storage,
// every interval its default, MaxQueuedPerKey 1,000. Rows per procs:
// keys=1000 (MaxActive 1: the baseline), keys=1/max-active=1,
// keys=1/max-active=4. Reported: jobs/s, ratio-to-1000-keys (same procs,
// same run), CPU (the test process and the worker processes) and messages
// per job. JOBKEYS_BENCH_HOT_N sets the number of jobs (1,000): on one key
// it is also the depth its queue reaches, and every write of a key
// carries its whole queue (the key layer's state document). Run with
//
//	go test -run '^$' -bench 'DispatchHotKey' -benchtime 1x ./jobs/
func BenchmarkDispatchHotKey(b *testing.B) {
	s := startBenchServer(b)
	n := envInt(b, "JOBKEYS_BENCH_HOT_N", 1000)
	var base benchBaseline
	for _, procs := range []int{1, 4} {
		for _, row := range []struct{ keys, maxActive int }{{1000, 1}, {1, 1}, {1, 4}} {
			name := fmt.Sprintf("procs=%d/keys=%d", procs, row.keys)
			if row.keys == 1 {
				name += fmt.Sprintf("/max-active=%d", row.maxActive)
			}
			b.Run(name, func(b *testing.B) {
				var cost benchCost
				for range b.N {
					from, to := hotKeyRow(b, s, procs, n, row.keys, row.maxActive)
					cost.add(n, from, to)
				}
				cost.report(b, false)
				if row.keys == 1000 {
					base.set(strconv.Itoa(procs), cost.rate())
					return
				}
				base.ratio(b, strconv.Itoa(procs), cost.rate(), "ratio-to-1000-keys")
			})
		}
	}
}

// hotKeyRow runs one stream of n jobs over keys keys and returns the
// samples around it.
func hotKeyRow(b *testing.B, s *benchServer, procs, n, keys, maxActive int) (from, to benchSample) {
	ctx := context.Background()
	bucket, svc := benchBuckets()
	workers := 16
	if procs > 1 {
		workers = 0 // this client only enqueues
	}
	rt := newDispatchClient(b, s, bucket, svc, jetstream.MemoryStorage, max(1, workers))
	var ended atomic.Int64
	done := make(chan struct{})
	require.NoError(b, jobs.Register(rt.client, jobs.Kind[benchIn, struct{}]{
		Type: "bench", Policy: jobkeys.Policy{Key: []string{"k", "/k"}, MaxActive: maxActive, MaxQueuedPerKey: 1000},
		Work: func(context.Context, *jobs.Run, benchIn) (struct{}, error) {
			if ended.Add(1) == int64(n) {
				close(done)
			}
			return struct{}{}, nil
		},
	}))
	var pids []int
	var ps []*benchProc
	if procs == 1 {
		require.NoError(b, rt.client.Start(ctx))
	} else {
		for range procs {
			p := startBenchProc(b, s.bin, "-mode", "worker", "-url", s.url, "-bucket", bucket, "-service", svc,
				"-workers", strconv.Itoa(16/procs), "-max-active", strconv.Itoa(maxActive), "-max-queued", "1000")
			_, ok := p.await("ready")
			require.True(b, ok, "worker process ended before it was ready")
			ps = append(ps, p)
			pids = append(pids, p.cmd.Process.Pid)
		}
		go func() {
			countEnds(ps, n)
			close(done)
		}()
		b.Cleanup(func() {
			for _, p := range ps {
				p.stop(b)
			}
		})
	}
	from = s.sample(b, pids...)
	require.NoError(b, parallel(n, 16, func(i int) error {
		_, err := rt.client.Enqueue(ctx, benchReq("bench", i, keys, time.Now()))
		return err
	}))
	<-done
	to = s.sample(b, pids...)
	sctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	require.NoError(b, rt.client.Stop(sctx)) // a client never started returns at once
	for _, p := range ps {
		p.stop(b)
	}
	dropBuckets(b, rt.js, bucket, svc)
	return from, to
}

// countEnds returns once the processes have printed n "e" lines in all
// (or all ended).
func countEnds(ps []*benchProc, n int) {
	ends := make(chan struct{}, n)
	for _, p := range ps {
		go func() {
			for l := range p.lines {
				if strings.HasPrefix(l, "e ") {
					ends <- struct{}{}
				}
			}
		}()
	}
	for range n {
		<-ends
	}
}

// BenchmarkDispatchHotKeyQueueDepth is the bound of the hot-key rows: the
// key layer alone (no job store, no dispatch) cycling one key — acquire
// the job at the head of its queue, release it, admit a new one at the
// tail — with the queue held at depth jobs, on the bench server, memory
// storage. Every write of a key carries its whole state, queue included
// (the TypeScript original's wire format), so a cycle's cost grows with
// the depth. Reported: cycles/s, bytes of the key's state, and
// ratio-to-depth-1 (same run). Run with
//
//	go test -run '^$' -bench 'DispatchHotKeyQueueDepth' -benchtime 1x ./jobs/
func BenchmarkDispatchHotKeyQueueDepth(b *testing.B) {
	s := startBenchServer(b)
	const cycles = 500
	var base benchBaseline
	for _, depth := range []int{1, 100, 1000} {
		b.Run(fmt.Sprintf("depth=%d", depth), func(b *testing.B) {
			ctx := context.Background()
			_, js := s.connect(b)
			_, svc := benchBuckets()
			ks, err := jobkeys.NewNATSStore(js, jobkeys.WithCreateBuckets(jetstream.MemoryStorage, 1))
			require.NoError(b, err)
			coord, err := jobkeys.NewCoordinator(ks, nil)
			require.NoError(b, err)
			jt, err := coord.JobType(svc, "bench", jobkeys.Policy{Key: []string{"k", "/k"}, MaxActive: 1, MaxQueuedPerKey: depth + 1})
			require.NoError(b, err)
			in := benchBody(0, 1, time.Now())
			id := func(i int) string { return "bench/j" + strconv.Itoa(i) }
			for i := range depth {
				_, err := jt.Admit(ctx, id(i), in)
				require.NoError(b, err)
			}
			var size int
			start := time.Now()
			for range b.N {
				for i := range cycles {
					acq, err := jt.Acquire(ctx, id(i), in)
					require.NoError(b, err)
					require.Equal(b, jobkeys.KindAcquired, acq.Kind)
					_, err = jt.Release(ctx, acq.Lease)
					require.NoError(b, err)
					_, err = jt.Admit(ctx, id(depth+i), in)
					require.NoError(b, err)
				}
			}
			rate := float64(cycles*b.N) / time.Since(start).Seconds()
			key, err := jt.Key(in)
			require.NoError(b, err)
			val, _, err := ks.Get(ctx, svc, key.KVKey)
			require.NoError(b, err)
			size = len(val)
			b.ReportMetric(rate, "cycles/s")
			b.ReportMetric(float64(size), "state-bytes")
			if depth == 1 {
				base.set("1", rate)
			} else {
				base.ratio(b, "1", rate, "ratio-to-depth-1")
			}
			if err := js.DeleteKeyValue(ctx, "JOBS_KEYS_"+svc); err != nil {
				b.Logf("delete bucket: %v", err)
			}
		})
	}
}
