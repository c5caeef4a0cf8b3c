package jobkeys

import (
	"context"
	"fmt"

	"github.com/jobkeys/jobkeys/internal/jscas"
)

// The compare-and-swap writes of NATSStore, one level below nats.go's KV
// layer: the message kv.Update (or kv.Delete) would publish, on the same
// subject with the same headers and data, sent by jscas.Writer as a
// request on the connection and its publish acknowledgement read by hand
// (see internal/jscas for what that saves and what stays as in nats.go).
//
// The key is checked by validKVKey instead of kv.Update's regular
// expression (stricter than nats.go's rule: a key it refuses goes through
// the KV layer, which gives the error it always gave). Mirrors keep the KV
// layer (their writes go to the origin under other subject rules), as does
// kv.Create's read of a delete marker, which only the KV layer's stream
// handle reads with the bucket's own read rules.

// directWrites reports whether the store writes key of b itself.
func (b *natsBucket) directWrites(key string) bool {
	return b.writePrefix != "" && validKVKey(key)
}

// writeKey publishes value to key's subject on condition that key's last
// revision is revision (0: that key has no message), or a delete marker
// (no data, KV-Operation: DEL) when del is set, and returns the revision
// written. b.directWrites(key) must hold. Errors are kv.Update's (see
// jscas.Writer.Write); casError maps them to the store's.
func (s *NATSStore) writeKey(ctx context.Context, b *natsBucket, key string, value []byte, revision uint64, del bool) (uint64, error) {
	w := jscas.Writer{Conn: s.js.Conn(), Stream: b.stream, Timeout: b.writeTimeout}
	return w.Write(ctx, b.writePrefix+key, value, revision, del)
}

var _ BatchWriter = (*NATSStore)(nil)

// Batches implements BatchWriter: the bucket is open, its stream takes
// atomic batches where they pay (natsBucket.batches), and the store writes
// key itself.
func (s *NATSStore) Batches(service, key string) bool {
	s.mu.Lock()
	b := s.buckets[service]
	s.mu.Unlock()
	return b != nil && b.batches.Load() && b.directWrites(key)
}

// WriteBatch implements BatchWriter with one JetStream atomic batch on the
// key's subject (jscas.Writer.WriteBatch): each message is the one Update
// (or Delete, for the last when del) would write, plus the batch headers,
// the condition on the first only. A stream that no longer allows atomic
// publish stops the bucket's batches.
func (s *NATSStore) WriteBatch(ctx context.Context, service, key string, values [][]byte, revision uint64, del bool) (uint64, error) {
	gctx, pg, err := s.begin(ctx, natsOpWrite, service, "write a batch to", key)
	if err != nil {
		return 0, err
	}
	defer pg.done()
	last, err := s.writeBatchKey(gctx, service, key, values, revision, del)
	return last, explainPermission(ctx, gctx, "write a batch to", key, err)
}

func (s *NATSStore) writeBatchKey(ctx context.Context, service, key string, values [][]byte, revision uint64, del bool) (uint64, error) {
	b, err := s.bucket(ctx, service)
	if err != nil {
		return 0, err
	}
	if !b.directWrites(key) {
		return 0, fmt.Errorf("%w: key %s is not written on the connection", ErrBatchRefused, key)
	}
	for i, v := range values {
		if len(v) > b.maxValueSize && !(del && i == len(values)-1) {
			return 0, tooLarge(len(v), b.maxValueSize)
		}
	}
	if revision == 0 {
		return 0, fmt.Errorf("%w: update %s: revision 0", ErrRevisionConflict, key)
	}
	w := jscas.Writer{Conn: s.js.Conn(), Stream: b.stream, Timeout: b.writeTimeout}
	last, err := w.WriteBatch(ctx, b.writePrefix+key, values, revision, del)
	switch {
	case err == nil:
		if del {
			b.markers.put(key, last)
		}
		return last, nil
	case jscas.IsBatchRefused(err):
		if jscas.IsBatchDisabled(err) {
			b.batches.Store(false)
		}
		return 0, fmt.Errorf("%w: %d writes to %s: %w", ErrBatchRefused, len(values), key, err)
	}
	return 0, casError(fmt.Sprintf("write a batch of %d to", len(values)), key, err)
}
