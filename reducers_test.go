package jobkeys

import (
	"reflect"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Reducer tables at fixed times. Every case is also run through tsOracle, a
// line-by-line transliteration of the TS original's reducers (seed 000,
// key-coordinator.ts): a case without a fix note must give the TS outcome;
// a case with one must differ from it (so the case really exercises the
// deliberate fix of docs/design/rules.md §4 it names).

// rt0 is the fixed "now" the tables are built around.
var rt0 = time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)

func rsec(n float64) time.Time { return rt0.Add(time.Duration(n * float64(time.Second))) }

// rtKey is the derived key every table uses (the fixtures' key).
var rtKey = JobKey{
	Service:    "fixtures",
	JobType:    "sync",
	DisplayKey: "tenant:acme",
	KeyHash:    "ebb59034518f7fd88ce5dfb2f428936d4972e4e4ee9108c05eabcdfb3876d3b3",
	KVKey:      "fixtures.sync.ebb59034518f7fd88ce5dfb2f428936d4972e4e4ee9108c05eabcdfb3876d3b3",
}

func rctx(id string) TraceContext {
	return TraceContext{
		RequestID:   "req-" + id,
		TraceID:     "0af7651916cd43dd8448eb211c80319c",
		Traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
	}
}

func rq(id string, created time.Time) QueuedJob {
	c := rctx(id)
	return QueuedJob{JobID: id, CreatedAt: created, RequestID: c.RequestID, Context: c}
}

// rslot is a slot of job id with token tok, started at started, whose lease
// expires at expires.
func rslot(id, tok string, started, expires time.Time) ActiveSlot {
	return ActiveSlot{JobID: id, SlotToken: tok, InstanceID: "worker-a", StartedAt: started,
		HeartbeatAt: started, LeaseExpiresAt: expires, Tries: 1, Context: rctx(id)}
}

// live and dead are slots whose lease is far from / before rt0.
func rlive(id, tok string) ActiveSlot { return rslot(id, tok, rsec(-10), rsec(110)) }
func rdead(id, tok string) ActiveSlot { return rslot(id, tok, rsec(-200), rsec(-80)) }

func rstate(maxActive, maxQueued int, active []ActiveSlot, queued []QueuedJob) *KeyState {
	return &KeyState{
		Version: StateVersion, Service: rtKey.Service, JobType: rtKey.JobType,
		DisplayKey: rtKey.DisplayKey, KeyHash: rtKey.KeyHash, MaxActive: maxActive, MaxQueuedPerKey: maxQueued,
		Active: active, Queued: queued, StaleTakeoverCount: 0, UpdatedAt: rsec(-1),
	}
}

// with returns a deep copy of s changed by f.
func rwith(s *KeyState, f func(*KeyState)) *KeyState {
	c := deepCopyState(s)
	f(c)
	return c
}

func rslots(s ...ActiveSlot) []ActiveSlot { return s }
func rqueue(q ...QueuedJob) []QueuedJob   { return q }

func mustPolicy(t testing.TB, p Policy) Policy {
	t.Helper()
	if p.Key == nil {
		p.Key = []string{"tenant", "/tenant"}
	}
	n, err := p.Normalize()
	require.NoError(t, err)
	return n
}

// deepCopyState copies s so that nothing is shared; nil stays nil, and nil
// slices stay nil.
func deepCopyState(s *KeyState) *KeyState {
	if s == nil {
		return nil
	}
	c := *s
	if s.Active != nil {
		c.Active = append([]ActiveSlot{}, s.Active...)
	}
	if s.Queued != nil {
		c.Queued = append([]QueuedJob{}, s.Queued...)
	}
	return &c
}

// normState returns a copy of s with empty slices as nil, so that expected
// and actual states compare by content.
func normState(s *KeyState) *KeyState {
	if s == nil {
		return nil
	}
	c := deepCopyState(s)
	if len(c.Active) == 0 {
		c.Active = nil
	}
	if len(c.Queued) == 0 {
		c.Queued = nil
	}
	return c
}

// sharesArray reports whether a and b have an element in common memory.
func sharesArray[T any](a, b []T) bool {
	a, b = a[:cap(a)], b[:cap(b)]
	for i := range a {
		for j := range b {
			if &a[i] == &b[j] {
				return true
			}
		}
	}
	return false
}

// checkNoAlias fails if out shares memory with in.
func checkNoAlias(t testing.TB, in, out *KeyState) {
	t.Helper()
	if in == nil || out == nil {
		return
	}
	require.True(t, !(in == out), "outcome state is the input state")
	require.True(t, !sharesArray(in.Active, out.Active), "outcome state's active slots share memory with the input")
	require.True(t, !sharesArray(in.Queued, out.Queued), "outcome state's queue shares memory with the input")
}

// runPure runs reduce on in and checks afterwards that in is unchanged (a
// deep copy is taken before) and that the outcome state does not alias it.
func runPure(t testing.TB, in *KeyState, reduce func(*KeyState) *KeyState) {
	t.Helper()
	before := deepCopyState(in)
	out := reduce(in)
	require.Equal(t, before, in, "the reducer mutated its input state")
	checkNoAlias(t, in, out)
}

// ---------------------------------------------------------------------------
// The TS original's reducers, transliterated. Times are the millisecond
// instants Date.parse gives; an outcome is expressed in the Go outcome types
// with the fields the TS outcome carries (plus Key and KeyHash as Go sets them).

func tsEmptyState(key JobKey, p Policy, now time.Time) *KeyState {
	return &KeyState{Version: 1, Service: key.Service, JobType: key.JobType, DisplayKey: key.DisplayKey,
		KeyHash: key.KeyHash, MaxActive: p.MaxActive, MaxQueuedPerKey: p.MaxQueuedPerKey,
		Active: []ActiveSlot{}, Queued: []QueuedJob{}, StaleTakeoverCount: 0, UpdatedAt: now}
}

func tsAppendQueued(state *KeyState, jobID string, ctx TraceContext, p Policy, now time.Time) *KeyState {
	s := deepCopyState(state)
	s.MaxActive = p.MaxActive
	s.MaxQueuedPerKey = p.MaxQueuedPerKey
	s.Queued = append(append([]QueuedJob{}, state.Queued...), QueuedJob{JobID: jobID, CreatedAt: now, RequestID: ctx.RequestID, Context: ctx})
	s.UpdatedAt = now
	return s
}

func tsReduceAdmission(state *KeyState, key JobKey, req AdmitRequest, p Policy, now time.Time) Admission {
	now = now.UTC().Truncate(time.Millisecond)
	if state == nil {
		state = tsEmptyState(key, p, now)
	}
	active := len(state.Active)
	queued := len(state.Queued)
	queueLimit := p.MaxQueuedPerKey + max(0, p.MaxActive-active)
	if queued < queueLimit {
		return Admission{Kind: KindAccepted, DisplayKey: state.DisplayKey, KeyHash: state.KeyHash,
			State: tsAppendQueued(state, req.JobID, req.Context, p, now)}
	}
	rejected := func() Admission {
		reason, limit := ReasonQueueDepth, queueLimit
		if active >= p.MaxActive {
			reason, limit = ReasonActiveLimit, p.MaxActive
		}
		return Admission{Kind: KindRejected, DisplayKey: state.DisplayKey, KeyHash: state.KeyHash, Reason: reason,
			Active: active, Queued: queued, Limit: limit}
	}
	if req.StrictCreate {
		return rejected()
	}
	if p.WhenFull == Coalesce {
		existing, reason := "", ReasonActiveLimit
		if len(state.Queued) > 0 {
			existing, reason = state.Queued[0].JobID, ReasonQueueFull
		} else if len(state.Active) > 0 {
			existing = state.Active[0].JobID
		}
		if existing != "" {
			return Admission{Kind: KindCoalesced, DisplayKey: state.DisplayKey, KeyHash: state.KeyHash, Reason: reason,
				Existing: &JobRef{Service: state.Service, JobType: state.JobType, ID: existing}}
		}
	}
	if p.WhenFull == ReplaceOldest && len(state.Queued) > 0 {
		replaced := state.Queued[0]
		remaining := rwith(state, func(s *KeyState) { s.Queued = append([]QueuedJob{}, state.Queued[1:]...) })
		return Admission{Kind: KindReplaced, DisplayKey: state.DisplayKey, KeyHash: state.KeyHash,
			Replaced: &ReplacedJob{JobRef: JobRef{Service: state.Service, JobType: state.JobType, ID: replaced.JobID},
				CreatedAt: replaced.CreatedAt, RequestID: replaced.RequestID, Context: replaced.Context},
			State: tsAppendQueued(remaining, req.JobID, req.Context, p, now)}
	}
	return rejected()
}

