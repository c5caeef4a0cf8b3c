package jobkeys

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestReduceSweep(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	slot := func(id string, expires time.Time) ActiveSlot {
		return ActiveSlot{JobID: id, SlotToken: id + "-token", InstanceID: "w", StartedAt: t0.Add(-time.Hour),
			HeartbeatAt: expires.Add(-time.Minute), LeaseExpiresAt: expires}
	}
	state := func(active []ActiveSlot, queued ...string) *KeyState {
		st := &KeyState{Version: StateVersion, Service: "svc", JobType: "t", DisplayKey: "k", KeyHash: "h",
			MaxActive: 2, StaleTakeoverCount: 1, UpdatedAt: t0.Add(-time.Hour), Active: active}
		for _, q := range queued {
			st.Queued = append(st.Queued, QueuedJob{JobID: q, CreatedAt: t0.Add(-time.Hour), RequestID: q})
		}
		return st
	}
	live, expired, atNow := slot("live", t0.Add(time.Millisecond)), slot("expired", t0.Add(-time.Second)), slot("at-now", t0)
	failStale := Policy{StalePolicy: FailStale}
	block := Policy{StalePolicy: Block}

	cases := []struct {
		name        string
		state       *KeyState
		policy      Policy
		removed     []string
		kept        []string // Expired
		wantActive  []string // nil: no new state
		wantQueued  int
		wantTakeovs int
	}{
		{name: "nil state", state: nil, policy: failStale},
		{name: "nothing expired", state: state([]ActiveSlot{live}), policy: failStale},
		{name: "fail-stale drops expired, keeps live and queue", state: state([]ActiveSlot{expired, live}, "q1"), policy: failStale,
			removed: []string{"expired"}, wantActive: []string{"live"}, wantQueued: 1, wantTakeovs: 2},
		{name: "expiry at now is expired", state: state([]ActiveSlot{atNow, live}), policy: failStale,
			removed: []string{"at-now"}, wantActive: []string{"live"}, wantTakeovs: 2},
		{name: "fail-stale empties the key", state: state([]ActiveSlot{expired, atNow}), policy: failStale,
			removed: []string{"expired", "at-now"}, wantActive: []string{}, wantTakeovs: 3},
		{name: "block keeps expired", state: state([]ActiveSlot{expired, live}, "q1"), policy: block,
			kept: []string{"expired"}},
	}
	ids := func(slots []ActiveSlot) []string {
		var out []string
		for _, s := range slots {
			out = append(out, s.JobID)
		}
		return out
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var before []byte
			if tc.state != nil {
				before = appendState(nil, tc.state)
			}
			now := t0.Add(500 * time.Microsecond) // truncated to t0, as the TS original sees it
			out := ReduceSweep(tc.state, tc.policy, now)
			assert.Equal(t, tc.removed, ids(out.Removed), "Removed")
			assert.Equal(t, tc.kept, ids(out.Expired), "Expired")
			if tc.wantActive == nil {
				assert.Nil(t, out.State, "new state")
			} else {
				require.NotNil(t, out.State, "new state")
				assert.Equal(t, tc.wantActive, append([]string{}, ids(out.State.Active)...))
				assert.Len(t, out.State.Queued, tc.wantQueued)
				assert.Equal(t, tc.wantTakeovs, out.State.StaleTakeoverCount)
				assert.Equal(t, t0, out.State.UpdatedAt)
				assert.Equal(t, len(tc.wantActive) == 0 && tc.wantQueued == 0, out.State.Empty())
			}
			if tc.state != nil {
				assert.True(t, bytes.Equal(appendState(nil, tc.state), before), "ReduceSweep modified its input")
			}
		})
	}
}

// sweepEnv is a service with crashed holders: its coordinators share a store;
// the sweeper's clock is set by the test.
type sweepEnv struct {
	store   Store
	svc     string
	workers *JobType // real clock
	later   *JobType // the sweeper's clock
	sweeper *JobType // the sweeper's clock, its own coordinator
	mu      sync.Mutex
	now     time.Time // the sweeper's clock
}

