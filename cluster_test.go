package jobkeys

// A 3-node in-process nats-server cluster with an R3 bucket: the random
// workload of linearizability_test.go checked with porcupine, and the fault
// workload of faults_test.go while the stream leader of the bucket is shut
// down mid-run and later restarted (and, with JOBKEYS_LONG=1, the new
// leader too). The cluster takes several seconds to form and to elect new
// leaders, so these tests run only with JOBKEYS_CLUSTER=1.

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// natsCluster is an in-process cluster of JetStream servers on fixed
// ports and store directories, so that a node can be stopped and
// restarted as itself.
type natsCluster struct {
	t       testing.TB
	opts    []*server.Options
	mu      sync.Mutex
	servers []*server.Server // nil while a node is down
}

// freePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// startCluster starts n routed JetStream servers and waits until
// JetStream answers through each of them.
func startCluster(t testing.TB, n int) *natsCluster {
	t.Helper()
	c := &natsCluster{t: t, servers: make([]*server.Server, n)}
	routes := make([]string, n)
	clusterPorts := make([]int, n)
	for i := range n {
		clusterPorts[i] = freePort(t)
		routes[i] = fmt.Sprintf("nats://127.0.0.1:%d", clusterPorts[i])
	}
	for i := range n {
		c.opts = append(c.opts, &server.Options{
			ServerName: fmt.Sprintf("n%d", i),
			Host:       "127.0.0.1",
			Port:       freePort(t),
			JetStream:  true,
			StoreDir:   t.TempDir(),
			NoLog:      true,
			NoSigs:     true,
			Cluster:    server.ClusterOpts{Name: "jobkeys", Host: "127.0.0.1", Port: clusterPorts[i]},
			Routes:     server.RoutesFromStr(strings.Join(routes, ",")),
		})
	}
	t.Cleanup(func() {
		for i := range n {
			c.stop(i)
		}
	})
	for i := range n {
		if err := c.start(i); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for i := range n {
		if err := c.waitJetStream(ctx, i); err != nil {
			t.Fatalf("cluster node n%d: %v", i, err)
		}
	}
	return c
}

func (c *natsCluster) start(i int) error {
	opts := *c.opts[i]
	s, err := server.NewServer(&opts)
	if err != nil {
		return fmt.Errorf("node n%d: %w", i, err)
	}
	go s.Start()
	if !s.ReadyForConnections(30 * time.Second) {
		s.Shutdown()
		return fmt.Errorf("node n%d not ready for connections after 30s", i)
	}
	c.mu.Lock()
	c.servers[i] = s
	c.mu.Unlock()
	return nil
}

func (c *natsCluster) stop(i int) {
	c.mu.Lock()
	s := c.servers[i]
	c.servers[i] = nil
	c.mu.Unlock()
	if s != nil {
		s.Shutdown()
		s.WaitForShutdown()
	}
}

func (c *natsCluster) url(i int) string { return fmt.Sprintf("nats://127.0.0.1:%d", c.opts[i].Port) }

// urls lists every node's URL, node first first.
func (c *natsCluster) urls(first int) string {
	var u []string
	for k := range c.opts {
		u = append(u, c.url((first+k)%len(c.opts)))
	}
	return strings.Join(u, ",")
}

// waitJetStream waits until a JetStream request through node i succeeds.
func (c *natsCluster) waitJetStream(ctx context.Context, i int) error {
	nc, err := nats.Connect(c.url(i))
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	for {
		actx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := js.AccountInfo(actx)
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("JetStream not available: %w", err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// streamLeader returns the node that leads stream, or -1.
func (c *natsCluster) streamLeader(stream string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, s := range c.servers {
		if s != nil && s.JetStreamIsStreamLeader(globalAccountName, stream) {
			return i
		}
	}
	return -1
}

// globalAccountName is the account of clients on servers without auth.
const globalAccountName = "$G"

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
	if err != nil {
		t.Fatal(err)
	}
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
	c := startCluster(t, 3)
	clusterLinearizable(t, c, "clusterlin")
}

func clusterLinearizable(t *testing.T, c *natsCluster, service string) {
	seed := reliabilitySeed(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const jobType = "work"
	_, js := clusterConnect(t, c.urls(0))
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
		cs[i] = newLinClient(t, i, c.urls(i%3), service, jobType, keys, rec)
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
	c := startCluster(t, 3)
	clusterNodeLoss(t, c, "clusterfault")
}

func clusterNodeLoss(t *testing.T, c *natsCluster, service string) {
	seed := reliabilitySeed(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	_, js := clusterConnect(t, c.urls(0))
	bucket := clusterBucket(t, ctx, js, service)
	f := newFaultRun(t, ctx, c.urls(0), service, faultKeys(t, service, 500*time.Millisecond))
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
			leader := c.streamLeader("KV_" + bucket)
			if leader < 0 {
				t.Errorf("no stream leader for KV_%s", bucket)
				return
			}
			c.stop(leader)
			f.fault(fmt.Sprintf("stream leader n%d shut down", leader))
			f.sleep(1500 * time.Millisecond)
			// Bring it back, even when the run is over, for the next run.
			if err := c.start(leader); err != nil {
				t.Errorf("restart n%d: %v", leader, err)
				return
			}
			if err := c.waitJetStream(ctx, leader); err != nil {
				t.Errorf("n%d after restart: %v", leader, err)
				return
			}
			f.fault("node restarted")
		}
	})
	f.finish(prod, js, bucket)
	if len(f.faults) == 0 {
		t.Errorf("no node was lost")
	}
}
