package jobkeys

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"time"

	"github.com/jobkeys/jobkeys/internal/jsjson"
)

// The key state encoder as it was before appendState was rewritten for
// speed, kept unchanged (only renamed) as the reference the differential
// tests and FuzzEncodeStateDifferential compare the new encoder with: each
// member written on its own, every time with a writer of its own.

// refAppendJSString writes a string as the old encoder did. The old string
// and time writers are internal/jsjson's references now
// (TestAppendStringMatchesReference, TestAppendTimeMatchesReference); here
// they are jsjson's, each time written by a TimeWriter of its own.
func refAppendJSString(dst []byte, s string) []byte {
	return jsjson.AppendString(dst, s)
}

// refAppendTime writes a time as the old encoder did; see refAppendJSString.
func refAppendTime(dst []byte, t time.Time) []byte {
	return new(jsjson.TimeWriter).Append(dst, t)
}

// refAppendContext is the old appendContext.
func refAppendContext(dst []byte, c TraceContext) []byte {
	dst = append(dst, `{"requestId":`...)
	dst = refAppendJSString(dst, c.RequestID)
	dst = append(dst, `,"traceId":`...)
	dst = refAppendJSString(dst, c.TraceID)
	dst = append(dst, `,"traceparent":`...)
	dst = refAppendJSString(dst, c.Traceparent)
	if c.Tracestate != "" {
		dst = append(dst, `,"tracestate":`...)
		dst = refAppendJSString(dst, c.Tracestate)
	}
	return append(dst, '}')
}

// refAppendState is the old appendState.
func refAppendState(dst []byte, s *KeyState) []byte {
	dst = append(dst, `{"version":1,"service":`...)
	dst = refAppendJSString(dst, s.Service)
	dst = append(dst, `,"jobType":`...)
	dst = refAppendJSString(dst, s.JobType)
	dst = append(dst, `,"key":`...)
	dst = refAppendJSString(dst, s.DisplayKey)
	dst = append(dst, `,"keyHash":`...)
	dst = refAppendJSString(dst, s.KeyHash)
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
		dst = refAppendJSString(dst, a.JobID)
		dst = append(dst, `,"slotToken":`...)
		dst = refAppendJSString(dst, a.SlotToken)
		dst = append(dst, `,"instanceId":`...)
		dst = refAppendJSString(dst, a.InstanceID)
		dst = append(dst, `,"startedAt":`...)
		dst = refAppendTime(dst, a.StartedAt)
		dst = append(dst, `,"heartbeatAt":`...)
		dst = refAppendTime(dst, a.HeartbeatAt)
		dst = append(dst, `,"leaseExpiresAt":`...)
		dst = refAppendTime(dst, a.LeaseExpiresAt)
		dst = append(dst, `,"tries":`...)
		dst = strconv.AppendInt(dst, int64(a.Tries), 10)
		dst = append(dst, `,"context":`...)
		dst = refAppendContext(dst, refWireContext(a.Context, a.JobID, a.SlotToken))
		dst = append(dst, '}')
	}
	dst = append(dst, `],"queued":[`...)
	for i := range s.Queued {
		q := &s.Queued[i]
		if i > 0 {
			dst = append(dst, ',')
		}
		ctx := refWireContext(q.Context, q.JobID, "")
		reqID := q.RequestID
		if reqID == "" {
			reqID = ctx.RequestID
		}
		dst = append(dst, `{"jobId":`...)
		dst = refAppendJSString(dst, q.JobID)
		dst = append(dst, `,"createdAt":`...)
		dst = refAppendTime(dst, q.CreatedAt)
		dst = append(dst, `,"requestId":`...)
		dst = refAppendJSString(dst, reqID)
		dst = append(dst, `,"context":`...)
		dst = refAppendContext(dst, ctx)
		dst = append(dst, '}')
	}
	dst = append(dst, `],"staleTakeoverCount":`...)
	dst = strconv.AppendInt(dst, int64(s.StaleTakeoverCount), 10)
	dst = append(dst, `,"updatedAt":`...)
	dst = refAppendTime(dst, s.UpdatedAt)
	return append(dst, '}')
}

// refWireContext is wireContext as it was when the encoder was rewritten.
func refWireContext(c TraceContext, jobID, salt string) TraceContext {
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
