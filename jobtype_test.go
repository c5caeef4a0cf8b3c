package jobkeys

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestJobTypeChecksOnce(t *testing.T) {
	t.Parallel()
	c := cCoordinator(t, NewMemoryStore(), nil)
	good := Policy{Key: []string{"tenant", "/tenant"}, MaxActive: 2}

	_, err := c.JobType("", "render", good)
	assert.ErrorIs(t, err, ErrInvalidName, "empty service")
	_, err = c.JobType("svc", "a.b", good)
	assert.ErrorIs(t, err, ErrInvalidName, "job type with a dot")
	_, err = c.JobType("svc", "render", Policy{})
	assert.ErrorIs(t, err, ErrInvalidPolicy, "empty key template")
	_, err = c.JobType("svc", "render", Policy{Key: []string{"/a~2"}})
	assert.ErrorIs(t, err, ErrInvalidPolicy, "bad pointer")
	_, err = c.JobType("svc", "render", Policy{Key: []string{"/t"}, HeartbeatInterval: time.Minute, HeartbeatTTL: time.Second})
	if assert.ErrorIs(t, err, ErrInvalidPolicy) {
		assert.Contains(t, err.Error(), "HeartbeatTTL")
	}

	jt, err := c.JobType("svc", "render", good)
	require.NoError(t, err)
	assert.Equal(t, "svc", jt.Service())
	assert.Equal(t, "render", jt.Name())
	want, err := good.Normalize()
	require.NoError(t, err)
	assert.Equal(t, want, jt.Policy(), "the normalized policy")

	// Neither the caller's policy nor the returned copy reaches the handle.
	good.Key[1] = "/other"
	p := jt.Policy()
	p.Key[0] = "changed"
	assert.Equal(t, []string{"tenant", "/tenant"}, jt.Policy().Key)
	adm, err := jt.Admit(context.Background(), "job-1", []byte(`{"tenant":"acme"}`))
	require.NoError(t, err)
	assert.Equal(t, "tenant:acme", adm.Key)
}

func TestJobTypeBadCalls(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := cCoordinator(t, NewMemoryStore(), nil)
	jt := rtJobType(t, c, "svc", rtPolicy(0, 0))
	other := rtJobType(t, c, "svc", Policy{Key: []string{"/tenant"}})
	otherType, err := c.JobType("svc", "mail", rtPolicy(0, 0))
	require.NoError(t, err)

	_, err = jt.Admit(ctx, "", rtPayload)
	assert.ErrorIs(t, err, ErrInvalidRequest, "empty job id")
	_, err = jt.Admit(ctx, "a\xff", rtPayload)
	assert.ErrorIs(t, err, ErrInvalidRequest, "job id not UTF-8")
	_, err = jt.Admit(ctx, "j", []byte(`{"tenant":null}`))
	assert.ErrorIs(t, err, ErrInvalidKey, "pointer to null")
	_, err = jt.Admit(ctx, "j", []byte(`{`))
	assert.ErrorIs(t, err, ErrInvalidKey, "payload not JSON")
	_, err = jt.Admit(ctx, "j", rtPayload, nil)
	assert.ErrorIs(t, err, ErrInvalidRequest, "nil option")
	_, err = jt.Acquire(ctx, "j", rtPayload, WithTries(-1))
	assert.ErrorIs(t, err, ErrInvalidRequest, "negative tries")
	_, err = jt.Acquire(ctx, "j", rtPayload, WithInstanceID("w\xff"))
	assert.ErrorIs(t, err, ErrInvalidRequest, "instance id not UTF-8")
	_, err = jt.Acquire(ctx, "j", rtPayload, nil)
	assert.ErrorIs(t, err, ErrInvalidRequest, "nil option")
	_, err = jt.RemoveQueued(ctx, "", rtPayload)
	assert.ErrorIs(t, err, ErrInvalidRequest, "empty job id")
	_, err = jt.RestoreReplaced(ctx, "j", rtPayload, ReplacedJob{})
	assert.ErrorIs(t, err, ErrInvalidRequest, "no replaced job")

	lease := rtAcquire(t, jt, "held")
	_, err = otherType.Renew(ctx, lease)
	assert.ErrorIs(t, err, ErrInvalidRequest, "a lease of another job type")
	_, err = otherType.Release(ctx, lease)
	assert.ErrorIs(t, err, ErrInvalidRequest, "a lease of another job type")
	// Another handle of the same job type may renew and release it.
	ren, err := other.Renew(ctx, lease)
	require.NoError(t, err)
	assert.Equal(t, KindRenewed, ren.Kind)
	rel, err := other.Release(ctx, lease)
	require.NoError(t, err)
	assert.Equal(t, KindReleased, rel.Kind)
}

