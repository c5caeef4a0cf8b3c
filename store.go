package jobkeys

import "context"

// Store is the port the coordinator writes key state through: a revisioned
// key-value store with compare-and-swap, one bucket per service. Revisions
// are positive and increase with every write to a bucket; 0 is never a
// revision. Implementations must be safe for concurrent use, and must not
// keep a value slice passed to Create or Update after returning: the caller
// reuses it.
// [NATSStore] and [MemoryStore] implement it.
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
