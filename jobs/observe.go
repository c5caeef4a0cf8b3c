package jobs

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jobkeys/jobkeys"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
)

// This file holds the job stores' metrics and logs (Config.MeterProvider,
// Config.Logger): the instruments, their attribute sets, and the wrapper
// every transition of both stores runs through. A store configured with
// neither has a nil *storeObserver and the wrapper calls straight through.

// MeterName is the name of the OpenTelemetry meter the job stores'
// instruments belong to (the instrumentation scope).
const MeterName = "github.com/jobkeys/jobkeys/jobs"

// The attribute keys of the job stores' instruments: a transition, an
// outcome and an error class; never a channel, a job id or a job type (job
// types are the caller's and need not be bounded).
const (
	attrTransition = attribute.Key("jobkeys.jobs.transition")
	attrOutcome    = attribute.Key("jobkeys.outcome")
	attrErrorType  = attribute.Key("error.type")
)

// transition names a store call that changes jobs: the values of
// jobkeys.jobs.transition.
type transition string

const (
	trEnqueue   transition = "enqueue"
	trClaim     transition = "claim"
	trRenew     transition = "renew"
	trRequeue   transition = "requeue"
	trProgress  transition = "progress"
	trSettle    transition = "settle"
	trFail      transition = "fail"
	trPause     transition = "pause"
	trResume    transition = "resume"
	trCancel    transition = "cancel"
	trSupersede transition = "supersede"
)

// Outcomes, the values of jobkeys.outcome.
const (
	outcomeOK       = "ok"       // the transition was applied
	outcomeRepeated = "repeated" // an enqueue replayed by its idempotency key: nothing changed
	outcomeEmpty    = "empty"    // a claim found no due job
	outcomeError    = "error"    // refused or failed: see error.type
)

// durationBuckets are the store call latency histogram's bucket boundaries
// in seconds.
var durationBuckets = []float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}

// storeObserver is the metrics and logs of one store. nil: neither.
type storeObserver struct {
	logger *slog.Logger // nil: no logs

	// nil when there is no MeterProvider
	transitions metric.Int64Counter
	duration    metric.Float64Histogram
	mu          sync.RWMutex
	sets        map[setKey]metric.MeasurementOption // bounded: transitions × outcomes × error classes
}

type setKey struct {
	tr               transition
	outcome, errType string
}

// newStoreObserver returns the observer of a store configured with mp and
// logger, nil when both are nil (or mp is the no-op provider).
func newStoreObserver(mp metric.MeterProvider, logger *slog.Logger) (*storeObserver, error) {
	if _, ok := mp.(noop.MeterProvider); ok {
		mp = nil
	}
	if mp == nil && logger == nil {
		return nil, nil
	}
	o := &storeObserver{logger: logger, sets: map[setKey]metric.MeasurementOption{}}
	if mp == nil {
		return o, nil
	}
	meter := mp.Meter(MeterName)
	var err, e error
	o.transitions, e = meter.Int64Counter("jobkeys.jobs.transitions", metric.WithUnit("{job}"),
		metric.WithDescription("Jobs a store call changed, or a refused or failed call (one each), by transition and outcome."))
	err = errors.Join(err, e)
	o.duration, e = meter.Float64Histogram("jobkeys.jobs.duration", metric.WithUnit("s"),
		metric.WithDescription("Duration of the job store's changing calls, by transition and outcome."),
		metric.WithExplicitBucketBoundaries(durationBuckets...))
	err = errors.Join(err, e)
	if err != nil {
		return nil, fmt.Errorf("%w: Config.MeterProvider: %w", ErrConflict, err)
	}
	return o, nil
}

func (o *storeObserver) attrs(k setKey) metric.MeasurementOption {
	o.mu.RLock()
	opt, ok := o.sets[k]
	o.mu.RUnlock()
	if ok {
		return opt
	}
	kv := []attribute.KeyValue{attrTransition.String(string(k.tr)), attrOutcome.String(k.outcome)}
	if k.errType != "" {
		kv = append(kv, attrErrorType.String(k.errType))
	}
	opt = metric.WithAttributeSet(attribute.NewSet(kv...))
	o.mu.Lock()
	o.sets[k] = opt
	o.mu.Unlock()
	return opt
}

// errorClass names the class of err, the value of error.type.
func errorClass(err error) string {
	switch {
	case errors.Is(err, context.Canceled):
		return "canceled"
	case errors.Is(err, jobkeys.ErrPermission): // a refusal shows as a timeout: before it
		return "permission_denied"
	case errors.Is(err, context.DeadlineExceeded):
		return "deadline_exceeded"
	case errors.Is(err, ErrConflict):
		return "conflict"
	case errors.Is(err, ErrNotFound):
		return "not_found"
	case errors.Is(err, ErrCorrupt):
		return "corrupt"
	case errors.Is(err, ErrUnavailable):
		return "unavailable"
	}
	return "error"
}

// record measures one call of tr that started at start, changed n jobs
// and ended with outcome or err, and logs a corrupt record.
func (o *storeObserver) record(ctx context.Context, tr transition, start time.Time, n int, outcome string, err error) {
	if err != nil {
		outcome, n = outcomeError, 1
		if o.logger != nil && errors.Is(err, ErrCorrupt) {
			// The error names the job and the KV key; it holds no input.
			o.logger.LogAttrs(ctx, slog.LevelError, "jobs: corrupt job record left as it is",
				slog.String("transition", string(tr)), slog.String("error", err.Error()))
		}
	}
	if o.transitions == nil {
		return
	}
	k := setKey{tr: tr, outcome: outcome}
	if err != nil {
		k.errType = errorClass(err)
	}
	attrs := o.attrs(k)
	if n > 0 {
		o.transitions.Add(ctx, int64(n), attrs)
	}
	o.duration.Record(ctx, time.Since(start).Seconds(), attrs)
}

// observe runs call, the body of a store method of transition tr, and
// records it. With no observer it only calls call.
func observe[Req, Out any](ctx context.Context, o *storeObserver, tr transition, call func(context.Context, Req) (Out, error), req Req) (Out, error) {
	if o == nil {
		return call(ctx, req)
	}
	start := time.Now()
	out, err := call(ctx, req)
	n, outcome := 1, outcomeOK
	switch v := any(&out).(type) { // a pointer: boxing a result would allocate
	case *Enqueued:
		if v.Repeated {
			outcome = outcomeRepeated
		}
	case *[]Job:
		if n = len(*v); n == 0 {
			outcome = outcomeEmpty
		}
	}
	o.record(ctx, tr, start, n, outcome, err)
	return out, err
}
