package jobkeys

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
)

// This file holds MemoryStore's optional capabilities: watching and listing
// keys.

var (
	_ WatchableStore = (*MemoryStore)(nil)
	_ ListableStore  = (*MemoryStore)(nil)
)

// memoryWatcher is a hook for watches over a MemoryStore; see notify.
type memoryWatcher struct {
	service string
	fn      func(key string, value []byte, rev uint64, deleted bool)
}

// notify tells watchers of service about a change. Called with m.mu held;
// watcher functions must not block or call back into the store.
func (m *MemoryStore) notify(service, key string, value []byte, rev uint64, deleted bool) {
	for _, w := range m.watchers {
		if w.service == service {
			w.fn(key, value, rev, deleted)
		}
	}
}

// WatchKeys implements [WatchableStore]. Changes are queued in memory, so a slow
// changed function never holds up writers.
func (m *MemoryStore) WatchKeys(ctx context.Context, service, jobType string, changed func(kvKey string)) (<-chan struct{}, error) {
	prefix, err := keyFilter(service, jobType)
	if err != nil {
		return nil, err
	}
	if changed == nil {
		return nil, fmt.Errorf("%w: changed function is nil", ErrInvalidRequest)
	}
	return m.watch(ctx, service, prefix, func(c ValueChange) { changed(c.KVKey) })
}

var _ ValueWatcher = (*MemoryStore)(nil)

// WatchValues implements ValueWatcher.
func (m *MemoryStore) WatchValues(ctx context.Context, service string, changed func(ValueChange)) (<-chan struct{}, error) {
	prefix, err := keyFilter(service, "")
	if err != nil {
		return nil, err
	}
	return m.watch(ctx, service, prefix, changed)
}

// watch reports the changes of service's keys under prefix to changed.
func (m *MemoryStore) watch(ctx context.Context, service, prefix string, changed func(ValueChange)) (<-chan struct{}, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	q := &keyQueue{signal: make(chan struct{}, 1)}
	mw := &memoryWatcher{service: service, fn: func(key string, value []byte, rev uint64, deleted bool) {
		if strings.HasPrefix(key, prefix) {
			// value may be the writer's buffer: keep a copy.
			q.push(ValueChange{KVKey: key, Value: append([]byte(nil), value...), Revision: rev, Deleted: deleted})
		}
	}}
	m.mu.Lock()
	m.watchers = append(m.watchers, mw)
	m.mu.Unlock()

	ended := make(chan struct{})
	go func() {
		defer close(ended)
		defer func() {
			m.mu.Lock()
			m.watchers = slices.DeleteFunc(m.watchers, func(x *memoryWatcher) bool { return x == mw })
			m.mu.Unlock()
		}()
		for {
			select {
			case <-ctx.Done():
				return
			case <-q.signal:
			}
			for _, c := range q.take() {
				if ctx.Err() != nil {
					return
				}
				changed(c)
			}
		}
	}()
	return ended, nil
}

// keyQueue is an unbounded FIFO of changes between a store's writers and a
// watch goroutine.
type keyQueue struct {
	mu      sync.Mutex
	changes []ValueChange
	signal  chan struct{} // capacity 1: "changes is not empty"
}

func (q *keyQueue) push(c ValueChange) {
	q.mu.Lock()
	q.changes = append(q.changes, c)
	q.mu.Unlock()
	select {
	case q.signal <- struct{}{}:
	default:
	}
}

func (q *keyQueue) take() []ValueChange {
	q.mu.Lock()
	changes := q.changes
	q.changes = nil
	q.mu.Unlock()
	return changes
}

// ListKeys implements [ListableStore].
func (m *MemoryStore) ListKeys(ctx context.Context, service, jobType string) ([]string, error) {
	prefix, err := keyFilter(service, jobType)
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	m.mu.Lock()
	keys := make([]string, 0, len(m.buckets[service]))
	for k, e := range m.buckets[service] {
		if !e.deleted && strings.HasPrefix(k, prefix) {
			keys = append(keys, k)
		}
	}
	m.mu.Unlock()
	slices.Sort(keys)
	return keys, nil
}
