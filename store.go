package jobkeys

import (
	"context"
	"time"
)

// Store is the port the coordinator writes key state through: a revisioned
// key-value store with compare-and-swap, one bucket per service. Revisions
// are positive and increase with every write to a bucket; 0 is never a
// revision. Implementations must be safe for concurrent use, and must not
// keep a value slice passed to Create or Update after returning: the caller
// reuses it.
// [NATSStore] and [MemoryStore] implement it; package
// [github.com/jobkeys/jobkeys/keystoretest] checks an implementation
// against this contract.
//
// Beyond the four methods, a store may offer optional capabilities, each an
// interface that the coordinator, a [Watcher] or a [Sweeper] finds by type
// assertion, as io.Copy finds an io.WriterTo: [WatchableStore] and
// [ValueWatcher] (watches), [ListableStore] (listing), [BatchWriter]
// (atomic batches), [ValueLimiter] (the value size limit) and
// [ClockSource] (the server's clock). Each interface's doc says
// what it gains and what happens without it; keystoretest checks each one a
// store implements. A wrapper that holds a Store in an interface field
// (to count or fail calls, say) keeps a capability only by implementing it
// too; one that embeds a [*MemoryStore] or a [*NATSStore] has their
// methods, promoted, except that a Watcher does not use the promoted value
// watch (see ValueWatcher).
type Store interface {
	// Get returns the value and revision of key in service's bucket. A key
	// that does not exist or was deleted returns an error wrapping
	// ErrKeyNotFound.
	Get(ctx context.Context, service, key string) (value []byte, revision uint64, err error)

	// Create writes key only if it does not exist or was deleted, and
	// returns the new revision. An existing key returns an error wrapping
	// ErrRevisionConflict; a value over the store's size limit returns an
	// error wrapping ErrStateTooLarge and writes nothing.
	Create(ctx context.Context, service, key string, value []byte) (revision uint64, err error)

	// Update writes key only if its latest revision is revision, and
	// returns the new revision. As in NATS KV, a delete marker has a
	// revision too: Update at the revision of the marker that deleted key
	// writes it again. Any other revision, or a key never written, returns
	// an error wrapping ErrRevisionConflict; a value over the size limit
	// returns an error wrapping ErrStateTooLarge.
	Update(ctx context.Context, service, key string, value []byte, revision uint64) (newRevision uint64, err error)

	// Delete deletes key only if its latest revision (a delete marker's
	// included, as for Update) is revision. Any other revision returns an
	// error wrapping ErrRevisionConflict.
	Delete(ctx context.Context, service, key string, revision uint64) error
}

// WatchableStore is an optional capability of a [Store]: telling which keys of a
// service's bucket change. A [Watcher] needs it to wake blocked acquisitions
// when a slot is released. [NATSStore] and [MemoryStore] implement it.
type WatchableStore interface {
	// WatchKeys starts watching the keys of service's bucket that belong to
	// jobType, or to every job type when jobType is "", and returns once the
	// watch is in place: every write or delete after it returns is reported
	// by calling changed with the KV key, in the order of the writes, from
	// one goroutine at a time, except that a change a later change of the
	// same key replaces before the watch reads it may be reported only
	// through that later one ([NATSStore]'s watch reads the stream behind
	// the writes, and the bucket keeps a key's latest revision only).
	// [MemoryStore] reports every change. changed should return quickly;
	// while it runs, further changes wait.
	//
	// The watch ends when ctx is cancelled, or when the store can no longer
	// watch (its connection closed). The returned channel is closed once the
	// watch has ended; changed is not called after that. An error means no
	// watch was started.
	WatchKeys(ctx context.Context, service, jobType string, changed func(kvKey string)) (ended <-chan struct{}, err error)
}

// ValueChange is one change a [ValueWatcher] reports.
type ValueChange struct {
	// KVKey is the KV key written.
	KVKey string
	// Value is the value written; nil for a delete. The store must not
	// modify it after reporting it, and the receiver does not modify it
	// (a [Watcher] keeps it).
	Value []byte
	// Revision is the revision of the write (of the delete marker, for a
	// delete): positive.
	Revision uint64
	// Deleted reports a delete (or a purge).
	Deleted bool
}

// ValueWatcher is an optional capability of a [WatchableStore]: a watch
// that reports each change in full, its value and revision with its key.
// [NATSStore] and [MemoryStore] implement it; package
// [github.com/jobkeys/jobkeys/keystoretest] checks it.
//
// A [Watcher] over one keeps each waited-on key's latest state from the
// watch itself: it wakes only the waiters a change can help, and the
// coordinators it feeds decide and write without reading the key first
// (in BENCHMARKS.md, "Hot keys in one process": 0–0.01 reads per cycle
// with 16 workers on one key). Without it the Watcher watches through
// WatchKeys: every change of a waited-on key wakes its waiters, and each
// one reads the key before it writes.
//
// A type that embeds a [*MemoryStore] or a [*NATSStore] has their
// WatchValues too, promoted: a wrapper that changes what WatchKeys does
// must change WatchValues the same way, or hold the store in a named
// field so that it has no WatchValues of its own (then the Watcher
// watches through its WatchKeys).
type ValueWatcher interface {
	// WatchValues is WatchKeys of every job type of service's bucket
	// (jobType ""), with each change reported in full: in revision order,
	// up to each key's latest revision, except that a change a later
	// change of the same key replaces before the watch reads it may be
	// left out (as in WatchKeys). Its other rules are WatchKeys': it
	// returns once the watch is in place, reports the writes and deletes
	// after that, calls changed from one goroutine at a time, and closes
	// ended once the watch has ended (ctx cancelled, or the store can no
	// longer watch), after which changed is not called.
	WatchValues(ctx context.Context, service string, changed func(ValueChange)) (ended <-chan struct{}, err error)
}

