package jobs

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// The unbatched enqueue of a NATSStore, for buckets where an atomic batch
// costs milliseconds (an R1 file-storage stream stages each batch in a
// temporary file store) or is not allowed. It writes one key at a time, in
// an order whose every prefix readers tolerate, and its last write, the
// target's, is its commit:
//
//  1. the idempotency record (created: expected revision 0), naming the job;
//  2. the job record, staged (natsJobRecord.Staged; created): the whole
//     job, pending, at the target's next generation, and the job the
//     target names, which it supersedes;
//  3. when that job's own enqueue is committed and unfinished (its record
//     still staged): the job that one superseded, superseded for good;
//     then that job's record unstaged;
//  4. the superseded job's record with a supersede mark
//     (natsJobRecord.Supersede; at the revision read), unless it has one
//     or is no longer active (3 and 4 are one write when both apply);
//  5. the job's list and active entries;
//  6. the target record (at the revision read), naming the job at its
//     generation: the commit.
//
// Writes 5 and 6 go out together (one round trip); the server applies
// them in order. Marks are resolved against the target, which every reader
// of a marked record reads after it (resolve): a staged job exists when
// its target names it at its generation, and its revision is then the
// target's; a marked active job is superseded when its target's generation
// is past its own, with the target's revision while the target is at the
// next generation (past that, step 3 of the next enqueue wrote it for
// good). So an enqueue's jobs and the channel carry one revision, the
// commit's, as a batched enqueue's do. A staged record loses its mark on
// the job's first change, which first writes the job it superseded for
// good (finishPrev); a supersede mark stays on every write of an active
// job (a write racing the commit must not drop it). Readers skip a staged
// record that is not committed: Get and every single-job call answer
// ErrNotFound, List leaves it out, Claim skips it and keeps its active
// entry (it may commit yet).
//
// A replay of the request (the same idempotency key) carries the enqueue
// on from whatever is written: it stages the job the idempotency record
// names, stages it again at the target's next generation when the target
// moved on (another enqueue committed in between), commits it, and answers
// Repeated only when the job was committed before it; an idempotency
// record whose job holds another idempotency key (the id was taken between
// the two writes) is taken over. An enqueue of the same target in between
// commits over the uncommitted job, which stays invisible. Concurrent
// enqueues of the same key, id or target conflict on the compare-and-swap
// of writes 1, 2 and 6 and read again. The crash windows are killed one
// by one in natsstore_enqueue_crash_test.go.

// natsWriteCut stops an unbatched enqueue's writes as a crash would, in
// fault tests: once left writes are sent, no other is, and the call that
// wanted one fails with errWritesCut.
type natsWriteCut struct {
	mu   sync.Mutex
	left int
	// sent counts the writes sent; committedAt is sent when the last
	// enqueue committed (the writes after it are its best-effort finish).
	sent, committedAt int
}

// committed notes that an enqueue committed with the writes sent so far.
func (c *natsWriteCut) committed() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.committedAt = c.sent
}

// errWritesCut is the error of a call whose writes a natsWriteCut stopped.
var errWritesCut = errors.New("the store's writes were cut (a fault test's crash)")

// take returns how many of n writes may still be sent, and counts them.
func (c *natsWriteCut) take(n int) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n = min(n, c.left)
	c.left -= n
	c.sent += n
	return n
}

// stagedWrites sends the writes of an unbatched enqueue (or of the
// finishing of one): a single conditional write as update sends it, more
// together (writeAll).
func (s *NATSStore) stagedWrites(ctx context.Context, op string, msgs []natsBatchMsg) ([]natsWriteResult, error) {
	if s.writeCut != nil {
		n := s.writeCut.take(len(msgs))
		if n < len(msgs) {
			if n > 0 {
				if _, err := s.writeAll(ctx, op, msgs[:n]); err != nil {
					return nil, err
				}
			}
			return nil, fmt.Errorf("%s: after %d of %d writes: %w", op, n, len(msgs), errWritesCut)
		}
	}
	if len(msgs) == 1 && msgs[0].check {
		rev, conflict, err := s.updateTTL(ctx, op, msgs[0].key, msgs[0].value, msgs[0].expect, msgs[0].ttl)
		if err != nil {
			return nil, err
		}
		return []natsWriteResult{{rev: rev, conflict: conflict}}, nil
	}
	return s.writeAll(ctx, op, msgs)
}

