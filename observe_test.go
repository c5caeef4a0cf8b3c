package jobkeys

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/jobkeys/jobkeys/internal/natstest"
)

// metricsReader is a MeterProvider with an in-memory reader.
type metricsReader struct {
	t      *testing.T
	reader *sdkmetric.ManualReader
	mp     *sdkmetric.MeterProvider
}

func newMetricsReader(t *testing.T) *metricsReader {
	t.Helper()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	return &metricsReader{t: t, reader: reader, mp: mp}
}

// collect returns the metrics of the key layer's meter by name.
func (r *metricsReader) collect() map[string]metricdata.Metrics {
	r.t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(r.t, r.reader.Collect(context.Background(), &rm))
	out := map[string]metricdata.Metrics{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			out[m.Name] = m
		}
	}
	return out
}

// allowedKeyAttrs are the only attribute keys the key layer may use.
var allowedKeyAttrs = []attribute.Key{attrOperation, attrOutcome, attrService, attrJobType, attrReason, attrSlot, attrErrorType}

// pointsOf returns the data points of m as (attribute set, value) pairs;
// for a histogram the value is its count.
func pointsOf(t *testing.T, m metricdata.Metrics) map[attribute.Distinct]struct {
	set   attribute.Set
	value int64
} {
	t.Helper()
	out := map[attribute.Distinct]struct {
		set   attribute.Set
		value int64
	}{}
	add := func(set attribute.Set, v int64) {
		for _, kv := range set.ToSlice() {
			assert.Contains(t, allowedKeyAttrs, kv.Key, "metric %s has attribute %s", m.Name, kv.Key)
		}
		p := out[set.Equivalent()]
		p.set, p.value = set, p.value+v
		out[set.Equivalent()] = p
	}
	switch d := m.Data.(type) {
	case metricdata.Sum[int64]:
		for _, p := range d.DataPoints {
			add(p.Attributes, p.Value)
		}
	case metricdata.Histogram[float64]:
		for _, p := range d.DataPoints {
			add(p.Attributes, int64(p.Count))
		}
	default:
		t.Fatalf("metric %s: unexpected data %T", m.Name, m.Data)
	}
	return out
}

// valueWhere sums the points of metric name whose attributes include want.
func valueWhere(t *testing.T, ms map[string]metricdata.Metrics, name string, want ...attribute.KeyValue) int64 {
	t.Helper()
	m, ok := ms[name]
	if !ok {
		return 0
	}
	var sum int64
	for _, p := range pointsOf(t, m) {
		match := true
		for _, kv := range want {
			if v, ok := p.set.Value(kv.Key); !ok || v != kv.Value {
				match = false
			}
		}
		if match {
			sum += p.value
		}
	}
	return sum
}

// observeStores are the stores the observation tests run on: memory, and
// NATS on an embedded server. open returns a second store over the same
// data (another process).
func observeStores(t *testing.T) map[string]func(t *testing.T) (Store, func() Store) {
	return map[string]func(t *testing.T) (Store, func() Store){
		"memory": func(t *testing.T) (Store, func() Store) {
			m := NewMemoryStore()
			return m, func() Store { return m }
		},
		"nats": func(t *testing.T) (Store, func() Store) {
			s := natstest.Run(t)
			open := func() Store {
				_, js := natstest.Connect(t, s)
				st, err := NewNATSStore(js, WithCreateBuckets(jetstream.MemoryStorage, 1))
				require.NoError(t, err)
				return st
			}
			return open(), open
		},
	}
}

