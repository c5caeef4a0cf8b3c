package jobkeys

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jobkeys/jobkeys/internal/natstest"
)

// skewedClock is a Config.Now that reads the local clock plus an offset the
// test can change.
type skewedClock struct{ skew atomic.Int64 }

func (c *skewedClock) Now() time.Time         { return time.Now().Add(time.Duration(c.skew.Load())) }
func (c *skewedClock) set(skew time.Duration) { c.skew.Store(int64(skew)) }
func newSkewedClock(skew time.Duration) *skewedClock {
	c := &skewedClock{}
	c.set(skew)
	return c
}

// clockPolicy tolerates 9s of skew between hosts: the coordinators refuse
// at 4.5s from the server.
var clockPolicy = rtPolicy(time.Second, 10*time.Second)

// storedRevision returns the revision of rtPayload's key (0: absent).
func storedRevision(t testing.TB, store Store, jt *JobType) uint64 {
	t.Helper()
	key, err := jt.Key(rtPayload)
	require.NoError(t, err)
	_, rev, err := store.Get(context.Background(), jt.Service(), key.KVKey)
	if errors.Is(err, ErrKeyNotFound) {
		return 0
	}
	require.NoError(t, err)
	return rev
}

// TestClockSkewRefusesAcquisition: against a real server, a coordinator
// whose clock is hours (or seconds past the limit) ahead of or behind the
// server's is refused every acquisition with ErrClockSkew, and writes
// nothing; one within the limit acquires as before.
func TestClockSkewRefusesAcquisition(t *testing.T) {
	t.Parallel()
	store, _ := rtNATS(t)
	for _, tc := range []struct {
		name   string
		skew   time.Duration
		refuse bool
	}{
		{"in-sync", 0, false},
		{"ahead-within-limit", 2 * time.Second, false},
		{"behind-within-limit", -2 * time.Second, false},
		{"ahead-past-limit", 6 * time.Second, true},
		{"behind-past-limit", -6 * time.Second, true},
		{"an-hour-ahead", time.Hour, true},
		{"an-hour-behind", -time.Hour, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			svc := rtService()
			producer := rtJobType(t, cCoordinator(t, store, nil), svc, clockPolicy)
			c := cCoordinator(t, store, &Config{InstanceID: "skewed", Now: newSkewedClock(tc.skew).Now})
			jt := rtJobType(t, c, svc, clockPolicy)
			id := rtAdmit(t, producer, "job-1")
			before := storedRevision(t, store, jt)
			require.NotZero(t, before)

			acq, err := jt.Acquire(context.Background(), id, rtPayload)
			if !tc.refuse {
				require.NoError(t, err)
				assert.Equal(t, KindAcquired, acq.Kind)
				return
			}
			require.ErrorIs(t, err, ErrClockSkew)
			assert.Zero(t, acq)
			key, kerr := jt.Key(rtPayload)
			require.NoError(t, kerr)
			assert.ErrorContains(t, err, key.KVKey, "the error names the KV key")
			assert.ErrorContains(t, err, "HeartbeatTTL 10s and HeartbeatInterval 1s", "the error names the policy")
			assert.ErrorContains(t, err, "4.5s or more", "the error names the limit")
			assert.Equal(t, before, storedRevision(t, store, jt), "nothing written")
			st := rtState(t, store, jt)
			require.NotNil(t, st)
			assert.Empty(t, st.Active)
			assert.Equal(t, []string{"job-1"}, queuedIDs(st))
		})
	}
}

// TestClockSkewKeepsHeldSlots: a coordinator whose clock steps far off
// after it took a slot still renews and releases it (refusing would let
// the slot lapse in the other hosts' eyes), but takes no new slot.
func TestClockSkewKeepsHeldSlots(t *testing.T) {
	t.Parallel()
	store, _ := rtNATS(t)
	svc := rtService()
	clock := newSkewedClock(0)
	jt := rtJobType(t, cCoordinator(t, store, &Config{Now: clock.Now}), svc, clockPolicy)
	lease := rtAcquire(t, jt, "job-1")
	rtAdmit(t, jt, "job-2")

	clock.set(-time.Hour)
	ctx := context.Background()
	ren, err := jt.Renew(ctx, lease)
	require.NoError(t, err)
	assert.Equal(t, KindRenewed, ren.Kind)
	rel, err := jt.Release(ctx, lease)
	require.NoError(t, err)
	assert.Equal(t, KindReleased, rel.Kind)
	_, err = jt.Acquire(ctx, "job-2", rtPayload)
	require.ErrorIs(t, err, ErrClockSkew)

	clock.set(0) // time sync fixed
	acq, err := jt.Acquire(ctx, "job-2", rtPayload)
	require.NoError(t, err)
	assert.Equal(t, KindAcquired, acq.Kind)
}

