package jobkeys

// An independent, sequential model of the keyed concurrency rules, written
// from docs/design/rules.md §4 and the TS original (seeds/000_*.txt) without calling the
// reducers, and a test that runs random operation sequences through both and
// demands the same outcome and the same state after every step. The
// linearizability test (system_linearizability_test.go) uses the same model as its
// sequential specification.
//
// Reproduce a failing run with JOBKEYS_SEED=<seed printed by the test>;
// JOBKEYS_LONG=1 runs many more and longer sequences.

import (
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// modelSlot is the model's active slot. Times are Unix milliseconds, as the
// TS original's Date.parse sees them.
type modelSlot struct {
	job, token, instance        string
	started, heartbeat, expires int64
	tries                       int
	ctx                         TraceContext // as requested; completed on the wire
}

// modelQueued is the model's queued entry.
type modelQueued struct {
	job       string
	created   int64
	requestID string
	ctx       TraceContext // as requested
}

// modelState is the model's key state. The zero of a pointer to it (nil)
// is an absent key; a state that empties is absent again (DESIGN §4.6).
type modelState struct {
	maxActive, maxQueued int
	active               []modelSlot
	queued               []modelQueued
	takeovers            int
	updated              int64
}

// modelPolicy is the part of a policy the rules read.
type modelPolicy struct {
	maxActive, maxQueued int
	whenFull             WhenFull
	stale                StalePolicy
	ttl                  int64 // ms
}

// modelResult is what one operation does in the model.
type modelResult struct {
	kind                  Kind
	already               bool
	reason                Reason
	active, queued, limit int
	existing              string       // coalesced: the job folded into
	replaced              *modelQueued // replaced: the dropped entry
	stale                 []modelSlot  // acquired: other jobs' slots dropped
	expires               int64        // acquired, renewed
	// changed says whether the operation writes; next is the state after
	// it (nil: absent).
	changed bool
	next    *modelState
}

func (s *modelState) copyState() *modelState {
	c := *s
	c.active = slices.Clone(s.active)
	c.queued = slices.Clone(s.queued)
	return &c
}

func (s *modelState) hasQueued(job string) bool {
	return s != nil && slices.ContainsFunc(s.queued, func(q modelQueued) bool { return q.job == job })
}

func (s *modelState) hasActive(job string) bool {
	return s != nil && slices.ContainsFunc(s.active, func(a modelSlot) bool { return a.job == job })
}

// modelSettle turns a written state into what the store holds afterwards: an
// empty state is deleted.
func modelSettle(r modelResult) modelResult {
	if r.changed && r.next != nil && len(r.next.active) == 0 && len(r.next.queued) == 0 {
		r.next = nil
	}
	return r
}

func modelFresh(p modelPolicy, now int64) *modelState {
	return &modelState{maxActive: p.maxActive, maxQueued: p.maxQueued, updated: now}
}

func modelRequestID(ctx TraceContext, job string) string {
	if ctx.RequestID != "" {
		return ctx.RequestID
	}
	return job
}

// modelAdmit: a job already queued or active is accepted without a second
// entry. Otherwise the queue may hold maxQueued plus the free slots; below
// that the job joins the queue's tail. A full queue rejects a strict create;
// otherwise coalesce names the oldest queued job (or, none queued, the
// oldest active one), replace-oldest drops the head of the queue for the new
// job, and anything else rejects.
func modelAdmit(s *modelState, job string, strict bool, ctx TraceContext, p modelPolicy, now int64) modelResult {
	if s.hasQueued(job) || s.hasActive(job) {
		return modelResult{kind: KindAccepted, already: true, next: s}
	}
	base := s
	if base == nil {
		base = modelFresh(p, now)
	}
	nActive, nQueued := len(base.active), len(base.queued)
	free := p.maxActive - nActive
	if free < 0 {
		free = 0
	}
	room := p.maxQueued + free // the queue's capacity; "unbounded" beyond MaxInt
	if p.maxQueued > math.MaxInt-free {
		room = math.MaxInt
	}
	enqueue := func(from []modelQueued) modelResult {
		n := base.copyState()
		n.queued = append(slices.Clone(from), modelQueued{job: job, created: now, requestID: modelRequestID(ctx, job), ctx: ctx})
		n.maxActive, n.maxQueued, n.updated = p.maxActive, p.maxQueued, now
		return modelResult{kind: KindAccepted, changed: true, next: n}
	}
	if nQueued < room {
		return enqueue(base.queued)
	}
	if !strict && p.whenFull == Coalesce {
		if nQueued > 0 {
			return modelResult{kind: KindCoalesced, existing: base.queued[0].job, reason: ReasonQueueFull, next: s}
		}
		if nActive > 0 {
			return modelResult{kind: KindCoalesced, existing: base.active[0].job, reason: ReasonActiveLimit, next: s}
		}
	}
	if !strict && p.whenFull == ReplaceOldest && nQueued > 0 {
		head := base.queued[0]
		r := enqueue(base.queued[1:])
		r.kind, r.replaced = KindReplaced, &head
		return r
	}
	r := modelResult{kind: KindRejected, active: nActive, queued: nQueued, next: s}
	if nActive >= p.maxActive {
		r.reason, r.limit = ReasonActiveLimit, p.maxActive
	} else {
		r.reason, r.limit = ReasonQueueDepth, room
	}
	return r
}

// modelAcquire: a slot is stale when its lease expired at or before now.
// A job whose own slot is live cannot take another; its own stale slot is
// replaced by the new one (a retry). Other jobs' stale slots are dropped
// and reported under fail-stale; under block they stay, count as taken, and
// block everyone while the key is at capacity. Only a queued job, a job
// with an (own, stale) slot, or an explicit retry may acquire.
func modelAcquire(s *modelState, job string, retry bool, tries int, instance string, ctx TraceContext, p modelPolicy, now int64, token string) modelResult {
	base := s
	if base == nil {
		base = modelFresh(p, now)
	}
	var own *modelSlot
	var liveOthers, staleOthers []modelSlot
	for i := range base.active {
		a := base.active[i]
		switch {
		case a.job == job:
			own = &base.active[i]
		case a.expires <= now:
			staleOthers = append(staleOthers, a)
		default:
			liveOthers = append(liveOthers, a)
		}
	}
	nQueued := len(base.queued)
	blocked := func(reason Reason, active, limit int) modelResult {
		return modelResult{kind: KindBlocked, reason: reason, active: active, queued: nQueued, limit: limit, next: s}
	}
	if own != nil && own.expires > now {
		return blocked(ReasonAlreadyActive, len(base.active), p.maxActive)
	}
	holding := len(liveOthers) // slots that count against maxActive
	if p.stale == Block {
		holding += len(staleOthers)
		if len(staleOthers) > 0 && holding >= p.maxActive {
			return blocked(ReasonStaleBlocked, len(base.active), p.maxActive)
		}
	}
	queued := base.hasQueued(job)
	if !queued && own == nil && !retry {
		return blocked(ReasonNotQueued, holding, p.maxQueued)
	}
	if holding >= p.maxActive {
		return blocked(ReasonActiveLimit, holding, p.maxActive)
	}
	n := base.copyState()
	n.active = n.active[:0]
	var dropped []modelSlot
	for _, a := range base.active {
		if a.job == job {
			continue // own stale slot: replaced
		}
		if p.stale == FailStale && a.expires <= now {
			dropped = append(dropped, a)
			continue
		}
		n.active = append(n.active, a)
	}
	taken := len(dropped)
	if own != nil {
		taken++
	}
	n.queued = slices.DeleteFunc(slices.Clone(base.queued), func(q modelQueued) bool { return q.job == job })
	expires := now + p.ttl
	n.active = append(n.active, modelSlot{job: job, token: token, instance: instance, started: now, heartbeat: now, expires: expires, tries: tries, ctx: ctx})
	n.maxActive, n.maxQueued = p.maxActive, p.maxQueued
	n.takeovers += taken
	n.updated = now
	return modelResult{kind: KindAcquired, stale: dropped, expires: expires, changed: true, next: n}
}

// modelRenew: the slot with the lease's job id and token gets a new lease
// (even if it has expired, as long as nobody took it over); else lost.
func modelRenew(s *modelState, job, token string, ttl, now int64) modelResult {
	if s == nil {
		return modelResult{kind: KindLost}
	}
	for i, a := range s.active {
		if a.job == job && a.token == token {
			n := s.copyState()
			n.active[i].heartbeat, n.active[i].expires = now, now+ttl
			n.updated = now
			return modelResult{kind: KindRenewed, expires: now + ttl, changed: true, next: n}
		}
	}
	return modelResult{kind: KindLost, next: s}
}

// modelRelease: the slot with the lease's job id and token is freed; else
// the completion is stale.
func modelRelease(s *modelState, job, token string, now int64) modelResult {
	if s == nil {
		return modelResult{kind: KindStaleCompletion}
	}
	for i, a := range s.active {
		if a.job == job && a.token == token {
			n := s.copyState()
			n.active = slices.Delete(n.active, i, i+1)
			n.updated = now
			return modelResult{kind: KindReleased, changed: true, next: n}
		}
	}
	return modelResult{kind: KindStaleCompletion, next: s}
}

// modelRemove: a queued job leaves the queue; else not found.
func modelRemove(s *modelState, job string, now int64) modelResult {
	if !s.hasQueued(job) {
		return modelResult{kind: KindNotFound, next: s}
	}
	n := s.copyState()
	n.queued = slices.DeleteFunc(n.queued, func(q modelQueued) bool { return q.job == job })
	n.updated = now
	return modelResult{kind: KindRemoved, changed: true, next: n}
}

// modelRestore: the replacing job leaves the queue and the replaced entry
// goes back to its head, unless that job is queued or active already. A
// restore that changes nothing writes nothing.
func modelRestore(s *modelState, replacement string, replaced modelQueued, p modelPolicy, now int64) modelResult {
	base := s
	if base == nil {
		base = modelFresh(p, now)
	}
	q := slices.DeleteFunc(slices.Clone(base.queued), func(e modelQueued) bool { return e.job == replacement })
	back := &modelState{queued: q}
	if !back.hasQueued(replaced.job) && !base.hasActive(replaced.job) {
		q = append([]modelQueued{replaced}, q...)
	}
	if s != nil && len(q) == len(s.queued) && s.maxActive == p.maxActive && s.maxQueued == p.maxQueued {
		same := true
		for i := range q {
			same = same && q[i] == s.queued[i]
		}
		if same {
			return modelResult{kind: modelKindRestored, next: s}
		}
	}
	n := base.copyState()
	n.queued = q
	n.maxActive, n.maxQueued, n.updated = p.maxActive, p.maxQueued, now
	return modelResult{kind: modelKindRestored, changed: true, next: n}
}

// ---- conversion and comparison with the library's types ----

func modelMs(t time.Time) int64 { return t.UnixMilli() }

// modelFromState converts a reducer state to the model's representation.
// Contexts are copied as they are; compare them with modelContextMatches.
func modelFromState(s *KeyState) *modelState {
	if s == nil {
		return nil
	}
	m := &modelState{maxActive: s.MaxActive, maxQueued: s.MaxQueuedPerKey, takeovers: s.StaleTakeoverCount, updated: modelMs(s.UpdatedAt)}
	for _, a := range s.Active {
		m.active = append(m.active, modelSlot{job: a.JobID, token: a.SlotToken, instance: a.InstanceID,
			started: modelMs(a.StartedAt), heartbeat: modelMs(a.HeartbeatAt), expires: modelMs(a.LeaseExpiresAt), tries: a.Tries, ctx: a.Context})
	}
	for _, q := range s.Queued {
		m.queued = append(m.queued, modelQueued{job: q.JobID, created: modelMs(q.CreatedAt), requestID: q.RequestID, ctx: q.Context})
	}
	return m
}

// modelContextMatches reports whether got is what the library should hold for a
// requested context want: want itself when complete, else want completed
// with a request id (the job id when missing), a 32-hex trace id and a
// traceparent.
func modelContextMatches(want, got TraceContext, job string) bool {
	if want == got {
		return true // kept as it was
	}
	if want.RequestID != "" && want.TraceID != "" && want.Traceparent != "" {
		return want == got
	}
	if got.RequestID != modelRequestID(want, job) || got.Tracestate != want.Tracestate {
		return false
	}
	if want.TraceID != "" && got.TraceID != want.TraceID || want.Traceparent != "" && got.Traceparent != want.Traceparent {
		return false
	}
	return len(got.TraceID) == 32 && strings.HasPrefix(got.Traceparent, "00-")
}

// modelDiffStates describes how a library state differs from the model's, or
// returns "".
func modelDiffStates(want *modelState, got *KeyState) string {
	g := modelFromState(got)
	if want == nil || g == nil {
		if want == nil && g == nil {
			return ""
		}
		return fmt.Sprintf("state: want %s, got %s", want.describe(), g.describe())
	}
	if len(want.active) == len(g.active) {
		for i := range want.active {
			if !modelContextMatches(want.active[i].ctx, g.active[i].ctx, want.active[i].job) {
				return fmt.Sprintf("active[%d].context: requested %+v, got %+v", i, want.active[i].ctx, g.active[i].ctx)
			}
			g.active[i].ctx = want.active[i].ctx
		}
	}
	if len(want.queued) == len(g.queued) {
		for i := range want.queued {
			if !modelContextMatches(want.queued[i].ctx, g.queued[i].ctx, want.queued[i].job) {
				return fmt.Sprintf("queued[%d].context: requested %+v, got %+v", i, want.queued[i].ctx, g.queued[i].ctx)
			}
			g.queued[i].ctx = want.queued[i].ctx
		}
	}
	if !modelEqual(want, g) {
		return fmt.Sprintf("state:\n want %s\n  got %s", want.describe(), g.describe())
	}
	return ""
}

// describe is a canonical, readable encoding of a state (contexts left out).
func (s *modelState) describe() string {
	if s == nil {
		return "<absent>"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "{max %d/%d takeovers %d updated %d active [", s.maxActive, s.maxQueued, s.takeovers, s.updated)
	for i, a := range s.active {
		if i > 0 {
			b.WriteString(" ")
		}
		fmt.Fprintf(&b, "%s/%s@%s %d-%d-%d t%d", a.job, a.token, a.instance, a.started, a.heartbeat, a.expires, a.tries)
	}
	b.WriteString("] queued [")
	for i, q := range s.queued {
		if i > 0 {
			b.WriteString(" ")
		}
		fmt.Fprintf(&b, "%s@%d/%s", q.job, q.created, q.requestID)
	}
	b.WriteString("]}")
	return b.String()
}

func (s *modelState) hash() uint64 {
	h := fnv.New64a()
	h.Write([]byte(s.describe()))
	return h.Sum64()
}

func modelSlotIDs(slots []modelSlot) string {
	var parts []string
	for _, a := range slots {
		parts = append(parts, a.job+"/"+a.token)
	}
	return strings.Join(parts, ",")
}

func modelActiveIDs(slots []ActiveSlot) string {
	var parts []string
	for _, a := range slots {
		parts = append(parts, a.JobID+"/"+a.SlotToken)
	}
	return strings.Join(parts, ",")
}

// The diff functions compare an outcome with the model's result and return
// "" or what differs. They do not compare the outcome's State; modelDiffStates
// does.

func modelDiffAdmission(want modelResult, got Admission, job string) string {
	var d []string
	check := func(what string, w, g any) {
		if !reflect.DeepEqual(w, g) {
			d = append(d, fmt.Sprintf("%s: want %v, got %v", what, w, g))
		}
	}
	check("kind", want.kind, got.Kind)
	check("already present", want.already, got.AlreadyPresent)
	check("reason", want.reason, got.Reason)
	check("active", want.active, got.Active)
	check("queued", want.queued, got.Queued)
	check("limit", want.limit, got.Limit)
	existing := ""
	if got.Existing != nil {
		existing = got.Existing.ID
	}
	check("existing", want.existing, existing)
	switch {
	case (want.replaced == nil) != (got.Replaced == nil):
		d = append(d, fmt.Sprintf("replaced: want %v, got %v", want.replaced, got.Replaced))
	case want.replaced != nil:
		r := want.replaced
		check("replaced", fmt.Sprint(r.job, " ", r.created, " ", r.requestID),
			fmt.Sprint(got.Replaced.ID, " ", modelMs(got.Replaced.CreatedAt), " ", got.Replaced.RequestID))
		if !modelContextMatches(r.ctx, got.Replaced.Context, r.job) {
			d = append(d, fmt.Sprintf("replaced context: requested %+v, got %+v", r.ctx, got.Replaced.Context))
		}
	}
	if want.changed != (got.State != nil) {
		d = append(d, fmt.Sprintf("writes: want %v, got State %v", want.changed, got.State != nil))
	}
	return strings.Join(d, "; ")
}

func modelDiffAcquisition(want modelResult, got Acquisition, job, token string) string {
	var d []string
	check := func(what string, w, g any) {
		if !reflect.DeepEqual(w, g) {
			d = append(d, fmt.Sprintf("%s: want %v, got %v", what, w, g))
		}
	}
	check("kind", want.kind, got.Kind)
	check("reason", want.reason, got.Reason)
	check("active", want.active, got.Active)
	check("queued", want.queued, got.Queued)
	check("limit", want.limit, got.Limit)
	check("stale", modelSlotIDs(want.stale), modelActiveIDs(got.Stale))
	if want.kind == KindAcquired {
		check("lease job", job, got.Lease.JobID)
		check("lease token", token, got.Lease.SlotToken)
		check("lease expiry", want.expires, modelMs(got.Lease.LeaseExpiresAt))
	} else if !reflect.DeepEqual(got.Lease, Lease{}) {
		d = append(d, fmt.Sprintf("lease: want none, got %+v", got.Lease))
	}
	if want.changed != (got.State != nil) {
		d = append(d, fmt.Sprintf("writes: want %v, got State %v", want.changed, got.State != nil))
	}
	return strings.Join(d, "; ")
}

func modelDiffSimple(want modelResult, kind Kind, expires time.Time, state *KeyState) string {
	var d []string
	if want.kind != kind {
		d = append(d, fmt.Sprintf("kind: want %v, got %v", want.kind, kind))
	}
	if want.kind == KindRenewed && want.expires != modelMs(expires) {
		d = append(d, fmt.Sprintf("lease expiry: want %d, got %d", want.expires, modelMs(expires)))
	}
	if want.changed != (state != nil) {
		d = append(d, fmt.Sprintf("writes: want %v, got State %v", want.changed, state != nil))
	}
	return strings.Join(d, "; ")
}

// ---- seeds and sizes ----

// reliabilitySeed returns the seed of a randomized test: JOBKEYS_SEED if set, else
// a random one. It is logged so that a failure can be reproduced.
func reliabilitySeed(t testing.TB) uint64 {
	t.Helper()
	seed := rand.Uint64()
	if v := os.Getenv("JOBKEYS_SEED"); v != "" {
		s, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("JOBKEYS_SEED=%q is not an unsigned integer: %v", v, err)
		}
		seed = s
	}
	t.Logf("seed %d (reproduce with JOBKEYS_SEED=%d)", seed, seed)
	return seed
}

