package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jobkeys/jobkeys/internal/natstest"
	"github.com/jobkeys/jobkeys/jobs"
)

// jobFixture fills channel "ch" of st with a job in each state: j-pending
// (due), j-backoff (pending, due in an hour), j-paused, j-running, j-failed.
func jobFixture(t *testing.T, st jobs.Store) {
	t.Helper()
	ctx := context.Background()
	enqueue := func(id string) {
		_, err := st.Enqueue(ctx, jobs.EnqueueRequest{ID: id, ChannelID: "ch", Type: "render", Version: 1,
			TargetKey: "doc-" + id, IdempotencyKey: "idem-" + id, Fingerprint: "fp", Input: json.RawMessage(`{"doc":"` + id + `"}`)})
		require.NoError(t, err)
	}
	claim := func(id string) jobs.Job {
		got, err := st.Claim(ctx, jobs.ClaimRequest{ChannelID: "ch", Owner: "worker-1", Count: 1, TTL: time.Hour})
		require.NoError(t, err)
		require.Len(t, got, 1)
		require.Equal(t, id, got[0].ID)
		return got[0]
	}
	enqueue("j-backoff")
	j := claim("j-backoff")
	_, err := st.Requeue(ctx, jobs.RequeueRequest{Claim: jobs.ClaimOf(j), AvailableAt: time.Now().Add(time.Hour), Reason: "boom", CountFailure: true})
	require.NoError(t, err)
	enqueue("j-failed")
	j = claim("j-failed")
	_, err = st.Fail(ctx, jobs.FailRequest{Claim: jobs.ClaimOf(j), Reason: "gave up"})
	require.NoError(t, err)
	enqueue("j-running")
	claim("j-running")
	enqueue("j-paused")
	d, err := st.Get(ctx, "ch", "j-paused")
	require.NoError(t, err)
	_, err = st.Pause(ctx, jobs.PauseRequest{ChannelID: "ch", JobID: "j-paused", ExpectedRevision: d.Job.Revision, Reason: "hold"})
	require.NoError(t, err)
	enqueue("j-pending")
}

func jobRunner(t *testing.T, st jobs.Store) *runner {
	srv := natstest.Run(t)
	r := newRunner(t, srv.ClientURL())
	r.jobStore = func(context.Context, *session, *options) (jobs.Store, error) { return st, nil }
	return r
}

func jobState(t *testing.T, st jobs.Store, id string) jobs.Job {
	t.Helper()
	d, err := st.Get(context.Background(), "ch", id)
	require.NoError(t, err)
	return d.Job
}

func TestJobs(t *testing.T) {
	t.Parallel()
	st, err := jobs.NewMemoryStore(nil)
	require.NoError(t, err)
	testJobs(t, st, jobRunner(t, st))
}

