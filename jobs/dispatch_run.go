package jobs

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jobkeys/jobkeys"
)

// The runtime's side of dispatch (see dispatcher, and
// docs/design/dispatch.md): who announces, and what a worker does with an
// announcement.
//
// Ready announcements are made
//   - by Enqueue, once the job is admitted with a free slot for it (at its
//     AvailableAt when that is later);
//   - by every write of a key that leaves it room (a release, a retry put
//     back in the queue, the removal of a finished job's entry,
//     reconciliation): for the first queued jobs, one per free slot;
//   - by a resume, at the job's AvailableAt (announcingStore).
//
// A run that requeues its job (a retry, a hand-back, a snooze) hands the
// announcement it ran on back for the job's due time instead of making a
// new one (runClaimed). Enqueue also makes a check, before the record: the
// checker that takes it after AdmitGrace admits the job if its producer
// died before the admission (Client.check).
//
// A worker takes an announcement with one of its MaxWorkers takers: it
// reads the job, takes its key's slot (a retry blocked by a full key goes
// back to the head of the key's queue), claims the job (ClaimJob) and runs
// it. A job that cannot start now is left to the announcement that will
// come when it can (its slot's release, its due time), and the room an
// announcement stood for is passed on to the next queued job.

// openDispatch gives a client its dispatcher, and whether the client owns
// it (closes it at Stop): over cfg.JetStream, or the job store's
// connection when it is a NATSStore and the key store is not in memory,
// the service's dispatch stream; else (one process) the MemoryStore's
// queue, or one of the client's own.
func openDispatch(store Store, cfg *ClientConfig) (dispatcher, bool, error) {
	js := cfg.JetStream
	storage, replicas := jetstream.FileStorage, 1
	if s, ok := store.(*NATSStore); ok {
		if _, inMemory := cfg.KeyStore.(*jobkeys.MemoryStore); js == nil && !inMemory {
			js = s.js
		}
		info := s.stream.CachedInfo()
		storage, replicas = info.Config.Storage, info.Config.Replicas
	}
	if js != nil {
		ctx, cancel := context.WithTimeout(context.Background(), js.Options().DefaultTimeout)
		defer cancel()
		d, err := newNATSDispatcher(ctx, js, cfg.Service, storage, replicas)
		if err != nil {
			return nil, false, err
		}
		return d, true, nil
	}
	if s, ok := store.(*MemoryStore); ok {
		return s.dispatcher(cfg.Service), false, nil
	}
	return newMemDispatcher(), true, nil
}

// announcingStore is the client's store: every write that makes a job
// pending sees it announced at its AvailableAt, so that no requeue,
// hand-back or resume can forget to. A job requeued by its own run (a
// retry, a hand-back, a snooze) takes the announcement it ran on back
// (see runClaimed): no message is published, and none can be lost
// between the write and its announcement.
type announcingStore struct {
	Store
	c *Client
}

func (s announcingStore) Requeue(ctx context.Context, req RequeueRequest) (Job, error) {
	j, err := s.Store.Requeue(ctx, req)
	if err != nil {
		return j, err
	}
	if ar := s.c.runOf(j); ar != nil {
		ar.mu.Lock()
		ar.again = j.AvailableAt
		ar.mu.Unlock()
		return j, nil
	}
	s.c.announce(ctx, j, j.AvailableAt)
	return j, nil
}

func (s announcingStore) Settle(ctx context.Context, req SettleRequest) (Detail, error) {
	d, err := s.Store.Settle(ctx, req)
	if err == nil {
		s.c.ranOver(d.Job)
	}
	return d, err
}

func (s announcingStore) Fail(ctx context.Context, req FailRequest) (Job, error) {
	j, err := s.Store.Fail(ctx, req)
	if err == nil {
		s.c.ranOver(j)
	}
	return j, err
}

// runOf returns the run of j in this client, if any.
func (c *Client) runOf(j Job) *activeRun {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.runs[jobRef{j.ChannelID, j.ID}]
}

