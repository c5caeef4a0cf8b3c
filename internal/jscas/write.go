package jscas

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
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
	// TTL, when positive, is the message's per-message TTL (header
	// Nats-TTL, whole seconds rounded up; the stream must allow it, server
	// 2.11 or later): the server removes the message after it. Write
	// alone sets it.
	TTL time.Duration
}

// TTLHeader is the header of a message's per-message TTL.
const TTLHeader = "Nats-TTL"

// TTLValue is the value of the [TTLHeader] of a message that d (positive)
// should outlive by less than a second: d in whole seconds, rounded up.
func TTLValue(d time.Duration) string {
	return strconv.FormatInt(int64((d+time.Second-1)/time.Second), 10)
}

// APIPrefix returns the prefix, ending in ".", of the JetStream API
// subjects of a context with options opts: the prefix nats.go's own
// requests (and its KV layer's writes) use there.
//
// nats.go decides it in its constructor and keeps it in an unexported
// field of the options: jetstream.New uses "$JS.API.",
// jetstream.NewWithDomain "$JS.<domain>.API." and
// jetstream.NewWithAPIPrefix the prefix it is given, whatever the other
// exported field says (any JetStreamOpt may set Domain or APIPrefix too).
// APIPrefix reads that field where it holds a prefix, so that a context
// whose options name both a domain and an API prefix gets the one nats.go
// obeys; options made without a constructor (which nats.go never hands
// out) give "$JS.<domain>.API." for a domain, else the API prefix, else
// "$JS.API.". TestAPIPrefixWithDomainAndAPIPrefix compares it with a trace
// of nats.go's own requests, so a nats.go that renames the field fails it.
func APIPrefix(opts jetstream.JetStreamOptions) string {
	if f := reflect.ValueOf(opts).FieldByName("apiPrefix"); f.IsValid() && f.Kind() == reflect.String && f.String() != "" {
		return strings.TrimSuffix(f.String(), ".") + "."
	}
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
	if w.TTL > 0 {
		hdr[TTLHeader] = []string{TTLValue(w.TTL)}
	}
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

// The headers of a JetStream atomic batch publish (server 2.12 and later),
// as the server and jetstreamext name them.
const (
	batchIDHeader     = "Nats-Batch-Id"
	batchSeqHeader    = "Nats-Batch-Sequence"
	batchCommitHeader = "Nats-Batch-Commit"
)

// WriteBatch publishes values to subject as one JetStream atomic batch, on
// condition that subject's last message in the stream is revision (0:
// subject has none), and returns the stream sequence of the last message
// written. With del the last message is a delete marker (no data,
// KV-Operation: DEL; its value is not sent). Each message is the one
// [Writer.Write] would send for it, with the batch headers
// (Nats-Batch-Id, Nats-Batch-Sequence, and Nats-Batch-Commit on the last)
// added, and only the first carries the condition: the server allows a
// condition only on the first message of a batch to a subject, and writes
// a batch all at once or not at all, at consecutive sequences, so the
// first condition fences them all. Message i of n is at sequence
// last-n+1+i; WriteBatch checks that the acknowledgement counts n
// messages. The stream must allow atomic publish.
//
// The messages but the last are published without waiting for a reply
// (no flow control: a batch of a few messages needs none); the last
// commits the batch and is sent as a request, so a batch costs one round
// trip. Errors are Write's; in addition, a batch the server refused as a
// batch (see [IsBatchRefused]) wrote nothing.
func (w *Writer) WriteBatch(ctx context.Context, subject string, values [][]byte, revision uint64, del bool) (uint64, error) {
	n := len(values)
	if n == 0 {
		return 0, errors.New("jscas: a batch of no messages")
	}
	msgs := make([]nats.Msg, n)
	for i := range msgs {
		hdr := make(nats.Header, 5)
		if i == 0 {
			hdr[jetstream.ExpectedLastSubjSeqHeader] = []string{strconv.FormatUint(revision, 10)}
		}
		hdr[batchSeqHeader] = []string{strconv.Itoa(i + 1)}
		msgs[i] = nats.Msg{Subject: subject, Header: hdr, Data: values[i]}
	}
	lastMsg := &msgs[n-1]
	lastMsg.Header[batchCommitHeader] = []string{"1"}
	if del {
		lastMsg.Header[kvOperationHeader] = []string{"DEL"}
		lastMsg.Data = nil
	}
	if _, ok := ctx.Deadline(); !ok && w.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, w.Timeout)
		defer cancel()
	}
	var (
		id   string
		resp *nats.Msg
		err  error
	)
	send := func() {
		id = nuid.Next() // a new batch per attempt
		for i := range msgs {
			msgs[i].Header[batchIDHeader] = []string{id}
		}
		for i := range msgs[:n-1] {
			if err = w.Conn.PublishMsg(&msgs[i]); err != nil {
				return
			}
		}
		resp, err = w.Conn.RequestMsgWithContext(ctx, lastMsg)
	}
	send()
	for r := 0; errors.Is(err, nats.ErrNoResponders) && r < jetstream.DefaultPubRetryAttempts; r++ {
		// A stream between leaders, as js.PublishMsg waits it out; no
		// message of the batch was taken (a batch starts at its first).
		select {
		case <-ctx.Done():
		case <-time.After(jetstream.DefaultPubRetryWait):
		}
		send()
	}
	if errors.Is(err, nats.ErrNoResponders) {
		return 0, jetstream.ErrNoStreamResponse
	}
	if err != nil {
		return 0, err
	}
	last, count, err := ParseBatchAck(resp.Data, w.Stream, id)
	if err != nil {
		if IsConflict(err) {
			err = fmt.Errorf("%w: %w", err, jetstream.ErrKeyRevisionMismatch)
		}
		return 0, err
	}
	if count != uint64(n) || last < count {
		return 0, fmt.Errorf("%w: batch of %d messages acknowledged as %d up to sequence %d", jetstream.ErrInvalidJSAck, n, count, last)
	}
	return last, nil
}

// The API error codes of an atomic batch the server refused as a batch,
// having written none of it.
const (
	errCodeAtomicPublishDisabled    jetstream.ErrorCode = 10174
	errCodeAtomicPublishIncomplete  jetstream.ErrorCode = 10176
	errCodeAtomicPublishTooLarge    jetstream.ErrorCode = 10199
	errCodeAtomicPublishTooManyOpen jetstream.ErrorCode = 10210
)

// IsBatchRefused reports whether err is a [Writer.WriteBatch] the server
// refused as a batch, writing none of it, for a reason that a write of
// each message on its own would not meet: the stream does not allow
// atomic publish (10174), the batch arrived incomplete (10176), it has
// more messages than the server takes (10199), or too many batches are
// open (10210). It matches by code.
func IsBatchRefused(err error) bool {
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) {
		return false
	}
	switch apiErr.ErrorCode {
	case errCodeAtomicPublishDisabled, errCodeAtomicPublishIncomplete, errCodeAtomicPublishTooLarge, errCodeAtomicPublishTooManyOpen:
		return true
	}
	return false
}

// IsBatchDisabled reports whether err is a [Writer.WriteBatch] refused
// because the stream does not allow atomic publish (10174).
func IsBatchDisabled(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == errCodeAtomicPublishDisabled
}
