package jobs_test

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jobkeys/jobkeys/jobs"
)

// proc is one process of internal/jobsproc.
type proc struct {
	cmd    *exec.Cmd
	done   chan error
	killed time.Time // when it was SIGKILLed, else zero
}

// The jobs runtime with real processes: three workers and three
// producers on a file-storage server; one producer is killed mid-burst
// (and run again), one dies between a record and its admission, one
// worker is killed mid-job (and replaced), and the server restarts. The
// ledger the processes append to is audited: every job completes (zero
// lost) and no key ever runs more than MaxActive jobs at once (zero
// over-admission), counting a killed worker's job as running until the
// kill.
func TestRuntimeProcessFaults(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs processes")
	}
	t.Parallel()
	tmp := t.TempDir()
	bin := filepath.Join(tmp, "jobsproc")
	out, err := exec.Command("go", "build", "-o", bin, "github.com/jobkeys/jobkeys/internal/jobsproc").CombinedOutput()
	require.NoError(t, err, "%s", out)

	storeDir := filepath.Join(tmp, "js")
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := l.Addr().(*net.TCPAddr).Port
	require.NoError(t, l.Close())
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)
	ledger := filepath.Join(tmp, "ledger")

	var procs []*proc
	spawn := func(args ...string) *proc {
		args = append([]string{"-url", url, "-ledger", ledger, "-bucket", "JOBS_PROC", "-service", "proc"}, args...)
		cmd := exec.Command(bin, args...)
		cmd.Stderr = os.Stderr
		require.NoError(t, cmd.Start())
		p := &proc{cmd: cmd, done: make(chan error, 1)}
		go func() { p.done <- cmd.Wait() }()
		procs = append(procs, p)
		return p
	}
	// The server is a process of its own too: its restart is a real one.
	startServer := func() *proc {
		p := spawn("-mode", "server", "-store", storeDir, "-port", strconv.Itoa(port))
		require.Eventually(t, func() bool {
			nc, err := nats.Connect(url)
			if err == nil {
				nc.Close()
			}
			return err == nil
		}, time.Minute, 20*time.Millisecond, "the server never accepted connections")
		return p
	}
	srv := startServer()
	// The bucket first: NATSStore creates it, then enables atomic batch
	// publish, and a process opening it in between refuses it.
	{
		nc, err := nats.Connect(url)
		require.NoError(t, err)
		js, err := jetstream.New(nc)
		require.NoError(t, err)
		_, err = jobs.NewNATSStore(js, nil, jobs.WithBucket("JOBS_PROC"), jobs.WithCreateBucket(jetstream.FileStorage, 1))
		nc.Close()
		require.NoError(t, err)
	}
	t.Cleanup(func() {
		for _, p := range procs {
			_ = p.cmd.Process.Kill()
		}
		for _, p := range procs {
			<-p.done
		}
	})
	wait := func(p *proc) error {
		select {
		case err := <-p.done:
			p.done <- err
			return err
		case <-time.After(3 * time.Minute):
			return fmt.Errorf("process %d did not exit", p.cmd.Process.Pid)
		}
	}
	kill := func(p *proc) {
		at := time.Now()
		if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Logf("process %d had exited before its kill", p.cmd.Process.Pid)
		} else {
			p.killed = at
		}
		_ = wait(p)
	}

	const jobsN = 80
	w1 := spawn("-mode", "worker")
	spawn("-mode", "worker")
	spawn("-mode", "worker")
	p1 := spawn("-mode", "producer", "-from", "0", "-to", "40", "-pace", "10ms")
	p2 := spawn("-mode", "producer", "-from", "40", "-to", strconv.Itoa(jobsN), "-pace", "20ms")
	orphan := spawn("-mode", "producer", "-orphan", "-from", strconv.Itoa(jobsN))
	time.Sleep(300 * time.Millisecond)
	kill(p2)
	p3 := spawn("-mode", "producer", "-from", "40", "-to", strconv.Itoa(jobsN)) // the rerun
	time.Sleep(500 * time.Millisecond)
	kill(w1)
	spawn("-mode", "worker")
	time.Sleep(500 * time.Millisecond)
	require.NoError(t, srv.cmd.Process.Signal(syscall.SIGTERM)) // the server restarts on its files
	require.NoError(t, wait(srv))
	srv = startServer()
	require.NoError(t, wait(p1))
	require.NoError(t, wait(p3))
	assert.Error(t, wait(orphan), "the orphan producer exits as if killed")

	// Every job ends completed.
	nc, err := nats.Connect(url)
	require.NoError(t, err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	st, err := jobs.NewNATSStore(js, nil, jobs.WithBucket("JOBS_PROC"))
	require.NoError(t, err)
	ctx := context.Background()
	for i := 0; i <= jobsN; i++ {
		id := "j" + strconv.Itoa(i)
		require.Eventuallyf(t, func() bool {
			d, err := st.Get(ctx, "proc", id)
			return err == nil && d.Job.State == jobs.StateCompleted
		}, 3*time.Minute, 50*time.Millisecond, "job %s never completed", id)
	}
	for _, p := range procs {
		if p != srv && p.killed.IsZero() && p.cmd.ProcessState == nil {
			_ = p.cmd.Process.Signal(syscall.SIGTERM)
		}
	}
	for _, p := range procs {
		if p != srv {
			_ = wait(p)
		}
	}
	_ = srv.cmd.Process.Signal(syscall.SIGTERM)
	auditLedger(t, ledger, procs, jobsN)
}

