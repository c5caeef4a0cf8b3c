package jobs

import (
	"context"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/jobkeys/jobkeys/internal/jscas"
)

// A NATSStore's retention (see [Retention]) is the server's work: the
// write that finishes a job carries a per-message TTL (header Nats-TTL),
// its retention and a second, and the job's idempotency, target and list
// entries are rewritten, each over the revision read and only while it
// names the job, with the retention left, so that they go before the
// record. A key
// rewritten later (a newer job of the target, an enqueue after the
// idempotency entry went) is a new message without a TTL: a TTL never
// removes what a later write put under the key. Expiry leaves no delete
// marker.

// useRetention implements retentionUser. A bucket whose stream does not
// allow per-message TTL refuses an explicit retention and keeps every job
// under the default one, with a warning through Config.Logger.
func (s *NATSStore) useRetention(r retention, explicit bool) error {
	if r.keepsAll() {
		s.retention.Store(nil)
		return nil
	}
	if !s.ttlAllowed {
		if explicit {
			return conflictf("stream %q of KV bucket %q does not allow per-message TTL, which retention needs; allow it (AllowMsgTTL, nats-server 2.11 or later: open the store with WithCreateBucket, or edit the stream), or keep finished jobs (RetentionKeep)",
				s.streamName, s.Bucket())
		}
		if s.cfg.obs != nil && s.cfg.obs.logger != nil {
			s.cfg.obs.logger.LogAttrs(context.Background(), slog.LevelWarn, "jobs: finished jobs are kept: the job bucket does not allow per-message TTL (AllowMsgTTL), which retention needs",
				slog.String("stream", s.streamName))
		}
		return nil
	}
	s.retention.Store(&r)
	return nil
}

// finalTTL is the per-message TTL of a job record written in state st:
// its retention and a second (so that its entries, given the retention
// from a moment later, whole seconds, at least one, go first even at the
// shortest retention); 0 for an active state, a kept one, or a store
// without retention.
func (s *NATSStore) finalTTL(st State) time.Duration {
	if st.Active() {
		return 0
	}
	d := s.retention.Load().of(st)
	if d < 0 {
		return 0
	}
	return d + time.Second
}

// updateTTL is update with the message's per-message TTL (0: none).
func (s *NATSStore) updateTTL(ctx context.Context, op, key string, value []byte, rev uint64, ttl time.Duration) (newRev uint64, conflict bool, err error) {
	if ttl <= 0 {
		return s.update(ctx, op, key, value, rev)
	}
	if err := s.checkSize(op, key, len(value)); err != nil {
		return 0, false, err
	}
	w := jscas.Writer{Conn: s.js.Conn(), Stream: s.streamName, Timeout: s.requestTimeout(), TTL: ttl}
	newRev, err = w.Write(ctx, s.writePrefix+key, value, rev, false)
	if err == nil {
		return newRev, false, nil
	}
	if jscas.IsConflict(err) {
		return 0, true, nil
	}
	return 0, false, s.writeFailed(ctx, op, "write KV key "+strconv.Quote(key), err, s.keys.subject(key))
}

// satelliteTTL is the TTL of an entry rewritten elapsed after its job's
// record was sent with ttl (finalTTL's: the retention and a second): the
// time left less that second, whole seconds, at least one. The record goes
// a second or more after its entries, so an idempotency entry never names
// a job that is gone.
func satelliteTTL(ttl, elapsed time.Duration) time.Duration {
	left := (ttl - elapsed - time.Second).Truncate(time.Second)
	return max(left, time.Second)
}

// retireKeys are the keys of j's entries that retire rewrites.
func (s *NATSStore) retireKeys(j *Job) (idem, target, list string) {
	return s.keys.idem(j.ChannelID, j.IdempotencyKey), s.keys.target(j.ChannelID, j.TargetKey), s.keys.list(j.ChannelID, j.CreatedAt, j.ID)
}

// readRetire starts the read of j's entries (one batched read) and returns
// the function that waits for it: a store reads them while the write that
// finishes j is in flight. The function must be called.
func (s *NATSStore) readRetire(ctx context.Context, op string, j *Job) func() (map[string]natsMsg, error) {
	idem, target, list := s.retireKeys(j)
	type result struct {
		read map[string]natsMsg
		err  error
	}
	done := make(chan result, 1)
	go func() {
		read, err := s.getMany(ctx, op, []string{idem, target, list})
		done <- result{read, err}
	}()
	return func() (map[string]natsMsg, error) {
		r := <-done
		return r.read, r.err
	}
}

// retire gives the idempotency, target and list entries of job j, whose
// record was sent at sent with ttl, the time that is left: a
// compare-and-swap per entry that still names j, over the revision read
// (entries, from readRetire), sent together. An entry changed since the
// read is another write's, which keeps it. It is cleanup after the write
// that finished j: a failure is logged, not returned (the entries then
// stay until DeleteChannel).
func (s *NATSStore) retire(ctx context.Context, op string, j *Job, ttl time.Duration, sent time.Time, entries func() (map[string]natsMsg, error)) {
	read, err := entries()
	if err != nil {
		s.retireFailed(ctx, j, err)
		return
	}
	idemKey, targetKey, listKey := s.retireKeys(j)
	type write struct {
		key   string
		value []byte
		rev   uint64
	}
	var writes []write
	if m, ok := read[idemKey]; ok {
		if r, err := decodeNATSIdem(idemKey, m.rev, m.data); err == nil && r.JobID == j.ID {
			writes = append(writes, write{idemKey, m.data, m.rev})
		}
	}
	if m, ok := read[targetKey]; ok {
		if r, err := decodeNATSTarget(targetKey, m.rev, m.data); err == nil && r.JobID == j.ID {
			writes = append(writes, write{targetKey, m.data, m.rev})
		}
	}
	if m, ok := read[listKey]; ok {
		writes = append(writes, write{listKey, m.data, m.rev})
	}
	left := satelliteTTL(ttl, time.Since(sent))
	errs := make([]error, len(writes))
	var wg sync.WaitGroup
	for i, w := range writes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// A conflict is a later write of the key's: it is that
			// write's now, and keeps it.
			_, _, errs[i] = s.updateTTL(ctx, op, w.key, w.value, w.rev, left)
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			s.retireFailed(ctx, j, err)
			return
		}
	}
}

// retireFailed logs a retire that failed.
func (s *NATSStore) retireFailed(ctx context.Context, j *Job, err error) {
	if s.cfg.obs == nil || s.cfg.obs.logger == nil {
		return
	}
	s.cfg.obs.logger.LogAttrs(ctx, slog.LevelWarn, "jobs: a finished job's entries were not given its retention; they stay until the channel is deleted",
		slog.String("channel", j.ChannelID), slog.String("job", j.ID), slog.String("error", err.Error()))
}

// retireSuperseded gives the entries of job p, superseded by an enqueue
// whose batch, sent at sent, wrote p's record with its retention, the
// retention left (see retire).
func (s *NATSStore) retireSuperseded(ctx context.Context, op string, p *Job, sent time.Time) {
	ttl := s.finalTTL(p.State)
	if ttl <= 0 {
		return
	}
	s.retire(ctx, op, p, ttl, sent, s.readRetire(ctx, op, p))
}
