package wake

import (
	"crypto/sha256"
	"encoding/base64"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jobkeys/jobkeys/internal/natstest"
)

// TestWakeUpsReachAnotherStore: a waiter on one hub gets the wake-up
// another hub (another connection) sends, with the exact revision, and
// without its value: a wake-up from the network is a hint, which anyone
// allowed to publish on its subject may have sent (TestWakeUpsSubject
// checks the bytes on the wire).
func TestWakeUpsReachAnotherStore(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	a, _ := f.hub(t)
	b, ncB := f.hub(t)
	l, _ := f.wait(t, b, ncB, "job-1")

	value := []byte("{\"version\":1}\x00\xff\n")
	a.Publish(f.bucket, f.kvKey, value, 1<<40+7, []string{"job-1"}, 1, false)
	got := l.next(t, "job-1's wake-up")
	assert.Equal(t, uint64(1<<40+7), got.rev)
	assert.Nil(t, got.value, "the value of a wake-up from the network")
	assert.Equal(t, uint64(1), a.Counters().Published)
	assert.Zero(t, a.Counters().Local)
	require.Eventually(t, func() bool { return b.Counters().Received == 1 }, rtWait, time.Millisecond)
}

// TestWakeUpsSubject: the wire subject is "<prefix>.<bucket>.<kvKey>.<token>"
// with the token base64url(sha256(jobID)[:16]); a subscriber of that
// subject on a plain connection gets revision and value.
func TestWakeUpsSubject(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	a, _ := f.hub(t)
	nc, _ := natstest.Connect(t, f.srv)
	sum := sha256.Sum256([]byte("job-1"))
	subject := "jobkeys.wake." + f.bucket + "." + f.kvKey + "." + base64.RawURLEncoding.EncodeToString(sum[:16])
	sub, err := nc.SubscribeSync(subject)
	require.NoError(t, err)
	require.NoError(t, nc.Flush())

	a.Publish(f.bucket, f.kvKey, []byte("v"), 258, []string{"job-1"}, 1, false)
	m, err := sub.NextMsg(rtWait)
	require.NoError(t, err)
	assert.Equal(t, []byte{0, 0, 0, 0, 0, 0, 1, 2, 'v'}, m.Data)
	assert.True(t, strings.HasPrefix(m.Reply, nats.InboxPrefix), "reply %q under the inbox prefix", m.Reply)
}

// TestWakeUpsMoveOnAfterNoResponders: with free 1, a target without a
// waiter answers "no responders" and the wake-up goes to the next; a
// target with a waiter takes it and the next gets nothing.
func TestWakeUpsMoveOnAfterNoResponders(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	a, _ := f.hub(t)
	b, ncB := f.hub(t)
	lb, _ := f.wait(t, b, ncB, "b")

	a.Publish(f.bucket, f.kvKey, []byte("s1"), 10, []string{"a", "b"}, 1, false)
	got := lb.next(t, "b's wake-up after a's no responders")
	assert.Equal(t, uint64(10), got.rev)
	assert.Nil(t, got.value, "the value of a wake-up from the network")
	c := a.Counters()
	assert.Equal(t, uint64(1), c.NoResponders)
	assert.Equal(t, uint64(2), c.Published)

	// Now a waits too, on a third hub: it alone is woken.
	w, ncW := f.hub(t)
	la, _ := f.wait(t, w, ncW, "a")
	a.Publish(f.bucket, f.kvKey, []byte("s2"), 20, []string{"a", "b"}, 1, false)
	got = la.next(t, "a's wake-up")
	assert.Equal(t, uint64(20), got.rev)
	assert.Equal(t, uint64(30), f.firstAfterMarker(t, a, lb, "b", 30).rev, "b got a wake-up meant for a")
	assert.Equal(t, uint64(1), a.Counters().NoResponders)
}

