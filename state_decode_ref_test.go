package jobkeys

import (
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/jobkeys/jobkeys/internal/jsjson"
)

// The key state decoder as it was before state_decode.go's single-pass
// decoder replaced it, kept unchanged (only renamed) as the reference the
// differential fuzz target FuzzDecodeStateDifferential compares the new
// decoder with: it validates the whole text with encoding/json first, then
// finds each member by rescanning the text.

// refDecodeState reads a key state document; see [ParseState]. It reads the
// members JSON.parse reads: names match exactly (after unescaping), the last
// of duplicate members counts, and members it does not know are ignored.
func refDecodeState(data []byte) (*KeyState, error) {
	text := jsjson.TrimBOM(data)
	if err := jsjson.CheckText(text); err != nil {
		return nil, fmt.Errorf("state is not valid JSON: %w", err)
	}
	r := refStateReader{text: text}
	pos := jsjson.SkipWS(text, 0)
	if text[pos] != '{' {
		return nil, fmt.Errorf("state is not a JSON object (it is %s)", refKindAt(text, pos))
	}
	const (
		fVersion = iota
		fService
		fJobType
		fKey
		fKeyHash
		fMaxActive
		fMaxQueued
		fActive
		fQueued
		fStale
		fUpdatedAt
		nStateFields
	)
	var at [nStateFields]int
	r.members(pos, []string{"version", "service", "jobType", "key", "keyHash", "maxActive",
		"maxQueuedPerKey", "active", "queued", "staleTakeoverCount", "updatedAt"}, at[:])

	var s KeyState
	var err error
	if v, ok := r.number(at[fVersion]); !ok || v != StateVersion {
		return nil, refFieldErr("version", at[fVersion] != 0, "must be 1")
	}
	s.Version = StateVersion
	if s.Service, err = r.nonEmpty("service", at[fService]); err != nil {
		return nil, err
	}
	if s.JobType, err = r.nonEmpty("jobType", at[fJobType]); err != nil {
		return nil, err
	}
	if s.DisplayKey, err = r.str("key", at[fKey]); err != nil {
		return nil, err
	}
	if s.KeyHash, err = r.nonEmpty("keyHash", at[fKeyHash]); err != nil {
		return nil, err
	}
	if s.MaxActive, err = r.integer("maxActive", at[fMaxActive], 1); err != nil {
		return nil, err
	}
	if at[fMaxQueued] != 0 { // optional in the TypeScript original's type
		if s.MaxQueuedPerKey, err = r.integer("maxQueuedPerKey", at[fMaxQueued], 0); err != nil {
			return nil, err
		}
	}
	err = r.array("active", at[fActive], func(i, pos int) error {
		var a ActiveSlot
		if err := r.slot(pos, &a); err != nil {
			return fmt.Errorf("active[%d]: %w", i, err)
		}
		s.Active = append(s.Active, a)
		return nil
	})
	if err != nil {
		return nil, err
	}
	err = r.array("queued", at[fQueued], func(i, pos int) error {
		var q QueuedJob
		if err := r.queued(pos, &q); err != nil {
			return fmt.Errorf("queued[%d]: %w", i, err)
		}
		s.Queued = append(s.Queued, q)
		return nil
	})
	if err != nil {
		return nil, err
	}
	if s.Active == nil {
		s.Active = []ActiveSlot{}
	}
	if s.Queued == nil {
		s.Queued = []QueuedJob{}
	}
	if s.StaleTakeoverCount, err = r.integer("staleTakeoverCount", at[fStale], 0); err != nil {
		return nil, err
	}
	if s.UpdatedAt, err = r.timestamp("updatedAt", at[fUpdatedAt]); err != nil {
		return nil, err
	}
	return &s, nil
}

// refStateReader reads the members of a state document, JSON text that
// jsjson.CheckText accepted. A member's position is the offset of its value plus
// one, so that 0 stands for a missing member.
type refStateReader struct {
	text    []byte
	scratch []byte
}

