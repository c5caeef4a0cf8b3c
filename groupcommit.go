package jobkeys

// Group commit (docs/design/keys-engine.md describes the per-key engine
// as a whole): the operations of one coordinator queued on one key's lane
// are written together. The operation that holds the lane takes those
// waiting behind it (in arrival order, at most groupCommitMax), applies
// their reducers in order, each to the state the one before it produced,
// and writes the last state with one compare-and-swap. They linearize at
// that write, in their order, as if they had run one after the other: every
// outcome is the one the operation would have had in that serial run.
//
// Operations that write (change the state) are the batch's writers; any
// number of others ride along, their outcomes resting on the write: a
// blocked acquisition, a renewal that finds its slot lost, a release of a
// slot already gone need no read of their own when they ride with a write
// that commits. What an outcome promises bounds the writers: its State is
// the state the operation wrote, a revision of the key (the audit checks
// every one is stored), and every revision is the work of one operation (a
// release frees one slot, an acquisition takes one and frees only expired
// ones). A write of the last state alone would leave the other writers'
// States unstored, and a release and an acquisition in one revision would
// look like the takeover of a live slot. So:
//
//   - over a store that writes successive states of a key in one step
//     (BatchWriter: NATS atomic batch publish, where it costs about one
//     round trip), a batch that updates the key takes up to groupCommitMax
//     writers and writes each one's own state, in order, as a revision of
//     its own: one WriteBatch, on condition that the key is still at the
//     revision the batch started from, all or nothing, at consecutive
//     revisions (WriteBatch). A release followed by the acquisition it lets
//     in is two revisions;
//   - otherwise a batch takes at most groupWriters writers and writes the
//     last state. groupWriters is 1, which keeps the contract; the engine
//     handles more (tests run it so), writing the last state only.
//
// A batch that creates the key writes one state (a create needs no
// batch: the next batch updates).
//
// A batch's holder may wait a little, holding the lane, for operations it
// expects (it lingers), so that they join its write instead of waiting a
// round trip for the next one:
//
//   - a batched write that frees slots of a key this process's Runners
//     wait on first wakes the waiters it frees them for, by the state the
//     batch leaves, as the watch's delivery would after it (prewake; only
//     waiters of this coordinator whose turn it is), and waits for their
//     acquisitions, which then reduce after the release, in the same
//     write. Nothing of that unstored state is recorded: each waiter's
//     outcome is its own reducer's in the batch, and a write that fails
//     sends it back to its retry rules as any operation;
//   - a batch that is no release, right after a batch that took a slot
//     (whose handler may return at once), waits for one release.
//
// A linger ends as soon as what it waits for has queued, after at most a
// fraction of a round trip (lingerBound), or when the holder's context
// ends; lingers for a release that waited in vain make the next batches
// skip theirs (see lane.Lane.LingerForRelease). An operation that queues
// while the holder lingers is taken as any waiting one (unless it read the
// key: it starts the next batch), and one whose context ends there leaves
// the queue with nothing applied. An operation alone on its key does not
// linger: it has no waiter to wake, and the release of a slot it took
// comes next.
//
// Where running operations together could give another outcome than the
// serial run, they do not run together:
//
//   - a state that fails a check of a written state (checkTimes, checkRoom)
//     fails it for the operation that produced it, which writes nothing, as
//     it would alone; the next operation starts from the state before it;
//   - a batch ends with an operation that empties the key (its write is a
//     delete; the next operation starts from an absent key, in the next
//     batch);
//   - a batch the store refuses as too large (ErrStateTooLarge) is run
//     again one operation at a time, so that only the operation whose own
//     state is too large gets the error; so is a batched write the store
//     refuses as a batch (ErrBatchRefused: too many batches open on the
//     stream, say), having written nothing.
//
// A batch that writes nothing rests on verified state, per operation, as a
// single operation does (see keycache.Start.Verified): an operation whose outcome
// writes nothing is done only if the state the batch started from was
// stored at an instant during it; otherwise it reads, on its own. A batch
// that loses a race, or wrote on a stale guess, sends every operation back
// to its own retry rules (run): each counts the lost race, and the key's
// backoff window widens once. A batch's write goes on while any of its
// operations' contexts lasts (batchCtx); an operation whose context ends
// while it waits in the queue leaves it with nothing applied, and one whose
// context ends once its batch has taken it waits for that batch's write,
// whose result is its outcome. A write that fails otherwise than by a
// lost race or a refusal (its contexts ended while it was under way, or
// the store failed) may have landed all the same, or may land later: each
// of its writers returns the error marked unsure (laneResult.unsure), and
// an acquisition takes back the slot it may have taken (undoAcquire).

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jobkeys/jobkeys/internal/keycache"
	"github.com/jobkeys/jobkeys/internal/lane"
)