func testJobs(t *testing.T, st jobs.Store, r *runner) {
	jobFixture(t, st)

	res := r.run("jobs", "ls", "ch")
	require.Equal(t, exitOK, res.code, res.stderr)
	lines := strings.Split(strings.TrimSpace(res.stdout), "\n")
	require.Len(t, lines, 6, res.stdout)
	assert.Regexp(t, `^ID +TYPE +STATE +TARGET +ATTEMPTS +FAILURES +DUE +UPDATED +REASON$`, lines[0])
	assert.Regexp(t, `^j-pending +render/v1 +pending +doc-j-pending#1 +0 +0 +\S+ ago +\S+ ago +$`, lines[1], "newest first")
	assert.Regexp(t, `^j-paused +render/v1 +paused +doc-j-paused#1 +0 +0 +- +\S+ ago +hold$`, lines[2])
	assert.Regexp(t, `^j-running +render/v1 +running +doc-j-running#1 +1 +0 +claim in \S+ +`, lines[3])
	assert.Regexp(t, `^j-failed +render/v1 +failed +doc-j-failed#1 +1 +1 +- +\S+ ago +gave up$`, lines[4])
	assert.Regexp(t, `^j-backoff +render/v1 +pending +doc-j-backoff#1 +1 +1 +in (59m\d+s|1h0m0s) +\S+ ago +boom$`, lines[5])

	res = r.run("jobs", "ls", "ch", "--json", "--state", "pending")
	require.Equal(t, exitOK, res.code, res.stderr)
	var list []summaryJSON
	require.NoError(t, json.Unmarshal([]byte(res.stdout), &list))
	require.Len(t, list, 2)
	assert.Equal(t, []string{"j-pending", "j-backoff"}, []string{list[0].ID, list[1].ID})
	res = r.run("jobs", "ls", "ch", "--limit", "2", "--json")
	require.Equal(t, exitOK, res.code, res.stderr)
	require.NoError(t, json.Unmarshal([]byte(res.stdout), &list))
	assert.Len(t, list, 2)
	res = r.run("jobs", "ls", "ch", "--limit", "2", "--all", "--json")
	require.Equal(t, exitOK, res.code, res.stderr)
	require.NoError(t, json.Unmarshal([]byte(res.stdout), &list))
	assert.Len(t, list, 5, "--all follows the pages")

	res = r.run("jobs", "show", "ch", "j-running")
	require.Equal(t, exitOK, res.code, res.stderr)
	assert.Regexp(t, `(?m)^State: +running$`, res.stdout)
	assert.Regexp(t, `(?m)^Claim: +worker-1, generation 1, expires `, res.stdout)
	assert.Regexp(t, `(?m)^Input: +\{"doc":"j-running"\}$`, res.stdout)
	res = r.run("jobs", "show", "--json", "ch", "j-failed")
	require.Equal(t, exitOK, res.code, res.stderr)
	var d detailJSON
	require.NoError(t, json.Unmarshal([]byte(res.stdout), &d))
	assert.Equal(t, jobs.StateFailed, d.Job.State)
	assert.Equal(t, "gave up", d.Job.Reason)
	res = r.run("jobs", "show", "ch", "nosuch")
	assert.Equal(t, exitNotFound, res.code)

	// pause and resume, at the revision seen.
	rev := jobState(t, st, "j-pending").Revision
	res = r.run("jobs", "pause", "ch", "j-pending", "--revision", "1")
	if rev != 1 {
		assert.Equal(t, exitConflict, res.code)
		assert.Equal(t, jobs.StatePending, jobState(t, st, "j-pending").State)
	}
	res = r.run("jobs", "pause", "ch", "j-pending", "--reason", "maintenance")
	require.Equal(t, exitOK, res.code, res.stderr)
	assert.Contains(t, res.stdout, "paused job j-pending of channel ch: now paused")
	assert.Equal(t, "maintenance", jobState(t, st, "j-pending").Reason)
	res = r.run("jobs", "resume", "ch", "j-pending", "--in", "10m")
	require.Equal(t, exitOK, res.code, res.stderr)
	j := jobState(t, st, "j-pending")
	assert.Equal(t, jobs.StatePending, j.State)
	assert.True(t, j.AvailableAt.After(time.Now().Add(9*time.Minute)))
	res = r.run("jobs", "resume", "ch", "j-pending")
	assert.Equal(t, exitConflict, res.code, "not paused")

	// retry: the backing-off job and the paused one become due now; the
	// failed and running ones are refused, unchanged.
	before := jobState(t, st, "j-backoff")
	res = r.run("jobs", "retry", "ch", "j-backoff")
	require.Equal(t, exitOK, res.code, res.stderr)
	after := jobState(t, st, "j-backoff")
	assert.Equal(t, jobs.StatePending, after.State)
	assert.False(t, after.AvailableAt.After(time.Now()), "due now")
	assert.Equal(t, [2]int{before.Attempts, before.Failures}, [2]int{after.Attempts, after.Failures})
	res = r.run("jobs", "retry", "ch", "j-paused", "--json")
	require.Equal(t, exitOK, res.code, res.stderr)
	var retried jobs.Job
	require.NoError(t, json.Unmarshal([]byte(res.stdout), &retried))
	assert.Equal(t, jobs.StatePending, retried.State)
	// The failed job runs again as a new job (Client.Retry), once.
	failed := jobState(t, st, "j-failed")
	res = r.run("jobs", "retry", "ch", "j-failed", "--json")
	require.Equal(t, exitOK, res.code, res.stderr)
	var again jobs.Job
	require.NoError(t, json.Unmarshal([]byte(res.stdout), &again))
	assert.Equal(t, jobs.StatePending, again.State)
	assert.Equal(t, jobs.RetryOriginPrefix+"j-failed", again.Origin)
	assert.Equal(t, failed.TargetKey, again.TargetKey)
	assert.JSONEq(t, string(failed.Input), string(again.Input))
	stored := jobState(t, st, again.ID)
	assert.Equal(t, [2]any{again.Revision, again.IdempotencyKey}, [2]any{stored.Revision, stored.IdempotencyKey}, "the new job as stored")
	assert.Equal(t, failed, jobState(t, st, "j-failed"), "the failed job stays as it was")
	res = r.run("jobs", "retry", "ch", "j-failed")
	require.Equal(t, exitOK, res.code, res.stderr)
	assert.Contains(t, res.stdout, "job j-failed of channel ch (failed) runs again as job "+again.ID+": now pending")
	res = r.run("jobs", "retry", "ch", "j-failed", "--service", "")
	assert.Equal(t, exitUsage, res.code)
	res = r.run("jobs", "retry", "ch", "j-running")
	assert.Equal(t, exitConflict, res.code)
	assert.Equal(t, jobs.StateRunning, jobState(t, st, "j-running").State)

	// cancel asks.
	res = r.run("jobs", "cancel", "ch", "j-running")
	assert.Equal(t, exitNotConfirmed, res.code)
	assert.Equal(t, jobs.StateRunning, jobState(t, st, "j-running").State)
	r.terminal, r.stdin = true, "y\n"
	res = r.run("jobs", "cancel", "ch", "j-running")
	require.Equal(t, exitOK, res.code, res.stderr)
	assert.Contains(t, res.stderr, "Cancel job j-running of channel ch? This is final. [y/N]")
	assert.Equal(t, jobs.StateCancelled, jobState(t, st, "j-running").State)
	res = r.run("jobs", "cancel", "-f", "ch", "j-running")
	assert.Equal(t, exitConflict, res.code, "already final")
}

