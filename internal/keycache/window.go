package keycache

import (
	"context"
	mrand "math/rand/v2"
	"time"
)

// Lose records a race lost on the key and returns the pause to take before
// the next attempt: the window before it widened. The window starts at
// floor, doubles with every race lost on the key and halves with every
// commit (down to zero below floor), within ceiling, and is forgotten once
// the key has been quiet for WindowMemory windows. All of this
// coordinator's operations on the key share it, and on a contended key
// operations pace their first attempt by it (see PaceWindow): so writers
// settle near an even chance per attempt, instead of early losers backing
// off ever further while fresh writers keep winning, and writers woken
// together spread out.
func (e *Entry[T]) Lose(floor, ceiling time.Duration, now time.Time) time.Duration {
	e.mu.Lock()
	defer e.mu.Unlock()
	window := max(e.window, floor)
	e.window = min(2*window, ceiling)
	e.lostAt = now
	return window
}

// PaceWindow returns the window to pace a first attempt by, 0 on a key that
// is not contended (and then forgets a window that has gone quiet).
func (e *Entry[T]) PaceWindow(now time.Time) time.Duration {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.window > 0 && now.Sub(e.lostAt) < WindowMemory*e.window {
		return e.window
	}
	e.window = 0
	return 0
}

// SleepJitter sleeps for a uniformly random duration in (0, window], or
// until ctx ends, returning ctx.Err() then. A window of zero or less
// takes no pause.
func SleepJitter(ctx context.Context, window time.Duration) error {
	if window <= 0 {
		return nil
	}
	t := time.NewTimer(time.Duration(mrand.Int64N(int64(window))) + 1)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