// TestClockSkewRefusesTakeoverAndSweep: a host an hour ahead, which sees a
// live lease as expired, neither takes it over nor sweeps it, in a Runner
// or a Sweep; IgnoreClockSkew restores the takeover (which is why the
// check exists: the first holder is still running).
func TestClockSkewRefusesTakeoverAndSweep(t *testing.T) {
	t.Parallel()
	store, _ := rtNATS(t)
	for _, stale := range []StalePolicy{FailStale, Block} {
		t.Run(string(stale), func(t *testing.T) {
			svc := rtService()
			p := clockPolicy
			p.StalePolicy = stale
			holder := rtJobType(t, cCoordinator(t, store, &Config{InstanceID: "holder"}), svc, p)
			lease := rtAcquire(t, holder, "job-1")
			rtAdmit(t, holder, "job-2")
			ahead := func() time.Time { return time.Now().Add(time.Hour) }
			skewed := rtJobType(t, cCoordinator(t, store, &Config{InstanceID: "ahead", Now: ahead}), svc, p)
			before := storedRevision(t, store, holder)

			ran := false
			_, err := rtRunner(t, skewed, &RunnerConfig{MaxWait: 5 * time.Second}).Run(context.Background(), "job-2", rtPayload,
				func(context.Context, Lease) error { ran = true; return nil })
			require.ErrorIs(t, err, ErrClockSkew)
			assert.False(t, ran, "the handler did not run")
			rep, err := skewed.Sweep(context.Background())
			require.ErrorIs(t, err, ErrClockSkew)
			assert.Contains(t, err.Error(), `sweep of job type "render" of service "`+svc+`"`)
			assert.Zero(t, rep)
			assert.Equal(t, before, storedRevision(t, store, holder), "nothing written")

			ignoring := rtJobType(t, cCoordinator(t, store, &Config{InstanceID: "ignoring", Now: ahead, IgnoreClockSkew: true}), svc, p)
			rep, err = ignoring.Sweep(context.Background())
			require.NoError(t, err)
			swept := append(rep.Removed, rep.Expired...)
			require.Len(t, swept, 1, "the skewed clock sees the live lease as expired")
			assert.Equal(t, lease.SlotToken, swept[0].Slot.SlotToken)
		})
	}
}

// TestClockOffsetBoundsTheInjectedOffset: the offset a coordinator reports
// against a real server (whose clock is this host's) contains the offset
// its Config.Now injects, to within a fraction of a second.
func TestClockOffsetBoundsTheInjectedOffset(t *testing.T) {
	t.Parallel()
	store, _ := rtNATS(t)
	svc := rtService()
	clock := newSkewedClock(0)
	c := cCoordinator(t, store, &Config{Now: clock.Now})
	rtAdmit(t, rtJobType(t, c, svc, clockPolicy), "job-1") // opens the bucket
	for _, skew := range []time.Duration{0, 3 * time.Second, -7 * time.Second, time.Hour, -48 * time.Hour} {
		clock.set(skew)
		off, err := c.ClockOffset(context.Background(), svc)
		require.NoError(t, err)
		require.True(t, off.MinKnown && off.MaxKnown, "skew %v: %+v", skew, off)
		// server − coordinator = local − (local + skew).
		assert.LessOrEqual(t, off.Min, -skew, "skew %v", skew)
		assert.GreaterOrEqual(t, off.Max, -skew, "skew %v", skew)
		assert.Less(t, off.Max-off.Min, time.Second, "skew %v: a round trip wide", skew)
	}
	_, err := c.ClockOffset(context.Background(), "bad service")
	require.ErrorIs(t, err, ErrInvalidName)
}

