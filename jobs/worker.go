package jobs

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/jobkeys/jobkeys"
)

// Start starts the client's workers and its reconciliation: the client
// claims due jobs of every channel, runs each registered kind's jobs
// under their keys' slots, and reconciles every ReconcileInterval. At
// least one kind must be registered. ctx bounds nothing after Start
// returns: only [Client.Stop] stops the client.
func (c *Client) Start(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.state != clientNew {
		return errors.New("jobs: Start: the client was started before")
	}
	if len(c.kinds) == 0 {
		return errors.New("jobs: Start: no kind is registered")
	}
	c.state = clientStarted
	if kw, ok := c.cfg.KeyStore.(jobkeys.WatchableStore); ok {
		w, err := jobkeys.NewWatcher(kw)
		if err == nil {
			c.watcher = w
		}
	}
	var ttl time.Duration
	for _, k := range c.kinds {
		ttl = max(ttl, k.jt.Policy().HeartbeatTTL)
	}
	c.claimTTL = ttl
	c.skewLimit = claimSkewLimit(ttl, c.kinds)
	c.tokens = make(chan struct{}, c.cfg.MaxWorkers)
	bg, cancel := context.WithCancel(context.WithoutCancel(ctx))
	c.bgCancel = cancel
	c.wg.Add(1)
	go c.claimLoop(bg, ttl)
	if c.cfg.ReconcileInterval > 0 {
		// Stop ends a pass in flight: it is cleanup, which the next
		// client's passes redo.
		rctx, rcancel := context.WithCancel(bg)
		c.reconcileCancel = rcancel
		c.wg.Add(1)
		go c.reconcileLoop(rctx)
	}
	return nil
}

// Stop drains the client: it claims nothing more, hands jobs waiting for a
// slot back at once, lets running handlers finish for StopGrace, then
// ends their contexts with [ErrStopping] and hands what did not finish
// back without counting a failure; every slot is released. A
// reconciliation pass in flight is ended (it is cleanup). It returns
// once every job is handed back or finished, or with ctx.Err() when ctx
// ends first (handlers are then cancelled at once, and what is left runs
// down in the background). Stop of a client never started, or stopped
// before, returns nil.
func (c *Client) Stop(ctx context.Context) error {
	c.mu.Lock()
	if c.state != clientStarted {
		c.state = clientStopped
		c.mu.Unlock()
		return nil
	}
	c.state = clientStopped
	close(c.stopCh)
	if c.reconcileCancel != nil {
		c.reconcileCancel()
	}
	c.mu.Unlock()

	done := make(chan struct{})
	go func() {
		c.wg.Wait()
		close(done)
	}()
	grace := time.NewTimer(c.cfg.StopGrace)
	defer grace.Stop()
	var err error
	select {
	case <-done:
	case <-grace.C:
		close(c.killCh)
		select {
		case <-done:
		case <-ctx.Done():
			err = ctx.Err()
		}
	case <-ctx.Done():
		close(c.killCh)
		err = ctx.Err()
	}
	cleanup := func() {
		// Every slot is released: their wake-ups go out before the
		// caller closes the connection (see KeyCoordinator.FlushWakeUps).
		c.coord.FlushWakeUps()
		if c.watcher != nil {
			c.watcher.Close()
		}
		c.bgCancel()
	}
	if err != nil {
		go func() { // once the last handler has returned
			<-done
			cleanup()
		}()
		return err
	}
	cleanup()
	return nil
}

// claimLoop claims due jobs while worker tokens are free, and hands each
// to its own goroutine.
func (c *Client) claimLoop(ctx context.Context, ttl time.Duration) {
	defer c.wg.Done()
	poll := time.NewTimer(0)
	defer poll.Stop()
	for {
		// Reserve the free worker tokens.
		n := 0
		for n < ClaimCountLimit {
			select {
			case c.tokens <- struct{}{}:
				n++
				continue
			default:
			}
			break
		}
		if n == 0 {
			select {
			case <-c.stopCh:
				return
			case <-c.slotFree:
			}
			continue
		}
		if c.clockSkewed(ctx) {
			// Claim nothing this pass; look again after PollInterval (not
			// at every enqueue or freed token: nothing is due to change).
			for range n {
				<-c.tokens
			}
			poll.Reset(c.cfg.PollInterval)
			select {
			case <-c.stopCh:
				return
			case <-poll.C:
			}
			continue
		}
		var claimed []Job
		var err error
		start := time.Now() // the claims' local deadlines count from here
		select {
		case <-c.stopCh:
		default:
			claimed, err = c.store.Claim(ctx, ClaimRequest{Owner: c.cfg.Owner, Count: n, TTL: ttl})
		}
		if err != nil {
			c.cfg.Logger.Warn("jobs: claim", "err", err)
		}
		for _, j := range claimed {
			c.wg.Add(1)
			go c.handle(ctx, j, start)
		}
		for range n - len(claimed) {
			<-c.tokens
		}
		if len(claimed) > 0 && err == nil {
			continue
		}
		poll.Reset(c.cfg.PollInterval)
		select {
		case <-c.stopCh:
			return
		case <-c.wake:
		case <-c.slotFree:
		case <-poll.C:
		}
	}
}