// TestWakeUpsFree: a wake-up with free 2 wakes two waiters, with free 1
// exactly one, the first in queue order.
func TestWakeUpsFree(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	a, _ := f.hub(t)
	b, ncB := f.hub(t)
	c, ncC := f.hub(t)
	l1, _ := f.wait(t, b, ncB, "j1")
	l2, _ := f.wait(t, c, ncC, "j2")

	a.Publish(f.bucket, f.kvKey, []byte("two"), 5, []string{"j1", "j2"}, 2, false)
	assert.Equal(t, uint64(5), l1.next(t, "j1's wake-up").rev)
	assert.Equal(t, uint64(5), l2.next(t, "j2's wake-up").rev)

	a.Publish(f.bucket, f.kvKey, []byte("one"), 6, []string{"j1", "j2"}, 1, false)
	assert.Equal(t, uint64(6), l1.next(t, "j1's wake-up").rev)
	assert.Equal(t, uint64(7), f.firstAfterMarker(t, a, l2, "j2", 7).rev, "free 1 woke j2 too")
	assert.Zero(t, a.Counters().NoResponders)
}

// TestWakeUpsLocal: a waiter of the same hub is woken in memory: before
// publishWakes returns, and with no message sent.
func TestWakeUpsLocal(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	a, ncA := f.hub(t)
	l, _ := f.wait(t, a, ncA, "j1")
	before := a.Counters()

	a.Publish(f.bucket, f.kvKey, []byte("here"), 9, []string{"j1"}, 1, false)
	require.Len(t, l.ch, 1, "the local waiter was woken before publishWakes returned")
	got := l.next(t, "the local wake-up")
	assert.Equal(t, wakeGot{value: []byte("here"), rev: 9}, got)
	after := a.Counters()
	assert.Equal(t, before.Published, after.Published, "a local wake-up sends no message")
	assert.Equal(t, before.Local+1, after.Local)
	assert.Zero(t, after.Received)

	// Local first, then remote: free 2 over [local j1, remote j2].
	b, ncB := f.hub(t)
	l2, _ := f.wait(t, b, ncB, "j2")
	a.Publish(f.bucket, f.kvKey, []byte("both"), 10, []string{"j1", "j2"}, 2, false)
	require.Len(t, l.ch, 1, "the local waiter was woken before publishWakes returned")
	assert.Equal(t, uint64(10), l.next(t, "the local wake-up").rev)
	assert.Equal(t, uint64(10), l2.next(t, "j2's wake-up").rev)
	assert.Equal(t, after.Published+1, a.Counters().Published)
}

// TestWakeUpsSharedJob: two waiters of one job on one hub share one
// subscription; both are woken, and the subscription stays until the last
// stops.
func TestWakeUpsSharedJob(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	a, _ := f.hub(t)
	b, ncB := f.hub(t)
	l1, stop1 := f.wait(t, b, ncB, "j1")
	l2, stop2 := f.wait(t, b, ncB, "j1")

	a.Publish(f.bucket, f.kvKey, []byte("x"), 1, []string{"j1"}, 1, false)
	assert.Equal(t, uint64(1), l1.next(t, "the first waiter's wake-up").rev)
	assert.Equal(t, uint64(1), l2.next(t, "the second waiter's wake-up").rev)

	stop1()
	require.NoError(t, ncB.Flush())
	a.Publish(f.bucket, f.kvKey, []byte("x"), 2, []string{"j1"}, 1, false)
	assert.Equal(t, uint64(2), l2.next(t, "the remaining waiter's wake-up").rev)
	assert.False(t, pending(l1.ch))

	stop2()
	require.NoError(t, ncB.Flush())
	a.Publish(f.bucket, f.kvKey, []byte("x"), 3, []string{"j1"}, 1, false)
	require.Eventually(t, func() bool { return a.Counters().NoResponders >= 1 }, rtWait, time.Millisecond,
		"the last stop unsubscribed: no responders")
}

