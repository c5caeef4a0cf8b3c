package jobkeys

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"
)

// BlockedError is the error for a job that did not get a slot. It wraps
// [ErrBlocked].
type BlockedError struct {
	JobID       string      // the job that got no slot
	Acquisition Acquisition // the last blocked outcome: its Reason, Active, Queued and Limit say why
}

// Error implements the error interface.
func (e *BlockedError) Error() string {
	a := &e.Acquisition
	return fmt.Sprintf("%v: job %q on key %q: %s (%d active, %d queued, limit %d)",
		ErrBlocked, e.JobID, a.DisplayKey, a.Reason, a.Active, a.Queued, a.Limit)
}

// Unwrap returns [ErrBlocked].
func (e *BlockedError) Unwrap() error { return ErrBlocked }

// Runner defaults, used for zero-valued [RunnerConfig] fields.
const (
	RecheckIntervalDefault = 5 * time.Second
	ReleaseTimeoutDefault  = 10 * time.Second
)

// RunnerConfig configures a [Runner]. The zero value is ready to use and
// polls while blocked; set Watcher to wake on release instead.
type RunnerConfig struct {
	// Watcher wakes a blocked Run as soon as the job's key changes. It must
	// watch the coordinator's store, and stay open while Runs wait: a Run
	// whose watch cannot start (or restart) fails with that error. Without
	// one, a blocked Run re-checks every RecheckInterval. Over a NATSStore
	// made with [WithWakeUps], a blocked Run of a queued job waits for its
	// own job's wake-ups instead of the watch. Defaults to nil.
	Watcher *Watcher

	// RecheckInterval is how often a blocked Run tries again when nothing
	// woke it: the safety net for a missed change with a Watcher (and for
	// a wake-up nobody sent, such as after a write by a process without
	// [WithWakeUps] or by the TS original), the poll interval without one. A blocked Run also re-checks when the earliest
	// lease it saw expires. Defaults to RecheckIntervalDefault (5s).
	RecheckInterval time.Duration

	// MaxWait bounds how long Run waits for a slot; then it returns a
	// [*BlockedError]. 0 means until the context ends. Defaults to 0.
	MaxWait time.Duration

	// ReleaseTimeout bounds the release after the handler returns. The
	// release does not use the caller's context, so that a cancelled caller
	// still frees its slot. Defaults to ReleaseTimeoutDefault (10s).
	ReleaseTimeout time.Duration

	// OnBlocked, if set, is called once per Run that has to wait, with the
	// job id and the blocked outcome, just before it starts waiting (never
	// by TryRun). It runs on Run's goroutine and should return quickly.
	OnBlocked func(jobID string, blocked Acquisition)

	// OnStale, if set, is called when an acquisition dropped the expired
	// slots of other jobs (FailStale), before the handler starts, so that
	// the caller can record those jobs as failed even if the handler then
	// panics. The same slots are in RunResult.Stale. It runs on Run's
	// goroutine while the slot is held; a panic in it releases the slot.
	OnStale func(lease Lease, stale []ActiveSlot)

	// Logger receives the Runner's logs: failed renewals (warn) and lost
	// leases (warn). The Runner's metrics go to the coordinator's
	// Config.MeterProvider. Defaults to nil: no logs.
	Logger *slog.Logger
}

// Runner runs jobs of one [JobType] under leases: it acquires a slot
// (waiting while the key is busy), runs the handler while renewing the lease
// every Policy.HeartbeatInterval, cancels the handler's context when the
// lease is lost, and releases the slot on every exit. It works only through
// the JobType's methods, and measures time with the local monotonic clock.
//
// Create it with [NewRunner]. It is safe for concurrent use: one Runner
// serves all of a process's workers of its job type, and Runners of several
// job types can share one [Watcher]. The zero value is not usable.
type Runner struct {
	jt     *JobType
	policy Policy // jt's
	cfg    RunnerConfig
	obs    *runnerObserver // metrics and logs; nil: none
	// rechecks counts the tries of blocked Runs that their recheck timer
	// (RecheckInterval, or a lease's expiry) started, not a wake-up.
	rechecks atomic.Int64
}

