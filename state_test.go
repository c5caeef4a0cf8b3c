package jobkeys

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jobkeys/jobkeys/internal/jsjson"
)

// ---------------------------------------------------------------------------
// An independent checker that follows the TypeScript original's
// isJobKeyState, isJobKeyActiveSlot, isJobKeyQueued and isJobContext (seed
// 000) predicate by predicate, over a generic decode of the document as
// JSON.parse gives it (jsParse). A missing member is JavaScript's
// undefined; a present null is null.
//
// In strict mode it is the TypeScript original's check: what we write must
// pass it. In lenient mode it is what ParseState must accept, the
// TypeScript original's check with the reader's deliberate differences:
//
//   - a slot's context may be missing or null (the Rust port's slots);
//   - integers go up to 2^53 (a Go int holds them; the TypeScript original
//     takes any integral double);
//   - timestamps are RFC 3339 or toISOString's expanded years (rfc3339Millis)
//     instead of whatever Date.parse accepts (esDateParses approximates the
//     ECMAScript format; TestParseTimestampDateParseVectors compares both
//     with real Date.parse output).

// tsRules selects the checker's mode.
type tsRules struct{ lenient bool }

var (
	tsStrict  = tsRules{}
	tsLenient = tsRules{lenient: true}
)

// jsParse decodes data as JSON.parse(new TextDecoder().decode(data)) does,
// with encoding/json (exact member names, the last duplicate wins): a
// leading byte order mark dropped, numbers as doubles (1e400 is +Inf).
// Strings differ from JSON.parse only where encoding/json writes U+FFFD for
// a lone surrogate escape or for each byte of invalid UTF-8.
func jsParse(data []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(bytes.TrimPrefix(data, []byte("\xef\xbb\xbf"))))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("data after the value (%v)", err)
	}
	var conv func(v any) any
	conv = func(v any) any {
		switch v := v.(type) {
		case json.Number:
			f, _ := strconv.ParseFloat(string(v), 64) // ±Inf past the doubles, as in JavaScript
			return f
		case []any:
			for i := range v {
				v[i] = conv(v[i])
			}
		case map[string]any:
			for k := range v {
				v[k] = conv(v[k])
			}
		}
		return v
	}
	return conv(v), nil
}

// tsCheckStateJSON returns "" if the TypeScript original accepts data as a
// key state, else the first predicate that fails.
func tsCheckStateJSON(data []byte) string {
	v, err := jsParse(data)
	if err != nil {
		return "JSON.parse: " + err.Error()
	}
	return tsStrict.checkState(v)
}

func (r tsRules) checkState(value any) string {
	state, ok := value.(map[string]any)
	if !ok {
		return "state is not an object"
	}
	switch {
	case !tsIs(state, "version", func(v any) bool { return v == float64(1) }):
		return "version === 1"
	case !tsIs(state, "service", tsNonEmptyString):
		return "isNonEmptyString(service)"
	case !tsIs(state, "jobType", tsNonEmptyString):
		return "isNonEmptyString(jobType)"
	case !tsIs(state, "key", tsString):
		return "typeof key === 'string'"
	case !tsIs(state, "keyHash", tsNonEmptyString):
		return "isNonEmptyString(keyHash)"
	case !tsIs(state, "maxActive", r.positiveInteger):
		return "isPositiveInteger(maxActive)"
	case tsDefined(state, "maxQueuedPerKey") && !tsIs(state, "maxQueuedPerKey", r.nonNegativeInteger):
		return "maxQueuedPerKey === undefined || isNonNegativeInteger(maxQueuedPerKey)"
	}
	active, ok := state["active"].([]any)
	if !ok {
		return "Array.isArray(active)"
	}
	for i, slot := range active {
		if why := r.checkSlot(slot); why != "" {
			return fmt.Sprintf("active[%d]: %s", i, why)
		}
	}
	queued, ok := state["queued"].([]any)
	if !ok {
		return "Array.isArray(queued)"
	}
	for i, entry := range queued {
		if why := r.checkQueued(entry); why != "" {
			return fmt.Sprintf("queued[%d]: %s", i, why)
		}
	}
	switch {
	case !tsIs(state, "staleTakeoverCount", r.nonNegativeInteger):
		return "isNonNegativeInteger(staleTakeoverCount)"
	case !tsIs(state, "updatedAt", r.validIsoTimestamp):
		return "isValidIsoTimestamp(updatedAt)"
	}
	return ""
}

func (r tsRules) checkQueued(value any) string {
	entry, ok := value.(map[string]any)
	if !ok {
		return "entry is not an object"
	}
	switch {
	case !tsIs(entry, "jobId", tsNonEmptyString):
		return "isNonEmptyString(jobId)"
	case !tsIs(entry, "createdAt", r.validIsoTimestamp):
		return "isValidIsoTimestamp(createdAt)"
	case !tsIs(entry, "requestId", tsNonEmptyString):
		return "isNonEmptyString(requestId)"
	}
	if why := tsCheckContext(entry["context"]); why != "" {
		return "isJobContext(context): " + why
	}
	return ""
}

func (r tsRules) checkSlot(value any) string {
	slot, ok := value.(map[string]any)
	if !ok {
		return "slot is not an object"
	}
	switch {
	case !tsIs(slot, "jobId", tsNonEmptyString):
		return "isNonEmptyString(jobId)"
	case !tsIs(slot, "slotToken", tsNonEmptyString):
		return "isNonEmptyString(slotToken)"
	case !tsIs(slot, "instanceId", tsNonEmptyString):
		return "isNonEmptyString(instanceId)"
	case !tsIs(slot, "startedAt", r.validIsoTimestamp):
		return "isValidIsoTimestamp(startedAt)"
	case !tsIs(slot, "heartbeatAt", r.validIsoTimestamp):
		return "isValidIsoTimestamp(heartbeatAt)"
	case !tsIs(slot, "leaseExpiresAt", r.validIsoTimestamp):
		return "isValidIsoTimestamp(leaseExpiresAt)"
	case !tsIs(slot, "tries", r.nonNegativeInteger):
		return "isNonNegativeInteger(tries)"
	}
	if r.lenient && (slot["context"] == nil) { // missing or null
		return ""
	}
	if why := tsCheckContext(slot["context"]); why != "" {
		return "isJobContext(context): " + why
	}
	return ""
}

