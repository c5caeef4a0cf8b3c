package jobs

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
)

// The store's background purges: a finished job's entry in the active
// index is purged after the write that finished it, without the call
// waiting for the answer (an entry a purge misses is purged again by the
// next Claim that meets it). The answer is still read, on the store's
// reply subscription: a purge the server refuses for the user's
// permissions, or that fails otherwise, is counted and logged, and
// [NATSStore.Close] waits for the purges in flight.

// natsPurges tracks a store's purges in flight. Its zero value is ready;
// its methods are safe for concurrent use.
type natsPurges struct {
	mu     sync.Mutex
	flying map[*natsPurge]struct{} // sent, no answer or timeout yet
	// live counts the purges not yet done: answered, timed out or
	// cancelled, and their timer's function not running (see
	// natsPurge.refs). drained, when not nil, is closed when live
	// becomes 0.
	live    int
	drained chan struct{}

	refused atomic.Int64 // refused for the user's permissions
	failed  atomic.Int64 // failed otherwise: an error answer, no answer
	// warned is set once a refusal has been logged: a store logs it
	// once, since every later purge is refused too.
	warned atomic.Bool
}

// natsPurge is one purge in flight.
type natsPurge struct {
	queue *natsReplyQueue
	timer *time.Timer
	// refs is 2 while the purge is sent: one for its outcome (the answer,
	// the timeout or Close's cancellation, whichever comes first), one for
	// its timer (its function's run, or a Stop that kept it from running).
	// The purge is done, and no goroutine of it is left, at 0.
	refs atomic.Int32
}

// natsPurgeOutcome is how a purge ended.
type natsPurgeOutcome int

const (
	purgeDone      natsPurgeOutcome = iota // the server purged (or found nothing to)
	purgeRefused                           // refused for the user's permissions
	purgeFailed                            // an error answer, or none
	purgeCancelled                         // Close stopped waiting for it
)

// dropActive removes key's active entry if it was written before revision
// before: a purge that cannot remove an entry written later (a job
// re-created after DeleteChannel). It is cleanup, sent without waiting for
// the answer: an entry it misses is removed by the next Claim that meets
// it. Its answer (or its absence) is read in the background; see
// natsPurges.
func (s *NATSStore) dropActive(ctx context.Context, key string, before uint64) {
	if before == 0 || ctx.Err() != nil {
		return
	}
	body, err := natsPurgeBody(s.keys.subject(key), before)
	if err != nil {
		return
	}
	nc := s.js.Conn()
	replies, err := s.replies.open(nc)
	if err != nil {
		s.purged(nil, purgeFailed, fmt.Errorf("subscribe to the purge's answer: %w", err))
		return
	}
	p := &natsPurge{}
	p.refs.Store(2)
	s.purges.mu.Lock()
	if s.purges.flying == nil {
		s.purges.flying = make(map[*natsPurge]struct{})
	}
	s.purges.flying[p] = struct{}{}
	s.purges.live++
	var inbox string
	inbox, p.queue = replies.awaitFunc(func(m *nats.Msg) { s.purgeAnswered(p, m) })
	p.timer = time.AfterFunc(s.requestTimeout(), func() { s.purgeTimedOut(p) })
	s.purges.mu.Unlock()
	if err := nc.PublishRequest(s.purge, inbox, body); err != nil {
		if s.purges.resolve(p) {
			s.replies.release(p.queue)
			s.purged(p, purgeFailed, err)
		}
		if p.timer.Stop() {
			s.purges.unref(p)
		}
	}
}

// resolve reports whether p's outcome is the caller's to record: the first
// of the answer, the timeout and Close's cancellation. It drops p's
// outcome reference on the caller's behalf when it is.
func (ps *natsPurges) resolve(p *natsPurge) bool {
	ps.mu.Lock()
	_, ok := ps.flying[p]
	delete(ps.flying, p)
	ps.mu.Unlock()
	return ok
}

// unref drops one of p's references; the last makes p done.
func (ps *natsPurges) unref(p *natsPurge) {
	if p.refs.Add(-1) != 0 {
		return
	}
	ps.mu.Lock()
	ps.live--
	if ps.live == 0 && ps.drained != nil {
		close(ps.drained)
		ps.drained = nil
	}
	ps.mu.Unlock()
}

// purgeAnswered handles the server's answer to p (on the reply
// subscription's goroutine).
func (s *NATSStore) purgeAnswered(p *natsPurge, m *nats.Msg) {
	if !s.purges.resolve(p) {
		return
	}
	s.replies.release(p.queue)
	if p.timer.Stop() {
		s.purges.unref(p) // its timer will not run
	}
	outcome, err := purgeAnswer(m)
	s.purged(p, outcome, err)
}

