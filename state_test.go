package jobkeys

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// ---------------------------------------------------------------------------
// An independent checker that follows the TS original's isJobKeyState,
// isJobKeyActiveSlot, isJobKeyQueued and isJobContext (seed 000) predicate by
// predicate, over a generic JSON decode as JSON.parse gives it. It returns ""
// for a document the TS original accepts, else the first predicate that
// fails. A missing member is JavaScript's undefined; a present null is null.

func tsCheckStateJSON(data []byte) string {
	var v any
	if err := json.Unmarshal(data, &v); err != nil {
		return "JSON.parse: " + err.Error()
	}
	return tsCheckState(v)
}

func tsCheckState(value any) string {
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
	case !tsIs(state, "maxActive", tsPositiveInteger):
		return "isPositiveInteger(maxActive)"
	case tsDefined(state, "maxQueuedPerKey") && !tsIs(state, "maxQueuedPerKey", tsNonNegativeInteger):
		return "maxQueuedPerKey === undefined || isNonNegativeInteger(maxQueuedPerKey)"
	}
	active, ok := state["active"].([]any)
	if !ok {
		return "Array.isArray(active)"
	}
	for i, slot := range active {
		if why := tsCheckSlot(slot); why != "" {
			return fmt.Sprintf("active[%d]: %s", i, why)
		}
	}
	queued, ok := state["queued"].([]any)
	if !ok {
		return "Array.isArray(queued)"
	}
	for i, entry := range queued {
		if why := tsCheckQueued(entry); why != "" {
			return fmt.Sprintf("queued[%d]: %s", i, why)
		}
	}
	switch {
	case !tsIs(state, "staleTakeoverCount", tsNonNegativeInteger):
		return "isNonNegativeInteger(staleTakeoverCount)"
	case !tsIs(state, "updatedAt", tsValidIsoTimestamp):
		return "isValidIsoTimestamp(updatedAt)"
	}
	return ""
}

func tsCheckQueued(value any) string {
	entry, ok := value.(map[string]any)
	if !ok {
		return "entry is not an object"
	}
	switch {
	case !tsIs(entry, "jobId", tsNonEmptyString):
		return "isNonEmptyString(jobId)"
	case !tsIs(entry, "createdAt", tsValidIsoTimestamp):
		return "isValidIsoTimestamp(createdAt)"
	case !tsIs(entry, "requestId", tsNonEmptyString):
		return "isNonEmptyString(requestId)"
	}
	if why := tsCheckContext(entry["context"]); why != "" {
		return "isJobContext(context): " + why
	}
	return ""
}

