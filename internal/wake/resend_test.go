package wake

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
	f := newFixture(t)
	a, ncA := f.hub(t)
	a.retry = 2 * time.Second // long enough for the waiters to subscribe first on a loaded machine
	b, ncB := f.hub(t)

	// The write's wake-up: neither job has a waiter yet; its retry waits.
	a.Publish(f.bucket, f.kvKey, []byte("s"), 1, []string{"j1", "j2"}, 1, false)
	require.Eventually(t, func() bool { return a.Counters().NoResponders == 2 }, rtWait, time.Millisecond)
	// j2's Run subscribes (in this hub) and, blocked in turn behind j1,
	// sends the state's wake-up again, itself last.
	ll, _ := f.wait(t, a, ncA, "j2")
	a.Publish(f.bucket, f.kvKey, []byte("s"), 1, []string{"j1", "j2"}, 1, true)
	// j1's waiter, in another process, is subscribed before the retry.
	l, _ := f.wait(t, b, ncB, "j1")
	got := l.next(t, "j1's wake-up (the retry)")
	assert.Equal(t, uint64(1), got.rev)
	assert.Zero(t, a.Counters().Local, "the wake-up was handed to j2, behind j1")
	assert.False(t, pending(ll.ch), "j2 was woken")
}

// TestWakeUpsAgainNoSecondCopy: a wake-up of a revision sent again (a Run
// blocked in turn, see KeyCoordinator.wakeAhead) while this hub's
// wake-up of that revision is still out to the job ahead, which has a
// waiter, does not wake that job a second time for the same state (the
// releasing worker's next Run sent it again to the head the release or
// admission had just woken); nor the job behind.
func TestWakeUpsAgainNoSecondCopy(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	a, ncA := f.hub(t)
	b, ncB := f.hub(t)
	l, _ := f.wait(t, b, ncB, "j1")
	ll, _ := f.wait(t, a, ncA, "j2")
	a.Publish(f.bucket, f.kvKey, []byte("s"), 1, []string{"j1"}, 1, false)
	got := l.next(t, "j1's wake-up")
	assert.Equal(t, uint64(1), got.rev)
	a.Publish(f.bucket, f.kvKey, []byte("s"), 1, []string{"j1", "j2"}, 1, true)
	// A marker of a later revision: once j1 has it, a second copy of
	// revision 1 sent before it would have come first.
	a.Publish(f.bucket, f.kvKey, []byte("m"), 2, []string{"j1"}, 1, false)
	got = l.next(t, "the marker")
	assert.Equal(t, uint64(2), got.rev, "j1 was woken twice for revision 1")
	assert.Equal(t, uint64(2), a.Counters().Published)
	assert.False(t, pending(ll.ch), "j2 was woken")
}

// TestWakeUpsAgainMovesOnPastJobAhead: a wake-up sent again while this
// hub's wake-up of that revision awaits the answer of a job ahead that
// has no waiter reaches the job that sent it again: the "no responders"
// answer moves it on.
func TestWakeUpsAgainMovesOnPastJobAhead(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	a, ncA := f.hub(t)
	ll, _ := f.wait(t, a, ncA, "j2")
	a.Publish(f.bucket, f.kvKey, []byte("s"), 1, []string{"j1"}, 1, false)
	a.Publish(f.bucket, f.kvKey, []byte("s"), 1, []string{"j1", "j2"}, 1, true)
	got := ll.next(t, "j2's wake-up, past j1, which has no waiter")
	assert.Equal(t, uint64(1), got.rev)
}

// TestWakeUpHandedToNobodyMovesOn: a wake-up the server delivers to a
// subscription whose waiters all stopped (their UNSUB not at the server
// yet) is answered as "no responders" by the hub that has it, so that
// it moves on to the next job, which waits: the server answers nothing
// for a subscription it still has, and the wake-up stayed with a job
// nobody waits for until its delivery state expired.
func TestWakeUpHandedToNobodyMovesOn(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	a, _ := f.hub(t)
	b, ncB := f.hub(t)
	f.wait(t, b, ncB, "j1")
	l2, _ := f.wait(t, b, ncB, "j2")
	f.stopWaiterOnly(t, b, "j1")
	a.Publish(f.bucket, f.kvKey, []byte("s"), 1, []string{"j1", "j2"}, 1, false)
	got := l2.next(t, "j2's wake-up, past j1, whose waiter stopped")
	assert.Equal(t, uint64(1), got.rev)
}