// groupCommitMax bounds the operations of one batch, and so its writers
// (each one message of a batched write; a NATS server takes up to 1,000
// per atomic batch). The count bounds the time the first operation spends
// reducing for the others and how long the last one waits.
const groupCommitMax = 64

// groupWritersDefault is how many writing operations a batch carries when
// the store does not write batches (see BatchWriter); see the file comment
// for why it is one.
const groupWritersDefault = 1

// opLane is a key's lane (see internal/lane): one operation at a time
// holds it and writes the key, leading a batch of those queued behind it.
type opLane = lane.Lane[*laneOp]

// batchScratch is the lane holder's scratch lists: the operations of its
// batch, in first until a batch outgrows it, and the encoded states of a
// batched write (writeBatch). Only the lane's holder uses them.
type batchScratch struct {
	ops    []*laneOp
	first  [2]*laneOp
	values [][]byte
	ends   []int
}

// laneOp is one operation's turn at a key's lane.
type laneOp struct {
	lane.Op                                      // Ctx, Solo, Lease, Trust: what the lane sees of it
	reduce  func(*KeyState, time.Time) *KeyState // nil: a lock (see keyEntry.lock)
	rt      retry
	woken   bool                     // a woken waiter's acquisition over targeted wake-ups (waitTry.wake)
	r       *keycache.Read[KeyState] // the operation's last read; nil: none

	// Set by the batch's holder while the operation is in its batch.
	s     keycache.Start[KeyState] // what begin gave the operation
	ok    bool                     // begin's ok
	err   error                    // a check of the state it produced failed
	early bool                     // done before the batch's write: res is final
	wrote *KeyState                // the state it produced, when it writes (nil: it does not)
	res   laneResult
}

// laneOps recycles laneOps with what their lane.Op allocated.
var laneOps = sync.Pool{New: func() any { return new(laneOp) }}

// newLaneOp returns an operation of rt with reducer reduce; trust marks a
// waiting acquisition that trusts the watch feed (waitTry).
func newLaneOp(ctx context.Context, reduce func(*KeyState, time.Time) *KeyState, rt retry, trust bool) *laneOp {
	op := laneOps.Get().(*laneOp)
	op.Ctx, op.Lease, op.Trust = ctx, rt.lease != nil, trust
	op.reduce, op.rt = reduce, rt
	return op
}

// free returns op to laneOps once its operation is over.
func (op *laneOp) free() {
	op.Op.Reset()
	*op = laneOp{Op: op.Op}
	laneOps.Put(op)
}

// laneProbes, when a coordinator's lanes have them (set by diagnostics
// only, through keyTable.probes: see bench_linger_test.go), are told what
// the lane sees (lane: arrivals, lingers), of every batch that writes,
// once taken and reduced (ops, of which writers write), and of the end of
// its write.
type laneProbes struct {
	lane    lane.Probes[*laneOp]
	batch   func(l *opLane, ops []*laneOp, writers int)
	written func(l *opLane, err error)
}

// laneResult is the result of an operation's turn, for run.
type laneResult struct {
	s     keycache.Start[KeyState] // the state the turn's attempt started from
	done  bool                     // the operation is complete
	err   error                    // the operation must stop with err
	rerun bool                     // (lead) run again alone, still holding the lane
	pause time.Duration
	// unsure, with err, says the operation's state was in a write whose
	// outcome is unknown (its context ended, or the store failed, while it
	// was under way): it may have landed, or may still land, as a revision
	// conditioned on the one the batch started from (see undoAcquire).
	unsure bool
}

