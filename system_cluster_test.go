package jobkeys

// A 3-node in-process nats-server cluster with an R3 bucket: the random
// workload of system_linearizability_test.go checked with porcupine, and the fault
// workload of system_faults_test.go while the stream leader of the bucket is shut
// down mid-run and later restarted (and, with JOBKEYS_LONG=1, the new
// leader too). The cluster takes several seconds to form and to elect new
// leaders, so these tests run only with JOBKEYS_CLUSTER=1.

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jobkeys/jobkeys/internal/natstest"
)

// clusterBucket creates the audited R3 bucket of service, retrying while
// the cluster settles.
func clusterBucket(t testing.TB, ctx context.Context, js jetstream.JetStream, service string) string {
	t.Helper()
	bucket := BucketPrefixDefault + "_" + service
	for {
		_, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: bucket, History: 64, Replicas: 3, Storage: jetstream.FileStorage})
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("create R3 bucket %s: %v", bucket, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	stream, err := js.Stream(ctx, "KV_"+bucket)
	require.NoError(t, err)
	cfg := stream.CachedInfo().Config
	cfg.MaxMsgsPerSubject = auditHistory
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		t.Fatalf("keep every revision of %s: %v", bucket, err)
	}
	return bucket
}

func clusterEnabled(t *testing.T) {
	t.Helper()
	if os.Getenv("JOBKEYS_CLUSTER") != "1" {
		t.Skip("3-node cluster test: set JOBKEYS_CLUSTER=1 to run it (about 20-60s)")
	}
}

// TestClusterLinearizable runs the random workload of
// TestLinearizableUnderConcurrency on an R3 bucket, with the clients spread
// over the three nodes, and checks the history with porcupine. On a
// replicated bucket NATSStore reads through the stream leader: a KV get (a
// direct get) may be answered by a replica that has not applied the latest
// writes, which this test caught as illegal histories before. When the
// history is illegal, the operations that read a state older than one
// already acknowledged are listed.
func TestClusterLinearizable(t *testing.T) {
	clusterEnabled(t)
	c := natstest.StartCluster(t, natstest.ClusterOptions{Nodes: 3})
	clusterLinearizable(t, c, "clusterlin")
}

func clusterLinearizable(t *testing.T, c *natstest.Cluster, service string) {
	seed := reliabilitySeed(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const jobType = "work"
	_, js := clusterConnect(t, c.URLs(0))
	bucket := clusterBucket(t, ctx, js, service)
	ttl := 300 * time.Millisecond
	keys := []linKey{
		newLinKey(t, service, jobType, "a", Policy{MaxActive: 1, MaxQueuedPerKey: 1, WhenFull: ReplaceOldest, StalePolicy: FailStale, HeartbeatTTL: ttl, HeartbeatInterval: ttl / 3}),
		newLinKey(t, service, jobType, "b", Policy{MaxActive: 2, MaxQueuedPerKey: 1, WhenFull: Coalesce, StalePolicy: Block, HeartbeatTTL: ttl, HeartbeatInterval: ttl / 3}),
	}
	clients, ops := 8, 250
	if reliabilityLong() {
		clients, ops = 12, 1000
	}
	rec := newLinRecorder()
	pool := &linPool{jobs: make([][]string, len(keys))}
	cs := make([]*linClient, clients)
	for i := range cs {
		cs[i] = newLinClient(t, i, c.URLs(i%3), service, jobType, keys, rec)
	}
	var wg sync.WaitGroup
	for i, cl := range cs {
		wg.Go(func() { linRandomClient(ctx, cl, pool, rand.New(rand.NewPCG(seed, uint64(i))), ops) })
	}
	wg.Wait()
	cs[0].drain(t, ctx)
	log := rec.log()
	for _, op := range log {
		if op.out.err != nil && !errors.Is(op.out.err, ErrContention) {
			t.Errorf("client %d: %s %s: %v", op.client, op.in.kind, op.in.job, op.out.err)
		}
	}
	t.Logf("%d clients on 3 nodes, %d operations: %v", clients, len(log), linCountOutcomes(log))
	res := linCheck(t, keys, log, time.Minute)
	actx, acancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer acancel()
	entries := auditRead(t, actx, js, bucket)
	t.Logf("audit of %s: %v", bucket, auditCheck(t, entries, newAuditFacts(log), linPolicyOf(keys), true))
	if res == porcupine.Illegal {
		for _, s := range linStaleReads(keys, log, entries, 10) {
			t.Errorf("stale read: %s", s)
		}
	}
}

func clusterConnect(t testing.TB, url string) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, js, _ := linConnect(t, url, "audit")
	return nc, js
}

// TestClusterNodeLoss runs the fault workload on an R3 bucket and shuts
// down the bucket's stream leader mid-run, with operations in flight;
// after a while the node is restarted and rejoins. Operations fail or
// succeed while a new leader is elected; every job completes, and the
// audit of every revision holds.
func TestClusterNodeLoss(t *testing.T) {
	clusterEnabled(t)
	c := natstest.StartCluster(t, natstest.ClusterOptions{Nodes: 3})
	clusterNodeLoss(t, c, "clusterfault")
}

func clusterNodeLoss(t *testing.T, c *natstest.Cluster, service string) {
	seed := reliabilitySeed(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	_, js := clusterConnect(t, c.URLs(0))
	bucket := clusterBucket(t, ctx, js, service)
	f := newFaultRun(t, ctx, c.URLs(0), service, faultKeys(t, service, 500*time.Millisecond))
	f.opWait = 4 * time.Second
	producers, jobs, workers := faultSize()
	prod := f.start(producers, jobs, workers, seed)
	losses := 1
	if reliabilityLong() {
		losses = 3
	}
	f.chaos.Go(func() {
		for range losses {
			if !f.sleep(300 * time.Millisecond) {
				return
			}
			for f.inflight.Load() == 0 {
				if !f.sleep(time.Millisecond) {
					return
				}
			}
			leader := c.StreamLeader(natstest.GlobalAccount, "KV_"+bucket)
			if leader < 0 {
				t.Errorf("no stream leader for KV_%s", bucket)
				return
			}
			c.Stop(leader)
			f.fault(fmt.Sprintf("stream leader n%d shut down", leader))
			f.sleep(1500 * time.Millisecond)
			// Bring it back, even when the run is over, for the next run.
			if err := c.Start(leader); err != nil {
				t.Errorf("restart n%d: %v", leader, err)
				return
			}
			if err := c.WaitJetStream(ctx, leader); err != nil {
				t.Errorf("n%d after restart: %v", leader, err)
				return
			}
			f.fault("node restarted")
		}
	})
	f.finish(prod, js, bucket)
	assert.NotEmpty(t, f.faults, "no node was lost")
}
