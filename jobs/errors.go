package jobs

import (
	"errors"
	"fmt"
)

// The four kinds of failure a [Store] reports. Match them with [errors.Is];
// the errors a store returns wrap one of them with what was wrong and where
// (the request field, the job, the KV key).
var (
	// ErrConflict reports a request that cannot be applied to the job as it
	// is: a bad or oversize field, a replayed idempotency key with another
	// fingerprint, a lost claim, a stale expected revision, a state the
	// call does not apply to, or a [Config.Guard] that refused the write.
	ErrConflict = errors.New("jobs: conflict")

	// ErrNotFound reports a channel or job that does not exist.
	ErrNotFound = errors.New("jobs: not found")

	// ErrCorrupt reports a stored record that does not decode or validate:
	// an unknown state, a running job without owner or expiry, a progress
	// entry that breaks the rules. The record is left as it is.
	ErrCorrupt = errors.New("jobs: corrupt record")

	// ErrUnavailable reports a store or channel registry that could not be
	// reached or did not answer.
	ErrUnavailable = errors.New("jobs: store unavailable")
)

// conflictf returns an ErrConflict error with a message naming the field.
func conflictf(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrConflict, fmt.Sprintf(format, args...))
}

// notFoundf returns an ErrNotFound error.
func notFoundf(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrNotFound, fmt.Sprintf(format, args...))
}

// corruptf returns an ErrCorrupt error.
func corruptf(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrCorrupt, fmt.Sprintf(format, args...))
}