func TestMetricsKeyWorkload(t *testing.T) {
	t.Parallel()
	for name, newStore := range observeStores(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			store, openOther := newStore(t)
			mr := newMetricsReader(t)
			coord, err := NewCoordinator(store, &Config{MeterProvider: mr.mp})
			require.NoError(t, err)
			service := "obs" + name
			jt, err := coord.JobType(service, "render", Policy{Key: []string{"/doc"}, MaxActive: 1, MaxQueuedPerKey: 1})
			require.NoError(t, err)
			doc := func(d string) []byte { return []byte(`{"doc":"` + d + `"}`) }

			// Queue limit is MaxQueuedPerKey + free slots: two fit, the third is rejected.
			for i, want := range []Kind{KindAccepted, KindAccepted, KindRejected} {
				adm, err := jt.Admit(ctx, fmt.Sprintf("j%d", i+1), doc("a"))
				require.NoError(t, err)
				require.Equal(t, want, adm.Kind)
			}
			acq, err := jt.Acquire(ctx, "j1", doc("a"))
			require.NoError(t, err)
			require.Equal(t, KindAcquired, acq.Kind)
			blocked, err := jt.Acquire(ctx, "j2", doc("a"))
			require.NoError(t, err)
			require.Equal(t, KindBlocked, blocked.Kind)
			ren, err := jt.Renew(ctx, acq.Lease)
			require.NoError(t, err)
			require.Equal(t, KindRenewed, ren.Kind)
			rel, err := jt.Release(ctx, acq.Lease)
			require.NoError(t, err)
			require.Equal(t, KindReleased, rel.Kind)
			_, err = jt.Admit(ctx, "", doc("a"))
			require.ErrorIs(t, err, ErrInvalidRequest) // refused before any operation: not counted

			// A conflict: another coordinator (another process) writes key
			// "b" behind this one's back, so this one's write on the state
			// it remembers fails its compare-and-swap once.
			_, err = jt.Admit(ctx, "b1", doc("b"))
			require.NoError(t, err)
			other, err := NewCoordinator(openOther(), nil)
			require.NoError(t, err)
			ojt, err := other.JobType(service, "render", jt.Policy())
			require.NoError(t, err)
			_, err = ojt.Admit(ctx, "b2", doc("b"))
			require.NoError(t, err)
			adm, err := jt.Admit(ctx, "b3", doc("b"))
			require.NoError(t, err)
			require.Equal(t, KindRejected, adm.Kind) // b1 and b2 fill it

			// A Runner: the running gauge is 1 while the handler runs.
			runner, err := NewRunner(jt, nil)
			require.NoError(t, err)
			var runningInside int64
			_, err = runner.Run(ctx, "j2", doc("a"), func(context.Context, Lease) error {
				runningInside = valueWhere(t, mr.collect(), "jobkeys.runner.running")
				return nil
			})
			require.NoError(t, err)
			_, err = runner.TryRun(ctx, "never-admitted", doc("c"), func(context.Context, Lease) error { return nil })
			require.ErrorIs(t, err, ErrBlocked)

			ms := mr.collect()
			svc, typ := attrService.String(service), attrJobType.String("render")
			op := func(o string, outcome string) int64 {
				return valueWhere(t, ms, "jobkeys.key.operations", svc, typ, attrOperation.String(o), attrOutcome.String(outcome))
			}
			assert.Equal(t, int64(3), op(metricOpAdmit, string(KindAccepted)))   // j1, j2, b1
			assert.Equal(t, int64(2), op(metricOpAdmit, string(KindRejected)))   // j3, b3
			assert.Equal(t, int64(2), op(metricOpAcquire, string(KindAcquired))) // j1, j2 (Runner)
			assert.Equal(t, int64(2), op(metricOpAcquire, string(KindBlocked)))  // j2, never-admitted
			assert.Equal(t, int64(1), op(metricOpRenew, string(KindRenewed)))
			assert.Equal(t, int64(2), op(metricOpRelease, string(KindReleased))) // j1, j2 (Runner)
			assert.Equal(t, int64(12), valueWhere(t, ms, "jobkeys.key.operations"), "every counted operation")
			assert.Equal(t, int64(12), valueWhere(t, ms, "jobkeys.key.operation.duration"), "one latency per operation")
			assert.Equal(t, int64(2), valueWhere(t, ms, "jobkeys.key.operation.duration", attrOperation.String(metricOpAcquire), attrOutcome.String(string(KindBlocked))))
			assert.Equal(t, int64(1), valueWhere(t, ms, "jobkeys.key.cas.conflicts", svc, typ))
			assert.Equal(t, int64(0), valueWhere(t, ms, "jobkeys.key.cas.exhausted"))
			assert.Equal(t, int64(1), runningInside)
			assert.Equal(t, int64(0), valueWhere(t, ms, "jobkeys.runner.running", svc, typ))
			assert.Equal(t, int64(1), valueWhere(t, ms, "jobkeys.runner.blocked", svc, typ, attrReason.String(string(ReasonNotQueued))))
			assert.Contains(t, ms, "jobkeys.runner.running")
			assert.Equal(t, "{operation}", ms["jobkeys.key.operations"].Unit)
			assert.Equal(t, "s", ms["jobkeys.key.operation.duration"].Unit)
		})
	}
}

