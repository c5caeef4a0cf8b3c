package wake

import (
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/jobkeys/jobkeys/internal/natstest"
)

// rtWait bounds every wait of these tests: a guard against a hang, never
// a measured time.
const rtWait = 30 * time.Second

// testConfirm is the confirmation bound the key layer passes (its
// wakeTrustSent: just under the sum of the two resend delays).
const testConfirm = Retry + RetryLate - 100*time.Microsecond

// recv waits for a value on ch, failing the test after rtWait.
func recv[T any](t testing.TB, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(rtWait):
		t.Fatalf("timed out after %v waiting for %s", rtWait, what)
		panic("unreachable")
	}
}

// pending reports whether a value is ready on ch right now.
func pending[T any](ch <-chan T) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// wakeGot is one wake-up a test waiter received.
type wakeGot struct {
	value []byte
	rev   uint64
}

// waitLog is a test waiter: its fn records every wake-up, without
// blocking.
type waitLog struct{ ch chan wakeGot }

func newWaitLog() *waitLog { return &waitLog{ch: make(chan wakeGot, 64)} }

func (l *waitLog) fn(value []byte, rev uint64) {
	select {
	case l.ch <- wakeGot{value: slices.Clone(value), rev: rev}:
	default:
		panic("test waiter's log is full")
	}
}

// next returns the next wake-up the waiter received, failing the test when
// none comes within rtWait.
func (l *waitLog) next(t *testing.T, what string) wakeGot {
	t.Helper()
	return recv(t, l.ch, what)
}

// fixture is a server and a key of a bucket.
type fixture struct {
	srv    *server.Server
	bucket string
	kvKey  string
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	return &fixture{srv: natstest.Run(t), bucket: "JOBS_KEYS_wake", kvKey: "wake.render.0f6b2a"}
}

// testPrefix is the key layer's default prefix (jobkeys.WakePrefixDefault).
const testPrefix = "jobkeys.wake"

// newHub returns a hub with the default prefix on nc, as a store makes it.
func newHub(t testing.TB, nc *nats.Conn) *Hub {
	t.Helper()
	h, err := New(nc, Config{Prefix: testPrefix, Reserved: []string{nats.InboxPrefix, "$JS.API."}, Confirm: testConfirm})
	require.NoError(t, err)
	return h
}

// hub returns a hub on a connection of its own.
func (f *fixture) hub(t *testing.T) (*Hub, *nats.Conn) {
	t.Helper()
	nc, _ := natstest.Connect(t, f.srv)
	return newHub(t, nc), nc
}

// wait subscribes a test waiter for job on hub h and makes sure the
// server has the subscription.
func (f *fixture) wait(t *testing.T, h *Hub, nc *nats.Conn, job string) (*waitLog, func()) {
	t.Helper()
	l := newWaitLog()
	stop, err := h.Subscribe(h.Subject(f.bucket, f.kvKey, job), l.fn)
	require.NoError(t, err)
	t.Cleanup(stop)
	require.NoError(t, nc.Flush())
	return l, stop
}

// firstAfterMarker publishes a marker wake-up (revision rev) from hub pub
// to job's waiter alone, and returns the first wake-up l gets. Wake-ups
// from one connection reach a subscriber in order, so when it is the
// marker, the waiter got nothing from pub before.
func (f *fixture) firstAfterMarker(t *testing.T, pub *Hub, l *waitLog, job string, rev uint64) wakeGot {
	t.Helper()
	pub.Publish(f.bucket, f.kvKey, []byte("marker"), rev, []string{job}, 1, false)
	return l.next(t, "the marker wake-up of "+job)
}

// stopWaiterOnly marks the waiters of job's wake-up subject on hub h
// stopped without unsubscribing: the state of a Run whose wait ends (its
// context, or a try its recheck started) while its UNSUB is not at the
// server yet. A wake-up the server delivers to the subscription then is
// handed to nobody.
func (f *fixture) stopWaiterOnly(t *testing.T, h *Hub, job string) {
	t.Helper()
	h.mu.Lock()
	e := h.subs[h.Subject(f.bucket, f.kvKey, job)]
	require.NotNil(t, e, "job %s waits on the hub", job)
	ws := append([]*waiter(nil), e.waiters...)
	h.mu.Unlock()
	for _, w := range ws {
		w.mu.Lock()
		w.stopped = true
		w.mu.Unlock()
	}
}