// Clock skew (see Clocks in the package doc). A claim, like a key-layer
// lease, is a timestamp of the host that wrote it compared against the
// clock of whichever host claims next: a host whose clock runs ahead sees
// live claims expired and takes their jobs over (the holder's next write
// fails, its run ends with ErrClaimLost), and one whose clock runs behind
// writes claims the other hosts see expire early. The key coordinator
// bounds its clock's offset from the NATS server's (from server times its
// store sees anyway, and a rare probe: [jobkeys.KeyCoordinator.ClockOffset]
// does no I/O but one stream info request per ten seconds at most), and
// the claim loop asks it once per pass, not per claim.
//
// Only claims are refused. Renewals and settles of claims already held go
// on: they extend or end a claim this host holds, and refusing them would
// let it lapse early in the other hosts' eyes and its job be claimed
// again while its handler still runs, the overlap the check prevents (the
// key layer keeps renewing the job's slot for the same reason).

// clockSkewTimeout bounds a pass's clock check (a bucket open or a probe,
// when one is due): a check that fails knows nothing and refuses nothing.
const clockSkewTimeout = 5 * time.Second

// claimSkewLimit is the least offset from the server's clock at which a
// client whose claims last ttl (the longest HeartbeatTTL of kinds) claims
// nothing: half the skew between hosts its claims tolerate. A claim is
// renewed at the latest half its TTL before it expires (a job waiting for
// a slot), or every HeartbeatInterval (a running one): what is left of it
// when it is renewed, ttl less the longer of those gaps, is how far ahead
// another host's clock may be before it sees the claim expired; a host
// within half that of the server is within all of it of every other such
// host.
func claimSkewLimit(ttl time.Duration, kinds map[string]*kind) time.Duration {
	gap := ttl / 2
	for _, k := range kinds {
		gap = max(gap, k.jt.Policy().HeartbeatInterval)
	}
	return (ttl - gap) / 2
}

// clockSkewed reports whether the coordinator proves its clock at least
// skewLimit away from the server's, and logs when that changes. Called by
// the claim loop before each pass.
func (c *Client) clockSkewed(ctx context.Context) bool {
	if c.coord.IgnoresClockSkew() {
		return false
	}
	cctx, cancel := context.WithTimeout(ctx, clockSkewTimeout)
	off, err := c.coord.ClockOffset(cctx, c.cfg.Service)
	cancel()
	if err != nil {
		return false // nothing known: the claim goes on as without the check
	}
	var got time.Duration // the least |offset| the bounds allow
	dir := "behind"
	switch {
	case off.MinKnown && off.Min > 0:
		got = off.Min
	case off.MaxKnown && off.Max < 0:
		got, dir = -off.Max, "ahead of"
	}
	skewed := got > 0 && got >= c.skewLimit
	if skewed != c.skewed {
		c.skewed = skewed
		if skewed {
			c.cfg.Logger.Warn("jobs: clock skew: claiming nothing while this host's clock is too far from the NATS server's (fix the host's time sync, or set the coordinator's Config.IgnoreClockSkew if the server's clock is the one that is wrong); jobs it holds run on",
				"service", c.cfg.Service, "offset", got.String(), "direction", dir, "limit", c.skewLimit.String(), "claimTTL", c.claimTTL.String())
		} else {
			c.cfg.Logger.Info("jobs: clock skew: claiming again, this host's clock is back within the limit of the NATS server's",
				"service", c.cfg.Service, "limit", c.skewLimit.String())
		}
	}
	return skewed
}

// releaseToken gives a worker token back.
func (c *Client) releaseToken() {
	<-c.tokens
	select {
	case c.slotFree <- struct{}{}:
	default:
	}
}

// activeRun is a job this client holds a claim on, from the claim to the
// last write; control calls of this client end it early.
type activeRun struct {
	generation uint64 // its target generation
	mu         sync.Mutex
	cause      error         // why it must stop, once known
	cancel     func(error)   // ends the handler's context; nil until it runs
	woken      chan struct{} // signalled when cause is set
}

