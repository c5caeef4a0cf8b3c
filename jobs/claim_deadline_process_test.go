package jobs_test

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jobkeys/jobkeys"
	"github.com/jobkeys/jobkeys/jobs"
)

// procPolicy is internal/jobsproc's policy: claims and slots of 2.5s,
// renewed every 200ms.
var procPolicy = jobkeys.Policy{
	Key: []string{"k", "/k"}, MaxActive: 2, MaxQueuedPerKey: 1000,
	HeartbeatInterval: 200 * time.Millisecond, HeartbeatTTL: 2500 * time.Millisecond,
}

// A worker process stopped (SIGSTOP) past its claims' TTL while another
// worker claims its jobs again and completes them: when it is continued,
// each of its handlers, which wakes from a wait that ended while it was
// stopped and checks its context right before its external effect, finds
// the context already ended with ErrClaimLost (not ErrTimeout, although
// the kind's Timeout passed too), and the process attempts no write
// (renewal, progress, settle, fail, requeue) of a lost claim.
func TestClaimDeadlineStoppedProcess(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs a process")
	}
	t.Parallel()
	bin := filepath.Join(t.TempDir(), "jobsproc")
	out, err := exec.Command("go", "build", "-o", bin, "github.com/jobkeys/jobkeys/internal/jobsproc").CombinedOutput()
	require.NoError(t, err, "%s", out)
	env := newRuntimeEnv(t)
	b := env.newNode(fastConfig, nil) // the other worker; it makes the buckets
	require.NoError(t, jobs.Register(b.client, jobs.Kind[procIn, docOut]{
		Type: "proc", Policy: procPolicy,
		Work: func(ctx context.Context, run *jobs.Run, in procIn) (docOut, error) { return docOut{By: "b"}, nil },
	}))
	ctx := context.Background()
	const jobsN = 4 // one per key: the stopped process holds them all
	for i := range jobsN {
		in, err := json.Marshal(procIn{K: "k" + strconv.Itoa(i), N: i})
		require.NoError(t, err)
		id := "j" + strconv.Itoa(i)
		_, err = b.client.Enqueue(ctx, jobs.EnqueueRequest{ID: id, ChannelID: "ch", Type: "proc", TargetKey: id,
			IdempotencyKey: id, Fingerprint: id, Input: in})
		require.NoError(t, err)
	}

	ledger := filepath.Join(t.TempDir(), "ledger")
	// Each handler holds its job 2s, then checks its context; the kind's
	// Timeout is 2.2s: both pass while the process is stopped.
	a := exec.Command(bin, "-mode", "worker", "-url", env.srv.ClientURL(), "-ledger", ledger,
		"-bucket", env.bucket, "-service", env.service, "-hold", "2s", "-timeout", "2200ms", "-log-writes")
	a.Stderr = os.Stderr
	require.NoError(t, a.Start())
	exited := make(chan error, 1)
	go func() { exited <- a.Wait() }()
	t.Cleanup(func() {
		_ = a.Process.Signal(syscall.SIGCONT)
		_ = a.Process.Kill()
		<-exited
	})
	pid := a.Process.Pid
	require.Eventually(t, func() bool { return len(ledgerLines(t, ledger, "hold", pid)) == jobsN },
		time.Minute, 10*time.Millisecond, "the worker never held every job")
	require.NoError(t, a.Process.Signal(syscall.SIGSTOP))
	held := map[string]bool{} // job/generation the stopped process held
	for _, f := range ledgerLines(t, ledger, "hold", pid) {
		held[f[1]+"/"+f[2]] = true
	}

	require.NoError(t, b.client.Start(ctx))
	for i := range jobsN {
		d := waitState(t, b, "j"+strconv.Itoa(i), jobs.StateCompleted)
		assert.False(t, held[d.ID+"/"+strconv.FormatUint(d.ClaimGeneration, 10)], "job %s completed on the stopped process's claim", d.ID)
	}
	continued := time.Now()
	require.NoError(t, a.Process.Signal(syscall.SIGCONT))
	require.Eventually(t, func() bool { return len(ledgerLines(t, ledger, "effect", pid)) == jobsN },
		time.Minute, 10*time.Millisecond, "the continued handlers never reached their effect")
	require.NoError(t, a.Process.Signal(syscall.SIGTERM))
	select {
	case err := <-exited:
		exited <- err
		require.NoError(t, err)
	case <-time.After(time.Minute):
		t.Fatal("the worker did not stop")
	}

	for _, f := range ledgerLines(t, ledger, "effect", pid) {
		require.Truef(t, held[f[1]+"/"+f[2]], "effect of a claim not held before the stop: %v", f)
		assert.Equalf(t, strconv.Quote(jobs.ErrClaimLost.Error()), strings.Join(f[5:], " "), "job %s: its context when the handler went on to its effect", f[1])
	}
	var late []string
	for _, f := range ledgerLines(t, ledger, "write", pid) {
		ns, err := strconv.ParseInt(f[5], 10, 64)
		require.NoError(t, err)
		if held[f[2]+"/"+f[3]] && time.Unix(0, ns).After(continued) {
			late = append(late, strings.Join(f, " "))
		}
	}
	assert.Empty(t, late, "writes of a lost claim attempted after the process was continued")
}

// procIn is internal/jobsproc's input.
type procIn struct {
	K string `json:"k"`
	N int    `json:"n"`
}

// ledgerLines returns the fields of the ledger's lines of kind by
// process pid (the pid is the fourth field of hold and effect lines, the
// fifth of write lines).
func ledgerLines(t *testing.T, path, kind string, pid int) [][]string {
	t.Helper()
	f, err := os.Open(path)
	if os.IsNotExist(err) {
		return nil
	}
	require.NoError(t, err)
	defer f.Close()
	at := 3
	if kind == "write" {
		at = 4
	}
	var lines [][]string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) > at+1 && fs[0] == kind && fs[at] == strconv.Itoa(pid) {
			lines = append(lines, fs)
		}
	}
	require.NoError(t, sc.Err())
	return lines
}
