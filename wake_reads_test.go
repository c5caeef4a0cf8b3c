package jobkeys

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jobkeys/jobkeys/internal/natstest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestWakeReadsSentAtOfOwnRequests: the coordinator records, with a state
// its own write or read returned, when that request was sent (the
// post-subscribe try of a Run over wake-ups trusts a state by that time,
// see wakeTrustSent), and no send time with a state it learned otherwise
// (a wake-up's), which is held to wakeTrustAge from its arrival.
func TestWakeReadsSentAtOfOwnRequests(t *testing.T) {
	t.Parallel()
	s := natstest.Run(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	policy := Policy{Key: benchPolicy.Key, MaxActive: 1, MaxQueuedPerKey: 8}
	p := newWakeProc(t, s, jkService("wakereads"), policy, wakeProcConfig{uncounted: true})
	c, jt := p.c, p.jt
	payload := benchPayload(0)
	key, err := jt.Key(payload)
	require.NoError(t, err)

	before := time.Now()
	adm, err := jt.Admit(ctx, "j1", payload)
	require.NoError(t, err)
	require.Equal(t, KindAccepted, adm.Kind)
	after := time.Now()
	e := c.keys.entry(key.KVKey)
	require.NotNil(t, e, "the entry is kept: it remembers the state")
	rev, at, sent := e.Learned()
	require.NotZero(t, rev)
	assert.False(t, sent.Before(before), "the write's send time is not before the call")
	assert.False(t, at.Before(sent), "the state arrived after its request was sent")
	assert.False(t, after.Before(at))

	// A wake-up's state (here: observed as subscribeWake does) has no
	// send time of this coordinator's.
	st, _, ok := e.Known()
	require.True(t, ok)
	e.Observe(st, rev+1, e.FeedMark())
	_, _, sent = e.Learned()
	assert.True(t, sent.IsZero(), "a state learned from a wake-up has no send time")

	// The cached revision is past the stored one: the acquisition's
	// write fails, and the read and write that follow record their send
	// times.
	before = time.Now()
	acq, err := jt.Acquire(ctx, "j1", payload)
	require.NoError(t, err)
	require.Equal(t, KindAcquired, acq.Kind)
	rev2, at, sent := e.Learned()
	assert.Greater(t, rev2, rev)
	assert.False(t, sent.Before(before), "the request's send time is not before the call")
	assert.False(t, at.Before(sent))
}

// thenOnLostUpdate returns the hook of a store whose Update, when it loses
// its compare-and-swap, first runs *then if set (a wake-up that arrives
// during the failed write).
func thenOnLostUpdate(then *func()) storeHook {
	return func(_ context.Context, c storeCall, call func() storeResult) storeResult {
		r := call()
		if c.op == opUpdate && errors.Is(r.err, ErrRevisionConflict) && *then != nil {
			(*then)()
		}
		return r
	}
}

// TestWakeLostOutcomeFigures: a woken try whose write lost (errWakeLost)
// reports the blocked outcome of the state its coordinator holds of the
// key (a wake-up of the write it lost to brought it): the live slot, its
// expiry and the queued jobs, not "0 active" with the reason "active
// limit". Holding none, it reports the queue of the state its write was
// made on, with the slot counted as taken. (It used to report 0 active,
// 0 queued, no expiry, whatever the state.)
func TestWakeLostOutcomeFigures(t *testing.T) {
	t.Parallel()
	s := natstest.Run(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	policy := Policy{Key: benchPolicy.Key, MaxActive: 1, MaxQueuedPerKey: 8}
	service := jkService("wakelost")
	payload := benchPayload(0)

	for _, held := range []bool{true, false} {
		name := "nothing-held"
		if held {
			name = "held"
		}
		t.Run(name, func(t *testing.T) {
			service := service + name
			var then func()
			pa := newWakeProc(t, s, service, policy, wakeProcConfig{uncounted: true, wrap: func(st Store) Store {
				// A bare Store: no wake-ups, batches or clock.
				return newHookStore(st, passNone).withHook(thenOnLostUpdate(&then))
			}})
			pb := newWakeProc(t, s, service, policy, wakeProcConfig{uncounted: true})
			a, ja, b, jb := pa.c, pa.jt, pb.c, pb.jt
			key, err := ja.Key(payload)
			require.NoError(t, err)

			for _, id := range []string{"j1", "j2", "j3"} {
				adm, err := ja.Admit(ctx, id, payload)
				require.NoError(t, err)
				require.Equal(t, KindAccepted, adm.Kind)
			}
			// a holds the state with the slot free; b takes it for j1.
			won, err := jb.Acquire(ctx, "j1", payload)
			require.NoError(t, err)
			require.Equal(t, KindAcquired, won.Kind)
			if held {
				// The wake-up of b's write reaches a while its write
				// fails.
				then = func() {
					value, rev, err := b.store.Get(ctx, service, key.KVKey)
					require.NoError(t, err)
					st, err := decodeState(value)
					require.NoError(t, err)
					e := a.keys.entry(key.KVKey)
					e.Observe(st, rev, e.FeedMark())
				}
			}
			// j2's Run, woken by a's state, tries on it; its write loses.
			wt := &waitTry{wake: true}
			got, err := acquireJobTry(ctx, ja, wt, "j2", payload)
			require.NoError(t, err)
			require.Equal(t, KindBlocked, got.Kind)
			assert.Equal(t, ReasonActiveLimit, got.Reason)
			assert.Equal(t, 1, got.Active, "the slot j1 holds")
			assert.Equal(t, 1, got.Limit)
			if held {
				assert.Equal(t, 2, got.Queued, "j2 and j3, queued behind j1's slot")
				assert.WithinDuration(t, won.Lease.LeaseExpiresAt, got.NextExpiry, time.Millisecond, "the expiry of j1's lease")
			} else {
				assert.Equal(t, 3, got.Queued, "the queue of the state the write was made on")
			}
		})
	}
}

// TestWakeReadsTrustBySendTime: over a link of 500 µs each way, a Run
// blocked behind a slot another process holds starts from the state its
// coordinator's admission of its job returned: the state arrived a round
// trip (1 ms) after the admission was sent, and the server confirmed the
// Run's wake-up subscription another round trip later, less than
// wakeTrustSent after the admission was sent. The Run waits for its
// wake-up without a read, and the holder's release wakes it. (Before, the
// state had arrived more than wakeTrustAge, 1 ms, before the
// confirmation, and the Run read the key.) A loaded machine may stretch
// the Run's start past the bound: of up to ten tries, one must not read.
// Not parallel: the other tests of the package would load the machine.
func TestWakeReadsTrustBySendTime(t *testing.T) {
	s := natstest.Run(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	policy := Policy{Key: benchPolicy.Key, MaxActive: 1, MaxQueuedPerKey: 8}
	a := newWakeProc(t, s, "wakesent", policy, wakeProcConfig{})
	line := startDelayLine(t, benchHostPort(t, s.ClientURL()), 500*time.Microsecond)
	_, js := natstest.ConnectURL(t, line.URL())
	c := newWakeProc(t, nil, "wakesent", policy, wakeProcConfig{js: js})

	var readless int
	for i := 0; i < 10 && readless == 0; i++ {
		release := a.holdSlot(t, ctx, fmt.Sprintf("hold-%d", i))
		job := fmt.Sprintf("job-%d", i)
		adm, err := c.jt.Admit(ctx, job, benchPayload(0))
		require.NoError(t, err)
		require.Equal(t, KindAccepted, adm.Kind)
		readsBefore := c.ops.reads.Load()
		done := make(chan error, 1)
		go func() {
			_, err := c.r.Run(ctx, job, benchPayload(0), func(context.Context, Lease) error { return nil })
			done <- err
		}()
		c.waitBlocked(t, ctx, job)
		reads := c.ops.reads.Load() - readsBefore
		release()
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-ctx.Done():
			t.Fatal(job + " never got the slot: its wake-up was lost")
		}
		assert.Zero(t, c.r.rechecks.Load(), "rechecks: the wake-up started the Run's last try")
		if reads == 0 {
			readless++
		}
	}
	assert.Positive(t, readless, "Runs that waited on their admission's state without a read")
}