func tsCheckSlot(value any) string {
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
	case !tsIs(slot, "startedAt", tsValidIsoTimestamp):
		return "isValidIsoTimestamp(startedAt)"
	case !tsIs(slot, "heartbeatAt", tsValidIsoTimestamp):
		return "isValidIsoTimestamp(heartbeatAt)"
	case !tsIs(slot, "leaseExpiresAt", tsValidIsoTimestamp):
		return "isValidIsoTimestamp(leaseExpiresAt)"
	case !tsIs(slot, "tries", tsNonNegativeInteger):
		return "isNonNegativeInteger(tries)"
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

func tsNonEmptyString(v any) bool { s, ok := v.(string); return ok && len(s) > 0 }

func tsInteger(v any) (float64, bool) {
	f, ok := v.(float64)
	return f, ok && !math.IsInf(f, 0) && f == math.Trunc(f)
}

func tsPositiveInteger(v any) bool { f, ok := tsInteger(v); return ok && f > 0 }

func tsNonNegativeInteger(v any) bool { f, ok := tsInteger(v); return ok && f >= 0 }

func tsValidIsoTimestamp(v any) bool {
	s, ok := v.(string)
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
	ms := float64(days)*86400e3 + float64(hour*3600+minute*60+sec-offset*60)*1e3
	return math.Abs(ms) <= 8.64e15
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

// ---------------------------------------------------------------------------

// isoMillis is the form of JavaScript's Date#toISOString for years 0-9999.
var isoMillis = regexp.MustCompile(`^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$`)

var (
	wantTopOrder     = []string{"version", "service", "jobType", "key", "keyHash", "maxActive", "maxQueuedPerKey", "active", "queued", "staleTakeoverCount", "updatedAt"}
	wantSlotOrder    = []string{"jobId", "slotToken", "instanceId", "startedAt", "heartbeatAt", "leaseExpiresAt", "tries", "context"}
	wantQueuedOrder  = []string{"jobId", "createdAt", "requestId", "context"}
	wantContextOrder = []string{"requestId", "traceId", "traceparent"}
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
	if err := walk(""); err != nil {
		t.Fatalf("walking %s: %v", data, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		t.Fatalf("trailing data after the document: %s", data)
	}
	return order, strs
}

// checkWritten checks a document the library wrote: the TS original accepts
// it, members in the TS original's order, timestamps as toISOString writes them.
func checkWritten(t testing.TB, data []byte) {
	t.Helper()
	if why := tsCheckStateJSON(data); why != "" {
		t.Fatalf("the TS original's isJobKeyState rejects what we wrote (%s):\n%s", why, data)
	}
	order, strs := jsonMembers(t, data)
	jkEqual(t, wantTopOrder, order[""], "top-level member order")
	for path, names := range order {
		switch {
		case path == "":
		case regexp.MustCompile(`^active\[\d+\]$`).MatchString(path):
			jkEqual(t, wantSlotOrder, names, "member order of %s", path)
		case regexp.MustCompile(`^queued\[\d+\]$`).MatchString(path):
			jkEqual(t, wantQueuedOrder, names, "member order of %s", path)
		case strings.HasSuffix(path, ".context"):
			want := wantContextOrder
			if len(names) == 4 {
				want = append(append([]string{}, wantContextOrder...), "tracestate")
			}
			jkEqual(t, want, names, "member order of %s", path)
		default:
			t.Fatalf("unexpected object at %s", path)
		}
	}
	for path, s := range strs {
		if strings.HasSuffix(path, "At") {
			jkMatch(t, isoMillis.String(), s, "timestamp %s", path)
		}
	}
}

func readStateVector(t testing.TB, name string) []byte {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", "states", name))
	jkNoErr(t, err)
	return data
}

func stateVectorNames(t testing.TB) []string {
	t.Helper()
	names, err := filepath.Glob(filepath.Join("testdata", "states", "*.json"))
	jkNoErr(t, err)
	for i := range names {
		names[i] = filepath.Base(names[i])
	}
	for _, want := range []string{"rust-style-no-slot-context.json", "ts-one-active-one-queued.json", "ts-two-queued.json"} {
		jkTrue(t, slices.Contains(names, want), "state vector %s missing from testdata/states (a copy of shared/vectors/states)", want)
	}
	return names
}

func encodeState(t testing.TB, s *KeyState) []byte {
	t.Helper()
	b, err := s.MarshalJSON()
	jkNoErr(t, err, "MarshalJSON")
	return b
}

func TestStateVectorsReadAndWriteBack(t *testing.T) {
	t.Parallel()
	for _, name := range stateVectorNames(t) {
		t.Run(name, func(t *testing.T) {
			doc := readStateVector(t, name)
			s, err := ParseState(doc)
			jkNoErr(t, err, "ParseState(%s)", name)
			out := encodeState(t, s)
			checkWritten(t, out)

			back, err := ParseState(out)
			jkNoErr(t, err, "ParseState of what we wrote")
			again := encodeState(t, back)
			jkEqual(t, string(out), string(again), "encoding is not stable")

			if strings.HasPrefix(name, "ts-") {
				// What the TS original wrote comes back byte for byte as
				// JSON.stringify would write it, and parses to the same value.
				var compact bytes.Buffer
				jkNoErr(t, json.Compact(&compact, doc))
				jkEqual(t, compact.String(), string(out), "re-encoding of a TS-written state")
				jkEqual(t, s, back, "parse(encode(s)) != s")
				if why := tsCheckStateJSON(doc); why != "" {
					t.Fatalf("checker rejects the TS-written vector: %s", why)
				}
			}
		})
	}
}

func TestStateTSVectorValues(t *testing.T) {
	t.Parallel()
	s, err := ParseState(readStateVector(t, "ts-one-active-one-queued.json"))
	jkNoErr(t, err)
	at := func(v string) time.Time {
		tm, err := time.Parse(time.RFC3339Nano, v)
		jkNoErr(t, err)
		return tm
	}
	c := TraceContext{RequestID: "r1", TraceID: "0af7651916cd43dd8448eb211c80319c",
		Traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
	want := &KeyState{
		Version: 1, Service: "fixtures", JobType: "sync", Key: "tenant:acme",
		KeyHash:   "ebb59034518f7fd88ce5dfb2f428936d4972e4e4ee9108c05eabcdfb3876d3b3",
		MaxActive: 2, MaxQueuedPerKey: 3,
		Active: []ActiveSlot{{JobID: "job-1", SlotToken: "0bc166b9-a13e-4bb5-a202-2df15d84c57d", InstanceID: "billing-worker",
			StartedAt: at("2026-11-30T10:00:02Z"), HeartbeatAt: at("2026-11-30T10:00:02Z"),
			LeaseExpiresAt: at("2026-11-30T10:02:02Z"), Tries: 1, Context: c}},
		Queued:    []QueuedJob{{JobID: "job-2", CreatedAt: at("2026-11-30T10:00:01Z"), RequestID: "r1", Context: c}},
		UpdatedAt: at("2026-11-30T10:00:02Z"),
	}
	jkEqual(t, normState(want), normState(s))
}

// The Rust port writes nanosecond and short fractions and may leave out a
// slot's context; we read that, and write the slot back with a context the
// TS original accepts.
func TestStateRustVector(t *testing.T) {
	t.Parallel()
	doc := readStateVector(t, "rust-style-no-slot-context.json")
	if why := tsCheckStateJSON(doc); !strings.Contains(why, "active[0]: isJobContext(context)") {
		t.Fatalf("the vector should be one the TS original rejects for the missing slot context; checker says %q", why)
	}
	s, err := ParseState(doc)
	jkNoErr(t, err)
	jkEqual(t, 1, len(s.Active))
	slot := s.Active[0]
	jkEqual(t, "01JDQ7Z3K9T1V5N8W2X4Y6Z0AB", slot.SlotToken)
	jkEqual(t, time.Date(2026, 11, 30, 10, 0, 2, 123000000, time.UTC), slot.StartedAt, "nanoseconds cut to ms as Date.parse does")
	jkEqual(t, time.Date(2026, 11, 30, 10, 0, 32, 500000000, time.UTC), slot.HeartbeatAt)
	jkEqual(t, time.Date(2026, 11, 30, 10, 2, 32, 500000000, time.UTC), slot.LeaseExpiresAt)
	jkTrue(t, slot.Context.IsZero(), "missing context reads as zero")

	out := encodeState(t, s)
	checkWritten(t, out)
	_, strs := jsonMembers(t, out)
	jkEqual(t, "2026-11-30T10:00:02.123Z", strs["active[0].startedAt"])
	jkEqual(t, "2026-11-30T10:00:32.500Z", strs["active[0].heartbeatAt"])
	jkEqual(t, "job-1", strs["active[0].context.requestId"], "derived requestId")
	jkTrue(t, strs["active[0].context.traceId"] != "" && strs["active[0].context.traceparent"] != "", "derived trace ids")

	back, err := ParseState(out)
	jkNoErr(t, err)
	jkTrue(t, !back.Active[0].Context.IsZero(), "context written back")
	// Apart from the filled-in context, nothing changed.
	back.Active[0].Context = TraceContext{}
	jkEqual(t, s, back)

	// A slot context of null (serde's None) reads as missing too.
	var m map[string]any
	jkNoErr(t, json.Unmarshal(doc, &m))
	m["active"].([]any)[0].(map[string]any)["context"] = nil
	nullDoc, _ := json.Marshal(m)
	s2, err := ParseState(nullDoc)
	jkNoErr(t, err, "slot context null")
	jkTrue(t, s2.Active[0].Context.IsZero(), "null context reads as zero")
}

func TestStateEncodeToISOStringAndEscaping(t *testing.T) {
	t.Parallel()
	zone := time.FixedZone("UTC+5:30", 5*3600+1800)
	local := time.Date(2026, 12, 1, 3, 30, 0, 987654321, zone) // 2026-11-30T22:00:00.987654321Z
	s := &KeyState{
		Version: 1, Service: "svc", JobType: "sync",
		Key:     "a<b>&c\u2028\u0001\"\\é😀",
		KeyHash: strings.Repeat("ab", 32), MaxActive: 1, MaxQueuedPerKey: 0,
		Active: []ActiveSlot{{JobID: "j1", SlotToken: "t", InstanceID: "w", StartedAt: local, HeartbeatAt: local,
			LeaseExpiresAt: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), Tries: 0,
			Context: TraceContext{RequestID: "r", TraceID: "x", Traceparent: "y", Tracestate: "k=v"}}},
		Queued:    []QueuedJob{{JobID: "j2", CreatedAt: time.Date(1970, 1, 1, 0, 0, 0, 0, time.UTC)}},
		UpdatedAt: time.Date(2026, 11, 30, 22, 0, 0, 1000000, time.UTC),
	}
	out := encodeState(t, s)
	checkWritten(t, out)
	_, strs := jsonMembers(t, out)
	jkEqual(t, "2026-11-30T22:00:00.987Z", strs["active[0].startedAt"], "UTC, milliseconds, Z")
	jkEqual(t, "2026-01-02T03:04:05.000Z", strs["active[0].leaseExpiresAt"])
	jkEqual(t, "1970-01-01T00:00:00.000Z", strs["queued[0].createdAt"])
	jkEqual(t, "2026-11-30T22:00:00.001Z", strs["updatedAt"])
	jkEqual(t, "k=v", strs["active[0].context.tracestate"])
	// A queued entry without request id or context gets both, from the job id.
	jkEqual(t, "j2", strs["queued[0].requestId"])
	jkEqual(t, "j2", strs["queued[0].context.requestId"])
	// JSON.stringify escapes only '"', '\', control characters (short forms
	// where JSON has them, else lowercase \u00xx) and lone surrogates.
	want := `"key":"a<b>&c` + "\u2028" + `\u0001\"\\é😀"`
	jkTrue(t, bytes.Contains(out, []byte(want)), "key not escaped as JSON.stringify escapes it:\n%s\nwant substring %s", out, want)

	// encoding/json uses the same codec.
	var viaJSON KeyState
	jkNoErr(t, json.Unmarshal(out, &viaJSON))
	back, err := ParseState(out)
	jkNoErr(t, err)
	jkEqual(t, back, &viaJSON)
	b, err := json.Marshal(back)
	jkNoErr(t, err)
	var a1, a2 any
	jkNoErr(t, json.Unmarshal(b, &a1))
	jkNoErr(t, json.Unmarshal(out, &a2))
	jkEqual(t, a2, a1, "json.Marshal(*KeyState) differs in content from MarshalJSON")
}

// Every required field, missing, null, of the wrong type or out of range, is
// an error that names the field; the TS original rejects the same documents.
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
		mutation{"active", map[string]any{}}, mutation{"active", "[]"},
		mutation{"queued", map[string]any{}}, mutation{"queued", float64(0)},
		mutation{"staleTakeoverCount", float64(-1)}, mutation{"staleTakeoverCount", 0.5}, mutation{"staleTakeoverCount", "0"},
		mutation{"updatedAt", "yesterday"}, mutation{"updatedAt", "2026-13-01T00:00:00.000Z"}, mutation{"updatedAt", float64(1700000000000)},
		mutation{"updatedAt", ""},
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
			jkNoErr(t, json.Unmarshal(base, &doc))
			setPath(t, doc, c.field, c.set, c.set == del)
			data, err := json.Marshal(doc)
			jkNoErr(t, err)
			if why := tsCheckStateJSON(data); why == "" {
				t.Fatalf("test bug: the TS original would accept %s", data)
			}
			_, err = ParseState(data)
			if err == nil {
				t.Fatalf("ParseState accepted a document the TS original rejects (%s): %s", tsCheckStateJSON(data), data)
			}
			// The error names the top-level member and the innermost field
			// (the array index is welcome but not required).
			parts := strings.Split(c.field, ".")
			for _, part := range []string{parts[0], parts[len(parts)-1]} {
				part, _, _ = strings.Cut(part, "[")
				re := `(^|[^A-Za-z])` + regexp.QuoteMeta(part) + `([^A-Za-z]|$)`
				if !regexp.MustCompile(re).MatchString(err.Error()) {
					t.Fatalf("error does not name %q (of %s): %v", part, c.field, err)
				}
			}
		})
	}

	for _, bad := range []string{"", "not json", "[]", "null", "5", `"state"`, `{"version":1`, "{}"} {
		if _, err := ParseState([]byte(bad)); err == nil {
			t.Errorf("ParseState(%q) accepted", bad)
		}
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

// A timestamp that is valid RFC 3339 but lies outside the years 0000-9999 in
// UTC (an offset pushes it over) must either be refused on read or be
// written back in a form that we and the TS original can read; it must never
// be accepted and then written as something nobody can parse.
func TestStateTimestampAtTheEdgeOfTheYearRange(t *testing.T) {
	t.Parallel()
	base := readStateVector(t, "ts-two-queued.json")
	for _, ts := range []string{
		"0000-01-01T00:00:00+00:01",     // -0001-12-31T23:59:00Z
		"9999-12-31T23:59:59.999-00:01", // +010000-01-01T00:00:59.999Z
		"0000-01-01T00:00:00Z",
		"9999-12-31T23:59:59.999Z",
	} {
		t.Run(ts, func(t *testing.T) {
			var doc any
			jkNoErr(t, json.Unmarshal(base, &doc))
			setPath(t, doc, "updatedAt", ts, false)
			data, _ := json.Marshal(doc)
			s, err := ParseState(data)
			if err != nil {
				return // refusing it is fine
			}
			out := encodeState(t, s)
			if _, err := ParseState(out); err != nil {
				t.Fatalf("accepted updatedAt %q but wrote a document it cannot read back: %v\n%s", ts, err, out)
			}
			checkWritten(t, out)
		})
	}
}

// Documents the Go side reads although the TS original's isJobKeyState
// rejects them: the Rust port's slot without context. Each must be written
// back in a form the TS original accepts.
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
		{"maxQueuedPerKey", nil, true}, // optional in the TS type: reads as 0
	} {
		t.Run(fmt.Sprintf("%s del=%v", m.path, m.del), func(t *testing.T) {
			var doc any
			jkNoErr(t, json.Unmarshal(base, &doc))
			setPath(t, doc, m.path, m.v, m.del)
			data, _ := json.Marshal(doc)
			s, err := ParseState(data)
			jkNoErr(t, err)
			checkWritten(t, encodeState(t, s))
		})
	}
}