// NewRunner returns a runner of jt's jobs. cfg may be nil for the defaults;
// a bad value is an error naming the field.
func NewRunner(jt *JobType, cfg *RunnerConfig) (*Runner, error) {
	if jt == nil {
		return nil, fmt.Errorf("%w: job type is nil", ErrInvalidRequest)
	}
	var c RunnerConfig
	if cfg != nil {
		c = *cfg
	}
	switch {
	case c.RecheckInterval == 0:
		c.RecheckInterval = RecheckIntervalDefault
	case c.RecheckInterval < time.Millisecond:
		return nil, fmt.Errorf("%w: RunnerConfig.RecheckInterval %v is less than 1ms", ErrInvalidRequest, c.RecheckInterval)
	}
	if c.MaxWait < 0 {
		return nil, fmt.Errorf("%w: RunnerConfig.MaxWait %v is negative", ErrInvalidRequest, c.MaxWait)
	}
	switch {
	case c.ReleaseTimeout == 0:
		c.ReleaseTimeout = ReleaseTimeoutDefault
	case c.ReleaseTimeout < 0:
		return nil, fmt.Errorf("%w: RunnerConfig.ReleaseTimeout %v is negative", ErrInvalidRequest, c.ReleaseTimeout)
	}
	return &Runner{jt: jt, policy: jt.Policy(), cfg: c, obs: newRunnerObserver(jt, c.Logger)}, nil
}

// Handler is the work of one job. ctx is cancelled when the caller's context
// ends or the lease is lost; context.Cause(ctx) then wraps [ErrLeaseLost] or
// is the caller's cause. A handler should stop promptly when ctx is done.
type Handler func(ctx context.Context, lease Lease) error

// RunResult says what happened to a job's slot in [Runner.Run].
type RunResult struct {
	// Lease is the lease the handler ran under; zero when it did not run.
	Lease Lease
	// Stale lists expired slots of other jobs that the acquisition dropped
	// under FailStale: record those jobs as failed.
	Stale []ActiveSlot
	// Waited is how long Run waited for the slot: from the first blocked
	// attempt to the acquisition; 0 when the first attempt acquired.
	Waited time.Duration
	// Release is KindReleased, or KindStaleCompletion when the slot was gone
	// at release; empty when the handler did not run or the release failed.
	Release Kind
	// LeaseLost is the cause the handler's context was cancelled with when
	// the lease was lost (it wraps ErrLeaseLost); nil otherwise.
	LeaseLost error
}

