package jobs

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"
)

// Periodic is a job enqueued on a schedule by every started [Client] that
// has it in [ClientConfig.Periodic]: exactly one job per tick, whatever
// the number of clients and restarts, with no leader. A tick's job has an
// id (and idempotency key and target key) derived from Name and the tick's
// time, "periodic-<Name>-<tick, RFC 3339 UTC>", in channel
// [PeriodicChannel], with Origin "periodic": the clients that enqueue the
// same tick write one job, the others' enqueues are replays of it.
//
// A client enqueues the latest tick at or before now, when it starts and
// at each tick after. Ticks missed while no client ran are not enqueued
// one by one: a client that starts enqueues only the latest of them (at
// most one catch-up job), and a schedule new to a deployment runs once
// when first started. A tick whose job is gone (its retention passed) is
// enqueued again only if a client starts before the next tick.
//
// Every or Cron, not both, gives the ticks: Every (at least
// PeriodicEveryMin) ticks at the multiples of Every since the zero time
// (time.Time.Truncate), so every client computes the same ticks; Cron is
// a five-field cron expression in UTC (minute hour day-of-month month
// day-of-week, e.g. "0 3 * * *"; see [Client.Start] for what is refused).
type Periodic struct {
	// Name names the schedule: unique among a client's Periodic, 1 to 64
	// letters, digits, '-' or '_'. Every client of the schedule must give
	// it the same Name, Type and Input (another Input for the same tick is
	// a conflict, logged).
	Name string
	// Type is the job type: a kind registered on the client.
	Type string
	// Input is the job's input (JSON). Defaults to null.
	Input json.RawMessage
	// Every is the period between ticks.
	Every time.Duration
	// Cron is a five-field cron expression, in UTC.
	Cron string
}

// PeriodicChannel is the channel of periodic jobs.
const PeriodicChannel = ChannelDefault

// PeriodicEveryMin is the shortest Periodic.Every.
const PeriodicEveryMin = time.Second

// PeriodicOrigin is the Origin of a periodic job.
const PeriodicOrigin = "periodic"

// periodicWaitMax bounds a periodic loop's sleep, so that a wall clock
// that jumps is noticed.
const periodicWaitMax = time.Minute

// periodicSchedule gives a schedule's ticks.
type periodicSchedule interface {
	// prev is the latest tick at or before t; ok is false when there is
	// none.
	prev(t time.Time) (time.Time, bool)
	// next is the first tick after t.
	next(t time.Time) (time.Time, bool)
}

// everySchedule ticks at the multiples of its duration since the zero time.
type everySchedule time.Duration

func (e everySchedule) prev(t time.Time) (time.Time, bool) {
	return t.Truncate(time.Duration(e)).UTC(), true
}

func (e everySchedule) next(t time.Time) (time.Time, bool) {
	return t.Truncate(time.Duration(e)).Add(time.Duration(e)).UTC(), true
}

// periodicEntry is one schedule a client runs.
type periodicEntry struct {
	p           Periodic
	sched       periodicSchedule
	version     int
	fingerprint string
	last        time.Time // the latest tick enqueued (or found enqueued); zero: none
}

// periodicRunner enqueues a client's periodic jobs. Tests read its ticks
// (done) and wake it after moving the client's clock.
type periodicRunner struct {
	c       *Client
	entries []*periodicEntry
	wake    chan struct{}

	mu   sync.Mutex
	done map[string]time.Time // by name: the latest tick enqueued
}