// Parse errors are plain errors the caller can print; ParseState never
// returns a state with an error.
func TestStateParseErrorIsUsable(t *testing.T) {
	t.Parallel()
	s, err := ParseState([]byte(`{"version":2}`))
	jkTrue(t, s == nil && err != nil, "want nil state and an error")
	jkTrue(t, !errors.Is(err, ErrStateTooLarge), "unexpected sentinel")
	jkTrue(t, strings.Contains(err.Error(), "version"), "error does not name version: %v", err)
}

// JavaScript strings may hold lone surrogates, and DeriveKey keeps them in
// JobKey.Key (as WTF-8) so that Go writes the same display key as the TS
// original. A state the TS original wrote with such a key must come back
// from a read-modify-write unchanged, not with U+FFFD in its place.
func TestStateLoneSurrogateInKeySurvives(t *testing.T) {
	t.Parallel()
	base := string(readStateVector(t, "ts-two-queued.json"))
	doc := strings.Replace(base, `"key": "tenant:acme"`, `"key": "tenant:a\ud800b"`, 1)
	jkTrue(t, doc != base, "test bug: key not replaced")
	s, err := ParseState([]byte(doc))
	jkNoErr(t, err)
	out := encodeState(t, s)
	jkTrue(t, bytes.Contains(out, []byte(`"key":"tenant:a\ud800b"`)),
		"the display key lost its lone surrogate on a round trip: %s", out)

	// The same holds for a key the Go side derived itself.
	k, err := DeriveKey("svc", "job", []byte(`{"tenant":"a\ud800b"}`), []string{"tenant", "/tenant"})
	jkNoErr(t, err)
	p := mustPolicy(t, Policy{MaxQueuedPerKey: 1}) // room for both admissions
	first := encodeState(t, ReduceAdmission(nil, k, AdmitRequest{JobID: "j1"}, p, rt0).State)
	read, err := ParseState(first)
	jkNoErr(t, err)
	second := encodeState(t, ReduceAdmission(read, k, AdmitRequest{JobID: "j2"}, p, rt0).State)
	jkTrue(t, bytes.Contains(first, []byte(`"key":"tenant:a\ud800b"`)), "first write: %s", first)
	jkTrue(t, bytes.Contains(second, []byte(`"key":"tenant:a\ud800b"`)), "the key changed on the second write: %s", second)
}