// TestWakeUpsRetry: a wake-up nobody was waiting for (every target
// answered no responders) is sent once more after the retry delay, and
// reaches a waiter that subscribed meanwhile.
func TestWakeUpsRetry(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	a, ncA := f.hub(t)
	a.retry = 2 * time.Second // long enough for the waiter to subscribe on a loaded machine
	b, ncB := f.hub(t)

	a.Publish(f.bucket, f.kvKey, []byte("late"), 3, []string{"j1"}, 1, false)
	require.NoError(t, ncA.Flush()) // the server took the publish: nobody waits
	l, _ := f.wait(t, b, ncB, "j1")
	got := l.next(t, "the retried wake-up")
	assert.Equal(t, wakeGot{rev: 3}, got, "the revision, not the value, of a wake-up from the network")
	c := a.Counters()
	assert.Equal(t, uint64(1), c.NoResponders)
	assert.Equal(t, uint64(1), c.Retried)
	assert.Equal(t, uint64(2), c.Published)
}

// TestWakeUpsResentTwiceThenNoMore: a wake-up whose resends find nobody either is not
// sent again: it is resent Resends (2) times, after Retry and
// RetryLate, and then no more.
func TestWakeUpsResentTwiceThenNoMore(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	a, _ := f.hub(t)
	a.Publish(f.bucket, f.kvKey, []byte("none"), 3, []string{"j1", "j2"}, 1, false)
	require.Eventually(t, func() bool { return a.Counters().NoResponders == 6 }, rtWait, time.Millisecond)
	// A second key's chain, published after the first was over, ends the
	// same way; by then the first could have been sent a fourth time.
	a.Publish(f.bucket, f.kvKey+"x", []byte("none"), 4, []string{"j1"}, 1, false)
	require.Eventually(t, func() bool { return a.Counters().NoResponders == 9 }, rtWait, time.Millisecond)
	c := a.Counters()
	assert.Equal(t, uint64(4), c.Retried)
	assert.Equal(t, uint64(9), c.Published)
}

// TestWakeUpsStaleChain: a newer state of the key published before an
// older wake-up's retry stops that retry.
func TestWakeUpsStaleChain(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	a, _ := f.hub(t)
	a.retry = 2 * time.Second // long enough for the newer state to go out first on a loaded machine
	b, ncB := f.hub(t)

	a.Publish(f.bucket, f.kvKey, []byte("old"), 1, []string{"j1"}, 1, false)
	require.Eventually(t, func() bool { return a.Counters().NoResponders == 1 }, rtWait, time.Millisecond)
	l, _ := f.wait(t, b, ncB, "j1") // the old wake-up's retry would reach it
	a.Publish(f.bucket, f.kvKey, []byte("new"), 2, []string{"j2"}, 1, false)
	require.Eventually(t, func() bool { return a.retrySkipped.Load() == 1 }, rtWait, time.Millisecond,
		"the old wake-up's retry ran")
	assert.Equal(t, uint64(9), f.firstAfterMarker(t, a, l, "j1", 9).rev, "the stale wake-up was retried")

	// An older state than one already published is not sent at all.
	published := a.Counters().Published
	a.Publish(f.bucket, f.kvKey, []byte("older"), 5, []string{"j1"}, 1, false)
	assert.Equal(t, published, a.Counters().Published)
}

// TestWakeUpsStaleNoResponders: a "no responders" answer for a wake-up
// that a newer one replaced moves nothing on.
func TestWakeUpsStaleNoResponders(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	a, ncA := f.hub(t)
	b, ncB := f.hub(t)
	l, _ := f.wait(t, b, ncB, "j2")
	reply, ok := a.replySubjects()
	require.True(t, ok)
	// The older wake-up's answer for j1 waits for the hub's lock, which
	// the test holds until the newer wake-up went out.
	a.mu.Lock()
	c, acts := a.startLocked(f.bucket, f.kvKey, []byte("old"), 1, []string{"j1", "j2"}, 1, time.Now(), false)
	require.NotNil(t, c)
	a.act(c, reply, &acts)
	require.NoError(t, ncA.Flush()) // the server answered: no responders
	c2, acts2 := a.startLocked(f.bucket, f.kvKey, []byte("new"), 2, []string{"j3"}, 1, time.Now(), false)
	require.NotNil(t, c2)
	a.act(c2, reply, &acts2)
	a.mu.Unlock()
	require.Eventually(t, func() bool { return a.Counters().NoResponders >= 2 }, rtWait, time.Millisecond)
	assert.Equal(t, uint64(7), f.firstAfterMarker(t, a, l, "j2", 7).rev, "the stale wake-up moved on to j2")
}