// reliabilityLong reports whether JOBKEYS_LONG=1 asks for the long version of the
// randomized and fault tests.
func reliabilityLong() bool { return os.Getenv("JOBKEYS_LONG") == "1" }

// ---- the model test ----

var modelKey = JobKey{Service: "svc", JobType: "type", DisplayKey: "tenant:7",
	KeyHash: strings.Repeat("ab", 32), KVKey: "svc.type." + strings.Repeat("ab", 32)}

// modelRun holds one random sequence: the policy family, the state as the
// reducers and as the model see it, and what the generator remembers.
type modelRun struct {
	rng      *rand.Rand
	base     modelPolicy
	now      time.Time
	state    *KeyState
	model    *modelState
	tokens   int
	leases   []Lease            // every lease ever handed out
	replaced []modelRestoreCase // every replacement seen
	trace    []string
	coverage map[string]int
}

type modelRestoreCase struct {
	replacement string
	replaced    ReplacedJob
}

var modelJobs = []string{"j0", "j1", "j2", "j3", "j4", "j5"}

func (r *modelRun) pick(n int) int { return r.rng.IntN(n) }

func (r *modelRun) job() string { return modelJobs[r.pick(len(modelJobs))] }

// policyFor returns the policy of an operation: usually the run's, now and
// then a changed one (a deploy changing the limits).
func (r *modelRun) policyFor() modelPolicy {
	p := r.base
	if r.pick(10) == 0 {
		p.maxActive = 1 + r.pick(3)
		p.maxQueued = r.pick(4)
		p.whenFull = []WhenFull{Reject, Coalesce, ReplaceOldest}[r.pick(3)]
		p.stale = []StalePolicy{FailStale, Block}[r.pick(2)]
	}
	return p
}

