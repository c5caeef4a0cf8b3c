package jobs

import (
	"encoding/json"
	"strconv"
	"time"
	"unicode/utf8"
)

// The JSON of the stored records without reflection, on the hot path of
// every write and read. Neither side defines the format: encoding/json of
// natsJobRecord (and of the idem and target records) does, and stays the
// fallback.
//
//   - appendNATSRecord writes exactly the bytes json.Marshal writes for the
//     records it handles: strings json would write as they are (printable
//     ASCII other than '"', '\\', '<', '>' and '&', and valid UTF-8 other
//     than U+2028 and U+2029), compact ASCII raw values without '<', '>'
//     or '&' in them, and times json can encode. For anything else it says
//     so, and the caller uses json.Marshal.
//   - parseNATSRecord reads the form json.Marshal writes: the fields in
//     the struct's order, no whitespace, strings without escapes, numbers
//     as plain digits, and no staged or supersede mark (read only while an
//     unbatched enqueue is unfinished). For anything else it says so, and
//     the caller uses encoding/json, whose result (and error) is then the answer. What it
//     accepts it decodes as encoding/json does (the fuzz target
//     FuzzNATSRecordFastPath compares the two on every input).

// natsRecordSize estimates the encoded size of r, so that one allocation
// usually holds it.
func natsRecordSize(r *natsJobRecord) int {
	n := 480 + len(r.ID) + len(r.ChannelID) + len(r.Type) + len(r.Origin) + len(r.TargetKey) +
		len(r.IdempotencyKey) + len(r.Fingerprint) + len(r.Input) + len(r.ClaimOwner) +
		len(r.ClaimBinding) + len(r.Reason)
	for i := range r.Progress {
		p := &r.Progress[i]
		n += 140 + len(p.Stage) + len(p.Label) + len(p.Reason)
	}
	if r.Artifact != nil {
		n += 100 + len(r.Artifact.Value)
	}
	return n
}

// appendNATSRecord appends json.Marshal(r) to b; ok is false when r holds a
// value it does not write itself (see above).
func appendNATSRecord(b []byte, r *natsJobRecord) (_ []byte, ok bool) {
	e := natsJSONWriter{b: b, ok: true}
	e.lit(`{"v":`)
	e.int(r.V)
	if r.RevisionOffset != 0 {
		e.lit(`,"revisionOffset":`)
		e.uint(r.RevisionOffset)
	}
	if r.Revision != 0 {
		e.lit(`,"revision":`)
		e.uint(r.Revision)
	}
	if r.ActiveSeq != 0 {
		e.lit(`,"activeSeq":`)
		e.uint(r.ActiveSeq)
	}
	if r.ActiveOffset != 0 {
		e.lit(`,"activeOffset":`)
		e.uint(r.ActiveOffset)
	}
	e.lit(`,"id":`)
	e.str(r.ID)
	e.lit(`,"channelId":`)
	e.str(r.ChannelID)
	e.lit(`,"type":`)
	e.str(r.Type)
	e.lit(`,"version":`)
	e.int(r.Version)
	if r.Origin != "" {
		e.lit(`,"origin":`)
		e.str(r.Origin)
	}
	e.lit(`,"targetKey":`)
	e.str(r.TargetKey)
	e.lit(`,"targetGeneration":`)
	e.uint(r.TargetGeneration)
	e.lit(`,"idempotencyKey":`)
	e.str(r.IdempotencyKey)
	e.lit(`,"fingerprint":`)
	e.str(r.Fingerprint)
	if len(r.Input) != 0 {
		e.lit(`,"input":`)
		e.raw(r.Input)
	}
	e.lit(`,"state":`)
	e.str(string(r.State))
	e.lit(`,"attempts":`)
	e.int(r.Attempts)
	e.lit(`,"failures":`)
	e.int(r.Failures)
	e.lit(`,"claimGeneration":`)
	e.uint(r.ClaimGeneration)
	if r.ClaimOwner != "" {
		e.lit(`,"claimOwner":`)
		e.str(r.ClaimOwner)
	}
	if len(r.ClaimBinding) != 0 {
		e.lit(`,"claimBinding":`)
		e.raw(r.ClaimBinding)
	}
	if !r.ClaimExpiresAt.IsZero() {
		e.lit(`,"claimExpiresAt":`)
		e.time(r.ClaimExpiresAt)
	}
	e.lit(`,"availableAt":`)
	e.time(r.AvailableAt)
	if r.Reason != "" {
		e.lit(`,"reason":`)
		e.str(r.Reason)
	}
	if len(r.Progress) != 0 {
		e.lit(`,"progress":[`)
		for i := range r.Progress {
			p := &r.Progress[i]
			if i > 0 {
				e.lit(",")
			}
			e.lit("{")
			if p.Revision != 0 {
				e.lit(`"revision":`)
				e.uint(p.Revision)
				e.lit(",")
			}
			e.lit(`"attempt":`)
			e.int(p.Attempt)
			e.lit(`,"stage":`)
			e.str(p.Stage)
			e.lit(`,"label":`)
			e.str(p.Label)
			e.lit(`,"state":`)
			e.str(string(p.State))
			if p.Reason != "" {
				e.lit(`,"reason":`)
				e.str(p.Reason)
			}
			e.lit(`,"createdAt":`)
			e.time(p.CreatedAt)
			e.lit("}")
		}
		e.lit("]")
	}
	e.lit(`,"createdAt":`)
	e.time(r.CreatedAt)
	e.lit(`,"updatedAt":`)
	e.time(r.UpdatedAt)
	if a := r.Artifact; a != nil {
		e.lit(`,"artifact":{`)
		if a.Revision != 0 {
			e.lit(`"revision":`)
			e.uint(a.Revision)
			e.lit(",")
		}
		e.lit(`"value":`)
		if a.Value == nil {
			e.lit("null")
		} else {
			e.raw(a.Value)
		}
		e.lit(`,"createdAt":`)
		e.time(a.CreatedAt)
		e.lit("}")
	}
	if st := r.Staged; st != nil {
		e.lit(`,"staged":{`)
		if st.Prev != "" {
			e.lit(`"prev":`)
			e.str(st.Prev)
		}
		e.lit("}")
	}
	if m := r.Supersede; m != nil {
		e.lit(`,"supersede":{"at":`)
		e.time(m.At)
		e.lit("}")
	}
	e.lit("}")
	return e.b, e.ok
}