// ranOver marks the run of j, which its last write ended, as over.
func (c *Client) ranOver(j Job) {
	if ar := c.runOf(j); ar != nil {
		ar.mu.Lock()
		ar.over = true
		ar.mu.Unlock()
	}
}

func (s announcingStore) Resume(ctx context.Context, req ResumeRequest) (Job, error) {
	j, err := s.Store.Resume(ctx, req)
	if err == nil {
		s.c.announce(ctx, j, j.AvailableAt)
	}
	return j, err
}

// jobPeeker is a store that reads a job record alone, cheaper than Get
// (NATSStore.peekJob); the runtime's workers and checkers read the jobs
// they are told of so.
type jobPeeker interface {
	peekJob(ctx context.Context, channelID, jobID string, forClaim bool) (Job, error)
}

// peek reads the job ref names: the record alone when the store can, else
// through Get.
func (c *Client) peek(ctx context.Context, ref jobRef) (Job, error) {
	return c.peekFor(ctx, ref, false)
}

// peekFor is peek, telling the store whether a claim of the job follows.
func (c *Client) peekFor(ctx context.Context, ref jobRef, forClaim bool) (Job, error) {
	if c.peeker != nil {
		return c.peeker.peekJob(ctx, ref.channel, ref.id, forClaim)
	}
	d, err := c.store.Get(ctx, ref.channel, ref.id)
	return d.Job, err
}

// announce announces job j at at (zero or past: now). A failure is
// logged: reconciliation announces what was lost.
func (c *Client) announce(ctx context.Context, j Job, at time.Time) {
	c.announceRef(ctx, j.Type, jobRef{j.ChannelID, j.ID}, at)
}

func (c *Client) announceRef(ctx context.Context, typ string, ref jobRef, at time.Time) {
	if !at.After(c.cfg.Now()) {
		at = time.Time{}
	}
	if err := c.disp.announce(ctx, laneReady, typ, ref, at, ""); err != nil {
		c.cfg.Logger.Warn("jobs: announce job", "job", ref.id, "channel", ref.channel, "err", err)
	}
}

// announceRoom announces, for a key state a write of kind k left (nil:
// none), the queued jobs after the first skip that have a free slot: the
// first free-slots ones.
func (c *Client) announceRoom(ctx context.Context, k *kind, st *jobkeys.KeyState, skip int) {
	if st == nil {
		return
	}
	free := freeSlots(k, st, c.cfg.Now())
	for i := skip; i < len(st.Queued) && i-skip < free; i++ {
		if ch, id, ok := parseKeyJobID(st.Queued[i].JobID); ok {
			c.announceRef(ctx, k.typ, jobRef{ch, id}, time.Time{})
		}
	}
}

// announceAdmitted announces job kid, which an admission of kind k just
// queued leaving st (nil: it was there already), when a slot is free for
// it.
func (c *Client) announceAdmitted(ctx context.Context, k *kind, job Job, st *jobkeys.KeyState) {
	now := c.cfg.Now()
	switch {
	case job.AvailableAt.After(now):
		c.announce(ctx, job, job.AvailableAt)
		return
	case st == nil:
		c.announce(ctx, job, time.Time{})
		return
	}
	kid := keyJobID(job.ChannelID, job.ID)
	pos := slices.IndexFunc(st.Queued, func(q jobkeys.QueuedJob) bool { return q.JobID == kid })
	if pos >= 0 && pos < freeSlots(k, st, now) {
		c.announce(ctx, job, time.Time{})
	}
}

// announceReplacedRoom makes up for the announcement an admission of job
// (kind k, leaving st) took from the job it replaced: the replaced job
// was the oldest queued, the head of the queue, announced when a slot was
// free; the job the removal moved into the first free-slots positions
// (unless job itself, which announceAdmitted sees to) is announced. A
// worker that takes the replaced job's announcement finds it superseded
// and its entry gone, and announces nothing.
func (c *Client) announceReplacedRoom(ctx context.Context, k *kind, job Job, st *jobkeys.KeyState) {
	if st == nil {
		return
	}
	free := freeSlots(k, st, c.cfg.Now())
	if free <= 0 || free > len(st.Queued) {
		return
	}
	q := st.Queued[free-1]
	if q.JobID == keyJobID(job.ChannelID, job.ID) {
		return
	}
	if ch, id, ok := parseKeyJobID(q.JobID); ok {
		c.announceRef(ctx, k.typ, jobRef{ch, id}, time.Time{})
	}
}

