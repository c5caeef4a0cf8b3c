package jobkeys

import (
	"errors"
	"fmt"
)

// Sentinel errors. Match them with [errors.Is]; the errors the package returns
// wrap them with the detail of what was wrong and where.
var (
	// ErrInvalidPolicy reports a Policy field with a value that cannot be used.
	ErrInvalidPolicy = errors.New("jobkeys: invalid policy")

	// ErrInvalidName reports a service or job type that cannot be part of a
	// NATS KV bucket name or key token.
	ErrInvalidName = errors.New("jobkeys: invalid name")

	// ErrInvalidKey reports a payload from which the policy's key template
	// cannot derive a key: a pointer that does not resolve, or resolves to
	// something other than a string, a finite number or a boolean.
	ErrInvalidKey = errors.New("jobkeys: cannot derive job key")

	// ErrInvalidRequest reports a request with a missing or malformed field,
	// such as an empty job id.
	ErrInvalidRequest = errors.New("jobkeys: invalid request")

	// ErrCorruptState reports key state in the store that does not parse or
	// does not validate. The stored value is left untouched.
	ErrCorruptState = errors.New("jobkeys: corrupt key state")

	// ErrForeignState reports key state that parses but belongs to another
	// service, job type or key hash than the KV key it was read from. The
	// stored value is left untouched.
	ErrForeignState = errors.New("jobkeys: key state belongs to another key")

	// ErrStateTooLarge reports a new key state whose encoding exceeds the
	// store's value size limit, or an admission that would leave the key no
	// room for all its queued jobs to take slots within that limit. Nothing
	// is written.
	ErrStateTooLarge = errors.New("jobkeys: key state too large")

	// ErrContention reports that an operation gave up after losing
	// Config.MaxAttempts compare-and-swap races to concurrent writers (a
	// renewal or release: after losing races until its lease expired).
	ErrContention = errors.New("jobkeys: too much contention on key")

	// ErrClockOutOfRange reports that a time the coordinator was about to
	// write (the clock's now, or a lease expiry from it) falls outside the
	// years 0000 to 9999, which key state cannot hold in a form every
	// reader accepts. Nothing is written: the clock (Config.Now) is wrong.
	ErrClockOutOfRange = errors.New("jobkeys: clock out of range")

	// ErrClockSkew reports that a coordinator refused to take a lease (an
	// acquisition) or to sweep because its clock (Config.Now) is proven to
	// be at least half of HeartbeatTTL − HeartbeatInterval away from the
	// clock of the NATS server that stamps the bucket: hosts that far from
	// the server may be too far from each other for leases to keep jobs
	// apart (see Clocks in [Policy]'s doc). Nothing is written; the error
	// says the measured offset, the limit and where. Renewals and releases
	// of slots already held go on. Only stores that see the server's time
	// detect it ([NATSStore]; not [MemoryStore]); Config.IgnoreClockSkew
	// turns the check off.
	ErrClockSkew = errors.New("jobkeys: clock skew")

	// ErrBucketNotFound reports that the KV bucket for a service does not
	// exist and the store was not configured to create it.
	ErrBucketNotFound = errors.New("jobkeys: bucket not found")

	// ErrKeyNotFound is returned by a [Store] for a key that does not exist
	// or was deleted.
	ErrKeyNotFound = errors.New("jobkeys: key not found")

	// ErrRevisionConflict is returned by a [Store] when a compare-and-swap
	// write finds a revision other than the one it expected.
	ErrRevisionConflict = errors.New("jobkeys: revision conflict")

	// ErrBatchRefused is returned by a [BatchWriter]'s WriteBatch that
	// could not take the writes as one batch (a NATS stream that no longer
	// allows atomic publish, too many batches in flight on the server).
	// Nothing is written: the same writes one at a time may succeed, and
	// the coordinator makes them so.
	ErrBatchRefused = errors.New("jobkeys: the store refused the write as a batch")

	// ErrBlocked reports that a job did not get a slot and its handler did
	// not run: [Runner.TryRun] found the key busy, [Runner.Run] waited
	// RunnerConfig.MaxWait in vain, or the job is not queued. The error is a
	// [*BlockedError] that carries the blocked [Acquisition].
	ErrBlocked = errors.New("jobkeys: job blocked")

	// ErrLeaseLost is the cause (see [context.Cause]) with which a handler's
	// context is cancelled when its lease is gone: a renewal found the slot
	// taken over or released, or renewals failed until the lease expired.
	ErrLeaseLost = errors.New("jobkeys: lease lost")

	// ErrStaleCompletion reports that a job's handler finished but its slot
	// was gone when it was released: it had been taken over after the lease
	// expired, so another run of the key may have overlapped this one.
	ErrStaleCompletion = errors.New("jobkeys: stale completion")

	// ErrWatcherClosed reports a use of a [Watcher] after its Close.
	ErrWatcherClosed = errors.New("jobkeys: watcher closed")

	// ErrPermission reports that the NATS server refused a publish or
	// subscription a [NATSStore] call needed, for lack of permission: the
	// error names the subject. The call's own error (often a timeout) is
	// wrapped too. See [NATSStore] for the permissions a worker needs.
	ErrPermission = errors.New("jobkeys: NATS permission denied")
)

// StateError is the error for key state that cannot be used: it names the KV
// key and wraps [ErrCorruptState], [ErrForeignState] or [ErrStateTooLarge]
// together with the detail.
type StateError struct {
	KVKey  string // the KV key the state was read from or was to be written to
	Reason string // what was wrong
	Err    error  // the sentinel: ErrCorruptState, ErrForeignState or ErrStateTooLarge
}

// Error implements the error interface.
func (e *StateError) Error() string {
	return fmt.Sprintf("%v: KV key %q: %s", e.Err, e.KVKey, e.Reason)
}

// Unwrap returns the sentinel the error wraps.
func (e *StateError) Unwrap() error { return e.Err }