// Run acquires a slot for job jobID on its payload's key (as
// [JobType.Acquire] does, with the same options), runs handler under its
// lease, and releases the slot when handler returns, fails or panics (the
// panic continues after the release). While the key is busy it waits: for the key
// to change (with a Watcher), for the earliest lease it saw to expire, or
// RecheckInterval, whichever comes first, and tries again; it gives up when
// ctx ends (returning ctx.Err(), with no slot of the job left behind and
// the job still queued: see [JobType.Acquire]) or after MaxWait (returning
// a [*BlockedError]). A job that is not queued, and not a retry, is never
// waited for: it returns a *BlockedError with [ReasonNotQueued] at once.
//
// With a Watcher that feeds the key's state to the coordinator (it does
// while, and for a second after, any of the coordinator's Runs waits on
// the key through it), a Run whose job that state has queued behind at
// least as many jobs as there are free slots does not try at once, which
// would take a slot ahead of them: it waits for its turn as a woken waiter
// does (see [Watcher]), passing over jobs ahead that do not take their
// turns after a short grace per job. Without such a feed (no Watcher, or
// the key not waited on lately) and for retries, the first try takes any
// free slot.
//
// Over targeted wake-ups (a NATSStore made with [WithWakeUps]), a blocked
// Run of a queued job waits for wake-ups sent to its own job, not the
// watch: the write that leaves a slot free for it (in any process with
// wake-ups on) sends it a wake-up, and the Run tries at once. A wake-up
// from another process is a hint, which anyone allowed to publish on its
// subject may have sent: the Run reads the key first, unless its
// coordinator holds the revision the wake-up names already (the
// Watcher's watch, its own write); one a write in its own process hands
// over in memory carries the state, and the Run writes on it without a
// read. A try whose compare-and-swap loses waits for
// the next wake-up, which the write it lost to sends if that write leaves
// a slot free. A first try whose coordinator just saw the job queued
// behind as many jobs as there are free slots waits for its wake-up
// without trying.
//
// The error is nil when the handler returned nil and the slot was released.
// Otherwise it is the acquisition's error (the handler did not run; one
// wrapping [ErrClockSkew], from a host whose clock is too far from the
// server's, is returned at once, not waited out), or the
// handler's error joined with an error wrapping [ErrStaleCompletion] when the
// slot was gone at release, or with the release's own error. The result
// tells the same in fields, and lists stale slots the acquisition dropped.
func (r *Runner) Run(ctx context.Context, jobID string, payload any, handler Handler, opts ...AcquireOption) (RunResult, error) {
	return r.run(ctx, jobID, payload, handler, opts, true)
}

// TryRun is [Runner.Run] without waiting: when the key is busy it returns a
// [*BlockedError] at once, for a caller that would rather retry later (a
// JetStream consumer that naks with a delay).
func (r *Runner) TryRun(ctx context.Context, jobID string, payload any, handler Handler, opts ...AcquireOption) (RunResult, error) {
	return r.run(ctx, jobID, payload, handler, opts, false)
}

func (r *Runner) run(ctx context.Context, jobID string, payload any, handler Handler, opts []AcquireOption, wait bool) (RunResult, error) {
	if handler == nil {
		return RunResult{}, fmt.Errorf("%w: handler is nil", ErrInvalidRequest)
	}
	acq, deadline, waited, err := r.acquire(ctx, jobID, payload, opts, wait)
	if err != nil {
		r.obs.acquireFailed(ctx, err)
		return RunResult{}, err
	}
	return r.runHeld(ctx, RunResult{Lease: acq.Lease, Stale: acq.Stale, Waited: waited}, deadline, handler)
}

// acquire gets a slot, waiting while blocked if wait is set, and says until
// when (local clock) the lease lasts at least and how long it waited.
func (r *Runner) acquire(ctx context.Context, jobID string, payload any, opts []AcquireOption, wait bool) (Acquisition, time.Time, time.Duration, error) {
	w := slotWait{r: r, ctx: ctx, jobID: jobID, opts: opts}
	// The job's key, derived once for every try (its error is each try's).
	w.key, w.keyErr = r.jt.key(jobID, payload)
	defer w.close()
	// Over targeted wake-ups (see WithWakeUps), a waiting Run waits for
	// the wake-ups of its own job, not the Watcher's watch, and a try
	// that trusts starts from the state its coordinator last saw stored,
	// without a read unless a wake-up from another process named a later
	// revision (see keycache.Entry.Hinted); one whose write loses waits for
	// the next wake-up (see waitTry.wake). A retry (WithRetry) is not
	// queued, so no wake-up names its job: it waits on the watch.
	w.wakes = wait && r.cfg.Watcher.wakeUps() != nil && !retryOf(opts)
	if done, acq, deadline, err := w.first(wait); done {
		return acq, deadline, 0, err
	}
	return w.wait()
}