func tsReduceRestoreReplaced(state *KeyState, key JobKey, req RestoreRequest, p Policy, now time.Time) Restoration {
	now = now.UTC().Truncate(time.Millisecond)
	base := state
	if base == nil {
		base = tsEmptyState(JobKey{Service: req.Replaced.Service, JobType: req.Replaced.JobType, DisplayKey: key.DisplayKey, KeyHash: key.KeyHash}, p, now)
	}
	var without []QueuedJob
	for _, e := range base.Queued {
		if e.JobID != req.ReplacementJobID {
			without = append(without, e)
		}
	}
	present := false
	for _, e := range without {
		present = present || e.JobID == req.Replaced.ID
	}
	for _, s := range base.Active {
		present = present || s.JobID == req.Replaced.ID
	}
	restored := without
	if !present {
		restored = append([]QueuedJob{{JobID: req.Replaced.ID, CreatedAt: req.Replaced.CreatedAt,
			RequestID: req.Replaced.RequestID, Context: req.Replaced.Context}}, without...)
	}
	next := rwith(base, func(s *KeyState) {
		s.MaxActive, s.MaxQueuedPerKey, s.Queued, s.UpdatedAt = p.MaxActive, p.MaxQueuedPerKey, restored, now
	})
	return Restoration{State: next}
}

func tsReduceAcquire(state *KeyState, key JobKey, req AcquireRequest, p Policy, now time.Time, slotToken string) Acquisition {
	nowMs := now.UTC().Truncate(time.Millisecond)
	base := state
	if base == nil {
		base = tsEmptyState(key, p, nowMs)
	}
	var expired, liveSlots []ActiveSlot
	for _, s := range base.Active {
		if !s.LeaseExpiresAt.After(nowMs) { // Date.parse(leaseExpiresAt) <= nowMs
			expired = append(expired, s)
		} else {
			liveSlots = append(liveSlots, s)
		}
	}
	blocked := func(reason Reason, active, limit int) Acquisition {
		return Acquisition{Kind: KindBlocked, DisplayKey: base.DisplayKey, KeyHash: base.KeyHash, Reason: reason,
			Active: active, Queued: len(base.Queued), Limit: limit}
	}
	if len(expired) > 0 && p.StalePolicy == Block && len(base.Active) >= p.MaxActive {
		return blocked(ReasonStaleBlocked, len(base.Active), p.MaxActive)
	}
	active := base.Active
	if p.StalePolicy == FailStale {
		active = liveSlots
	}
	isQueued, isAlreadyActive := false, false
	for _, e := range base.Queued {
		isQueued = isQueued || e.JobID == req.JobID
	}
	for _, s := range base.Active {
		isAlreadyActive = isAlreadyActive || s.JobID == req.JobID
	}
	if !isQueued && !isAlreadyActive && !req.Retry {
		return blocked(ReasonNotQueued, len(active), p.MaxQueuedPerKey)
	}
	if len(active) >= p.MaxActive {
		return blocked(ReasonActiveLimit, len(active), p.MaxActive)
	}
	leaseExpiresAt := nowMs.Add(p.HeartbeatTTL)
	var queued []QueuedJob
	for _, e := range base.Queued {
		if e.JobID != req.JobID {
			queued = append(queued, e)
		}
	}
	slot := ActiveSlot{JobID: req.JobID, SlotToken: slotToken, InstanceID: req.InstanceID,
		StartedAt: nowMs, HeartbeatAt: nowMs, LeaseExpiresAt: leaseExpiresAt, Tries: req.Tries, Context: req.Context}
	next := rwith(base, func(s *KeyState) {
		s.MaxActive, s.MaxQueuedPerKey = p.MaxActive, p.MaxQueuedPerKey
		s.Active = append(append([]ActiveSlot{}, active...), slot)
		s.Queued = queued
		s.StaleTakeoverCount = base.StaleTakeoverCount + len(expired)
		s.UpdatedAt = nowMs
	})
	out := Acquisition{Kind: KindAcquired, DisplayKey: base.DisplayKey, KeyHash: base.KeyHash, State: next,
		Lease: Lease{SlotToken: slotToken}}
	if p.StalePolicy == FailStale {
		out.Stale = expired
	}
	return out
}

func tsReduceRemoveQueued(state *KeyState, jobID string, now time.Time) Removal {
	if state == nil {
		return Removal{Kind: KindNotFound}
	}
	var queued []QueuedJob
	for _, e := range state.Queued {
		if e.JobID != jobID {
			queued = append(queued, e)
		}
	}
	if len(queued) == len(state.Queued) {
		return Removal{Kind: KindNotFound}
	}
	return Removal{Kind: KindRemoved, State: rwith(state, func(s *KeyState) {
		s.Queued, s.UpdatedAt = queued, now.UTC().Truncate(time.Millisecond)
	})}
}

func tsReduceRenew(state *KeyState, jobID, slotToken string, now time.Time, p Policy) Renewal {
	if state == nil {
		return Renewal{Kind: KindLost}
	}
	nowMs := now.UTC().Truncate(time.Millisecond)
	renewed := false
	active := make([]ActiveSlot, 0, len(state.Active))
	for _, s := range state.Active {
		if s.JobID != jobID || s.SlotToken != slotToken {
			active = append(active, s)
			continue
		}
		renewed = true
		s.HeartbeatAt = nowMs
		s.LeaseExpiresAt = nowMs.Add(p.HeartbeatTTL)
		active = append(active, s)
	}
	if !renewed {
		return Renewal{Kind: KindLost}
	}
	return Renewal{Kind: KindRenewed, State: rwith(state, func(s *KeyState) { s.Active, s.UpdatedAt = active, nowMs })}
}

func tsReduceRelease(state *KeyState, jobID, slotToken string, now time.Time) ReleaseOutcome {
	if state == nil {
		return ReleaseOutcome{Kind: KindStaleCompletion}
	}
	var next []ActiveSlot
	for _, s := range state.Active {
		if s.JobID != jobID || s.SlotToken != slotToken {
			next = append(next, s)
		}
	}
	if len(next) == len(state.Active) {
		return ReleaseOutcome{Kind: KindStaleCompletion}
	}
	return ReleaseOutcome{Kind: KindReleased, State: rwith(state, func(s *KeyState) {
		s.Active, s.UpdatedAt = next, now.UTC().Truncate(time.Millisecond)
	})}
}

// Projections of outcomes onto what both implementations report.

type admissionView struct {
	Kind                  Kind
	Key                   string
	Reason                Reason
	Active, Queued, Limit int
	Existing              *JobRef
	Replaced              *ReplacedJob
	State                 *KeyState
}

