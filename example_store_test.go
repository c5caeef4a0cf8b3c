package jobkeys_test

import (
	"context"
	"fmt"
	"sync/atomic"

	"github.com/jobkeys/jobkeys"
)

// countedStore counts the writes of the store it wraps. It holds the
// store in an interface field, so it has the four Store methods only: it
// keeps an optional capability by implementing it, here the value size
// limit (without it a coordinator would admit jobs that could never take
// a slot in a full key). Batched writes, watches and listing it does not
// forward, so a coordinator over it writes one state per write, and a
// Watcher or Sweeper refuses it.
type countedStore struct {
	jobkeys.Store
	limit  jobkeys.ValueLimiter
	writes atomic.Int64
}

func (s *countedStore) Create(ctx context.Context, service, key string, value []byte) (uint64, error) {
	s.writes.Add(1)
	return s.Store.Create(ctx, service, key, value)
}

func (s *countedStore) Update(ctx context.Context, service, key string, value []byte, revision uint64) (uint64, error) {
	s.writes.Add(1)
	return s.Store.Update(ctx, service, key, value, revision)
}

func (s *countedStore) Delete(ctx context.Context, service, key string, revision uint64) error {
	s.writes.Add(1)
	return s.Store.Delete(ctx, service, key, revision)
}

// MaxValueSize implements jobkeys.ValueLimiter with the wrapped store's.
func (s *countedStore) MaxValueSize(ctx context.Context, service string) (int, error) {
	return s.limit.MaxValueSize(ctx, service)
}

// A store that wraps another keeps the optional capabilities it
// implements itself; the coordinator finds them by type assertion.
func ExampleStore_wrapper() {
	ctx := context.Background()
	mem := jobkeys.NewMemoryStore()
	st := &countedStore{Store: mem, limit: mem}

	var s jobkeys.Store = st
	_, limits := s.(jobkeys.ValueLimiter)
	_, batches := s.(jobkeys.BatchWriter)
	_, watches := s.(jobkeys.WatchableStore)
	fmt.Println("value limit:", limits, "batches:", batches, "watches:", watches)

	coord, err := jobkeys.NewCoordinator(st, &jobkeys.Config{InstanceID: "worker-1"})
	if err != nil {
		fmt.Println(err)
		return
	}
	jt, err := coord.JobType("billing", "sync", jobkeys.Policy{Key: []string{"tenant", "/tenant"}})
	if err != nil {
		fmt.Println(err)
		return
	}
	payload := []byte(`{"tenant":"acme"}`)
	if _, err := jt.Admit(ctx, "job-1", payload); err != nil {
		fmt.Println(err)
		return
	}
	acq, err := jt.Acquire(ctx, "job-1", payload)
	if err != nil {
		fmt.Println(err)
		return
	}
	if _, err := jt.Release(ctx, acq.Lease); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("writes:", st.writes.Load())
	// Output:
	// value limit: true batches: false watches: false
	// writes: 3
}