// stopWith records cause (the first one wins) and ends the handler's
// context if it runs.
func (r *activeRun) stopWith(cause error) {
	r.mu.Lock()
	if r.cause == nil {
		r.cause = cause
	}
	fn := r.cancel
	r.mu.Unlock()
	if fn != nil {
		fn(cause)
	}
	select {
	case r.woken <- struct{}{}:
	default:
	}
}

func (r *activeRun) stopped() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.cause
}

// handle takes a job claimed by a request that started at start (holding
// a worker token) through its slot, its handler and its outcome.
func (c *Client) handle(ctx context.Context, job Job, start time.Time) {
	defer c.wg.Done()
	ref := jobRef{job.ChannelID, job.ID}
	target := jobRef{job.ChannelID, job.TargetKey}
	ar := &activeRun{woken: make(chan struct{}, 1), generation: job.TargetGeneration}
	c.mu.Lock()
	c.runs[ref] = ar
	c.byTarget[target] = append(c.byTarget[target], ar)
	k := c.kinds[job.Type]
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		if c.runs[ref] == ar {
			delete(c.runs, ref)
		}
		if rest := slices.DeleteFunc(c.byTarget[target], func(r *activeRun) bool { return r == ar }); len(rest) > 0 {
			c.byTarget[target] = rest
		} else {
			delete(c.byTarget, target)
		}
		c.mu.Unlock()
	}()
	run := &Run{c: c, job: job, claim: ClaimOf(job), clock: newLeaseClock(start, c.claimTTL, 0, 0)}
	if k != nil {
		p := k.jt.Policy()
		run.clock = newLeaseClock(start, c.claimTTL, p.HeartbeatTTL, deadlineMargin(p.HeartbeatInterval, p.HeartbeatTTL))
	}
	select {
	case <-c.stopCh: // claimed as Stop began: not ours to start
		c.releaseToken()
		c.handBack(ctx, run, 0, "client-stopping")
		return
	default:
	}
	if k == nil || k.version != job.Version {
		c.releaseToken()
		c.handBack(ctx, run, c.cfg.UnknownKindDelay, "unknown-kind")
		return
	}
	lease, ok := c.acquire(ctx, k, run, ar)
	if !ok {
		return
	}
	c.execute(ctx, k, run, ar, lease)
	c.releaseToken()
}

