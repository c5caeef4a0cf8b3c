package jobkeys

import (
	"bytes"
	"context"
	mrand "math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"
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
	// (see Watcher.linked): its writes are handed to them (handoff).
	// Replaced, never modified, under mu.
	feeds atomic.Pointer[[]*Watcher]
	// lingerWake and lingerRelease bound how long a batch's holder
	// lingers for the acquisitions of the waiters it woke (prewake) and
	// for a release (see lane.linger); lingerBound unless a test sets
	// them before the table is used. lingers counts the lingers.
	lingerWake    time.Duration
	lingerRelease time.Duration
	lingers       atomic.Int64
	// probes, nil but in diagnostics that set them before the table is
	// used, are given to every key's lane (see laneProbes).
	probes *laneProbes
}

// keyEntry is one key's entry. users is guarded by keyTable.mu, the other
// fields but lane by mu.
//
// An operation uses it in this order: pace (before its first attempt, when
// the key is contended); then per attempt a turn at the lane (lane.enter:
// it leads a batch or a batch carries it), in which the batch's holder
// calls begin (the state to start from) for each, and after the write
// commit or conflict, then leaves the lane. Reads run without the lane:
// mark before, observe or begin(read) after.
type keyEntry struct {
	lane  lane // one operation writes at a time; see groupcommit.go
	users int  // operations that pinned the entry
	// wakeMu guards held, the wake-up held for a write that may follow
	// (see wakeHold), and its fields.
	wakeMu sync.Mutex
	held   *heldWake
	// holdMisses counts the held wake-ups in a row that no write
	// followed (sent when wakeHold passed), holdSkips the wake-ups not
	// held since: see holdWake.
	holdMisses, holdSkips int
	// blockStale is set while the StalePolicy of the last operation on
	// the key that knew its policy is Block (see blocksStale).
	blockStale atomic.Bool

	mu      sync.Mutex
	state   *KeyState // last state read or written; immutable once stored
	rev     uint64
	known   bool          // state and rev are what this coordinator last saw stored
	commits uint64        // successful writes (and deletes) through this entry
	window  time.Duration // backoff window; 0 while the key is not contended
	lostAt  time.Time     // when an operation last lost a race on the key

	// The watch feed (see keyTable.watched): watching counts the waiter
	// subscriptions that feed the key's changes to this entry; watchRev
	// is the latest revision they delivered; fresh says the remembered
	// state (or its absence) has been set since the feed started and no
	// change since may have been missed; changed is closed (and replaced)
	// when a change arrives, for operations waiting for one.
	watching int
	watchRev uint64
	fresh    bool
	changed  chan struct{}
	// feedGen counts the feeds started (and ended by unwatched): a read or
	// write begun in an earlier one may predate a change the current feed
	// never delivers, so it does not make the entry fresh. writeGen is
	// feedGen when the write under way began (writing).
	feedGen  uint64
	writeGen uint64
	// recent holds the last states this coordinator wrote, by revision,
	// so that the watch, which delivers them a little later, need not
	// decode them again (see held).
	recent [recentStates]revState
	next   int // where recent's next state goes
	// inflight is the value of the write under way (while fed), and
	// inflightState its state: the watch may deliver the write before
	// its reply arrives.
	inflight      []byte
	inflightState *KeyState
	// value is the undecoded state at rev that the watch feed delivered
	// (watchedValue), while state is nil and known; materialize decodes
	// it when an operation needs it. valueService and valueKey are its
	// key's service and KV key.
	value        []byte
	valueService string
	valueKey     string
	// seenAt is when the state (and rev) was learned, by a read, a
	// write, a watch feed's delivery or a wake-up. sentAt is, for a
	// state learned from this coordinator's own read or write, when the
	// request that returned it was sent (every later write of the key
	// was committed after that instant); for a later state a watch feed
	// delivered over a known one, that one's (older, so trusted less:
	// see keepSentOver); zero for a state learned otherwise. writeSent
	// is when the write under way (writing) was sent, for commit.
	seenAt    time.Time
	sentAt    time.Time
	writeSent time.Time
	// hint is the latest revision a wake-up from another process named
	// (hinted) above the revision e holds, 0 once a read or a later state
	// settled it; hints counts the hints recorded. A wake-up is a hint:
	// nothing vouches for its revision or its state (anyone allowed to
	// publish on its subject can send one), so neither is ever a state
	// to write on. While a hint stands, an operation reads before it
	// writes instead of starting from what e holds (see begin).
	hint  uint64
	hints uint64
}