// freeSlots is how many slots of a key in state st are free at now:
// MaxActive less the live slots.
func freeSlots(k *kind, st *jobkeys.KeyState, now time.Time) int {
	free := k.jt.Policy().MaxActive
	for i := range st.Active {
		if st.Active[i].LeaseExpiresAt.After(now) {
			free--
		}
	}
	return free
}

// passRoom hands the room an announcement of job stood for, when job
// cannot start now, to the queued job behind it: one read of the key.
func (c *Client) passRoom(ctx context.Context, k *kind, job Job) {
	st, ok := c.keyState(ctx, k, job)
	if !ok {
		return
	}
	kid := keyJobID(job.ChannelID, job.ID)
	if pos := slices.IndexFunc(st.Queued, func(q jobkeys.QueuedJob) bool { return q.JobID == kid }); pos >= 0 {
		c.announceRoom(ctx, k, st, pos+1)
	}
}

// keyState reads the state of job's key; false when there is none or it
// cannot be read (logged).
func (c *Client) keyState(ctx context.Context, k *kind, job Job) (*jobkeys.KeyState, bool) {
	key, err := k.jt.Key([]byte(inputOf(job)))
	if err != nil {
		return nil, false
	}
	val, _, err := c.cfg.KeyStore.Get(ctx, c.cfg.Service, key.KVKey)
	if err != nil {
		if !errors.Is(err, jobkeys.ErrKeyNotFound) {
			c.cfg.Logger.Warn("jobs: read key", "key", key.KVKey, "err", err)
		}
		return nil, false
	}
	st, err := jobkeys.ParseState(val)
	if err != nil {
		c.cfg.Logger.Warn("jobs: read key", "key", key.KVKey, "err", err)
		return nil, false
	}
	return st, true
}

// startTakers starts the client's MaxWorkers takers and its checker,
// which end when Stop begins.
func (c *Client) startTakers(bg context.Context) {
	wait, cancel := context.WithCancel(bg)
	c.wg.Add(2 + c.cfg.MaxWorkers)
	go func() {
		defer c.wg.Done()
		<-c.stopCh
		cancel()
	}()
	for range c.cfg.MaxWorkers {
		go c.taker(bg, wait)
	}
	go c.checker(bg, wait)
}

// checker takes the checks (see laneCheck) one at a time until wait ends.
func (c *Client) checker(ctx, wait context.Context) {
	defer c.wg.Done()
	for {
		d, err := c.disp.next(wait, laneCheck)
		if err != nil {
			if wait.Err() != nil || errors.Is(err, errDispatchClosed) {
				return
			}
			c.cfg.Logger.Warn("jobs: wait for a check", "err", err)
			continue
		}
		c.check(ctx, d)
	}
}

