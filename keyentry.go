package jobkeys

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jobkeys/jobkeys/internal/keycache"
	"github.com/jobkeys/jobkeys/internal/lane"
)

// keyTable is what a coordinator keeps per KV key (a keyEntry; the engine
// is described in docs/design/keys-engine.md): a lane that
// lets one of its operations write the key at a time, the state and
// revision it last read or wrote, and the key's backoff window, its
// estimate of contention.
//
// The lane costs nothing on distinct keys and turns concurrent writes of
// one process to one key, which would otherwise lose compare-and-swap
// races to each other, into a queue in memory where each write starts from
// the state the one before it wrote: no read, no conflict. Operations
// queued together are written together, with one compare-and-swap (group
// commit, see groupcommit.go). Reads are not queued. Races with other
// processes are still settled by compare-and-swap.
//
// Entries in use are never evicted; idle entries are kept only while they
// remember something (state, or an open backoff window), and at most max
// of them (evicting an arbitrary one), so memory stays bounded however many
// keys pass through. With max 0 no state is remembered between operations.
type keyTable struct {
	mu      sync.Mutex
	max     int
	entries map[string]*keyEntry
	// feeds are the Watchers this coordinator's Runners waited through
	// (see Watcher.linked): a batch wakes their waiters ahead of its
	// write (prewake).
	// Replaced, never modified, under mu.
	feeds atomic.Pointer[[]*Watcher]
	// lingerWake and lingerRelease bound how long a batch's holder
	// lingers for the acquisitions of the waiters it woke (prewake) and
	// for a release (see lane.Lane.Linger); lingerBound unless a test sets
	// them before the table is used. lingers counts the lingers.
	lingerWake    time.Duration
	lingerRelease time.Duration
	lingers       atomic.Int64
	// probes, nil but in diagnostics that set them before the table is
	// used, are given to every key's lane (see laneProbes).
	probes *laneProbes
}

// keyEntry is one key's entry: the lane, the stale policy, and what the
// coordinator knows of the key's stored state (the embedded
// keycache.Entry: its state, revision, backoff window, watch feed and
// hints). users is guarded by keyTable.mu; the cache guards its own.
//
// An operation uses it in this order: pace (PaceWindow, before its first
// attempt, when the key is contended); then per attempt a turn at the lane
// (lane.Lane.Enter: it leads a batch or a batch carries it), in which the
// batch's holder calls Begin (the state to start from) for each, and
// after the write Commit or ConflictAt, then leaves the lane. Reads run
// without the lane: Mark before, Observe or Begin(read) after.
type keyEntry struct {
	lane    opLane       // one operation writes at a time; see groupcommit.go
	scratch batchScratch // the lane holder's
	users   int          // operations that pinned the entry
	// blockStale is set while the StalePolicy of the last operation on
	// the key that knew its policy is Block (see blocksStale).
	blockStale atomic.Bool

	keycache.Entry[KeyState]
}

// decodeFed is the key entries' keycache.Entry.Decode: it decodes a value
// a watch feed delivered for the key kvKey of service, nil when the value
// is not that key's state.
func decodeFed(value []byte, service, kvKey string) *KeyState {
	st, err := decodeState(value)
	if err != nil || st.Service != service || kvKeyFor(st.Service, st.JobType, st.KeyHash) != kvKey {
		return nil
	}
	return st
}

func newKeyTable(size int) *keyTable {
	return &keyTable{max: max(size, 0), entries: make(map[string]*keyEntry), lingerWake: lingerBound, lingerRelease: lingerBound}
}

// pin returns k's entry, creating it if needed, and keeps it in the
// table until unpin.
func (t *keyTable) pin(k string) *keyEntry {
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.entries[k]
	if e == nil {
		t.evictIdle()
		e = &keyEntry{}
		e.Decode = decodeFed
		if t.probes != nil {
			e.lane.Probes = &t.probes.lane
		}
		t.entries[k] = e
	}
	e.users++
	return e
}