// appendNATSIdem appends json.Marshal(r); ok as for appendNATSRecord.
func appendNATSIdem(b []byte, r natsIdemRecord) ([]byte, bool) {
	e := natsJSONWriter{b: b, ok: true}
	e.lit(`{"jobId":`)
	e.str(r.JobID)
	e.lit(`,"fingerprint":`)
	e.str(r.Fingerprint)
	e.lit("}")
	return e.b, e.ok
}

// appendNATSTarget appends json.Marshal(r); ok as for appendNATSRecord.
func appendNATSTarget(b []byte, r natsTargetRecord) ([]byte, bool) {
	e := natsJSONWriter{b: b, ok: true}
	e.lit(`{"generation":`)
	e.uint(r.Generation)
	e.lit(`,"jobId":`)
	e.str(r.JobID)
	e.lit("}")
	return e.b, e.ok
}

// natsJSONWriter appends JSON; ok turns false, for good, at the first
// value it does not write as json.Marshal would.
type natsJSONWriter struct {
	b  []byte
	ok bool
}

func (e *natsJSONWriter) lit(s string) { e.b = append(e.b, s...) }

func (e *natsJSONWriter) int(v int) { e.b = strconv.AppendInt(e.b, int64(v), 10) }

func (e *natsJSONWriter) uint(v uint64) { e.b = strconv.AppendUint(e.b, v, 10) }

func (e *natsJSONWriter) str(s string) {
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c < 0x20 || c > 0x7e || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
				e.ok = false // json escapes it
				return
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 || r == '\u2028' || r == '\u2029' {
			e.ok = false // json replaces or escapes it
			return
		}
		i += size
	}
	e.b = append(e.b, '"')
	e.b = append(e.b, s...)
	e.b = append(e.b, '"')
}

// raw writes a raw JSON value that is valid, compact (no whitespace outside
// strings) and plain ASCII with no '<', '>' or '&': what json.Marshal
// copies as it is.
func (e *natsJSONWriter) raw(v []byte) {
	inString := false
	for i := 0; i < len(v); i++ {
		c := v[i]
		switch {
		case c >= utf8.RuneSelf || c == '<' || c == '>' || c == '&':
			e.ok = false
			return
		case inString && c == '\\':
			i++ // the escaped byte; an escape at the end fails json.Valid
		case c == '"':
			inString = !inString
		case !inString && (c == ' ' || c == '\t' || c == '\n' || c == '\r'):
			e.ok = false // json compacts it
			return
		}
	}
	if !json.Valid(v) {
		e.ok = false // json.Marshal reports it
		return
	}
	e.b = append(e.b, v...)
}

