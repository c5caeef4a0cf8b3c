package jobkeys

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jobkeys/jobkeys/internal/natstest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestWakeUpsInTurnAcrossProcesses: the slot of a key frees while job-b,
// queued first, waits for its wake-up in a process on a slow link (its
// wake-up and its acquisition take 20 ms each way); job-c, queued behind
// it in a third process, starts its Run then, on a state too old to wait
// from, and reads the key: it finds the slot free, which the reducer would
// let it take, but job-b was woken for it. job-c waits its turn: job-b
// runs first, then job-c, woken by job-b's release. (job-c used to take
// the slot, and job-b's woken acquisition lost.)
func TestWakeUpsInTurnAcrossProcesses(t *testing.T) {
	t.Parallel()
	s := natstest.Run(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	policy := Policy{Key: benchPolicy.Key, MaxActive: 1, MaxQueuedPerKey: 8}
	a := newWakeProc(t, s, "wakeinturn", policy, wakeProcConfig{})
	line := startDelayLine(t, benchHostPort(t, s.ClientURL()), 20*time.Millisecond)
	_, js := natstest.ConnectURL(t, line.URL())
	b := newWakeProc(t, nil, "wakeinturn", policy, wakeProcConfig{js: js})
	c := newWakeProc(t, s, "wakeinturn", policy, wakeProcConfig{})

	var mu sync.Mutex
	var order []string
	ran := func(id string) {
		mu.Lock()
		defer mu.Unlock()
		order = append(order, id)
	}
	releaseA := a.holdSlot(t, ctx, "job-a")
	heldB, doneB := b.runAsync(t, ctx, "job-b", released())
	b.waitBlocked(t, ctx, "job-b")
	go func() {
		<-heldB
		ran("job-b")
	}()
	payload := benchPayload(0)
	adm, err := c.jt.Admit(ctx, "job-c", payload)
	require.NoError(t, err)
	require.Equal(t, KindAccepted, adm.Kind)
	time.Sleep(2 * wakeTrustSent) // job-c's Run will not trust its admission's state
	releaseA()
	readsBefore := c.ops.reads.Load()
	doneC := make(chan error, 1)
	go func() {
		_, err := c.r.Run(ctx, "job-c", payload, func(context.Context, Lease) error {
			ran("job-c")
			return nil
		})
		doneC <- err
	}()
	require.NoError(t, recv(t, doneB, "job-b's Run"))
	require.NoError(t, recv(t, doneC, "job-c's Run"))
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, []string{"job-b", "job-c"}, order, "the order the jobs ran in")
	assert.Zero(t, c.r.rechecks.Load(), "job-c's rechecks: its wake-up started its last try")
	assert.Positive(t, c.ops.reads.Load()-readsBefore, "job-c's Run read the key (the state of its admission was too old to wait from)")
	assert.Positive(t, c.store.wakeCounters().Received, "job-c's wake-ups received")
}