// TestWakeUpsStop: after stop the waiter's fn is never called again, and
// the subscription is gone from the server (no responders).
func TestWakeUpsStop(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	a, ncA := f.hub(t)
	b, ncB := f.hub(t)
	l, stop := f.wait(t, b, ncB, "j1")
	a.Publish(f.bucket, f.kvKey, []byte("x"), 1, []string{"j1"}, 1, false)
	assert.Equal(t, uint64(1), l.next(t, "the wake-up before stop").rev)

	stop()
	stop() // a second stop is harmless
	require.NoError(t, ncB.Flush())
	a.Publish(f.bucket, f.kvKey, []byte("x"), 2, []string{"j1"}, 1, false)
	require.Eventually(t, func() bool {
		c := a.Counters()
		return c.NoResponders == 1+Resends && c.Retried == Resends
	}, rtWait, time.Millisecond, "no responders after stop, and after the resends")

	// A local waiter that stopped is not called either.
	ll, lstop := f.wait(t, a, ncA, "j3")
	lstop()
	a.Publish(f.bucket, f.kvKey, []byte("x"), 3, []string{"j3"}, 1, false)
	assert.Zero(t, a.Counters().Local)
	require.Eventually(t, func() bool { return a.Counters().NoResponders == 2*(1+Resends) }, rtWait, time.Millisecond)
	assert.False(t, pending(l.ch), "a stopped waiter was called")
	assert.False(t, pending(ll.ch), "a stopped local waiter was called")
	assert.Equal(t, uint64(1), b.Counters().Received)
}

// TestWakeUpsMalformed: a message too short to be a wake-up is ignored
// and counted.
func TestWakeUpsMalformed(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	a, ncA := f.hub(t)
	b, ncB := f.hub(t)
	l, _ := f.wait(t, b, ncB, "j1")
	require.NoError(t, ncA.Publish(b.Subject(f.bucket, f.kvKey, "j1"), []byte{1, 2, 3}))
	assert.Equal(t, uint64(4), f.firstAfterMarker(t, a, l, "j1", 4).rev)
	assert.Equal(t, uint64(1), b.Counters().Malformed)
	require.Eventually(t, func() bool { return b.Counters().Received == 1 }, rtWait, time.Millisecond)
}

// TestWakeUpsStopRace: a waiter that stops after a wake-up chose it but
// before the wake-up reached it is not called.
func TestWakeUpsStopRace(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	a, ncA := f.hub(t)
	l, stop := f.wait(t, a, ncA, "j1")
	reply, ok := a.replySubjects()
	require.True(t, ok)
	a.mu.Lock()
	c, acts := a.startLocked(f.bucket, f.kvKey, []byte("x"), 1, []string{"j1"}, 1, time.Now(), false)
	a.mu.Unlock()
	require.NotNil(t, c)
	require.Len(t, acts.local, 1, "the walk chose the local waiter")
	stop()
	a.act(c, reply, &acts)
	assert.Empty(t, l.ch, "a stopped waiter was called")
	assert.Zero(t, a.Counters().Local)
}

// TestWakeUpsConnectionClosed: closing the connection ends the hub's
// dispatcher even while waiters are subscribed; later wake-ups are dropped
// and counted, later subscriptions fail.
func TestWakeUpsConnectionClosed(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	b, ncB := f.hub(t)
	_, stop := f.wait(t, b, ncB, "j1")
	_, _ = f.wait(t, b, ncB, "j2")
	ncB.Close()
	require.Eventually(t, func() bool {
		b.mu.Lock()
		defer b.mu.Unlock()
		return b.disp == nil && b.live == 0 && len(b.subs) == 0
	}, rtWait, time.Millisecond, "the dispatcher ended with the connection")
	stop() // harmless after the close

	b.Publish(f.bucket, f.kvKey, []byte("x"), 1, []string{"j1"}, 1, false)
	assert.Equal(t, uint64(1), b.Counters().Dropped)
	_, err := b.Subscribe(b.Subject(f.bucket, f.kvKey, "j3"), func([]byte, uint64) {})
	require.ErrorIs(t, err, nats.ErrConnectionClosed)
}

