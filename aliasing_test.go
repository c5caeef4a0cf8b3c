package jobkeys

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The coordinator shares what it can between the states it keeps and
// reuses its encode buffers (snapshotOver, encodeBuffers). These tests
// show that the states it returns belong to the caller, who may keep them
// or write over them, and that no write carries bytes of another.

// scribbled marks what scribble writes, so that a stored value carrying it
// shows a caller's write reached the store.
const scribbled = "SCRIBBLED"

// scribble writes over every element s's slices can reach, their spare
// capacity included, and appends to them, as a careless caller might.
func scribble(s *KeyState) {
	if s == nil {
		return
	}
	junkSlot := ActiveSlot{JobID: scribbled, SlotToken: scribbled, InstanceID: scribbled, Tries: 7,
		Context: TraceContext{RequestID: scribbled, TraceID: scribbled, Traceparent: scribbled}}
	junkJob := QueuedJob{JobID: scribbled, RequestID: scribbled, Context: junkSlot.Context}
	a := s.Active[:cap(s.Active)]
	for i := range a {
		a[i] = junkSlot
	}
	q := s.Queued[:cap(s.Queued)]
	for i := range q {
		q[i] = junkJob
	}
	s.Active = append(s.Active, junkSlot, junkSlot)
	s.Queued = append(s.Queued, junkJob, junkJob)
	s.Service, s.KeyHash, s.MaxActive, s.StaleTakeoverCount = scribbled, scribbled, -1, -1
}

// storedValues is a copy of every value written through a recording store.
type storedValues struct {
	mu     sync.Mutex
	values map[string]bool
}

func newStoredValues() *storedValues { return &storedValues{values: make(map[string]bool)} }

// newRecordingStore returns a store over st (passing no optional
// capability through) that records every value written through it.
func newRecordingStore(st Store) (*hookStore, *storedValues) {
	r := newStoredValues()
	return newHookStore(st, passNone).withHook(func(_ context.Context, c storeCall, call func() storeResult) storeResult {
		res := call()
		if res.err == nil && (c.op == opCreate || c.op == opUpdate) {
			r.record(c.value)
		}
		return res
	}), r
}

func (r *storedValues) record(value []byte) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.values[string(value)] = true
}

// check fails t if a recorded value does not parse or carries scribbled.
func (r *storedValues) check(t *testing.T) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	require.NotEmpty(t, r.values)
	for v := range r.values {
		_, err := ParseState([]byte(v))
		require.NoError(t, err, "a stored value does not parse: %s", v)
		require.NotContains(t, v, scribbled, "a caller's write to a returned state reached the store")
	}
}

func (r *storedValues) has(value []byte) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.values[string(value)]
}

// deepCopy returns a copy of s through its wire form; nil stays nil.
func deepCopy(t *testing.T, s *KeyState) *KeyState {
	t.Helper()
	if s == nil {
		return nil
	}
	c, err := ParseState(appendState(nil, s))
	require.NoError(t, err)
	return c
}