// stagedWrite is stagedWrites of one conditional write.
func (s *NATSStore) stagedWrite(ctx context.Context, op, key string, value []byte, expect uint64) (rev uint64, conflict bool, err error) {
	res, err := s.stagedWrites(ctx, op, []natsBatchMsg{{key: key, value: value, expect: expect, check: true}})
	if err != nil {
		return 0, false, err
	}
	return res[0].rev, res[0].conflict, nil
}

// natsRawJob is a job record as stored, its marks unresolved.
type natsRawJob struct {
	job       Job // as stored
	art       *Artifact
	rev       uint64 // the KV entry's
	activeSeq uint64
	marks     natsMarks
}

// decodeNATSRaw decodes the record m of job jobID in channelID.
func decodeNATSRaw(key string, m natsMsg, channelID, jobID string) (natsRawJob, error) {
	j, art, activeSeq, marks, err := decodeNATSJobStaged(key, m.rev, m.data, channelID, jobID)
	if err != nil {
		return natsRawJob{}, err
	}
	return natsRawJob{job: j, art: art, rev: m.rev, activeSeq: activeSeq, marks: marks}, nil
}

// natsTargetRead is a target record and its revision (0: no record).
type natsTargetRead struct {
	rec natsTargetRecord
	rev uint64
}

// resolve returns the job r stands for, its target read after it as t
// (see above); found is false for a staged record not committed.
func (r *natsRawJob) resolve(t natsTargetRead) (j Job, found bool) {
	j = r.job
	switch {
	case r.marks.staged != nil:
		if t.rev == 0 || t.rec.JobID != j.ID || t.rec.Generation != j.TargetGeneration {
			return Job{}, false
		}
		j.Revision = t.rev
	case r.marks.supersede != nil && t.rec.Generation > j.TargetGeneration:
		_, _, superseded := enqueueJob(EnqueueRequest{ChannelID: j.ChannelID, TargetKey: j.TargetKey}, j.TargetGeneration, []Job{j}, r.marks.supersede.At, 0)
		if len(superseded) == 0 {
			return j, true // not active: the mark is void
		}
		rev := r.job.Revision
		if t.rec.Generation == j.TargetGeneration+1 {
			rev = t.rev
		}
		j = superseded[0]
		j.Revision = rev
	}
	return j, true
}

// readTarget reads a target record.
func (s *NATSStore) readTarget(ctx context.Context, op, channelID, targetKey string) (natsTargetRead, error) {
	key := s.keys.target(channelID, targetKey)
	m, found, err := s.getOne(ctx, op, key)
	if err != nil || !found {
		return natsTargetRead{}, err
	}
	t, err := decodeNATSTarget(key, m.rev, m.data)
	if err != nil {
		return natsTargetRead{}, err
	}
	return natsTargetRead{rec: t, rev: m.rev}, nil
}

// natsJobRead is a job read for a call: its record, the target read after
// it when the record holds a mark, and the job as it stands.
type natsJobRead struct {
	raw    natsRawJob
	target natsTargetRead
	job    Job
	found  bool
}

// readJobFull reads job jobID of channel channelID, and its target when
// its record holds a mark, which it resolves.
func (s *NATSStore) readJobFull(ctx context.Context, op, channelID, jobID string) (natsJobRead, error) {
	key := s.keys.job(channelID, jobID)
	m, found, err := s.getOne(ctx, op, key)
	if err != nil || !found {
		return natsJobRead{}, err
	}
	raw, err := decodeNATSRaw(key, m, channelID, jobID)
	if err != nil {
		return natsJobRead{}, err
	}
	if !raw.marks.any() {
		return natsJobRead{raw: raw, job: raw.job, found: true}, nil
	}
	t, err := s.readTarget(ctx, op, channelID, raw.job.TargetKey)
	if err != nil {
		return natsJobRead{}, err
	}
	j, found := raw.resolve(t)
	return natsJobRead{raw: raw, target: t, job: j, found: found}, nil
}

// beforeWrite makes the write a change of a read job must come after, and
// returns the meta its record keeps: a staged job's first change drops the
// mark, so the job its enqueue superseded is written superseded for good
// first (finishPrev); a supersede mark stays while the job stays active
// and is not superseded by it.
func (s *NATSStore) beforeWrite(ctx context.Context, op string, raw *natsRawJob, t natsTargetRead, stored, next *Job) (*natsSupersede, error) {
	if st := raw.marks.staged; st != nil && st.Prev != "" {
		if err := s.finishPrev(ctx, op, stored, st.Prev, t.rev); err != nil {
			return nil, err
		}
	}
	if raw.marks.supersede != nil && stored.State.Active() && next.State.Active() {
		return raw.marks.supersede, nil
	}
	return nil, nil
}