func viewAdmission(a Admission) admissionView {
	return admissionView{a.Kind, a.DisplayKey, a.Reason, a.Active, a.Queued, a.Limit, a.Existing, a.Replaced, normState(a.State)}
}

type acquisitionView struct {
	Kind                  Kind
	Key                   string
	Reason                Reason
	Active, Queued, Limit int
	SlotToken             string
	Stale                 []ActiveSlot
	State                 *KeyState
}

func viewAcquisition(a Acquisition) acquisitionView {
	stale := a.Stale
	if len(stale) == 0 {
		stale = nil
	}
	return acquisitionView{a.Kind, a.DisplayKey, a.Reason, a.Active, a.Queued, a.Limit, a.Lease.SlotToken, stale, normState(a.State)}
}

// compareWithTS checks got against the TS original's outcome: equal when fix
// is empty, different otherwise.
func compareWithTS(t *testing.T, fix string, ts, got any) {
	t.Helper()
	if fix == "" {
		require.Equal(t, ts, got, "outcome differs from the TS original's")
		return
	}
	require.NotEqual(t, ts, got, "case claims a deliberate difference (%s) but matches the TS original", fix)
}

// ---------------------------------------------------------------------------

func TestReduceAdmission(t *testing.T) {
	t.Parallel()
	type tc struct {
		name   string
		policy Policy
		state  *KeyState
		job    string
		strict bool
		now    time.Time
		want   Admission
		fix    string // the docs/design/rules.md §4 fix that makes Go differ from the TS original
	}
	p := func(active, queued int, whenFull WhenFull) Policy {
		return mustPolicy(t, Policy{MaxActive: active, MaxQueuedPerKey: queued, WhenFull: whenFull})
	}
	now := rsec(5)
	key, hash := rtKey.DisplayKey, rtKey.KeyHash
	ref := func(id string) *JobRef { return &JobRef{Service: rtKey.Service, JobType: rtKey.JobType, ID: id} }
	cases := []tc{
		{
			name: "nil state: accepted, new state from the policy", policy: p(2, 1, Reject), job: "j1", now: now,
			want: Admission{Kind: KindAccepted, DisplayKey: key, KeyHash: hash,
				State: &KeyState{Version: 1, Service: "fixtures", JobType: "sync", DisplayKey: key, KeyHash: hash,
					MaxActive: 2, MaxQueuedPerKey: 1, Queued: rqueue(rq("j1", now)), UpdatedAt: now}},
		},
		{
			name: "below the limit: appended at the tail, limits from the policy, counters kept", policy: p(2, 1, Reject),
			state: rwith(rstate(3, 0, rslots(rlive("a1", "t1")), rqueue(rq("j2", rsec(-3)))), func(s *KeyState) { s.StaleTakeoverCount = 4 }),
			job:   "j3", now: now,
			want: Admission{Kind: KindAccepted, DisplayKey: key, KeyHash: hash,
				State: rwith(rstate(2, 1, rslots(rlive("a1", "t1")), rqueue(rq("j2", rsec(-3)), rq("j3", now))), func(s *KeyState) {
					s.StaleTakeoverCount, s.UpdatedAt = 4, now
				})},
		},
		{
			name: "limit is maxQueued + free slots: 2+1 with none active takes a third", policy: p(2, 1, Reject),
			state: rstate(2, 1, nil, rqueue(rq("j1", rsec(1)), rq("j2", rsec(2)))), job: "j3", now: now,
			want: Admission{Kind: KindAccepted, DisplayKey: key, KeyHash: hash,
				State: rwith(rstate(2, 1, nil, rqueue(rq("j1", rsec(1)), rq("j2", rsec(2)), rq("j3", now))), func(s *KeyState) { s.UpdatedAt = now })},
		},
		{
			name: "limit is maxQueued + free slots: full at 3, strict: queue-depth", policy: p(2, 1, Reject),
			state: rstate(2, 1, nil, rqueue(rq("j1", rsec(1)), rq("j2", rsec(2)), rq("j3", rsec(3)))), job: "j4", strict: true, now: now,
			want: Admission{Kind: KindRejected, DisplayKey: key, KeyHash: hash, Reason: ReasonQueueDepth, Active: 0, Queued: 3, Limit: 3},
		},
		{
			name: "a taken slot lowers the limit: 1+1 with one active", policy: p(2, 1, Reject),
			state: rstate(2, 1, rslots(rlive("a1", "t1")), rqueue(rq("j1", rsec(1)), rq("j2", rsec(2)))), job: "j3", strict: true, now: now,
			want: Admission{Kind: KindRejected, DisplayKey: key, KeyHash: hash, Reason: ReasonQueueDepth, Active: 1, Queued: 2, Limit: 2},
		},
		{
			name: "more active than maxActive: free slots are max(0, ...), never negative", policy: p(2, 1, Reject),
			state: rstate(3, 1, rslots(rlive("a1", "t1"), rlive("a2", "t2"), rlive("a3", "t3")), nil), job: "j1", now: now,
			want: Admission{Kind: KindAccepted, DisplayKey: key, KeyHash: hash,
				State: rwith(rstate(2, 1, rslots(rlive("a1", "t1"), rlive("a2", "t2"), rlive("a3", "t3")), rqueue(rq("j1", now))), func(s *KeyState) { s.UpdatedAt = now })},
		},
		{
			name: "more active than maxActive and the queue at maxQueued: active-limit", policy: p(2, 1, Reject),
			state: rstate(3, 1, rslots(rlive("a1", "t1"), rlive("a2", "t2"), rlive("a3", "t3")), rqueue(rq("j1", rsec(1)))), job: "j2", now: now,
			want: Admission{Kind: KindRejected, DisplayKey: key, KeyHash: hash, Reason: ReasonActiveLimit, Active: 3, Queued: 1, Limit: 2},
		},
		{
			name: "strict, every slot taken: active-limit with limit maxActive", policy: p(1, 1, Reject),
			state: rstate(1, 1, rslots(rlive("a1", "t1")), rqueue(rq("j1", rsec(1)))), job: "j2", strict: true, now: now,
			want: Admission{Kind: KindRejected, DisplayKey: key, KeyHash: hash, Reason: ReasonActiveLimit, Active: 1, Queued: 1, Limit: 1},
		},
		{
			name: "strict never coalesces", policy: p(1, 1, Coalesce),
			state: rstate(1, 1, rslots(rlive("a1", "t1")), rqueue(rq("j1", rsec(1)))), job: "j2", strict: true, now: now,
			want: Admission{Kind: KindRejected, DisplayKey: key, KeyHash: hash, Reason: ReasonActiveLimit, Active: 1, Queued: 1, Limit: 1},
		},
		{
			name: "strict never replaces", policy: p(2, 0, ReplaceOldest),
			state: rstate(2, 0, rslots(rlive("a1", "t1")), rqueue(rq("j1", rsec(1)))), job: "j2", strict: true, now: now,
			want: Admission{Kind: KindRejected, DisplayKey: key, KeyHash: hash, Reason: ReasonQueueDepth, Active: 1, Queued: 1, Limit: 1},
		},
		{
			name: "coalesce into the oldest queued job: queue-full", policy: p(1, 2, Coalesce),
			state: rstate(1, 2, rslots(rlive("a1", "t1")), rqueue(rq("j2", rsec(1)), rq("j3", rsec(2)))), job: "j4", now: now,
			want: Admission{Kind: KindCoalesced, DisplayKey: key, KeyHash: hash, Reason: ReasonQueueFull, Existing: ref("j2")},
		},
		{
			name: "coalesce with a free slot but a full queue: queue-full", policy: p(2, 0, Coalesce),
			state: rstate(2, 0, rslots(rlive("a1", "t1")), rqueue(rq("j2", rsec(1)))), job: "j4", now: now,
			want: Admission{Kind: KindCoalesced, DisplayKey: key, KeyHash: hash, Reason: ReasonQueueFull, Existing: ref("j2")},
		},
		{
			name: "coalesce with an empty queue but an active slot: into the oldest active job, active-limit", policy: p(2, 0, Coalesce),
			state: rstate(2, 0, rslots(rlive("a1", "t1"), rlive("a2", "t2")), nil), job: "j4", now: now,
			want: Admission{Kind: KindCoalesced, DisplayKey: key, KeyHash: hash, Reason: ReasonActiveLimit, Existing: ref("a1")},
		},
		{
			name: "replace-oldest: the oldest queued job is dropped and reported, the new one queued at the tail", policy: p(1, 2, ReplaceOldest),
			state: rstate(1, 2, rslots(rlive("a1", "t1")), rqueue(rq("j2", rsec(1)), rq("j3", rsec(2)))), job: "j4", now: now,
			want: Admission{Kind: KindReplaced, DisplayKey: key, KeyHash: hash,
				Replaced: &ReplacedJob{JobRef: *ref("j2"), CreatedAt: rsec(1), RequestID: "req-j2", Context: rctx("j2")},
				State:    rwith(rstate(1, 2, rslots(rlive("a1", "t1")), rqueue(rq("j3", rsec(2)), rq("j4", now))), func(s *KeyState) { s.UpdatedAt = now })},
		},
		{
			name: "replace-oldest with an empty queue: rejected active-limit", policy: p(1, 0, ReplaceOldest),
			state: rstate(1, 0, rslots(rlive("a1", "t1")), nil), job: "j4", now: now,
			want: Admission{Kind: KindRejected, DisplayKey: key, KeyHash: hash, Reason: ReasonActiveLimit, Active: 1, Queued: 0, Limit: 1},
		},
		{
			name: "reject, non-strict, a slot free: queue-depth", policy: p(2, 0, Reject),
			state: rstate(2, 0, rslots(rlive("a1", "t1")), rqueue(rq("j2", rsec(1)))), job: "j4", now: now,
			want: Admission{Kind: KindRejected, DisplayKey: key, KeyHash: hash, Reason: ReasonQueueDepth, Active: 1, Queued: 1, Limit: 1},
		},
		{
			name: "reject, non-strict, every slot taken: active-limit", policy: p(1, 1, Reject),
			state: rstate(1, 1, rslots(rlive("a1", "t1")), rqueue(rq("j2", rsec(1)))), job: "j4", now: now,
			want: Admission{Kind: KindRejected, DisplayKey: key, KeyHash: hash, Reason: ReasonActiveLimit, Active: 1, Queued: 1, Limit: 1},
		},
		{
			name: "expired slots still count as active for admission", policy: mustPolicy(t, Policy{MaxActive: 1, StalePolicy: Block}),
			state: rstate(1, 0, rslots(rdead("a1", "t1")), nil), job: "j4", now: now,
			want: Admission{Kind: KindRejected, DisplayKey: key, KeyHash: hash, Reason: ReasonActiveLimit, Active: 1, Queued: 0, Limit: 1},
		},
		{
			name: "now is cut to milliseconds as a JavaScript date", policy: p(1, 0, Reject), job: "j1", now: rsec(5).Add(999999 * time.Nanosecond),
			want: Admission{Kind: KindAccepted, DisplayKey: key, KeyHash: hash,
				State: &KeyState{Version: 1, Service: "fixtures", JobType: "sync", DisplayKey: key, KeyHash: hash,
					MaxActive: 1, Queued: rqueue(rq("j1", rsec(5.000))), UpdatedAt: rsec(5)}},
		},
		{
			name: "fix 1: a job already queued is not queued twice", policy: p(2, 2, Reject),
			state: rstate(2, 2, nil, rqueue(rq("j1", rsec(1)))), job: "j1", now: now,
			want: Admission{Kind: KindAccepted, DisplayKey: key, KeyHash: hash, AlreadyPresent: true},
			fix:  "fix 1",
		},
		{
			name: "fix 1: a job already active is not queued", policy: p(2, 2, Reject),
			state: rstate(2, 2, rslots(rlive("j1", "t1")), nil), job: "j1", now: now,
			want: Admission{Kind: KindAccepted, DisplayKey: key, KeyHash: hash, AlreadyPresent: true},
			fix:  "fix 1",
		},
		{
			name: "fix 1: a job already queued in a full queue is present, not rejected", policy: p(1, 0, Reject),
			state: rstate(1, 0, rslots(rlive("a1", "t1")), rqueue(rq("j1", rsec(1)))), job: "j1", strict: true, now: now,
			want: Admission{Kind: KindAccepted, DisplayKey: key, KeyHash: hash, AlreadyPresent: true},
			fix:  "fix 1",
		},
		{
			name: "fix 1: replace-oldest does not replace a job with itself", policy: p(1, 0, ReplaceOldest),
			state: rstate(1, 0, rslots(rlive("a1", "t1")), rqueue(rq("j1", rsec(1)))), job: "j1", now: now,
			want: Admission{Kind: KindAccepted, DisplayKey: key, KeyHash: hash, AlreadyPresent: true},
			fix:  "fix 1",
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			req := AdmitRequest{Service: rtKey.Service, JobType: rtKey.JobType, JobID: c.job, Context: rctx(c.job), StrictCreate: c.strict}
			var got Admission
			runPure(t, c.state, func(s *KeyState) *KeyState {
				got = ReduceAdmission(s, rtKey, req, c.policy, c.now)
				return got.State
			})
			require.Equal(t, viewAdmission(c.want), viewAdmission(got))
			require.Equal(t, c.want.KeyHash, got.KeyHash)
			require.Equal(t, c.want.AlreadyPresent, got.AlreadyPresent)
			compareWithTS(t, c.fix, viewAdmission(tsReduceAdmission(deepCopyState(c.state), rtKey, req, c.policy, c.now)), viewAdmission(got))
		})
	}
}

