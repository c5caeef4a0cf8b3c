package lane

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// testOp is an operation as a caller defines one: it embeds Op and
// carries its own result.
type testOp struct {
	Op
	name string
	res  string
}

func newOp(name string) *testOp { return &testOp{Op: Op{Ctx: context.Background()}, name: name} }

type testLane = Lane[*testOp]

// entered is what Enter returned to an operation that queued.
type entered struct {
	lead bool
	err  error
}

// queue makes ops wait at l, which the caller holds, in their order; it
// returns where each one's Enter result arrives.
func queue(t *testing.T, l *testLane, ops ...*testOp) []chan entered {
	t.Helper()
	chans := make([]chan entered, len(ops))
	base, _ := l.Queued()
	for i, op := range ops {
		ch := make(chan entered, 1)
		chans[i] = ch
		go func() {
			lead, err := l.Enter(op)
			ch <- entered{lead, err}
		}()
		require.Eventually(t, func() bool { n, _ := l.Queued(); return n == base+i+1 }, time.Minute, time.Millisecond,
			"operation %s queued", op.name)
	}
	return chans
}

func names(ops []*testOp) []string {
	out := make([]string, len(ops))
	for i, op := range ops {
		out[i] = op.name
	}
	return out
}

func TestLaneHandsOnInArrivalOrder(t *testing.T) {
	var l testLane
	lead, err := l.Enter(newOp("holder"))
	require.NoError(t, err)
	require.True(t, lead, "the first operation at a free lane holds it")
	ops := []*testOp{newOp("a"), newOp("b"), newOp("c")}
	chans := queue(t, &l, ops...)
	for i, ch := range chans {
		select {
		case r := <-ch:
			t.Fatalf("%s returned %+v before the lane was handed on", ops[i].name, r)
		default:
		}
		l.Leave()
		r := <-ch
		require.NoError(t, r.err)
		assert.True(t, r.lead, "%s is handed the lane, in arrival order", ops[i].name)
	}
	l.Leave()
	lead, err = l.Enter(newOp("next"))
	require.NoError(t, err)
	assert.True(t, lead, "the lane is free once the last holder leaves")
}

func TestLaneTakeBatchesUpToLimitAndSolo(t *testing.T) {
	var l testLane
	holder := newOp("holder")
	_, err := l.Enter(holder)
	require.NoError(t, err)
	solo := newOp("solo")
	solo.Solo = true
	ops := []*testOp{newOp("a"), newOp("b"), newOp("c"), solo, newOp("d")}
	chans := queue(t, &l, ops...)

	batch := l.Take([]*testOp{holder}, 3)
	assert.Equal(t, []string{"holder", "a", "b"}, names(batch), "Take stops at the limit")
	batch = l.Take(batch, 10)
	assert.Equal(t, []string{"holder", "a", "b", "c"}, names(batch), "Take stops at an operation that runs alone")
	n, _ := l.Queued()
	assert.Equal(t, 2, n, "solo and d still queued")

	for _, op := range batch[1:] {
		op.res = "done " + op.name
	}
	l.Deliver(batch, 3) // a and b ran; c is cut off
	for i := range 2 {
		r := <-chans[i]
		require.NoError(t, r.err)
		assert.False(t, r.lead, "%s was carried by the batch", ops[i].name)
		assert.Nil(t, ops[i].Dropped)
		assert.Equal(t, "done "+ops[i].name, ops[i].res)
	}
	again := l.Take(nil, 10)
	assert.Equal(t, []string{"c"}, names(again), "the cut-off operation is back at the head, before the solo one")
	l.PutBack(again)

	l.Leave() // to c
	r := <-chans[2]
	require.True(t, r.lead)
	l.Leave() // to solo
	r = <-chans[3]
	require.True(t, r.lead, "an operation that runs alone is handed the lane")
	l.Leave()
	require.True(t, (<-chans[4]).lead)
	l.Leave()
}