func (p modelPolicy) policy(t testing.TB) Policy {
	t.Helper()
	pol, err := Policy{Key: []string{"tenant", "/id"}, MaxActive: p.maxActive, MaxQueuedPerKey: p.maxQueued,
		WhenFull: p.whenFull, StalePolicy: p.stale,
		HeartbeatTTL: time.Duration(p.ttl) * time.Millisecond, HeartbeatInterval: time.Duration(p.ttl) * time.Millisecond / 3}.Normalize()
	if err != nil {
		t.Fatalf("policy %+v: %v", p, err)
	}
	return pol
}

func (r *modelRun) context(job string) TraceContext {
	switch r.pick(4) {
	case 0:
		return TraceContext{}
	case 1:
		return TraceContext{RequestID: "req-" + job}
	default:
		return TraceContext{RequestID: "req-" + job, TraceID: fmt.Sprintf("%032x", r.rng.Uint64()),
			Traceparent: "00-" + fmt.Sprintf("%032x", r.rng.Uint64()) + "-00f067aa0ba902b7-01", Tracestate: []string{"", "k=v"}[r.pick(2)]}
	}
}

// advance moves the clock: a little, past every lease, or onto (or next to)
// a lease's expiry, where "stale" begins.
func (r *modelRun) advance() string {
	var d time.Duration
	switch r.pick(6) {
	case 0, 1:
		d = time.Duration(r.rng.Int64N(int64(80 * time.Millisecond)))
	case 2:
		d = time.Duration(r.base.ttl)*time.Millisecond + time.Duration(r.rng.Int64N(int64(time.Second)))
	default:
		if r.state == nil || len(r.state.Active) == 0 {
			d = time.Duration(r.rng.Int64N(int64(time.Second)))
			break
		}
		exp := r.state.Active[r.pick(len(r.state.Active))].LeaseExpiresAt
		target := exp.Add(time.Duration(r.pick(3)-1) * time.Millisecond).Add(time.Duration(r.rng.Int64N(int64(time.Millisecond))))
		d = target.Sub(r.now)
	}
	if d > 0 {
		r.now = r.now.Add(d)
	}
	return fmt.Sprintf("clock +%v -> %d", d, modelMs(r.now))
}

