package jobs

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/jobkeys/jobkeys"
)

// Start starts the client's workers and its reconciliation: MaxWorkers
// workers take the jobs announced to the service's clients (see Dispatch
// in the package doc) and run each under its key's slot, and the client
// reconciles every ReconcileInterval. At least one kind must be
// registered. A ClientConfig.Periodic schedule whose Name, Type, Every,
// Cron or Input is wrong (see [Periodic]) fails Start, naming it; the
// schedules run until Stop. ctx bounds Start's own requests (the dispatch
// consumer); nothing after Start returns: only [Client.Stop] stops the
// client.
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
	if err := c.producerOnly(); err != nil {
		return err
	}
	periodic, err := c.checkPeriodic()
	if err != nil {
		return fmt.Errorf("jobs: Start: %w", err)
	}
	c.state = clientStarted
	var ttl time.Duration
	for _, k := range c.kinds {
		ttl = max(ttl, k.jt.Policy().HeartbeatTTL)
	}
	c.claimTTL = ttl
	c.skewLimit = claimSkewLimit(ttl, c.kinds)
	bg, cancel := context.WithCancel(context.WithoutCancel(ctx))
	c.bgCancel = cancel
	if nd, ok := c.disp.(*natsDispatcher); ok {
		cctx, ccancel := context.WithTimeout(ctx, nd.js.Options().DefaultTimeout)
		err := nd.consume(cctx, ttl)
		ccancel()
		if err != nil {
			cancel()
			c.state = clientNew
			return fmt.Errorf("jobs: Start: %w", err)
		}
	}
	c.startTakers(bg)
	if c.cfg.ReconcileInterval > 0 {
		// Stop ends a pass in flight: it is cleanup, which the next
		// client's passes redo.
		rctx, rcancel := context.WithCancel(bg)
		c.reconcileCancel = rcancel
		c.wg.Add(1)
		go c.reconcileLoop(rctx)
	}
	c.startPeriodic(bg, periodic)
	return nil
}

// Stop drains the client: it takes no more jobs (an announcement in hand
// goes back to the other clients), lets running handlers finish for StopGrace, then
// ends their contexts with [ErrStopping] and hands what did not finish
// back without counting a failure; every slot is released. A
// reconciliation pass in flight is ended (it is cleanup). It returns
// once every job is handed back or finished, or with ctx.Err() when ctx
// ends first (handlers are then cancelled at once, and what is left runs
// down in the background). A client of [NewNATSClient] then closes the
// job store it made (see [NATSStore.Close]), unless ctx ended first. Stop
// of a client never started, or stopped before, does nothing else.
func (c *Client) Stop(ctx context.Context) (err error) {
	defer func() {
		if err == nil {
			err = c.closeMade(ctx)
		}
	}()
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
		if c.dispOwned {
			c.disp.close()
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

// Clock skew (see Clocks in the package doc). A claim, like a key-layer
// lease, is a timestamp of the host that wrote it compared against the
// clock of whichever host claims next: a host whose clock runs ahead sees
// live claims expired and takes their jobs over (the holder's next write
// fails, its run ends with ErrClaimLost), and one whose clock runs behind
// writes claims the other hosts see expire early. The key coordinator
// bounds its clock's offset from the NATS server's (from server times its
// store sees anyway, and a rare probe: [jobkeys.KeyCoordinator.ClockOffset]
// does no I/O but one stream info request per ten seconds at most), and
// the workers ask it before they take a job (a cached answer but for the
// rare probe).
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
// the workers (skewedNow) before they take a job.
func (c *Client) clockSkewed(ctx context.Context) bool {
	if c.coord.Config().IgnoreClockSkew {
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

// activeRun is a job this client holds a claim on, from the claim to the
// last write; control calls of this client end it early.
type activeRun struct {
	generation uint64 // its target generation
	mu         sync.Mutex
	cause      error         // why it must stop, once known
	cancel     func(error)   // ends the handler's context; nil until it runs
	woken      chan struct{} // signalled when cause is set
	// again is when the job is due again after this run requeued it
	// (zero: not requeued): its announcement comes back then. over: the
	// run settled or failed it.
	again time.Time
	over  bool
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

// stillOurs reports whether run's claim still holds (a read): a job that
// waited for its slot may have been paused, cancelled or superseded by
// another process meanwhile, which its own client learns only from the
// record; a claim that ran out is not ours either, even while nobody has
// claimed the job again.
func (c *Client) stillOurs(ctx context.Context, run *Run) bool {
	j, err := c.peek(ctx, jobRef{run.claim.ChannelID, run.claim.JobID})
	return err == nil && j.State == StateRunning && j.ClaimOwner == run.claim.Owner &&
		j.ClaimGeneration == run.claim.Generation && j.ClaimExpiresAt.After(c.cfg.Now()) &&
		!run.clock.claimPast()
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
}

// release frees a slot, trying a few times: a slot left behind holds its
// key until its lease runs out.
func (c *Client) release(ctx context.Context, k *kind, lease jobkeys.Lease) {
	for i := range 3 {
		out, err := k.jt.Release(ctx, lease)
		if err == nil {
			c.announceRoom(ctx, k, out.State, 0)
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
		// Slot and claim are renewed at once, each on its own request, so
		// that neither's renewal waits behind the other's: one stuck
		// lets the other's deadline move on, and the stuck one's
		// deadline ends the handler with its own cause.
		start := time.Now()
		if cause := run.clock.lost(start); cause != nil {
			hctx.cancel(cause) // it passed before this goroutine ran: nothing is renewed
			return
		}
		// A slow renewal may take until the local deadline, no longer.
		rctx, rcancel := context.WithDeadline(ctx, run.clock.deadline())
		slotLost := false
		slotDone := make(chan struct{})
		go func() {
			defer close(slotDone)
			ren, err := k.jt.Renew(rctx, lease)
			switch {
			case err != nil:
				c.cfg.Logger.Warn("jobs: renew slot", "job", run.claim.JobID, "err", err)
			case ren.Kind == jobkeys.KindLost:
				slotLost = true
				hctx.cancel(ErrSlotLost)
			default:
				lease.LeaseExpiresAt = ren.LeaseExpiresAt
				run.clock.acquiredSlot(start) // at once: the claim's renewal may be slow
			}
		}()
		run.writing.Lock()
		j, err := c.store.Renew(rctx, RenewRequest{Claim: run.claim, ExpectedRevision: run.Job().Revision, TTL: c.claimTTL})
		if err == nil {
			run.mu.Lock()
			run.job = j
			run.mu.Unlock()
			run.clock.renewedClaim(start)
		}
		run.writing.Unlock()
		<-slotDone
		rcancel()
		if slotLost {
			return
		}
		if err != nil {
			if errors.Is(err, ErrConflict) || errors.Is(err, ErrNotFound) {
				cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
				hctx.cancel(c.lostCause(cctx, run.claim))
				ccancel()
				return
			}
			c.cfg.Logger.Warn("jobs: renew claim", "job", run.claim.JobID, "err", err)
		}
	}
}

// lostCause says why a claim can no longer be renewed.
func (c *Client) lostCause(ctx context.Context, claim Claim) error {
	j, err := c.peek(ctx, jobRef{claim.ChannelID, claim.JobID})
	if err != nil {
		return ErrClaimLost
	}
	switch j.State {
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