// recentStates is how many of its own writes per key a coordinator keeps
// for the watch to recognise.
const recentStates = 4

type revState struct {
	rev   uint64
	state *KeyState
}

// windowMemory is how many backoff windows after its last lost race a key
// counts as contended: a key that has been quiet that long is cold again.
const windowMemory = 16

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
		e.lane.probes = t.probes
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

// attach starts a watch feed of k's entry: the entry is kept while fed, and
// what it remembers is not trusted until the feed (or a read or write)
// refreshes it.
func (t *keyTable) attach(k string) {
	e := t.pin(k)
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.watching == 0 {
		e.fresh = false
		e.feedGen++
	}
	e.watching++
}

// detach ends a feed started by attach.
func (t *keyTable) detach(k string) {
	t.mu.Lock()
	e := t.entries[k]
	t.mu.Unlock()
	if e == nil {
		return
	}
	e.mu.Lock()
	e.watching--
	e.mu.Unlock()
	t.unpin(k, e)
}

// unwatched says the feed of k's entry may have missed changes (its watch
// ended): what it remembers is no longer trusted.
func (t *keyTable) unwatched(k string) {
	if e := t.entry(k); e != nil {
		e.mu.Lock()
		e.fresh, e.feedGen = false, e.feedGen+1
		e.mu.Unlock()
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

// handoff hands a write of k that this coordinator committed, the state
// st at revision rev (a stored revision: the write's reply says so), to
// the Watchers its Runners wait through, which wake the waiters on k it
// frees slots for at once, and feed it to the entries of k of every
// coordinator they feed, this one's and the process's others (see
// Watcher.handoff). A coordinator that no Runner waited through a Watcher
// with does nothing. Call it after commit, with no lock held (the lane
// may be: no Watcher waits for a lane); st must not be modified.
//
// A delete is not handed off: the store does not say the revision of its
// delete marker, and a change without its revision cannot be ordered
// against the watch's. Its watch delivery wakes the waiters.
func (t *keyTable) handoff(k string, st *KeyState, rev uint64) {
	ws := t.feeds.Load()
	if ws == nil || st == nil {
		return
	}
	for _, w := range *ws {
		w.handoff(k, st, rev)
	}
}

// prewake wakes, ahead of a write of k by this coordinator that would
// leave the key at state st (revision rev), the waiters of this
// coordinator on k the write frees slots for, in the order the Watchers
// it hands its writes to would wake them on that change (see
// Watcher.prewake), so that their acquisitions can join the write's batch
// (see lane.linger). It returns how many it woke. Nothing is recorded of
// st, which is not stored (yet): the write's hand-off, or its failure,
// follows as without prewake. Call it holding k's lane, with no lock held;
// st must not be modified.
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
// state (the next operation reads it and reports why). Changes arrive in
// revision order; one older than what the entry holds changes nothing.
func (t *keyTable) watched(k string, st *KeyState, rev uint64, ok bool) {
	e := t.entry(k)
	if e == nil {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if rev <= e.watchRev {
		return
	}
	e.watchRev = rev
	switch {
	case !ok:
		e.state, e.rev, e.known, e.fresh = nil, 0, false, false
	case rev > e.rev: // e.rev is 0 or, when not known, a revision the key is past
		e.keepSentOver()
		e.state, e.rev, e.known, e.fresh = st, rev, st != nil, true
		e.seenAt = time.Now()
		if st == nil {
			e.rev = 0
		}
	default:
		e.fresh = true // the entry holds a later state than the watch delivered
	}
	if e.changed != nil {
		close(e.changed)
		e.changed = nil
	}
}

// watchedValue is watched for a change of k delivered with its value not
// decoded (the state at rev, of a key of service): the entry keeps the
// value and decodes it only when an operation uses it (materialize).
func (t *keyTable) watchedValue(k, service string, value []byte, rev uint64) {
	e := t.entry(k)
	if e == nil {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if rev <= e.watchRev {
		return
	}
	e.watchRev = rev
	if rev > e.rev { // e.rev is 0 or, when not known, a revision the key is past
		e.keepSentOver()
		e.state, e.rev, e.known, e.fresh = nil, rev, true, true
		e.seenAt = time.Now()
		e.value, e.valueService, e.valueKey = value, service, k
	} else {
		e.fresh = true // the entry holds a later state than the watch delivered
	}
	if e.changed != nil {
		close(e.changed)
		e.changed = nil
	}
}

// keepSentOver is called before a feed's delivery replaces e's state with
// one of a later revision than e.rev: the send time of the state e knows
// bounds the writes after that later one too (see sentAt), but when e
// knows none, the delivery may be older than the state the send time came
// with (e.rev was reset, or is a revision the key is past), and it has
// none. Called with e.mu held.
func (e *keyEntry) keepSentOver() {
	if !e.known {
		e.sentAt = time.Time{}
	}
}

// materialize decodes the value watchedValue left for e's state, if it is
// still the state e holds; a value that is not the key's state leaves e
// knowing nothing (the next operation reads it and reports why). Called
// with e.mu held.
func (e *keyEntry) materialize() {
	if e.value == nil {
		return
	}
	value := e.value
	e.value = nil
	if !e.known || e.state != nil {
		return // set since, by a read, a write or a decoded change
	}
	st, err := decodeState(value)
	if err != nil || st.Service != e.valueService || kvKeyFor(st.Service, st.JobType, st.KeyHash) != e.valueKey {
		e.state, e.rev, e.known, e.fresh = nil, 0, false, false
		return
	}
	e.state = st
}

// Hinted records that a wake-up from another process named revision rev
// of e's key: until a read settles it (settleHint) or e holds a state of
// rev or later, the next operation on the key reads before it writes. A
// hint of a revision e holds, or older, changes nothing. So a forged
// wake-up costs at most one read per message, and never a write on a
// state its sender chose.
func (e *keyEntry) Hinted(rev uint64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if rev <= e.rev && e.known || rev <= e.hint {
		return
	}
	e.hint = rev
	e.hints++
}

// HintMark returns the count of hints, to be passed to settleHint after a
// read.
func (e *keyEntry) HintMark() uint64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.hints
}

// SettleHint drops the standing hint after a read that returned revision
// rev (0: absent) and whose request was sent after hintMark returned
// mark: the read saw the hint's revision, or, when it returned an older
// one though no hint came since mark, the hint named a revision the key
// had not reached when the read was served (a legitimate wake-up's
// revision was committed before it was sent): a forgery, or a revision
// the next wake-up will name again.
func (e *keyEntry) SettleHint(rev, mark uint64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.hint != 0 && (rev >= e.hint || e.hints == mark) {
		e.hint = 0
	}
}

// held returns the state k's entry holds at rev, or of its write under way
// when that wrote value, or nil.
func (t *keyTable) held(k string, rev uint64, value []byte) *KeyState {
	e := t.entry(k)
	if e == nil {
		return nil
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.known && e.rev == rev {
		e.materialize()
		return e.state
	}
	for _, r := range e.recent {
		if r.rev == rev && r.state != nil {
			return r.state
		}
	}
	if e.inflightState != nil && bytes.Equal(e.inflight, value) {
		return e.inflightState // the same bytes: the same state
	}
	return nil
}

// Writing records the write of value, the encoding of st, about to be made
// holding the lane, until written.
func (e *keyEntry) Writing(value []byte, st *KeyState) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.writeGen = e.feedGen
	e.writeSent = time.Now() // the write's request goes out after this
	if e.watching > 0 {
		e.inflight, e.inflightState = value, st
	}
}

// Written ends writing: the value's buffer may be reused.
func (e *keyEntry) Written() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.inflight, e.inflightState = nil, nil
}

func (t *keyTable) entry(k string) *keyEntry {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.entries[k]
}

// trusted reports whether e's state is the latest its watch feed knows of,
// with no change since that it may have missed. Called with e.mu held.
func (e *keyEntry) trusted() bool {
	return e.watching > 0 && e.fresh && e.known && e.rev >= e.watchRev
}

// refreshed marks a state just read or written as fresh when the entry is
// fed and the read or write began in feed generation gen (see feedGen).
// Called with e.mu held.
func (e *keyEntry) refreshed(gen uint64) {
	if e.watching > 0 && gen == e.feedGen {
		e.fresh = true
	}
}

// FeedMark returns the feed generation, to be passed in a read to begin.
func (e *keyEntry) FeedMark() uint64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.feedGen
}

// Fed reports whether a watch feeds e.
func (e *keyEntry) Fed() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.watching > 0 && e.fresh
}