func tsCheckContext(value any) string {
	c, ok := value.(map[string]any)
	if !ok {
		return "context is not an object"
	}
	switch {
	case !tsIs(c, "requestId", tsNonEmptyString):
		return "isNonEmptyString(requestId)"
	case !tsIs(c, "traceId", tsNonEmptyString):
		return "isNonEmptyString(traceId)"
	case !tsIs(c, "traceparent", tsNonEmptyString):
		return "isNonEmptyString(traceparent)"
	case tsDefined(c, "tracestate") && !tsIs(c, "tracestate", tsString):
		return "tracestate === undefined || typeof tracestate === 'string'"
	}
	return ""
}

// tsIs applies pred to member k of o; a missing member is undefined, which
// no predicate but the explicit "=== undefined" checks accepts.
func tsIs(o map[string]any, k string, pred func(any) bool) bool {
	v, ok := o[k]
	return ok && pred(v)
}

func tsDefined(o map[string]any, k string) bool { _, ok := o[k]; return ok }

func tsString(v any) bool { _, ok := v.(string); return ok }

// tsNonEmptyString is isNonEmptyString; a string's JavaScript length is
// positive exactly when it has a byte.
func tsNonEmptyString(v any) bool { s, ok := v.(string); return ok && len(s) > 0 }

func (r tsRules) integer(v any) (float64, bool) {
	f, ok := v.(float64)
	ok = ok && !math.IsInf(f, 0) && f == math.Trunc(f)
	if r.lenient {
		ok = ok && f <= 1<<53
	}
	return f, ok
}

func (r tsRules) positiveInteger(v any) bool { f, ok := r.integer(v); return ok && f > 0 }

func (r tsRules) nonNegativeInteger(v any) bool { f, ok := r.integer(v); return ok && f >= 0 }

func (r tsRules) validIsoTimestamp(v any) bool {
	s, ok := v.(string)
	if r.lenient {
		_, ok2 := rfc3339Millis(s)
		return ok && ok2
	}
	return ok && esDateParses(s)
}

// esDateRe is ECMAScript's Date Time String Format (ECMA-262, "Date Time
// String Format"), the one format Date.parse must accept in every engine,
// with V8's leniency of any number of fraction digits.
var esDateRe = regexp.MustCompile(`^([+-]\d{6}|\d{4})(?:-(\d{2})(?:-(\d{2}))?)?` +
	`(?:T(\d{2}):(\d{2})(?::(\d{2})(?:\.(\d+))?)?(Z|[+-]\d{2}:\d{2})?)?$`)

// esDateParses reports whether Date.parse(s) gives a finite number for s in
// the ECMAScript format: fields in range and the instant within ±8.64e15 ms.
func esDateParses(s string) bool {
	m := esDateRe.FindStringSubmatch(s)
	if m == nil || m[1] == "-000000" {
		return false
	}
	num := func(s string, def int) int {
		if s == "" {
			return def
		}
		n, _ := strconv.Atoi(s)
		return n
	}
	year := num(strings.TrimPrefix(m[1], "+"), 0)
	month, day := num(m[2], 1), num(m[3], 1)
	hour, minute, sec := num(m[4], 0), num(m[5], 0), num(m[6], 0)
	if month < 1 || month > 12 || day < 1 || day > 31 || minute > 59 || sec > 59 || hour > 24 {
		return false
	}
	if hour == 24 && (minute != 0 || sec != 0 || strings.Trim(m[7], "0") != "") {
		return false
	}
	offset := 0
	if z := m[8]; len(z) == 6 {
		oh, om := num(z[1:3], 0), num(z[4:6], 0)
		if oh > 23 || om > 59 {
			return false
		}
		offset = oh*60 + om
		if z[0] == '-' {
			offset = -offset
		}
	}
	// Days from the civil date (proleptic Gregorian), then milliseconds.
	days := daysFromCivil(year, month, day)
	ms := float64(days)*86400e3 + float64(hour*3600+minute*60+sec-offset*60)*1e3 + float64(num((m[7] + "000")[:3], 0))
	return math.Abs(ms) <= 8.64e15
}

// rfc3339Re is an RFC 3339 date-time ("T" and "Z" in either case), or the
// same with a sign and a six-digit year.
var rfc3339Re = regexp.MustCompile(`^([+-]\d{6}|\d{4})-(\d{2})-(\d{2})[Tt](\d{2}):(\d{2}):(\d{2})(?:\.(\d+))?([Zz]|[+-]\d{2}:\d{2})$`)

// rfc3339Millis returns the Unix milliseconds of s as ParseState must read
// it (see the top of this section), and whether it must read it at all.
func rfc3339Millis(s string) (int64, bool) {
	m := rfc3339Re.FindStringSubmatch(s)
	if m == nil || m[1] == "-000000" {
		return 0, false
	}
	n := func(s string) int { v, _ := strconv.Atoi(s); return v }
	year, month, day := n(strings.TrimPrefix(m[1], "+")), n(m[2]), n(m[3])
	hour, minute, sec := n(m[4]), n(m[5]), n(m[6])
	if month < 1 || month > 12 || day < 1 || hour > 23 || minute > 59 || sec > 59 {
		return 0, false
	}
	if time.Date(year, time.Month(month), day, 0, 0, 0, 0, time.UTC).Day() != day {
		return 0, false // past the end of the month
	}
	ms := (m[7] + "000")[:3]
	offset := 0
	if z := m[8]; len(z) == 6 {
		oh, om := n(z[1:3]), n(z[4:6])
		if oh > 23 || om > 59 {
			return 0, false
		}
		offset = oh*60 + om
		if z[0] == '-' {
			offset = -offset
		}
	}
	total := (int64(daysFromCivil(year, month, day))*86400+int64(hour*3600+minute*60+sec-offset*60))*1000 + int64(n(ms))
	if total > 8.64e15 || total < -8.64e15 {
		return 0, false
	}
	return total, true
}