// purgeAnswer reads a STREAM.PURGE answer.
func purgeAnswer(m *nats.Msg) (natsPurgeOutcome, error) {
	if len(m.Data) == 0 && m.Header.Get("Status") != "" { // "503": no responders
		return purgeFailed, fmt.Errorf("status %s %s", m.Header.Get("Status"), m.Header.Get("Description"))
	}
	if bytes.Contains(m.Data, []byte(`"success":true`)) {
		return purgeDone, nil
	}
	var resp struct {
		Error *struct {
			Code        int    `json:"code"`
			ErrCode     int    `json:"err_code"`
			Description string `json:"description"`
		} `json:"error"`
		Success bool `json:"success"`
	}
	switch err := json.Unmarshal(m.Data, &resp); {
	case err != nil:
		return purgeFailed, fmt.Errorf("bad answer: %w", err)
	case resp.Success:
		return purgeDone, nil
	case resp.Error != nil:
		return purgeFailed, fmt.Errorf("%s (code %d, error code %d)", resp.Error.Description, resp.Error.Code, resp.Error.ErrCode)
	}
	return purgeFailed, fmt.Errorf("answer without success or error: %q", m.Data)
}

// purgeTimedOut handles p when its answer did not come in time: a refusal
// of the purge subject (the server tells only the connection's error
// handler) or a lost request.
func (s *NATSStore) purgeTimedOut(p *natsPurge) {
	defer s.purges.unref(p) // the timer's reference, last: nothing of p runs after
	if !s.purges.resolve(p) {
		return
	}
	s.replies.release(p.queue)
	err := fmt.Errorf("no answer in %v: %w", s.requestTimeout(), nats.ErrTimeout)
	if refused, subject, ok := natsRefusal(s.js.Conn(), err, []string{s.purge}); ok {
		s.purged(p, purgeRefused, fmt.Errorf("the NATS server refused %s %q for this connection's user", refused, subject))
		return
	}
	s.purged(p, purgeFailed, err)
}

// purged records p's outcome (p nil: a purge that was never sent) and drops
// its outcome reference.
func (s *NATSStore) purged(p *natsPurge, outcome natsPurgeOutcome, err error) {
	if p != nil {
		defer s.purges.unref(p)
	}
	var logger *slog.Logger
	if s.cfg.obs != nil {
		logger = s.cfg.obs.logger
	}
	switch outcome {
	case purgeRefused:
		s.purges.refused.Add(1)
		if logger != nil && !s.purges.warned.Swap(true) {
			logger.LogAttrs(context.Background(), slog.LevelWarn,
				"jobs: the NATS server refuses this store's purges of finished jobs' active-index entries; claims read every finished job until the user may publish to the stream's purge subject (logged once per store)",
				slog.String("bucket", s.Bucket()), slog.String("subject", s.purge), slog.String("error", err.Error()))
		}
	case purgeFailed:
		s.purges.failed.Add(1)
		if logger != nil {
			logger.LogAttrs(context.Background(), slog.LevelDebug, "jobs: purge of a finished job's active-index entry failed; the next claim that meets it purges it again",
				slog.String("bucket", s.Bucket()), slog.String("error", err.Error()))
		}
	}
}

// Close ends the store's background work. Every write that finishes a job
// (and a Claim that meets a finished job) purges the job's entry from the
// active index without waiting for the answer; Close waits for the answers
// of the purges in flight until ctx ends, then stops waiting for the rest
// (returning an error that wraps ctx's and says how many), ends the
// store's subscription for replies, and ends its gauges of pending and
// running jobs (Config.MeterProvider). Call it after the store's last call has returned; a call made after
// Close still works, subscribing again. It is safe for concurrent use and
// may be called more than once.
func (s *NATSStore) Close(ctx context.Context) error {
	if s.gauges != nil {
		_ = s.gauges.Unregister() // the SDK's fails only for another provider's registration
	}
	ps := &s.purges
	var err error
	// With nothing in flight and ctx ended, select picks either case:
	// the second then finds no purge to stop, and that is no error.
	select {
	case <-ps.wait():
	case <-ctx.Done():
		ps.mu.Lock()
		var stopped []*natsPurge
		for p := range ps.flying {
			if p.timer.Stop() { // else its function runs now and ends it
				delete(ps.flying, p)
				stopped = append(stopped, p)
			}
		}
		ps.mu.Unlock()
		if len(stopped) > 0 { // else every purge ended, or ends now
			err = fmt.Errorf("jobs: close the store of bucket %s: stopped waiting for the answers of %d purges of finished jobs' active-index entries: %w", s.Bucket(), len(stopped), ctx.Err())
		}
		for _, p := range stopped {
			s.replies.release(p.queue)
			s.purged(p, purgeCancelled, nil)
			ps.unref(p)
		}
		<-ps.wait() // timer functions that were running: they end at once
	}
	s.replies.close()
	return err
}

// wait returns a channel closed when no purge is live.
func (ps *natsPurges) wait() <-chan struct{} {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if ps.live == 0 {
		c := make(chan struct{})
		close(c)
		return c
	}
	if ps.drained == nil {
		ps.drained = make(chan struct{})
	}
	return ps.drained
}