// check sees that the job of a check, which its Enqueue announced before
// writing its record, was admitted: a job still pending, never claimed,
// past AdmitGrace and neither queued nor holding a slot lost its producer
// between the record and the admission. It is admitted strictly (never
// replacing or coalescing: a job whose entry was just replaced must not
// replace another while its producer supersedes it), and announced if a
// slot is free for it; while the key's queue is full the check comes
// back. The common case, a job admitted or over long since, costs a read.
func (c *Client) check(ctx context.Context, d delivery) {
	ref := d.job()
	c.mu.Lock()
	k := c.kinds[d.jobType()]
	c.mu.Unlock()
	if k == nil {
		d.later(c.cfg.UnknownKindDelay) // a client with the kind checks it
		return
	}
	job, err := c.peek(ctx, ref)
	switch {
	case errors.Is(err, ErrNotFound):
		d.done() // its record was never written
		return
	case err != nil:
		c.cfg.Logger.Warn("jobs: read checked job", "job", ref.id, "err", err)
		d.later(c.cfg.RecheckInterval)
		return
	}
	if job.Type != k.typ || job.State != StatePending || job.Attempts > 0 {
		d.done()
		return
	}
	now := c.cfg.Now()
	if grace := job.CreatedAt.Add(c.cfg.AdmitGrace); now.Before(grace) {
		d.later(grace.Sub(now))
		return
	}
	kid := keyJobID(job.ChannelID, job.ID)
	adm, err := k.jt.Admit(ctx, kid, []byte(inputOf(job)), jobkeys.WithStrictCreate())
	switch {
	case errors.Is(err, jobkeys.ErrInvalidKey):
		if _, err := c.supersede(ctx, job.ChannelID, job.ID, ReasonBadKey); err != nil {
			c.cfg.Logger.Warn("jobs: supersede job", "job", job.ID, "err", err)
			d.later(c.cfg.RecheckInterval)
			return
		}
		d.done()
	case err != nil:
		c.cfg.Logger.Warn("jobs: repair admission", "job", job.ID, "err", err)
		d.later(c.cfg.RecheckInterval)
	case adm.Kind == jobkeys.KindAccepted:
		if !adm.AlreadyPresent {
			// Queued already: a release, or reconciliation, announces it.
			c.cfg.Logger.Info("jobs: admitted a job its producer did not", "job", job.ID, "channel", job.ChannelID)
			c.announceAdmitted(ctx, k, job, adm.State)
		}
		d.done()
	default:
		d.later(c.cfg.AdmitGrace) // the queue is full
	}
}

// taker is one worker: it waits for an announcement (until wait ends) and
// takes it, one at a time.
func (c *Client) taker(ctx, wait context.Context) {
	defer c.wg.Done()
	for {
		// A client whose clock is too far from the server's takes
		// nothing (see Clock skew): it looks again after PollInterval.
		if c.skewedNow(ctx) {
			if !sleepCtx(wait, c.stopCh, c.cfg.PollInterval) {
				return
			}
			continue
		}
		d, err := c.disp.next(wait, laneReady)
		if err != nil {
			if wait.Err() != nil || errors.Is(err, errDispatchClosed) {
				return
			}
			c.cfg.Logger.Warn("jobs: wait for a job", "err", err)
			continue
		}
		select {
		case <-c.stopCh:
			d.later(0) // for another client
			return
		default:
		}
		if c.skewedNow(ctx) {
			d.later(0)
			continue
		}
		c.take(ctx, d)
	}
}

// skewedNow is clockSkewed for the takers, one at a time.
func (c *Client) skewedNow(ctx context.Context) bool {
	c.skewMu.Lock()
	defer c.skewMu.Unlock()
	return c.clockSkewed(ctx)
}

// take deals with one announcement: the job starts here, or the
// announcement is left for later, or it is over.
func (c *Client) take(ctx context.Context, d delivery) {
	ref := d.job()
	c.mu.Lock()
	k := c.kinds[d.jobType()]
	c.mu.Unlock()
	if k == nil || k.work == nil {
		d.later(c.cfg.UnknownKindDelay) // another client's kind
		return
	}
	job, err := c.peekFor(ctx, ref, true)
	switch {
	case errors.Is(err, ErrNotFound):
		d.done()
		return
	case err != nil:
		c.cfg.Logger.Warn("jobs: read announced job", "job", ref.id, "err", err)
		d.later(c.cfg.RecheckInterval)
		return
	}
	if job.Type != k.typ {
		d.done() // not what was announced
		return
	}
	if job.Version != k.version {
		d.later(c.cfg.UnknownKindDelay) // a client with that version runs it
		return
	}
	now := c.cfg.Now()
	switch job.State {
	case StatePending:
		if job.AvailableAt.After(now) {
			c.passRoom(ctx, k, job)
			d.later(job.AvailableAt.Sub(now))
			return
		}
	case StateRunning:
		if job.ClaimExpiresAt.After(now) {
			// Claimed by a live worker (or so it seems): look again when
			// that claim would run out.
			d.later(job.ClaimExpiresAt.Sub(now) + time.Second)
			return
		}
	case StatePaused:
		c.passRoom(ctx, k, job)
		d.done() // Resume announces it
		return
	default:
		// Over: its queue entry, if left, goes, and the room it held is
		// announced.
		c.dropQueued(ctx, job)
		d.done()
		return
	}
	c.start(ctx, k, d, job)
}