// AwaitChange waits until e's watch feed delivers a revision after rev or
// e holds a later state, for at most bound; it reports whether one came.
func (e *keyEntry) AwaitChange(ctx context.Context, rev uint64, bound time.Duration) bool {
	var t *time.Timer
	defer func() {
		if t != nil {
			t.Stop()
		}
	}()
	for {
		e.mu.Lock()
		if e.watchRev > rev || e.known && e.rev > rev {
			e.mu.Unlock()
			return true
		}
		if e.changed == nil {
			e.changed = make(chan struct{})
		}
		ch := e.changed
		e.mu.Unlock()
		if t == nil {
			t = time.NewTimer(bound)
		}
		select {
		case <-ch:
		case <-t.C:
			return false
		case <-ctx.Done():
			return false
		}
	}
}

// lock takes e's lane for an operation of its own, outside any batch,
// waiting for it or for ctx to end.
func (e *keyEntry) lock(ctx context.Context) error {
	_, err := e.lane.enter(&laneOp{ctx: ctx, solo: true, wake: make(chan struct{}, 1)})
	return err
}

// unlock releases e's lane.
func (e *keyEntry) unlock() { e.lane.leave() }

// Start is the state an attempt starts from.
type Start struct {
	State *KeyState // nil: the key is absent
	Rev   uint64
	// Verified says the state was stored at some instant during the
	// operation (read by it, or written by this coordinator meanwhile), so
	// an outcome that writes nothing may rest on it. Otherwise it is a
	// guess that only a successful compare-and-swap confirms.
	Verified bool
	// Watched says the state is the latest the key's watch feed knows of
	// (keyEntry.trusted): a failed write on it lost a race, and the next
	// change the watch delivers answers it.
	Watched bool
	// Cached says the state is the one this coordinator last saw stored
	// (keyEntry.known), from before the operation: a woken waiter over
	// targeted wake-ups may find the key busy on it (see waitTry.wake).
	Cached bool
}

