package jobs_test

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
)

// BenchmarkDispatchLatency is the latency from enqueue to handler start
// across processes (issue 23, row 5): a producer process, a worker process
// and the standalone server, all of internal/jobsbench, memory storage.
// The producer sends at a steady rate (25 or 500 jobs/s; an open loop, each
// send on its own goroutine), stamping each job's input with the time just
// before its Enqueue; the worker (MaxWorkers 16, 1,000 keys, MaxActive 1,
// a no-op handler, every interval its default) measures from that stamp to
// its handler's start. The baseline is a JetStream pull consumer (Consume,
// 16 messages in flight) in a worker process, fed by js.Publish from a
// producer process at the same rate, measured from just before the
// publish to the consumer's callback. 200 jobs at 25/s, 2,000 at 500/s.
// Reported: p50-ms, p99-ms, ratio-p50-to-jetstream (same rate, same run),
// jobs/s achieved (first send to last start), CPU (producer and worker
// processes) and messages per job. Run with
//
//	go test -run '^$' -bench 'DispatchLatency' -benchtime 1x ./jobs/
func BenchmarkDispatchLatency(b *testing.B) {
	s := startBenchServer(b)
	var base benchBaseline
	for _, rate := range []int{25, 500} {
		n := rate * 8
		if rate > 100 {
			n = rate * 4
		}
		for _, sys := range []string{"jetstream", "jobs"} {
			b.Run(fmt.Sprintf("rate=%d/%s", rate, sys), func(b *testing.B) {
				var cost benchCost
				var lat []time.Duration
				for range b.N {
					from, to, l := latencyRow(b, s, sys, rate, n)
					cost.add(n, from, to)
					lat = append(lat, l...)
				}
				sortDurations(lat)
				cost.report(b, false)
				p50 := ms(percentile(lat, 50))
				b.ReportMetric(p50, "p50-ms")
				b.ReportMetric(ms(percentile(lat, 99)), "p99-ms")
				key := strconv.Itoa(rate)
				if sys == "jetstream" {
					base.set(key, p50)
					return
				}
				base.ratio(b, key, p50, "ratio-p50-to-jetstream")
			})
		}
	}
}

func latencyRow(b *testing.B, s *benchServer, sys string, rate, n int) (from, to benchSample, lat []time.Duration) {
	common := []string{"-url", s.url}
	var worker, producer *benchProc
	var drop func()
	if sys == "jetstream" {
		_, js := s.connect(b)
		name := fmt.Sprintf("WQ%d", dispatchSeq.Add(1))
		benchStream(b, js, name, jetstream.MemoryStorage)
		drop = func() { require.NoError(b, js.DeleteStream(b.Context(), name)) }
		worker = startBenchProc(b, s.bin, append(common, "-mode", "jsworker", "-stream", name, "-workers", "16")...)
		producer = startBenchProc(b, s.bin, append(common, "-mode", "jsproducer", "-subject", name,
			"-rate", strconv.Itoa(rate), "-to", strconv.Itoa(n))...)
	} else {
		bucket, svc := benchBuckets()
		rt := newDispatchClient(b, s, bucket, svc, jetstream.MemoryStorage, 1) // makes the buckets
		drop = func() { dropBuckets(b, rt.js, bucket, svc) }
		common = append(common, "-bucket", bucket, "-service", svc)
		worker = startBenchProc(b, s.bin, append(common, "-mode", "worker", "-workers", "16", "-max-queued", "100")...)
		producer = startBenchProc(b, s.bin, append(common, "-mode", "producer",
			"-rate", strconv.Itoa(rate), "-to", strconv.Itoa(n), "-keys", "1000")...)
	}
	for _, p := range []*benchProc{worker, producer} {
		_, ok := p.await("ready")
		require.True(b, ok, "process ended before it was ready")
	}
	pids := []int{worker.cmd.Process.Pid, producer.cmd.Process.Pid}
	from = s.sample(b, pids...)
	_, err := producer.stdin.Write([]byte("go\n"))
	require.NoError(b, err)
	for len(lat) < n {
		l, ok := worker.await("s ")
		require.True(b, ok, "worker ended after %d of %d jobs", len(lat), n)
		f := strings.Fields(l)
		ns, err := strconv.ParseInt(f[len(f)-1], 10, 64)
		require.NoError(b, err, "%q", l)
		lat = append(lat, time.Duration(ns))
	}
	to = s.sample(b, pids...)
	l, ok := producer.await("done")
	require.True(b, ok)
	require.True(b, strings.HasSuffix(l, " 0"), "producer: %s (sent, failed)", l)
	producer.stop(b)
	worker.stop(b)
	drop()
	return from, to, lat
}
