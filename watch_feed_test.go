package jobkeys

// Review of issue 11's watch feed and group commit: regression tests of
// the bugs found.

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestCoordinatorDeleteIgnoresOlderWatchedRevisions: once this coordinator
// deleted a key (the last release emptied it), a lagging watch feed that
// then delivers a revision from before the delete must not make that state
// the trusted, verified start of a waiting acquisition.
func TestCoordinatorDeleteIgnoresOlderWatchedRevisions(t *testing.T) {
	ctx := context.Background()
	store := NewMemoryStore()
	c, err := NewCoordinator(store, nil)
	require.NoError(t, err)
	jt, err := c.JobType(rtService(), benchJobType, benchPolicy)
	require.NoError(t, err)
	payload := benchPayload(0)
	key, err := jt.Key(payload)
	require.NoError(t, err)
	c.keys.attach(key.KVKey) // fed, as while a waiter waits
	defer c.keys.detach(key.KVKey)

	adm, err := jt.Admit(ctx, "j1", payload)
	require.NoError(t, err)
	require.Equal(t, KindAccepted, adm.Kind)
	acq, err := jt.Acquire(ctx, "j1", payload)
	require.NoError(t, err)
	require.Equal(t, KindAcquired, acq.Kind)
	_, rev, err := store.Get(ctx, key.Service, key.KVKey)
	require.NoError(t, err)
	busy := acq.State
	_, err = jt.Release(ctx, acq.Lease) // empties the key: a delete
	require.NoError(t, err)
	_, _, err = store.Get(ctx, key.Service, key.KVKey)
	require.ErrorIs(t, err, ErrKeyNotFound, "the release deleted the key")

	c.keys.watched(key.KVKey, busy, rev, true) // the lagging feed delivers the acquisition
	e := c.keys.pin(key.KVKey)
	defer c.keys.unpin(key.KVKey, e)
	s, ok := e.Begin(nil, true, false, true)
	if ok {
		assert.False(t, s.Verified && s.Rev <= rev, "start at revision %d verified although this coordinator deleted the key after it", s.Rev)
		assert.False(t, s.Watched && s.Rev <= rev, "start at revision %d watched although the key was deleted after it", s.Rev)
	}
}

// TestRunnerTryRunDoesNotTrustLaggingFeed: TryRun's answer is final (a
// *BlockedError goes back to the caller), so it must not rest on the state
// a lingering watch feed delivered last, which may be older than the call:
// a slot freed before TryRun started is found free.
func TestRunnerTryRunDoesNotTrustLaggingFeed(t *testing.T) {
	ctx := context.Background()
	mem := NewMemoryStore()
	p := newTwoProcesses(t, mem, mem)
	otherJT, w, r, payload := p.otherJT, p.w, p.r, p.payload
	for _, id := range []string{"h", "a", "x", "z"} {
		_, err := otherJT.Admit(ctx, id, payload)
		require.NoError(t, err)
	}
	held, err := otherJT.Acquire(ctx, "h", payload)
	require.NoError(t, err)
	require.Equal(t, KindAcquired, held.Kind)
	fed := func() bool { return p.fed(ctx, mem) }

	// This process waits on the key once: its feed lingers afterwards.
	done := make(chan error, 1)
	go func() {
		_, err := r.Run(ctx, "a", payload, func(context.Context, Lease) error { return nil })
		done <- err
	}()
	p.awaitWaiter(t)
	_, err = otherJT.Release(ctx, held.Lease)
	require.NoError(t, err)
	require.NoError(t, <-done)

	// Another process takes the slot; the feed delivers it.
	x, err := otherJT.Acquire(ctx, "x", payload)
	require.NoError(t, err)
	require.Equal(t, KindAcquired, x.Kind)
	require.Eventually(t, fed, rtWait, time.Millisecond, "the feed never delivered the other process's acquisition")
	// The watch lags: it delivers nothing while the Watcher is held.
	w.mu.Lock()
	unlocked := false
	defer func() {
		if !unlocked {
			w.mu.Unlock()
		}
	}()
	if !fed() {
		t.Skip("the lingering feed ended before the test used it (machine too slow)")
	}
	_, err = otherJT.Release(ctx, x.Lease)
	require.NoError(t, err)
	ran := false
	_, err = r.TryRun(ctx, "z", payload, func(context.Context, Lease) error { ran = true; return nil })
	w.mu.Unlock()
	unlocked = true
	var blocked *BlockedError
	if errors.As(err, &blocked) {
		t.Fatalf("TryRun blocked on the state the lagging feed held (%s), although the slot was freed before the call", blocked.Acquisition.Reason)
	}
	require.NoError(t, err)
	assert.True(t, ran, "the handler ran")
}

