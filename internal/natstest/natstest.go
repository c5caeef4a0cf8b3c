// Package natstest starts embedded nats-server instances with JetStream for
// the tests and examples of jobkeys. Nothing here is part of the library.
package natstest

import (
	"errors"
	"fmt"
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
}

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
	s, err = server.NewServer(&server.Options{
		Host:      "127.0.0.1",
		Port:      port,
		JetStream: true,
		StoreDir:  dir,
		NoLog:     true,
		NoSigs:    true,
	})
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
	if !s.ReadyForConnections(10 * time.Second) {
		stop()
		return nil, nil, errors.New("natstest: server not ready for connections after 10s")
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
	s, stop, err := Start(Options{StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	return s
}

// Connect opens a client connection to s over TCP and returns it with its
// JetStream context; the connection is closed when the test ends.
func Connect(t testing.TB, s *server.Server) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := nats.Connect(s.ClientURL(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
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