// TestWakeUpsBounded: the delivery state kept for wake-ups stays bounded
// however many keys are woken, and expires.
func TestWakeUpsBounded(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	a, _ := f.hub(t)
	h := a
	kept := func() (order, latest, chains int) {
		h.mu.Lock()
		defer h.mu.Unlock()
		return len(h.order), len(h.latest), len(h.chains)
	}
	for i := range chainsMax + 500 {
		a.Publish(f.bucket, f.kvKey+strconv.Itoa(i), []byte("x"), 1, []string{"j"}, 1, false)
		order, latest, chains := kept()
		require.LessOrEqual(t, order, chainsMax)
		require.LessOrEqual(t, latest, chainsMax)
		require.LessOrEqual(t, chains, chainsMax)
	}
	require.Eventually(t, func() bool { _, _, chains := kept(); return chains == 0 }, rtWait, time.Millisecond,
		"every wake-up ended")

	// Targets beyond free+WalkExtra are never tried.
	before := a.Counters()
	many := make([]string, 1000)
	for i := range many {
		many[i] = "nobody-" + strconv.Itoa(i)
	}
	a.Publish(f.bucket, f.kvKey, []byte("x"), 1, many, 1, false)
	require.Eventually(t, func() bool { _, _, chains := kept(); return chains == 0 }, rtWait, time.Millisecond)
	after := a.Counters()
	assert.Equal(t, before.Retried+Resends, after.Retried)
	assert.Equal(t, before.Published+(1+Resends)*(1+WalkExtra), after.Published)
	assert.Equal(t, before.NoResponders+(1+Resends)*(1+WalkExtra), after.NoResponders)

	// Large states: the bytes kept are bounded too.
	big := make([]byte, 600<<10)
	for i := range 20 {
		a.Publish(f.bucket, f.kvKey+"big"+strconv.Itoa(i), big, 1, []string{"j"}, 1, false)
		h.mu.Lock()
		keptBytes := h.keptBytes
		h.mu.Unlock()
		require.LessOrEqual(t, keptBytes, keptBytesMax+len(big)+revLen)
	}
	require.Eventually(t, func() bool { _, _, chains := kept(); return chains == 0 }, rtWait, time.Millisecond)

	h.mu.Lock()
	defer h.mu.Unlock()
	assert.Zero(t, h.keptBytes)
	h.expireLocked(time.Now().Add(2 * ChainTTL))
	assert.Empty(t, h.order)
	assert.Empty(t, h.latest)
}

// TestWakeUpsSameConnection: a second hub on the same connection is
// another process as far as wake-ups go: it is woken by a message, which
// the server echoes to the connection.
func TestWakeUpsSameConnection(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	nc, _ := natstest.Connect(t, f.srv)
	a := newHub(t, nc)
	b := newHub(t, nc)
	l, _ := f.wait(t, b, nc, "j1")
	a.Publish(f.bucket, f.kvKey, []byte("x"), 1, []string{"j1"}, 1, false)
	assert.Equal(t, wakeGot{rev: 1}, l.next(t, "j1's wake-up"), "the revision, not the value, of a wake-up from the network")
	assert.Equal(t, uint64(1), a.Counters().Published)
	assert.Zero(t, a.Counters().Local)
}

