// Package kvstream is what both of jobkeys' NATS stores do with a KV
// bucket's stream below nats.go's KV layer: create a bucket ([Create],
// with its storage and replicas checked by [CheckStorage]), turn on the
// stream settings a KeyValueConfig has no field for ([Allow]: atomic
// batch publish, per-message TTL), and read a key's last message through
// the stream leader ([LastBySubjectRequest], [ParseMsgGet], [Deleted]).
//
// It is not in nats.go because nats.go's KV layer has none of it:
// jetstream.KeyValueConfig cannot allow atomic publish or per-message
// TTL (a stream update can), and kv.Get reads through direct gets, which
// any replica may answer, possibly one that has not applied the latest
// writes; a STREAM.MSG.GET is answered by the leader, but nats.go's
// Stream.GetLastMsgForSubject gives no way to send it under the stores'
// own deadline and permission guards and to keep the server's stamp and
// the raw headers. The root package (the key layer) and package jobs use
// this one copy, each wrapping its errors in its own kinds.
package kvstream
