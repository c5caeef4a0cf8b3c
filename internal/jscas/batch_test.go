package jscas

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/synadia-io/orbit.go/jetstreamext"

	"github.com/jobkeys/jobkeys/internal/natstest"
)

// atomicBucket creates KV bucket name on memory storage and allows atomic
// publish on its stream (KeyValueConfig has no field for it).
func atomicBucket(t testing.TB, ctx context.Context, js jetstream.JetStream, name string, allow bool) jetstream.KeyValue {
	t.Helper()
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: name, History: 64, Storage: jetstream.MemoryStorage})
	require.NoError(t, err)
	if allow {
		stream, err := js.Stream(ctx, "KV_"+name)
		require.NoError(t, err)
		cfg := stream.CachedInfo().Config
		cfg.AllowAtomicPublish = true
		_, err = js.UpdateStream(ctx, cfg)
		require.NoError(t, err)
	}
	return kv
}

// TestWriterWriteBatch: a batch's messages are stored at consecutive
// sequences ending at the one WriteBatch returns, each as Write would store
// it plus the batch headers, the condition on the first only; a batch
// whose condition fails writes nothing.
func TestWriterWriteBatch(t *testing.T) {
	t.Parallel()
	s := natstest.Run(t)
	nc, js := natstest.Connect(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	kv := atomicBucket(t, ctx, js, "B", true)
	w := Writer{Conn: nc, Stream: "KV_B", Timeout: js.Options().DefaultTimeout}
	prefix := WritePrefix(js.Options(), "B")

	rev, err := w.Write(ctx, prefix+"k", []byte("v0"), 0, false)
	require.NoError(t, err)
	_, err = w.Write(ctx, prefix+"other", []byte("o"), 0, false) // the stream's sequence is past k's
	require.NoError(t, err)

	values := [][]byte{[]byte("v1"), []byte("v2"), []byte("v3")}
	last, err := w.WriteBatch(context.Background(), prefix+"k", values, rev, false) // no deadline: Timeout
	require.NoError(t, err)
	assert.Equal(t, rev+4, last, "three messages after k's and other's")
	hist, err := kv.History(ctx, "k")
	require.NoError(t, err)
	require.Len(t, hist, 4)
	var id string
	for i, v := range values {
		seq := last - uint64(len(values)-1) + uint64(i)
		assert.Equal(t, seq, hist[i+1].Revision(), "message %d's revision", i)
		assert.Equal(t, string(v), string(hist[i+1].Value()))
		m := natstest.ReadStored(t, nc, "KV_B", seq)
		hdr, err := nats.DecodeHeadersMsg(m.Hdrs)
		require.NoError(t, err)
		if i == 0 {
			assert.Equal(t, strconv.FormatUint(rev, 10), hdr.Get(jetstream.ExpectedLastSubjSeqHeader), "the first message's condition")
			id = hdr.Get(batchIDHeader)
			assert.NotEmpty(t, id)
		} else {
			assert.Empty(t, hdr.Values(jetstream.ExpectedLastSubjSeqHeader), "message %d has no condition", i)
		}
		assert.Equal(t, id, hdr.Get(batchIDHeader), "message %d: one batch", i)
		assert.Equal(t, strconv.Itoa(i+1), hdr.Get(batchSeqHeader))
		if i == len(values)-1 {
			assert.Equal(t, "1", hdr.Get(batchCommitHeader))
		}
		delete(hdr, jetstream.ExpectedLastSubjSeqHeader)
		delete(hdr, batchIDHeader)
		delete(hdr, batchSeqHeader)
		delete(hdr, batchCommitHeader)
		assert.Empty(t, hdr, "message %d: no other header", i)
	}

	// A failed condition writes nothing.
	info, err := js.Stream(ctx, "KV_B")
	require.NoError(t, err)
	before := info.CachedInfo().State.LastSeq
	_, err = w.WriteBatch(ctx, prefix+"k", values, rev, false)
	require.Error(t, err)
	assert.True(t, IsConflict(err), "%v", err)
	assert.ErrorIs(t, err, jetstream.ErrKeyRevisionMismatch)
	assert.False(t, IsBatchRefused(err))
	si, err := info.Info(ctx)
	require.NoError(t, err)
	assert.Equal(t, before, si.State.LastSeq, "nothing written")

	// A batch ending in a delete marker.
	del, err := w.WriteBatch(ctx, prefix+"k", [][]byte{[]byte("v4"), []byte("ignored")}, last, true)
	require.NoError(t, err)
	assert.Equal(t, before+2, del)
	_, err = kv.Get(ctx, "k")
	assert.ErrorIs(t, err, jetstream.ErrKeyNotFound)
	hist, err = kv.History(ctx, "k")
	require.NoError(t, err)
	assert.Equal(t, "v4", string(hist[len(hist)-2].Value()))
	assert.Equal(t, jetstream.KeyValueDelete, hist[len(hist)-1].Operation())
	assert.Empty(t, hist[len(hist)-1].Value())

	// A batch of one message commits at once.
	one, err := w.WriteBatch(ctx, prefix+"k", [][]byte{[]byte("v5")}, del, false)
	require.NoError(t, err)
	assert.Equal(t, del+1, one)
	_, err = w.WriteBatch(ctx, prefix+"k", nil, one, false)
	assert.Error(t, err, "no messages")
}

// TestWriterWriteBatchNotAllowed: a stream without atomic publish refuses
// the batch, and nothing is written.
func TestWriterWriteBatchNotAllowed(t *testing.T) {
	t.Parallel()
	s := natstest.Run(t)
	nc, js := natstest.Connect(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	kv := atomicBucket(t, ctx, js, "N", false)
	w := Writer{Conn: nc, Stream: "KV_N", Timeout: js.Options().DefaultTimeout}
	rev, err := kv.Put(ctx, "k", []byte("v0"))
	require.NoError(t, err)
	_, err = w.WriteBatch(ctx, "$KV.N.k", [][]byte{[]byte("v1"), []byte("v2")}, rev, false)
	require.Error(t, err)
	assert.True(t, IsBatchRefused(err), "%v", err)
	assert.True(t, IsBatchDisabled(err), "%v", err)
	assert.False(t, IsConflict(err))
	e, err := kv.Get(ctx, "k")
	require.NoError(t, err)
	assert.Equal(t, rev, e.Revision(), "nothing written")
}

// TestParseBatchAck reads batch acknowledgements: the server's template
// by hand, anything else through encoding/json.
func TestParseBatchAck(t *testing.T) {
	t.Parallel()
	const stream, id = "KV_B", "ID1"
	for _, tc := range []struct {
		ack         string
		last, count uint64
		fast        bool
	}{
		{`{"stream":"KV_B","seq":42,"batch":"ID1","count":3}`, 42, 3, true},
		{`{"stream":"KV_B","domain":"hub","seq":7,"batch":"ID1","count":2}`, 7, 2, true},
		{`{"stream":"KV_B","seq":42,"batch":"ID1","count":03}`, 0, 0, false}, // not JSON either
		{`{"count":3,"batch":"ID1","seq":42,"stream":"KV_B"}`, 42, 3, false},
	} {
		last, count, fast := parseBatchAckTemplate([]byte(tc.ack), stream, id)
		assert.Equal(t, tc.fast, fast, "read by hand: %s", tc.ack)
		if fast {
			assert.Equal(t, [2]uint64{tc.last, tc.count}, [2]uint64{last, count}, tc.ack)
		}
		if tc.last == 0 {
			_, _, err := ParseBatchAck([]byte(tc.ack), stream, id)
			assert.ErrorIs(t, err, jetstream.ErrInvalidJSAck, tc.ack)
			continue
		}
		last, count, err := ParseBatchAck([]byte(tc.ack), stream, id)
		require.NoError(t, err, tc.ack)
		assert.Equal(t, [2]uint64{tc.last, tc.count}, [2]uint64{last, count}, tc.ack)
	}
	for _, bad := range []string{
		`{"stream":"KV_B","seq":42}`, // not a batch's
		`{"stream":"KV_B","seq":42,"batch":"ID2","count":3}`,
		`{"stream":"","seq":42,"batch":"ID1","count":3}`,
		`{"stream":"KV_B","seq":42,"batch":"ID1"}`,
	} {
		_, _, err := ParseBatchAck([]byte(bad), stream, id)
		assert.ErrorIs(t, err, jetstream.ErrInvalidJSAck, bad)
	}
	_, _, err := ParseBatchAck([]byte(`{"error":{"code":400,"err_code":10071,"description":"wrong last sequence: 5"},"stream":"KV_B","seq":0}`), stream, id)
	assert.True(t, IsConflict(err), "%v", err)
	_, _, err = ParseBatchAck([]byte(`{"error":{"code":429,"err_code":10210,"description":"atomic publish too many inflight"},"stream":"KV_B","seq":0}`), stream, id)
	assert.True(t, IsBatchRefused(err), "%v", err)
	assert.False(t, IsBatchDisabled(err), "%v", err)
}

// BenchmarkWriteBatch compares a batch of 2 and 8 messages written by
// WriteBatch with jetstreamext.PublishMsgBatch (no flow control, as the
// jobs package sends it) and with as many single Writes, on a memory
// bucket.
func BenchmarkWriteBatch(b *testing.B) {
	s := natstest.Run(b)
	nc, js := natstest.Connect(b, s)
	ctx := context.Background()
	atomicBucket(b, ctx, js, "BB", true)
	w := Writer{Conn: nc, Stream: "KV_BB", Timeout: js.Options().DefaultTimeout}
	value := make([]byte, 300)
	for _, n := range []int{2, 8} {
		values := make([][]byte, n)
		for i := range values {
			values[i] = value
		}
		key := "k" + strconv.Itoa(n)
		rev, err := w.Write(ctx, "$KV.BB."+key, value, 0, false)
		require.NoError(b, err)
		b.Run("jscas-"+strconv.Itoa(n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if rev, err = w.WriteBatch(ctx, "$KV.BB."+key, values, rev, false); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run("jetstreamext-"+strconv.Itoa(n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				msgs := make([]*nats.Msg, n)
				for i := range msgs {
					msgs[i] = nats.NewMsg("$KV.BB." + key)
					msgs[i].Data = value
				}
				msgs[0].Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(rev, 10))
				ack, err := jetstreamext.PublishMsgBatch(ctx, js, msgs, jetstreamext.BatchFlowControl{AckFirst: false, AckTimeout: js.Options().DefaultTimeout})
				if err != nil {
					b.Fatal(err)
				}
				rev = ack.Sequence
			}
		})
		b.Run("single-writes-"+strconv.Itoa(n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				for range n {
					if rev, err = w.Write(ctx, "$KV.BB."+key, value, rev, false); err != nil {
						b.Fatal(err)
					}
				}
			}
		})
	}
}
