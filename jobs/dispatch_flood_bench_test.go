package jobs_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jobkeys/jobkeys"
	"github.com/jobkeys/jobkeys/jobs"
)

// BenchmarkDispatchFlood is one key's deep backlog against three small
// keys (issue 23, row 2): one client, MaxWorkers 4, a kind keyed by
// ["tenant", "/tenant"] with MaxActive 1 and MaxQueuedPerKey 2,000, a 20 ms
// handler; 1,000 jobs of tenant "flood" are enqueued, then 3 jobs each of
// tenants b, c and d, then the client starts (memory storage, every
// interval its default). The run ends once the 9 b/c/d jobs have started
// and at least 150 flood jobs have (so that the flood's rate has a window).
// Rows: flood=0 (the 9 jobs alone: the baseline) and flood=1000. Reported:
//
//	bcd-start-ms       from Start until the last b/c/d job started
//	ratio-to-no-flood  bcd-start-ms / flood=0's in the same run
//	flood-before-last  flood jobs started before the last b/c/d job
//	flood-jobs/s       the flood key's rate, first to last flood start
//	ratio-to-ceiling   flood-jobs/s / 50 (one 20 ms handler at a time)
//
// and CPU and messages per job started. Run with
//
//	go test -run '^$' -bench 'DispatchFlood' -benchtime 1x ./jobs/
func BenchmarkDispatchFlood(b *testing.B) {
	s := startBenchServer(b)
	var base benchBaseline
	for _, flood := range []int{0, 1000} {
		b.Run(fmt.Sprintf("flood=%d", flood), func(b *testing.B) {
			var cost benchCost
			var bcd time.Duration
			var before int
			var floodRate float64
			for range b.N {
				r := floodRow(b, s, flood)
				cost.add(r.started, r.from, r.to)
				bcd += r.bcdStart
				before += r.floodBefore
				floodRate += r.floodRate
			}
			bcd /= time.Duration(b.N)
			cost.report(b, true)
			b.ReportMetric(ms(bcd), "bcd-start-ms")
			if flood == 0 {
				base.set("bcd", ms(bcd))
				return
			}
			base.ratio(b, "bcd", ms(bcd), "ratio-to-no-flood")
			b.ReportMetric(float64(before)/float64(b.N), "flood-before-last")
			b.ReportMetric(floodRate/float64(b.N), "flood-jobs/s")
			b.ReportMetric(floodRate/float64(b.N)/50, "ratio-to-ceiling")
		})
	}
}

type floodIn struct {
	Tenant string `json:"tenant"`
	I      int    `json:"i"`
}

type floodResult struct {
	from, to    benchSample
	started     int
	bcdStart    time.Duration
	floodBefore int
	floodRate   float64
}

func floodRow(b *testing.B, s *benchServer, flood int) floodResult {
	ctx := context.Background()
	bucket, svc := benchBuckets()
	rt := newDispatchClient(b, s, bucket, svc, jetstream.MemoryStorage, 4)
	const others = 9
	floodWindow := min(flood, 150)
	var (
		mu                    sync.Mutex
		floodStarts, bcd      int
		firstFlood, lastFlood time.Time
		lastBCD               time.Time
		floodBefore           int
		done                  = make(chan struct{})
		closed                bool
	)
	require.NoError(b, jobs.Register(rt.client, jobs.Kind[floodIn, struct{}]{
		Type:   "bench",
		Policy: jobkeys.Policy{Key: []string{"tenant", "/tenant"}, MaxActive: 1, MaxQueuedPerKey: 2000},
		Work: func(ctx context.Context, run *jobs.Run, in floodIn) (struct{}, error) {
			now := time.Now()
			mu.Lock()
			if in.Tenant == "flood" {
				if floodStarts == 0 {
					firstFlood = now
				}
				floodStarts++
				lastFlood = now
			} else {
				bcd++
				if bcd == others {
					lastBCD = now
					floodBefore = floodStarts
				}
			}
			if !closed && bcd == others && floodStarts >= floodWindow {
				closed = true
				close(done)
			}
			mu.Unlock()
			select {
			case <-time.After(20 * time.Millisecond):
				return struct{}{}, nil
			case <-ctx.Done():
				return struct{}{}, context.Cause(ctx)
			}
		},
	}))
	req := func(tenant string, i int) jobs.EnqueueRequest {
		id := fmt.Sprintf("%s-%d", tenant, i)
		return jobs.EnqueueRequest{ID: id, ChannelID: "bench", Type: "bench", TargetKey: id,
			IdempotencyKey: id, Fingerprint: id, Input: fmt.Appendf(nil, `{"tenant":%q,"i":%d}`, tenant, i)}
	}
	require.NoError(b, parallel(flood, 16, func(i int) error {
		_, err := rt.client.Enqueue(ctx, req("flood", i))
		return err
	}))
	for i := range 3 {
		for _, t := range []string{"b", "c", "d"} {
			_, err := rt.client.Enqueue(ctx, req(t, i))
			require.NoError(b, err)
		}
	}
	r := floodResult{from: s.sample(b)}
	start := time.Now()
	require.NoError(b, rt.client.Start(ctx))
	<-done
	r.to = s.sample(b)
	mu.Lock()
	r.started = floodStarts + bcd
	r.bcdStart = lastBCD.Sub(start)
	r.floodBefore = floodBefore
	if floodStarts > 1 {
		r.floodRate = float64(floodStarts-1) / lastFlood.Sub(firstFlood).Seconds()
	}
	mu.Unlock()
	sctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	require.NoError(b, rt.client.Stop(sctx))
	dropBuckets(b, rt.js, bucket, svc)
	return r
}