// A job admitted without a trace context gets one the TS original accepts:
// requestId is the job id, traceId 32 hex digits, traceparent W3C version 00.
func TestReduceAdmissionDerivesMissingContext(t *testing.T) {
	t.Parallel()
	p := mustPolicy(t, Policy{MaxActive: 1})
	got := ReduceAdmission(nil, rtKey, AdmitRequest{JobID: "job-7"}, p, rt0)
	require.Equal(t, KindAccepted, got.Kind)
	require.Equal(t, 1, len(got.State.Queued), "length of got.State.Queued")
	q := got.State.Queued[0]
	require.Equal(t, "job-7", q.RequestID)
	require.Equal(t, "job-7", q.Context.RequestID)
	require.Regexp(t, `^[0-9a-f]{32}$`, q.Context.TraceID)
	require.Regexp(t, `^00-`+regexp.QuoteMeta(q.Context.TraceID)+`-[0-9a-f]{16}-0[01]$`, q.Context.Traceparent)

	// Deterministic: the same job gets the same derived context.
	again := ReduceAdmission(nil, rtKey, AdmitRequest{JobID: "job-7"}, p, rsec(9))
	require.Equal(t, q.Context, again.State.Queued[0].Context)

	// A partial context keeps what it has.
	part := ReduceAdmission(nil, rtKey, AdmitRequest{JobID: "job-8", Context: TraceContext{RequestID: "r-8", Tracestate: "k=v"}}, p, rt0)
	pc := part.State.Queued[0]
	require.Equal(t, "r-8", pc.RequestID)
	require.Equal(t, "r-8", pc.Context.RequestID)
	require.Equal(t, "k=v", pc.Context.Tracestate)
	require.True(t, pc.Context.TraceID != "", "pc.Context.TraceID is empty")
	require.True(t, pc.Context.Traceparent != "", "pc.Context.Traceparent is empty")
}

