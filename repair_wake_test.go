package jobkeys

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jobkeys/jobkeys/internal/natstest"
)

// TestRepairWakesTheNextJob: an operator's Repair that frees a slot (the
// stuck slot of a worker that will not come back, removed by hand) sends
// the wake-up any write that frees a slot sends, so a Run waiting in
// another process runs its job at once, not at its recheck (an hour away
// here: without the wake-up the test times out).
func TestRepairWakesTheNextJob(t *testing.T) {
	t.Parallel()
	s := natstest.Run(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	policy := Policy{Key: benchPolicy.Key, MaxActive: 1, MaxQueuedPerKey: 4, HeartbeatTTL: time.Hour, HeartbeatInterval: time.Minute}
	a := newWakeProc(t, s, "repairwake", policy, wakeProcConfig{})
	b := newWakeProc(t, s, "repairwake", policy, wakeProcConfig{})
	payload := benchPayload(0)
	adm, err := a.jt.Admit(ctx, "stuck", payload)
	require.NoError(t, err)
	require.Equal(t, KindAccepted, adm.Kind)
	acq, err := a.jt.Acquire(ctx, "stuck", payload)
	require.NoError(t, err)
	require.Equal(t, KindAcquired, acq.Kind)

	release := make(chan struct{})
	close(release)
	acquired, done := b.runAsync(t, ctx, "next", release)
	require.Equal(t, "next", recv(t, b.blocked, "next blocked"))

	// The operator removes the stuck slot at the revision it inspected.
	op := newWakeProc(t, s, "repairwake", policy, wakeProcConfig{uncounted: true}).c
	key, err := a.jt.Key(payload)
	require.NoError(t, err)
	kvKey := key.KVKey
	value, rev, err := op.store.Get(ctx, "repairwake", kvKey)
	require.NoError(t, err)
	st, err := decodeState(value)
	require.NoError(t, err)
	require.Len(t, st.Active, 1)
	st.Active = nil
	_, err = op.Repair(ctx, RepairRequest{Service: "repairwake", KVKey: kvKey, Revision: rev, Replacement: st})
	require.NoError(t, err)

	select {
	case <-acquired:
	case <-time.After(10 * time.Second):
		t.Fatal("next did not run within 10s of the repair that freed the slot (its recheck is an hour away)")
	}
	require.NoError(t, <-done)
}
