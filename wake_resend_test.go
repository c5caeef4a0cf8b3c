package jobkeys

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestWakeUpsAgainKeepsRetry: a wake-up of a revision sent again (a Run
// blocked in turn, see KeyCoordinator.wakeAhead) while the one before it
// of that revision waits for its retry, having found no waiter, does not
// cancel that retry and hand the slot to the job behind: the job ahead,
// whose waiter subscribes meanwhile (its subscription was on its way to
// the server), gets the wake-up, and the job behind does not.
func TestWakeUpsAgainKeepsRetry(t *testing.T) {
	t.Parallel()
	f := newNATSWakeFixture(t)
	a, ncA := f.store(t)
	a.wake.retry = 2 * time.Second // long enough for the waiters to subscribe first on a loaded machine
	b, ncB := f.store(t)

	// The write's wake-up: neither job has a waiter yet; its retry waits.
	a.publishWakes(f.service, f.kvKey, []byte("s"), 1, []string{"j1", "j2"}, 1)
	require.Eventually(t, func() bool { return a.wakeCounters().NoResponders == 2 }, rtWait, time.Millisecond)
	// j2's Run subscribes (in this store) and, blocked in turn behind j1,
	// sends the state's wake-up again, itself last.
	ll, _ := f.wait(t, a, ncA, "j2")
	a.publishWakesAgain(f.service, f.kvKey, []byte("s"), 1, []string{"j1", "j2"}, 1)
	// j1's waiter, in another process, is subscribed before the retry.
	l, _ := f.wait(t, b, ncB, "j1")
	got := l.next(t, "j1's wake-up (the retry)")
	assert.Equal(t, uint64(1), got.rev)
	assert.Zero(t, a.wakeCounters().Local, "the wake-up was handed to j2, behind j1")
	assert.False(t, pending(ll.ch), "j2 was woken")
}

// TestWakeUpsAgainNoSecondCopy: a wake-up of a revision sent again (a Run
// blocked in turn, see KeyCoordinator.wakeAhead) while this store's
// wake-up of that revision is still out to the job ahead, which has a
// waiter, does not wake that job a second time for the same state (the
// releasing worker's next Run sent it again to the head the release or
// admission had just woken); nor the job behind.
func TestWakeUpsAgainNoSecondCopy(t *testing.T) {
	t.Parallel()
	f := newNATSWakeFixture(t)
	a, ncA := f.store(t)
	b, ncB := f.store(t)
	l, _ := f.wait(t, b, ncB, "j1")
	ll, _ := f.wait(t, a, ncA, "j2")
	a.publishWakes(f.service, f.kvKey, []byte("s"), 1, []string{"j1"}, 1)
	got := l.next(t, "j1's wake-up")
	assert.Equal(t, uint64(1), got.rev)
	a.publishWakesAgain(f.service, f.kvKey, []byte("s"), 1, []string{"j1", "j2"}, 1)
	// A marker of a later revision: once j1 has it, a second copy of
	// revision 1 sent before it would have come first.
	a.publishWakes(f.service, f.kvKey, []byte("m"), 2, []string{"j1"}, 1)
	got = l.next(t, "the marker")
	assert.Equal(t, uint64(2), got.rev, "j1 was woken twice for revision 1")
	assert.Equal(t, uint64(2), a.wakeCounters().Published)
	assert.False(t, pending(ll.ch), "j2 was woken")
}

// TestWakeUpsAgainMovesOnPastJobAhead: a wake-up sent again while this
// store's wake-up of that revision awaits the answer of a job ahead that
// has no waiter reaches the job that sent it again: the "no responders"
// answer moves it on.
func TestWakeUpsAgainMovesOnPastJobAhead(t *testing.T) {
	t.Parallel()
	f := newNATSWakeFixture(t)
	a, ncA := f.store(t)
	ll, _ := f.wait(t, a, ncA, "j2")
	a.publishWakes(f.service, f.kvKey, []byte("s"), 1, []string{"j1"}, 1)
	a.publishWakesAgain(f.service, f.kvKey, []byte("s"), 1, []string{"j1", "j2"}, 1)
	got := ll.next(t, "j2's wake-up, past j1, which has no waiter")
	assert.Equal(t, uint64(1), got.rev)
}
