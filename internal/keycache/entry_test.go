package keycache

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// state is the tests' state: the entry never looks inside it.
type state struct{ n int }

// decodeState decodes a value "n" of key "k" of service "svc"; anything
// else is not that key's state.
func decodeState(calls *int) func(value []byte, service, kvKey string) *state {
	return func(value []byte, service, kvKey string) *state {
		*calls++
		n, err := strconv.Atoi(string(value))
		if err != nil || service != "svc" || kvKey != "k" {
			return nil
		}
		return &state{n: n}
	}
}

// After a write on revision 9 lost its race, the key is known to be past
// 9; a lagging watch feed that then delivers revision 7 must not make that
// older state the trusted, verified start of a waiting acquisition.
func TestConflictIgnoresOlderWatchedRevisions(t *testing.T) {
	t.Parallel()
	var e Entry[state]
	e.Attach()
	defer e.Detach()

	st := &state{n: 1}
	e.Watched(st, 5, true) // the feed is at revision 5
	// A read finds revision 9; the write on it loses a race.
	s, ok := e.Begin(&Read[state]{State: st, Rev: 9, Mark: e.Mark()}, true, false, true)
	require.True(t, ok)
	require.Equal(t, uint64(9), s.Rev)
	e.ConflictAt(9)

	e.Watched(st, 7, true) // the lagging feed delivers revision 7
	s, ok = e.Begin(nil, true, false, true)
	if ok {
		assert.False(t, s.Verified && s.Rev < 9, "start at revision %d verified although a write on revision 9 lost a race before it", s.Rev)
		assert.False(t, s.Watched && s.Rev < 9, "start at revision %d watched although the key is past revision 9", s.Rev)
	}

	e.Watched(st, 10, true) // the write that won
	s, ok = e.Begin(nil, true, false, true)
	require.True(t, ok)
	assert.Equal(t, uint64(10), s.Rev)
	assert.True(t, s.Verified, "the feed's latest state is trusted")
}

// A read that began before the entry's watch feed started may have missed
// a change made between the read and the feed's start (which the feed
// never delivers): finishing after the attach, it must not make the entry
// trusted.
func TestReadBeforeAttachNotTrusted(t *testing.T) {
	t.Parallel()
	var e Entry[state]
	st := &state{n: 1}

	mark, feed := e.Mark(), e.FeedMark() // a read begins, and finds revision 5
	// Revision 6 is written by another process; then the feed starts.
	e.Attach()
	defer e.Detach()
	s, ok := e.Begin(&Read[state]{State: st, Rev: 5, Mark: mark, Feed: feed}, true, false, true)
	require.True(t, ok)
	require.Equal(t, uint64(5), s.Rev)

	s, ok = e.Begin(nil, true, false, true)
	require.True(t, ok)
	assert.False(t, s.Verified, "a state read before the feed started is trusted as the latest")

	// A read begun within the feed is.
	s, ok = e.Begin(&Read[state]{State: st, Rev: 6, Mark: e.Mark(), Feed: e.FeedMark()}, true, false, true)
	require.True(t, ok)
	require.Equal(t, uint64(6), s.Rev)
	s, ok = e.Begin(nil, true, false, true)
	require.True(t, ok)
	assert.True(t, s.Verified, "a state read within the feed, with nothing delivered since")
}

// A guess (the remembered state, no read) is never verified without a
// feed that vouches for it; a read, or a write committed during the read,
// is.
func TestBeginGuessAndRead(t *testing.T) {
	t.Parallel()
	var e Entry[state]
	_, ok := e.Begin(nil, true, false, false)
	assert.False(t, ok, "nothing remembered and no absent assumption: read first")
	s, ok := e.Begin(nil, true, true, false)
	require.True(t, ok)
	assert.Nil(t, s.State, "assumed absent")

	mine := &state{n: 1}
	e.Commit(mine, 3, time.Millisecond)
	s, ok = e.Begin(nil, true, false, true)
	require.True(t, ok)
	assert.Same(t, mine, s.State)
	assert.Equal(t, Start[state]{State: mine, Rev: 3, Cached: true}, s, "a guess, not verified, not watched")
	_, ok = e.Begin(nil, false, false, false)
	assert.False(t, ok, "without the cache: read first")

	// A read that began before this coordinator's commit of revision 4
	// and found revision 3: the commit is the newer, verified.
	mark := e.Mark()
	newer := &state{n: 2}
	e.Commit(newer, 4, time.Millisecond)
	s, ok = e.Begin(&Read[state]{State: mine, Rev: 3, Mark: mark}, true, false, false)
	require.True(t, ok)
	assert.Equal(t, Start[state]{State: newer, Rev: 4, Verified: true}, s)

	// An absent read during which this coordinator wrote: its write.
	mark = e.Mark()
	e.Commit(mine, 5, time.Millisecond)
	s, ok = e.Begin(&Read[state]{Mark: mark}, true, false, false)
	require.True(t, ok)
	assert.Equal(t, Start[state]{State: mine, Rev: 5, Verified: true}, s)

	// An absent read with no write of this coordinator during it: the
	// key is absent, verified, whatever the entry remembered.
	s, ok = e.Begin(&Read[state]{Mark: e.Mark()}, true, false, false)
	require.True(t, ok)
	assert.Equal(t, Start[state]{Verified: true}, s)
	_, _, ok = e.Known()
	assert.False(t, ok, "the absence is remembered")
	e.Commit(mine, 5, time.Millisecond)

	// A read that found the key present while this coordinator deleted
	// it: which came last cannot be told.
	mark = e.Mark()
	e.Commit(nil, 6, time.Millisecond)
	_, ok = e.Begin(&Read[state]{State: mine, Rev: 5, Mark: mark}, true, false, false)
	assert.False(t, ok, "a present read racing this coordinator's delete")
}

