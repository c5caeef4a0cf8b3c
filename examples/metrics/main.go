// Command metrics shows jobkeys' metrics and logs: it wires the key layer
// and the job store to an OpenTelemetry MeterProvider whose reader is a
// Prometheus exporter, and their logs to a log/slog text handler on
// stderr, runs a small workload, and prints the jobkeys lines of the
// Prometheus scrape.
//
// It starts an embedded NATS server unless NATS_URL is set.
//
//	go run ./examples/metrics                        # run, print the scrape, exit
//	go run ./examples/metrics -listen 127.0.0.1:9464 # then keep serving /metrics until interrupted
//
// With NATS_URL the example uses (and first empties) its own buckets,
// JOBS_KEYS_example-metrics and JOBKEYS_EXAMPLE_METRICS_JOBS.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/jobkeys/jobkeys"
	"github.com/jobkeys/jobkeys/jobs"
)

const (
	service   = "example-metrics"
	jobBucket = "JOBKEYS_EXAMPLE_METRICS_JOBS"
)

func main() {
	listen := flag.String("listen", "", "after the workload, serve /metrics on this address until interrupted")
	flag.Parse()
	if err := run(*listen); err != nil {
		fmt.Fprintln(os.Stderr, "metrics:", err)
		os.Exit(1)
	}
}

