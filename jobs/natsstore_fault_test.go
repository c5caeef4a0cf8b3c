package jobs

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/synadia-io/orbit.go/jetstreamext"

	"github.com/jobkeys/jobkeys/internal/natstest"
)

// errWriterKilled is what the crashing writer's enqueue returns.
var errWriterKilled = errors.New("writer killed")

// crashAfter makes st's atomic batches die after k of their messages reach
// the server: the first k messages are sent as the batch's staged messages
// (never the commit), then the writer's connection is closed, as a process
// crash would close it.
func crashAfter(st *NATSStore, nc *nats.Conn, k int, sent *int) {
	st.batchPublish = func(ctx context.Context, msgs []*nats.Msg) (uint64, error) {
		*sent = len(msgs)
		id := nats.NewInbox()[len("_INBOX."):] // any unique id
		for i := 0; i < k && i < len(msgs); i++ {
			m := msgs[i]
			m.Header.Set(jetstreamext.BatchIDHeader, id)
			m.Header.Set(jetstreamext.BatchSeqHeader, strconv.Itoa(i+1))
			if err := nc.PublishMsg(m); err != nil {
				return 0, err
			}
		}
		if err := nc.Flush(); err != nil {
			return 0, err
		}
		nc.Close()
		return 0, errWriterKilled
	}
}

// channelKeys lists every KV key of channel in st's bucket.
func channelKeys(t *testing.T, st *NATSStore, channel string) []string {
	t.Helper()
	keys, _, err := st.subjects(context.Background(), "test", st.keys.channelFilter(channel))
	require.NoError(t, err)
	return keys
}

// TestNATSStoreEnqueueCrashAtEveryWrite kills the writer of an enqueue
// after each of the batch's writes (1 … all of them, never the commit) and
// checks that none of them is visible, that the job it would supersede is
// untouched and that the enqueue then succeeds from another process. It
// covers both enqueues of the layout: the first job of a target (five keys)
// and one that supersedes (six).
func TestNATSStoreEnqueueCrashAtEveryWrite(t *testing.T) {
	t.Parallel()
	s := natstest.Run(t)
	ctx := context.Background()
	for _, supersede := range []bool{false, true} {
		for k := 1; ; k++ {
			name := fmt.Sprintf("supersede=%t/after=%d", supersede, k)
			healthy, _ := newTestNATSStore(t, s, nil)
			const channel = "ch"
			var prev Job
			if supersede {
				out, err := healthy.Enqueue(ctx, testEnqueueRequest(channel, "old", "doc"))
				require.NoError(t, err, name)
				prev = out.Job
			}
			before := channelKeys(t, healthy, channel)

			nc, js := natstest.Connect(t, s)
			writer, err := NewNATSStore(js, nil, WithBucket(healthy.Bucket()))
			require.NoError(t, err, name)
			var n int
			crashAfter(writer, nc, k, &n)
			_, err = writer.Enqueue(ctx, testEnqueueRequest(channel, "new", "doc"))
			require.ErrorIs(t, err, errWriterKilled, name)
			require.Less(t, k-1, n, "%s: the batch has only %d writes", name, n)

			assert.ElementsMatch(t, before, channelKeys(t, healthy, channel), "%s: a key of the killed batch is visible", name)
			_, err = healthy.Get(ctx, channel, "new")
			require.ErrorIs(t, err, ErrNotFound, name)
			if supersede {
				got, err := healthy.Get(ctx, channel, "old")
				require.NoError(t, err, name)
				assert.Equal(t, prev, got.Job, "%s: the superseded job changed", name)
			}

			out, err := healthy.Enqueue(ctx, testEnqueueRequest(channel, "new", "doc"))
			require.NoError(t, err, name)
			assert.False(t, out.Repeated, name)
			want := uint64(1)
			if supersede {
				want = 2
				got, err := healthy.Get(ctx, channel, "old")
				require.NoError(t, err, name)
				assert.Equal(t, StateSuperseded, got.Job.State, name)
			}
			assert.Equal(t, want, out.Job.TargetGeneration, name)
			claimed, err := healthy.Claim(ctx, ClaimRequest{ChannelID: channel, Owner: "w", Count: 10, TTL: time.Minute})
			require.NoError(t, err, name)
			require.Len(t, claimed, 1, name)
			assert.Equal(t, "new", claimed[0].ID, name)
			if k >= n {
				break
			}
		}
	}
}

// TestNATSStoreEnqueueBatchIsConditional shows that a batch whose
// expectation fails writes nothing: an enqueue racing another for the same
// idempotency key through a stale read.
func TestNATSStoreEnqueueBatchIsConditional(t *testing.T) {
	t.Parallel()
	s := natstest.Run(t)
	ctx := context.Background()
	st, _ := newTestNATSStore(t, s, nil)
	first := testEnqueueRequest("ch", "a", "doc")
	_, err := st.Enqueue(ctx, first)
	require.NoError(t, err)
	before := channelKeys(t, st, "ch")
	// A batch written as if the idempotency key were still free.
	rival := testEnqueueRequest("ch", "b", "other")
	rival.IdempotencyKey = first.IdempotencyKey
	now := time.Now().UTC()
	j, tgt, _ := enqueueJob(rival, 0, nil, now, 0)
	msgs, err := st.enqueueBatch(&j, tgt, 0, nil, 0, 0)
	require.NoError(t, err)
	_, conflict, err := st.publishBatch(ctx, "test", msgs)
	require.NoError(t, err)
	assert.True(t, conflict)
	assert.ElementsMatch(t, before, channelKeys(t, st, "ch"), "the failed batch wrote a key")
	_, err = st.Get(ctx, "ch", "b")
	assert.ErrorIs(t, err, ErrNotFound)
}
