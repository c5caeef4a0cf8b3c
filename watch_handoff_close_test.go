package jobkeys

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A Watcher closed while coordinators' key tables are linked to it
// (review): Close unlinks them, so that their writes hand nothing to it,
// and a handoff to a closed Watcher changes nothing and does not panic.
func TestWatcherCloseUnlinksTables(t *testing.T) {
	t.Parallel()
	mem := NewMemoryStore()
	w, err := NewWatcher(mem)
	require.NoError(t, err)
	const service = "handoffclose"
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
	tbl.handoff(kvKey, st, 7) // nothing linked: nothing happens
	w.handoff(kvKey, st, 7)   // a closed Watcher takes nothing
	w.mu.Lock()
	for _, sw := range w.watches {
		if kw := sw.keys[kvKey]; kw != nil {
			assert.NotEqual(t, uint64(7), kw.rev, "a closed Watcher holds no handed-off revision")
		}
	}
	w.mu.Unlock()
	sub.Close()
}
