package jobs_test

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jobkeys/jobkeys"
	"github.com/jobkeys/jobkeys/internal/natstest"
	"github.com/jobkeys/jobkeys/jobs"
)

// BenchmarkRuntimeJobCycleWakeUps is BenchmarkRuntimeJobCycle's runtime
// cases over key stores with targeted wake-ups (jobkeys.WithWakeUps), in
// one client (procs=1) or two on connections of their own (procs=2, each
// with half the workers, the jobs enqueued through the first), with the
// key stores' reads per job (key-reads/op). As there, a key admits
// workers/keys jobs at once: no job waits for a slot here (the root
// package's BenchmarkJobsClientWakeUps is the contended case, MaxActive
// 1). Run with
//
//	go test -run '^$' -bench RuntimeJobCycleWakeUps -benchtime 2000x ./jobs/
func BenchmarkRuntimeJobCycleWakeUps(b *testing.B) {
	s := natstest.Run(b)
	for _, procs := range []int{1, 2} {
		for _, keys := range []int{16, 1} {
			b.Run(fmt.Sprintf("procs=%d/workers=16/keys=%d", procs, keys), func(b *testing.B) {
				benchRuntimeWake(b, s.ClientURL(), procs, 16, keys)
			})
		}
	}
}

// benchReadKeys is a key store that counts its reads; it embeds the
// NATSStore, keeping its wake-ups and watches.
type benchReadKeys struct {
	*jobkeys.NATSStore
	gets *atomic.Int64
}

func (k benchReadKeys) Get(ctx context.Context, service, key string) ([]byte, uint64, error) {
	k.gets.Add(1)
	return k.NATSStore.Get(ctx, service, key)
}

func benchRuntimeWake(b *testing.B, url string, procs, workers, keys int) {
	n := runtimeSeq.Add(1)
	bucket, service := fmt.Sprintf("JOBS_RW%d", n), fmt.Sprintf("rw%d", n)
	inflight := make(chan struct{}, 4*workers)
	var done, total, reads atomic.Int64
	finished := make(chan struct{})
	clients := make([]*jobs.Client, procs)
	for i := range clients {
		nc, err := nats.Connect(url)
		require.NoError(b, err)
		b.Cleanup(nc.Close)
		js, err := jetstream.New(nc)
		require.NoError(b, err)
		st, err := jobs.NewNATSStore(js, nil, jobs.WithBucket(bucket), jobs.WithCreateBucket(jetstream.MemoryStorage, 1))
		require.NoError(b, err)
		ks, err := jobkeys.NewNATSStore(js, jobkeys.WithCreateBuckets(jetstream.MemoryStorage, 1), jobkeys.WithWakeUps(""))
		require.NoError(b, err)
		keyStore := &benchReadKeys{NATSStore: ks, gets: &reads}
		coord, err := jobkeys.NewCoordinator(keyStore, nil)
		require.NoError(b, err)
		signal := &settleSignal{Store: st, settled: func() {
			<-inflight
			if done.Add(1) == total.Load() {
				close(finished)
			}
		}}
		c, err := jobs.NewClient(signal, coord, &jobs.ClientConfig{
			KeyStore: keyStore, Service: service, MaxWorkers: workers / procs,
			PollInterval: 10 * time.Millisecond, ReconcileInterval: -1,
		})
		require.NoError(b, err)
		require.NoError(b, jobs.Register(c, jobs.Kind[docIn, docOut]{
			Type: "bench", Policy: jobkeys.Policy{Key: []string{"/doc"}, MaxActive: max(1, workers/keys), MaxQueuedPerKey: 4 * workers},
			Work: func(ctx context.Context, run *jobs.Run, in docIn) (docOut, error) { return docOut{}, nil },
		}))
		clients[i] = c
	}
	ctx := context.Background()
	for _, c := range clients {
		require.NoError(b, c.Start(ctx))
		b.Cleanup(func() { require.NoError(b, c.Stop(ctx)) })
	}
	total.Store(int64(b.N))
	b.ReportAllocs()
	b.ResetTimer()
	reads.Store(0)
	benchProduce(b, workers, inflight, func(i int) error {
		id := strconv.Itoa(i)
		_, err := clients[0].Enqueue(ctx, enqueueReq("bench", id, id, "k"+strconv.Itoa(i%keys)))
		return err
	})
	<-finished
	b.ReportMetric(float64(reads.Load())/float64(b.N), "key-reads/op")
}
