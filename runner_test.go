package jobkeys

import (
	"context"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// rtPolicy keys jobs by tenant, one active per tenant, up to 8 waiting.
func rtPolicy(interval, ttl time.Duration) Policy {
	return Policy{Key: []string{"/tenant"}, MaxActive: 1, MaxQueuedPerKey: 8, HeartbeatInterval: interval, HeartbeatTTL: ttl}
}

var rtPayload = []byte(`{"tenant":"acme"}`)

// rtJobType returns the "render" job type of svc under p.
func rtJobType(t testing.TB, c *KeyCoordinator, svc string, p Policy) *JobType {
	t.Helper()
	jt, err := c.JobType(svc, "render", p)
	require.NoError(t, err)
	return jt
}

// rtAdmit admits job id with rtPayload and returns the id.
func rtAdmit(t testing.TB, jt *JobType, id string) string {
	t.Helper()
	adm, err := jt.Admit(context.Background(), id, rtPayload)
	require.NoError(t, err)
	require.Equal(t, KindAccepted, adm.Kind, "admit %s: %s", id, adm.Reason)
	return id
}

// rtAcquire admits and acquires job id, and returns its lease.
func rtAcquire(t testing.TB, jt *JobType, id string) Lease {
	t.Helper()
	acq, err := jt.Acquire(context.Background(), rtAdmit(t, jt, id), rtPayload)
	require.NoError(t, err)
	require.Equal(t, KindAcquired, acq.Kind, "acquire %s: %s", id, acq.Reason)
	return acq.Lease
}

// rtState reads the key state of rtPayload's key; nil when absent.
func rtState(t testing.TB, store Store, jt *JobType) *KeyState {
	t.Helper()
	key, err := DeriveKey(jt.Service(), jt.Name(), rtPayload, jt.Policy().Key)
	require.NoError(t, err)
	value, _, err := store.Get(context.Background(), jt.Service(), key.KVKey)
	if errors.Is(err, ErrKeyNotFound) {
		return nil
	}
	require.NoError(t, err)
	st, err := ParseState(value)
	require.NoError(t, err)
	return st
}

// activeIDs lists the job ids of st's slots; nil for a nil state.
func activeIDs(st *KeyState) []string {
	if st == nil {
		return nil
	}
	var ids []string
	for _, s := range st.Active {
		ids = append(ids, s.JobID)
	}
	return ids
}

// signalTo returns an OnBlocked hook that signals ch without blocking.
func signalTo(ch chan Acquisition) func(string, Acquisition) {
	return func(_ string, a Acquisition) {
		select {
		case ch <- a:
		default:
		}
	}
}

func rtRunner(t testing.TB, jt *JobType, cfg *RunnerConfig) *Runner {
	t.Helper()
	r, err := NewRunner(jt, cfg)
	require.NoError(t, err)
	return r
}

func ok(context.Context, Lease) error { return nil }

// TestRunReleasesOnEveryExit: the slot is held while the handler runs and
// gone after it returns, fails, panics or is cancelled.
func TestRunReleasesOnEveryExit(t *testing.T) {
	t.Parallel()
	store, _ := rtNATS(t)
	errBoom := errors.New("boom")
	cases := []struct {
		name    string
		handler func(ctx context.Context, cancel context.CancelFunc) error
		wantErr error
		panics  bool
	}{
		{name: "return", handler: func(context.Context, context.CancelFunc) error { return nil }},
		{name: "error", handler: func(context.Context, context.CancelFunc) error { return errBoom }, wantErr: errBoom},
		{name: "panic", handler: func(context.Context, context.CancelFunc) error { panic(errBoom) }, panics: true},
		{name: "cancel", handler: func(ctx context.Context, cancel context.CancelFunc) error {
			cancel()
			<-ctx.Done()
			return ctx.Err()
		}, wantErr: context.Canceled},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			jt := rtJobType(t, cCoordinator(t, store, nil), rtService(), rtPolicy(time.Minute, 10*time.Minute))
			r := rtRunner(t, jt, nil)
			id := rtAdmit(t, jt, "job-1")
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()

			var (
				res      RunResult
				err      error
				panicVal any
				held     *KeyState
			)
			func() {
				defer func() { panicVal = recover() }()
				res, err = r.Run(ctx, id, rtPayload, func(ctx context.Context, lease Lease) error {
					held = rtState(t, store, jt)
					return tc.handler(ctx, cancel)
				})
			}()

			require.NotNil(t, held, "state while the handler ran")
			assert.Equal(t, []string{"job-1"}, activeIDs(held), "slots while the handler ran")
			assert.Empty(t, held.Queued, "queue while the handler ran")
			if tc.panics {
				assert.Equal(t, errBoom, panicVal, "the handler's panic value, re-panicked")
			} else {
				require.Nil(t, panicVal, "Run panicked")
				if tc.wantErr == nil {
					assert.NoError(t, err)
				} else {
					assert.ErrorIs(t, err, tc.wantErr)
				}
				assert.Equal(t, KindReleased, res.Release)
				assert.Equal(t, "job-1", res.Lease.JobID)
				assert.Zero(t, res.Waited)
				assert.NoError(t, res.LeaseLost)
			}
			assert.Nil(t, rtState(t, store, jt), "state after the run: want the key deleted")
		})
	}
}

