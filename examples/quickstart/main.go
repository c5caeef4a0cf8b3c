// Command quickstart shows jobkeys at work on an embedded NATS server: no
// setup, no ports to configure, done in seconds.
//
// For each of the three WhenFull policies it submits a few dozen jobs for a
// handful of tenants (at most 2 run per tenant, 1 more may wait), runs four
// workers — each with its own NATS connection, as separate processes would —
// and prints what happened to every job, who ran it, and the highest number
// of jobs that ran at once per tenant.
//
//	go run ./examples/quickstart
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jobkeys/jobkeys"
)

const (
	service = "quickstart"
	workers = 4
)

// The burst each tenant sends: acme floods, the others stay in their limits.
var tenants = []struct {
	name string
	jobs int
}{{"acme", 6}, {"globex", 3}, {"initech", 2}, {"umbrella", 1}}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "quickstart:", err)
		os.Exit(1)
	}
}

func run() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	srv, stop, err := startServer()
	if err != nil {
		return err
	}
	defer stop()
	fmt.Printf("jobkeys quickstart: embedded NATS server at %s\n", srv.ClientURL())

	for _, wf := range []jobkeys.WhenFull{jobkeys.Reject, jobkeys.Coalesce, jobkeys.ReplaceOldest} {
		policy := jobkeys.Policy{
			Key:             []string{"tenant", "/tenant"},
			MaxActive:       2,
			MaxQueuedPerKey: 1,
			WhenFull:        wf,
		}
		if err := scenario(ctx, srv.ClientURL(), policy); err != nil {
			return fmt.Errorf("when full %s: %w", wf, err)
		}
	}
	return nil
}

// startServer starts a NATS server with JetStream in this process, on a free
// port of 127.0.0.1, storing into a temporary directory; stop shuts it down
// and removes the directory.
func startServer() (srv *server.Server, stop func(), err error) {
	dir, err := os.MkdirTemp("", "jobkeys-quickstart-*")
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
		return nil, nil, fmt.Errorf("embedded NATS server: not ready after 10s")
	}
	return srv, stop, nil
}

// client is one worker process: its own connection, store and coordinator,
// and the job type's handle.
type client struct {
	nc *nats.Conn
	jt *jobkeys.JobType
}

func connect(url, name, jobType string, policy jobkeys.Policy) (*client, error) {
	nc, err := nats.Connect(url, nats.Name(name))
	if err != nil {
		return nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, err
	}
	store, err := jobkeys.NewNATSStore(js, jobkeys.WithCreateBuckets(jetstream.MemoryStorage, 1))
	if err != nil {
		nc.Close()
		return nil, err
	}
	coord, err := jobkeys.NewCoordinator(store, &jobkeys.Config{InstanceID: name})
	if err != nil {
		nc.Close()
		return nil, err
	}
	// The job type, its service and its policy are checked once, here;
	// every call after this takes just the job.
	jt, err := coord.JobType(service, jobType, policy)
	if err != nil {
		nc.Close()
		return nil, err
	}
	return &client{nc: nc, jt: jt}, nil
}

type job struct {
	id, tenant string
	payload    []byte
}

// tally is what happened, per tenant.
type tally struct {
	accepted, rejected, coalesced, replaced, ran int
	running, peak                                int
}

