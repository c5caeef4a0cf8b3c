package jobkeys

// Review of issue 11's watch feed and group commit: regression tests of
// the bugs found.

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestKeyEntryConflictIgnoresOlderWatchedRevisions: after a write on
// revision 9 lost its race, the key is known to be past 9; a lagging watch
// feed that then delivers revision 7 must not make that older state the
// trusted, verified start of a waiting acquisition.
func TestKeyEntryConflictIgnoresOlderWatchedRevisions(t *testing.T) {
	const k = "svc.t.h"
	tab := newKeyTable(8)
	tab.attach(k)
	defer tab.detach(k)
	e := tab.pin(k)
	defer tab.unpin(k, e)

	st := &KeyState{Version: 1, Service: "svc", JobType: "t", KeyHash: "h"}
	tab.watched(k, st, 5, true) // the feed is at revision 5
	// A read finds revision 9; the write on it loses a race.
	s, ok := e.begin(&read{state: st, rev: 9, mark: e.mark()}, true, false, true)
	require.True(t, ok)
	require.Equal(t, uint64(9), s.rev)
	e.conflictAt(9)

	tab.watched(k, st, 7, true) // the lagging feed delivers revision 7
	s, ok = e.begin(nil, true, false, true)
	if ok {
		assert.False(t, s.verified && s.rev < 9, "start at revision %d verified although a write on revision 9 lost a race before it", s.rev)
		assert.False(t, s.watched && s.rev < 9, "start at revision %d watched although the key is past revision 9", s.rev)
	}

	tab.watched(k, st, 10, true) // the write that won
	s, ok = e.begin(nil, true, false, true)
	require.True(t, ok)
	assert.Equal(t, uint64(10), s.rev)
	assert.True(t, s.verified, "the feed's latest state is trusted")
}

// TestCoordinatorDeleteIgnoresOlderWatchedRevisions: once this coordinator
// deleted a key (the last release emptied it), a lagging watch feed that
// then delivers a revision from before the delete must not make that state
// the trusted, verified start of a waiting acquisition.
func TestCoordinatorDeleteIgnoresOlderWatchedRevisions(t *testing.T) {
	ctx := context.Background()
	store := NewMemoryStore()
	c, err := NewCoordinator(store, nil)
	require.NoError(t, err)
	jt, err := c.JobType(rtService(), benchJobType, benchPolicy)
	require.NoError(t, err)
	payload := benchPayload(0)
	key, err := jt.Key(payload)
	require.NoError(t, err)
	c.keys.attach(key.KVKey) // fed, as while a waiter waits
	defer c.keys.detach(key.KVKey)

	adm, err := jt.Admit(ctx, "j1", payload)
	require.NoError(t, err)
	require.Equal(t, KindAccepted, adm.Kind)
	acq, err := jt.Acquire(ctx, "j1", payload)
	require.NoError(t, err)
	require.Equal(t, KindAcquired, acq.Kind)
	_, rev, err := store.Get(ctx, key.Service, key.KVKey)
	require.NoError(t, err)
	busy := acq.State
	_, err = jt.Release(ctx, acq.Lease) // empties the key: a delete
	require.NoError(t, err)
	_, _, err = store.Get(ctx, key.Service, key.KVKey)
	require.ErrorIs(t, err, ErrKeyNotFound, "the release deleted the key")

	c.keys.watched(key.KVKey, busy, rev, true) // the lagging feed delivers the acquisition
	e := c.keys.pin(key.KVKey)
	defer c.keys.unpin(key.KVKey, e)
	s, ok := e.begin(nil, true, false, true)
	if ok {
		assert.False(t, s.verified && s.rev <= rev, "start at revision %d verified although this coordinator deleted the key after it", s.rev)
		assert.False(t, s.watched && s.rev <= rev, "start at revision %d watched although the key was deleted after it", s.rev)
	}
}