// members sets at[k] to the position of the last member of the object at
// text[pos] named names[k], and leaves it 0 where there is none.
func (r *refStateReader) members(pos int, names []string, at []int) {
	i, _ := jsjson.FirstMember(r.text, pos)
	for i >= 0 {
		var name []byte
		var v int
		name, v, r.scratch = jsjson.NextMember(r.text, i, r.scratch)
		for k, n := range names {
			if string(name) == n {
				at[k] = v + 1
				break
			}
		}
		i, _ = jsjson.AfterValue(r.text, jsjson.ValueEnd(r.text, v))
	}
}

// object reads the object at position p into at, or says what the member
// field is instead.
func (r *refStateReader) object(field string, p int, names []string, at []int) error {
	if p == 0 || r.text[p-1] != '{' {
		return refFieldErr(field, p != 0, "must be an object"+r.got(p))
	}
	r.members(p-1, names, at)
	return nil
}

// array calls each with the index and offset of every element of the array
// at position p, or says what the member field is instead.
func (r *refStateReader) array(field string, p int, each func(i, pos int) error) error {
	if p == 0 || r.text[p-1] != '[' {
		return refFieldErr(field, p != 0, "must be an array"+r.got(p))
	}
	i, _ := jsjson.FirstMember(r.text, p-1)
	for n := 0; i >= 0; n++ {
		if err := each(n, i); err != nil {
			return err
		}
		i, _ = jsjson.AfterValue(r.text, jsjson.ValueEnd(r.text, i))
	}
	return nil
}

// got describes the value at position p for an error message.
func (r *refStateReader) got(p int) string {
	if p == 0 {
		return ""
	}
	return ", not " + refKindAt(r.text, p-1)
}

// kindAt names the kind of the JSON value at text[pos].
func refKindAt(text []byte, pos int) string {
	switch text[pos] {
	case '"':
		return "a string"
	case '{':
		return "an object"
	case '[':
		return "an array"
	case 't', 'f':
		return "a boolean"
	case 'n':
		return "null"
	}
	return "a number"
}

// str returns the string at position p.
func (r *refStateReader) str(field string, p int) (string, error) {
	if p == 0 || r.text[p-1] != '"' {
		return "", refFieldErr(field, p != 0, "must be a string"+r.got(p))
	}
	raw := r.text[p : jsjson.StringEnd(r.text, p-1)-1]
	if !jsjson.NeedsDecoding(raw) {
		return string(raw), nil
	}
	return string(jsjson.AppendStringValue(make([]byte, 0, len(raw)), raw)), nil
}

// nonEmpty returns the non-empty string at position p.
func (r *refStateReader) nonEmpty(field string, p int) (string, error) {
	s, err := r.str(field, p)
	if err != nil || s == "" {
		return "", refFieldErr(field, p != 0, "must be a non-empty string"+r.got(p))
	}
	return s, nil
}

// number returns the number at position p as JSON.parse reads it (a literal
// beyond the doubles is ±Infinity).
func (r *refStateReader) number(p int) (float64, bool) {
	if p == 0 {
		return 0, false
	}
	switch c := r.text[p-1]; {
	case c == '-' || c >= '0' && c <= '9':
		f, _ := strconv.ParseFloat(string(r.text[p-1:jsjson.ValueEnd(r.text, p-1)]), 64)
		return f, true
	}
	return 0, false
}

// integer returns the integer at position p, at least lowest and at most
// 2^53 (beyond that a double does not hold every integer; the TypeScript
// original accepts any integral double).
func (r *refStateReader) integer(field string, p int, lowest int) (int, error) {
	f, ok := r.number(p)
	if !ok || f != math.Trunc(f) || f < float64(lowest) || f > 1<<53 || f > math.MaxInt {
		return 0, refFieldErr(field, p != 0, fmt.Sprintf("must be an integer from %d to 2^53", lowest)+r.got(p))
	}
	return int(f), nil
}

// timestamp returns the time at position p; see jsjson.ParseTime.
func (r *refStateReader) timestamp(field string, p int) (time.Time, error) {
	s, err := r.str(field, p)
	if err != nil {
		return time.Time{}, refFieldErr(field, p != 0, "must be an RFC 3339 timestamp"+r.got(p))
	}
	t, err := refParseTimestamp(s)
	if err != nil {
		return time.Time{}, fmt.Errorf("field %s: %w", field, err)
	}
	return t, nil
}

