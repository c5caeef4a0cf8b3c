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
