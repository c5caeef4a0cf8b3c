package jobkeys

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jobkeys/jobkeys/internal/natstest"

	"github.com/stretchr/testify/require"
)

// A Runner waiting through its Watcher on a NATS key, whose watch's
// consumer lags behind two writes of the key (55fbf73: the first, the
// release that frees the slot, is replaced in the bucket's stream by the
// second, an admission, before the consumer reads it): the waiter is woken
// by the later revision alone and takes the slot. No recheck covers for a
// missed wake-up (RecheckInterval an hour, the other lease an hour too).
func TestRunnerWokenThroughReplacedRevision(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := natstest.Run(t)
	service := rtService()
	policy := Policy{Key: benchPolicy.Key, MaxActive: 1, MaxQueuedPerKey: 8, HeartbeatInterval: time.Minute, HeartbeatTTL: time.Hour}
	payload := benchPayload(0)
	mine := newWorkerProcess(t, s, service, policy, nil, nil)
	other := newWorkerProcess(t, s, service, policy, nil, nil)
	blocked := make(chan struct{}, 1)
	r, err := NewRunner(mine.jt, &RunnerConfig{Watcher: mine.w, RecheckInterval: time.Hour,
		OnBlocked: func(string, Acquisition) { blocked <- struct{}{} }})
	require.NoError(t, err)
	kvKey := mustKey(t, mine.jt, payload).KVKey

	_, err = other.jt.Admit(ctx, "o1", payload)
	require.NoError(t, err)
	held, err := other.jt.Acquire(ctx, "o1", payload)
	require.NoError(t, err)
	require.Equal(t, KindAcquired, held.Kind)
	_, err = mine.jt.Admit(ctx, "m1", payload)
	require.NoError(t, err)

	done := make(chan struct{})
	var runErr error
	go func() {
		defer close(done)
		_, runErr = r.Run(ctx, "m1", payload, func(context.Context, Lease) error { return nil })
	}()
	awaitOneWaiter(t, mine.w, service, kvKey, "m1 never waited")
	// And its try after subscribing is over (it may read the key, which,
	// after the release below, would find the slot free: CI saw it once).
	select {
	case <-blocked:
	case <-time.After(rtWait):
		t.Fatal("m1 never started to wait")
	}

	// mine's Watcher's consumer is the only one on the bucket's stream.
	stream, err := mine.store.js.Stream(ctx, "KV_"+mine.store.BucketName(service))
	require.NoError(t, err)
	var consumers []string
	for name := range stream.ConsumerNames(ctx).Name() {
		consumers = append(consumers, name)
	}
	require.Len(t, consumers, 1, "consumers of the bucket's stream")
	_, err = stream.PauseConsumer(ctx, consumers[0], time.Now().Add(time.Hour))
	require.NoError(t, err)
	rel, err := other.jt.Release(ctx, held.Lease)
	require.NoError(t, err)
	require.Equal(t, KindReleased, rel.Kind)
	_, relRev, err := other.store.Get(ctx, service, kvKey)
	require.NoError(t, err)
	adm, err := other.jt.Admit(ctx, "o2", payload) // replaces the release in the stream
	require.NoError(t, err)
	require.Equal(t, KindAccepted, adm.Kind)
	_, err = stream.GetMsg(ctx, relRev)
	require.ErrorIs(t, err, jetstream.ErrMsgNotFound, "the release is still in the stream: the watch can deliver it, and the test tests nothing")
	select {
	case <-done:
		t.Fatalf("m1 ran while the watch's consumer was paused: %v", runErr)
	default:
	}
	_, err = stream.ResumeConsumer(ctx, consumers[0])
	require.NoError(t, err)
	_, err = other.store.Create(ctx, service, service+".other.wake", []byte("x")) // wakes the resumed consumer
	require.NoError(t, err)

	select {
	case <-done:
	case <-time.After(rtWait):
		t.Fatal("m1 was never woken by the admission that replaced the release")
	}
	require.NoError(t, runErr)
}
