package jobkeys

// Fuzz targets for every reducer entry on arbitrary states (including ones
// no sequence of operations produces: more slots than the limit, leases in
// year 0 or 9999, odd job ids) and for the coordinator's request
// validation (empty and absurd fields, huge policies, odd templates,
// forged leases). The seeds run as ordinary tests; explore with e.g.
//
//	go test -run '^$' -fuzz '^FuzzReduceAcquire$' -fuzztime 30s -parallel 1 .

import (
	"context"
	"errors"
	"fmt"
	"math"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// fzGen turns fuzz bytes into values; past the end it yields zeros.
type fzGen struct {
	data []byte
	i    int
}

func (g *fzGen) byte() byte {
	if g.i >= len(g.data) {
		return 0
	}
	b := g.data[g.i]
	g.i++
	return b
}

func (g *fzGen) intn(n int) int { return int(g.byte()) % n }

func (g *fzGen) u64() uint64 {
	var v uint64
	for range 8 {
		v = v<<8 | uint64(g.byte())
	}
	return v
}

// fzJobs are few, so that job ids collide.
var fzJobs = []string{"j0", "j1", "j2", "j3"}

// job returns a job id: usually one of fzJobs, sometimes empty, long or
// made of raw bytes (possibly invalid UTF-8).
func (g *fzGen) job() string {
	switch m := g.intn(16); {
	case m < 12:
		return fzJobs[m%len(fzJobs)]
	case m == 12:
		return ""
	case m == 13:
		return strings.Repeat("x", 1+g.intn(200))
	default:
		n := g.intn(12)
		b := make([]byte, n)
		for i := range b {
			b[i] = g.byte()
		}
		return string(b)
	}
}

// count returns a small int, now and then an absurd one.
func (g *fzGen) count() int {
	switch m := g.intn(16); {
	case m < 9:
		return m % 5
	case m == 9:
		return math.MaxInt
	case m == 10:
		return 1<<53 - 1
	case m == 11:
		return 1 << 53
	case m == 12:
		return 1<<53 + 1
	case m == 13:
		return math.MinInt
	case m == 14:
		return -1
	default:
		return int(g.u64())
	}
}

// fzBase is the fuzz clock's origin.
var fzBase = time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

// when returns a time near fzBase, or at the ends of what the wire format
// holds (years 0 and 9999), with sub-millisecond parts now and then.
func (g *fzGen) when() time.Time {
	switch m := g.intn(8); {
	case m == 0:
		return time.Date(0, 1, 1, 0, 0, 0, 0, time.UTC)
	case m == 1:
		return time.Date(9999, 12, 31, 23, 59, 59, 999_000_000, time.UTC)
	case m == 2:
		return fzBase.Add(time.Duration(g.u64() % uint64(time.Hour)))
	default:
		return fzBase.Add(time.Duration(int(g.byte())-128) * 10 * time.Millisecond)
	}
}

func (g *fzGen) context() TraceContext {
	switch g.intn(3) {
	case 0:
		return TraceContext{}
	case 1:
		return TraceContext{RequestID: g.job()}
	default:
		return TraceContext{RequestID: "r", TraceID: strings.Repeat("a", 32), Traceparent: "00-" + strings.Repeat("a", 32) + "-" + strings.Repeat("b", 16) + "-01", Tracestate: g.job()}
	}
}

// state returns nil or a state with up to 5 slots and 5 queued jobs,
// which need not respect any rule: ids may repeat or be empty, slots may
// exceed the limit, times may be anywhere the wire format allows.
func (g *fzGen) state() *KeyState {
	if g.intn(8) == 0 {
		return nil
	}
	s := emptyState(modelKey, Policy{MaxActive: 1 + g.intn(4), MaxQueuedPerKey: g.intn(4)}, g.when())
	for range g.intn(6) {
		start := g.when()
		s.Active = append(s.Active, ActiveSlot{JobID: g.job(), SlotToken: []string{"t0", "t1", "t2", "t3"}[g.intn(4)],
			InstanceID: "w", StartedAt: start, HeartbeatAt: start, LeaseExpiresAt: g.when(), Tries: g.intn(4), Context: g.context()})
	}
	for range g.intn(6) {
		s.Queued = append(s.Queued, QueuedJob{JobID: g.job(), CreatedAt: g.when(), RequestID: "r", Context: g.context()})
	}
	s.StaleTakeoverCount = g.intn(3)
	return s
}

// policy returns a normalized policy, or false when the fuzzed values do
// not normalize (which must then be an ErrInvalidPolicy).
func (g *fzGen) policy(t *testing.T) (Policy, modelPolicy, bool) {
	t.Helper()
	p := Policy{Key: []string{"k"}, MaxActive: g.count(), MaxQueuedPerKey: g.count(),
		WhenFull:          []WhenFull{"", Reject, Coalesce, ReplaceOldest, "sometimes"}[g.intn(5)],
		StalePolicy:       []StalePolicy{"", FailStale, Block, "never"}[g.intn(4)],
		HeartbeatInterval: time.Duration(g.intn(4)) * time.Second, HeartbeatTTL: time.Duration(g.intn(6)) * time.Second}
	if g.intn(8) == 0 {
		p.HeartbeatTTL = time.Duration(g.u64() >> 1)
	}
	norm, err := p.Normalize()
	if err != nil {
		if !errors.Is(err, ErrInvalidPolicy) {
			t.Fatalf("Normalize(%+v): error %v does not wrap ErrInvalidPolicy", p, err)
		}
		return Policy{}, modelPolicy{}, false
	}
	return norm, modelPolicy{maxActive: norm.MaxActive, maxQueued: norm.MaxQueuedPerKey, whenFull: norm.WhenFull,
		stale: norm.StalePolicy, ttl: norm.HeartbeatTTL.Milliseconds()}, true
}

// fzWellFormed reports whether s is a state the rules can produce: no
// empty or repeated job ids, no job both queued and active. The model is
// compared only on those (on others "first match" details may differ).
func fzWellFormed(s *KeyState) bool {
	if s == nil {
		return true
	}
	seen := map[string]bool{}
	for _, a := range s.Active {
		if a.JobID == "" || seen[a.JobID] {
			return false
		}
		seen[a.JobID] = true
	}
	for _, q := range s.Queued {
		if q.JobID == "" || seen[q.JobID] {
			return false
		}
		seen[q.JobID] = true
	}
	return true
}

// fzReducer runs one reducer entry on fuzzed input and checks: no panic;
// the input is not modified and the outcome is deterministic; on
// well-formed input the outcome and state are the model's; an acquisition
// never leaves more slots than its policy allows nor a job twice; and the
// state written by an operation the coordinator would accept survives the
// wire codec.
func fzReducer(t *testing.T, data []byte, kind opKind) {
	g := &fzGen{data: data}
	st := g.state()
	pol, mp, ok := g.policy(t)
	if !ok {
		return
	}
	// now is a clock reading: near fzBase, not anywhere in years 0-9999.
	now := fzBase.Add(time.Duration(int(g.byte())-128) * 10 * time.Millisecond).Add(time.Duration(g.byte()) * time.Microsecond)
	job := g.job()
	acceptable := job != "" // what the coordinator would pass to the reducer
	var snapshot *KeyState
	if st != nil {
		c := *st
		c.Active, c.Queued = slices.Clone(st.Active), slices.Clone(st.Queued)
		snapshot = &c
	}
	model := modelFromState(st)
	if model != nil {
		for i := range model.active {
			model.active[i].ctx = st.Active[i].Context
		}
	}
	wellFormed := fzWellFormed(st)
	ms := modelMs(jsNow(now))
	fc := fzCall{t: t, g: g, st: st, model: model, pol: pol, mp: mp, now: now, ms: ms, job: job, acceptable: acceptable, wellFormed: wellFormed}
	fc.run(kind)
	out, want, diff, acceptable, wellFormed := fc.out, fc.want, fc.diff, fc.acceptable, fc.wellFormed
	if st != nil && !reflect.DeepEqual(snapshot, st) {
		t.Fatalf("%s modified its input state", kind)
	}
	if wellFormed && job != "" {
		if diff != "" {
			t.Fatalf("%s %q on %s: differs from the model: %s", kind, job, model.describe(), diff)
		}
		if d := modelDiffStates(want.next, out); want.changed && d != "" {
			t.Fatalf("%s %q on %s: %s", kind, job, model.describe(), d)
		}
	}
	// What the coordinator accepts must be readable once written.
	if out != nil && !out.Empty() && acceptable && fzAcceptableState(st) {
		if _, err := ParseState(appendState(nil, out)); err != nil {
			t.Fatalf("%s %q: the new state does not parse back: %v\n%s", kind, job, err, appendState(nil, out))
		}
	}
}

// fzCall is one reducer call of fzReducer on fuzzed input: the input, and
// what run leaves (the new state, the model's result, their difference,
// and whether the input is well formed and acceptable after the call's own
// inputs are drawn).
type fzCall struct {
	t                      *testing.T
	g                      *fzGen
	st                     *KeyState
	model                  *modelState
	pol                    Policy
	mp                     modelPolicy
	now                    time.Time
	ms                     int64
	job                    string
	acceptable, wellFormed bool

	out  *KeyState
	want modelResult
	diff string
}

// run calls the reducer of kind, and the model's, on c's input.
func (c *fzCall) run(kind opKind) {
	switch kind {
	case opAdmit:
		req := AdmitRequest{JobID: c.job, StrictCreate: c.g.intn(2) == 0, Context: c.g.context()}
		got := ReduceAdmission(c.st, modelKey, req, c.pol, c.now)
		if again := ReduceAdmission(c.st, modelKey, req, c.pol, c.now); !reflect.DeepEqual(got, again) {
			c.t.Fatal("ReduceAdmission is not deterministic")
		}
		c.out, c.want = got.State, modelAdmit(c.model, c.job, req.StrictCreate, req.Context, c.mp, c.ms)
		c.diff = modelDiffAdmission(c.want, got, c.job)
	case opAcquire:
		req := AcquireRequest{JobID: c.job, Retry: c.g.intn(2) == 0, Tries: c.g.count(), InstanceID: "w", Context: c.g.context()}
		c.acceptable = c.acceptable && req.Tries >= 0 && req.Tries < 1<<53
		got := ReduceAcquire(c.st, modelKey, req, c.pol, c.now, "new-token")
		if again := ReduceAcquire(c.st, modelKey, req, c.pol, c.now, "new-token"); !reflect.DeepEqual(got, again) {
			c.t.Fatal("ReduceAcquire is not deterministic")
		}
		c.out, c.want = got.State, modelAcquire(c.model, c.job, req.Retry, req.Tries, "w", req.Context, c.mp, c.ms, "new-token")
		c.diff = modelDiffAcquisition(c.want, got, c.job, "new-token")
		if got.Kind == KindAcquired {
			if len(c.out.Active) > c.pol.MaxActive {
				c.t.Fatalf("acquisition left %d slots, MaxActive %d", len(c.out.Active), c.pol.MaxActive)
			}
			if c.wellFormed && c.acceptable && !fzWellFormed(c.out) {
				c.t.Fatalf("acquisition of %q left a job twice: %s / %v", c.job, modelActiveIDs(c.out.Active), auditQueuedIDs(c.out.Queued))
			}
		}
	case opRenew, opRelease:
		lease := Lease{JobID: c.job, SlotToken: []string{"t0", "t1", "t2", "t3", ""}[c.g.intn(5)], Policy: c.pol}
		if kind == opRenew {
			got := ReduceRenew(c.st, lease, c.now)
			c.out, c.want = got.State, modelRenew(c.model, c.job, lease.SlotToken, c.mp.ttl, c.ms)
			c.diff = modelDiffSimple(c.want, got.Kind, got.LeaseExpiresAt, got.State)
		} else {
			got := ReduceRelease(c.st, lease, c.now)
			c.out, c.want = got.State, modelRelease(c.model, c.job, lease.SlotToken, c.ms)
			c.diff = modelDiffSimple(c.want, got.Kind, time.Time{}, got.State)
		}
	case opRemove:
		got := ReduceRemoveQueued(c.st, c.job, c.now)
		c.out, c.want = got.State, modelRemove(c.model, c.job, c.ms)
		c.diff = modelDiffSimple(c.want, got.Kind, time.Time{}, got.State)
	case opRestore:
		replaced := ReplacedJob{JobRef: JobRef{ID: c.g.job()}, CreatedAt: c.g.when(), RequestID: []string{"", "r"}[c.g.intn(2)], Context: c.g.context()}
		req := RestoreRequest{ReplacementJobID: c.job, Replaced: replaced}
		got := ReduceRestoreReplaced(c.st, modelKey, req, c.pol, c.now)
		q := modelQueued{job: replaced.ID, created: modelMs(replaced.CreatedAt), requestID: replaced.RequestID, ctx: replaced.Context}
		if q.requestID == "" {
			q.requestID = modelRequestID(replaced.Context, replaced.ID)
		}
		c.out, c.want = got.State, modelRestore(c.model, c.job, q, c.mp, c.ms)
		c.diff = modelDiffSimple(c.want, modelKindRestored, time.Time{}, got.State)
		c.wellFormed = c.wellFormed && replaced.ID != c.job && replaced.ID != ""
		c.acceptable = c.acceptable && replaced.ID != ""
	}
}

// fzAcceptableState reports whether s could have been read from the store
// (every string non-empty where the wire format requires it).
func fzAcceptableState(s *KeyState) bool {
	if s == nil {
		return true
	}
	for _, a := range s.Active {
		if a.JobID == "" {
			return false
		}
	}
	for _, q := range s.Queued {
		if q.JobID == "" {
			return false
		}
	}
	return true
}

func fzSeeds(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16})
	f.Add([]byte("\x01\x03\x02\x00\x05\x06\x80\x01\x07\x02\x03\x80\x80\x04\x01\x02\x00\x01\x00\x00"))
	f.Add([]byte("\x07\x01\x04\x00\x01\x00\x00\x81\x02\x01\x00\x00\x82\x00\x03\x01\x05\x00\x01\x0a\x00\x02\x01\x03\x02\x01"))
	f.Add([]byte("\x05\x03\x05\x05\x01\x01\x80\x02\x02\x01\x80\x03\x03\x01\x80\x04\x01\x01\x80\x05\x01\x01\x80\x00\x02\x0b\x00\x00\x10\x00"))
}

