package jobs

import (
	"fmt"
	"math/bits"
	"strconv"
	"strings"
	"time"
)

// A cron expression of [Periodic.Cron]: five fields, minute (0–59), hour
// (0–23), day of month (1–31), month (1–12 or jan–dec) and day of week
// (0–7, 0 and 7 both Sunday, or sun–sat), in UTC. A field is a
// comma-separated list of "*", a value, a range "a-b", each optionally
// stepped ("*/15", "1-30/2", "5/10": from 5 to the field's end, every
// 10th). As in Vixie cron, when both day fields are restricted (neither
// starts with "*") a day matches either; otherwise it must match both.
// "@yearly" (or "@annually"), "@monthly", "@weekly", "@daily" (or
// "@midnight") and "@hourly" stand for their usual expressions.

// cronSchedule is a parsed cron expression: a bit per allowed value of
// each field.
type cronSchedule struct {
	minute, hour, dom, month, dow uint64
	// domStar, dowStar: the day field starts with "*" (see the OR rule).
	domStar, dowStar bool
}

// cronSearchDays bounds the days a search looks through for a match: past
// the longest gap between two matches of any expression that matches at
// all (29 February falls every 4 years, at most 8 apart across a
// century).
const cronSearchDays = 8*366 + 1

var cronMacros = map[string]string{
	"@yearly":   "0 0 1 1 *",
	"@annually": "0 0 1 1 *",
	"@monthly":  "0 0 1 * *",
	"@weekly":   "0 0 * * 0",
	"@daily":    "0 0 * * *",
	"@midnight": "0 0 * * *",
	"@hourly":   "0 * * * *",
}

var (
	cronMonthNames = []string{"jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"}
	cronDayNames   = []string{"sun", "mon", "tue", "wed", "thu", "fri", "sat"}
)

// parseCron parses a five-field cron expression (see above). Its error
// names the field and what is wrong; an expression that never matches
// (30 February) is an error too.
func parseCron(expr string) (*cronSchedule, error) {
	spec := strings.TrimSpace(expr)
	if m, ok := cronMacros[strings.ToLower(spec)]; ok {
		spec = m
	}
	fields := strings.Fields(spec)
	if len(fields) != 5 {
		return nil, fmt.Errorf("cron %q: %d fields, want 5 (minute hour day-of-month month day-of-week)", expr, len(fields))
	}
	var c cronSchedule
	var err error
	for i, f := range []struct {
		name     string
		min, max int
		names    []string
		nameBase int
		dst      *uint64
	}{
		{"minute", 0, 59, nil, 0, &c.minute},
		{"hour", 0, 23, nil, 0, &c.hour},
		{"day of month", 1, 31, nil, 0, &c.dom},
		{"month", 1, 12, cronMonthNames, 1, &c.month},
		{"day of week", 0, 7, cronDayNames, 0, &c.dow},
	} {
		if *f.dst, err = parseCronField(fields[i], f.min, f.max, f.names, f.nameBase); err != nil {
			return nil, fmt.Errorf("cron %q: %s field %q: %w", expr, f.name, fields[i], err)
		}
	}
	if c.dow&(1<<7) != 0 { // 7 is Sunday
		c.dow = c.dow&^(1<<7) | 1
	}
	c.domStar = strings.HasPrefix(fields[2], "*")
	c.dowStar = strings.HasPrefix(fields[4], "*")
	if _, ok := c.next(time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)); !ok {
		return nil, fmt.Errorf("cron %q: never matches (no such day)", expr)
	}
	return &c, nil
}

// parseCronField parses one field into a bit set of its values, min..max.
// names, when given, spell the values from nameBase on.
func parseCronField(field string, min, max int, names []string, nameBase int) (uint64, error) {
	if field == "" {
		return 0, fmt.Errorf("empty")
	}
	var set uint64
	for _, item := range strings.Split(field, ",") {
		rangePart, stepPart, stepped := strings.Cut(item, "/")
		step := 1
		if stepped {
			n, err := strconv.Atoi(stepPart)
			if err != nil || n < 1 || n > max {
				return 0, fmt.Errorf("step %q is not a number from 1 to %d", stepPart, max)
			}
			step = n
		}
		lo, hi := min, max
		switch {
		case rangePart == "*":
		case strings.Contains(rangePart, "-"):
			a, b, _ := strings.Cut(rangePart, "-")
			var err error
			if lo, err = cronValue(a, min, max, names, nameBase); err != nil {
				return 0, err
			}
			if hi, err = cronValue(b, min, max, names, nameBase); err != nil {
				return 0, err
			}
			if lo > hi {
				return 0, fmt.Errorf("range %q runs backwards", rangePart)
			}
		default:
			v, err := cronValue(rangePart, min, max, names, nameBase)
			if err != nil {
				return 0, err
			}
			lo = v
			if !stepped {
				hi = v
			}
		}
		for v := lo; v <= hi; v += step {
			set |= 1 << uint(v)
		}
	}
	return set, nil
}

