package jobkeys

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// sweepMarginScene sets up e (HeartbeatTTL 3s): crashed-acme's lease
// expires 3s from now by the real clock, with next-acme queued behind it;
// crashed-globex's lease 10s later (acquired on the sweeper's clock, moved
// on 10s); a corrupt key beside them. The sweeper's clock is then moved to
// 14s from now: acme's lease expired 11s ago, globex's 1s ago. It returns
// the corrupt key's KV key and value.
func sweepMarginScene(t *testing.T, e *sweepEnv) (string, []byte) {
	t.Helper()
	ctx := context.Background()
	e.crash(t, "acme", "crashed-acme")
	e.admit(t, "acme", "next-acme")
	e.advance(10 * time.Second)
	adm, err := e.later.Admit(ctx, "crashed-globex", tenantPayload("globex"))
	require.NoError(t, err)
	require.Equal(t, KindAccepted, adm.Kind)
	acq, err := e.later.Acquire(ctx, "crashed-globex", tenantPayload("globex"))
	require.NoError(t, err)
	require.Equal(t, KindAcquired, acq.Kind)
	corruptKey := e.svc + ".render." + "00000000000000000000000000000000000000000000000000000000000000cc"
	garbage := []byte(`{"version":1,"active":`)
	putKey(t, e.store, e.svc, corruptKey, garbage)
	e.advance(4 * time.Second)
	return corruptKey, garbage
}

// A sweep with a margin keeps the slots expired less than the margin ago
// and sweeps those expired more (FailStale: removed; Block: reported as
// expired); a corrupt key is left alone and reported; the key it wrote
// says it was updated at the sweep's time, not at the cutoff. Without the
// margin the same sweep takes the other slot too.
func TestSweepWithMargin(t *testing.T) {
	t.Parallel()
	store, _ := rtNATS(t)
	for _, stale := range []StalePolicy{FailStale, Block} {
		t.Run(string(stale), func(t *testing.T) {
			t.Parallel()
			e := newSweepEnv(t, store, stale)
			ctx := context.Background()
			corruptKey, garbage := sweepMarginScene(t, e)
			globexBefore, globexRev, err := store.Get(ctx, e.svc, e.kvKey(t, "globex"))
			require.NoError(t, err)

			rep, err := e.sweeper.Sweep(ctx, WithSweepMargin(10*time.Second))
			require.ErrorIs(t, err, ErrCorruptState, "the corrupt key is reported")
			var se *StateError
			require.ErrorAs(t, err, &se)
			assert.Equal(t, corruptKey, se.KVKey)
			assert.Equal(t, 3, rep.Keys)
			got, _, err := store.Get(ctx, e.svc, corruptKey)
			require.NoError(t, err)
			assert.Equal(t, string(garbage), string(got), "the corrupt key is not overwritten")
			globexAfter, globexRev2, err := store.Get(ctx, e.svc, e.kvKey(t, "globex"))
			require.NoError(t, err)
			assert.Equal(t, globexRev, globexRev2, "globex, expired 1s ago, is not written")
			assert.Equal(t, string(globexBefore), string(globexAfter))

			switch stale {
			case FailStale:
				assert.Equal(t, []string{"crashed-acme"}, sweptIDs(rep.Removed), "acme, expired 11s ago, goes")
				assert.Empty(t, rep.Expired)
				assert.Zero(t, rep.Deleted, "next-acme is still queued")
				value, _, err := store.Get(ctx, e.svc, e.kvKey(t, "acme"))
				require.NoError(t, err)
				st, err := ParseState(value)
				require.NoError(t, err)
				assert.Empty(t, st.Active)
				assert.Len(t, st.Queued, 1)
				assert.Equal(t, jsNow(e.sweeper.coord.cfg.Now()), st.UpdatedAt, "updated at the sweep's time")
			case Block:
				assert.Equal(t, []string{"crashed-acme"}, sweptIDs(rep.Expired), "only acme expired by the margin")
				assert.Empty(t, rep.Removed)
			}

			// The default: no margin.
			rep, err = e.sweeper.Sweep(ctx)
			require.ErrorIs(t, err, ErrCorruptState)
			switch stale {
			case FailStale:
				assert.Equal(t, []string{"crashed-globex"}, sweptIDs(rep.Removed), "globex goes without a margin")
				assert.Equal(t, 1, rep.Deleted, "globex had nothing queued")
			case Block:
				assert.Equal(t, []string{"crashed-acme", "crashed-globex"}, sweptIDs(rep.Expired))
			}
		})
	}
}

// A Sweeper sweeps with the options it was made with.
func TestSweeperWithMargin(t *testing.T) {
	t.Parallel()
	store, _ := rtNATS(t)
	e := newSweepEnv(t, store, FailStale)
	sweepMarginScene(t, e)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	reports := make(chan SweepReport, 1)
	sw, err := NewSweeper(e.sweeper, time.Hour, func(rep SweepReport, err error) {
		select {
		case reports <- rep:
		default:
		}
		cancel()
	}, WithSweepMargin(10*time.Second))
	require.NoError(t, err)
	require.ErrorIs(t, sw.Run(ctx), context.Canceled)
	rep := <-reports
	assert.Equal(t, []string{"crashed-acme"}, sweptIDs(rep.Removed), "globex, expired less than the margin ago, stays")
}