func TestReduceAcquire(t *testing.T) {
	t.Parallel()
	type tc struct {
		name   string
		policy Policy
		state  *KeyState
		job    string
		retry  bool
		now    time.Time
		want   Acquisition
		fix    string
	}
	const tok = "tok-new"
	failStale := func(active, queued int) Policy {
		return mustPolicy(t, Policy{MaxActive: active, MaxQueuedPerKey: queued})
	}
	block := func(active, queued int) Policy {
		return mustPolicy(t, Policy{MaxActive: active, MaxQueuedPerKey: queued, StalePolicy: Block})
	}
	key, hash := rtKey.DisplayKey, rtKey.KeyHash
	// newSlot is the slot the acquisition at rt0 creates for job id.
	newSlot := func(id string) ActiveSlot {
		return ActiveSlot{JobID: id, SlotToken: tok, InstanceID: "worker-b", StartedAt: rt0, HeartbeatAt: rt0,
			LeaseExpiresAt: rsec(120), Tries: 3, Context: rctx(id)}
	}
	acquired := func(p Policy, id string, next *KeyState, stale ...ActiveSlot) Acquisition {
		next.UpdatedAt = rt0
		return Acquisition{Kind: KindAcquired, DisplayKey: key, KeyHash: hash, State: next, Stale: stale,
			Lease: Lease{Service: rtKey.Service, JobType: rtKey.JobType, JobID: id, DisplayKey: key, KeyHash: hash,
				SlotToken: tok, Policy: p, LeaseExpiresAt: rsec(120)}}
	}
	blocked := func(reason Reason, active, queued, limit int) Acquisition {
		return Acquisition{Kind: KindBlocked, DisplayKey: key, KeyHash: hash, Reason: reason, Active: active, Queued: queued, Limit: limit}
	}
	stale := func(s *KeyState, n int) *KeyState { s.StaleTakeoverCount = n; return s }
	cases := []tc{
		{
			name: "nil state, not queued, not a retry: not-queued with limit maxQueuedPerKey", policy: failStale(2, 3), job: "j1",
			want: blocked(ReasonNotQueued, 0, 0, 3),
		},
		{
			name: "nil state, a retry: acquired in a new state", policy: failStale(2, 3), job: "j1", retry: true,
			want: acquired(failStale(2, 3), "j1", rstate(2, 3, rslots(newSlot("j1")), nil)),
		},
		{
			name: "queued job with a free slot: acquired, leaves the queue, slot at the tail, limits from the policy", policy: failStale(2, 3),
			state: rstate(5, 0, rslots(rlive("a1", "t1")), rqueue(rq("j1", rsec(-5)), rq("j2", rsec(-4)))), job: "j1",
			want: acquired(failStale(2, 3), "j1", rstate(2, 3, rslots(rlive("a1", "t1"), newSlot("j1")), rqueue(rq("j2", rsec(-4))))),
		},
		{
			name: "every slot live: active-limit", policy: failStale(1, 3),
			state: rstate(1, 3, rslots(rlive("a1", "t1")), rqueue(rq("j1", rsec(-5)))), job: "j1",
			want: blocked(ReasonActiveLimit, 1, 1, 1),
		},
		{
			name: "neither queued nor active nor a retry: not-queued, counting live slots under fail-stale", policy: failStale(2, 3),
			state: rstate(2, 3, rslots(rlive("a1", "t1"), rdead("a2", "t2")), rqueue(rq("j2", rsec(-4)))), job: "j9",
			want: blocked(ReasonNotQueued, 1, 1, 3),
		},
		{
			name: "a retry that is not queued: acquired, queue untouched", policy: failStale(1, 3),
			state: rstate(1, 3, nil, rqueue(rq("j2", rsec(-4)))), job: "j1", retry: true,
			want: acquired(failStale(1, 3), "j1", rstate(1, 3, rslots(newSlot("j1")), rqueue(rq("j2", rsec(-4))))),
		},
		{
			name: "fail-stale: another job's expired slot is dropped, reported and counted", policy: failStale(1, 3),
			state: stale(rstate(1, 3, rslots(rdead("a1", "t1")), rqueue(rq("j1", rsec(-5)))), 2), job: "j1",
			want: acquired(failStale(1, 3), "j1", stale(rstate(1, 3, rslots(newSlot("j1")), nil), 3), rdead("a1", "t1")),
		},
		{
			name: "a lease expiring exactly now is expired (TS <=)", policy: failStale(1, 3),
			state: rstate(1, 3, rslots(rslot("a1", "t1", rsec(-120), rt0)), rqueue(rq("j1", rsec(-5)))), job: "j1",
			want: acquired(failStale(1, 3), "j1", stale(rstate(1, 3, rslots(newSlot("j1")), nil), 1), rslot("a1", "t1", rsec(-120), rt0)),
		},
		{
			name: "a lease expiring 1ms after now is live", policy: failStale(1, 3),
			state: rstate(1, 3, rslots(rslot("a1", "t1", rsec(-120), rt0.Add(time.Millisecond))), rqueue(rq("j1", rsec(-5)))), job: "j1",
			want: blocked(ReasonActiveLimit, 1, 1, 1),
		},
		{
			name: "a lease expiring within the same millisecond as now is expired (now is cut to ms)", policy: failStale(1, 3),
			state: rstate(1, 3, rslots(rslot("a1", "t1", rsec(-120), rt0)), rqueue(rq("j1", rsec(-5)))), job: "j1", now: rt0.Add(999 * time.Microsecond),
			want: acquired(failStale(1, 3), "j1", stale(rstate(1, 3, rslots(newSlot("j1")), nil), 1), rslot("a1", "t1", rsec(-120), rt0)),
		},
		{
			name: "fail-stale: two expired slots dropped beside a live one", policy: failStale(2, 3),
			state: rstate(3, 3, rslots(rdead("a2", "t2"), rlive("a1", "t1"), rdead("a3", "t3")), rqueue(rq("j1", rsec(-5)))), job: "j1",
			want: acquired(failStale(2, 3), "j1", stale(rstate(2, 3, rslots(rlive("a1", "t1"), newSlot("j1")), nil), 2), rdead("a2", "t2"), rdead("a3", "t3")),
		},
		{
			name: "fail-stale blocked by live slots: expired ones are left for later (nothing written)", policy: failStale(1, 3),
			state: rstate(2, 3, rslots(rlive("a1", "t1"), rdead("a2", "t2")), rqueue(rq("j1", rsec(-5)))), job: "j1",
			want: blocked(ReasonActiveLimit, 1, 1, 1),
		},
		{
			name: "block: an expired slot at capacity blocks: stale-blocked", policy: block(1, 3),
			state: rstate(1, 3, rslots(rdead("a1", "t1")), rqueue(rq("j1", rsec(-5)))), job: "j1",
			want: blocked(ReasonStaleBlocked, 1, 1, 1),
		},
		{
			name: "block: stale-blocked is decided before not-queued", policy: block(1, 3),
			state: rstate(1, 3, rslots(rdead("a1", "t1")), nil), job: "j9",
			want: blocked(ReasonStaleBlocked, 1, 0, 1),
		},
		{
			name: "block: below capacity, not-queued counts the expired slot", policy: block(2, 3),
			state: rstate(2, 3, rslots(rdead("a1", "t1")), nil), job: "j9",
			want: blocked(ReasonNotQueued, 1, 0, 3),
		},
		{
			name: "block: no expired slot, at capacity: active-limit", policy: block(1, 3),
			state: rstate(1, 3, rslots(rlive("a1", "t1")), rqueue(rq("j1", rsec(-5)))), job: "j1",
			want: blocked(ReasonActiveLimit, 1, 1, 1),
		},
		{
			name: "fix 3: block keeps an expired slot below capacity: not reported, not counted", policy: block(2, 3),
			state: stale(rstate(2, 3, rslots(rdead("a1", "t1")), rqueue(rq("j1", rsec(-5)))), 5), job: "j1",
			want: acquired(block(2, 3), "j1", stale(rstate(2, 3, rslots(rdead("a1", "t1"), newSlot("j1")), nil), 5)),
			fix:  "fix 3",
		},
		{
			name: "fix 2: a job whose own slot is live cannot take a second one", policy: failStale(2, 3),
			state: rstate(2, 3, rslots(rlive("j1", "t-old")), nil), job: "j1",
			want: blocked(ReasonAlreadyActive, 1, 0, 2),
			fix:  "fix 2",
		},
		{
			name: "fix 2: ... not as a retry either, nor when also queued", policy: failStale(3, 3),
			state: rstate(3, 3, rslots(rlive("j1", "t-old")), rqueue(rq("j1", rsec(-5)))), job: "j1", retry: true,
			want: blocked(ReasonAlreadyActive, 1, 1, 3),
			fix:  "fix 2",
		},
		{
			name: "fix 2: the job's own expired slot is replaced by its retry (fail-stale): counted, not reported", policy: failStale(1, 3),
			state: rstate(1, 3, rslots(rdead("j1", "t-old")), nil), job: "j1", retry: true,
			want: acquired(failStale(1, 3), "j1", stale(rstate(1, 3, rslots(newSlot("j1")), nil), 1)),
			fix:  "fix 2",
		},
		{
			name: "fix 2: an own expired slot makes the job a retry without the flag", policy: failStale(2, 3),
			state: rstate(2, 3, rslots(rlive("a1", "t1"), rdead("j1", "t-old")), nil), job: "j1",
			want: acquired(failStale(2, 3), "j1", stale(rstate(2, 3, rslots(rlive("a1", "t1"), newSlot("j1")), nil), 1)),
			fix:  "fix 2",
		},
		{
			name: "fix 2: block: the own expired slot at capacity is replaced, not stale-blocked", policy: block(1, 3),
			state: rstate(1, 3, rslots(rdead("j1", "t-old")), nil), job: "j1", retry: true,
			want: acquired(block(1, 3), "j1", stale(rstate(1, 3, rslots(newSlot("j1")), nil), 1)),
			fix:  "fix 2",
		},
		{
			name: "fix 2: block: own expired slot replaced, another expired slot kept below capacity", policy: block(2, 3),
			state: rstate(2, 3, rslots(rdead("a1", "t1"), rdead("j1", "t-old")), nil), job: "j1", retry: true,
			want: acquired(block(2, 3), "j1", stale(rstate(2, 3, rslots(rdead("a1", "t1"), newSlot("j1")), nil), 1)),
			fix:  "fix 2",
		},
		{
			name: "fix 2: block: own expired slot and another expired slot at capacity: stale-blocked", policy: block(1, 3),
			state: rstate(1, 3, rslots(rdead("a1", "t1"), rdead("j1", "t-old")), nil), job: "j1", retry: true,
			want: blocked(ReasonStaleBlocked, 2, 0, 1),
		},
		{
			name: "fix 2: fail-stale: own and another expired slot both go, only the other is reported", policy: failStale(1, 3),
			state: rstate(1, 3, rslots(rdead("a1", "t1"), rdead("j1", "t-old")), nil), job: "j1", retry: true,
			want: acquired(failStale(1, 3), "j1", stale(rstate(1, 3, rslots(newSlot("j1")), nil), 2), rdead("a1", "t1")),
			fix:  "fix 2",
		},
		{
			// The TS original (defect 2) can write two slots for one job;
			// the Go side must still refuse a third while one of them is live.
			name: "fix 2: two slots of the job as the TS original writes them, the later one live: already-active", policy: failStale(3, 3),
			state: rstate(3, 3, rslots(rdead("j1", "t-a"), rlive("j1", "t-b")), nil), job: "j1", retry: true,
			want: blocked(ReasonAlreadyActive, 2, 0, 3),
			fix:  "fix 2",
		},
		{
			name: "queued twice (as the TS original can write): every entry leaves the queue", policy: failStale(1, 3),
			state: rstate(1, 3, nil, rqueue(rq("j1", rsec(-5)), rq("j2", rsec(-4)), rq("j1", rsec(-3)))), job: "j1",
			want: acquired(failStale(1, 3), "j1", rstate(1, 3, rslots(newSlot("j1")), rqueue(rq("j2", rsec(-4))))),
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			now := c.now
			if now.IsZero() {
				now = rt0
			}
			req := AcquireRequest{Service: rtKey.Service, JobType: rtKey.JobType, JobID: c.job, Context: rctx(c.job),
				Retry: c.retry, Tries: 3, InstanceID: "worker-b"}
			var got Acquisition
			runPure(t, c.state, func(s *KeyState) *KeyState {
				got = ReduceAcquire(s, rtKey, req, c.policy, now, tok)
				if got.State != nil {
					require.True(t, !sharesArray(got.Stale, got.State.Active), "Stale aliases the new state")
				}
				if c.state != nil {
					require.True(t, !sharesArray(got.Stale, c.state.Active), "Stale aliases the input state")
				}
				return got.State
			})
			require.Equal(t, viewAcquisition(c.want), viewAcquisition(got))
			require.Equal(t, c.want.Lease, got.Lease)
			require.Equal(t, c.want.KeyHash, got.KeyHash)
			compareWithTS(t, c.fix, viewAcquisition(tsReduceAcquire(deepCopyState(c.state), rtKey, req, c.policy, now, tok)), viewAcquisition(got))
		})
	}
}