func daysFromCivil(y, m, d int) int {
	if m <= 2 {
		y--
	}
	era := y
	if era < 0 {
		era -= 399
	}
	era /= 400
	yoe := y - era*400
	mp := (m + 9) % 12
	doy := (153*mp+2)/5 + d - 1
	doe := yoe*365 + yoe/4 - yoe/100 + doy
	return era*146097 + doe - 719468
}

// tsExpectState returns the state ParseState must read from data (the
// lenient checker's verdict, "" for accepted, and the content the
// TypeScript original reads). Strings are as encoding/json decodes them
// (see jsParse); compare them through jsonView.
func tsExpectState(data []byte) (*KeyState, string) {
	v, err := jsParse(data)
	if err != nil {
		return nil, "JSON.parse: " + err.Error()
	}
	if why := tsLenient.checkState(v); why != "" {
		return nil, why
	}
	o := v.(map[string]any)
	str := func(o map[string]any, k string) string { s, _ := o[k].(string); return s }
	num := func(o map[string]any, k string) int { f, _ := o[k].(float64); return int(f) }
	at := func(o map[string]any, k string) time.Time {
		ms, _ := rfc3339Millis(o[k].(string))
		return time.UnixMilli(ms).UTC()
	}
	ctx := func(v any) TraceContext {
		c, _ := v.(map[string]any)
		return TraceContext{RequestID: str(c, "requestId"), TraceID: str(c, "traceId"),
			Traceparent: str(c, "traceparent"), Tracestate: str(c, "tracestate")}
	}
	s := &KeyState{Version: 1, Service: str(o, "service"), JobType: str(o, "jobType"), DisplayKey: str(o, "key"),
		KeyHash: str(o, "keyHash"), MaxActive: num(o, "maxActive"), MaxQueuedPerKey: num(o, "maxQueuedPerKey"),
		StaleTakeoverCount: num(o, "staleTakeoverCount"), UpdatedAt: at(o, "updatedAt")}
	for _, e := range o["active"].([]any) {
		a := e.(map[string]any)
		s.Active = append(s.Active, ActiveSlot{JobID: str(a, "jobId"), SlotToken: str(a, "slotToken"),
			InstanceID: str(a, "instanceId"), StartedAt: at(a, "startedAt"), HeartbeatAt: at(a, "heartbeatAt"),
			LeaseExpiresAt: at(a, "leaseExpiresAt"), Tries: num(a, "tries"), Context: ctx(a["context"])})
	}
	for _, e := range o["queued"].([]any) {
		q := e.(map[string]any)
		s.Queued = append(s.Queued, QueuedJob{JobID: str(q, "jobId"), CreatedAt: at(q, "createdAt"),
			RequestID: str(q, "requestId"), Context: ctx(q["context"])})
	}
	return s, ""
}

// jsonView returns s as encoding/json would decode it from what
// JSON.stringify writes for it: lone surrogates (WTF-8) become U+FFFD.
func jsonView(s string) string {
	var out string
	if err := json.Unmarshal(jsjson.AppendString(nil, s), &out); err != nil {
		panic(err)
	}
	return out
}

// stringsView returns a copy of s with every string passed through
// jsonView, for comparison with tsExpectState's content.
func stringsView(s *KeyState) *KeyState {
	c := normState(s)
	v := jsonView
	ctx := func(x TraceContext) TraceContext {
		return TraceContext{v(x.RequestID), v(x.TraceID), v(x.Traceparent), v(x.Tracestate)}
	}
	c.Service, c.JobType, c.DisplayKey, c.KeyHash = v(c.Service), v(c.JobType), v(c.DisplayKey), v(c.KeyHash)
	for i := range c.Active {
		a := &c.Active[i]
		a.JobID, a.SlotToken, a.InstanceID, a.Context = v(a.JobID), v(a.SlotToken), v(a.InstanceID), ctx(a.Context)
	}
	for i := range c.Queued {
		q := &c.Queued[i]
		q.JobID, q.RequestID, q.Context = v(q.JobID), v(q.RequestID), ctx(q.Context)
	}
	return c
}

// ---------------------------------------------------------------------------

// isoMillis is the form of JavaScript's Date#toISOString: four-digit years
// from 0 to 9999, a sign and six digits otherwise.
var isoMillis = regexp.MustCompile(`^(\d{4}|[+-]\d{6})-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$`)

var (
	wantTopOrder     = []string{"version", "service", "jobType", "key", "keyHash", "maxActive", "maxQueuedPerKey", "active", "queued", "staleTakeoverCount", "updatedAt"}
	wantSlotOrder    = []string{"jobId", "slotToken", "instanceId", "startedAt", "heartbeatAt", "leaseExpiresAt", "tries", "context"}
	wantQueuedOrder  = []string{"jobId", "createdAt", "requestId", "context"}
	wantContextOrder = []string{"requestId", "traceId", "traceparent"}
	slotPath         = regexp.MustCompile(`^active\[\d+\]$`)
	queuedPath       = regexp.MustCompile(`^queued\[\d+\]$`)
)

// jsonMembers returns, for every object in the document, its member names
// in document order, by path ("" for the top, "active[0].context", ...), and
// every string value by path.
func jsonMembers(t testing.TB, data []byte) (order map[string][]string, strs map[string]string) {
	t.Helper()
	order, strs = map[string][]string{}, map[string]string{}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var walk func(path string) error
	walk = func(path string) error {
		tok, err := dec.Token()
		if err != nil {
			return err
		}
		switch d := tok.(type) {
		case json.Delim:
			switch d {
			case '{':
				order[path] = []string{}
				for dec.More() {
					k, err := dec.Token()
					if err != nil {
						return err
					}
					name := k.(string)
					order[path] = append(order[path], name)
					child := name
					if path != "" {
						child = path + "." + name
					}
					if err := walk(child); err != nil {
						return err
					}
				}
				_, err = dec.Token()
				return err
			case '[':
				for i := 0; dec.More(); i++ {
					if err := walk(fmt.Sprintf("%s[%d]", path, i)); err != nil {
						return err
					}
				}
				_, err = dec.Token()
				return err
			}
		case string:
			strs[path] = d
		}
		return nil
	}
	require.NoError(t, walk(""), "walking %s", data)
	_, err := dec.Token()
	require.ErrorIs(t, err, io.EOF, "trailing data after the document: %s", data)
	return order, strs
}