// acquire gets job's slot, waiting (without writes) while its key is
// full, and returns holding a worker token; or it deals with the job
// (hands it back, or leaves it to whoever took it) and returns false
// holding no token.
func (c *Client) acquire(ctx context.Context, k *kind, run *Run, ar *activeRun) (jobkeys.Lease, bool) {
	job := run.job
	kid := keyJobID(job.ChannelID, job.ID)
	input := []byte(inputOf(job))
	retry := job.Failures > 0 || job.Attempts > 1
	var kvKey string      // the key this job waits on, once it waits
	var group *keyWaiters // the client's waiters on that key, if watched
	// wake is the subscription to the wake-ups of its own job, if it waits
	// on them (over targeted wake-ups, a queued job): then it is in no
	// group. ended is wake's Done.
	var wake *jobkeys.Subscription
	var ended <-chan struct{}
	var turn <-chan struct{} // its turns to try: a change of the key, or its wake-up
	// noGroup and noWake: that way of waiting failed (or ended) once; the
	// job does not try it again.
	noGroup, noWake := false, false
	acquired := false
	// leaveWake closes wake, if open, and, unless the job acquired, hands
	// its wake-up on (passWakeUp) in the background, so that a hand-back
	// of the job does not wait for it (over a connection that is down,
	// each waits for its timeout); passed is closed when that ends. Called
	// before a hand-back, and when acquire returns, which waits for it.
	var passed chan struct{}
	leaveWake := func() {
		if wake == nil {
			return
		}
		wake.Close()
		wake = nil
		if acquired {
			return
		}
		done := make(chan struct{})
		passed = done
		go func() {
			defer close(done)
			c.passWakeUp(ctx, k, kid, input)
		}()
	}
	defer func() {
		if group != nil {
			c.leaveWaiters(kvKey, group)
		}
		leaveWake()
		if passed != nil {
			<-passed
		}
	}()
	repaired, waited := false, false
	// The repair of a missing admission waits AdmitGrace from the job's
	// creation, or from when it was last seen queued: an entry that was
	// there and is gone was replaced, and its producer is superseding the
	// job (re-admitting it would replace the new job instead).
	graceFrom := job.CreatedAt
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	// Over wake-ups a queued job's first try and its try right after
	// subscribing keep the queue's order (jobkeys.WithQueueTurn): they do
	// not take a slot a wake-up is on its way for to a job queued ahead
	// of it, in any process. Its other tries (a wake-up's, a recheck's)
	// are its turn. inTurn says the next try is one of those two;
	// turnBlocked that the last try was blocked so.
	inTurn, turnBlocked := c.wakeUps(), false
	for {
		opts := []jobkeys.AcquireOption{jobkeys.WithTries(job.Attempts), jobkeys.WithInstanceID(c.cfg.Owner)}
		if retry {
			opts = append(opts, jobkeys.WithRetry())
		} else if inTurn {
			opts = append(opts, jobkeys.WithQueueTurn())
		}
		acqStart := time.Now()
		acq, err := k.jt.Acquire(ctx, kid, input, opts...)
		// Blocked in turn: slots are free, for the jobs ahead.
		turnBlocked = inTurn && !retry && err == nil && acq.Kind == jobkeys.KindBlocked &&
			acq.Reason == jobkeys.ReasonActiveLimit && acq.Active < acq.Limit
		inTurn = false
		if errors.Is(err, jobkeys.ErrInvalidKey) {
			// Its input derives no key under the kind's policy: it can
			// never run (the record was written past Client.Enqueue).
			c.cfg.Logger.Warn("jobs: job derives no key", "job", job.ID, "err", err)
			c.releaseToken()
			if _, err := c.supersede(ctx, job.ChannelID, job.ID, ReasonBadKey); err != nil {
				c.cfg.Logger.Warn("jobs: supersede job", "job", job.ID, "err", err)
			}
			return jobkeys.Lease{}, false
		}
		if err != nil {
			c.cfg.Logger.Warn("jobs: acquire slot", "job", job.ID, "err", err)
			c.releaseToken()
			leaveWake()
			c.handBack(ctx, run, c.cfg.RecheckInterval, "key-unavailable")
			return jobkeys.Lease{}, false
		}
		if acq.Kind == jobkeys.KindAcquired {
			acquired = true // if it leaves now, its release wakes the next job
			run.clock.acquiredSlot(acqStart)
			c.cfg.Logger.Debug("jobs: acquired", "job", job.ID, "generation", run.claim.Generation, "waited", waited)
			if kvKey != "" && wake == nil {
				// Another slot may be free too. (A wake-up is not passed
				// on: its writer woke as many jobs as it left slots free.)
				c.passTurn(kvKey)
			}
			select {
			case <-c.stopCh: // Stop began while it acquired: do not start
				c.release(ctx, k, acq.Lease)
				c.releaseToken()
				c.handBack(ctx, run, 0, "client-stopping")
				return jobkeys.Lease{}, false
			default:
			}
			if !waited || c.stillOurs(ctx, run) {
				return acq.Lease, true
			}
			// Paused, cancelled, superseded or taken over while it
			// waited (by another process: this one's control calls
			// stop it directly): give the slot back.
			c.release(ctx, k, acq.Lease)
			c.releaseToken()
			return jobkeys.Lease{}, false
		}
		c.cfg.Logger.Debug("jobs: blocked", "job", job.ID, "reason", acq.Reason, "active", acq.Active, "limit", acq.Limit)
		now := c.cfg.Now()
		if acq.Reason == jobkeys.ReasonActiveLimit && !retry && now.After(graceFrom) {
			graceFrom = now // queued (the reducer checks that first)
		}
		var until time.Time
		switch {
		case acq.Reason == jobkeys.ReasonNotQueued && !repaired && !now.Before(graceFrom.Add(c.cfg.AdmitGrace)):
			// No admission past the grace: the producer died between
			// the record and the admission. Make its decision now.
			repaired = true
			d, err := c.store.Get(ctx, job.ChannelID, job.ID)
			if err != nil || d.Job.State != StateRunning || d.Job.ClaimGeneration != job.ClaimGeneration {
				c.releaseToken()
				return jobkeys.Lease{}, false // not ours any more
			}
			res, err := c.admit(ctx, k, d.Job)
			if err != nil || res.Outcome == OutcomeCoalesced {
				// Superseded (rejected, coalesced, bad key), or the key
				// layer failed: then it is tried again later (a hand-back
				// of a superseded job is refused and changes nothing).
				c.releaseToken()
				if err != nil && !errors.Is(err, ErrRejected) {
					c.cfg.Logger.Warn("jobs: repair admission", "job", job.ID, "err", err)
					leaveWake()
					c.handBack(ctx, run, c.cfg.RecheckInterval, "key-unavailable")
				}
				return jobkeys.Lease{}, false
			}
			continue
		case acq.Reason == jobkeys.ReasonNotQueued && !repaired:
			until = graceFrom.Add(c.cfg.AdmitGrace)
		case acq.Reason == jobkeys.ReasonNotQueued:
			retry = true // admitted by the repair, and run since: a retry
			continue
		}
		if kvKey == "" {
			if key, err := k.jt.Key(input); err == nil {
				kvKey = key.KVKey
			}
		}
		// Over targeted wake-ups a queued job waits for the wake-ups of its
		// own job; a retry, or a job not queued (yet), which no wake-up
		// names, waits in its key's group, as every job does without
		// wake-ups. After subscribing either way it tries once more: a
		// release between the blocked try and the subscription would wake
		// nobody (a wake-up that found no subscriber is sent once more
		// 2 ms later, which may still be too early).
		byWake := !noWake && !retry && c.wakeUps() &&
			(acq.Reason == jobkeys.ReasonActiveLimit || acq.Reason == jobkeys.ReasonStaleBlocked)
		if kvKey != "" && byWake && wake == nil {
			if group != nil {
				c.leaveWaiters(kvKey, group)
				group, turn = nil, nil
			}
			waited = true // subscribing takes a while too
			if wake = c.subscribeJob(ctx, k, kvKey, kid); wake != nil {
				turn, ended = wake.Changed(), wake.Done()
				inTurn = true
				continue
			}
			noWake, byWake = true, false
		}
		if kvKey != "" && !byWake && group == nil && !noGroup {
			if wake != nil {
				wake.Close()
				wake, turn, ended = nil, nil, nil
			}
			waited = true // starting the watch takes a while too
			if group = c.joinWaiters(ctx, kvKey); group != nil {
				turn = group.turn
				continue
			}
			noGroup = true
		}
		// Wait for a change of the key, a lease expiry, the grace, or the
		// recheck bound, without a write.
		wait := c.cfg.RecheckInterval
		if !acq.NextExpiry.IsZero() {
			wait = min(wait, acq.NextExpiry.Sub(now)+10*time.Millisecond)
		}
		if !until.IsZero() {
			wait = min(wait, until.Sub(now)+time.Millisecond)
		}
		if turnBlocked {
			// The jobs ahead were woken (by the write that freed the
			// slots, and by the try itself); should none of them act on
			// it, it tries anyway.
			wait = min(wait, queueTurnWait)
		}
		wait = max(min(wait, time.Until(run.clock.renewClaimAt())), time.Millisecond)
		c.releaseToken()
		c.mu.Lock()
		full := c.waiting >= c.cfg.MaxWaiting
		if !full {
			c.waiting++
		}
		c.mu.Unlock()
		if full {
			leaveWake()
			c.handBack(ctx, run, c.cfg.RecheckInterval, "key-full")
			return jobkeys.Lease{}, false
		}
		c.cfg.Logger.Debug("jobs: waiting", "job", job.ID, "for", wait, "watched", turn != nil, "wakeUps", wake != nil)
		timer.Reset(wait)
		stop, gotTurn := false, false
		select {
		case <-turn:
			gotTurn = group != nil // a group's turn, which it passes on if it leaves
		case <-ended:
			// Its wake-ups ended (the Watcher closed): it tries, then
			// waits in its key's group, or on rechecks.
			wake.Close()
			wake, turn, ended = nil, nil, nil
			noWake = true
		case <-timer.C:
		case <-ar.woken:
		case <-c.stopCh:
			stop = true
		}
		stopTimer(timer)
		c.mu.Lock()
		c.waiting--
		c.mu.Unlock()
		waited = true
		if ar.stopped() != nil {
			if gotTurn {
				c.passTurn(kvKey) // the try it leaves is another waiter's
			}
			return jobkeys.Lease{}, false // paused, cancelled or superseded here: nothing to write
		}
		if stop {
			leaveWake()
			c.handBack(ctx, run, 0, "client-stopping")
			return jobkeys.Lease{}, false
		}
		if !c.takeToken(ctx, run, ar, timer, leaveWake) {
			if gotTurn {
				c.passTurn(kvKey)
			}
			return jobkeys.Lease{}, false
		}
	}
}