// A random sequence of operations on one key, each checked against the
// pure reducers run on a model state of the test's own, while the test
// writes over two of every three returned states and keeps the third:
// every outcome equals the model's, every stored value is its State, and
// every kept state still reads as it did when returned.
func TestReturnedStatesBelongToTheCaller(t *testing.T) {
	t.Parallel()
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(uint64(seed), 0))
	ctx := context.Background()
	svc := jkService("alias")
	st, rec := newRecordingStore(NewMemoryStore())
	clock := &jkClock{t: rt0}
	tokens := 0
	newToken := func() string { tokens++; return "tok-" + strconv.Itoa(tokens) }
	c := cCoordinator(t, st, &Config{InstanceID: "inst-a", Now: clock.Now, NewSlotToken: newToken})
	p := Policy{Key: cPolicy().Key, MaxActive: 2, MaxQueuedPerKey: 6, WhenFull: ReplaceOldest}
	np, err := p.Normalize()
	require.NoError(t, err)
	key := cKey(t, svc)

	var (
		model  *KeyState // the state the model says is stored
		leases []Lease
		kept   []*KeyState // returned states left alone
		keptAt [][]byte    // their wire form when returned
		n      int
	)
	// returned checks an operation's State against the model's and the
	// store, and then keeps it or writes over it.
	returned := func(i int, got, want *KeyState) {
		t.Helper()
		if want == nil {
			require.Nil(t, got, "step %d", i)
			return
		}
		require.NotNil(t, got, "step %d", i)
		require.Equal(t, string(appendState(nil, want)), string(appendState(nil, got)), "step %d: State", i)
		if want.Empty() {
			_, _, err := st.Get(ctx, svc, key.KVKey)
			require.ErrorIs(t, err, ErrKeyNotFound, "step %d", i)
			model = nil
		} else {
			v, _ := stored(t, st, svc, key.KVKey)
			require.Equal(t, string(appendState(nil, want)), string(v), "step %d: stored value", i)
			model = deepCopy(t, want)
		}
		if i%3 == 0 {
			kept, keptAt = append(kept, got), append(keptAt, appendState(nil, got))
		} else {
			scribble(got)
		}
	}
	for i := range 600 {
		clock.Advance(time.Duration(rng.IntN(3)) * time.Second)
		now := clock.Now()
		base := deepCopy(t, model)
		queued := func() string {
			if base == nil || len(base.Queued) == 0 || rng.IntN(4) == 0 {
				return "none-" + strconv.Itoa(i)
			}
			return base.Queued[rng.IntN(len(base.Queued))].JobID
		}
		switch op := rng.IntN(10); {
		case op < 4:
			n++
			req := cAdmit(svc, "j"+strconv.Itoa(n), p)
			if n%2 == 0 {
				req.Context = TraceContext{} // derived
			}
			req.StrictCreate = rng.IntN(4) == 0
			got, err := c.Admit(ctx, req)
			require.NoError(t, err)
			want := ReduceAdmission(base, key, req, np, now)
			require.Equal(t, want.Kind, got.Kind, "step %d", i)
			returned(i, got.State, want.State)
		case op < 7:
			req := cAcquire(svc, queued(), p, rng.IntN(5) == 0)
			req.InstanceID = "inst-a"
			if rng.IntN(2) == 0 {
				req.Context = TraceContext{} // derived
			}
			got, err := c.Acquire(ctx, req)
			require.NoError(t, err)
			want := ReduceAcquire(base, key, req, np, now, "tok-"+strconv.Itoa(tokens))
			require.Equal(t, want.Kind, got.Kind, "step %d", i)
			require.Equal(t, want.Stale, got.Stale, "step %d", i)
			returned(i, got.State, want.State)
			if got.Kind == KindAcquired {
				leases = append(leases, got.Lease)
			}
			for j := range got.Stale {
				got.Stale[j].JobID = scribbled
			}
		case op < 9 && len(leases) > 0:
			k := rng.IntN(len(leases))
			lease := leases[k]
			if rng.IntN(3) == 0 {
				got, err := c.Renew(ctx, RenewRequest{Lease: lease})
				require.NoError(t, err)
				want := ReduceRenew(base, lease, now)
				require.Equal(t, want.Kind, got.Kind, "step %d", i)
				returned(i, got.State, want.State)
				break
			}
			leases = slices.Delete(leases, k, k+1)
			got, err := c.Release(ctx, ReleaseRequest{Lease: lease})
			require.NoError(t, err)
			want := ReduceRelease(base, lease, now)
			require.Equal(t, want.Kind, got.Kind, "step %d", i)
			returned(i, got.State, want.State)
		default:
			id := queued()
			got, err := c.RemoveQueued(ctx, RemoveRequest{Service: svc, JobType: cJobType, JobID: id, Payload: cPayload, Policy: p})
			require.NoError(t, err)
			want := ReduceRemoveQueued(base, id, now)
			require.Equal(t, want.Kind, got.Kind, "step %d", i)
			returned(i, got.State, want.State)
		}
	}
	require.NotEmpty(t, kept)
	for i, s := range kept {
		require.Equal(t, string(keptAt[i]), string(appendState(nil, s)), "kept state %d changed after it was returned", i)
	}
	rec.check(t)
}