// checkWritten checks a document the library wrote: the TypeScript original
// accepts it, members in its order, timestamps as toISOString writes them.
func checkWritten(t testing.TB, data []byte) {
	t.Helper()
	require.Empty(t, tsCheckStateJSON(data), "the TypeScript original's isJobKeyState rejects what we wrote:\n%s", data)
	order, strs := jsonMembers(t, data)
	require.Equal(t, wantTopOrder, order[""], "top-level member order")
	for path, names := range order {
		switch {
		case path == "":
		case slotPath.MatchString(path):
			require.Equal(t, wantSlotOrder, names, "member order of %s", path)
		case queuedPath.MatchString(path):
			require.Equal(t, wantQueuedOrder, names, "member order of %s", path)
		case strings.HasSuffix(path, ".context"):
			want := wantContextOrder
			if len(names) == 4 {
				want = append(append([]string{}, wantContextOrder...), "tracestate")
			}
			require.Equal(t, want, names, "member order of %s", path)
		default:
			require.Fail(t, "unexpected object", "at %s", path)
		}
	}
	for path, s := range strs {
		if strings.HasSuffix(path, "At") {
			require.Regexp(t, isoMillis, s, "timestamp %s", path)
		}
	}
}

func readStateVector(t testing.TB, name string) []byte {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", "states", name))
	require.NoError(t, err)
	return data
}

func stateVectorNames(t testing.TB) []string {
	t.Helper()
	names, err := filepath.Glob(filepath.Join("testdata", "states", "*.json"))
	require.NoError(t, err)
	for i := range names {
		names[i] = filepath.Base(names[i])
	}
	for _, want := range []string{"rust-style-no-slot-context.json", "ts-one-active-one-queued.json", "ts-two-queued.json"} {
		require.Contains(t, names, want, "state vector missing from testdata/states (a copy of shared/vectors/states)")
	}
	return names
}

// encodeState returns s in the wire format, as the coordinator writes it.
func encodeState(t testing.TB, s *KeyState) []byte {
	t.Helper()
	return appendState(nil, s)
}

func TestStateVectorsReadAndWriteBack(t *testing.T) {
	t.Parallel()
	for _, name := range stateVectorNames(t) {
		t.Run(name, func(t *testing.T) {
			doc := readStateVector(t, name)
			s, err := ParseState(doc)
			require.NoError(t, err, "ParseState(%s)", name)
			out := encodeState(t, s)
			checkWritten(t, out)

			back, err := ParseState(out)
			require.NoError(t, err, "ParseState of what we wrote")
			require.Equal(t, string(out), string(encodeState(t, back)), "encoding is not stable")

			if strings.HasPrefix(name, "ts-") {
				// What the TypeScript original wrote comes back byte for
				// byte as JSON.stringify would write it, and parses to the
				// same value.
				var compact bytes.Buffer
				require.NoError(t, json.Compact(&compact, doc))
				require.Equal(t, compact.String(), string(out), "re-encoding of a TS-written state")
				require.Equal(t, s, back, "parse(encode(s)) != s")
				require.Empty(t, tsCheckStateJSON(doc), "checker rejects the TS-written vector")
			}
		})
	}
}

