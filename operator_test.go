package jobkeys

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// opDoc is a valid state document for key holding queued jobs ids,
// changed by f.
func opDoc(key JobKey, f func(*KeyState), ids ...string) []byte {
	s := &KeyState{Version: 1, Service: key.Service, JobType: key.JobType, DisplayKey: key.DisplayKey, KeyHash: key.KeyHash,
		MaxActive: 1, MaxQueuedPerKey: 4, UpdatedAt: rt0}
	for _, id := range ids {
		s.Queued = append(s.Queued, rq(id, rt0))
	}
	if f != nil {
		f(s)
	}
	return appendState(nil, s)
}

// The operator's removal needs only the KV key and the job id; it leaves
// state it cannot read untouched.
func TestOperatorRemoveQueuedEntry(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, b := range coordBackends(t) {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			st, svc, _ := b.open(t)
			key := cKey(t, svc)
			producer := cCoordinator(t, st, nil)
			for _, id := range []string{"j1", "j2"} {
				_, err := producer.Admit(ctx, cAdmit(svc, id, cPolicy()))
				require.NoError(t, err)
			}
			op := cCoordinator(t, st, nil)
			ref := QueueEntryRef{Service: svc, KVKey: key.KVKey, JobID: "j1"}
			rem, err := op.RemoveQueuedEntry(ctx, ref)
			require.NoError(t, err)
			assert.Equal(t, KindRemoved, rem.Kind)
			assert.Equal(t, []string{"j2"}, queuedIDs(storedState(t, st, svc, key.KVKey)))
			rem, err = op.RemoveQueuedEntry(ctx, ref)
			require.NoError(t, err)
			assert.Equal(t, KindNotFound, rem.Kind)
			assert.Nil(t, rem.State)
			// The producer's coordinator, whose cache is stale, carries on.
			_, err = producer.Admit(ctx, cAdmit(svc, "j3", cPolicy()))
			require.NoError(t, err)
			assert.Equal(t, []string{"j2", "j3"}, queuedIDs(storedState(t, st, svc, key.KVKey)))
			for _, id := range []string{"j2", "j3"} {
				rem, err = op.RemoveQueuedEntry(ctx, QueueEntryRef{Service: svc, KVKey: key.KVKey, JobID: id})
				require.NoError(t, err)
				assert.Equal(t, KindRemoved, rem.Kind)
			}
			_, _, err = st.Get(ctx, svc, key.KVKey)
			require.ErrorIs(t, err, ErrKeyNotFound, "the emptied key is deleted")

			// Unreadable state is an error and stays as it was.
			for name, value := range map[string][]byte{
				"corrupt": []byte(`{"version":1,"service":`),
				"foreign": opDoc(key, func(s *KeyState) { s.JobType = "other" }, "j1"),
			} {
				svc := jkService("rmentry")
				key := cKey(t, svc)
				_, err := st.Create(ctx, svc, key.KVKey, value)
				require.NoError(t, err)
				_, err = op.RemoveQueuedEntry(ctx, QueueEntryRef{Service: svc, KVKey: key.KVKey, JobID: "j1"})
				want := map[string]error{"corrupt": ErrCorruptState, "foreign": ErrForeignState}[name]
				checkStateErr(t, name, err, want, key.KVKey)
				after, _ := stored(t, st, svc, key.KVKey)
				assert.Equal(t, string(value), string(after), name)
			}

			for name, ref := range map[string]QueueEntryRef{
				"empty job id":       {Service: svc, KVKey: key.KVKey},
				"other service":      {Service: svc + "x", KVKey: key.KVKey, JobID: "j1"},
				"not a key hash":     {Service: svc, KVKey: svc + "." + cJobType + ".abc", JobID: "j1"},
				"missing job type":   {Service: svc, KVKey: svc + "." + key.KeyHash, JobID: "j1"},
				"invalid job type":   {Service: svc, KVKey: svc + ".a*b." + key.KeyHash, JobID: "j1"},
				"invalid service":    {Service: "a.b", KVKey: "a.b." + cJobType + "." + key.KeyHash, JobID: "j1"},
				"uppercase key hash": {Service: svc, KVKey: svc + "." + cJobType + "." + "A" + key.KeyHash[1:], JobID: "j1"},
			} {
				_, err := op.RemoveQueuedEntry(ctx, ref)
				assert.Error(t, err, name)
			}
		})
	}
}