// Workers share one key on each store, and write over every state they
// are returned at once: every State returned was stored, as it was
// returned, and no stored value carries what they wrote. Their operations
// run in batches (group commit) and the key entry shares the states'
// arrays (snapshotOver).
func TestReturnedStatesBelongToTheCallerConcurrent(t *testing.T) {
	t.Parallel()
	for _, b := range coordBackends(t) {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			raw, svc, _ := b.open(t)
			st, rec := newRecordingStore(raw)
			c := cCoordinator(t, st, nil)
			p := Policy{Key: cPolicy().Key, MaxActive: 2, MaxQueuedPerKey: 64}
			var (
				mu       sync.Mutex
				returned [][]byte // the wire form of each State when returned
			)
			took := func(s *KeyState) {
				if s == nil {
					return
				}
				v := appendState(nil, s)
				scribble(s)
				mu.Lock()
				returned = append(returned, v)
				mu.Unlock()
			}
			const workers, cycles = 6, 25
			var wg sync.WaitGroup
			for w := range workers {
				wg.Go(func() {
					for i := range cycles {
						id := fmt.Sprintf("w%d-%d", w, i)
						adm, err := c.Admit(ctx, cAdmit(svc, id, p))
						if !assert.NoError(t, err) || !assert.Equal(t, KindAccepted, adm.Kind) {
							return
						}
						took(adm.State)
						var acq Acquisition
						for deadline := time.Now().Add(time.Minute); ; {
							acq, err = c.Acquire(ctx, cAcquire(svc, id, p, false))
							if !assert.NoError(t, err) {
								return
							}
							if acq.Kind == KindAcquired {
								break
							}
							// Blocked only while the others hold the slots.
							if !assert.Equal(t, ReasonActiveLimit, acq.Reason, "job %s", id) || !assert.True(t, time.Now().Before(deadline), "job %s never got a slot", id) {
								return
							}
							time.Sleep(time.Millisecond)
						}
						took(acq.State)
						ren, err := c.Renew(ctx, RenewRequest{Lease: acq.Lease})
						if !assert.NoError(t, err) || !assert.Equal(t, KindRenewed, ren.Kind) {
							return
						}
						took(ren.State)
						rel, err := c.Release(ctx, ReleaseRequest{Lease: acq.Lease})
						if !assert.NoError(t, err) || !assert.Equal(t, KindReleased, rel.Kind) {
							return
						}
						if !rel.State.Empty() {
							took(rel.State)
						}
					}
				})
			}
			wg.Wait()
			rec.check(t)
			// Every admission, acquisition and renewal returns a State; a
			// release does unless it emptied the key.
			require.GreaterOrEqual(t, len(returned), workers*cycles*3)
			for i, v := range returned {
				require.True(t, rec.has(v), "returned state %d was never stored as returned: %s", i, v)
			}
		})
	}
}

// Workers on keys of their own, over each store, each checking after every
// write that the key holds exactly the State it was returned: encode
// buffers pass from one operation to the next, and none is kept by a store.
func TestEncodeBuffersAreNotKept(t *testing.T) {
	t.Parallel()
	for _, b := range coordBackends(t) {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			st, svc, _ := b.open(t)
			c := cCoordinator(t, st, nil)
			p := Policy{Key: cPolicy().Key, MaxActive: 1, MaxQueuedPerKey: 40}
			const workers = 6
			var wg sync.WaitGroup
			for w := range workers {
				wg.Go(func() {
					payload := []byte(fmt.Sprintf(`{"tenant":"t%d"}`, w))
					key, err := DeriveKey(svc, cJobType, payload, p.Key)
					if !assert.NoError(t, err) {
						return
					}
					check := func(s *KeyState, what string) bool {
						v, _, err := st.Get(ctx, svc, key.KVKey)
						return assert.NoError(t, err) && assert.Equal(t, string(appendState(nil, s)), string(v), "%s", what)
					}
					// Worker w's queue grows to 5*w+5 jobs, so the buffers
					// differ in size, and then drains.
					n := 5*w + 5
					for i := range n {
						req := cAdmit(svc, fmt.Sprintf("w%d-j%d", w, i), p)
						req.Payload = payload
						adm, err := c.Admit(ctx, req)
						if !assert.NoError(t, err) || !check(adm.State, "admit") {
							return
						}
					}
					for i := range n - 1 {
						req := cAcquire(svc, fmt.Sprintf("w%d-j%d", w, i), p, false)
						req.Payload = payload
						acq, err := c.Acquire(ctx, req)
						if !assert.NoError(t, err) || !assert.Equal(t, KindAcquired, acq.Kind) || !check(acq.State, "acquire") {
							return
						}
						rel, err := c.Release(ctx, ReleaseRequest{Lease: acq.Lease})
						if !assert.NoError(t, err) || !check(rel.State, "release") {
							return
						}
					}
				})
			}
			wg.Wait()
		})
	}
}

