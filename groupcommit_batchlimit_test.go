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
	require.True(t, st.Batches("bclimit", b.key.KVKey))
	s, err := js.Stream(ctx, "KV_"+bucket)
	require.NoError(t, err)
	from := s.CachedInfo().State.LastSeq + 1
	singles := b.calls.singles.Load()
	res := b.batched([]bcOp{b.admit("a"), b.admit("b"), b.admit("c"), bcReleaseHeld, b.acquire("a")})
	for i, got := range res {
		require.NoError(t, got.err, "operation %d", i)
	}
	hist, _ := bcNATSHistory(t, ctx, nc, js, "KV_"+bucket, from)
	bcCheckRevisions(t, res, hist, 0)
	assert.Equal(t, int64(1), b.calls.groups.Load(), "one batch tried")
	assert.Equal(t, singles+5, b.calls.singles.Load(), "then one write each")
	assert.True(t, st.Batches("bclimit", b.key.KVKey), "a batch too large for the server leaves batching on")
}

// A batch behind a JetStream domain or API prefix is one atomic batch on
// the domain's subjects: consecutive revisions, all or nothing, as on the
// default API.
func TestNATSStoreBatchBehindDomain(t *testing.T) {
	t.Parallel()
	nc, contexts := natstest.RunDomain(t, "hub")
	for i, tc := range contexts {
		t.Run(tc.Name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			svc := "bcdomain" + string(rune('a'+i))
			bucket := natsAtomicBucket(t, ctx, tc.JS, svc, jetstream.MemoryStorage, true)
			st, err := NewNATSStore(tc.JS)
			require.NoError(t, err)
			key := svc + ".t.k"
			rev, err := st.Create(ctx, svc, key, []byte("v0"))
			require.NoError(t, err)
			require.True(t, st.Batches(svc, key))
			last, err := st.WriteBatch(ctx, svc, key, [][]byte{[]byte("v1"), []byte("v2"), []byte("v3")}, rev, false)
			require.NoError(t, err)
			assert.Equal(t, rev+3, last, "three consecutive revisions")
			hist, _ := bcNATSHistory(t, ctx, nc, tc.JS, "KV_"+bucket, rev+1)
			require.Len(t, hist, 3)
			for j, c := range hist {
				assert.Equal(t, "v"+string(rune('1'+j)), string(c.Value))
			}
			_, err = st.WriteBatch(ctx, svc, key, [][]byte{[]byte("x"), []byte("y")}, rev, true)
			require.ErrorIs(t, err, ErrRevisionConflict)
			last, err = st.WriteBatch(ctx, svc, key, [][]byte{[]byte("v4"), nil}, rev+3, true)
			require.NoError(t, err)
			_, _, err = st.Get(ctx, svc, key)
			require.ErrorIs(t, err, ErrKeyNotFound, "deleted by the batch's last message")
			assert.Equal(t, rev+5, last)
		})
	}
}
