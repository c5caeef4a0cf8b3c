package jobs_test

// The harness of the dispatch benchmarks (issue 23): a standalone server
// process (internal/jobsbench -mode server) whose CPU and message counters
// every row reads, worker and producer processes of the same program,
// and the per-job figures every row reports. The benchmarks drive only the
// public API (NewClient, Register, Enqueue, Start, Stop, NATSStore,
// jobkeys.NewNATSStore, NewCoordinator), so they measure whatever dispatch
// sits behind it.
//
// Every row reports, beside its own figures:
//
//	client-cpu-ms/job  CPU of the test process and of its worker and
//	                   producer processes over the measured part
//	server-cpu-ms/job  CPU of the server process over the same part
//	msgs/job           the server's in_msgs + out_msgs (/varz) over it
//
// CPU is read from /proc (Linux; elsewhere those two figures are left out)
// in clock ticks (10 ms): a row of a fraction of a second reports it
// coarsely. Each top-level benchmark starts its own server and runs its
// baseline row first; a row's ratio is to the baseline of the same run.
// Run each command with -benchtime 1x, and repeat the command to
// interleave rows with their baselines: -count n runs each row n times
// back to back instead. The commands are in each benchmark's doc; all of
// them (about 6 minutes on 2 cores; the 100,000-completed row is extra):
//
//	JOBKEYS_BENCH_BACKLOG_N=200 go test -run '^$' -bench 'Dispatch' -benchtime 1x -timeout 30m ./jobs/

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jobkeys/jobkeys"
	"github.com/jobkeys/jobkeys/internal/natstest"
	"github.com/jobkeys/jobkeys/jobs"
)

// dispatchSeq numbers the buckets and services of the dispatch rows.
var dispatchSeq atomic.Int64

// buildJobsBench builds internal/jobsbench once per benchmark and returns
// the binary.
func buildJobsBench(b *testing.B) string {
	b.Helper()
	bin := filepath.Join(b.TempDir(), "jobsbench")
	out, err := exec.Command("go", "build", "-o", bin, "github.com/jobkeys/jobkeys/internal/jobsbench").CombinedOutput()
	require.NoError(b, err, "%s", out)
	return bin
}

// benchProc is a worker or producer process of internal/jobsbench.
type benchProc struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines chan string // its stdout, line by line; closed at EOF
	done  chan error
}

func startBenchProc(b *testing.B, bin string, args ...string) *benchProc {
	b.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	require.NoError(b, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(b, err)
	require.NoError(b, cmd.Start())
	p := &benchProc{cmd: cmd, stdin: stdin, lines: make(chan string, 1<<16), done: make(chan error, 1)}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			p.lines <- sc.Text()
		}
		close(p.lines)
		p.done <- cmd.Wait()
	}()
	b.Cleanup(func() { p.stop(b) })
	return p
}

// await returns the next line with prefix, discarding others; false when
// the process ended first.
func (p *benchProc) await(prefix string) (string, bool) {
	for l := range p.lines {
		if strings.HasPrefix(l, prefix) {
			return l, true
		}
	}
	return "", false
}

// stop ends the process (SIGTERM, stdin closed) and waits for it.
func (p *benchProc) stop(b *testing.B) {
	if p.cmd.ProcessState != nil {
		return
	}
	_ = p.stdin.Close()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	go func() {
		for range p.lines {
		}
	}()
	select {
	case err := <-p.done:
		if err != nil {
			b.Errorf("jobsbench %v: %v", p.cmd.Args[1:], err)
		}
	case <-time.After(time.Minute):
		_ = p.cmd.Process.Kill()
		<-p.done
		b.Errorf("jobsbench %v did not stop in a minute", p.cmd.Args[1:])
	}
	p.done <- nil // a second stop returns at once
}

// benchServer is a standalone server process.
type benchServer struct {
	bin     string
	url     string
	varzURL string
	pid     int
	http    *http.Client
}