// slotWait is one Runner.acquire: its first try (first), then, blocked,
// its wait (wait): a subscription (subscribeWakes, subscribeWatch), a
// wait for a wake-up, a change, its turn or a recheck (block), and a try
// (try), until a slot is taken or the wait ends.
type slotWait struct {
	r      *Runner
	ctx    context.Context
	jobID  string
	opts   []AcquireOption
	key    JobKey
	keyErr error
	// wakes: the Run waits for its own job's targeted wake-ups.
	wakes bool
	sub   *Subscription // nil until it subscribes, and after one ended
	// acq is the last try's outcome (or the blocked outcome by the fed
	// state, see behind).
	acq  Acquisition
	seen uint64 // the revision the last try's outcome rested on; 0 unknown
	// ahead is, after a try in turn (see waitTry.inTurn) that found the
	// job queued behind the jobs that may take the free slots, how many of
	// them are before its turn; else 0.
	ahead int
	// tried says a try was made: a later one (a recheck of a Run without
	// a Watcher) is a waiting try too (waitTry), whose outcome's revision
	// is kept in seen.
	tried bool
	// behind is the revision of the fed state by which the job is queued
	// behind the jobs that may take the free slots: it does not try
	// before its turn (see queuedBehind); 0 when it tries.
	behind uint64
	// turnAt is, over wake-ups, when a Run queued behind free slots tries
	// anyway; zero: never.
	turnAt  time.Time
	waiting bool // counted as waiting (OnBlocked called)
	giveUp  <-chan time.Time
	recheck *time.Timer
}

// close ends the wait: its subscription, and its count as waiting.
func (w *slotWait) close() {
	if w.waiting {
		w.r.obs.waiting(w.ctx, -1)
	}
	if w.sub != nil {
		w.sub.Close()
	}
}

// try tries to take a slot; trust lets it find the key busy on the state
// the Watcher delivered, without a read (the safety-net recheck reads);
// inTurn keeps the queue's order (see waitTry.inTurn). The deadline is
// until when the lease lasts at least.
func (w *slotWait) try(trust, inTurn bool) (Acquisition, time.Time, error) {
	var wt *waitTry
	switch {
	case w.wakes && trust:
		wt = &waitTry{wake: true, inTurn: inTurn}
	case w.sub != nil || trust || inTurn || w.tried:
		wt = &waitTry{trustWatch: trust, inTurn: inTurn}
	}
	w.tried = true
	w.sub.beginTry()
	// The coordinator's clock reads later than start: the lease lasts at
	// least TTL from start.
	start := time.Now()
	acq, err := Acquisition{}, w.keyErr
	if err == nil {
		acq, err = w.r.jt.acquire(w.ctx, w.key, w.jobID, w.opts, wt)
	}
	if w.seen, w.ahead = 0, 0; wt != nil {
		w.seen, w.ahead = wt.rev, wt.ahead
	}
	if err == nil && acq.Kind != KindAcquired && w.sub != nil {
		w.sub.rearm(w.seen) // wait to be woken by a change that frees a slot
	}
	w.acq = acq
	return acq, start.Add(w.r.policy.HeartbeatTTL), err
}

// first makes the Run's first try, unless the fed state has the job
// queued behind others (behind); done says acquire returns its result.
func (w *slotWait) first(wait bool) (done bool, _ Acquisition, _ time.Time, _ error) {
	r := w.r
	// The first try of a Run trusts what the Watcher still feeds of the
	// key from this process's last wait on it (see keyWatch.linger), if
	// anything: finding the key busy, it waits. TryRun's answer is final
	// and must not rest on a feed that may lag behind the call: it does not.
	trusted := r.cfg.Watcher != nil && wait
	if trusted {
		w.acq, w.behind = r.queuedBehind(w.key, w.keyErr, w.jobID, w.opts, w.wakes)
	}
	if w.behind != 0 {
		return false, Acquisition{}, time.Time{}, nil
	}
	acq, deadline, err := w.try(trusted, w.wakes)
	if trusted && err == nil && acq.Kind != KindAcquired && acq.Reason == ReasonNotQueued {
		// Not queued, which is final, may be the feed lagging behind the
		// job's admission: only a read tells.
		acq, deadline, err = w.try(false, w.wakes)
	}
	if err != nil || acq.Kind == KindAcquired {
		return true, acq, deadline, err
	}
	if !wait || acq.Reason == ReasonNotQueued {
		return true, Acquisition{}, time.Time{}, &BlockedError{JobID: w.jobID, Acquisition: acq}
	}
	return false, Acquisition{}, time.Time{}, nil
}