func newSweepEnv(t *testing.T, store Store, stale StalePolicy) *sweepEnv {
	t.Helper()
	e := &sweepEnv{store: store, svc: rtService(), now: time.Now()}
	policy := Policy{Key: []string{"/tenant"}, MaxActive: 1, MaxQueuedPerKey: 4,
		HeartbeatInterval: time.Second, HeartbeatTTL: 3 * time.Second, StalePolicy: stale}
	clock := func() time.Time {
		e.mu.Lock()
		defer e.mu.Unlock()
		return e.now
	}
	e.workers = rtJobType(t, cCoordinator(t, store, nil), e.svc, policy)
	e.later = rtJobType(t, cCoordinator(t, store, &Config{IgnoreClockSkew: true, Now: clock}), e.svc, policy)
	e.sweeper = rtJobType(t, cCoordinator(t, store, &Config{IgnoreClockSkew: true, Now: clock}), e.svc, policy)
	return e
}

func (e *sweepEnv) advance(d time.Duration) {
	e.mu.Lock()
	e.now = e.now.Add(d)
	e.mu.Unlock()
}

func tenantPayload(tenant string) []byte { return []byte(`{"tenant":"` + tenant + `"}`) }

func (e *sweepEnv) admit(t *testing.T, tenant, id string) {
	t.Helper()
	adm, err := e.workers.Admit(context.Background(), id, tenantPayload(tenant))
	require.NoError(t, err)
	require.Equal(t, KindAccepted, adm.Kind)
}

// crash admits and acquires a job whose worker then dies: no heartbeats, no release.
func (e *sweepEnv) crash(t *testing.T, tenant, id string) {
	t.Helper()
	e.admit(t, tenant, id)
	acq, err := e.workers.Acquire(context.Background(), id, tenantPayload(tenant))
	require.NoError(t, err)
	require.Equal(t, KindAcquired, acq.Kind)
}

func (e *sweepEnv) kvKey(t *testing.T, tenant string) string {
	t.Helper()
	key, err := DeriveKey(e.svc, "render", tenantPayload(tenant), e.workers.Policy().Key)
	require.NoError(t, err)
	return key.KVKey
}

func (e *sweepEnv) sweep(t *testing.T) SweepReport {
	t.Helper()
	rep, err := e.sweeper.Sweep(context.Background())
	require.NoError(t, err)
	return rep
}

func sweptIDs(slots []SweptSlot) []string {
	var out []string
	for _, s := range slots {
		out = append(out, s.Slot.JobID)
	}
	slices.Sort(out)
	return out
}