// lingerBound bounds how long a batch's holder waits for the acquisitions
// of the waiters it woke, or for a release, to join it (see
// lane.Lane.Linger): a fraction of a round trip to the store (one costs
// 60-150 µs on the benchmarks' embedded server), spent only when this
// process has waiters the batch frees slots for, or a slot it took just
// now. It is the default of keyTable.lingerWake and lingerRelease.
const lingerBound = 40 * time.Microsecond

// deliver ends a batch of ops whose first n ran: it hands ops[1:n] their
// results (op.res), returns the others to the head of the queue, and
// returns the result of ops[0], the holder.
func deliver(l *opLane, ops []*laneOp, n int) laneResult {
	l.Deliver(ops, n)
	return ops[0].res
}

// startFrom returns the start of op's attempt in a batch that started from
// s: s, verified for op when it was stored at an instant during op (op read
// it or an older revision, or a trusted watch feed vouches for it).
func (op *laneOp) startFrom(s keycache.Start[KeyState]) keycache.Start[KeyState] {
	v := op.Trust && s.Watched || op.woken && s.Cached ||
		op.ok && op.s.Verified && (op.s.Rev == s.Rev && (op.s.State == nil) == (s.State == nil) || op.s.Rev != 0 && s.Rev > op.s.Rev)
	return keycache.Start[KeyState]{State: s.State, Rev: s.Rev, Verified: v, Watched: s.Watched, Cached: s.Cached}
}

// turn takes op's turn at e's lane: it leads a batch (op and those waiting
// behind it) or is carried by one, and returns op's result. The error is
// op's context's, when it ended before op's turn.
func (c *KeyCoordinator) turn(e *keyEntry, key JobKey, op *laneOp, buf *[]byte) (laneResult, error) {
	lead, err := e.lane.Enter(op)
	if err != nil {
		return laneResult{}, err
	}
	if !lead {
		if op.Dropped != nil {
			return laneResult{err: op.Dropped}, nil
		}
		return op.res, nil
	}
	res := c.commitBatch(e, key, op, buf)
	for res.rerun {
		res = c.commitBatch(e, key, op, buf)
	}
	e.lane.Leave()
	return res, nil
}

// commitBatch runs the batch lead leads, holding e's lane: it hands every
// other operation of the batch its result and returns lead's. Its steps,
// in order (docs/design/keys-engine.md, "Concepts"): gather the
// operations waiting behind lead (gather), find the state they start
// from (begin), reduce them in order, each from the state the one before
// produced (reduceFrom), linger for this process's waiters the batch
// frees slots for (lingerForWoken), hand the outcomes that write nothing
// theirs (deliverUnwritten, sendEarly), write (write) and hand out the
// results (committed, failed).
func (c *KeyCoordinator) commitBatch(e *keyEntry, key JobKey, lead *laneOp, buf *[]byte) laneResult {
	b := laneBatch{c: c, e: e, key: key, lead: lead, buf: buf}
	b.gather()
	defer b.release()
	if !b.begin() {
		for _, op := range b.ops {
			op.res = laneResult{} // each reads first
		}
		return deliver(&e.lane, b.ops, len(b.ops))
	}
	if !b.reduceFrom(0) {
		b.lingerForWoken()
	}
	if !b.writes {
		return b.deliverUnwritten()
	}
	b.sendEarly()
	if p := c.keys.probes; p != nil && p.batch != nil {
		p.batch(&e.lane, b.ops[:b.n], b.writers)
	}
	wctx := lead.Ctx
	if b.n > 1 {
		bc := newBatchContext(b.ops[:b.n])
		defer bc.stop()
		wctx = bc
	}
	final, rev, err := b.write(wctx)
	if err == nil {
		return b.committed(final, rev)
	}
	return b.failed(wctx, err)
}

