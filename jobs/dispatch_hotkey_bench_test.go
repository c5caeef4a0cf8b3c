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