func run(listen string) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	// Metrics: an OpenTelemetry MeterProvider that Prometheus scrapes.
	registry := prometheus.NewRegistry()
	exporter, err := otelprom.New(otelprom.WithRegisterer(registry))
	if err != nil {
		return fmt.Errorf("prometheus exporter: %w", err)
	}
	provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter))
	defer func() { _ = provider.Shutdown(context.Background()) }()
	// Logs: info and above as text on stderr.
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))

	url := os.Getenv("NATS_URL")
	if url == "" {
		srv, stopServer, err := startServer()
		if err != nil {
			return err
		}
		defer stopServer()
		url = srv.ClientURL()
	}
	nc, err := nats.Connect(url)
	if err != nil {
		return fmt.Errorf("connect to %s: %w", url, err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	if err := reset(ctx, js); err != nil {
		return err
	}

	if err := keyWorkload(ctx, js, provider, logger); err != nil {
		return err
	}
	if err := jobWorkload(ctx, js, provider, logger); err != nil {
		return err
	}

	// Serve /metrics and print what a scrape sees.
	if listen == "" {
		listen = "127.0.0.1:0"
	}
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", listen, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(registry, promhttp.HandlerOpts{}))
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	served := make(chan error, 1)
	go func() { served <- hs.Serve(ln) }()
	defer func() { _ = hs.Close() }()
	metricsURL := "http://" + ln.Addr().String() + "/metrics"
	if err := printScrape(ctx, metricsURL); err != nil {
		return err
	}
	if flag.Lookup("listen").Value.String() == "" {
		return nil
	}
	fmt.Println("serving", metricsURL, "until interrupted")
	select {
	case <-ctx.Done():
		return nil
	case err := <-served:
		return err
	}
}

// keyWorkload runs jobs of two tenants through a Runner, one at a time per
// tenant, with one admission rejected and one lease left to expire and
// swept.
func keyWorkload(ctx context.Context, js jetstream.JetStream, mp *sdkmetric.MeterProvider, logger *slog.Logger) error {
	store, err := jobkeys.NewNATSStore(js, jobkeys.WithCreateBuckets(jetstream.MemoryStorage, 1))
	if err != nil {
		return err
	}
	coord, err := jobkeys.NewCoordinator(store, &jobkeys.Config{MeterProvider: mp, Logger: logger})
	if err != nil {
		return err
	}
	jt, err := coord.JobType(service, "render", jobkeys.Policy{
		Key: []string{"/tenant"}, MaxActive: 1, MaxQueuedPerKey: 2,
		HeartbeatInterval: 100 * time.Millisecond, HeartbeatTTL: 300 * time.Millisecond,
	})
	if err != nil {
		return err
	}
	runner, err := jobkeys.NewRunner(jt, &jobkeys.RunnerConfig{Logger: logger, RecheckInterval: 50 * time.Millisecond})
	if err != nil {
		return err
	}
	payload := func(tenant string) []byte { return []byte(`{"tenant":"` + tenant + `"}`) }

	var ids []string
	for _, tenant := range []string{"acme", "globex"} {
		for i := 1; i <= 4; i++ {
			id := fmt.Sprintf("%s-%d", tenant, i)
			adm, err := jt.Admit(ctx, id, payload(tenant))
			if err != nil {
				return err
			}
			fmt.Printf("admit %s: %s\n", id, adm.Kind) // the fourth of each tenant is rejected
			if adm.Kind == jobkeys.KindAccepted {
				ids = append(ids, id)
			}
		}
	}
	errs := make(chan error, len(ids))
	for _, id := range ids {
		tenant, _, _ := strings.Cut(id, "-")
		go func() {
			_, err := runner.Run(ctx, id, payload(tenant), func(ctx context.Context, _ jobkeys.Lease) error {
				select {
				case <-time.After(150 * time.Millisecond):
					return nil
				case <-ctx.Done():
					return context.Cause(ctx)
				}
			})
			errs <- err
		}()
	}
	for range ids {
		if err := <-errs; err != nil {
			return err
		}
	}

	// A worker that dies holding its slot: its lease expires and the
	// sweeper removes it (logged at info).
	if _, err := jt.Admit(ctx, "hooli-1", payload("hooli")); err != nil {
		return err
	}
	if _, err := jt.Acquire(ctx, "hooli-1", payload("hooli")); err != nil {
		return err
	}
	time.Sleep(400 * time.Millisecond)
	rep, err := jt.Sweep(ctx)
	if err != nil {
		return err
	}
	fmt.Printf("sweep: %d keys, %d expired slots removed\n", rep.Keys, len(rep.Removed))
	return nil
}

// jobWorkload enqueues, claims and settles a few job records.
func jobWorkload(ctx context.Context, js jetstream.JetStream, mp *sdkmetric.MeterProvider, logger *slog.Logger) error {
	store, err := jobs.NewNATSStore(js, &jobs.Config{MeterProvider: mp, Logger: logger},
		jobs.WithBucket(jobBucket), jobs.WithCreateBucket(jetstream.MemoryStorage, 1))
	if err != nil {
		return err
	}
	for i := 1; i <= 3; i++ {
		id := fmt.Sprintf("report-%d", i)
		if _, err := store.Enqueue(ctx, jobs.EnqueueRequest{
			ID: id, ChannelID: "acme", Type: "report", Version: 1, TargetKey: id,
			IdempotencyKey: id, Fingerprint: "v1", Input: json.RawMessage(`{}`),
		}); err != nil {
			return err
		}
	}
	claimed, err := store.Claim(ctx, jobs.ClaimRequest{ChannelID: "acme", Owner: "example", Count: 10, TTL: time.Minute})
	if err != nil {
		return err
	}
	for _, j := range claimed {
		if _, err := store.Settle(ctx, jobs.SettleRequest{Claim: jobs.ClaimOf(j), Artifact: json.RawMessage(`{"ok":true}`)}); err != nil {
			return err
		}
	}
	fmt.Printf("jobs: %d enqueued, claimed and settled\n", len(claimed))
	return nil
}

// printScrape fetches url and prints its jobkeys lines.
func printScrape(ctx context.Context, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("scrape %s: %w", url, err)
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("scrape %s: %s: %s", url, resp.Status, body)
	}
	fmt.Println("--- scrape of", url, "(jobkeys lines, histogram buckets left out)")
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if strings.Contains(line, "jobkeys_") && !strings.Contains(line, "_bucket{") {
			fmt.Println(line)
		}
	}
	return sc.Err()
}

// startServer starts an embedded NATS server with JetStream in a temporary
// directory.
func startServer() (srv *server.Server, stop func(), err error) {
	dir, err := os.MkdirTemp("", "jobkeys-metrics-*")
	if err != nil {
		return nil, nil, err
	}
	srv, err = server.NewServer(&server.Options{
		Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: dir, NoLog: true, NoSigs: true})
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, nil, fmt.Errorf("embedded NATS server: %w", err)
	}
	stop = func() {
		srv.Shutdown()
		srv.WaitForShutdown()
		_ = os.RemoveAll(dir)
	}
	go srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		stop()
		return nil, nil, errors.New("embedded NATS server: not ready after 10s")
	}
	return srv, stop, nil
}

// reset deletes the example's buckets, left over from an earlier run
// against the same server.
func reset(ctx context.Context, js jetstream.JetStream) error {
	for _, b := range []string{"JOBS_KEYS_" + service, jobBucket} {
		if err := js.DeleteKeyValue(ctx, b); err != nil && !errors.Is(err, jetstream.ErrBucketNotFound) {
			return fmt.Errorf("delete bucket %s: %w", b, err)
		}
	}
	return nil
}
