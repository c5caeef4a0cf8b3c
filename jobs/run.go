package jobs

import (
	"context"
	"errors"
	"fmt"
	"sync"
)

// Why a handler's context ended. [Run.Context] carries one of them as its
// [context.Cause]; match them with [errors.Is].
var (
	// ErrClaimLost: the job's claim was taken over (it expired and another
	// worker claimed the job) or could not be renewed. The runtime writes
	// nothing to the job record after it.
	ErrClaimLost = errors.New("jobs: claim lost")
	// ErrSlotLost: the job's slot on its key was lost (its lease expired and
	// was swept or taken over). The job is handed back without a failure.
	ErrSlotLost = errors.New("jobs: key slot lost")
	// ErrPaused: the job was paused.
	ErrPaused = errors.New("jobs: job paused")
	// ErrCancelled: the job was cancelled.
	ErrCancelled = errors.New("jobs: job cancelled")
	// ErrSuperseded: the job was superseded (a newer job for its target, or
	// a Supersede call).
	ErrSuperseded = errors.New("jobs: job superseded")
	// ErrTimeout: the kind's Timeout passed. It counts as a failure.
	ErrTimeout = errors.New("jobs: job timed out")
	// ErrStopping: the client is stopping and the grace period passed. The
	// job is handed back without a failure.
	ErrStopping = errors.New("jobs: client stopping")
)

// Run is one attempt of a job, handed to the kind's Work function. Its
// methods are safe for concurrent use by the handler's goroutines while
// Work runs; they must not be called after Work returns.
type Run struct {
	c   *Client
	ctx context.Context
	// writing serializes the claimed writes of the attempt (renewals,
	// progress): each changes the job's revision, which the next expects.
	// It is held through their I/O; mu, which guards job, is not, so
	// that Job does not wait for a renewal in flight.
	writing sync.Mutex
	mu      sync.Mutex
	job     Job
	claim   Claim
	clock   *leaseClock // the local deadlines of claim and slot
}

// Job returns the job record as it was claimed (Attempts counts this
// attempt; Failures the attempts that failed before it), with the revision
// of the last write of this run. Its ClaimGeneration is the fencing token
// of this attempt: every claim of the job has a higher one than the
// claims before it, so a system the handler writes to can refuse a write
// that carries a lower token than one it has seen (the write of a
// handler whose claim was lost without its knowing).
func (r *Run) Job() Job {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.job
}

// Context returns the handler's context (the one Work was given). It ends
// at the latest at the claim's local deadline (see Claims and fencing in
// the package doc), which its Done, Err and Value methods check
// themselves: a process that wakes past it finds it ended.
func (r *Run) Context() context.Context { return r.ctx }

// Progress records a progress entry (stage and state; a trimmed label of 1
// to LabelLimit characters) in the job record. stage must match
// ^[a-z][a-z0-9-]{0,63}$ and state must not be ProgressInterrupted, which
// needs a reason: use [Run.Interrupted]. It fails with the store's error,
// or with the context's cause once the handler's context has ended.
func (r *Run) Progress(stage, label string, state ProgressState) error {
	return r.progress(stage, label, state, "")
}

// Interrupted records that stage was interrupted, with reason (matching
// ^[a-z][a-z0-9-]{0,63}$).
func (r *Run) Interrupted(stage, label, reason string) error {
	return r.progress(stage, label, ProgressInterrupted, reason)
}

func (r *Run) progress(stage, label string, state ProgressState, reason string) error {
	r.writing.Lock()
	defer r.writing.Unlock()
	// Err checks the local deadlines: nothing is written for a claim past
	// its own (after the wait for the lock, which a renewal may hold).
	if r.ctx.Err() != nil {
		return fmt.Errorf("jobs: progress of job %q: %w", r.claim.JobID, context.Cause(r.ctx))
	}
	j, err := r.c.store.AppendProgress(r.ctx, ProgressRequest{Claim: r.claim, Stage: stage, Label: label, State: state, Reason: reason})
	if err != nil {
		return err
	}
	r.mu.Lock()
	r.job = j
	r.mu.Unlock()
	return nil
}
