package jobkeys

// Regression tests for the coordinator fixes of issue 8.

import (
	"context"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// gatedGetStore holds the first Get after arm until release, having read
// the value already: a read that is answered late.
type gatedGetStore struct {
	Store
	mu      sync.Mutex
	armed   bool
	entered chan struct{}
	release chan struct{}
}

func (s *gatedGetStore) arm() {
	s.mu.Lock()
	s.armed, s.entered, s.release = true, make(chan struct{}), make(chan struct{})
	s.mu.Unlock()
}

func (s *gatedGetStore) Get(ctx context.Context, service, key string) ([]byte, uint64, error) {
	v, rev, err := s.Store.Get(ctx, service, key)
	s.mu.Lock()
	gated := s.armed
	s.armed = false
	s.mu.Unlock()
	if gated {
		close(s.entered)
		<-s.release
	}
	return v, rev, err
}

// A read that found the key absent and returns after this coordinator
// created the key must not discard that write: the operation continues from
// the coordinator's own newer state instead of creating the key again and
// losing a compare-and-swap race to itself. Before, it forgot the cached
// state and its Create failed: a race lost, and a backoff, with nobody else
// writing.
func TestCoordinatorAbsentReadDoesNotRaceItself(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	gated := &gatedGetStore{Store: newCountingStore(NewMemoryStore())}
	c := cCoordinator(t, gated, nil)
	svc := jkService("absent")
	p := Policy{Key: cPolicy().Key, MaxActive: 2, MaxQueuedPerKey: 2}
	gated.arm()
	type result struct {
		acq  Acquisition
		err  error
		lost int
	}
	done := make(chan result, 1)
	go func() {
		actx, races := withRaceCounter(ctx)
		acq, err := c.Acquire(actx, cAcquire(svc, "retry", p, true))
		lost, stale := races.counts()
		done <- result{acq, err, lost + stale}
	}()
	<-gated.entered // the acquisition read the key absent
	adm, err := c.Admit(ctx, cAdmit(svc, "queued", p))
	require.NoError(t, err)
	require.Equal(t, KindAccepted, adm.Kind)
	close(gated.release)
	res := <-done
	require.NoError(t, res.err)
	assert.Equal(t, KindAcquired, res.acq.Kind)
	assert.Zero(t, res.lost, "compare-and-swap failures with no other writer")
	s := storedState(t, gated, svc, cKey(t, svc).KVKey)
	assert.Equal(t, []string{"retry"}, activeJobIDs(s))
	assert.Equal(t, []string{"queued"}, queuedIDs(s))
}

// A clock whose leases would end after year 9999 is refused before any
// write, with an error naming the time and the bound; the key stays
// readable. Before, the lease was written as "10000-01-01T…", which no
// reader accepts, and every later operation on the key failed.
func TestCoordinatorRefusesClockPastYear9999(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	clock := &jkClock{t: time.Date(9999, 12, 31, 23, 59, 0, 0, time.UTC)}
	st := NewMemoryStore()
	c := cCoordinator(t, st, &Config{Now: clock.Now})
	svc := jkService("clock")
	key := cKey(t, svc)
	p := cPolicy()
	_, err := c.Admit(ctx, cAdmit(svc, "j", p))
	require.NoError(t, err, "an admission at 9999-12-31T23:59Z writes times within the years")
	before, rev := stored(t, st, svc, key.KVKey)

	_, err = c.Acquire(ctx, cAcquire(svc, "j", p, false))
	require.ErrorIs(t, err, ErrClockOutOfRange)
	assert.Contains(t, err.Error(), "10000-01-01T00:01:00Z", "the lease's end")
	assert.Contains(t, err.Error(), "9999-12-31T23:59:59.999Z", "the bound")
	after, rev2 := stored(t, st, svc, key.KVKey)
	assert.Equal(t, string(before), string(after))
	assert.Equal(t, rev, rev2)

	clock.Advance(time.Hour) // now in year 10000
	_, err = c.Admit(ctx, cAdmit(svc, "k", p))
	require.ErrorIs(t, err, ErrClockOutOfRange)
	_, err = ParseState(after)
	require.NoError(t, err, "the key is still readable")
}

// Renew checks the lease's policy as Acquire checks a policy: a lease that
// claims a HeartbeatTTL of math.MaxInt64 is an error, and nothing is
// written. Before, it extended the lease to the year 2319.
func TestCoordinatorRenewValidatesLeasePolicy(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := NewMemoryStore()
	c := cCoordinator(t, st, nil)
	svc := jkService("leasepolicy")
	key := cKey(t, svc)
	p := cPolicy()
	_, err := c.Admit(ctx, cAdmit(svc, "j", p))
	require.NoError(t, err)
	acq, err := c.Acquire(ctx, cAcquire(svc, "j", p, false))
	require.NoError(t, err)
	require.Equal(t, KindAcquired, acq.Kind)
	before, _ := stored(t, st, svc, key.KVKey)

	for name, mutate := range map[string]func(*Lease){
		"HeartbeatTTL MaxInt64":   func(l *Lease) { l.Policy.HeartbeatTTL = math.MaxInt64 },
		"HeartbeatTTL over limit": func(l *Lease) { l.Policy.HeartbeatTTL = HeartbeatTTLLimit + time.Millisecond },
		"TTL not over interval":   func(l *Lease) { l.Policy.HeartbeatInterval = l.Policy.HeartbeatTTL },
	} {
		lease := acq.Lease
		mutate(&lease)
		_, err := c.Renew(ctx, RenewRequest{Lease: lease})
		require.ErrorIs(t, err, ErrInvalidRequest, name)
		require.ErrorIs(t, err, ErrInvalidPolicy, name)
		assert.Contains(t, err.Error(), "Lease.Policy", name)
		_, err = c.Release(ctx, ReleaseRequest{Lease: lease})
		require.ErrorIs(t, err, ErrInvalidPolicy, name)
	}
	after, _ := stored(t, st, svc, key.KVKey)
	assert.Equal(t, string(before), string(after))
	ren, err := c.Renew(ctx, RenewRequest{Lease: acq.Lease})
	require.NoError(t, err)
	assert.Equal(t, KindRenewed, ren.Kind)
}

// An acquisition under other limits than the state was written under says
// so in Acquisition.StoredLimits, acquired or blocked.
func TestCoordinatorAcquireReportsOtherLimits(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := cCoordinator(t, NewMemoryStore(), nil)
	svc := jkService("limits")
	producer := Policy{Key: cPolicy().Key, MaxActive: 1, MaxQueuedPerKey: 3}
	worker := Policy{Key: cPolicy().Key, MaxActive: 2, MaxQueuedPerKey: 3}
	for _, id := range []string{"a", "b", "c"} {
		_, err := c.Admit(ctx, cAdmit(svc, id, producer))
		require.NoError(t, err)
	}
	same, err := c.Acquire(ctx, cAcquire(svc, "a", producer, false))
	require.NoError(t, err)
	require.Equal(t, KindAcquired, same.Kind)
	assert.Nil(t, same.StoredLimits, "same limits")

	other, err := c.Acquire(ctx, cAcquire(svc, "b", worker, false))
	require.NoError(t, err)
	require.Equal(t, KindAcquired, other.Kind, "MaxActive 2 lets b start beside a")
	assert.Equal(t, &Limits{MaxActive: 1, MaxQueuedPerKey: 3}, other.StoredLimits)

	blocked, err := c.Acquire(ctx, cAcquire(svc, "c", producer, false))
	require.NoError(t, err)
	require.Equal(t, KindBlocked, blocked.Kind)
	assert.Equal(t, &Limits{MaxActive: 2, MaxQueuedPerKey: 3}, blocked.StoredLimits)
	assert.True(t, strings.Contains(string(blocked.Reason), "active"))
}

// Renew and Release are bounded by the lease, not by Config.MaxAttempts: a
// renewal that loses more races than MaxAttempts still renews once the
// contention ends, and one that keeps losing gives up with ErrContention
// only once its lease has expired, naming the expiry. Before, both gave up
// after MaxAttempts lost races however long the lease still ran.
func TestCoordinatorLeaseOpsBoundedByLease(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	clock := &jkClock{t: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)}
	fs := &faultStore{Store: NewMemoryStore()}
	const attempts = 3
	c := cCoordinator(t, fs, &Config{Now: clock.Now, MaxAttempts: attempts, RetryBackoff: time.Microsecond, MaxRetryBackoff: 10 * time.Microsecond})
	svc := jkService("leasebound")
	p := cPolicy() // HeartbeatTTL 120s by default
	_, err := c.Admit(ctx, cAdmit(svc, "j", p))
	require.NoError(t, err)
	acq, err := c.Acquire(ctx, cAcquire(svc, "j", p, false))
	require.NoError(t, err)
	require.Equal(t, KindAcquired, acq.Kind)

	// 5×MaxAttempts lost races, then the other writers stop.
	fs.failing.Store(true)
	fs.onConflict = func(n int64) {
		if n == 5*attempts {
			fs.failing.Store(false)
		}
	}
	ren, err := c.Renew(ctx, RenewRequest{Lease: acq.Lease})
	require.NoError(t, err, "a renewal that lost %d races with the lease still running", 5*attempts)
	assert.Equal(t, KindRenewed, ren.Kind)

	// Races lost while the clock passes the lease's expiry: ErrContention
	// then, and not before.
	var expiredAt int64
	fs.onConflict = func(n int64) {
		if n == 10*attempts {
			clock.Advance(2 * p.normalizedTTL(t))
			expiredAt = n
		}
	}
	check := func(name string, expires time.Time, op func() error) {
		fs.writes.Store(0)
		expiredAt = 0
		fs.failing.Store(true)
		err := op()
		fs.failing.Store(false)
		require.ErrorIs(t, err, ErrContention, name)
		assert.Contains(t, err.Error(), "lease expired at "+expires.Format(time.RFC3339Nano), name)
		assert.Equal(t, int64(10*attempts), expiredAt, "%s: gave up before the lease expired", name)
		assert.Equal(t, expiredAt, fs.writes.Load(), "%s: attempts after the expiry", name)
	}
	check("Renew", ren.LeaseExpiresAt, func() error { _, err := c.Renew(ctx, RenewRequest{Lease: acq.Lease}); return err })
	// The slot expired: its job's retry takes it over with a new lease.
	acq, err = c.Acquire(ctx, cAcquire(svc, "j", p, true))
	require.NoError(t, err)
	require.Equal(t, KindAcquired, acq.Kind)
	check("Release", acq.Lease.LeaseExpiresAt, func() error { _, err := c.Release(ctx, ReleaseRequest{Lease: acq.Lease}); return err })
}

// normalizedTTL is p's HeartbeatTTL with the default filled in.
func (p Policy) normalizedTTL(t *testing.T) time.Duration {
	n, err := p.Normalize()
	require.NoError(t, err)
	return n.HeartbeatTTL
}
