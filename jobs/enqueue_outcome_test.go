package jobs

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/synadia-io/orbit.go/jetstreamext"

	"github.com/jobkeys/jobkeys"
	"github.com/jobkeys/jobkeys/internal/natstest"
)

type outcomeIn struct {
	Doc string `json:"doc"`
}

// newOutcomeClient returns a client over st and a key store on s, with a
// kind "render" keyed by /doc.
func newOutcomeClient(t *testing.T, s *server.Server, st Store) *Client {
	t.Helper()
	_, js := natstest.Connect(t, s)
	ks, err := jobkeys.NewNATSStore(js, jobkeys.WithCreateBuckets(jetstream.MemoryStorage, 1))
	require.NoError(t, err)
	coord, err := jobkeys.NewCoordinator(ks, nil)
	require.NoError(t, err)
	service := fmt.Sprintf("out%d", natsBucketSeq.Add(1))
	c, err := NewClient(st, coord, &ClientConfig{KeyStore: ks, Service: service})
	require.NoError(t, err)
	require.NoError(t, Register(c, Kind[outcomeIn, struct{}]{Type: "render",
		Policy: jobkeys.Policy{Key: []string{"doc", "/doc"}, MaxActive: 1, MaxQueuedPerKey: 5},
		Work:   func(context.Context, *Run, outcomeIn) (struct{}, error) { return struct{}{}, nil }}))
	return c
}

func outcomeRequest(id string) EnqueueRequest {
	return EnqueueRequest{ID: id, ChannelID: "ch", Type: "render", Origin: "test", TargetKey: "t-" + id,
		IdempotencyKey: "idem-" + id, Fingerprint: "fp-" + id, Input: json.RawMessage(`{"doc":"d"}`)}
}

// loseAnswer makes st's atomic batches land and their answer never come:
// each batch is written (and acknowledged to no one), then the publish
// waits for its ctx to end, as a request whose reply was lost does.
func loseAnswer(t *testing.T, st *NATSStore) {
	st.batchPublish = func(ctx context.Context, msgs []*nats.Msg) (uint64, error) {
		_, err := jetstreamext.PublishMsgBatch(context.Background(), st.js, msgs)
		require.NoError(t, err, "the batch lands")
		_, bounded := ctx.Deadline()
		assert.True(t, bounded, "the store bounds its publish")
		if !bounded {
			return 0, context.DeadlineExceeded // as JetStream's own bound would end it
		}
		<-ctx.Done()
		return 0, ctx.Err()
	}
}

// TestEnqueueLostAnswerIsOutcomeUnknown is the regression test for an
// enqueue whose record's write landed and whose answer did not come in
// the store's time (at load 19, 121 of 200 enqueues): it returned
// "store unavailable: enqueue: atomic batch of 5 writes: context deadline
// exceeded", for jobs that existed and ran. The error now matches
// ErrOutcomeUnknown, names the job and its idempotency key, and a replay
// returns the job as written, admitted on its key.
func TestEnqueueLostAnswerIsOutcomeUnknown(t *testing.T) {
	t.Parallel()
	s := natstest.Run(t)
	for _, callerDeadline := range []bool{false, true} {
		t.Run(fmt.Sprintf("callerDeadline=%t", callerDeadline), func(t *testing.T) {
			_, js := natstest.Connect(t, s)
			st, err := NewNATSStore(js, nil, WithBucket(fmt.Sprintf("JOBS_T%d", natsBucketSeq.Add(1))),
				WithCreateBucket(jetstream.MemoryStorage, 1), WithTimeout(200*time.Millisecond))
			require.NoError(t, err)
			c := newOutcomeClient(t, s, st)
			loseAnswer(t, st)
			ctx := context.Background()
			if callerDeadline {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, 200*time.Millisecond)
				defer cancel()
			}
			req := outcomeRequest("A")
			_, err = c.Enqueue(ctx, req)
			require.Error(t, err)
			t.Logf("the enqueue's error: %v", err)
			assert.ErrorIs(t, err, ErrOutcomeUnknown)
			if callerDeadline {
				assert.ErrorIs(t, err, context.DeadlineExceeded, "the caller's deadline is its cause")
			} else {
				assert.ErrorIs(t, err, ErrUnavailable)
				assert.NotErrorIs(t, err, context.DeadlineExceeded, "the store's own timeout, not the caller's")
			}
			assert.Contains(t, err.Error(), `"A"`)
			assert.Contains(t, err.Error(), `"idem-A"`)
			assert.Contains(t, err.Error(), "replay")

			st.batchPublish = nil
			res, err := c.Enqueue(context.Background(), req)
			require.NoError(t, err)
			assert.True(t, res.Repeated, "the lost write landed")
			assert.Equal(t, OutcomeAccepted, res.Outcome)
			assert.Equal(t, StatePending, res.Job.State)
			assert.Equal(t, "doc:d", res.Key, "the replay admitted it")
			k, err := c.kindOf("render")
			require.NoError(t, err)
			adm, err := k.jt.Admit(context.Background(), keyJobID("ch", "A"), []byte(`{"doc":"d"}`))
			require.NoError(t, err)
			assert.True(t, adm.AlreadyPresent, "the job is queued on its key")
		})
	}
}

// TestEnqueueRefusedWriteIsNotOutcomeUnknown shows the other side: a
// write the server refused (the bucket's stream no longer allows atomic
// batches) and a conflicting request wrote nothing, and their errors do
// not match ErrOutcomeUnknown.
func TestEnqueueRefusedWriteIsNotOutcomeUnknown(t *testing.T) {
	t.Parallel()
	s := natstest.Run(t)
	st, js := newTestNATSStore(t, s, nil)
	c := newOutcomeClient(t, s, st)
	ctx := context.Background()

	_, err := c.Enqueue(ctx, outcomeRequest("A"))
	require.NoError(t, err)
	conflicting := outcomeRequest("A")
	conflicting.Fingerprint = "another"
	_, err = c.Enqueue(ctx, conflicting)
	require.ErrorIs(t, err, ErrConflict)
	assert.NotErrorIs(t, err, ErrOutcomeUnknown)

	stream, err := js.Stream(ctx, "KV_"+st.Bucket())
	require.NoError(t, err)
	cfg := stream.CachedInfo().Config
	cfg.AllowAtomicPublish = false
	_, err = js.UpdateStream(ctx, cfg)
	require.NoError(t, err)
	_, err = c.Enqueue(ctx, outcomeRequest("B"))
	require.Error(t, err)
	t.Logf("the refused enqueue's error: %v", err)
	var apiErr *jetstream.APIError
	require.ErrorAs(t, err, &apiErr, "the server's answer")
	assert.NotErrorIs(t, err, ErrOutcomeUnknown, "the server refused the batch: %v", err)
	_, err = st.Get(ctx, "ch", "B")
	assert.ErrorIs(t, err, ErrNotFound, "the refused write wrote nothing")
}