// leaseFor picks the lease of a renew or release: a slot's own, an old
// one, or one with the wrong token or the wrong job.
func (r *modelRun) leaseFor(t testing.TB) Lease {
	var held []Lease
	if r.state != nil {
		for _, a := range r.state.Active {
			for _, l := range r.leases {
				if l.SlotToken == a.SlotToken && l.JobID == a.JobID {
					held = append(held, l)
				}
			}
		}
	}
	pol := r.base.policy(t)
	switch n := r.pick(10); {
	case n < 5 && len(held) > 0:
		return held[r.pick(len(held))]
	case n < 7 && len(r.leases) > 0:
		return r.leases[r.pick(len(r.leases))]
	case n < 8 && len(held) > 0:
		l := held[r.pick(len(held))]
		l.SlotToken = "forged-token"
		return l
	case n < 9 && len(held) > 0:
		l := held[r.pick(len(held))]
		l.JobID = r.job()
		return l
	}
	return Lease{Service: modelKey.Service, JobType: modelKey.JobType, JobID: r.job(), DisplayKey: modelKey.DisplayKey,
		KeyHash: modelKey.KeyHash, SlotToken: fmt.Sprintf("tok-%d", r.pick(r.tokens+1)), Policy: pol}
}

func (r *modelRun) fail(t testing.TB, seed uint64, seq int, what string) {
	t.Helper()
	start := max(0, len(r.trace)-25)
	t.Fatalf("seed %d sequence %d step %d: %s\npolicy %+v\nlast steps:\n  %s\nreproduce: JOBKEYS_SEED=%d go test -race -run TestModelAgreesWithReducers .",
		seed, seq, len(r.trace), what, r.base, strings.Join(r.trace[start:], "\n  "), seed)
}

