package jobkeys

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// inspectClock is a clock a test moves on.
type inspectClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *inspectClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *inspectClock) add(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

var inspectPolicy = Policy{Key: []string{"/t"}, MaxActive: 2, MaxQueuedPerKey: 1,
	HeartbeatInterval: time.Second, HeartbeatTTL: 10 * time.Second}

// A listing shows every key of the job type with its occupancy, a corrupt
// one with its problem, and nothing of other job types.
func TestInspectKeys(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, b := range coordBackends(t) {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			st, svc, _ := b.open(t)
			clock := &inspectClock{now: rt0}
			coord := cCoordinator(t, st, &Config{IgnoreClockSkew: true, Now: clock.Now})
			jt, err := coord.JobType(svc, "render", inspectPolicy)
			require.NoError(t, err)
			other, err := coord.JobType(svc, "other", inspectPolicy)
			require.NoError(t, err)

			// idle: one job queued.
			_, err = jt.Admit(ctx, "q1", []byte(`{"t":"idle"}`))
			require.NoError(t, err)
			// full: two slots and one queued.
			for _, id := range []string{"f1", "f2", "f3"} {
				_, err = jt.Admit(ctx, id, []byte(`{"t":"full"}`))
				require.NoError(t, err)
			}
			for _, id := range []string{"f1", "f2"} {
				acq, err := jt.Acquire(ctx, id, []byte(`{"t":"full"}`))
				require.NoError(t, err)
				require.Equal(t, KindAcquired, acq.Kind)
			}
			// expired: one slot acquired 11s before the listing.
			_, err = jt.Admit(ctx, "e1", []byte(`{"t":"expired"}`))
			require.NoError(t, err)
			_, err = jt.Acquire(ctx, "e1", []byte(`{"t":"expired"}`))
			require.NoError(t, err)
			_, err = other.Admit(ctx, "o1", []byte(`{"t":"idle"}`))
			require.NoError(t, err)
			// corrupt: a value that is not key state.
			corruptKey := svc + ".render." + strings.Repeat("c", 64)
			_, err = st.Create(ctx, svc, corruptKey, []byte(`{"version":1,"trunc`))
			require.NoError(t, err)

			clock.add(5 * time.Second)
			_, err = jt.Admit(ctx, "f4", []byte(`{"t":"other-full"}`)) // a later key, never acquired
			require.NoError(t, err)
			clock.add(6 * time.Second)

			infos, err := jt.InspectKeys(ctx)
			require.NoError(t, err)
			byKey := map[string]KeyInfo{}
			for _, in := range infos {
				if in.Corrupt() {
					byKey["corrupt"] = in
					continue
				}
				byKey[in.DisplayKey] = in
			}
			require.Len(t, infos, 5, "idle, full, expired, other-full and the corrupt key; not the other job type")
			for i := 1; i < len(infos); i++ {
				assert.Less(t, infos[i-1].KVKey, infos[i].KVKey, "sorted by KV key")
			}

			idle := byKey["idle"]
			assert.Equal(t, 0, idle.Active)
			assert.Equal(t, 1, idle.Queued)
			assert.Equal(t, 3, idle.QueueLimit, "MaxQueuedPerKey + free slots")
			assert.Equal(t, rt0, idle.OldestQueuedAt)
			assert.Equal(t, 11*time.Second, idle.OldestQueuedAge())
			assert.True(t, idle.NextLeaseExpiry.IsZero())

			full := byKey["full"]
			assert.Equal(t, [4]int{2, 2, 1, 1}, [4]int{full.Active, full.MaxActive, full.Queued, full.QueueLimit})
			assert.Equal(t, 2, full.ExpiredSlots, "acquired 11s ago with a 10s TTL")

			acq, err := jt.Acquire(ctx, "f4", []byte(`{"t":"other-full"}`))
			require.NoError(t, err)
			info, err := jt.InspectKey(ctx, []byte(`{"t":"other-full"}`))
			require.NoError(t, err)
			assert.Equal(t, 0, info.ExpiredSlots)
			assert.Equal(t, acq.Lease.LeaseExpiresAt, info.NextLeaseExpiry)

			exp := byKey["expired"]
			assert.Equal(t, 1, exp.ExpiredSlots)
			assert.Equal(t, 0, exp.StaleCount)
			require.NotNil(t, exp.State)
			assert.NotZero(t, exp.Revision)

			bad := byKey["corrupt"]
			assert.Equal(t, corruptKey, bad.KVKey)
			require.ErrorIs(t, bad.Problem, ErrCorruptState)
			assert.Nil(t, bad.State)
			assert.Equal(t, []byte(`{"version":1,"trunc`), bad.Value)

			all, err := coord.InspectKeys(ctx, svc, "")
			require.NoError(t, err)
			assert.Len(t, all, 6, "every job type")

			_, err = jt.InspectKey(ctx, []byte(`{"t":"nobody"}`))
			require.ErrorIs(t, err, ErrKeyNotFound)
			_, err = coord.InspectKey(ctx, svc, "not-a-key")
			require.ErrorIs(t, err, ErrInvalidRequest)
		})
	}
}