// TestJobTypeRenewUsesItsTTL: the handle renews by its own HeartbeatTTL,
// not by whatever TTL the lease value carries.
func TestJobTypeRenewUsesItsTTL(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	c := cCoordinator(t, NewMemoryStore(), &Config{Now: func() time.Time { return now }})
	jt := rtJobType(t, c, "svc", rtPolicy(time.Second, 10*time.Second))
	lease := rtAcquire(t, jt, "job-1")
	lease.Policy.HeartbeatTTL = 1<<63 - 1
	ren, err := jt.Renew(context.Background(), lease)
	require.NoError(t, err)
	assert.Equal(t, now.Add(10*time.Second), ren.LeaseExpiresAt)
}

// TestJobTypeMatchesRequests: the handle and the request-struct methods,
// given the same clock and tokens, write the same states and give the same
// outcomes, options included.
func TestJobTypeMatchesRequests(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	now := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	newCoord := func(store Store) *KeyCoordinator {
		var n atomic.Int64
		return cCoordinator(t, store, &Config{InstanceID: "w", Now: func() time.Time { return now },
			NewSlotToken: func() string { return "token-" + strconv.FormatInt(n.Add(1), 10) }})
	}
	policy := Policy{Key: []string{"/tenant"}, MaxActive: 1, MaxQueuedPerKey: 1, WhenFull: ReplaceOldest}
	tc := TraceContext{RequestID: "req-1", TraceID: "0af7651916cd43dd8448eb211c80319c", Traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}

	hStore, rStore := NewMemoryStore(), NewMemoryStore()
	jt := rtJobType(t, newCoord(hStore), "svc", policy)
	rc := newCoord(rStore)
	admit := func(id string, strict bool) AdmitRequest {
		return AdmitRequest{Service: "svc", JobType: "render", JobID: id, Payload: rtPayload, Policy: policy, StrictCreate: strict, Context: tc}
	}
	acquire := func(id string) AcquireRequest {
		return AcquireRequest{Service: "svc", JobType: "render", JobID: id, Payload: rtPayload, Policy: policy,
			Retry: true, Tries: 2, InstanceID: "w-2", Context: tc}
	}
	same := func(step string, h, r any, herr, rerr error) {
		t.Helper()
		require.NoError(t, herr, step)
		require.NoError(t, rerr, step)
		assert.Equal(t, r, h, "%s: outcome", step)
		key, err := DeriveKey("svc", "render", rtPayload, policy.Key)
		require.NoError(t, err)
		hv, _, herr := hStore.Get(ctx, "svc", key.KVKey)
		rv, _, rerr := rStore.Get(ctx, "svc", key.KVKey)
		assert.Equal(t, rerr, herr, "%s: read error", step)
		assert.Equal(t, string(rv), string(hv), "%s: state", step)
	}

	h1, herr := jt.Admit(ctx, "a", rtPayload, WithTraceContext(tc))
	r1, rerr := rc.Admit(ctx, admit("a", false))
	same("admit a", h1, r1, herr, rerr)
	h1, herr = jt.Admit(ctx, "b", rtPayload, WithTraceContext(tc))
	r1, rerr = rc.Admit(ctx, admit("b", false))
	same("admit b", h1, r1, herr, rerr)
	h1, herr = jt.Admit(ctx, "c", rtPayload, WithTraceContext(tc), WithStrictCreate())
	r1, rerr = rc.Admit(ctx, admit("c", true))
	same("admit c strict", h1, r1, herr, rerr)
	assert.Equal(t, KindRejected, h1.Kind)
	h1, herr = jt.Admit(ctx, "d", rtPayload)
	r1, rerr = rc.Admit(ctx, AdmitRequest{Service: "svc", JobType: "render", JobID: "d", Payload: rtPayload, Policy: policy})
	same("admit d replaces", h1, r1, herr, rerr)
	require.Equal(t, KindReplaced, h1.Kind)

	h3, herr := jt.RestoreReplaced(ctx, "d", rtPayload, *h1.Replaced)
	r3, rerr := rc.RestoreReplaced(ctx, RestoreRequest{Service: "svc", JobType: "render", ReplacementJobID: "d", Replaced: *r1.Replaced, Payload: rtPayload, Policy: policy})
	same("restore", h3, r3, herr, rerr)

	h2, herr := jt.Acquire(ctx, "r", rtPayload, WithRetry(), WithTries(2), WithInstanceID("w-2"), WithTraceContext(tc))
	r2, rerr := rc.Acquire(ctx, acquire("r"))
	same("acquire retry", h2, r2, herr, rerr)
	require.Equal(t, KindAcquired, h2.Kind)

	h4, herr := jt.Renew(ctx, h2.Lease)
	r4, rerr := rc.Renew(ctx, RenewRequest{Lease: r2.Lease})
	same("renew", h4, r4, herr, rerr)
	h5, herr := jt.Release(ctx, h2.Lease)
	r5, rerr := rc.Release(ctx, ReleaseRequest{Lease: r2.Lease})
	same("release", h5, r5, herr, rerr)
	h6, herr := jt.RemoveQueued(ctx, "b", rtPayload)
	r6, rerr := rc.RemoveQueued(ctx, RemoveRequest{Service: "svc", JobType: "render", JobID: "b", Payload: rtPayload, Policy: policy})
	same("remove", h6, r6, herr, rerr)
	assert.Equal(t, KindRemoved, h6.Kind)
}