func scenario(ctx context.Context, url string, policy jobkeys.Policy) error {
	jobType := "report-" + string(policy.WhenFull)
	fmt.Printf("\n=== when the queue is full: %s ===\n", policy.WhenFull)
	fmt.Printf("policy: key tenant:<tenant>, at most %d running and %d more waiting per tenant\n",
		policy.MaxActive, policy.MaxQueuedPerKey)

	submitter, err := connect(url, "submitter", jobType, policy)
	if err != nil {
		return err
	}
	defer submitter.nc.Close()

	var (
		mu     sync.Mutex
		stats  = map[string]*tally{}
		queue  []job               // admitted jobs not yet run
		gone   = map[string]bool{} // replaced jobs: no longer queued
		ranBy  = map[string][]string{}
		waited = map[string]bool{}
		events []string
	)
	for _, t := range tenants {
		stats[t.name] = &tally{}
	}

	fmt.Println("\nsubmitting:")
	n := 0
	for _, t := range tenants {
		for round := 0; round < t.jobs; round++ {
			n++
			j := job{id: fmt.Sprintf("%s-%02d", t.name, round+1), tenant: t.name}
			j.payload, _ = json.Marshal(map[string]string{"tenant": t.name})
			adm, err := submitter.jt.Admit(ctx, j.id, j.payload)
			if err != nil {
				return err
			}
			s := stats[t.name]
			switch adm.Kind {
			case jobkeys.KindAccepted:
				s.accepted++
				queue = append(queue, j)
				fmt.Printf("  %-12s accepted: waits for a slot\n", j.id)
			case jobkeys.KindRejected:
				s.rejected++
				fmt.Printf("  %-12s rejected: %s (limit %d)\n", j.id, adm.Reason, adm.Limit)
			case jobkeys.KindCoalesced:
				s.coalesced++
				fmt.Printf("  %-12s coalesced into %s: that job will do this one's work\n", j.id, adm.Existing.ID)
			case jobkeys.KindReplaced:
				s.replaced++
				gone[adm.Replaced.ID] = true
				queue = append(queue, j)
				fmt.Printf("  %-12s accepted, replacing %s, the oldest waiting job\n", j.id, adm.Replaced.ID)
			}
		}
	}

	// Workers take admitted jobs in order; a job whose tenant is at its limit
	// goes back to the end of the line.
	var pending []job
	for _, j := range queue {
		if !gone[j.id] {
			pending = append(pending, j)
		}
	}
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := 1; w <= workers; w++ {
		name := fmt.Sprintf("worker-%d", w)
		c, err := connect(url, name, jobType, policy)
		if err != nil {
			return err
		}
		defer c.nc.Close()
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				mu.Lock()
				if len(pending) == 0 {
					mu.Unlock()
					return
				}
				j := pending[0]
				pending = pending[1:]
				mu.Unlock()

				acq, err := c.jt.Acquire(ctx, j.id, j.payload)
				if err != nil {
					errs <- err
					return
				}
				if acq.Kind == jobkeys.KindBlocked {
					mu.Lock()
					pending = append(pending, j)
					if !waited[j.id] {
						waited[j.id] = true
						events = append(events, fmt.Sprintf("  %-9s waits %-11s (%s: %d of %d slots for %s in use)",
							name, j.id, acq.Reason, acq.Active, acq.Limit, acq.Key))
					}
					mu.Unlock()
					time.Sleep(5 * time.Millisecond)
					continue
				}
				mu.Lock()
				s := stats[j.tenant]
				s.running++
				s.peak = max(s.peak, s.running)
				if len(acq.State.Active) > policy.MaxActive {
					events = append(events, fmt.Sprintf("BUG: %d slots held for %s", len(acq.State.Active), acq.Key))
				}
				events = append(events, fmt.Sprintf("  %-9s runs %-12s (%d of %d slots for %s in use)",
					name, j.id, len(acq.State.Active), policy.MaxActive, acq.Key))
				mu.Unlock()

				time.Sleep(80 * time.Millisecond) // the job's work

				mu.Lock()
				s.running--
				s.ran++
				ranBy[name] = append(ranBy[name], j.id)
				mu.Unlock()
				rel, err := c.jt.Release(ctx, acq.Lease)
				if err != nil {
					errs <- err
					return
				}
				if rel.Kind != jobkeys.KindReleased {
					errs <- fmt.Errorf("release %s: %s", j.id, rel.Kind)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return err
	}

	fmt.Printf("\nrunning (%d workers):\n%s\n", workers, strings.Join(events, "\n"))
	fmt.Println("\nwho ran what:")
	names := make([]string, 0, len(ranBy))
	for name := range ranBy {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		fmt.Printf("  %-9s %s\n", name, strings.Join(ranBy[name], ", "))
	}
	fmt.Printf("\n%d jobs submitted:\n", n)
	fmt.Printf("  %-9s %8s %8s %9s %8s %4s %18s\n", "tenant", "accepted", "rejected", "coalesced", "replaced", "ran", "peak running (max)")
	for _, t := range tenants {
		s := stats[t.name]
		fmt.Printf("  %-9s %8d %8d %9d %8d %4d %14d (%d)\n", t.name, s.accepted, s.rejected, s.coalesced, s.replaced, s.ran, s.peak, policy.MaxActive)
	}
	fmt.Println("  replaced: also accepted, by dropping the tenant's oldest waiting job, which then never runs")
	fmt.Println("  coalesced: not queued; the existing job it names does its work")
	return nil
}