// laneBatch is the batch a lane's holder runs (see commitBatch).
type laneBatch struct {
	c    *KeyCoordinator
	e    *keyEntry
	key  JobKey
	lead *laneOp
	buf  *[]byte                  // the encode buffer of the batch's states
	ops  []*laneOp                // lead first, then those taken from the queue, in order
	s    keycache.Start[KeyState] // the state the batch starts from
	bw   BatchWriter              // the store's batched writes; nil: none
	// batched: the store writes successive states of the key in one step,
	// and takes every writer of the batch, each state a revision of its
	// own; else a batch carries at most c.groupWriters, and writes the
	// last state. A batch that creates the key writes one state (Create).
	batched    bool
	maxWriters int
	n          int       // ops[:n] are in the batch; the others start the next one
	cur        *KeyState // the state the operations reduced so far produced
	encoded    *KeyState // the state *buf holds
	writes     bool      // an operation's outcome writes
	writers    int       // the operations whose outcomes write
	acquired   int       // the writers that took a slot: their releases may come soon
}

// gather makes lead and the operations waiting behind it the batch: a
// release can join only a batched write (one writer else), so a batch
// that may be batched first lingers for one (see lane.Lane.LingerForRelease).
func (b *laneBatch) gather() {
	l, sc := &b.e.lane, &b.e.scratch
	if sc.ops == nil {
		sc.ops = sc.first[:0]
	}
	b.ops = append(sc.ops[:0], b.lead)
	if b.lead.Solo {
		return
	}
	if b.lead.rt.lease == nil && l.ReleasesDue() && canBatch(b.c.store, b.key) {
		if l.LingerForRelease(b.lead.Ctx, b.c.keys.lingerRelease) {
			b.c.keys.lingers.Add(1)
		}
	}
	b.ops = l.Take(b.ops, groupCommitMax)
}

// release gives the batch's list back to the lane, cleared.
func (b *laneBatch) release() {
	clear(b.ops)
	b.e.scratch.ops = b.ops[:0]
}

// begin finds the state to start from: each operation's read, if newer,
// updates what the entry knows (keycache.Entry.Begin); the batch starts from the
// newest, the start begin gave the last operation it could give one. It
// reports false when it gave none one: each must read first.
func (b *laneBatch) begin() bool {
	last := -1
	for i, op := range b.ops {
		op.s, op.ok = b.e.Begin(op.r, b.c.keys.max > 0, op.rt.assumeAbsent, op.Trust)
		op.err, op.early, op.wrote = nil, false, nil
		if op.ok {
			last = i
		}
	}
	if last < 0 {
		return false
	}
	b.s = b.ops[last].s
	b.bw, _ = b.c.store.(BatchWriter)
	b.batched = b.bw != nil && b.s.State != nil && b.bw.Batches(b.key.Service, b.key.KVKey)
	b.maxWriters = b.c.groupWriters
	if b.batched {
		b.maxWriters = groupCommitMax
	}
	b.n, b.cur = len(b.ops), b.s.State
	return true
}

// reduceFrom reduces ops[from:] in order, each from the state the one
// before produced; it reports whether the batch ended before the last of
// them (b.n is then where it ended).
func (b *laneBatch) reduceFrom(from int) bool {
	b.n = len(b.ops)
	for i := from; i < len(b.ops); i++ {
		if b.reduceOp(i) {
			return true
		}
	}
	return false
}