// TestMetricsContentionAndErrors covers the error outcomes: exhausted
// retries (ErrContention) and corrupt state, by error.type.
func TestMetricsContentionAndErrors(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	mem := NewMemoryStore()
	store, faults := newConflictingStore(mem)
	mr := newMetricsReader(t)
	coord, err := NewCoordinator(store, &Config{MeterProvider: mr.mp, MaxAttempts: 3, RetryBackoff: time.Microsecond, MaxRetryBackoff: time.Microsecond})
	require.NoError(t, err)
	jt, err := coord.JobType("obserr", "t", Policy{Key: []string{"/k"}, MaxQueuedPerKey: 5})
	require.NoError(t, err)
	_, err = jt.Admit(ctx, "j1", []byte(`{"k":"a"}`))
	require.NoError(t, err)
	faults.conflicts.Store(true)
	_, err = jt.Admit(ctx, "j2", []byte(`{"k":"a"}`))
	require.ErrorIs(t, err, ErrContention)
	faults.conflicts.Store(false)
	// The first attempt on the remembered state, then three lost races.
	assert.Equal(t, int64(4), valueWhere(t, mr.collect(), "jobkeys.key.cas.conflicts"))

	key, err := jt.Key([]byte(`{"k":"bad"}`))
	require.NoError(t, err)
	_, err = mem.Create(ctx, key.Service, key.KVKey, []byte(`{"version":1,`))
	require.NoError(t, err)
	_, err = jt.Admit(ctx, "j3", []byte(`{"k":"bad"}`))
	require.ErrorIs(t, err, ErrCorruptState)

	ms := mr.collect()
	admitErr := func(class string) int64 {
		return valueWhere(t, ms, "jobkeys.key.operations", attrOperation.String(metricOpAdmit), attrOutcome.String(outcomeError), attrErrorType.String(class))
	}
	assert.Equal(t, int64(1), admitErr("contention"))
	assert.Equal(t, int64(1), admitErr("corrupt_state"))
	assert.Equal(t, int64(1), valueWhere(t, ms, "jobkeys.key.cas.exhausted", attrOperation.String(metricOpAdmit)))
	assert.Equal(t, int64(3), valueWhere(t, ms, "jobkeys.key.operations", attrOperation.String(metricOpAdmit)))
}

// writeFaults fails writes: every Create and Update with a revision
// conflict while conflicts is set, as a store with a faster writer would;
// and while failures > 0, Update with an error that is not a conflict.
type writeFaults struct {
	conflicts atomic.Bool
	failures  atomic.Int64
}

// newConflictingStore returns a store over mem (passing every capability
// through) whose writes fail as the returned writeFaults says.
func newConflictingStore(mem *MemoryStore) (*hookStore, *writeFaults) {
	f := &writeFaults{}
	return newHookStore(mem, passAll).withHook(f.hook), f
}

