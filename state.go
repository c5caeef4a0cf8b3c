package jobkeys

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"reflect"
	"strconv"
	"time"
)

// StateVersion is the only key state version this package reads and writes.
const StateVersion = 1

// TraceContext is the W3C trace context a job carries, stored with every
// queued entry and slot (wire field "context").
type TraceContext struct {
	RequestID   string // wire "requestId"; required on the wire
	TraceID     string // wire "traceId"; required on the wire
	Traceparent string // wire "traceparent"; required on the wire
	Tracestate  string // wire "tracestate"; omitted when empty
}

// IsZero reports whether c has no field set.
func (c TraceContext) IsZero() bool { return c == TraceContext{} }

// ActiveSlot is one running job's hold on a key (wire: an element of "active").
type ActiveSlot struct {
	JobID          string    // the job holding the slot
	SlotToken      string    // random per acquisition; renew and release must present it
	InstanceID     string    // the worker instance that holds the slot
	StartedAt      time.Time // when the slot was acquired
	HeartbeatAt    time.Time // the last renewal (or the acquisition)
	LeaseExpiresAt time.Time // the slot is stale from this instant on
	Tries          int       // the attempt number the acquirer gave
	// Context is the job's trace context. The Rust port may omit it; it is
	// then zero, and written back with a context derived from the job id
	// and slot token so that the TS original accepts it.
	Context TraceContext
}

// QueuedJob is one admitted job waiting for a slot (wire: an element of "queued").
type QueuedJob struct {
	JobID     string       // the waiting job
	CreatedAt time.Time    // when it was admitted
	RequestID string       // the request that admitted it (its Context.RequestID)
	Context   TraceContext // the job's trace context
}

// KeyState is the document stored under one KV key: the active slots and
// queued jobs of one key of one job type of one service.
type KeyState struct {
	Version            int          // always StateVersion
	Service            string       // the service (bucket JOBS_KEYS_<Service>)
	JobType            string       // the job type
	Key                string       // display key
	KeyHash            string       // the key hash, the last token of the KV key
	MaxActive          int          // the policy's MaxActive when last admitted or acquired under
	MaxQueuedPerKey    int          // the policy's MaxQueuedPerKey, likewise
	Active             []ActiveSlot // the slots, oldest first
	Queued             []QueuedJob  // the waiting jobs, oldest first
	StaleTakeoverCount int          // expired slots removed from this key so far
	UpdatedAt          time.Time    // the last change
}

// Empty reports whether the state holds no active slot and no queued job;
// such state is deleted from the store rather than written.
func (s *KeyState) Empty() bool { return len(s.Active) == 0 && len(s.Queued) == 0 }

// clone returns a deep copy of the slices so reducers never alias their input.
func (s *KeyState) clone() *KeyState {
	c := *s
	c.Active = append(make([]ActiveSlot, 0, len(s.Active)+1), s.Active...)
	c.Queued = append(make([]QueuedJob, 0, len(s.Queued)+1), s.Queued...)
	return &c
}

// MarshalJSON encodes the state in the wire format of the TS original: fields
// in its order, timestamps as JavaScript's toISOString writes them.
//
// It has a value receiver so that KeyState values and structs holding
// them encode in the wire format too. Note that json.Marshal escapes '<',
// '>' and '&' in what a MarshalJSON returns, which JSON.stringify does not;
// call MarshalJSON directly for the exact bytes the coordinator writes.
func (s KeyState) MarshalJSON() ([]byte, error) {
	return appendState(make([]byte, 0, 512), &s), nil
}

// UnmarshalJSON decodes and validates a state document; see [ParseState].
func (s *KeyState) UnmarshalJSON(data []byte) error {
	st, err := decodeState(data)
	if err != nil {
		return err
	}
	*s = *st
	return nil
}

// ParseState decodes a key state document as the TS original or its Rust
// port writes it and validates it with the TS original's rules (slot
// "context" may be missing). The error says which field is wrong.
func ParseState(data []byte) (*KeyState, error) {
	return decodeState(data)
}

// inJSYears reports whether t, in UTC, falls in the years 0000 to 9999,
// which toISOString writes in the four-digit form every reader accepts.
func inJSYears(t time.Time) bool {
	y := t.UTC().Year()
	return y >= 0 && y <= 9999
}

// jsTime is the layout of JavaScript's Date#toISOString for years 0-9999.
const jsTime = "2006-01-02T15:04:05.000Z"