// TestRunHeartbeats: a handler that runs for several lease lifetimes keeps
// its slot, because the runner renews it.
func TestRunHeartbeats(t *testing.T) {
	t.Parallel()
	store, _ := rtNATS(t)
	// A TTL far above the interval, so that a loaded machine does not lose
	// the lease; the handler runs past the first expiry.
	jt := rtJobType(t, cCoordinator(t, store, nil), rtService(), rtPolicy(50*time.Millisecond, time.Second))
	r := rtRunner(t, jt, nil)
	res, err := r.Run(context.Background(), rtAdmit(t, jt, "job-1"), rtPayload, func(ctx context.Context, lease Lease) error {
		first := lease.LeaseExpiresAt
		deadline := time.Now().Add(rtWait)
		for {
			st := rtState(t, store, jt)
			if st == nil || len(st.Active) != 1 || st.Active[0].SlotToken != lease.SlotToken {
				return fmt.Errorf("state %+v, want the handler's slot", st)
			}
			now := time.Now()
			if now.After(first.Add(100*time.Millisecond)) && st.Active[0].LeaseExpiresAt.After(now) {
				return ctx.Err() // held beyond the first expiry, and still live
			}
			if now.After(deadline) {
				return fmt.Errorf("lease expires at %v, first expiry %v", st.Active[0].LeaseExpiresAt, first)
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("handler cancelled: %w", context.Cause(ctx))
			case <-time.After(20 * time.Millisecond):
			}
		}
	})
	require.NoError(t, err)
	assert.Equal(t, KindReleased, res.Release)
}

// TestRunHeartbeatsOnLocalClock: a coordinator whose clock runs an hour
// behind writes leases that look an hour in the past to the local clock;
// the runner still renews them on time and keeps the slot, because it
// counts the lease's time on its own monotonic clock, not against a
// timestamp from another clock.
func TestRunHeartbeatsOnLocalClock(t *testing.T) {
	t.Parallel()
	store := NewMemoryStore()
	c := cCoordinator(t, store, &Config{Now: func() time.Time { return time.Now().Add(-time.Hour) }})
	jt := rtJobType(t, c, rtService(), rtPolicy(20*time.Millisecond, 2*time.Second))
	r := rtRunner(t, jt, nil)
	renewals := 0
	res, err := r.Run(context.Background(), rtAdmit(t, jt, "job-1"), rtPayload, func(ctx context.Context, lease Lease) error {
		var last time.Time
		for renewals < 3 {
			select {
			case <-ctx.Done():
				return fmt.Errorf("handler cancelled: %w", context.Cause(ctx))
			case <-time.After(10 * time.Millisecond):
			}
			st := rtState(t, store, jt)
			if st == nil || len(st.Active) != 1 {
				return fmt.Errorf("state %+v, want the handler's slot", st)
			}
			if hb := st.Active[0].HeartbeatAt; hb.After(lease.LeaseExpiresAt.Add(-jt.Policy().HeartbeatTTL)) && !hb.Equal(last) {
				last = hb
				renewals++
			}
		}
		return nil
	})
	require.NoError(t, err)
	assert.NoError(t, res.LeaseLost)
	assert.Equal(t, KindReleased, res.Release)
}