func FuzzReduceAdmission(f *testing.F) {
	fzSeeds(f)
	f.Fuzz(func(t *testing.T, data []byte) { fzReducer(t, data, opAdmit) })
}

func FuzzReduceAcquire(f *testing.F) {
	fzSeeds(f)
	f.Fuzz(func(t *testing.T, data []byte) { fzReducer(t, data, opAcquire) })
}

func FuzzReduceRenew(f *testing.F) {
	fzSeeds(f)
	f.Fuzz(func(t *testing.T, data []byte) { fzReducer(t, data, opRenew) })
}

func FuzzReduceRelease(f *testing.F) {
	fzSeeds(f)
	f.Fuzz(func(t *testing.T, data []byte) { fzReducer(t, data, opRelease) })
}

func FuzzReduceRemoveQueued(f *testing.F) {
	fzSeeds(f)
	f.Fuzz(func(t *testing.T, data []byte) { fzReducer(t, data, opRemove) })
}

func FuzzReduceRestoreReplaced(f *testing.F) {
	fzSeeds(f)
	f.Fuzz(func(t *testing.T, data []byte) { fzReducer(t, data, opRestore) })
}

// ---- coordinator request validation ----

// fzSentinels are the errors a coordinator call may wrap on bad input.
var fzSentinels = []error{ErrInvalidPolicy, ErrInvalidName, ErrInvalidKey, ErrInvalidRequest, ErrStateTooLarge}

