package jobkeys

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel/metric"
)

// runnerObserver is the metrics (the coordinator's instruments) and logs
// (RunnerConfig.Logger) of one Runner. nil: neither.
type runnerObserver struct {
	logger *slog.Logger // nil: no logs
	m      *keyMetrics  // nil: no metrics
	attrs  metric.MeasurementOption
	jt     *JobType
}

// newRunnerObserver returns the observer of a Runner of jt logging to
// logger, nil when there is nothing to observe.
func newRunnerObserver(jt *JobType, logger *slog.Logger) *runnerObserver {
	var m *keyMetrics
	if o := jt.coord.obs; o != nil {
		m = o.m
	}
	if m == nil && logger == nil {
		return nil
	}
	r := &runnerObserver{logger: logger, m: m, jt: jt}
	if m != nil {
		r.attrs = m.attrs(attrKey{service: jt.service, jobType: jt.name})
	}
	return r
}

// running adds delta to the running handlers.
func (r *runnerObserver) running(ctx context.Context, delta int64) {
	if r == nil || r.m == nil {
		return
	}
	r.m.running.Add(ctx, delta, r.attrs)
}

// waiting adds delta to the Runs waiting for a slot.
func (r *runnerObserver) waiting(ctx context.Context, delta int64) {
	if r == nil || r.m == nil {
		return
	}
	r.m.waiting.Add(ctx, delta, r.attrs)
}

// acquireFailed counts a Run that ended without a slot because of err.
func (r *runnerObserver) acquireFailed(ctx context.Context, err error) {
	if r == nil || r.m == nil {
		return
	}
	var be *BlockedError
	if errors.As(err, &be) {
		r.m.blocked.Add(ctx, 1, r.m.attrs(attrKey{service: r.jt.service, jobType: r.jt.name, reason: string(be.Acquisition.Reason)}))
	}
}

// renewFailed logs a failed renewal of lease; the runner tries again until
// the lease may have expired (remaining from now).
func (r *runnerObserver) renewFailed(ctx context.Context, lease *Lease, kvKey string, remaining time.Duration, err error) {
	if r == nil || r.logger == nil {
		return
	}
	r.logger.LogAttrs(ctx, slog.LevelWarn, "jobkeys: lease renewal failed; retrying",
		slog.String("kv_key", kvKey), slog.String("job_id", lease.JobID),
		slog.Duration("lease_remaining", remaining), slog.String("error", err.Error()))
}

// leaseLost logs that lease was lost and its handler cancelled with cause.
func (r *runnerObserver) leaseLost(ctx context.Context, lease *Lease, cause error) {
	if r == nil || r.logger == nil {
		return
	}
	r.logger.LogAttrs(ctx, slog.LevelWarn, "jobkeys: lease lost; handler cancelled",
		slog.String("kv_key", kvKeyFor(lease.Service, lease.JobType, lease.KeyHash)),
		slog.String("job_id", lease.JobID), slog.String("error", cause.Error()))
}