// TestRunLeaseTakenOver: a holder is taken over by a second coordinator
// whose clock is an hour ahead, so that it sees the lease expired; the first
// handler's context is cancelled with the lost lease cause, and the run
// reports a stale completion.
func TestRunLeaseTakenOver(t *testing.T) {
	t.Parallel()
	store, _ := rtNATS(t)
	svc := rtService()
	// The first holder's lease is long (renewal delays on a loaded machine
	// cannot expire it); the second coordinator's clock sees it expired.
	p := rtPolicy(100*time.Millisecond, 30*time.Second)
	first := rtJobType(t, cCoordinator(t, store, &Config{InstanceID: "first"}), svc, p)
	second := rtJobType(t, cCoordinator(t, store, &Config{InstanceID: "second", IgnoreClockSkew: true, Now: func() time.Time { return time.Now().Add(time.Hour) }}), svc, p)
	r := rtRunner(t, first, nil)
	id1, id2 := rtAdmit(t, first, "job-1"), rtAdmit(t, first, "job-2")

	var (
		cause    error
		takeover Acquisition
	)
	res, err := r.Run(context.Background(), id1, rtPayload, func(ctx context.Context, lease Lease) error {
		var err error
		takeover, err = second.Acquire(context.Background(), id2, rtPayload)
		if err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			cause = context.Cause(ctx)
			return cause
		case <-time.After(rtWait):
			return errors.New("handler not cancelled after its slot was taken over")
		}
	})

	require.Equal(t, KindAcquired, takeover.Kind, "job-2's takeover")
	require.Len(t, takeover.Stale, 1, "job-1's slot reported stale")
	assert.Equal(t, "job-1", takeover.Stale[0].JobID)
	require.ErrorIs(t, cause, ErrLeaseLost, "the handler's context cause")
	assert.Contains(t, cause.Error(), "taken over")
	assert.ErrorIs(t, err, ErrLeaseLost)       // the handler's own error
	assert.ErrorIs(t, err, ErrStaleCompletion) // and the release's finding
	assert.Equal(t, KindStaleCompletion, res.Release)
	assert.ErrorIs(t, res.LeaseLost, ErrLeaseLost)
	assert.Equal(t, []string{"job-2"}, activeIDs(rtState(t, store, first)), "job-2's slot untouched")
}

// updateFaults fails updates with errInjected while failing is set, and
// counts them.
type updateFaults struct {
	failing atomic.Bool
	failed  atomic.Int64
}

var errInjected = errors.New("injected store fault")

// newFaultyStore returns a store over inner (passing no optional
// capability through) whose updates fail as the returned updateFaults says.
func newFaultyStore(inner Store) (*hookStore, *updateFaults) {
	f := &updateFaults{}
	return newHookStore(inner, passNone).withHook(func(_ context.Context, c storeCall, call func() storeResult) storeResult {
		if c.op == opUpdate && f.failing.Load() {
			f.failed.Add(1)
			return storeResult{err: errInjected}
		}
		return call()
	}), f
}