// FuzzCoordinatorRequests drives a coordinator over a MemoryStore (with a
// small value limit, so oversize states are common) with fuzzed requests:
// names, job ids, payloads, templates, policy numbers and names, tries,
// trace contexts, the replaced job of a restore and a forged lease. Every
// call must return an outcome or an error wrapping one of the package's
// sentinels (never a panic, never contention with a single client); an
// oversize state must be a *StateError naming the KV key, with nothing
// written; and whatever the coordinator wrote must read back: no request it
// accepts may leave a key that later fails as corrupt.
func FuzzCoordinatorRequests(f *testing.F) {
	f.Add("svc", "type", "j1", []byte(`{"t":"a"}`), "tenant|/t", int64(1), int64(1), int64(0), int64(0), "", "", false, false, int64(1), "r", int64(0), "x")
	f.Add("svc", "type/v=2", "j1", []byte(`{"t":7}`), "/t", int64(2), int64(0), int64(1e9), int64(3e9), "block", "coalesce", true, true, int64(0), "", int64(-1), "")
	f.Add("", "type", "j1", []byte(`{}`), "k", int64(1), int64(0), int64(0), int64(0), "", "", false, false, int64(0), "", int64(0), "")
	f.Add("svc", "a.b", "", []byte(`{}`), "k", int64(1), int64(0), int64(0), int64(0), "", "", false, false, int64(0), "", int64(0), "")
	f.Add("svc", "type", "j1", []byte(`{"t":null}`), "/t|/u/~2", int64(0), int64(-1), int64(-5), int64(0), "sometimes", "never", false, true, int64(-1), "", int64(0), "")
	f.Add("svc", "type", "j1", []byte(`not json`), "", int64(1), int64(0), int64(2e9), int64(1e9), "", "", false, false, int64(0), "", int64(0), "")
	f.Add("svc", "type", strings.Repeat("j", 5000), []byte(`{"t":"a"}`), "k", int64(1), int64(0), int64(0), int64(0), "", "", false, false, int64(0), "", int64(0), "")
	f.Add("svc", "type", "j1", []byte(`{}`), "k", int64(1), int64(0), int64(time.Millisecond), int64(math.MaxInt64), "", "", false, false, int64(0), "", int64(0), "")
	f.Add("svc", "type", "j1", []byte(`{}`), "k", int64(1<<53), int64(1<<53), int64(0), int64(0), "", "", false, true, int64(1<<53), "", int64(253402300799), "")
	// Limits, tries and creation times beyond what the wire format holds
	// (see TestAbsurdValuesDoNotWedgeKeys).
	f.Add("svc", "type", "j1", []byte(`{}`), "k", int64(math.MaxInt64), int64(0), int64(0), int64(0), "", "", false, false, int64(0), "", int64(0), "")
	f.Add("svc", "type", "j1", []byte(`{}`), "k", int64(1), int64(math.MaxInt64), int64(0), int64(0), "", "", false, false, int64(0), "", int64(0), "")
	f.Add("svc", "type", "j1", []byte(`{}`), "k", int64(1), int64(0), int64(0), int64(0), "", "", false, true, int64(math.MaxInt64), "", int64(0), "")
	f.Add("svc", "type", "j1", []byte(`{}`), "k", int64(1), int64(1), int64(0), int64(0), "", "", false, false, int64(0), "", int64(300000*365*24*3600), "")
	f.Add("svc", "type", "j1", []byte(`{}`), "k", int64(1), int64(1), int64(0), int64(0), "", "", false, false, int64(0), "", int64(-70000*365*24*3600), "")
	f.Fuzz(func(t *testing.T, service, jobType, jobID string, payload []byte, template string,
		maxActive, maxQueued, interval, ttl int64, stale, whenFull string, strict, retry bool, tries int64,
		requestID string, createdAt int64, token string) {
		fzCoordinator(t, service, jobType, jobID, payload, template, maxActive, maxQueued, interval, ttl,
			stale, whenFull, strict, retry, tries, requestID, createdAt, token)
	})
}