// TestClockSkewMemoryStoreDetectsNothing: MemoryStore knows no server
// clock: a skewed coordinator over one acquires, and reports nothing known.
func TestClockSkewMemoryStoreDetectsNothing(t *testing.T) {
	t.Parallel()
	store := NewMemoryStore()
	svc := rtService()
	c := cCoordinator(t, store, &Config{Now: newSkewedClock(time.Hour).Now})
	rtAcquire(t, rtJobType(t, c, svc, clockPolicy), "job-1")
	off, err := c.ClockOffset(context.Background(), svc)
	require.NoError(t, err)
	assert.Equal(t, ClockOffset{}, off)
}

// TestNATSStoreClockFromStamps: the stamps of the values a Get reads and of
// the changes a watch delivers give the store a lower bound on the offset
// by themselves, with no probe: here (server and test share a clock) at
// most zero and not far below.
func TestNATSStoreClockFromStamps(t *testing.T) {
	t.Parallel()
	store, _ := rtNATS(t)
	svc := rtService()
	jt := rtJobType(t, cCoordinator(t, store, nil), svc, clockPolicy)
	rtAdmit(t, jt, "job-1")
	clock := store.bucketClock(svc)
	require.NotNil(t, clock)
	lowerOnly := func(what string) {
		t.Helper()
		got, _ := clock.bounds(time.Now())
		require.True(t, got.hasLo, "%s: a lower bound", what)
		assert.False(t, got.hasHi, "%s: no upper bound from stamps alone", what)
		assert.LessOrEqual(t, got.lo, time.Duration(0), what)
		assert.Greater(t, got.lo, -time.Second, what)
	}

	clock.forget()
	storedRevision(t, store, jt)
	lowerOnly("get")

	clock.forget()
	ctx, cancel := context.WithCancel(context.Background())
	changes := make(chan string, 16)
	ended, err := store.WatchKeys(ctx, svc, "", func(kvKey string) { changes <- kvKey })
	require.NoError(t, err)
	defer func() { cancel(); <-ended }()
	clock.forget() // the watch's start may have read the bucket
	rtAdmit(t, jt, "job-2")
	select {
	case <-changes:
	case <-time.After(30 * time.Second):
		t.Fatal("the watch delivered no change")
	}
	lowerOnly("watch")
}

// forget drops everything e knows.
func (e *clockEstimate) forget() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.lo, e.hi, e.probedAt = clockBound{}, clockBound{}, time.Time{}
}

// TestClockEstimate steps the estimate through its rules: a round trip
// bounds both sides, a stamp raises the lower bound, a contradiction drops
// the older bound, bounds age out, and a probe is due when a bound is
// missing or old, at most once per clockProbeRetry.
func TestClockEstimate(t *testing.T) {
	t0 := time.Now()
	var e clockEstimate
	b, probe := e.bounds(t0)
	assert.Equal(t, clockBounds{}, b)
	assert.True(t, probe, "nothing known: a probe is due")

	ts := t0.Add(-time.Hour).Round(0) // a server an hour behind
	e.observeRoundTrip(ts, t0, t0.Add(2*time.Millisecond))
	b, probe = e.bounds(t0.Add(3 * time.Millisecond))
	assert.Equal(t, clockBounds{lo: -time.Hour - 2*time.Millisecond, hi: -time.Hour, hasLo: true, hasHi: true}, b)
	assert.False(t, probe)
	assert.Equal(t, time.Hour, b.minAbs())
	assert.Equal(t, 2*time.Hour, b.shift(-time.Hour).minAbs(), "a clock behind this one")
	assert.Equal(t, time.Duration(0), b.shift(time.Hour+time.Millisecond).minAbs(), "within the interval")

	// A stamp received 1ms after the server wrote it: a tighter lower bound.
	at := t0.Add(10 * time.Millisecond)
	e.observeStamp(at.Add(-time.Hour-time.Millisecond).Round(0), at)
	b, _ = e.bounds(at)
	assert.Equal(t, -time.Hour-time.Millisecond, b.lo)
	// A looser one, while the bound is young, changes nothing.
	e.observeStamp(at.Add(-2*time.Hour).Round(0), at)
	b, _ = e.bounds(at)
	assert.Equal(t, -time.Hour-time.Millisecond, b.lo)

	// The server's clock jumps forward: the new lower bound contradicts the
	// upper one, which goes; a probe is due.
	at = t0.Add(20 * time.Millisecond)
	e.observeStamp(at.Round(0), at)
	b, probe = e.bounds(at)
	assert.Equal(t, clockBounds{lo: 0, hasLo: true}, b)
	assert.True(t, probe)

	require.True(t, e.startProbe(at))
	assert.False(t, e.startProbe(at), "one probe at a time")
	e.endProbe()
	_, probe = e.bounds(at.Add(clockProbeRetry / 2))
	assert.False(t, probe, "a probe started less than clockProbeRetry ago")
	_, probe = e.bounds(at.Add(clockProbeRetry))
	assert.True(t, probe)

	// Bounds age out.
	e.observeRoundTrip(at.Round(0), at, at)
	b, probe = e.bounds(at.Add(clockProbeAfter - time.Millisecond))
	assert.True(t, b.hasLo && b.hasHi)
	assert.False(t, probe)
	b, probe = e.bounds(at.Add(clockProbeAfter))
	assert.True(t, b.hasLo && b.hasHi, "still used")
	assert.True(t, probe, "but due for a probe")
	b, _ = e.bounds(at.Add(clockBoundAge))
	assert.Equal(t, clockBounds{}, b, "too old to use")

	// A bound measured by a concurrent call just after the check read its
	// clock holds for the check.
	e.observeRoundTrip(at.Round(0), at.Add(5*time.Millisecond), at.Add(5*time.Millisecond))
	b, probe = e.bounds(at)
	assert.True(t, b.hasLo && b.hasHi)
	assert.False(t, probe)

	var nilEstimate *clockEstimate
	nilEstimate.observeStamp(t0, t0) // a watch of a bucket not open: nothing recorded, no panic
}

