// Command dashboard serves the jobkeys web dashboard (package jobsweb) over
// a small deployment that keeps working: an embedded NATS server, a client
// running two kinds of jobs for a few tenants, and a producer that enqueues
// new ones continuously. Some jobs fail (and are retried, then given up),
// and some wait on full keys: acme sends more than its limits let run.
//
//	go run ./examples/dashboard                     # http://127.0.0.1:8080/
//	go run ./examples/dashboard -listen 127.0.0.1:0 # any free port
//	go run ./examples/dashboard -read-only
//
// It prints the dashboard's URL and runs until interrupted. It listens on
// loopback unless -listen names another address.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jobkeys/jobkeys"
	"github.com/jobkeys/jobkeys/internal/natstest"
	"github.com/jobkeys/jobkeys/jobs"
	"github.com/jobkeys/jobkeys/jobs/jobsweb"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:8080", "address to serve the dashboard on")
	readOnly := flag.Bool("read-only", false, "show no actions and refuse them")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *listen, *readOnly); err != nil {
		fmt.Fprintln(os.Stderr, "dashboard:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, listen string, readOnly bool) error {
	srv, stopServer, err := natstest.Start(natstest.Options{})
	if err != nil {
		return err
	}
	defer stopServer()
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	d, err := startDemo(js, readOnly)
	if err != nil {
		return err
	}
	defer d.close()
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	if ip := ln.Addr().(*net.TCPAddr).IP; !ip.IsLoopback() {
		fmt.Fprintf(os.Stderr, "dashboard: warning: listening on %s, which is not loopback: anyone who reaches it can act on jobs\n", ln.Addr())
	}
	hs := &http.Server{Handler: d.web, ReadHeaderTimeout: 10 * time.Second}
	served := make(chan error, 1)
	go func() { served <- hs.Serve(ln) }()
	fmt.Printf("dashboard: http://%s/  (NATS at %s; Ctrl-C to stop)\n", ln.Addr(), srv.ClientURL())
	select {
	case <-ctx.Done():
	case err := <-served:
		return err
	}
	d.web.Close() // ends the live streams, which Shutdown would wait for
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return hs.Shutdown(sctx)
}

// Tenants, the channels their jobs go to; acme sends the most.
var tenants = []string{"acme", "acme", "acme", "globex", "globex", "initech", "hooli"}

// work is the input of both kinds: whose job it is, how long it takes,
// and whether it fails (every attempt, or the first).
type work struct {
	Tenant    string `json:"tenant"`
	Ms        int    `json:"ms"`
	Fail      bool   `json:"fail,omitempty"`
	FailFirst bool   `json:"failFirst,omitempty"`
	Pages     int    `json:"pages,omitempty"`
}

type result struct {
	Pages int    `json:"pages"`
	URL   string `json:"url"`
}

// demo is the running deployment: the client and its producer, and the
// dashboard over them.
type demo struct {
	client *jobs.Client
	web    *jobsweb.Handler
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// startDemo makes the client on js (its buckets in memory), registers the
// kinds, starts the client, the producer and the dashboard.
func startDemo(js jetstream.JetStream, readOnly bool) (*demo, error) {
	client, err := jobs.NewNATSClient(js, &jobs.ClientConfig{Buckets: jobs.Buckets{Storage: jetstream.MemoryStorage},
		MaxWorkers: 16, StopGrace: 2 * time.Second, Backoff: jobs.ExponentialBackoff(500*time.Millisecond, 4*time.Second)})
	if err != nil {
		return nil, err
	}
	// render: two per tenant at once, four more may wait, the rest are
	// rejected. export: one per tenant, three waiting, a newer export
	// replaces the oldest waiting one.
	kinds := []struct {
		typ    string
		policy jobkeys.Policy
	}{
		{"render", jobkeys.Policy{Key: []string{"tenant", "/tenant"}, MaxActive: 2, MaxQueuedPerKey: 4}},
		{"export", jobkeys.Policy{Key: []string{"tenant", "/tenant"}, MaxActive: 1, MaxQueuedPerKey: 3, WhenFull: jobkeys.ReplaceOldest}},
	}
	for _, k := range kinds {
		if err := jobs.Register(client, jobs.Kind[work, result]{Type: k.typ, Policy: k.policy, MaxFailures: 3, Work: doWork}); err != nil {
			return nil, errors.Join(err, client.Stop(context.Background()))
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := client.Start(ctx); err != nil {
		cancel()
		return nil, errors.Join(err, client.Stop(context.Background()))
	}
	// The dashboard of the client's keys and jobs.
	web, err := jobsweb.New(&jobsweb.Config{Client: client, ReadOnly: readOnly})
	if err != nil {
		cancel()
		return nil, errors.Join(err, client.Stop(context.Background()))
	}
	d := &demo{client: client, web: web, cancel: cancel}
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		d.produce(ctx)
	}()
	return d, nil
}

// close stops the producer, the dashboard and the client.
func (d *demo) close() {
	d.cancel()
	d.wg.Wait()
	d.web.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := d.client.Stop(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "dashboard: stop the client:", err)
	}
}

// doWork runs one attempt: a few stages with progress, then a result or
// a failure.
func doWork(ctx context.Context, run *jobs.Run, in work) (result, error) {
	stages := []string{"fetch", "render", "upload"}
	for i, stage := range stages {
		if err := run.Progress(stage, fmt.Sprintf("%s for %s (%d of %d)", stage, in.Tenant, i+1, len(stages)), jobs.ProgressStarted); err != nil {
			return result{}, err
		}
		select {
		case <-ctx.Done():
			return result{}, context.Cause(ctx)
		case <-time.After(time.Duration(in.Ms/len(stages)) * time.Millisecond):
		}
		if in.Fail || (in.FailFirst && run.Job().Attempts == 1) {
			_ = run.Interrupted(stage, stage+" failed", "upstream-error")
			return result{}, fmt.Errorf("%s of %s: the upstream service answered 503", stage, in.Tenant)
		}
		if err := run.Progress(stage, fmt.Sprintf("%s for %s (%d of %d)", stage, in.Tenant, i+1, len(stages)), jobs.ProgressCompleted); err != nil {
			return result{}, err
		}
	}
	return result{Pages: in.Pages, URL: fmt.Sprintf("s3://exports/%s/%s.pdf", in.Tenant, run.Job().ID)}, nil
}

// produce enqueues a job every 300 ms until ctx ends: a render or an
// export of a random tenant, about one in eight failing for good and one
// in six failing its first attempt.
func (d *demo) produce(ctx context.Context) {
	tick := time.NewTicker(300 * time.Millisecond)
	defer tick.Stop()
	for n := 1; ; n++ {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		tenant := tenants[rand.IntN(len(tenants))]
		typ, ms := "render", 800+rand.IntN(2500)
		if rand.IntN(3) == 0 {
			typ, ms = "export", 2000+rand.IntN(5000)
		}
		in := work{Tenant: tenant, Ms: ms, Fail: rand.IntN(8) == 0, FailFirst: rand.IntN(6) == 0, Pages: 1 + rand.IntN(40)}
		_, err := d.enqueue(ctx, fmt.Sprintf("%s-%05d", typ, n), typ, in)
		if err != nil && !errors.Is(err, jobs.ErrRejected) && ctx.Err() == nil {
			fmt.Fprintln(os.Stderr, "dashboard: enqueue:", err)
		}
	}
}

// enqueue enqueues job id of type typ into its tenant's channel.
func (d *demo) enqueue(ctx context.Context, id, typ string, in work) (jobs.EnqueueResult, error) {
	b, err := json.Marshal(in)
	if err != nil {
		return jobs.EnqueueResult{}, err
	}
	return d.client.Enqueue(ctx, jobs.EnqueueRequest{ID: id, ChannelID: in.Tenant, Type: typ, Version: 1, Origin: "producer",
		TargetKey: id, IdempotencyKey: id, Fingerprint: id, Input: b})
}