func fzCoordinator(t *testing.T, service, jobType, jobID string, payload []byte, template string,
	maxActive, maxQueued, interval, ttl int64, stale, whenFull string, strict, retry bool, tries int64,
	requestID string, createdAt int64, token string) {
	store := NewMemoryStore()
	if err := store.SetMaxValueSize(4096); err != nil {
		t.Fatal(err)
	}
	now := fzBase
	coord, err := NewCoordinator(store, &Config{InstanceID: "fuzz", Now: func() time.Time { return now }})
	require.NoError(t, err)
	// Nothing here waits on anything: a call that takes seconds is hung.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	watchdog := time.AfterFunc(20*time.Second, func() {
		panic(fmt.Sprintf("coordinator calls hung (ignoring ctx) on service %q job type %q job %q template %q limits %d/%d interval %d ttl %d tries %d",
			service, jobType, jobID, template, maxActive, maxQueued, interval, ttl, tries))
	})
	defer watchdog.Stop()
	pol := Policy{Key: strings.Split(template, "|"), MaxActive: int(maxActive), MaxQueuedPerKey: int(maxQueued),
		HeartbeatInterval: time.Duration(interval), HeartbeatTTL: time.Duration(ttl),
		StalePolicy: StalePolicy(stale), WhenFull: WhenFull(whenFull)}
	if template == "" {
		pol.Key = nil
	}
	tc := TraceContext{RequestID: requestID}
	var kvKey string
	if norm, err := pol.Normalize(); err == nil {
		if key, err := DeriveKey(service, jobType, payload, norm.Key); err == nil {
			kvKey = key.KVKey
		}
	}
	var stored []byte
	check := func(what string, err error) {
		t.Helper()
		if err != nil {
			if ctx.Err() != nil {
				t.Fatalf("%s: hung until the 10s deadline: %v", what, err)
			}
			if err.Error() == "" {
				t.Fatalf("%s: empty error message", what)
			}
			known := false
			for _, s := range fzSentinels {
				known = known || errors.Is(err, s)
			}
			if !known {
				t.Fatalf("%s: error %q wraps none of the package's input sentinels", what, err)
			}
			if errors.Is(err, ErrStateTooLarge) {
				var se *StateError
				if !errors.As(err, &se) || se.KVKey == "" || se.KVKey != kvKey {
					t.Fatalf("%s: oversize state error %v is not a *StateError naming KV key %q", what, err, kvKey)
				}
			}
		}
		if kvKey == "" {
			return
		}
		value, _, gerr := store.Get(ctx, service, kvKey)
		if errors.Is(err, ErrStateTooLarge) && string(value) != string(stored) {
			t.Fatalf("%s: failed as too large but changed the stored state", what)
		}
		if gerr == nil {
			if _, perr := ParseState(value); perr != nil {
				t.Fatalf("%s: the coordinator wrote a state it cannot read back: %v\n%s", what, perr, value)
			}
		}
		stored = value
	}
	a, err := coord.Admit(ctx, AdmitRequest{Service: service, JobType: jobType, JobID: jobID, Payload: payload, Context: tc, Policy: pol, StrictCreate: strict})
	check("admit", err)
	_, err = coord.Admit(ctx, AdmitRequest{Service: service, JobType: jobType, JobID: jobID + "-2", Payload: payload, Context: tc, Policy: pol})
	check("admit a second job", err)
	a3, err := coord.Admit(ctx, AdmitRequest{Service: service, JobType: jobType, JobID: jobID + "-3", Payload: payload, Context: tc, Policy: pol})
	check("admit a third job", err)
	if err == nil && a.Kind == KindAccepted && kvKey != "" && !strict {
		// The first job was accepted: it must be readable by a coordinator
		// that has nothing cached.
		fresh, _ := NewCoordinator(store, &Config{StateCacheSize: -1, Now: func() time.Time { return now }})
		_, err := fresh.RemoveQueued(ctx, RemoveRequest{Service: service, JobType: jobType, JobID: "absent", Payload: payload, Policy: pol})
		check("a fresh coordinator reads the key", err)
	}
	acq, err := coord.Acquire(ctx, AcquireRequest{Service: service, JobType: jobType, JobID: jobID, Payload: payload, Context: tc,
		Retry: retry, Tries: int(tries), Policy: pol})
	check("acquire", err)
	now = now.Add(time.Second)
	if err == nil && acq.Kind == KindAcquired {
		_, err = coord.Renew(ctx, RenewRequest{Lease: acq.Lease})
		check("renew", err)
		_, err = coord.Release(ctx, ReleaseRequest{Lease: acq.Lease})
		check("release", err)
	}
	forged := acq.Lease
	forged.Service, forged.JobType, forged.JobID, forged.SlotToken = service, jobType, jobID, token
	if len(requestID) == 64 {
		forged.KeyHash = requestID
	}
	_, err = coord.Renew(ctx, RenewRequest{Lease: forged})
	check("renew with a forged lease", err)
	_, err = coord.Release(ctx, ReleaseRequest{Lease: forged})
	check("release with a forged lease", err)
	_, err = coord.RemoveQueued(ctx, RemoveRequest{Service: service, JobType: jobType, JobID: jobID + "-2", Payload: payload, Policy: pol})
	check("remove", err)
	replaced := ReplacedJob{JobRef: JobRef{Service: service, JobType: jobType, ID: jobID + "-r"}, CreatedAt: time.Unix(createdAt, 0), RequestID: requestID, Context: tc}
	if a3.Replaced != nil {
		replaced = *a3.Replaced
	}
	_, err = coord.RestoreReplaced(ctx, RestoreRequest{Service: service, JobType: jobType, ReplacementJobID: jobID + "-3",
		Replaced: replaced, Payload: payload, Policy: pol})
	check("restore", err)
}

