package jobs

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func cronAt(s string) time.Time {
	t, err := time.Parse("2006-01-02 15:04 Mon", s)
	if err != nil {
		panic(err)
	}
	return t
}

// TestCronNextAndPrev is a table of expressions, each with a time and the
// matching minutes just after it and at or before it.
func TestCronNextAndPrev(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		expr, at, next, prev string
	}{
		{"0 3 * * *", "2026-03-04 05:06 Wed", "2026-03-05 03:00 Thu", "2026-03-04 03:00 Wed"},
		{"0 3 * * *", "2026-03-04 03:00 Wed", "2026-03-05 03:00 Thu", "2026-03-04 03:00 Wed"},
		{"*/15 * * * *", "2026-03-04 05:06 Wed", "2026-03-04 05:15 Wed", "2026-03-04 05:00 Wed"},
		{"5/20 * * * *", "2026-03-04 05:26 Wed", "2026-03-04 05:45 Wed", "2026-03-04 05:25 Wed"},
		{"0 9-17/4 * * mon-fri", "2026-03-06 18:00 Fri", "2026-03-09 09:00 Mon", "2026-03-06 17:00 Fri"},
		{"30 23 31 * *", "2026-04-01 00:00 Wed", "2026-05-31 23:30 Sun", "2026-03-31 23:30 Tue"},
		{"0 0 29 2 *", "2026-03-01 00:00 Sun", "2028-02-29 00:00 Tue", "2024-02-29 00:00 Thu"},
		{"0 12 1 * 0", "2026-03-02 00:00 Mon", "2026-03-08 12:00 Sun", "2026-03-01 12:00 Sun"},      // day of month OR day of week
		{"0 12 * * 7", "2026-03-02 00:00 Mon", "2026-03-08 12:00 Sun", "2026-03-01 12:00 Sun"},      // 7 is Sunday
		{"0 12 */10 * sun", "2026-03-02 00:00 Mon", "2026-05-31 12:00 Sun", "2026-03-01 12:00 Sun"}, // "*…" day of month: both must match
		{"0 0 1 jan,JUL *", "2026-03-04 05:06 Wed", "2026-07-01 00:00 Wed", "2026-01-01 00:00 Thu"},
		{"@hourly", "2026-03-04 05:06 Wed", "2026-03-04 06:00 Wed", "2026-03-04 05:00 Wed"},
		{"@weekly", "2026-03-04 05:06 Wed", "2026-03-08 00:00 Sun", "2026-03-01 00:00 Sun"},
		{"59 23 31 12 *", "2026-12-31 23:59 Thu", "2027-12-31 23:59 Fri", "2026-12-31 23:59 Thu"},
	} {
		c, err := parseCron(tc.expr)
		require.NoError(t, err, tc.expr)
		at := cronAt(tc.at).Add(17 * time.Second) // seconds do not matter
		next, ok := c.next(at)
		require.True(t, ok, tc.expr)
		assert.Equal(t, cronAt(tc.next), next, "next of %q after %s", tc.expr, tc.at)
		prev, ok := c.prev(at)
		require.True(t, ok, tc.expr)
		assert.Equal(t, cronAt(tc.prev), prev, "prev of %q at %s", tc.expr, tc.at)
	}
}

// TestCronRefused: each malformed expression is refused, naming the field.
func TestCronRefused(t *testing.T) {
	t.Parallel()
	for expr, want := range map[string]string{
		"":                "0 fields",
		"* * * *":         "4 fields",
		"* * * * * *":     "6 fields",
		"60 * * * *":      "minute field",
		"* 24 * * *":      "hour field",
		"* * 0 * *":       "day of month field",
		"* * * 13 *":      "month field",
		"* * * * 8":       "day of week field",
		"*/0 * * * *":     "step",
		"5-1 * * * *":     "runs backwards",
		"a * * * *":       "minute field",
		"1,,2 * * * *":    "minute field",
		"* * * foo *":     "month field",
		"0 0 31 4,6,9 *":  "never matches",
		"0 0 30 feb *":    "never matches",
		"*/61 * * * *":    "step",
		"1-2-3 * * * *":   "minute field",
		"@fortnightly":    "1 fields",
		"* * * * mon-sun": "runs backwards",
	} {
		_, err := parseCron(expr)
		if assert.Error(t, err, "%q", expr) {
			assert.Contains(t, err.Error(), want, "%q", expr)
		}
	}
}

// TestCronAgainstMinuteScan checks next and prev of random expressions at
// random times against a scan of every minute of 7 days around them (the
// seed is printed).
func TestCronAgainstMinuteScan(t *testing.T) {
	t.Parallel()
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(uint64(seed), 0))
	fields := [][]string{
		{"*", "0", "*/7", "5-10", "1,31,59", "30/9"},
		{"*", "0", "*/5", "9-17", "23"},
		{"*", "1", "*/10", "13", "28-31", "15"},
		{"*", "2", "jan-mar", "*/4", "12"},
		{"*", "0", "mon-fri", "6,0", "3", "*/3"},
	}
	for range 120 {
		expr := ""
		for i, f := range fields {
			if i > 0 {
				expr += " "
			}
			expr += f[rng.IntN(len(f))]
		}
		c, err := parseCron(expr)
		if err != nil {
			continue // a combination that never matches
		}
		at := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC).Add(time.Duration(rng.Int64N(int64(3 * 365 * 24 * time.Hour)))).Truncate(time.Second)
		matches := func(m time.Time) bool {
			return c.minute&(1<<uint(m.Minute())) != 0 && c.hour&(1<<uint(m.Hour())) != 0 && c.dayMatches(m)
		}
		var wantNext time.Time
		for m := at.Truncate(time.Minute).Add(time.Minute); m.Before(at.AddDate(0, 0, 7)); m = m.Add(time.Minute) {
			if matches(m) {
				wantNext = m
				break
			}
		}
		if !wantNext.IsZero() {
			got, ok := c.next(at)
			require.True(t, ok, expr)
			require.Equal(t, wantNext, got, "next of %q after %s", expr, at)
		}
		var wantPrev time.Time
		for m := at.Truncate(time.Minute); m.After(at.AddDate(0, 0, -7)); m = m.Add(-time.Minute) {
			if matches(m) {
				wantPrev = m
				break
			}
		}
		if !wantPrev.IsZero() {
			got, ok := c.prev(at)
			require.True(t, ok, expr)
			require.Equal(t, wantPrev, got, "prev of %q at %s", expr, at)
		}
	}
}

// FuzzParseCron: any expression is parsed or refused without a panic; a
// parsed one's next tick comes after the time and matches, and prev of it
// is itself.
func FuzzParseCron(f *testing.F) {
	for _, s := range []string{"0 3 * * *", "*/15 * * * *", "0 9-17/4 * * mon-fri", "@daily", "0 0 29 2 *", "5/20 1,2 */3 jan-jun 7"} {
		f.Add(s)
	}
	at := time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)
	f.Fuzz(func(t *testing.T, expr string) {
		c, err := parseCron(expr)
		if err != nil {
			return
		}
		next, ok := c.next(at)
		if !ok {
			t.Fatalf("%q parsed but has no next tick", expr)
		}
		if !next.After(at) {
			t.Fatalf("%q: next %s is not after %s", expr, next, at)
		}
		if prev, ok := c.prev(next); !ok || !prev.Equal(next) {
			t.Fatalf("%q: prev(next %s) = %s, %t", expr, next, prev, ok)
		}
	})
}
