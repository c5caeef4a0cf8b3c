package jobs

import (
	"context"
	"slices"
	"sync"
	"time"
)

// MemoryStore is a [Store] in process memory: what tests and single-process
// users run. It is safe for concurrent use; every value it returns is a
// copy. Its zero value is a usable empty store with the default [Config].
// Ids are unique per channel, as in every Store (a deliberate difference
// from the seed, which checked them across channels).
type MemoryStore struct {
	cfg      config
	mu       sync.Mutex
	channels map[string]*memChannel
	// dispatchers are the clients' dispatch queues, by key-layer service:
	// the clients of one MemoryStore in a process share them.
	dispatchers map[string]*memDispatcher
	// retention is how long finished jobs are kept (nil: for good);
	// expiries the finished jobs queued for deletion. See
	// retention_memory.go.
	retention *retention
	expiries  memExpiries
}

// dispatcher returns the dispatch queue of service's clients.
func (s *MemoryStore) dispatcher(service string) *memDispatcher {
	s.mu.Lock()
	defer s.mu.Unlock()
	d := s.dispatchers[service]
	if d == nil {
		if s.dispatchers == nil {
			s.dispatchers = make(map[string]*memDispatcher)
		}
		d = newMemDispatcher()
		s.dispatchers[service] = d
	}
	return d
}

var _ Store = (*MemoryStore)(nil)

// memChannel is one channel's records. Stored *Job and *Artifact values are
// never modified: a change stores a new value, so a pointer read under the
// lock stays valid after it.
type memChannel struct {
	revision    uint64
	jobs        map[string]*Job      // by job id
	targets     map[string]uint64    // generation by target key
	active      map[string][]string  // ids of the active jobs by target key
	idempotency map[string]string    // job id by idempotency key
	artifacts   map[string]*Artifact // by job id
	open        map[string]struct{}  // ids of the pending and running jobs
	// finished is told of a job just stored in a final state; nil: none.
	finished func(j *Job)
}

// NewMemoryStore returns an empty store configured by cfg (nil: defaults;
// see [Config]). cfg is copied. With Config.MeterProvider it reports the
// gauges of pending and running jobs by type, counted under its lock at
// each collection.
func NewMemoryStore(cfg *Config) (*MemoryStore, error) {
	c, err := newConfig(cfg)
	if err != nil {
		return nil, err
	}
	s := &MemoryStore{cfg: c}
	// The gauges of pending and running jobs by type live as long as the
	// MeterProvider (a MemoryStore is never closed).
	if _, err := c.obs.observeActive(s.countActive); err != nil {
		return nil, err
	}
	return s, nil
}

// channel returns the channel's records, creating them when create is set;
// nil when absent and not created. Called with mu held.
func (s *MemoryStore) channel(id string, create bool) *memChannel {
	if ch := s.channels[id]; ch != nil || !create {
		return ch
	}
	if s.channels == nil {
		s.channels = make(map[string]*memChannel)
	}
	ch := &memChannel{
		jobs:        make(map[string]*Job),
		targets:     make(map[string]uint64),
		active:      make(map[string][]string),
		idempotency: make(map[string]string),
		artifacts:   make(map[string]*Artifact),
		open:        make(map[string]struct{}),
		finished:    s.noteFinished,
	}
	s.channels[id] = ch
	return ch
}

// put stores j, keeping the active and open indexes. Called with mu held.
func (ch *memChannel) put(j Job) {
	old := ch.jobs[j.ID]
	ch.jobs[j.ID] = &j
	if !j.State.Active() && (old == nil || old.State.Active()) && ch.finished != nil {
		ch.finished(&j)
	}
	if old == nil || old.State.Active() != j.State.Active() {
		ids := slices.DeleteFunc(ch.active[j.TargetKey], func(id string) bool { return id == j.ID })
		if j.State.Active() {
			ids = append(ids, j.ID)
		}
		if len(ids) == 0 {
			delete(ch.active, j.TargetKey)
		} else {
			ch.active[j.TargetKey] = ids
		}
	}
	if j.State == StatePending || j.State == StateRunning {
		ch.open[j.ID] = struct{}{}
	} else {
		delete(ch.open, j.ID)
	}
}

// Enqueue implements [Store.Enqueue].
func (s *MemoryStore) Enqueue(ctx context.Context, req EnqueueRequest) (Enqueued, error) {
	return observe(ctx, s.cfg.obs, trEnqueue, s.enqueue, req)
}