// wait waits, blocked, for a slot, and says how long it waited.
func (w *slotWait) wait() (Acquisition, time.Time, time.Duration, error) {
	r := w.r
	blockedAt := time.Now()
	if r.cfg.MaxWait > 0 {
		t := time.NewTimer(r.cfg.MaxWait)
		defer t.Stop()
		w.giveUp = t.C
	}
	w.recheck = time.NewTimer(r.cfg.RecheckInterval)
	defer w.recheck.Stop()
	w.inTurnAt()
	for {
		// Over wake-ups, the Run's first try and its try right after
		// subscribing keep the queue's order (see waitTry.inTurn): such a
		// try, on a state read or remembered, must not take a slot a
		// wake-up is on its way for to a job ahead of it. Its other tries
		// do not: one a wake-up, its turn, a lease's expiry or a recheck
		// started.
		trust, inTurn, now, err := w.next()
		if err != nil {
			return Acquisition{}, time.Time{}, 0, err
		}
		if !now {
			continue
		}
		acq, deadline, err := w.try(trust, inTurn && w.wakes)
		if err != nil || acq.Kind == KindAcquired {
			return acq, deadline, time.Since(blockedAt), err
		}
		w.inTurnAt()
		if acq.Reason == ReasonNotQueued {
			return Acquisition{}, time.Time{}, 0, &BlockedError{JobID: w.jobID, Acquisition: acq}
		}
	}
}

// next is one step of the wait: it subscribes if the Run has no
// subscription, else it waits for what starts the next try (see block).
// now says to try at once, with trust and inTurn (see try); else the
// wait goes on.
func (w *slotWait) next() (trust, inTurn, now bool, err error) {
	switch {
	case w.sub == nil && w.wakes:
		return w.subscribeWakes()
	case w.sub == nil && w.r.cfg.Watcher != nil:
		trust, now, err = w.subscribeWatch()
		return trust, false, now, err
	default:
		trust, err = w.block()
		return trust, false, err == nil, err
	}
}

// inTurnAt sets, after a try blocked in turn behind the jobs the free
// slots are for, when it tries anyway should no wake-up come first: when
// its turn would come by the Watcher's rule (see keyWatch.turn).
func (w *slotWait) inTurnAt() {
	if w.ahead > 0 {
		w.turnAt = time.Now().Add(wakeTurn(w.ahead))
		if w.sub != nil && w.sub.wake != nil {
			// The jobs ahead may have nobody waiting for them: their
			// wake-up passes them over to this one.
			w.r.jt.coord.wakeAhead(w.r.jt.Service(), w.sub.kvKey, w.sub.wake.entry, w.seen, w.jobID, w.r.policy)
		}
	}
}

