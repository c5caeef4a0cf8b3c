package jobkeys

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"time"
)

// This file decodes a key state document in one pass over its text, as
// JSON.parse followed by the TypeScript original's checks reads it (see
// [ParseState] and jsontext.go). The pass checks the JSON grammar and the
// nesting depth as it goes, and records for each member it knows where its
// value is (a string's bytes, a number's value, a timestamp's time) or what
// else it is; a later duplicate member overwrites an earlier one, as with
// JSON.parse. Only when the whole text has been read are the members
// checked, in the order the TypeScript original checks them, so a document
// gets the error the first check it fails names (a syntax error before any
// other). The strings the state keeps are then copied, once, into one
// allocation sized to hold them all.
//
// Documents that fail are rare: their error messages come from the slower
// helpers of jsontext.go (checkJSONText describes a syntax error as
// encoding/json does).

// stateDecoderPool holds decoders, whose buffers outlive one decode.
var stateDecoderPool = sync.Pool{New: func() any { return new(stateDecoder) }}

// maxPooledRecords bounds the records a pooled decoder keeps between uses.
const maxPooledRecords = 4096

// decodeState reads a key state document; see [ParseState]. It reads the
// members JSON.parse reads: names match exactly (after unescaping), the last
// of duplicate members counts, and members it does not know are ignored.
func decodeState(data []byte) (*KeyState, error) {
	d := stateDecoderPool.Get().(*stateDecoder)
	s, err := d.decode(trimBOM(data))
	d.text = nil
	if cap(d.slots) <= maxPooledRecords && cap(d.queue) <= maxPooledRecords && cap(d.unesc) <= 64*maxPooledRecords {
		stateDecoderPool.Put(d)
	}
	return s, err
}

// stateDecoder holds one decode's position and the records of the members
// it has read. Offsets in records are into text, or into unesc for a string
// with escapes or non-ASCII bytes.
type stateDecoder struct {
	text  []byte
	i     int            // the next byte to read
	unesc []byte         // the values of strings that differ from their literal
	name  []byte         // a member name with escapes, decoded
	stack []byte         // the closing brackets of the containers skipValue is in
	slots []slotRecord   // the elements of the last "active" member
	queue []queuedRecord // the elements of the last "queued" member
}

// A jsonString records a string member: kind is the first byte of its value
// ('"' for a string, 0 when the member is missing); a string's value is
// text[start:end], or unesc[start:end] when esc is set.
type jsonString struct {
	kind       byte
	esc        bool
	start, end int
}

// A jsonNumber records a number member: kind is the first byte of its value
// (0 when missing); a number's value is f, as JSON.parse reads it.
type jsonNumber struct {
	kind byte
	f    float64
}

// A jsonTime records a timestamp member: the string and, when ok, the time
// parseTimestamp reads from it.
type jsonTime struct {
	jsonString
	t  time.Time
	ok bool
}

// A jsonArray records the "active" or "queued" member: kind is the first
// byte of its value (0 when missing); err is the first element's error.
type jsonArray struct {
	kind byte
	err  error
}

// contextRecord records a "context" member.
type contextRecord struct {
	kind                                        byte // '{' for an object
	requestID, traceID, traceparent, tracestate jsonString
}

// slotRecord records an element of "active".
type slotRecord struct {
	jobID, slotToken, instanceID           jsonString
	startedAt, heartbeatAt, leaseExpiresAt jsonTime
	tries                                  jsonNumber
	context                                contextRecord
}

// queuedRecord records an element of "queued".
type queuedRecord struct {
	jobID     jsonString
	createdAt jsonTime
	requestID jsonString
	context   contextRecord
}

// stateRecord records the members of the state object.
type stateRecord struct {
	version                        jsonNumber
	service, jobType, key, keyHash jsonString
	maxActive, maxQueued, stale    jsonNumber
	active, queued                 jsonArray
	updatedAt                      jsonTime
}