// BatchWriter is an optional capability of a [Store]: writing successive
// states of one key as one all-or-nothing write, at consecutive
// revisions, for about the cost of one write. [NATSStore] implements it
// (it batches on buckets whose stream allows atomic publish and does not
// stage batches on disk, which rules out R1 file storage, where the
// server stages each batch in a temporary file store at about 3.4 ms
// against 70 µs for a write; see [NATSStore]'s "Atomic batches"); so does
// [MemoryStore], which batches only when its tests turn batches on.
// Package [github.com/jobkeys/jobkeys/keystoretest] checks it.
//
// A coordinator over one writes the state-changing operations that wait
// on one key together as one WriteBatch, each operation's own state a
// revision of its own, so that a release and the acquisition it lets in
// cost about one write (in BENCHMARKS.md, "Hot keys in one process":
// 1.03–1.07 writes per cycle with 16 and 64 workers on one key, and an
// atomic batch of 2 states 74–76 µs on the connection against 8 single
// writes 258–336 µs). Without it the coordinator writes each operation's
// state with its own Update (or Delete).
type BatchWriter interface {
	// Batches reports whether a write of several successive states of key
	// in service's bucket should be one WriteBatch. It does no I/O and is
	// called on the coordinator's hot path: false while the store has not
	// opened the bucket.
	Batches(service, key string) bool

	// WriteBatch writes values as successive revisions of key on
	// condition that key's latest revision is revision (as Update: a
	// delete marker's included; 0 never matches), the last a delete
	// marker when del (its value is not written), and returns the
	// revision of the last: values[i] of n is at last-n+1+i. It writes
	// all of them or none: a conflict returns an error wrapping
	// ErrRevisionConflict, a value over the size limit one wrapping
	// ErrStateTooLarge, a batch the store could not take as a batch
	// (written one at a time it would be) one wrapping ErrBatchRefused,
	// after which the coordinator writes the operations one at a time.
	// Other errors leave unknown whether the batch was written, as for
	// Update. It must not keep values or their slices after returning.
	WriteBatch(ctx context.Context, service, key string, values [][]byte, revision uint64, del bool) (last uint64, err error)
}

// ValueLimiter is an optional capability of a [Store]: telling the
// largest value a service's bucket takes. [NATSStore] (the bucket's
// MaxValueSize or the connection's max payload, less room for headers)
// and [MemoryStore] (see [MemoryStore.SetMaxValueSize]) implement it;
// package [github.com/jobkeys/jobkeys/keystoretest] checks it.
//
// A coordinator over one refuses an admission (with an error wrapping
// ErrStateTooLarge, writing nothing) when the key's state would outgrow
// the limit once every queued job held a slot, so that a key filled by
// admissions can always start its jobs. Without it admissions are checked
// against nothing but the write itself: a key may fill up with queued
// jobs that can never take a slot, each acquisition failing with
// ErrStateTooLarge.
type ValueLimiter interface {
	// MaxValueSize returns the largest value, in bytes, that Create,
	// Update and WriteBatch take in service's bucket: one byte more
	// returns an error wrapping ErrStateTooLarge. It may open the bucket.
	MaxValueSize(ctx context.Context, service string) (int, error)
}

// ClockSource is an optional capability of a [Store]: bounding this
// host's clock against the clock of the server that stamps a service's
// bucket. [NATSStore] implements it (from the server times it sees
// anyway, and a stream info request when its measurement is older than
// ten seconds; see clock.go); [MemoryStore], which is its own server,
// does not.
//
// A coordinator over one refuses to take a lease or to sweep while its
// clock is proven too far from the server's (see [ErrClockSkew]), and
// reports the bounds through [KeyCoordinator.ClockOffset]. Without it
// nothing is detected: ClockOffset knows nothing and ErrClockSkew is never
// returned.
type ClockSource interface {
	// ServerClockOffset returns what is known of offset = server clock −
	// local clock (time.Now) for service's bucket, as of at, the local
	// time it read after measuring (the coordinator shifts the bounds to
	// its Config.Now by it). It must not fail: what it cannot measure is
	// not known. It should do no I/O on most calls (it is called before
	// every acquisition).
	ServerClockOffset(ctx context.Context, service string) (offset ClockOffset, at time.Time)
}

// The targeted wake-ups of [WithWakeUps] (natskv_wake.go) are not a
// capability another store can offer: they are NATSStore's own protocol
// between its processes, found by the coordinator and the Watcher through
// unexported interfaces (wakeStore, localWaiters, wakeAheadStore).

// ListableStore is an optional capability of a [Store]: listing the keys of a
// service's bucket. A [Sweeper] needs it. [NATSStore] and [MemoryStore]
// implement it.
type ListableStore interface {
	// ListKeys returns the KV keys of service's bucket that belong to
	// jobType, or to every job type when jobType is "", sorted. Deleted keys
	// are left out. A bucket with no such key returns an empty list and no
	// error.
	ListKeys(ctx context.Context, service, jobType string) ([]string, error)
}

// keyFilter validates service and jobType ("" for all job types) and returns
// the KV key prefix they select, ending in ".".
func keyFilter(service, jobType string) (string, error) {
	if err := validateService(service); err != nil {
		return "", err
	}
	if jobType == "" {
		return service + ".", nil
	}
	if err := validateJobType(jobType); err != nil {
		return "", err
	}
	return service + "." + jobType + ".", nil
}