func (f *writeFaults) hook(_ context.Context, c storeCall, call func() storeResult) storeResult {
	if c.op != opCreate && c.op != opUpdate {
		return call()
	}
	if f.conflicts.Load() {
		return storeResult{err: ErrRevisionConflict}
	}
	if c.op == opUpdate {
		for n := f.failures.Load(); n > 0; n = f.failures.Load() {
			if f.failures.CompareAndSwap(n, n-1) {
				return storeResult{err: errors.New("store unavailable (test)")}
			}
		}
	}
	return call()
}

// capturedRecord is a log record as a handler saw it.
type capturedRecord struct {
	Level   slog.Level
	Message string
	Attrs   map[string]any
}

// captureHandler is a slog.Handler that keeps every record.
type captureHandler struct {
	mu      sync.Mutex
	records []capturedRecord
}

func (h *captureHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *captureHandler) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *captureHandler) WithGroup(string) slog.Handler            { return h }
func (h *captureHandler) Handle(_ context.Context, r slog.Record) error {
	rec := capturedRecord{Level: r.Level, Message: r.Message, Attrs: map[string]any{}}
	r.Attrs(func(a slog.Attr) bool {
		rec.Attrs[a.Key] = a.Value.Resolve().Any()
		return true
	})
	h.mu.Lock()
	h.records = append(h.records, rec)
	h.mu.Unlock()
	return nil
}

// find returns the records whose message is msg.
func (h *captureHandler) find(msg string) []capturedRecord {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []capturedRecord
	for _, r := range h.records {
		if r.Message == msg {
			out = append(out, r)
		}
	}
	return out
}

func TestLogsStaleTakeoverAndCorruptState(t *testing.T) {
	t.Parallel()
	for name, newStore := range observeStores(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			store, _ := newStore(t)
			var h captureHandler
			var clock atomic.Int64
			clock.Store(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
			coord, err := NewCoordinator(store, &Config{Logger: slog.New(&h), IgnoreClockSkew: true, Now: func() time.Time { return time.Unix(0, clock.Load()) }})
			require.NoError(t, err)
			service := "logs" + name
			jt, err := coord.JobType(service, "t", Policy{Key: []string{"/k"}, MaxQueuedPerKey: 1, HeartbeatInterval: time.Second, HeartbeatTTL: 2 * time.Second})
			require.NoError(t, err)
			payload := []byte(`{"k":"a"}`)
			for _, id := range []string{"j1", "j2"} {
				_, err = jt.Admit(ctx, id, payload)
				require.NoError(t, err)
			}
			_, err = jt.Acquire(ctx, "j1", payload)
			require.NoError(t, err)
			assert.Empty(t, h.find("jobkeys: expired slots taken over"))
			clock.Add(int64(3 * time.Second)) // j1's lease expires
			acq, err := jt.Acquire(ctx, "j2", payload)
			require.NoError(t, err)
			require.Equal(t, KindAcquired, acq.Kind)
			require.Len(t, acq.Stale, 1)
			key, err := jt.Key(payload)
			require.NoError(t, err)

			recs := h.find("jobkeys: expired slots taken over")
			require.Len(t, recs, 1)
			assert.Equal(t, slog.LevelInfo, recs[0].Level)
			assert.Equal(t, key.KVKey, recs[0].Attrs["kv_key"])
			assert.Equal(t, "j2", recs[0].Attrs["job_id"])
			assert.Equal(t, int64(1), recs[0].Attrs["stale"])
			assert.Equal(t, []string{"j1"}, recs[0].Attrs["stale_job_ids"])

			// Corrupt state: an error naming the KV key, from the operation
			// and from a sweep.
			bad, err := jt.Key([]byte(`{"k":"bad"}`))
			require.NoError(t, err)
			_, err = store.Create(ctx, service, bad.KVKey, []byte(`not json`))
			require.NoError(t, err)
			_, err = jt.Admit(ctx, "j3", []byte(`{"k":"bad"}`))
			require.ErrorIs(t, err, ErrCorruptState)
			recs = h.find("jobkeys: unusable key state left as it is; inspect and repair it")
			require.Len(t, recs, 1)
			assert.Equal(t, slog.LevelError, recs[0].Level)
			assert.Equal(t, bad.KVKey, recs[0].Attrs["kv_key"])
			assert.Equal(t, metricOpAdmit, recs[0].Attrs["operation"])
			assert.Contains(t, recs[0].Attrs["error"], "corrupt")

			if _, ok := store.(ListableStore); ok {
				rep, err := jt.Sweep(ctx)
				require.ErrorIs(t, err, ErrCorruptState)
				assert.Equal(t, 2, rep.Keys)
				recs = h.find("jobkeys: unusable key state left as it is; inspect and repair it")
				require.Len(t, recs, 2)
				assert.Equal(t, bad.KVKey, recs[1].Attrs["kv_key"])
				assert.Equal(t, metricOpSweep, recs[1].Attrs["operation"])
				sweeps := h.find("jobkeys: sweep")
				require.Len(t, sweeps, 1)
				assert.Equal(t, slog.LevelWarn, sweeps[0].Level)
				assert.Equal(t, int64(2), sweeps[0].Attrs["keys"])
				assert.Equal(t, int64(1), sweeps[0].Attrs["unusable"])
			}
			for _, r := range h.records {
				for k, v := range r.Attrs {
					assert.NotContains(t, fmt.Sprint(v), `"k":"a"`, "record %q attribute %s holds the payload", r.Message, k)
				}
			}
		})
	}
}

