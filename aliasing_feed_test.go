package jobkeys

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Review of the pooled encode buffers and the shared arrays of key entries
// (snapshotOver) on the paths TestReturnedStatesBelongToTheCaller does not
// take: a Watcher feeding the key entries of two coordinators of one
// process (keyTable.watched, held, materialize), Runners waiting on that
// feed, lost races that the watch answers or does not (fake conflicts),
// replies lost after the write (the watch delivers a write whose reply
// failed), and batches the store refuses as too large (the solo reruns).

// bufferFaults, a hookStore hook, checks that a value handed to Create or
// Update does not change while the call runs (an encode buffer reused under a write in
// flight), records a copy of every value written, and injects faults: fake
// conflicts that write nothing, and for admissions only, lost replies (the
// write is made, the reply says it lost a race). Its store passes no
// capability through: the inner store's value limit hidden, too-large
// batches reach the store (and rerun solo).
type bufferFaults struct {
	rec *storedValues
	mu  sync.Mutex
	rng *rand.Rand
	// changed counts values that changed during the call that wrote them.
	changed   atomic.Int64
	fakes     atomic.Int64
	lostReply atomic.Int64
	tooLarge  atomic.Int64
}

type admitMark struct{}

func (s *bufferFaults) roll(n int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.rng.IntN(n) == 0
}

// admissionsOnly reports whether every operation the write is for is an
// admission of the test's (its context carries admitMark).
func admissionsOnly(ctx context.Context) bool {
	for _, c := range batchContexts(ctx) {
		if c.Value(admitMark{}) == nil {
			return false
		}
	}
	return true
}

func (s *bufferFaults) hook(ctx context.Context, c storeCall, call func() storeResult) storeResult {
	if c.op != opCreate && c.op != opUpdate {
		return call()
	}
	if s.roll(10) {
		s.fakes.Add(1)
		return storeResult{err: fmt.Errorf("%w: injected by the test", ErrRevisionConflict)}
	}
	before := bytes.Clone(c.value)
	r := call()
	if !bytes.Equal(before, c.value) {
		s.changed.Add(1)
	}
	if errors.Is(r.err, ErrStateTooLarge) {
		s.tooLarge.Add(1)
	}
	if r.err != nil {
		return r
	}
	s.rec.record(before)
	if admissionsOnly(ctx) && s.roll(5) {
		s.lostReply.Add(1)
		return storeResult{err: fmt.Errorf("%w: reply lost (injected by the test; the write was made)", ErrRevisionConflict)}
	}
	return r
}

// Two coordinators of one process share a Watcher over one store;
// workers admit jobs on one key (scribbling over each admission's State),
// run them with each coordinator's Runner (renewing once in the handler and
// scribbling over the renewal's State), while some admissions are refused
// as too large. Every value written parses and carries nothing scribbled,
// every State returned was stored as returned, and no value changed while
// it was being written.
func TestFedStatesAndEncodeBuffersUnderFaults(t *testing.T) {
	t.Parallel()
	for _, b := range coordBackends(t) {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			testFedStatesAndEncodeBuffers(t, b)
		})
	}
}

