package jobkeys

// Server limits on atomic batches (review): a batch with more writers than
// the server takes is refused as a batch, having written nothing, and its
// operations are written one at a time.

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jobkeys/jobkeys/internal/natstest"
)

// A server whose max_batch_size is below a batch's writers refuses the
// batch (10199): every operation still gets the serial run's outcome, each
// writer its own revision, one write each.
func TestNATSStoreBatchOverServerLimit(t *testing.T) {
	t.Parallel()
	srv := natstest.RunWith(t, natstest.Options{Configure: func(o *server.Options) { o.JetStreamLimits.MaxBatchSize = 2 }})
	nc, js := natstest.Connect(t, srv)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	policy := Policy{Key: benchPolicy.Key, MaxActive: 1, MaxQueuedPerKey: 16}
	bucket := natsAtomicBucket(t, ctx, js, "bclimit", jetstream.MemoryStorage, true)
	st, err := NewNATSStore(js)
	require.NoError(t, err)
	b := newBCRig(t, st, "bclimit", policy)
	require.True(t, st.batches("bclimit", b.key.KVKey))
	s, err := js.Stream(ctx, "KV_"+bucket)
	require.NoError(t, err)
	from := s.CachedInfo().State.LastSeq + 1
	singles := b.store.singles.Load()
	res := b.batched([]bcOp{b.admit("a"), b.admit("b"), b.admit("c"), bcReleaseHeld, b.acquire("a")})
	for i, got := range res {
		require.NoError(t, got.err, "operation %d", i)
	}
	hist, _ := bcNATSHistory(t, ctx, nc, js, "KV_"+bucket, from)
	bcCheckRevisions(t, res, hist, 0)
	assert.Equal(t, int64(1), b.store.groups.Load(), "one batch tried")
	assert.Equal(t, singles+5, b.store.singles.Load(), "then one write each")
	assert.True(t, st.batches("bclimit", b.key.KVKey), "a batch too large for the server leaves batching on")
}