// Read is the result of a Read made without the lane.
type Read struct {
	State *KeyState
	Sent  time.Time // when the read's request was sent
	Rev   uint64    // 0 when the key is absent
	Mark  uint64    // e.commits when the read began
	Feed  uint64    // e.feedGen when the read began
}

// Mark returns the count of commits, to be passed in a read to begin.
func (e *keyEntry) Mark() uint64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.commits
}

// Begin returns the state an attempt starts from; the caller holds the
// lane. With r nil (the first attempt) it is the remembered state if
// useCache, else an absent key if assumeAbsent, else ok is false: read
// first. With a read it is the newer of that read and what e knows, and ok
// false (read again) when that cannot be told: this coordinator deleted the
// key while the read ran and the read found it present. A write this
// coordinator committed while an "absent" read ran is taken as the newer
// (an absent read has no revision to order it by); without that, such a
// read would discard the coordinator's own newer write and its next
// compare-and-swap would lose a race to itself.
//
// With trustWatch (a Runner's waiting acquisition), a remembered state
// that its watch feed vouches for counts as verified: such an operation
// may find the key busy on it without a read, and the watch wakes it when
// that changes.
func (e *keyEntry) Begin(r *Read, useCache, assumeAbsent, trustWatch bool) (s Start, ok bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.materialize()
	if r == nil {
		if e.hint > e.rev || e.hint != 0 && !e.known {
			// A wake-up named a later revision than e holds: read it
			// (see hinted).
			return Start{}, false
		}
		switch {
		case useCache && e.known:
			w := e.trusted()
			return Start{State: e.state, Rev: e.rev, Verified: trustWatch && w, Watched: w, Cached: true}, true
		case assumeAbsent:
			return Start{}, true
		}
		return Start{}, false
	}
	own := e.commits != r.Mark // this coordinator wrote the key during the read
	switch {
	case r.Rev != 0 && e.known && e.rev > r.Rev:
		// Stored after the read's snapshot (revisions only grow), so at
		// an instant during this operation.
		return Start{State: e.state, Rev: e.rev, Verified: true}, true
	case r.Rev != 0 && own && !e.known:
		// This coordinator deleted the key, perhaps after the read.
		return Start{}, false
	case r.Rev == 0 && own && e.known:
		// An absent read has no revision to order it by: the write
		// committed during it is the later confirmed state either way.
		return Start{State: e.state, Rev: e.rev, Verified: true}, true
	}
	e.state, e.rev, e.known = r.State, r.Rev, r.State != nil
	e.seenAt, e.sentAt = time.Now(), r.Sent
	e.refreshed(r.Feed)
	return Start{State: r.State, Rev: r.Rev, Verified: true}, true
}