// decode reads text, the document without a byte order mark.
func (d *stateDecoder) decode(text []byte) (*KeyState, error) {
	d.text, d.i = text, skipWS(text, 0)
	d.unesc, d.slots, d.queue = d.unesc[:0], d.slots[:0], d.queue[:0]
	if d.i == len(text) || text[d.i] != '{' {
		if err := checkJSONText(text); err != nil {
			return nil, fmt.Errorf("state is not valid JSON: %w", err)
		}
		if d.i == len(text) { // not expected: checkJSONText refuses empty text
			return nil, errors.New("state is not valid JSON: no value")
		}
		return nil, fmt.Errorf("state is not a JSON object (it is %s)", kindName(text[d.i]))
	}
	var r stateRecord
	if !d.state(&r) || skipWS(text, d.i) != len(text) {
		return nil, d.syntaxError()
	}
	if err := d.check(&r); err != nil {
		return nil, err
	}
	return d.build(&r), nil
}

// syntaxError describes the JSON syntax error the pass stopped at.
func (d *stateDecoder) syntaxError() error {
	err := checkJSONText(d.text)
	if err == nil { // not expected: the pass and checkJSONText disagree
		err = fmt.Errorf("unexpected %s at byte %d", describeByte(d.text, d.i), d.i)
	}
	return fmt.Errorf("state is not valid JSON: %w", err)
}

// describeByte names the byte at text[i] for an error message.
func describeByte(text []byte, i int) string {
	if i >= len(text) {
		return "end of text"
	}
	return strconv.QuoteRune(rune(text[i]))
}

// check applies the TypeScript original's checks to the state's members, in
// its order, and returns the first failure.
func (d *stateDecoder) check(r *stateRecord) error {
	if !isNumberKind(r.version.kind) || r.version.f != StateVersion {
		return fieldErr("version", r.version.kind != 0, "must be 1")
	}
	if err := nonEmptyErr("service", r.service); err != nil {
		return err
	}
	if err := nonEmptyErr("jobType", r.jobType); err != nil {
		return err
	}
	if err := stringErr("key", r.key); err != nil {
		return err
	}
	if err := nonEmptyErr("keyHash", r.keyHash); err != nil {
		return err
	}
	if err := integerErr("maxActive", r.maxActive, 1); err != nil {
		return err
	}
	if r.maxQueued.kind != 0 { // optional in the TypeScript original's type
		if err := integerErr("maxQueuedPerKey", r.maxQueued, 0); err != nil {
			return err
		}
	}
	if err := arrayErr("active", r.active); err != nil {
		return err
	}
	if err := arrayErr("queued", r.queued); err != nil {
		return err
	}
	if err := integerErr("staleTakeoverCount", r.stale, 0); err != nil {
		return err
	}
	return d.timeErr("updatedAt", &r.updatedAt)
}

// slotErr applies the checks of an active slot.
func (d *stateDecoder) slotErr(r *slotRecord) error {
	if err := nonEmptyErr("jobId", r.jobID); err != nil {
		return err
	}
	if err := nonEmptyErr("slotToken", r.slotToken); err != nil {
		return err
	}
	if err := nonEmptyErr("instanceId", r.instanceID); err != nil {
		return err
	}
	if err := d.timeErr("startedAt", &r.startedAt); err != nil {
		return err
	}
	if err := d.timeErr("heartbeatAt", &r.heartbeatAt); err != nil {
		return err
	}
	if err := d.timeErr("leaseExpiresAt", &r.leaseExpiresAt); err != nil {
		return err
	}
	if err := integerErr("tries", r.tries, 0); err != nil {
		return err
	}
	// The Rust port may leave the context out (or write null); it then
	// reads as zero and is written back derived from the job and slot.
	if k := r.context.kind; k != 0 && k != 'n' {
		return contextErr(&r.context)
	}
	return nil
}

// queuedErr applies the checks of a queued entry.
func (d *stateDecoder) queuedErr(r *queuedRecord) error {
	if err := nonEmptyErr("jobId", r.jobID); err != nil {
		return err
	}
	if err := d.timeErr("createdAt", &r.createdAt); err != nil {
		return err
	}
	if err := nonEmptyErr("requestId", r.requestID); err != nil {
		return err
	}
	return contextErr(&r.context)
}

// contextErr applies the checks of a trace context.
func contextErr(r *contextRecord) error {
	if r.kind != '{' {
		return fieldErr("context", r.kind != 0, "must be an object"+got(r.kind))
	}
	if err := nonEmptyErr("context.requestId", r.requestID); err != nil {
		return err
	}
	if err := nonEmptyErr("context.traceId", r.traceID); err != nil {
		return err
	}
	if err := nonEmptyErr("context.traceparent", r.traceparent); err != nil {
		return err
	}
	if r.tracestate.kind != 0 { // optional
		return stringErr("context.tracestate", r.tracestate)
	}
	return nil
}