// Inspect shows what a key holds, readable or not; Repair deletes or
// replaces it only at the revision the operator saw.
func TestOperatorInspectAndRepair(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, b := range coordBackends(t) {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			st, svc, _ := b.open(t)
			key := cKey(t, svc)
			c := cCoordinator(t, st, nil)

			in, err := c.Inspect(ctx, svc, key.KVKey)
			require.NoError(t, err)
			assert.Equal(t, Inspection{}, in, "an absent key")

			corrupt := []byte(`{"version":1,"service":"` + svc + `","active":"nope"}`)
			rev, err := st.Create(ctx, svc, key.KVKey, corrupt)
			require.NoError(t, err)
			in, err = c.Inspect(ctx, svc, key.KVKey)
			require.NoError(t, err)
			assert.Equal(t, rev, in.Revision)
			assert.Equal(t, string(corrupt), string(in.Value))
			assert.Nil(t, in.State)
			checkStateErr(t, "Inspect corrupt", in.Problem, ErrCorruptState, key.KVKey)
			_, err = c.Admit(ctx, cAdmit(svc, "j1", cPolicy()))
			checkStateErr(t, "Admit on corrupt state", err, ErrCorruptState, key.KVKey)

			// A repair at another revision than the one inspected writes nothing.
			_, err = c.Repair(ctx, RepairRequest{Service: svc, KVKey: key.KVKey, Revision: rev + 100})
			require.ErrorIs(t, err, ErrRevisionConflict)
			_, err = c.Repair(ctx, RepairRequest{Service: svc, KVKey: key.KVKey})
			require.ErrorIs(t, err, ErrInvalidRequest, "no revision")
			after, rev2 := stored(t, st, svc, key.KVKey)
			assert.Equal(t, string(corrupt), string(after))
			assert.Equal(t, rev, rev2)

			rep, err := c.Repair(ctx, RepairRequest{Service: svc, KVKey: key.KVKey, Revision: rev})
			require.NoError(t, err)
			assert.Equal(t, RepairOutcome{Previous: corrupt, Deleted: true}, rep)
			in, err = c.Inspect(ctx, svc, key.KVKey)
			require.NoError(t, err)
			assert.Zero(t, in.Revision, "deleted")
			adm, err := c.Admit(ctx, cAdmit(svc, "j1", cPolicy()))
			require.NoError(t, err, "the key works again")
			assert.Equal(t, KindAccepted, adm.Kind)

			// Foreign state, replaced by the operator's state for the key.
			foreign := opDoc(key, func(s *KeyState) { s.Service = "someone-else" }, "x")
			_, rev = stored(t, st, svc, key.KVKey)
			rev, err = st.Update(ctx, svc, key.KVKey, foreign, rev)
			require.NoError(t, err)
			in, err = c.Inspect(ctx, svc, key.KVKey)
			require.NoError(t, err)
			checkStateErr(t, "Inspect foreign", in.Problem, ErrForeignState, key.KVKey)
			replacement, err := ParseState(opDoc(key, nil, "j1", "j2"))
			require.NoError(t, err)
			wrong := *replacement
			wrong.KeyHash = "0" + key.KeyHash[1:]
			_, err = c.Repair(ctx, RepairRequest{Service: svc, KVKey: key.KVKey, Revision: rev, Replacement: &wrong})
			require.ErrorIs(t, err, ErrInvalidRequest, "a replacement for another key")
			rep, err = c.Repair(ctx, RepairRequest{Service: svc, KVKey: key.KVKey, Revision: rev, Replacement: replacement})
			require.NoError(t, err)
			assert.False(t, rep.Deleted)
			assert.Equal(t, string(foreign), string(rep.Previous))
			value, newRev := stored(t, st, svc, key.KVKey)
			assert.Equal(t, newRev, rep.Revision)
			assert.Equal(t, string(appendState(nil, replacement)), string(value))

			acq, err := c.Acquire(ctx, cAcquire(svc, "j2", cPolicy(), false))
			require.NoError(t, err, "the repaired key works")
			assert.Equal(t, KindAcquired, acq.Kind)
			// The repair's revision is stale now.
			_, err = c.Repair(ctx, RepairRequest{Service: svc, KVKey: key.KVKey, Revision: rep.Revision})
			require.ErrorIs(t, err, ErrRevisionConflict)
			assert.Equal(t, []string{"j2"}, activeJobIDs(storedState(t, st, svc, key.KVKey)))
		})
	}
}

// The operator operations honour ctx.
func TestOperatorCancelled(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	c := cCoordinator(t, NewMemoryStore(), nil)
	svc := jkService("opcancel")
	key := cKey(t, svc)
	_, err := c.RemoveQueuedEntry(ctx, QueueEntryRef{Service: svc, KVKey: key.KVKey, JobID: "j"})
	require.ErrorIs(t, err, context.Canceled)
	_, err = c.Inspect(ctx, svc, key.KVKey)
	require.ErrorIs(t, err, context.Canceled)
	_, err = c.Repair(ctx, RepairRequest{Service: svc, KVKey: key.KVKey, Revision: 1})
	require.ErrorIs(t, err, context.Canceled)
}

// TestConfigReportsTheSettingsInForce: KeyCoordinator.Config returns the
// configuration the coordinator was made with, its zero fields replaced by
// their defaults, and a copy: changing it changes nothing in the
// coordinator.
func TestConfigReportsTheSettingsInForce(t *testing.T) {
	t.Parallel()
	c, err := NewCoordinator(NewMemoryStore(), &Config{InstanceID: "w-1", IgnoreClockSkew: true, MaxAttempts: 7})
	require.NoError(t, err)
	got := c.Config()
	assert.Equal(t, "w-1", got.InstanceID)
	assert.True(t, got.IgnoreClockSkew)
	assert.Equal(t, 7, got.MaxAttempts)
	assert.Equal(t, RetryBackoffDefault, got.RetryBackoff, "a zero field reads as its default")
	assert.Equal(t, MaxRetryBackoffDefault, got.MaxRetryBackoff)
	assert.Equal(t, StateCacheSizeDefault, got.StateCacheSize)
	require.NotNil(t, got.Now)
	require.NotNil(t, got.NewSlotToken)

	got.IgnoreClockSkew = false
	got.InstanceID = "changed"
	assert.True(t, c.Config().IgnoreClockSkew, "the copy is the caller's")
	assert.Equal(t, "w-1", c.Config().InstanceID)

	d, err := NewCoordinator(NewMemoryStore(), nil)
	require.NoError(t, err)
	assert.False(t, d.Config().IgnoreClockSkew, "the check is on by default")
	assert.Equal(t, MaxAttemptsDefault, d.Config().MaxAttempts)
}
