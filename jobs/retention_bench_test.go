package jobs

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jobkeys/jobkeys/internal/natstest"
)

// BenchmarkRetentionBucketSize runs N jobs through a NATSStore (enqueue,
// claim, settle; 8 at a time) on a memory-storage bucket (file storage
// with JOBKEYS_RETENTION_STORAGE=file), with finished jobs
// kept ("keep") and with a one-second retention ("1s"), in the same run,
// and reports the bucket's messages and bytes once the jobs are done and
// (with retention) their second has passed, the stream messages written
// per job (retention's rewrites included) and the time per job. N is 2,000,
// or JOBKEYS_RETENTION_JOBS:
//
//	go test -run '^$' -bench RetentionBucketSize -benchtime 1x ./jobs/
//	JOBKEYS_RETENTION_JOBS=100000 go test -run '^$' -bench RetentionBucketSize -benchtime 1x -timeout 1h ./jobs/
func BenchmarkRetentionBucketSize(b *testing.B) {
	storage := jetstream.MemoryStorage
	if os.Getenv("JOBKEYS_RETENTION_STORAGE") == "file" {
		storage = jetstream.FileStorage
	}
	n := 2000
	if v := os.Getenv("JOBKEYS_RETENTION_JOBS"); v != "" {
		var err error
		n, err = strconv.Atoi(v)
		require.NoError(b, err, "JOBKEYS_RETENTION_JOBS")
	}
	s := natstest.Run(b)
	ctx := context.Background()
	for _, bc := range []struct {
		name string
		r    Retention
	}{
		{"keep", Retention{Completed: RetentionKeep, Failed: RetentionKeep, Cancelled: RetentionKeep, Superseded: RetentionKeep}},
		{"1s", Retention{Completed: time.Second, Failed: time.Second, Cancelled: time.Second, Superseded: time.Second}},
	} {
		b.Run(fmt.Sprintf("%s/%s/jobs=%d", storage, bc.name, n), func(b *testing.B) {
			for b.Loop() {
				b.StopTimer()
				st, js := benchStore(b, s, storage)
				require.NoError(b, useRetention(st, bc.r))
				stream, err := js.Stream(ctx, "KV_"+st.Bucket())
				require.NoError(b, err)
				b.StartTimer()
				start := time.Now()
				ids := make(chan int)
				var wg sync.WaitGroup
				errs := make(chan error, 8)
				for range 8 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for i := range ids {
							id := strconv.Itoa(i)
							if _, err := st.Enqueue(ctx, testEnqueueRequest("ch", id, id)); err != nil {
								errs <- err
								return
							}
							j, err := st.ClaimJob(ctx, ClaimJobRequest{ChannelID: "ch", JobID: id, Owner: "w", TTL: time.Minute})
							if err != nil {
								errs <- err
								return
							}
							if _, err := st.Settle(ctx, SettleRequest{Claim: ClaimOf(j)}); err != nil {
								errs <- err
								return
							}
						}
					}()
				}
			feed:
				for i := range n {
					select {
					case ids <- i:
					case err := <-errs:
						b.Fatal(err)
						break feed
					}
				}
				close(ids)
				wg.Wait()
				select {
				case err := <-errs:
					b.Fatal(err)
				default:
				}
				elapsed := time.Since(start)
				b.StopTimer()
				// Settle the background purges, then (with retention) wait
				// until the last TTL has passed: the messages stop falling.
				require.NoError(b, st.Close(ctx))
				info, err := stream.Info(ctx)
				require.NoError(b, err)
				written := info.State.LastSeq
				if bc.name != "keep" {
					deadline := time.Now().Add(2 * time.Minute) // a failure guard
					for info.State.Msgs > 0 && time.Now().Before(deadline) {
						time.Sleep(200 * time.Millisecond)
						info, err = stream.Info(ctx)
						require.NoError(b, err)
					}
					require.Zero(b, info.State.Msgs, "messages left after the retention")
				}
				b.ReportMetric(float64(info.State.Msgs), "msgs-after")
				b.ReportMetric(float64(info.State.Bytes), "bytes-after")
				b.ReportMetric(float64(written)/float64(n), "writes/job")
				b.ReportMetric(float64(elapsed.Nanoseconds())/float64(n), "ns/job")
				b.StartTimer()
			}
		})
	}
}