// stringErr says what the member field is if it is not a string.
func stringErr(field string, v jsonString) error {
	if v.kind != '"' {
		return fieldErr(field, v.kind != 0, "must be a string"+got(v.kind))
	}
	return nil
}

// nonEmptyErr says what the member field is if it is not a non-empty string.
func nonEmptyErr(field string, v jsonString) error {
	if v.kind != '"' || v.start == v.end {
		return fieldErr(field, v.kind != 0, "must be a non-empty string"+got(v.kind))
	}
	return nil
}

// integerErr says what the member field is if it is not an integer from
// lowest to 2^53 (beyond that a double does not hold every integer; the
// TypeScript original accepts any integral double).
func integerErr(field string, v jsonNumber, lowest int) error {
	if f := v.f; !isNumberKind(v.kind) || f != math.Trunc(f) || f < float64(lowest) || f > 1<<53 || f > math.MaxInt {
		return fieldErr(field, v.kind != 0, fmt.Sprintf("must be an integer from %d to 2^53", lowest)+got(v.kind))
	}
	return nil
}

// timeErr says what the member field is if it is not a timestamp
// parseTimestamp reads.
func (d *stateDecoder) timeErr(field string, v *jsonTime) error {
	if v.kind != '"' {
		return fieldErr(field, v.kind != 0, "must be an RFC 3339 timestamp"+got(v.kind))
	}
	if !v.ok {
		_, err := parseTimestamp(d.bytes(v.jsonString))
		if err == nil { // not expected: the pass read it
			err = fmt.Errorf("%q is not an RFC 3339 timestamp", d.bytes(v.jsonString))
		}
		return fmt.Errorf("field %s: %w", field, err)
	}
	return nil
}

// arrayErr says what the member field is if it is not an array, or what is
// wrong with its first bad element.
func arrayErr(field string, v jsonArray) error {
	if v.kind != '[' {
		return fieldErr(field, v.kind != 0, "must be an array"+got(v.kind))
	}
	return v.err
}

// fieldErr reports that a field is missing or has a bad value.
func fieldErr(field string, present bool, want string) error {
	if !present {
		return fmt.Errorf("field %s is missing (it %s)", field, want)
	}
	return fmt.Errorf("field %s %s", field, want)
}

// got describes a value of the kind (its first byte) for an error message,
// or nothing for a missing member.
func got(kind byte) string {
	if kind == 0 {
		return ""
	}
	return ", not " + kindName(kind)
}

