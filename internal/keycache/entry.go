package keycache

import (
	"bytes"
	"context"
	"sync"
	"time"
)

// Entry is what a coordinator knows of one key's stored state: the last
// state (a *T, nil when the key is absent) and revision it saw stored, the
// key's backoff window, its watch feed's marks, the hint of a wake-up and
// the last states the coordinator wrote. It never looks inside a state
// (see the package doc); T is the state's type.
//
// An operation uses it in this order: pace (PaceWindow, before its first
// attempt, when the key is contended); then per attempt, holding the key's
// lane, Begin (the state to start from) and, after the write, Commit or
// ConflictAt. Reads run without the lane: Mark and FeedMark before, Observe
// or Begin with the Read after.
//
// The zero Entry knows nothing and is ready for use; set Decode before the
// entry is shared if a watch feed will give it undecoded values
// (WatchedValue). An Entry must not be copied after first use. Its methods
// are safe for concurrent use.
type Entry[T any] struct {
	// Decode decodes a value WatchedValue kept, of the key kvKey of
	// service: nil when the value is not that key's state (the entry then
	// knows nothing, and the next operation reads the key and reports
	// why). Without Decode such a value is never used. Set before first
	// use, never changed.
	Decode func(value []byte, service, kvKey string) *T

	mu      sync.Mutex
	state   *T // last state read or written; immutable once stored
	rev     uint64
	known   bool          // state and rev are what this coordinator last saw stored
	commits uint64        // successful writes (and deletes) through this entry
	window  time.Duration // backoff window; 0 while the key is not contended
	lostAt  time.Time     // when an operation last lost a race on the key

	// The watch feed (see Watched): watching counts the waiter
	// subscriptions that feed the key's changes to this entry; watchRev
	// is the latest revision they delivered; fresh says the remembered
	// state (or its absence) has been set since the feed started and no
	// change since may have been missed; changed is closed (and replaced)
	// when a change arrives, for operations waiting for one.
	watching int
	watchRev uint64
	fresh    bool
	next     uint8 // where recent's next state goes (beside fresh: no padding of its own)
	changed  chan struct{}
	// feedGen counts the feeds started (and ended by Unwatched): a read or
	// write begun in an earlier one may predate a change the current feed
	// never delivers, so it does not make the entry fresh. writeGen is
	// feedGen when the write under way began (Writing).
	feedGen  uint64
	writeGen uint64
	// recent holds the last states this coordinator wrote, by revision,
	// so that the watch, which delivers them a little later, need not
	// decode them again (see Held).
	recent [recentStates]revState[T]
	// inflight is the value of the write under way (while fed), and
	// inflightState its state: the watch may deliver the write before
	// its reply arrives.
	inflight      []byte
	inflightState *T
	// value is the undecoded state at rev that the watch feed delivered
	// (WatchedValue), while state is nil and known; materialize decodes
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
	// is when the write under way (Writing) was sent, for Commit.
	seenAt    time.Time
	sentAt    time.Time
	writeSent time.Time
	// hint is the latest revision a wake-up from another process named
	// (Hinted) above the revision e holds, 0 once a read or a later state
	// settled it; hints counts the hints recorded. A wake-up is a hint:
	// nothing vouches for its revision or its state (anyone allowed to
	// publish on its subject can send one), so neither is ever a state
	// to write on. While a hint stands, an operation reads before it
	// writes instead of starting from what e holds (see Begin).
	hint  uint64
	hints uint64
}

// recentStates is how many of its own writes per key a coordinator keeps
// for the watch to recognise.
const recentStates = 4

type revState[T any] struct {
	rev   uint64
	state *T
}

// WindowMemory is how many backoff windows after its last lost race a key
// counts as contended: a key that has been quiet that long is cold again
// (see Entry.PaceWindow).
const WindowMemory = 16

// Idle reports whether e remembers nothing worth keeping: no state and no
// open backoff window. An idle entry no operation uses may be dropped.
func (e *Entry[T]) Idle() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return !e.known && e.window == 0
}

// Attach starts a watch feed of e: what e remembers is not trusted until
// the feed (or a read or write) refreshes it. Feeds nest: each Attach is
// ended by a Detach.
func (e *Entry[T]) Attach() {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.watching == 0 {
		e.fresh = false
		e.feedGen++
	}
	e.watching++
}

// Detach ends a feed started by Attach.
func (e *Entry[T]) Detach() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.watching--
}

// Unwatched says e's feed may have missed changes (its watch ended): what
// e remembers is no longer trusted.
func (e *Entry[T]) Unwatched() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.fresh, e.feedGen = false, e.feedGen+1
}

// Watched records a change of the key delivered by its watch feed: its
// state at rev (nil when deleted), or, when not ok, a value that is not the
// key's state (the next operation reads it and reports why). Changes
// arrive in revision order; one older than what e holds changes nothing.
// st must not be modified afterwards.
func (e *Entry[T]) Watched(st *T, rev uint64, ok bool) {
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
	e.signal()
}

// WatchedValue is Watched for a change delivered with its value not
// decoded (the state at rev of the key kvKey of service): e keeps the
// value and decodes it (Decode) only when an operation uses it. value
// must not be modified afterwards.
func (e *Entry[T]) WatchedValue(service, kvKey string, value []byte, rev uint64) {
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
		e.value, e.valueService, e.valueKey = value, service, kvKey
	} else {
		e.fresh = true // the entry holds a later state than the watch delivered
	}
	e.signal()
}