// slot reads the active slot at text[pos].
func (r *refStateReader) slot(pos int, a *ActiveSlot) error {
	const (
		fJobID = iota
		fSlotToken
		fInstanceID
		fStartedAt
		fHeartbeatAt
		fLeaseExpiresAt
		fTries
		fContext
		nSlotFields
	)
	var at [nSlotFields]int
	err := r.object("slot", pos+1, []string{"jobId", "slotToken", "instanceId", "startedAt", "heartbeatAt",
		"leaseExpiresAt", "tries", "context"}, at[:])
	if err != nil {
		return err
	}
	if a.JobID, err = r.nonEmpty("jobId", at[fJobID]); err != nil {
		return err
	}
	if a.SlotToken, err = r.nonEmpty("slotToken", at[fSlotToken]); err != nil {
		return err
	}
	if a.InstanceID, err = r.nonEmpty("instanceId", at[fInstanceID]); err != nil {
		return err
	}
	if a.StartedAt, err = r.timestamp("startedAt", at[fStartedAt]); err != nil {
		return err
	}
	if a.HeartbeatAt, err = r.timestamp("heartbeatAt", at[fHeartbeatAt]); err != nil {
		return err
	}
	if a.LeaseExpiresAt, err = r.timestamp("leaseExpiresAt", at[fLeaseExpiresAt]); err != nil {
		return err
	}
	if a.Tries, err = r.integer("tries", at[fTries], 0); err != nil {
		return err
	}
	// The Rust port may leave the context out (or write null); it then
	// reads as zero and is written back derived from the job and slot.
	if p := at[fContext]; p != 0 && r.text[p-1] != 'n' {
		a.Context, err = r.context(p)
	}
	return err
}

// queued reads the queued entry at text[pos].
func (r *refStateReader) queued(pos int, q *QueuedJob) error {
	const (
		fJobID = iota
		fCreatedAt
		fRequestID
		fContext
		nQueuedFields
	)
	var at [nQueuedFields]int
	err := r.object("entry", pos+1, []string{"jobId", "createdAt", "requestId", "context"}, at[:])
	if err != nil {
		return err
	}
	if q.JobID, err = r.nonEmpty("jobId", at[fJobID]); err != nil {
		return err
	}
	if q.CreatedAt, err = r.timestamp("createdAt", at[fCreatedAt]); err != nil {
		return err
	}
	if q.RequestID, err = r.nonEmpty("requestId", at[fRequestID]); err != nil {
		return err
	}
	q.Context, err = r.context(at[fContext])
	return err
}

// context reads the trace context at position p.
func (r *refStateReader) context(p int) (TraceContext, error) {
	var c TraceContext
	var at [4]int
	if err := r.object("context", p, []string{"requestId", "traceId", "traceparent", "tracestate"}, at[:]); err != nil {
		return c, err
	}
	var err error
	if c.RequestID, err = r.nonEmpty("context.requestId", at[0]); err != nil {
		return c, err
	}
	if c.TraceID, err = r.nonEmpty("context.traceId", at[1]); err != nil {
		return c, err
	}
	if c.Traceparent, err = r.nonEmpty("context.traceparent", at[2]); err != nil {
		return c, err
	}
	if at[3] != 0 { // optional
		c.Tracestate, err = r.str("context.tracestate", at[3])
	}
	return c, err
}

// fieldErr reports that a field is missing or has a bad value.
func refFieldErr(field string, present bool, want string) error {
	if !present {
		return fmt.Errorf("field %s is missing (it %s)", field, want)
	}
	return fmt.Errorf("field %s %s", field, want)
}