// The slot of a job acquired without a trace context carries a derived one
// (the TS original requires it), and the lease expiry is cut to ms.
func TestReduceAcquireContextAndExpiry(t *testing.T) {
	t.Parallel()
	p := mustPolicy(t, Policy{MaxActive: 1, HeartbeatInterval: time.Second, HeartbeatTTL: 1500 * time.Microsecond * 1000})
	now := rt0.Add(123456789 * time.Nanosecond)
	got := ReduceAcquire(nil, rtKey, AcquireRequest{JobID: "j1", Retry: true, InstanceID: "w"}, p, now, "tok")
	require.Equal(t, KindAcquired, got.Kind)
	s := got.State.Active[0]
	require.Equal(t, rt0.Add(123*time.Millisecond), s.StartedAt)
	require.Equal(t, rt0.Add(123*time.Millisecond+1500*time.Millisecond), s.LeaseExpiresAt)
	require.Equal(t, s.LeaseExpiresAt, got.Lease.LeaseExpiresAt)
	require.Equal(t, "j1", s.Context.RequestID)
	require.Regexp(t, `^[0-9a-f]{32}$`, s.Context.TraceID)
	require.True(t, s.Context.Traceparent != "", "s.Context.Traceparent is empty")
}

func TestReduceRenew(t *testing.T) {
	t.Parallel()
	p := mustPolicy(t, Policy{MaxActive: 2})
	short := mustPolicy(t, Policy{MaxActive: 2, HeartbeatInterval: time.Second, HeartbeatTTL: 10 * time.Second})
	lease := func(id, tok string, p Policy) Lease {
		return Lease{Service: rtKey.Service, JobType: rtKey.JobType, JobID: id, DisplayKey: rtKey.DisplayKey, KeyHash: rtKey.KeyHash, SlotToken: tok, Policy: p}
	}
	renewed := func(s ActiveSlot, ttl time.Duration) ActiveSlot {
		s.HeartbeatAt, s.LeaseExpiresAt = rt0, rt0.Add(ttl)
		return s
	}
	two := rstate(2, 0, rslots(rlive("a1", "t1"), rlive("j1", "t2")), rqueue(rq("q1", rsec(-1))))
	cases := []struct {
		name  string
		state *KeyState
		lease Lease
		want  Renewal
	}{
		{name: "nil state: lost", lease: lease("j1", "t2", p), want: Renewal{Kind: KindLost}},
		{name: "matching job and token: renewed by the TTL, others untouched", state: two, lease: lease("j1", "t2", p),
			want: Renewal{Kind: KindRenewed, LeaseExpiresAt: rsec(120),
				State: rwith(two, func(s *KeyState) { s.Active[1] = renewed(s.Active[1], 120*time.Second); s.UpdatedAt = rt0 })}},
		{name: "the lease's own policy TTL is used", state: two, lease: lease("j1", "t2", short),
			want: Renewal{Kind: KindRenewed, LeaseExpiresAt: rsec(10),
				State: rwith(two, func(s *KeyState) { s.Active[1] = renewed(s.Active[1], 10*time.Second); s.UpdatedAt = rt0 })}},
		{name: "same job, another token (taken over): lost", state: two, lease: lease("j1", "t1", p), want: Renewal{Kind: KindLost}},
		{name: "same token, another job: lost", state: two, lease: lease("a2", "t2", p), want: Renewal{Kind: KindLost}},
		{name: "an expired slot not yet taken over is renewed (as in the TS original)",
			state: rstate(1, 0, rslots(rdead("j1", "t9")), nil), lease: lease("j1", "t9", p),
			want: Renewal{Kind: KindRenewed, LeaseExpiresAt: rsec(120),
				State: rwith(rstate(1, 0, rslots(rdead("j1", "t9")), nil), func(s *KeyState) { s.Active[0] = renewed(s.Active[0], 120*time.Second); s.UpdatedAt = rt0 })}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var got Renewal
			runPure(t, c.state, func(s *KeyState) *KeyState {
				got = ReduceRenew(s, c.lease, rt0)
				return got.State
			})
			require.Equal(t, c.want.Kind, got.Kind)
			require.Equal(t, c.want.LeaseExpiresAt, got.LeaseExpiresAt)
			require.Equal(t, normState(c.want.State), normState(got.State))
			ts := tsReduceRenew(deepCopyState(c.state), c.lease.JobID, c.lease.SlotToken, rt0, c.lease.Policy)
			require.Equal(t, ts.Kind, got.Kind, "TS original")
			require.Equal(t, normState(ts.State), normState(got.State), "TS original")
		})
	}
}