// reduceOp reduces ops[i] from b.cur, and reports whether the batch ends
// with it or before it (b.n says where).
func (b *laneBatch) reduceOp(i int) bool {
	op := b.ops[i]
	next := op.reduce(b.cur, b.c.cfg.Now())
	if writesNothing(next, b.cur) {
		// Ahead of every write, on state verified for it, the outcome is
		// final now, as it would be alone.
		if i > 0 && !b.writes {
			if st := op.startFrom(b.s); st.Verified {
				op.res, op.early = laneResult{s: st, done: true}, true
			}
		}
		return false
	}
	if b.writers == b.maxWriters {
		b.n = i // one writer too many: it starts the next batch
		return true
	}
	if next.Empty() {
		if b.writes && b.s.State == nil {
			b.n = i // the key was never stored: the batch creates it, the next one deletes it
			return true
		}
		b.cur, b.writes, b.n = next, true, i+1 // a delete ends the batch
		op.wrote = next
		b.writers++
		return true
	}
	if err := checkTimes(b.key.KVKey, next, b.c.cfg.Now); err != nil {
		op.err = err
		return false
	}
	if b.cur == nil || len(next.Queued) > len(b.cur.Queued) {
		b.c.encode(b.buf, next)
		b.encoded = next
		if err := b.c.checkRoom(op.Ctx, b.key, next, len(*b.buf)); err != nil {
			op.err = err
			return false
		}
	}
	if b.cur != nil && len(next.Active) > len(b.cur.Active) || b.cur == nil && len(next.Active) > 0 {
		b.acquired++ // a slot taken: its handler's release may come soon
	}
	b.cur, b.writes = next, true
	op.wrote = next
	b.writers++
	return false
}

// lingerForWoken: a batched write that frees slots wakes this process's
// waiters it frees them for now, and waits a little for their
// acquisitions to join it (see lane.Lane.Linger), as long as the batch has
// room for them.
func (b *laneBatch) lingerForWoken() {
	for b.batched && b.writes && b.writers < b.maxWriters && !b.lead.Solo && len(b.ops) < groupCommitMax &&
		b.s.State != nil && len(b.cur.Active) < len(b.s.State.Active) {
		woken := b.c.keys.prewake(b.key.KVKey, b.cur, b.s.Rev+uint64(b.writers))
		if woken == 0 {
			return
		}
		b.c.keys.lingers.Add(1)
		if _, arrived := b.e.lane.Linger(b.lead.Ctx, false, woken, b.c.keys.lingerWake); !arrived {
			return
		}
		from := len(b.ops)
		b.takeWoken()
		if b.reduceFrom(from) {
			return
		}
	}
}

// takeWoken adds to the batch the operations that queued while it
// lingered, up to the first that read the key: the state it starts from
// may be newer than the batch's, so it starts the next batch.
func (b *laneBatch) takeWoken() {
	from := len(b.ops)
	b.ops = b.e.lane.Take(b.ops, groupCommitMax)
	for i := from; i < len(b.ops); i++ {
		op := b.ops[i]
		if op.r != nil {
			b.e.lane.PutBack(b.ops[i:])
			clear(b.ops[i:])
			b.ops = b.ops[:i]
			return
		}
		op.s, op.ok = b.e.Begin(nil, b.c.keys.max > 0, op.rt.assumeAbsent, op.Trust)
		op.err, op.early, op.wrote = nil, false, nil
	}
}

// deliverUnwritten ends a batch none of whose outcomes writes: an outcome
// that writes nothing must not rest on a guess.
func (b *laneBatch) deliverUnwritten() laneResult {
	for _, op := range b.ops[:b.n] {
		if op.err != nil {
			op.res = laneResult{err: op.err}
			continue
		}
		st := op.startFrom(b.s)
		op.res = laneResult{s: st, done: st.Verified}
	}
	return deliver(&b.e.lane, b.ops, b.n)
}

// sendEarly hands the operations done already (op.early) their results:
// they need not wait for the write. It leaves them out of ops.
func (b *laneBatch) sendEarly() {
	k, early := 1, 0
	for i, op := range b.ops[1:] {
		if op.early && i+1 < b.n {
			b.e.lane.Send(op)
			early++
			continue
		}
		b.ops[k] = op
		k++
	}
	clear(b.ops[k:])
	b.ops, b.n = b.ops[:k], b.n-early
}