// cronValue is one value of a field: a number in min..max or a name.
func cronValue(s string, min, max int, names []string, nameBase int) (int, error) {
	for i, n := range names {
		if strings.EqualFold(s, n) {
			return nameBase + i, nil
		}
	}
	v, err := strconv.Atoi(s)
	if err != nil || v < min || v > max {
		return 0, fmt.Errorf("value %q is not a number from %d to %d", s, min, max)
	}
	return v, nil
}

// dayMatches reports whether the day of t (UTC) matches the month and day
// fields.
func (c *cronSchedule) dayMatches(t time.Time) bool {
	if c.month&(1<<uint(t.Month())) == 0 {
		return false
	}
	dom := c.dom&(1<<uint(t.Day())) != 0
	dow := c.dow&(1<<uint(t.Weekday())) != 0
	if !c.domStar && !c.dowStar {
		return dom || dow
	}
	return dom && dow
}

// next is the first minute strictly after t that matches; ok is false when
// none does within cronSearchDays.
func (c *cronSchedule) next(t time.Time) (time.Time, bool) {
	t = t.UTC().Truncate(time.Minute).Add(time.Minute)
	day := time.Date(t.Year(), t.Month(), t.Day(), 0, 0, 0, 0, time.UTC)
	for range cronSearchDays {
		if c.dayMatches(day) {
			h0, m0 := 0, 0
			if day.Equal(time.Date(t.Year(), t.Month(), t.Day(), 0, 0, 0, 0, time.UTC)) {
				h0, m0 = t.Hour(), t.Minute()
			}
			if h, m, ok := c.firstFrom(h0, m0); ok {
				return day.Add(time.Duration(h)*time.Hour + time.Duration(m)*time.Minute), true
			}
		}
		day = day.AddDate(0, 0, 1)
	}
	return time.Time{}, false
}

// prev is the last minute at or before t that matches; ok is false when
// none does within cronSearchDays.
func (c *cronSchedule) prev(t time.Time) (time.Time, bool) {
	t = t.UTC().Truncate(time.Minute)
	first := time.Date(t.Year(), t.Month(), t.Day(), 0, 0, 0, 0, time.UTC)
	day := first
	for range cronSearchDays {
		if c.dayMatches(day) {
			h0, m0 := 23, 59
			if day.Equal(first) {
				h0, m0 = t.Hour(), t.Minute()
			}
			if h, m, ok := c.lastUpTo(h0, m0); ok {
				return day.Add(time.Duration(h)*time.Hour + time.Duration(m)*time.Minute), true
			}
		}
		day = day.AddDate(0, 0, -1)
	}
	return time.Time{}, false
}

// firstFrom is the first allowed hour and minute at or after h0:m0.
func (c *cronSchedule) firstFrom(h0, m0 int) (h, m int, ok bool) {
	for h = h0; h < 24; h++ {
		if c.hour&(1<<uint(h)) == 0 {
			continue
		}
		from := 0
		if h == h0 {
			from = m0
		}
		if rest := c.minute >> uint(from); rest != 0 {
			return h, from + bits.TrailingZeros64(rest), true
		}
	}
	return 0, 0, false
}

// lastUpTo is the last allowed hour and minute at or before h0:m0.
func (c *cronSchedule) lastUpTo(h0, m0 int) (h, m int, ok bool) {
	for h = h0; h >= 0; h-- {
		if c.hour&(1<<uint(h)) == 0 {
			continue
		}
		upTo := 59
		if h == h0 {
			upTo = m0
		}
		if below := c.minute & (1<<uint(upTo+1) - 1); below != 0 {
			return h, 63 - bits.LeadingZeros64(below), true
		}
	}
	return 0, 0, false
}
