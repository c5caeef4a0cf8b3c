package jscas

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jobkeys/jobkeys/internal/natstest"
)

// Write is kv.Update (and kv.Delete with LastRevision) on the same bucket:
// the same revisions, the same markers, the same errors.
func TestWriterWrite(t *testing.T) {
	t.Parallel()
	s := natstest.Run(t)
	nc, js := natstest.Connect(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "B", History: 5, Storage: jetstream.MemoryStorage})
	require.NoError(t, err)
	w := Writer{Conn: nc, Stream: "KV_B", Timeout: js.Options().DefaultTimeout}
	prefix := WritePrefix(js.Options(), "B")
	require.Equal(t, "$KV.B.", prefix)

	rev, err := w.Write(ctx, prefix+"k", []byte("v1"), 0, false) // create: no message yet
	require.NoError(t, err)
	rev2, err := w.Write(context.Background(), prefix+"k", []byte("v2"), rev, false) // no deadline: Timeout
	require.NoError(t, err)
	assert.Greater(t, rev2, rev)
	e, err := kv.Get(ctx, "k")
	require.NoError(t, err)
	assert.Equal(t, rev2, e.Revision())
	assert.Equal(t, "v2", string(e.Value()))

	// A conflict fails as kv.Update's does.
	_, err = w.Write(ctx, prefix+"k", []byte("v3"), rev, false)
	require.Error(t, err)
	assert.True(t, IsConflict(err), "%v", err)
	assert.ErrorIs(t, err, jetstream.ErrKeyRevisionMismatch)
	var apiErr *jetstream.APIError
	require.ErrorAs(t, err, &apiErr)
	assert.Equal(t, jetstream.JSErrCodeStreamWrongLastSequence, apiErr.ErrorCode)
	_, kvErr := kv.Update(ctx, "k", []byte("v3"), rev)
	assert.Equal(t, kvErr.Error(), err.Error(), "kv.Update's error")
	_, err = w.Write(ctx, prefix+"other", []byte("v"), rev2, false)
	assert.True(t, IsConflict(err), "a revision of a key that has none: %v", err)

	// A delete marker, which the KV layer reads as a deleted key.
	del, err := w.Write(ctx, prefix+"k", nil, rev2, true)
	require.NoError(t, err)
	assert.Greater(t, del, rev2)
	_, err = kv.Get(ctx, "k")
	assert.ErrorIs(t, err, jetstream.ErrKeyNotFound)
	hist, err := kv.History(ctx, "k")
	require.NoError(t, err)
	require.Len(t, hist, 3)
	assert.Equal(t, jetstream.KeyValueDelete, hist[2].Operation())
	assert.Equal(t, del, hist[2].Revision())
	_, err = w.Write(ctx, prefix+"k", nil, rev2, true)
	assert.ErrorIs(t, err, jetstream.ErrKeyRevisionMismatch, "a marker over an old revision")

	// The end of ctx is its error.
	ended, stop := context.WithCancel(ctx)
	stop()
	_, err = w.Write(ended, prefix+"k", []byte("v4"), del, false)
	assert.ErrorIs(t, err, context.Canceled)
}

// A subject no stream answers fails, after js.PublishMsg's retries, with
// jetstream.ErrNoStreamResponse, as kv.Update does.
func TestWriterNoStream(t *testing.T) {
	t.Parallel()
	s := natstest.Run(t)
	nc, js := natstest.Connect(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "GONE", Storage: jetstream.MemoryStorage})
	require.NoError(t, err)
	rev, err := kv.Put(ctx, "k", []byte("v1"))
	require.NoError(t, err)
	require.NoError(t, js.DeleteKeyValue(ctx, "GONE"))

	w := Writer{Conn: nc, Stream: "KV_GONE", Timeout: js.Options().DefaultTimeout}
	_, err = w.Write(ctx, "$KV.GONE.k", []byte("v2"), rev, false)
	assert.ErrorIs(t, err, jetstream.ErrNoStreamResponse)
	assert.False(t, IsConflict(err))
	_, kvErr := kv.Update(ctx, "k", []byte("v2"), rev)
	assert.ErrorIs(t, kvErr, jetstream.ErrNoStreamResponse, "kv.Update's error too")
}

func TestWritePrefix(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		opts jetstream.JetStreamOptions
		want string
	}{
		{jetstream.JetStreamOptions{}, "$KV.B."},
		{jetstream.JetStreamOptions{APIPrefix: "$JS.API"}, "$KV.B."},
		{jetstream.JetStreamOptions{APIPrefix: "$JS.API."}, "$KV.B."},
		{jetstream.JetStreamOptions{Domain: "hub"}, "$JS.hub.API.$KV.B."},
		{jetstream.JetStreamOptions{APIPrefix: "$JS.hub.API"}, "$JS.hub.API.$KV.B."},
		{jetstream.JetStreamOptions{APIPrefix: "imported.JS.API."}, "imported.JS.API.$KV.B."},
	} {
		assert.Equal(t, tc.want, WritePrefix(tc.opts, "B"), "%+v", tc.opts)
	}
}

// TestAPIPrefix: the API subject prefix of a JetStream context's options.
func TestAPIPrefix(t *testing.T) {
	t.Parallel()
	assert.Equal(t, "$JS.API.", APIPrefix(jetstream.JetStreamOptions{}))
	assert.Equal(t, "$JS.hub.API.", APIPrefix(jetstream.JetStreamOptions{Domain: "hub"}))
	assert.Equal(t, "JS.acme.", APIPrefix(jetstream.JetStreamOptions{APIPrefix: "JS.acme"}))
	assert.Equal(t, "JS.acme.", APIPrefix(jetstream.JetStreamOptions{APIPrefix: "JS.acme."}))
}