// TestAbsurdValuesDoNotWedgeKeys: a request with a limit, a try count or a
// creation time beyond what the wire format holds (integers up to 2^53,
// years 0 to 9999) must be refused, or work; it must never write a state
// that no coordinator (nor the TS original) can read, which would wedge
// the key for every worker until someone repairs it by hand. A huge
// MaxQueuedPerKey must not turn into a rejection on an empty key.
func TestAbsurdValuesDoNotWedgeKeys(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	payload := []byte(`{"t":"a"}`)
	base := Policy{Key: []string{"/t"}}
	cases := []struct {
		name string
		run  func(c *KeyCoordinator) error
	}{
		{"MaxActive MaxInt", func(c *KeyCoordinator) error {
			p := base
			p.MaxActive = math.MaxInt
			_, err := c.Admit(ctx, AdmitRequest{Service: "svc", JobType: "t", JobID: "j1", Payload: payload, Policy: p})
			return err
		}},
		{"MaxActive 2^53+1", func(c *KeyCoordinator) error {
			p := base
			p.MaxActive = 1<<53 + 1
			_, err := c.Admit(ctx, AdmitRequest{Service: "svc", JobType: "t", JobID: "j1", Payload: payload, Policy: p})
			return err
		}},
		{"MaxQueuedPerKey MaxInt", func(c *KeyCoordinator) error {
			p := base
			p.MaxQueuedPerKey = math.MaxInt
			a, err := c.Admit(ctx, AdmitRequest{Service: "svc", JobType: "t", JobID: "j1", Payload: payload, Policy: p})
			if err == nil && a.Kind != KindAccepted {
				return fmt.Errorf("admission to an empty key: %s %s (limit %d)", a.Kind, a.Reason, a.Limit)
			}
			return err
		}},
		{"Tries MaxInt", func(c *KeyCoordinator) error {
			_, err := c.Acquire(ctx, AcquireRequest{Service: "svc", JobType: "t", JobID: "j1", Payload: payload, Policy: base, Retry: true, Tries: math.MaxInt})
			return err
		}},
		{"restored CreatedAt in year 10000", func(c *KeyCoordinator) error {
			_, err := c.RestoreReplaced(ctx, RestoreRequest{Service: "svc", JobType: "t", ReplacementJobID: "j2", Payload: payload, Policy: base,
				Replaced: ReplacedJob{JobRef: JobRef{Service: "svc", JobType: "t", ID: "j1"}, CreatedAt: time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)}})
			return err
		}},
		{"restored CreatedAt before year 0", func(c *KeyCoordinator) error {
			_, err := c.RestoreReplaced(ctx, RestoreRequest{Service: "svc", JobType: "t", ReplacementJobID: "j2", Payload: payload, Policy: base,
				Replaced: ReplacedJob{JobRef: JobRef{Service: "svc", JobType: "t", ID: "j1"}, CreatedAt: time.Date(-1, 1, 1, 0, 0, 0, 0, time.UTC)}})
			return err
		}},
	}
	for _, tc := range cases {
		store := NewMemoryStore()
		c, err := NewCoordinator(store, nil)
		require.NoError(t, err)
		err = tc.run(c)
		switch {
		case errors.Is(err, ErrInvalidPolicy), errors.Is(err, ErrInvalidRequest):
			continue // refused: fine
		case err != nil:
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		// Accepted: another worker must still be able to use the key.
		other, _ := NewCoordinator(store, &Config{StateCacheSize: -1})
		if _, err := other.Admit(ctx, AdmitRequest{Service: "svc", JobType: "t", JobID: "j9", Payload: payload, Policy: base}); err != nil {
			t.Errorf("%s: accepted, and the key is now unusable: %v", tc.name, err)
		}
	}
}
