package kvstream

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jobkeys/jobkeys/internal/natstest"
)

func TestCheckStorage(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		storage  jetstream.StorageType
		replicas int
		err      string
	}{
		{jetstream.FileStorage, 1, ""},
		{jetstream.MemoryStorage, 5, ""},
		{jetstream.StorageType(7), 1, "unknown storage type 7"},
		{jetstream.FileStorage, 0, "replicas 0 is not between 1 and 5"},
		{jetstream.MemoryStorage, 6, "replicas 6 is not between 1 and 5"},
	} {
		err := CheckStorage(tc.storage, tc.replicas)
		if tc.err == "" {
			assert.NoError(t, err, "%v R%d", tc.storage, tc.replicas)
		} else {
			assert.EqualError(t, err, tc.err)
		}
	}
}

// Create creates a missing bucket, and opens one another process created
// first with another configuration; Allow turns on what it is asked for,
// once, and reports the stream's settings as they are then.
func TestCreateAndAllow(t *testing.T) {
	t.Parallel()
	s := natstest.Run(t)
	_, js := natstest.Connect(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	kv, created, err := Create(ctx, js, jetstream.KeyValueConfig{Bucket: "B", History: 1, Storage: jetstream.MemoryStorage})
	require.NoError(t, err)
	assert.True(t, created)
	assert.Equal(t, "B", kv.Bucket())
	again, created, err := Create(ctx, js, jetstream.KeyValueConfig{Bucket: "B", History: 5, Storage: jetstream.MemoryStorage})
	require.NoError(t, err, "a bucket created first with another configuration is opened")
	assert.False(t, created)
	status, err := again.Status(ctx)
	require.NoError(t, err)
	assert.Equal(t, int64(1), status.History(), "the first configuration stands")

	stream, err := js.Stream(ctx, "KV_B")
	require.NoError(t, err)
	require.False(t, stream.CachedInfo().Config.AllowAtomicPublish)
	info, err := Allow(ctx, js, stream, Features{AtomicPublish: true})
	require.NoError(t, err)
	assert.True(t, info.Config.AllowAtomicPublish)
	assert.False(t, info.Config.AllowMsgTTL, "not asked for")
	stream, err = js.Stream(ctx, "KV_B")
	require.NoError(t, err)
	info, err = Allow(ctx, js, stream, Features{AtomicPublish: true, MsgTTL: true})
	require.NoError(t, err)
	assert.True(t, info.Config.AllowAtomicPublish)
	assert.True(t, info.Config.AllowMsgTTL)
	stored, err := js.Stream(ctx, "KV_B")
	require.NoError(t, err)
	assert.True(t, stored.CachedInfo().Config.AllowMsgTTL, "as stored")

	// A stream that is gone: the error names it and what was asked.
	require.NoError(t, js.DeleteKeyValue(ctx, "B"))
	_, err = Allow(ctx, js, stream, Features{AtomicPublish: true, MsgTTL: false})
	require.NoError(t, err, "nothing to turn on: no request")
	_, err = Allow(ctx, js, stream, Features{AtomicPublish: true, MsgTTL: true})
	require.Error(t, err)
	assert.Contains(t, err.Error(), `allow atomic publish and per-message TTL on stream "KV_B"`)
	assert.ErrorIs(t, err, jetstream.ErrStreamNotFound)
}

// ParseMsgGet reads the server's own STREAM.MSG.GET replies: a value, a
// delete marker (Deleted), a key with no message, and an API error.
func TestParseMsgGet(t *testing.T) {
	t.Parallel()
	s := natstest.Run(t)
	nc, js := natstest.Connect(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "G", History: 1, Storage: jetstream.MemoryStorage})
	require.NoError(t, err)
	rev, err := kv.Put(ctx, "k", []byte("v1"))
	require.NoError(t, err)
	require.NoError(t, kv.Delete(ctx, "gone"))

	get := func(stream, subject string) []byte {
		t.Helper()
		req, err := LastBySubjectRequest(subject)
		require.NoError(t, err)
		reply, err := nc.RequestWithContext(ctx, "$JS.API.STREAM.MSG.GET."+stream, req)
		require.NoError(t, err)
		return reply.Data
	}

	m, found, err := ParseMsgGet(get("KV_G", "$KV.G.k"))
	require.NoError(t, err)
	require.True(t, found)
	assert.Equal(t, rev, m.Seq)
	assert.Equal(t, "v1", string(m.Data))
	assert.Equal(t, "$KV.G.k", m.Subject)
	assert.WithinDuration(t, time.Now(), m.Time, time.Hour, "the server's stamp is read")
	deleted, err := Deleted(m.Hdrs)
	require.NoError(t, err)
	assert.False(t, deleted)

	m, found, err = ParseMsgGet(get("KV_G", "$KV.G.gone"))
	require.NoError(t, err)
	require.True(t, found)
	deleted, err = Deleted(m.Hdrs)
	require.NoError(t, err)
	assert.True(t, deleted, "a delete marker")

	_, found, err = ParseMsgGet(get("KV_G", "$KV.G.none"))
	require.NoError(t, err)
	assert.False(t, found, "no message: not an error")

	_, _, err = ParseMsgGet(get("KV_NONE", "$KV.NONE.k"))
	var apiErr *jetstream.APIError
	require.ErrorAs(t, err, &apiErr)
	assert.Equal(t, jetstream.JSErrCodeStreamNotFound, apiErr.ErrorCode)

	_, _, err = ParseMsgGet([]byte("not json"))
	assert.ErrorContains(t, err, "bad response: ")
	_, _, err = ParseMsgGet([]byte(`{}`))
	assert.EqualError(t, err, "response without a message")
	_, err = Deleted([]byte("garbage"))
	assert.ErrorContains(t, err, "bad headers: ")
	assert.True(t, IsMarker(nats.Header{"KV-Operation": []string{"PURGE"}}))
	assert.False(t, IsMarker(nats.Header{}))
}

// LastBySubjectRequest writes what encoding/json would for any subject.
func TestLastBySubjectRequest(t *testing.T) {
	t.Parallel()
	for _, subj := range []string{"$KV.B.active.ch.>", "$KV.B.job.ch.j-1_x", "a\"b\\c\x01ü", ""} {
		b, err := LastBySubjectRequest(subj)
		require.NoError(t, err)
		var got struct {
			LastBySubj string `json:"last_by_subj"`
		}
		require.NoError(t, json.Unmarshal(b, &got), "%s", b)
		assert.Equal(t, subj, got.LastBySubj)
	}
	b, err := LastBySubjectRequest("$KV.B.k")
	require.NoError(t, err)
	assert.Equal(t, `{"last_by_subj":"$KV.B.k"}`, string(b), "a KV subject as the stores always sent it")

	out, ok := AppendSubject([]byte("x"), `a"b`)
	assert.False(t, ok, "a subject that needs an escape")
	assert.Equal(t, "x", string(out), "b unchanged")
	out, ok = AppendSubject([]byte("x"), "$KV.B.k")
	assert.True(t, ok)
	assert.Equal(t, `x"$KV.B.k"`, string(out))
}