func TestStateTSVectorValues(t *testing.T) {
	t.Parallel()
	s, err := ParseState(readStateVector(t, "ts-one-active-one-queued.json"))
	require.NoError(t, err)
	at := func(v string) time.Time {
		tm, err := time.Parse(time.RFC3339Nano, v)
		require.NoError(t, err)
		return tm
	}
	c := TraceContext{RequestID: "r1", TraceID: "0af7651916cd43dd8448eb211c80319c",
		Traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
	want := &KeyState{
		Version: 1, Service: "fixtures", JobType: "sync", DisplayKey: "tenant:acme",
		KeyHash:   "ebb59034518f7fd88ce5dfb2f428936d4972e4e4ee9108c05eabcdfb3876d3b3",
		MaxActive: 2, MaxQueuedPerKey: 3,
		Active: []ActiveSlot{{JobID: "job-1", SlotToken: "0bc166b9-a13e-4bb5-a202-2df15d84c57d", InstanceID: "billing-worker",
			StartedAt: at("2026-11-30T10:00:02Z"), HeartbeatAt: at("2026-11-30T10:00:02Z"),
			LeaseExpiresAt: at("2026-11-30T10:02:02Z"), Tries: 1, Context: c}},
		Queued:    []QueuedJob{{JobID: "job-2", CreatedAt: at("2026-11-30T10:00:01Z"), RequestID: "r1", Context: c}},
		UpdatedAt: at("2026-11-30T10:00:02Z"),
	}
	require.Equal(t, normState(want), normState(s))
}

// The Rust port writes nanosecond and short fractions and may leave out a
// slot's context; we read that, and write the slot back with a context the
// TypeScript original accepts.
func TestStateRustVector(t *testing.T) {
	t.Parallel()
	doc := readStateVector(t, "rust-style-no-slot-context.json")
	require.Contains(t, tsCheckStateJSON(doc), "active[0]: isJobContext(context)",
		"the vector should be one the TypeScript original rejects for the missing slot context")
	s, err := ParseState(doc)
	require.NoError(t, err)
	require.Len(t, s.Active, 1)
	slot := s.Active[0]
	assert.Equal(t, "01JDQ7Z3K9T1V5N8W2X4Y6Z0AB", slot.SlotToken)
	assert.Equal(t, time.Date(2026, 11, 30, 10, 0, 2, 123000000, time.UTC), slot.StartedAt, "nanoseconds cut to ms as Date.parse does")
	assert.Equal(t, time.Date(2026, 11, 30, 10, 0, 32, 500000000, time.UTC), slot.HeartbeatAt)
	assert.Equal(t, time.Date(2026, 11, 30, 10, 2, 32, 500000000, time.UTC), slot.LeaseExpiresAt)
	assert.True(t, slot.Context.IsZero(), "missing context reads as zero")

	out := encodeState(t, s)
	checkWritten(t, out)
	_, strs := jsonMembers(t, out)
	assert.Equal(t, "2026-11-30T10:00:02.123Z", strs["active[0].startedAt"])
	assert.Equal(t, "2026-11-30T10:00:32.500Z", strs["active[0].heartbeatAt"])
	assert.Equal(t, "job-1", strs["active[0].context.requestId"], "derived requestId")
	assert.NotEmpty(t, strs["active[0].context.traceId"], "derived trace id")
	assert.NotEmpty(t, strs["active[0].context.traceparent"], "derived traceparent")

	back, err := ParseState(out)
	require.NoError(t, err)
	require.False(t, back.Active[0].Context.IsZero(), "context written back")
	// Apart from the filled-in context, nothing changed.
	back.Active[0].Context = TraceContext{}
	assert.Equal(t, s, back)

	// A slot context of null (serde's None) reads as missing too.
	var m map[string]any
	require.NoError(t, json.Unmarshal(doc, &m))
	m["active"].([]any)[0].(map[string]any)["context"] = nil
	nullDoc, err := json.Marshal(m)
	require.NoError(t, err)
	s2, err := ParseState(nullDoc)
	require.NoError(t, err, "slot context null")
	assert.True(t, s2.Active[0].Context.IsZero(), "null context reads as zero")
}

func TestStateEncodeToISOStringAndEscaping(t *testing.T) {
	t.Parallel()
	zone := time.FixedZone("UTC+5:30", 5*3600+1800)
	local := time.Date(2026, 12, 1, 3, 30, 0, 987654321, zone) // 2026-11-30T22:00:00.987654321Z
	s := &KeyState{
		Version: 1, Service: "svc", JobType: "sync",
		DisplayKey: "a<b>&c\u2028\u0001\"\\é😀",
		KeyHash:    strings.Repeat("ab", 32), MaxActive: 1, MaxQueuedPerKey: 0,
		Active: []ActiveSlot{{JobID: "j1", SlotToken: "t", InstanceID: "w", StartedAt: local, HeartbeatAt: local,
			LeaseExpiresAt: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), Tries: 0,
			Context: TraceContext{RequestID: "r", TraceID: "x", Traceparent: "y", Tracestate: "k=v"}}},
		Queued:    []QueuedJob{{JobID: "j2", CreatedAt: time.Date(1970, 1, 1, 0, 0, 0, 0, time.UTC)}},
		UpdatedAt: time.Date(2026, 11, 30, 22, 0, 0, 1000000, time.UTC),
	}
	out := encodeState(t, s)
	checkWritten(t, out)
	_, strs := jsonMembers(t, out)
	assert.Equal(t, "2026-11-30T22:00:00.987Z", strs["active[0].startedAt"], "UTC, milliseconds, Z")
	assert.Equal(t, "2026-01-02T03:04:05.000Z", strs["active[0].leaseExpiresAt"])
	assert.Equal(t, "1970-01-01T00:00:00.000Z", strs["queued[0].createdAt"])
	assert.Equal(t, "2026-11-30T22:00:00.001Z", strs["updatedAt"])
	assert.Equal(t, "k=v", strs["active[0].context.tracestate"])
	// A queued entry without request id or context gets both, from the job id.
	assert.Equal(t, "j2", strs["queued[0].requestId"])
	assert.Equal(t, "j2", strs["queued[0].context.requestId"])
	// JSON.stringify escapes only '"', '\', control characters (short forms
	// where JSON has them, else lowercase \u00xx) and lone surrogates.
	assert.Contains(t, string(out), `"key":"a<b>&c`+"\u2028"+`\u0001\"\\é😀"`, "key escaped as JSON.stringify escapes it")
}