// TestJobTypeConcurrent: one handle shared by many goroutines keeps the
// limit; run with -race.
func TestJobTypeConcurrent(t *testing.T) {
	t.Parallel()
	store, _ := rtNATS(t)
	jt := rtJobType(t, cCoordinator(t, store, nil), rtService(), Policy{Key: []string{"/tenant"}, MaxActive: 2, MaxQueuedPerKey: 64})
	ctx := context.Background()
	var (
		running, peak atomic.Int64
		wg            sync.WaitGroup
	)
	for g := range 8 {
		wg.Go(func() {
			for i := range 4 {
				id := fmt.Sprintf("job-%d-%d", g, i)
				if _, err := jt.Admit(ctx, id, rtPayload); !assert.NoError(t, err) {
					return
				}
				for {
					acq, err := jt.Acquire(ctx, id, rtPayload)
					if !assert.NoError(t, err) {
						return
					}
					if acq.Kind == KindBlocked {
						time.Sleep(time.Millisecond)
						continue
					}
					n := running.Add(1)
					for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
					}
					running.Add(-1)
					rel, err := jt.Release(ctx, acq.Lease)
					assert.NoError(t, err)
					assert.Equal(t, KindReleased, rel.Kind)
					break
				}
			}
		})
	}
	wg.Wait()
	assert.LessOrEqual(t, peak.Load(), int64(2), "jobs of one key running at once")
	assert.Nil(t, rtState(t, store, jt), "the key is deleted once every job ran")
}

// BenchmarkKeyCycle compares an admit → acquire → release cycle through the
// handle with the same cycle through the request structs, on the memory
// store (so that the difference is the library's own work).
func BenchmarkKeyCycle(b *testing.B) {
	policy := Policy{Key: []string{"tenant", "/tenant"}, MaxActive: 1, MaxQueuedPerKey: 1}
	ctx := context.Background()
	b.Run("handle", func(b *testing.B) {
		jt := rtJobType(b, cCoordinator(b, NewMemoryStore(), nil), "svc", policy)
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			id := strconv.Itoa(i)
			if _, err := jt.Admit(ctx, id, rtPayload); err != nil {
				b.Fatal(err)
			}
			acq, err := jt.Acquire(ctx, id, rtPayload)
			if err != nil || acq.Kind != KindAcquired {
				b.Fatal(acq.Kind, err)
			}
			if _, err := jt.Release(ctx, acq.Lease); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("requests", func(b *testing.B) {
		c := cCoordinator(b, NewMemoryStore(), nil)
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			id := strconv.Itoa(i)
			if _, err := c.Admit(ctx, AdmitRequest{Service: "svc", JobType: "render", JobID: id, Payload: rtPayload, Policy: policy}); err != nil {
				b.Fatal(err)
			}
			acq, err := c.Acquire(ctx, AcquireRequest{Service: "svc", JobType: "render", JobID: id, Payload: rtPayload, Policy: policy})
			if err != nil || acq.Kind != KindAcquired {
				b.Fatal(acq.Kind, err)
			}
			if _, err := c.Release(ctx, ReleaseRequest{Lease: acq.Lease}); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// TestJobTypeLeaseIsTheCallers: changing the policy in a lease (a plain
// value the caller owns) does not change the handle.
func TestJobTypeLeaseIsTheCallers(t *testing.T) {
	t.Parallel()
	jt := rtJobType(t, cCoordinator(t, NewMemoryStore(), nil), "svc", rtPolicy(0, 0))
	lease := rtAcquire(t, jt, "job-1")
	lease.Policy.Key[0] = "/other"
	assert.Equal(t, []string{"/tenant"}, jt.Policy().Key)
	key, err := jt.Key(rtPayload)
	require.NoError(t, err)
	assert.Equal(t, "acme", key.Key)
}