// write writes the batch with wctx: its success leaves the key at state
// final (nil: deleted) and revision rev.
func (b *laneBatch) write(wctx context.Context) (final *KeyState, rev uint64, err error) {
	c, e, key, s := b.c, b.e, b.key, b.s
	switch {
	case b.batched && b.writers > 1:
		final, rev, err = c.writeBatch(wctx, e, key, b.bw, b.ops[:b.n], s.Rev, b.buf)
	case b.cur.Empty():
		err = c.store.Delete(wctx, key.Service, key.KVKey, s.Rev)
		rev = s.Rev // absent now (past s.rev); Admit creates it without a read
	default:
		if b.encoded != b.cur {
			c.encode(b.buf, b.cur)
		}
		// cur is also its operation's outcome's State, which belongs to
		// the caller: remember a copy. The watch may recognise it before
		// the reply.
		final = snapshotOver(b.cur, s.State)
		e.Writing(*b.buf, final)
		if s.State == nil {
			rev, err = c.store.Create(wctx, key.Service, key.KVKey, *b.buf)
		} else {
			rev, err = c.store.Update(wctx, key.Service, key.KVKey, *b.buf, s.Rev)
		}
		e.Written()
	}
	if p := b.c.keys.probes; p != nil && p.written != nil {
		p.written(&e.lane, err)
	}
	return final, rev, err
}

// committed ends a batch whose write succeeded at state final and
// revision rev: the entry learns it, the wake-ups go out, and every
// operation gets its result. This process's waiters learn it from the
// watch, as every process's do.
func (b *laneBatch) committed(final *KeyState, rev uint64) laneResult {
	c, e, key := b.c, b.e, b.key
	e.Commit(final, rev, c.cfg.RetryBackoff)
	if c.wakes != nil && final != nil {
		c.publishWakes(key, b.s.State, final, rev, lastValue(*b.buf, e.scratch.ends, b.batched && b.writers > 1))
	}
	leases := 0
	for _, op := range b.ops[:b.n] {
		if op.rt.lease != nil {
			leases++
		}
	}
	e.lane.Returned(b.acquired, leases)
	for _, op := range b.ops[:b.n] {
		op.res = laneResult{s: keycache.Start[KeyState]{State: b.s.State, Rev: b.s.Rev, Verified: true}, done: op.err == nil, err: op.err}
	}
	return deliver(&e.lane, b.ops, b.n)
}

// failed ends a batch whose write (with wctx) failed with err.
func (b *laneBatch) failed(wctx context.Context, err error) laneResult {
	// A value refused for its size, or a batch refused as a batch,
	// changed nothing: s is still what e knows. Any other failure leaves
	// the stored state unknown.
	tooLarge := errors.Is(err, ErrStateTooLarge)
	refused := errors.Is(err, ErrBatchRefused)
	if !tooLarge && !refused {
		b.e.ConflictAt(b.s.Rev)
	}
	conflict := errors.Is(err, ErrRevisionConflict)
	if conflict {
		b.c.obs.conflict(b.lead.Ctx, &b.key)
	}
	switch {
	case tooLarge && b.n > 1, refused:
		// Which operation's state is too large? Run them one at a time,
		// in their order: lead now, the others handed the lane after it.
		// So too for a batch the store would not take as one.
		for _, op := range b.ops[:b.n] {
			op.Solo = true
		}
		b.e.lane.PutBack(b.ops[1:])
		return laneResult{rerun: true}
	case tooLarge:
		err = &StateError{KVKey: b.key.KVKey, Reason: fmt.Sprintf("new state of %d bytes (%d active, %d queued): %v", len(*b.buf), len(b.cur.Active), len(b.cur.Queued), err), Err: ErrStateTooLarge}
	case wctx.Err() != nil:
		err = nil // each its own context's
	case !conflict:
		err = fmt.Errorf("jobkeys: KV key %q: %w", b.key.KVKey, err)
	}
	if conflict {
		return b.lost()
	}
	for _, op := range b.ops[:b.n] {
		// A value refused for its size was not written; any other failure
		// leaves the writers' states maybe written.
		op.res = laneResult{err: err, unsure: !tooLarge && op.wrote != nil}
		if err == nil {
			op.res.err = op.Ctx.Err()
		}
	}
	return deliver(&b.e.lane, b.ops, b.n)
}

