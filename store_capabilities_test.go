package jobkeys

// Which optional capabilities of a store the package uses: a store's own
// value watch, never one promoted from an embedded MemoryStore or
// NATSStore (whose wrapper's WatchKeys may do more).

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// ownValueWatchStore is a store of its own type with a value watch: it
// holds a MemoryStore in a named field, as a third-party store would hold
// its client, and counts which watch the Watcher starts. Not a hookStore:
// what it tests is a store whose own type has the value watch, which no
// wrapper has (see hookStore).
type ownValueWatchStore struct {
	mem          *MemoryStore
	keyWatches   atomic.Int64
	valueWatches atomic.Int64
}

func (s *ownValueWatchStore) Get(ctx context.Context, service, key string) ([]byte, uint64, error) {
	return s.mem.Get(ctx, service, key)
}

func (s *ownValueWatchStore) Create(ctx context.Context, service, key string, value []byte) (uint64, error) {
	return s.mem.Create(ctx, service, key, value)
}

func (s *ownValueWatchStore) Update(ctx context.Context, service, key string, value []byte, revision uint64) (uint64, error) {
	return s.mem.Update(ctx, service, key, value, revision)
}

func (s *ownValueWatchStore) Delete(ctx context.Context, service, key string, revision uint64) error {
	return s.mem.Delete(ctx, service, key, revision)
}

func (s *ownValueWatchStore) WatchKeys(ctx context.Context, service, jobType string, changed func(string)) (<-chan struct{}, error) {
	s.keyWatches.Add(1)
	return s.mem.WatchKeys(ctx, service, jobType, changed)
}

func (s *ownValueWatchStore) WatchValues(ctx context.Context, service string, changed func(ValueChange)) (<-chan struct{}, error) {
	s.valueWatches.Add(1)
	return s.mem.WatchValues(ctx, service, changed)
}

// TestWatcherUsesValueWatchOfItsOwnType: a Watcher over a store whose own
// type is a ValueWatcher watches through WatchValues (and its subscribers
// hear of changes); over a wrapper that holds its store in a named field,
// through the wrapper's WatchKeys.
func TestWatcherUsesValueWatchOfItsOwnType(t *testing.T) {
	t.Parallel()
	own := &ownValueWatchStore{mem: NewMemoryStore()}
	w, err := NewWatcher(own)
	require.NoError(t, err)
	defer w.Close()
	sub, err := w.Subscribe(context.Background(), "svc", "svc.t.k")
	require.NoError(t, err)
	defer sub.Close()
	putKey(t, own, "svc", "svc.t.k", []byte("v"))
	recv(t, sub.Changed(), "a change through the value watch")
	assert.Equal(t, int64(1), own.valueWatches.Load(), "value watches started")
	assert.Equal(t, int64(0), own.keyWatches.Load(), "key watches started")

	var watches atomic.Int64
	wrapped := newWatchCountingStore(&watches)
	w2, err := NewWatcher(wrapped)
	require.NoError(t, err)
	defer w2.Close()
	sub2, err := w2.Subscribe(context.Background(), "svc", "svc.t.k")
	require.NoError(t, err)
	defer sub2.Close()
	assert.Equal(t, int64(1), watches.Load(), "the wrapper's WatchKeys is the watch")
	assert.Nil(t, valueWatcherOf(wrapped), "a wrapper has no value watch")
}

// TestClockOffsetCarriesClockBounds: the bounds a store keeps go through
// ClockSource's ClockOffset and back unchanged, saturated ones included;
// a side that bounds nothing (a lower bound at the smallest Duration, an
// upper one at the largest) comes back unknown, as clockBounds keeps it.
func TestClockOffsetCarriesClockBounds(t *testing.T) {
	t.Parallel()
	values := []time.Duration{durationMin + 1, -time.Hour, -1, 0, 1, 80 * time.Millisecond, durationMax - 1}
	for _, hasLo := range []bool{false, true} {
		for _, hasHi := range []bool{false, true} {
			for _, lo := range values {
				for _, hi := range append(values, durationMin) {
					b := clockBounds{hasLo: hasLo, hasHi: hasHi}
					if hasLo {
						b.lo = lo
					}
					if hasHi {
						b.hi = hi
					}
					assert.Equal(t, b, boundsOf(b.offset()), "%+v", b)
				}
			}
			b := clockBounds{lo: durationMax, hi: durationMin, hasLo: hasLo, hasHi: hasHi}
			if !hasLo {
				b.lo = 0
			}
			if !hasHi {
				b.hi = 0
			}
			assert.Equal(t, b, boundsOf(b.offset()), "saturated %+v", b)
		}
	}
	assert.Equal(t, clockBounds{}, boundsOf(ClockOffset{Min: durationMin, MinKnown: true, Max: durationMax, MaxKnown: true}),
		"bounds at the far ends of a Duration bound nothing")
	assert.Equal(t, ClockOffset{}, clockBounds{}.offset())
}