// apply commits an outcome's state as the coordinator would (an empty state
// is deleted) and checks it against the model's.
func (r *modelRun) apply(t testing.TB, seed uint64, seq int, before *KeyState, want modelResult, got *KeyState) {
	t.Helper()
	want = modelSettle(want)
	next := before
	if got != nil {
		if got.Empty() {
			next = nil
		} else {
			next = got
		}
		if next != nil && r.pick(4) == 0 {
			// the state must survive the wire: encode, parse, compare
			parsed, err := ParseState(appendState(nil, got))
			if err != nil {
				r.fail(t, seed, seq, fmt.Sprintf("new state does not parse back: %v", err))
			}
			if d := modelDiffStates(modelFromState(got), parsed); d != "" {
				r.fail(t, seed, seq, "new state changes on the wire: "+d)
			}
		}
	}
	if d := modelDiffStates(want.next, next); d != "" {
		r.fail(t, seed, seq, d)
	}
	r.state, r.model = next, want.next
}

func (r *modelRun) step(t testing.TB, seed uint64, seq int) {
	t.Helper()
	now := r.now
	ms := modelMs(now)
	before := r.state
	var snapshot *KeyState
	if before != nil {
		snapshot = before.clone()
	}
	pure := func(what string) { // the reducers must not touch their input
		if before != nil && !reflect.DeepEqual(snapshot, before) {
			r.fail(t, seed, seq, what+" modified its input state")
		}
	}
	cover := func(k Kind, extra string) { r.coverage[string(k)+extra]++ }
	switch op := r.pick(100); {
	case op < 28: // admit
		mp := r.policyFor()
		job := r.job()
		strict, ctx := r.pick(4) == 0, r.context(job)
		req := AdmitRequest{Service: modelKey.Service, JobType: modelKey.JobType, JobID: job, Context: ctx, StrictCreate: strict}
		r.trace = append(r.trace, fmt.Sprintf("admit %s strict=%v policy=%+v at %d", job, strict, mp, ms))
		got := ReduceAdmission(r.state, modelKey, req, mp.policy(t), now)
		again := ReduceAdmission(r.state, modelKey, req, mp.policy(t), now)
		pure("ReduceAdmission")
		if !reflect.DeepEqual(got, again) {
			r.fail(t, seed, seq, "ReduceAdmission is not deterministic")
		}
		want := modelAdmit(r.model, job, strict, ctx, mp, ms)
		if d := modelDiffAdmission(want, got, job); d != "" {
			r.fail(t, seed, seq, "admission: "+d)
		}
		extra := string(got.Reason)
		if got.AlreadyPresent {
			extra = "already"
		}
		if strict {
			extra += "/strict"
		}
		cover(got.Kind, "/"+extra)
		if got.Replaced != nil {
			r.replaced = append(r.replaced, modelRestoreCase{replacement: job, replaced: *got.Replaced})
		}
		r.trace[len(r.trace)-1] += fmt.Sprintf(" -> %s %s", got.Kind, got.Reason)
		r.apply(t, seed, seq, before, want, got.State)
	case op < 52: // acquire
		mp := r.policyFor()
		job := r.job()
		retry, tries, inst, ctx := r.pick(5) == 0, r.pick(4), fmt.Sprintf("w%d", r.pick(3)), r.context(job)
		r.tokens++
		token := fmt.Sprintf("tok-%d", r.tokens)
		req := AcquireRequest{Service: modelKey.Service, JobType: modelKey.JobType, JobID: job, Context: ctx, Retry: retry, Tries: tries, InstanceID: inst}
		r.trace = append(r.trace, fmt.Sprintf("acquire %s retry=%v token=%s policy=%+v at %d", job, retry, token, mp, ms))
		got := ReduceAcquire(r.state, modelKey, req, mp.policy(t), now, token)
		again := ReduceAcquire(r.state, modelKey, req, mp.policy(t), now, token)
		pure("ReduceAcquire")
		if !reflect.DeepEqual(got, again) {
			r.fail(t, seed, seq, "ReduceAcquire is not deterministic")
		}
		want := modelAcquire(r.model, job, retry, tries, inst, ctx, mp, ms, token)
		if d := modelDiffAcquisition(want, got, job, token); d != "" {
			r.fail(t, seed, seq, "acquisition: "+d)
		}
		extra := "/" + string(got.Reason) + "/" + string(mp.stale)
		if len(got.Stale) > 0 {
			extra += "/took-over-stale"
		}
		if got.Kind == KindAcquired && r.model.hasActive(job) {
			extra += "/own-retry"
		}
		cover(got.Kind, extra)
		if got.Kind == KindAcquired {
			// An acquisition never leaves more slots than its policy allows
			// (stale ones count under Block; FailStale dropped them).
			if n := len(got.State.Active); n > mp.maxActive {
				r.fail(t, seed, seq, fmt.Sprintf("acquisition left %d slots, maxActive is %d", n, mp.maxActive))
			}
			if got.Lease.Policy.HeartbeatTTL != time.Duration(mp.ttl)*time.Millisecond {
				r.fail(t, seed, seq, fmt.Sprintf("lease policy TTL %v, want %dms", got.Lease.Policy.HeartbeatTTL, mp.ttl))
			}
			r.leases = append(r.leases, got.Lease)
		}
		r.trace[len(r.trace)-1] += fmt.Sprintf(" -> %s %s stale=[%s]", got.Kind, got.Reason, modelActiveIDs(got.Stale))
		r.apply(t, seed, seq, before, want, got.State)
	case op < 64: // renew
		l := r.leaseFor(t)
		r.trace = append(r.trace, fmt.Sprintf("renew %s/%s at %d", l.JobID, l.SlotToken, ms))
		got := ReduceRenew(r.state, l, now)
		pure("ReduceRenew")
		want := modelRenew(r.model, l.JobID, l.SlotToken, l.Policy.HeartbeatTTL.Milliseconds(), ms)
		if d := modelDiffSimple(want, got.Kind, got.LeaseExpiresAt, got.State); d != "" {
			r.fail(t, seed, seq, "renewal: "+d)
		}
		cover(got.Kind, "")
		r.trace[len(r.trace)-1] += " -> " + string(got.Kind)
		r.apply(t, seed, seq, before, want, got.State)
	case op < 78: // release
		l := r.leaseFor(t)
		r.trace = append(r.trace, fmt.Sprintf("release %s/%s at %d", l.JobID, l.SlotToken, ms))
		got := ReduceRelease(r.state, l, now)
		pure("ReduceRelease")
		want := modelRelease(r.model, l.JobID, l.SlotToken, ms)
		if d := modelDiffSimple(want, got.Kind, time.Time{}, got.State); d != "" {
			r.fail(t, seed, seq, "release: "+d)
		}
		cover(got.Kind, "")
		r.trace[len(r.trace)-1] += " -> " + string(got.Kind)
		r.apply(t, seed, seq, before, want, got.State)
	case op < 85: // remove
		job := r.job()
		r.trace = append(r.trace, fmt.Sprintf("remove %s at %d", job, ms))
		got := ReduceRemoveQueued(r.state, job, now)
		pure("ReduceRemoveQueued")
		want := modelRemove(r.model, job, ms)
		if d := modelDiffSimple(want, got.Kind, time.Time{}, got.State); d != "" {
			r.fail(t, seed, seq, "removal: "+d)
		}
		cover(got.Kind, "")
		r.trace[len(r.trace)-1] += " -> " + string(got.Kind)
		r.apply(t, seed, seq, before, want, got.State)
	case op < 90: // restore
		mp := r.policyFor()
		var rc modelRestoreCase
		if len(r.replaced) > 0 && r.pick(4) != 0 {
			rc = r.replaced[r.pick(len(r.replaced))]
		} else {
			// Two different jobs: a job cannot replace itself (admitting a
			// queued id is accepted as already present).
			i := r.pick(len(modelJobs))
			job, replacement := modelJobs[i], modelJobs[(i+1+r.pick(len(modelJobs)-1))%len(modelJobs)]
			rc = modelRestoreCase{replacement: replacement, replaced: ReplacedJob{
				JobRef:    JobRef{Service: modelKey.Service, JobType: modelKey.JobType, ID: job},
				CreatedAt: now.Add(-time.Duration(r.rng.Int64N(int64(time.Hour)))), RequestID: []string{"", "req-" + job}[r.pick(2)],
				Context: r.context(job)}}
		}
		req := RestoreRequest{Service: modelKey.Service, JobType: modelKey.JobType, ReplacementJobID: rc.replacement, Replaced: rc.replaced}
		r.trace = append(r.trace, fmt.Sprintf("restore %s replacing %s policy=%+v at %d", rc.replaced.ID, rc.replacement, mp, ms))
		got := ReduceRestoreReplaced(r.state, modelKey, req, mp.policy(t), now)
		pure("ReduceRestoreReplaced")
		rq := modelQueued{job: rc.replaced.ID, created: modelMs(rc.replaced.CreatedAt), ctx: rc.replaced.Context}
		rq.requestID = rc.replaced.RequestID
		if rq.requestID == "" {
			rq.requestID = modelRequestID(rc.replaced.Context, rc.replaced.ID)
		}
		want := modelRestore(r.model, rc.replacement, rq, mp, ms)
		if d := modelDiffSimple(want, modelKindRestored, time.Time{}, got.State); d != "" {
			r.fail(t, seed, seq, "restoration: "+d)
		}
		cover(modelKindRestored, fmt.Sprintf("/writes=%v", got.State != nil))
		r.trace[len(r.trace)-1] += " -> " + string(modelKindRestored)
		r.apply(t, seed, seq, before, want, got.State)
	default:
		r.trace = append(r.trace, r.advance())
	}
}