func appendTime(dst []byte, t time.Time) []byte {
	dst = append(dst, '"')
	dst = t.UTC().AppendFormat(dst, jsTime)
	return append(dst, '"')
}

func appendContext(dst []byte, c TraceContext) []byte {
	dst = append(dst, `{"requestId":`...)
	dst = appendJSString(dst, c.RequestID)
	dst = append(dst, `,"traceId":`...)
	dst = appendJSString(dst, c.TraceID)
	dst = append(dst, `,"traceparent":`...)
	dst = appendJSString(dst, c.Traceparent)
	if c.Tracestate != "" {
		dst = append(dst, `,"tracestate":`...)
		dst = appendJSString(dst, c.Tracestate)
	}
	return append(dst, '}')
}

// appendState writes s as the TS original's JSON.stringify would.
func appendState(dst []byte, s *KeyState) []byte {
	dst = append(dst, `{"version":1,"service":`...)
	dst = appendJSString(dst, s.Service)
	dst = append(dst, `,"jobType":`...)
	dst = appendJSString(dst, s.JobType)
	dst = append(dst, `,"key":`...)
	dst = appendJSString(dst, s.Key)
	dst = append(dst, `,"keyHash":`...)
	dst = appendJSString(dst, s.KeyHash)
	dst = append(dst, `,"maxActive":`...)
	dst = strconv.AppendInt(dst, int64(s.MaxActive), 10)
	dst = append(dst, `,"maxQueuedPerKey":`...)
	dst = strconv.AppendInt(dst, int64(s.MaxQueuedPerKey), 10)
	dst = append(dst, `,"active":[`...)
	for i := range s.Active {
		a := &s.Active[i]
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = append(dst, `{"jobId":`...)
		dst = appendJSString(dst, a.JobID)
		dst = append(dst, `,"slotToken":`...)
		dst = appendJSString(dst, a.SlotToken)
		dst = append(dst, `,"instanceId":`...)
		dst = appendJSString(dst, a.InstanceID)
		dst = append(dst, `,"startedAt":`...)
		dst = appendTime(dst, a.StartedAt)
		dst = append(dst, `,"heartbeatAt":`...)
		dst = appendTime(dst, a.HeartbeatAt)
		dst = append(dst, `,"leaseExpiresAt":`...)
		dst = appendTime(dst, a.LeaseExpiresAt)
		dst = append(dst, `,"tries":`...)
		dst = strconv.AppendInt(dst, int64(a.Tries), 10)
		dst = append(dst, `,"context":`...)
		dst = appendContext(dst, wireContext(a.Context, a.JobID, a.SlotToken))
		dst = append(dst, '}')
	}
	dst = append(dst, `],"queued":[`...)
	for i := range s.Queued {
		q := &s.Queued[i]
		if i > 0 {
			dst = append(dst, ',')
		}
		ctx := wireContext(q.Context, q.JobID, "")
		reqID := q.RequestID
		if reqID == "" {
			reqID = ctx.RequestID
		}
		dst = append(dst, `{"jobId":`...)
		dst = appendJSString(dst, q.JobID)
		dst = append(dst, `,"createdAt":`...)
		dst = appendTime(dst, q.CreatedAt)
		dst = append(dst, `,"requestId":`...)
		dst = appendJSString(dst, reqID)
		dst = append(dst, `,"context":`...)
		dst = appendContext(dst, ctx)
		dst = append(dst, '}')
	}
	dst = append(dst, `],"staleTakeoverCount":`...)
	dst = strconv.AppendInt(dst, int64(s.StaleTakeoverCount), 10)
	dst = append(dst, `,"updatedAt":`...)
	dst = appendTime(dst, s.UpdatedAt)
	return append(dst, '}')
}

// wireContext returns c with every field the TS original requires filled.
// Missing fields are derived deterministically from the job id and slot
// token (a trace id of their hash), so a slot the Rust port wrote without
// context, or a job admitted without one, still validates on the TS side.
func wireContext(c TraceContext, jobID, salt string) TraceContext {
	if c.RequestID != "" && c.TraceID != "" && c.Traceparent != "" {
		return c
	}
	if c.RequestID == "" {
		c.RequestID = jobID
	}
	if c.TraceID == "" || c.Traceparent == "" {
		sum := sha256.Sum256([]byte(jobID + "\x00" + salt))
		var buf [48]byte
		hex.Encode(buf[:], sum[:24])
		if c.TraceID == "" {
			c.TraceID = string(buf[:32])
		}
		if c.Traceparent == "" {
			c.Traceparent = "00-" + c.TraceID + "-" + string(buf[32:48]) + "-00"
		}
	}
	return c
}

