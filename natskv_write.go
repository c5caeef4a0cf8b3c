package jobkeys

import (
	"context"

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
