package keycache

import (
	"context"
	"time"
)

// Retries answered by the watch. On a key a watch feeds to the entry
// (Fed), a create that fails on the key's absence the feed delivered (its
// delete) lost to another process's create, which the feed delivers next:
// the operation starts its next attempt from that delivery rather than a
// read. This file holds what an operation needs of the entry for that.

// FeedView is what an attempt knew of its key's watch feed when it began
// (View).
type FeedView struct {
	// Delivered is the latest revision the feed had delivered.
	Delivered uint64
	// Absent says the fed entry held the key as absent (the feed delivered
	// its delete, and nothing stored since): an admission creates it, and
	// a create that fails lost to another process's create.
	Absent bool
}

// View returns what e's watch feed has delivered, for an attempt about to
// begin.
func (e *Entry[T]) View() FeedView {
	e.mu.Lock()
	defer e.mu.Unlock()
	return FeedView{Delivered: e.watchRev, Absent: e.watching > 0 && e.fresh && !e.known}
}

// Present reports whether e holds the key's state (not its absence).
func (e *Entry[T]) Present() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.known
}

// AwaitCreated waits, for at most bound, until e's watch feed delivers a
// revision after base and e holds the key's state: the create that won
// over one of this coordinator's, made after the feed had delivered base.
// A delete delivered meanwhile (this coordinator's own, say, whose
// revision it does not know) is not that create. It reports whether the
// create came (false also when ctx ends).
func (e *Entry[T]) AwaitCreated(ctx context.Context, base uint64, bound time.Duration) bool {
	end := time.Now().Add(bound)
	for {
		if !e.AwaitChange(ctx, base, time.Until(end)) {
			return false
		}
		if e.Present() {
			return true
		}
		base = e.View().Delivered
	}
}
