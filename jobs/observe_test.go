package jobs

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/jobkeys/jobkeys/internal/natstest"
)

// collectJobMetrics returns the job store metrics reader has, by name.
func collectJobMetrics(t *testing.T, reader *sdkmetric.ManualReader) map[string]metricdata.Metrics {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(context.Background(), &rm))
	out := map[string]metricdata.Metrics{}
	for _, sm := range rm.ScopeMetrics {
		assert.Equal(t, MeterName, sm.Scope.Name)
		for _, m := range sm.Metrics {
			out[m.Name] = m
		}
	}
	return out
}

// jobPoints maps "transition/outcome[/error.type][@job.type]" to the
// counter's value or the histogram's count, and checks that no other
// attribute is used.
func jobPoints(t *testing.T, m metricdata.Metrics) map[string]int64 {
	t.Helper()
	out := map[string]int64{}
	name := func(set attribute.Set) string {
		for _, kv := range set.ToSlice() {
			assert.Contains(t, []attribute.Key{attrTransition, attrOutcome, attrErrorType, attrJobType}, kv.Key, "metric %s", m.Name)
		}
		tr, _ := set.Value(attrTransition)
		oc, _ := set.Value(attrOutcome)
		s := tr.AsString() + "/" + oc.AsString()
		if et, ok := set.Value(attrErrorType); ok {
			s += "/" + et.AsString()
		}
		if jt, ok := set.Value(attrJobType); ok {
			s += "@" + jt.AsString()
		}
		return s
	}
	switch d := m.Data.(type) {
	case metricdata.Sum[int64]:
		for _, p := range d.DataPoints {
			out[name(p.Attributes)] += p.Value
		}
	case metricdata.Histogram[float64]:
		for _, p := range d.DataPoints {
			out[name(p.Attributes)] += int64(p.Count)
		}
	default:
		t.Fatalf("metric %s: unexpected data %T", m.Name, m.Data)
	}
	return out
}

