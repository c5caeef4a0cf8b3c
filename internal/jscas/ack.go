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
