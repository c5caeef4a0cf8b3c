package jobkeys

import (
	"context"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// rtPolicy keys jobs by tenant, one active per tenant, up to 8 waiting.
func rtPolicy(interval, ttl time.Duration) Policy {
	return Policy{Key: []string{"/tenant"}, MaxActive: 1, MaxQueuedPerKey: 8, HeartbeatInterval: interval, HeartbeatTTL: ttl}
}

var rtPayload = []byte(`{"tenant":"acme"}`)

// rtJob admits job id under svc and returns the request that acquires it.
func rtJob(t testing.TB, c *KeyCoordinator, svc, id string, p Policy) AcquireRequest {
	t.Helper()
	adm, err := c.Admit(context.Background(), AdmitRequest{Service: svc, JobType: "render", JobID: id, Payload: rtPayload, Policy: p})
	jkNoErr(t, err)
	if adm.Kind != KindAccepted {
		t.Fatalf("admit %s: %s (%s)", id, adm.Kind, adm.Reason)
	}
	return AcquireRequest{Service: svc, JobType: "render", JobID: id, Payload: rtPayload, Policy: p}
}

// rtState reads the key state of rtPayload's key; nil when absent.
func rtState(t testing.TB, store Store, svc string, p Policy) *KeyState {
	t.Helper()
	key, err := DeriveKey(svc, "render", rtPayload, p.Key)
	jkNoErr(t, err)
	value, _, err := store.Get(context.Background(), svc, key.KVKey)
	if errors.Is(err, ErrKeyNotFound) {
		return nil
	}
	jkNoErr(t, err)
	st, err := ParseState(value)
	jkNoErr(t, err)
	return st
}

// signalTo returns an OnBlocked hook that signals ch without blocking.
func signalTo(ch chan Acquisition) func(AcquireRequest, Acquisition) {
	return func(_ AcquireRequest, a Acquisition) {
		select {
		case ch <- a:
		default:
		}
	}
}

func rtRunner(t testing.TB, c *KeyCoordinator, cfg *RunnerConfig) *Runner {
	t.Helper()
	r, err := NewRunner(c, cfg)
	jkNoErr(t, err)
	return r
}

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
			svc := rtService()
			p := rtPolicy(time.Minute, 10*time.Minute)
			c := cCoordinator(t, store, nil)
			r := rtRunner(t, c, nil)
			req := rtJob(t, c, svc, "job-1", p)
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
				res, err = r.Run(ctx, req, func(ctx context.Context, lease Lease) error {
					held = rtState(t, store, svc, p)
					return tc.handler(ctx, cancel)
				})
			}()

			if held == nil || len(held.Active) != 1 || held.Active[0].JobID != "job-1" || len(held.Queued) != 0 {
				t.Fatalf("state while the handler ran: %+v, want job-1 active and nothing queued", held)
			}
			if tc.panics {
				if panicVal != errBoom {
					t.Fatalf("recovered %v, want the handler's panic value re-panicked", panicVal)
				}
			} else {
				if panicVal != nil {
					t.Fatalf("Run panicked: %v", panicVal)
				}
				if tc.wantErr == nil && err != nil || tc.wantErr != nil && !errors.Is(err, tc.wantErr) {
					t.Fatalf("Run error %v, want %v", err, tc.wantErr)
				}
				rtEqual(t, res.Release, KindReleased)
				rtEqual(t, res.Lease.JobID, "job-1")
				rtEqual(t, res.Waited, 0)
				jkCheck(t, res.LeaseLost == nil, "lease lost: %v", res.LeaseLost)
			}
			if st := rtState(t, store, svc, p); st != nil {
				t.Fatalf("state after the run: %+v, want the key deleted", st)
			}
		})
	}
}

