package jobkeys

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"
)

func TestReduceSweep(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	slot := func(id string, expires time.Time) ActiveSlot {
		return ActiveSlot{JobID: id, SlotToken: id + "-token", InstanceID: "w", StartedAt: t0.Add(-time.Hour),
			HeartbeatAt: expires.Add(-time.Minute), LeaseExpiresAt: expires}
	}
	state := func(active []ActiveSlot, queued ...string) *KeyState {
		st := &KeyState{Version: StateVersion, Service: "svc", JobType: "t", Key: "k", KeyHash: "h",
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
			rtEqual(t, ids(out.Removed), tc.removed)
			rtEqual(t, ids(out.Expired), tc.kept)
			if tc.wantActive == nil {
				jkCheck(t, out.State == nil, "new state %+v, want none", out.State)
			} else {
				if out.State == nil {
					t.Fatal("no new state")
				}
				rtEqual(t, append([]string{}, ids(out.State.Active)...), tc.wantActive)
				rtEqual(t, len(out.State.Queued), tc.wantQueued)
				rtEqual(t, out.State.StaleTakeoverCount, tc.wantTakeovs)
				rtEqual(t, out.State.UpdatedAt, t0)
				rtEqual(t, out.State.Empty(), len(tc.wantActive) == 0 && tc.wantQueued == 0)
			}
			if tc.state != nil && !bytes.Equal(appendState(nil, tc.state), before) {
				t.Error("ReduceSweep modified its input")
			}
		})
	}
}

// sweepEnv is a service with crashed holders: its coordinators share a store;
// the sweeper's clock is set by the test.
type sweepEnv struct {
	store   Store
	svc     string
	policy  Policy
	workers *KeyCoordinator // real clock
	later   *KeyCoordinator // the sweeper's clock
	sweeper *Sweeper
	mu      sync.Mutex
	now     time.Time // the sweeper's clock
}

func newSweepEnv(t *testing.T, store Store, stale StalePolicy) *sweepEnv {
	t.Helper()
	e := &sweepEnv{store: store, svc: rtService(), now: time.Now(),
		policy: Policy{Key: []string{"/tenant"}, MaxActive: 1, MaxQueuedPerKey: 4,
			HeartbeatInterval: time.Second, HeartbeatTTL: 3 * time.Second, StalePolicy: stale}}
	e.workers = cCoordinator(t, store, nil)
	clock := func() time.Time {
		e.mu.Lock()
		defer e.mu.Unlock()
		return e.now
	}
	e.later = cCoordinator(t, store, &Config{Now: clock})
	var err error
	e.sweeper, err = NewSweeper(cCoordinator(t, store, &Config{Now: clock}))
	jkNoErr(t, err)
	return e
}

func (e *sweepEnv) advance(d time.Duration) {
	e.mu.Lock()
	e.now = e.now.Add(d)
	e.mu.Unlock()
}

func (e *sweepEnv) req(tenant, id string) AcquireRequest {
	return AcquireRequest{Service: e.svc, JobType: "render", JobID: id, Payload: []byte(`{"tenant":"` + tenant + `"}`), Policy: e.policy}
}

func (e *sweepEnv) admit(t *testing.T, tenant, id string) AcquireRequest {
	t.Helper()
	r := e.req(tenant, id)
	adm, err := e.workers.Admit(context.Background(), AdmitRequest{Service: r.Service, JobType: r.JobType, JobID: id, Payload: r.Payload, Policy: r.Policy})
	jkNoErr(t, err)
	rtEqual(t, adm.Kind, KindAccepted)
	return r
}

// crash admits and acquires a job whose worker then dies: no heartbeats, no release.
func (e *sweepEnv) crash(t *testing.T, tenant, id string) {
	t.Helper()
	acq, err := e.workers.Acquire(context.Background(), e.admit(t, tenant, id))
	jkNoErr(t, err)
	rtEqual(t, acq.Kind, KindAcquired)
}