func TestLogsSweep(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var h captureHandler
	var clock atomic.Int64
	clock.Store(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	mr := newMetricsReader(t)
	coord, err := NewCoordinator(NewMemoryStore(), &Config{Logger: slog.New(&h), MeterProvider: mr.mp, Now: func() time.Time { return time.Unix(0, clock.Load()) }})
	require.NoError(t, err)
	jt, err := coord.JobType("sweeplogs", "t", Policy{Key: []string{"/k"}, HeartbeatInterval: time.Second, HeartbeatTTL: 2 * time.Second})
	require.NoError(t, err)

	rep, err := jt.Sweep(ctx) // nothing there: debug
	require.NoError(t, err)
	require.Zero(t, rep.Keys)
	for _, k := range []string{"a", "b"} {
		p := []byte(`{"k":"` + k + `"}`)
		_, err = jt.Admit(ctx, "j"+k, p)
		require.NoError(t, err)
		_, err = jt.Acquire(ctx, "j"+k, p)
		require.NoError(t, err)
	}
	clock.Add(int64(3 * time.Second))
	rep, err = jt.Sweep(ctx)
	require.NoError(t, err)
	require.Len(t, rep.Removed, 2)

	sweeps := h.find("jobkeys: sweep")
	require.Len(t, sweeps, 2)
	assert.Equal(t, slog.LevelDebug, sweeps[0].Level)
	assert.Equal(t, slog.LevelInfo, sweeps[1].Level)
	assert.Equal(t, int64(2), sweeps[1].Attrs["keys"])
	assert.Equal(t, int64(2), sweeps[1].Attrs["removed"])
	assert.Equal(t, int64(2), sweeps[1].Attrs["deleted"])
	assert.Equal(t, "sweeplogs", sweeps[1].Attrs["service"])

	ms := mr.collect()
	assert.Equal(t, int64(2), valueWhere(t, ms, "jobkeys.key.operations", attrOperation.String(metricOpSweep), attrOutcome.String("swept")))
	assert.Equal(t, int64(2), valueWhere(t, ms, "jobkeys.key.sweep.slots", attrSlot.String("removed")))
}

func TestLogsRenewFailureAndLeaseLoss(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store, faults := newConflictingStore(NewMemoryStore())
	coord, err := NewCoordinator(store, nil)
	require.NoError(t, err)
	// A short heartbeat, and a TTL long enough that a loaded machine does
	// not lose the lease by itself.
	jt, err := coord.JobType("leaselogs", "t", Policy{Key: []string{"/k"}, HeartbeatInterval: 5 * time.Millisecond, HeartbeatTTL: time.Minute})
	require.NoError(t, err)
	var h captureHandler
	runner, err := NewRunner(jt, &RunnerConfig{Logger: slog.New(&h)})
	require.NoError(t, err)
	payload := []byte(`{"k":"a"}`)
	_, err = jt.Admit(ctx, "j1", payload)
	require.NoError(t, err)
	key, err := jt.Key(payload)
	require.NoError(t, err)

	res, err := runner.Run(ctx, "j1", payload, func(hctx context.Context, lease Lease) error {
		// Two renewals fail, then the slot is taken from the holder.
		faults.failures.Store(2)
		require.Eventually(t, func() bool { return len(h.find("jobkeys: lease renewal failed; retrying")) >= 2 }, time.Minute, time.Millisecond)
		rel, err := jt.Release(ctx, lease)
		if err != nil || rel.Kind != KindReleased {
			return fmt.Errorf("release behind the runner's back: %v %v", rel.Kind, err)
		}
		<-hctx.Done()
		return context.Cause(hctx)
	})
	require.ErrorIs(t, err, ErrLeaseLost)
	require.ErrorIs(t, res.LeaseLost, ErrLeaseLost)

	fails := h.find("jobkeys: lease renewal failed; retrying")
	require.GreaterOrEqual(t, len(fails), 2)
	assert.Equal(t, slog.LevelWarn, fails[0].Level)
	assert.Equal(t, key.KVKey, fails[0].Attrs["kv_key"])
	assert.Equal(t, "j1", fails[0].Attrs["job_id"])
	assert.Contains(t, fails[0].Attrs["error"], "store unavailable (test)")
	assert.IsType(t, time.Duration(0), fails[0].Attrs["lease_remaining"])

	lost := h.find("jobkeys: lease lost; handler cancelled")
	require.Len(t, lost, 1)
	assert.Equal(t, slog.LevelWarn, lost[0].Level)
	assert.Equal(t, key.KVKey, lost[0].Attrs["kv_key"])
	assert.Equal(t, "j1", lost[0].Attrs["job_id"])
	assert.Contains(t, lost[0].Attrs["error"], "lease lost")
}

// TestObserveSilentByDefault checks that a coordinator and a runner
// without a MeterProvider or Logger have no observer (no cost), and that
// the no-op provider counts as none.
func TestObserveSilentByDefault(t *testing.T) {
	t.Parallel()
	coord, err := NewCoordinator(NewMemoryStore(), nil)
	require.NoError(t, err)
	assert.Nil(t, coord.obs)
	jt, err := coord.JobType("silent", "t", Policy{Key: []string{"/k"}})
	require.NoError(t, err)
	runner, err := NewRunner(jt, nil)
	require.NoError(t, err)
	assert.Nil(t, runner.obs)

	var h captureHandler
	coord, err = NewCoordinator(NewMemoryStore(), &Config{Logger: slog.New(&h)})
	require.NoError(t, err)
	require.NotNil(t, coord.obs)
	assert.Nil(t, coord.obs.m, "a logger alone makes no instruments")
}

func TestErrorClass(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		err  error
		want string
	}{
		{context.Canceled, "canceled"},
		{fmt.Errorf("x: %w", context.DeadlineExceeded), "deadline_exceeded"},
		{fmt.Errorf("%w: KV key", ErrContention), "contention"},
		{&StateError{KVKey: "k", Err: ErrCorruptState}, "corrupt_state"},
		{&StateError{KVKey: "k", Err: ErrForeignState}, "foreign_state"},
		{&StateError{KVKey: "k", Err: ErrStateTooLarge}, "state_too_large"},
		{ErrClockOutOfRange, "clock_out_of_range"},
		{fmt.Errorf("%w: acquisition refused", ErrClockSkew), "clock_skew"},
		{ErrRevisionConflict, "revision_conflict"},
		{ErrBucketNotFound, "bucket_not_found"},
		{ErrPermission, "permission_denied"},
		{ErrInvalidKey, "invalid_request"},
		{errors.New("other"), "error"},
	} {
		assert.Equal(t, tc.want, errorClass(tc.err), "%v", tc.err)
	}
	assert.True(t, slices.Contains(allowedKeyAttrs, attrErrorType))
}

