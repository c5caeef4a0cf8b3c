package jscas

import (
	"encoding/json"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestParsePubAck reads publish acknowledgements as jetstream's PublishMsg
// does: the server's success template by hand, everything else through
// encoding/json, with its errors.
func TestParsePubAck(t *testing.T) {
	t.Parallel()
	const stream = "KV_JOBS_KEYS_s"
	for _, tc := range []struct {
		ack  string
		seq  uint64
		fast bool // read by hand, without encoding/json
	}{
		{`{"stream":"KV_JOBS_KEYS_s","seq":42}`, 42, true},
		{`{"stream":"KV_JOBS_KEYS_s","domain":"hub","seq":7}`, 7, true},
		{`{"stream":"KV_JOBS_KEYS_s","seq":0}`, 0, true},
		{`{"stream":"KV_JOBS_KEYS_s","seq":18446744073709551615}`, 1<<64 - 1, false}, // 20 digits
		{`{"stream":"KV_JOBS_KEYS_s","seq":1,"duplicate": true}`, 1, false},
		{`{"stream":"other","seq":3}`, 3, false},
		{`{"stream":"KV_JOBS_KEYS_s_x","seq":3}`, 3, false},
		{`{"seq":3,"stream":"KV_JOBS_KEYS_s"}`, 3, false},
		{` {"stream":"KV_JOBS_KEYS_s","seq":9}`, 9, false},
		{`{ "stream": "KV_JOBS_KEYS_s", "seq": 45 }`, 45, false},
	} {
		seq, fast := parseAckTemplate([]byte(tc.ack), stream)
		assert.Equal(t, tc.fast, fast, "read by hand: %s", tc.ack)
		if fast {
			assert.Equal(t, tc.seq, seq, "hand-read sequence of %s", tc.ack)
		}
		seq, err := ParsePubAck([]byte(tc.ack), stream)
		require.NoError(t, err, tc.ack)
		assert.Equal(t, tc.seq, seq, tc.ack)
	}

	_, err := ParsePubAck([]byte(`{"error":{"code":400,"err_code":10071,"description":"wrong last sequence: 5"},"stream":"KV_JOBS_KEYS_s","seq":0}`), stream)
	var apiErr *jetstream.APIError
	require.ErrorAs(t, err, &apiErr)
	assert.Equal(t, jetstream.JSErrCodeStreamWrongLastSequence, apiErr.ErrorCode)
	assert.Equal(t, "wrong last sequence: 5", apiErr.Description)
	assert.True(t, IsConflict(err), "%v", err)
	assert.ErrorIs(t, err, jetstream.ErrKeyExists, "10071 matches jetstream's sentinel by code")
	assert.Equal(t, "nats: "+apiErr.Error(), err.Error(), "wrapped as js.PublishMsg wraps it")

	_, err = ParsePubAck([]byte(`{"error":{"code":503,"err_code":10077,"description":"maximum messages exceeded"},"stream":"KV_JOBS_KEYS_s","seq":0}`), stream)
	require.ErrorAs(t, err, &apiErr)
	assert.Equal(t, jetstream.ErrorCode(10077), apiErr.ErrorCode)
	assert.False(t, IsConflict(err))

	for _, bad := range []string{``, `{`, `{"stream":"KV_JOBS_KEYS_s","seq":`, `{"stream":"KV_JOBS_KEYS_s","seq":"1"}`, `{"seq":1}`, `{"stream":"","seq":1}`, `null`} {
		_, err := ParsePubAck([]byte(bad), stream)
		assert.ErrorIs(t, err, jetstream.ErrInvalidJSAck, "%q", bad)
	}
}

// Whatever the hand-read path accepts, encoding/json reads the same way.
// The corpus under testdata/fuzz holds the inputs that once broke it.
func FuzzParseAckTemplate(f *testing.F) {
	const stream = "KV_JOBS_KEYS_s"
	for _, seed := range []string{
		`{"stream":"KV_JOBS_KEYS_s","seq":42}`,
		`{"stream":"KV_JOBS_KEYS_s","domain":"hub","seq":7}`,
		`{"stream":"KV_JOBS_KEYS_s","domain":"a\"b","seq":7}`,
		`{"stream":"KV_JOBS_KEYS_s","seq":0042}`,
		`{"stream":"KV_JOBS_KEYS_s","seq":1}}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		seq, ok := parseAckTemplate(data, stream)
		if !ok {
			return
		}
		var ack struct {
			Error  *jetstream.APIError `json:"error"`
			Stream string              `json:"stream"`
			Seq    uint64              `json:"seq"`
		}
		require.NoError(t, json.Unmarshal(data, &ack), "%q read by hand but not by encoding/json", data)
		assert.Nil(t, ack.Error)
		assert.Equal(t, stream, ack.Stream)
		assert.Equal(t, ack.Seq, seq, "%q", data)
	})
}
