package jobkeys

// Contention is measured at the store, not inside the coordinator: a
// countingStore tells the compare-and-swap failures of each operation apart
// into lost races (a write on a revision the operation read, or a create
// after it read the key absent) and stale guesses (a write on a remembered
// or assumed state), per operation when its context carries a raceCounter.

import (
	"context"
	"errors"
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

// countingStore is a hookStore that classifies the compare-and-swap
// failures of the store it wraps (see the file comment) and sums them in
// totals. It passes the wrapped store's batch writes (a batch is one
// write), value limit and targeted wake-ups through, so that a coordinator
// over it sees them as it would over the store itself; it hides listing,
// watching and the clock source.
type countingStore struct {
	*hookStore
	totals *raceTotals
}

func newCountingStore(s Store) countingStore {
	totals := &raceTotals{}
	h := newHookStore(s, passBatches|passValueLimit|passWakes).withHook(countRaces(totals))
	return countingStore{hookStore: h, totals: totals}
}

func counterOf(ctx context.Context) *raceCounter {
	rc, _ := ctx.Value(raceCounterKey{}).(*raceCounter)
	return rc
}

// countRaces returns the hook of a countingStore: it counts every read and
// write in totals, records what a read returned in its operation's
// raceCounter, and classifies a write's revision conflict as a lost race or
// a stale guess.
func countRaces(totals *raceTotals) storeHook {
	return func(ctx context.Context, c storeCall, call func() storeResult) storeResult {
		r := call()
		switch c.op {
		case opGet:
			totals.reads.Add(1)
			if rc := counterOf(ctx); rc != nil {
				rc.mu.Lock()
				switch {
				case r.err == nil:
					rc.readRevs[r.rev] = true
				case errors.Is(r.err, ErrKeyNotFound):
					rc.readAbsent = true
				}
				rc.mu.Unlock()
			}
		case opCreate:
			recordWrite(ctx, totals, r.err, func(rc *raceCounter) bool { return rc.readAbsent })
		case opUpdate, opDelete, opWriteBatch:
			recordWrite(ctx, totals, r.err, func(rc *raceCounter) bool { return rc.readRevs[c.revision] })
		}
		return r
	}
}

// recordWrite classifies a write's error; read says whether the write
// rested on what the operation read.
func recordWrite(ctx context.Context, totals *raceTotals, err error, read func(*raceCounter) bool) {
	totals.writes.Add(1)
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
	if lost {
		totals.lost.Add(1)
	} else {
		totals.stale.Add(1)
	}
}

// len returns the number of entries in t.
func (t *keyTable) len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.entries)
}