// signal wakes the operations waiting for a change (AwaitChange). Called
// with e.mu held.
func (e *Entry[T]) signal() {
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
func (e *Entry[T]) keepSentOver() {
	if !e.known {
		e.sentAt = time.Time{}
	}
}

// materialize decodes the value WatchedValue left for e's state, if it is
// still the state e holds; a value that is not the key's state leaves e
// knowing nothing (the next operation reads it and reports why). Called
// with e.mu held.
func (e *Entry[T]) materialize() {
	if e.value == nil {
		return
	}
	value := e.value
	e.value = nil
	if !e.known || e.state != nil {
		return // set since, by a read, a write or a decoded change
	}
	var st *T
	if e.Decode != nil {
		st = e.Decode(value, e.valueService, e.valueKey)
	}
	if st == nil {
		e.state, e.rev, e.known, e.fresh = nil, 0, false, false
		return
	}
	e.state = st
}

// Known returns the state e knows and its revision, ok false when it
// knows none (the key's absence included). The state must not be
// modified.
func (e *Entry[T]) Known() (st *T, rev uint64, ok bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.knownLocked()
}

// Trusted is Known for a state its watch feed vouches for only: the latest
// the feed knows of, with no change since that it may have missed (see
// Start.Watched).
func (e *Entry[T]) Trusted() (st *T, rev uint64, ok bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.trusted() {
		return nil, 0, false
	}
	return e.knownLocked()
}

// knownLocked is Known, called with e.mu held.
func (e *Entry[T]) knownLocked() (*T, uint64, bool) {
	if !e.known {
		return nil, 0, false
	}
	e.materialize()
	if !e.known || e.state == nil {
		return nil, 0, false
	}
	return e.state, e.rev, true
}

// Hinted records that a wake-up from another process named revision rev
// of e's key: until a read settles it (SettleHint) or e holds a state of
// rev or later, the next operation on the key reads before it writes. A
// hint of a revision e holds, or older, changes nothing. So a forged
// wake-up costs at most one read per message, and never a write on a
// state its sender chose.
func (e *Entry[T]) Hinted(rev uint64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if rev <= e.rev && e.known || rev <= e.hint {
		return
	}
	e.hint = rev
	e.hints++
}

// HintMark returns the count of hints, to be passed to SettleHint after a
// read.
func (e *Entry[T]) HintMark() uint64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.hints
}

// SettleHint drops the standing hint after a read that returned revision
// rev (0: absent) and whose request was sent after HintMark returned
// mark: the read saw the hint's revision, or, when it returned an older
// one though no hint came since mark, the hint named a revision the key
// had not reached when the read was served (a legitimate wake-up's
// revision was committed before it was sent): a forgery, or a revision
// the next wake-up will name again.
func (e *Entry[T]) SettleHint(rev, mark uint64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.hint != 0 && (rev >= e.hint || e.hints == mark) {
		e.hint = 0
	}
}

// Held returns the state e holds at rev, or of its write under way when
// that wrote value, or nil. The state must not be modified.
func (e *Entry[T]) Held(rev uint64, value []byte) *T {
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
// holding the lane, until Written. Neither may be modified until then.
func (e *Entry[T]) Writing(value []byte, st *T) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.writeGen = e.feedGen
	e.writeSent = time.Now() // the write's request goes out after this
	if e.watching > 0 {
		e.inflight, e.inflightState = value, st
	}
}

// Written ends Writing: the value's buffer may be reused.
func (e *Entry[T]) Written() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.inflight, e.inflightState = nil, nil
}

// trusted reports whether e's state is the latest its watch feed knows of,
// with no change since that it may have missed. Called with e.mu held.
func (e *Entry[T]) trusted() bool {
	return e.watching > 0 && e.fresh && e.known && e.rev >= e.watchRev
}

// refreshed marks a state just read or written as fresh when the entry is
// fed and the read or write began in feed generation gen (see feedGen).
// Called with e.mu held.
func (e *Entry[T]) refreshed(gen uint64) {
	if e.watching > 0 && gen == e.feedGen {
		e.fresh = true
	}
}

// FeedMark returns the feed generation, to be passed in a Read to Begin.
func (e *Entry[T]) FeedMark() uint64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.feedGen
}

// Fed reports whether a watch feeds e, with no change since its state was
// set that it may have missed.
func (e *Entry[T]) Fed() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.watching > 0 && e.fresh
}

// AwaitChange waits until e's watch feed delivers a revision after rev or
// e holds a later state, for at most bound; it reports whether one came
// (false also when ctx ends).
func (e *Entry[T]) AwaitChange(ctx context.Context, rev uint64, bound time.Duration) bool {
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

// Marks is what an entry knows and its watch feed's marks, read at once
// (Entry.Marks): for diagnostics and tests, which check the engine's
// rules through it.
type Marks struct {
	// Rev is the revision of the state held, or, when not Known, 0 or a
	// revision the key is past.
	Rev uint64
	// Known says the entry holds what the coordinator last saw stored of
	// the key (its state, not its absence).
	Known bool
	// Trusted says the state is the latest the watch feed knows of, with
	// no change since that it may have missed.
	Trusted bool
	// Watching counts the feeds attached; Fresh says no change since the
	// state was set may have been missed; WatchRev is the latest revision
	// the feeds delivered.
	Watching int
	Fresh    bool
	WatchRev uint64
	// Hint is the standing hint's revision (0: none).
	Hint uint64
	// Window is the backoff window (0: the key is not contended).
	Window time.Duration
}

// Marks returns what e knows and its feed's marks.
func (e *Entry[T]) Marks() Marks {
	e.mu.Lock()
	defer e.mu.Unlock()
	return Marks{Rev: e.rev, Known: e.known, Trusted: e.trusted(), Watching: e.watching, Fresh: e.fresh,
		WatchRev: e.watchRev, Hint: e.hint, Window: e.window}
}