// TestWakeUpsRunWakesPastJobsNobodyWaitsFor: the slot is free, and the
// Run's job is queued behind 10 jobs nobody waits for on a key nobody
// writes (the process that admitted them sent their wake-ups already,
// answered "no responders"). The Run, blocked in turn, sends the state's
// wake-up to the jobs ahead and itself: each job ahead answers "no
// responders" and the wake-up comes to the Run, in memory, which takes
// the slot — not at its turn's timer (wakeTurnMin), nor its recheck.
func TestWakeUpsRunWakesPastJobsNobodyWaitsFor(t *testing.T) {
	t.Parallel()
	s := natstest.Run(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	policy := Policy{Key: benchPolicy.Key, MaxActive: 1, MaxQueuedPerKey: 16}
	a := newWakeProc(t, s, "wakepast", policy, wakeProcConfig{})
	for i := range 10 {
		adm, err := a.jt.Admit(ctx, fmt.Sprintf("unclaimed-%d", i), benchPayload(0))
		require.NoError(t, err)
		require.Equal(t, KindAccepted, adm.Kind)
	}
	adm, err := a.jt.Admit(ctx, "job", benchPayload(0))
	require.NoError(t, err)
	require.Equal(t, KindAccepted, adm.Kind)
	// The admissions' own wake-ups are over: each target answered, and the
	// one retry after wakeRetry went out too.
	// (A chain leaves the hub's delivery state when it is done.)
	require.Eventually(t, func() bool { return a.store.wake.Size().Chains == 0 }, 10*time.Second, time.Millisecond)
	before := a.store.wakeCounters()
	ran := make(chan struct{})
	res, err := a.r.Run(ctx, "job", benchPayload(0), func(context.Context, Lease) error {
		close(ran)
		return nil
	})
	require.NoError(t, err)
	recv(t, ran, "the handler")
	assert.Equal(t, KindReleased, res.Release)
	after := a.store.wakeCounters()
	// The Run's own, handed over in memory: one per try in turn (its
	// first, and the one after it subscribed when that one read).
	local := after.Local - before.Local
	assert.GreaterOrEqual(t, local, uint64(1), "wake-ups handed over in memory: the Run's own")
	assert.LessOrEqual(t, local, uint64(2), "wake-ups handed over in memory: at most one per try in turn")
	assert.GreaterOrEqual(t, after.NoResponders-before.NoResponders, uint64(10), "the jobs ahead answered no responders")
	assert.Zero(t, a.r.rechecks.Load(), "rechecks")
}

// TestInTurnBlockStalePolicy: under StalePolicy Block an expired slot
// stays taken, so an in-turn try (waitTry.inTurn) of a job queued second
// counts it as taken, as the reducer does: on a key at capacity with the
// expired slot it reports ReasonStaleBlocked (not ReasonActiveLimit with
// a slot it says is free), and with MaxActive 2 and one expired slot it
// is blocked behind the job queued first, whose turn the one slot really
// free is, instead of taking it. (The try counted the expired slot free.)
func TestInTurnBlockStalePolicy(t *testing.T) {
	t.Parallel()
	f := newNATSWakeFixture(t)
	ctx := context.Background()
	w, _ := f.store(t, WithCreateBuckets(0, 1))
	r, _ := f.store(t)
	cw, err := NewCoordinator(w, nil)
	require.NoError(t, err)
	// The reader's clock runs an hour ahead: the writer's slots have
	// expired by it.
	cr, err := NewCoordinator(r, &Config{Now: func() time.Time { return time.Now().Add(time.Hour) }, IgnoreClockSkew: true})
	require.NoError(t, err)
	for _, tc := range []struct {
		name      string
		maxActive int
		want      Reason
	}{
		{"at capacity", 1, ReasonStaleBlocked},
		{"one slot free", 2, ReasonActiveLimit},
	} {
		p := Policy{Key: []string{"/t"}, MaxActive: tc.maxActive, MaxQueuedPerKey: 5, StalePolicy: Block}
		payload := []byte(`{"t":"` + tc.name + `"}`)
		jtw, err := cw.JobType(f.service, "render", p)
		require.NoError(t, err)
		jtr, err := cr.JobType(f.service, "render", p)
		require.NoError(t, err)
		for _, id := range []string{"job-s", "job-a", "job-b"} {
			adm, err := jtw.Admit(ctx, id, payload)
			require.NoError(t, err)
			require.Equal(t, KindAccepted, adm.Kind, tc.name)
		}
		acq, err := jtw.Acquire(ctx, "job-s", payload)
		require.NoError(t, err)
		require.Equal(t, KindAcquired, acq.Kind, tc.name)

		wt := &waitTry{inTurn: true}
		got, err := acquireJobTry(ctx, jtr, wt, "job-b", payload)
		require.NoError(t, err)
		assert.Equal(t, KindBlocked, got.Kind, tc.name)
		assert.Equal(t, tc.want, got.Reason, tc.name)
		assert.Equal(t, tc.maxActive, got.Limit, tc.name)
		if tc.want == ReasonActiveLimit {
			assert.Equal(t, 1, got.Active, tc.name+": the expired slot is taken under Block")
			assert.Equal(t, 1, wt.ahead, tc.name+": job-a's turn first")
		}
	}
}

// TestInTurnPastTheWakeUpWalkTakesTheSlot (final review): a try in turn of
// a job queued further back than any wake-up reaches (wakeTargetsMax past
// the free slots) is not held back: no wake-up of the jobs ahead could
// reach it, so it would only wait for its turn's timer (a second) with
// the slot free. It takes the slot, as the reducer allows; a job ahead
// that was woken loses the race and waits for the next wake-up.
func TestInTurnPastTheWakeUpWalkTakesTheSlot(t *testing.T) {
	t.Parallel()
	p := Policy{Key: []string{"/t"}, MaxActive: 1, MaxQueuedPerKey: 2 * wakeTargetsMax}
	f := newJobWakeFixtureWith(t, p, wakeProcConfig{}, wakeProcConfig{})
	jta, jtb := f.jta, f.jtb
	ctx := context.Background()
	n := 1 + wakeTargetsMax + 1 // the last is queued past the walk
	for i := range n {
		_, err := jta.Admit(ctx, fmt.Sprintf("job-%d", i), jobWakePayload)
		require.NoError(t, err)
	}

	// Within the walk: held back, the slot left to the jobs ahead.
	acq, err := acquireInTurn(ctx, jtb, fmt.Sprintf("job-%d", wakeTargetsMax), jobWakePayload)
	require.NoError(t, err)
	require.Equal(t, KindBlocked, acq.Kind, "queued within the walk's reach")

	// Past it: takes the slot.
	acq, err = acquireInTurn(ctx, jtb, fmt.Sprintf("job-%d", n-1), jobWakePayload)
	require.NoError(t, err)
	require.Equal(t, KindAcquired, acq.Kind, "queued past every wake-up's reach, with the slot free: %s %s", acq.Kind, acq.Reason)
}
