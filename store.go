package jobkeys

import (
	"context"
	"errors"
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

// keyChange is one change reported by a valueWatcher: the KV key, the
// revision of the write, and the value written (nil for a delete).
type keyChange struct {
	kvKey   string
	value   []byte
	rev     uint64
	deleted bool
}

// valueWatcher is implemented by stores whose watch also reports each
// change's value and revision ([MemoryStore], [NATSStore]), in revision
// order and up to each key's latest revision (one replaced before the watch
// read it may be left out, as in WatchKeys). A [Watcher] over one keeps each
// waited-on key's latest state from the watch itself, so that it wakes only the
// waiters a change can help, and the coordinators it feeds decide and write
// without a read. watchValues is WatchKeys of every job type, with the
// change in full; value must not be modified.
type valueWatcher interface {
	watchValues(ctx context.Context, service string, changed func(keyChange)) (ended <-chan struct{}, err error)
}

// batchWriter is implemented by stores that can write successive states of
// one key as one all-or-nothing write, at consecutive revisions, for about
// the cost of one write: [NATSStore] on buckets whose stream allows atomic
// publish and does not stage batches on disk (not R1 file storage), and
// [MemoryStore] when batches were enabled on it (tests). A coordinator over
// one writes a batch of several state-changing operations of one key's
// lane as one writeBatch, each operation's own state a revision of its own
// (see groupcommit.go).
type batchWriter interface {
	// batches reports whether a write of several successive states of key
	// in service's bucket should be one writeBatch. It does no I/O: false
	// while the store has not opened the bucket.
	batches(service, key string) bool

	// writeBatch writes values as successive revisions of key on
	// condition that key's latest revision is revision (as Update: a
	// delete marker's included; 0 never matches), the last a delete
	// marker when del (its value is not written), and returns the
	// revision of the last: values[i] of n is at last-n+1+i. It writes
	// all of them or none: a conflict returns an error wrapping
	// ErrRevisionConflict, a value over the size limit one wrapping
	// ErrStateTooLarge, a batch the store could not take as a batch
	// (written one at a time it would be) one wrapping errBatchRefused.
	// Other errors leave unknown whether the batch was written, as for
	// Update.
	writeBatch(ctx context.Context, service, key string, values [][]byte, revision uint64, del bool) (last uint64, err error)
}

// errBatchRefused is a batchWriter.writeBatch the store refused as a
// batch, writing nothing: the same writes one at a time may succeed.
var errBatchRefused = errors.New("jobkeys: the store refused the write as a batch")

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
