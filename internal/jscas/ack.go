package jscas

import (
	"encoding/json"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
)

// ParsePubAck returns the stream sequence of a publish acknowledgement
// from stream. The server writes a successful one from a template,
// {"stream":"<stream>"[,"domain":"<domain>"],"seq":<seq>}; that shape is
// read by hand, anything else (an error, other fields, another stream) is
// decoded as nats.go's js.PublishMsg decodes it, with its errors: the API
// error the acknowledgement carries, wrapped ("nats: …"), or
// jetstream.ErrInvalidJSAck.
func ParsePubAck(data []byte, stream string) (uint64, error) {
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
	seq, rest, ok := parseAckHead(data, stream)
	if !ok || len(rest) != 1 || rest[0] != '}' {
		return 0, false
	}
	return seq, true
}

// ParseBatchAck returns the stream sequence of the last message of atomic
// batch batchID and the number of messages the batch wrote, from the
// acknowledgement of its commit. The server writes a successful one from a
// template, {"stream":"<stream>"[,"domain":"<domain>"],"seq":<seq>,
// "batch":"<batchID>","count":<count>}; that shape is read by hand,
// anything else decoded with encoding/json as jetstreamext.PublishMsgBatch
// decodes it: the API error it carries (wrapped "nats: …"), or
// jetstream.ErrInvalidJSAck when it has no stream, another batch's id or
// no count.
func ParseBatchAck(data []byte, stream, batchID string) (last, count uint64, err error) {
	if last, count, ok := parseBatchAckTemplate(data, stream, batchID); ok {
		return last, count, nil
	}
	var ack struct {
		Error  *jetstream.APIError `json:"error"`
		Stream string              `json:"stream"`
		Seq    uint64              `json:"seq"`
		Batch  string              `json:"batch"`
		Count  uint64              `json:"count"`
	}
	if err := json.Unmarshal(data, &ack); err != nil {
		return 0, 0, jetstream.ErrInvalidJSAck
	}
	if ack.Error != nil {
		return 0, 0, fmt.Errorf("nats: %w", ack.Error)
	}
	if ack.Stream == "" || ack.Batch != batchID || ack.Count == 0 {
		return 0, 0, jetstream.ErrInvalidJSAck
	}
	return ack.Seq, ack.Count, nil
}

// parseBatchAckTemplate reads a batch commit's success acknowledgement in
// exactly the server's template; ok is false for anything else.
func parseBatchAckTemplate(data []byte, stream, batchID string) (last, count uint64, ok bool) {
	last, rest, ok := parseAckHead(data, stream)
	if !ok {
		return 0, 0, false
	}
	if rest, ok = cutPrefix(rest, `,"batch":"`); !ok {
		return 0, 0, false
	}
	if rest, ok = cutPrefix(rest, batchID); !ok {
		return 0, 0, false
	}
	if rest, ok = cutPrefix(rest, `","count":`); !ok {
		return 0, 0, false
	}
	count, rest, ok = parseDigits(rest)
	if !ok || len(rest) != 1 || rest[0] != '}' {
		return 0, 0, false
	}
	return last, count, true
}

// parseAckHead reads the start of a success acknowledgement of stream in
// the server's template, up to and including the sequence, and returns the
// rest.
func parseAckHead(data []byte, stream string) (seq uint64, rest []byte, ok bool) {
	rest, ok = cutPrefix(data, `{"stream":"`)
	if !ok {
		return 0, nil, false
	}
	if rest, ok = cutPrefix(rest, stream); !ok {
		return 0, nil, false
	}
	if rest, ok = cutPrefix(rest, `",`); !ok {
		return 0, nil, false
	}
	if r, found := cutPrefix(rest, `"domain":"`); found {
		i := 0
		for i < len(r) && r[i] >= ' ' && r[i] <= '~' && r[i] != '"' && r[i] != '\\' {
			i++ // printable ASCII, nothing JSON would escape
		}
		if rest, ok = cutPrefix(r[i:], `",`); !ok {
			return 0, nil, false
		}
	}
	if rest, ok = cutPrefix(rest, `"seq":`); !ok {
		return 0, nil, false
	}
	return parseDigits(rest)
}

// parseDigits reads the number b starts with: 1 to 19 digits, no leading
// zero (JSON has none), so it cannot overflow; a 20th digit is not
// accepted.
func parseDigits(b []byte) (n uint64, rest []byte, ok bool) {
	i := 0
	for i < len(b) && i < 19 && b[i] >= '0' && b[i] <= '9' {
		n = n*10 + uint64(b[i]-'0')
		i++
	}
	if i == 0 || i > 1 && b[0] == '0' || i < len(b) && b[i] >= '0' && b[i] <= '9' {
		return 0, nil, false
	}
	return n, b[i:], true
}

func cutPrefix(b []byte, prefix string) ([]byte, bool) {
	if len(b) < len(prefix) || string(b[:len(prefix)]) != prefix {
		return b, false
	}
	return b[len(prefix):], true
}
