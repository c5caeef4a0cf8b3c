package jobkeys

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"time"

	"github.com/jobkeys/jobkeys/internal/jsjson"
)

// This file decodes a key state document in one pass over its text, as
// JSON.parse followed by the TypeScript original's checks reads it (see
// [ParseState]), with the JSON primitives of internal/jsjson: its Scanner
// reads the grammar, this file knows the schema. The pass checks the JSON grammar and the
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
// helpers of jsjson (CheckText describes a syntax error as
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
	s, err := d.decode(jsjson.TrimBOM(data))
	d.Text = nil
	if cap(d.slots) <= maxPooledRecords && cap(d.queue) <= maxPooledRecords && cap(d.unesc) <= 64*maxPooledRecords {
		stateDecoderPool.Put(d)
	}
	return s, err
}

// stateDecoder holds one decode's position and the records of the members
// it has read. Offsets in records are into text, or into unesc for a string
// with escapes or non-ASCII bytes.
type stateDecoder struct {
	jsjson.Scanner                // the text and the position in it
	unesc          []byte         // the values of strings that differ from their literal
	slots          []slotRecord   // the elements of the last "active" member
	queue          []queuedRecord // the elements of the last "queued" member
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
// jsjson.ParseTime reads from it.
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
	d.Reset(text)
	d.unesc, d.slots, d.queue = d.unesc[:0], d.slots[:0], d.queue[:0]
	if d.I == len(text) || text[d.I] != '{' {
		if err := jsjson.CheckText(text); err != nil {
			return nil, fmt.Errorf("state is not valid JSON: %w", err)
		}
		if d.I == len(text) { // not expected: jsjson.CheckText refuses empty text
			return nil, errors.New("state is not valid JSON: no value")
		}
		return nil, fmt.Errorf("state is not a JSON object (it is %s)", jsjson.KindName(text[d.I]))
	}
	var r stateRecord
	if !d.state(&r) || jsjson.SkipWS(text, d.I) != len(text) {
		return nil, d.syntaxError()
	}
	if err := d.check(&r); err != nil {
		return nil, err
	}
	return d.build(&r), nil
}

// syntaxError describes the JSON syntax error the pass stopped at.
func (d *stateDecoder) syntaxError() error {
	err := jsjson.CheckText(d.Text)
	if err == nil { // not expected: the pass and jsjson.CheckText disagree
		err = fmt.Errorf("unexpected %s at byte %d", jsjson.DescribeByte(d.Text, d.I), d.I)
	}
	return fmt.Errorf("state is not valid JSON: %w", err)
}

// check applies the TypeScript original's checks to the state's members, in
// its order, and returns the first failure.
func (d *stateDecoder) check(r *stateRecord) error {
	if !jsjson.IsNumberStart(r.version.kind) || r.version.f != StateVersion {
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
	if f := v.f; !jsjson.IsNumberStart(v.kind) || f != math.Trunc(f) || f < float64(lowest) || f > 1<<53 || f > math.MaxInt {
		return fieldErr(field, v.kind != 0, fmt.Sprintf("must be an integer from %d to 2^53", lowest)+got(v.kind))
	}
	return nil
}

// timeErr says what the member field is if it is not a timestamp
// jsjson.ParseTime reads.
func (d *stateDecoder) timeErr(field string, v *jsonTime) error {
	if v.kind != '"' {
		return fieldErr(field, v.kind != 0, "must be an RFC 3339 timestamp"+got(v.kind))
	}
	if !v.ok {
		_, err := jsjson.ParseTime(d.bytes(v.jsonString))
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
	return ", not " + jsjson.KindName(kind)
}

// bytes returns the value of the string v.
func (d *stateDecoder) bytes(v jsonString) []byte {
	if v.esc {
		return d.unesc[v.start:v.end]
	}
	return d.Text[v.start:v.end]
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

// The reading pass. Each method reads the value at d.I and moves d.I past
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
	stateMembers   = jsjson.MemberNames("version", "service", "jobType", "key", "keyHash", "maxActive", "maxQueuedPerKey", "active", "queued", "staleTakeoverCount", "updatedAt")
	slotMembers    = jsjson.MemberNames("jobId", "slotToken", "instanceId", "startedAt", "heartbeatAt", "leaseExpiresAt", "tries", "context")
	queuedMembers  = jsjson.MemberNames("jobId", "createdAt", "requestId", "context")
	contextMembers = jsjson.MemberNames("requestId", "traceId", "traceparent", "tracestate")
)

// state reads the state object.
func (d *stateDecoder) state(r *stateRecord) bool {
	return d.Object(stateMembers, func(k int) bool {
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
		return d.SkipValue(1)
	})
}

// activeArray reads the "active" member into d.slots.
func (d *stateDecoder) activeArray(v *jsonArray) bool {
	*v = jsonArray{kind: d.Text[d.I]}
	d.slots = d.slots[:0]
	if v.kind != '[' {
		return d.SkipValue(1)
	}
	return d.Array(func(n int) bool {
		if d.Text[d.I] != '{' {
			if v.err == nil {
				v.err = fmt.Errorf("active[%d]: %w", n, fieldErr("slot", true, "must be an object"+got(d.Text[d.I])))
			}
			return d.SkipValue(2)
		}
		d.slots = append(d.slots, slotRecord{})
		r := &d.slots[len(d.slots)-1]
		ok := d.Object(slotMembers, func(k int) bool {
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
			return d.SkipValue(3)
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
	*v = jsonArray{kind: d.Text[d.I]}
	d.queue = d.queue[:0]
	if v.kind != '[' {
		return d.SkipValue(1)
	}
	return d.Array(func(n int) bool {
		if d.Text[d.I] != '{' {
			if v.err == nil {
				v.err = fmt.Errorf("queued[%d]: %w", n, fieldErr("entry", true, "must be an object"+got(d.Text[d.I])))
			}
			return d.SkipValue(2)
		}
		d.queue = append(d.queue, queuedRecord{})
		r := &d.queue[len(d.queue)-1]
		ok := d.Object(queuedMembers, func(k int) bool {
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
			return d.SkipValue(3)
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
	*r = contextRecord{kind: d.Text[d.I]}
	if r.kind != '{' {
		return d.SkipValue(3)
	}
	return d.Object(contextMembers, func(k int) bool {
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
		return d.SkipValue(4)
	})
}

// readString reads a member that should be a string into v.
func (d *stateDecoder) readString(v *jsonString, depth int) bool {
	if c := d.Text[d.I]; c != '"' {
		*v = jsonString{kind: c}
		return d.SkipValue(depth)
	}
	start, end, plain, ok := d.ScanString()
	if !ok {
		return false
	}
	if plain {
		*v = jsonString{kind: '"', start: start, end: end}
		return true
	}
	n := len(d.unesc)
	d.unesc = jsjson.AppendStringValue(d.unesc, d.Text[start:end])
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
		t, err := jsjson.ParseTime(d.bytes(v.jsonString))
		v.t, v.ok = t, err == nil
	}
	return true
}

// readNumber reads a member that should be a number into v.
func (d *stateDecoder) readNumber(v *jsonNumber, depth int) bool {
	c := d.Text[d.I]
	*v = jsonNumber{kind: c}
	if !jsjson.IsNumberStart(c) {
		return d.SkipValue(depth)
	}
	var ok bool
	v.f, ok = d.Number()
	return ok
}