// Every required field, missing, null, of the wrong type or out of range, is
// an error that names the field; the TypeScript original rejects the same
// documents.
func TestStateParseRejects(t *testing.T) {
	t.Parallel()
	base := readStateVector(t, "ts-one-active-one-queued.json")
	type mutation struct {
		field string // the field the error must name, as a path
		set   any    // the new value; del for a missing member
	}
	del := struct{}{}
	var cases []mutation
	for _, f := range []string{"version", "service", "jobType", "key", "keyHash", "maxActive", "active", "queued", "staleTakeoverCount", "updatedAt"} {
		cases = append(cases, mutation{f, del}, mutation{f, nil})
	}
	cases = append(cases,
		mutation{"version", float64(2)}, mutation{"version", "1"}, mutation{"version", float64(0)},
		mutation{"service", ""}, mutation{"service", float64(5)},
		mutation{"jobType", ""}, mutation{"jobType", true},
		mutation{"key", float64(5)}, mutation{"key", []any{}},
		mutation{"keyHash", ""}, mutation{"keyHash", float64(1)},
		mutation{"maxActive", 1.5}, mutation{"maxActive", float64(0)}, mutation{"maxActive", float64(-1)}, mutation{"maxActive", "2"},
		mutation{"maxQueuedPerKey", float64(-1)}, mutation{"maxQueuedPerKey", 0.5}, mutation{"maxQueuedPerKey", "3"},
		mutation{"maxQueuedPerKey", nil},
		mutation{"active", map[string]any{}}, mutation{"active", "[]"},
		mutation{"queued", map[string]any{}}, mutation{"queued", float64(0)},
		mutation{"staleTakeoverCount", float64(-1)}, mutation{"staleTakeoverCount", 0.5}, mutation{"staleTakeoverCount", "0"},
		mutation{"updatedAt", "yesterday"}, mutation{"updatedAt", "2026-13-01T00:00:00.000Z"}, mutation{"updatedAt", float64(1700000000000)},
		mutation{"updatedAt", ""}, mutation{"updatedAt", "2026-11-30T23:59:60Z"}, mutation{"updatedAt", "+275760-09-13T00:00:00.001Z"},
	)
	for _, f := range []string{"jobId", "slotToken", "instanceId", "startedAt", "heartbeatAt", "leaseExpiresAt", "tries"} {
		cases = append(cases, mutation{"active[0]." + f, del}, mutation{"active[0]." + f, nil}, mutation{"active[0]." + f, ""})
	}
	cases = append(cases,
		mutation{"active[0].tries", float64(-1)}, mutation{"active[0].tries", 1.5}, mutation{"active[0].tries", "1"},
		mutation{"active[0].leaseExpiresAt", "2026-11-30 10:02:02"}, mutation{"active[0].startedAt", float64(0)},
		mutation{"active[0].context", float64(5)}, mutation{"active[0].context", map[string]any{}},
		mutation{"active[0].context.requestId", del}, mutation{"active[0].context.traceId", ""},
		mutation{"active[0].context.traceparent", nil}, mutation{"active[0].context.tracestate", float64(5)},
		mutation{"active[0].context.tracestate", nil},
	)
	for _, f := range []string{"jobId", "createdAt", "requestId"} {
		cases = append(cases, mutation{"queued[0]." + f, del}, mutation{"queued[0]." + f, nil}, mutation{"queued[0]." + f, ""})
	}
	cases = append(cases,
		mutation{"queued[0].createdAt", "not a time"},
		mutation{"queued[0].context", del}, mutation{"queued[0].context", nil}, mutation{"queued[0].context", "ctx"},
		mutation{"queued[0].context.traceId", del}, mutation{"queued[0].context.requestId", float64(1)},
		mutation{"queued[0]", nil}, mutation{"active[0]", "slot"},
	)
	for _, c := range cases {
		name := fmt.Sprintf("%s=%v", c.field, c.set)
		if c.set == del {
			name = c.field + " missing"
		}
		t.Run(name, func(t *testing.T) {
			var doc any
			require.NoError(t, json.Unmarshal(base, &doc))
			setPath(t, doc, c.field, c.set, c.set == del)
			data, err := json.Marshal(doc)
			require.NoError(t, err)
			require.NotEmpty(t, tsCheckStateJSON(data), "test bug: the TypeScript original would accept %s", data)
			_, err = ParseState(data)
			require.Error(t, err, "ParseState accepted a document the TypeScript original rejects (%s): %s", tsCheckStateJSON(data), data)
			// The error names the top-level member and the innermost field
			// (the array index is welcome but not required).
			parts := strings.Split(c.field, ".")
			for _, part := range []string{parts[0], parts[len(parts)-1]} {
				part, _, _ = strings.Cut(part, "[")
				re := `(^|[^A-Za-z])` + regexp.QuoteMeta(part) + `([^A-Za-z]|$)`
				require.Regexp(t, re, err.Error(), "the error names %q (of %s)", part, c.field)
			}
		})
	}

	for _, bad := range []string{"", "not json", "[]", "null", "5", `"state"`, `{"version":1`, "{}"} {
		_, err := ParseState([]byte(bad))
		assert.Error(t, err, "ParseState(%q)", bad)
	}
}

// setPath sets (or deletes) the member at path ("a", "a[0].b") of doc.
func setPath(t testing.TB, doc any, path string, v any, remove bool) {
	t.Helper()
	parts := regexp.MustCompile(`[^.\[\]]+|\[\d+\]`).FindAllString(path, -1)
	cur := doc
	for i, p := range parts {
		last := i == len(parts)-1
		if strings.HasPrefix(p, "[") {
			idx, _ := strconv.Atoi(p[1 : len(p)-1])
			arr := cur.([]any)
			if last {
				arr[idx] = v
				return
			}
			cur = arr[idx]
			continue
		}
		obj := cur.(map[string]any)
		if last {
			if remove {
				delete(obj, p)
			} else {
				obj[p] = v
			}
			return
		}
		cur = obj[p]
	}
}

// withMember returns the state vector ts-one-active-one-queued.json with
// the text member inserted at the start of the object at path ("" for the
// top, "active[0]", "active[0].context", "queued[0]", "queued[0].context"),
// or at its end with atEnd.
func withMember(t testing.TB, path, member string, atEnd bool) []byte {
	t.Helper()
	var compact bytes.Buffer
	require.NoError(t, json.Compact(&compact, readStateVector(t, "ts-one-active-one-queued.json")))
	doc := compact.String()
	// Each object of the vector starts with a member name found nowhere else
	// at that place; find the object's opening brace by it.
	first := map[string]string{
		"": `{"version"`, "active[0]": `[{"jobId"`, "queued[0]": `"queued":[{"jobId"`,
		"active[0].context": `"tries":1,"context":{`, "queued[0].context": `"requestId":"r1","context":{`,
	}[path]
	require.NotEmpty(t, first, "unknown path %q", path)
	i := strings.Index(doc, first)
	require.GreaterOrEqual(t, i, 0, "test bug: %s not found", first)
	open := i + strings.IndexByte(doc[i:], '{')
	if !atEnd {
		return []byte(doc[:open+1] + member + "," + doc[open+1:])
	}
	end := open + len(valueBytes(t, doc[open:]))
	return []byte(doc[:end-1] + "," + member + doc[end-1:])
}

// valueBytes returns the JSON value at the start of s.
func valueBytes(t testing.TB, s string) string {
	t.Helper()
	var raw json.RawMessage
	dec := json.NewDecoder(strings.NewReader(s))
	require.NoError(t, dec.Decode(&raw))
	return string(raw)
}

