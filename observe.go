package jobkeys

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jobkeys/jobkeys/internal/otelmetric"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// This file holds the coordinator's metrics and logs: the instruments, their
// attribute sets, and the hooks the public operations call at their
// boundary. The instruments are listed in the package docs ("Metrics and
// logs"). A coordinator configured with neither a MeterProvider nor a Logger
// has a nil *observer, and every hook is a nil check.

// MeterName is the name of the OpenTelemetry meter the key layer's
// instruments belong to (the instrumentation scope).
const MeterName = "github.com/jobkeys/jobkeys"

// The attribute keys of the key layer's instruments. Attributes are bounded:
// an operation, an outcome, an error class, the service and the job type;
// never a key, a key hash or a job id.
const (
	attrOperation = attribute.Key("jobkeys.operation")
	attrOutcome   = attribute.Key("jobkeys.outcome")
	attrService   = attribute.Key("jobkeys.service")
	attrJobType   = attribute.Key("jobkeys.job_type")
	attrReason    = attribute.Key("jobkeys.reason")
	attrSlot      = attribute.Key("jobkeys.slot")
	attrErrorType = attribute.Key("error.type") // OpenTelemetry's general error attribute
)

// Operation names, the values of jobkeys.operation.
const (
	metricOpAdmit   = "admit"
	metricOpAcquire = "acquire"
	metricOpRenew   = "renew"
	metricOpRelease = "release"
	metricOpRemove  = "remove"
	metricOpRestore = "restore"
	metricOpSweep   = "sweep"
	metricOpRepair  = "repair"
)

// outcomeError is jobkeys.outcome of an operation that returned an error;
// error.type then says which.
const outcomeError = "error"

// observer is the metrics and logging of one coordinator. nil: neither.
type observer struct {
	logger *slog.Logger // nil: no logs
	m      *keyMetrics  // nil: no metrics
}

// keyMetrics are the key layer's instruments.
type keyMetrics struct {
	ops       metric.Int64Counter
	duration  metric.Float64Histogram
	conflicts metric.Int64Counter
	exhausted metric.Int64Counter
	swept     metric.Int64Counter
	running   metric.Int64UpDownCounter
	waiting   metric.Int64UpDownCounter
	blocked   metric.Int64Counter

	sets otelmetric.AttrSets[attrKey] // bounded: see otelmetric.MaxAttrSets
}

// attrKey identifies one cached attribute set.
type attrKey struct {
	service, jobType, op, outcome, errType, reason, slot string
}

// newObserver returns the observer of a coordinator configured with mp and
// logger, nil when both are nil (or mp is the no-op provider and logger
// nil).
func newObserver(mp metric.MeterProvider, logger *slog.Logger) (*observer, error) {
	mp = otelmetric.Provider(mp) // nil for the no-op provider
	if mp == nil && logger == nil {
		return nil, nil
	}
	o := &observer{logger: logger}
	if mp != nil {
		m, err := newKeyMetrics(mp.Meter(MeterName))
		if err != nil {
			return nil, fmt.Errorf("%w: Config.MeterProvider: %w", ErrInvalidRequest, err)
		}
		o.m = m
	}
	return o, nil
}

func newKeyMetrics(meter metric.Meter) (*keyMetrics, error) {
	m := &keyMetrics{}
	var err, e error
	m.ops, e = meter.Int64Counter("jobkeys.key.operations", metric.WithUnit("{operation}"),
		metric.WithDescription("Key operations completed, by operation and outcome (the outcome's Kind, or error with error.type)."))
	err = errors.Join(err, e)
	m.duration, e = meter.Float64Histogram("jobkeys.key.operation.duration", metric.WithUnit("s"),
		metric.WithDescription("Duration of key operations, compare-and-swap retries and pauses included."),
		metric.WithExplicitBucketBoundaries(otelmetric.DurationBuckets()...))
	err = errors.Join(err, e)
	m.conflicts, e = meter.Int64Counter("jobkeys.key.cas.conflicts", metric.WithUnit("{conflict}"),
		metric.WithDescription("Compare-and-swap writes of key state refused because another writer changed the key first."))
	err = errors.Join(err, e)
	m.exhausted, e = meter.Int64Counter("jobkeys.key.cas.exhausted", metric.WithUnit("{operation}"),
		metric.WithDescription("Key operations that gave up after losing too many compare-and-swap races (ErrContention)."))
	err = errors.Join(err, e)
	m.swept, e = meter.Int64Counter("jobkeys.key.sweep.slots", metric.WithUnit("{slot}"),
		metric.WithDescription("Expired slots sweeps found, by what became of them (removed under FailStale, kept under Block)."))
	err = errors.Join(err, e)
	m.running, e = meter.Int64UpDownCounter("jobkeys.runner.running", metric.WithUnit("{job}"),
		metric.WithDescription("Jobs whose handler is running under a lease in a Runner."))
	err = errors.Join(err, e)
	m.waiting, e = meter.Int64UpDownCounter("jobkeys.runner.waiting", metric.WithUnit("{job}"),
		metric.WithDescription("Runner.Run calls waiting for a slot on a busy key."))
	err = errors.Join(err, e)
	m.blocked, e = meter.Int64Counter("jobkeys.runner.blocked", metric.WithUnit("{job}"),
		metric.WithDescription("Runner.Run and TryRun calls that ended without a slot (a BlockedError), by reason."))
	err = errors.Join(err, e)
	if err != nil {
		return nil, err
	}
	return m, nil
}