// refParseTimestamp reads an RFC 3339 date-time ("2026-11-30T10:00:02.5Z",
// "2026-11-30t11:00:02+01:00"; "T" and "Z" in either case) or the same with
// an expanded year as toISOString writes it ("+010000-01-01T00:00:00.000Z"),
// as JavaScript's Date.parse reads it: fraction digits past the millisecond
// are cut, and the time must lie within what a Date can hold (about the
// years -271821 to 275760). A leap second (":60") is an error, as
// Date.parse has no way to hold one; so are the other forms Date.parse may
// accept (a date alone, no seconds, no offset, a space for "T", day 31 of a
// 30-day month). The error quotes s.
func refParseTimestamp(s string) (time.Time, error) {
	bad := func(why string) (time.Time, error) {
		return time.Time{}, fmt.Errorf("%q is not an RFC 3339 timestamp: %s", s, why)
	}
	i := 0
	digits := func(n int) (int, bool) {
		if len(s)-i < n {
			return 0, false
		}
		v := 0
		for _, c := range []byte(s[i : i+n]) {
			if c < '0' || c > '9' {
				return 0, false
			}
			v = v*10 + int(c-'0')
		}
		i += n
		return v, true
	}
	sep := func(c byte) bool {
		if i < len(s) && (s[i] == c || c >= 'A' && c <= 'Z' && s[i] == c+'a'-'A') { // 'T' or 't', 'Z' or 'z'
			i++
			return true
		}
		return false
	}
	var year int
	var ok bool
	if s != "" && (s[0] == '+' || s[0] == '-') {
		i = 1
		if year, ok = digits(6); !ok {
			return bad("a signed year has six digits")
		}
		if s[0] == '-' {
			if year == 0 {
				return bad("the year -000000 is not allowed")
			}
			year = -year
		}
	} else if year, ok = digits(4); !ok {
		return bad("it does not start with a four-digit year")
	}
	var month, day, hour, minute, sec int
	if !sep('-') {
		return bad("no '-' after the year")
	}
	if month, ok = digits(2); !ok || !sep('-') {
		return bad("want YYYY-MM-DD")
	}
	if day, ok = digits(2); !ok {
		return bad("want YYYY-MM-DD")
	}
	if !sep('T') {
		return bad("want 'T' between date and time")
	}
	if hour, ok = digits(2); !ok || !sep(':') {
		return bad("want hh:mm:ss")
	}
	if minute, ok = digits(2); !ok || !sep(':') {
		return bad("want hh:mm:ss")
	}
	if sec, ok = digits(2); !ok {
		return bad("want hh:mm:ss")
	}
	millis := 0
	if sep('.') {
		start := i
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			if i-start < 3 {
				millis = millis*10 + int(s[i]-'0')
			}
			i++
		}
		if i == start {
			return bad("no digits after '.'")
		}
		for n := i - start; n < 3; n++ {
			millis *= 10
		}
	}
	offset := 0
	switch {
	case sep('Z'):
	case i < len(s) && (s[i] == '+' || s[i] == '-'):
		sign := 1
		if s[i] == '-' {
			sign = -1
		}
		i++
		oh, ok1 := digits(2)
		ok2 := sep(':')
		om, ok3 := digits(2)
		if !ok1 || !ok2 || !ok3 || oh > 23 || om > 59 {
			return bad("want an offset of Z or ±hh:mm")
		}
		offset = sign * (oh*60 + om)
	default:
		return bad("want an offset of Z or ±hh:mm")
	}
	if i != len(s) {
		return bad("unexpected text after the offset")
	}
	switch {
	case month < 1 || month > 12:
		return bad("month out of range")
	case day < 1 || day > refDaysIn(year, month):
		return bad("day out of range")
	case hour > 23 || minute > 59:
		return bad("time out of range")
	case sec == 60:
		return bad("a leap second cannot be represented")
	case sec > 59:
		return bad("seconds out of range")
	}
	t := time.Date(year, time.Month(month), day, hour, minute, sec, millis*int(time.Millisecond), time.UTC).
		Add(-time.Duration(offset) * time.Minute)
	if ms := t.UnixMilli(); ms > jsjson.MaxTimeMillis || ms < -jsjson.MaxTimeMillis {
		return bad("outside the range of JavaScript dates")
	}
	return t, nil
}

// daysIn returns the number of days in month of year (proleptic Gregorian).
func refDaysIn(year, month int) int {
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