// Observe records a read's result that no write followed, without the
// lane, when it is newer than what e knows, so that the next write starts
// from it. An absent read is not recorded: it has no revision to order
// it by.
func (e *keyEntry) Observe(state *KeyState, rev, feed uint64) {
	e.ObserveSent(state, rev, feed, time.Time{})
}

// ObserveSent is observe for a state this coordinator's own read returned,
// whose request was sent at sent (see keyEntry.sentAt); zero: not known.
func (e *keyEntry) ObserveSent(state *KeyState, rev, feed uint64, sent time.Time) {
	if state == nil {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if rev > e.rev || !e.known {
		e.state, e.rev, e.known = state, rev, true
		e.seenAt, e.sentAt = time.Now(), sent
		e.refreshed(feed)
	}
}

// Commit records a successful write of state at rev (state nil: a delete
// of revision rev, which e keeps, not known, so that a lagging watch feed's
// changes from before the delete are not taken for its state) and halves the backoff window, down to zero below floor. The caller
// holds the lane; state must not be modified afterwards.
func (e *keyEntry) Commit(state *KeyState, rev uint64, floor time.Duration) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if state != nil && e.watching > 0 {
		e.recent[e.next] = revState{rev: rev, state: state}
		e.next = (e.next + 1) % recentStates
	}
	// The watch feed may have delivered this write and later ones already.
	if state == nil || !e.known || rev >= e.rev {
		e.state, e.rev, e.known = state, rev, state != nil
		// A write not made through writing (an operator's) has no send
		// time: zero, or an earlier write's, which is older and so
		// trusted less (see sentAt).
		e.seenAt, e.sentAt = time.Now(), e.writeSent
		e.refreshed(e.writeGen)
	}
	e.writeSent = time.Time{}
	e.commits++
	if e.window /= 2; e.window < floor {
		e.window = 0
	}
}

// Conflict records a failed write: what e remembered is no longer stored.
func (e *keyEntry) Conflict() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.state, e.rev, e.known = nil, 0, false
}

// ConflictAt records a failed write on revision rev (0: a create): what e
// remembered is no longer stored, unless e learned of a later state
// meanwhile (from its watch feed or a read). The key is past rev: e keeps
// it (not known) so that a lagging watch feed's older changes are not
// taken for its state.
func (e *keyEntry) ConflictAt(rev uint64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.known && e.rev > rev {
		return
	}
	e.state, e.rev, e.known = nil, rev, false
}

// Lose records a race lost on the key and returns the pause to take before
// the next attempt: the window before it widened. The window starts at
// floor, doubles with every race lost on the key and halves with every
// commit (down to zero below floor), within ceiling, and is forgotten once
// the key has been quiet for windowMemory windows. All of this
// coordinator's operations on the key share it, and on a contended key
// operations pace their first attempt by it (see pace): so writers settle
// near an even chance per attempt, instead of early losers backing off ever
// further while fresh writers keep winning, and writers woken together
// spread out.
func (e *keyEntry) Lose(floor, ceiling time.Duration, now time.Time) time.Duration {
	e.mu.Lock()
	defer e.mu.Unlock()
	window := max(e.window, floor)
	e.window = min(2*window, ceiling)
	e.lostAt = now
	return window
}

// PaceWindow returns the window to pace a first attempt by, 0 on a key that
// is not contended (and then forgets a window that has gone quiet).
func (e *keyEntry) PaceWindow(now time.Time) time.Duration {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.window > 0 && now.Sub(e.lostAt) < windowMemory*e.window {
		return e.window
	}
	e.window = 0
	return 0
}

