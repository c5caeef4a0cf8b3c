package jobs

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jobkeys/jobkeys/internal/natstest"
)

// TestNATSStoreClaimSkipsCorruptRecord is the regression test for a corrupt
// job record that stopped Claim on its whole channel: Claim now claims the
// healthy jobs beside it, leaves the corrupt value as it is, and reports it
// (ErrCorrupt naming job and KV key) when it has nothing else to claim.
func TestNATSStoreClaimSkipsCorruptRecord(t *testing.T) {
	t.Parallel()
	s := natstest.Run(t)
	ctx := context.Background()
	clock := newFixedClock()
	st, js := newTestNATSStore(t, s, &Config{Now: clock.Now})
	for _, id := range []string{"bad", "good-1", "good-2"} {
		_, err := st.Enqueue(ctx, testEnqueueRequest("ch", id, "doc-"+id))
		require.NoError(t, err)
		clock.Advance(time.Millisecond) // "bad" comes first in claim order
	}
	kv, err := js.KeyValue(ctx, st.Bucket())
	require.NoError(t, err)
	key := st.keys.job("ch", "bad")
	rev, err := kv.Put(ctx, key, []byte(`{"v":1,`))
	require.NoError(t, err)

	got, err := st.Claim(ctx, ClaimRequest{ChannelID: "ch", Owner: "w", Count: 10, TTL: time.Minute})
	require.NoError(t, err, "a corrupt record beside due jobs must not fail the claim")
	ids := []string{}
	for _, j := range got {
		ids = append(ids, j.ID)
	}
	assert.Equal(t, []string{"good-1", "good-2"}, ids)

	got, err = st.Claim(ctx, ClaimRequest{Owner: "w", Count: 10, TTL: time.Minute}) // every channel
	require.ErrorIs(t, err, ErrCorrupt)
	assert.Empty(t, got)
	assert.Contains(t, err.Error(), `"bad"`)
	assert.Contains(t, err.Error(), key)

	after, err := kv.Get(ctx, key)
	require.NoError(t, err)
	assert.Equal(t, rev, after.Revision(), "the corrupt record was overwritten")
	assert.Equal(t, []byte(`{"v":1,`), after.Value())
	_, err = kv.Get(ctx, st.keys.active("ch", "bad"))
	require.NoError(t, err, "the corrupt job's active entry was removed")
}

// cancelAfterUpdates is a KeyValue that cancels a context once n updates
// have been written.
type cancelAfterUpdates struct {
	jetstream.KeyValue
	n      int32
	done   atomic.Int32
	cancel context.CancelFunc
}

func (c *cancelAfterUpdates) Update(ctx context.Context, key string, value []byte, last uint64) (uint64, error) {
	rev, err := c.KeyValue.Update(ctx, key, value, last)
	if c.done.Add(1) == c.n {
		c.cancel()
	}
	return rev, err
}

// TestNATSStoreClaimKeepsWhatItClaimed is the regression test for a Claim
// whose ctx ended after it had claimed a job: it returned ctx.Err() and
// dropped the claimed job, which stayed running, unseen, until its claim
// expired. It now returns the jobs it claimed.
func TestNATSStoreClaimKeepsWhatItClaimed(t *testing.T) {
	t.Parallel()
	s := natstest.Run(t)
	bg := context.Background()
	st, _ := newTestNATSStore(t, s, nil)
	for _, id := range []string{"a", "b", "c"} {
		_, err := st.Enqueue(bg, testEnqueueRequest("ch", id, "doc-"+id))
		require.NoError(t, err)
	}
	ctx, cancel := context.WithCancel(bg)
	defer cancel()
	st.kv = &cancelAfterUpdates{KeyValue: st.kv, n: 1, cancel: cancel}
	st.plainWrites = false // compare-and-swap writes through st.kv, which counts them
	got, err := st.Claim(ctx, ClaimRequest{ChannelID: "ch", Owner: "w", Count: 3, TTL: time.Minute})
	require.NoError(t, err)
	require.Len(t, got, 1, "the job claimed before ctx ended")
	d, err := st.Get(bg, "ch", got[0].ID)
	require.NoError(t, err)
	assert.Equal(t, StateRunning, d.Job.State)
	assert.Equal(t, got[0].ClaimGeneration, d.Job.ClaimGeneration)
	running := 0
	for _, id := range []string{"a", "b", "c"} {
		d, err := st.Get(bg, "ch", id)
		require.NoError(t, err)
		if d.Job.State == StateRunning {
			running++
		}
	}
	assert.Equal(t, 1, running, "only the returned job is claimed")

	_, err = st.Claim(ctx, ClaimRequest{ChannelID: "ch", Owner: "w", Count: 3, TTL: time.Minute})
	assert.ErrorIs(t, err, context.Canceled, "nothing claimed: the ctx error, unchanged")
}

