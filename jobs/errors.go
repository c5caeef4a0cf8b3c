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

// ErrOutcomeUnknown reports a write whose outcome the caller cannot know:
// its request may have been applied (a timeout or a lost connection after
// it was sent), or a call that writes more than once stopped after its
// first write. The error says what stands and what is unknown, naming the
// job (and, for an enqueue, its idempotency key). A [Client.Enqueue] or
// [Store.Enqueue] that fails so is completed by a replay: the same request
// again (the same idempotency key and fingerprint), which returns the job
// with the outcome that stands and makes any step still missing. An error
// that does not match it (a conflict, an invalid request, a write the
// server refused) means that the call changed nothing. It is matched
// beside the error's cause ([ErrUnavailable], or the caller's ctx's
// error).
var ErrOutcomeUnknown = errors.New("jobs: outcome unknown")