// TestMetricsOperatorOutcomes covers the outcomes without a Kind of their
// own (restore, repair) and the operator removal, and the repair's log.
func TestMetricsOperatorOutcomes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store := NewMemoryStore()
	mr := newMetricsReader(t)
	var h captureHandler
	coord, err := NewCoordinator(store, &Config{MeterProvider: mr.mp, Logger: slog.New(&h)})
	require.NoError(t, err)
	jt, err := coord.JobType("obsops", "t", Policy{Key: []string{"/k"}, MaxQueuedPerKey: 0, WhenFull: ReplaceOldest})
	require.NoError(t, err)
	p := []byte(`{"k":"a"}`)
	_, err = jt.Admit(ctx, "j1", p)
	require.NoError(t, err)
	adm, err := jt.Admit(ctx, "j2", p) // replaces j1
	require.NoError(t, err)
	require.Equal(t, KindReplaced, adm.Kind)
	res, err := jt.RestoreReplaced(ctx, "j2", p, *adm.Replaced)
	require.NoError(t, err)
	require.NotNil(t, res.State)
	res, err = jt.RestoreReplaced(ctx, "j2", p, *adm.Replaced) // j2 is gone already: nothing changes
	require.NoError(t, err)
	require.Nil(t, res.State)
	key, err := jt.Key(p)
	require.NoError(t, err)
	rem, err := coord.RemoveQueuedEntry(ctx, QueueEntryRef{Service: "obsops", KVKey: key.KVKey, JobID: "j1"})
	require.NoError(t, err)
	require.Equal(t, KindRemoved, rem.Kind)
	rem, err = jt.RemoveQueued(ctx, "j1", p)
	require.NoError(t, err)
	require.Equal(t, KindNotFound, rem.Kind)

	bad, err := jt.Key([]byte(`{"k":"bad"}`))
	require.NoError(t, err)
	rev, err := store.Create(ctx, "obsops", bad.KVKey, []byte(`{`))
	require.NoError(t, err)
	_, err = coord.Repair(ctx, RepairRequest{Service: "obsops", KVKey: bad.KVKey, Revision: rev + 1})
	require.ErrorIs(t, err, ErrRevisionConflict)
	out, err := coord.Repair(ctx, RepairRequest{Service: "obsops", KVKey: bad.KVKey, Revision: rev})
	require.NoError(t, err)
	require.True(t, out.Deleted)

	ms := mr.collect()
	op := func(o, outcome string, more ...attribute.KeyValue) int64 {
		return valueWhere(t, ms, "jobkeys.key.operations", append(more, attrService.String("obsops"), attrJobType.String("t"), attrOperation.String(o), attrOutcome.String(outcome))...)
	}
	assert.Equal(t, int64(1), op(metricOpAdmit, string(KindReplaced)))
	assert.Equal(t, int64(1), op(metricOpRestore, "restored"))
	assert.Equal(t, int64(1), op(metricOpRestore, "unchanged"))
	assert.Equal(t, int64(1), op(metricOpRemove, string(KindRemoved)))
	assert.Equal(t, int64(1), op(metricOpRemove, string(KindNotFound)))
	assert.Equal(t, int64(1), op(metricOpRepair, "deleted"))
	assert.Equal(t, int64(1), op(metricOpRepair, outcomeError, attrErrorType.String("revision_conflict")))

	recs := h.find("jobkeys: key state repaired")
	require.Len(t, recs, 1)
	assert.Equal(t, slog.LevelWarn, recs[0].Level)
	assert.Equal(t, bad.KVKey, recs[0].Attrs["kv_key"])
	assert.Equal(t, "deleted", recs[0].Attrs["outcome"])
}

