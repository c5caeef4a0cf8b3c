package jobkeys

import (
	"context"

	"go.opentelemetry.io/otel/trace"
)

// spanTraceContext returns tc, filled from the span in ctx (the caller's
// OpenTelemetry span, local or remote) when tc names no trace of its own:
// the trace id, a W3C traceparent ("00-<trace id>-<span id>-<flags>") and
// the tracestate. The request id is left as tc has it (empty: the job id).
// Without a valid span, or when tc has a TraceID or Traceparent, tc is
// returned as it is, and the fields still missing are derived from the job
// id when written.
func spanTraceContext(ctx context.Context, tc TraceContext) TraceContext {
	if tc.TraceID != "" || tc.Traceparent != "" {
		return tc
	}
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsValid() {
		return tc
	}
	traceID, spanID := sc.TraceID(), sc.SpanID()
	var b [55]byte // 00-<32 hex>-<16 hex>-<2 hex>
	const hexDigits = "0123456789abcdef"
	n := copy(b[:], "00-")
	for _, c := range traceID {
		b[n], b[n+1] = hexDigits[c>>4], hexDigits[c&0xf]
		n += 2
	}
	b[n] = '-'
	n++
	for _, c := range spanID {
		b[n], b[n+1] = hexDigits[c>>4], hexDigits[c&0xf]
		n += 2
	}
	b[n] = '-'
	n++
	f := byte(sc.TraceFlags())
	b[n], b[n+1] = hexDigits[f>>4], hexDigits[f&0xf]
	tc.Traceparent = string(b[:])
	tc.TraceID = tc.Traceparent[3:35]
	if tc.Tracestate == "" {
		tc.Tracestate = sc.TraceState().String()
	}
	return tc
}
