package jobs

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jobkeys/jobkeys/internal/natstest"
)

// TestNATSStoreSupersedeMarkOutlivesWritesAndFencesLateClaims: an
// unbatched enqueue marks the job it supersedes before its commit, and
// the job may be written in between. A renewal of the running job keeps
// the mark (were it dropped, the commit would leave two active jobs on
// the target), and a claim that read the marked job before the commit and
// writes after it is refused: the job is superseded, and no worker may
// start it.
func TestNATSStoreSupersedeMarkOutlivesWritesAndFencesLateClaims(t *testing.T) {
	t.Parallel()
	s := natstest.Run(t)
	ctx := context.Background()

	t.Run("renewal keeps the mark", func(t *testing.T) {
		st := newUnbatchedStore(t, s)
		_, err := st.Enqueue(ctx, testEnqueueRequest(crashChannel, "old", "doc"))
		require.NoError(t, err)
		worker := openTestNATSStore(t, s, st, nil)
		running, err := worker.ClaimJob(ctx, ClaimJobRequest{ChannelID: crashChannel, JobID: "old", Owner: "w", TTL: time.Hour})
		require.NoError(t, err)

		// The enqueue of new stops after marking old (idempotency record,
		// staged record, mark): before its commit.
		writer := openTestNATSStore(t, s, st, nil)
		writer.targets.add(writer.keys.target(crashChannel, "doc"))
		writer.writeCut = &natsWriteCut{left: 3}
		_, err = writer.Enqueue(ctx, testEnqueueRequest(crashChannel, "new", "doc"))
		require.ErrorIs(t, err, errWritesCut)

		renewed, err := worker.Renew(ctx, RenewRequest{Claim: ClaimOf(running), ExpectedRevision: running.Revision, TTL: time.Hour})
		require.NoError(t, err, "the enqueue did not commit: old is still the target's")
		rd, err := st.readJobFull(ctx, "test", crashChannel, "old")
		require.NoError(t, err)
		assert.NotNil(t, rd.raw.marks.supersede, "the renewal dropped the supersede mark")

		out, err := st.Enqueue(ctx, testEnqueueRequest(crashChannel, "new", "doc"))
		require.NoError(t, err)
		assert.False(t, out.Repeated)
		d, err := st.Get(ctx, crashChannel, "old")
		require.NoError(t, err)
		assert.Equal(t, StateSuperseded, d.Job.State, "old after the commit")
		assert.Equal(t, out.Job.Revision, d.Job.Revision)
		_, err = worker.Renew(ctx, RenewRequest{Claim: ClaimOf(renewed), ExpectedRevision: renewed.Revision, TTL: time.Hour})
		assert.ErrorIs(t, err, ErrConflict, "the superseded claim is fenced")
	})

	t.Run("a claim written after the commit is refused", func(t *testing.T) {
		st := newUnbatchedStore(t, s)
		_, err := st.Enqueue(ctx, testEnqueueRequest(crashChannel, "old", "doc"))
		require.NoError(t, err)
		writer := openTestNATSStore(t, s, st, nil)
		writer.targets.add(writer.keys.target(crashChannel, "doc"))
		writer.writeCut = &natsWriteCut{left: 3}
		_, err = writer.Enqueue(ctx, testEnqueueRequest(crashChannel, "new", "doc"))
		require.ErrorIs(t, err, errWritesCut)

		// A worker reads old, pending and marked, to claim it; the
		// enqueue commits (old's record does not change: it was marked
		// already); then the worker's claim writes over the record it read.
		worker := openTestNATSStore(t, s, st, nil)
		seen, err := worker.peekJob(ctx, crashChannel, "old", true)
		require.NoError(t, err)
		require.Equal(t, StatePending, seen.State)
		_, err = st.Enqueue(ctx, testEnqueueRequest(crashChannel, "new", "doc"))
		require.NoError(t, err)

		_, err = worker.ClaimJob(ctx, ClaimJobRequest{ChannelID: crashChannel, JobID: "old", Owner: "w", TTL: time.Hour})
		require.Error(t, err, "a superseded job was claimed")
		d, err := st.Get(ctx, crashChannel, "old")
		require.NoError(t, err)
		assert.Equal(t, StateSuperseded, d.Job.State)
		claimed, err := worker.Claim(ctx, ClaimRequest{ChannelID: crashChannel, Owner: "w", Count: 10, TTL: time.Hour})
		require.NoError(t, err)
		require.Len(t, claimed, 1)
		assert.Equal(t, "new", claimed[0].ID)
	})
}