// A watch starts with every key, reports slots and queue entries as they
// change, and reports no renewal.
func TestWatchOccupancy(t *testing.T) {
	t.Parallel()
	for _, b := range coordBackends(t) {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			st, svc, _ := b.open(t)
			clock := &inspectClock{now: rt0}
			coord := cCoordinator(t, st, &Config{IgnoreClockSkew: true, Now: clock.Now})
			jt, err := coord.JobType(svc, "render", inspectPolicy)
			require.NoError(t, err)
			a := []byte(`{"t":"a"}`)
			_, err = jt.Admit(ctx, "j1", a)
			require.NoError(t, err)

			wctx, stop := context.WithCancel(ctx)
			w, err := coord.WatchOccupancy(wctx, svc, "render")
			require.NoError(t, err)
			next := func() KeyChange {
				t.Helper()
				select {
				case ch, ok := <-w.Changes():
					require.True(t, ok, "watch ended: %v", w.Err())
					return ch
				case <-ctx.Done():
					require.FailNow(t, "no change")
				}
				return KeyChange{}
			}
			first := next()
			assert.True(t, first.Initial)
			assert.Equal(t, 1, first.Info.Queued)

			acq, err := jt.Acquire(ctx, "j1", a)
			require.NoError(t, err)
			ch := next()
			assert.False(t, ch.Initial)
			assert.Equal(t, [2]int{1, 0}, [2]int{ch.Info.Active, ch.Info.Queued})

			for range 5 { // heartbeats: no events
				clock.add(time.Second)
				ren, err := jt.Renew(ctx, acq.Lease)
				require.NoError(t, err)
				require.Equal(t, KindRenewed, ren.Kind)
			}
			_, err = jt.Admit(ctx, "j2", a)
			require.NoError(t, err)
			ch = next()
			assert.Equal(t, [2]int{1, 1}, [2]int{ch.Info.Active, ch.Info.Queued}, "the admission, not a renewal")

			_, err = jt.Release(ctx, acq.Lease)
			require.NoError(t, err)
			ch = next()
			assert.Equal(t, [2]int{0, 1}, [2]int{ch.Info.Active, ch.Info.Queued})
			_, err = jt.RemoveQueued(ctx, "j2", a)
			require.NoError(t, err)
			ch = next()
			assert.True(t, ch.Deleted)

			stop()
			for range w.Changes() {
			}
			require.ErrorIs(t, w.Err(), context.Canceled)
		})
	}
}

// A store that cannot list or watch keys is told so, not used halfway.
func TestInspectNeedsCapabilities(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	plain := struct{ Store }{NewMemoryStore()} // only the Store methods
	coord := cCoordinator(t, plain, nil)
	_, err := coord.InspectKeys(ctx, "svc", "render")
	require.ErrorIs(t, err, ErrInvalidRequest)
	assert.Contains(t, err.Error(), "ListableStore")
	_, err = coord.WatchOccupancy(ctx, "svc", "render")
	require.ErrorIs(t, err, ErrInvalidRequest)
	assert.Contains(t, err.Error(), "WatchableStore")
	_, err = cCoordinator(t, NewMemoryStore(), nil).InspectKeys(ctx, "svc", "a.b")
	require.ErrorIs(t, err, ErrInvalidName)
}
