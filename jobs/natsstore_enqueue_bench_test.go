package jobs

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jobkeys/jobkeys/internal/natstest"
)

// BenchmarkNATSStoreEnqueue is NATSStore.Enqueue alone, 16 goroutines, by
// bucket: memory storage (one atomic batch per enqueue), memory storage
// without atomic publish and R1 file storage (both written key by key);
// each on new targets and on 16 targets every enqueue of which supersedes
// the one before. Reported: enqueues/s and, beside memory's row of the
// same shape in the same run, ratio-to-memory. Run with
//
//	go test -run '^$' -bench 'NATSStoreEnqueue' -benchtime 2000x ./jobs/
func BenchmarkNATSStoreEnqueue(b *testing.B) {
	s := natstest.Run(b)
	ctx := context.Background()
	rates := map[string]float64{}
	for _, shape := range []string{"new-targets", "supersede"} {
		for _, bucket := range []string{"memory", "memory-unbatched", "file"} {
			b.Run(shape+"/"+bucket, func(b *testing.B) {
				_, js := natstest.Connect(b, s)
				name := fmt.Sprintf("JOBS_E%d", natsBucketSeq.Add(1))
				opts := []NATSStoreOption{WithBucket(name)}
				switch bucket {
				case "memory":
					opts = append(opts, WithCreateBucket(jetstream.MemoryStorage, 1))
				case "file":
					opts = append(opts, WithCreateBucket(jetstream.FileStorage, 1))
				case "memory-unbatched":
					_, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: name, History: 1, Storage: jetstream.MemoryStorage})
					require.NoError(b, err)
				}
				st, err := NewNATSStore(js, nil, opts...)
				require.NoError(b, err)
				b.Cleanup(func() { _ = js.DeleteKeyValue(context.Background(), name) })
				var seq atomic.Int64
				b.SetParallelism(8) // 16 goroutines on 2 cores
				b.ResetTimer()
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						i := seq.Add(1)
						id := strconv.FormatInt(i, 10)
						target := id
						if shape == "supersede" {
							target = strconv.FormatInt(i%16, 10)
						}
						if _, err := st.Enqueue(ctx, testEnqueueRequest("ch", id, target)); err != nil {
							b.Error(err)
							return
						}
					}
				})
				rate := float64(b.N) / b.Elapsed().Seconds()
				b.ReportMetric(rate, "enqueues/s")
				if bucket == "memory" {
					rates[shape] = rate
				} else if m := rates[shape]; m > 0 {
					b.ReportMetric(rate/m, "ratio-to-memory")
				}
			})
		}
	}
}