// queueTurnWait is how long a job blocked in turn (see
// jobkeys.WithQueueTurn: slots free, for jobs queued ahead of it) waits
// for its wake-up before it tries anyway: the woken jobs ahead take a
// wake-up's hop and a write's round trip, more over a network or on a
// loaded machine (the Runner's wakeTurn, at its least).
const queueTurnWait = time.Second

// passWakeUpTimeout bounds the read of a hand-on (passWakeUp).
const passWakeUpTimeout = 5 * time.Second

// passWakeUp hands on the wake-up of key-layer job kid (input its
// payload), which waited for its wake-ups and leaves without a slot
// (paused, superseded or cancelled here, the client stopping, no worker
// token, MaxWaiting full, the key layer failing): the write that freed a
// slot may have woken it, and it alone, and its queue entry may stay
// (a pause keeps it; a hand-back leaves it for the next claim). A woken
// job that left without a word would keep the next queued job, in any
// process, waiting for its recheck. One read, and a wake-up of the other
// queued jobs when a slot is free for it (see jobkeys.JobType.PassWakeUp).
// Called with its subscription closed, so that a later wake-up passes it
// over.
func (c *Client) passWakeUp(ctx context.Context, k *kind, kid string, input []byte) {
	ctx, cancel := context.WithTimeout(ctx, passWakeUpTimeout)
	defer cancel()
	if err := k.jt.PassWakeUp(ctx, kid, input); err != nil {
		c.cfg.Logger.Warn("jobs: pass a wake-up on", "job", kid, "err", err)
	}
}

