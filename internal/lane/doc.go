// Package lane is the per-key queue of the key layer's engine
// (docs/design/keys-engine.md): one operation at a time holds a key's
// lane and writes the key; the others wait in memory, in arrival order,
// where the holder can take them into the batch it writes with one
// compare-and-swap (group commit, in the root package's groupcommit.go).
// It knows operations, contexts and order; it never looks at what an
// operation does or at a key's state.
//
// It is kept for what it saves on a hot key: concurrent writes of one
// process to one key would otherwise lose compare-and-swap races to each
// other; queued, each starts from the state the one before wrote, and a
// batch of them costs one round trip. BENCHMARKS.md, "Hot keys in one
// process", measures the cycle with it at about one write per cycle with
// 16 and 64 workers on one key (1.03–1.13 writes, 0–0.01 reads), and
// "Contended keys" the races it saves. Its lingers earn their place too,
// measured off against on (docs/design/keys-engine.md, "What each
// mechanism earns"): without the linger for a release the one-connection
// hot-key rows ran at 0.75× and 0.80× with twice the writes per cycle.
//
// Besides the queue it keeps the two waits a holder may spend for
// operations it expects (Linger): the acquisitions of waiters its write
// frees slots for, and, after a batch that took slots, one release
// (LingerForRelease), with the bookkeeping that makes a key whose
// handlers run long stop waiting for releases.
package lane
