package jobkeys

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestHeldWakeUpsEndOnManyKeys: the wake-ups of releases on many keys,
// held for a write that may follow (wakeHold) while FlushWakeUps runs
// again and again beside the holds' timers, all end: none stays in the
// coordinator's list of held wake-ups (which FlushWakeUps walks) or in
// its key's entry once its hold passed or a flush sent it.
func TestHeldWakeUpsEndOnManyKeys(t *testing.T) {
	t.Parallel()
	f := newJobWakeFixture(t)
	ca, jta, jtb := f.pa.c, f.jta, f.jtb
	ca.wakeHold = 20 * time.Millisecond

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
		k, err := DeriveKey(f.service, "render", payloads[i], jobWakePolicy.Key)
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
	pub, _, _, _ := WakeCountsOf(f.a)
	assert.NotZero(t, pub, "the releases' wake-ups were published")
}
