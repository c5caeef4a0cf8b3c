package jobs

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/jobkeys/jobkeys"
)

// ReconcileReport is what one [Client.Reconcile] did.
type ReconcileReport struct {
	// SlotsSwept counts expired slots removed from the kinds' keys.
	SlotsSwept int
	// QueueEntriesRemoved counts queue entries removed because their job
	// is over (completed, failed, cancelled, superseded), or missing for
	// longer than AdmitGrace.
	QueueEntriesRemoved int
}

// Reconcile repairs what crashes leave in the key layer, for every
// registered kind: it sweeps expired slots ([jobkeys.JobType.Sweep]) and
// removes queue entries whose job is over or, past AdmitGrace, missing.
// Expired claims need no pass of their own (claiming takes them over), nor
// do pending jobs without an admission (the worker that claims one admits
// it). Every write is a compare-and-swap: any number of processes may
// reconcile at once. Queue entries the runtime did not write (key-layer
// job ids without a channel) are left alone. A running client calls it
// every ReconcileInterval; errors name the key or job and the pass goes on.
func (c *Client) Reconcile(ctx context.Context) (ReconcileReport, error) {
	var rep ReconcileReport
	c.mu.Lock()
	kinds := make([]*kind, 0, len(c.kinds))
	for _, k := range c.kinds {
		kinds = append(kinds, k)
	}
	c.mu.Unlock()
	lister, _ := c.cfg.KeyStore.(jobkeys.ListableStore)
	var errs []error
	for _, k := range kinds {
		sw, err := k.jt.Sweep(ctx)
		rep.SlotsSwept += len(sw.Removed)
		if err != nil {
			errs = append(errs, err)
		}
		if lister == nil {
			continue
		}
		keys, err := lister.ListKeys(ctx, c.cfg.Service, k.typ)
		if err != nil {
			errs = append(errs, fmt.Errorf("jobs: reconcile kind %q: list keys: %w", k.typ, err))
			continue
		}
		for _, kv := range keys {
			n, err := c.pruneKVKey(ctx, kv)
			rep.QueueEntriesRemoved += n
			if err != nil {
				errs = append(errs, err)
			}
		}
	}
	if ctx.Err() != nil {
		return rep, ctx.Err()
	}
	return rep, errors.Join(errs...)
}

// reconcileLoop reconciles every ReconcileInterval (±10 %) until the
// client stops; ctx ends when Stop begins. The first pass comes after an
// interval too: a pass reads every key of the kinds and every queued
// job's record, cleanup that should not compete with the jobs a client
// starts on.
func (c *Client) reconcileLoop(ctx context.Context) {
	defer c.wg.Done()
	d := c.cfg.ReconcileInterval
	t := time.NewTimer(d - d/10 + rand.N(d/5+1))
	defer t.Stop()
	for {
		select {
		case <-c.stopCh:
			return
		case <-t.C:
		}
		if _, err := c.Reconcile(ctx); err != nil && ctx.Err() == nil {
			c.cfg.Logger.Warn("jobs: reconcile", "err", err)
		}
		t.Reset(d - d/10 + rand.N(d/5+1))
	}
}

// pruneKey removes the finished or missing jobs' entries from the queue
// of the key job derives under k.
func (c *Client) pruneKey(ctx context.Context, k *kind, job Job) (int, error) {
	key, err := k.jt.Key([]byte(inputOf(job)))
	if err != nil {
		return 0, err
	}
	return c.pruneKVKey(ctx, key.KVKey)
}