// time writes t as time.Time.MarshalJSON does, when it can encode t.
func (e *natsJSONWriter) time(t time.Time) {
	n0 := len(e.b)
	e.b = append(e.b, '"')
	e.b = t.AppendFormat(e.b, time.RFC3339Nano)
	// MarshalJSON's checks: a four-digit year, a zone hour below 24.
	s := e.b[n0+1:]
	switch {
	case len(s) < len("2006-01-02T15:04:05Z") || s[4] != '-':
		e.ok = false
	case s[len(s)-1] != 'Z':
		c := s[len(s)-len("Z07:00")]
		h := s[len(s)-len("07:00"):]
		if '0' <= c && c <= '9' || 10*(h[0]-'0')+(h[1]-'0') >= 24 {
			e.ok = false
		}
	}
	e.b = append(e.b, '"')
}

// parseNATSRecord decodes data in the form json.Marshal writes a
// natsJobRecord (see above); ok is false for anything else. wantChannel and
// wantJob, when equal to the stored ids, are used instead of new strings.
func parseNATSRecord(data []byte, wantChannel, wantJob string) (r natsJobRecord, ok bool) {
	p := natsJSONReader{data: data, ok: true}
	p.lit(`{"v":`)
	r.V = p.int()
	if p.opt(`,"revisionOffset":`) {
		r.RevisionOffset = p.uint()
	}
	if p.opt(`,"revision":`) {
		r.Revision = p.uint()
	}
	if p.opt(`,"activeSeq":`) {
		r.ActiveSeq = p.uint()
	}
	if p.opt(`,"activeOffset":`) {
		r.ActiveOffset = p.uint()
	}
	p.lit(`,"id":`)
	r.ID = p.strAs(wantJob)
	p.lit(`,"channelId":`)
	r.ChannelID = p.strAs(wantChannel)
	p.lit(`,"type":`)
	r.Type = p.str()
	p.lit(`,"version":`)
	r.Version = p.int()
	if p.opt(`,"origin":`) {
		r.Origin = p.str()
	}
	p.lit(`,"targetKey":`)
	r.TargetKey = p.str()
	p.lit(`,"targetGeneration":`)
	r.TargetGeneration = p.uint()
	p.lit(`,"idempotencyKey":`)
	r.IdempotencyKey = p.str()
	p.lit(`,"fingerprint":`)
	r.Fingerprint = p.str()
	if p.opt(`,"input":`) {
		r.Input = p.raw()
	}
	p.lit(`,"state":`)
	r.State = State(p.state())
	p.lit(`,"attempts":`)
	r.Attempts = p.int()
	p.lit(`,"failures":`)
	r.Failures = p.int()
	p.lit(`,"claimGeneration":`)
	r.ClaimGeneration = p.uint()
	if p.opt(`,"claimOwner":`) {
		r.ClaimOwner = p.str()
	}
	if p.opt(`,"claimBinding":`) {
		r.ClaimBinding = p.raw()
	}
	if p.opt(`,"claimExpiresAt":`) {
		r.ClaimExpiresAt = p.time()
	}
	p.lit(`,"availableAt":`)
	r.AvailableAt = p.time()
	if p.opt(`,"reason":`) {
		r.Reason = p.str()
	}
	if p.opt(`,"progress":[`) {
		for p.ok {
			var e natsProgress
			p.lit("{")
			if p.opt(`"revision":`) {
				e.Revision = p.uint()
				p.lit(",")
			}
			p.lit(`"attempt":`)
			e.Attempt = p.int()
			p.lit(`,"stage":`)
			e.Stage = p.str()
			p.lit(`,"label":`)
			e.Label = p.str()
			p.lit(`,"state":`)
			e.State = ProgressState(p.state())
			if p.opt(`,"reason":`) {
				e.Reason = p.str()
			}
			p.lit(`,"createdAt":`)
			e.CreatedAt = p.time()
			p.lit("}")
			r.Progress = append(r.Progress, e)
			if !p.opt(",") {
				break
			}
		}
		p.lit("]")
	}
	p.lit(`,"createdAt":`)
	r.CreatedAt = p.time()
	p.lit(`,"updatedAt":`)
	r.UpdatedAt = p.time()
	if p.opt(`,"artifact":{`) {
		a := &natsArtifactValue{}
		if p.opt(`"revision":`) {
			a.Revision = p.uint()
			p.lit(",")
		}
		p.lit(`"value":`)
		a.Value = p.raw()
		p.lit(`,"createdAt":`)
		a.CreatedAt = p.time()
		p.lit("}")
		r.Artifact = a
	}
	p.lit("}")
	if !p.ok || p.i != len(data) {
		return natsJobRecord{}, false
	}
	return r, true
}

