package jobs

import (
	"fmt"
	"time"
)

// Retention says how long a finished job is kept, by its final state. A
// field's zero value is its default; a negative value keeps such jobs for
// good. Once a job's retention has passed since it finished, its record
// (with its artifact) and its idempotency, target, list and active
// entries are deleted: it is no longer listed or found, and an enqueue
// with its idempotency key makes a new job (an idempotent replay after
// that is not a replay). A target entry is deleted only while it still
// names the finished job: a newer job of the target keeps it.
//
// A [NATSStore] deletes by per-message TTL (the server removes the
// messages; nothing sweeps): the write that finishes a job carries its
// retention and a second, and the job's idempotency, target and list
// entries are rewritten with the retention that is left (a read and up to
// three writes per finished job), so that they go a second or more before
// the record. Its bucket must allow per-message TTL (nats-server 2.11
// or later; [WithCreateBucket] allows it, on an existing bucket too). A
// [MemoryStore] deletes on its next call after the time, by its clock.
//
// Retention is set by [ClientConfig.Retention] on the store the client is
// made with, for the jobs that finish from then on (the last client made
// over a store sets it). A store used without a [Client], and a Store of
// your own (or one wrapped in another type), keeps every job until
// [Store.DeleteChannel].
type Retention struct {
	// Completed is how long a completed job is kept. Defaults to
	// RetentionCompletedDefault (24h).
	Completed time.Duration
	// Failed is how long a failed job is kept. Defaults to
	// RetentionFailedDefault (7 days).
	Failed time.Duration
	// Cancelled is how long a cancelled job is kept. Defaults to
	// RetentionCancelledDefault (24h).
	Cancelled time.Duration
	// Superseded is how long a superseded job is kept. Defaults to
	// RetentionSupersededDefault (24h).
	Superseded time.Duration
}

// The default retention of finished jobs, by final state (see [Retention]).
const (
	RetentionCompletedDefault  = 24 * time.Hour
	RetentionFailedDefault     = 7 * 24 * time.Hour
	RetentionCancelledDefault  = 24 * time.Hour
	RetentionSupersededDefault = 24 * time.Hour
)

// RetentionMin is the shortest positive retention: per-message TTLs are
// whole seconds, at least one.
const RetentionMin = time.Second

// RetentionKeep, as a field of [Retention], keeps such jobs for good.
const RetentionKeep time.Duration = -1

// retention is a Retention with its defaults applied: a positive duration
// per final state, or a negative one (keep).
type retention struct {
	completed, failed, cancelled, superseded time.Duration
}

// resolve checks r and applies its defaults. A positive field under
// RetentionMin is ErrConflict naming it.
func (r Retention) resolve() (retention, error) {
	out := retention{completed: r.Completed, failed: r.Failed, cancelled: r.Cancelled, superseded: r.Superseded}
	for _, f := range []struct {
		name string
		v    *time.Duration
		def  time.Duration
	}{
		{"Completed", &out.completed, RetentionCompletedDefault},
		{"Failed", &out.failed, RetentionFailedDefault},
		{"Cancelled", &out.cancelled, RetentionCancelledDefault},
		{"Superseded", &out.superseded, RetentionSupersededDefault},
	} {
		switch {
		case *f.v == 0:
			*f.v = f.def
		case *f.v < 0:
			*f.v = RetentionKeep
		case *f.v < RetentionMin:
			return retention{}, conflictf("Retention.%s %v is under the shortest retention, %v (or negative: keep)", f.name, *f.v, RetentionMin)
		}
	}
	return out, nil
}

// of is how long a job in state st is kept: negative for an active state
// or a kept one.
func (r *retention) of(st State) time.Duration {
	if r == nil {
		return RetentionKeep
	}
	switch st {
	case StateCompleted:
		return r.completed
	case StateFailed:
		return r.failed
	case StateCancelled:
		return r.cancelled
	case StateSuperseded:
		return r.superseded
	}
	return RetentionKeep
}

// keepsAll reports whether r deletes nothing.
func (r *retention) keepsAll() bool {
	return r.completed < 0 && r.failed < 0 && r.cancelled < 0 && r.superseded < 0
}

// retentionUser is a store that deletes finished jobs after their
// retention: both stores of the package. explicit says whether the user
// set a field (a zero Retention is the default): a store that cannot
// delete refuses an explicit retention and warns of a default one.
type retentionUser interface {
	useRetention(r retention, explicit bool) error
}

// useRetention hands a client's retention to its store. A store that is
// not a retentionUser (a custom Store) keeps its jobs as it does.
func useRetention(store Store, r Retention) error {
	res, err := r.resolve()
	if err != nil {
		return err
	}
	u, ok := store.(retentionUser)
	if !ok {
		return nil
	}
	if err := u.useRetention(res, r != Retention{}); err != nil {
		return fmt.Errorf("ClientConfig.Retention: %w", err)
	}
	return nil
}
