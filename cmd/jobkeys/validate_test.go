package main

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jobkeys/jobkeys/jobs"
)

// TestBadJobsBucketIsUsage is the regression test for a --jobs-bucket that
// cannot be a bucket name: it connected first, then failed with exit code
// 4 (conflict, the library's error kind for a bad option). It is a usage
// error now (exit code 2), found before connecting.
func TestBadJobsBucketIsUsage(t *testing.T) {
	t.Parallel()
	r := newRunner(t, "nats://127.0.0.1:1") // never reached
	for _, name := range []string{"bad.name", "a b", "", strings.Repeat("x", 65)} {
		res := r.run("jobs", "ls", "ch", "--jobs-bucket", name)
		assert.Equal(t, exitUsage, res.code, "%q: %s", name, res.stderr)
		assert.Contains(t, res.stderr, "--jobs-bucket", "%q", name)
	}
}

// TestNonPositiveTimeoutIsUsage is the regression test for --timeout 0 or
// negative: exit code 1 with an error from the NATS client ("timeout
// invalid", "invalid jetstream option") after trying to connect. It is a
// usage error now (exit code 2) naming the flag.
func TestNonPositiveTimeoutIsUsage(t *testing.T) {
	t.Parallel()
	r := newRunner(t, "nats://127.0.0.1:1")
	for _, d := range []string{"0", "-1s"} {
		res := r.run("keys", "ls", "svc", "--timeout", d)
		assert.Equal(t, exitUsage, res.code, "%s: %s", d, res.stderr)
		assert.Contains(t, res.stderr, "--timeout", d)
		assert.Contains(t, res.stderr, "not positive", d)
	}
}

// TestJobsCancelFinalJobRefusedBeforeAsking is the regression test for
// "jobs cancel" of a job that is already final: it asked to cancel it
// (refusing without a terminal, exit code 6, as if the operator had to
// decide) and, once confirmed, failed with a conflict. It says at once that
// the job is final (exit code 4), without asking.
func TestJobsCancelFinalJobRefusedBeforeAsking(t *testing.T) {
	t.Parallel()
	st, err := jobs.NewMemoryStore(nil)
	require.NoError(t, err)
	jobFixture(t, st)
	r := jobRunner(t, st)
	before := jobState(t, st, "j-failed")
	res := r.run("jobs", "cancel", "ch", "j-failed")
	assert.Equal(t, exitConflict, res.code, res.stderr)
	assert.Contains(t, res.stderr, `job "j-failed" of channel "ch" is failed, which is final`)
	assert.NotContains(t, res.stderr, "[y/N]")
	assert.Equal(t, before, jobState(t, st, "j-failed"))
	r.terminal, r.stdin = true, "y\n"
	res = r.run("jobs", "cancel", "ch", "j-failed")
	assert.Equal(t, exitConflict, res.code, res.stderr)
	assert.NotContains(t, res.stderr, "[y/N]", "not asked")
}

// TestJobsCancelCountsAttempts is the regression test for "jobs cancel"
// describing a job of one attempt as "1 attempts".
func TestJobsCancelCountsAttempts(t *testing.T) {
	t.Parallel()
	st, err := jobs.NewMemoryStore(nil)
	require.NoError(t, err)
	jobFixture(t, st)
	r := jobRunner(t, st)
	res := r.run("jobs", "cancel", "-f", "ch", "j-running")
	require.Equal(t, exitOK, res.code, res.stderr)
	assert.Contains(t, res.stdout, "Job j-running (render/v1, target doc-j-running) is running, 1 attempt.\n")
	res = r.run("jobs", "cancel", "-f", "ch", "j-pending")
	require.Equal(t, exitOK, res.code, res.stderr)
	assert.Contains(t, res.stdout, "is pending, 0 attempts.\n")
}

// TestJobsArgumentsOutOfLimitsAreUsage is the regression test for a
// CHANNEL, JOBID or --reason the job store cannot hold: an empty one was
// "not found" (exit code 3), one over the store's limits a "conflict"
// (exit code 4). They are usage errors now (exit code 2), naming the
// argument, found before connecting.
func TestJobsArgumentsOutOfLimitsAreUsage(t *testing.T) {
	t.Parallel()
	st, err := jobs.NewMemoryStore(nil)
	require.NoError(t, err)
	jobFixture(t, st)
	r := jobRunner(t, st)
	long := strings.Repeat("x", jobs.IdentifierSizeLimit+1)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"jobs", "ls", ""}, "CHANNEL is empty"},
		{[]string{"jobs", "ls", long}, "CHANNEL is 257 bytes, over the limit of 256"},
		{[]string{"jobs", "show", "", "j-pending"}, "CHANNEL is empty"},
		{[]string{"jobs", "show", "ch", ""}, "JOBID is empty"},
		{[]string{"jobs", "show", "ch", long}, "JOBID is 257 bytes"},
		{[]string{"jobs", "cancel", "-f", "ch", long}, "JOBID is 257 bytes"},
		{[]string{"jobs", "pause", "ch", "\xff"}, "JOBID is not valid UTF-8"},
		{[]string{"jobs", "resume", long, "j-paused"}, "CHANNEL is 257 bytes"},
		{[]string{"jobs", "retry", "ch", ""}, "JOBID is empty"},
		{[]string{"jobs", "pause", "ch", "j-pending", "--reason", strings.Repeat("r", jobs.ReasonSizeLimit+1)}, "--reason is 2049 bytes, over the limit of 2048"},
	} {
		res := r.run(tc.args...)
		assert.Equal(t, exitUsage, res.code, "%.40q: %s", tc.args, res.stderr)
		assert.Contains(t, res.stderr, tc.want, "%.40q", tc.args)
	}
	assert.Equal(t, jobs.StatePending, jobState(t, st, "j-pending").State, "nothing changed")
}