// natsJSONReader reads the canonical form; ok turns false, for good, at the
// first byte outside it, and every later read returns a zero value.
type natsJSONReader struct {
	data []byte
	i    int
	ok   bool
}

func (p *natsJSONReader) rest() []byte {
	if !p.ok {
		return nil
	}
	return p.data[p.i:]
}

func (p *natsJSONReader) lit(s string) {
	if !p.opt(s) {
		p.ok = false
	}
}

// opt consumes s if the input continues with it.
func (p *natsJSONReader) opt(s string) bool {
	r := p.rest()
	if len(r) < len(s) || string(r[:len(s)]) != s {
		return false
	}
	p.i += len(s)
	return true
}

// digits consumes a plain decimal number of at most most digits: no sign,
// fraction, exponent or leading zero.
func (p *natsJSONReader) digits(most int) uint64 {
	r := p.rest()
	n := 0
	var v uint64
	for n < len(r) && r[n] >= '0' && r[n] <= '9' {
		v = v*10 + uint64(r[n]-'0')
		n++
	}
	if n == 0 || n > most || n > 1 && r[0] == '0' {
		p.ok = false
		return 0
	}
	p.i += n
	return v
}

// uint reads a uint64 (19 digits always fit).
func (p *natsJSONReader) uint() uint64 { return p.digits(19) }

// int reads a non-negative int (18 digits fit an int64; the record's
// counters are far smaller, and an int is 64 bits where this runs).
func (p *natsJSONReader) int() int {
	v := p.digits(18)
	if int(v) < 0 || uint64(int(v)) != v {
		p.ok = false
		return 0
	}
	return int(v)
}

// strBytes reads a string without escapes whose bytes are valid UTF-8
// (json would replace invalid bytes) and returns its contents.
func (p *natsJSONReader) strBytes() []byte {
	r := p.rest()
	if len(r) == 0 || r[0] != '"' {
		p.ok = false
		return nil
	}
	ascii := true
	for n := 1; n < len(r); n++ {
		c := r[n]
		switch {
		case c == '"':
			s := r[1:n]
			if !ascii && !utf8.Valid(s) {
				p.ok = false
				return nil
			}
			p.i += n + 1
			return s
		case c == '\\' || c < 0x20:
			p.ok = false
			return nil
		case c >= utf8.RuneSelf:
			ascii = false
		}
	}
	p.ok = false
	return nil
}

func (p *natsJSONReader) str() string { return string(p.strBytes()) }

// strAs is str, returning known when the string equals it.
func (p *natsJSONReader) strAs(known string) string {
	s := p.strBytes()
	if string(s) == known {
		return known
	}
	return string(s)
}

// state reads a job or progress state, sharing the constants' strings.
func (p *natsJSONReader) state() string {
	s := p.strBytes()
	for _, c := range [...]string{string(StatePending), string(StateRunning), string(StateCompleted),
		string(StatePaused), string(StateFailed), string(StateCancelled), string(StateSuperseded),
		string(ProgressStarted), string(ProgressInterrupted)} {
		if string(s) == c {
			return c
		}
	}
	return string(s)
}

// time reads a time as time.Time.UnmarshalJSON does, from a string without
// escapes.
func (p *natsJSONReader) time() time.Time {
	r := p.rest()
	start := p.i
	p.strBytes()
	if !p.ok {
		return time.Time{}
	}
	var t time.Time
	if err := t.UnmarshalJSON(r[:p.i-start]); err != nil {
		p.ok = false
		return time.Time{}
	}
	return t
}

// raw reads any valid JSON value and returns its bytes (not a copy), as
// json.RawMessage's decoding does.
func (p *natsJSONReader) raw() json.RawMessage {
	r := p.rest()
	if len(r) == 0 {
		p.ok = false
		return nil
	}
	n, depth, inString := 0, 0, false
scan:
	for ; n < len(r); n++ {
		c := r[n]
		switch {
		case inString && c == '\\':
			n++
		case c == '"':
			inString = !inString
			if !inString && depth == 0 {
				n++
				break scan
			}
		case inString:
		case c == '{' || c == '[':
			depth++
		case c == '}' || c == ']':
			if depth == 0 {
				break scan // the end of a literal or number
			}
			depth--
			if depth == 0 {
				n++
				break scan
			}
		case c == ',' && depth == 0:
			break scan
		}
	}
	if n > len(r) || !json.Valid(r[:n]) {
		p.ok = false
		return nil
	}
	p.i += n
	return r[:n:n]
}