// The backoff window doubles per lost race up to the ceiling, halves per
// successful write down to zero below the floor, and is forgotten on a key
// quiet for WindowMemory windows.
func TestBackoffWindow(t *testing.T) {
	t.Parallel()
	const us = time.Microsecond
	var e Entry[state]
	now := time.Now()
	var paused, grown []time.Duration
	for range 5 {
		paused = append(paused, e.Lose(us, 8*us, now))
		grown = append(grown, e.Marks().Window)
	}
	var settled []time.Duration
	for range 4 {
		e.Commit(nil, 0, us)
		settled = append(settled, e.Marks().Window)
	}
	assert.Equal(t, []time.Duration{us, 2 * us, 4 * us, 8 * us, 8 * us}, paused, "pause after each lost race: the window before it widened")
	assert.Equal(t, []time.Duration{2 * us, 4 * us, 8 * us, 8 * us, 8 * us}, grown, "window after lost races")
	assert.Equal(t, []time.Duration{4 * us, 2 * us, 1 * us, 0}, settled, "window after successful writes")
	assert.True(t, e.Idle(), "no state, no window")

	lostAt := time.Now()
	e.Lose(time.Hour, time.Hour, lostAt)
	assert.False(t, e.Idle(), "an open window is remembered")
	assert.Equal(t, time.Hour, e.PaceWindow(lostAt.Add(time.Minute)), "a contended key paces first attempts")
	assert.Equal(t, time.Duration(0), e.PaceWindow(lostAt.Add(WindowMemory*time.Hour)), "a key quiet for WindowMemory windows")
	assert.Equal(t, time.Duration(0), e.Marks().Window, "and forgotten")
	assert.True(t, e.Idle())

	require.NoError(t, SleepJitter(context.Background(), us))
	require.NoError(t, SleepJitter(context.Background(), 0), "no window, no pause")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	assert.ErrorIs(t, SleepJitter(ctx, time.Hour), context.Canceled)
}

// A value the feed delivers undecoded is decoded once, when an operation
// uses it; a value that is not the key's state leaves the entry knowing
// nothing, so the next operation reads.
func TestWatchedValueDecodedWhenUsed(t *testing.T) {
	t.Parallel()
	calls := 0
	e := Entry[state]{Decode: decodeState(&calls)}
	e.Attach()
	defer e.Detach()
	e.WatchedValue("svc", "k", []byte("42"), 3)
	assert.Zero(t, calls, "not decoded on delivery")
	assert.Equal(t, Marks{Rev: 3, Known: true, Trusted: true, Watching: 1, Fresh: true, WatchRev: 3}, e.Marks())
	s, ok := e.Begin(nil, true, false, true)
	require.True(t, ok)
	assert.Equal(t, Start[state]{State: &state{n: 42}, Rev: 3, Verified: true, Watched: true, Cached: true}, s)
	st, rev, ok := e.Trusted()
	require.True(t, ok)
	assert.Equal(t, uint64(3), rev)
	assert.Same(t, s.State, st, "the decoded state is kept")
	assert.Equal(t, 1, calls, "decoded once")

	e.WatchedValue("svc", "other", []byte("7"), 4) // not this key's state
	_, _, ok = e.Known()
	assert.False(t, ok, "a value of another key is no state")
	_, ok = e.Begin(nil, true, false, true)
	assert.False(t, ok, "the next operation reads")
	assert.Equal(t, 2, calls)

	e.WatchedValue("svc", "k", []byte("9"), 4)
	assert.Equal(t, uint64(4), e.Marks().WatchRev, "an older or repeated revision changes nothing")
	_, _, ok = e.Known()
	assert.False(t, ok)

	var plain Entry[state] // no Decode: the value is never used
	plain.WatchedValue("svc", "k", []byte("1"), 1)
	_, _, ok = plain.Known()
	assert.False(t, ok)
}