func TestReduceRelease(t *testing.T) {
	t.Parallel()
	lease := func(id, tok string) Lease {
		return Lease{Service: rtKey.Service, JobType: rtKey.JobType, JobID: id, KeyHash: rtKey.KeyHash, SlotToken: tok}
	}
	two := rstate(2, 0, rslots(rlive("a1", "t1"), rlive("j1", "t2")), rqueue(rq("q1", rsec(-1))))
	cases := []struct {
		name  string
		state *KeyState
		lease Lease
		want  ReleaseOutcome
	}{
		{name: "nil state: stale completion", lease: lease("j1", "t2"), want: ReleaseOutcome{Kind: KindStaleCompletion}},
		{name: "matching job and token: released, the rest kept", state: two, lease: lease("j1", "t2"),
			want: ReleaseOutcome{Kind: KindReleased, State: rwith(two, func(s *KeyState) { s.Active = rslots(rlive("a1", "t1")); s.UpdatedAt = rt0 })}},
		{name: "same job, another token: stale completion", state: two, lease: lease("j1", "t1"), want: ReleaseOutcome{Kind: KindStaleCompletion}},
		{name: "same token, another job: stale completion", state: two, lease: lease("a9", "t2"), want: ReleaseOutcome{Kind: KindStaleCompletion}},
		{name: "an expired slot not yet taken over is released", state: rstate(1, 0, rslots(rdead("j1", "t9")), nil), lease: lease("j1", "t9"),
			want: ReleaseOutcome{Kind: KindReleased, State: rwith(rstate(1, 0, nil, nil), func(s *KeyState) { s.UpdatedAt = rt0 })}},
		{name: "two slots of one job (TS-written): only the token's slot goes",
			state: rstate(3, 0, rslots(rdead("j1", "t8"), rlive("j1", "t9")), nil), lease: lease("j1", "t9"),
			want: ReleaseOutcome{Kind: KindReleased, State: rwith(rstate(3, 0, rslots(rdead("j1", "t8")), nil), func(s *KeyState) { s.UpdatedAt = rt0 })}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var got ReleaseOutcome
			runPure(t, c.state, func(s *KeyState) *KeyState {
				got = ReduceRelease(s, c.lease, rt0)
				return got.State
			})
			require.Equal(t, c.want.Kind, got.Kind)
			require.Equal(t, normState(c.want.State), normState(got.State))
			ts := tsReduceRelease(deepCopyState(c.state), c.lease.JobID, c.lease.SlotToken, rt0)
			require.Equal(t, ts.Kind, got.Kind, "TS original")
			require.Equal(t, normState(ts.State), normState(got.State), "TS original")
		})
	}
	// Releasing the last slot of a key with nothing queued leaves an empty
	// state, which the coordinator deletes.
	got := ReduceRelease(rstate(1, 0, rslots(rlive("j1", "t1")), nil), lease("j1", "t1"), rt0)
	require.Equal(t, KindReleased, got.Kind)
	require.True(t, got.State.Empty())
}

func TestReduceRemoveQueued(t *testing.T) {
	t.Parallel()
	st := rwith(rstate(2, 3, rslots(rlive("a1", "t1")), rqueue(rq("j1", rsec(-3)), rq("j2", rsec(-2)), rq("j3", rsec(-1)))), func(s *KeyState) { s.StaleTakeoverCount = 2 })
	cases := []struct {
		name  string
		state *KeyState
		job   string
		want  Removal
	}{
		{name: "nil state: not found", job: "j1", want: Removal{Kind: KindNotFound}},
		{name: "not queued: not found", state: st, job: "j9", want: Removal{Kind: KindNotFound}},
		{name: "active but not queued: not found", state: st, job: "a1", want: Removal{Kind: KindNotFound}},
		{name: "queued in the middle: removed, order kept, limits and counters kept", state: st, job: "j2",
			want: Removal{Kind: KindRemoved, State: rwith(st, func(s *KeyState) { s.Queued = rqueue(rq("j1", rsec(-3)), rq("j3", rsec(-1))); s.UpdatedAt = rt0 })}},
		{name: "queued twice (TS-written): both entries removed",
			state: rstate(1, 0, nil, rqueue(rq("j1", rsec(-3)), rq("j2", rsec(-2)), rq("j1", rsec(-1)))), job: "j1",
			want: Removal{Kind: KindRemoved, State: rwith(rstate(1, 0, nil, rqueue(rq("j2", rsec(-2)))), func(s *KeyState) { s.UpdatedAt = rt0 })}},
		{name: "the only queued job: an empty state", state: rstate(1, 0, nil, rqueue(rq("j1", rsec(-3)))), job: "j1",
			want: Removal{Kind: KindRemoved, State: rwith(rstate(1, 0, nil, nil), func(s *KeyState) { s.UpdatedAt = rt0 })}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var got Removal
			runPure(t, c.state, func(s *KeyState) *KeyState {
				got = ReduceRemoveQueued(s, c.job, rt0)
				return got.State
			})
			require.Equal(t, c.want.Kind, got.Kind)
			require.Equal(t, normState(c.want.State), normState(got.State))
			ts := tsReduceRemoveQueued(deepCopyState(c.state), c.job, rt0)
			require.Equal(t, ts.Kind, got.Kind, "TS original")
			require.Equal(t, normState(ts.State), normState(got.State), "TS original")
		})
	}
}