// pruneKVKey removes the queue entries of kvKey whose job is over, or
// missing past AdmitGrace, each with the coordinator's compare-and-swap
// (KeyCoordinator.RemoveQueuedEntry); it returns how many it removed.
// State that does not parse is an error and is left as it is.
func (c *Client) pruneKVKey(ctx context.Context, kvKey string) (int, error) {
	val, _, err := c.cfg.KeyStore.Get(ctx, c.cfg.Service, kvKey)
	if errors.Is(err, jobkeys.ErrKeyNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("jobs: reconcile KV key %q: %w", kvKey, err)
	}
	st, err := jobkeys.ParseState(val)
	if err != nil {
		return 0, fmt.Errorf("jobs: reconcile KV key %q: %w: %w", kvKey, jobkeys.ErrCorruptState, err)
	}
	read, err := c.peekQueued(ctx, st.Queued)
	if err != nil {
		return 0, fmt.Errorf("jobs: reconcile KV key %q: %w", kvKey, err)
	}
	now := c.cfg.Now()
	var drop []string
	due := make(map[string]bool, len(st.Queued)) // queued jobs that may start now
	for _, q := range st.Queued {
		ch, id, ok := parseKeyJobID(q.JobID)
		if !ok {
			continue
		}
		j, err := read(jobRef{ch, id})
		switch {
		case errors.Is(err, ErrNotFound):
			if !now.Before(q.CreatedAt.Add(c.cfg.AdmitGrace)) {
				drop = append(drop, q.JobID)
			}
		case err != nil:
			return 0, fmt.Errorf("jobs: reconcile KV key %q: job %q: %w", kvKey, id, err)
		case !j.State.Active():
			drop = append(drop, q.JobID)
		case j.State == StatePending && !j.AvailableAt.After(now):
			due[q.JobID] = true
		}
	}
	removed := 0
	for _, id := range drop {
		out, err := c.coord.RemoveQueuedEntry(ctx, jobkeys.QueueEntryRef{Service: c.cfg.Service, KVKey: kvKey, JobID: id})
		if err != nil {
			return removed, fmt.Errorf("jobs: reconcile KV key %q: %w", kvKey, err)
		}
		if out.Kind == jobkeys.KindRemoved {
			removed++
			if out.State != nil {
				st = out.State
			}
		}
	}
	// Room with due jobs queued: their announcements were lost (a crash
	// between a write and its announcement) or are on their way; announce
	// them again (a duplicate costs a read). A job not due yet has its
	// schedule; a paused one is announced by its resume.
	c.mu.Lock()
	k := c.kinds[st.JobType]
	c.mu.Unlock()
	if k == nil {
		return removed, nil
	}
	free := freeSlots(k, st, now)
	for _, q := range st.Queued {
		if free == 0 {
			break
		}
		if ch, id, ok := parseKeyJobID(q.JobID); ok && due[q.JobID] {
			c.announceRef(ctx, k.typ, jobRef{ch, id}, time.Time{})
			free--
		}
	}
	return removed, nil
}

// jobsPeeker is a store that reads job records alone in batches
// (NATSStore.peekJobs); reconciliation reads a key's queued jobs so.
type jobsPeeker interface {
	peekJobs(ctx context.Context, refs []jobRef) (map[jobRef]Job, error)
}

// peekQueued reads the jobs of queued (the runtime's entries): in one
// batch when the store can, else one by one as they are asked for. The
// function it returns gives a job, or ErrNotFound.
func (c *Client) peekQueued(ctx context.Context, queued []jobkeys.QueuedJob) (func(jobRef) (Job, error), error) {
	bp, ok := c.peeker.(jobsPeeker) // the store itself, when it reads records alone
	if !ok {
		return func(r jobRef) (Job, error) { return c.peek(ctx, r) }, nil
	}
	refs := make([]jobRef, 0, len(queued))
	for _, q := range queued {
		if ch, id, ok := parseKeyJobID(q.JobID); ok {
			refs = append(refs, jobRef{ch, id})
		}
	}
	got, err := bp.peekJobs(ctx, refs)
	if err != nil {
		return nil, err
	}
	return func(r jobRef) (Job, error) {
		if j, ok := got[r]; ok {
			return j, nil
		}
		return Job{}, notFoundf("reconcile: job %q does not exist in channel %q", r.id, r.channel)
	}, nil
}

// dropQueuedByScan removes job j's queue entry for a client without a kind
// for j.Type, which cannot derive j's key: it reads the keys of the type
// in the client's service until one queues j, and removes the entry there
// (KeyCoordinator.RemoveQueuedEntry, a compare-and-swap). Its cost grows
// with the type's keys; a missing bucket or a job queued nowhere is no
// error. The key store must list keys ([jobkeys.ListableStore]).
func (c *Client) dropQueuedByScan(ctx context.Context, j Job) error {
	lister, ok := c.cfg.KeyStore.(jobkeys.ListableStore)
	if !ok {
		return fmt.Errorf("jobs: remove the queue entry of job %q of type %q: no kind for the type, and key store %T cannot list keys to find it", j.ID, j.Type, c.cfg.KeyStore)
	}
	keys, err := lister.ListKeys(ctx, c.cfg.Service, j.Type)
	if errors.Is(err, jobkeys.ErrBucketNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("jobs: remove the queue entry of job %q: list the keys of type %q: %w", j.ID, j.Type, err)
	}
	kid := keyJobID(j.ChannelID, j.ID)
	for _, kvKey := range keys {
		val, _, err := c.cfg.KeyStore.Get(ctx, c.cfg.Service, kvKey)
		if errors.Is(err, jobkeys.ErrKeyNotFound) {
			continue
		}
		if err != nil {
			return fmt.Errorf("jobs: remove the queue entry of job %q: read KV key %q: %w", j.ID, kvKey, err)
		}
		st, err := jobkeys.ParseState(val)
		if err != nil {
			continue // not this job's to judge: reconciliation reports it
		}
		for _, q := range st.Queued {
			if q.JobID != kid {
				continue
			}
			if _, err := c.coord.RemoveQueuedEntry(ctx, jobkeys.QueueEntryRef{Service: c.cfg.Service, KVKey: kvKey, JobID: kid}); err != nil {
				return fmt.Errorf("jobs: remove the queue entry of job %q from KV key %q: %w", j.ID, kvKey, err)
			}
			return nil
		}
	}
	return nil
}
