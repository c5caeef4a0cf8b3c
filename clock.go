package jobkeys

import (
	"context"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// Clock skew detection (see Clocks in [Policy]'s doc, and [ErrClockSkew]).
//
// Leases are timestamps of the host that wrote them, compared against the
// clock of whichever host looks next. A host whose clock runs ahead sees
// live leases as expired and takes them over (or sweeps them); one whose
// clock runs behind writes leases that the other hosts see expire early.
// Either way, two hosts whose clocks differ by HeartbeatTTL −
// HeartbeatInterval or more can both hold a slot. No host can see the
// other hosts' clocks, but every host sees the clock of the NATS server
// that stamps its bucket's messages: a host within half that margin of the
// server is within the whole margin of every other such host. So a
// coordinator refuses to take a lease (an acquisition, whether or not it
// takes an expired slot over) or to sweep while it can prove its clock
// (Config.Now) is half the margin or more away from the server's.
//
// The proof is an interval that holds offset = server clock − local clock,
// built from what the store sees anyway, at no extra round trip on the hot
// path:
//
//   - a request sent at local time t0 whose reply, received at t1, carries
//     a time ts the server read while answering: ts − t1 ≤ offset ≤ ts − t0.
//     [NATSStore] gets one when it opens a bucket (the stream info it reads
//     then carries the server's time) and from a rare probe of the same
//     stream info (see clockProbeAfter);
//   - a message the server stamped ts and the store received at t_r (a
//     value read by Get, a change delivered by a watch, a [Watcher]'s
//     included): offset ≥ ts − t_r, a lower bound only, since the message
//     may be old.
//
// Only a bound that excludes zero by the limit proves skew; the width of
// the interval (a round trip) only delays detection, it never refuses a
// host that is in fact close to the server. Stores that do not see a
// server's time ([MemoryStore], which is its own server, and wrappers of
// other stores) detect nothing.

// Clock estimate timing.
const (
	// clockBoundAge is how long a measured bound is used: the local clock
	// drifts (some tens of microseconds a second under NTP), and a bound
	// older than this is dropped.
	clockBoundAge = 30 * time.Second
	// clockProbeAfter is the age of the upper bound (or the lower one) at
	// which the next check probes the server for a fresh two-sided
	// measurement: one stream info request per bucket and store every
	// clockProbeAfter at most, on the call that finds it due.
	clockProbeAfter = 10 * time.Second
	// clockProbeRetry spaces the probes of a bucket whose probe failed.
	clockProbeRetry = time.Second
	// clockProbeTimeout bounds a probe, whatever the call's deadline: a
	// slow probe must not hold up the acquisition that triggered it for
	// long (the acquisition goes on without it).
	clockProbeTimeout = time.Second
	// clockStepTolerance is the largest difference between the wall clock
	// and the monotonic clock elapsed since a bound was measured that is
	// taken for drift. More is a step of the wall clock (or a suspend),
	// after which the bound no longer holds and is dropped.
	clockStepTolerance = 50 * time.Millisecond
)

// clockBounds is what is known of offset = server clock − local clock:
// lo ≤ offset when hasLo, offset ≤ hi when hasHi.
//
// An offset may lie beyond what a Duration holds (about 292 years either
// way): time.Time.Sub saturates, and so does every sum here (satAdd).
// A saturated lower bound (durationMax) is still a lower bound, and a
// saturated upper bound (durationMin) still an upper one; a lower bound
// at durationMin or an upper one at durationMax says nothing and is not
// kept (see lowerBound, upperBound).
type clockBounds struct {
	lo, hi       time.Duration
	hasLo, hasHi bool
}

// The range of a Duration, at whose ends the arithmetic of clock bounds
// saturates.
const (
	durationMin = time.Duration(math.MinInt64)
	durationMax = time.Duration(math.MaxInt64)
)

// satAdd returns a + b, saturated at durationMin and durationMax.
func satAdd(a, b time.Duration) time.Duration {
	s := a + b
	switch {
	case a > 0 && b > 0 && s < 0:
		return durationMax
	case a < 0 && b < 0 && s >= 0:
		return durationMin
	}
	return s
}

// lowerBound reports whether off, a saturated difference or sum, bounds
// the offset from below: durationMin may stand for anything smaller.
func lowerBound(off time.Duration) bool { return off != durationMin }

// upperBound reports whether off, a saturated difference or sum, bounds
// the offset from above: durationMax may stand for anything larger.
func upperBound(off time.Duration) bool { return off != durationMax }

// shift returns b for a local clock that reads d behind this one (offset
// grows by d). d is a saturated difference (time.Time.Sub): at
// durationMax the true shift may be larger, which leaves no upper bound,
// at durationMin smaller, which leaves no lower bound.
func (b clockBounds) shift(d time.Duration) clockBounds {
	if b.hasLo {
		b.lo = satAdd(b.lo, d)
		b.hasLo = lowerBound(b.lo) && d != durationMin
	}
	if b.hasHi {
		b.hi = satAdd(b.hi, d)
		b.hasHi = upperBound(b.hi) && d != durationMax
	}
	if !b.hasLo {
		b.lo = 0
	}
	if !b.hasHi {
		b.hi = 0
	}
	return b
}

// minAbs returns the least |offset| the bounds allow, durationMax when
// that is durationMax or more.
func (b clockBounds) minAbs() time.Duration {
	switch {
	case b.hasLo && b.lo > 0:
		return b.lo
	case b.hasHi && b.hi < 0:
		if b.hi == durationMin {
			return durationMax // −durationMin does not fit
		}
		return -b.hi
	}
	return 0
}

// String describes the bounds for errors.
func (b clockBounds) String() string {
	switch {
	case b.hasLo && b.hasHi:
		return fmt.Sprintf("between %v and %v", b.lo, b.hi)
	case b.hasLo:
		return fmt.Sprintf("at least %v", b.lo)
	case b.hasHi:
		return fmt.Sprintf("at most %v", b.hi)
	}
	return "unknown"
}

// clockBound is one side of a clockEstimate: a bound on offset, and the
// local time (with its monotonic reading) it was measured at; zero at: none.
type clockBound struct {
	off time.Duration
	at  time.Time
}

// valid reports whether the bound still holds at now: measured less than
// clockBoundAge ago, with no step of the wall clock since. A bound
// measured a little after now (by a concurrent call, between its clock
// read and its lock) holds too.
func (b clockBound) valid(now time.Time) bool {
	if b.at.IsZero() {
		return false
	}
	mono := now.Sub(b.at)
	wall := now.Round(0).Sub(b.at.Round(0))
	step := wall - mono
	return mono < clockBoundAge && step < clockStepTolerance && step > -clockStepTolerance
}

// clockEstimate keeps the bounds on one server's clock offset that a
// store measured. It is safe for concurrent use; the zero value knows
// nothing.
type clockEstimate struct {
	mu       sync.Mutex
	lo, hi   clockBound
	probedAt time.Time // the last probe's start; zero: none
	probing  atomic.Bool
}

// observeStamp records a message the server stamped ts, received at local
// time received: offset ≥ ts − received. A zero ts is ignored.
// e may be nil: nothing is recorded.
func (e *clockEstimate) observeStamp(ts, received time.Time) {
	if e == nil || ts.IsZero() {
		return
	}
	e.mu.Lock()
	e.lower(ts.Sub(received), received)
	e.mu.Unlock()
}

// observeRoundTrip records a reply received at local time replied to a
// request sent at sent that carries ts, a time the server read while
// answering: ts − replied ≤ offset ≤ ts − sent. A zero ts is ignored.
func (e *clockEstimate) observeRoundTrip(ts, sent, replied time.Time) {
	if ts.IsZero() {
		return
	}
	e.mu.Lock()
	// The freshest two-sided measurement: it replaces both bounds, even
	// looser ones (they may predate a step of either clock). A side
	// beyond a Duration's range is not known (see clockBounds).
	e.lo, e.hi = clockBound{}, clockBound{}
	if lo := ts.Sub(replied); lowerBound(lo) {
		e.lo = clockBound{off: lo, at: replied}
	}
	if hi := ts.Sub(sent); upperBound(hi) {
		e.hi = clockBound{off: hi, at: replied}
	}
	e.mu.Unlock()
}

// lower records offset ≥ off, measured at at; e.mu is held. The bound
// replaces the current one when tighter, or when that one has lived half
// its age (so that bounds roll over while samples come in). A bound that
// contradicts the upper bound means the clocks moved (a step, or a new
// stream leader stamping with its own clock): the upper bound, the older,
// goes, and the next check probes for a new one.
func (e *clockEstimate) lower(off time.Duration, at time.Time) {
	if !lowerBound(off) {
		return // below a Duration's range: no bound (see clockBounds)
	}
	if cur := e.lo; !cur.valid(at) || off >= cur.off || at.Sub(cur.at) >= clockBoundAge/2 {
		e.lo = clockBound{off: off, at: at}
	}
	if e.hi.valid(at) && e.lo.off > e.hi.off {
		e.hi = clockBound{}
	}
}

// bounds returns the bounds valid at now, and whether a probe is due: a
// bound missing or older than clockProbeAfter, and no probe started in
// the last clockProbeRetry.
func (e *clockEstimate) bounds(now time.Time) (b clockBounds, probe bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.lo.valid(now) {
		b.lo, b.hasLo = e.lo.off, true
	}
	if e.hi.valid(now) {
		b.hi, b.hasHi = e.hi.off, true
	}
	due := !b.hasLo || !b.hasHi || now.Sub(e.lo.at) >= clockProbeAfter || now.Sub(e.hi.at) >= clockProbeAfter
	if due && (e.probedAt.IsZero() || now.Sub(e.probedAt) >= clockProbeRetry) {
		return b, true
	}
	return b, false
}

// startProbe claims the estimate's probe, started at now: false when
// another call is probing.
func (e *clockEstimate) startProbe(now time.Time) bool {
	if !e.probing.CompareAndSwap(false, true) {
		return false
	}
	e.mu.Lock()
	e.probedAt = now
	e.mu.Unlock()
	return true
}

// endProbe releases the probe startProbe claimed.
func (e *clockEstimate) endProbe() { e.probing.Store(false) }

// ClockOffset bounds a coordinator's clock (Config.Now) against the clock
// of the NATS server that stamps a bucket's messages: Min ≤ server clock −
// coordinator clock ≤ Max, as far as MinKnown and MaxKnown say. Positive
// offsets mean the coordinator's clock is behind the server's. The zero
// value knows nothing.
//
// A bound beyond the range of a Duration (clocks some 292 years apart)
// saturates: a lower bound past the largest Duration reads as that
// Duration (math.MaxInt64), an upper bound past the smallest as the
// smallest, and each still holds; a bound that would be past the other
// end is not known.
type ClockOffset struct {
	Min      time.Duration // a lower bound on the offset, when MinKnown
	Max      time.Duration // an upper bound on the offset, when MaxKnown
	MinKnown bool          // Min holds
	MaxKnown bool          // Max holds
}

// offset returns b as a ClockOffset.
func (b clockBounds) offset() ClockOffset {
	var off ClockOffset
	if b.hasLo {
		off.Min, off.MinKnown = b.lo, true
	}
	if b.hasHi {
		off.Max, off.MaxKnown = b.hi, true
	}
	return off
}

// boundsOf returns off as clockBounds. A side that bounds nothing (a
// lower bound at the smallest Duration, an upper one at the largest) is
// not known, as clockBounds keeps it.
func boundsOf(off ClockOffset) clockBounds {
	var b clockBounds
	if off.MinKnown && lowerBound(off.Min) {
		b.lo, b.hasLo = off.Min, true
	}
	if off.MaxKnown && upperBound(off.Max) {
		b.hi, b.hasHi = off.Max, true
	}
	return b
}

// clockBounds returns what is known of server clock − Config.Now for
// service's bucket. Stores that cannot tell know nothing.
func (c *KeyCoordinator) clockBounds(ctx context.Context, service string) clockBounds {
	cs, ok := c.store.(ClockSource)
	if !ok {
		return clockBounds{}
	}
	off, at := cs.ServerClockOffset(ctx, service)
	b := boundsOf(off)
	// The store measured against time.Now; the coordinator writes
	// Config.Now. Read right after at, the difference is the shift (less
	// the nanoseconds between the two reads, for the default clock).
	return b.shift(at.Sub(c.cfg.Now()))
}

// clockSkewLimit is the least proven |offset| from the server at which a
// coordinator refuses to take leases of policy p: half of the skew between
// hosts p's leases tolerate.
func clockSkewLimit(p Policy) time.Duration {
	return (p.HeartbeatTTL - p.HeartbeatInterval) / 2
}

// clockSkew reports whether the coordinator's clock is proven at least
// clockSkewLimit(p) away from the clock of the server of service's
// bucket, and if so returns the error for the refused operation, what
// ("acquisition of job \"x\" on KV key \"k\"", say): it wraps ErrClockSkew.
//
// It is called before an acquisition or a sweep writes anything (what is
// only read on a refusal, so that the check allocates nothing). Renewals
// and releases are not checked: they only extend or end a slot this host
// already holds, and refusing them would let the slot expire early in
// every other host's eyes, and be taken over while its job still runs,
// which is the very overlap the check prevents.
func (c *KeyCoordinator) clockSkew(ctx context.Context, service string, p Policy) (refuse func(what string) error) {
	if c.cfg.IgnoreClockSkew {
		return nil
	}
	b := c.clockBounds(ctx, service)
	limit := clockSkewLimit(p)
	got := b.minAbs()
	if got == 0 || got < limit {
		return nil
	}
	dir := "behind"
	if b.hasHi && b.hi < 0 {
		dir = "ahead of"
	}
	return func(what string) error {
		return fmt.Errorf("%w: %s refused, nothing written: this host's clock (Config.Now) is at least %v %s the clock of the NATS server of service %q's bucket (offset server − local %s); leases of HeartbeatTTL %v and HeartbeatInterval %v tolerate %v of skew between hosts, and a host %v or more from the server may be that far from another (fix the host's time sync, or set Config.IgnoreClockSkew if the server's clock is the one that is wrong)",
			ErrClockSkew, what, got, dir, service, b, p.HeartbeatTTL, p.HeartbeatInterval, p.HeartbeatTTL-p.HeartbeatInterval, limit)
	}
}