// finishPrev writes job prevID superseded for good by j, whose enqueue
// committed at revision commit, if it is still active and of an older
// generation; the superseded job's revision is commit (as it read while
// marked), unless it was not marked and changed after the commit.
func (s *NATSStore) finishPrev(ctx context.Context, op string, j *Job, prevID string, commit uint64) error {
	key := s.keys.job(j.ChannelID, prevID)
	for round := range natsCASAttempts {
		if err := casPause(ctx, round); err != nil {
			return err
		}
		m, found, err := s.getOne(ctx, op, key)
		if err != nil || !found {
			return err
		}
		p, err := decodeNATSRaw(key, m, j.ChannelID, prevID)
		if err != nil {
			return err
		}
		if p.marks.staged != nil {
			return nil // never committed: no job
		}
		at := s.cfg.now()
		if p.marks.supersede != nil {
			at = p.marks.supersede.At
		}
		_, _, superseded := enqueueJob(EnqueueRequest{ChannelID: j.ChannelID, TargetKey: j.TargetKey}, j.TargetGeneration-1, []Job{p.job}, at, 0)
		if len(superseded) == 0 {
			return nil // finished, or superseded for good already
		}
		meta := natsMeta{activeSeq: p.activeSeq}
		if commit > p.job.Revision || p.marks.supersede != nil && progressBefore(&p.job, commit) {
			// A marked job read as superseded at the commit's revision
			// (resolve), whatever it was written at since.
			meta.revision = commit
		}
		v, err := encodeNATSJobMeta(&superseded[0], p.art, meta)
		if err != nil {
			return err
		}
		// Superseded for good: the write carries the job's retention, and
		// its entries follow (see Retention).
		sent := time.Now()
		res, err := s.stagedWrites(ctx, op, []natsBatchMsg{{key: key, value: v, expect: m.rev, check: true, ttl: s.finalTTL(StateSuperseded)}})
		if err != nil {
			return err
		}
		if res[0].conflict {
			continue
		}
		s.cache.drop(key)
		s.pending.remove(key)
		s.dropActive(ctx, s.keys.active(j.ChannelID, prevID), activeBound(p.activeSeq, res[0].rev))
		s.retireSuperseded(ctx, op, &superseded[0], sent)
		return nil
	}
	return conflictf("%s: job %q in channel %q, superseded by job %q: changed concurrently %d times in a row", op, prevID, j.ChannelID, j.ID, natsCASAttempts)
}

// progressBefore reports whether every progress entry of j is of revision
// rev or earlier (a record may not carry a later one than its own).
func progressBefore(j *Job, rev uint64) bool {
	for _, p := range j.Progress {
		if p.Revision > rev {
			return false
		}
	}
	return true
}

// enqueueStaged is enqueue on a bucket whose enqueues are not batched (see
// above). read is false when the target is new to this store: the first
// writes are then tried without a read, and a conflict makes it read.
func (s *NATSStore) enqueueStaged(ctx context.Context, req EnqueueRequest, read bool) (Enqueued, error) {
	const op = "enqueue"
	e := natsEnqueue{s: s, req: req,
		idemKey:   s.keys.idem(req.ChannelID, req.IdempotencyKey),
		targetKey: s.keys.target(req.ChannelID, req.TargetKey),
		jobID:     req.ID,
	}
	conflicts := 0
	// Each round takes one step: one write, or the answer. Every step but
	// a conflict moves the enqueue forward, and there are a handful.
	for conflicts < natsCASAttempts {
		if read {
			if err := e.read(ctx, op); err != nil {
				return Enqueued{}, e.failed(op, err)
			}
			read = false
		}
		out, done, conflict, err := e.step(ctx, op)
		if err != nil {
			return Enqueued{}, e.failed(op, err)
		}
		if done {
			return out, nil
		}
		if conflict {
			conflicts++
			read = true
			if err := casPause(ctx, conflicts); err != nil {
				return Enqueued{}, e.failed(op, err)
			}
		}
	}
	return Enqueued{}, conflictf("%s: job %q in channel %q: its keys changed concurrently %d times in a row", op, req.ID, req.ChannelID, natsCASAttempts)
}

