package keycache

import "time"

// Start is the state an attempt starts from (Begin).
type Start[T any] struct {
	State *T // nil: the key is absent
	Rev   uint64
	// Verified says the state was stored at some instant during the
	// operation (read by it, or written by this coordinator meanwhile), so
	// an outcome that writes nothing may rest on it. Otherwise it is a
	// guess that only a successful compare-and-swap confirms.
	Verified bool
	// Watched says the state is the latest the key's watch feed knows of
	// (trusted): a failed write on it lost a race, and the next change the
	// watch delivers answers it.
	Watched bool
	// Cached says the state is the one this coordinator last saw stored,
	// from before the operation: a woken waiter over targeted wake-ups may
	// find the key busy on it.
	Cached bool
}

// Read is the result of a read made without the lane, given to Begin.
type Read[T any] struct {
	State *T
	Sent  time.Time // when the read's request was sent
	Rev   uint64    // 0 when the key is absent
	Mark  uint64    // Entry.Mark when the read began
	Feed  uint64    // Entry.FeedMark when the read began
}

// Mark returns the count of commits, to be passed in a Read to Begin.
func (e *Entry[T]) Mark() uint64 {
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
func (e *Entry[T]) Begin(r *Read[T], useCache, assumeAbsent, trustWatch bool) (s Start[T], ok bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.materialize()
	if r == nil {
		if e.hint > e.rev || e.hint != 0 && !e.known {
			// A wake-up named a later revision than e holds: read it
			// (see Hinted).
			return Start[T]{}, false
		}
		switch {
		case useCache && e.known:
			w := e.trusted()
			return Start[T]{State: e.state, Rev: e.rev, Verified: trustWatch && w, Watched: w, Cached: true}, true
		case assumeAbsent:
			return Start[T]{}, true
		}
		return Start[T]{}, false
	}
	own := e.commits != r.Mark // this coordinator wrote the key during the read
	switch {
	case r.Rev != 0 && e.known && e.rev > r.Rev:
		// Stored after the read's snapshot (revisions only grow), so at
		// an instant during this operation.
		return Start[T]{State: e.state, Rev: e.rev, Verified: true}, true
	case r.Rev != 0 && own && !e.known:
		// This coordinator deleted the key, perhaps after the read.
		return Start[T]{}, false
	case r.Rev == 0 && own && e.known:
		// An absent read has no revision to order it by: the write
		// committed during it is the later confirmed state either way.
		return Start[T]{State: e.state, Rev: e.rev, Verified: true}, true
	}
	e.state, e.rev, e.known = r.State, r.Rev, r.State != nil
	e.seenAt, e.sentAt = time.Now(), r.Sent
	e.refreshed(r.Feed)
	return Start[T]{State: r.State, Rev: r.Rev, Verified: true}, true
}

// Observe records a read's result that no write followed, without the
// lane, when it is newer than what e knows, so that the next write starts
// from it. An absent read is not recorded: it has no revision to order
// it by. feed is FeedMark when the read began.
func (e *Entry[T]) Observe(state *T, rev, feed uint64) {
	e.ObserveSent(state, rev, feed, time.Time{})
}

// ObserveSent is Observe for a state this coordinator's own read returned,
// whose request was sent at sent (see Learned); zero: not known.
func (e *Entry[T]) ObserveSent(state *T, rev, feed uint64, sent time.Time) {
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
// of revision rev, which e keeps, not known, so that a lagging watch
// feed's changes from before the delete are not taken for its state) and
// halves the backoff window, down to zero below floor. The caller holds
// the lane; state must not be modified afterwards.
func (e *Entry[T]) Commit(state *T, rev uint64, floor time.Duration) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if state != nil && e.watching > 0 {
		e.recent[e.next] = revState[T]{rev: rev, state: state}
		e.next = (e.next + 1) % recentStates
	}
	// The watch feed may have delivered this write and later ones already.
	if state == nil || !e.known || rev >= e.rev {
		e.state, e.rev, e.known = state, rev, state != nil
		// A write not made through Writing (an operator's) has no send
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
func (e *Entry[T]) Conflict() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.state, e.rev, e.known = nil, 0, false
}

// ConflictAt records a failed write on revision rev (0: a create): what e
// remembered is no longer stored, unless e learned of a later state
// meanwhile (from its watch feed or a read). The key is past rev: e keeps
// it (not known) so that a lagging watch feed's older changes are not
// taken for its state.
func (e *Entry[T]) ConflictAt(rev uint64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.known && e.rev > rev {
		return
	}
	e.state, e.rev, e.known = nil, rev, false
}

// Learned returns the revision of the state e knows (0 when it knows
// none), when it learned it and, for a state this coordinator's own read
// or write returned, when that request was sent (zero otherwise): every
// write of the key after that state was committed after sentAt.
func (e *Entry[T]) Learned() (rev uint64, seenAt, sentAt time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.known {
		return 0, time.Time{}, time.Time{}
	}
	return e.rev, e.seenAt, e.sentAt
}