// checkPeriodic validates cfg.Periodic against the registered kinds; its
// error names the schedule and the field. Called by Start with mu held.
func (c *Client) checkPeriodic() (*periodicRunner, error) {
	if len(c.cfg.Periodic) == 0 {
		return nil, nil
	}
	r := &periodicRunner{c: c, wake: make(chan struct{}, 1), done: map[string]time.Time{}}
	names := map[string]bool{}
	for i, p := range c.cfg.Periodic {
		where := fmt.Sprintf("ClientConfig.Periodic[%d] (%q)", i, p.Name)
		switch {
		case p.Name == "" || len(p.Name) > 64 || !isPlainToken(p.Name):
			return nil, fmt.Errorf("%s: Name must be 1 to 64 letters, digits, '-' or '_'", where)
		case names[p.Name]:
			return nil, fmt.Errorf("%s: Name is used by another schedule", where)
		}
		names[p.Name] = true
		k := c.kinds[p.Type]
		if k == nil {
			return nil, fmt.Errorf("%s: Type %q is not a registered kind", where, p.Type)
		}
		e := &periodicEntry{p: p, version: k.version}
		switch {
		case p.Every != 0 && p.Cron != "":
			return nil, fmt.Errorf("%s: both Every and Cron are set; set one", where)
		case p.Every == 0 && p.Cron == "":
			return nil, fmt.Errorf("%s: neither Every nor Cron is set; set one", where)
		case p.Cron != "":
			cs, err := parseCron(p.Cron)
			if err != nil {
				return nil, fmt.Errorf("%s: Cron: %w", where, err)
			}
			e.sched = cs
		case p.Every < PeriodicEveryMin:
			return nil, fmt.Errorf("%s: Every %v is under %v", where, p.Every, PeriodicEveryMin)
		default:
			e.sched = everySchedule(p.Every)
		}
		if len(p.Input) == 0 {
			e.p.Input = json.RawMessage("null")
		} else if !json.Valid(p.Input) {
			return nil, fmt.Errorf("%s: Input is not valid JSON", where)
		}
		if err := k.decode(e.p.Input); err != nil {
			return nil, fmt.Errorf("%s: Input does not decode into kind %q's input type: %w", where, p.Type, err)
		}
		sum := sha256.Sum256([]byte(fmt.Sprintf("%s\x00%d\x00%s", p.Type, k.version, e.p.Input)))
		e.fingerprint = "periodic-" + hex.EncodeToString(sum[:16])
		r.entries = append(r.entries, e)
	}
	return r, nil
}

// startPeriodic runs r (nil: nothing) until ctx ends or the client stops.
func (c *Client) startPeriodic(ctx context.Context, r *periodicRunner) {
	if r == nil {
		return
	}
	c.periodic = r
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		r.run(ctx)
	}()
}

// periodicID is the id, idempotency key and target key of a tick's job.
func periodicID(name string, tick time.Time) string {
	return "periodic-" + name + "-" + tick.UTC().Format(time.RFC3339Nano)
}

// run enqueues the latest tick of each schedule at or before now whenever
// it is newer than the last one enqueued, then sleeps until the next tick
// (at most periodicWaitMax; RecheckInterval after a failed enqueue).
func (r *periodicRunner) run(ctx context.Context) {
	c := r.c
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-c.stopCh:
			return
		case <-ctx.Done():
			return
		case <-timer.C:
		case <-r.wake:
		}
		now := c.cfg.Now()
		wait := periodicWaitMax
		for _, e := range r.entries {
			if tick, ok := e.sched.prev(now); ok && tick.After(e.last) {
				if err := r.enqueue(ctx, e, tick); err != nil {
					if ctx.Err() != nil {
						return
					}
					c.cfg.Logger.LogAttrs(ctx, slog.LevelWarn, "jobs: periodic job not enqueued; retrying",
						slog.String("periodic", e.p.Name), slog.Time("tick", tick), slog.String("error", err.Error()))
					wait = min(wait, c.cfg.RecheckInterval)
				}
			}
			if next, ok := e.sched.next(now); ok {
				wait = min(wait, next.Sub(now))
			}
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
		timer.Reset(max(wait, 0))
	}
}

// enqueue enqueues tick's job of e. A replay (another client came first)
// and a conflict (another Input for the tick) count as enqueued.
func (r *periodicRunner) enqueue(ctx context.Context, e *periodicEntry, tick time.Time) error {
	id := periodicID(e.p.Name, tick)
	_, err := r.c.Enqueue(ctx, EnqueueRequest{
		ID: id, ChannelID: PeriodicChannel, Type: e.p.Type, Version: e.version, Origin: PeriodicOrigin,
		TargetKey: id, IdempotencyKey: id, Fingerprint: e.fingerprint, Input: e.p.Input,
	})
	var rejected *RejectedError
	switch {
	case err == nil:
	case errors.As(err, &rejected):
		// The kind's key policy refused it: the tick's decision is made.
		r.c.cfg.Logger.LogAttrs(ctx, slog.LevelWarn, "jobs: periodic job rejected by its kind's key policy",
			slog.String("periodic", e.p.Name), slog.Time("tick", tick), slog.String("error", err.Error()))
	case errors.Is(err, ErrConflict):
		// Another client enqueued the tick with another Input (or the id
		// is taken): the tick has its job.
		r.c.cfg.Logger.LogAttrs(ctx, slog.LevelWarn, "jobs: periodic job of this tick was enqueued with another input",
			slog.String("periodic", e.p.Name), slog.Time("tick", tick), slog.String("error", err.Error()))
	default:
		return err
	}
	e.last = tick
	r.mu.Lock()
	r.done[e.p.Name] = tick
	r.mu.Unlock()
	return nil
}
