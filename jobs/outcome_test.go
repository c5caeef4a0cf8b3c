package jobs_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jobkeys/jobkeys/jobs"
)

// Permanent keeps the error it marks: errors.Is and errors.As see through
// it (wrapped further or not), its text is the error's, and Permanent(nil)
// is nil (a success).
func TestPermanentKeepsError(t *testing.T) {
	t.Parallel()
	base := errors.New("bad input")
	p := jobs.Permanent(base)
	require.ErrorIs(t, p, base)
	require.ErrorIs(t, fmt.Errorf("render: %w", p), base)
	assert.Equal(t, "bad input", p.Error())
	var pe *fsError
	assert.False(t, errors.As(p, &pe))
	target := &fsError{}
	require.ErrorAs(t, jobs.Permanent(fmt.Errorf("open: %w", target)), &pe)
	assert.Same(t, target, pe)
	assert.NoError(t, jobs.Permanent(nil))
}

type fsError struct{}

func (*fsError) Error() string { return "fs" }

// A handler error marked Permanent — directly, wrapped with %w, or in
// errors.Join — fails the job at its first attempt, whatever its failure
// budget, with "permanent: " and the error's text as its reason.
func TestPermanentFailsJobAtOnce(t *testing.T) {
	t.Parallel()
	env := newRuntimeEnv(t)
	n := env.newNode(fastConfig, nil)
	bad := errors.New("page size 0")
	returns := map[string]error{
		"direct":  jobs.Permanent(bad),
		"wrapped": fmt.Errorf("render: %w", jobs.Permanent(bad)),
		"joined":  errors.Join(errors.New("cleanup"), jobs.Permanent(bad)),
	}
	var runs atomic.Int64
	require.NoError(t, jobs.Register(n.client, jobs.Kind[docIn, docOut]{
		Type: "perm", Policy: quickPolicy, MaxFailures: 5,
		Work: func(ctx context.Context, run *jobs.Run, in docIn) (docOut, error) {
			runs.Add(1)
			return docOut{}, returns[in.Doc]
		},
	}))
	ctx := context.Background()
	for name := range returns {
		_, err := n.client.Enqueue(ctx, enqueueReq("perm", name, name, name))
		require.NoError(t, err)
	}
	require.NoError(t, n.client.Start(ctx))
	for name, werr := range returns {
		j := waitState(t, n, name, jobs.StateFailed)
		assert.Equal(t, 1, j.Attempts, name)
		assert.Equal(t, 1, j.Failures, name)
		assert.Equal(t, "permanent: "+werr.Error(), j.Reason, name)
	}
	require.NoError(t, n.client.Stop(ctx))
	assert.Equal(t, int64(len(returns)), runs.Load(), "a job with a permanent error ran again")
}

// A Snooze (returned directly or wrapped) hands the job back, pending
// again after its delay, without counting a failure: the record says
// "snoozed for …", Failures stays 0 (under a budget of one failure, one
// counted failure would have failed the job), Attempts counts the claim.
// A job snoozed for 0 runs again and completes.
func TestSnoozeHandsBackWithoutFailure(t *testing.T) {
	t.Parallel()
	env := newRuntimeEnv(t)
	n := env.newNode(fastConfig, nil)
	require.NoError(t, jobs.Register(n.client, jobs.Kind[docIn, docOut]{
		Type: "snooze", Policy: quickPolicy, MaxFailures: 1,
		Work: func(ctx context.Context, run *jobs.Run, in docIn) (docOut, error) {
			switch {
			case in.Doc == "later":
				return docOut{}, fmt.Errorf("upstream busy: %w", jobs.Snooze(time.Hour))
			case run.Job().Attempts == 1:
				return docOut{}, jobs.Snooze(0)
			}
			return docOut{By: fmt.Sprintf("attempt %d, failures %d", run.Job().Attempts, run.Job().Failures)}, nil
		},
	}))
	ctx := context.Background()
	t0 := time.Now()
	for _, id := range []string{"later", "again"} {
		_, err := n.client.Enqueue(ctx, enqueueReq("snooze", id, id, id))
		require.NoError(t, err)
	}
	require.NoError(t, n.client.Start(ctx))

	again := waitState(t, n, "again", jobs.StateCompleted)
	assert.Equal(t, 2, again.Attempts)
	assert.Equal(t, 0, again.Failures)
	d, err := n.client.Get(ctx, "ch", "again")
	require.NoError(t, err)
	require.NotNil(t, d.Artifact)
	assert.JSONEq(t, `{"by":"attempt 2, failures 0"}`, string(d.Artifact.Value))

	var later jobs.Job
	require.Eventually(t, func() bool {
		later = getJob(t, n, "later")
		return later.State == jobs.StatePending && later.Attempts == 1
	}, time.Minute, 20*time.Millisecond, "the snoozed job was not handed back")
	require.NoError(t, n.client.Stop(ctx))
	later = getJob(t, n, "later")
	assert.Equal(t, jobs.StatePending, later.State)
	assert.Equal(t, 0, later.Failures)
	assert.Equal(t, 1, later.Attempts)
	assert.Equal(t, "snoozed for 1h0m0s", later.Reason)
	assert.False(t, later.AvailableAt.Before(t0.Add(time.Hour)), "due at %v, before the snooze ends", later.AvailableAt)
	assert.True(t, strings.HasPrefix(jobs.Snooze(time.Second).Error(), "jobs: snoozed"))
}