func TestStoreMetrics(t *testing.T) {
	t.Parallel()
	stores := map[string]func(t *testing.T, cfg *Config) Store{
		"memory": func(t *testing.T, cfg *Config) Store {
			st, err := NewMemoryStore(cfg)
			require.NoError(t, err)
			return st
		},
		"nats": func(t *testing.T, cfg *Config) Store {
			st, _ := newTestNATSStore(t, natstest.Run(t), cfg)
			return st
		},
	}
	for name, newStore := range stores {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			reader := sdkmetric.NewManualReader()
			mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
			t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
			st := newStore(t, &Config{MeterProvider: mp})

			// j1: enqueue, replay, conflicting replay, claim, renew, progress, settle.
			_, err := st.Enqueue(ctx, testEnqueueRequest("ch", "j1", "doc-1"))
			require.NoError(t, err)
			again, err := st.Enqueue(ctx, testEnqueueRequest("ch", "j1", "doc-1"))
			require.NoError(t, err)
			require.True(t, again.Repeated)
			other := testEnqueueRequest("ch", "j1", "doc-1")
			other.Fingerprint = "another"
			_, err = st.Enqueue(ctx, other)
			require.ErrorIs(t, err, ErrConflict)
			claimed, err := st.Claim(ctx, ClaimRequest{ChannelID: "ch", Owner: "w", Count: 10, TTL: time.Hour})
			require.NoError(t, err)
			require.Len(t, claimed, 1)
			none, err := st.Claim(ctx, ClaimRequest{ChannelID: "ch", Owner: "w", Count: 10, TTL: time.Hour})
			require.NoError(t, err)
			require.Empty(t, none)
			c := ClaimOf(claimed[0])
			_, err = st.Renew(ctx, RenewRequest{Claim: c, ExpectedRevision: claimed[0].Revision, TTL: 2 * time.Hour})
			require.NoError(t, err)
			_, err = st.AppendProgress(ctx, ProgressRequest{Claim: c, Stage: "render", Label: "page 1", State: ProgressStarted})
			require.NoError(t, err)
			_, err = st.Settle(ctx, SettleRequest{Claim: c})
			require.NoError(t, err)
			_, err = st.Settle(ctx, SettleRequest{Claim: c})
			require.ErrorIs(t, err, ErrConflict)

			// j2 and j3: claimed together, one requeued, one failed.
			for _, id := range []string{"j2", "j3"} {
				_, err = st.Enqueue(ctx, testEnqueueRequest("ch", id, "doc-"+id))
				require.NoError(t, err)
			}
			claimed, err = st.Claim(ctx, ClaimRequest{ChannelID: "ch", Owner: "w", Count: 10, TTL: time.Hour})
			require.NoError(t, err)
			require.Len(t, claimed, 2)
			_, err = st.Requeue(ctx, RequeueRequest{Claim: ClaimOf(claimed[0]), Reason: "retry", CountFailure: true})
			require.NoError(t, err)
			_, err = st.Fail(ctx, FailRequest{Claim: ClaimOf(claimed[1]), Reason: "broken"})
			require.NoError(t, err)

			// j4: pause, resume, cancel; j5: supersede; a job that is not there.
			e4, err := st.Enqueue(ctx, testEnqueueRequest("ch", "j4", "doc-4"))
			require.NoError(t, err)
			p, err := st.Pause(ctx, PauseRequest{ChannelID: "ch", JobID: "j4", ExpectedRevision: e4.Job.Revision, Reason: "hold"})
			require.NoError(t, err)
			_, err = st.Resume(ctx, ResumeRequest{ChannelID: "ch", JobID: "j4", ExpectedRevision: p.Revision})
			require.NoError(t, err)
			_, err = st.Cancel(ctx, CancelRequest{ChannelID: "ch", JobID: "j4"})
			require.NoError(t, err)
			e5, err := st.Enqueue(ctx, testEnqueueRequest("ch", "j5", "doc-5"))
			require.NoError(t, err)
			_, err = st.Supersede(ctx, SupersedeRequest{ChannelID: "ch", JobID: "j5", ExpectedRevision: e5.Job.Revision, Reason: "stale"})
			require.NoError(t, err)
			_, err = st.Cancel(ctx, CancelRequest{ChannelID: "ch", JobID: "missing"})
			require.ErrorIs(t, err, ErrNotFound)
			// Reads are not transitions.
			_, err = st.Get(ctx, "ch", "j1")
			require.NoError(t, err)

			ms := collectJobMetrics(t, reader)
			require.Contains(t, ms, "jobkeys.jobs.transitions")
			require.Contains(t, ms, "jobkeys.jobs.duration")
			assert.Equal(t, "{job}", ms["jobkeys.jobs.transitions"].Unit)
			assert.Equal(t, "s", ms["jobkeys.jobs.duration"].Unit)
			assert.Equal(t, map[string]int64{
				"enqueue/ok@render":             5,
				"enqueue/repeated@render":       1,
				"enqueue/error/conflict@render": 1, // the request's type
				"claim/ok@render":               3, // jobs claimed: j1, then j2 and j3
				"renew/ok@render":               1,
				"progress/ok@render":            1,
				"settle/ok@render":              1,
				"settle/error/conflict":         1,
				"requeue/ok@render":             1,
				"fail/ok@render":                1,
				"pause/ok@render":               1,
				"resume/ok@render":              1,
				"cancel/ok@render":              1,
				"cancel/error/not_found":        1,
				"supersede/ok@render":           1,
			}, jobPoints(t, ms["jobkeys.jobs.transitions"]))
			assert.Equal(t, map[string]int64{
				"enqueue/ok@render":             5,
				"enqueue/repeated@render":       1,
				"enqueue/error/conflict@render": 1,
				"claim/ok@render":               2, // calls
				"claim/empty":                   1,
				"renew/ok@render":               1,
				"progress/ok@render":            1,
				"settle/ok@render":              1,
				"settle/error/conflict":         1,
				"requeue/ok@render":             1,
				"fail/ok@render":                1,
				"pause/ok@render":               1,
				"resume/ok@render":              1,
				"cancel/ok@render":              1,
				"cancel/error/not_found":        1,
				"supersede/ok@render":           1,
			}, jobPoints(t, ms["jobkeys.jobs.duration"]))
		})
	}
}

// gaugePoints maps each job type to a gauge's value, and checks that the
// job type is its only attribute.
func gaugePoints(t *testing.T, ms map[string]metricdata.Metrics, name string) map[string]int64 {
	t.Helper()
	out := map[string]int64{}
	m, ok := ms[name]
	if !ok {
		return out
	}
	assert.Equal(t, "{job}", m.Unit)
	g, ok := m.Data.(metricdata.Gauge[int64])
	require.True(t, ok, "%s is %T", name, m.Data)
	for _, p := range g.DataPoints {
		require.Equal(t, 1, p.Attributes.Len(), "%s: attributes %v", name, p.Attributes.ToSlice())
		typ, ok := p.Attributes.Value(attrJobType)
		require.True(t, ok, "%s: no job.type", name)
		out[typ.AsString()] = p.Value
	}
	return out
}

