package jobs

import (
	"errors"
	"time"
)

// Permanent marks err as one that retrying cannot fix (bad input, a
// refused request): returned from a kind's Work, alone or wrapped (with
// fmt.Errorf's %w, or errors.Join), it fails the job now, counting the
// failure, whatever the kind's MaxFailures, with "permanent: " and the
// error's text as the record's Reason. The error is kept:
// errors.Is(Permanent(e), e) holds, errors.As sees through it, and its
// text is err's. Permanent(nil) returns nil, so that
// `return out, jobs.Permanent(err)` after a call that succeeded settles
// the job.
//
// An attempt the runtime stopped (its claim or slot lost, the job paused,
// cancelled or superseded, the client stopping) ends as it would with any
// other error: a permanent error does not override those.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &permanentError{err: err}
}

type permanentError struct{ err error }

func (e *permanentError) Error() string { return e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

// Snooze returns an error that, returned from a kind's Work (alone or
// wrapped), hands the job back, pending again after d, without counting
// a failure: the record's Reason is "snoozed for " and d, its Failures
// are unchanged. Its Attempts still counts the attempt (Attempts counts
// claims), and the next attempt is a retry to the key layer. d ≤ 0 makes
// the job due at once. A Snooze wrapped in a [Permanent] error is a
// permanent failure. Stopped attempts end as with [Permanent].
func Snooze(d time.Duration) error {
	return &snoozeError{d: max(d, 0)}
}

type snoozeError struct{ d time.Duration }

func (e *snoozeError) Error() string { return "jobs: snoozed for " + e.d.String() }

// outcomeOf says how an attempt whose Work returned werr (not nil) ends:
// permanent (fail now), or snoozed for the returned delay, or neither
// (a failure counted against the budget).
func outcomeOf(werr error) (permanent bool, snooze time.Duration, snoozed bool) {
	var p *permanentError
	if errors.As(werr, &p) {
		return true, 0, false
	}
	var s *snoozeError
	if errors.As(werr, &s) {
		return false, s.d, true
	}
	return false, 0, false
}