// start takes job's slot and claim and runs it.
func (c *Client) start(ctx context.Context, k *kind, d delivery, job Job) {
	kid := keyJobID(job.ChannelID, job.ID)
	input := []byte(inputOf(job))
	retry := job.Attempts > 0
	admitted := false
	var lease jobkeys.Lease
	var acqStart time.Time // when the acquisition that took the slot began
	for {
		acqStart = time.Now()
		opts := []jobkeys.AcquireOption{jobkeys.WithTries(job.Attempts + 1), jobkeys.WithInstanceID(c.cfg.Owner)}
		if retry {
			opts = append(opts, jobkeys.WithRetry())
		}
		acq, err := k.jt.Acquire(ctx, kid, input, opts...)
		if errors.Is(err, jobkeys.ErrInvalidKey) {
			c.cfg.Logger.Warn("jobs: job derives no key", "job", job.ID, "err", err)
			if _, err := c.supersede(ctx, job.ChannelID, job.ID, ReasonBadKey); err != nil {
				c.cfg.Logger.Warn("jobs: supersede job", "job", job.ID, "err", err)
			}
			d.done()
			return
		}
		if err != nil {
			c.cfg.Logger.Warn("jobs: acquire slot", "job", job.ID, "err", err)
			d.later(c.cfg.RecheckInterval)
			return
		}
		if acq.Kind == jobkeys.KindAcquired {
			lease = acq.Lease
			c.restoreStale(ctx, k, input, acq.Stale)
			break
		}
		now := c.cfg.Now()
		switch {
		case acq.Reason == jobkeys.ReasonAlreadyActive:
			// Its own live slot, from a run whose release is late: look
			// again once it could have lapsed.
			d.later(max(acq.NextExpiry.Sub(now), 0) + time.Second)
			return
		case acq.Reason == jobkeys.ReasonNotQueued && !admitted:
			// Never admitted: its producer died first (its check admits
			// it too), or its admission was replaced and the producer is
			// superseding it. After AdmitGrace, admit it strictly: a
			// replaced job must not replace another in turn, so a full
			// queue leaves it to try again, and the producer's supersede
			// ends it.
			if grace := job.CreatedAt.Add(c.cfg.AdmitGrace); now.Before(grace) {
				d.later(grace.Sub(now))
				return
			}
			adm, err := k.jt.Admit(ctx, kid, input, jobkeys.WithStrictCreate())
			if err != nil {
				c.cfg.Logger.Warn("jobs: repair admission", "job", job.ID, "err", err)
				d.later(c.cfg.RecheckInterval)
				return
			}
			if adm.Kind != jobkeys.KindAccepted {
				d.later(c.cfg.AdmitGrace) // the queue is full
				return
			}
			admitted = true
			continue
		case retry:
			// A retry on a full key waits at the head of its queue (as a
			// restored replaced job does): the next release announces it.
			res, err := k.jt.RestoreReplaced(ctx, kid, input, jobkeys.ReplacedJob{
				JobRef: jobkeys.JobRef{Service: c.cfg.Service, JobType: k.typ, ID: kid}, CreatedAt: job.CreatedAt,
			})
			if err != nil {
				c.cfg.Logger.Warn("jobs: queue retry", "job", job.ID, "err", err)
				d.later(c.cfg.RecheckInterval)
				return
			}
			c.announceRoom(ctx, k, res.State, 0) // a slot freed since
			d.done()
			return
		default:
			// Queued (or admitted just now) behind a full key: its turn
			// comes with a release's announcement.
			d.done()
			return
		}
	}
	select {
	case <-c.stopCh:
		c.release(ctx, k, lease)
		d.later(0)
		return
	default:
	}
	claimStart := time.Now()
	claimed, err := c.store.ClaimJob(ctx, ClaimJobRequest{ChannelID: job.ChannelID, JobID: job.ID, Owner: c.cfg.Owner, TTL: c.claimTTL})
	if err != nil {
		c.release(ctx, k, lease)
		if errors.Is(err, ErrConflict) || errors.Is(err, ErrNotFound) {
			d.done() // changed since the read: another announcement covers what is next
		} else {
			c.cfg.Logger.Warn("jobs: claim job", "job", job.ID, "err", err)
			d.later(c.cfg.RecheckInterval)
		}
		return
	}
	p := k.jt.Policy()
	clock := newLeaseClock(claimStart, c.claimTTL, p.HeartbeatTTL, deadlineMargin(p.HeartbeatInterval, p.HeartbeatTTL))
	clock.acquiredSlot(acqStart)
	c.runClaimed(ctx, k, d, &Run{c: c, job: claimed, claim: ClaimOf(claimed), clock: clock}, lease)
}