// failed is the error of an enqueue that failed with err: ErrOutcomeUnknown
// naming the job, its idempotency key and the replay when a write's
// answer was lost or the call ended (its ctx, the server) after some of
// its writes, since what stands is then a prefix of them, which a replay
// carries on; err as it is otherwise.
func (e *natsEnqueue) failed(op string, err error) error {
	if errors.Is(err, ErrConflict) || errors.Is(err, ErrCorrupt) || !(e.sent || errors.Is(err, ErrOutcomeUnknown)) {
		return err
	}
	if !errors.Is(err, ErrOutcomeUnknown) {
		err = fmt.Errorf("%w (after some of its writes): %w", ErrOutcomeUnknown, err)
	}
	return fmt.Errorf("%s: job %q in channel %q (idempotency key %q) may have been written, in part or whole; replay the request (the same idempotency key and fingerprint): it finishes the enqueue, or returns the job if it was: %w",
		op, e.jobID, e.req.ChannelID, e.req.IdempotencyKey, err)
}

// natsEnqueue is the state of one unbatched enqueue: what it last read or
// wrote of its keys.
type natsEnqueue struct {
	s         *NATSStore
	req       EnqueueRequest
	idemKey   string
	targetKey string

	idem    *natsIdemRecord // nil: no idempotency record
	idemRev uint64
	// jobID is the job the enqueue makes: the one the idempotency record
	// names, else the request's.
	jobID  string
	job    *natsRawJob // nil: no record
	target natsTargetRead
	// prepared is the target revision at which the target's job was
	// marked (steps 3 and 4), 0: not yet.
	prepared uint64
	// marked is the target's job as this call marked it (or found it
	// marked), nil: none; once committed it is the job the enqueue
	// superseded (Enqueued.Superseded).
	marked *natsRawJob
	// listed is set once this call wrote the job's list and active
	// entries.
	listed bool
	// sent is set once this call sent a write.
	sent bool
	// committed is set when this call wrote the commit.
	committed bool
}

// read reads the enqueue's keys: the idempotency record, the job it names
// (else the request's) and that job's target, after the job.
func (e *natsEnqueue) read(ctx context.Context, op string) error {
	s, req := e.s, e.req
	e.idem, e.job, e.target = nil, nil, natsTargetRead{}
	e.targetKey = s.keys.target(req.ChannelID, req.TargetKey)
	read, err := s.getMany(ctx, op, []string{e.idemKey, s.keys.job(req.ChannelID, req.ID), e.targetKey})
	if err != nil {
		return err
	}
	e.jobID = req.ID
	if m, ok := read[e.idemKey]; ok {
		idem, err := decodeNATSIdem(e.idemKey, m.rev, m.data)
		if err != nil {
			return err
		}
		e.idem, e.idemRev, e.jobID = &idem, m.rev, idem.JobID
	}
	jobKey := s.keys.job(req.ChannelID, e.jobID)
	m, ok := read[jobKey]
	if !ok && e.jobID != req.ID {
		if m, ok, err = s.getOne(ctx, op, jobKey); err != nil {
			return err
		}
	}
	if ok {
		raw, err := decodeNATSRaw(jobKey, m, req.ChannelID, e.jobID)
		if err != nil {
			return err
		}
		e.job = &raw
		if tk := s.keys.target(req.ChannelID, raw.job.TargetKey); tk != e.targetKey || e.jobID != req.ID {
			// Read the job's own target after the job.
			e.targetKey = tk
			e.target, err = s.readTarget(ctx, op, req.ChannelID, raw.job.TargetKey)
			if err != nil {
				return err
			}
			if e.target.rev > 0 {
				s.targets.add(e.targetKey)
			}
			return nil
		}
	}
	if m, ok := read[e.targetKey]; ok {
		t, err := decodeNATSTarget(e.targetKey, m.rev, m.data)
		if err != nil {
			return err
		}
		e.target = natsTargetRead{rec: t, rev: m.rev}
		s.targets.add(e.targetKey)
	}
	return nil
}