// TestLaneTakeStopsAtSoloAtHead: a holder's Take takes nobody queued
// behind an operation that runs alone, even the ones after it.
func TestLaneTakeStopsAtSoloAtHead(t *testing.T) {
	var l testLane
	_, err := l.Enter(newOp("holder"))
	require.NoError(t, err)
	solo := newOp("solo")
	solo.Solo = true
	chans := queue(t, &l, solo, newOp("a"))
	assert.Empty(t, l.Take(nil, 10))
	l.Leave()
	require.True(t, (<-chans[0]).lead)
	l.Leave()
	require.True(t, (<-chans[1]).lead)
	l.Leave()
}

func TestLaneCancelledWhileQueuedLeavesWithNothingApplied(t *testing.T) {
	var l testLane
	_, err := l.Enter(newOp("holder"))
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	gone := newOp("gone")
	gone.Ctx = ctx
	chans := queue(t, &l, gone, newOp("stays"))
	cancel()
	r := <-chans[0]
	assert.ErrorIs(t, r.err, context.Canceled)
	assert.False(t, r.lead)
	n, _ := l.Queued()
	assert.Equal(t, 1, n, "the cancelled operation left the queue")
	l.Leave()
	require.True(t, (<-chans[1]).lead, "the next operation is handed the lane")
	l.Leave()
}

func TestLaneTakeDropsCancelledOperations(t *testing.T) {
	var l testLane
	holder := newOp("holder")
	_, err := l.Enter(holder)
	require.NoError(t, err)
	// An operation whose context ends while the holder takes its batch:
	// the queued Enter may not have seen the end yet; Take drops it.
	ctx, cancel := context.WithCancel(context.Background())
	dropped := newOp("dropped")
	dropped.Ctx = ctx
	chans := queue(t, &l, dropped, newOp("kept"))
	l.mu.Lock() // hold the lane's lock so that Enter cannot leave first
	cancel()
	l.mu.Unlock()
	batch := l.Take([]*testOp{holder}, 10)
	r := <-chans[0]
	if r.err != nil {
		// Enter saw the end first and left the queue itself.
		assert.ErrorIs(t, r.err, context.Canceled)
	} else {
		assert.False(t, r.lead)
		assert.ErrorIs(t, dropped.Dropped, context.Canceled, "Take says why the operation got no result")
	}
	assert.Equal(t, []string{"holder", "kept"}, names(batch))
	l.Deliver(batch, 2)
	r = <-chans[1]
	assert.False(t, r.lead)
	assert.Nil(t, batch[1].Dropped)
	l.Leave()
}

func TestLaneHandedToCancelledOperationPassesOn(t *testing.T) {
	var l testLane
	_, err := l.Enter(newOp("holder"))
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	late := newOp("late")
	late.Ctx = ctx
	chans := queue(t, &l, late, newOp("next"))
	// Cancel with the lane's lock held, and hand the lane on before Enter
	// can see it: late is handed a lane it no longer wants.
	l.mu.Lock()
	cancel()
	l.mu.Unlock()
	l.Leave()
	r := <-chans[0]
	if r.err == nil {
		t.Fatalf("late was handed the lane after its context ended and kept it: %+v", r)
	}
	assert.ErrorIs(t, r.err, context.Canceled)
	require.True(t, (<-chans[1]).lead, "the lane went on to the next operation")
	l.Leave()
}