// kindName names the kind of JSON value that starts with the byte c.
func kindName(c byte) string {
	switch c {
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

// isNumberKind reports whether a value starting with c is a number.
func isNumberKind(c byte) bool { return c == '-' || c >= '0' && c <= '9' }

// bytes returns the value of the string v.
func (d *stateDecoder) bytes(v jsonString) []byte {
	if v.esc {
		return d.unesc[v.start:v.end]
	}
	return d.text[v.start:v.end]
}

// build makes the state of r, which check accepted. Its strings share one
// allocation; a queued entry's context request id that equals its request
// id, and a trace id that is part of the traceparent, share their bytes.
func (d *stateDecoder) build(r *stateRecord) *KeyState {
	size := r.service.end - r.service.start + r.jobType.end - r.jobType.start +
		r.key.end - r.key.start + r.keyHash.end - r.keyHash.start
	for i := range d.slots {
		a := &d.slots[i]
		size += a.jobID.end - a.jobID.start + a.slotToken.end - a.slotToken.start +
			a.instanceID.end - a.instanceID.start + d.contextSize(&a.context, jsonString{})
	}
	for i := range d.queue {
		q := &d.queue[i]
		size += q.jobID.end - q.jobID.start + q.requestID.end - q.requestID.start + d.contextSize(&q.context, q.requestID)
	}
	a := stringArena{d: d}
	a.b.Grow(size)

	var s *KeyState
	if len(d.slots) == 1 { // the common case, as with MaxActive 1: one allocation for both
		h := new(stateWithOneSlot)
		s = &h.state
		s.Active = h.active[:]
	} else {
		s = new(KeyState)
		s.Active = make([]ActiveSlot, len(d.slots)) // not nil when empty, as before
	}
	*s = KeyState{
		Version:    StateVersion,
		Service:    a.str(r.service),
		JobType:    a.str(r.jobType),
		DisplayKey: a.str(r.key),
		KeyHash:    a.str(r.keyHash),
		MaxActive:  int(r.maxActive.f),
		Active:     s.Active,
		Queued:     []QueuedJob{},
		UpdatedAt:  r.updatedAt.t,
	}
	if r.maxQueued.kind != 0 {
		s.MaxQueuedPerKey = int(r.maxQueued.f)
	}
	s.StaleTakeoverCount = int(r.stale.f)
	if len(d.slots) > 0 {
		for i := range d.slots {
			in, out := &d.slots[i], &s.Active[i]
			out.JobID = a.str(in.jobID)
			out.SlotToken = a.str(in.slotToken)
			out.InstanceID = a.str(in.instanceID)
			out.StartedAt = in.startedAt.t
			out.HeartbeatAt = in.heartbeatAt.t
			out.LeaseExpiresAt = in.leaseExpiresAt.t
			out.Tries = int(in.tries.f)
			if in.context.kind == '{' {
				out.Context = a.context(&in.context, "", jsonString{})
			}
		}
	}
	if len(d.queue) > 0 {
		s.Queued = make([]QueuedJob, len(d.queue))
		for i := range d.queue {
			in, out := &d.queue[i], &s.Queued[i]
			out.JobID = a.str(in.jobID)
			out.CreatedAt = in.createdAt.t
			out.RequestID = a.str(in.requestID)
			out.Context = a.context(&in.context, out.RequestID, in.requestID)
		}
	}
	return s
}

// stateWithOneSlot holds a state and its one active slot.
type stateWithOneSlot struct {
	state  KeyState
	active [1]ActiveSlot
}

// contextSize returns the bytes the strings of c take in the arena, where
// a request id equal to reqID's takes none.
func (d *stateDecoder) contextSize(c *contextRecord, reqID jsonString) int {
	if c.kind != '{' {
		return 0
	}
	n := c.traceparent.end - c.traceparent.start + c.tracestate.end - c.tracestate.start
	if reqID.kind == 0 || string(d.bytes(c.requestID)) != string(d.bytes(reqID)) {
		n += c.requestID.end - c.requestID.start
	}
	if _, ok := d.traceIDIn(c); !ok {
		n += c.traceID.end - c.traceID.start
	}
	return n
}

// traceIDIn reports where in c's traceparent c's trace id is, when the
// traceparent has the W3C form "00-<trace id>-...".
func (d *stateDecoder) traceIDIn(c *contextRecord) (int, bool) {
	tp, id := d.bytes(c.traceparent), d.bytes(c.traceID)
	if len(id) > 0 && len(tp) >= 3+len(id) && string(tp[3:3+len(id)]) == string(id) {
		return 3, true
	}
	return 0, false
}

// A stringArena makes the strings of one state, in one allocation sized
// beforehand.
type stringArena struct {
	d *stateDecoder
	b strings.Builder
}

// str returns the value of v.
func (a *stringArena) str(v jsonString) string {
	b := a.d.bytes(v)
	if len(b) == 0 {
		return ""
	}
	start := a.b.Len()
	a.b.Write(b)
	return a.b.String()[start:]
}

// context returns the trace context of c; a request id equal to reqID's
// value (reqStr) is reqStr.
func (a *stringArena) context(c *contextRecord, reqStr string, reqID jsonString) TraceContext {
	var t TraceContext
	if reqID.kind != 0 && string(a.d.bytes(c.requestID)) == reqStr {
		t.RequestID = reqStr
	} else {
		t.RequestID = a.str(c.requestID)
	}
	t.Traceparent = a.str(c.traceparent)
	if at, ok := a.d.traceIDIn(c); ok {
		t.TraceID = t.Traceparent[at : at+c.traceID.end-c.traceID.start]
	} else {
		t.TraceID = a.str(c.traceID)
	}
	t.Tracestate = a.str(c.tracestate)
	return t
}

// The reading pass. Each method reads the value at d.i and moves d.i past
// it; it returns false at a syntax error, or at arrays and objects nested
// deeper than MaxPayloadDepth. depth is the number of arrays and objects
// around the value.

// The members the decoder reads, numbered in the order the wire format
// writes them (the order object expects them in).
const (
	sVersion = iota
	sService
	sJobType
	sKey
	sKeyHash
	sMaxActive
	sMaxQueuedPerKey
	sActive
	sQueued
	sStaleTakeoverCount
	sUpdatedAt
)

const (
	aJobId = iota
	aSlotToken
	aInstanceId
	aStartedAt
	aHeartbeatAt
	aLeaseExpiresAt
	aTries
	aContext
)

const (
	qJobId = iota
	qCreatedAt
	qRequestId
	qContext
)

const (
	cRequestId = iota
	cTraceId
	cTraceparent
	cTracestate
)

var (
	stateMembers   = memberNames("version", "service", "jobType", "key", "keyHash", "maxActive", "maxQueuedPerKey", "active", "queued", "staleTakeoverCount", "updatedAt")
	slotMembers    = memberNames("jobId", "slotToken", "instanceId", "startedAt", "heartbeatAt", "leaseExpiresAt", "tries", "context")
	queuedMembers  = memberNames("jobId", "createdAt", "requestId", "context")
	contextMembers = memberNames("requestId", "traceId", "traceparent", "tracestate")
)

// memberNames returns names as object takes them: each quoted and followed
// by a colon, as the wire format writes a member's name.
func memberNames(names ...string) []string {
	q := make([]string, len(names))
	for i, n := range names {
		q[i] = strconv.Quote(n) + ":"
	}
	return q
}

// state reads the state object.
func (d *stateDecoder) state(r *stateRecord) bool {
	return d.object(stateMembers, func(k int) bool {
		switch k {
		case sVersion:
			return d.readNumber(&r.version, 1)
		case sService:
			return d.readString(&r.service, 1)
		case sJobType:
			return d.readString(&r.jobType, 1)
		case sKey:
			return d.readString(&r.key, 1)
		case sKeyHash:
			return d.readString(&r.keyHash, 1)
		case sMaxActive:
			return d.readNumber(&r.maxActive, 1)
		case sMaxQueuedPerKey:
			return d.readNumber(&r.maxQueued, 1)
		case sActive:
			return d.activeArray(&r.active)
		case sQueued:
			return d.queuedArray(&r.queued)
		case sStaleTakeoverCount:
			return d.readNumber(&r.stale, 1)
		case sUpdatedAt:
			return d.readTime(&r.updatedAt, 1)
		}
		return d.skipValue(1)
	})
}

// activeArray reads the "active" member into d.slots.
func (d *stateDecoder) activeArray(v *jsonArray) bool {
	*v = jsonArray{kind: d.text[d.i]}
	d.slots = d.slots[:0]
	if v.kind != '[' {
		return d.skipValue(1)
	}
	return d.array(func(n int) bool {
		if d.text[d.i] != '{' {
			if v.err == nil {
				v.err = fmt.Errorf("active[%d]: %w", n, fieldErr("slot", true, "must be an object"+got(d.text[d.i])))
			}
			return d.skipValue(2)
		}
		d.slots = append(d.slots, slotRecord{})
		r := &d.slots[len(d.slots)-1]
		ok := d.object(slotMembers, func(k int) bool {
			switch k {
			case aJobId:
				return d.readString(&r.jobID, 3)
			case aSlotToken:
				return d.readString(&r.slotToken, 3)
			case aInstanceId:
				return d.readString(&r.instanceID, 3)
			case aStartedAt:
				return d.readTime(&r.startedAt, 3)
			case aHeartbeatAt:
				return d.readTime(&r.heartbeatAt, 3)
			case aLeaseExpiresAt:
				return d.readTime(&r.leaseExpiresAt, 3)
			case aTries:
				return d.readNumber(&r.tries, 3)
			case aContext:
				return d.readContext(&r.context)
			}
			return d.skipValue(3)
		})
		if ok && v.err == nil {
			if err := d.slotErr(r); err != nil {
				v.err = fmt.Errorf("active[%d]: %w", n, err)
			}
		}
		return ok
	})
}

// queuedArray reads the "queued" member into d.queue.
func (d *stateDecoder) queuedArray(v *jsonArray) bool {
	*v = jsonArray{kind: d.text[d.i]}
	d.queue = d.queue[:0]
	if v.kind != '[' {
		return d.skipValue(1)
	}
	return d.array(func(n int) bool {
		if d.text[d.i] != '{' {
			if v.err == nil {
				v.err = fmt.Errorf("queued[%d]: %w", n, fieldErr("entry", true, "must be an object"+got(d.text[d.i])))
			}
			return d.skipValue(2)
		}
		d.queue = append(d.queue, queuedRecord{})
		r := &d.queue[len(d.queue)-1]
		ok := d.object(queuedMembers, func(k int) bool {
			switch k {
			case qJobId:
				return d.readString(&r.jobID, 3)
			case qCreatedAt:
				return d.readTime(&r.createdAt, 3)
			case qRequestId:
				return d.readString(&r.requestID, 3)
			case qContext:
				return d.readContext(&r.context)
			}
			return d.skipValue(3)
		})
		if ok && v.err == nil {
			if err := d.queuedErr(r); err != nil {
				v.err = fmt.Errorf("queued[%d]: %w", n, err)
			}
		}
		return ok
	})
}

// readContext reads the "context" member of a slot or queued entry.
func (d *stateDecoder) readContext(r *contextRecord) bool {
	*r = contextRecord{kind: d.text[d.i]}
	if r.kind != '{' {
		return d.skipValue(3)
	}
	return d.object(contextMembers, func(k int) bool {
		switch k {
		case cRequestId:
			return d.readString(&r.requestID, 4)
		case cTraceId:
			return d.readString(&r.traceID, 4)
		case cTraceparent:
			return d.readString(&r.traceparent, 4)
		case cTracestate:
			return d.readString(&r.tracestate, 4)
		}
		return d.skipValue(4)
	})
}

// object reads the object at d.i, calling member with d.i at each
// member's value and the member's index in names (see memberNames), or -1
// for a name not in names. A name where the wire format writes the next
// member is recognised without decoding it.
func (d *stateDecoder) object(names []string, member func(k int) bool) bool {
	t := d.text
	d.i = skipWS(t, d.i+1)
	if d.i < len(t) && t[d.i] == '}' {
		d.i++
		return true
	}
	next := 0 // the member the wire format writes next
	for {
		k := -1
		if q := names[next%len(names)]; len(t)-d.i >= len(q) && string(t[d.i:d.i+len(q)]) == q {
			k = next % len(names)
			if d.i = skipWS(t, d.i+len(q)); d.i >= len(t) {
				return false
			}
		} else {
			name, ok := d.memberName()
			if !ok {
				return false
			}
			for j, q := range names {
				if string(name) == q[1:len(q)-2] {
					k = j
					break
				}
			}
		}
		if !member(k) {
			return false
		}
		if k >= 0 {
			next = k + 1
		}
		if d.i = skipWS(t, d.i); d.i >= len(t) {
			return false
		}
		switch t[d.i] {
		case ',':
			d.i = skipWS(t, d.i+1)
		case '}':
			d.i++
			return true
		default:
			return false
		}
	}
}

// array reads the array at d.i, calling element with the index of each
// element and d.i at it.
func (d *stateDecoder) array(element func(n int) bool) bool {
	t := d.text
	d.i = skipWS(t, d.i+1)
	if d.i < len(t) && t[d.i] == ']' {
		d.i++
		return true
	}
	for n := 0; ; n++ {
		if d.i >= len(t) || !element(n) {
			return false
		}
		if d.i = skipWS(t, d.i); d.i >= len(t) {
			return false
		}
		switch t[d.i] {
		case ',':
			d.i = skipWS(t, d.i+1)
		case ']':
			d.i++
			return true
		default:
			return false
		}
	}
}

// memberName reads a member name and the colon after it, and returns the
// name as JSON.parse reads it, with d.i at the member's value.
func (d *stateDecoder) memberName() ([]byte, bool) {
	t := d.text
	if d.i >= len(t) || t[d.i] != '"' {
		return nil, false
	}
	start, end, plain, ok := d.scanString()
	if !ok {
		return nil, false
	}
	name := t[start:end]
	if !plain {
		d.name = appendStringValue(d.name[:0], name)
		name = d.name
	}
	if d.i = skipWS(t, d.i); d.i >= len(t) || t[d.i] != ':' {
		return nil, false
	}
	if d.i = skipWS(t, d.i+1); d.i >= len(t) {
		return nil, false
	}
	return name, true
}

// readString reads a member that should be a string into v.
func (d *stateDecoder) readString(v *jsonString, depth int) bool {
	if c := d.text[d.i]; c != '"' {
		*v = jsonString{kind: c}
		return d.skipValue(depth)
	}
	start, end, plain, ok := d.scanString()
	if !ok {
		return false
	}
	if plain {
		*v = jsonString{kind: '"', start: start, end: end}
		return true
	}
	n := len(d.unesc)
	d.unesc = appendStringValue(d.unesc, d.text[start:end])
	*v = jsonString{kind: '"', esc: true, start: n, end: len(d.unesc)}
	return true
}

// readTime reads a member that should be a timestamp into v.
func (d *stateDecoder) readTime(v *jsonTime, depth int) bool {
	if !d.readString(&v.jsonString, depth) {
		return false
	}
	v.t, v.ok = time.Time{}, false
	if v.kind == '"' {
		t, err := parseTimestamp(d.bytes(v.jsonString))
		v.t, v.ok = t, err == nil
	}
	return true
}

// readNumber reads a member that should be a number into v.
func (d *stateDecoder) readNumber(v *jsonNumber, depth int) bool {
	c := d.text[d.i]
	*v = jsonNumber{kind: c}
	if !isNumberKind(c) {
		return d.skipValue(depth)
	}
	start, simple, ok := d.scanNumber()
	if !ok {
		return false
	}
	lit := d.text[start:d.i]
	if simple { // digits only, at most 15: exact in an int64 and a double
		neg := lit[0] == '-'
		if neg {
			lit = lit[1:]
		}
		n := int64(0)
		for _, c := range lit {
			n = n*10 + int64(c-'0')
		}
		v.f = float64(n)
		if neg {
			v.f = -v.f
		}
		return true
	}
	// A literal beyond the doubles is ±Infinity, as JSON.parse reads it:
	// ParseFloat's value with its range error.
	v.f, _ = strconv.ParseFloat(string(lit), 64)
	return true
}

// scanNumber moves past the number literal at d.i and returns where it
// starts, and whether it is at most 15 digits with no fraction or exponent.
func (d *stateDecoder) scanNumber() (start int, simple, ok bool) {
	t := d.text
	i := d.i
	start = i
	if i < len(t) && t[i] == '-' {
		i++
	}
	digits := i
	switch {
	case i < len(t) && t[i] == '0':
		i++
	case i < len(t) && t[i] >= '1' && t[i] <= '9':
		i = skipDigits(t, i+1)
	default:
		return start, false, false
	}
	simple = i-digits <= 15
	if i < len(t) && t[i] == '.' {
		simple = false
		if i, ok = scanDigits(t, i+1); !ok {
			return start, false, false
		}
	}
	if i < len(t) && (t[i] == 'e' || t[i] == 'E') {
		simple = false
		if i++; i < len(t) && (t[i] == '+' || t[i] == '-') {
			i++
		}
		if i, ok = scanDigits(t, i); !ok {
			return start, false, false
		}
	}
	d.i = i
	return start, simple, true
}

// skipDigits returns the index past the decimal digits at t[i:].
func skipDigits(t []byte, i int) int {
	for i < len(t) && t[i] >= '0' && t[i] <= '9' {
		i++
	}
	return i
}

// scanDigits returns the index past the decimal digits at t[i:], of which
// there must be at least one (a fraction's, an exponent's).
func scanDigits(t []byte, i int) (int, bool) {
	if i >= len(t) || t[i] < '0' || t[i] > '9' {
		return i, false
	}
	return skipDigits(t, i+1), true
}

// plainStringByte tells the bytes a string literal holds as they are:
// printable ASCII other than '"' and '\\'.
var plainStringByte = func() (p [256]bool) {
	for c := 0x20; c < 0x80; c++ {
		p[c] = c != '"' && c != '\\'
	}
	return p
}()

// scanString moves past the string literal whose opening quote is at d.i
// and returns where its body is, and whether the body is its value (it has
// no escape and only ASCII bytes).
func (d *stateDecoder) scanString() (start, end int, plain, ok bool) {
	t := d.text
	i := d.i + 1
	start = i
	// Eight bytes at a time while none of them is special: a byte of
	// m has its high bit set where the byte is below 0x20, a quote or a
	// backslash (each a byte minus one wrapping past zero), or not ASCII.
	// A borrow can mark a byte above a special one, never a word without
	// one.
	const ones, highs = 0x0101010101010101, 0x8080808080808080
	for i+8 <= len(t) {
		x := binary.LittleEndian.Uint64(t[i:])
		m := (x - ones*0x20) | (x ^ ones*'"' - ones) | (x ^ ones*'\\' - ones) | x
		if m&highs != 0 {
			break
		}
		i += 8
	}
	for i < len(t) && plainStringByte[t[i]] {
		i++
	}
	plain = true
	for i < len(t) {
		switch c := t[i]; {
		case c == '"':
			d.i = i + 1
			return start, i, plain, true
		case c == '\\':
			plain = false
			if i+1 >= len(t) {
				return 0, 0, false, false
			}
			switch t[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i += 2
			case 'u':
				if i+6 > len(t) || hexValue(t[i+2]) < 0 || hexValue(t[i+3]) < 0 || hexValue(t[i+4]) < 0 || hexValue(t[i+5]) < 0 {
					return 0, 0, false, false
				}
				i += 6
			default:
				return 0, 0, false, false
			}
		case c < 0x20:
			return 0, 0, false, false
		default:
			if c >= 0x80 {
				plain = false
			}
			i++
		}
	}
	return 0, 0, false, false
}

// skipValue moves past the value at d.i, checking its grammar and that it
// nests at most MaxPayloadDepth deep with the depth containers around it.
func (d *stateDecoder) skipValue(depth int) bool {
	t := d.text
	stack := d.stack[:0]
	for {
		if d.i >= len(t) {
			return false
		}
		switch c := t[d.i]; c {
		case '{', '[':
			if depth++; depth > MaxPayloadDepth {
				return false
			}
			closer := c + 2 // '}' or ']'
			if d.i = skipWS(t, d.i+1); d.i < len(t) && t[d.i] == closer {
				d.i++
				depth--
				break
			}
			stack = append(stack, closer)
			if c == '{' {
				if _, ok := d.memberName(); !ok {
					return false
				}
			}
			continue
		case '"':
			if _, _, _, ok := d.scanString(); !ok {
				return false
			}
		case 't':
			if !d.literal("true") {
				return false
			}
		case 'f':
			if !d.literal("false") {
				return false
			}
		case 'n':
			if !d.literal("null") {
				return false
			}
		default:
			if _, _, ok := d.scanNumber(); !ok {
				return false
			}
		}
		// After a value: close the containers it ends, up to the next value.
		for {
			if len(stack) == 0 {
				d.stack = stack
				return true
			}
			if d.i = skipWS(t, d.i); d.i >= len(t) {
				return false
			}
			closer := stack[len(stack)-1]
			if t[d.i] == ',' {
				d.i = skipWS(t, d.i+1)
				if closer == '}' {
					if _, ok := d.memberName(); !ok {
						return false
					}
				}
				break
			}
			if t[d.i] != closer {
				return false
			}
			d.i++
			depth--
			stack = stack[:len(stack)-1]
		}
	}
}

// literal moves past lit (true, false or null) at d.i.
func (d *stateDecoder) literal(lit string) bool {
	if len(d.text)-d.i < len(lit) || string(d.text[d.i:d.i+len(lit)]) != lit {
		return false
	}
	d.i += len(lit)
	return true
}

// parseTimestamp reads an RFC 3339 date-time ("2026-11-30T10:00:02.5Z",
// "2026-11-30t11:00:02+01:00"; "T" and "Z" in either case) or the same with
// an expanded year as toISOString writes it ("+010000-01-01T00:00:00.000Z"),
// as JavaScript's Date.parse reads it: fraction digits past the millisecond
// are cut, and the time must lie within what a Date can hold (about the
// years -271821 to 275760). A leap second (":60") is an error, as
// Date.parse has no way to hold one; so are the other forms Date.parse may
// accept (a date alone, no seconds, no offset, a space for "T", day 31 of a
// 30-day month). The error quotes s.
func parseTimestamp[T string | []byte](s T) (time.Time, error) {
	if t, ok := isoTime(s); ok {
		return t, nil
	}
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
	if ms := t.UnixMilli(); ms > jsTimeLimit || ms < -jsTimeLimit {
		return bad("outside the range of JavaScript dates")
	}
	return t, nil
}

// tsScan reads the fields of a timestamp for parseTimestamp, s[i:] being
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
// and a valid time; otherwise it returns false and parseTimestamp reads s.
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