// TestStoreMetricsByType: a claim of jobs of two types counts each type;
// the gauges report the pending and running jobs of each type across
// channels, and leave out finished ones.
func TestStoreMetricsByType(t *testing.T) {
	t.Parallel()
	s := natstest.Run(t)
	stores := map[string]func(t *testing.T, cfg *Config) Store{
		"memory": func(t *testing.T, cfg *Config) Store {
			st, err := NewMemoryStore(cfg)
			require.NoError(t, err)
			return st
		},
		"nats": func(t *testing.T, cfg *Config) Store {
			st, _ := newTestNATSStore(t, s, cfg)
			t.Cleanup(func() { _ = st.Close(context.Background()) })
			return st
		},
	}
	for name, newStore := range stores {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			reader := sdkmetric.NewManualReader()
			mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
			t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
			st := newStore(t, &Config{MeterProvider: mp})
			enqueue := func(ch, id, typ string) {
				r := testEnqueueRequest(ch, id, id)
				r.Type = typ
				_, err := st.Enqueue(ctx, r)
				require.NoError(t, err)
			}
			enqueue("a", "r1", "render")
			enqueue("a", "m1", "mail")
			enqueue("b", "r2", "render")
			enqueue("b", "m2", "mail")
			enqueue("b", "m3", "mail")
			claimed, err := st.Claim(ctx, ClaimRequest{ChannelID: "a", Owner: "w", Count: 10, TTL: time.Hour})
			require.NoError(t, err)
			require.Len(t, claimed, 2)
			enqueue("a", "d1", "render")
			done, err := st.Claim(ctx, ClaimRequest{ChannelID: "a", Owner: "w", Count: 1, TTL: time.Hour})
			require.NoError(t, err)
			require.Len(t, done, 1)
			_, err = st.Settle(ctx, SettleRequest{Claim: ClaimOf(done[0])})
			require.NoError(t, err)

			ms := collectJobMetrics(t, reader)
			tr := jobPoints(t, ms["jobkeys.jobs.transitions"])
			assert.Equal(t, int64(2), tr["claim/ok@render"], "claims of render jobs: r1 (claimed with m1) and d1")
			assert.Equal(t, int64(1), tr["claim/ok@mail"], "the claim of m1, counted under its own type")
			assert.Equal(t, int64(1), jobPoints(t, ms["jobkeys.jobs.duration"])["claim/ok"], "a claim of two types: its duration carries no type")
			assert.Equal(t, map[string]int64{"render": 1, "mail": 2}, gaugePoints(t, ms, "jobkeys.jobs.pending"))
			assert.Equal(t, map[string]int64{"render": 1, "mail": 1}, gaugePoints(t, ms, "jobkeys.jobs.running"))
		})
	}
}

// logRecords is a slog.Handler that keeps every record.
type logRecords struct {
	mu      sync.Mutex
	records []slog.Record
}

func (h *logRecords) Enabled(context.Context, slog.Level) bool { return true }
func (h *logRecords) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *logRecords) WithGroup(string) slog.Handler            { return h }
func (h *logRecords) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	h.records = append(h.records, r.Clone())
	h.mu.Unlock()
	return nil
}

func TestStoreLogsCorruptRecord(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var h logRecords
	st, js := newTestNATSStore(t, natstest.Run(t), &Config{Logger: slog.New(&h)})
	_, err := st.Enqueue(ctx, testEnqueueRequest("ch", "job-1", "doc"))
	require.NoError(t, err)
	kv, err := js.KeyValue(ctx, st.Bucket())
	require.NoError(t, err)
	key := st.keys.job("ch", "job-1")
	_, err = kv.Put(ctx, key, []byte(`{"v":1,`))
	require.NoError(t, err)
	_, err = st.Cancel(ctx, CancelRequest{ChannelID: "ch", JobID: "job-1"})
	require.ErrorIs(t, err, ErrCorrupt)
	_, err = st.Cancel(ctx, CancelRequest{ChannelID: "ch", JobID: "missing"})
	require.ErrorIs(t, err, ErrNotFound) // not logged: the caller's to handle

	h.mu.Lock()
	defer h.mu.Unlock()
	require.Len(t, h.records, 1)
	r := h.records[0]
	assert.Equal(t, slog.LevelError, r.Level)
	assert.Equal(t, "jobs: corrupt job record left as it is", r.Message)
	attrs := map[string]string{}
	r.Attrs(func(a slog.Attr) bool { attrs[a.Key] = a.Value.String(); return true })
	assert.Equal(t, "cancel", attrs["transition"])
	assert.Contains(t, attrs["error"], key)
	assert.Contains(t, attrs["error"], `"job-1"`)
	assert.NotContains(t, attrs["error"], `{"n":1}`, "no input in logs")
}

func TestStoreObserverSilentByDefault(t *testing.T) {
	t.Parallel()
	st, err := NewMemoryStore(&Config{})
	require.NoError(t, err)
	assert.Nil(t, st.cfg.obs)
	var zero MemoryStore
	_, err = zero.Enqueue(context.Background(), testEnqueueRequest("ch", "j", "t")) // zero value still works
	require.NoError(t, err)
}
