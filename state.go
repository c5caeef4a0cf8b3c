package jobkeys

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"time"

	"github.com/jobkeys/jobkeys/internal/jsjson"
)

// StateVersion is the only key state version this package reads and writes.
const StateVersion = 1

// TraceContext is the W3C trace context a job carries, stored with every
// queued entry and slot (wire member "context").
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
	// Context is the job's trace context. A slot written by the Rust port
	// may have none; it then reads as zero and is written back with a
	// context derived from the job id and slot token, since the TypeScript
	// original refuses a slot without one.
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
// queued jobs of one key of one job type of one service. [ParseState] reads
// it; the coordinator writes it.
//
// On the wire it is a JSON object shared with workers written in
// TypeScript: members in the order of the fields below, named as the
// fields are but in lower camel case ("jobType", "maxQueuedPerKey",
// "staleTakeoverCount"), strings escaped as JSON.stringify escapes them,
// and times written as toISOString writes them: UTC with milliseconds and
// "Z" ("2026-11-30T10:00:02.000Z"), and for years outside 0 to 9999 a sign
// and six digits ("+010000-01-01T00:00:00.000Z").
//
// KeyState has no JSON methods: json.Marshal writes its Go field names, not
// the wire format, and json.Unmarshal does not read the wire format as the
// TypeScript original does (it matches names case-insensitively). Read a
// state with ParseState.
type KeyState struct {
	Version            int          // always StateVersion
	Service            string       // the service (bucket JOBS_KEYS_<Service>)
	JobType            string       // the job type
	DisplayKey         string       // display key
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
//
// Every state a reducer returns is built in arrays of its own (clone or
// rebuilt), never in its input's: the input may be a state a key entry
// holds, whose arrays other states share (snapshotOver), and the returned
// state belongs to the caller, who may write to it.
func (s *KeyState) clone() *KeyState {
	c := *s
	c.Active = append(make([]ActiveSlot, 0, len(s.Active)+1), s.Active...)
	c.Queued = append(make([]QueuedJob, 0, len(s.Queued)+1), s.Queued...)
	return &c
}

// rebuilt returns a copy of s with empty (not nil) slices of room for
// active slots and queued jobs, none of them shared with s: a reducer that
// rebuilds the slices from s's fills them, so each element is copied once.
func (s *KeyState) rebuilt(active, queued int) *KeyState {
	c := *s
	c.Active = make([]ActiveSlot, 0, active)
	c.Queued = make([]QueuedJob, 0, queued)
	return &c
}

// ParseState decodes and validates a key state document, as a KV entry
// holds it. It reads what the TypeScript original and its Rust port write,
// with the TypeScript original's rules:
//
//   - member names match exactly (JSON.parse is case-sensitive: "ACTIVE" is
//     not "active") and the last of duplicate members counts; unknown
//     members are ignored;
//   - strings, numbers and integers as JSON.parse reads them (a leading byte
//     order mark is dropped, lone surrogate escapes are kept as WTF-8 so that
//     they are written back as they were read), integers up to 2^53;
//   - timestamps in RFC 3339, or with the expanded years toISOString writes
//     (see [KeyState] for how they are written);
//   - a slot's "context" may be missing or null (the Rust port leaves it out);
//     it reads as the zero [TraceContext].
//
// A document nested deeper than [MaxPayloadDepth] is refused (only an
// unknown member can be; the TypeScript original has no such limit).
//
// The error names the field that is wrong ("active[0]: field tries must be
// an integer from 0 to 2^53, not a string"); ParseState never returns both a
// state and an error.
func ParseState(data []byte) (*KeyState, error) {
	return decodeState(data)
}

// inJSYears reports whether t, in UTC, falls in the years 0000 to 9999,
// which toISOString writes in the four-digit form.
func inJSYears(t time.Time) bool {
	y := t.UTC().Year()
	return y >= 0 && y <= 9999
}

// appendContext appends c as the member value "context" of a slot or a
// queued job.
func appendContext(dst []byte, c TraceContext) []byte {
	dst = append(dst, `{"requestId":`...)
	dst = jsjson.AppendString(dst, c.RequestID)
	return appendContextRest(dst, c)
}

// appendContextRest appends what follows c's request id in appendContext.
func appendContextRest(dst []byte, c TraceContext) []byte {
	dst = append(dst, `,"traceId":`...)
	dst = jsjson.AppendString(dst, c.TraceID)
	dst = append(dst, `,"traceparent":`...)
	dst = jsjson.AppendString(dst, c.Traceparent)
	if c.Tracestate != "" {
		dst = append(dst, `,"tracestate":`...)
		dst = jsjson.AppendString(dst, c.Tracestate)
	}
	return append(dst, '}')
}

// appendState appends s in the wire format (see [KeyState]): the bytes the
// TypeScript original's JSON.stringify writes for the same state.
func appendState(dst []byte, s *KeyState) []byte {
	var tw jsjson.TimeWriter
	dst = append(dst, `{"version":1,"service":`...)
	dst = jsjson.AppendString(dst, s.Service)
	dst = append(dst, `,"jobType":`...)
	dst = jsjson.AppendString(dst, s.JobType)
	dst = append(dst, `,"key":`...)
	dst = jsjson.AppendString(dst, s.DisplayKey)
	dst = append(dst, `,"keyHash":`...)
	dst = jsjson.AppendString(dst, s.KeyHash)
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
		dst = jsjson.AppendString(dst, a.JobID)
		dst = append(dst, `,"slotToken":`...)
		dst = jsjson.AppendString(dst, a.SlotToken)
		dst = append(dst, `,"instanceId":`...)
		dst = jsjson.AppendString(dst, a.InstanceID)
		dst = append(dst, `,"startedAt":`...)
		dst = tw.Append(dst, a.StartedAt)
		dst = append(dst, `,"heartbeatAt":`...)
		dst = tw.Append(dst, a.HeartbeatAt)
		dst = append(dst, `,"leaseExpiresAt":`...)
		dst = tw.Append(dst, a.LeaseExpiresAt)
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
		dst = jsjson.AppendString(dst, q.JobID)
		dst = append(dst, `,"createdAt":`...)
		dst = tw.Append(dst, q.CreatedAt)
		dst = append(dst, `,"requestId":`...)
		start := len(dst)
		dst = jsjson.AppendString(dst, reqID)
		end := len(dst)
		dst = append(dst, `,"context":{"requestId":`...)
		if ctx.RequestID == reqID {
			// Mostly the same string: its text is copied.
			dst = append(dst, dst[start:end]...)
		} else {
			dst = jsjson.AppendString(dst, ctx.RequestID)
		}
		dst = appendContextRest(dst, ctx)
		dst = append(dst, '}')
	}
	dst = append(dst, `],"staleTakeoverCount":`...)
	dst = strconv.AppendInt(dst, int64(s.StaleTakeoverCount), 10)
	dst = append(dst, `,"updatedAt":`...)
	dst = tw.Append(dst, s.UpdatedAt)
	return append(dst, '}')
}

