package jsjson

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestParseTimestamp is the regression test for timestamps that only one
// side could read: lowercase "t" and "z" (RFC 3339 allows them, and the
// TypeScript original writes what its callers pass it), and the expanded
// years toISOString writes outside 0 to 9999.
func TestParseTimestamp(t *testing.T) {
	t.Parallel()
	ms := func(s string) time.Time {
		tm, err := time.Parse(time.RFC3339Nano, s)
		require.NoError(t, err)
		return tm.UTC()
	}
	for _, tc := range []struct {
		in   string
		want time.Time
	}{
		{"2026-11-30T10:00:02.000Z", ms("2026-11-30T10:00:02Z")},
		{"2026-11-30t10:00:02.000z", ms("2026-11-30T10:00:02Z")},
		{"2026-11-30t10:00:02Z", ms("2026-11-30T10:00:02Z")},
		{"2026-11-30T10:00:02.123456789Z", ms("2026-11-30T10:00:02.123Z")},
		{"2026-11-30T10:00:02.9999Z", ms("2026-11-30T10:00:02.999Z")},
		{"2026-11-30T10:00:02.5+01:30", ms("2026-11-30T08:30:02.5Z")},
		{"2026-11-30T10:00:02-00:00", ms("2026-11-30T10:00:02Z")},
		{"2024-02-29T00:00:00Z", ms("2024-02-29T00:00:00Z")},
		{"0000-01-01T00:00:00.000Z", time.Date(0, 1, 1, 0, 0, 0, 0, time.UTC)},
		{"0000-01-01T00:00:00+00:01", time.Date(-1, 12, 31, 23, 59, 0, 0, time.UTC)},
		{"+010000-01-01T00:00:00.000Z", time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)},
		{"-000001-12-31T23:59:59.999Z", time.Date(-1, 12, 31, 23, 59, 59, 999e6, time.UTC)},
		{"+002026-11-30T10:00:02.000Z", ms("2026-11-30T10:00:02Z")},
		{"+275760-09-13T00:00:00.000Z", time.UnixMilli(8.64e15).UTC()},
		{"-271821-04-20T00:00:00.000Z", time.UnixMilli(-8.64e15).UTC()},
	} {
		got, err := ParseTime(tc.in)
		if assert.NoError(t, err, "ParseTime(%q)", tc.in) {
			assert.True(t, tc.want.Equal(got), "ParseTime(%q) = %v, want %v", tc.in, got, tc.want)
		}
	}
	for _, in := range []string{
		"", "yesterday", "2026-11-30", "2026-11-30T10:00Z", "2026-11-30T10:00:02", "2026-11-30 10:00:02Z",
		"2026-11-30T10:00:02.Z", "2026-11-30T10:00:02,5Z", "2026-11-30T10:00:02+0100", "2026-11-30T10:00:02+01",
		"2026-11-30T24:00:00Z", "2026-11-30T23:60:00Z", "2026-11-30T23:59:60Z", "2026-02-29T00:00:00Z",
		"2026-04-31T00:00:00Z", "2026-13-01T00:00:00Z", "2026-00-01T00:00:00Z", "2026-01-00T00:00:00Z",
		"2026-11-30T10:00:02+24:00", "2026-11-30T10:00:02+01:60", "10000-01-01T00:00:00.000Z",
		"-000000-01-01T00:00:00Z", "+2026-01-01T00:00:00Z", "+275760-09-13T00:00:00.001Z",
		"-271821-04-19T23:59:59.999Z", " 2026-11-30T10:00:02Z", "2026-11-30T10:00:02Z ", "2026-11-30T10:00:02ZZ",
		"2026-11-30T10:00:02\rZ", "2026-11-30T10:00:02-\r0:00", "２０２６-11-30T10:00:02Z",
	} {
		_, err := ParseTime(in)
		if assert.Error(t, err, "ParseTime(%q)", in) {
			assert.Contains(t, err.Error(), strconv.Quote(in), "the error quotes the timestamp")
		}
	}
}

// TestAppendTimeToISOStringVectors is the regression test for times outside
// the years 0 to 9999, which were written as "10000-01-01T..." (which
// neither side reads): they are written as toISOString writes them, and
// read back to the same millisecond.
func TestAppendTimeToISOStringVectors(t *testing.T) {
	t.Parallel()
	for _, v := range loadToISOStringVectors(t) {
		tm := time.UnixMilli(v.MS)
		assert.Equal(t, `"`+v.ISO+`"`, string(new(TimeWriter).Append(nil, tm)), "TimeWriter.Append(%d ms)", v.MS)
		back, err := ParseTime(v.ISO)
		if assert.NoError(t, err) {
			assert.Equal(t, v.MS, back.UnixMilli())
		}
	}
	// Finer than milliseconds is cut, as toISOString holds milliseconds.
	assert.Equal(t, `"+010000-01-01T00:00:00.999Z"`, string(new(TimeWriter).Append(nil, time.Date(10000, 1, 1, 0, 0, 0, 999999999, time.UTC))))
	assert.Equal(t, `"-000001-12-31T23:59:59.999Z"`, string(new(TimeWriter).Append(nil, time.Date(0, 1, 1, 0, 0, 0, 0, time.UTC).Add(-time.Nanosecond))))
}

