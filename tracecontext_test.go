package jobkeys

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/trace"
)

// callerSpan returns ctx carrying a sampled remote span context with a
// tracestate, as a propagator leaves it for a request handler.
func callerSpan(t *testing.T, ctx context.Context) (context.Context, trace.SpanContext) {
	t.Helper()
	tid, err := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	require.NoError(t, err)
	sid, err := trace.SpanIDFromHex("00f067aa0ba902b7")
	require.NoError(t, err)
	ts, err := trace.ParseTraceState("rojo=00f067aa0ba902b7,congo=t61rcWkgMzE")
	require.NoError(t, err)
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled, TraceState: ts, Remote: true})
	require.True(t, sc.IsValid())
	return trace.ContextWithRemoteSpanContext(ctx, sc), sc
}

func TestTraceContextFromCallerSpan(t *testing.T) {
	t.Parallel()
	for name, newStore := range observeStores(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			store, _ := newStore(t)
			coord, err := NewCoordinator(store, nil)
			require.NoError(t, err)
			jt, err := coord.JobType("trace"+name, "t", Policy{Key: []string{"/k"}, MaxQueuedPerKey: 4})
			require.NoError(t, err)
			ctx, _ := callerSpan(t, context.Background())
			want := TraceContext{
				RequestID:   "j1",
				TraceID:     "4bf92f3577b34da6a3ce929d0e0e4736",
				Traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
				Tracestate:  "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE",
			}

			adm, err := jt.Admit(ctx, "j1", []byte(`{"k":"a"}`))
			require.NoError(t, err)
			require.Equal(t, KindAccepted, adm.Kind)
			require.Len(t, adm.State.Queued, 1)
			assert.Equal(t, want, adm.State.Queued[0].Context)

			acq, err := jt.Acquire(ctx, "j1", []byte(`{"k":"a"}`))
			require.NoError(t, err)
			require.Equal(t, KindAcquired, acq.Kind)
			require.Len(t, acq.State.Active, 1)
			assert.Equal(t, want, acq.State.Active[0].Context)

			// What was written reads back the same (the wire format).
			key, err := jt.Key([]byte(`{"k":"a"}`))
			require.NoError(t, err)
			in, err := coord.Inspect(context.Background(), jt.Service(), key.KVKey)
			require.NoError(t, err)
			require.NotNil(t, in.State)
			assert.Equal(t, want, in.State.Active[0].Context)

			// The request-struct API does the same.
			adm, err = coord.Admit(ctx, AdmitRequest{Service: jt.Service(), JobType: jt.Name(), JobID: "j2", Payload: []byte(`{"k":"b"}`), Policy: jt.Policy()})
			require.NoError(t, err)
			want.RequestID = "j2"
			assert.Equal(t, want, adm.State.Queued[0].Context)
		})
	}
}

func TestTraceContextWithoutSpanIsDerivedFromJobID(t *testing.T) {
	t.Parallel()
	coord, err := NewCoordinator(NewMemoryStore(), nil)
	require.NoError(t, err)
	jt, err := coord.JobType("tracenone", "t", Policy{Key: []string{"/k"}, MaxQueuedPerKey: 4})
	require.NoError(t, err)

	// No span; and a span context that is not valid counts as none.
	invalid := trace.ContextWithSpanContext(context.Background(), trace.SpanContext{})
	for i, ctx := range []context.Context{context.Background(), invalid} {
		adm, err := jt.Admit(ctx, "job-x", []byte(`{"k":"`+string(rune('a'+i))+`"}`))
		require.NoError(t, err)
		got := adm.State.Queued[0].Context
		assert.Equal(t, wireContext(TraceContext{}, "job-x", ""), got, "derived from the job id as before")
		assert.Equal(t, "job-x", got.RequestID)
		assert.Len(t, got.TraceID, 32)
		assert.Equal(t, "00-"+got.TraceID+"-", got.Traceparent[:36])
		assert.Empty(t, got.Tracestate)
	}
}

func TestTraceContextExplicitWinsOverSpan(t *testing.T) {
	t.Parallel()
	coord, err := NewCoordinator(NewMemoryStore(), nil)
	require.NoError(t, err)
	jt, err := coord.JobType("traceexplicit", "t", Policy{Key: []string{"/k"}, MaxQueuedPerKey: 4})
	require.NoError(t, err)
	ctx, _ := callerSpan(t, context.Background())
	explicit := TraceContext{RequestID: "req-1", TraceID: "0af7651916cd43dd8448eb211c80319c", Traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
	adm, err := jt.Admit(ctx, "j1", []byte(`{"k":"a"}`), WithTraceContext(explicit))
	require.NoError(t, err)
	assert.Equal(t, explicit, adm.State.Queued[0].Context)

	// A context with only a request id takes the trace from the span.
	adm, err = jt.Admit(ctx, "j2", []byte(`{"k":"a"}`), WithTraceContext(TraceContext{RequestID: "req-2"}))
	require.NoError(t, err)
	got := adm.State.Queued[1].Context
	assert.Equal(t, "req-2", got.RequestID)
	assert.Equal(t, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", got.Traceparent)
}

func TestSpanTraceContextFlags(t *testing.T) {
	t.Parallel()
	tid, err := trace.TraceIDFromHex("0af7651916cd43dd8448eb211c80319c")
	require.NoError(t, err)
	sid, err := trace.SpanIDFromHex("b7ad6b7169203331")
	require.NoError(t, err)
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid}) // not sampled, no state
	got := spanTraceContext(trace.ContextWithSpanContext(context.Background(), sc), TraceContext{})
	assert.Equal(t, TraceContext{TraceID: "0af7651916cd43dd8448eb211c80319c", Traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"}, got)
}
