package jobkeys

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jobkeys/jobkeys/internal/natstest"
	"github.com/jobkeys/jobkeys/internal/wake"
)

// The wake-up machinery keeps state per waiting job (a subscription, a
// waiter, a Watcher entry, a pinned key entry) and per wake-up sent (its
// delivery chain); all of it must go when the jobs are done, also when the
// hot key moves on and its jobs' subjects are never used again.

// wakeSoak runs workers Runners over conns connections with wake-ups on a
// hot key that moves to the next of keys keys every perKey cycles, cycles
// cycles in all (admit, then Run with a handler that returns at once), each
// job a new one; sample, when set, is called after every tenth of the
// cycles. The key set is bounded so that the bucket holds a bounded set
// of keys (each key a state or a delete marker).
type wakeSoak struct {
	workers, conns, cycles, perKey, keys int
	sample                               func(done int)
}

func (ws wakeSoak) run(t *testing.T) []*wakeProc {
	s := natstest.Run(t)
	service := "wakesoak"
	policy := Policy{Key: []string{"tenant", "/tenant"}, MaxActive: 1, MaxQueuedPerKey: ws.workers}
	conns := make([]*wakeProc, ws.conns)
	for i := range conns {
		// A recheck well past the run: a Run that missed its wake-up
		// shows as a slow soak, not as a pass.
		conns[i] = newWakeProc(t, s, service, policy, wakeProcConfig{uncounted: true, recheck: time.Minute})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	var next atomic.Int64 // cycles started
	var failed atomic.Bool
	var mu sync.Mutex // serialises sample
	step := max(ws.cycles/10, 1)
	var wg sync.WaitGroup
	for worker := range ws.workers {
		c := conns[worker%ws.conns]
		wg.Go(func() {
			for !failed.Load() {
				i := int(next.Add(1)) - 1
				if i >= ws.cycles {
					return
				}
				if ws.sample != nil && i > 0 && i%step == 0 {
					mu.Lock()
					ws.sample(i)
					mu.Unlock()
				}
				payload := []byte(`{"tenant":"t-` + strconv.Itoa(i/ws.perKey%ws.keys) + `"}`)
				jobID := fmt.Sprintf("job-%d", i)
				adm, err := c.jt.Admit(ctx, jobID, payload)
				if !assert.NoError(t, err, "admit %s", jobID) || !assert.Equal(t, KindAccepted, adm.Kind, "admit %s: %s", jobID, adm.Reason) {
					failed.Store(true)
					return
				}
				res, err := c.r.Run(ctx, jobID, payload, func(context.Context, Lease) error { return nil })
				if !assert.NoError(t, err, "run %s", jobID) || !assert.Equal(t, KindReleased, res.Release, "run %s", jobID) {
					failed.Store(true)
					return
				}
			}
		})
	}
	wg.Wait()
	require.False(t, failed.Load())
	return conns
}

// wakeHubSize is what a store's wake-up hub holds: subjects waited on,
// live subscriptions, delivery chains kept.
func wakeHubSize(s *NATSStore) (subs, live, chains int) {
	n := s.wake.Size()
	return n.Subjects, n.Live, n.Chains
}

// TestWakeUpsLeaveNothingBehind: after a few thousand hot-key cycles over
// wake-ups across connections, the hot key moving every 50 cycles, no
// subscription, waiter, pinned key entry or Watcher entry is left, and the
// delivery chains go once they are older than wake.ChainTTL.
func TestWakeUpsLeaveNothingBehind(t *testing.T) {
	if testing.Short() {
		t.Skip("a few thousand cycles over NATS")
	}
	conns := wakeSoak{workers: 16, conns: 4, cycles: 2000, perKey: 50, keys: 1000}.run(t)
	var received, published uint64
	for _, c := range conns {
		n := c.store.wakeCounters()
		received += n.Received
		published += n.Published
	}
	// Across connections, the Runs waited on wake-ups sent to them.
	require.NotZero(t, published, "wake-ups published")
	require.NotZero(t, received, "wake-ups received from other connections")
	for i, c := range conns {
		assert.Zero(t, c.w.wakeSubscriptions(), "conn %d: Watcher wake-up subscriptions", i)
		c.w.mu.Lock()
		assert.Empty(t, c.w.wakeSubs, "conn %d: Watcher wake-up entries by key", i)
		c.w.mu.Unlock()
		c.c.keys.mu.Lock()
		pinned := 0
		for _, e := range c.c.keys.entries {
			if e.users > 0 {
				pinned++
			}
		}
		c.c.keys.mu.Unlock()
		assert.Zero(t, pinned, "conn %d: key entries still pinned", i)
		// Unsubscribing is asynchronous to the Run's return.
		assert.Eventually(t, func() bool {
			subs, live, _ := wakeHubSize(c.store)
			return subs == 0 && live == 0
		}, 10*time.Second, 10*time.Millisecond, "conn %d: wake-up subjects or subscriptions left", i)
	}
	// Chains are forgotten lazily, by the next wake-up's publish past
	// their TTL: one more wake-up per store after the TTL must leave at
	// most its own.
	time.Sleep(wake.ChainTTL + 100*time.Millisecond)
	for i, c := range conns {
		c.store.wake.Expire(time.Now())
		_, _, chains := wakeHubSize(c.store)
		assert.Zero(t, chains, "conn %d: wake-up chains kept past their TTL", i)
	}
}

// TestWakeUpsMemoryFlat is the wake-up variant of TestCoordinatorMemoryFlat:
// hot-key cycles over wake-ups across connections, the hot key moving
// every 100 cycles over 200 keys, heap sampled after GC. It runs only with
// JOBKEYS_MEM_SOAK=1 (JOBKEYS_MEM_SOAK_WAKE_CYCLES overrides its 100,000
// cycles, JOBKEYS_MEM_SOAK_WAKE_KEYS its 200 keys):
//
//	JOBKEYS_MEM_SOAK=1 go test -run TestWakeUpsMemoryFlat -v -timeout 30m
func TestWakeUpsMemoryFlat(t *testing.T) {
	if testing.Short() {
		t.Skip("memory soak")
	}
	if os.Getenv("JOBKEYS_MEM_SOAK") != "1" {
		t.Skip("set JOBKEYS_MEM_SOAK=1 to run the memory soak")
	}
	cycles := benchEnvInt(t, "JOBKEYS_MEM_SOAK_WAKE_CYCLES", 100_000)
	keys := benchEnvInt(t, "JOBKEYS_MEM_SOAK_WAKE_KEYS", 200)
	var samples []uint64
	start := time.Now()
	var goroutines []int
	sample := func(done int) {
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		samples = append(samples, ms.HeapAlloc)
		goroutines = append(goroutines, runtime.NumGoroutine())
		t.Logf("cycle %7d: HeapAlloc %7.2f MiB, %4d goroutines (%v)", done, float64(ms.HeapAlloc)/(1<<20), runtime.NumGoroutine(), time.Since(start).Round(time.Millisecond))
	}
	wakeSoak{workers: 16, conns: 4, cycles: cycles, perKey: 100, keys: keys, sample: sample}.run(t)
	require.GreaterOrEqual(t, len(samples), 3)
	base, final := samples[1], samples[len(samples)-1]
	assert.LessOrEqual(t, final, base+4<<20, "heap grew from %d to %d bytes over %d cycles", base, final, cycles)
	assert.LessOrEqual(t, goroutines[len(goroutines)-1], goroutines[1]+16, "goroutines grew")
}