// auditLedger checks the ledger: every job ran to an "ok" end at least
// once, and per key no more than MaxActive (2) ran at once.
func auditLedger(t *testing.T, path string, procs []*proc, jobsN int) {
	t.Helper()
	killedAt := map[int]time.Time{}
	for _, p := range procs {
		if !p.killed.IsZero() {
			killedAt[p.cmd.Process.Pid] = p.killed
		}
	}
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	type run struct {
		key        string
		pid        int
		start, end time.Time
	}
	open := map[string]*run{} // job/pid → run
	var runs []*run
	okEnds := map[string]int{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) < 5 || (fs[0] != "start" && fs[0] != "end") {
			continue
		}
		pid, _ := strconv.Atoi(fs[3])
		ns, _ := strconv.ParseInt(fs[4], 10, 64)
		at := time.Unix(0, ns)
		k := fs[1] + "/" + fs[3]
		if fs[0] == "start" {
			r := &run{key: fs[2], pid: pid, start: at}
			open[k] = r
			runs = append(runs, r)
			continue
		}
		if r := open[k]; r != nil {
			r.end = at
			delete(open, k)
		}
		if len(fs) > 5 && fs[5] == `"ok"` {
			okEnds[fs[1]]++
		}
	}
	require.NoError(t, sc.Err())
	for k, r := range open {
		kt, ok := killedAt[r.pid]
		require.Truef(t, ok, "run %s never ended and its process was not killed", k)
		r.end = kt
	}
	for i := 0; i <= jobsN; i++ {
		assert.GreaterOrEqual(t, okEnds["j"+strconv.Itoa(i)], 1, "job j%d never ran to its end", i)
	}
	type ev struct {
		at time.Time
		d  int
	}
	byKey := map[string][]ev{}
	for _, r := range runs {
		byKey[r.key] = append(byKey[r.key], ev{r.start, 1}, ev{r.end, -1})
	}
	for key, evs := range byKey {
		sort.Slice(evs, func(i, j int) bool {
			if evs[i].at.Equal(evs[j].at) {
				return evs[i].d < evs[j].d
			}
			return evs[i].at.Before(evs[j].at)
		})
		cur, peak := 0, 0
		for _, e := range evs {
			cur += e.d
			peak = max(peak, cur)
		}
		assert.LessOrEqual(t, peak, 2, "key %s ran %d jobs at once", key, peak)
	}
	t.Logf("%d runs over %d keys; %d killed processes", len(runs), len(byKey), len(killedAt))
}