func TestReduceRestoreReplaced(t *testing.T) {
	t.Parallel()
	p := mustPolicy(t, Policy{MaxActive: 1, MaxQueuedPerKey: 2, WhenFull: ReplaceOldest})
	replaced := ReplacedJob{JobRef: JobRef{Service: rtKey.Service, JobType: rtKey.JobType, ID: "j2"},
		CreatedAt: rsec(-9), RequestID: "req-j2", Context: rctx("j2")}
	cases := []struct {
		name        string
		state       *KeyState
		replacement string
		replaced    ReplacedJob
		want        Restoration
		// goNoWrite: Go writes nothing where the TS original rewrites the
		// same state with a new updatedAt (not one of the six fixes).
		goNoWrite bool
	}{
		{
			name:  "the replacement leaves the queue, the replaced job returns to its head",
			state: rstate(1, 2, rslots(rlive("a1", "t1")), rqueue(rq("j3", rsec(-5)), rq("j4", rsec(-1)))), replacement: "j4", replaced: replaced,
			want: Restoration{State: rwith(rstate(1, 2, rslots(rlive("a1", "t1")), rqueue(rq("j2", rsec(-9)), rq("j3", rsec(-5)))), func(s *KeyState) { s.UpdatedAt = rt0 })},
		},
		{
			name: "nil state: a new state holding the replaced job", replacement: "j4", replaced: replaced,
			want: Restoration{State: rwith(rstate(1, 2, nil, rqueue(rq("j2", rsec(-9)))), func(s *KeyState) { s.UpdatedAt = rt0 })},
		},
		{
			name:  "the replaced job is queued again already: not twice",
			state: rstate(1, 2, nil, rqueue(rq("j2", rsec(-9)), rq("j4", rsec(-1)))), replacement: "j4", replaced: replaced,
			want: Restoration{State: rwith(rstate(1, 2, nil, rqueue(rq("j2", rsec(-9)))), func(s *KeyState) { s.UpdatedAt = rt0 })},
		},
		{
			name:  "the replaced job is active: not queued",
			state: rstate(1, 2, rslots(rlive("j2", "t2")), rqueue(rq("j4", rsec(-1)))), replacement: "j4", replaced: replaced,
			want: Restoration{State: rwith(rstate(1, 2, rslots(rlive("j2", "t2")), nil), func(s *KeyState) { s.UpdatedAt = rt0 })},
		},
		{
			name:  "the replacement is no longer queued: the replaced job still returns",
			state: rstate(1, 2, rslots(rlive("j4", "t4")), rqueue(rq("j3", rsec(-5)))), replacement: "j4", replaced: replaced,
			want: Restoration{State: rwith(rstate(1, 2, rslots(rlive("j4", "t4")), rqueue(rq("j2", rsec(-9)), rq("j3", rsec(-5)))), func(s *KeyState) { s.UpdatedAt = rt0 })},
		},
		{
			name:  "limits are taken from the policy",
			state: rstate(4, 0, nil, rqueue(rq("j4", rsec(-1)))), replacement: "j4", replaced: replaced,
			want: Restoration{State: rwith(rstate(1, 2, nil, rqueue(rq("j2", rsec(-9)))), func(s *KeyState) { s.UpdatedAt = rt0 })},
		},
		{
			name:  "nothing to change: nothing written",
			state: rstate(1, 2, nil, rqueue(rq("j2", rsec(-9)))), replacement: "j4", replaced: replaced,
			want: Restoration{}, goNoWrite: true,
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			req := RestoreRequest{Service: rtKey.Service, JobType: rtKey.JobType, ReplacementJobID: c.replacement, Replaced: c.replaced}
			var got Restoration
			runPure(t, c.state, func(s *KeyState) *KeyState {
				got = ReduceRestoreReplaced(s, rtKey, req, p, rt0)
				return got.State
			})
			require.Equal(t, normState(c.want.State), normState(got.State))
			ts := tsReduceRestoreReplaced(deepCopyState(c.state), rtKey, req, p, rt0)
			if c.goNoWrite {
				require.True(t, got.State == nil, "got.State is not nil")
				require.Equal(t, normState(rwith(c.state, func(s *KeyState) { s.UpdatedAt = rt0 })), normState(ts.State),
					"the TS original changes only updatedAt here")
				return
			}
			require.Equal(t, normState(ts.State), normState(got.State), "TS original")
		})
	}

	t.Run("missing request id and context of the replaced job are derived; createdAt cut to ms", func(t *testing.T) {
		r := ReplacedJob{JobRef: JobRef{ID: "j7"}, CreatedAt: rsec(-9).Add(1500 * time.Microsecond)}
		got := ReduceRestoreReplaced(nil, rtKey, RestoreRequest{ReplacementJobID: "j8", Replaced: r}, p, rt0)
		require.Equal(t, 1, len(got.State.Queued), "length of got.State.Queued")
		q := got.State.Queued[0]
		require.Equal(t, rsec(-9).Add(time.Millisecond), q.CreatedAt)
		require.Equal(t, "j7", q.RequestID)
		require.Equal(t, "j7", q.Context.RequestID)
		require.True(t, q.Context.TraceID != "", "q.Context.TraceID is empty")
		require.True(t, q.Context.Traceparent != "", "q.Context.Traceparent is empty")
	})
}

// Mutating an outcome's state must not reach back into the input.
func TestReducersOutcomeDoesNotAliasInput(t *testing.T) {
	t.Parallel()
	p := mustPolicy(t, Policy{MaxActive: 3, MaxQueuedPerKey: 3, WhenFull: ReplaceOldest})
	in := rstate(3, 3, rslots(rlive("a1", "t1"), rlive("a2", "t2")), rqueue(rq("j1", rsec(-3)), rq("j2", rsec(-2))))
	before := deepCopyState(in)
	lease := Lease{JobID: "a1", SlotToken: "t1", Policy: p}
	outs := []*KeyState{
		ReduceAdmission(in, rtKey, AdmitRequest{JobID: "j3", Context: rctx("j3")}, p, rt0).State,
		ReduceAcquire(in, rtKey, AcquireRequest{JobID: "j1", InstanceID: "w"}, p, rt0, "tok").State,
		ReduceRenew(in, lease, rt0).State,
		ReduceRelease(in, lease, rt0).State,
		ReduceRemoveQueued(in, "j2", rt0).State,
		ReduceRestoreReplaced(in, rtKey, RestoreRequest{ReplacementJobID: "j2", Replaced: ReplacedJob{JobRef: JobRef{ID: "j0"}, RequestID: "r", Context: rctx("j0")}}, p, rt0).State,
	}
	for i, out := range outs {
		require.True(t, out != nil, "outcome %d", i)
		for j := range out.Active[:cap(out.Active)] {
			out.Active[:cap(out.Active)][j] = ActiveSlot{JobID: "mutated"}
		}
		for j := range out.Queued[:cap(out.Queued)] {
			out.Queued[:cap(out.Queued)][j] = QueuedJob{JobID: "mutated"}
		}
		require.True(t, reflect.DeepEqual(before, in), "mutating outcome %d changed the input state", i)
	}
}