// TestWakeUpsAgainAfterCopyHandedToNobody: a wake-up sent again (a Run
// blocked in turn behind j1, see KeyCoordinator.wakeAhead) after the
// first copy of that revision was handed to nobody at j1 (its waiter
// stopped before its UNSUB reached the server; it is gone now) reaches
// the job that sent it again. It was taken for a copy still out to j1
// (coveredLocked), and not sent at all.
func TestWakeUpsAgainAfterCopyHandedToNobody(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	a, _ := f.hub(t)
	b, ncB := f.hub(t)
	_, stop1 := f.wait(t, b, ncB, "j1")
	l2, _ := f.wait(t, b, ncB, "j2")
	f.stopWaiterOnly(t, b, "j1")
	// A marker on another key: once its waiter on b has it, b had the
	// copy to j1 first (one connection's messages reach b in order, and
	// b's dispatcher hands them over in order).
	other := f.kvKey + "-other"
	lm := newWaitLog()
	stopM, err := b.Subscribe(b.Subject(f.bucket, other, "m"), lm.fn)
	require.NoError(t, err)
	defer stopM()
	require.NoError(t, ncB.Flush())
	a.Publish(f.bucket, f.kvKey, []byte("s"), 1, []string{"j1"}, 1, false)
	a.Publish(f.bucket, other, []byte("m"), 1, []string{"m"}, 1, false)
	lm.next(t, "the marker")
	stop1()
	require.NoError(t, ncB.Flush())
	a.Publish(f.bucket, f.kvKey, []byte("s"), 1, []string{"j1", "j2"}, 1, true)
	got := l2.next(t, "j2's wake-up, sent again past j1")
	assert.Equal(t, uint64(1), got.rev)
}

// TestLocalWakeUpHandedToNobodyMovesOn: a wake-up handed in memory to a
// job whose waiters of this hub all stopped between the walk that chose
// them and the hand-over moves on to the next job, which waits, as a "no
// responders" answer would move it: it counted as delivered, and stayed
// with a job nobody waits for.
func TestLocalWakeUpHandedToNobodyMovesOn(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	a, ncA := f.hub(t)
	f.wait(t, a, ncA, "j1")
	l2, _ := f.wait(t, a, ncA, "j2")
	f.stopWaiterOnly(t, a, "j1")
	a.Publish(f.bucket, f.kvKey, []byte("s"), 1, []string{"j1", "j2"}, 1, false)
	got := l2.next(t, "j2's wake-up, past j1, whose waiter stopped")
	assert.Equal(t, uint64(1), got.rev)
	assert.Equal(t, uint64(1), a.Counters().Local, "wake-ups handed over in memory")
}

// TestWakeUpInFlightAtUnsubscribeMovesOn: a wake-up the server delivers
// to a job's subscription after its last waiter stopped, with the UNSUB
// on its way to the server, moves on to the next job, which waits. The
// stop unsubscribed at once, so nats.go dropped the message on arrival
// (its subscription gone from the client): nobody answered "no
// responders", and the wake-up stayed with the stopped job until its
// delivery state expired; the next job waited for its recheck. The
// publisher here is a second hub on the waiters' connection, so its
// PUB reaches the server before the UNSUB, deterministically.
func TestWakeUpInFlightAtUnsubscribeMovesOn(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	b, ncB := f.hub(t)
	pub := newHub(t, ncB)
	_, stop1 := f.wait(t, b, ncB, "j1")
	l2, _ := f.wait(t, b, ncB, "j2")
	pub.Publish(f.bucket, f.kvKey, []byte("s"), 1, []string{"j1", "j2"}, 1, false)
	stop1() // j1's Run stops: its UNSUB follows the wake-up's PUB
	got := l2.next(t, "j2's wake-up, past j1, whose waiter stopped")
	assert.Equal(t, uint64(1), got.rev)
	assert.Nil(t, got.value, "the value of a wake-up from the network")
}

// TestWakeUpInFlightAtResubscribeReachesNewWaiter: a job's Run that stops
// waiting and waits again at once (a new subscription of the same
// subject) while a wake-up for it is in flight to the old subscription
// gets it on the new one, and the wake-up is not answered "no
// responders" (which would wake the next job too, for the same slot).
func TestWakeUpInFlightAtResubscribeReachesNewWaiter(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	b, ncB := f.hub(t)
	pub := newHub(t, ncB)
	_, stop1 := f.wait(t, b, ncB, "j1")
	l2, _ := f.wait(t, b, ncB, "j2")
	pub.Publish(f.bucket, f.kvKey, []byte("s"), 1, []string{"j1", "j2"}, 1, false)
	stop1()
	l1 := newWaitLog()
	stop, err := b.Subscribe(b.Subject(f.bucket, f.kvKey, "j1"), l1.fn)
	require.NoError(t, err)
	defer stop()
	got := l1.next(t, "j1's wake-up on its new subscription")
	assert.Equal(t, uint64(1), got.rev)
	// A "no responders" answer would have followed the hand-over at once.
	require.NoError(t, ncB.Flush())
	time.Sleep(50 * time.Millisecond)
	assert.Zero(t, pub.Counters().NoResponders, "no job was passed over")
	select {
	case g := <-l2.ch:
		t.Fatalf("j2 was woken too (revision %d) for j1's slot", g.rev)
	default:
	}
}