// TestRunLeaseLostWhenRenewalsFail: when no renewal succeeds until the lease
// expires, the handler is cancelled with the lost lease cause, which carries
// the last renewal error.
func TestRunLeaseLostWhenRenewalsFail(t *testing.T) {
	t.Parallel()
	nats, _ := rtNATS(t)
	store, faults := newFaultyStore(nats)
	jt := rtJobType(t, cCoordinator(t, store, nil), rtService(), rtPolicy(200*time.Millisecond, time.Second))
	r := rtRunner(t, jt, nil)

	var cause error
	res, err := r.Run(context.Background(), rtAdmit(t, jt, "job-1"), rtPayload, func(ctx context.Context, lease Lease) error {
		faults.failing.Store(true)
		defer faults.failing.Store(false) // let the release through
		select {
		case <-ctx.Done():
			cause = context.Cause(ctx)
			return nil // the work finished anyway
		case <-time.After(rtWait):
			return errors.New("handler not cancelled while renewals failed")
		}
	})
	require.NoError(t, err)
	assert.ErrorIs(t, cause, ErrLeaseLost)
	assert.ErrorIs(t, cause, errInjected, "the cause carries the renewal error")
	assert.GreaterOrEqual(t, faults.failed.Load(), int64(1), "failed renewals before giving up")
	assert.ErrorIs(t, res.LeaseLost, ErrLeaseLost)
	// Nobody took the slot over, so the release found it.
	assert.Equal(t, KindReleased, res.Release)
	assert.Nil(t, rtState(t, nats, jt), "state after the run: want the key deleted")
}

// TestRunWakesOnRelease: a blocked Run wakes on the release of the slot it
// waits for, long before its re-check timer or the holder's lease expiry
// would have woken it.
func TestRunWakesOnRelease(t *testing.T) {
	t.Parallel()
	store, _ := rtNATS(t)
	jt := rtJobType(t, cCoordinator(t, store, nil), rtService(), rtPolicy(time.Minute, time.Hour))
	w, err := NewWatcher(store)
	require.NoError(t, err)
	defer w.Close()
	blocked := make(chan Acquisition, 1)
	var blockedCalls atomic.Int64
	r := rtRunner(t, jt, &RunnerConfig{Watcher: w, RecheckInterval: time.Hour, OnBlocked: func(jobID string, a Acquisition) {
		blockedCalls.Add(1)
		assert.Equal(t, "waiter", jobID)
		signalTo(blocked)(jobID, a)
	}})

	holder := rtAcquire(t, jt, "holder")
	waiter := rtAdmit(t, jt, "waiter")

	type result struct {
		res RunResult
		err error
		at  time.Time
	}
	done := make(chan result, 1)
	go func() {
		res, err := r.Run(context.Background(), waiter, rtPayload, ok)
		done <- result{res, err, time.Now()}
	}()
	a := recv(t, blocked, "the waiter to block")
	assert.Equal(t, ReasonActiveLimit, a.Reason)
	// Renewals change the key too: the waiter wakes, finds the slot still
	// taken and waits again.
	for range 3 {
		ren, err := jt.Renew(context.Background(), holder)
		require.NoError(t, err)
		assert.Equal(t, KindRenewed, ren.Kind)
	}
	assert.False(t, pending(done), "the waiter ran while the holder held the slot")
	released := time.Now()
	rel, err := jt.Release(context.Background(), holder)
	require.NoError(t, err)
	assert.Equal(t, KindReleased, rel.Kind)

	got := recv(t, done, "the waiter to run after the release (re-check timer and lease: 1h)")
	require.NoError(t, got.err)
	assert.Equal(t, KindReleased, got.res.Release)
	assert.Positive(t, got.res.Waited)
	assert.Equal(t, int64(1), blockedCalls.Load())
	t.Logf("woke %v after the release", got.at.Sub(released))
}

// TestRunWaitsForStaleSlot: a crashed holder writes nothing when its lease
// expires; a blocked Run still looks again at the expiry, takes the slot
// over and reports the stale slot.
func TestRunWaitsForStaleSlot(t *testing.T) {
	t.Parallel()
	store, _ := rtNATS(t)
	jt := rtJobType(t, cCoordinator(t, store, nil), rtService(), rtPolicy(100*time.Millisecond, 300*time.Millisecond))
	w, err := NewWatcher(store)
	require.NoError(t, err)
	defer w.Close()
	var stale []ActiveSlot
	r := rtRunner(t, jt, &RunnerConfig{Watcher: w, RecheckInterval: time.Hour,
		OnStale: func(_ Lease, s []ActiveSlot) { stale = s }})

	rtAcquire(t, jt, "crashed")
	next := rtAdmit(t, jt, "next")

	ctx, cancel := context.WithTimeout(context.Background(), rtWait)
	defer cancel()
	res, err := r.Run(ctx, next, rtPayload, ok)
	require.NoError(t, err)
	require.Len(t, res.Stale, 1, "RunResult.Stale: the crashed job's slot")
	assert.Equal(t, "crashed", res.Stale[0].JobID)
	assert.Equal(t, res.Stale, stale, "OnStale saw RunResult.Stale")
	assert.Positive(t, res.Waited)
}

