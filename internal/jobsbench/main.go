// Command jobsbench is the server, worker and producer processes of the
// jobs dispatch benchmarks (jobs/dispatch_*_bench_test.go); nothing here is
// part of the library. It drives only the public API of package jobs and
// of jobkeys, so that the benchmarks measure any dispatch behind it.
//
// Modes (-mode):
//
//   - server: an embedded nats-server with JetStream (storage in -store;
//     a bucket's storage type is chosen by whoever creates it) on
//     127.0.0.1:-port, with HTTP monitoring (/varz) on -http, until
//     SIGTERM.
//   - worker: a jobs.Client with -workers handlers for kind "bench" (key
//     template ["k", "/k"], -max-active, -max-queued), handler time
//     -handler; until SIGTERM, then Stop.
//   - producer: enqueues jobs -from to -to through a jobs.Client that is
//     never started, -rate jobs/s (0: as fast as -conc goroutines go).
//   - jsworker: a pull consumer on stream -stream, acking every message.
//   - jsproducer: publishes -from to -to on -subject at -rate.
//
// Every job's input (and every message's body) is {"k":"k<i % keys>",
// "t":<unix ns just before the enqueue or publish>}. Workers print, one
// line per event on stdout:
//
//	s <id> <ns from the enqueue's start to the handler's start>
//	e <id>
//
// Every process but the server prints "ready" once it is connected and
// set up; a producer then waits for a line on stdin before it starts,
// prints "done <sent> <errors>" when it is through, and exits when stdin
// closes, so that its CPU can be read before and after its work.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jobkeys/jobkeys"
	"github.com/jobkeys/jobkeys/jobs"
)

type options struct {
	url, bucket, service, storage, stream, subject string
	workers, maxActive, maxQueued, keys            int
	from, to, conc                                 int
	rate                                           float64
	handler                                        time.Duration
}

func main() {
	var o options
	mode := flag.String("mode", "worker", "server, worker, producer, jsworker or jsproducer")
	store := flag.String("store", "", "server: JetStream storage directory")
	port := flag.Int("port", 0, "server: client port")
	httpPort := flag.Int("http", 0, "server: HTTP monitoring port")
	flag.StringVar(&o.url, "url", "", "NATS URL")
	flag.StringVar(&o.bucket, "bucket", "JOBS_BENCH", "job store bucket")
	flag.StringVar(&o.service, "service", "bench", "key-layer service")
	flag.StringVar(&o.storage, "storage", "memory", "memory or file: storage of buckets this process creates")
	flag.StringVar(&o.stream, "stream", "", "jsworker: work-queue stream")
	flag.StringVar(&o.subject, "subject", "", "jsproducer: subject")
	flag.IntVar(&o.workers, "workers", 16, "worker: MaxWorkers; jsworker: messages in flight")
	flag.IntVar(&o.maxActive, "max-active", 1, "kind policy: MaxActive")
	flag.IntVar(&o.maxQueued, "max-queued", 1000, "kind policy: MaxQueuedPerKey")
	flag.IntVar(&o.keys, "keys", 1000, "producer: keys the jobs spread over")
	flag.IntVar(&o.from, "from", 0, "producer: first job")
	flag.IntVar(&o.to, "to", 0, "producer: one past the last job")
	flag.IntVar(&o.conc, "conc", 1, "producer: goroutines when -rate is 0")
	flag.Float64Var(&o.rate, "rate", 0, "producer: jobs per second (0: unpaced)")
	flag.DurationVar(&o.handler, "handler", 0, "worker: time each handler takes")
	flag.Parse()
	var err error
	switch *mode {
	case "server":
		err = serve(*store, *port, *httpPort)
	case "worker":
		err = worker(o)
	case "producer":
		err = producer(o)
	case "jsworker":
		err = jsWorker(o)
	case "jsproducer":
		err = jsProducer(o)
	default:
		err = fmt.Errorf("unknown mode %q", *mode)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "jobsbench:", err)
		os.Exit(1)
	}
}

