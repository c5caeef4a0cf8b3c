// Package boundedmap is the bounded map both of jobkeys' NATS stores keep
// their guesses in: hints that save a read or a round trip (the root
// store's delete markers; package jobs' running jobs, seen targets,
// pending jobs and listings), where a wrong or missing entry costs a
// failed write or an extra read, never a wrong result. A [Map] holds at
// most its Max entries; a new key in a full map evicts an arbitrary one,
// so that memory stays bounded whatever keys a program touches.
//
// It is not in nats.go because it has nothing to do with NATS: it is the
// one copy of what the two stores each wrote for themselves. It is not an
// LRU cache on purpose: the entries are cheap guesses, and an arbitrary
// eviction costs no bookkeeping per read.
package boundedmap
