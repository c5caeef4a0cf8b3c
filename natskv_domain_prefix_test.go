package jobkeys

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jobkeys/jobkeys/internal/natstest"
)

// TestNATSStoreDomainAndAPIPrefix: over a JetStream context whose options
// name both a domain and an API prefix, the store writes its keys under
// the prefix nats.go itself uses there (the one its constructor was
// given), so that its own writes, single and batched, reach the bucket.
func TestNATSStoreDomainAndAPIPrefix(t *testing.T) {
	t.Parallel()
	_, contexts := natstest.RunDomainAndPrefix(t, "hub")
	for _, tc := range contexts {
		t.Run(tc.Name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			st, err := NewNATSStore(tc.JS, WithCreateBuckets(jetstream.MemoryStorage, 1))
			require.NoError(t, err)
			svc := jkService("prefix")
			const key = "svc.job.k"
			rev, err := st.Create(ctx, svc, key, []byte("v1"))
			require.NoError(t, err)
			b, err := st.bucket(ctx, svc)
			require.NoError(t, err)
			require.True(t, b.directWrites(key), "the store writes the key itself")
			assert.Equal(t, tc.WritePrefix+"$KV."+st.BucketName(svc)+".", b.writePrefix, "kv.Update's subjects")

			rev, err = st.Update(ctx, svc, key, []byte("v2"), rev)
			require.NoError(t, err, "a write of the store's own")
			require.True(t, st.Batches(svc, key), "memory storage: atomic batches")
			rev, err = st.WriteBatch(ctx, svc, key, [][]byte{[]byte("v3"), []byte("v4")}, rev, false)
			require.NoError(t, err, "an atomic batch of the store's own")
			value, got, err := st.Get(ctx, svc, key)
			require.NoError(t, err)
			assert.Equal(t, "v4", string(value))
			assert.Equal(t, rev, got)
			require.NoError(t, st.Delete(ctx, svc, key, rev))
			_, _, err = st.Get(ctx, svc, key)
			assert.ErrorIs(t, err, ErrKeyNotFound)
		})
	}
}