// out writes whole lines to stdout from any goroutine.
var out = struct {
	sync.Mutex
	w *bufio.Writer
}{w: bufio.NewWriter(os.Stdout)}

func line(format string, args ...any) {
	out.Lock()
	defer out.Unlock()
	fmt.Fprintf(out.w, format+"\n", args...)
	_ = out.w.Flush()
}

// Input is a job's input and a message's body.
type Input struct {
	K string `json:"k"`
	T int64  `json:"t"`
}

// Body is the JSON of job i's input at t: byte for byte what
// encoding/json makes of Input.
func Body(i, keys int, t time.Time) []byte {
	return fmt.Appendf(nil, `{"k":"k%d","t":%d}`, i%keys, t.UnixNano())
}

// Request is job i's enqueue request.
func Request(i, keys int, t time.Time) jobs.EnqueueRequest {
	id := "j" + strconv.Itoa(i)
	return jobs.EnqueueRequest{ID: id, ChannelID: "bench", Type: "bench", Version: 1, TargetKey: id,
		IdempotencyKey: id, Fingerprint: id, Input: Body(i, keys, t)}
}

func storageOf(name string) (jetstream.StorageType, error) {
	switch name {
	case "memory":
		return jetstream.MemoryStorage, nil
	case "file":
		return jetstream.FileStorage, nil
	}
	return 0, fmt.Errorf("unknown storage %q", name)
}

func connect(url string) (*nats.Conn, jetstream.JetStream, error) {
	nc, err := nats.Connect(url)
	if err != nil {
		return nil, nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return nc, js, nil
}

// client makes the jobs client of a worker or producer, with the
// defaults of every interval, and registers kind "bench".
func client(js jetstream.JetStream, o options, work func(ctx context.Context, run *jobs.Run, in Input) (struct{}, error)) (*jobs.Client, error) {
	st, err := storageOf(o.storage)
	if err != nil {
		return nil, err
	}
	store, err := jobs.NewNATSStore(js, nil, jobs.WithBucket(o.bucket), jobs.WithCreateBucket(st, 1))
	if err != nil {
		return nil, err
	}
	ks, err := jobkeys.NewNATSStore(js, jobkeys.WithCreateBuckets(st, 1))
	if err != nil {
		return nil, err
	}
	coord, err := jobkeys.NewCoordinator(ks, nil)
	if err != nil {
		return nil, err
	}
	c, err := jobs.NewClient(store, coord, &jobs.ClientConfig{KeyStore: ks, Service: o.service, MaxWorkers: o.workers})
	if err != nil {
		return nil, err
	}
	if work == nil {
		work = func(context.Context, *jobs.Run, Input) (struct{}, error) { return struct{}{}, nil }
	}
	err = jobs.Register(c, jobs.Kind[Input, struct{}]{
		Type: "bench", Policy: jobkeys.Policy{Key: []string{"k", "/k"}, MaxActive: o.maxActive, MaxQueuedPerKey: o.maxQueued},
		Work: work,
	})
	return c, err
}

func worker(o options) error {
	nc, js, err := connect(o.url)
	if err != nil {
		return err
	}
	defer nc.Close()
	c, err := client(js, o, func(ctx context.Context, run *jobs.Run, in Input) (struct{}, error) {
		id := run.Job().ID
		line("s %s %d", id, time.Now().UnixNano()-in.T)
		if o.handler > 0 {
			select {
			case <-time.After(o.handler):
			case <-ctx.Done():
				return struct{}{}, context.Cause(ctx)
			}
		}
		line("e %s", id)
		return struct{}{}, nil
	})
	if err != nil {
		return err
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, os.Interrupt)
	ctx := context.Background()
	if err := c.Start(ctx); err != nil {
		return err
	}
	line("ready")
	<-sig
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	return c.Stop(sctx)
}

// paced runs send for i in [from, to): at rate per second on one
// goroutine, job i at its own time (an open loop: a slow send does not
// delay the schedule), or unpaced on conc goroutines. It returns how many
// sends failed.
func paced(o options, send func(i int) error) int64 {
	var failed atomic.Int64
	if o.rate <= 0 {
		var next atomic.Int64
		next.Store(int64(o.from))
		var wg sync.WaitGroup
		for range max(1, o.conc) {
			wg.Go(func() {
				for i := int(next.Add(1) - 1); i < o.to; i = int(next.Add(1) - 1) {
					if send(i) != nil {
						failed.Add(1)
					}
				}
			})
		}
		wg.Wait()
		return failed.Load()
	}
	start := time.Now()
	var wg sync.WaitGroup
	for i := o.from; i < o.to; i++ {
		time.Sleep(time.Until(start.Add(time.Duration(float64(i-o.from) / o.rate * float64(time.Second)))))
		// Each send on its own goroutine: one slow round trip does not
		// hold the next job back.
		wg.Go(func() {
			if send(i) != nil {
				failed.Add(1)
			}
		})
	}
	wg.Wait()
	return failed.Load()
}

// awaitGo prints ready, waits for a line on stdin, runs work, prints
// done and waits for stdin to close or SIGTERM.
func awaitGo(o options, send func(i int) error) error {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, os.Interrupt)
	go func() {
		<-sig
		os.Exit(0) // told to stop: the same as stdin closing
	}()
	line("ready")
	in := bufio.NewScanner(os.Stdin)
	if !in.Scan() {
		return errors.New("stdin closed before go")
	}
	failed := paced(o, send)
	line("done %d %d", int64(o.to-o.from)-failed, failed)
	for in.Scan() {
	}
	return nil
}

