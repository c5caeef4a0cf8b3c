package jobkeys

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Clocks further apart than a Duration holds (about 292 years): the
// bounds on the offset saturate instead of wrapping round, so that
// Min ≤ offset ≤ Max holds for every bound reported known, and a host
// that far off is refused, not taken for one in sync.

// TestClockEstimateBeyondDurationRange: a round trip whose reply carries
// an extreme server time gives bounds that hold (checked in time.Time
// arithmetic, which does not overflow), a side past a Duration's range
// left unknown, and a least |offset| that is a true lower bound.
func TestClockEstimateBeyondDurationRange(t *testing.T) {
	t.Parallel()
	sent := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	replied := sent.Add(time.Millisecond)
	for _, tc := range []struct {
		name     string
		ts       time.Time
		lo, hi   bool          // which sides are known
		wantAbs  time.Duration // the least |offset|, when not 0
		atLeast  bool          // wantAbs is a floor, not exact
		wantSide string        // "behind", "ahead of": the coordinator's clock against the server's
	}{
		{name: "in sync", ts: sent.Add(time.Microsecond), lo: true, hi: true},
		{name: "server an hour ahead", ts: sent.Add(time.Hour), lo: true, hi: true, wantAbs: time.Hour - time.Millisecond},
		{name: "server an hour behind", ts: sent.Add(-time.Hour), lo: true, hi: true, wantAbs: time.Hour},
		{name: "server 292 years ahead", ts: sent.AddDate(292, 0, 0), lo: true, hi: true, atLeast: true},
		{name: "server 292 years behind", ts: sent.AddDate(-292, 0, 0), lo: true, hi: true, atLeast: true},
		{name: "server at local + the largest Duration", ts: sent.Add(durationMax), lo: true, hi: false, wantAbs: durationMax - time.Millisecond},
		{name: "server at local + the smallest Duration", ts: sent.Add(durationMin), lo: false, hi: true, wantAbs: durationMax},
		{name: "server 293 years ahead", ts: sent.AddDate(293, 0, 0), lo: true, hi: false, wantAbs: durationMax},
		{name: "server 293 years behind", ts: sent.AddDate(-293, 0, 0), lo: false, hi: true, wantAbs: durationMax},
		{name: "server in year 9999", ts: time.Date(9999, 12, 31, 23, 59, 59, 999e6, time.UTC), lo: true, hi: false, wantAbs: durationMax},
		{name: "server in year 1", ts: time.Date(1, 1, 1, 0, 0, 0, 1, time.UTC), lo: false, hi: true, wantAbs: durationMax},
		{name: "server 146 billion years ahead", ts: time.Unix(1<<62, 0), lo: true, hi: false, wantAbs: durationMax},
		{name: "server 146 billion years behind", ts: time.Unix(-1<<62, 0), lo: false, hi: true, wantAbs: durationMax},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var e clockEstimate
			e.observeRoundTrip(tc.ts, sent, replied)
			b, _ := e.bounds(replied)
			checkClockBounds(t, b, tc.ts, sent, replied)
			assert.Equal(t, tc.lo, b.hasLo, "lower bound known: %s", b)
			assert.Equal(t, tc.hi, b.hasHi, "upper bound known: %s", b)
			got := b.minAbs()
			switch {
			case tc.atLeast:
				assert.Greater(t, got, 2500000*time.Hour, "least |offset| %v", got)
			default:
				assert.Equal(t, tc.wantAbs, got, "least |offset|, bounds %s", b)
			}
			// A stamp as extreme (a value read, a watch's change) keeps
			// the bounds true.
			e.observeStamp(tc.ts, replied)
			b, _ = e.bounds(replied)
			checkClockBounds(t, b, tc.ts, sent, replied)
		})
	}
}

// checkClockBounds fails the test unless b, measured by a request sent
// at sent and answered at replied with the server's time ts, holds:
// ts − replied ≤ offset ≤ ts − sent, so lo ≤ ts − replied and
// hi ≥ ts − sent, and minAbs is at most the least |offset| in between.
func checkClockBounds(t *testing.T, b clockBounds, ts, sent, replied time.Time) {
	t.Helper()
	if b.hasLo {
		assert.False(t, replied.Add(b.lo).After(ts), "lower bound %v above the offset (server %s, local %s)", b.lo, ts, replied)
	}
	if b.hasHi {
		assert.False(t, sent.Add(b.hi).Before(ts), "upper bound %v below the offset (server %s, local %s)", b.hi, ts, sent)
	}
	if b.hasLo && b.hasHi {
		assert.LessOrEqual(t, b.lo, b.hi, "bounds %s", b)
	}
	abs := b.minAbs()
	require.GreaterOrEqual(t, abs, time.Duration(0), "least |offset| of %s", b)
	switch {
	case ts.After(replied):
		assert.False(t, replied.Add(abs).After(ts), "least |offset| %v above ts − replied", abs)
	case ts.Before(sent):
		assert.False(t, ts.Add(abs).After(sent), "least |offset| %v above sent − ts", abs)
	default:
		assert.Zero(t, abs, "the offset may be zero")
	}
}

