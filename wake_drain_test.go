package jobkeys

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestWakeUpInFlightAtUnsubscribeMovesOn: a wake-up the server delivers
// to a job's subscription after its last waiter stopped, with the UNSUB
// on its way to the server, moves on to the next job, which waits. The
// stop unsubscribed at once, so nats.go dropped the message on arrival
// (its subscription gone from the client): nobody answered "no
// responders", and the wake-up stayed with the stopped job until its
// delivery state expired; the next job waited for its recheck. The
// publisher here is a second store on the waiters' connection, so its
// PUB reaches the server before the UNSUB, deterministically.
func TestWakeUpInFlightAtUnsubscribeMovesOn(t *testing.T) {
	t.Parallel()
	f := newNATSWakeFixture(t)
	b, ncB := f.store(t)
	js, err := jetstream.New(ncB)
	require.NoError(t, err)
	pub, err := NewNATSStore(js, WithWakeUps(""))
	require.NoError(t, err)
	_, stop1 := f.wait(t, b, ncB, "j1")
	l2, _ := f.wait(t, b, ncB, "j2")
	pub.publishWakes(f.service, f.kvKey, []byte("s"), 1, []string{"j1", "j2"}, 1)
	stop1() // j1's Run stops: its UNSUB follows the wake-up's PUB
	got := l2.next(t, "j2's wake-up, past j1, whose waiter stopped")
	assert.Equal(t, uint64(1), got.rev)
	assert.Nil(t, got.value, "the value of a wake-up from the network")
}

// TestHeldWakeUpsEndOnManyKeys: the wake-ups of releases on many keys,
// held for a write that may follow (wakeHold) while FlushWakeUps runs
// again and again beside the holds' timers, all end: none stays in the
// coordinator's list of held wake-ups (which FlushWakeUps walks) or in
// its key's entry once its hold passed or a flush sent it.
func TestHeldWakeUpsEndOnManyKeys(t *testing.T) {
	t.Parallel()
	f := newNATSWakeFixture(t)
	a, _ := f.store(t, WithCreateBuckets(0, 1))
	b, _ := f.store(t)
	p := Policy{Key: []string{"/t"}, MaxActive: 1, MaxQueuedPerKey: 5}
	ca, err := NewCoordinator(a, nil)
	require.NoError(t, err)
	ca.wakeHold = 20 * time.Millisecond
	jta, err := ca.JobType(f.service, "render", p)
	require.NoError(t, err)
	cb, err := NewCoordinator(b, nil)
	require.NoError(t, err)
	jtb, err := cb.JobType(f.service, "render", p)
	require.NoError(t, err)

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const keys = 48
	leases := make([]Lease, keys)
	payloads := make([][]byte, keys)
	for i := range keys {
		payloads[i] = fmt.Appendf(nil, `{"t":"k%d"}`, i)
		_, err := jta.Admit(ctx, "h", payloads[i])
		require.NoError(t, err)
		acq, err := jta.Acquire(ctx, "h", payloads[i])
		require.NoError(t, err)
		require.Equal(t, KindAcquired, acq.Kind)
		leases[i] = acq.Lease
		// Queued in another process: the release's wake-up is held.
		_, err = jtb.Admit(ctx, "x", payloads[i])
		require.NoError(t, err)
	}
	heldCount := func() int {
		ca.heldMu.Lock()
		defer ca.heldMu.Unlock()
		return len(ca.held)
	}
	stopFlush := make(chan struct{})
	flushed := make(chan int)
	go func() {
		most := 0
		for {
			select {
			case <-stopFlush:
				flushed <- most
				return
			case <-time.After(time.Millisecond):
			}
			most = max(most, heldCount())
			ca.FlushWakeUps()
		}
	}()
	var wg sync.WaitGroup
	for i := range keys {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rel, err := jta.Release(ctx, leases[i])
			assert.NoError(t, err)
			assert.Equal(t, KindReleased, rel.Kind)
		}()
	}
	wg.Wait()
	time.Sleep(5 * time.Millisecond)
	close(stopFlush)
	most := <-flushed
	assert.NotZero(t, most, "wake-ups were held while the flushes ran")
	require.Eventually(t, func() bool { return heldCount() == 0 }, rtWait, time.Millisecond, "no held wake-up is left")
	for i := range keys {
		k, err := DeriveKey(f.service, "render", payloads[i], p.Key)
		require.NoError(t, err)
		e := ca.keys.entry(k.KVKey)
		if e == nil {
			continue
		}
		e.wakeMu.Lock()
		h := e.held
		e.wakeMu.Unlock()
		assert.Nil(t, h, "key %d holds no wake-up", i)
	}
	pub, _, _, _ := WakeCountsOf(a)
	assert.NotZero(t, pub, "the releases' wake-ups were published")
}

// TestWakeUpInFlightAtResubscribeReachesNewWaiter: a job's Run that stops
// waiting and waits again at once (a new subscription of the same
// subject) while a wake-up for it is in flight to the old subscription
// gets it on the new one, and the wake-up is not answered "no
// responders" (which would wake the next job too, for the same slot).
func TestWakeUpInFlightAtResubscribeReachesNewWaiter(t *testing.T) {
	t.Parallel()
	f := newNATSWakeFixture(t)
	b, ncB := f.store(t)
	js, err := jetstream.New(ncB)
	require.NoError(t, err)
	pub, err := NewNATSStore(js, WithWakeUps(""))
	require.NoError(t, err)
	_, stop1 := f.wait(t, b, ncB, "j1")
	l2, _ := f.wait(t, b, ncB, "j2")
	pub.publishWakes(f.service, f.kvKey, []byte("s"), 1, []string{"j1", "j2"}, 1)
	stop1()
	l1 := newNATSWakeLog()
	stop, err := b.subscribeWake(f.service, f.kvKey, "j1", l1.fn)
	require.NoError(t, err)
	defer stop()
	got := l1.next(t, "j1's wake-up on its new subscription")
	assert.Equal(t, uint64(1), got.rev)
	// A "no responders" answer would have followed the hand-over at once.
	require.NoError(t, ncB.Flush())
	time.Sleep(50 * time.Millisecond)
	assert.Zero(t, pub.wakeCounters().NoResponders, "no job was passed over")
	select {
	case g := <-l2.ch:
		t.Fatalf("j2 was woken too (revision %d) for j1's slot", g.rev)
	default:
	}
}