// takeToken waits for a worker token for a job that waited for its slot,
// renewing its claim every half claim TTL meanwhile: every worker may be
// busy for longer than a claim lasts. It returns false, holding no token,
// when the job is no longer this client's to try: stopped here, its claim
// lost or not renewed (it runs out and is claimed again), or the client
// stopping (then it is handed back, after a call of leaving, which starts
// the hand-on of a wake-up). timer is stopped on entry and on return.
func (c *Client) takeToken(ctx context.Context, run *Run, ar *activeRun, timer *time.Timer, leaving func()) bool {
	defer stopTimer(timer)
	for {
		renewAt := run.clock.renewClaimAt()
		if start := time.Now(); !start.Before(renewAt) {
			if run.clock.claimPast() {
				return false // not renewed in time (a stopped process): it runs out
			}
			j, err := c.store.Renew(ctx, RenewRequest{Claim: run.claim, ExpectedRevision: run.job.Revision, TTL: c.claimTTL})
			if err != nil {
				return false
			}
			run.job = j
			run.clock.renewedClaim(start)
			continue
		}
		timer.Reset(max(time.Until(renewAt), time.Millisecond))
		select {
		case c.tokens <- struct{}{}:
			return true
		case <-timer.C:
		case <-ar.woken:
			if ar.stopped() != nil {
				return false // paused, cancelled or superseded here: nothing to write
			}
		case <-c.stopCh:
			leaving()
			c.handBack(ctx, run, 0, "client-stopping")
			return false
		}
		stopTimer(timer)
	}
}

// stopTimer stops t and drains a tick it may have delivered.
func stopTimer(t *time.Timer) {
	if !t.Stop() {
		select {
		case <-t.C:
		default:
		}
	}
}

// stillOurs reports whether run's claim still holds (a read): a job that
// waited for its slot may have been paused, cancelled or superseded by
// another process meanwhile, which its own client learns only from the
// record; a claim that ran out is not ours either, even while nobody has
// claimed the job again.
func (c *Client) stillOurs(ctx context.Context, run *Run) bool {
	d, err := c.store.Get(ctx, run.claim.ChannelID, run.claim.JobID)
	return err == nil && d.Job.State == StateRunning && d.Job.ClaimOwner == run.claim.Owner &&
		d.Job.ClaimGeneration == run.claim.Generation && d.Job.ClaimExpiresAt.After(c.cfg.Now()) &&
		!run.clock.claimPast()
}

// handBack requeues a claimed job for after delay without counting a
// failure, in one try. An error leaves the claim to run out.
func (c *Client) handBack(ctx context.Context, run *Run, delay time.Duration, reason string) {
	c.handBackBy(ctx, run, false, delay, reason)
}

// handBackBy is handBack, trying again while the store is unavailable and
// the claim holds when retry is set, as writeOutcome.
func (c *Client) handBackBy(ctx context.Context, run *Run, retry bool, delay time.Duration, reason string) {
	err := c.writeOutcome(ctx, run, retry, func(ctx context.Context) error {
		_, err := c.store.Requeue(ctx, RequeueRequest{Claim: run.claim, AvailableAt: c.cfg.Now().Add(delay), Reason: reason})
		return err
	})
	if err != nil && !errors.Is(err, ErrConflict) && !errors.Is(err, ErrClaimLost) {
		c.cfg.Logger.Warn("jobs: hand job back", "job", run.claim.JobID, "err", err)
	}
}

// outcomeRetryMax bounds the pause between two tries of an outcome write.
const outcomeRetryMax = time.Second