// The same over the NATS job store, opened by the CLI in --jobs-bucket.
func TestJobsNATS(t *testing.T) {
	t.Parallel()
	srv := natstest.Run(t)
	_, js := natstest.Connect(t, srv)
	st, err := jobs.NewNATSStore(js, nil, jobs.WithBucket("OPS_JOBS"), jobs.WithCreateBucket(jetstream.MemoryStorage, 1))
	require.NoError(t, err)
	r := newRunner(t, srv.ClientURL())
	res := r.run("jobs", "ls", "ch")
	assert.Equal(t, exitNotFound, res.code, "no bucket JOBKEYS_JOBS: %s", res.stderr)
	assert.Contains(t, res.stderr, `"JOBKEYS_JOBS"`)
	r.defaultArgs = []string{"--jobs-bucket", "OPS_JOBS"}
	testJobs(t, st, r)
}

// TestJobsLsRefusesUnknownState is the regression test for "jobs ls
// --state" with a misspelt state: it listed nothing and said "no jobs in
// channel", as if the channel were empty. It is a usage error now.
func TestJobsLsRefusesUnknownState(t *testing.T) {
	t.Parallel()
	st, err := jobs.NewMemoryStore(nil)
	require.NoError(t, err)
	jobFixture(t, st)
	r := jobRunner(t, st)
	res := r.run("jobs", "ls", "ch", "--state", "runing")
	assert.Equal(t, exitUsage, res.code, res.stdout)
	assert.Contains(t, res.stderr, `"runing"`)
	res = r.run("jobs", "ls", "ch", "--state", "running")
	require.Equal(t, exitOK, res.code, res.stderr)
	assert.Contains(t, res.stdout, "j-running")
}
