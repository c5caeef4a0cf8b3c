package jobs

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jobkeys/jobkeys"
	"github.com/jobkeys/jobkeys/internal/natstest"
)

// TestWaiterStoppedOnItsTurnPassesIt is the regression test for a job
// waiting for its key's slot that received its group's turn (a change of
// the key) in the moment this client paused it: it left without trying and
// without passing the turn on, so the other jobs waiting on the key slept
// until their recheck (a minute here) although the slot was free. The turn
// is now passed on.
//
// Pause sets the run's cause and then wakes it; the test sets the cause
// alone, so that the key's change is what wakes the paused job: it waits
// first, so it is first in line for the turn.
func TestWaiterStoppedOnItsTurnPassesIt(t *testing.T) {
	t.Parallel()
	s := natstest.Run(t)
	_, js := natstest.Connect(t, s)
	n := natsBucketSeq.Add(1)
	st, err := NewNATSStore(js, nil, WithBucket(fmt.Sprintf("JOBS_W%d", n)), WithCreateBucket(jetstream.MemoryStorage, 1))
	require.NoError(t, err)
	keys, err := jobkeys.NewNATSStore(js, jobkeys.WithCreateBuckets(jetstream.MemoryStorage, 1))
	require.NoError(t, err)
	coord, err := jobkeys.NewCoordinator(keys, nil)
	require.NoError(t, err)
	c, err := NewClient(st, coord, &ClientConfig{KeyStore: keys, Service: fmt.Sprintf("w%d", n),
		PollInterval: 50 * time.Millisecond, RecheckInterval: time.Minute, ReconcileInterval: -1, StopGrace: 2 * time.Second})
	require.NoError(t, err)
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		assert.NoError(t, c.Stop(ctx))
	}()
	// Claims last two minutes: no renewal wakes a waiter during the test.
	p := jobkeys.Policy{Key: []string{"/doc"}, MaxActive: 1, MaxQueuedPerKey: 5,
		HeartbeatInterval: 100 * time.Millisecond, HeartbeatTTL: 2 * time.Minute}
	gate := make(chan struct{})
	ran := make(chan string, 4)
	require.NoError(t, Register(c, Kind[json.RawMessage, string]{Type: "turn", Policy: p,
		Work: func(ctx context.Context, run *Run, in json.RawMessage) (string, error) {
			ran <- run.Job().ID
			if run.Job().ID == "a" {
				<-gate
			}
			return "", nil
		}}))
	ctx := context.Background()
	enqueue := func(id string) {
		_, err := c.Enqueue(ctx, EnqueueRequest{ID: id, ChannelID: "ch", Type: "turn", TargetKey: id,
			IdempotencyKey: id, Fingerprint: id, Input: json.RawMessage(`{"doc":"d"}`)})
		require.NoError(t, err)
	}
	waiting := func(want int) {
		require.Eventually(t, func() bool {
			c.mu.Lock()
			defer c.mu.Unlock()
			return c.waiting == want
		}, 30*time.Second, 5*time.Millisecond)
	}
	enqueue("a")
	require.NoError(t, c.Start(ctx))
	require.Equal(t, "a", <-ran)
	enqueue("b")
	waiting(1)
	time.Sleep(50 * time.Millisecond) // b is in its wait
	enqueue("c")
	waiting(2)
	c.mu.Lock()
	b := c.runs[jobRef{"ch", "b"}]
	c.mu.Unlock()
	require.NotNil(t, b)
	b.mu.Lock()
	b.cause = ErrPaused
	b.mu.Unlock()

	close(gate) // a's release is the change
	select {
	case id := <-ran:
		assert.Equal(t, "c", id)
	case <-time.After(15 * time.Second):
		t.Fatal("c slept through the free slot: the turn was lost")
	}
}
