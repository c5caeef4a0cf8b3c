package jobs

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"
)

// Claim implements [Store.Claim]. It lists the active entries of the
// channel (or of every channel), reads their jobs in batched reads, and
// claims the due ones in claim order, each with a compare-and-swap on its
// key; a job another process claimed or changed in between is skipped.
// Entries whose job is terminal or gone are removed on the way. A job
// record that does not validate is skipped (reported as [Store.Claim]
// says); the other jobs of its channel are still claimed.
func (s *NATSStore) Claim(ctx context.Context, req ClaimRequest) ([]Job, error) {
	return observe(ctx, s.cfg.obs, trClaim, s.claim, req)
}

// claim is Claim without its metrics: list the active entries (natsClaim.list),
// read their records and the targets of marked ones (read), pick the due
// jobs (due), drop the entries of finished or gone jobs, and claim the
// due jobs in claim order (take).
func (s *NATSStore) claim(ctx context.Context, req ClaimRequest) ([]Job, error) {
	req, err := prepareClaim(req)
	if err != nil {
		return nil, err
	}
	cl := &natsClaim{s: s, req: req}
	if err := s.cfg.guard(ctx, cl.op()); err != nil {
		return nil, err
	}
	if err := cl.list(ctx); err != nil {
		return nil, err
	}
	if len(cl.jobKeys) == 0 {
		return []Job{}, nil
	}
	if err := cl.read(ctx); err != nil {
		return nil, err
	}
	now := s.cfg.now()
	due, stale, err := cl.due(now)
	if err != nil {
		return nil, err
	}
	for _, key := range stale {
		s.dropActive(ctx, key, cl.entries[key].rev+1)
	}
	out, err := cl.take(ctx, due, now)
	if err != nil {
		return out, err
	}
	if len(out) == 0 && len(cl.skipped) > 0 {
		return out, fmt.Errorf("%s: no job claimed; skipped %d stored records that do not validate: %w", cl.op(), len(cl.skipped), errors.Join(cl.skipped...))
	}
	return out, nil
}

// natsClaim is one call of NATSStore.claim: what it read, step by step.
type natsClaim struct {
	s   *NATSStore
	req ClaimRequest
	// entries are the active entries listed, by KV key; refs the job
	// keys they name, with the entry's channel, job id and KV key;
	// jobKeys those job keys, sorted.
	entries map[string]natsMsg
	refs    map[string]natsActiveRef
	jobKeys []string
	// records are the job records read, by job key (absent: gone); raws
	// those that decode; targets the targets of the marked ones, by
	// target key.
	records map[string]natsMsg
	raws    map[string]*natsRawJob
	targets map[string]natsMsg
	// skipped are the errors of the records that do not validate.
	skipped []error
}

// natsActiveRef is what an active entry names: its job's channel and id,
// and the entry's own KV key.
type natsActiveRef struct{ channelID, jobID, activeKey string }

// natsCandidate is a claimable job, its KV key and the entry revision it
// was read at.
type natsCandidate struct {
	job       Job
	key       string
	rev       uint64
	activeSeq uint64
	// raw and target: the record as stored and its target, when the
	// record holds a mark (see natsstore_enqueue.go).
	raw    *natsRawJob
	target natsTargetRead
}

// op names the operation in errors.
func (*natsClaim) op() string { return "claim" }

// list reads the channel's active entries (every channel's without a
// channel) and, in the same request, the records of the jobs the store's
// pending hints name; it forgets the hints whose entry is gone.
func (cl *natsClaim) list(ctx context.Context) error {
	s := cl.s
	prefix := familyJob + "."
	if cl.req.ChannelID != "" {
		prefix += escapeToken(cl.req.ChannelID) + "."
	}
	hinted := s.pending.matching(prefix)
	entries, prefetched, err := s.listActive(ctx, cl.op(), cl.req.ChannelID, hinted)
	if err != nil {
		return err
	}
	cl.entries, cl.records = entries, prefetched
	cl.refs = make(map[string]natsActiveRef, len(entries))
	cl.jobKeys = make([]string, 0, len(entries))
	for key := range entries {
		channelID, jobID, err := parseActive(key)
		if err != nil {
			continue // not written by this store; never claimable
		}
		jk := s.keys.job(channelID, jobID)
		cl.refs[jk] = natsActiveRef{channelID, jobID, key}
		cl.jobKeys = append(cl.jobKeys, jk)
	}
	for _, jk := range hinted {
		if _, ok := cl.refs[jk]; !ok {
			s.pending.remove(jk) // gone, or finished by another store
		}
	}
	slices.Sort(cl.jobKeys)
	return nil
}

// read reads the records the listing did not bring, decodes them (a
// record that does not validate is skipped, its error kept), and reads
// the targets of the marked ones: unbatched enqueues' records are
// resolved against their targets, read after them.
func (cl *natsClaim) read(ctx context.Context) error {
	s := cl.s
	var missing []string
	for _, jk := range cl.jobKeys {
		if _, ok := cl.records[jk]; !ok {
			missing = append(missing, jk)
		}
	}
	if len(missing) > 0 {
		more, err := s.getMany(ctx, cl.op(), missing)
		if err != nil {
			return err
		}
		for k, m := range more {
			cl.records[k] = m
		}
	}
	cl.raws = make(map[string]*natsRawJob, len(cl.jobKeys))
	var targetKeys []string
	for _, jk := range cl.jobKeys {
		r := cl.refs[jk]
		m, ok := cl.records[jk]
		if !ok {
			continue
		}
		raw, err := decodeNATSRaw(jk, m, r.channelID, r.jobID)
		if err != nil {
			// Skipped, never written, its active entry kept: the rest of
			// the channel is still claimed (see Claim's doc).
			s.pending.remove(jk)
			cl.skipped = append(cl.skipped, err)
			continue
		}
		cl.raws[jk] = &raw
		if raw.marks.any() {
			targetKeys = append(targetKeys, s.keys.target(r.channelID, raw.job.TargetKey))
		}
	}
	if len(targetKeys) == 0 {
		return nil
	}
	var err error
	cl.targets, err = s.getMany(ctx, cl.op(), targetKeys)
	return err
}