func TestLaneLingerCountsTheKindItWaitsFor(t *testing.T) {
	var l testLane
	_, err := l.Enter(newOp("holder"))
	require.NoError(t, err)
	plain := newOp("plain") // neither a lease's nor a trusting waiter's
	release := newOp("release")
	release.Lease = true
	chans := queue(t, &l, plain, release)

	met, arrived := l.Linger(context.Background(), true, 1, time.Hour)
	assert.True(t, met, "a release queued already counts")
	assert.True(t, arrived)
	met, arrived = l.Linger(context.Background(), false, 1, time.Millisecond)
	assert.False(t, met, "neither queued operation is a trusting waiter")
	assert.True(t, arrived, "operations are queued all the same")

	// A trusting waiter that queues while the holder lingers ends the
	// linger (the bound is an hour: only its arrival can).
	done := make(chan bool, 1)
	go func() {
		met, _ := l.Linger(context.Background(), false, 1, time.Hour)
		done <- met
	}()
	require.Eventually(t, func() bool { _, lingering := l.Queued(); return lingering }, time.Minute, time.Millisecond)
	waiter := newOp("waiter")
	waiter.Trust = true
	chans = append(chans, queue(t, &l, waiter)[0])
	select {
	case met := <-done:
		assert.True(t, met)
	case <-time.After(time.Minute):
		t.Fatal("the linger did not end when the waiter it waited for queued")
	}

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	met, _ = l.Linger(ctx, true, 5, time.Hour)
	assert.False(t, met, "a linger ends with its context")

	batch := l.Take(nil, 10)
	assert.Equal(t, []string{"plain", "release", "waiter"}, names(batch))
	l.Deliver(append([]*testOp{newOp("holder")}, batch...), len(batch)+1)
	for _, ch := range chans {
		require.NoError(t, (<-ch).err)
	}
	l.Leave()
}

func TestLaneLingerForReleaseBacksOffAfterVainLingers(t *testing.T) {
	var l testLane
	ctx := context.Background()
	_, err := l.Enter(newOp("holder"))
	require.NoError(t, err)
	assert.False(t, l.ReleasesDue())
	assert.False(t, l.LingerForRelease(ctx, time.Hour), "no slot taken: no release to wait for")

	bound := time.Millisecond
	var lingered []bool
	for range 8 {
		l.Returned(1, 0) // a batch took a slot: its release may come soon
		require.True(t, l.ReleasesDue())
		lingered = append(lingered, l.LingerForRelease(ctx, bound))
		l.Returned(0, 1) // its release came, later
	}
	// Vain lingers skip 1, then 2, then 4 batches.
	assert.Equal(t, []bool{true, false, true, false, false, true, false, false}, lingered)

	// A release that comes while the holder lingers resets the back-off.
	l2 := &testLane{}
	_, err = l2.Enter(newOp("holder"))
	require.NoError(t, err)
	l2.Returned(1, 0)
	assert.True(t, l2.LingerForRelease(ctx, bound)) // vain: the next batch skips
	l2.Returned(1, 0)
	assert.False(t, l2.LingerForRelease(ctx, bound), "skipped")
	release := newOp("release")
	release.Lease = true
	ch := queue(t, l2, release)[0]
	l2.Returned(1, 0)
	assert.True(t, l2.LingerForRelease(ctx, time.Hour), "lingered and met: a release is queued")
	l2.Returned(1, 0)
	l2.Deliver([]*testOp{newOp("holder"), release}, 1)
	l2.Leave()
	require.True(t, (<-ch).lead)
	assert.True(t, l2.LingerForRelease(ctx, bound), "after a met linger the next batch lingers again")
	l2.Leave()
}

func TestLaneOpResetKeepsNoSignal(t *testing.T) {
	var l testLane
	holder := newOp("holder")
	_, err := l.Enter(holder)
	require.NoError(t, err)
	op := newOp("a")
	ch := queue(t, &l, op)[0]
	l.Deliver(l.Take([]*testOp{holder}, 10), 2)
	require.NoError(t, (<-ch).err)
	op.Reset()
	assert.Nil(t, op.Ctx)
	select {
	case <-op.wake:
		t.Fatal("a reset operation carries a signal")
	default:
	}
	assert.NotNil(t, op.wake, "Reset keeps the channel for the next operation")
	l.Leave()
	op.Ctx = context.Background()
	lead, err := l.Enter(op)
	require.NoError(t, err)
	assert.True(t, lead)
	l.Leave()
	assert.False(t, errors.Is(op.Dropped, context.Canceled))
}