// TestModelAgreesWithReducers runs random operation sequences (admit, strict
// and not, under every WhenFull; acquire, with and without retry, under both
// stale policies; renew and release with right and wrong tokens; remove;
// restore; clock steps onto and past lease expiries; now and then a changed
// policy) through the exported reducers and through the independent model,
// and demands the same outcome and state after every step. It also checks
// that the reducers neither modify their input nor depend on anything but
// it, and that every state they produce survives the wire codec.
func TestModelAgreesWithReducers(t *testing.T) {
	t.Parallel()
	seed := reliabilitySeed(t)
	sequences, steps := 250, 60
	if reliabilityLong() {
		sequences, steps = 8000, 200
	}
	coverage := map[string]int{}
	ops := 0
	for seq := range sequences {
		rng := rand.New(rand.NewPCG(seed, uint64(seq)))
		r := &modelRun{rng: rng, coverage: coverage,
			now: time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC).Add(time.Duration(rng.Int64N(int64(time.Second))))}
		r.base = modelPolicy{maxActive: 1 + r.pick(3), maxQueued: r.pick(4),
			whenFull: []WhenFull{Reject, Coalesce, ReplaceOldest}[r.pick(3)],
			stale:    []StalePolicy{FailStale, Block}[r.pick(2)], ttl: int64(100 + r.pick(2000))}
		for range steps {
			r.step(t, seed, seq)
			ops++
		}
	}
	t.Logf("%d sequences, %d steps; outcomes: %v", sequences, ops, coverage)
	// The generator must reach every branch, or agreement proves little.
	for _, k := range []string{
		"accepted/", "accepted/already", "accepted//strict", "rejected/active-limit", "rejected/queue-depth",
		"rejected/active-limit/strict", "coalesced/queue-full", "coalesced/active-limit", "replaced/",
		"acquired//fail-stale", "acquired//block", "acquired//fail-stale/took-over-stale",
		"acquired//fail-stale/own-retry", "acquired//block/own-retry",
		"blocked/already-active/fail-stale", "blocked/stale-blocked/block", "blocked/not-queued/fail-stale",
		"blocked/active-limit/fail-stale", "blocked/active-limit/block",
		"renewed", "lost", "released", "stale-completion", "removed", "not-found",
		"restored/writes=true", "restored/writes=false",
	} {
		if coverage[k] == 0 {
			t.Errorf("the random sequences never produced %q", k)
		}
	}
}

// modelKindRestored is the model's kind for a restore: the library's
// Restoration has no Kind, since a restore has only one outcome.
const modelKindRestored Kind = "restored"