// subscribeWakes subscribes to the job's targeted wake-ups, and says
// whether to try at once, on what (see next).
func (w *slotWait) subscribeWakes() (trust, inTurn, now bool, err error) {
	r := w.r
	kvKey := kvKeyFor(r.jt.Service(), r.jt.Name(), w.acq.KeyHash)
	if w.sub, err = r.cfg.Watcher.subscribeWake(r.jt.Service(), kvKey, w.jobID, r.jt.coord.keys); err != nil {
		return false, false, false, fmt.Errorf("jobkeys: wait for a slot for job %q: %w (a Runner without a Watcher polls instead)", w.jobID, err)
	}
	if w.behind != 0 {
		w.seen = w.behind // not tried: the fed state has it queued behind others
		if free := w.acq.Limit - w.acq.Active; free > 0 {
			// Slots are free for the jobs ahead, whose Runs, if they
			// wait, are woken; if no write follows (they do not wait,
			// and nobody else writes), nothing wakes this one: it tries
			// when its turn would come by the Watcher's rule (see
			// keyWatch.turn).
			if i := w.sub.wake.entry.queuedIndex(w.jobID); i >= free {
				w.turnAt = time.Now().Add(wakeTurn(i - free + 1))
				r.jt.coord.wakeAhead(r.jt.Service(), kvKey, w.sub.wake.entry, w.behind, w.jobID, r.policy)
			}
		}
	}
	if w.behind = 0; w.ahead > 0 {
		// Its first try found it queued behind the jobs the free slots
		// are for (see inTurnAt).
		r.jt.coord.wakeAhead(r.jt.Service(), kvKey, w.sub.wake.entry, w.seen, w.jobID, r.policy)
	}
	// A wake-up sent before the subscription reached the server is sent
	// again shortly by its writer when nobody took it (see WithWakeUps),
	// so a state whose request went out just before the server confirmed
	// the subscription (subscribeWake waits for that; see wakeTrustSent),
	// or, learned otherwise, that arrived just before (wakeTrustAge), is a
	// safe place to wait from. One older is not: it reads. A later state
	// the coordinator learned meanwhile is tried.
	rev, at, sent := w.sub.wake.entry.Learned()
	fresh := time.Since(at) <= wakeTrustAge
	if !sent.IsZero() {
		fresh = time.Since(sent) < wakeTrustSent
	}
	switch {
	case rev == 0 || !fresh:
		return false, true, true, nil
	case rev > w.seen:
		return true, true, true, nil
	default:
		return false, false, false, nil // wait
	}
}

// subscribeWatch subscribes to the key's changes through the Watcher, and
// says whether to try at once (trusting the feed) or wait (see next).
func (w *slotWait) subscribeWatch() (trust, now bool, err error) {
	r := w.r
	kvKey := kvKeyFor(r.jt.Service(), r.jt.Name(), w.acq.KeyHash)
	// A waiter's subscription wakes it only when a change frees a slot,
	// and feeds the key's changes to the coordinator.
	if w.sub, err = r.cfg.Watcher.subscribeQueued(w.ctx, r.jt.Service(), kvKey, w.jobID, r.policy.MaxActive, r.jt.coord.keys, w.behind, retryOf(w.opts)); err != nil {
		if w.ctx.Err() != nil {
			return false, false, w.ctx.Err()
		}
		return false, false, fmt.Errorf("jobkeys: wait for a slot for job %q: %w (a Runner without a Watcher polls instead)", w.jobID, err)
	}
	if w.behind == 0 && w.sub.waiter.table != nil {
		// The key may have changed before the subscription; if the feed
		// now has the job queued behind others, it is their turn first:
		// it waits as if it had found the key busy just before that
		// state.
		var ahead Acquisition
		if ahead, w.behind = r.queuedBehind(w.key, w.keyErr, w.jobID, w.opts, false); w.behind != 0 {
			w.acq = ahead
			w.sub.rearm(w.behind - 1)
		}
	}
	if w.behind != 0 {
		// Its turn comes after the jobs queued ahead of it: the Watcher
		// wakes it then, as it wakes a waiter.
		w.behind = 0
		return false, false, nil
	}
	// The key may have changed before the subscription: look again.
	return true, true, nil
}