// snapshotOver shares only runs of base equal to the state, cut to their
// length, and keeps nil and empty slices apart, as a full copy does.
func TestSnapshotOverSharesOnlyEqualRuns(t *testing.T) {
	t.Parallel()
	job := func(id string) QueuedJob {
		return QueuedJob{JobID: id, CreatedAt: rt0, RequestID: id, Context: rctx(id)}
	}
	slot := func(id string) ActiveSlot { return ActiveSlot{JobID: id, SlotToken: "t-" + id, LeaseExpiresAt: rt0} }
	base := &KeyState{Service: "s", Active: []ActiveSlot{slot("a"), slot("b")}, Queued: []QueuedJob{job("q1"), job("q2"), job("q3")}}
	same := func(x, y []QueuedJob) bool { return len(x) > 0 && len(y) > 0 && &x[0] == &y[0] }
	cases := []struct {
		name   string
		queued []QueuedJob
		shared []QueuedJob // the run of base.Queued it shares; nil: none
	}{
		{"unchanged", []QueuedJob{job("q1"), job("q2"), job("q3")}, base.Queued[0:3]},
		{"head taken", []QueuedJob{job("q2"), job("q3")}, base.Queued[1:3]},
		{"tail taken", []QueuedJob{job("q1"), job("q2")}, base.Queued[0:2]},
		{"middle taken", []QueuedJob{job("q1"), job("q3")}, nil},
		{"appended", []QueuedJob{job("q1"), job("q2"), job("q3"), job("q4")}, nil},
		{"one changed", []QueuedJob{job("q1"), job("x"), job("q3")}, nil},
		{"empty", []QueuedJob{}, nil},
		{"nil", nil, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := base.clone()
			s.Queued = tc.queued
			s.Active = append([]ActiveSlot(nil), base.Active[1:]...)
			want := string(appendState(nil, s))
			snap := snapshotOver(s, base)
			require.Equal(t, want, string(appendState(nil, snap)))
			require.Equal(t, tc.queued == nil, snap.Queued == nil, "nil stays nil, empty stays empty")
			require.Equal(t, len(snap.Queued), cap(snap.Queued), "no room past what it holds")
			if tc.shared != nil {
				require.True(t, same(snap.Queued, tc.shared), "shares base's run")
			} else {
				require.False(t, len(snap.Queued) > 0 && (&snap.Queued[0] == &s.Queued[0] ||
					&snap.Queued[0] == &base.Queued[:1][0]), "a copy of its own")
			}
			require.Same(t, &base.Active[1], &snap.Active[0], "the slots left are base's last one")
			// Writing over s leaves the snapshot and base alone.
			baseWire := appendState(nil, base)
			scribble(s)
			require.Equal(t, want, string(appendState(nil, snap)))
			require.Equal(t, string(baseWire), string(appendState(nil, base)))
			// Appending to the snapshot leaves base alone.
			snap.Queued = append(snap.Queued, job("new"))
			snap.Active = append(snap.Active, slot("new"))
			require.Equal(t, string(baseWire), string(appendState(nil, base)))
		})
	}
	snap := snapshotOver(base, nil)
	require.NotSame(t, &base.Queued[0], &snap.Queued[0], "no base: a full copy")
}

// deriveContext gives what it gave before it hashed from the stack: the
// trace id is the first 16 bytes of SHA-256(jobID NUL salt) in hex, the
// parent id the next 8, whatever the lengths.
func TestDeriveContextAsBefore(t *testing.T) {
	t.Parallel()
	before := func(c TraceContext, jobID, salt string) TraceContext {
		if c.RequestID == "" {
			c.RequestID = jobID
		}
		if c.TraceID == "" || c.Traceparent == "" {
			sum := sha256.Sum256([]byte(jobID + "\x00" + salt))
			var buf [48]byte
			hex.Encode(buf[:], sum[:24])
			if c.TraceID == "" {
				c.TraceID = string(buf[:32])
			}
			if c.Traceparent == "" {
				c.Traceparent = "00-" + c.TraceID + "-" + string(buf[32:48]) + "-00"
			}
		}
		return c
	}
	given := TraceContext{RequestID: "req", TraceID: "0af7651916cd43dd8448eb211c80319c",
		Traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", Tracestate: "k=v"}
	for _, jobID := range []string{"", "j", "job-1", strings.Repeat("é", 70), strings.Repeat("x", 200)} {
		for _, salt := range []string{"", "9b2c6f1e-4d3a-4f7e-8a1b-2c3d4e5f6a7b", strings.Repeat("s", 130)} {
			for _, c := range []TraceContext{
				{},
				{RequestID: "r"},
				{TraceID: given.TraceID},
				{Traceparent: given.Traceparent},
				{TraceID: given.TraceID, Traceparent: given.Traceparent, Tracestate: "k=v"},
				given,
			} {
				want := before(c, jobID, salt)
				require.Equal(t, want, wireContext(c, jobID, salt), "job %q salt %q context %+v", jobID, salt, c)
			}
		}
	}
	got := deriveContext(TraceContext{}, "job-1", "")
	require.True(t, strings.Contains(got.Traceparent, got.TraceID))
	require.True(t, bytes.HasPrefix([]byte(got.Traceparent), []byte("00-"+got.TraceID+"-")))
}