// isoTime, ParseTime's path for the form toISOString writes, reads
// the same instant, in the same representation, as its general path
// (parseTimeFields) and time.Date do, across
// the years 0000 to 9999 and at the edges of months and days.
func TestISOTimeMatchesTimeDate(t *testing.T) {
	t.Parallel()
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 2))
	check := func(year, month, day, hour, minute, sec, ms int) {
		s := fmt.Sprintf("%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", year, month, day, hour, minute, sec, ms)
		got, ok := isoTime(s)
		want, err := parseTimeFields(s)
		if err != nil {
			require.False(t, ok, "isoTime(%q) reads what parseTimeFields refuses: %v", s, err)
			return
		}
		require.True(t, ok, "isoTime(%q) refuses a valid time", s)
		require.Equal(t, want, got, "isoTime(%q)", s)
		require.Equal(t, want, time.Date(year, time.Month(month), day, hour, minute, sec, ms*int(time.Millisecond), time.UTC))
		gotB, ok := isoTime([]byte(strings.ToLower(s)))
		require.True(t, ok, "isoTime of lowercase %q", s)
		require.Equal(t, want, gotB)
	}
	for _, year := range []int{0, 1, 4, 99, 100, 400, 1600, 1900, 1969, 1970, 2000, 2024, 2100, 9999} {
		for month := 1; month <= 12; month++ {
			for _, day := range []int{0, 1, 28, 29, 30, 31, 32} {
				check(year, month, day, 0, 0, 0, 0)
				check(year, month, day, 23, 59, 59, 999)
			}
		}
	}
	for range 20000 {
		check(rng.IntN(10000), 1+rng.IntN(12), 1+rng.IntN(31), rng.IntN(25), rng.IntN(61), rng.IntN(61), rng.IntN(1000))
	}
	for _, s := range []string{"2026-11-30T10:00:02.00aZ", "2026-11-30T10:00:02.000+", "2026-11-30 10:00:02.000Z",
		"2026-11-30T10:00:60.000Z", "+02026-11-30T10:00:02.00Z", "2026-11-30T10:00:02,000Z", "-026-11-30T10:00:02.000Z"} {
		_, ok := isoTime(s)
		assert.False(t, ok, "isoTime(%q)", s)
	}
}

// TestAppendTimeMatchesReference compares a new TimeWriter for each time,
// and one TimeWriter given the times one after another, with the old
// writer (refAppendTime) on every day
// of the years around the epoch, year 0 and year 9999, on every 400-year
// era boundary across the range of a Date, at the ends of that range and
// of the hand-formatted range, and on random instants.
func TestAppendTimeMatchesReference(t *testing.T) {
	t.Parallel()
	var w TimeWriter // remembers the time before, as when a document is written
	check := func(tm time.Time) {
		t.Helper()
		want := string(refAppendTime(nil, tm))
		require.Equal(t, want, string(new(TimeWriter).Append(nil, tm)), "TimeWriter.Append(%d s, %d ns)", tm.Unix(), tm.Nanosecond())
		require.Equal(t, want, string(w.Append(nil, tm)), "TimeWriter.Append(%d s, %d ns) after another time", tm.Unix(), tm.Nanosecond())
	}
	for _, start := range []time.Time{
		time.Date(1966, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(-3, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Date(9996, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(1896, 1, 1, 0, 0, 0, 0, time.UTC),
	} {
		for d := range 8 * 366 {
			day := start.AddDate(0, 0, d)
			check(day)
			check(day.Add(-time.Nanosecond))
			check(day.Add(time.Duration(d) * 7919 * time.Millisecond))
		}
	}
	for y := -272000; y <= 276000; y += 400 {
		for _, m := range []time.Month{1, 2, 3} {
			tm := time.Date(y, m, 1, 0, 0, 0, 0, time.UTC)
			check(tm)
			check(tm.Add(-time.Millisecond))
		}
	}
	for _, sec := range []int64{-MaxTimeMillis / 1000, MaxTimeMillis / 1000, -fastTimeSeconds, fastTimeSeconds, math.MinInt64, math.MaxInt64, 0, -1} {
		for d := int64(-2); d <= 2; d++ {
			check(time.Unix(sec+d, 0))
			check(time.Unix(sec+d, 999_999_999))
		}
	}
	check(time.Time{})
	check(time.Date(2026, 11, 30, 10, 0, 2, 123_456_789, time.FixedZone("x", -11*3600)))
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 2))
	for range 20000 {
		check(randomTime(rng))
	}
}

// refAppendTime is TimeWriter.Append as it was before it was rewritten for
// speed, kept as the reference TestAppendTimeMatchesReference compares it
// with: every time goes through time.AppendFormat.
func refAppendTime(dst []byte, t time.Time) []byte {
	t = t.UTC()
	dst = append(dst, '"')
	year := t.Year()
	if year >= 0 && year <= 9999 {
		dst = t.AppendFormat(dst, TimeLayout)
		return append(dst, '"')
	}
	if year < 0 {
		dst = append(dst, '-')
		year = -year
	} else {
		dst = append(dst, '+')
	}
	for n := 100000; n > 1 && year < n; n /= 10 {
		dst = append(dst, '0') // six digits
	}
	dst = strconv.AppendInt(dst, int64(year), 10)
	dst = t.AppendFormat(dst, "-01-02T15:04:05.000Z")
	return append(dst, '"')
}