// TestParseStateExactMemberNames is the regression test for member names
// matched case-insensitively (encoding/json's rule): "ACTIVE":[slot] beside
// "active":[] was read with one slot, while JSON.parse, and so the
// TypeScript original, reads none. Names match exactly, the last duplicate
// wins, at every level, and each document is read as the independent
// checker reads it.
func TestParseStateExactMemberNames(t *testing.T) {
	t.Parallel()
	slot := `{"jobId":"x","slotToken":"t","instanceId":"w","startedAt":"2026-11-30T10:00:02.000Z",` +
		`"heartbeatAt":"2026-11-30T10:00:02.000Z","leaseExpiresAt":"2026-11-30T10:02:02.000Z","tries":1,` +
		`"context":{"requestId":"r","traceId":"t","traceparent":"p"}}`
	type check func(t *testing.T, s *KeyState)
	for _, tc := range []struct {
		name   string
		doc    []byte
		accept bool
		check  check
	}{
		{"ACTIVE after active", withMember(t, "", `"active":[],"ACTIVE":[`+slot+`]`, true), true,
			func(t *testing.T, s *KeyState) { assert.Empty(t, s.Active) }},
		{"ACTIVE before active", withMember(t, "", `"ACTIVE":[`+slot+`]`, false), true,
			func(t *testing.T, s *KeyState) {
				assert.Len(t, s.Active, 1)
				assert.Equal(t, "job-1", s.Active[0].JobID)
			}},
		{"Active only", bytes.Replace(withMember(t, "", `"x":0`, false), []byte(`"active"`), []byte(`"Active"`), 1), false, nil},
		{"duplicate active, last wins", withMember(t, "", `"active":[]`, true), true,
			func(t *testing.T, s *KeyState) { assert.Empty(t, s.Active) }},
		{"duplicate active, last wins over an earlier one", withMember(t, "", `"active":[`+slot+`,`+slot+`]`, false), true,
			func(t *testing.T, s *KeyState) {
				assert.Len(t, s.Active, 1)
				assert.Equal(t, "job-1", s.Active[0].JobID)
			}},
		{"MaxActive", withMember(t, "", `"MaxActive":0,"MAXACTIVE":"x"`, true), true,
			func(t *testing.T, s *KeyState) { assert.Equal(t, 2, s.MaxActive) }},
		{"escaped name", withMember(t, "", `"m\u0061xActive":5`, true), true,
			func(t *testing.T, s *KeyState) { assert.Equal(t, 5, s.MaxActive) }},
		{"slot JOBID", withMember(t, "active[0]", `"JOBID":"other","JobId":"other"`, true), true,
			func(t *testing.T, s *KeyState) { assert.Equal(t, "job-1", s.Active[0].JobID) }},
		{"slot duplicate jobId", withMember(t, "active[0]", `"jobId":"last"`, true), true,
			func(t *testing.T, s *KeyState) { assert.Equal(t, "last", s.Active[0].JobID) }},
		{"slot Tries only", bytes.Replace(withMember(t, "", `"x":0`, false), []byte(`"tries"`), []byte(`"Tries"`), 1), false, nil},
		{"queued REQUESTID", withMember(t, "queued[0]", `"REQUESTID":""`, true), true,
			func(t *testing.T, s *KeyState) { assert.Equal(t, "r1", s.Queued[0].RequestID) }},
		{"queued duplicate createdAt", withMember(t, "queued[0]", `"createdAt":"2030-01-01T00:00:00.000Z"`, true), true,
			func(t *testing.T, s *KeyState) {
				assert.Equal(t, time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC), s.Queued[0].CreatedAt)
			}},
		{"context TraceId", withMember(t, "active[0].context", `"TraceId":""`, true), true,
			func(t *testing.T, s *KeyState) {
				assert.Equal(t, "0af7651916cd43dd8448eb211c80319c", s.Active[0].Context.TraceID)
			}},
		{"context TRACESTATE", withMember(t, "queued[0].context", `"TRACESTATE":5`, true), true,
			func(t *testing.T, s *KeyState) { assert.Empty(t, s.Queued[0].Context.Tracestate) }},
		{"context duplicate tracestate", withMember(t, "queued[0].context", `"tracestate":5,"tracestate":"k=v"`, true), true,
			func(t *testing.T, s *KeyState) { assert.Equal(t, "k=v", s.Queued[0].Context.Tracestate) }},
		{"context duplicate, last bad", withMember(t, "queued[0].context", `"traceId":""`, true), false, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want, why := tsExpectState(tc.doc)
			require.Equal(t, tc.accept, why == "", "test bug: the checker says %q for %s", why, tc.doc)
			s, err := ParseState(tc.doc)
			if !tc.accept {
				require.Error(t, err, "ParseState accepted %s", tc.doc)
				return
			}
			require.NoError(t, err, "%s", tc.doc)
			assert.Equal(t, stringsView(want), stringsView(s), "ParseState reads other members than JSON.parse")
			tc.check(t, s)
		})
	}
}

// dateVectors is testdata/dateparse/vectors.json, written by real
// JavaScript with testdata/dateparse/gen.mjs.
type dateVectors struct {
	Parse []struct {
		Input string `json:"input"`
		MS    *int64 `json:"ms"` // nil: Date.parse gives NaN
	} `json:"parse"`
	ToISOString []struct {
		MS  int64  `json:"ms"`
		ISO string `json:"iso"`
	} `json:"toISOString"`
}

func loadDateVectors(t testing.TB) *dateVectors {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "dateparse", "vectors.json"))
	require.NoError(t, err, "regenerate with node testdata/dateparse/gen.mjs > testdata/dateparse/vectors.json")
	var v dateVectors
	require.NoError(t, json.Unmarshal(b, &v))
	require.NotEmpty(t, v.Parse)
	require.NotEmpty(t, v.ToISOString)
	return &v
}

// TestParseTimestampDateParseVectors compares jsjson.ParseTime with real
// Date.parse output: whatever jsjson.ParseTime reads, Date.parse reads as the
// same millisecond; whatever Date.parse refuses, jsjson.ParseTime refuses;
// and what only Date.parse reads is not RFC 3339 (nor an expanded year).
func TestParseTimestampDateParseVectors(t *testing.T) {
	t.Parallel()
	both, onlyJS := 0, 0
	for _, v := range loadDateVectors(t).Parse {
		got, err := jsjson.ParseTime(v.Input)
		_, rfc := rfc3339Millis(v.Input)
		switch {
		case v.MS == nil:
			assert.Error(t, err, "jsjson.ParseTime(%q) reads what Date.parse refuses", v.Input)
			assert.False(t, rfc, "the checker's rfc3339Millis(%q) reads what Date.parse refuses", v.Input)
		case err != nil:
			onlyJS++
			assert.False(t, rfc, "jsjson.ParseTime(%q) refuses an RFC 3339 time Date.parse reads: %v", v.Input, err)
		default:
			both++
			assert.Equal(t, *v.MS, got.UnixMilli(), "jsjson.ParseTime(%q)", v.Input)
			assert.True(t, rfc, "the checker's rfc3339Millis(%q) refuses what jsjson.ParseTime reads", v.Input)
		}
	}
	assert.Greater(t, both, 200, "timestamps both read")
	assert.Greater(t, onlyJS, 50, "timestamps only Date.parse reads")
}

