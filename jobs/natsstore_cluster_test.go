package jobs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jobkeys/jobkeys/internal/natstest"
)

// TestNATSStoreClusterClaimsAndLeaderLoss runs NATSStore on an R3 bucket of
// a 3-node cluster, with a store connected to each node: workers on the
// three connections claim and settle the jobs of one channel while the
// bucket's stream leader is shut down mid-run. No claim (job and claim
// generation) is handed to two workers, and every job ends completed: none
// is lost with the leader (a claim whose answer was lost is reclaimed once
// it expires). It needs a cluster, so it runs only with JOBKEYS_CLUSTER=1.
func TestNATSStoreClusterClaimsAndLeaderLoss(t *testing.T) {
	if os.Getenv("JOBKEYS_CLUSTER") != "1" {
		t.Skip("3-node cluster test: set JOBKEYS_CLUSTER=1 to run it")
	}
	c := natstest.StartCluster(t, natstest.ClusterOptions{Nodes: 3})
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Second)
	defer cancel()
	const bucket, channel, jobCount = "JOBS_CLUSTER", "ch", 60
	connect := func(i int) jetstream.JetStream {
		nc, err := nats.Connect(c.URLs(i), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
		require.NoError(t, err)
		t.Cleanup(nc.Close)
		js, err := jetstream.New(nc)
		require.NoError(t, err)
		return js
	}
	stores := make([]*NATSStore, c.Size())
	for i := range stores {
		for {
			st, err := NewNATSStore(connect(i), nil, WithBucket(bucket), WithCreateBucket(jetstream.FileStorage, 3))
			if err == nil {
				stores[i] = st
				break
			}
			require.NoError(t, ctx.Err(), "open the R3 bucket through node %d: %v", i, err)
			time.Sleep(200 * time.Millisecond)
		}
	}
	for i := range jobCount {
		id := fmt.Sprintf("job-%02d", i)
		for {
			_, err := stores[0].Enqueue(ctx, testEnqueueRequest(channel, id, id))
			if err == nil {
				break
			}
			require.NoError(t, ctx.Err(), "enqueue %s: %v", id, err)
			time.Sleep(100 * time.Millisecond)
		}
	}

	type claimID struct {
		job string
		gen uint64
	}
	var mu sync.Mutex
	claims := map[claimID]int{} // worker that was handed the claim
	var settled atomic.Int32
	var logged atomic.Int32
	logErr := func(op string, w int, err error) {
		if logged.Add(1) <= 20 {
			t.Logf("worker %d: %s: %v", w, op, err)
		}
	}
	var wg sync.WaitGroup
	for w, st := range stores {
		wg.Add(1)
		go func() {
			defer wg.Done()
			owner := fmt.Sprintf("worker-%d", w)
			for settled.Load() < jobCount && ctx.Err() == nil {
				// Each call with its own timeout: a request that reached
				// the stopped leader is never answered.
				cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				got, err := st.Claim(cctx, ClaimRequest{ChannelID: channel, Owner: owner, Count: 3, TTL: 3 * time.Second})
				cancel()
				if err != nil || len(got) == 0 {
					if err != nil && ctx.Err() == nil {
						logErr("claim", w, err)
					}
					time.Sleep(50 * time.Millisecond) // failover, or nothing due yet
					continue
				}
				for _, j := range got {
					mu.Lock()
					if prev, ok := claims[claimID{j.ID, j.ClaimGeneration}]; ok {
						t.Errorf("claim %d of %s handed to worker %d and worker %d", j.ClaimGeneration, j.ID, prev, w)
					}
					claims[claimID{j.ID, j.ClaimGeneration}] = w
					mu.Unlock()
					cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
					_, err := st.Settle(cctx, SettleRequest{Claim: ClaimOf(j)})
					cancel()
					switch {
					case err == nil:
						settled.Add(1)
					case errors.Is(err, ErrConflict):
						// settled by a write whose answer was lost, or
						// reclaimed after expiry: the final check decides
					default:
						logErr("settle", w, err)
					}
				}
			}
		}()
	}
	for settled.Load() < jobCount/3 && ctx.Err() == nil {
		time.Sleep(20 * time.Millisecond)
	}
	leader := c.StreamLeader(natstest.GlobalAccount, "KV_"+bucket)
	require.GreaterOrEqual(t, leader, 0, "no stream leader")
	c.Stop(leader)
	stopped := time.Now()
	t.Logf("stopped stream leader n%d after %d settles", leader, settled.Load())

	// Settles whose answers were lost are not counted: wait for the jobs.
	live := stores[(leader+1)%len(stores)]
	remaining := func() (left []string, err error) {
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		for i := range jobCount {
			id := fmt.Sprintf("job-%02d", i)
			d, err := live.Get(ctx, channel, id)
			if err != nil {
				return nil, err // no leader yet: ask again
			}
			if d.Job.State != StateCompleted {
				left = append(left, id+" "+string(d.Job.State))
			}
		}
		return left, nil
	}
	for {
		left, err := remaining()
		if err == nil && len(left) == 0 {
			t.Logf("every job completed %v after the leader stopped", time.Since(stopped).Round(time.Second))
			break
		}
		if ctx.Err() != nil {
			t.Errorf("jobs not completed after the leader was lost: %v (%v)", left, err)
			break
		}
		time.Sleep(2 * time.Second)
	}
	settled.Store(jobCount) // stop the workers
	wg.Wait()
}
