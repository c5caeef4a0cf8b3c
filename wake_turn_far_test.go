package jobkeys

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestInTurnPastTheWakeUpWalkTakesTheSlot (final review): a try in turn of
// a job queued further back than any wake-up reaches (wakeTargetsMax past
// the free slots) is not held back: no wake-up of the jobs ahead could
// reach it, so it would only wait for its turn's timer (a second) with
// the slot free. It takes the slot, as the reducer allows; a job ahead
// that was woken loses the race and waits for the next wake-up.
func TestInTurnPastTheWakeUpWalkTakesTheSlot(t *testing.T) {
	t.Parallel()
	f := newNATSWakeFixture(t)
	a, _ := f.store(t, WithCreateBuckets(0, 1))
	b, _ := f.store(t)
	p := Policy{Key: []string{"/t"}, MaxActive: 1, MaxQueuedPerKey: 2 * wakeTargetsMax}
	ca, err := NewCoordinator(a, nil)
	require.NoError(t, err)
	jta, err := ca.JobType(f.service, "render", p)
	require.NoError(t, err)
	cb, err := NewCoordinator(b, nil)
	require.NoError(t, err)
	jtb, err := cb.JobType(f.service, "render", p)
	require.NoError(t, err)
	ctx := context.Background()
	n := 1 + wakeTargetsMax + 1 // the last is queued past the walk
	for i := range n {
		_, err := jta.Admit(ctx, fmt.Sprintf("job-%d", i), jobWakePayload)
		require.NoError(t, err)
	}

	// Within the walk: held back, the slot left to the jobs ahead.
	acq, err := jtb.Acquire(ctx, fmt.Sprintf("job-%d", wakeTargetsMax), jobWakePayload, queueTurn())
	require.NoError(t, err)
	require.Equal(t, KindBlocked, acq.Kind, "queued within the walk's reach")

	// Past it: takes the slot.
	acq, err = jtb.Acquire(ctx, fmt.Sprintf("job-%d", n-1), jobWakePayload, queueTurn())
	require.NoError(t, err)
	require.Equal(t, KindAcquired, acq.Kind, "queued past every wake-up's reach, with the slot free: %s %s", acq.Kind, acq.Reason)
}