// BenchmarkWakeUps measures one wake-up of a one-slot state: to a waiter
// of the same hub (in memory), and to a waiter on another connection,
// received before the next is sent; beside it, a bare core NATS publish
// and receipt over the same connections as the baseline.
func BenchmarkWakeUps(b *testing.B) {
	srv := natstest.Run(b)
	const bucket, kvKey = "JOBS_KEYS_wakebench", "wakebench.render.9c1e0f0c0c4dd5ab9c2a67a9d3c4b5e9f2f0a1b2c3d4e5f60718293a4b5c6d7e"
	value := []byte(`{"version":1,"service":"wakebench","jobType":"render","key":"acme","keyHash":"9c1e0f0c0c4dd5ab9c2a67a9d3c4b5e9f2f0a1b2c3d4e5f60718293a4b5c6d7e` +
		`","maxActive":1,"maxQueuedPerKey":16,"active":[],"queued":[{"jobId":"j1","createdAt":"2026-12-01T00:00:00.000Z","requestId":"r"}],"staleTakeoverCount":0,"updatedAt":"2026-12-01T00:00:00.000Z"}`)
	open := func() (*Hub, *nats.Conn) {
		nc, _ := natstest.Connect(b, srv)
		return newHub(b, nc), nc
	}
	got := make(chan uint64, 1)
	fn := func(_ []byte, rev uint64) { got <- rev }

	b.Run("local", func(b *testing.B) {
		a, _ := open()
		stop, err := a.Subscribe(a.Subject(bucket, kvKey, "j1"), fn)
		require.NoError(b, err)
		defer stop()
		b.ReportAllocs()
		for i := range b.N {
			a.Publish(bucket, kvKey, value, uint64(i+1), []string{"j1"}, 1, false)
			<-got
		}
	})
	b.Run("remote", func(b *testing.B) {
		a, _ := open()
		w, ncW := open()
		stop, err := w.Subscribe(w.Subject(bucket, kvKey, "j1"), fn)
		require.NoError(b, err)
		defer stop()
		require.NoError(b, ncW.Flush())
		b.ReportAllocs()
		for i := range b.N {
			a.Publish(bucket, kvKey, value, uint64(i+1), []string{"j1"}, 1, false)
			<-got
		}
	})
	b.Run("core-nats-baseline", func(b *testing.B) {
		_, ncA := open()
		_, ncW := open()
		subject := "bench.wakebench"
		sub, err := ncW.Subscribe(subject, func(m *nats.Msg) { got <- uint64(len(m.Data)) })
		require.NoError(b, err)
		defer func() { _ = sub.Unsubscribe() }()
		require.NoError(b, ncW.Flush())
		b.ReportAllocs()
		for range b.N {
			require.NoError(b, ncA.Publish(subject, value))
			<-got
		}
	})
}

// TestNewRefusesBadConfig: New refuses a nil connection, a bad prefix, a
// confirmation bound that is not positive, and a prefix that could share
// a subject with a reserved prefix; each error names what was wrong.
func TestNewRefusesBadConfig(t *testing.T) {
	t.Parallel()
	nc, _ := natstest.Connect(t, natstest.Run(t))
	ok := Config{Prefix: "app.wake", Reserved: []string{"_INBOX.", "$JS.API."}, Confirm: testConfirm}
	_, err := New(nc, ok)
	require.NoError(t, err)

	_, err = New(nil, ok)
	require.ErrorContains(t, err, "NATS connection")
	for _, tc := range []struct {
		edit func(*Config)
		want string
	}{
		{func(c *Config) { c.Prefix = "a..b" }, `"a..b"`},
		{func(c *Config) { c.Prefix = "app.>" }, `"app.>"`},
		{func(c *Config) { c.Prefix = strings.Repeat("a", PrefixMaxLength+1) }, "more than 64"},
		{func(c *Config) { c.Confirm = 0 }, "not positive"},
		{func(c *Config) { c.Prefix = "_INBOX" }, "overlaps the subjects _INBOX."},
		{func(c *Config) { c.Reserved = []string{"app.wake.x."} }, "overlaps the subjects app.wake.x."},
	} {
		cfg := ok
		tc.edit(&cfg)
		_, err := New(nc, cfg)
		require.Error(t, err, "%+v", cfg)
		assert.Contains(t, err.Error(), tc.want)
	}
}