// wireContext returns c with every field the TypeScript original requires filled.
// Missing fields are derived deterministically from the job id and slot
// token (a trace id of their hash), so a slot the Rust port wrote without
// context, or a job admitted without one, still validates in the TypeScript original.
func wireContext(c TraceContext, jobID, salt string) TraceContext {
	if c.RequestID != "" && c.TraceID != "" && c.Traceparent != "" {
		return c // small enough to inline: the rest is in deriveContext
	}
	return deriveContext(c, jobID, salt)
}

// deriveContext is wireContext for a context missing a field.
func deriveContext(c TraceContext, jobID, salt string) TraceContext {
	if c.RequestID == "" {
		c.RequestID = jobID
	}
	if c.TraceID == "" || c.Traceparent == "" {
		// The hash of jobID, a NUL and salt, hashed from a buffer on the
		// stack when they fit in it.
		var in [128]byte
		sum := sha256.Sum256(append(append(append(in[:0], jobID...), 0), salt...))
		// "00-" + 32 hex digits of trace id + "-" + 16 of parent id + "-00"
		var tp [55]byte
		copy(tp[:], "00-")
		hex.Encode(tp[3:35], sum[:16])
		tp[35] = '-'
		hex.Encode(tp[36:52], sum[16:24])
		copy(tp[52:], "-00")
		switch {
		case c.Traceparent != "":
			c.TraceID = string(tp[3:35])
		case c.TraceID == "":
			// One string for both: the trace id is the traceparent's.
			c.Traceparent = string(tp[:])
			c.TraceID = c.Traceparent[3:35]
		default:
			c.Traceparent = "00-" + c.TraceID + string(tp[35:])
		}
	}
	return c
}