// wireString is a JSON string decoded as JSON.parse decodes it: escaped
// lone surrogates are kept (in WTF-8, as DeriveKey keeps them) rather than
// replaced with U+FFFD as encoding/json does, so that state written back
// holds exactly the strings that were read.
type wireString string

var stringType = reflect.TypeFor[string]()

// UnmarshalJSON implements json.Unmarshaler.
func (w *wireString) UnmarshalJSON(b []byte) error {
	if len(b) < 2 || b[0] != '"' {
		kind := "number"
		switch b[0] {
		case '{':
			kind = "object"
		case '[':
			kind = "array"
		case 't', 'f':
			kind = "bool"
		}
		return &json.UnmarshalTypeError{Value: kind, Type: stringType}
	}
	raw := b[1 : len(b)-1]
	if !needsDecoding(raw) {
		*w = wireString(raw)
		return nil
	}
	*w = wireString(appendStringValue(make([]byte, 0, len(raw)), raw))
	return nil
}

// Wire shapes for decoding. Pointers tell missing and null apart from zero.
type wireContextDoc struct {
	RequestID   *wireString `json:"requestId"`
	TraceID     *wireString `json:"traceId"`
	Traceparent *wireString `json:"traceparent"`
	Tracestate  *wireString `json:"tracestate"`
}

type wireSlot struct {
	JobID          *wireString     `json:"jobId"`
	SlotToken      *wireString     `json:"slotToken"`
	InstanceID     *wireString     `json:"instanceId"`
	StartedAt      *wireString     `json:"startedAt"`
	HeartbeatAt    *wireString     `json:"heartbeatAt"`
	LeaseExpiresAt *wireString     `json:"leaseExpiresAt"`
	Tries          *float64        `json:"tries"`
	Context        *wireContextDoc `json:"context"`
}

type wireQueued struct {
	JobID     *wireString     `json:"jobId"`
	CreatedAt *wireString     `json:"createdAt"`
	RequestID *wireString     `json:"requestId"`
	Context   *wireContextDoc `json:"context"`
}

type wireState struct {
	Version            *float64      `json:"version"`
	Service            *wireString   `json:"service"`
	JobType            *wireString   `json:"jobType"`
	Key                *wireString   `json:"key"`
	KeyHash            *wireString   `json:"keyHash"`
	MaxActive          *float64      `json:"maxActive"`
	MaxQueuedPerKey    *float64      `json:"maxQueuedPerKey"`
	Active             *[]wireSlot   `json:"active"`
	Queued             *[]wireQueued `json:"queued"`
	StaleTakeoverCount *float64      `json:"staleTakeoverCount"`
	UpdatedAt          *wireString   `json:"updatedAt"`
}

func decodeState(data []byte) (*KeyState, error) {
	var w wireState
	if err := json.Unmarshal(data, &w); err != nil {
		var typeErr *json.UnmarshalTypeError
		if errors.As(err, &typeErr) && typeErr.Field != "" {
			return nil, fieldErr(typeErr.Field, "has the wrong type ("+typeErr.Value+")")
		}
		if errors.As(err, &typeErr) {
			return nil, fmt.Errorf("state is not a JSON object (%s)", typeErr.Value)
		}
		return nil, fmt.Errorf("state is not valid JSON: %w", err)
	}
	var s KeyState
	var err error
	if w.Version == nil || *w.Version != StateVersion {
		return nil, fieldErr("version", "must be 1")
	}
	s.Version = StateVersion
	if s.Service, err = nonEmpty("service", w.Service); err != nil {
		return nil, err
	}
	if s.JobType, err = nonEmpty("jobType", w.JobType); err != nil {
		return nil, err
	}
	if w.Key == nil {
		return nil, fieldErr("key", "must be a string")
	}
	s.Key = string(*w.Key)
	if s.KeyHash, err = nonEmpty("keyHash", w.KeyHash); err != nil {
		return nil, err
	}
	if s.MaxActive, err = integer("maxActive", w.MaxActive, 1); err != nil {
		return nil, err
	}
	if w.MaxQueuedPerKey != nil {
		if s.MaxQueuedPerKey, err = integer("maxQueuedPerKey", w.MaxQueuedPerKey, 0); err != nil {
			return nil, err
		}
	}
	if w.Active == nil {
		return nil, fieldErr("active", "must be an array")
	}
	s.Active = make([]ActiveSlot, len(*w.Active), len(*w.Active)+1)
	for i := range *w.Active {
		if err := decodeSlot(&(*w.Active)[i], &s.Active[i]); err != nil {
			return nil, fmt.Errorf("active[%d]: %w", i, err)
		}
	}
	if w.Queued == nil {
		return nil, fieldErr("queued", "must be an array")
	}
	s.Queued = make([]QueuedJob, len(*w.Queued), len(*w.Queued)+1)
	for i := range *w.Queued {
		if err := decodeQueued(&(*w.Queued)[i], &s.Queued[i]); err != nil {
			return nil, fmt.Errorf("queued[%d]: %w", i, err)
		}
	}
	if s.StaleTakeoverCount, err = integer("staleTakeoverCount", w.StaleTakeoverCount, 0); err != nil {
		return nil, err
	}
	if s.UpdatedAt, err = timestamp("updatedAt", w.UpdatedAt); err != nil {
		return nil, err
	}
	return &s, nil
}

