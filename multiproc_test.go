package jobkeys

// Hot keys shared by several processes (issue 11): regression tests of what
// TestHotKeyTrace found, each with its processes on their own connections
// to one embedded server.

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jobkeys/jobkeys/internal/natstest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// raceHookStore runs a hook, once armed, before the next Update or Delete it
// is given: another process's write slipped in just before this one.
type raceHookStore struct {
	Store
	hook      atomic.Pointer[func()]
	conflicts atomic.Int64 // Updates and Deletes that lost their compare-and-swap
}

func (s *raceHookStore) count(err error) {
	if errors.Is(err, ErrRevisionConflict) {
		s.conflicts.Add(1)
	}
}

func (s *raceHookStore) valueLimit(ctx context.Context, service string) (int, error) {
	return s.Store.(valueLimiter).valueLimit(ctx, service)
}

func (s *raceHookStore) before() {
	if h := s.hook.Swap(nil); h != nil {
		(*h)()
	}
}

func (s *raceHookStore) Update(ctx context.Context, service, key string, value []byte, revision uint64) (uint64, error) {
	s.before()
	rev, err := s.Store.Update(ctx, service, key, value, revision)
	s.count(err)
	return rev, err
}

func (s *raceHookStore) Delete(ctx context.Context, service, key string, revision uint64) error {
	s.before()
	err := s.Store.Delete(ctx, service, key, revision)
	s.count(err)
	return err
}

// workerProcess is one worker process of a multi-process test: its own
// connection, store, coordinator, job type and Watcher.
type workerProcess struct {
	store *NATSStore
	coord *KeyCoordinator
	jt    *JobType
	w     *Watcher
}

func newWorkerProcess(t *testing.T, s *server.Server, service string, policy Policy, wrap func(Store) Store, cfg *Config) *workerProcess {
	t.Helper()
	_, js := natstest.Connect(t, s)
	store, err := NewNATSStore(js, WithCreateBuckets(jetstream.MemoryStorage, 1))
	require.NoError(t, err)
	var cs Store = store
	if wrap != nil {
		cs = wrap(store)
	}
	coord, err := NewCoordinator(cs, cfg)
	require.NoError(t, err)
	jt, err := coord.JobType(service, benchJobType, policy)
	require.NoError(t, err)
	w, err := NewWatcher(store)
	require.NoError(t, err)
	t.Cleanup(w.Close)
	return &workerProcess{store: store, coord: coord, jt: jt, w: w}
}

// TestReleaseLostRaceAnsweredByWatch: a release that loses its
// compare-and-swap to another process's admission on a key its watch feeds
// retries once the watch delivers that admission, instead of pausing by the
// key's backoff window while it holds the slot (with RetryBackoff an hour,
// the pause would outlast the release's timeout).
func TestReleaseLostRaceAnsweredByWatch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := natstest.Run(t)
	service := rtService()
	policy := Policy{Key: benchPolicy.Key, MaxActive: 1, MaxQueuedPerKey: 8}
	payload := benchPayload(0)

	hs := &raceHookStore{}
	mine := newWorkerProcess(t, s, service, policy, func(st Store) Store { hs.Store = st; return hs },
		&Config{RetryBackoff: time.Hour, MaxRetryBackoff: time.Hour})
	other := newWorkerProcess(t, s, service, policy, nil, nil)
	r, err := NewRunner(mine.jt, &RunnerConfig{Watcher: mine.w, ReleaseTimeout: 20 * time.Second})
	require.NoError(t, err)
	kvKey := mustKey(t, mine.jt, payload).KVKey

	// The other process holds the slot, so that mine waits for it through
	// its Watcher and its entry of the key is fed.
	_, err = other.jt.Admit(ctx, "o1", payload)
	require.NoError(t, err)
	held, err := other.jt.Acquire(ctx, "o1", payload)
	require.NoError(t, err)
	require.Equal(t, KindAcquired, held.Kind)
	_, err = mine.jt.Admit(ctx, "m1", payload)
	require.NoError(t, err)

	done := make(chan struct{})
	var res RunResult
	var runErr error
	go func() {
		defer close(done)
		res, runErr = r.Run(ctx, "m1", payload, func(context.Context, Lease) error {
			// Just before the release, the other process admits a job.
			hook := func() {
				adm, err := other.jt.Admit(ctx, "o2", payload)
				assert.NoError(t, err)
				assert.Equal(t, KindAccepted, adm.Kind)
			}
			hs.hook.Store(&hook)
			return nil
		})
	}()
	awaitOneWaiter(t, mine.w, service, kvKey, "m1 never waited")
	rel, err := other.jt.Release(ctx, held.Lease)
	require.NoError(t, err)
	require.Equal(t, KindReleased, rel.Kind)

	<-done
	require.NoError(t, runErr, "the release lost its race and paused instead of retrying on the watched admission")
	assert.Equal(t, KindReleased, res.Release)
	assert.GreaterOrEqual(t, hs.conflicts.Load(), int64(1), "the release never lost a race: the test did not test it")

	state, _, err := other.coord.read(ctx, mustKey(t, other.jt, payload))
	require.NoError(t, err)
	require.NotNil(t, state)
	assert.Empty(t, state.Active, "m1's slot is released")
	if assert.Len(t, state.Queued, 1) {
		assert.Equal(t, "o2", state.Queued[0].JobID, "the admission that won the race is kept")
	}
}