// block waits, subscribed or polling, for what starts the next try: a
// change or wake-up (trusted), the subscription's end, a lease's expiry,
// its turn or a recheck (not trusted). It fails when ctx ends or MaxWait
// passes.
func (w *slotWait) block() (trust bool, err error) {
	r := w.r
	if !w.waiting {
		if r.cfg.OnBlocked != nil {
			r.cfg.OnBlocked(w.jobID, w.acq)
		}
		r.obs.waiting(w.ctx, 1)
		w.waiting = true
	}
	d := r.cfg.RecheckInterval
	if !w.acq.NextExpiry.IsZero() {
		// A lease that expires frees its slot (FailStale) without any
		// write to the key. (NextExpiry is on the coordinator's clock;
		// should that be another, this only changes when the key is
		// looked at again.)
		d = min(d, time.Until(w.acq.NextExpiry)+time.Millisecond)
	}
	if !w.turnAt.IsZero() {
		d = min(d, time.Until(w.turnAt))
	}
	w.recheck.Reset(max(d, time.Millisecond))
	var changed, ended <-chan struct{}
	if w.sub != nil {
		changed, ended = w.sub.Changed(), w.sub.Done()
	}
	select {
	case <-w.ctx.Done():
		return false, w.ctx.Err()
	case <-w.giveUp:
		return false, &BlockedError{JobID: w.jobID, Acquisition: w.acq}
	case <-changed:
		return true, nil
	case <-ended:
		w.sub.Close()
		w.sub = nil
		return false, nil
	case <-w.recheck.C:
		if !w.turnAt.IsZero() && !time.Now().Before(w.turnAt) {
			w.turnAt = time.Time{} // its turn, not a recheck
		} else {
			r.rechecks.Add(1)
		}
		return false, nil
	}
}

// queuedBehind returns, for the first try of a Run with a Watcher, the
// blocked outcome and the revision of the watch-fed state of the job's key
// when by that state the job is queued behind at least as many jobs as
// there are free slots (see keyTable.queuedBehind): trying now would take
// a slot ahead of jobs queued before it, which the reducer allows but the
// queue's order does not, or find the key busy. Such a Run waits for its
// turn as a waiter does (see keyWatch.turn). The outcome says
// ReasonActiveLimit, with Active the live slots seen, fewer than Limit when
// the slots left free are the turns of the jobs ahead. It returns 0 when
// the try may go ahead: the coordinator's entry of the key is not fed by a
// watch or not trusted (no read is made to learn the queue), the state
// does not have the job queued (the feed may lag behind its admission:
// the try reads), the job is among the first free queued ones or holds a
// slot, or it is a retry (WithRetry), which the reducer lets take a slot
// whether queued or not.
func (r *Runner) queuedBehind(key JobKey, keyErr error, jobID string, opts []AcquireOption, cached bool) (Acquisition, uint64) {
	t := r.jt.coord.keys
	if t.feeds.Load() == nil && !cached {
		return Acquisition{}, 0 // no Runner of the coordinator waited through a Watcher: nothing fed
	}
	var req AcquireRequest
	for _, o := range opts {
		if o == nil {
			return Acquisition{}, 0 // the try reports it
		}
		req = o.applyAcquire(req)
	}
	if req.Retry {
		return Acquisition{}, 0
	}
	if keyErr != nil {
		return Acquisition{}, 0 // the try reports it
	}
	return t.queuedBehind(key, jobID, r.policy.MaxActive, time.Now(), cached)
}