// writeOutcome makes an attempt's last write (settle, requeue, fail, hand
// back) for run's claim, unless the claim's local deadline has passed: then
// it writes nothing and returns an error wrapping ErrClaimLost. With retry
// it tries again while the store is unavailable ([ErrUnavailable]) and
// the claim still holds: a write lost to a store briefly out of reach (a
// leader election, a reconnect) would otherwise leave the job to run again
// from the start once its claim ran out. It gives up, returning the last
// error, before the claim's local deadline (nothing renews the claim after
// the handler returns), when the client's grace ends, or when ctx ends.
// Any other error is returned at once.
func (c *Client) writeOutcome(ctx context.Context, run *Run, retry bool, write func(context.Context) error) error {
	pause := 50 * time.Millisecond
	for {
		if run.clock.claimPast() {
			return fmt.Errorf("%w: job %q: past the claim's local deadline, nothing written", ErrClaimLost, run.claim.JobID)
		}
		err := write(ctx)
		if err == nil || !retry || !errors.Is(err, ErrUnavailable) || ctx.Err() != nil {
			return err
		}
		if !time.Now().Add(pause).Before(run.clock.claimDeadline()) {
			return err
		}
		t := time.NewTimer(pause)
		select {
		case <-t.C:
		case <-c.killCh:
			t.Stop()
			return err
		case <-ctx.Done():
			t.Stop()
			return err
		}
		pause = min(2*pause, outcomeRetryMax)
	}
}

// execute runs the handler under the slot with heartbeats, then writes
// the outcome and releases the slot.
func (c *Client) execute(ctx context.Context, k *kind, run *Run, ar *activeRun, lease jobkeys.Lease) {
	hctx := newRunContext(context.WithoutCancel(ctx), run.clock, k.timeout)
	defer hctx.stop()
	run.ctx = hctx
	ar.mu.Lock()
	ar.cancel = func(err error) { hctx.cancel(err) }
	early := ar.cause
	ar.mu.Unlock()
	if early != nil {
		// Paused, cancelled or superseded by this client before it could
		// start (while its slot was acquired): nothing to run, nothing to
		// write.
		c.release(ctx, k, lease)
		c.poke()
		return
	}

	input := run.job.Input // before the heartbeat may change run.job
	hbStop := make(chan struct{})
	hbDone := make(chan struct{})
	go func() {
		defer close(hbDone)
		c.heartbeat(ctx, k, run, lease, hctx, hbStop)
	}()
	out, werr := safeWork(hctx, k, run, input)
	close(hbStop)
	<-hbDone

	// Err checks the local deadlines: a claim past its own is not
	// written, whatever the handler returned.
	var cause error
	if hctx.Err() != nil {
		cause = context.Cause(hctx)
	}
	run.mu.Lock()
	job := run.job
	run.mu.Unlock()
	if werr == nil && len(out) > ArtifactSizeLimit {
		// The store would refuse it: the attempt failed.
		werr = fmt.Errorf("jobs: result of job %q is %d bytes, over ArtifactSizeLimit (%d)", job.ID, len(out), ArtifactSizeLimit)
	}
	switch {
	case errors.Is(cause, ErrClaimLost), errors.Is(cause, ErrPaused),
		errors.Is(cause, ErrCancelled), errors.Is(cause, ErrSuperseded):
		// Not ours to write any more.
	case werr == nil:
		err := c.writeOutcome(ctx, run, true, func(ctx context.Context) error {
			_, err := c.store.Settle(ctx, SettleRequest{Claim: run.claim, Artifact: out})
			return err
		})
		switch {
		case errors.Is(err, ErrConflict) && c.stillOurs(ctx, run):
			// The claim holds, so the store refused the result itself (a
			// record over the server's max_payload): the attempt failed.
			// Else the job would run again, for ever, at every claim.
			c.failed(ctx, k, run, job, fmt.Errorf("jobs: the store refused the result of job %q: %w", job.ID, err), false)
		case errors.Is(err, ErrClaimLost):
		case err != nil:
			c.cfg.Logger.Warn("jobs: settle", "job", job.ID, "err", err)
		}
	case errors.Is(cause, ErrStopping), errors.Is(cause, ErrSlotLost):
		c.handBackBy(ctx, run, true, 0, reasonOf(cause))
	default:
		switch permanent, delay, snoozed := outcomeOf(werr); {
		case snoozed:
			c.handBackBy(ctx, run, true, delay, "snoozed for "+delay.String())
		default:
			if errors.Is(cause, ErrTimeout) {
				werr = fmt.Errorf("%w after %v: %w", ErrTimeout, k.timeout, werr)
			}
			c.failed(ctx, k, run, job, werr, permanent)
		}
	}
	c.release(ctx, k, lease)
	c.poke()
}

// release frees a slot, trying a few times: a slot left behind holds its
// key until its lease runs out.
func (c *Client) release(ctx context.Context, k *kind, lease jobkeys.Lease) {
	for i := range 3 {
		_, err := k.jt.Release(ctx, lease)
		if err == nil {
			return
		}
		c.cfg.Logger.Warn("jobs: release slot", "job", lease.JobID, "attempt", i+1, "err", err)
		time.Sleep(time.Duration(i+1) * 100 * time.Millisecond)
	}
}