func decodeSlot(w *wireSlot, a *ActiveSlot) error {
	var err error
	if a.JobID, err = nonEmpty("jobId", w.JobID); err != nil {
		return err
	}
	if a.SlotToken, err = nonEmpty("slotToken", w.SlotToken); err != nil {
		return err
	}
	if a.InstanceID, err = nonEmpty("instanceId", w.InstanceID); err != nil {
		return err
	}
	if a.StartedAt, err = timestamp("startedAt", w.StartedAt); err != nil {
		return err
	}
	if a.HeartbeatAt, err = timestamp("heartbeatAt", w.HeartbeatAt); err != nil {
		return err
	}
	if a.LeaseExpiresAt, err = timestamp("leaseExpiresAt", w.LeaseExpiresAt); err != nil {
		return err
	}
	if a.Tries, err = integer("tries", w.Tries, 0); err != nil {
		return err
	}
	if w.Context != nil { // the Rust port may leave it out
		if a.Context, err = decodeContext(w.Context); err != nil {
			return err
		}
	}
	return nil
}

func decodeQueued(w *wireQueued, q *QueuedJob) error {
	var err error
	if q.JobID, err = nonEmpty("jobId", w.JobID); err != nil {
		return err
	}
	if q.CreatedAt, err = timestamp("createdAt", w.CreatedAt); err != nil {
		return err
	}
	if q.RequestID, err = nonEmpty("requestId", w.RequestID); err != nil {
		return err
	}
	if w.Context == nil {
		return fieldErr("context", "must be an object")
	}
	q.Context, err = decodeContext(w.Context)
	return err
}

func decodeContext(w *wireContextDoc) (TraceContext, error) {
	var c TraceContext
	var err error
	if c.RequestID, err = nonEmpty("context.requestId", w.RequestID); err != nil {
		return c, err
	}
	if c.TraceID, err = nonEmpty("context.traceId", w.TraceID); err != nil {
		return c, err
	}
	if c.Traceparent, err = nonEmpty("context.traceparent", w.Traceparent); err != nil {
		return c, err
	}
	if w.Tracestate != nil {
		c.Tracestate = string(*w.Tracestate)
	}
	return c, nil
}

func fieldErr(field, reason string) error {
	return fmt.Errorf("field %s %s", field, reason)
}

func nonEmpty(field string, v *wireString) (string, error) {
	if v == nil || *v == "" {
		return "", fieldErr(field, "must be a non-empty string")
	}
	return string(*v), nil
}

func integer(field string, v *float64, lowest int) (int, error) {
	if v == nil || *v != math.Trunc(*v) || *v < float64(lowest) || *v > 1<<53 || *v > math.MaxInt {
		return 0, fieldErr(field, fmt.Sprintf("must be an integer >= %d", lowest))
	}
	return int(*v), nil
}

func timestamp(field string, v *wireString) (time.Time, error) {
	if v == nil {
		return time.Time{}, fieldErr(field, "must be an RFC 3339 timestamp")
	}
	t, err := time.Parse(time.RFC3339Nano, string(*v))
	if err != nil {
		return time.Time{}, fieldErr(field, fmt.Sprintf("must be an RFC 3339 timestamp, got %q", string(*v)))
	}
	if !inJSYears(t) {
		return time.Time{}, fieldErr(field, fmt.Sprintf("%q is outside the years 0000 to 9999 in UTC", string(*v)))
	}
	// JavaScript dates hold milliseconds; finer fractions (the Rust port
	// writes nanoseconds) are truncated as Date.parse truncates them.
	return t.UTC().Truncate(time.Millisecond), nil
}
