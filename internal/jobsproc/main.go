// Command jobsproc is a worker or producer process of the jobs runtime for
// the real-process fault test (jobs/runtime_process_test.go); nothing here
// is part of the library. Every process appends what it did to a ledger
// file, one line per event, which the test audits:
//
//	enqueued <job> <outcome>
//	start <job> <key> <pid> <unix ns>
//	end <job> <key> <pid> <unix ns> <cause or ok>
//
// A worker with -hold runs each job's handler in two steps, for the
// frozen-worker test (jobs/claim_deadline_process_test.go): it waits
// -hold (or until its context ends), then checks its context right before
// its external effect; with -log-writes it logs every claimed write it
// attempts. Its lines are
//
//	hold <job> <claim generation> <pid> <unix ns>
//	effect <job> <claim generation> <pid> <unix ns> <context cause or ok>
//	write <op> <job> <claim generation> <pid> <unix ns>
//
// A worker runs until SIGTERM (then drains) or SIGKILL (a crash). A
// producer enqueues jobs -from to -to (retrying through outages) and
// exits; with -orphan it writes one job record without its admission and
// exits, as a producer killed between the two writes. A server (-mode
// server) is an embedded nats-server with JetStream on file storage in
// -store, on 127.0.0.1:-port, until SIGTERM.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jobkeys/jobkeys"
	"github.com/jobkeys/jobkeys/jobs"
)

// Policy is the policy every process of the test uses.
var policy = jobkeys.Policy{
	Key: []string{"k", "/k"}, MaxActive: 2, MaxQueuedPerKey: 1000,
	HeartbeatInterval: 200 * time.Millisecond, HeartbeatTTL: 2500 * time.Millisecond,
}

type input struct {
	K string `json:"k"`
	N int    `json:"n"`
}

func main() {
	var (
		url     = flag.String("url", "", "NATS URL")
		mode    = flag.String("mode", "worker", "worker or producer")
		ledger  = flag.String("ledger", "", "ledger file")
		bucket  = flag.String("bucket", "JOBS_PROC", "job store bucket")
		service = flag.String("service", "proc", "key-layer service")
		keys    = flag.Int("keys", 4, "keys jobs spread over")
		from    = flag.Int("from", 0, "producer: first job")
		to      = flag.Int("to", 0, "producer: one past the last job")
		orphan  = flag.Bool("orphan", false, "producer: write the record of job -from without its admission, then exit")
		store   = flag.String("store", "", "server: JetStream storage directory")
		port    = flag.Int("port", 0, "server: client port")
		pace    = flag.Duration("pace", 0, "producer: pause between enqueues")
		hold    = flag.Duration("hold", 0, "worker: hold each job this long, then check the context before the effect")
		timeout = flag.Duration("timeout", 0, "worker: the kind's Timeout")
		logW    = flag.Bool("log-writes", false, "worker: log every claimed write attempted")
	)
	flag.Parse()
	if *mode == "server" {
		if err := serve(*store, *port); err != nil {
			fmt.Fprintln(os.Stderr, "jobsproc:", err)
			os.Exit(1)
		}
		return
	}
	w := workerFlags{hold: *hold, timeout: *timeout, logWrites: *logW}
	if err := run(*url, *mode, *ledger, *bucket, *service, *keys, *from, *to, *orphan, *pace, w); err != nil {
		fmt.Fprintln(os.Stderr, "jobsproc:", err)
		os.Exit(1)
	}
}

type ledgerFile struct {
	mu sync.Mutex
	f  *os.File
}

func (l *ledgerFile) line(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, _ = fmt.Fprintf(l.f, format+"\n", args...)
}

// workerFlags are the frozen-worker test's flags.
type workerFlags struct {
	hold, timeout time.Duration
	logWrites     bool
}

// writeLog is a job store that logs every claimed write attempted.
type writeLog struct {
	jobs.Store
	led *ledgerFile
}

func (s *writeLog) log(op string, c jobs.Claim) {
	s.led.line("write %s %s %d %d %d", op, c.JobID, c.Generation, os.Getpid(), time.Now().UnixNano())
}

func (s *writeLog) Renew(ctx context.Context, req jobs.RenewRequest) (jobs.Job, error) {
	s.log("renew", req.Claim)
	return s.Store.Renew(ctx, req)
}

func (s *writeLog) AppendProgress(ctx context.Context, req jobs.ProgressRequest) (jobs.Job, error) {
	s.log("progress", req.Claim)
	return s.Store.AppendProgress(ctx, req)
}

func (s *writeLog) Settle(ctx context.Context, req jobs.SettleRequest) (jobs.Detail, error) {
	s.log("settle", req.Claim)
	return s.Store.Settle(ctx, req)
}

func (s *writeLog) Fail(ctx context.Context, req jobs.FailRequest) (jobs.Job, error) {
	s.log("fail", req.Claim)
	return s.Store.Fail(ctx, req)
}

func (s *writeLog) Requeue(ctx context.Context, req jobs.RequeueRequest) (jobs.Job, error) {
	s.log("requeue", req.Claim)
	return s.Store.Requeue(ctx, req)
}