// failed counts a failure: the job is requeued with backoff, or failed
// when the failures reach the kind's budget or the error is permanent
// (job is the record as this attempt last wrote it).
func (c *Client) failed(ctx context.Context, k *kind, run *Run, job Job, werr error, permanent bool) {
	claim := run.claim
	msg := werr.Error()
	if permanent {
		msg = "permanent: " + msg
	}
	reason := truncate(msg, ReasonSizeLimit)
	failures := job.Failures + 1
	err := c.writeOutcome(ctx, run, true, func(ctx context.Context) error {
		var err error
		if permanent || failures >= k.maxFailures {
			_, err = c.store.Fail(ctx, FailRequest{Claim: claim, Reason: reason})
		} else {
			_, err = c.store.Requeue(ctx, RequeueRequest{
				Claim: claim, AvailableAt: c.cfg.Now().Add(c.cfg.Backoff(failures)), Reason: reason, CountFailure: true,
			})
		}
		return err
	})
	if err != nil && !errors.Is(err, ErrClaimLost) {
		c.cfg.Logger.Warn("jobs: record failure", "job", job.ID, "err", err)
	}
}

// safeWork runs the handler; a panic is its error.
func safeWork(ctx context.Context, k *kind, run *Run, input []byte) (out []byte, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("jobs: handler of job %q panicked: %v", run.claim.JobID, p)
		}
	}()
	return k.work(ctx, run, input)
}

// heartbeat renews the claim and the slot together every
// HeartbeatInterval until stop closes (the handler returned; after a
// timeout the claim is kept for the failure to be written) or a local
// deadline passes, and ends the handler's context with the cause when
// either is lost or when the client's grace ends. The local deadlines
// (see deadline.go) end the context without the heartbeat too: a renewal
// that hangs cannot hold it up.
func (c *Client) heartbeat(ctx context.Context, k *kind, run *Run, lease jobkeys.Lease, hctx *runContext, stop <-chan struct{}) {
	t := time.NewTicker(k.jt.Policy().HeartbeatInterval)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-c.killCh:
			hctx.cancel(ErrStopping)
			return
		case <-t.C:
		}
		start := time.Now()
		if cause := run.clock.lost(start); cause != nil {
			hctx.cancel(cause) // it passed before this goroutine ran: nothing is renewed
			return
		}
		// A slow renewal may take until the local deadline, no longer.
		rctx, rcancel := context.WithDeadline(ctx, run.clock.deadline())
		run.writing.Lock()
		j, err := c.store.Renew(rctx, RenewRequest{Claim: run.claim, ExpectedRevision: run.Job().Revision, TTL: c.claimTTL})
		if err == nil {
			run.mu.Lock()
			run.job = j
			run.mu.Unlock()
			run.clock.renewedClaim(start)
		}
		run.writing.Unlock()
		rcancel()
		if err != nil {
			if errors.Is(err, ErrConflict) || errors.Is(err, ErrNotFound) {
				cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
				hctx.cancel(c.lostCause(cctx, run.claim))
				ccancel()
				return
			}
			c.cfg.Logger.Warn("jobs: renew claim", "job", run.claim.JobID, "err", err)
		}
		start = time.Now()
		if cause := run.clock.lost(start); cause != nil {
			hctx.cancel(cause)
			return
		}
		rctx, rcancel = context.WithDeadline(ctx, run.clock.deadline())
		ren, err := k.jt.Renew(rctx, lease)
		rcancel()
		switch {
		case err != nil:
			c.cfg.Logger.Warn("jobs: renew slot", "job", run.claim.JobID, "err", err)
		case ren.Kind == jobkeys.KindLost:
			hctx.cancel(ErrSlotLost)
			return
		default:
			lease.LeaseExpiresAt = ren.LeaseExpiresAt
			run.clock.acquiredSlot(start)
		}
	}
}

// lostCause says why a claim can no longer be renewed.
func (c *Client) lostCause(ctx context.Context, claim Claim) error {
	d, err := c.store.Get(ctx, claim.ChannelID, claim.JobID)
	if err != nil {
		return ErrClaimLost
	}
	switch d.Job.State {
	case StatePaused:
		return ErrPaused
	case StateCancelled:
		return ErrCancelled
	case StateSuperseded:
		return ErrSuperseded
	}
	return ErrClaimLost
}

func reasonOf(cause error) string {
	if errors.Is(cause, ErrSlotLost) {
		return "slot-lost"
	}
	return "client-stopping"
}

// truncate cuts s to at most n bytes of valid UTF-8 (invalid bytes become
// U+FFFD: the store refuses a reason that is not valid UTF-8).
func truncate(s string, n int) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	if len(s) <= n {
		return s
	}
	s = s[:n]
	for len(s) > 0 && !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s
}