// due returns the jobs claimable at now, in claim order, and the active
// entries (KV keys) of the jobs that are gone or no longer active.
func (cl *natsClaim) due(now time.Time) (due []natsCandidate, stale []string, err error) {
	for _, jk := range cl.jobKeys {
		r := cl.refs[jk]
		raw, ok := cl.raws[jk]
		if !ok {
			if _, read := cl.records[jk]; !read {
				stale = append(stale, r.activeKey)
			}
			continue
		}
		c, j, ok, err := cl.candidate(jk, r, raw)
		if err != nil {
			return nil, nil, err
		}
		if !ok {
			continue // an enqueue not committed (yet): its entry kept
		}
		if j.State != StatePending {
			cl.s.pending.remove(jk)
		}
		if !j.State.Active() {
			stale = append(stale, r.activeKey)
			continue
		}
		// Only the target's newest job can be active (an enqueue supersedes
		// the previous one in its batch, or marks it superseded before its
		// commit, resolved in candidate), so an active job's generation is
		// its target's current one.
		if claimable(&j, j.TargetGeneration, now) {
			c.job = j
			due = append(due, c)
		}
	}
	slices.SortFunc(due, func(a, b natsCandidate) int { return claimOrder(&a.job, &b.job) })
	return due, stale, nil
}

// candidate returns the candidate of the record raw of job key jk, and
// the job as it stands: a marked record resolved against its target
// (found false: an enqueue not committed yet).
func (cl *natsClaim) candidate(jk string, r natsActiveRef, raw *natsRawJob) (c natsCandidate, j Job, found bool, err error) {
	c = natsCandidate{key: jk, rev: raw.rev, activeSeq: raw.activeSeq}
	if !raw.marks.any() {
		return c, raw.job, true, nil
	}
	tk := cl.s.keys.target(r.channelID, raw.job.TargetKey)
	if m, ok := cl.targets[tk]; ok {
		t, err := decodeNATSTarget(tk, m.rev, m.data)
		if err != nil {
			return c, Job{}, false, err
		}
		c.target = natsTargetRead{rec: t, rev: m.rev}
	}
	c.raw = raw
	j, found = raw.resolve(c.target)
	return c, j, found, nil
}

// take claims the due jobs in order, up to the request's count, each with
// a compare-and-swap on its key: a job another process claimed or changed
// since the read is skipped. Once a job is claimed it is the caller's: a
// failure after it ends the call with the jobs claimed so far (the next
// call reports it), never with an error that would drop them.
func (cl *natsClaim) take(ctx context.Context, due []natsCandidate, now time.Time) ([]Job, error) {
	out := []Job{}
	for _, c := range due {
		if len(out) == cl.req.Count {
			break
		}
		if err := ctx.Err(); err != nil {
			return claimedOr(out, err)
		}
		claimed, ok, err := cl.takeOne(ctx, c, now)
		if err != nil {
			return claimedOr(out, err)
		}
		if ok {
			out = append(out, cloneJob(claimed))
		}
	}
	return out, nil
}

// takeOne claims candidate c: false when another process claimed or
// changed it since the read, or when an unbatched enqueue that marked it
// superseded-to-be committed after the read (the job is superseded, not
// claimed; see apply).
func (cl *natsClaim) takeOne(ctx context.Context, c natsCandidate, now time.Time) (Job, bool, error) {
	s, op := cl.s, cl.op()
	claimed := claimJob(&c.job, cl.req, now, 0)
	meta := natsMeta{activeSeq: c.activeSeq}
	var err error
	if c.raw != nil {
		if meta.supersede, err = s.beforeWrite(ctx, op, c.raw, c.target, &c.job, &claimed); err != nil {
			return Job{}, false, err
		}
	}
	value, err := encodeNATSJobMeta(&claimed, nil, meta)
	if err != nil {
		return Job{}, false, err
	}
	rev, conflict, err := s.update(ctx, op, c.key, value, c.rev)
	if err != nil || conflict {
		return Job{}, false, err
	}
	if meta.supersede != nil {
		t, err := s.readTarget(ctx, op, c.job.ChannelID, c.job.TargetKey)
		if err != nil {
			return Job{}, false, err
		}
		if t.rec.Generation > c.job.TargetGeneration {
			return Job{}, false, nil
		}
	}
	claimed.Revision = rev
	if meta.supersede == nil {
		s.cache.put(c.key, claimed, rev, c.activeSeq)
	}
	s.pending.remove(c.key)
	return claimed, true, nil
}

// claimedOr is what a Claim returns when it stops early with err: the jobs
// it claimed, if any, with no error; else err.
func claimedOr(out []Job, err error) ([]Job, error) {
	if len(out) > 0 {
		return out, nil
	}
	return nil, err
}