func run(url, mode, ledgerPath, bucket, service string, keys, from, to int, orphan bool, pace time.Duration, w workerFlags) error {
	f, err := os.OpenFile(ledgerPath, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	led := &ledgerFile{f: f}
	nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	store, err := jobs.NewNATSStore(js, nil, jobs.WithBucket(bucket), jobs.WithCreateBucket(jetstream.FileStorage, 1))
	if err != nil {
		return err
	}
	ks, err := jobkeys.NewNATSStore(js, jobkeys.WithCreateBuckets(jetstream.FileStorage, 1))
	if err != nil {
		return err
	}
	var keyStore jobkeys.Store = ks
	if orphan {
		keyStore = refusingKeys{ks} // the admission fails: the crash after the record
	}
	coord, err := jobkeys.NewCoordinator(keyStore, nil)
	if err != nil {
		return err
	}
	var st jobs.Store = store
	if w.logWrites {
		st = &writeLog{Store: store, led: led}
	}
	client, err := jobs.NewClient(st, coord, &jobs.ClientConfig{
		KeyStore: keyStore, Service: service, MaxWorkers: 4,
		PollInterval: 100 * time.Millisecond, RecheckInterval: 500 * time.Millisecond,
		AdmitGrace: time.Second, ReconcileInterval: 500 * time.Millisecond, StopGrace: time.Second,
		Backoff: jobs.ExponentialBackoff(50*time.Millisecond, time.Second),
	})
	if err != nil {
		return err
	}
	pid := os.Getpid()
	err = jobs.Register(client, jobs.Kind[input, struct{}]{
		Type: "proc", Policy: policy, MaxFailures: 1000, Timeout: w.timeout,
		Work: func(ctx context.Context, run *jobs.Run, in input) (struct{}, error) {
			id := run.Job().ID
			if w.hold > 0 {
				gen := run.Job().ClaimGeneration
				led.line("hold %s %d %d %d", id, gen, pid, time.Now().UnixNano())
				select {
				case <-time.After(w.hold):
				case <-ctx.Done():
				}
				// Right before the effect: a handler that sees its context
				// ended does nothing.
				effect := "ok"
				if ctx.Err() != nil {
					effect = context.Cause(ctx).Error()
				}
				led.line("effect %s %d %d %d %q", id, gen, pid, time.Now().UnixNano(), effect)
				return struct{}{}, context.Cause(ctx)
			}
			led.line("start %s %s %d %d", id, in.K, pid, time.Now().UnixNano())
			cause := "ok"
			select {
			case <-time.After(time.Duration(50+in.N%5*25) * time.Millisecond):
			case <-ctx.Done():
				cause = context.Cause(ctx).Error()
			}
			led.line("end %s %s %d %d %q", id, in.K, pid, time.Now().UnixNano(), cause)
			return struct{}{}, context.Cause(ctx)
		},
	})
	if err != nil {
		return err
	}
	ctx := context.Background()
	req := func(i int) jobs.EnqueueRequest {
		id := "j" + strconv.Itoa(i)
		in, _ := json.Marshal(input{K: "k" + strconv.Itoa(i%keys), N: i})
		return jobs.EnqueueRequest{ID: id, ChannelID: "proc", Type: "proc", Version: 1, TargetKey: id,
			IdempotencyKey: id, Fingerprint: id, Input: in}
	}
	switch {
	case mode == "producer" && orphan:
		// Enqueue writes the record and fails at the admission; the
		// process dies there.
		if _, err := client.Enqueue(ctx, req(from)); !errors.Is(err, jobs.ErrOutcomeUnknown) {
			return fmt.Errorf("orphan enqueue: want an outcome-unknown error, got %v", err)
		}
		led.line("enqueued %s orphan", req(from).ID)
		os.Exit(3) // the crash between the record and the admission
	case mode == "producer":
		for i := from; i < to; i++ {
			time.Sleep(pace)
			for {
				res, err := client.Enqueue(ctx, req(i))
				var rej *jobs.RejectedError
				if errors.As(err, &rej) {
					led.line("enqueued %s rejected", req(i).ID)
					break
				}
				if err == nil {
					led.line("enqueued %s %s", req(i).ID, res.Outcome)
					break
				}
				time.Sleep(100 * time.Millisecond) // an outage: try again
			}
		}
		return nil
	}
	if err := client.Start(ctx); err != nil {
		return err
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, os.Interrupt)
	<-sig
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	return client.Stop(sctx)
}

// serve runs an embedded server until SIGTERM.
func serve(dir string, port int) error {
	srv, err := server.NewServer(&server.Options{
		Host: "127.0.0.1", Port: port, JetStream: true, StoreDir: dir, NoLog: true, NoSigs: true,
	})
	if err != nil {
		return err
	}
	go srv.Start()
	if !srv.ReadyForConnections(30 * time.Second) {
		return errors.New("server not ready after 30s")
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, os.Interrupt)
	<-sig
	srv.Shutdown()
	srv.WaitForShutdown()
	return nil
}

// refusingKeys is a key store whose writes fail: a producer that dies
// between a job's record and its admission.
type refusingKeys struct{ *jobkeys.NATSStore }

func (refusingKeys) Create(context.Context, string, string, []byte) (uint64, error) {
	return 0, errors.New("jobsproc: the producer died before the admission")
}

func (refusingKeys) Update(context.Context, string, string, []byte, uint64) (uint64, error) {
	return 0, errors.New("jobsproc: the producer died before the admission")
}
