package jobs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jobkeys/jobkeys/internal/jscas"
	"github.com/jobkeys/jobkeys/internal/kvstream"
	"github.com/jobkeys/jobkeys/internal/natsperm"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/synadia-io/orbit.go/jetstreamext"
)

// The reads and writes NATSStore makes, below the rules: single and batched
// last-message reads, the channel revision, compare-and-swap writes, the
// atomic enqueue batch, writes sent together (writeAll) and the purges.

// natsMsg is the last message of a key: its value and revision.
type natsMsg struct {
	data []byte
	rev  uint64
}

// natsReadChunk bounds the subjects of one batched read, keeping the request
// far below the server's payload limit and the 1,024 results a batched
// direct get may return.
const natsReadChunk = 256

// natsUnavailable wraps an I/O error; the error of the caller's ctx, when
// it has ended, is returned unchanged. ctx must be the caller's: a timeout
// of the store's own (the JetStream default timeout) is ErrUnavailable,
// not the caller's deadline, and does not match context.DeadlineExceeded.
func natsUnavailable(ctx context.Context, op, what string, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("%w: %s: %s: %v (the store's own timeout)", ErrUnavailable, op, what, err)
	}
	return fmt.Errorf("%w: %s: %s: %w", ErrUnavailable, op, what, err)
}

// natsDeadline is ctx bounded by the store's request timeout
// (requestTimeout) when ctx has no deadline of its own.
func (s *NATSStore) natsDeadline(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, s.requestTimeout())
}

// getOne reads the last message of key. found is false when the key has
// none (or a delete marker). On a replicated bucket the read goes to the
// stream leader, so it sees every acknowledged write.
func (s *NATSStore) getOne(ctx context.Context, op, key string) (natsMsg, bool, error) {
	if s.leaderReads {
		return s.getFromLeader(ctx, op, s.keys.subject(key))
	}
	rctx, cancel := s.natsDeadline(ctx)
	defer cancel()
	m, err := s.stream.GetLastMsgForSubject(rctx, s.keys.subject(key))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return natsMsg{}, false, nil
	}
	if err != nil {
		return natsMsg{}, false, s.unavailable(ctx, op, "read KV key "+strconv.Quote(key), err, s.directGet, s.msgGet)
	}
	if kvstream.IsMarker(m.Header) {
		return natsMsg{}, false, nil
	}
	return natsMsg{data: m.Data, rev: m.Sequence}, true, nil
}

// getFromLeader reads the last message of subject (wildcards allowed)
// through STREAM.MSG.GET, which the stream leader answers.
func (s *NATSStore) getFromLeader(ctx context.Context, op, subject string) (natsMsg, bool, error) {
	rctx, cancel := s.natsDeadline(ctx)
	defer cancel()
	req, err := kvstream.LastBySubjectRequest(subject)
	if err != nil {
		return natsMsg{}, false, err
	}
	reply, err := s.js.Conn().RequestWithContext(rctx, s.msgGet, req)
	if err != nil {
		return natsMsg{}, false, s.unavailable(ctx, op, "read "+subject+" from the stream leader", err, s.msgGet)
	}
	m, found, err := kvstream.ParseMsgGet(reply.Data)
	if err != nil {
		return natsMsg{}, false, s.unavailable(ctx, op, "read "+subject, err)
	}
	if !found {
		return natsMsg{}, false, nil
	}
	deleted, err := kvstream.Deleted(m.Hdrs)
	if err != nil {
		return natsMsg{}, false, s.unavailable(ctx, op, "read "+subject, err)
	}
	if deleted {
		return natsMsg{}, false, nil
	}
	return natsMsg{data: m.Data, rev: m.Seq}, true, nil
}

