package jsjson

import (
	"fmt"
	"strconv"
	"time"
)

// This file writes times as JavaScript's Date#toISOString writes them and
// reads them as Date.parse reads the RFC 3339 forms.

// TimeLayout is the layout of JavaScript's Date#toISOString for the years
// 0000 to 9999, for [time.Time.Format].
const TimeLayout = "2006-01-02T15:04:05.000Z"

// MaxTimeMillis is the largest distance from the Unix epoch, in
// milliseconds, of a time JavaScript's Date can hold: 8.64e15 ms, the years
// -271821 to 275760.
const MaxTimeMillis = 8_640_000_000_000_000

// A TimeWriter appends times as JSON strings as JavaScript's toISOString
// writes them: UTC, milliseconds (finer digits cut), "Z", the year as four
// digits when it is 0 to 9999 and otherwise as a sign and six digits
// ("+010000-01-01T00:00:00.000Z", "-000001-12-31T23:59:59.999Z"). A time
// outside what a Date can hold is written in the same form, which nobody
// reads back.
//
// It works the digits out from the Unix time directly, and remembers the
// last time it wrote: the times of one document mostly fall on one day (its
// date is not worked out again) and often on one millisecond (the text is
// copied). A time further than fastTimeSeconds from the epoch (which no Date
// holds) goes through time.Time's own calendar in appendFarTime. The zero
// TimeWriter is ready; it is not safe for concurrent use.
type TimeWriter struct {
	valid bool     // the fields below hold the last time written
	sec   int64    // its Unix time, in seconds
	ms    int      // its milliseconds
	days  int64    // its days since the epoch
	date  int      // the length of its date part in text, '"' included
	n     int      // the length of its text
	text  [30]byte // '"', a year of up to 7 bytes, "-MM-DDTHH:MM:SS.mmmZ" (21), '"'
}

// Append appends t, quoted, as toISOString writes it (see [TimeWriter]).
func (w *TimeWriter) Append(dst []byte, t time.Time) []byte {
	sec, ms := t.Unix(), t.Nanosecond()/1e6
	if w.valid && sec == w.sec && ms == w.ms {
		return append(dst, w.text[:w.n]...)
	}
	if sec < -fastTimeSeconds || sec > fastTimeSeconds {
		return appendFarTime(dst, t)
	}
	days, rem := sec/secondsPerDay, sec%secondsPerDay
	if rem < 0 {
		days--
		rem += secondsPerDay
	}
	b := &w.text
	if !w.valid || days != w.days {
		year, month, day := civilDate(days)
		b[0] = '"'
		n := 1
		if year >= 0 && year <= 9999 {
			put2(b[1:], year/100)
			put2(b[3:], year%100)
			n = 5
		} else {
			b[1] = '+'
			if year < 0 {
				b[1] = '-'
				year = -year
			}
			put2(b[2:], year/10000) // |year| < 1e6 within fastTimeSeconds
			put2(b[4:], year/100%100)
			put2(b[6:], year%100)
			n = 8
		}
		b[n] = '-'
		put2(b[n+1:], month)
		b[n+3] = '-'
		put2(b[n+4:], day)
		w.date, w.days = n+6, days
	}
	n, r := w.date, int(rem)
	b[n] = 'T'
	put2(b[n+1:], r/3600)
	b[n+3] = ':'
	put2(b[n+4:], r/60%60)
	b[n+6] = ':'
	put2(b[n+7:], r%60)
	b[n+9] = '.'
	b[n+10] = byte('0' + ms/100)
	put2(b[n+11:], ms%100)
	b[n+13] = 'Z'
	b[n+14] = '"'
	w.valid, w.sec, w.ms, w.n = true, sec, ms, n+15
	return append(dst, b[:w.n]...)
}

const secondsPerDay = 86400

// fastTimeSeconds bounds the Unix times TimeWriter formats by hand: within
// it the year has at most six digits (2^44 s is about 557,000 years) and the
// arithmetic of civilDate cannot overflow. A Date holds at most 8.64e12 s.
const fastTimeSeconds = 1 << 44

// civilDate returns the proleptic Gregorian date (the calendar of both
// JavaScript's Date and package time) of the day days after 1970-01-01,
// counting the year before year 1 as year 0 and months and days from 1.
// It counts in eras of 400 years (146,097 days) starting on March 1 so that
// the leap day ends each year.
func civilDate(days int64) (year, month, day int) {
	z := days + 719468 // days since 0000-03-01
	era := z / 146097
	if z < 0 && z%146097 != 0 {
		era--
	}
	doe := int(z - era*146097)                             // day of the era, 0 to 146096
	yoe := (doe - doe/1460 + doe/36524 - doe/146096) / 365 // year of the era, 0 to 399
	doy := doe - (365*yoe + yoe/4 - yoe/100)               // day of the year from March 1, 0 to 365
	mp := (5*doy + 2) / 153                                // month from March, 0 to 11
	day = doy - (153*mp+2)/5 + 1
	month = mp + 3
	if mp >= 10 {
		month = mp - 9
	}
	year = yoe + int(era)*400
	if month <= 2 {
		year++
	}
	return year, month, day
}

