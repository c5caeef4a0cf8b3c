package jobkeys

// Contention is measured at the store, not inside the coordinator: a
// countingStore tells the compare-and-swap failures of each operation apart
// into lost races (a write on a revision the operation read, or a create
// after it read the key absent) and stale guesses (a write on a remembered
// or assumed state), per operation when its context carries a raceCounter.

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
)

// raceCounter counts what one operation's writes met.
type raceCounter struct {
	mu         sync.Mutex
	readRevs   map[uint64]bool // revisions the operation's reads returned
	readAbsent bool            // a read found the key absent
	lost       int             // writes on state the operation read that lost
	stale      int             // writes on a guess that found it stale
}

type raceCounterKey struct{}

// withRaceCounter returns ctx carrying a new counter for one operation.
func withRaceCounter(ctx context.Context) (context.Context, *raceCounter) {
	rc := &raceCounter{readRevs: make(map[uint64]bool)}
	return context.WithValue(ctx, raceCounterKey{}, rc), rc
}

func (rc *raceCounter) counts() (lost, stale int) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return rc.lost, rc.stale
}

// raceTotals sums what a countingStore saw over all operations.
type raceTotals struct {
	lost, stale atomic.Int64
	// reads and writes count every Get and every Create, Update and
	// Delete, whatever its result.
	reads, writes atomic.Int64
}

// countingStore wraps a Store and classifies its compare-and-swap
// failures (see the file comment). The zero totals field counts nothing.
type countingStore struct {
	Store
	totals *raceTotals
}

func newCountingStore(s Store) countingStore { return countingStore{Store: s, totals: &raceTotals{}} }

func (s countingStore) MaxValueSize(ctx context.Context, service string) (int, error) {
	if l, ok := s.Store.(ValueLimiter); ok {
		return l.MaxValueSize(ctx, service)
	}
	return math.MaxInt, nil
}

// wakeUps, publishWakes and subscribeWake forward the wrapped store's
// targeted wake-ups (wakeStore), so that a coordinator over a
// countingStore sees them as it would over the store itself; without them
// the wake-ups are off.
func (s countingStore) wakeUps() bool {
	w, ok := s.Store.(wakeStore)
	return ok && w.wakeUps()
}

func (s countingStore) publishWakes(service, kvKey string, value []byte, rev uint64, targets []string, free int) {
	if w, ok := s.Store.(wakeStore); ok {
		w.publishWakes(service, kvKey, value, rev, targets, free)
	}
}

func (s countingStore) subscribeWake(service, kvKey, jobID string, fn func(value []byte, rev uint64)) (stop func(), err error) {
	if w, ok := s.Store.(wakeStore); ok {
		return w.subscribeWake(service, kvKey, jobID, fn)
	}
	return nil, fmt.Errorf("%w: KV key %q of service %q: the store %T under the counting store carries no wake-ups", ErrInvalidRequest, kvKey, service, s.Store)
}

func (s countingStore) publishWakesAgain(service, kvKey string, value []byte, rev uint64, targets []string, free int) {
	if w, ok := s.Store.(wakeAheadStore); ok {
		w.publishWakesAgain(service, kvKey, value, rev, targets, free)
	}
}

func (s countingStore) waitsFor(service, kvKey, jobID string) bool {
	l, ok := s.Store.(localWaiters)
	return ok && l.waitsFor(service, kvKey, jobID)
}

var (
	_ wakeStore      = countingStore{}
	_ localWaiters   = countingStore{}
	_ wakeAheadStore = countingStore{}
)

func counterOf(ctx context.Context) *raceCounter {
	rc, _ := ctx.Value(raceCounterKey{}).(*raceCounter)
	return rc
}

func (s countingStore) Get(ctx context.Context, service, key string) ([]byte, uint64, error) {
	v, rev, err := s.Store.Get(ctx, service, key)
	if s.totals != nil {
		s.totals.reads.Add(1)
	}
	if rc := counterOf(ctx); rc != nil {
		rc.mu.Lock()
		switch {
		case err == nil:
			rc.readRevs[rev] = true
		case errors.Is(err, ErrKeyNotFound):
			rc.readAbsent = true
		}
		rc.mu.Unlock()
	}
	return v, rev, err
}

// record classifies a write's error; read says whether the write rested on
// what the operation read.
func (s countingStore) record(ctx context.Context, err error, read func(*raceCounter) bool) {
	if s.totals != nil {
		s.totals.writes.Add(1)
	}
	if !errors.Is(err, ErrRevisionConflict) {
		return
	}
	lost := false
	// A batch's write (group commit) is every one of its operations' write.
	for _, ctx := range batchContexts(ctx) {
		if rc := counterOf(ctx); rc != nil {
			rc.mu.Lock()
			l := read(rc)
			if l {
				rc.lost++
			} else {
				rc.stale++
			}
			lost = lost || l
			rc.mu.Unlock()
		}
	}
	if s.totals == nil {
		return
	}
	if lost {
		s.totals.lost.Add(1)
	} else {
		s.totals.stale.Add(1)
	}
}

func (s countingStore) Create(ctx context.Context, service, key string, value []byte) (uint64, error) {
	rev, err := s.Store.Create(ctx, service, key, value)
	s.record(ctx, err, func(rc *raceCounter) bool { return rc.readAbsent })
	return rev, err
}

func (s countingStore) Update(ctx context.Context, service, key string, value []byte, revision uint64) (uint64, error) {
	rev, err := s.Store.Update(ctx, service, key, value, revision)
	s.record(ctx, err, func(rc *raceCounter) bool { return rc.readRevs[revision] })
	return rev, err
}

func (s countingStore) Delete(ctx context.Context, service, key string, revision uint64) error {
	err := s.Store.Delete(ctx, service, key, revision)
	s.record(ctx, err, func(rc *raceCounter) bool { return rc.readRevs[revision] })
	return err
}

// len returns the number of entries in t.
func (t *keyTable) len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.entries)
}