// getMany reads the last messages of keys in batched direct gets of at most
// natsReadChunk subjects each. Keys without a message are absent from the
// result.
func (s *NATSStore) getMany(ctx context.Context, op string, keys []string) (map[string]natsMsg, error) {
	out := make(map[string]natsMsg, len(keys))
	if len(keys) == 1 { // a single get answers faster than a batch
		m, found, err := s.getOne(ctx, op, keys[0])
		if err != nil {
			return nil, err
		}
		if found {
			out[keys[0]] = m
		}
		return out, nil
	}
	for start := 0; start < len(keys); start += natsReadChunk {
		chunk := keys[start:min(start+natsReadChunk, len(keys))]
		subjects := make([]string, len(chunk))
		for i, k := range chunk {
			subjects[i] = s.keys.subject(k)
		}
		err := s.batchGet(ctx, op, subjects, len(chunk), out)
		if errors.Is(err, errBatchCut) {
			// Large records: read what the batch did not answer alone.
			for _, k := range chunk {
				if _, ok := out[k]; ok {
					continue
				}
				m, found, err := s.getOne(ctx, op, k)
				if err != nil {
					return nil, err
				}
				if found {
					out[k] = m
				}
			}
			continue
		}
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

// errTooManyResults reports a batched read that matched more subjects than
// the server answers in one request.
var errTooManyResults = errors.New("too many results for one batched read")

// natsBatchGetMax is the most messages the server returns for one batched
// direct get (its maxAllowedResponses); more matches are "413 Too Many
// Results".
const natsBatchGetMax = 1024

// lastMatching reads the last message of every subject matching filter.
// When more subjects match than one batched read returns, it falls back to
// the stream's subject list, whose entries carry the stream's last sequence
// as their revision: an upper bound, enough for dropActive.
func (s *NATSStore) lastMatching(ctx context.Context, op, filter string) (map[string]natsMsg, error) {
	out := make(map[string]natsMsg)
	err := s.batchGet(ctx, op, []string{filter}, natsBatchGetMax, out)
	if errors.Is(err, errTooManyResults) || errors.Is(err, errBatchCut) {
		names, last, err := s.subjects(ctx, op, filter)
		if err != nil {
			return nil, err
		}
		out = make(map[string]natsMsg, len(names))
		for _, key := range names {
			out[key] = natsMsg{rev: last}
		}
		return out, nil
	}
	return out, err
}

// batchGet sends one batched direct get ("multi_last") for subjects, which
// may match up to most messages, and adds the answers to out by KV key.
// Replies arrive on the store's own inbox subscription (see natsReplies):
// a subscription per request would cost a SUB, an UNSUB and a large
// buffer every time.
func (s *NATSStore) batchGet(ctx context.Context, op string, subjects []string, most int, out map[string]natsMsg) error {
	rctx, cancel := s.natsDeadline(ctx)
	defer cancel()
	replies, err := s.replies.open(s.js.Conn())
	if err != nil {
		return s.unavailable(ctx, op, "subscribe to batched read replies", err)
	}
	body, err := natsMultiLastBody(subjects, natsBatchMaxBytes)
	if err != nil {
		return err
	}
	inbox, queue := replies.await(most + 2)
	defer replies.release(queue)
	if err := s.js.Conn().PublishRequest(s.directGet, inbox, body); err != nil {
		return s.unavailable(ctx, op, fmt.Sprintf("batched read of %d subjects", len(subjects)), err, s.directGet)
	}
	// Every reply carries the number of matches still to come: they count
	// down by one, so a reply lost on the way (a slow consumer) shows as a
	// gap, and an end of batch with matches to come as a cut-short batch
	// (the server stops at its byte limit).
	var pending uint64
	first := true
	for {
		m, err := queue.take(rctx)
		if err != nil {
			return s.unavailable(ctx, op, fmt.Sprintf("batched read of %d subjects", len(subjects)), err, s.directGet)
		}
		np, npErr := strconv.ParseUint(m.Header.Get("Nats-Num-Pending"), 10, 64)
		if len(m.Data) == 0 {
			switch m.Header.Get("Status") {
			case "204": // end of batch
				if npErr == nil && np > 0 {
					return errBatchCut
				}
				return nil
			case "404": // no subject matched
				return nil
			case "413":
				return errTooManyResults
			case "":
			default:
				return s.unavailable(ctx, op, "batched read", fmt.Errorf("status %s %s", m.Header.Get("Status"), m.Header.Get("Description")))
			}
		}
		if npErr != nil {
			return s.unavailable(ctx, op, "batched read", fmt.Errorf("reply without Nats-Num-Pending: %w", npErr))
		}
		if !first && np+1 != pending {
			return s.unavailable(ctx, op, "batched read", fmt.Errorf("replies lost: %d matches to come after %d", np, pending))
		}
		first, pending = false, np
		seq, err := strconv.ParseUint(m.Header.Get(jetstream.SequenceHeader), 10, 64)
		if err != nil {
			return s.unavailable(ctx, op, "batched read", fmt.Errorf("reply without a sequence: %w", err))
		}
		if kvstream.IsMarker(m.Header) {
			continue
		}
		if key, ok := s.keys.key(m.Header.Get(jetstream.SubjectHeader)); ok {
			out[key] = natsMsg{data: m.Data, rev: seq}
		}
	}
}

// natsBatchMaxBytes is where the server ends a batched read (the rest is
// read key by key): well below the outbound buffer at which the server
// treats a client as a slow consumer.
const natsBatchMaxBytes = 1 << 20

// errBatchCut reports a batched read the server ended before every match
// (at its byte limit).
var errBatchCut = errors.New("batched read cut short")

// natsReplies is one inbox subscription per store for the replies of
// batched reads, each request told apart by the last token of its reply
// subject. It lives as long as the connection, or until the store's
// Close.
type natsReplies struct {
	mu      sync.Mutex
	sub     *nats.Subscription
	prefix  string
	next    uint64
	waiting map[string]*natsReplyQueue
}

// natsReplyQueue holds the replies of one request until its reader takes
// them: a queue that grows with the replies that arrive (a claim's batched
// read usually answers a handful), never beyond the most the request can
// get, so that a request costs no buffer sized for the largest answer.
type natsReplyQueue struct {
	token string // the last token of the request's reply subject
	// fn, when set, takes each reply instead of the queue, on the
	// subscription's goroutine (see awaitFunc).
	fn     func(*nats.Msg)
	mu     sync.Mutex
	msgs   []*nats.Msg
	most   int
	signal chan struct{} // capacity 1: replies are waiting
}

// open subscribes on first use.
func (r *natsReplies) open(nc *nats.Conn) (*natsReplies, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.sub != nil && r.sub.IsValid() {
		return r, nil
	}
	prefix := nc.NewInbox() + "."
	sub, err := nc.Subscribe(prefix+"*", r.deliver)
	if err != nil {
		return nil, err
	}
	r.sub, r.prefix, r.waiting = sub, prefix, make(map[string]*natsReplyQueue)
	return r, nil
}

func (r *natsReplies) deliver(m *nats.Msg) {
	token := m.Subject[strings.LastIndexByte(m.Subject, '.')+1:]
	r.mu.Lock()
	q := r.waiting[token]
	r.mu.Unlock()
	if q == nil {
		return // a request that gave up
	}
	if q.fn != nil {
		q.fn(m)
		return
	}
	q.mu.Lock()
	if len(q.msgs) < q.most { // else more replies than the server sends for one request
		q.msgs = append(q.msgs, m)
	}
	q.mu.Unlock()
	select {
	case q.signal <- struct{}{}:
	default:
	}
}

// take waits for the next reply, or for ctx to end.
func (q *natsReplyQueue) take(ctx context.Context) (*nats.Msg, error) {
	for {
		q.mu.Lock()
		if len(q.msgs) > 0 {
			m := q.msgs[0]
			q.msgs[0] = nil
			q.msgs = q.msgs[1:]
			q.mu.Unlock()
			return m, nil
		}
		q.mu.Unlock()
		select {
		case <-q.signal:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// await registers a request that expects at most n replies; release
// unregisters it.
func (r *natsReplies) await(n int) (inbox string, q *natsReplyQueue) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.next++
	token := strconv.FormatUint(r.next, 36)
	q = &natsReplyQueue{token: token, most: n, signal: make(chan struct{}, 1)}
	r.waiting[token] = q
	return r.prefix + token, q
}

// awaitFunc registers a request whose replies fn takes, on the
// subscription's goroutine; fn must not block. release unregisters it.
func (r *natsReplies) awaitFunc(fn func(*nats.Msg)) (inbox string, q *natsReplyQueue) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.next++
	token := strconv.FormatUint(r.next, 36)
	q = &natsReplyQueue{token: token, fn: fn}
	r.waiting[token] = q
	return r.prefix + token, q
}

// close ends the subscription; the next open subscribes again. Requests
// still waiting get no more replies.
func (r *natsReplies) close() {
	r.mu.Lock()
	sub := r.sub
	r.sub = nil
	r.mu.Unlock()
	if sub != nil {
		_ = sub.Unsubscribe() // an error: the connection is closed, and the subscription with it
	}
}

// release unregisters q's request.
func (r *natsReplies) release(q *natsReplyQueue) {
	r.mu.Lock()
	delete(r.waiting, q.token)
	r.mu.Unlock()
}

// subjects lists the KV keys matching filter (key names only, no values)
// and the stream's last sequence at the time of the listing.
func (s *NATSStore) subjects(ctx context.Context, op, filter string) ([]string, uint64, error) {
	rctx, cancel := s.natsDeadline(ctx)
	defer cancel()
	info, err := s.stream.Info(rctx, jetstream.WithSubjectFilter(filter))
	if err != nil {
		return nil, 0, s.unavailable(ctx, op, "list "+filter, err, jscas.APIPrefix(s.js.Options())+"STREAM.INFO."+s.streamName)
	}
	keys := make([]string, 0, len(info.State.Subjects))
	for subj := range info.State.Subjects {
		if key, ok := s.keys.key(subj); ok {
			keys = append(keys, key)
		}
	}
	return keys, info.State.LastSeq, nil
}

// channelRevision is the revision of the channel's last change: the
// sequence of the last message of any of its keys; 0 when it has none.
func (s *NATSStore) channelRevision(ctx context.Context, op, channelID string) (uint64, error) {
	m, found, err := s.getFromLeader(ctx, op, s.keys.channelFilter(channelID))
	if err != nil || !found {
		return 0, err
	}
	return m.rev, nil
}

// update writes value over key's revision rev. conflict is true when the key
// changed since.
func (s *NATSStore) update(ctx context.Context, op, key string, value []byte, rev uint64) (newRev uint64, conflict bool, err error) {
	if err := s.checkSize(op, key, len(value)); err != nil {
		return 0, false, err
	}
	if s.plainWrites {
		newRev, err = s.casWrite(ctx, key, value, rev)
	} else {
		wctx, cancel := s.natsDeadline(ctx)
		newRev, err = s.kv.Update(wctx, key, value, rev)
		cancel()
	}
	if err == nil {
		return newRev, false, nil
	}
	if jscas.IsConflict(err) {
		return 0, true, nil
	}
	return 0, false, s.writeFailed(ctx, op, "write KV key "+strconv.Quote(key), err, s.keys.subject(key))
}

// casWrite is kv.Update(ctx, key, value, rev) without its per-call options
// and reflection: one request carrying the expected revision, sent by
// jscas.Writer, which reads the acknowledgement by hand and retries "no
// responders" (no stream leader, for a moment) as kv.Update does.
func (s *NATSStore) casWrite(ctx context.Context, key string, value []byte, rev uint64) (uint64, error) {
	w := jscas.Writer{Conn: s.js.Conn(), Stream: s.streamName, Timeout: s.requestTimeout()}
	return w.Write(ctx, s.writePrefix+key, value, rev, false)
}

// natsHeaderAllowance is kept free of the server's payload limit for the
// headers a write carries.
const natsHeaderAllowance = 512

// checkSize refuses, before any write, a record the server would refuse:
// larger than its max_payload less room for headers.
func (s *NATSStore) checkSize(op, key string, n int) error {
	if limit := int(s.js.Conn().MaxPayload()) - natsHeaderAllowance; n > limit {
		return conflictf("%s: KV key %q: the record is %d bytes, over the %d the server's max_payload (%d) leaves; store less input, artifact or binding",
			op, key, n, limit, s.js.Conn().MaxPayload())
	}
	return nil
}

// natsBatchMsg is one write of an atomic batch: key, value and the revision
// the key must have (0: no message), or no expectation; ttl, when positive,
// is the message's per-message TTL (a finished job's retention).
type natsBatchMsg struct {
	key    string
	value  []byte
	expect uint64
	check  bool
	ttl    time.Duration
}

// publishBatch writes msgs as one atomic batch and returns the sequence of
// the last. conflict is true when an expectation failed; nothing is written
// then.
func (s *NATSStore) publishBatch(ctx context.Context, op string, msgs []natsBatchMsg) (lastRev uint64, conflict bool, err error) {
	out := make([]*nats.Msg, len(msgs))
	for i, m := range msgs {
		if err := s.checkSize(op, m.key, len(m.value)); err != nil {
			return 0, false, err
		}
		nm := nats.NewMsg(s.keys.subject(m.key))
		nm.Data = m.value
		if m.check {
			nm.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(m.expect, 10))
		}
		if m.ttl > 0 {
			nm.Header.Set(jscas.TTLHeader, jscas.TTLValue(m.ttl))
		}
		out[i] = nm
	}
	timeout := s.requestTimeout()
	publish := s.batchPublish
	if publish == nil {
		publish = func(ctx context.Context, msgs []*nats.Msg) (uint64, error) {
			ack, err := jetstreamext.PublishMsgBatch(ctx, s.js, msgs,
				jetstreamext.BatchFlowControl{AckFirst: false, AckTimeout: timeout})
			if err != nil {
				return 0, err
			}
			return ack.Sequence, nil
		}
	}
	pctx, cancel := s.natsDeadline(ctx)
	defer cancel()
	lastRev, err = publish(pctx, out)
	if err == nil {
		return lastRev, false, nil
	}
	if jscas.IsConflict(err) {
		return 0, true, nil
	}
	return 0, false, s.writeFailed(ctx, op, fmt.Sprintf("atomic batch of %d writes", len(msgs)), err, s.keys.prefix)
}

// natsWriteResult is the answer to one write of writeAll: the revision
// written, or a conflict (the write's condition was refused; it wrote
// nothing).
type natsWriteResult struct {
	rev      uint64
	conflict bool
}

// writeAll sends msgs one after another without waiting in between, each
// a request of its own carrying its condition (when check is set), and
// then waits for every answer: one round trip for all of them. The
// stream applies them in the order sent, so a writer that dies part way
// leaves a prefix of them written. results[i] answers msgs[i]. Any
// failure other than a conflict ends the call with the error of the first
// failed write, which wraps ErrOutcomeUnknown when its answer did not
// come (see writeFailed).
func (s *NATSStore) writeAll(ctx context.Context, op string, msgs []natsBatchMsg) ([]natsWriteResult, error) {
	for _, m := range msgs {
		if err := s.checkSize(op, m.key, len(m.value)); err != nil {
			return nil, err
		}
	}
	rctx, cancel := s.natsDeadline(ctx)
	defer cancel()
	replies, err := s.replies.open(s.js.Conn())
	if err != nil {
		return nil, s.unavailable(ctx, op, "subscribe to write replies", err)
	}
	queues := make([]*natsReplyQueue, 0, len(msgs))
	defer func() {
		for _, q := range queues {
			replies.release(q)
		}
	}()
	nc := s.js.Conn()
	for _, m := range msgs {
		inbox, q := replies.await(1)
		queues = append(queues, q)
		nm := &nats.Msg{Subject: s.writePrefix + m.key, Reply: inbox, Data: m.value}
		if m.check {
			nm.Header = nats.Header{jetstream.ExpectedLastSubjSeqHeader: []string{strconv.FormatUint(m.expect, 10)}}
		}
		if err := nc.PublishMsg(nm); err != nil {
			return nil, s.writeFailed(ctx, op, "write KV key "+strconv.Quote(m.key), err, s.keys.subject(m.key))
		}
	}
	out := make([]natsWriteResult, len(msgs))
	for i, q := range queues {
		key := msgs[i].key
		reply, err := q.take(rctx)
		if err == nil && len(reply.Data) == 0 && reply.Header.Get("Status") == "503" {
			err = jetstream.ErrNoStreamResponse // no stream leader for a moment: nothing written
		}
		if err == nil {
			out[i].rev, err = jscas.ParsePubAck(reply.Data, s.streamName)
		}
		switch {
		case err == nil:
		case jscas.IsConflict(err):
			out[i].conflict = true
		default:
			return nil, s.writeFailed(ctx, op, "write KV key "+strconv.Quote(key), err, s.keys.subject(key))
		}
	}
	return out, nil
}

// writeFailed is unavailable for a write that failed without the server's
// refusal: a write that may have been applied (its answer did not come:
// a timeout, the caller's ctx ending, a connection lost after the
// request was sent) wraps ErrOutcomeUnknown beside the cause. A write the
// server answered with an error (jetstream.APIError), found no stream for
// (no responders) or refused for the user's permissions (its own subject,
// not the reply's inbox) changed nothing, and its error does not wrap
// ErrOutcomeUnknown. used are the write's subjects, as for unavailable.
func (s *NATSStore) writeFailed(ctx context.Context, op, what string, err error, used ...string) error {
	failed := s.unavailable(ctx, op, what, err, used...)
	if natsWriteRefused(s.js.Conn(), err, used) {
		return failed
	}
	return fmt.Errorf("%w (the write may have been applied): %w", ErrOutcomeUnknown, failed)
}

// natsWriteRefused reports a write error that shows the write was not
// applied: the server's error answer, no stream to take it, or a
// permission refusal of the write's own subject.
func natsWriteRefused(nc *nats.Conn, err error, used []string) bool {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) || errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, nats.ErrNoResponders) {
		return true
	}
	_, subject, ok := natsRefusal(nc, err, used)
	if !ok {
		return false
	}
	return !strings.HasPrefix(subject, natsperm.InboxPrefix(nc)) // a refused inbox loses the answer, not the write
}