// attrs returns the measurement option of k, cached.
func (m *keyMetrics) attrs(k attrKey) metric.MeasurementOption {
	return m.sets.Get(k, attrKey.attributes)
}

// attributes are the attributes of k's set.
func (k attrKey) attributes() []attribute.KeyValue {
	kv := make([]attribute.KeyValue, 0, 6)
	kv = append(kv, attrService.String(k.service), attrJobType.String(k.jobType))
	if k.op != "" {
		kv = append(kv, attrOperation.String(k.op))
	}
	if k.outcome != "" {
		kv = append(kv, attrOutcome.String(k.outcome))
	}
	if k.errType != "" {
		kv = append(kv, attrErrorType.String(k.errType))
	}
	if k.reason != "" {
		kv = append(kv, attrReason.String(k.reason))
	}
	if k.slot != "" {
		kv = append(kv, attrSlot.String(k.slot))
	}
	return kv
}

// errorClass names the class of err, the value of error.type: the sentinel
// it wraps, in snake case, or "error" when it wraps none of them.
func errorClass(err error) string {
	switch {
	case errors.Is(err, context.Canceled):
		return "canceled"
	case errors.Is(err, context.DeadlineExceeded):
		return "deadline_exceeded"
	case errors.Is(err, ErrContention):
		return "contention"
	case errors.Is(err, ErrCorruptState):
		return "corrupt_state"
	case errors.Is(err, ErrForeignState):
		return "foreign_state"
	case errors.Is(err, ErrStateTooLarge):
		return "state_too_large"
	case errors.Is(err, ErrClockOutOfRange):
		return "clock_out_of_range"
	case errors.Is(err, ErrClockSkew):
		return "clock_skew"
	case errors.Is(err, ErrRevisionConflict):
		return "revision_conflict"
	case errors.Is(err, ErrBucketNotFound):
		return "bucket_not_found"
	case errors.Is(err, ErrPermission):
		return "permission_denied"
	case errors.Is(err, ErrInvalidRequest), errors.Is(err, ErrInvalidKey),
		errors.Is(err, ErrInvalidName), errors.Is(err, ErrInvalidPolicy):
		return "invalid_request"
	}
	return "error"
}

// begin returns the start time of an operation when it is measured, else
// the zero time (no clock read).
func (o *observer) begin() time.Time {
	if o == nil || o.m == nil {
		return time.Time{}
	}
	return time.Now()
}

// end records one operation op on key that started at start and ended with
// *kind or *err. It is deferred by the operation, hence the pointers.
func (o *observer) end(ctx context.Context, op string, key *JobKey, start time.Time, kind *Kind, err *error) {
	if o == nil {
		return
	}
	o.record(ctx, op, key.Service, key.JobType, key.KVKey, start, string(*kind), *err)
}

// record is end with the outcome given as a string.
func (o *observer) record(ctx context.Context, op, service, jobType, kvKey string, start time.Time, outcome string, err error) {
	if err != nil {
		o.failed(ctx, op, kvKey, err)
	}
	if o.m == nil {
		return
	}
	k := attrKey{service: service, jobType: jobType, op: op, outcome: outcome}
	if err != nil {
		k.outcome, k.errType = outcomeError, errorClass(err)
		if errors.Is(err, ErrContention) {
			o.m.exhausted.Add(ctx, 1, o.m.attrs(attrKey{service: service, jobType: jobType, op: op}))
		}
	}
	attrs := o.m.attrs(k)
	o.m.ops.Add(ctx, 1, attrs)
	o.m.duration.Record(ctx, time.Since(start).Seconds(), attrs)
}

// failed logs an operation's error when it says the state is unusable:
// corrupt or another key's state is an operator's problem (Repair), the
// rest are the caller's to handle and are not logged.
func (o *observer) failed(ctx context.Context, op, kvKey string, err error) {
	if o.logger == nil {
		return
	}
	if !errors.Is(err, ErrCorruptState) && !errors.Is(err, ErrForeignState) {
		return
	}
	var se *StateError
	if errors.As(err, &se) {
		kvKey = se.KVKey
	}
	o.logger.LogAttrs(ctx, slog.LevelError, "jobkeys: unusable key state left as it is; inspect and repair it",
		slog.String("operation", op), slog.String("kv_key", kvKey), slog.String("error", err.Error()))
}