func TestTryRunBlocked(t *testing.T) {
	t.Parallel()
	store := NewMemoryStore()
	jt := rtJobType(t, cCoordinator(t, store, nil), rtService(), rtPolicy(time.Minute, time.Hour))
	r := rtRunner(t, jt, &RunnerConfig{MaxWait: 100 * time.Millisecond, RecheckInterval: 10 * time.Millisecond})
	rtAcquire(t, jt, "holder")
	waiter := rtAdmit(t, jt, "waiter")
	ran := false
	handler := func(context.Context, Lease) error { ran = true; return nil }

	var be *BlockedError
	res, err := r.TryRun(context.Background(), waiter, rtPayload, handler)
	require.ErrorAs(t, err, &be)
	assert.ErrorIs(t, err, ErrBlocked)
	assert.Equal(t, ReasonActiveLimit, be.Acquisition.Reason)
	assert.Equal(t, "waiter", be.JobID)
	assert.Equal(t, RunResult{}, res)

	start := time.Now()
	_, err = r.Run(context.Background(), waiter, rtPayload, handler)
	assert.ErrorIs(t, err, ErrBlocked)
	assert.GreaterOrEqual(t, time.Since(start), 100*time.Millisecond, "Run gave up before MaxWait")

	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err = rtRunner(t, jt, nil).Run(ctx, waiter, rtPayload, handler)
	assert.Equal(t, context.DeadlineExceeded, err, "Run with an expiring context: ctx.Err() unchanged")

	_, err = rtRunner(t, jt, nil).Run(context.Background(), "never-admitted", rtPayload, handler)
	require.ErrorAs(t, err, &be, "a job that is not queued: a BlockedError at once")
	assert.Equal(t, ReasonNotQueued, be.Acquisition.Reason)
	assert.False(t, ran, "a blocked handler ran")
	st := rtState(t, store, jt)
	require.NotNil(t, st)
	require.Len(t, st.Queued, 1)
	assert.Equal(t, "waiter", st.Queued[0].JobID, "the waiter is still queued")
}

// TestRunOptions: Run passes its options to the acquisition.
func TestRunOptions(t *testing.T) {
	t.Parallel()
	store := NewMemoryStore()
	jt := rtJobType(t, cCoordinator(t, store, nil), rtService(), rtPolicy(time.Minute, time.Hour))
	r := rtRunner(t, jt, nil)
	var slot ActiveSlot
	_, err := r.Run(context.Background(), "retry", rtPayload, func(context.Context, Lease) error {
		st := rtState(t, store, jt)
		require.Len(t, st.Active, 1)
		slot = st.Active[0]
		return nil
	}, WithRetry(), WithTries(3), WithInstanceID("w-7"))
	require.NoError(t, err)
	assert.Equal(t, 3, slot.Tries)
	assert.Equal(t, "w-7", slot.InstanceID)
}