// runHeld runs handler under res.Lease, which lasts at least until deadline
// (local clock) unless renewed, and releases the slot on every exit.
func (r *Runner) runHeld(ctx context.Context, acquired RunResult, deadline time.Time, handler Handler) (res RunResult, err error) {
	res = acquired
	lease := res.Lease
	r.obs.running(ctx, 1)
	defer r.obs.running(ctx, -1)
	hctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)

	// Heartbeats do not stop with the caller's context: a handler that is
	// still running still holds its slot.
	hbCtx, stopHeartbeats := context.WithCancel(context.WithoutCancel(ctx))
	hbDone := make(chan struct{})
	var lost error // written by the heartbeat goroutine before hbDone closes
	go func() {
		defer close(hbDone)
		lost = r.heartbeat(hbCtx, lease, deadline)
		if lost != nil {
			r.obs.leaseLost(hbCtx, &lease, lost)
			cancel(lost)
		}
	}()

	panicked := true
	defer func() {
		stopHeartbeats()
		<-hbDone
		cancel(nil)
		res.LeaseLost = lost

		rctx, cancelRelease := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.ReleaseTimeout)
		rel, relErr := r.jt.Release(rctx, lease)
		cancelRelease()
		if panicked {
			return // the panic (or runtime.Goexit) continues; nobody sees the result
		}
		var errs []error
		if err != nil {
			errs = append(errs, err)
		}
		switch {
		case relErr != nil:
			errs = append(errs, fmt.Errorf("jobkeys: release job %q on key %q: %w", lease.JobID, lease.DisplayKey, relErr))
		case rel.Kind == KindStaleCompletion:
			res.Release = rel.Kind
			errs = append(errs, fmt.Errorf("%w: job %q on key %q: the slot was gone at release (taken over or swept after the lease expired)", ErrStaleCompletion, lease.JobID, lease.DisplayKey))
		default:
			res.Release = rel.Kind
		}
		switch len(errs) {
		case 0:
			err = nil
		case 1:
			err = errs[0]
		default:
			err = errors.Join(errs...)
		}
	}()
	if len(res.Stale) > 0 && r.cfg.OnStale != nil {
		r.cfg.OnStale(lease, res.Stale)
	}
	err = handler(hctx, lease)
	panicked = false
	return res, err
}

// heartbeatRetryFloor is the shortest pause between renewal attempts after a
// failed one.
const heartbeatRetryFloor = 10 * time.Millisecond

// heartbeat renews lease every HeartbeatInterval until ctx ends (nil) or the
// lease is lost (the cause, wrapping ErrLeaseLost). After a failed renewal it
// tries again sooner, and gives up when the lease may have expired: at
// expires on the local clock, which every renewal moves to TTL after the
// renewal started.
func (r *Runner) heartbeat(ctx context.Context, lease Lease, expires time.Time) error {
	interval, ttl := r.policy.HeartbeatInterval, r.policy.HeartbeatTTL
	kvKey := kvKeyFor(lease.Service, lease.JobType, lease.KeyHash)
	var lastErr error
	t := time.NewTimer(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		start := time.Now()
		remaining := expires.Sub(start)
		if remaining <= 0 {
			return leaseExpired(lease, kvKey, lease.LeaseExpiresAt, lastErr)
		}
		rctx, cancel := context.WithTimeout(ctx, remaining)
		out, err := r.jt.Renew(rctx, lease)
		cancel()
		if ctx.Err() != nil {
			return nil
		}
		next := interval
		switch {
		case err != nil:
			if lastErr == nil || !errors.Is(err, context.DeadlineExceeded) {
				// Keep the renewal error that says why over an attempt
				// cut short by the lease's expiry.
				lastErr = err
			}
			remaining = time.Until(expires)
			if remaining <= 0 {
				return leaseExpired(lease, kvKey, lease.LeaseExpiresAt, lastErr)
			}
			r.obs.renewFailed(ctx, &lease, kvKey, remaining, err)
			next = min(interval, max(remaining/2, heartbeatRetryFloor))
		case out.Kind == KindLost:
			return fmt.Errorf("%w: job %q on KV key %q: the slot was taken over or released", ErrLeaseLost, lease.JobID, kvKey)
		default:
			expires, lastErr = start.Add(ttl), nil
			lease.LeaseExpiresAt = out.LeaseExpiresAt
		}
		t.Reset(next)
	}
}

func leaseExpired(lease Lease, kvKey string, expires time.Time, lastErr error) error {
	if lastErr == nil {
		lastErr = errors.New("no renewal completed in time")
	}
	return fmt.Errorf("%w: job %q on KV key %q: renewals failed until the lease expired at %s: %w",
		ErrLeaseLost, lease.JobID, kvKey, expires.UTC().Format(time.RFC3339Nano), lastErr)
}

// retryOf reports whether opts make an acquisition a retry (WithRetry).
func retryOf(opts []AcquireOption) bool {
	var req AcquireRequest
	for _, o := range opts {
		if o != nil {
			req = o.applyAcquire(req)
		}
	}
	return req.Retry
}