// TestMetricsRunnerWaiting checks the waiting gauge while a Run waits for a
// busy key, and the running gauge while two keys' handlers run.
func TestMetricsRunnerWaiting(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	mr := newMetricsReader(t)
	coord, err := NewCoordinator(NewMemoryStore(), &Config{MeterProvider: mr.mp})
	require.NoError(t, err)
	jt, err := coord.JobType("obswait", "t", Policy{Key: []string{"/k"}, MaxQueuedPerKey: 2})
	require.NoError(t, err)
	runner, err := NewRunner(jt, &RunnerConfig{RecheckInterval: time.Millisecond})
	require.NoError(t, err)
	p := []byte(`{"k":"a"}`)
	for _, id := range []string{"j1", "j2"} {
		_, err = jt.Admit(ctx, id, p)
		require.NoError(t, err)
	}
	gauge := func(name string) int64 { return valueWhere(t, mr.collect(), name, attrService.String("obswait")) }

	release := make(chan struct{})
	first := make(chan error, 1)
	go func() {
		_, err := runner.Run(ctx, "j1", p, func(context.Context, Lease) error { <-release; return nil })
		first <- err
	}()
	require.Eventually(t, func() bool { return gauge("jobkeys.runner.running") == 1 }, time.Minute, time.Millisecond)
	second := make(chan error, 1)
	go func() {
		_, err := runner.Run(ctx, "j2", p, func(context.Context, Lease) error { return nil })
		second <- err
	}()
	require.Eventually(t, func() bool { return gauge("jobkeys.runner.waiting") == 1 }, time.Minute, time.Millisecond)
	assert.Equal(t, int64(1), gauge("jobkeys.runner.running"))
	close(release)
	require.NoError(t, <-first)
	require.NoError(t, <-second)
	assert.Equal(t, int64(0), gauge("jobkeys.runner.waiting"))
	assert.Equal(t, int64(0), gauge("jobkeys.runner.running"))
	assert.Zero(t, valueWhere(t, mr.collect(), "jobkeys.runner.blocked"), "a Run that waited and got its slot is not blocked")
}