// The bodies of the API requests the store sends, written by hand: the
// subjects in them are the bucket's, plain ASCII without quotes or
// backslashes, which JSON holds as they are; any other subject goes
// through encoding/json.

// natsMultiLastBody is a batched direct get of the last messages of
// subjects, ending at maxBytes.
func natsMultiLastBody(subjects []string, maxBytes int) ([]byte, error) {
	n := 48
	for _, s := range subjects {
		n += len(s) + 3
	}
	b := append(make([]byte, 0, n), `{"multi_last":[`...)
	ok := true
	for i, subj := range subjects {
		if i > 0 {
			b = append(b, ',')
		}
		if b, ok = kvstream.AppendSubject(b, subj); !ok {
			return json.Marshal(struct {
				MultiLast []string `json:"multi_last"`
				MaxBytes  int      `json:"max_bytes"`
			}{subjects, maxBytes})
		}
	}
	b = append(b, `],"max_bytes":`...)
	b = strconv.AppendInt(b, int64(maxBytes), 10)
	return append(b, '}'), nil
}

// natsPurgeBody is a STREAM.PURGE request for the messages of filter
// before sequence seq.
func natsPurgeBody(filter string, seq uint64) ([]byte, error) {
	b, ok := kvstream.AppendSubject(append(make([]byte, 0, 40+len(filter)), `{"filter":`...), filter)
	if !ok {
		return json.Marshal(struct {
			Filter string `json:"filter"`
			Seq    uint64 `json:"seq"`
		}{filter, seq})
	}
	b = append(b, `,"seq":`...)
	b = strconv.AppendUint(b, seq, 10)
	return append(b, '}'), nil
}