// BenchmarkClockSkewCheck is what the check adds to every acquisition and
// sweep on a NATSStore whose bucket is open (no probe is due within a
// run of a few seconds), what a probe costs the acquisition that makes
// it, and what every watched change and Get pays to record its stamp.
func BenchmarkClockSkewCheck(b *testing.B) {
	store, _ := rtNATS(b)
	svc := rtService()
	c := cCoordinator(b, store, nil)
	rtAdmit(b, rtJobType(b, c, svc, clockPolicy), "job-1")
	ctx := context.Background()
	b.Run("acquisition", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if refuse := c.clockSkew(ctx, svc, clockPolicy); refuse != nil {
				b.Fatal(refuse("check"))
			}
		}
	})
	b.Run("probe", func(b *testing.B) { // one stream info request: once per 10s and bucket
		bucket, err := store.bucket(ctx, svc)
		require.NoError(b, err)
		b.ReportAllocs()
		for b.Loop() {
			store.probeClock(ctx, svc, bucket)
		}
	})
	clock := store.bucketClock(svc)
	b.Run("stamp", func(b *testing.B) {
		b.ReportAllocs()
		ts := time.Now()
		for b.Loop() {
			clock.observeStamp(ts, time.Now())
		}
	})
}

// TestClusterClockFromLeaderGets: on an R3 bucket, Get reads through the
// stream leader's message get, whose stamp bounds the offset too, and a
// skewed coordinator is refused there as on one server (JOBKEYS_CLUSTER=1).
func TestClusterClockFromLeaderGets(t *testing.T) {
	clusterEnabled(t)
	c := natstest.StartCluster(t, natstest.ClusterOptions{Nodes: 3})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, js := clusterConnect(t, c.URLs(0))
	const svc = "clusterclock"
	clusterBucket(t, ctx, js, svc)
	store, err := NewNATSStore(js)
	require.NoError(t, err)
	jt := rtJobType(t, cCoordinator(t, store, nil), svc, clockPolicy)
	id := rtAdmit(t, jt, "job-1")

	clock := store.bucketClock(svc)
	require.NotNil(t, clock)
	clock.forget()
	storedRevision(t, store, jt)
	got, _ := clock.bounds(time.Now())
	require.True(t, got.hasLo, "the leader get's stamp bounds the offset")
	assert.LessOrEqual(t, got.lo, time.Duration(0))
	assert.Greater(t, got.lo, -time.Second)

	skewed := rtJobType(t, cCoordinator(t, store, &Config{Now: newSkewedClock(time.Hour).Now}), svc, clockPolicy)
	_, err = skewed.Acquire(ctx, id, rtPayload)
	require.ErrorIs(t, err, ErrClockSkew)
	acq, err := jt.Acquire(ctx, id, rtPayload)
	require.NoError(t, err)
	assert.Equal(t, KindAcquired, acq.Kind)
}