// TestSweepCrashedHolders: crashed holders are removed once their TTL has
// passed under fail-stale, and kept under block; then the queued jobs
// acquire (fail-stale) or stay blocked (block).
func TestSweepCrashedHolders(t *testing.T) {
	t.Parallel()
	store, _ := rtNATS(t)
	for _, stale := range []StalePolicy{FailStale, Block} {
		t.Run(string(stale), func(t *testing.T) {
			t.Parallel()
			e := newSweepEnv(t, store, stale)
			ctx := context.Background()
			e.crash(t, "acme", "crashed-acme")
			e.crash(t, "globex", "crashed-globex")
			e.admit(t, "acme", "next-acme")
			e.admit(t, "initech", "live-initech")
			liveAcq, err := e.workers.Acquire(ctx, "live-initech", tenantPayload("initech"))
			require.NoError(t, err)

			rep := e.sweep(t)
			assert.Equal(t, 3, rep.Keys)
			assert.Equal(t, SweepReport{Keys: 3}, rep, "sweep before the TTL")

			e.advance(e.workers.Policy().HeartbeatTTL + time.Second)
			// The live holder heartbeats with the sweeper's clock.
			_, err = e.later.Renew(ctx, liveAcq.Lease)
			require.NoError(t, err)

			rep = e.sweep(t)
			switch stale {
			case FailStale:
				assert.Equal(t, []string{"crashed-acme", "crashed-globex"}, sweptIDs(rep.Removed))
				assert.Empty(t, rep.Expired, "expired kept under fail-stale")
				assert.Equal(t, 1, rep.Deleted, "globex had nothing queued")
				for _, s := range rep.Removed {
					if s.Slot.JobID == "crashed-acme" {
						assert.Equal(t, e.kvKey(t, "acme"), s.KVKey)
						assert.Equal(t, "acme", s.DisplayKey)
					}
				}
				_, _, err = store.Get(ctx, e.svc, e.kvKey(t, "globex"))
				assert.ErrorIs(t, err, ErrKeyNotFound)

				acq, err := e.later.Acquire(ctx, "next-acme", tenantPayload("acme"))
				require.NoError(t, err)
				assert.Equal(t, KindAcquired, acq.Kind)
				assert.Empty(t, acq.Stale, "the sweeper left stale slots to the acquisition")
				// A second sweep finds nothing.
				assert.Empty(t, e.sweep(t).Removed, "second sweep")
			case Block:
				assert.Equal(t, []string{"crashed-acme", "crashed-globex"}, sweptIDs(rep.Expired))
				assert.Empty(t, rep.Removed, "removed under block")
				assert.Zero(t, rep.Deleted, "deleted under block")
				value, _, err := store.Get(ctx, e.svc, e.kvKey(t, "acme"))
				require.NoError(t, err)
				st, err := ParseState(value)
				require.NoError(t, err)
				assert.Len(t, st.Active, 1)
				acq, err := e.later.Acquire(ctx, "next-acme", tenantPayload("acme"))
				require.NoError(t, err)
				assert.Equal(t, KindBlocked, acq.Kind)
				assert.Equal(t, ReasonStaleBlocked, acq.Reason)
			}
		})
	}
}

// TestSweepReportsBadState: corrupt and foreign entries are reported by
// key and left alone, and do not stop the sweep of the other keys.
func TestSweepReportsBadState(t *testing.T) {
	t.Parallel()
	store, _ := rtNATS(t)
	e := newSweepEnv(t, store, FailStale)
	e.crash(t, "acme", "crashed")
	ctx := context.Background()
	corruptKey := e.svc + ".render." + "00000000000000000000000000000000000000000000000000000000000000aa"
	foreignKey := e.svc + ".render.not-a-hash"
	otherKey := e.svc + ".render." + "00000000000000000000000000000000000000000000000000000000000000bb"
	garbage := []byte(`{"version":1,"oops"`)
	putKey(t, store, e.svc, corruptKey, garbage)
	putKey(t, store, e.svc, foreignKey, []byte(`{}`))
	// Valid state of another key hash, stored under the wrong KV key.
	acmeValue, _, err := store.Get(ctx, e.svc, e.kvKey(t, "acme"))
	require.NoError(t, err)
	putKey(t, store, e.svc, otherKey, acmeValue)

	e.advance(time.Hour)
	rep, err := e.sweeper.Sweep(ctx)
	assert.Equal(t, []string{"crashed"}, sweptIDs(rep.Removed))
	assert.Equal(t, 4, rep.Keys)
	var joined interface{ Unwrap() []error }
	require.ErrorAs(t, err, &joined, "one error per bad key")
	var bad []string
	for _, e := range joined.Unwrap() {
		var se *StateError
		require.ErrorAs(t, e, &se)
		bad = append(bad, se.KVKey)
	}
	assert.ElementsMatch(t, []string{corruptKey, otherKey, foreignKey}, bad)
	assert.ErrorIs(t, err, ErrCorruptState)
	assert.ErrorIs(t, err, ErrForeignState)

	for key, value := range map[string][]byte{corruptKey: garbage, foreignKey: []byte(`{}`), otherKey: acmeValue} {
		got, _, err := store.Get(ctx, e.svc, key)
		require.NoError(t, err)
		assert.Equal(t, string(value), string(got), "%s was overwritten", key)
	}
}

