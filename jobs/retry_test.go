package jobs_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jobkeys/jobkeys"
	"github.com/jobkeys/jobkeys/jobs"
)

// waitJob waits until job id of the default channel is in state want.
func waitJob(t *testing.T, c *jobs.Client, id string, want jobs.State) jobs.Detail {
	t.Helper()
	var d jobs.Detail
	require.Eventuallyf(t, func() bool {
		var err error
		d, err = c.Get(context.Background(), jobs.ChannelDefault, id)
		require.NoError(t, err)
		return d.Job.State == want
	}, 60*time.Second, 20*time.Millisecond, "job %s never became %s (it is %s)", id, want, d.Job.State)
	return d
}

// TestRetryFailedJob: a failed job runs again as a new job of the same
// type, input and target, linked through its Origin; a second Retry of
// it returns that job; jobs in other states are refused.
func TestRetryFailedJob(t *testing.T) {
	t.Parallel()
	env := newNATSClientEnv(t)
	ctx := context.Background()
	c := env.client(jobs.ClientConfig{PollInterval: 10 * time.Millisecond})
	var runs atomic.Int64
	require.NoError(t, jobs.Register(c, jobs.Kind[docIn, docOut]{Type: "render", Policy: docPolicy,
		Work: func(_ context.Context, run *jobs.Run, in docIn) (docOut, error) {
			if runs.Add(1) == 1 {
				return docOut{}, jobs.Permanent(errors.New("the renderer is down"))
			}
			return docOut{By: run.Job().ID}, nil
		}}))
	require.NoError(t, c.Start(ctx))

	res, err := c.Enqueue(ctx, jobs.EnqueueRequest{Type: "render", Input: docInput("d1"), TargetKey: "report-d1", Origin: "api"})
	require.NoError(t, err)
	failed := waitJob(t, c, res.Job.ID, jobs.StateFailed).Job

	again, err := c.Retry(ctx, jobs.ChannelDefault, failed.ID)
	require.NoError(t, err)
	assert.NotEqual(t, failed.ID, again.ID)
	assert.Equal(t, jobs.RetryOriginPrefix+failed.ID, again.Origin)
	assert.Equal(t, failed.Type, again.Type)
	assert.Equal(t, failed.Version, again.Version)
	assert.JSONEq(t, string(failed.Input), string(again.Input))
	assert.Equal(t, failed.TargetKey, again.TargetKey)
	assert.Equal(t, failed.TargetGeneration+1, again.TargetGeneration)
	done := waitJob(t, c, again.ID, jobs.StateCompleted)
	assert.JSONEq(t, `{"by":"`+again.ID+`"}`, string(done.Artifact.Value))
	assert.Equal(t, failed, waitJob(t, c, failed.ID, jobs.StateFailed).Job, "the failed job is left as it was")

	twice, err := c.Retry(ctx, jobs.ChannelDefault, failed.ID)
	require.NoError(t, err)
	assert.Equal(t, again.ID, twice.ID, "a second Retry returns the first one's job")
	assert.Equal(t, jobs.StateCompleted, twice.State)
	assert.EqualValues(t, 2, runs.Load(), "the second Retry ran nothing")

	_, err = c.Retry(ctx, jobs.ChannelDefault, again.ID)
	require.ErrorIs(t, err, jobs.ErrConflict, "a completed job")
	assert.ErrorContains(t, err, "completed")
	_, err = c.Retry(ctx, jobs.ChannelDefault, "nosuch")
	require.ErrorIs(t, err, jobs.ErrNotFound)
}

// TestRetryCancelledAndSuperseded: a cancelled job and a superseded one
// run again; the retry of a superseded job is its target's newest job,
// which supersedes the job that superseded it. A pending job is refused.
func TestRetryCancelledAndSuperseded(t *testing.T) {
	t.Parallel()
	env := newNATSClientEnv(t)
	ctx := context.Background()
	c := env.client(jobs.ClientConfig{})
	require.NoError(t, jobs.Register(c, jobs.Kind[docIn, docOut]{Type: "render",
		Policy: jobkeys.Policy{Key: []string{"doc", "/doc"}, MaxActive: 1, MaxQueuedPerKey: 10}}))

	cancelled, err := c.Enqueue(ctx, jobs.EnqueueRequest{Type: "render", Input: docInput("d1")})
	require.NoError(t, err)
	_, err = c.Cancel(ctx, jobs.CancelRequest{ChannelID: jobs.ChannelDefault, JobID: cancelled.Job.ID})
	require.NoError(t, err)
	r1, err := c.Retry(ctx, jobs.ChannelDefault, cancelled.Job.ID)
	require.NoError(t, err)
	assert.Equal(t, jobs.StatePending, r1.State)
	assert.Equal(t, jobs.RetryOriginPrefix+cancelled.Job.ID, r1.Origin)

	older, err := c.Enqueue(ctx, jobs.EnqueueRequest{Type: "render", Input: docInput("d2"), TargetKey: "t"})
	require.NoError(t, err)
	newer, err := c.Enqueue(ctx, jobs.EnqueueRequest{Type: "render", Input: docInput("d2"), TargetKey: "t"})
	require.NoError(t, err)
	require.Len(t, newer.Superseded, 1)
	r2, err := c.Retry(ctx, jobs.ChannelDefault, older.Job.ID)
	require.NoError(t, err)
	assert.Equal(t, "t", r2.TargetKey)
	assert.Equal(t, uint64(3), r2.TargetGeneration)
	d, err := c.Get(ctx, jobs.ChannelDefault, newer.Job.ID)
	require.NoError(t, err)
	assert.Equal(t, jobs.StateSuperseded, d.Job.State, "the retry superseded the target's newer job")

	_, err = c.Retry(ctx, jobs.ChannelDefault, r2.ID)
	require.ErrorIs(t, err, jobs.ErrConflict, "a pending job")
	assert.ErrorContains(t, err, "pending")
}

// TestRetryWithoutKind: a client without the job's kind (an operator's
// tool, as the CLI's) writes the retry's record; a worker of the kind
// admits it (its checker, after AdmitGrace) and runs it.
func TestRetryWithoutKind(t *testing.T) {
	t.Parallel()
	env := newNATSClientEnv(t)
	ctx := context.Background()
	worker := env.client(jobs.ClientConfig{PollInterval: 10 * time.Millisecond, AdmitGrace: 200 * time.Millisecond})
	var runs atomic.Int64
	require.NoError(t, jobs.Register(worker, jobs.Kind[docIn, docOut]{Type: "render", Policy: docPolicy,
		Work: func(_ context.Context, run *jobs.Run, in docIn) (docOut, error) {
			if runs.Add(1) == 1 {
				return docOut{}, jobs.Permanent(errors.New("the renderer is down"))
			}
			return docOut{By: "worker"}, nil
		}}))
	require.NoError(t, worker.Start(ctx))
	res, err := worker.Enqueue(ctx, jobs.EnqueueRequest{Type: "render", Input: docInput("d1")})
	require.NoError(t, err)
	waitJob(t, worker, res.Job.ID, jobs.StateFailed)

	operator := env.client(jobs.ClientConfig{AdmitGrace: 200 * time.Millisecond})
	again, err := operator.Retry(ctx, jobs.ChannelDefault, res.Job.ID)
	require.NoError(t, err)
	assert.Equal(t, jobs.StatePending, again.State)
	assert.True(t, strings.HasPrefix(again.Origin, jobs.RetryOriginPrefix))
	waitJob(t, worker, again.ID, jobs.StateCompleted)
}