// TestNATSStoreOwnTimeoutIsUnavailable is the regression test for a read
// that ran out of the store's own time (the JetStream context's default
// timeout, applied when the caller's ctx has no deadline): it returned a
// bare context.DeadlineExceeded, as if the caller's ctx had expired. It is
// ErrUnavailable naming the read now.
func TestNATSStoreOwnTimeoutIsUnavailable(t *testing.T) {
	t.Parallel()
	s := natstest.Run(t)
	ctx := context.Background()
	st, _ := newTestNATSStore(t, s, nil)
	_, err := st.Enqueue(ctx, testEnqueueRequest("ch", "j", "doc"))
	require.NoError(t, err)
	nc, _ := natstest.Connect(t, s)
	short, err := jetstream.New(nc, jetstream.WithDefaultTimeout(time.Nanosecond))
	require.NoError(t, err)
	st.js = short // the leader and batched reads take their timeout from it
	_, err = st.List(ctx, ListRequest{ChannelID: "ch"})
	require.ErrorIs(t, err, ErrUnavailable)
	assert.Contains(t, err.Error(), "list")
	_, err = st.Claim(ctx, ClaimRequest{ChannelID: "ch", Owner: "w", Count: 1, TTL: time.Minute})
	require.ErrorIs(t, err, ErrUnavailable)
	assert.Contains(t, err.Error(), "batched read")
}

// TestNATSStoreClaimForgetsHintsOfJobsFinishedElsewhere is the regression
// test for the pending hints of a store whose jobs another store claims and
// settles: they stayed (up to 1,024), and every Claim of the first store
// read up to 32 of those completed jobs again — claims reading terminal
// jobs. A hint whose job has no active entry is now dropped.
func TestNATSStoreClaimForgetsHintsOfJobsFinishedElsewhere(t *testing.T) {
	t.Parallel()
	s := natstest.Run(t)
	ctx := context.Background()
	a, js := newTestNATSStore(t, s, nil)
	b := openTestNATSStore(t, s, a, nil)
	_, err := a.Enqueue(ctx, testEnqueueRequest("ch", "j", "doc"))
	require.NoError(t, err)
	jk := a.keys.job("ch", "j")
	require.True(t, a.pending.has(jk))
	got, err := b.Claim(ctx, ClaimRequest{ChannelID: "ch", Owner: "w", Count: 1, TTL: time.Minute})
	require.NoError(t, err)
	require.Len(t, got, 1)
	_, err = b.Settle(ctx, SettleRequest{Claim: ClaimOf(got[0])})
	require.NoError(t, err)
	kv, err := js.KeyValue(ctx, a.Bucket())
	require.NoError(t, err)
	require.Eventually(t, func() bool { // the settle's purge is sent without waiting
		_, err := kv.Get(ctx, a.keys.active("ch", "j"))
		return err != nil
	}, 10*time.Second, 10*time.Millisecond)

	_, err = a.Enqueue(ctx, testEnqueueRequest("ch", "k", "doc2")) // the channel has an active job
	require.NoError(t, err)
	_, err = a.Claim(ctx, ClaimRequest{ChannelID: "ch", Owner: "w", Count: 1, TTL: time.Minute})
	require.NoError(t, err)
	assert.False(t, a.pending.has(jk), "the hint of a job settled elsewhere is kept")
	_, err = a.Claim(ctx, ClaimRequest{ChannelID: "other", Owner: "w", Count: 1, TTL: time.Minute})
	require.NoError(t, err)
}

// TestNATSStoreOwnTimeoutIsNotTheCallersDeadline is the regression test for
// a read that ran out of the store's own time while the caller's ctx had no
// deadline: its error wrapped ErrUnavailable but still matched
// context.DeadlineExceeded, so a caller (and the metrics' error.type,
// "deadline_exceeded") took it for the caller's deadline. It matches
// ErrUnavailable only now, and says it was the store's own timeout.
func TestNATSStoreOwnTimeoutIsNotTheCallersDeadline(t *testing.T) {
	t.Parallel()
	s := natstest.Run(t)
	ctx := context.Background()
	st, _ := newTestNATSStore(t, s, nil)
	_, err := st.Enqueue(ctx, testEnqueueRequest("ch", "j", "doc"))
	require.NoError(t, err)
	nc, _ := natstest.Connect(t, s)
	short, err := jetstream.New(nc, jetstream.WithDefaultTimeout(time.Nanosecond))
	require.NoError(t, err)
	st.js = short
	_, err = st.Claim(ctx, ClaimRequest{ChannelID: "ch", Owner: "w", Count: 1, TTL: time.Minute})
	require.ErrorIs(t, err, ErrUnavailable)
	assert.NotErrorIs(t, err, context.DeadlineExceeded, "the caller's ctx has no deadline: %v", err)
	assert.Contains(t, err.Error(), "the store's own timeout")
	assert.Equal(t, "unavailable", errorClass(err))
}
