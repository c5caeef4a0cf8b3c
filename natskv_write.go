package jobkeys

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jobkeys/jobkeys/internal/jscas"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// The compare-and-swap writes of NATSStore, one level below nats.go's KV
// layer: the message kv.Update (or kv.Delete) would publish, on the same
// subject with the same headers and data, sent as a request on the
// connection and its publish acknowledgement read by hand.
//
// What that saves per write, against the round trip it rides on: kv.Update
// checks the key with a regular expression, builds its publish options
// (two allocations and a closure), and decodes the acknowledgement with
// encoding/json through reflection; together about a tenth of the client's
// CPU in an uncontended cycle (see BenchmarkUncontended). The key is
// checked by validKVKey instead (stricter than nats.go's rule: a key it
// refuses goes through the KV layer, which gives the error it always
// gave), and an acknowledgement of any other shape than the server's
// success template is decoded as nats.go decodes it.
//
// What stays as in nats.go: a call without a deadline gets the JetStream
// context's default timeout; "no responders" is retried as js.PublishMsg
// retries it and then reported as jetstream.ErrNoStreamResponse; an API
// error is returned as *jetstream.APIError wrapped as nats.go wraps it, and
// a conflict also wraps jetstream.ErrKeyRevisionMismatch as kv.Update's
// does. Mirrors keep the KV layer (their writes go to the origin under
// other subject rules), as does kv.Create's read of a delete marker, which
// only the KV layer's stream handle reads with the bucket's own read
// rules.

// kvOperationHeader is the header of KV delete and purge markers.
const kvOperationHeader = "KV-Operation"

// directWrites reports whether the store writes key of b itself.
func (b *natsBucket) directWrites(key string) bool {
	return b.writePrefix != "" && validKVKey(key)
}

// writeKey publishes value to key's subject on condition that key's last
// revision is revision (0: that key has no message), or a delete marker
// (no data, KV-Operation: DEL) when del is set, and returns the revision
// written. b.directWrites(key) must hold.
func (s *NATSStore) writeKey(ctx context.Context, b *natsBucket, key string, value []byte, revision uint64, del bool) (uint64, error) {
	hdr := make(nats.Header, 2)
	if del {
		hdr[kvOperationHeader] = []string{"DEL"}
	}
	hdr[jetstream.ExpectedLastSubjSeqHeader] = []string{strconv.FormatUint(revision, 10)}
	m := &nats.Msg{Subject: b.writePrefix + key, Header: hdr, Data: value}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, b.writeTimeout)
		defer cancel()
	}
	nc := s.js.Conn()
	resp, err := nc.RequestMsgWithContext(ctx, m)
	for r := 0; errors.Is(err, nats.ErrNoResponders) && r < jetstream.DefaultPubRetryAttempts; r++ {
		// A stream between leaders, as js.PublishMsg waits it out.
		select {
		case <-ctx.Done():
		case <-time.After(jetstream.DefaultPubRetryWait):
		}
		resp, err = nc.RequestMsgWithContext(ctx, m)
	}
	if errors.Is(err, nats.ErrNoResponders) {
		return 0, jetstream.ErrNoStreamResponse
	}
	if err != nil {
		return 0, err
	}
	rev, err := parsePubAck(resp.Data, b.stream)
	if err != nil && jscas.IsConflict(err) {
		err = fmt.Errorf("%w: %w", err, jetstream.ErrKeyRevisionMismatch)
	}
	return rev, err
}

// parsePubAck returns the stream sequence of a publish acknowledgement. The
// server writes a successful one from a template,
// {"stream":"<stream>"[,"domain":"<domain>"],"seq":<seq>}; that shape is
// read by hand, anything else (an error, other fields) is decoded as
// nats.go's js.PublishMsg decodes it, with its errors.
func parsePubAck(data []byte, stream string) (uint64, error) {
	if seq, ok := parseAckTemplate(data, stream); ok {
		return seq, nil
	}
	var ack struct {
		Error  *jetstream.APIError `json:"error"`
		Stream string              `json:"stream"`
		Seq    uint64              `json:"seq"`
	}
	if err := json.Unmarshal(data, &ack); err != nil {
		return 0, jetstream.ErrInvalidJSAck
	}
	if ack.Error != nil {
		return 0, fmt.Errorf("nats: %w", ack.Error)
	}
	if ack.Stream == "" {
		return 0, jetstream.ErrInvalidJSAck
	}
	return ack.Seq, nil
}

// parseAckTemplate reads a success acknowledgement of stream in exactly the
// server's template; ok is false for anything else.
func parseAckTemplate(data []byte, stream string) (seq uint64, ok bool) {
	rest, ok := cutPrefix(data, `{"stream":"`)
	if !ok {
		return 0, false
	}
	if rest, ok = cutPrefix(rest, stream); !ok {
		return 0, false
	}
	if rest, ok = cutPrefix(rest, `",`); !ok {
		return 0, false
	}
	if r, found := cutPrefix(rest, `"domain":"`); found {
		i := 0
		for i < len(r) && r[i] >= ' ' && r[i] <= '~' && r[i] != '"' && r[i] != '\\' {
			i++ // printable ASCII, nothing JSON would escape
		}
		if rest, ok = cutPrefix(r[i:], `",`); !ok {
			return 0, false
		}
	}
	if rest, ok = cutPrefix(rest, `"seq":`); !ok {
		return 0, false
	}
	// 1 to 19 digits, no leading zero (JSON has none), so the sequence
	// cannot overflow; then "}" and nothing after it.
	n := 0
	for n < len(rest) && n < 19 && rest[n] >= '0' && rest[n] <= '9' {
		seq = seq*10 + uint64(rest[n]-'0')
		n++
	}
	if n == 0 || n > 1 && rest[0] == '0' || len(rest) != n+1 || rest[n] != '}' {
		return 0, false
	}
	return seq, true
}

func cutPrefix(b []byte, prefix string) ([]byte, bool) {
	if len(b) < len(prefix) || string(b[:len(prefix)]) != prefix {
		return b, false
	}
	return b[len(prefix):], true
}
