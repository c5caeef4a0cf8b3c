package jobkeys

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fakeConflictStore fails every Update with a conflict that writes
// nothing while armed, and counts them.
type fakeConflictStore struct {
	*MemoryStore
	armed atomic.Bool
	fakes atomic.Int64
}

func (s *fakeConflictStore) Update(ctx context.Context, service, key string, value []byte, revision uint64) (uint64, error) {
	if s.armed.Load() {
		s.fakes.Add(1)
		return 0, fmt.Errorf("%w: injected by the test", ErrRevisionConflict)
	}
	return s.MemoryStore.Update(ctx, service, key, value, revision)
}

// A release on a key the Watcher feeds (3c67174: it does not pause after a
// lost race there) whose lost races the watch never answers, since nothing
// was written: it falls back to a read after watchFallback each time, not
// a busy loop, and succeeds once the races stop, not held up by the key's
// backoff window (an hour here).
func TestFedReleaseLostRacesWithoutDelivery(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	mem := NewMemoryStore()
	st := &fakeConflictStore{MemoryStore: mem}
	c := cCoordinator(t, st, &Config{RetryBackoff: time.Hour, MaxRetryBackoff: time.Hour})
	w, err := NewWatcher(mem)
	require.NoError(t, err)
	t.Cleanup(w.Close)
	svc := jkService("nodeliver")
	p := Policy{Key: cPolicy().Key, MaxActive: 1, MaxQueuedPerKey: 4, HeartbeatInterval: time.Second, HeartbeatTTL: time.Minute}
	key := cKey(t, svc)

	// A waiter's subscription feeds the key's changes to c's entry.
	sub, err := w.subscribeWaiter(ctx, svc, key.KVKey, "other", p.MaxActive, c.keys)
	require.NoError(t, err)
	defer sub.Close()
	for _, id := range []string{"j1", "j2"} { // j2 stays queued: the release is an Update
		_, err = c.Admit(ctx, cAdmit(svc, id, p))
		require.NoError(t, err)
	}
	acq, err := c.Acquire(ctx, cAcquire(svc, "j1", p, false))
	require.NoError(t, err)
	require.Equal(t, KindAcquired, acq.Kind)
	e := c.keys.entry(key.KVKey)
	require.NotNil(t, e)
	require.Eventually(t, e.fed, rtWait, time.Millisecond, "the entry is never fed")

	const racing = 500 * time.Millisecond
	st.armed.Store(true)
	time.AfterFunc(racing, func() { st.armed.Store(false) })
	rctx, cancel := context.WithTimeout(ctx, rtWait)
	defer cancel()
	start := time.Now()
	rel, err := c.Release(rctx, ReleaseRequest{Lease: acq.Lease})
	took := time.Since(start)
	require.NoError(t, err, "the release paused by the key's window (an hour) after %v", took)
	assert.Equal(t, KindReleased, rel.Kind)
	fakes := st.fakes.Load()
	t.Logf("%d lost races in %v", fakes, took)
	require.Positive(t, fakes, "the release never lost a race: the test did not test it")
	// One attempt per watchFallback at most (and the first at once), with
	// room for a loaded machine's late timers: not a loop without pauses.
	assert.LessOrEqual(t, fakes, int64(2+racing/watchFallback), "attempts while the races lasted")
}