// TestRunnerRunFindsJobAdmittedBehindLaggingFeed: a job admitted (by
// another process) before Run started is queued; Run's first try must not
// answer ReasonNotQueued, which is final, from a lingering watch feed that
// has not delivered the admission yet.
func TestRunnerRunFindsJobAdmittedBehindLaggingFeed(t *testing.T) {
	ctx := context.Background()
	mem := NewMemoryStore()
	p := newTwoProcesses(t, mem, mem)
	otherJT, w, r, payload := p.otherJT, p.w, p.r, p.payload
	for _, id := range []string{"h", "a", "x"} {
		_, err := otherJT.Admit(ctx, id, payload)
		require.NoError(t, err)
	}
	held, err := otherJT.Acquire(ctx, "h", payload)
	require.NoError(t, err)
	require.Equal(t, KindAcquired, held.Kind)
	fed := func() bool { return p.fed(ctx, mem) }

	done := make(chan error, 1)
	go func() {
		_, err := r.Run(ctx, "a", payload, func(context.Context, Lease) error { return nil })
		done <- err
	}()
	p.awaitWaiter(t)
	_, err = otherJT.Release(ctx, held.Lease)
	require.NoError(t, err)
	require.NoError(t, <-done)
	require.Eventually(t, fed, rtWait, time.Millisecond, "the feed never delivered the key's latest change")

	// The watch lags: it delivers nothing while the Watcher is held.
	w.mu.Lock()
	unlocked := false
	defer func() {
		if !unlocked {
			w.mu.Unlock()
		}
	}()
	if !fed() {
		t.Skip("the lingering feed ended before the test used it (machine too slow)")
	}
	_, err = otherJT.Admit(ctx, "n", payload)
	require.NoError(t, err)
	x, err := otherJT.Acquire(ctx, "x", payload) // busy: n waits
	require.NoError(t, err)
	require.Equal(t, KindAcquired, x.Kind)
	ran := make(chan error, 1)
	go func() {
		_, err := r.Run(ctx, "n", payload, func(context.Context, Lease) error { return nil })
		ran <- err
	}()
	var err2 error
	select {
	case err2 = <-ran:
	case <-time.After(200 * time.Millisecond): // waiting, as it should
	}
	w.mu.Unlock()
	unlocked = true
	var blocked *BlockedError
	if errors.As(err2, &blocked) {
		t.Fatalf("Run gave up on a queued job: %s (the lagging feed had not delivered its admission)", blocked.Acquisition.Reason)
	}
	require.NoError(t, err2)
	_, err = otherJT.Release(ctx, x.Lease)
	require.NoError(t, err)
	require.NoError(t, <-ran, "the run of n")
}

// twoProcesses is a hot key's setting in the watch-feed tests: coordinator
// mine (on store, which may wrap mem) whose Runner waits through a Watcher
// on mem, and coordinator other on mem, as another process would; one job
// type with MaxActive 1, one payload and its key.
type twoProcesses struct {
	mine, other *KeyCoordinator
	jt, otherJT *JobType
	w           *Watcher
	r           *Runner
	service     string
	payload     []byte
	key         JobKey
}

func newTwoProcesses(t *testing.T, mem *MemoryStore, store Store) *twoProcesses {
	t.Helper()
	p := &twoProcesses{service: rtService(), payload: benchPayload(0)}
	policy := Policy{Key: benchPolicy.Key, MaxActive: 1, MaxQueuedPerKey: 8}
	var err error
	p.mine, err = NewCoordinator(store, nil)
	require.NoError(t, err)
	p.other, err = NewCoordinator(mem, nil)
	require.NoError(t, err)
	p.jt, err = p.mine.JobType(p.service, benchJobType, policy)
	require.NoError(t, err)
	p.otherJT, err = p.other.JobType(p.service, benchJobType, policy)
	require.NoError(t, err)
	p.w, err = NewWatcher(mem)
	require.NoError(t, err)
	t.Cleanup(p.w.Close)
	p.r, err = NewRunner(p.jt, &RunnerConfig{Watcher: p.w, RecheckInterval: time.Minute})
	require.NoError(t, err)
	p.key = mustKey(t, p.jt, p.payload)
	return p
}

// awaitWaiter waits until one Runner waits on the key through p's Watcher.
func (p *twoProcesses) awaitWaiter(t *testing.T) {
	t.Helper()
	awaitOneWaiter(t, p.w, p.service, p.key.KVKey, "the run never waited")
}

// awaitOneWaiter waits until exactly one waiter waits on kvKey through w;
// msg says what failed if none does.
func awaitOneWaiter(t *testing.T, w *Watcher, service, kvKey, msg string) {
	t.Helper()
	awaitWaiters(t, w, service, kvKey, 1, msg)
}

// fed reports whether mine's entry for the key holds, trusted, the
// revision mem stores.
func (p *twoProcesses) fed(ctx context.Context, mem *MemoryStore) bool {
	_, want, err := mem.Get(ctx, p.service, p.key.KVKey)
	if err != nil {
		return false
	}
	e := p.mine.keys.entry(p.key.KVKey)
	if e == nil {
		return false
	}
	m := e.Marks()
	return m.WatchRev >= want && m.Trusted
}