// SleepJitter sleeps for a uniformly random duration in (0, window].
func SleepJitter(ctx context.Context, window time.Duration) error {
	t := time.NewTimer(time.Duration(mrand.Int64N(int64(window))) + 1)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

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
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.trusted() && !(cached && e.known) {
		return Acquisition{}, 0
	}
	e.materialize()
	st := e.state
	if st == nil || !e.known {
		return Acquisition{}, 0
	}
	out, _, behind := queuedBehindIn(st, key, jobID, limit, now)
	if !behind {
		return Acquisition{}, 0
	}
	return out, e.rev
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

// Learned returns the revision of the state e knows (0 when it knows
// none), when it Learned it and, for a state this coordinator's own read
// or write returned, when that request was sent (zero otherwise; see
// sentAt).
func (e *keyEntry) Learned() (rev uint64, seenAt, sentAt time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.known {
		return 0, time.Time{}, time.Time{}
	}
	return e.rev, e.seenAt, e.sentAt
}

// queuedIndex returns the place of job jobID in the queue of the state e
// knows, -1 when it knows none or the job is not queued there.
func (e *keyEntry) queuedIndex(jobID string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.materialize()
	if !e.known || e.state == nil {
		return -1
	}
	return indexQueued(e.state.Queued, jobID)
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

// holdWake holds h, the wake-up of a write of the key just committed,
// for wakeHold, dropping any held wake-up of an older revision (the
// write supersedes it; see wakeHold); it sends h then unless a write that
// began meanwhile is still under way.
//
// A key on which no write followed the last wakeHoldMisses held wake-ups
// (its workers admit their next jobs ahead, or none) has only one in
// wakeHoldProbe held, to learn when that changes; it reports whether it
// held h (false: the caller sends it now).
func (e *keyEntry) holdWake(h *heldWake) bool {
	e.wakeMu.Lock()
	e.dropHeldLocked(h.rev)
	if e.holdMisses >= wakeHoldMisses {
		if e.holdSkips++; e.holdSkips%wakeHoldProbe != 0 {
			e.wakeMu.Unlock()
			return false
		}
	}
	e.held, h.e = h, e
	h.c.heldMu.Lock()
	if h.c.held == nil {
		h.c.held = make(map[*heldWake]struct{})
	}
	h.c.held[h] = struct{}{}
	h.c.heldMu.Unlock()
	e.wakeMu.Unlock()
	time.AfterFunc(h.c.wakeHold, func() {
		e.wakeMu.Lock()
		send := !h.done && h.holders == 0
		h.expired = true
		if send {
			e.endHeldLocked(h)
			e.holdMisses++
		}
		e.wakeMu.Unlock()
		if send {
			h.send()
		}
	})
	return true
}

// dropHeldWake drops the held wake-up of a revision older than rev: a
// write of the key at rev was committed (see wakeHold).
func (e *keyEntry) dropHeldWake(rev uint64) {
	e.wakeMu.Lock()
	e.dropHeldLocked(rev)
	e.wakeMu.Unlock()
}

func (e *keyEntry) dropHeldLocked(rev uint64) {
	if h := e.held; h != nil && h.rev < rev {
		e.endHeldLocked(h)
		e.holdMisses, e.holdSkips = 0, 0 // a write followed it
	}
}

// endHeldLocked ends h, a wake-up e holds or held: it is sent by the
// caller, or dropped. Called with e.wakeMu held.
func (e *keyEntry) endHeldLocked(h *heldWake) {
	if h.done {
		return
	}
	h.done = true
	if e.held == h {
		e.held = nil
	}
	h.c.heldMu.Lock()
	delete(h.c.held, h)
	h.c.heldMu.Unlock()
}

// holdWakeFor keeps the held wake-up, if any, held while a write of the
// key that begins now is under way; the returned function ends that
// (call it once the write committed or failed): the wake-up is sent then
// if wakeHold has passed and the write did not supersede it.
func (e *keyEntry) holdWakeFor() func() {
	e.wakeMu.Lock()
	h := e.held
	if h == nil || h.done {
		e.wakeMu.Unlock()
		return nil
	}
	h.holders++
	e.wakeMu.Unlock()
	return func() {
		e.wakeMu.Lock()
		h.holders--
		send := !h.done && h.holders == 0 && h.expired
		if send {
			e.endHeldLocked(h)
			e.holdMisses++ // the write superseded nothing
		}
		e.wakeMu.Unlock()
		if send {
			h.send()
		}
	}
}
