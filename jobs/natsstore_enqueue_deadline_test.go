package jobs

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jobkeys/jobkeys/internal/natstest"
)

// TestNATSStoreUnbatchedEnqueueDeadlines ends unbatched enqueues by their
// caller's deadline, at every point the deadlines happen to fall on (from
// before the first write to after the last): an enqueue that fails says
// ErrOutcomeUnknown (beside the deadline) unless it wrote nothing at all,
// and names the job, its idempotency key and the replay; a replay without
// a deadline then makes the job, the target's newest, pending, the job it
// superseded superseded, as one clean enqueue would.
func TestNATSStoreUnbatchedEnqueueDeadlines(t *testing.T) {
	t.Parallel()
	s := natstest.Run(t)
	ctx := context.Background()
	st := newUnbatchedStore(t, s)
	prev := ""
	unknown, clean := 0, 0
	for i, d := 0, 20*time.Microsecond; d < 100*time.Millisecond; i, d = i+1, d*5/4 {
		id := fmt.Sprintf("j%d", i)
		req := testEnqueueRequest(crashChannel, id, "doc")
		// A store of its own each time, which has not read the target: its
		// first writes are tried before any read.
		writer := openTestNATSStore(t, s, st, nil)
		dctx, cancel := context.WithTimeout(ctx, d)
		_, err := writer.Enqueue(dctx, req)
		cancel()
		switch {
		case err == nil:
			clean++
		case errors.Is(err, ErrOutcomeUnknown):
			unknown++
			assert.ErrorIs(t, err, context.DeadlineExceeded, "%s: the caller's deadline is the cause", id)
			assert.Contains(t, err.Error(), fmt.Sprintf("%q", id), id)
			assert.Contains(t, err.Error(), fmt.Sprintf("%q", req.IdempotencyKey), id)
			assert.Contains(t, err.Error(), "replay", id)
		default:
			require.ErrorIs(t, err, context.DeadlineExceeded, id)
			err0 := err
			_, found, err := st.getOne(ctx, "test", st.keys.idem(crashChannel, req.IdempotencyKey))
			require.NoError(t, err)
			assert.False(t, found, "%s: failed without ErrOutcomeUnknown and wrote its idempotency record: %v", id, err0)
		}
		out, err := st.Enqueue(ctx, req)
		require.NoError(t, err, "%s: the replay", id)
		assert.Equal(t, StatePending, out.Job.State, id)
		d2, err := st.Get(ctx, crashChannel, id)
		require.NoError(t, err, id)
		assert.Equal(t, out.Job, d2.Job, id)
		assert.Equal(t, uint64(i+1), d2.Target.Generation, "%s: one generation per enqueue", id)
		if prev != "" {
			p, err := st.Get(ctx, crashChannel, prev)
			require.NoError(t, err, id)
			assert.Equal(t, StateSuperseded, p.Job.State, "%s: %s after it", id, prev)
		}
		prev = id
	}
	t.Logf("%d enqueues cut with ErrOutcomeUnknown, %d clean", unknown, clean)
	claimed, err := st.Claim(ctx, ClaimRequest{ChannelID: crashChannel, Owner: "w", Count: 100, TTL: time.Minute})
	require.NoError(t, err)
	require.Len(t, claimed, 1, "one job of the target claimable")
	assert.Equal(t, prev, claimed[0].ID)
}