func (e *sweepEnv) sweep(t *testing.T) SweepReport {
	t.Helper()
	rep, err := e.sweeper.Sweep(context.Background(), SweepRequest{Service: e.svc, JobType: "render", Policy: e.policy})
	jkNoErr(t, err)
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

// TestSweeperCrashedHolders: crashed holders are removed once their TTL has
// passed under fail-stale, and kept under block; then the queued jobs
// acquire (fail-stale) or stay blocked (block).
func TestSweeperCrashedHolders(t *testing.T) {
	t.Parallel()
	store, _ := rtNATS(t)
	for _, stale := range []StalePolicy{FailStale, Block} {
		t.Run(string(stale), func(t *testing.T) {
			t.Parallel()
			e := newSweepEnv(t, store, stale)
			e.crash(t, "acme", "crashed-acme")
			e.crash(t, "globex", "crashed-globex")
			next := e.admit(t, "acme", "next-acme")
			live := e.admit(t, "initech", "live-initech")
			liveAcq, err := e.workers.Acquire(context.Background(), live)
			jkNoErr(t, err)

			rep := e.sweep(t)
			rtEqual(t, rep.Keys, 3)
			jkCheck(t, len(rep.Removed)+len(rep.Expired)+rep.Deleted == 0, "sweep before the TTL: %+v", rep)

			e.advance(e.policy.HeartbeatTTL + time.Second)
			// The live holder heartbeats with the sweeper's clock.
			_, err = e.later.Renew(context.Background(), RenewRequest{Lease: liveAcq.Lease})
			jkNoErr(t, err)

			rep = e.sweep(t)
			acmeKey, err := DeriveKey(e.svc, "render", next.Payload, e.policy.Key)
			jkNoErr(t, err)
			switch stale {
			case FailStale:
				rtEqual(t, sweptIDs(rep.Removed), []string{"crashed-acme", "crashed-globex"})
				jkCheck(t, len(rep.Expired) == 0, "expired kept under fail-stale: %+v", rep.Expired)
				rtEqual(t, rep.Deleted, 1) // globex had nothing queued
				for _, s := range rep.Removed {
					if s.Slot.JobID == "crashed-acme" {
						rtEqual(t, s.KVKey, acmeKey.KVKey)
						rtEqual(t, s.Key, "acme")
					}
				}
				globex, err := DeriveKey(e.svc, "render", []byte(`{"tenant":"globex"}`), e.policy.Key)
				jkNoErr(t, err)
				_, _, err = store.Get(context.Background(), e.svc, globex.KVKey)
				jkErrorIs(t, err, ErrKeyNotFound)

				acq, err := e.later.Acquire(context.Background(), next)
				jkNoErr(t, err)
				rtEqual(t, acq.Kind, KindAcquired)
				jkCheck(t, len(acq.Stale) == 0, "the sweeper left stale slots to the acquisition: %+v", acq.Stale)
				// A second sweep finds nothing.
				rep = e.sweep(t)
				jkCheck(t, len(rep.Removed) == 0, "second sweep removed %+v", rep.Removed)
			case Block:
				rtEqual(t, sweptIDs(rep.Expired), []string{"crashed-acme", "crashed-globex"})
				jkCheck(t, len(rep.Removed) == 0 && rep.Deleted == 0, "removed under block: %+v", rep)
				value, _, err := store.Get(context.Background(), e.svc, acmeKey.KVKey)
				jkNoErr(t, err)
				st, err := ParseState(value)
				jkNoErr(t, err)
				rtEqual(t, len(st.Active), 1)
				acq, err := e.later.Acquire(context.Background(), next)
				jkNoErr(t, err)
				rtEqual(t, acq.Kind, KindBlocked)
				rtEqual(t, acq.Reason, ReasonStaleBlocked)
			}
		})
	}
}

// TestSweeperReportsBadState: corrupt and foreign entries are reported by
// key and left alone, and do not stop the sweep of the other keys.
func TestSweeperReportsBadState(t *testing.T) {
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
	acme, err := DeriveKey(e.svc, "render", []byte(`{"tenant":"acme"}`), e.policy.Key)
	jkNoErr(t, err)
	acmeValue, _, err := store.Get(ctx, e.svc, acme.KVKey)
	jkNoErr(t, err)
	putKey(t, store, e.svc, otherKey, acmeValue)

	e.advance(time.Hour)
	rep, err := e.sweeper.Sweep(ctx, SweepRequest{Service: e.svc, JobType: "render", Policy: e.policy})
	rtEqual(t, sweptIDs(rep.Removed), []string{"crashed"})
	rtEqual(t, rep.Keys, 4)
	var bad []string
	var joined interface{ Unwrap() []error }
	if !errors.As(err, &joined) {
		t.Fatalf("error %v, want one error per bad key", err)
	}
	for _, e := range joined.Unwrap() {
		var se *StateError
		if !errors.As(e, &se) {
			t.Fatalf("error %v is not a *StateError", e)
		}
		bad = append(bad, se.KVKey)
	}
	slices.Sort(bad)
	want := []string{corruptKey, otherKey, foreignKey}
	slices.Sort(want)
	rtEqual(t, bad, want)
	jkErrorIs(t, err, ErrCorruptState)
	jkErrorIs(t, err, ErrForeignState)

	for key, value := range map[string][]byte{corruptKey: garbage, foreignKey: []byte(`{}`), otherKey: acmeValue} {
		got, _, err := store.Get(ctx, e.svc, key)
		jkNoErr(t, err)
		jkCheck(t, bytes.Equal(got, value), "%s was overwritten: %s", key, got)
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
	err := e.sweeper.Run(ctx, SweepRequest{Service: e.svc, JobType: "render", Policy: e.policy}, time.Millisecond,
		func(rep SweepReport, err error) {
			jkNoErr(t, err)
			reports = append(reports, rep)
			if len(reports) == 3 {
				cancel()
			}
		})
	if err != context.Canceled {
		t.Fatalf("Run: %v, want context.Canceled", err)
	}
	rtEqual(t, len(reports), 3)
	rtEqual(t, sweptIDs(reports[0].Removed), []string{"crashed"})
	rtEqual(t, reports[1].Keys, 0)

	req := SweepRequest{Service: e.svc, JobType: "render", Policy: e.policy}
	jkErrorIs(t, e.sweeper.Run(ctx, req, 0, func(SweepReport, error) {}), ErrInvalidRequest)
	jkErrorIs(t, e.sweeper.Run(ctx, req, time.Second, nil), ErrInvalidRequest)
	jkErrorIs(t, e.sweeper.Run(ctx, SweepRequest{Service: e.svc, JobType: "render"}, time.Second, func(SweepReport, error) {}), ErrInvalidPolicy)
	_, err = e.sweeper.Sweep(context.Background(), SweepRequest{Service: e.svc, Policy: e.policy})
	jkErrorIs(t, err, ErrInvalidName)

	_, err = NewSweeper(cCoordinator(t, struct{ Store }{NewMemoryStore()}, nil))
	jkErrorIs(t, err, ErrInvalidRequest)
	_, err = NewSweeper(nil)
	jkErrorIs(t, err, ErrInvalidRequest)
}

// cancelOnWrite cancels a context after its first successful write, as a
// shutdown that lands in the middle of a sweep.
type cancelOnWrite struct {
	*MemoryStore
	mu     sync.Mutex
	cancel context.CancelFunc
}

func (s *cancelOnWrite) wrote() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cancel != nil {
		s.cancel()
	}
}

func (s *cancelOnWrite) Update(ctx context.Context, service, key string, value []byte, revision uint64) (uint64, error) {
	rev, err := s.MemoryStore.Update(ctx, service, key, value, revision)
	if err == nil {
		s.wrote()
	}
	return rev, err
}

func (s *cancelOnWrite) Delete(ctx context.Context, service, key string, revision uint64) error {
	err := s.MemoryStore.Delete(ctx, service, key, revision)
	if err == nil {
		s.wrote()
	}
	return err
}

// TestSweeperRunReportsSweepCutShort: a sweep that removes a slot and is
// then cut short by Run's context is still reported: the removed slot's job
// must be recorded as failed by someone.
func TestSweeperRunReportsSweepCutShort(t *testing.T) {
	t.Parallel()
	store := &cancelOnWrite{MemoryStore: NewMemoryStore()}
	e := newSweepEnv(t, store, FailStale)
	e.crash(t, "acme", "crashed-acme")
	e.crash(t, "globex", "crashed-globex")
	e.advance(time.Hour)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	store.mu.Lock()
	store.cancel = cancel
	store.mu.Unlock()

	var reported []string
	err := e.sweeper.Run(ctx, SweepRequest{Service: e.svc, JobType: "render", Policy: e.policy}, time.Hour,
		func(rep SweepReport, _ error) { reported = append(reported, sweptIDs(rep.Removed)...) })
	jkErrorIs(t, err, context.Canceled)

	// Exactly one key was written before the cancellation took effect.
	var left []string
	for _, tenant := range []string{"acme", "globex"} {
		key, err := DeriveKey(e.svc, "render", []byte(`{"tenant":"`+tenant+`"}`), e.policy.Key)
		jkNoErr(t, err)
		value, _, err := store.Get(context.Background(), e.svc, key.KVKey)
		if errors.Is(err, ErrKeyNotFound) {
			continue
		}
		jkNoErr(t, err)
		st, err := ParseState(value)
		jkNoErr(t, err)
		for _, s := range st.Active {
			left = append(left, s.JobID)
		}
	}
	rtEqual(t, len(left), 1)
	removed := []string{"crashed-acme", "crashed-globex"}
	removed = slices.DeleteFunc(removed, func(id string) bool { return slices.Contains(left, id) })
	rtEqual(t, reported, removed)
}
