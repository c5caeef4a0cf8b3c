package jobs

import (
	"context"
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// Local deadlines. A claim, like a slot lease, is good until a time the
// store compares with its clock; the runtime cannot ask the store before
// every step of a handler, so it counts each on its own monotonic clock:
// a claim made or renewed by a request that started at s is good, here,
// until s + TTL − margin (the local deadline), whenever the reply came.
// The start, not the reply: the store may have written the claim at any
// time in between, and a reply that came late (a slow network, a process
// stopped while it waited) must not stretch the claim. The margin (half
// the heartbeat interval, or half the gap between interval and TTL if
// less) leaves time for the handler to stop before another worker may
// claim the job. Wall clocks play no part, so a clock step on this host
// moves no local deadline.
//
// The handler's context ([runContext]) ends at the earlier of the claim's
// and the slot's local deadlines, with ErrClaimLost or ErrSlotLost, and
// at the kind's Timeout, with ErrTimeout (a lost claim wins when several
// have passed: nothing may be written for it). It does not rely on a
// timer's goroutine alone: a process that was stopped (SIGSTOP, a paused
// VM, a long GC) wakes with every expired timer due at once and runs the
// woken goroutines in any order, so the handler could act before the
// goroutine that ends its context. The context checks the deadlines
// itself whenever it is asked (Done, Err, Value, and so Cause), and the
// runtime checks the claim's before each of its writes: past it, it
// writes nothing.

// noSlot marks a leaseClock without a slot.
const noSlot = math.MaxInt64

// leaseClock keeps the local deadlines of one claim and of its slot once
// acquired. Safe for concurrent use.
type leaseClock struct {
	base     time.Time // a monotonic reading the offsets count from
	claimTTL time.Duration
	slotTTL  time.Duration
	margin   time.Duration
	// The start of the request that last made or renewed the claim, and
	// the slot's (noSlot: none), as offsets from base.
	claimFrom atomic.Int64
	slotFrom  atomic.Int64
}

// newLeaseClock returns the clock of a claim made by a request that
// started at start (a time.Now reading: monotonic).
func newLeaseClock(start time.Time, claimTTL, slotTTL, margin time.Duration) *leaseClock {
	lc := &leaseClock{base: start, claimTTL: claimTTL, slotTTL: slotTTL, margin: margin}
	lc.slotFrom.Store(noSlot)
	return lc
}

// deadlineMargin is the margin of a kind's policy: half the heartbeat
// interval, or half the gap between the interval and the TTL if less.
func deadlineMargin(interval, ttl time.Duration) time.Duration {
	return max(min(interval/2, (ttl-interval)/2), 0)
}

// renewedClaim records a renewal of the claim by a request that started
// at start.
func (lc *leaseClock) renewedClaim(start time.Time) { lc.claimFrom.Store(int64(start.Sub(lc.base))) }

// acquiredSlot records an acquisition or renewal of the slot by a request
// that started at start.
func (lc *leaseClock) acquiredSlot(start time.Time) { lc.slotFrom.Store(int64(start.Sub(lc.base))) }

// claimDeadline returns the claim's local deadline.
func (lc *leaseClock) claimDeadline() time.Time {
	return lc.base.Add(time.Duration(lc.claimFrom.Load()) + lc.claimTTL - lc.margin)
}

// deadline returns the earlier of the claim's and the slot's local
// deadlines.
func (lc *leaseClock) deadline() time.Time {
	d := lc.claimDeadline()
	if from := lc.slotFrom.Load(); from != noSlot {
		d = minTime(d, lc.base.Add(time.Duration(from)+lc.slotTTL-lc.margin))
	}
	return d
}

// claimPast reports whether the claim's local deadline has passed.
func (lc *leaseClock) claimPast() bool { return !time.Now().Before(lc.claimDeadline()) }

// lost returns ErrClaimLost when the claim's local deadline has passed at
// now, else ErrSlotLost when the slot's has, else nil.
func (lc *leaseClock) lost(now time.Time) error {
	if !now.Before(lc.claimDeadline()) {
		return ErrClaimLost
	}
	if !now.Before(lc.deadline()) {
		return ErrSlotLost
	}
	return nil
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// runContext is a handler's context: a context the runtime ends with a
// cause (control calls, a lost renewal, shutdown), which also ends itself
// when a local deadline or the kind's Timeout passes, checked on every
// call of Done, Err and Value (see Local deadlines above) and by a timer.
type runContext struct {
	context.Context // ended by cancel
	cancel          context.CancelCauseFunc
	clock           *leaseClock
	timeoutAt       time.Time // zero: no Timeout

	mu      sync.Mutex // guards timer and stopped
	timer   *time.Timer
	stopped bool
}

// newRunContext returns the context of a handler whose claim and slot are
// kept by clock, under parent (which should not end: the runtime ends
// it); timeout > 0 is the kind's Timeout, counted from now. Call stop
// when the handler has returned.
func newRunContext(parent context.Context, clock *leaseClock, timeout time.Duration) *runContext {
	ctx, cancel := context.WithCancelCause(parent)
	rc := &runContext{Context: ctx, cancel: cancel, clock: clock}
	now := time.Now()
	if timeout > 0 {
		rc.timeoutAt = now.Add(timeout)
	}
	rc.mu.Lock()
	rc.timer = time.AfterFunc(rc.next().Sub(now), rc.fire)
	rc.mu.Unlock()
	return rc
}

// next returns the earliest time the context must end by.
func (rc *runContext) next() time.Time {
	d := rc.clock.deadline()
	if !rc.timeoutAt.IsZero() {
		d = minTime(d, rc.timeoutAt)
	}
	return d
}

// check ends the context if a deadline has passed, with the cause of the
// first that matters: a lost claim, then a lost slot, then the Timeout.
func (rc *runContext) check() {
	select {
	case <-rc.Context.Done():
		return
	default:
	}
	now := time.Now()
	cause := rc.clock.lost(now)
	if cause == nil && !rc.timeoutAt.IsZero() && !now.Before(rc.timeoutAt) {
		cause = ErrTimeout
	}
	if cause != nil {
		rc.cancel(cause)
	}
}

// fire is the timer's: it checks, and sets the timer again for the next
// deadline while the context lives (renewals move the deadlines on).
func (rc *runContext) fire() {
	rc.check()
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if rc.stopped || rc.Context.Err() != nil {
		return
	}
	rc.timer.Reset(time.Until(rc.next()))
}

// stop ends the context and its timer.
func (rc *runContext) stop() {
	rc.cancel(nil)
	rc.mu.Lock()
	rc.stopped = true
	rc.timer.Stop()
	rc.mu.Unlock()
}

// Deadline returns the end of the kind's Timeout, if it has one. (The
// local deadlines move with every renewal: they are not a deadline in
// the sense of [context.Context].)
func (rc *runContext) Deadline() (time.Time, bool) {
	if rc.timeoutAt.IsZero() {
		return rc.Context.Deadline()
	}
	return rc.timeoutAt, true
}

// Done checks the deadlines first: a select on it that was entered after
// a deadline passed finds it closed.
func (rc *runContext) Done() <-chan struct{} {
	rc.check()
	return rc.Context.Done()
}

// Err checks the deadlines first.
func (rc *runContext) Err() error {
	rc.check()
	return rc.Context.Err()
}

// Value checks the deadlines first, so that [context.Cause] (which finds
// the cause through Value) sees a deadline that passed.
func (rc *runContext) Value(key any) any {
	rc.check()
	return rc.Context.Value(key)
}

func (rc *runContext) String() string { return "jobs.Run context" }
