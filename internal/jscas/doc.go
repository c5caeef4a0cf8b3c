// Package jscas is the JetStream compare-and-swap write both of jobkeys'
// NATS stores send (a [Writer]: kv.Update's message as one request, its
// acknowledgement read by hand), the recognition of a refused one
// ([IsConflict]), and the subjects both stores address: the API prefix of
// a JetStream context ([APIPrefix]) and the subjects its KV layer writes
// a bucket's keys to ([WritePrefix]).
//
// It is not in nats.go because nats.go has no such calls: kv.Update
// builds per-call options and decodes its acknowledgement through
// reflection on every write, jetstream has no atomic batch of one key's
// successive states, and the API prefix a context uses is an unexported
// field of its options. Both stores (the key layer's and package jobs')
// use this one copy, so that they address the same subjects as nats.go.
package jscas
