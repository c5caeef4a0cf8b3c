package natstest

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// ClusterOptions configures StartCluster.
type ClusterOptions struct {
	// Nodes is the number of servers; 0 means 3.
	Nodes int
	// Configure, when set, edits node i's options before it first starts
	// (a JetStream domain, accounts). Restarts reuse the edited options.
	Configure func(i int, o *server.Options)
}

// Cluster is an in-process cluster of routed JetStream servers on fixed
// ports and store directories, so that a node can be stopped and started
// again as itself. Its methods are safe for concurrent use.
type Cluster struct {
	opts    []*server.Options
	mu      sync.Mutex
	servers []*server.Server // nil while a node is down
}

// StartCluster starts a cluster for t, waits until JetStream answers
// through every node, and shuts every node down when the test ends.
func StartCluster(t testing.TB, o ClusterOptions) *Cluster {
	t.Helper()
	n := o.Nodes
	if n == 0 {
		n = 3
	}
	c := &Cluster{servers: make([]*server.Server, n)}
	routes := make([]string, n)
	clusterPorts := make([]int, n)
	for i := range n {
		clusterPorts[i] = FreePort(t)
		routes[i] = fmt.Sprintf("nats://127.0.0.1:%d", clusterPorts[i])
	}
	for i := range n {
		opts := &server.Options{
			ServerName: fmt.Sprintf("n%d", i),
			Host:       "127.0.0.1",
			Port:       FreePort(t),
			JetStream:  true,
			StoreDir:   t.TempDir(),
			NoLog:      true,
			NoSigs:     true,
			Cluster:    server.ClusterOpts{Name: "jobkeys", Host: "127.0.0.1", Port: clusterPorts[i]},
			Routes:     server.RoutesFromStr(strings.Join(routes, ",")),
		}
		if o.Configure != nil {
			o.Configure(i, opts)
		}
		c.opts = append(c.opts, opts)
	}
	t.Cleanup(func() {
		for i := range n {
			c.Stop(i)
		}
	})
	for i := range n {
		if err := c.Start(i); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for i := range n {
		if err := c.WaitJetStream(ctx, i); err != nil {
			t.Fatalf("cluster node n%d: %v", i, err)
		}
	}
	return c
}

// Size returns the number of nodes.
func (c *Cluster) Size() int { return len(c.opts) }

// Start starts node i (again) and waits until it accepts connections.
func (c *Cluster) Start(i int) error {
	opts := *c.opts[i]
	s, err := server.NewServer(&opts)
	if err != nil {
		return fmt.Errorf("node n%d: %w", i, err)
	}
	go s.Start()
	if !s.ReadyForConnections(readyWait) {
		s.Shutdown()
		s.WaitForShutdown()
		return fmt.Errorf("node n%d not ready for connections after %v", i, readyWait)
	}
	c.mu.Lock()
	c.servers[i] = s
	c.mu.Unlock()
	return nil
}

// Stop shuts node i down and waits for it; a stopped node is left alone.
func (c *Cluster) Stop(i int) {
	c.mu.Lock()
	s := c.servers[i]
	c.servers[i] = nil
	c.mu.Unlock()
	if s != nil {
		s.Shutdown()
		s.WaitForShutdown()
	}
}

// Server returns node i, or nil while it is down.
func (c *Cluster) Server(i int) *server.Server {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.servers[i]
}

// URL returns node i's client URL.
func (c *Cluster) URL(i int) string { return fmt.Sprintf("nats://127.0.0.1:%d", c.opts[i].Port) }

// URLs lists every node's URL, comma-separated, node first first.
func (c *Cluster) URLs(first int) string {
	var u []string
	for k := range c.opts {
		u = append(u, c.URL((first+k)%len(c.opts)))
	}
	return strings.Join(u, ",")
}

// WaitJetStream waits until a JetStream request through node i succeeds.
// Nodes with accounts or users need their clients' credentials: this
// connects without any, so use it only on clusters without auth.
func (c *Cluster) WaitJetStream(ctx context.Context, i int) error {
	nc, err := nats.Connect(c.URL(i))
	if err != nil {
		return err
	}
	defer nc.Close()
	var js jetstream.JetStream
	if d := c.opts[i].JetStreamDomain; d != "" {
		js, err = jetstream.NewWithDomain(nc, d)
	} else {
		js, err = jetstream.New(nc)
	}
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

// GlobalAccount is the account of clients on servers without accounts.
const GlobalAccount = "$G"

// StreamLeader returns the node that leads stream in account, or -1.
func (c *Cluster) StreamLeader(account, stream string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, s := range c.servers {
		if s != nil && s.JetStreamIsStreamLeader(account, stream) {
			return i
		}
	}
	return -1
}