// TestClockShiftSaturates: moving bounds to a clock far from the one they
// were measured on saturates: a sum past the range keeps the bound that
// still holds and drops the other.
func TestClockShiftSaturates(t *testing.T) {
	t.Parallel()
	near := clockBounds{lo: -time.Millisecond, hi: time.Millisecond, hasLo: true, hasHi: true}
	for _, tc := range []struct {
		name string
		b    clockBounds
		d    time.Duration
		want clockBounds
	}{
		{"near, shifted an hour", near, time.Hour, clockBounds{lo: time.Hour - time.Millisecond, hi: time.Hour + time.Millisecond, hasLo: true, hasHi: true}},
		{"near, by the largest Duration", near, durationMax, clockBounds{lo: durationMax - time.Millisecond, hasLo: true}},
		{"near, by the smallest Duration", near, durationMin, clockBounds{hi: durationMin + time.Millisecond, hasHi: true}},
		{"near, the upper bound past the range", near, durationMax - time.Microsecond, clockBounds{lo: durationMax - time.Microsecond - time.Millisecond, hasLo: true}},
		{"near, the lower bound past the range", near, durationMin + time.Microsecond, clockBounds{hi: durationMin + time.Microsecond + time.Millisecond, hasHi: true}},
		{"saturated lower bound, shifted on", clockBounds{lo: durationMax, hasLo: true}, time.Hour, clockBounds{lo: durationMax, hasLo: true}},
		{"saturated lower bound, shifted back", clockBounds{lo: durationMax, hasLo: true}, -time.Hour, clockBounds{lo: durationMax - time.Hour, hasLo: true}},
		{"saturated upper bound, shifted on", clockBounds{hi: durationMin, hasHi: true}, -time.Hour, clockBounds{hi: durationMin, hasHi: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := tc.b.shift(tc.d)
			assert.Equal(t, tc.want, got)
			assert.GreaterOrEqual(t, got.minAbs(), time.Duration(0))
		})
	}
}

// TestClockOffsetCentenaryClocks: a coordinator whose clock (Config.Now)
// is centuries off a real server (whose clock is this host's) reports
// bounds that hold (the offset is exactly the years it is off), a side
// past a Duration's range unknown, and is refused acquisitions with an
// ErrClockSkew that says how far and which way. At 292 years and beyond,
// before, the upper bound wrapped round to about −2562047h while the
// lower one read +2562047h, and the refusal came from the wrapped side.
func TestClockOffsetCentenaryClocks(t *testing.T) {
	t.Parallel()
	store, _ := rtNATS(t)
	svc := rtService()
	rtAdmit(t, rtJobType(t, cCoordinator(t, store, nil), svc, clockPolicy), "job-1") // opens the bucket
	for _, years := range []int{-1000, -300, -293, -292, -100, 0, 100, 292, 293, 300, 1000} {
		t.Run(fmt.Sprintf("%+d years", years), func(t *testing.T) {
			now := func() time.Time { return time.Now().AddDate(years, 0, 0) }
			c := cCoordinator(t, store, &Config{Now: now})
			off, err := c.ClockOffset(context.Background(), svc)
			require.NoError(t, err)
			// server − coordinator: the same instant, read on both.
			server := time.Now()
			coord := server.AddDate(years, 0, 0)
			if off.MinKnown {
				assert.False(t, coord.Add(off.Min).After(server), "Min %v above the offset (%+d years): %+v", off.Min, years, off)
			}
			if off.MaxKnown {
				assert.False(t, coord.Add(off.Max).Before(server), "Max %v below the offset (%+d years): %+v", off.Max, years, off)
			}
			if off.MinKnown && off.MaxKnown {
				assert.LessOrEqual(t, off.Min, off.Max, "%+v", off)
			}
			switch {
			case years == 0:
				assert.True(t, off.MinKnown && off.MaxKnown, "%+v", off)
				return
			case years < 0: // behind the server: a positive offset
				assert.True(t, off.MinKnown, "%+v", off)
			default:
				assert.True(t, off.MaxKnown, "%+v", off)
			}
			_, err = rtJobType(t, c, svc, clockPolicy).Acquire(context.Background(), "job-1", rtPayload)
			require.ErrorIs(t, err, ErrClockSkew)
			side := "ahead of"
			if years < 0 {
				side = "behind"
			}
			assert.Contains(t, err.Error(), side+" the clock of the NATS server")
			assert.NotContains(t, err.Error(), "at least -", "the least skew is not negative")
		})
	}
}

// A clock whose leases would end after year 9999 is refused before any
// write, with an error naming the time and the bound; the key stays
// readable. Before, the lease was written as "10000-01-01T…", which no
// reader accepts, and every later operation on the key failed.
func TestCoordinatorRefusesClockPastYear9999(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	clock := &jkClock{t: time.Date(9999, 12, 31, 23, 59, 0, 0, time.UTC)}
	st := NewMemoryStore()
	c := cCoordinator(t, st, &Config{Now: clock.Now})
	svc := jkService("clock")
	key := cKey(t, svc)
	p := cPolicy()
	_, err := c.Admit(ctx, cAdmit(svc, "j", p))
	require.NoError(t, err, "an admission at 9999-12-31T23:59Z writes times within the years")
	before, rev := stored(t, st, svc, key.KVKey)

	_, err = c.Acquire(ctx, cAcquire(svc, "j", p, false))
	require.ErrorIs(t, err, ErrClockOutOfRange)
	assert.Contains(t, err.Error(), "10000-01-01T00:01:00Z", "the lease's end")
	assert.Contains(t, err.Error(), "9999-12-31T23:59:59.999Z", "the bound")
	after, rev2 := stored(t, st, svc, key.KVKey)
	assert.Equal(t, string(before), string(after))
	assert.Equal(t, rev, rev2)

	clock.Advance(time.Hour) // now in year 10000
	_, err = c.Admit(ctx, cAdmit(svc, "k", p))
	require.ErrorIs(t, err, ErrClockOutOfRange)
	_, err = ParseState(after)
	require.NoError(t, err, "the key is still readable")
}
