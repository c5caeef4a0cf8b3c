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

// Job cycles through the runtime (enqueue → claim + acquire → settle +
// release) on an embedded server over TCP (memory storage), beside the
// store-only cycle (enqueue → claim → settle) in the same run. Run with
//
//	go test -run '^$' -bench RuntimeJobCycle -benchtime 2000x ./jobs/
//
// ns/op is per job; the runtime cases enqueue from as many goroutines as
// there are workers and keep 4 jobs per worker in flight, and
// a key admits workers/keys running jobs at once (at least 1).
func BenchmarkRuntimeJobCycle(b *testing.B) {
	s := natstest.Run(b)
	ctx := context.Background()
	b.Run("store-only", func(b *testing.B) {
		_, js := natstest.Connect(b, s)
		st, err := jobs.NewNATSStore(js, nil, jobs.WithBucket(fmt.Sprintf("JOBS_RB%d", runtimeSeq.Add(1))), jobs.WithCreateBucket(jetstream.MemoryStorage, 1))
		require.NoError(b, err)
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			id := strconv.Itoa(i)
			req := enqueueReq("bench", id, id, "d")
			req.Version = 1
			if _, err := st.Enqueue(ctx, req); err != nil {
				b.Fatal(err)
			}
			got, err := st.Claim(ctx, jobs.ClaimRequest{Owner: "w", Count: 1, TTL: time.Minute})
			if err != nil || len(got) != 1 {
				b.Fatal(len(got), err)
			}
			if _, err := st.Settle(ctx, jobs.SettleRequest{Claim: jobs.ClaimOf(got[0]), Artifact: []byte(`{}`)}); err != nil {
				b.Fatal(err)
			}
		}
	})
	for _, workers := range []int{1, 16} {
		for _, keys := range []int{16, 1} {
			b.Run(fmt.Sprintf("runtime/workers=%d/keys=%d", workers, keys), func(b *testing.B) {
				benchRuntime(b, s.ClientURL(), workers, keys)
			})
		}
	}
}

// settleSignal is a job store that reports every successful settle: the
// end of a cycle.
type settleSignal struct {
	jobs.Store
	settled func()
}

func (s *settleSignal) Settle(ctx context.Context, req jobs.SettleRequest) (jobs.Detail, error) {
	d, err := s.Store.Settle(ctx, req)
	if err == nil {
		s.settled()
	}
	return d, err
}

func benchRuntime(b *testing.B, url string, workers, keys int) {
	nc, err := nats.Connect(url)
	require.NoError(b, err)
	b.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(b, err)
	n := runtimeSeq.Add(1)
	st, err := jobs.NewNATSStore(js, nil, jobs.WithBucket(fmt.Sprintf("JOBS_RB%d", n)), jobs.WithCreateBucket(jetstream.MemoryStorage, 1))
	require.NoError(b, err)
	ks, err := jobkeys.NewNATSStore(js, jobkeys.WithCreateBuckets(jetstream.MemoryStorage, 1))
	require.NoError(b, err)
	coord, err := jobkeys.NewCoordinator(ks, nil)
	require.NoError(b, err)
	inflight := make(chan struct{}, 4*workers)
	var done, total atomic.Int64
	finished := make(chan struct{})
	signal := &settleSignal{Store: st, settled: func() {
		<-inflight
		if done.Add(1) == total.Load() {
			close(finished)
		}
	}}
	c, err := jobs.NewClient(signal, coord, &jobs.ClientConfig{
		KeyStore: ks, Service: fmt.Sprintf("rb%d", n), MaxWorkers: workers,
		PollInterval: 10 * time.Millisecond, ReconcileInterval: -1,
	})
	require.NoError(b, err)
	require.NoError(b, jobs.Register(c, jobs.Kind[docIn, docOut]{
		Type: "bench", Policy: jobkeys.Policy{Key: []string{"/doc"}, MaxActive: max(1, workers/keys), MaxQueuedPerKey: 4 * workers},
		Work: func(ctx context.Context, run *jobs.Run, in docIn) (docOut, error) { return docOut{}, nil },
	}))
	ctx := context.Background()
	require.NoError(b, c.Start(ctx))
	b.Cleanup(func() { require.NoError(b, c.Stop(ctx)) })
	total.Store(int64(b.N))
	b.ReportAllocs()
	b.ResetTimer()
	// As many producers as workers, so that enqueueing keeps up.
	benchProduce(b, workers, inflight, func(i int) error {
		id := strconv.Itoa(i)
		_, err := c.Enqueue(ctx, enqueueReq("bench", id, id, "k"+strconv.Itoa(i%keys)))
		return err
	})
	<-finished
}

// benchProduce enqueues b.N jobs from workers producers, one at a time
// each, a slot of inflight taken before each (the handlers free them), and
// fails b on the first error.
func benchProduce(b *testing.B, workers int, inflight chan struct{}, enqueue func(i int) error) {
	b.Helper()
	var next atomic.Int64
	errs := make(chan error, workers)
	for range workers {
		go func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= b.N {
					errs <- nil
					return
				}
				inflight <- struct{}{}
				if err := enqueue(i); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	for range workers {
		if err := <-errs; err != nil {
			b.Fatal(err)
		}
	}
}