func TestRunnerConfigErrors(t *testing.T) {
	t.Parallel()
	jt := rtJobType(t, cCoordinator(t, NewMemoryStore(), nil), "svc", rtPolicy(0, 0))
	for _, tc := range []struct {
		cfg   *RunnerConfig
		field string
	}{
		{&RunnerConfig{RecheckInterval: time.Microsecond}, "RecheckInterval"},
		{&RunnerConfig{MaxWait: -1}, "MaxWait"},
		{&RunnerConfig{ReleaseTimeout: -1}, "ReleaseTimeout"},
	} {
		_, err := NewRunner(jt, tc.cfg)
		if assert.ErrorIs(t, err, ErrInvalidRequest, "NewRunner(%+v)", tc.cfg) {
			assert.Contains(t, err.Error(), tc.field)
		}
	}
	_, err := NewRunner(nil, nil)
	assert.ErrorIs(t, err, ErrInvalidRequest)
	r := rtRunner(t, jt, nil)
	_, err = r.Run(context.Background(), "j", rtPayload, nil)
	assert.ErrorIs(t, err, ErrInvalidRequest, "nil handler")
	_, err = r.Run(context.Background(), "", rtPayload, ok)
	assert.ErrorIs(t, err, ErrInvalidRequest, "empty job id")
	_, err = r.Run(context.Background(), "j", []byte(`{}`), ok)
	assert.ErrorIs(t, err, ErrInvalidKey, "payload without the key")
	_, err = r.Run(context.Background(), "j", rtPayload, ok, WithTries(-1))
	assert.ErrorIs(t, err, ErrInvalidRequest, "negative tries")
	_, err = r.Run(context.Background(), "j", rtPayload, ok)
	assert.ErrorIs(t, err, ErrBlocked, "not queued")
}

// TestRunNoGoroutineLeak is not parallel: it counts the process's
// goroutines after runs that return, fail, panic, wait and lose their lease.
func TestRunNoGoroutineLeak(t *testing.T) {
	store, _ := rtNATS(t)
	svc := rtService()
	c := cCoordinator(t, store, nil)
	// Slow heartbeats, so that a heartbeat goroutine left running would
	// outlive the wait below; the holder heartbeats fast.
	slow := rtJobType(t, c, svc, rtPolicy(time.Minute, 2*time.Minute))
	fast := rtJobType(t, c, svc, rtPolicy(20*time.Millisecond, 10*time.Second))
	rtAdmit(t, slow, "warm-up") // opens the bucket
	baseline, _ := clientGoroutines()

	w, err := NewWatcher(store)
	require.NoError(t, err)
	r := rtRunner(t, slow, &RunnerConfig{Watcher: w})
	ctx := context.Background()
	_, err = r.Run(ctx, rtAdmit(t, slow, "ok"), rtPayload, ok)
	require.NoError(t, err)
	_, err = r.Run(ctx, rtAdmit(t, slow, "fails"), rtPayload, func(context.Context, Lease) error { return errInjected })
	assert.ErrorIs(t, err, errInjected)
	func() {
		defer func() { _ = recover() }()
		_, _ = r.Run(ctx, rtAdmit(t, slow, "panics"), rtPayload, func(context.Context, Lease) error { panic("x") })
	}()

	// A waiter woken by a release, while the holder heartbeats.
	holderIn, holderOut := make(chan struct{}), make(chan struct{})
	holder, waiter := rtAdmit(t, fast, "holder"), rtAdmit(t, slow, "waiter")
	errs := make(chan error, 2)
	var wg sync.WaitGroup
	rf := rtRunner(t, fast, &RunnerConfig{Watcher: w})
	wg.Go(func() {
		_, err := rf.Run(ctx, holder, rtPayload, func(context.Context, Lease) error {
			close(holderIn)
			<-holderOut
			return nil
		})
		errs <- err
	})
	recv(t, holderIn, "the holder to run")
	blocked := make(chan Acquisition, 1)
	rw := rtRunner(t, slow, &RunnerConfig{Watcher: w, OnBlocked: signalTo(blocked)})
	wg.Go(func() {
		_, err := rw.Run(ctx, waiter, rtPayload, ok)
		errs <- err
	})
	recv(t, blocked, "the waiter to block")
	time.Sleep(3 * fast.Policy().HeartbeatInterval) // a few heartbeats
	close(holderOut)
	wg.Wait()
	require.NoError(t, <-errs)
	require.NoError(t, <-errs)

	// A run cancelled while it waits.
	lease := rtAcquire(t, slow, "holder-2")
	wctx, cancel := context.WithCancel(ctx)
	rc := rtRunner(t, slow, &RunnerConfig{Watcher: w, OnBlocked: func(string, Acquisition) { cancel() }})
	_, err = rc.Run(wctx, rtAdmit(t, slow, "cancelled"), rtPayload, ok)
	assert.ErrorIs(t, err, context.Canceled)
	_, err = slow.Release(ctx, lease)
	require.NoError(t, err)

	w.mu.Lock()
	for service, sw := range w.watches {
		assert.Empty(t, sw.subs, "service %s: subscriptions left after the runs", service)
	}
	w.mu.Unlock()
	w.Close()
	settleGoroutines(t, baseline)
}

