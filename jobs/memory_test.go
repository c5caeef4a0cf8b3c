package jobs_test

import (
	"context"
	"encoding/json"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jobkeys/jobkeys/internal/leakcheck"
	"github.com/jobkeys/jobkeys/jobs"
	"github.com/jobkeys/jobkeys/jobs/jobstest"
)

func TestMain(m *testing.M) { leakcheck.Main(m) }

func newMemoryStore(t *testing.T, cfg *jobs.Config) jobs.Store {
	s, err := jobs.NewMemoryStore(cfg)
	require.NoError(t, err)
	return s
}

func TestMemoryStoreConformance(t *testing.T) {
	t.Parallel()
	jobstest.Run(t, newMemoryStore)
}

// The zero MemoryStore is a usable empty store with the default config.
func TestMemoryStoreZeroValue(t *testing.T) {
	t.Parallel()
	var s jobs.MemoryStore
	ctx := context.Background()
	out, err := s.Enqueue(ctx, jobs.EnqueueRequest{ID: "j1", ChannelID: "c", Type: "t", Version: 1,
		TargetKey: "d", IdempotencyKey: "k", Fingerprint: "f"})
	require.NoError(t, err)
	assert.Equal(t, jobs.StatePending, out.Job.State)
	assert.WithinDuration(t, time.Now(), out.Job.CreatedAt, time.Hour, "the default clock is the system's")
	got, err := s.Claim(ctx, jobs.ClaimRequest{Owner: "w", Count: 1, TTL: time.Minute})
	require.NoError(t, err)
	require.Len(t, got, 1)
	p, err := s.List(ctx, jobs.ListRequest{ChannelID: "c"})
	require.NoError(t, err)
	assert.Empty(t, p.Jobs[0].Subject, "no Subject function: no subjects")
	require.NoError(t, s.DeleteChannel(ctx, "c"))
}

// The config's callbacks run outside the store's lock: a guard, registry
// or subject function that calls the store does not deadlock.
func TestMemoryStoreCallbacksMayCallTheStore(t *testing.T) {
	t.Parallel()
	var s *jobs.MemoryStore
	ctx := context.Background()
	var inside atomic.Bool
	reentrant := func() {
		if !inside.CompareAndSwap(false, true) {
			return // one level deep: the inner Get calls the registry too
		}
		defer inside.Store(false)
		_, err := s.Get(ctx, "c", "nope")
		assert.ErrorIs(t, err, jobs.ErrNotFound)
	}
	s, err := jobs.NewMemoryStore(&jobs.Config{
		Guard:    func(context.Context) error { reentrant(); return nil },
		Channels: reentrantRegistry{reentrant},
		Subject:  func(string, json.RawMessage) string { reentrant(); return "s" },
	})
	require.NoError(t, err)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, err := s.Enqueue(ctx, jobs.EnqueueRequest{ID: "j1", ChannelID: "c", Type: "t", Version: 1,
			TargetKey: "d", IdempotencyKey: "k", Fingerprint: "f"})
		assert.NoError(t, err)
		_, err = s.Cancel(ctx, jobs.CancelRequest{ChannelID: "c", JobID: "j1"})
		assert.NoError(t, err)
		p, err := s.List(ctx, jobs.ListRequest{ChannelID: "c"})
		assert.NoError(t, err)
		assert.Equal(t, "s", p.Jobs[0].Subject)
	}()
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatal("a callback calling the store deadlocked")
	}
}

type reentrantRegistry struct{ call func() }

func (r reentrantRegistry) ChannelExists(context.Context, string) (bool, error) {
	r.call()
	return true, nil
}
func (r reentrantRegistry) ChannelActive(context.Context, string) (bool, error) {
	r.call()
	return true, nil
}