// startBenchServer builds internal/jobsbench and starts its server for b.
func startBenchServer(b *testing.B) *benchServer {
	b.Helper()
	bin := buildJobsBench(b)
	port, httpPort := natstest.FreePort(b), natstest.FreePort(b)
	p := startBenchProc(b, bin, "-mode", "server", "-store", b.TempDir(), "-port", strconv.Itoa(port), "-http", strconv.Itoa(httpPort))
	s := &benchServer{
		bin: bin, url: fmt.Sprintf("nats://127.0.0.1:%d", port),
		varzURL: fmt.Sprintf("http://127.0.0.1:%d/varz", httpPort), pid: p.cmd.Process.Pid,
		http: &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second},
	}
	deadline := time.Now().Add(time.Minute)
	for {
		nc, err := nats.Connect(s.url)
		if err == nil {
			nc.Close()
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("the server never accepted connections: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return s
}

func (s *benchServer) connect(b *testing.B) (*nats.Conn, jetstream.JetStream) {
	b.Helper()
	return natstest.ConnectURL(b, s.url)
}

// varz returns the server's in_msgs + out_msgs.
func (s *benchServer) varz(b *testing.B) int64 {
	b.Helper()
	resp, err := s.http.Get(s.varzURL)
	require.NoError(b, err)
	defer resp.Body.Close()
	var v struct {
		InMsgs  int64 `json:"in_msgs"`
		OutMsgs int64 `json:"out_msgs"`
	}
	require.NoError(b, json.NewDecoder(resp.Body).Decode(&v))
	return v.InMsgs + v.OutMsgs
}

// benchSample is a reading of the costs a row reports per job.
type benchSample struct {
	at        time.Time
	clientCPU time.Duration // this process and the row's other client processes
	serverCPU time.Duration
	msgs      int64
	cpuOK     bool
}

// sample reads the costs now; pids are the row's worker and producer
// processes.
func (s *benchServer) sample(b *testing.B, pids ...int) benchSample {
	b.Helper()
	self, ok1 := selfCPU()
	srv, ok2 := pidCPU(s.pid)
	smp := benchSample{clientCPU: self, serverCPU: srv, cpuOK: ok1 && ok2}
	for _, pid := range pids {
		c, ok := pidCPU(pid)
		smp.clientCPU += c
		smp.cpuOK = smp.cpuOK && ok
	}
	smp.msgs = s.varz(b)
	smp.at = time.Now()
	return smp
}

// benchCost is what a row spent between two samples, summed over b.N.
type benchCost struct {
	jobs               int
	elapsed            time.Duration
	clientCPU, srvCPU  time.Duration
	msgs               int64
	cpuOK, anyMeasured bool
}

func (c *benchCost) add(jobs int, from, to benchSample) {
	if !c.anyMeasured {
		c.cpuOK = true
	}
	c.anyMeasured = true
	c.jobs += jobs
	c.elapsed += to.at.Sub(from.at)
	c.clientCPU += to.clientCPU - from.clientCPU
	c.srvCPU += to.serverCPU - from.serverCPU
	c.msgs += to.msgs - from.msgs
	c.cpuOK = c.cpuOK && from.cpuOK && to.cpuOK
}

// rate is jobs per second.
func (c *benchCost) rate() float64 { return float64(c.jobs) / c.elapsed.Seconds() }

// report reports jobs/s (unless noRate), CPU and messages per job.
func (c *benchCost) report(b *testing.B, noRate bool) {
	if c.jobs == 0 {
		return
	}
	if !noRate {
		b.ReportMetric(c.rate(), "jobs/s")
	}
	if c.cpuOK {
		b.ReportMetric(float64(c.clientCPU)/float64(time.Millisecond)/float64(c.jobs), "client-cpu-ms/job")
		b.ReportMetric(float64(c.srvCPU)/float64(time.Millisecond)/float64(c.jobs), "server-cpu-ms/job")
	}
	b.ReportMetric(float64(c.msgs)/float64(c.jobs), "msgs/job")
}

// benchBaseline holds a top-level benchmark's baseline figures, by name,
// for the rows after it in the same run to report their ratio to.
type benchBaseline struct {
	mu sync.Mutex
	v  map[string]float64
}

func (bl *benchBaseline) set(name string, v float64) {
	bl.mu.Lock()
	defer bl.mu.Unlock()
	if bl.v == nil {
		bl.v = make(map[string]float64)
	}
	bl.v[name] = v
}

// ratio reports v / the baseline name under unit, when the baseline ran.
func (bl *benchBaseline) ratio(b *testing.B, name string, v float64, unit string) {
	bl.mu.Lock()
	base, ok := bl.v[name]
	bl.mu.Unlock()
	if ok && base > 0 {
		b.ReportMetric(v/base, unit)
	}
}

// dispatchClient is a jobs client on its own connection to the server, over
// a job bucket and key service of its own (the row's).
type dispatchClient struct {
	js     jetstream.JetStream
	store  *jobs.NATSStore
	client *jobs.Client
	bucket string
	svc    string
}

// benchBuckets names a fresh job bucket and key service.
func benchBuckets() (bucket, service string) {
	n := dispatchSeq.Add(1)
	return fmt.Sprintf("JOBS_DB%d", n), fmt.Sprintf("db%d", n)
}

// newDispatchClient makes a client with cfg's MaxWorkers (every interval
// its default) over bucket and service, created with storage st.
func newDispatchClient(b *testing.B, s *benchServer, bucket, service string, st jetstream.StorageType, workers int) *dispatchClient {
	b.Helper()
	_, js := s.connect(b)
	store, err := jobs.NewNATSStore(js, nil, jobs.WithBucket(bucket), jobs.WithCreateBucket(st, 1))
	require.NoError(b, err)
	ks, err := jobkeys.NewNATSStore(js, jobkeys.WithCreateBuckets(st, 1))
	require.NoError(b, err)
	coord, err := jobkeys.NewCoordinator(ks, nil)
	require.NoError(b, err)
	cfg := &jobs.ClientConfig{KeyStore: ks, Service: service, MaxWorkers: workers}
	if os.Getenv("JOBKEYS_BENCH_RETENTION") == "keep" {
		// Finished jobs kept for good: no retention writes (see Retention).
		cfg.Retention = jobs.Retention{Completed: -1, Failed: -1, Cancelled: -1, Superseded: -1}
	}
	c, err := jobs.NewClient(store, coord, cfg)
	require.NoError(b, err)
	return &dispatchClient{js: js, store: store, client: c, bucket: bucket, svc: service}
}

// dropBuckets deletes a row's job bucket and key bucket, so that the
// server's memory does not grow over the rows.
func dropBuckets(b *testing.B, js jetstream.JetStream, bucket, service string) {
	ctx := context.Background()
	for _, name := range []string{bucket, "JOBS_KEYS_" + service} {
		if err := js.DeleteKeyValue(ctx, name); err != nil && !strings.Contains(err.Error(), "not found") {
			b.Logf("delete bucket %s: %v", name, err)
		}
	}
}

// benchBody is a job's input and a message's body, as internal/jobsbench
// makes it: {"k":"k<i % keys>","t":<unix ns>}.
func benchBody(i, keys int, t time.Time) []byte {
	return fmt.Appendf(nil, `{"k":"k%d","t":%d}`, i%keys, t.UnixNano())
}

type benchIn struct {
	K string `json:"k"`
	T int64  `json:"t"`
}

// benchReq is job i of kind typ.
func benchReq(typ string, i, keys int, t time.Time) jobs.EnqueueRequest {
	id := typ + strconv.Itoa(i)
	return jobs.EnqueueRequest{ID: id, ChannelID: "bench", Type: typ, Version: 1, TargetKey: id,
		IdempotencyKey: id, Fingerprint: id, Input: benchBody(i, keys, t)}
}

// parallel runs f(i) for i in [0, n) on conc goroutines and returns the
// first error.
func parallel(n, conc int, f func(i int) error) error {
	var next atomic.Int64
	var first error
	var once sync.Once
	var wg sync.WaitGroup
	for range conc {
		wg.Go(func() {
			for i := int(next.Add(1) - 1); i < n; i = int(next.Add(1) - 1) {
				if err := f(i); err != nil {
					once.Do(func() { first = err })
					return
				}
			}
		})
	}
	wg.Wait()
	return first
}

// percentile returns the p-th percentile (0–100) of sorted ds.
func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	i := int(p / 100 * float64(len(ds)-1))
	return ds[i]
}

func sortDurations(ds []time.Duration) { slices.Sort(ds) }

// envInt returns the environment variable name as an int, or def.
func envInt(b *testing.B, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	require.NoError(b, err, "%s", name)
	return n
}

// ms is d in milliseconds.
func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