// benchReleaseSpread is the range of the random pause between a waiter
// blocking and the release, so that releases fall anywhere in a poll period
// as they do in real life.
const benchReleaseSpread = 50 * time.Millisecond

// benchWake measures the time from the release of a slot to the moment the
// job blocked on it runs, with the given runner configuration.
func benchWake(b *testing.B, watch bool, recheck time.Duration) {
	store, _ := rtNATS(b)
	jt := rtJobType(b, cCoordinator(b, store, nil), rtService(), rtPolicy(time.Minute, time.Hour))
	cfg := &RunnerConfig{RecheckInterval: recheck}
	if watch {
		w, err := NewWatcher(store)
		require.NoError(b, err)
		b.Cleanup(w.Close)
		cfg.Watcher = w
	}
	blocked := make(chan Acquisition, 1)
	cfg.OnBlocked = signalTo(blocked)
	r := rtRunner(b, jt, cfg)
	ctx := context.Background()
	var (
		total time.Duration
		n     int
	)
	b.ReportAllocs()
	for ; b.Loop(); n++ {
		holder := rtAcquire(b, jt, "holder-"+strconv.Itoa(n))
		ran := make(chan time.Time, 1)
		done := make(chan error, 1)
		waiter := rtAdmit(b, jt, "waiter-"+strconv.Itoa(n))
		go func() {
			_, err := r.Run(ctx, waiter, rtPayload, func(context.Context, Lease) error {
				ran <- time.Now()
				return nil
			})
			done <- err
		}()
		recv(b, blocked, "the waiter to block")
		time.Sleep(mrand.N(benchReleaseSpread))
		released := time.Now()
		if _, err := jt.Release(ctx, holder); err != nil {
			b.Fatal(err)
		}
		total += recv(b, ran, "the waiter to run").Sub(released)
		if err := recv(b, done, "the waiter's run to end"); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(total.Microseconds())/float64(n)/1000, "ms/wake")
}

// BenchmarkWakeOnRelease: a blocked Run woken by the KV watch.
func BenchmarkWakeOnRelease(b *testing.B) { benchWake(b, true, time.Hour) }

// BenchmarkWakePolling: a blocked Run that polls every 50ms, the alternative
// without a watch.
func BenchmarkWakePolling(b *testing.B) { benchWake(b, false, 50*time.Millisecond) }

// TestRunLeaseLostWhenCoordinatorClockStops: when the coordinator's clock
// stops (or steps back) while renewals fail, the runner still gives the
// lease up once TTL has passed on its own monotonic clock; before, it
// measured the lease on the coordinator's clock and held on forever.
func TestRunLeaseLostWhenCoordinatorClockStops(t *testing.T) {
	t.Parallel()
	store, faults := newFaultyStore(NewMemoryStore())
	stopped := time.Now()
	c := cCoordinator(t, store, &Config{Now: func() time.Time { return stopped }})
	jt := rtJobType(t, c, rtService(), rtPolicy(100*time.Millisecond, 300*time.Millisecond))
	r := rtRunner(t, jt, nil)

	var cause error
	res, err := r.Run(context.Background(), rtAdmit(t, jt, "job-1"), rtPayload, func(ctx context.Context, lease Lease) error {
		faults.failing.Store(true)
		defer faults.failing.Store(false)
		select {
		case <-ctx.Done():
			cause = context.Cause(ctx)
			return nil
		case <-time.After(rtWait):
			return errors.New("handler not cancelled while renewals failed")
		}
	})
	require.NoError(t, err)
	assert.ErrorIs(t, cause, ErrLeaseLost)
	assert.ErrorIs(t, res.LeaseLost, ErrLeaseLost)
}