// Trusted counts only a state the feed vouches for; Known any known state.
func TestKnownAndTrusted(t *testing.T) {
	t.Parallel()
	var e Entry[state]
	st := &state{n: 1}
	e.Observe(st, 2, e.FeedMark())
	got, rev, ok := e.Known()
	require.True(t, ok)
	assert.Same(t, st, got)
	assert.Equal(t, uint64(2), rev)
	_, _, ok = e.Trusted()
	assert.False(t, ok, "not fed")

	e.Attach()
	defer e.Detach()
	_, _, ok = e.Trusted()
	assert.False(t, ok, "fed, but not refreshed since the feed began")
	e.Watched(st, 3, true)
	_, rev, ok = e.Trusted()
	require.True(t, ok)
	assert.Equal(t, uint64(3), rev)
	e.Unwatched()
	_, _, ok = e.Trusted()
	assert.False(t, ok, "the feed may have missed a change")
	e.Watched(nil, 4, true)
	_, _, ok = e.Known()
	assert.False(t, ok, "deleted")
	assert.Equal(t, FeedView{Delivered: 4, Absent: true}, e.View())

	// A read begun within the feed that finishes after the delete, with
	// an older revision: known, but older than what the feed delivered.
	e.Observe(st, 3, e.FeedMark())
	_, rev, ok = e.Known()
	require.True(t, ok)
	assert.Equal(t, uint64(3), rev)
	_, _, ok = e.Trusted()
	assert.False(t, ok, "revision 3 is older than the feed's 4")
}

// A wake-up's revision is a hint: the next attempt reads instead of
// starting from what the entry holds, until a read settles it. A hint of
// a revision the entry holds changes nothing.
func TestHintMakesTheNextAttemptRead(t *testing.T) {
	t.Parallel()
	var e Entry[state]
	st := &state{n: 1}
	e.Commit(st, 5, 0)
	e.Hinted(5)
	_, ok := e.Begin(nil, true, false, false)
	assert.True(t, ok, "a hint of the revision held")

	e.Hinted(7)
	assert.Equal(t, uint64(7), e.Marks().Hint)
	_, ok = e.Begin(nil, true, false, false)
	assert.False(t, ok, "a hint of a later revision: read first")

	mark := e.HintMark()
	e.Hinted(8) // another hint while the read runs
	e.SettleHint(6, mark)
	_, ok = e.Begin(nil, true, false, false)
	assert.False(t, ok, "a read older than a hint that came during it settles nothing")
	e.SettleHint(6, e.HintMark())
	assert.Zero(t, e.Marks().Hint, "a read with no hint since: the hint named a revision the key had not reached")
	_, ok = e.Begin(nil, true, false, false)
	assert.True(t, ok)
}

// While fed, the entry recognises its own recent writes and the write
// under way (by its bytes) when the watch delivers them.
func TestHeldRecognisesOwnWrites(t *testing.T) {
	t.Parallel()
	var e Entry[state]
	e.Attach()
	defer e.Detach()
	written := make([]*state, recentStates+1)
	for i := range written {
		written[i] = &state{n: i}
		e.Commit(written[i], uint64(i+1), 0)
	}
	assert.Same(t, written[len(written)-1], e.Held(uint64(len(written)), nil), "the state held")
	assert.Same(t, written[1], e.Held(2, nil), "a recent write")
	assert.Nil(t, e.Held(1, nil), "older than the last recentStates writes")

	inflight := &state{n: 99}
	e.Writing([]byte("99"), inflight)
	assert.Same(t, inflight, e.Held(100, []byte("99")), "the write under way, by its bytes")
	assert.Nil(t, e.Held(100, []byte("98")))
	e.Written()
	assert.Nil(t, e.Held(100, []byte("99")), "ended")
}

// AwaitChange returns once the feed delivers a later revision, or the
// entry holds one; it gives up when its context ends or its bound passes.
func TestAwaitChange(t *testing.T) {
	t.Parallel()
	var e Entry[state]
	e.Attach()
	defer e.Detach()
	ctx := context.Background()
	done := make(chan bool, 1)
	go func() { done <- e.AwaitChange(ctx, 1, time.Minute) }()
	e.Watched(&state{n: 1}, 2, true)
	assert.True(t, <-done, "the change came")
	assert.True(t, e.AwaitChange(ctx, 1, time.Minute), "a change after revision 1 came already")
	e.Commit(&state{n: 2}, 3, 0)
	assert.True(t, e.AwaitChange(ctx, 2, time.Minute), "the entry holds a later state (its own write)")

	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	assert.False(t, e.AwaitChange(cancelled, 3, time.Minute), "no change, context ended")
	assert.False(t, e.AwaitChange(ctx, 3, time.Nanosecond), "no change within the bound")
}