func testFedStatesAndEncodeBuffers(t *testing.T, b coordBackend) {
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	ctx := context.Background()
	// The coordinators do not see the store's limit (the hookStore hides
	// it): a state over it is refused by the store.
	raw, svc := b.openLimited(t, 3000)
	faults := &bufferFaults{rec: newStoredValues(), rng: rand.New(rand.NewPCG(uint64(seed), 1))}
	st := newHookStore(raw, passNone).withHook(faults.hook)
	w, err := NewWatcher(raw.(WatchableStore))
	require.NoError(t, err)
	t.Cleanup(w.Close)
	policy := Policy{Key: []string{"tenant", "/tenant"}, MaxActive: 2, MaxQueuedPerKey: 64, HeartbeatInterval: time.Second, HeartbeatTTL: 10 * time.Second}
	payload := benchPayload(0)

	type process struct {
		jt *JobType
		r  *Runner
	}
	var procs []process
	for range 2 {
		c := cCoordinator(t, st, &Config{RetryBackoff: time.Millisecond, MaxRetryBackoff: 5 * time.Millisecond, MaxAttempts: 1000})
		jt, err := c.JobType(svc, benchJobType, policy)
		require.NoError(t, err)
		r, err := NewRunner(jt, &RunnerConfig{Watcher: w, RecheckInterval: 20 * time.Millisecond, MaxWait: time.Minute})
		require.NoError(t, err)
		procs = append(procs, process{jt: jt, r: r})
	}

	var (
		mu       sync.Mutex
		returned [][]byte
		ran      atomic.Int64
		refused  atomic.Int64
	)
	took := func(s *KeyState) {
		if s == nil {
			return
		}
		v := appendState(nil, s)
		scribble(s)
		mu.Lock()
		returned = append(returned, v)
		mu.Unlock()
	}
	const workers, jobs = 6, 15
	var wg sync.WaitGroup
	for wk := range workers {
		p := procs[wk%len(procs)]
		wg.Go(func() {
			for j := range jobs {
				id := fmt.Sprintf("w%d-j%d", wk, j)
				adm, err := p.jt.Admit(context.WithValue(ctx, admitMark{}, true), id, payload)
				if errors.Is(err, ErrStateTooLarge) {
					refused.Add(1)
					continue
				}
				if !assert.NoError(t, err, "admit %s", id) || !assert.Equal(t, KindAccepted, adm.Kind, "admit %s", id) {
					return
				}
				took(adm.State)
				_, err = p.r.Run(ctx, id, payload, func(hctx context.Context, lease Lease) error {
					ren, err := p.jt.Renew(hctx, lease)
					if err != nil {
						return err
					}
					if ren.Kind != KindRenewed {
						return fmt.Errorf("renewal of %s: %s", id, ren.Kind)
					}
					took(ren.State)
					return nil
				})
				if !assert.NoError(t, err, "run %s", id) {
					return
				}
				ran.Add(1)
			}
		})
	}
	// Admissions of jobs whose ids alone outgrow the store's limit, riding
	// in the workers' batches: refused by the store, each batch reruns solo.
	stop := make(chan struct{})
	var big sync.WaitGroup
	big.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			id := fmt.Sprintf("big-%d-%s", i, strings.Repeat("x", 3000))
			_, err := procs[i%len(procs)].jt.Admit(context.WithValue(ctx, admitMark{}, true), id, payload)
			if !assert.ErrorIs(t, err, ErrStateTooLarge, "admit %d", i) {
				return
			}
			refused.Add(1)
		}
	})
	wg.Wait()
	close(stop)
	big.Wait()
	t.Logf("ran %d, refused %d; fake conflicts %d, lost replies %d, too large %d",
		ran.Load(), refused.Load(), faults.fakes.Load(), faults.lostReply.Load(), faults.tooLarge.Load())

	assert.Zero(t, faults.changed.Load(), "values changed while they were being written")
	faults.rec.check(t)
	for i, v := range returned {
		assert.True(t, faults.rec.has(v), "returned state %d was never stored as returned: %s", i, v)
	}
	require.Positive(t, ran.Load())
	require.Positive(t, faults.fakes.Load(), "no fake conflict: the test did not test lost races")
	require.Positive(t, faults.lostReply.Load(), "no lost reply: the test did not test them")
	require.Positive(t, faults.tooLarge.Load(), "no value refused as too large: the test did not test it")
	// Every job either ran or was refused: the key ends empty.
	_, _, err = raw.Get(ctx, svc, mustKey(t, procs[0].jt, payload).KVKey)
	require.ErrorIs(t, err, ErrKeyNotFound, "the key holds jobs no one ran")
}
