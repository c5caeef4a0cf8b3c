// Package natstest starts embedded nats-server instances with JetStream for
// the tests and examples of jobkeys: single servers ([Start], [Run]) and
// routed clusters ([StartCluster]). Nothing here is part of the library.
package natstest

import (
	"errors"
	"fmt"
	"net"
	"os"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Options configures Start.
type Options struct {
	// StoreDir is the JetStream storage directory. Empty means a new
	// temporary directory, removed by the returned stop function.
	StoreDir string
	// Port is the client port; 0 picks a free one.
	Port int
	// Configure, when set, edits the server options after the fields above
	// are applied and before the server starts: users and permissions,
	// accounts, a JetStream domain.
	Configure func(*server.Options)
}

// readyWait bounds how long a server may take to accept connections.
const readyWait = 30 * time.Second

// Start starts a JetStream-enabled server listening on 127.0.0.1 and waits
// until it accepts connections. stop shuts it down and waits for it.
func Start(o Options) (s *server.Server, stop func(), err error) {
	dir := o.StoreDir
	cleanupDir := false
	if dir == "" {
		if dir, err = os.MkdirTemp("", "jobkeys-nats-*"); err != nil {
			return nil, nil, err
		}
		cleanupDir = true
	}
	port := o.Port
	if port == 0 {
		port = -1
	}
	opts := &server.Options{
		Host:      "127.0.0.1",
		Port:      port,
		JetStream: true,
		StoreDir:  dir,
		NoLog:     true,
		NoSigs:    true,
	}
	if o.Configure != nil {
		o.Configure(opts)
	}
	s, err = server.NewServer(opts)
	stop = func() {
		if s != nil {
			s.Shutdown()
			s.WaitForShutdown()
		}
		if cleanupDir {
			_ = os.RemoveAll(dir)
		}
	}
	if err != nil {
		stop()
		return nil, nil, fmt.Errorf("natstest: new server: %w", err)
	}
	go s.Start()
	if !s.ReadyForConnections(readyWait) {
		stop()
		return nil, nil, fmt.Errorf("natstest: server not ready for connections after %v", readyWait)
	}
	if !s.JetStreamEnabled() {
		stop()
		return nil, nil, errors.New("natstest: JetStream is not enabled")
	}
	return s, stop, nil
}

// Run starts a server for t (storage in t.TempDir()) and stops it when the
// test ends.
func Run(t testing.TB) *server.Server {
	t.Helper()
	return RunWith(t, Options{})
}

// RunWith is Run with options; an empty StoreDir means t.TempDir().
func RunWith(t testing.TB, o Options) *server.Server {
	t.Helper()
	if o.StoreDir == "" {
		o.StoreDir = t.TempDir()
	}
	s, stop, err := Start(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	return s
}

// Connect opens a client connection to s over TCP and returns it with its
// JetStream context; the connection is closed when the test ends. It
// reconnects without limit every 50ms; opts come after those defaults and
// may override them.
func Connect(t testing.TB, s *server.Server, opts ...nats.Option) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	return ConnectURL(t, s.ClientURL(), opts...)
}

// ConnectURL is Connect for a URL (or a comma-separated list of them).
func ConnectURL(t testing.TB, url string, opts ...nats.Option) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	all := append([]nats.Option{nats.MaxReconnects(-1), nats.ReconnectWait(50 * time.Millisecond)}, opts...)
	nc, err := nats.Connect(url, all...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return nc, js
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func FreePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