// twoDigits holds "00" to "99", two bytes each.
var twoDigits = func() (d [200]byte) {
	for i := range 100 {
		d[2*i], d[2*i+1] = byte('0'+i/10), byte('0'+i%10)
	}
	return d
}()

// put2 writes v, 0 to 99, as two digits at b[0:2].
func put2(b []byte, v int) {
	_ = b[1]
	b[0], b[1] = twoDigits[2*v], twoDigits[2*v+1]
}

// appendFarTime is TimeWriter.Append for any t, through time.Time's calendar.
func appendFarTime(dst []byte, t time.Time) []byte {
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

// ParseTime reads an RFC 3339 date-time ("2026-11-30T10:00:02.5Z",
// "2026-11-30t11:00:02+01:00"; "T" and "Z" in either case) or the same with
// an expanded year as toISOString writes it ("+010000-01-01T00:00:00.000Z"),
// as JavaScript's Date.parse reads it: fraction digits past the millisecond
// are cut, and the time must lie within what a Date can hold (about the
// years -271821 to 275760). A leap second (":60") is an error, as
// Date.parse has no way to hold one; so are the other forms Date.parse may
// accept (a date alone, no seconds, no offset, a space for "T", day 31 of a
// 30-day month). The error quotes s.
func ParseTime[T string | []byte](s T) (time.Time, error) {
	if t, ok := isoTime(s); ok {
		return t, nil
	}
	return parseTimeFields(s)
}

// parseTimeFields is ParseTime's general path, for every form it reads;
// isoTime is its fast path for the form toISOString writes.
func parseTimeFields[T string | []byte](s T) (time.Time, error) {
	bad := func(why string) (time.Time, error) {
		return time.Time{}, fmt.Errorf("%q is not an RFC 3339 timestamp: %s", s, why)
	}
	p := tsScan[T]{s: s}
	f, why := p.fields()
	if why == "" {
		why = f.check()
	}
	if why != "" {
		return bad(why)
	}
	t := time.Date(f.year, time.Month(f.month), f.day, f.hour, f.minute, f.sec, f.millis*int(time.Millisecond), time.UTC).
		Add(-time.Duration(f.offset) * time.Minute)
	if ms := t.UnixMilli(); ms > MaxTimeMillis || ms < -MaxTimeMillis {
		return bad("outside the range of JavaScript dates")
	}
	return t, nil
}

// tsScan reads the fields of a timestamp for ParseTime, s[i:] being
// what is left to read.
type tsScan[T string | []byte] struct {
	s T
	i int
}

// tsFields are the fields of a timestamp as written; offset in minutes.
type tsFields struct {
	year, month, day, hour, minute, sec, millis, offset int
}

// fields reads the whole timestamp; why says what is wrong, "" nothing.
// The fields' ranges are not checked (see check).
func (p *tsScan[T]) fields() (f tsFields, why string) {
	if f.year, why = p.year(); why != "" {
		return f, why
	}
	if f.month, f.day, why = p.date(); why != "" {
		return f, why
	}
	if f.hour, f.minute, f.sec, why = p.clock(); why != "" {
		return f, why
	}
	if f.millis, why = p.fraction(); why != "" {
		return f, why
	}
	if f.offset, why = p.offset(); why != "" {
		return f, why
	}
	if p.i != len(p.s) {
		return f, "unexpected text after the offset"
	}
	return f, ""
}

// digits reads n decimal digits.
func (p *tsScan[T]) digits(n int) (int, bool) {
	if len(p.s)-p.i < n {
		return 0, false
	}
	v := 0
	for k := p.i; k < p.i+n; k++ {
		if c := p.s[k]; c < '0' || c > '9' {
			return 0, false
		}
		v = v*10 + int(p.s[k]-'0')
	}
	p.i += n
	return v, true
}

// sep reads c, or its lower case for an upper-case letter ('T' or 't',
// 'Z' or 'z').
func (p *tsScan[T]) sep(c byte) bool {
	if p.i < len(p.s) && (p.s[p.i] == c || c >= 'A' && c <= 'Z' && p.s[p.i] == c+'a'-'A') {
		p.i++
		return true
	}
	return false
}

// year reads a four-digit year, or a signed six-digit one.
func (p *tsScan[T]) year() (int, string) {
	s := p.s
	if len(s) > 0 && (s[0] == '+' || s[0] == '-') {
		p.i = 1
		year, ok := p.digits(6)
		if !ok {
			return 0, "a signed year has six digits"
		}
		if s[0] == '-' {
			if year == 0 {
				return 0, "the year -000000 is not allowed"
			}
			year = -year
		}
		return year, ""
	}
	year, ok := p.digits(4)
	if !ok {
		return 0, "it does not start with a four-digit year"
	}
	return year, ""
}

// date reads "-MM-DD" after the year.
func (p *tsScan[T]) date() (month, day int, why string) {
	if !p.sep('-') {
		return 0, 0, "no '-' after the year"
	}
	month, ok := p.digits(2)
	if !ok || !p.sep('-') {
		return 0, 0, "want YYYY-MM-DD"
	}
	if day, ok = p.digits(2); !ok {
		return 0, 0, "want YYYY-MM-DD"
	}
	return month, day, ""
}

// clock reads "Thh:mm:ss" after the date.
func (p *tsScan[T]) clock() (hour, minute, sec int, why string) {
	if !p.sep('T') {
		return 0, 0, 0, "want 'T' between date and time"
	}
	var ok bool
	if hour, ok = p.digits(2); !ok || !p.sep(':') {
		return 0, 0, 0, "want hh:mm:ss"
	}
	if minute, ok = p.digits(2); !ok || !p.sep(':') {
		return 0, 0, 0, "want hh:mm:ss"
	}
	if sec, ok = p.digits(2); !ok {
		return 0, 0, 0, "want hh:mm:ss"
	}
	return hour, minute, sec, ""
}

// fraction reads an optional fraction of a second, in milliseconds: the
// digits past the third are cut.
func (p *tsScan[T]) fraction() (int, string) {
	if !p.sep('.') {
		return 0, ""
	}
	s, start, millis := p.s, p.i, 0
	for p.i < len(s) && s[p.i] >= '0' && s[p.i] <= '9' {
		if p.i-start < 3 {
			millis = millis*10 + int(s[p.i]-'0')
		}
		p.i++
	}
	if p.i == start {
		return 0, "no digits after '.'"
	}
	for n := p.i - start; n < 3; n++ {
		millis *= 10
	}
	return millis, ""
}

// offset reads "Z" or "±hh:mm", in minutes east of UTC.
func (p *tsScan[T]) offset() (int, string) {
	const want = "want an offset of Z or ±hh:mm"
	s := p.s
	switch {
	case p.sep('Z'):
		return 0, ""
	case p.i < len(s) && (s[p.i] == '+' || s[p.i] == '-'):
		sign := 1
		if s[p.i] == '-' {
			sign = -1
		}
		p.i++
		oh, ok1 := p.digits(2)
		ok2 := p.sep(':')
		om, ok3 := p.digits(2)
		if !ok1 || !ok2 || !ok3 || oh > 23 || om > 59 {
			return 0, want
		}
		return sign * (oh*60 + om), ""
	default:
		return 0, want
	}
}

// check says what is out of range in f, "" nothing.
func (f *tsFields) check() string {
	switch {
	case f.month < 1 || f.month > 12:
		return "month out of range"
	case f.day < 1 || f.day > daysIn(f.year, f.month):
		return "day out of range"
	case f.hour > 23 || f.minute > 59:
		return "time out of range"
	case f.sec == 60:
		return "a leap second cannot be represented"
	case f.sec > 59:
		return "seconds out of range"
	}
	return ""
}

// isoTime reads s if it is in the form toISOString writes for the years
// 0000 to 9999, "2026-11-30T10:00:02.000Z" ("t" and "z" in either case),
// and a valid time; otherwise it returns false and ParseTime reads s.
func isoTime[T string | []byte](s T) (time.Time, bool) {
	if len(s) != 24 || s[4] != '-' || s[7] != '-' || s[10]|0x20 != 't' || s[13] != ':' || s[16] != ':' ||
		s[19] != '.' || s[23]|0x20 != 'z' {
		return time.Time{}, false
	}
	bad := false // a digit's place holds another byte
	digit := func(i int) int {
		c := s[i] - '0'
		if c > 9 {
			bad = true
		}
		return int(c)
	}
	two := func(i int) int { return digit(i)*10 + digit(i+1) }
	year := two(0)*100 + two(2)
	month, day, hour, minute, sec := two(5), two(8), two(11), two(14), two(17)
	millis := two(20)*10 + digit(22)
	if bad || month < 1 || month > 12 || day < 1 || day > daysIn(year, month) || hour > 23 || minute > 59 || sec > 59 {
		return time.Time{}, false
	}
	secs := civilDays(year, month, day)*86400 + int64(hour*3600+minute*60+sec)
	return time.Unix(secs, int64(millis)*int64(time.Millisecond)).UTC(), true
}

// civilDays returns the days from 1970-01-01 to the date (proleptic
// Gregorian, year 0 or later).
func civilDays(year, month, day int) int64 {
	if month <= 2 {
		year--
	}
	era := year / 400 // 400-year eras, floored: year -1 is in era -1
	if year < 0 {
		era = (year - 399) / 400
	}
	yoe := year - era*400 // the year of the era, 0 to 399
	doy := (153*((month+9)%12)+2)/5 + day - 1
	doe := yoe*365 + yoe/4 - yoe/100 + doy
	return int64(era)*146097 + int64(doe) - 719468
}

// daysIn returns the number of days in month of year (proleptic Gregorian).
func daysIn(year, month int) int {
	switch month {
	case 2:
		if year%4 == 0 && (year%100 != 0 || year%400 == 0) {
			return 29
		}
		return 28
	case 4, 6, 9, 11:
		return 30
	}
	return 31
}
