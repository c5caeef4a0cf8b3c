package jobkeys

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jobkeys/jobkeys/internal/natstest"
)

// TestWakeSubscribeUnconfirmedWaitsOutTheBound: a wake-up subscription
// whose confirmation fails early (the connection drops while the PING is
// on its way: nats.go ends the flush at once) returns no sooner than
// wakeSubscribeConfirm after it began, as one the server never answered
// does, so that the Run measuring its trust bound after it (see
// wakeTrustSent) reads the key instead of waiting on a state while the
// server may not have its subscription. (It returned at once, inside the
// bound, and the Run trusted a subscription the server never had.)
func TestWakeSubscribeUnconfirmedWaitsOutTheBound(t *testing.T) {
	t.Parallel()
	s := natstest.Run(t)
	// 100 ms each way: the PING's PONG cannot come within the bound; the
	// line is cut while it is on its way.
	line := startDelayLine(t, benchHostPort(t, s.ClientURL()), 100*time.Millisecond)
	_, js := natstest.ConnectURL(t, line.URL())
	ns, err := NewNATSStore(js, WithWakeUps(""))
	require.NoError(t, err)
	svc := jkService("wakeconfirm")
	key, err := DeriveKey(svc, "render", []byte(`{"t":"acme"}`), []string{"/t"})
	require.NoError(t, err)

	cut := time.AfterFunc(3*time.Millisecond, line.Close)
	defer cut.Stop()
	start := time.Now()
	stop, err := ns.subscribeWake(svc, key.KVKey, "job-1", func([]byte, uint64) {})
	took := time.Since(start)
	require.NoError(t, err)
	defer stop()
	assert.GreaterOrEqual(t, took, wakeSubscribeConfirm, "an unconfirmed subscription returned inside the trust bound")
}

// TestWakeSubscribeSecondWaiterWaitsForTheFirstsConfirmation: a second
// waiter of a job's subject in the same store shares the first's
// subscription; while the first is still being confirmed (here: never,
// over a slow line), the second does not return before the first's
// confirmation or its bound, so that it too measures its trust bound
// from a subscription the server has (or reads). (It returned at once,
// before the SUB had even been sent.)
func TestWakeSubscribeSecondWaiterWaitsForTheFirstsConfirmation(t *testing.T) {
	t.Parallel()
	s := natstest.Run(t)
	line := startDelayLine(t, benchHostPort(t, s.ClientURL()), 100*time.Millisecond)
	_, js := natstest.ConnectURL(t, line.URL())
	ns, err := NewNATSStore(js, WithWakeUps(""))
	require.NoError(t, err)
	svc := jkService("wakeconfirm2")
	key, err := DeriveKey(svc, "render", []byte(`{"t":"acme"}`), []string{"/t"})
	require.NoError(t, err)
	subject := ns.wake.Subject(ns.BucketName(svc), key.KVKey, "job-1")

	start := time.Now()
	first := make(chan func(), 1)
	go func() {
		stop, err := ns.subscribeWake(svc, key.KVKey, "job-1", func([]byte, uint64) {})
		assert.NoError(t, err)
		first <- stop
	}()
	require.Eventually(t, func() bool {
		return ns.wake.WaitsFor(subject) // its waiter is registered before its SUB is sent
	}, 10*time.Second, 50*time.Microsecond, "the first waiter subscribes")
	stop, err := ns.subscribeWake(svc, key.KVKey, "job-1", func([]byte, uint64) {})
	require.NoError(t, err)
	defer stop()
	assert.GreaterOrEqual(t, time.Since(start), wakeSubscribeConfirm, "the second waiter returned before the first's subscription was confirmed or its bound passed")
	if stop := <-first; stop != nil {
		stop()
	}
}