// unpin ends a pin. An entry no longer pinned is dropped when the table is
// over its bound or the entry remembers nothing.
func (t *keyTable) unpin(k string, e *keyEntry) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e.users--
	if e.users > 0 {
		return
	}
	if len(t.entries) > t.max || e.Idle() {
		delete(t.entries, k)
	}
}

// evictIdle makes room for one entry by evicting an arbitrary idle one.
// Called with t.mu held.
func (t *keyTable) evictIdle() {
	if len(t.entries) < t.max || t.max == 0 {
		return
	}
	for k, e := range t.entries {
		if e.users == 0 {
			delete(t.entries, k)
			return
		}
	}
}

// attach starts a watch feed of k's entry: the entry is kept while fed, and
// what it remembers is not trusted until the feed (or a read or write)
// refreshes it (keycache.Entry.Attach).
func (t *keyTable) attach(k string) {
	t.pin(k).Attach()
}

// detach ends a feed started by attach.
func (t *keyTable) detach(k string) {
	t.mu.Lock()
	e := t.entries[k]
	t.mu.Unlock()
	if e == nil {
		return
	}
	e.Detach()
	t.unpin(k, e)
}

// unwatched says the feed of k's entry may have missed changes (its watch
// ended): what it remembers is no longer trusted.
func (t *keyTable) unwatched(k string) {
	if e := t.entry(k); e != nil {
		e.Unwatched()
	}
}

// link adds w to t's feeds. Called with w.mu held.
func (t *keyTable) link(w *Watcher) {
	t.mu.Lock()
	defer t.mu.Unlock()
	var ws []*Watcher
	if old := t.feeds.Load(); old != nil {
		ws = slices.Clone(*old)
	}
	ws = append(ws, w)
	t.feeds.Store(&ws)
}

// unlink removes w from t's feeds. Called with w.mu held.
func (t *keyTable) unlink(w *Watcher) {
	t.mu.Lock()
	defer t.mu.Unlock()
	old := t.feeds.Load()
	if old == nil {
		return
	}
	ws := slices.DeleteFunc(slices.Clone(*old), func(x *Watcher) bool { return x == w })
	if len(ws) == 0 {
		t.feeds.Store(nil)
		return
	}
	t.feeds.Store(&ws)
}

// prewake wakes, ahead of a write of k by this coordinator that would
// leave the key at state st (revision rev), the waiters of this
// coordinator on k the write frees slots for, in the order the Watchers
// its Runners wait through would wake them on that change (see
// Watcher.prewake), so that their acquisitions can join the write's batch
// (see lane.Lane.Linger). It returns how many it woke. Nothing is
// recorded of st, which is not stored (yet): the watch's delivery of the
// write, or the write's failure, follows as without prewake. Call it
// holding k's lane, with no lock held; st must not be modified.
func (t *keyTable) prewake(k string, st *KeyState, rev uint64) int {
	ws := t.feeds.Load()
	if ws == nil {
		return 0
	}
	n := 0
	for _, w := range *ws {
		n += w.prewake(k, t, st, rev, time.Now())
	}
	return n
}

// watched records a change of k delivered by its watch feed: its state at
// rev (nil when deleted), or, when not ok, a value that is not the key's
// state (keycache.Entry.Watched). st must not be modified.
func (t *keyTable) watched(k string, st *KeyState, rev uint64, ok bool) {
	if e := t.entry(k); e != nil {
		e.Watched(st, rev, ok)
	}
}

// watchedValue is watched for a change of k delivered with its value not
// decoded (the state at rev, of a key of service): the entry keeps the
// value and decodes it only when an operation uses it
// (keycache.Entry.WatchedValue).
func (t *keyTable) watchedValue(k, service string, value []byte, rev uint64) {
	if e := t.entry(k); e != nil {
		e.WatchedValue(service, k, value, rev)
	}
}