// acquired is end for an acquisition; it also logs the stale slots the
// acquisition took over.
func (o *observer) acquired(ctx context.Context, key *JobKey, start time.Time, acq *Acquisition, err *error) {
	if o == nil {
		return
	}
	o.record(ctx, metricOpAcquire, key.Service, key.JobType, key.KVKey, start, string(acq.Kind), *err)
	if *err != nil || o.logger == nil {
		return
	}
	if l := acq.StoredLimits; l != nil {
		o.logger.LogAttrs(ctx, slog.LevelWarn, "jobkeys: key state was written under other limits than this policy's",
			slog.String("kv_key", key.KVKey), slog.Int("stored_max_active", l.MaxActive),
			slog.Int("stored_max_queued_per_key", l.MaxQueuedPerKey))
	}
	if len(acq.Stale) == 0 {
		return
	}
	o.logger.LogAttrs(ctx, slog.LevelInfo, "jobkeys: expired slots taken over",
		slog.String("kv_key", key.KVKey), slog.String("job_id", acq.Lease.JobID),
		slog.Int("stale", len(acq.Stale)), slog.Any("stale_job_ids", staleJobIDs(acq.Stale)))
}

// restored is end for a restoration, which has no Kind: its outcome is
// "restored" when it changed the state, else "unchanged".
func (o *observer) restored(ctx context.Context, key *JobKey, start time.Time, out *Restoration, err *error) {
	if o == nil {
		return
	}
	outcome := "unchanged"
	if out.State != nil {
		outcome = "restored"
	}
	o.record(ctx, metricOpRestore, key.Service, key.JobType, key.KVKey, start, outcome, *err)
}

// conflict counts a compare-and-swap write on key that another writer beat.
func (o *observer) conflict(ctx context.Context, key *JobKey) {
	if o == nil || o.m == nil {
		return
	}
	o.m.conflicts.Add(ctx, 1, o.m.attrs(attrKey{service: key.Service, jobType: key.JobType}))
}

// repaired is end for Repair.
func (o *observer) repaired(ctx context.Context, service, kvKey string, start time.Time, deletes bool, err *error) {
	if o == nil {
		return
	}
	outcome := "replaced"
	if deletes {
		outcome = "deleted"
	}
	jobType := ""
	if key, kerr := operatorKey(service, kvKey); kerr == nil {
		jobType = key.JobType
	}
	o.record(ctx, metricOpRepair, service, jobType, kvKey, start, outcome, *err)
	if *err == nil && o.logger != nil {
		o.logger.LogAttrs(ctx, slog.LevelWarn, "jobkeys: key state repaired",
			slog.String("kv_key", kvKey), slog.String("outcome", outcome))
	}
}

// swept is end for JobType.Sweep: it counts the sweep and the slots it
// found, and logs it (info when it found expired slots, debug otherwise;
// each key whose state is unusable at error).
func (o *observer) swept(ctx context.Context, jt *JobType, start time.Time, rep *SweepReport, err *error) {
	if o == nil {
		return
	}
	outcome := "swept"
	if *err != nil {
		// A sweep that failed on some keys still swept the others.
		outcome = outcomeError
	}
	if o.m != nil {
		k := attrKey{service: jt.service, jobType: jt.name, op: metricOpSweep, outcome: outcome}
		if *err != nil {
			k.errType = errorClass(*err)
		}
		attrs := o.m.attrs(k)
		o.m.ops.Add(ctx, 1, attrs)
		o.m.duration.Record(ctx, time.Since(start).Seconds(), attrs)
		if n := len(rep.Removed); n > 0 {
			o.m.swept.Add(ctx, int64(n), o.m.attrs(attrKey{service: jt.service, jobType: jt.name, slot: "removed"}))
		}
		if n := len(rep.Expired); n > 0 {
			o.m.swept.Add(ctx, int64(n), o.m.attrs(attrKey{service: jt.service, jobType: jt.name, slot: "expired"}))
		}
	}
	if o.logger == nil {
		return
	}
	var unusable int
	for _, e := range joined(*err) {
		if errors.Is(e, ErrCorruptState) || errors.Is(e, ErrForeignState) {
			unusable++
			o.failed(ctx, metricOpSweep, "", e)
		}
	}
	level := slog.LevelDebug
	switch {
	case *err != nil:
		level = slog.LevelWarn
	case len(rep.Removed) > 0 || len(rep.Expired) > 0:
		level = slog.LevelInfo
	}
	attrs := []slog.Attr{
		slog.String("service", jt.service), slog.String("job_type", jt.name),
		slog.Int("keys", rep.Keys), slog.Int("removed", len(rep.Removed)),
		slog.Int("expired_kept", len(rep.Expired)), slog.Int("deleted", rep.Deleted),
	}
	if *err != nil {
		attrs = append(attrs, slog.Int("unusable", unusable), slog.String("error", (*err).Error()))
	}
	o.logger.LogAttrs(ctx, level, "jobkeys: sweep", attrs...)
}

// joined returns the errors err joins (errors.Join), or err itself.
func joined(err error) []error {
	if err == nil {
		return nil
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	return []error{err}
}

// staleJobIDs returns the job ids of slots.
func staleJobIDs(slots []ActiveSlot) []string {
	ids := make([]string, len(slots))
	for i := range slots {
		ids[i] = slots[i].JobID
	}
	return ids
}
