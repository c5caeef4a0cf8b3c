package jobkeys

import (
	"context"
	mrand "math/rand/v2"
	"sync"
	"time"
)

// keyTable is what a coordinator keeps per KV key (a keyEntry): a lane that
// lets one of its operations write the key at a time, the state and
// revision it last read or wrote, and the key's backoff window, its
// estimate of contention.
//
// The lane costs nothing on distinct keys and turns concurrent writes of
// one process to one key, which would otherwise lose compare-and-swap
// races to each other, into a queue in memory where each write starts from
// the state the one before it wrote: no read, no conflict. Reads are not
// queued. Races with other processes are still settled by compare-and-swap.
//
// Entries in use are never evicted; idle entries are kept only while they
// remember something (state, or an open backoff window), and at most max
// of them (evicting an arbitrary one), so memory stays bounded however many
// keys pass through. With max 0 no state is remembered between operations.
type keyTable struct {
	mu      sync.Mutex
	max     int
	entries map[string]*keyEntry
}

// keyEntry is one key's entry. users is guarded by keyTable.mu, the other
// fields but lane by mu.
//
// An operation uses it in this order: pace (before its first attempt, when
// the key is contended); then per attempt lock, begin (the state to start
// from), and after the write commit or conflict, then unlock. Reads run
// without the lane: mark before, observe or begin(read) after.
type keyEntry struct {
	lane  chan struct{} // holds one token while an operation may write
	users int           // operations that pinned the entry

	mu      sync.Mutex
	state   *KeyState // last state read or written; immutable once stored
	rev     uint64
	known   bool          // state and rev are what this coordinator last saw stored
	commits uint64        // successful writes (and deletes) through this entry
	window  time.Duration // backoff window; 0 while the key is not contended
	lostAt  time.Time     // when an operation last lost a race on the key
}

// windowMemory is how many backoff windows after its last lost race a key
// counts as contended: a key that has been quiet that long is cold again.
const windowMemory = 16

func newKeyTable(size int) *keyTable {
	return &keyTable{max: max(size, 0), entries: make(map[string]*keyEntry)}
}

// pin returns k's entry, creating it if needed, and keeps it in the
// table until unpin.
func (t *keyTable) pin(k string) *keyEntry {
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.entries[k]
	if e == nil {
		t.evictIdle()
		e = &keyEntry{lane: make(chan struct{}, 1)}
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
	e.mu.Lock()
	idle := !e.known && e.window == 0
	e.mu.Unlock()
	if len(t.entries) > t.max || idle {
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

// lock takes e's lane, waiting for it or for ctx to end.
func (e *keyEntry) lock(ctx context.Context) error {
	select {
	case e.lane <- struct{}{}:
		return nil
	default:
	}
	select {
	case e.lane <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// unlock releases e's lane.
func (e *keyEntry) unlock() { <-e.lane }

// start is the state an attempt starts from.
type start struct {
	state *KeyState // nil: the key is absent
	rev   uint64
	// verified says the state was stored at some instant during the
	// operation (read by it, or written by this coordinator meanwhile), so
	// an outcome that writes nothing may rest on it. Otherwise it is a
	// guess that only a successful compare-and-swap confirms.
	verified bool
}

// read is the result of a read made without the lane.
type read struct {
	state *KeyState
	rev   uint64 // 0 when the key is absent
	mark  uint64 // e.commits when the read began
}

// mark returns the count of commits, to be passed in a read to begin.
func (e *keyEntry) mark() uint64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.commits
}

// begin returns the state an attempt starts from; the caller holds the
// lane. With r nil (the first attempt) it is the remembered state if
// useCache, else an absent key if assumeAbsent, else ok is false: read
// first. With a read it is the newer of that read and what e knows, and ok
// false (read again) when that cannot be told: this coordinator deleted the
// key while the read ran and the read found it present. A write this
// coordinator committed while an "absent" read ran is taken as the newer
// (an absent read has no revision to order it by); without that, such a
// read would discard the coordinator's own newer write and its next
// compare-and-swap would lose a race to itself.
func (e *keyEntry) begin(r *read, useCache, assumeAbsent bool) (s start, ok bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if r == nil {
		switch {
		case useCache && e.known:
			return start{state: e.state, rev: e.rev}, true
		case assumeAbsent:
			return start{}, true
		}
		return start{}, false
	}
	own := e.commits != r.mark // this coordinator wrote the key during the read
	switch {
	case r.rev != 0 && e.known && e.rev > r.rev:
		// Stored after the read's snapshot (revisions only grow), so at
		// an instant during this operation.
		return start{state: e.state, rev: e.rev, verified: true}, true
	case r.rev != 0 && own && !e.known:
		// This coordinator deleted the key, perhaps after the read.
		return start{}, false
	case r.rev == 0 && own && e.known:
		// An absent read has no revision to order it by: the write
		// committed during it is the later confirmed state either way.
		return start{state: e.state, rev: e.rev, verified: true}, true
	}
	e.state, e.rev, e.known = r.state, r.rev, r.state != nil
	return start{state: r.state, rev: r.rev, verified: true}, true
}

// observe records a read's result that no write followed, without the
// lane, when it is newer than what e knows, so that the next write starts
// from it. An absent read is not recorded: it has no revision to order
// it by.
func (e *keyEntry) observe(state *KeyState, rev uint64) {
	if state == nil {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if rev > e.rev || !e.known {
		e.state, e.rev, e.known = state, rev, true
	}
}

// commit records a successful write of state at rev (state nil: a delete)
// and halves the backoff window, down to zero below floor. The caller
// holds the lane; state must not be modified afterwards.
func (e *keyEntry) commit(state *KeyState, rev uint64, floor time.Duration) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.state, e.rev, e.known = state, rev, state != nil
	e.commits++
	if e.window /= 2; e.window < floor {
		e.window = 0
	}
}

// conflict records a failed write: what e remembered is no longer stored.
func (e *keyEntry) conflict() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.state, e.rev, e.known = nil, 0, false
}

// lose records a race lost on the key and returns the pause to take before
// the next attempt: the window before it widened. The window starts at
// floor, doubles with every race lost on the key and halves with every
// commit (down to zero below floor), within ceiling, and is forgotten once
// the key has been quiet for windowMemory windows. All of this
// coordinator's operations on the key share it, and on a contended key
// operations pace their first attempt by it (see pace): so writers settle
// near an even chance per attempt, instead of early losers backing off ever
// further while fresh writers keep winning, and writers woken together
// spread out.
func (e *keyEntry) lose(floor, ceiling time.Duration, now time.Time) time.Duration {
	e.mu.Lock()
	defer e.mu.Unlock()
	window := max(e.window, floor)
	e.window = min(2*window, ceiling)
	e.lostAt = now
	return window
}

// paceWindow returns the window to pace a first attempt by, 0 on a key that
// is not contended (and then forgets a window that has gone quiet).
func (e *keyEntry) paceWindow(now time.Time) time.Duration {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.window > 0 && now.Sub(e.lostAt) < windowMemory*e.window {
		return e.window
	}
	e.window = 0
	return 0
}

// sleepJitter sleeps for a uniformly random duration in (0, window].
func sleepJitter(ctx context.Context, window time.Duration) error {
	t := time.NewTimer(time.Duration(mrand.Int64N(int64(window))) + 1)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