// TestRunHeartbeats: a handler that runs for several lease lifetimes keeps
// its slot, because the runner renews it.
func TestRunHeartbeats(t *testing.T) {
	t.Parallel()
	store, _ := rtNATS(t)
	svc := rtService()
	// A TTL far above the interval, so that a loaded machine does not lose
	// the lease; the handler runs past the first expiry.
	p := rtPolicy(50*time.Millisecond, time.Second)
	c := cCoordinator(t, store, nil)
	r := rtRunner(t, c, nil)
	req := rtJob(t, c, svc, "job-1", p)
	res, err := r.Run(context.Background(), req, func(ctx context.Context, lease Lease) error {
		first := lease.LeaseExpiresAt
		deadline := time.Now().Add(rtWait)
		for {
			st := rtState(t, store, svc, p)
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
	jkNoErr(t, err)
	rtEqual(t, res.Release, KindReleased)
}

// TestRunLeaseTakenOver: a holder is taken over by a second coordinator
// whose clock is an hour ahead, so that it sees the lease expired; the first
// handler's context is cancelled with the lost
// lease cause, and the run reports a stale completion.
func TestRunLeaseTakenOver(t *testing.T) {
	t.Parallel()
	store, _ := rtNATS(t)
	svc := rtService()
	// The first holder's lease is long (renewal delays on a loaded machine
	// cannot expire it); the second coordinator's clock sees it expired.
	p := rtPolicy(100*time.Millisecond, 30*time.Second)
	first := cCoordinator(t, store, &Config{InstanceID: "first"})
	second := cCoordinator(t, store, &Config{InstanceID: "second", Now: func() time.Time { return time.Now().Add(time.Hour) }})
	r := rtRunner(t, first, nil)
	req1 := rtJob(t, first, svc, "job-1", p)
	req2 := rtJob(t, first, svc, "job-2", p)

	var (
		cause    error
		takeover Acquisition
	)
	res, err := r.Run(context.Background(), req1, func(ctx context.Context, lease Lease) error {
		var err error
		takeover, err = second.Acquire(context.Background(), req2)
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

	if takeover.Kind != KindAcquired || len(takeover.Stale) != 1 || takeover.Stale[0].JobID != "job-1" {
		t.Fatalf("takeover: %+v, want job-2 acquired with job-1's slot reported stale", takeover)
	}
	if !errors.Is(cause, ErrLeaseLost) || !strings.Contains(cause.Error(), "taken over") {
		t.Fatalf("handler context cause %v, want one wrapping ErrLeaseLost that says the slot was taken over", cause)
	}
	jkErrorIs(t, err, ErrLeaseLost)       // the handler's own error
	jkErrorIs(t, err, ErrStaleCompletion) // and the release's finding
	rtEqual(t, res.Release, KindStaleCompletion)
	jkCheck(t, errors.Is(res.LeaseLost, ErrLeaseLost), "RunResult.LeaseLost %v", res.LeaseLost)
	st := rtState(t, store, svc, p)
	if st == nil || len(st.Active) != 1 || st.Active[0].JobID != "job-2" {
		t.Fatalf("state after the run: %+v, want job-2's slot untouched", st)
	}
}

// faultyStore fails updates while failing is set.
type faultyStore struct {
	Store
	failing atomic.Bool
	failed  atomic.Int64
}

var errInjected = errors.New("injected store fault")

func (s *faultyStore) Update(ctx context.Context, service, key string, value []byte, revision uint64) (uint64, error) {
	if s.failing.Load() {
		s.failed.Add(1)
		return 0, errInjected
	}
	return s.Store.Update(ctx, service, key, value, revision)
}

// TestRunLeaseLostWhenRenewalsFail: when no renewal succeeds until the lease
// expires, the handler is cancelled with the lost lease cause, which carries
// the last renewal error.
func TestRunLeaseLostWhenRenewalsFail(t *testing.T) {
	t.Parallel()
	nats, _ := rtNATS(t)
	store := &faultyStore{Store: nats}
	svc := rtService()
	p := rtPolicy(100*time.Millisecond, 300*time.Millisecond)
	c := cCoordinator(t, store, nil)
	r := rtRunner(t, c, nil)
	req := rtJob(t, c, svc, "job-1", p)

	var cause error
	res, err := r.Run(context.Background(), req, func(ctx context.Context, lease Lease) error {
		store.failing.Store(true)
		defer store.failing.Store(false) // let the release through
		select {
		case <-ctx.Done():
			cause = context.Cause(ctx)
			return nil // the work finished anyway
		case <-time.After(rtWait):
			return errors.New("handler not cancelled while renewals failed")
		}
	})
	jkNoErr(t, err)
	if !errors.Is(cause, ErrLeaseLost) || !errors.Is(cause, errInjected) {
		t.Fatalf("cause %v, want one wrapping ErrLeaseLost and the renewal error", cause)
	}
	jkCheck(t, store.failed.Load() >= 1, "%d failed renewals, want at least one before giving up", store.failed.Load())
	jkCheck(t, errors.Is(res.LeaseLost, ErrLeaseLost), "RunResult.LeaseLost %v", res.LeaseLost)
	// Nobody took the slot over, so the release found it.
	rtEqual(t, res.Release, KindReleased)
	if st := rtState(t, nats, svc, p); st != nil {
		t.Fatalf("state after the run: %+v, want the key deleted", st)
	}
}

// TestRunWakesOnRelease: a blocked Run wakes on the release of the slot it
// waits for, long before its re-check timer or the holder's lease expiry
// would have woken it.
func TestRunWakesOnRelease(t *testing.T) {
	t.Parallel()
	store, _ := rtNATS(t)
	svc := rtService()
	p := rtPolicy(time.Minute, time.Hour)
	c := cCoordinator(t, store, nil)
	w, err := NewWatcher(store)
	jkNoErr(t, err)
	defer w.Close()
	blocked := make(chan Acquisition, 1)
	var blockedCalls atomic.Int64
	r := rtRunner(t, c, &RunnerConfig{Watcher: w, RecheckInterval: time.Hour, OnBlocked: func(req AcquireRequest, a Acquisition) {
		blockedCalls.Add(1)
		rtEqual(t, req.JobID, "waiter")
		signalTo(blocked)(req, a)
	}})

	holder, err := c.Acquire(context.Background(), rtJob(t, c, svc, "holder", p))
	jkNoErr(t, err)
	rtEqual(t, holder.Kind, KindAcquired)
	req := rtJob(t, c, svc, "waiter", p)

	type result struct {
		res RunResult
		err error
		at  time.Time
	}
	done := make(chan result, 1)
	go func() {
		res, err := r.Run(context.Background(), req, func(context.Context, Lease) error { return nil })
		done <- result{res, err, time.Now()}
	}()
	a := recv(t, blocked, "the waiter to block")
	if a.Reason != ReasonActiveLimit {
		t.Fatalf("blocked with %q, want %q", a.Reason, ReasonActiveLimit)
	}
	// Renewals change the key too: the waiter wakes, finds the slot still
	// taken and waits again.
	for range 3 {
		ren, err := c.Renew(context.Background(), RenewRequest{Lease: holder.Lease})
		jkNoErr(t, err)
		rtEqual(t, ren.Kind, KindRenewed)
	}
	jkCheck(t, !pending(done), "the waiter ran while the holder held the slot")
	released := time.Now()
	rel, err := c.Release(context.Background(), ReleaseRequest{Lease: holder.Lease})
	jkNoErr(t, err)
	rtEqual(t, rel.Kind, KindReleased)

	got := recv(t, done, "the waiter to run after the release (re-check timer and lease: 1h)")
	jkNoErr(t, got.err)
	rtEqual(t, got.res.Release, KindReleased)
	jkCheck(t, got.res.Waited > 0, "Waited %v", got.res.Waited)
	rtEqual(t, blockedCalls.Load(), 1)
	t.Logf("woke %v after the release", got.at.Sub(released))
}

// TestRunWaitsForStaleSlot: a crashed holder writes nothing when its lease
// expires; a blocked Run still looks again at the expiry, takes the slot
// over and reports the stale slot.
func TestRunWaitsForStaleSlot(t *testing.T) {
	t.Parallel()
	store, _ := rtNATS(t)
	svc := rtService()
	p := rtPolicy(100*time.Millisecond, 300*time.Millisecond)
	c := cCoordinator(t, store, nil)
	w, err := NewWatcher(store)
	jkNoErr(t, err)
	defer w.Close()
	var stale []ActiveSlot
	r := rtRunner(t, c, &RunnerConfig{Watcher: w, RecheckInterval: time.Hour,
		OnStale: func(_ Lease, s []ActiveSlot) { stale = s }})

	crashed, err := c.Acquire(context.Background(), rtJob(t, c, svc, "crashed", p))
	jkNoErr(t, err)
	rtEqual(t, crashed.Kind, KindAcquired)
	req := rtJob(t, c, svc, "next", p)

	ctx, cancel := context.WithTimeout(context.Background(), rtWait)
	defer cancel()
	res, err := r.Run(ctx, req, func(context.Context, Lease) error { return nil })
	jkNoErr(t, err)
	if len(res.Stale) != 1 || res.Stale[0].JobID != "crashed" {
		t.Fatalf("RunResult.Stale %+v, want the crashed job's slot", res.Stale)
	}
	rtEqual(t, stale, res.Stale)
	jkCheck(t, res.Waited > 0, "Waited %v", res.Waited)
}

func TestTryRunBlocked(t *testing.T) {
	t.Parallel()
	store := NewMemoryStore()
	svc := rtService()
	p := rtPolicy(time.Minute, time.Hour)
	c := cCoordinator(t, store, nil)
	r := rtRunner(t, c, &RunnerConfig{MaxWait: 100 * time.Millisecond, RecheckInterval: 10 * time.Millisecond})
	holder, err := c.Acquire(context.Background(), rtJob(t, c, svc, "holder", p))
	jkNoErr(t, err)
	rtEqual(t, holder.Kind, KindAcquired)
	req := rtJob(t, c, svc, "waiter", p)
	ran := false
	handler := func(context.Context, Lease) error { ran = true; return nil }

	var be *BlockedError
	res, err := r.TryRun(context.Background(), req, handler)
	if !errors.As(err, &be) || !errors.Is(err, ErrBlocked) || be.Acquisition.Reason != ReasonActiveLimit || be.JobID != "waiter" {
		t.Fatalf("TryRun: %v, want a BlockedError for the active limit", err)
	}
	rtEqual(t, res, RunResult{})

	start := time.Now()
	_, err = r.Run(context.Background(), req, handler)
	jkErrorIs(t, err, ErrBlocked)
	jkCheck(t, time.Since(start) >= 100*time.Millisecond, "Run gave up after %v, before MaxWait", time.Since(start))

	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err = rtRunner(t, c, nil).Run(ctx, req, handler)
	if err != context.DeadlineExceeded {
		t.Fatalf("Run with an expiring context: %v, want context.DeadlineExceeded unchanged", err)
	}

	notQueued := req
	notQueued.JobID = "never-admitted"
	_, err = rtRunner(t, c, nil).Run(context.Background(), notQueued, handler)
	if !errors.As(err, &be) || be.Acquisition.Reason != ReasonNotQueued {
		t.Fatalf("Run of a job that is not queued: %v, want a BlockedError at once", err)
	}
	jkCheck(t, !ran, "a blocked handler ran")
	if st := rtState(t, store, svc, p); st == nil || len(st.Queued) != 1 || st.Queued[0].JobID != "waiter" {
		t.Fatalf("state %+v, want the waiter still queued", st)
	}
}

func TestRunnerConfigErrors(t *testing.T) {
	t.Parallel()
	c := cCoordinator(t, NewMemoryStore(), nil)
	for _, tc := range []struct {
		cfg   *RunnerConfig
		field string
	}{
		{&RunnerConfig{RecheckInterval: time.Microsecond}, "RecheckInterval"},
		{&RunnerConfig{MaxWait: -1}, "MaxWait"},
		{&RunnerConfig{ReleaseTimeout: -1}, "ReleaseTimeout"},
	} {
		_, err := NewRunner(c, tc.cfg)
		if !errors.Is(err, ErrInvalidRequest) || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("NewRunner(%+v): %v, want an error naming %s", tc.cfg, err, tc.field)
		}
	}
	_, err := NewRunner(nil, nil)
	jkErrorIs(t, err, ErrInvalidRequest)
	r := rtRunner(t, c, nil)
	_, err = r.Run(context.Background(), AcquireRequest{}, nil)
	jkErrorIs(t, err, ErrInvalidRequest)
	_, err = r.Run(context.Background(), AcquireRequest{Service: "svc", JobType: "t", JobID: "j", Payload: rtPayload, Policy: rtPolicy(0, 0)}, func(context.Context, Lease) error { return nil })
	jkErrorIs(t, err, ErrBlocked) // not queued
}

// TestRunNoGoroutineLeak is not parallel: it counts the process's
// goroutines after runs that return, fail, panic, wait and lose their lease.
func TestRunNoGoroutineLeak(t *testing.T) {
	store, _ := rtNATS(t)
	svc := rtService()
	// Slow heartbeats, so that a heartbeat goroutine left running would
	// outlive the wait below; the holder heartbeats fast.
	p := rtPolicy(time.Minute, 2*time.Minute)
	fast := rtPolicy(20*time.Millisecond, 10*time.Second)
	c := cCoordinator(t, store, nil)
	rtJob(t, c, svc, "warm-up", p) // opens the bucket
	baseline, _ := clientGoroutines()

	w, err := NewWatcher(store)
	jkNoErr(t, err)
	r := rtRunner(t, c, &RunnerConfig{Watcher: w})
	ctx := context.Background()
	_, err = r.Run(ctx, rtJob(t, c, svc, "ok", p), func(context.Context, Lease) error { return nil })
	jkNoErr(t, err)
	_, err = r.Run(ctx, rtJob(t, c, svc, "fails", p), func(context.Context, Lease) error { return errInjected })
	jkErrorIs(t, err, errInjected)
	func() {
		defer func() { _ = recover() }()
		_, _ = r.Run(ctx, rtJob(t, c, svc, "panics", p), func(context.Context, Lease) error { panic("x") })
	}()

	// A waiter woken by a release, while the holder heartbeats.
	holderIn, holderOut := make(chan struct{}), make(chan struct{})
	holderReq, waiterReq := rtJob(t, c, svc, "holder", fast), rtJob(t, c, svc, "waiter", p)
	errs := make(chan error, 2)
	var wg sync.WaitGroup
	wg.Go(func() {
		_, err := r.Run(ctx, holderReq, func(context.Context, Lease) error {
			close(holderIn)
			<-holderOut
			return nil
		})
		errs <- err
	})
	recv(t, holderIn, "the holder to run")
	blocked := make(chan Acquisition, 1)
	rw := rtRunner(t, c, &RunnerConfig{Watcher: w, OnBlocked: signalTo(blocked)})
	wg.Go(func() {
		_, err := rw.Run(ctx, waiterReq, func(context.Context, Lease) error { return nil })
		errs <- err
	})
	recv(t, blocked, "the waiter to block")
	time.Sleep(3 * fast.HeartbeatInterval) // a few heartbeats
	close(holderOut)
	wg.Wait()
	jkNoErr(t, <-errs)
	jkNoErr(t, <-errs)

	// A run cancelled while it waits.
	holder, err := c.Acquire(ctx, rtJob(t, c, svc, "holder-2", p))
	jkNoErr(t, err)
	wctx, cancel := context.WithCancel(ctx)
	rc := rtRunner(t, c, &RunnerConfig{Watcher: w, OnBlocked: func(AcquireRequest, Acquisition) { cancel() }})
	_, err = rc.Run(wctx, rtJob(t, c, svc, "cancelled", p), func(context.Context, Lease) error { return nil })
	jkErrorIs(t, err, context.Canceled)
	_, err = c.Release(ctx, ReleaseRequest{Lease: holder.Lease})
	jkNoErr(t, err)

	w.mu.Lock()
	for service, sw := range w.watches {
		jkCheck(t, len(sw.subs) == 0, "service %s: subscriptions left after the runs: %v", service, sw.subs)
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
	svc := rtService()
	p := rtPolicy(time.Minute, time.Hour)
	c := cCoordinator(b, store, nil)
	cfg := &RunnerConfig{RecheckInterval: recheck}
	if watch {
		w, err := NewWatcher(store)
		jkNoErr(b, err)
		b.Cleanup(w.Close)
		cfg.Watcher = w
	}
	blocked := make(chan Acquisition, 1)
	cfg.OnBlocked = signalTo(blocked)
	r := rtRunner(b, c, cfg)
	ctx := context.Background()
	var (
		total time.Duration
		n     int
	)
	b.ReportAllocs()
	for ; b.Loop(); n++ {
		i := n
		holder, err := c.Acquire(ctx, rtJob(b, c, svc, "holder-"+strconv.Itoa(i), p))
		if err != nil || holder.Kind != KindAcquired {
			b.Fatalf("holder: %+v, %v", holder, err)
		}
		ran := make(chan time.Time, 1)
		done := make(chan error, 1)
		req := rtJob(b, c, svc, "waiter-"+strconv.Itoa(i), p)
		go func() {
			_, err := r.Run(ctx, req, func(context.Context, Lease) error {
				ran <- time.Now()
				return nil
			})
			done <- err
		}()
		recv(b, blocked, "the waiter to block")
		time.Sleep(mrand.N(benchReleaseSpread))
		released := time.Now()
		if _, err := c.Release(ctx, ReleaseRequest{Lease: holder.Lease}); err != nil {
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
