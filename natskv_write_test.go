package jobkeys

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jobkeys/jobkeys/internal/natstest"
)

// The store's own writes (natskv_write.go) store exactly what nats.go's KV
// layer stores: the same subject, header block and data for an update, a
// delete marker and a create over a delete marker, also behind a JetStream
// domain or API prefix.
func TestNATSStoreWritesAsKVLayer(t *testing.T) {
	t.Parallel()
	nc, contexts := natstest.RunDomain(t, "hub")
	for _, tc := range contexts {
		t.Run(tc.Name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			st, err := NewNATSStore(tc.JS, WithCreateBuckets(jetstream.MemoryStorage, 1))
			require.NoError(t, err)
			oldSvc, newSvc := jkService("write-kv"), jkService("write-own")
			const key = "svc.job.k"
			for _, svc := range []string{oldSvc, newSvc} { // history 10: every write stays readable
				_, err := tc.JS.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: st.BucketName(svc), History: 10, Storage: jetstream.MemoryStorage})
				require.NoError(t, err)
			}

			// The KV layer, as the store wrote before natskv_write.go (its
			// Delete published kv.Delete's marker itself, to learn the
			// revision).
			kv, err := st.KeyValue(ctx, oldSvc)
			require.NoError(t, err)
			var oldRevs []uint64
			r, err := kv.Create(ctx, key, []byte("v1"))
			require.NoError(t, err)
			oldRevs = append(oldRevs, r)
			r, err = kv.Update(ctx, key, []byte("v2"), r)
			require.NoError(t, err)
			oldRevs = append(oldRevs, r)
			require.NoError(t, kv.Delete(ctx, key, jetstream.LastRevision(r)))
			r, err = kv.Create(ctx, key, []byte("v3")) // over the marker (revision 3)
			require.NoError(t, err)
			oldRevs = append(oldRevs, r)
			r, err = kv.Update(ctx, key, []byte("v4"), r)
			require.NoError(t, err)
			oldRevs = append(oldRevs, r)
			require.NoError(t, kv.Delete(ctx, key, jetstream.LastRevision(r)))

			// The store, writing on the connection itself.
			var newRevs []uint64
			r, err = st.Create(ctx, newSvc, key, []byte("v1")) // no marker: kv.Create
			require.NoError(t, err)
			newRevs = append(newRevs, r)
			b, err := st.bucket(ctx, newSvc)
			require.NoError(t, err)
			require.True(t, b.directWrites(key), "the store writes the key itself")
			require.Equal(t, tc.WritePrefix+"$KV."+st.BucketName(newSvc)+".", b.writePrefix)
			r, err = st.Update(ctx, newSvc, key, []byte("v2"), r)
			require.NoError(t, err)
			newRevs = append(newRevs, r)
			require.NoError(t, st.Delete(ctx, newSvc, key, r))
			r, err = st.Create(ctx, newSvc, key, []byte("v3")) // over the marker it remembers
			require.NoError(t, err)
			newRevs = append(newRevs, r)
			r, err = st.Update(ctx, newSvc, key, []byte("v4"), r)
			require.NoError(t, err)
			newRevs = append(newRevs, r)
			require.NoError(t, st.Delete(ctx, newSvc, key, r))

			assert.Equal(t, []uint64{1, 2, 4, 5}, oldRevs, "KV layer revisions")
			assert.Equal(t, oldRevs, newRevs, "the store returns the revisions the KV layer returns")
			oldBucket, newBucket := st.BucketName(oldSvc), st.BucketName(newSvc)
			for seq := uint64(1); seq <= 6; seq++ {
				want := natstest.ReadStored(t, nc, "KV_"+oldBucket, seq)
				got := natstest.ReadStored(t, nc, "KV_"+newBucket, seq)
				assert.Equal(t, want.Subject, strings.Replace(got.Subject, newBucket, oldBucket, 1), "subject of message %d", seq)
				assert.Equal(t, want.Data, got.Data, "data of message %d", seq)
				wantHdr, err := nats.DecodeHeadersMsg(want.Hdrs)
				require.NoError(t, err)
				gotHdr, err := nats.DecodeHeadersMsg(got.Hdrs)
				require.NoError(t, err)
				assert.Equal(t, wantHdr, gotHdr, "headers of message %d", seq)
				if len(wantHdr) == 1 {
					// One header: one possible order, so the bytes match too.
					// (nats.go writes several in map order.)
					assert.Equal(t, string(want.Hdrs), string(got.Hdrs), "header block of message %d", seq)
				}
			}
			marker := natstest.ReadStored(t, nc, "KV_"+newBucket, 3)
			hdr, err := nats.DecodeHeadersMsg(marker.Hdrs)
			require.NoError(t, err)
			assert.Equal(t, "DEL", hdr.Get("KV-Operation"), "message 3 is a delete marker")
			assert.Equal(t, "2", hdr.Get(jetstream.ExpectedLastSubjSeqHeader))

			// Conflicts fail as kv.Update's do: the API error with its code,
			// ErrKeyRevisionMismatch, and the store's ErrRevisionConflict.
			_, err = st.Update(ctx, newSvc, key, []byte("v5"), 5)
			assert.ErrorIs(t, err, ErrRevisionConflict)
			assert.ErrorIs(t, err, jetstream.ErrKeyRevisionMismatch)
			var apiErr *jetstream.APIError
			require.ErrorAs(t, err, &apiErr)
			assert.Equal(t, jetstream.JSErrCodeStreamWrongLastSequence, apiErr.ErrorCode)
			_, raw := kv.Update(ctx, key, []byte("v5"), 5)
			assert.ErrorIs(t, raw, jetstream.ErrKeyRevisionMismatch)
			assert.Contains(t, err.Error(), raw.Error(), "the KV layer's error, wrapped")
			assert.ErrorIs(t, st.Delete(ctx, newSvc, key, 5), ErrRevisionConflict)
		})
	}
}

// A write to a bucket whose stream is gone fails as kv.Update does: after
// js.PublishMsg's retries, with jetstream.ErrNoStreamResponse.
func TestNATSStoreWriteNoStream(t *testing.T) {
	t.Parallel()
	n := startJKNATS(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st := n.store(t)
	svc := jkService("write-gone")
	rev, err := st.Create(ctx, svc, "k", []byte("v1"))
	require.NoError(t, err)
	require.NoError(t, n.js.DeleteKeyValue(ctx, st.BucketName(svc)))

	_, err = st.Update(ctx, svc, "k", []byte("v2"), rev)
	assert.ErrorIs(t, err, jetstream.ErrNoStreamResponse)
	assert.NotErrorIs(t, err, ErrRevisionConflict)
	assert.ErrorIs(t, st.Delete(ctx, svc, "k", rev), jetstream.ErrNoStreamResponse)
}
