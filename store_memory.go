package jobkeys

import (
	"context"
	"fmt"
	"sync"
)

// MemoryStoreMaxValueSizeDefault is the value size limit of a [MemoryStore],
// the same as a NATS server's default max_payload.
const MemoryStoreMaxValueSizeDefault = 1 << 20

// MemoryStore is a [Store] in process memory, with the same revision and
// compare-and-swap rules as [NATSStore]: one revision counter per store,
// deleted keys may be created again. It suits tests and single-process use.
// The zero value is an empty store with a value size limit of
// MemoryStoreMaxValueSizeDefault, like [NewMemoryStore]'s. It is safe for
// concurrent use.
type MemoryStore struct {
	mu           sync.Mutex
	rev          uint64
	buckets      map[string]map[string]memoryEntry
	maxValueSize int
	watchers     []*memoryWatcher
	// batching makes the store's Batches true (tests).
	batching bool
}

type memoryEntry struct {
	value   []byte // nil for a delete marker
	rev     uint64
	deleted bool
}

var (
	_ Store        = (*MemoryStore)(nil)
	_ BatchWriter  = (*MemoryStore)(nil)
	_ ValueLimiter = (*MemoryStore)(nil)
)

// NewMemoryStore returns an empty store with a value size limit of
// MemoryStoreMaxValueSizeDefault.
func NewMemoryStore() *MemoryStore {
	return &MemoryStore{buckets: make(map[string]map[string]memoryEntry), maxValueSize: MemoryStoreMaxValueSizeDefault}
}

// SetMaxValueSize sets the largest value the store accepts, in bytes.
// n must be positive.
func (m *MemoryStore) SetMaxValueSize(n int) error {
	if n <= 0 {
		return fmt.Errorf("%w: max value size %d is not positive", ErrInvalidRequest, n)
	}
	m.mu.Lock()
	m.maxValueSize = n
	m.mu.Unlock()
	return nil
}

// MaxValueSize implements [ValueLimiter]: the limit SetMaxValueSize set,
// the same for every service.
func (m *MemoryStore) MaxValueSize(context.Context, string) (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.maxValueSize == 0 {
		return MemoryStoreMaxValueSizeDefault, nil
	}
	return m.maxValueSize, nil
}

// Get implements [Store].
func (m *MemoryStore) Get(ctx context.Context, service, key string) ([]byte, uint64, error) {
	if err := ctx.Err(); err != nil {
		return nil, 0, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	e, ok := m.buckets[service][key]
	if !ok || e.deleted {
		return nil, 0, fmt.Errorf("%w: %s in bucket of service %q", ErrKeyNotFound, key, service)
	}
	return append([]byte(nil), e.value...), e.rev, nil
}

// Create implements [Store].
func (m *MemoryStore) Create(ctx context.Context, service, key string, value []byte) (uint64, error) {
	return m.write(ctx, service, key, value, 0, true)
}

// Update implements [Store].
func (m *MemoryStore) Update(ctx context.Context, service, key string, value []byte, revision uint64) (uint64, error) {
	return m.write(ctx, service, key, value, revision, false)
}

func (m *MemoryStore) write(ctx context.Context, service, key string, value []byte, revision uint64, create bool) (uint64, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	limit := m.maxValueSize
	if limit == 0 {
		limit = MemoryStoreMaxValueSizeDefault
	}
	if len(value) > limit {
		return 0, fmt.Errorf("%w: %d bytes exceed the memory store's limit of %d", ErrStateTooLarge, len(value), limit)
	}
	b := m.buckets[service]
	e, ok := b[key]
	switch {
	case create && ok && !e.deleted:
		return 0, fmt.Errorf("%w: %s exists at revision %d", ErrRevisionConflict, key, e.rev)
	case !create && (!ok || e.rev != revision):
		return 0, fmt.Errorf("%w: %s is not at revision %d", ErrRevisionConflict, key, revision)
	}
	if b == nil {
		if m.buckets == nil {
			m.buckets = make(map[string]map[string]memoryEntry)
		}
		b = make(map[string]memoryEntry)
		m.buckets[service] = b
	}
	m.rev++
	b[key] = memoryEntry{value: append([]byte(nil), value...), rev: m.rev}
	m.notify(service, key, value, m.rev, false)
	return m.rev, nil
}

// Batches implements BatchWriter: only when enabled (tests).
func (m *MemoryStore) Batches(service, key string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.batching
}

// WriteBatch implements BatchWriter.
func (m *MemoryStore) WriteBatch(ctx context.Context, service, key string, values [][]byte, revision uint64, del bool) (uint64, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	if len(values) == 0 {
		return 0, fmt.Errorf("%w: a batch of no writes to %s", ErrInvalidRequest, key)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	limit := m.maxValueSize
	if limit == 0 {
		limit = MemoryStoreMaxValueSizeDefault
	}
	for i, v := range values {
		if len(v) > limit && !(del && i == len(values)-1) {
			return 0, fmt.Errorf("%w: write %d of a batch: %d bytes exceed the memory store's limit of %d", ErrStateTooLarge, i+1, len(v), limit)
		}
	}
	b := m.buckets[service]
	if e, ok := b[key]; !ok || e.rev != revision {
		return 0, fmt.Errorf("%w: %s is not at revision %d", ErrRevisionConflict, key, revision)
	}
	for i, v := range values {
		m.rev++
		if del && i == len(values)-1 {
			b[key] = memoryEntry{rev: m.rev, deleted: true}
			m.notify(service, key, nil, m.rev, true)
			break
		}
		b[key] = memoryEntry{value: append([]byte(nil), v...), rev: m.rev}
		m.notify(service, key, v, m.rev, false)
	}
	return m.rev, nil
}

// Delete implements [Store].
func (m *MemoryStore) Delete(ctx context.Context, service, key string, revision uint64) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	b := m.buckets[service]
	e, ok := b[key]
	if !ok || e.rev != revision {
		return fmt.Errorf("%w: %s is not at revision %d", ErrRevisionConflict, key, revision)
	}
	m.rev++
	b[key] = memoryEntry{rev: m.rev, deleted: true}
	m.notify(service, key, nil, m.rev, true)
	return nil
}