// step takes the enqueue's next step from what it read and wrote: done
// with its answer, or one write made (conflict: refused; read again).
func (e *natsEnqueue) step(ctx context.Context, op string) (out Enqueued, done, conflict bool, err error) {
	s, req := e.s, e.req
	switch {
	case e.idem == nil:
		if err := checkNewJob(req, e.job != nil); err != nil {
			return Enqueued{}, false, false, err
		}
		idem := natsIdemRecord{JobID: req.ID, Fingerprint: req.Fingerprint}
		v, err := encodeNATSIdem(idem)
		if err != nil {
			return Enqueued{}, false, false, err
		}
		e.sent = true
		rev, conflict, err := s.stagedWrite(ctx, op, e.idemKey, v, 0)
		if err != nil || conflict {
			return Enqueued{}, false, conflict, err
		}
		e.idem, e.idemRev, e.jobID = &idem, rev, req.ID
		return Enqueued{}, false, false, nil

	case e.job == nil:
		// The idempotency record names a job not yet staged.
		if e.idem.Fingerprint != req.Fingerprint {
			return Enqueued{}, false, false, conflictf("enqueue: IdempotencyKey %q was used by job %q with another Fingerprint (stored %q, given %q)",
				req.IdempotencyKey, e.jobID, e.idem.Fingerprint, req.Fingerprint)
		}
		if err := checkNewJob(req, false); err != nil {
			return Enqueued{}, false, false, err
		}
		return e.stage(ctx, op)

	case e.job.job.IdempotencyKey != req.IdempotencyKey:
		// The idempotency record names a job of another key: the id was
		// taken between this key's write and its job's. The record is
		// dead; this request takes it over.
		if e.jobID == req.ID {
			return Enqueued{}, false, false, checkNewJob(req, true)
		}
		v, err := encodeNATSIdem(natsIdemRecord{JobID: req.ID, Fingerprint: req.Fingerprint})
		if err != nil {
			return Enqueued{}, false, false, err
		}
		e.sent = true
		if _, _, err := s.stagedWrite(ctx, op, e.idemKey, v, e.idemRev); err != nil {
			return Enqueued{}, false, false, err
		}
		return Enqueued{}, false, true, nil // taken over or not: read again
	}
	j, found := e.job.resolve(e.target)
	switch {
	case found && e.committed:
		s.pending.add(s.keys.job(j.ChannelID, j.ID))
		out := Enqueued{Job: cloneJob(j)}
		if m := e.marked; m != nil && m.job.TargetGeneration+1 == j.TargetGeneration {
			if p, _ := m.resolve(e.target); p.State == StateSuperseded {
				out.Superseded = []Job{cloneJob(p)}
			}
		}
		return out, true, false, nil
	case found:
		out, err := replay(req, &j)
		if err != nil {
			return Enqueued{}, false, false, err
		}
		out.Job = cloneJob(out.Job)
		return out, true, false, nil
	case e.job.job.Fingerprint != req.Fingerprint:
		// Staged, not committed, by a request of the same key with
		// another fingerprint: the key is that one's.
		return Enqueued{}, false, false, conflictf("enqueue: IdempotencyKey %q was used by job %q with another Fingerprint (stored %q, given %q)",
			req.IdempotencyKey, e.jobID, e.job.job.Fingerprint, req.Fingerprint)
	case e.job.job.TargetGeneration != e.target.rec.Generation+1 || e.job.marks.staged.Prev != e.target.rec.JobID:
		// Staged at an older generation: the target moved on since.
		return e.stage(ctx, op)
	case e.target.rec.JobID != "" && e.prepared != e.target.rev:
		return e.prepare(ctx, op)
	default:
		return e.commit(ctx, op)
	}
}

// stage writes the job record, staged at the target's next generation:
// created, or over a staged record of an older one.
func (e *natsEnqueue) stage(ctx context.Context, op string) (Enqueued, bool, bool, error) {
	s := e.s
	var j Job
	var expect uint64
	if e.job == nil {
		r := e.req
		r.ID = e.jobID
		j, _, _ = enqueueJob(r, e.target.rec.Generation, nil, s.cfg.now(), 0)
	} else {
		j = e.job.job
		j.TargetGeneration = e.target.rec.Generation + 1
		expect = e.job.rev
	}
	staged := &natsStaged{Prev: e.target.rec.JobID}
	v, err := encodeNATSJobMeta(&j, nil, natsMeta{staged: staged})
	if err != nil {
		return Enqueued{}, false, false, err
	}
	e.sent = true
	rev, conflict, err := s.stagedWrite(ctx, op, s.keys.job(j.ChannelID, j.ID), v, expect)
	if err != nil || conflict {
		return Enqueued{}, false, conflict, err
	}
	j.Revision = rev
	e.job = &natsRawJob{job: j, rev: rev, marks: natsMarks{staged: staged}}
	return Enqueued{}, false, false, nil
}