// restoreStale puts the runtime's jobs whose expired slots an acquisition
// dropped (FailStale: stale) back at the head of their key's queue (the
// key input derives): their workers died, or lost them, and a job with
// neither a slot nor a queue entry would look like one never admitted,
// left to AdmitGrace. A restored job that is over by now is dropped from
// the queue when its announcement finds it so; one still running in a
// live worker is handed back by that worker, and its entry lets it run
// again at its turn.
func (c *Client) restoreStale(ctx context.Context, k *kind, input []byte, stale []jobkeys.ActiveSlot) {
	for _, s := range stale {
		if _, _, ok := parseKeyJobID(s.JobID); !ok {
			continue // not the runtime's
		}
		res, err := k.jt.RestoreReplaced(ctx, s.JobID, input, jobkeys.ReplacedJob{
			JobRef: jobkeys.JobRef{Service: c.cfg.Service, JobType: k.typ, ID: s.JobID}, CreatedAt: s.StartedAt, Context: s.Context,
		})
		if err != nil {
			c.cfg.Logger.Warn("jobs: queue a job whose slot went stale", "job", s.JobID, "err", err)
			continue
		}
		c.announceRoom(ctx, k, res.State, 0) // a slot the stale one held may be free
	}
}

// runClaimed runs a job claimed under lease, its announcement marked
// running meanwhile, and then ends the announcement: done, or handed back
// for when the job is due again if the run requeued it. A process that
// dies first leaves the announcement to come back after AckWait.
func (c *Client) runClaimed(ctx context.Context, k *kind, d delivery, run *Run, lease jobkeys.Lease) {
	job := run.job
	ref := jobRef{job.ChannelID, job.ID}
	target := jobRef{job.ChannelID, job.TargetKey}
	ar := &activeRun{woken: make(chan struct{}, 1), generation: job.TargetGeneration}
	c.mu.Lock()
	c.runs[ref] = ar
	c.byTarget[target] = append(c.byTarget[target], ar)
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
	// The announcement is marked running while the claim holds, and not
	// after its local deadline: a worker whose claim lapsed (frozen, cut
	// off) lets it come back to another, which takes the claim over.
	marks := time.NewTicker(max(c.claimTTL+time.Second, dispatchAckWaitMin) / 3)
	defer marks.Stop()
	done := make(chan struct{})
	defer close(done)
	go func() {
		for {
			select {
			case <-done:
				return
			case <-marks.C:
				if run.clock.claimPast() {
					return
				}
				d.running()
			}
		}
	}()
	c.execute(ctx, k, run, ar, lease)
	ar.mu.Lock()
	again, over := ar.again, ar.over
	ar.mu.Unlock()
	switch {
	case over:
		d.done()
	case !again.IsZero():
		d.later(max(again.Sub(c.cfg.Now()), 0))
	default:
		// Nothing written: the claim was lost (another worker holds the
		// job, or it is paused, cancelled, superseded), or the last write
		// failed and the claim runs out. Look again once it would have.
		d.later(max(run.Job().ClaimExpiresAt.Sub(c.cfg.Now()), 0) + time.Second)
	}
}
