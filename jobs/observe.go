package jobs

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jobkeys/jobkeys"
	"github.com/jobkeys/jobkeys/internal/otelmetric"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// This file holds the job stores' metrics and logs (Config.MeterProvider,
// Config.Logger): the instruments, their attribute sets, and the wrapper
// every transition of both stores runs through. A store configured with
// neither has a nil *storeObserver and the wrapper calls straight through.

// MeterName is the name of the OpenTelemetry meter the job stores'
// instruments belong to (the instrumentation scope).
const MeterName = "github.com/jobkeys/jobkeys/jobs"

// The attribute keys of the job stores' instruments: a transition, an
// outcome, an error class and the job type; never a channel, a key or a
// job id. Job types are the kinds an application registers, a bounded
// set; a store keeps at most otelmetric.MaxAttrSets attribute sets and
// builds any beyond them per measurement.
const (
	attrTransition = attribute.Key("jobkeys.jobs.transition")
	attrOutcome    = attribute.Key("jobkeys.outcome")
	attrErrorType  = attribute.Key("error.type")
	attrJobType    = attribute.Key("job.type")
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

// storeObserver is the metrics and logs of one store. nil: neither.
type storeObserver struct {
	logger *slog.Logger // nil: no logs

	// nil when there is no MeterProvider
	meter       metric.Meter
	transitions metric.Int64Counter
	duration    metric.Float64Histogram
	sets        otelmetric.AttrSets[setKey] // transitions × outcomes × error classes × job types, bounded
}

type setKey struct {
	tr                        transition
	outcome, errType, jobType string
}

// newStoreObserver returns the observer of a store configured with mp and
// logger, nil when both are nil (or mp is the no-op provider).
func newStoreObserver(mp metric.MeterProvider, logger *slog.Logger) (*storeObserver, error) {
	mp = otelmetric.Provider(mp) // nil for the no-op provider
	if mp == nil && logger == nil {
		return nil, nil
	}
	o := &storeObserver{logger: logger}
	if mp == nil {
		return o, nil
	}
	meter := mp.Meter(MeterName)
	o.meter = meter
	var err, e error
	o.transitions, e = meter.Int64Counter("jobkeys.jobs.transitions", metric.WithUnit("{job}"),
		metric.WithDescription("Jobs a store call changed, or a refused or failed call (one each), by transition, outcome and job type (when known)."))
	err = errors.Join(err, e)
	o.duration, e = meter.Float64Histogram("jobkeys.jobs.duration", metric.WithUnit("s"),
		metric.WithDescription("Duration of the job store's changing calls, by transition, outcome and job type (when the call's jobs have one)."),
		metric.WithExplicitBucketBoundaries(otelmetric.DurationBuckets()...))
	err = errors.Join(err, e)
	if err != nil {
		return nil, fmt.Errorf("%w: Config.MeterProvider: %w", ErrConflict, err)
	}
	return o, nil
}

func (o *storeObserver) attrs(k setKey) metric.MeasurementOption {
	return o.sets.Get(k, setKey.attributes)
}

// attributes are the attributes of k's set.
func (k setKey) attributes() []attribute.KeyValue {
	kv := []attribute.KeyValue{attrTransition.String(string(k.tr)), attrOutcome.String(k.outcome)}
	if k.errType != "" {
		kv = append(kv, attrErrorType.String(k.errType))
	}
	if k.jobType != "" {
		kv = append(kv, attrJobType.String(k.jobType))
	}
	return kv
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

// record measures one call of tr that started at start, changed n jobs of
// type jobType ("": unknown, or several: then claimed gives each job's)
// and ended with outcome or err, and logs a corrupt record.
func (o *storeObserver) record(ctx context.Context, tr transition, start time.Time, n int, outcome, jobType string, claimed []Job, err error) {
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
	k := setKey{tr: tr, outcome: outcome, jobType: jobType}
	if err != nil {
		k.errType = errorClass(err)
	}
	attrs := o.attrs(k)
	switch {
	case jobType == "" && len(claimed) > 0: // jobs of several types: counted by type
		for i := range claimed {
			o.transitions.Add(ctx, 1, o.attrs(setKey{tr: tr, outcome: outcome, jobType: claimed[i].Type}))
		}
	case n > 0:
		o.transitions.Add(ctx, int64(n), attrs)
	}
	o.duration.Record(ctx, time.Since(start).Seconds(), attrs)
}

// observe runs call, the body of a store method of transition tr, and
// records it with the type of the jobs it changed (an enqueue's request's
// type when it failed). With no observer it only calls call.
func observe[Req, Out any](ctx context.Context, o *storeObserver, tr transition, call func(context.Context, Req) (Out, error), req Req) (Out, error) {
	if o == nil {
		return call(ctx, req)
	}
	start := time.Now()
	out, err := call(ctx, req)
	n, outcome, jobType := 1, outcomeOK, ""
	var claimed []Job
	switch v := any(&out).(type) { // a pointer: boxing a result would allocate
	case *Enqueued:
		if v.Repeated {
			outcome = outcomeRepeated
		}
		jobType = v.Job.Type
	case *[]Job:
		if n = len(*v); n == 0 {
			outcome = outcomeEmpty
		} else {
			jobType = (*v)[0].Type
			for i := range *v {
				if (*v)[i].Type != jobType {
					jobType, claimed = "", *v
					break
				}
			}
		}
	case *Job:
		jobType = v.Type
	case *Detail:
		jobType = v.Job.Type
	}
	if r, ok := any(&req).(*EnqueueRequest); ok && jobType == "" {
		jobType = r.Type
	}
	o.record(ctx, tr, start, n, outcome, jobType, claimed, err)
	return out, err
}

// The gauges of pending and running jobs by type (jobkeys.jobs.pending,
// jobkeys.jobs.running), observed at each collection by counting the
// store's active jobs: see [MemoryStore] and [NATSStore] for the cost.

// activeCounts is the number of pending and of running jobs by type.
type activeCounts struct {
	pending, running map[string]int64
}

// add counts j when it is pending or running.
func (c *activeCounts) add(j *Job) {
	switch j.State {
	case StatePending:
		c.pending[j.Type]++
	case StateRunning:
		c.running[j.Type]++
	}
}

func newActiveCounts() activeCounts {
	return activeCounts{pending: map[string]int64{}, running: map[string]int64{}}
}

// observeActive registers the gauges of pending and running jobs by type,
// observed through count. The registration is returned for the store to
// end on Close; nil when there is no MeterProvider.
func (o *storeObserver) observeActive(count func(ctx context.Context) (activeCounts, error)) (metric.Registration, error) {
	if o == nil || o.meter == nil {
		return nil, nil
	}
	pending, err := o.meter.Int64ObservableGauge("jobkeys.jobs.pending", metric.WithUnit("{job}"),
		metric.WithDescription("Pending jobs (due or not), by job type."))
	if err != nil {
		return nil, fmt.Errorf("%w: Config.MeterProvider: %w", ErrConflict, err)
	}
	running, err := o.meter.Int64ObservableGauge("jobkeys.jobs.running", metric.WithUnit("{job}"),
		metric.WithDescription("Running jobs (claimed, their claim not yet ended), by job type."))
	if err != nil {
		return nil, fmt.Errorf("%w: Config.MeterProvider: %w", ErrConflict, err)
	}
	reg, err := o.meter.RegisterCallback(func(ctx context.Context, obs metric.Observer) error {
		c, err := count(ctx)
		if err != nil {
			return err
		}
		for typ, n := range c.pending {
			obs.ObserveInt64(pending, n, metric.WithAttributes(attrJobType.String(typ)))
		}
		for typ, n := range c.running {
			obs.ObserveInt64(running, n, metric.WithAttributes(attrJobType.String(typ)))
		}
		return nil
	}, pending, running)
	if err != nil {
		return nil, fmt.Errorf("%w: Config.MeterProvider: %w", ErrConflict, err)
	}
	return reg, nil
}

// countActive counts the pending and running jobs of every channel, under
// the store's lock: a pass over the open jobs.
func (s *MemoryStore) countActive(ctx context.Context) (activeCounts, error) {
	if err := ctx.Err(); err != nil {
		return activeCounts{}, err
	}
	c := newActiveCounts()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, ch := range s.channels {
		for id := range ch.open {
			c.add(ch.jobs[id])
		}
	}
	return c, nil
}

// countActive counts the pending and running jobs of every channel: a
// listing of the active index and batched reads of the active jobs'
// records, as a Claim of every channel reads them (never a finished job).
func (s *NATSStore) countActive(ctx context.Context) (activeCounts, error) {
	const op = "count active jobs"
	entries, _, err := s.listActive(ctx, op, "", nil)
	if err != nil {
		return activeCounts{}, err
	}
	keys := make([]string, 0, len(entries))
	refs := make(map[string][2]string, len(entries))
	for key := range entries {
		channelID, jobID, err := parseActive(key)
		if err != nil {
			continue
		}
		jk := s.keys.job(channelID, jobID)
		keys = append(keys, jk)
		refs[jk] = [2]string{channelID, jobID}
	}
	c := newActiveCounts()
	if len(keys) == 0 {
		return c, nil
	}
	read, err := s.getMany(ctx, op, keys)
	if err != nil {
		return activeCounts{}, err
	}
	for jk, m := range read {
		r := refs[jk]
		j, _, err := decodeNATSJob(jk, m.rev, m.data, r[0], r[1])
		if err != nil {
			continue // a corrupt record is reported where it is used
		}
		c.add(&j)
	}
	return c, nil
}
