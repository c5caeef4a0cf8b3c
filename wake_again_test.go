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
