package jobkeys

// A diagnostic of the cross-process thundering herd on a hot key (issue
// 11): n processes, each with its own connection, coordinator and Watcher
// feeding the key to its coordinator, loop admit → remove of jobs of their
// own on ONE key, so that every process has a write pending on every
// revision and all but one of them lose it. It reports the failed writes
// per successful one, the reads, the rate, and the admissions' latency.
//
// It runs only with JOBKEYS_HOTKEY_HERD=1. JOBKEYS_HOTKEY_PROCS (default
// 16) and JOBKEYS_HOTKEY_LOOPS (default 2000, over all processes) size it:
//
//	JOBKEYS_HOTKEY_HERD=1 go test -count=1 -run TestHotKeyAdmitHerd -v .

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jobkeys/jobkeys/internal/natstest"

	"github.com/stretchr/testify/require"
)

func TestHotKeyAdmitHerd(t *testing.T) {
	if os.Getenv("JOBKEYS_HOTKEY_HERD") == "" {
		t.Skip("a diagnostic: set JOBKEYS_HOTKEY_HERD=1 to run it")
	}
	procs := benchEnvInt(t, "JOBKEYS_HOTKEY_PROCS", 16)
	loops := benchEnvInt(t, "JOBKEYS_HOTKEY_LOOPS", 2000)
	s := natstest.Run(t)
	ctx := context.Background()
	service := rtService()
	payload := benchPayload(0)
	policy := Policy{Key: []string{"tenant", "/tenant"}, MaxActive: 1, MaxQueuedPerKey: procs}

	type proc struct {
		jt     *JobType
		totals *raceTotals
	}
	ps := make([]proc, procs)
	for i := range ps {
		_, js := natstest.Connect(t, s)
		store, err := NewNATSStore(js, WithCreateBuckets(jetstream.MemoryStorage, 1))
		require.NoError(t, err)
		cs := newCountingStore(store)
		coord, err := NewCoordinator(cs, nil)
		require.NoError(t, err)
		jt, err := coord.JobType(service, benchJobType, policy)
		require.NoError(t, err)
		w, err := NewWatcher(store)
		require.NoError(t, err)
		t.Cleanup(w.Close)
		key, err := jt.Key(payload)
		require.NoError(t, err)
		// A waiter's subscription feeds the key to the coordinator, as a
		// Runner waiting on it does.
		sub, err := w.subscribeWaiter(ctx, service, key.KVKey, "nobody", policy.MaxActive, coord.keys)
		require.NoError(t, err)
		t.Cleanup(sub.Close)
		ps[i] = proc{jt: jt, totals: cs.totals}
	}
	loop := func(p proc, jobID string) (time.Duration, error) {
		began := time.Now()
		adm, err := p.jt.Admit(ctx, jobID, payload)
		took := time.Since(began)
		if err != nil {
			return 0, fmt.Errorf("admit %s: %w", jobID, err)
		}
		if adm.Kind != KindAccepted {
			return 0, fmt.Errorf("admit %s: %s %s", jobID, adm.Kind, adm.Reason)
		}
		rm, err := p.jt.RemoveQueued(ctx, jobID, payload)
		if err != nil {
			return 0, fmt.Errorf("remove %s: %w", jobID, err)
		}
		if rm.Kind != KindRemoved {
			return 0, fmt.Errorf("remove %s: %s", jobID, rm.Kind)
		}
		return took, nil
	}
	for i, p := range ps {
		_, err := loop(p, fmt.Sprintf("warmup-%d", i))
		require.NoError(t, err)
	}
	for _, p := range ps {
		p.totals.reads.Store(0)
		p.totals.writes.Store(0)
		p.totals.lost.Store(0)
		p.totals.stale.Store(0)
	}

	var next, contention atomic.Int64
	var mu sync.Mutex
	var admits []time.Duration
	var wg sync.WaitGroup
	errs := make(chan error, procs)
	began, cpu0 := time.Now(), hotCPU(t)
	for i, p := range ps {
		wg.Go(func() {
			for {
				n := int(next.Add(1)) - 1
				if n >= loops {
					return
				}
				took, err := loop(p, fmt.Sprintf("job-%d-%d", i, n))
				if errors.Is(err, ErrContention) {
					contention.Add(1)
				}
				if err != nil {
					errs <- err
					return
				}
				mu.Lock()
				admits = append(admits, took)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	elapsed, cpu := time.Since(began), hotCPU(t)-cpu0
	close(errs)
	// Without a raceCounter per operation, countingStore counts every
	// failed compare-and-swap as stale: lost + stale is every failure.
	var reads, writes, failed int64
	for _, p := range ps {
		reads += p.totals.reads.Load()
		writes += p.totals.writes.Load()
		failed += p.totals.lost.Load() + p.totals.stale.Load()
	}
	done := writes - failed
	t.Logf("%d processes, %d admit → remove loops in %v: %.0f loops/s; process CPU %.0f%% of one core",
		procs, loops, elapsed.Round(time.Millisecond), float64(loops)/elapsed.Seconds(), 100*cpu.Seconds()/elapsed.Seconds())
	t.Logf("writes: %d succeeded, %d failed (%.2f per success), %d reads (%.2f per loop); %d ErrContention",
		done, failed, float64(failed)/float64(max(done, 1)), reads, float64(reads)/float64(loops), contention.Load())
	t.Logf("Admit call: %s", hotDist(admits))
	for err := range errs {
		require.NoError(t, err)
	}
}