// enqueue is Enqueue without its metrics.
func (s *MemoryStore) enqueue(ctx context.Context, req EnqueueRequest) (Enqueued, error) {
	req, err := prepareEnqueue(req)
	if err != nil {
		return Enqueued{}, err
	}
	if err := s.cfg.guard(ctx, "enqueue"); err != nil {
		return Enqueued{}, err
	}
	if err := s.cfg.channelExists(ctx, "enqueue", req.ChannelID); err != nil {
		return Enqueued{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.expire(s.cfg.now())
	ch := s.channel(req.ChannelID, false)
	if ch != nil {
		if id, ok := ch.idempotency[req.IdempotencyKey]; ok {
			out, err := replay(req, ch.jobs[id])
			if err != nil {
				return Enqueued{}, err
			}
			out.Job = cloneJob(out.Job)
			return out, nil
		}
	}
	if err := checkNewJob(req, ch != nil && ch.jobs[req.ID] != nil); err != nil {
		return Enqueued{}, err
	}
	ch = s.channel(req.ChannelID, true)
	var targetJobs []Job
	for _, id := range ch.active[req.TargetKey] {
		targetJobs = append(targetJobs, *ch.jobs[id])
	}
	now := s.cfg.now()
	rev := ch.revision + 1
	j, t, superseded := enqueueJob(req, ch.targets[req.TargetKey], targetJobs, now, rev)
	ch.revision = rev
	for _, p := range superseded {
		ch.put(p)
	}
	ch.put(j)
	ch.targets[t.TargetKey] = t.Generation
	ch.idempotency[j.IdempotencyKey] = j.ID
	out := Enqueued{Job: cloneJob(j)}
	for _, p := range superseded {
		out.Superseded = append(out.Superseded, cloneJob(p))
	}
	return out, nil
}

// Claim implements [Store.Claim].
func (s *MemoryStore) Claim(ctx context.Context, req ClaimRequest) ([]Job, error) {
	return observe(ctx, s.cfg.obs, trClaim, s.claim, req)
}

// claim is Claim without its metrics.
func (s *MemoryStore) claim(ctx context.Context, req ClaimRequest) ([]Job, error) {
	req, err := prepareClaim(req)
	if err != nil {
		return nil, err
	}
	if err := s.cfg.guard(ctx, "claim"); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.cfg.now()
	s.expire(now)
	var due []*Job
	collect := func(ch *memChannel) {
		for id := range ch.open {
			j := ch.jobs[id]
			if claimable(j, ch.targets[j.TargetKey], now) {
				due = append(due, j)
			}
		}
	}
	if req.ChannelID != "" {
		if ch := s.channel(req.ChannelID, false); ch != nil {
			collect(ch)
		}
	} else {
		for _, ch := range s.channels {
			collect(ch)
		}
	}
	slices.SortFunc(due, claimOrder)
	due = due[:min(len(due), req.Count)]
	revs := make(map[string]uint64)
	out := make([]Job, 0, len(due))
	for _, j := range due {
		ch := s.channels[j.ChannelID]
		rev, ok := revs[j.ChannelID]
		if !ok {
			rev = ch.revision + 1
			ch.revision = rev
			revs[j.ChannelID] = rev
		}
		c := claimJob(j, req, now, rev)
		ch.put(c)
		out = append(out, cloneJob(c))
	}
	return out, nil
}

// ClaimJob implements [Store.ClaimJob].
func (s *MemoryStore) ClaimJob(ctx context.Context, req ClaimJobRequest) (Job, error) {
	return observe(ctx, s.cfg.obs, trClaim, s.claimJob, req)
}

// claimJob is ClaimJob without its metrics.
func (s *MemoryStore) claimJob(ctx context.Context, req ClaimJobRequest) (Job, error) {
	req, err := prepareClaimJob(req)
	if err != nil {
		return Job{}, err
	}
	return s.change(ctx, "claim job", req.ChannelID, req.JobID, func(j *Job, gen uint64, now time.Time, rev uint64) (Job, error) {
		return claimNamedJob(j, req, gen, now, rev)
	})
}

// change runs the guard, then [MemoryStore.apply].
func (s *MemoryStore) change(ctx context.Context, op, channelID, jobID string,
	rule func(j *Job, generation uint64, now time.Time, rev uint64) (Job, error)) (Job, error) {
	if err := s.cfg.guard(ctx, op); err != nil {
		return Job{}, err
	}
	return s.apply(channelID, jobID, rule)
}

// apply applies rule to the job (nil when missing) under the lock and
// stores its result, stamping the channel's next revision.
func (s *MemoryStore) apply(channelID, jobID string,
	rule func(j *Job, generation uint64, now time.Time, rev uint64) (Job, error)) (Job, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.expire(s.cfg.now())
	var j *Job
	var gen, rev uint64 = 0, 1
	ch := s.channel(channelID, false)
	if ch != nil {
		j = ch.jobs[jobID]
		rev = ch.revision + 1
		if j != nil {
			gen = ch.targets[j.TargetKey]
		}
	}
	c, err := rule(j, gen, s.cfg.now(), rev)
	if err != nil {
		return Job{}, err
	}
	ch.revision = rev
	ch.put(c)
	return cloneJob(c), nil
}

// Renew implements [Store.Renew].
func (s *MemoryStore) Renew(ctx context.Context, req RenewRequest) (Job, error) {
	return observe(ctx, s.cfg.obs, trRenew, s.renew, req)
}

// renew is Renew without its metrics.
func (s *MemoryStore) renew(ctx context.Context, req RenewRequest) (Job, error) {
	req, err := prepareRenew(req)
	if err != nil {
		return Job{}, err
	}
	return s.change(ctx, "renew", req.Claim.ChannelID, req.Claim.JobID, func(j *Job, gen uint64, now time.Time, rev uint64) (Job, error) {
		return renewJob(j, req, gen, now, rev)
	})
}

// Requeue implements [Store.Requeue].
func (s *MemoryStore) Requeue(ctx context.Context, req RequeueRequest) (Job, error) {
	return observe(ctx, s.cfg.obs, trRequeue, s.requeue, req)
}

// requeue is Requeue without its metrics.
func (s *MemoryStore) requeue(ctx context.Context, req RequeueRequest) (Job, error) {
	req, err := prepareRequeue(req)
	if err != nil {
		return Job{}, err
	}
	return s.change(ctx, "requeue", req.Claim.ChannelID, req.Claim.JobID, func(j *Job, gen uint64, now time.Time, rev uint64) (Job, error) {
		return requeueJob(j, req, gen, now, rev)
	})
}

// AppendProgress implements [Store.AppendProgress].
func (s *MemoryStore) AppendProgress(ctx context.Context, req ProgressRequest) (Job, error) {
	return observe(ctx, s.cfg.obs, trProgress, s.appendProgress, req)
}

// appendProgress is AppendProgress without its metrics.
func (s *MemoryStore) appendProgress(ctx context.Context, req ProgressRequest) (Job, error) {
	req, err := prepareProgress(req)
	if err != nil {
		return Job{}, err
	}
	return s.change(ctx, "progress", req.Claim.ChannelID, req.Claim.JobID, func(j *Job, gen uint64, now time.Time, rev uint64) (Job, error) {
		return progressJob(j, req, gen, now, rev)
	})
}

// Settle implements [Store.Settle].
func (s *MemoryStore) Settle(ctx context.Context, req SettleRequest) (Detail, error) {
	return observe(ctx, s.cfg.obs, trSettle, s.settle, req)
}

// settle is Settle without its metrics.
func (s *MemoryStore) settle(ctx context.Context, req SettleRequest) (Detail, error) {
	req, err := prepareSettle(req)
	if err != nil {
		return Detail{}, err
	}
	if err := s.cfg.guard(ctx, "settle"); err != nil {
		return Detail{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.expire(s.cfg.now())
	var j *Job
	var gen, rev uint64 = 0, 1
	ch := s.channel(req.Claim.ChannelID, false)
	if ch != nil {
		j = ch.jobs[req.Claim.JobID]
		rev = ch.revision + 1
		if j != nil {
			gen = ch.targets[j.TargetKey]
		}
	}
	c, a, err := settleJob(j, req, gen, s.cfg.now(), rev)
	if err != nil {
		return Detail{}, err
	}
	if ch.artifacts[c.ID] != nil {
		return Detail{}, conflictf("settle: job %q already has an artifact", c.ID)
	}
	ch.revision = rev
	ch.put(c)
	ch.artifacts[c.ID] = &a
	return ch.detail(&c), nil
}

// Fail implements [Store.Fail].
func (s *MemoryStore) Fail(ctx context.Context, req FailRequest) (Job, error) {
	return observe(ctx, s.cfg.obs, trFail, s.fail, req)
}

// fail is Fail without its metrics.
func (s *MemoryStore) fail(ctx context.Context, req FailRequest) (Job, error) {
	req, err := prepareFail(req)
	if err != nil {
		return Job{}, err
	}
	return s.change(ctx, "fail", req.Claim.ChannelID, req.Claim.JobID, func(j *Job, gen uint64, now time.Time, rev uint64) (Job, error) {
		return failJob(j, req, gen, now, rev)
	})
}

// Pause implements [Store.Pause].
func (s *MemoryStore) Pause(ctx context.Context, req PauseRequest) (Job, error) {
	return observe(ctx, s.cfg.obs, trPause, s.pause, req)
}

// pause is Pause without its metrics.
func (s *MemoryStore) pause(ctx context.Context, req PauseRequest) (Job, error) {
	req, err := preparePause(req)
	if err != nil {
		return Job{}, err
	}
	return s.change(ctx, "pause", req.ChannelID, req.JobID, func(j *Job, gen uint64, now time.Time, rev uint64) (Job, error) {
		return pauseJob(j, req, gen, now, rev)
	})
}

// Resume implements [Store.Resume].
func (s *MemoryStore) Resume(ctx context.Context, req ResumeRequest) (Job, error) {
	return observe(ctx, s.cfg.obs, trResume, s.resume, req)
}

// resume is Resume without its metrics.
func (s *MemoryStore) resume(ctx context.Context, req ResumeRequest) (Job, error) {
	req, err := prepareResume(req)
	if err != nil {
		return Job{}, err
	}
	return s.change(ctx, "resume", req.ChannelID, req.JobID, func(j *Job, gen uint64, now time.Time, rev uint64) (Job, error) {
		return resumeJob(j, req, gen, now, rev)
	})
}

// Cancel implements [Store.Cancel].
func (s *MemoryStore) Cancel(ctx context.Context, req CancelRequest) (Job, error) {
	return observe(ctx, s.cfg.obs, trCancel, s.cancel, req)
}

// cancel is Cancel without its metrics.
func (s *MemoryStore) cancel(ctx context.Context, req CancelRequest) (Job, error) {
	req, err := prepareCancel(req)
	if err != nil {
		return Job{}, err
	}
	if err := s.cfg.guardCancel(ctx, req); err != nil {
		return Job{}, err
	}
	return s.apply(req.ChannelID, req.JobID, func(j *Job, gen uint64, now time.Time, rev uint64) (Job, error) {
		return cancelJob(j, req, gen, now, rev)
	})
}

// Supersede implements [Store.Supersede].
func (s *MemoryStore) Supersede(ctx context.Context, req SupersedeRequest) (Job, error) {
	return observe(ctx, s.cfg.obs, trSupersede, s.supersede, req)
}

// supersede is Supersede without its metrics.
func (s *MemoryStore) supersede(ctx context.Context, req SupersedeRequest) (Job, error) {
	req, err := prepareSupersede(req)
	if err != nil {
		return Job{}, err
	}
	return s.change(ctx, "supersede", req.ChannelID, req.JobID, func(j *Job, gen uint64, now time.Time, rev uint64) (Job, error) {
		return supersedeJob(j, req, gen, now, rev)
	})
}

// List implements [Store.List]: it sorts the listed channels' jobs (every
// channel's when req.ChannelID is empty) and filters them in memory.
func (s *MemoryStore) List(ctx context.Context, req ListRequest) (Page, error) {
	req, err := prepareList(req)
	if err != nil {
		return Page{}, err
	}
	if req.ChannelID != "" {
		if err := s.cfg.channelExists(ctx, "list", req.ChannelID); err != nil {
			return Page{}, err
		}
	} else if err := ctx.Err(); err != nil {
		return Page{}, err
	}
	s.mu.Lock()
	s.expire(s.cfg.now())
	var jobs []*Job
	var rev uint64
	add := func(ch *memChannel) {
		rev = max(rev, ch.revision)
		for _, j := range ch.jobs {
			jobs = append(jobs, j)
		}
	}
	if req.ChannelID == "" {
		for _, ch := range s.channels {
			add(ch)
		}
	} else if ch := s.channel(req.ChannelID, false); ch != nil {
		add(ch)
	}
	s.mu.Unlock()
	// The stored jobs are immutable; the Subject function runs unlocked.
	return listPage(jobs, req, rev, s.cfg.summarize), nil
}

// Get implements [Store.Get].
func (s *MemoryStore) Get(ctx context.Context, channelID, jobID string) (Detail, error) {
	if err := prepareGet(channelID, jobID); err != nil {
		return Detail{}, err
	}
	if err := s.cfg.channelExists(ctx, "get", channelID); err != nil {
		return Detail{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.expire(s.cfg.now())
	ch := s.channel(channelID, false)
	if ch == nil || ch.jobs[jobID] == nil {
		return Detail{}, notFoundf("get: job %q does not exist in channel %q", jobID, channelID)
	}
	return ch.detail(ch.jobs[jobID]), nil
}

// detail is a copy of j with its target, artifact and the channel
// revision. Called with mu held.
func (ch *memChannel) detail(j *Job) Detail {
	return Detail{
		Revision: ch.revision,
		Target:   Target{ChannelID: j.ChannelID, TargetKey: j.TargetKey, Generation: ch.targets[j.TargetKey]},
		Job:      cloneJob(*j),
		Artifact: cloneArtifact(ch.artifacts[j.ID]),
	}
}

// DeleteChannel implements [Store.DeleteChannel].
func (s *MemoryStore) DeleteChannel(ctx context.Context, channelID string) error {
	if err := checkString("delete channel", "ChannelID", channelID, IdentifierSizeLimit); err != nil {
		return err
	}
	if err := s.cfg.guard(ctx, "delete channel"); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.channels, channelID)
	return nil
}