// lost ends a batch whose write lost a race, or rested on a stale guess:
// each operation goes back to its own retry rules. The key lost one race:
// its window widens once. A waiting acquisition on a fed key loses a race
// the watch answers: that widens no window (see run).
func (b *laneBatch) lost() laneResult {
	fed, lost := b.e.Fed(), false
	for _, op := range b.ops[:b.n] {
		st := op.startFrom(b.s)
		lost = lost || (st.Verified || st.Watched) && !(fed && op.Trust) && !op.woken
	}
	var pause time.Duration
	if lost {
		pause = b.e.Lose(b.c.cfg.RetryBackoff, b.c.cfg.MaxRetryBackoff, time.Now())
	}
	for _, op := range b.ops[:b.n] {
		op.res = laneResult{s: op.startFrom(b.s), pause: pause}
	}
	return deliver(&b.e.lane, b.ops, b.n)
}

// canBatch reports whether store writes successive states of key in one
// step (see BatchWriter).
func canBatch(store Store, key JobKey) bool {
	bw, ok := store.(BatchWriter)
	return ok && bw.Batches(key.Service, key.KVKey)
}

// writeBatch writes the states of the writers among ops (op.wrote, in
// their order) with one bw.WriteBatch on revision rev, each a revision of
// its own, the last a delete when it empties the key. It returns the state
// the key is left at (a copy; nil: deleted) and its revision.
func (c *KeyCoordinator) writeBatch(ctx context.Context, e *keyEntry, key JobKey, bw BatchWriter, ops []*laneOp, rev uint64, buf *[]byte) (*KeyState, uint64, error) {
	l := &e.scratch
	*buf, l.ends = (*buf)[:0], l.ends[:0]
	var last *KeyState
	for _, op := range ops {
		if op.wrote == nil {
			continue
		}
		last = op.wrote
		if !last.Empty() {
			*buf = appendState(*buf, last)
		}
		l.ends = append(l.ends, len(*buf))
	}
	values, from := l.values[:0], 0
	for _, end := range l.ends {
		values = append(values, (*buf)[from:end:end])
		from = end
	}
	defer func() {
		clear(values)
		l.values = values[:0]
	}()
	del := last.Empty()
	var final *KeyState
	if !del {
		// last is also its operation's outcome's State, which belongs to
		// the caller: remember a copy. The watch may recognise it before
		// the reply.
		final = snapshot(last)
		e.Writing(values[len(values)-1], final)
		defer e.Written()
	}
	lastRev, err := bw.WriteBatch(ctx, key.Service, key.KVKey, values, rev, del)
	return final, lastRev, err
}

// encode writes st's wire form into *buf, an encode buffer (see
// encodeBuffers: the bytes are valid until the next encode into it, and
// nobody may keep them past the write they are for).
func (c *KeyCoordinator) encode(buf *[]byte, st *KeyState) {
	if need := encodedSizeEstimate(st); cap(*buf) < need {
		// At least doubled, so that a key whose queue grows does not
		// outgrow it at every write.
		*buf = make([]byte, 0, max(need, 2*cap(*buf)))
	}
	*buf = appendState((*buf)[:0], st)
}

// batchCtx is the context of the write of a batch: it has the values of
// the first operation's context and ends only when every operation's
// context has ended, so that one operation giving up does not fail the
// others' write.
type batchCtx struct {
	context.Context
	ops   []*laneOp // the operations the write is for
	stops []func() bool
	end   context.CancelFunc
}

func newBatchContext(ops []*laneOp) *batchCtx {
	ctx, cancel := context.WithCancel(context.WithoutCancel(ops[0].Ctx))
	b := &batchCtx{Context: ctx, ops: ops, stops: make([]func() bool, len(ops)), end: cancel}
	live := new(atomic.Int64)
	live.Store(int64(len(ops)))
	for i, op := range ops {
		b.stops[i] = context.AfterFunc(op.Ctx, func() {
			if live.Add(-1) == 0 {
				cancel()
			}
		})
	}
	return b
}

// stop releases b.
func (b *batchCtx) stop() {
	for _, stop := range b.stops {
		stop()
	}
	b.end()
}