func producer(o options) error {
	nc, js, err := connect(o.url)
	if err != nil {
		return err
	}
	defer nc.Close()
	c, err := client(js, o, nil)
	if err != nil {
		return err
	}
	ctx := context.Background()
	var logged atomic.Bool
	return awaitGo(o, func(i int) error {
		_, err := c.Enqueue(ctx, Request(i, o.keys, time.Now()))
		if err != nil && !logged.Swap(true) {
			fmt.Fprintln(os.Stderr, "jobsbench: enqueue:", err)
		}
		return err
	})
}

func jsProducer(o options) error {
	nc, js, err := connect(o.url)
	if err != nil {
		return err
	}
	defer nc.Close()
	ctx := context.Background()
	return awaitGo(o, func(i int) error {
		_, err := js.Publish(ctx, o.subject, Body(i, o.keys, time.Now()))
		return err
	})
}

func jsWorker(o options) error {
	nc, js, err := connect(o.url)
	if err != nil {
		return err
	}
	defer nc.Close()
	ctx := context.Background()
	cons, err := js.CreateOrUpdateConsumer(ctx, o.stream, jetstream.ConsumerConfig{
		Durable: "W", AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: 10 * o.workers,
	})
	if err != nil {
		return err
	}
	cc, err := cons.Consume(func(m jetstream.Msg) {
		var t int64
		if meta, err := m.Metadata(); err == nil {
			// The body's t: parse it without reflection.
			t = bodyTime(m.Data())
			line("s %d %d", meta.Sequence.Stream, time.Now().UnixNano()-t)
		}
		_ = m.Ack()
	}, jetstream.PullMaxMessages(o.workers))
	if err != nil {
		return err
	}
	defer cc.Stop()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, os.Interrupt)
	line("ready")
	<-sig
	return nil
}

// bodyTime returns the t of a Body.
func bodyTime(b []byte) int64 {
	const tag = `"t":`
	for i := 0; i+len(tag) <= len(b); i++ {
		if string(b[i:i+len(tag)]) == tag {
			j := i + len(tag)
			k := j
			for k < len(b) && b[k] >= '0' && b[k] <= '9' {
				k++
			}
			t, _ := strconv.ParseInt(string(b[j:k]), 10, 64)
			return t
		}
	}
	return 0
}

// serve runs an embedded server until SIGTERM.
func serve(dir string, port, httpPort int) error {
	srv, err := server.NewServer(&server.Options{
		Host: "127.0.0.1", Port: port, HTTPHost: "127.0.0.1", HTTPPort: httpPort,
		JetStream: true, StoreDir: dir, NoLog: true, NoSigs: true,
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