func TestLogsStoredLimits(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store := NewMemoryStore()
	producer, err := NewCoordinator(store, nil)
	require.NoError(t, err)
	var h captureHandler
	worker, err := NewCoordinator(store, &Config{Logger: slog.New(&h)})
	require.NoError(t, err)
	pjt, err := producer.JobType("limits", "t", Policy{Key: []string{"/k"}, MaxActive: 1, MaxQueuedPerKey: 3})
	require.NoError(t, err)
	wjt, err := worker.JobType("limits", "t", Policy{Key: []string{"/k"}, MaxActive: 2, MaxQueuedPerKey: 3})
	require.NoError(t, err)
	p := []byte(`{"k":"a"}`)
	_, err = pjt.Admit(ctx, "j1", p)
	require.NoError(t, err)
	acq, err := wjt.Acquire(ctx, "j1", p)
	require.NoError(t, err)
	require.NotNil(t, acq.StoredLimits)

	recs := h.find("jobkeys: key state was written under other limits than this policy's")
	require.Len(t, recs, 1)
	assert.Equal(t, slog.LevelWarn, recs[0].Level)
	assert.Equal(t, int64(1), recs[0].Attrs["stored_max_active"])
	assert.Equal(t, int64(3), recs[0].Attrs["stored_max_queued_per_key"])
}