// A negative margin (or a nil option) is refused before anything is read
// or written.
func TestSweepMarginInvalid(t *testing.T) {
	t.Parallel()
	store, _ := rtNATS(t)
	e := newSweepEnv(t, store, FailStale)
	e.crash(t, "acme", "crashed-acme")
	e.advance(time.Hour)
	ctx := context.Background()
	before, rev, err := store.Get(ctx, e.svc, e.kvKey(t, "acme"))
	require.NoError(t, err)

	rep, err := e.sweeper.Sweep(ctx, WithSweepMargin(-time.Second))
	require.ErrorIs(t, err, ErrInvalidRequest)
	assert.Contains(t, err.Error(), "sweep margin -1s is negative")
	assert.Equal(t, SweepReport{}, rep)
	_, err = e.sweeper.Sweep(ctx, nil)
	require.ErrorIs(t, err, ErrInvalidRequest)
	_, err = NewSweeper(e.sweeper, time.Second, func(SweepReport, error) {}, WithSweepMargin(-time.Millisecond))
	require.ErrorIs(t, err, ErrInvalidRequest)
	assert.Contains(t, err.Error(), "sweep margin -1ms is negative")

	after, rev2, err := store.Get(ctx, e.svc, e.kvKey(t, "acme"))
	require.NoError(t, err)
	assert.Equal(t, rev, rev2, "nothing written")
	assert.Equal(t, string(before), string(after))
}

// A sweep with a margin tolerates the margin more of this host's clock
// ahead of the server's: a host 40s ahead sweeps leases of HeartbeatTTL 3s
// and HeartbeatInterval 1s (which alone tolerate 1s from the server) with
// a margin of a minute, and is refused without one, or with 30s.
func TestSweepMarginClockSkew(t *testing.T) {
	t.Parallel()
	store, _ := rtNATS(t)
	e := newSweepEnv(t, store, FailStale)
	e.crash(t, "acme", "crashed-acme")
	ctx := context.Background()
	ahead := rtJobType(t, cCoordinator(t, store, &Config{Now: func() time.Time { return time.Now().Add(40 * time.Second) }}),
		e.svc, e.workers.Policy())
	_, rev, err := store.Get(ctx, e.svc, e.kvKey(t, "acme"))
	require.NoError(t, err)

	_, err = ahead.Sweep(ctx)
	require.ErrorIs(t, err, ErrClockSkew, "no margin: 40s ahead is too far")
	_, err = ahead.Sweep(ctx, WithSweepMargin(30*time.Second))
	require.ErrorIs(t, err, ErrClockSkew, "30s: 40s ahead is still too far")
	assert.Contains(t, err.Error(), "a sweep with margin 30s")
	assert.Contains(t, err.Error(), "is refused from 31s off the server's clock")
	_, rev2, err := store.Get(ctx, e.svc, e.kvKey(t, "acme"))
	require.NoError(t, err)
	assert.Equal(t, rev, rev2, "nothing written")

	// A minute: acme's lease expired 37s ago by that clock, less than the
	// margin: it stays.
	rep, err := ahead.Sweep(ctx, WithSweepMargin(time.Minute))
	require.NoError(t, err)
	assert.Equal(t, 1, rep.Keys)
	assert.Empty(t, rep.Removed)
	_, rev3, err := store.Get(ctx, e.svc, e.kvKey(t, "acme"))
	require.NoError(t, err)
	assert.Equal(t, rev, rev3, "the live slot is untouched")
}

// A margin so large that the skew bound it adds overflows (the largest
// Duration) still tolerates a clock 40s ahead, and keeps every slot: it
// was refused with ErrClockSkew, its bound wrapped round to a negative one.
func TestSweepHugeMarginClockSkew(t *testing.T) {
	t.Parallel()
	store, _ := rtNATS(t)
	e := newSweepEnv(t, store, FailStale)
	e.crash(t, "acme", "crashed-acme")
	ctx := context.Background()
	ahead := rtJobType(t, cCoordinator(t, store, &Config{Now: func() time.Time { return time.Now().Add(40 * time.Second) }}),
		e.svc, e.workers.Policy())
	_, err := ahead.Sweep(ctx)
	require.ErrorIs(t, err, ErrClockSkew, "the clock is proven 40s ahead")
	_, rev, err := store.Get(ctx, e.svc, e.kvKey(t, "acme"))
	require.NoError(t, err)

	rep, err := ahead.Sweep(ctx, WithSweepMargin(time.Duration(math.MaxInt64)))
	require.NoError(t, err, "a margin of centuries tolerates 40s")
	assert.Equal(t, 1, rep.Keys)
	assert.Empty(t, rep.Removed)
	_, rev2, err := store.Get(ctx, e.svc, e.kvKey(t, "acme"))
	require.NoError(t, err)
	assert.Equal(t, rev, rev2, "nothing written")
}