// A timestamp that is valid RFC 3339 but lies outside the years 0000-9999 in
// UTC (an offset pushes it over) is read, and written back in the expanded
// form, which we and the TypeScript original read.
func TestStateTimestampAtTheEdgeOfTheYearRange(t *testing.T) {
	t.Parallel()
	base := readStateVector(t, "ts-two-queued.json")
	for _, tc := range []struct{ in, out string }{
		{"0000-01-01T00:00:00+00:01", "-000001-12-31T23:59:00.000Z"},
		{"9999-12-31T23:59:59.999-00:01", "+010000-01-01T00:00:59.999Z"},
		{"0000-01-01T00:00:00Z", "0000-01-01T00:00:00.000Z"},
		{"9999-12-31T23:59:59.999Z", "9999-12-31T23:59:59.999Z"},
	} {
		t.Run(tc.in, func(t *testing.T) {
			var doc any
			require.NoError(t, json.Unmarshal(base, &doc))
			setPath(t, doc, "updatedAt", tc.in, false)
			data, err := json.Marshal(doc)
			require.NoError(t, err)
			s, err := ParseState(data)
			require.NoError(t, err)
			out := encodeState(t, s)
			checkWritten(t, out)
			_, strs := jsonMembers(t, out)
			assert.Equal(t, tc.out, strs["updatedAt"])
			back, err := ParseState(out)
			require.NoError(t, err, "reading back %s", out)
			assert.True(t, s.UpdatedAt.Equal(back.UpdatedAt))
		})
	}
}

// Documents the Go side reads although the TypeScript original's
// isJobKeyState rejects them: the Rust port's slot without context. Each
// must be written back in a form the TypeScript original accepts.
func TestStateLenientReadsWriteValid(t *testing.T) {
	t.Parallel()
	base := readStateVector(t, "ts-one-active-one-queued.json")
	for _, m := range []struct {
		path string
		v    any
		del  bool
	}{
		{"active[0].context", nil, true},
		{"active[0].context", nil, false},
		{"maxQueuedPerKey", nil, true}, // optional in the TypeScript type: reads as 0
	} {
		t.Run(fmt.Sprintf("%s del=%v", m.path, m.del), func(t *testing.T) {
			var doc any
			require.NoError(t, json.Unmarshal(base, &doc))
			setPath(t, doc, m.path, m.v, m.del)
			data, err := json.Marshal(doc)
			require.NoError(t, err)
			s, err := ParseState(data)
			require.NoError(t, err)
			checkWritten(t, encodeState(t, s))
		})
	}
}

// Parse errors are plain errors the caller can print; ParseState never
// returns a state with an error.
func TestStateParseErrorIsUsable(t *testing.T) {
	t.Parallel()
	s, err := ParseState([]byte(`{"version":2}`))
	require.Error(t, err)
	assert.Nil(t, s)
	assert.NotErrorIs(t, err, ErrStateTooLarge)
	assert.Contains(t, err.Error(), "version")
	_, err = ParseState([]byte(`{"version":1,"service":"s","jobType":"j","key":"","keyHash":"h","maxActive":1,` +
		`"active":[{"jobId":"j1","slotToken":"t","instanceId":"w","startedAt":"2026-11-30T10:00:00Z",` +
		`"heartbeatAt":"2026-11-30T10:00:00Z","leaseExpiresAt":"2026-11-30T10:00:00Z","tries":"1"}],` +
		`"queued":[],"staleTakeoverCount":0,"updatedAt":"2026-11-30T10:00:00Z"}`))
	require.Error(t, err)
	assert.Equal(t, "active[0]: field tries must be an integer from 0 to 2^53, not a string", err.Error())
}

// JavaScript strings may hold lone surrogates, and DeriveKey keeps them in
// JobKey.Key (as WTF-8) so that Go writes the same display key as the
// TypeScript original. A state the TypeScript original wrote with such a
// key must come back from a read-modify-write unchanged, not with U+FFFD in
// its place.
func TestStateLoneSurrogateInKeySurvives(t *testing.T) {
	t.Parallel()
	base := string(readStateVector(t, "ts-two-queued.json"))
	doc := strings.Replace(base, `"key": "tenant:acme"`, `"key": "tenant:a\ud800b"`, 1)
	require.NotEqual(t, base, doc, "test bug: key not replaced")
	s, err := ParseState([]byte(doc))
	require.NoError(t, err)
	assert.Contains(t, string(encodeState(t, s)), `"key":"tenant:a\ud800b"`, "the display key kept its lone surrogate on a round trip")

	// The same holds for a key the Go side derived itself.
	k, err := DeriveKey("svc", "job", []byte(`{"tenant":"a\ud800b"}`), []string{"tenant", "/tenant"})
	require.NoError(t, err)
	p := mustPolicy(t, Policy{MaxQueuedPerKey: 1}) // room for both admissions
	first := encodeState(t, ReduceAdmission(nil, k, AdmitRequest{JobID: "j1"}, p, rt0).State)
	read, err := ParseState(first)
	require.NoError(t, err)
	second := encodeState(t, ReduceAdmission(read, k, AdmitRequest{JobID: "j2"}, p, rt0).State)
	assert.Contains(t, string(first), `"key":"tenant:a\ud800b"`, "first write")
	assert.Contains(t, string(second), `"key":"tenant:a\ud800b"`, "the key changed on the second write")
}

// A state nests at most MaxPayloadDepth deep: an unknown member may nest
// MaxPayloadDepth-1 levels below the state's object, not one more.
func TestParseStateDepth(t *testing.T) {
	t.Parallel()
	at := func(depth int) []byte {
		return withMember(t, "", `"x":`+strings.Repeat("[", depth)+strings.Repeat("]", depth), true)
	}
	_, err := ParseState(at(MaxPayloadDepth - 1))
	require.NoError(t, err)
	_, err = ParseState(at(MaxPayloadDepth))
	require.ErrorIs(t, err, jsjson.ErrTooDeep)
	assert.Contains(t, err.Error(), fmt.Sprintf("deeper than %d", MaxPayloadDepth))
}
