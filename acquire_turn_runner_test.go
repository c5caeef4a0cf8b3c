package jobkeys

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestWithQueueTurnRunnerPollsOutOfTurn: a Runner without a Watcher over a
// store with wake-ups, given queueTurn, keeps the queue's order on its
// first try only: its rechecks are not in turn (queueTurn's doc: not
// on the tries a recheck starts), so a job queued behind one nobody runs
// (its worker gone) takes the free slot at its first recheck, as it does
// without the option. (Every recheck was in turn: blocked behind the
// abandoned job, the Run waited until MaxWait.)
func TestWithQueueTurnRunnerPollsOutOfTurn(t *testing.T) {
	t.Parallel()
	f := newJobWakeFixture(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, id := range []string{"job-abandoned", "job-2"} {
		_, err := f.jta.Admit(ctx, id, jobWakePayload)
		require.NoError(t, err)
	}
	r, err := NewRunner(f.jtb, &RunnerConfig{RecheckInterval: 10 * time.Millisecond, MaxWait: 30 * time.Second})
	require.NoError(t, err)

	// Its first try is in turn: blocked, the slot is free for the job ahead.
	_, err = r.TryRun(ctx, "job-2", jobWakePayload, func(context.Context, Lease) error { return nil }, queueTurn())
	var blocked *BlockedError
	require.ErrorAs(t, err, &blocked, "TryRun's try with queueTurn is in turn")
	assert.Less(t, blocked.Acquisition.Active, blocked.Acquisition.Limit)

	ran := false
	res, err := r.Run(ctx, "job-2", jobWakePayload, func(context.Context, Lease) error { ran = true; return nil }, queueTurn())
	require.NoError(t, err, "a Run with queueTurn behind a job nobody runs")
	assert.True(t, ran)
	assert.Equal(t, KindReleased, res.Release)
}