func TestSweeperRun(t *testing.T) {
	t.Parallel()
	e := newSweepEnv(t, NewMemoryStore(), FailStale)
	e.crash(t, "acme", "crashed")
	e.advance(time.Hour)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var reports []SweepReport
	s, err := NewSweeper(e.sweeper, time.Millisecond, func(rep SweepReport, err error) {
		if len(reports) < 3 {
			assert.NoError(t, err)
		}
		reports = append(reports, rep)
		if len(reports) == 3 {
			cancel()
		}
	})
	require.NoError(t, err)
	assert.Equal(t, context.Canceled, s.Run(ctx), "Run returns ctx.Err() unchanged")
	require.Len(t, reports, 3)
	assert.Equal(t, []string{"crashed"}, sweptIDs(reports[0].Removed))
	assert.Zero(t, reports[1].Keys)

	report := func(SweepReport, error) {}
	_, err = NewSweeper(e.sweeper, 0, report)
	assert.ErrorIs(t, err, ErrInvalidRequest)
	_, err = NewSweeper(e.sweeper, time.Second, nil)
	assert.ErrorIs(t, err, ErrInvalidRequest)
	_, err = NewSweeper(nil, time.Second, report)
	assert.ErrorIs(t, err, ErrInvalidRequest)
	// A store that cannot list keys cannot be swept.
	unlisted := rtJobType(t, cCoordinator(t, struct{ Store }{NewMemoryStore()}, nil), e.svc, e.workers.Policy())
	_, err = NewSweeper(unlisted, time.Second, report)
	assert.ErrorIs(t, err, ErrInvalidRequest)
	_, err = unlisted.Sweep(ctx)
	assert.ErrorIs(t, err, ErrInvalidRequest)
}

// TestSweeperRunReportsSweepCutShort: a sweep that removes a slot and is
// then cut short by Run's context is still reported: the removed slot's job
// must be recorded as failed by someone.
func TestSweeperRunReportsSweepCutShort(t *testing.T) {
	t.Parallel()
	// The store cancels a context after its first successful update or
	// delete, as a shutdown that lands in the middle of a sweep.
	var (
		mu         sync.Mutex
		cancelCall context.CancelFunc
	)
	store := newHookStore(NewMemoryStore(), passAll).withHook(func(_ context.Context, c storeCall, call func() storeResult) storeResult {
		r := call()
		if r.err == nil && (c.op == opUpdate || c.op == opDelete) {
			mu.Lock()
			if cancelCall != nil {
				cancelCall()
			}
			mu.Unlock()
		}
		return r
	})
	e := newSweepEnv(t, store, FailStale)
	e.crash(t, "acme", "crashed-acme")
	e.crash(t, "globex", "crashed-globex")
	e.advance(time.Hour)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	mu.Lock()
	cancelCall = cancel
	mu.Unlock()

	var (
		reported []string
		errs     []error
	)
	s, err := NewSweeper(e.sweeper, time.Hour, func(rep SweepReport, err error) {
		reported = append(reported, sweptIDs(rep.Removed)...)
		errs = append(errs, err)
	})
	require.NoError(t, err)
	assert.ErrorIs(t, s.Run(ctx), context.Canceled)

	// Exactly one key was written before the cancellation took effect.
	var left []string
	for _, tenant := range []string{"acme", "globex"} {
		value, _, err := store.Get(context.Background(), e.svc, e.kvKey(t, tenant))
		if errors.Is(err, ErrKeyNotFound) {
			continue
		}
		require.NoError(t, err)
		st, err := ParseState(value)
		require.NoError(t, err)
		left = append(left, activeIDs(st)...)
	}
	require.Len(t, left, 1)
	removed := slices.DeleteFunc([]string{"crashed-acme", "crashed-globex"}, func(id string) bool { return slices.Contains(left, id) })
	assert.Equal(t, removed, reported, "the removed slot is reported")
	require.Len(t, errs, 1)
	assert.ErrorIs(t, errs[0], context.Canceled, "the cut-short sweep's error")
}
