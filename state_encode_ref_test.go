package jobkeys

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"time"
	"unicode/utf8"
)

// The key state encoder as it was before appendState, appendTime and
// appendJSQuoted were rewritten for speed, kept unchanged (only renamed) as
// the reference the differential tests and FuzzEncodeStateDifferential
// compare the new encoder with: every time goes through time.AppendFormat
// and every string is scanned one byte at a time.

// refAppendJSString is the old appendJSString.
func refAppendJSString(dst []byte, s string) []byte {
	return refAppendJSQuoted(dst, s)
}

// refAppendTime is the old appendTime.
func refAppendTime(dst []byte, t time.Time) []byte {
	t = t.UTC()
	dst = append(dst, '"')
	year := t.Year()
	if year >= 0 && year <= 9999 {
		dst = t.AppendFormat(dst, jsTime)
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

// refAppendJSQuoted is the old appendJSQuoted.
func refAppendJSQuoted[S ~string | ~[]byte](dst []byte, s S) []byte {
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			dst = append(dst, s[start:i]...)
			switch c {
			case '"':
				dst = append(dst, '\\', '"')
			case '\\':
				dst = append(dst, '\\', '\\')
			case '\b':
				dst = append(dst, '\\', 'b')
			case '\f':
				dst = append(dst, '\\', 'f')
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			}
			i++
			start = i
			continue
		}
		n, kind := utf8Seq(s, i)
		switch kind {
		case seqValid:
			i += n
			continue
		case seqSurrogate:
			dst = append(dst, s[start:i]...)
			r := surrogateAt(s, i)
			if r < 0xDC00 && i+3 < len(s) {
				if m, k := utf8Seq(s, i+3); m == 3 && k == seqSurrogate {
					if r2 := surrogateAt(s, i+3); r2 >= 0xDC00 {
						dst = utf8.AppendRune(dst, 0x10000+(r-0xD800)<<10+(r2-0xDC00))
						i += 6
						start = i
						continue
					}
				}
			}
			dst = append(dst, '\\', 'u', hexDigits[r>>12], hexDigits[r>>8&0xf], hexDigits[r>>4&0xf], hexDigits[r&0xf])
		default:
			dst = append(dst, s[start:i]...)
			dst = append(dst, "\uFFFD"...)
		}
		i += n
		start = i
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}