// prepare marks the target's current job superseded-to-be (steps 3 and 4
// above): finished for good first when its own enqueue is unfinished.
func (e *natsEnqueue) prepare(ctx context.Context, op string) (Enqueued, bool, bool, error) {
	s, t := e.s, e.target
	key := s.keys.job(e.req.ChannelID, t.rec.JobID)
	m, found, err := s.getOne(ctx, op, key)
	if err != nil {
		return Enqueued{}, false, false, err
	}
	if !found {
		e.prepared = t.rev // gone (a channel deleted under it): nothing to supersede
		return Enqueued{}, false, false, nil
	}
	cur, err := decodeNATSRaw(key, m, e.req.ChannelID, t.rec.JobID)
	if err != nil {
		return Enqueued{}, false, false, err
	}
	k, committed := cur.resolve(t)
	e.sent = true // from here on, writes (finishPrev's too)
	meta := natsMeta{activeSeq: cur.activeSeq, revision: k.Revision}
	switch {
	case !committed || !k.State.Active() || k.TargetGeneration != t.rec.Generation:
		e.prepared = t.rev // no job, or nothing to supersede
		return Enqueued{}, false, false, nil
	case cur.marks.staged != nil:
		if prev := cur.marks.staged.Prev; prev != "" {
			if err := s.finishPrev(ctx, op, &k, prev, t.rev); err != nil {
				return Enqueued{}, false, false, err
			}
		}
	case cur.marks.supersede != nil:
		e.prepared = t.rev // marked by an earlier try
		e.marked = &natsRawJob{job: k, marks: natsMarks{supersede: cur.marks.supersede}}
		return Enqueued{}, false, false, nil
	}
	meta.supersede = &natsSupersede{At: s.cfg.now()}
	v, err := encodeNATSJobMeta(&k, cur.art, meta)
	if err != nil {
		return Enqueued{}, false, false, err
	}
	_, conflict, err := s.stagedWrite(ctx, op, key, v, cur.rev)
	if err != nil || conflict {
		return Enqueued{}, false, conflict, err
	}
	s.cache.drop(key)
	e.prepared = t.rev
	e.marked = &natsRawJob{job: k, marks: natsMarks{supersede: meta.supersede}}
	return Enqueued{}, false, false, nil
}

// commit writes the job's list and active entries and then its target: the
// commit.
func (e *natsEnqueue) commit(ctx context.Context, op string) (Enqueued, bool, bool, error) {
	s, j := e.s, e.job.job
	target, err := encodeNATSTarget(natsTargetRecord{Generation: j.TargetGeneration, JobID: j.ID})
	if err != nil {
		return Enqueued{}, false, false, err
	}
	var msgs []natsBatchMsg
	if !e.listed {
		msgs = append(msgs, natsBatchMsg{key: s.keys.list(j.ChannelID, j.CreatedAt, j.ID)}, natsBatchMsg{key: s.keys.active(j.ChannelID, j.ID)})
	}
	msgs = append(msgs, natsBatchMsg{key: e.targetKey, value: target, expect: e.target.rev, check: true})
	e.sent = true
	res, err := s.stagedWrites(ctx, op, msgs)
	if err != nil {
		return Enqueued{}, false, false, err
	}
	e.listed = true
	last := res[len(res)-1]
	if last.conflict {
		return Enqueued{}, false, true, nil
	}
	e.committed = true
	if s.writeCut != nil {
		s.writeCut.committed()
	}
	e.target = natsTargetRead{rec: natsTargetRecord{Generation: j.TargetGeneration, JobID: j.ID}, rev: last.rev}
	s.targets.add(e.targetKey)
	if m := e.marked; m != nil && m.job.TargetGeneration+1 == j.TargetGeneration {
		// The job this enqueue superseded is written superseded for good
		// now, with its retention (see Retention), rather than at this
		// job's first change: a job that waits long must not keep it. A
		// failure leaves it to that first change (readers resolve the mark
		// meanwhile).
		_ = s.finishPrev(ctx, op, &j, m.job.ID, last.rev)
	}
	return Enqueued{}, false, false, nil
}
