package jobkeys

import (
	"context"
	"runtime"
	"testing"
	"time"
	"weak"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A Watcher closed while coordinators' key tables are linked to it
// (review): Close unlinks them, so that their batches prewake nothing
// through it, and a prewake through a closed Watcher wakes nothing and
// does not panic.
func TestWatcherCloseUnlinksTables(t *testing.T) {
	t.Parallel()
	mem := NewMemoryStore()
	w, err := NewWatcher(mem)
	require.NoError(t, err)
	const service = "watchclose"
	kvKey := service + ".t.k"
	tbl := newKeyTable(16)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sub, err := w.subscribeWaiter(ctx, service, kvKey, "j1", 1, tbl)
	require.NoError(t, err)
	ws := tbl.feeds.Load()
	require.NotNil(t, ws, "a waiter's table is linked")
	assert.Equal(t, []*Watcher{w}, *ws)

	w.Close()
	<-sub.Done()
	assert.Nil(t, tbl.feeds.Load(), "Close unlinks the tables")
	st := &KeyState{Service: service, JobType: "t", MaxActive: 1}
	assert.Zero(t, tbl.prewake(kvKey, st, 7), "nothing linked: nothing woken")
	assert.Zero(t, w.prewake(kvKey, tbl, st, 7, time.Now()), "a closed Watcher wakes nothing")
	sub.Close()
}

// A Watcher that outlives the coordinators linked to it does not keep them
// alive (review: linked held each coordinator's key table until Close, so
// a long-lived Watcher used with short-lived coordinators grew without
// bound), and prunes the entries of collected ones.
func TestWatcherLinkDoesNotKeepTablesAlive(t *testing.T) {
	t.Parallel()
	mem := NewMemoryStore()
	w, err := NewWatcher(mem)
	require.NoError(t, err)
	defer w.Close()
	const service = "watchlink"
	kvKey := service + ".t.k"
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const tables = 200
	var first weak.Pointer[keyTable]
	for i := range tables {
		tbl := newKeyTable(16)
		if i == 0 {
			first = weak.Make(tbl)
		}
		sub, err := w.subscribeWaiter(ctx, service, kvKey, "j1", 1, tbl)
		require.NoError(t, err)
		sub.Close()
	}
	require.Eventually(t, func() bool {
		runtime.GC()
		return first.Value() == nil
	}, 10*time.Second, 10*time.Millisecond, "a dropped coordinator's key table stayed reachable through the Watcher")
	// The next link prunes the collected entries once the map has grown.
	for range 64 {
		sub, err := w.subscribeWaiter(ctx, service, kvKey, "j1", 1, newKeyTable(16))
		require.NoError(t, err)
		sub.Close()
		runtime.GC()
	}
	w.mu.Lock()
	n := len(w.linked)
	w.mu.Unlock()
	assert.Less(t, n, tables, "collected tables' entries are pruned")
}
