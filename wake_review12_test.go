package jobkeys

import (
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestWakeUpInFlightAtUnsubscribeMovesOn: a wake-up the server delivers
// to a job's subscription after its last waiter stopped, with the UNSUB
// on its way to the server, moves on to the next job, which waits. The
// stop unsubscribed at once, so nats.go dropped the message on arrival
// (its subscription gone from the client): nobody answered "no
// responders", and the wake-up stayed with the stopped job until its
// delivery state expired; the next job waited for its recheck. The
// publisher here is a second store on the waiters' connection, so its
// PUB reaches the server before the UNSUB, deterministically.
func TestWakeUpInFlightAtUnsubscribeMovesOn(t *testing.T) {
	t.Parallel()
	f := newNATSWakeFixture(t)
	b, ncB := f.store(t)
	js, err := jetstream.New(ncB)
	require.NoError(t, err)
	pub, err := NewNATSStore(js, WithWakeUps(""))
	require.NoError(t, err)
	_, stop1 := f.wait(t, b, ncB, "j1")
	l2, _ := f.wait(t, b, ncB, "j2")
	pub.publishWakes(f.service, f.kvKey, []byte("s"), 1, []string{"j1", "j2"}, 1)
	stop1() // j1's Run stops: its UNSUB follows the wake-up's PUB
	got := l2.next(t, "j2's wake-up, past j1, whose waiter stopped")
	assert.Equal(t, uint64(1), got.rev)
	assert.Equal(t, []byte("s"), got.value)
}