// held returns the state k's entry holds at rev, or of its write under way
// when that wrote value, or nil (keycache.Entry.Held).
func (t *keyTable) held(k string, rev uint64, value []byte) *KeyState {
	if e := t.entry(k); e != nil {
		return e.Held(rev, value)
	}
	return nil
}

func (t *keyTable) entry(k string) *keyEntry {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.entries[k]
}

// lock takes e's lane for an operation of its own, outside any batch,
// waiting for it or for ctx to end.
func (e *keyEntry) lock(ctx context.Context) error {
	_, err := e.lane.Enter(&laneOp{Op: lane.Op{Ctx: ctx, Solo: true}})
	return err
}

// unlock releases e's lane.
func (e *keyEntry) unlock() { e.lane.Leave() }

// queuedBehind returns, when the state of key's entry is the latest its
// watch feed knows of (trusted) and has job jobID queued behind at least
// as many jobs as it leaves slots free (of limit; a lease that expired by
// now counts as free), the blocked outcome that state stands for and its
// revision: a try now would take a free slot ahead of jobs queued before
// it, or find the key busy. It returns 0 otherwise: the entry is not
// trusted, the job is not queued there (the feed may not have delivered
// its admission yet), or it is among the first free queued jobs, or holds
// a slot of its own (the reducer decides what a retry gets).
func (t *keyTable) queuedBehind(key JobKey, jobID string, limit int, now time.Time, cached bool) (Acquisition, uint64) {
	e := t.entry(key.KVKey)
	if e == nil {
		return Acquisition{}, 0
	}
	st, rev, ok := e.Trusted()
	if cached {
		st, rev, ok = e.Known()
	}
	if !ok {
		return Acquisition{}, 0
	}
	out, _, behind := queuedBehindIn(st, key, jobID, limit, now)
	if !behind {
		return Acquisition{}, 0
	}
	return out, rev
}

// queuedBehindIn reports whether, by state st, job jobID is queued behind
// at least as many jobs as st leaves slots free (of limit; a lease that
// expired by now counts as free), with the blocked outcome st stands for
// then and the job's place in the queue. It is false when the job is not
// queued in st, is among its first free queued jobs, or holds a slot.
func queuedBehindIn(st *KeyState, key JobKey, jobID string, limit int, now time.Time) (Acquisition, int, bool) {
	i := indexQueued(st.Queued, jobID)
	if i < 0 {
		return Acquisition{}, -1, false
	}
	out := Acquisition{Kind: KindBlocked, Reason: ReasonActiveLimit, DisplayKey: key.DisplayKey, KeyHash: key.KeyHash,
		Queued: len(st.Queued), Limit: limit}
	for k := range st.Active {
		slot := &st.Active[k]
		if slot.JobID == jobID {
			return Acquisition{}, -1, false
		}
		if exp := slot.LeaseExpiresAt; exp.After(now) {
			out.Active++
			if out.NextExpiry.IsZero() || exp.Before(out.NextExpiry) {
				out.NextExpiry = exp
			}
		}
	}
	if i < limit-out.Active {
		return Acquisition{}, -1, false
	}
	return out, i, true
}

// queuedIndex returns the place of job jobID in the queue of the state e
// knows, -1 when it knows none or the job is not queued there.
func (e *keyEntry) queuedIndex(jobID string) int {
	st, _, ok := e.Known()
	if !ok {
		return -1
	}
	return indexQueued(st.Queued, jobID)
}

// stalePolicy records p, the StalePolicy of an operation on the key ("":
// unknown, nothing recorded), for blocksStale.
func (e *keyEntry) stalePolicy(p StalePolicy) {
	if p == "" {
		return
	}
	if block := p == Block; e.blockStale.Load() != block {
		e.blockStale.Store(block)
	}
}

// blocksStale reports whether the last operation on the key that knew its
// policy had StalePolicy Block, under which an expired slot stays taken
// (every producer and worker of a job type shares its policy).
func (e *keyEntry) blocksStale() bool { return e.blockStale.Load() }
