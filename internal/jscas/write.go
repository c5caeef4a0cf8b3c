package jscas

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// The compare-and-swap write both NATS stores send, one level below
// nats.go's KV layer: the message kv.Update (or kv.Delete with
// jetstream.LastRevision) would publish, on the same subject with the same
// headers and data, sent as a request on the connection and its publish
// acknowledgement read by hand.
//
// What that saves per write, against the round trip it rides on: kv.Update
// checks the key with a regular expression, builds its publish options (two
// allocations and a closure), and decodes the acknowledgement with
// encoding/json through reflection. An acknowledgement of any other shape
// than the server's success template is decoded as nats.go decodes it.
//
// What stays as in nats.go: a call without a deadline gets the JetStream
// context's default timeout; "no responders" is retried as js.PublishMsg
// retries it and then reported as jetstream.ErrNoStreamResponse; an API
// error is returned as *jetstream.APIError wrapped as nats.go wraps it, and
// a conflict also wraps jetstream.ErrKeyRevisionMismatch as kv.Update's
// does.

// kvOperationHeader is the header of KV delete and purge markers.
const kvOperationHeader = "KV-Operation"

// Writer sends compare-and-swap writes to the keys of one KV bucket. Its
// zero value is not usable: Conn and Stream must be set. A Writer is a few
// words, cheap to build per write; it is safe for concurrent use.
type Writer struct {
	// Conn is the connection the writes are sent on.
	Conn *nats.Conn
	// Stream is the name of the bucket's stream, as its publish
	// acknowledgements name it ("KV_<bucket>").
	Stream string
	// Timeout bounds a write whose context has no deadline; stores set the
	// JetStream context's default timeout, as nats.go does. Zero or less
	// leaves such a write to the context alone.
	Timeout time.Duration
}

// APIPrefix returns the prefix of the JetStream API subjects of a context
// with options opts, ending in ".": "$JS.<domain>.API." for a domain, the
// API prefix when one is set, "$JS.API." otherwise (as jetstream does).
func APIPrefix(opts jetstream.JetStreamOptions) string {
	switch {
	case opts.Domain != "":
		return "$JS." + opts.Domain + ".API."
	case opts.APIPrefix != "":
		return strings.TrimSuffix(opts.APIPrefix, ".") + "."
	default:
		return jetstream.DefaultAPIPrefix
	}
}

// WritePrefix is the subject prefix kv.Update writes the keys of bucket
// under for a JetStream context with options opts: "$KV.<bucket>.", behind
// the context's API prefix or domain when it has one. It does not hold
// for mirrors, whose writes go to their origin.
func WritePrefix(opts jetstream.JetStreamOptions, bucket string) string {
	if api := APIPrefix(opts); api != jetstream.DefaultAPIPrefix {
		return api + "$KV." + bucket + "."
	}
	return "$KV." + bucket + "."
}

// Write publishes value to subject on condition that subject's last
// message in the stream is revision (0: subject has none), or a delete
// marker (no data, KV-Operation: DEL) when del is set, and returns the
// stream sequence written: the key's new revision. subject is the key's
// full write subject (see [WritePrefix]).
//
// A refused condition fails with an error for which [IsConflict] holds and
// which wraps jetstream.ErrKeyRevisionMismatch; other API errors are
// *jetstream.APIError wrapped as nats.go wraps them; a subject no stream
// answers is jetstream.ErrNoStreamResponse after js.PublishMsg's retries;
// an acknowledgement that cannot be read is jetstream.ErrInvalidJSAck; the
// end of ctx is its error.
func (w *Writer) Write(ctx context.Context, subject string, value []byte, revision uint64, del bool) (uint64, error) {
	hdr := make(nats.Header, 2)
	if del {
		hdr[kvOperationHeader] = []string{"DEL"}
	}
	hdr[jetstream.ExpectedLastSubjSeqHeader] = []string{strconv.FormatUint(revision, 10)}
	m := &nats.Msg{Subject: subject, Header: hdr, Data: value}
	if _, ok := ctx.Deadline(); !ok && w.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, w.Timeout)
		defer cancel()
	}
	resp, err := w.Conn.RequestMsgWithContext(ctx, m)
	for r := 0; errors.Is(err, nats.ErrNoResponders) && r < jetstream.DefaultPubRetryAttempts; r++ {
		// A stream between leaders, as js.PublishMsg waits it out.
		select {
		case <-ctx.Done():
		case <-time.After(jetstream.DefaultPubRetryWait):
		}
		resp, err = w.Conn.RequestMsgWithContext(ctx, m)
	}
	if errors.Is(err, nats.ErrNoResponders) {
		return 0, jetstream.ErrNoStreamResponse
	}
	if err != nil {
		return 0, err
	}
	rev, err := ParsePubAck(resp.Data, w.Stream)
	if err != nil && IsConflict(err) {
		err = fmt.Errorf("%w: %w", err, jetstream.ErrKeyRevisionMismatch)
	}
	return rev, err
}
