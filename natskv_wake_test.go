package jobkeys

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jobkeys/jobkeys/internal/natstest"
)

// natsWakeGot is one wake-up a test waiter received.
type natsWakeGot struct {
	value []byte
	rev   uint64
}

// natsWakeLog is a test waiter: its fn records every wake-up, without
// blocking.
type natsWakeLog struct{ ch chan natsWakeGot }

func newNATSWakeLog() *natsWakeLog { return &natsWakeLog{ch: make(chan natsWakeGot, 64)} }

func (l *natsWakeLog) fn(value []byte, rev uint64) {
	select {
	case l.ch <- natsWakeGot{value: slices.Clone(value), rev: rev}:
	default:
		panic("test waiter's log is full")
	}
}

// next returns the next wake-up the waiter received, failing the test when
// none comes within rtWait.
func (l *natsWakeLog) next(t *testing.T, what string) natsWakeGot {
	t.Helper()
	return recv(t, l.ch, what)
}

// natsWakeFixture is a server and a key of a service of its own.
type natsWakeFixture struct {
	srv     *server.Server
	service string
	kvKey   string
}

func newNATSWakeFixture(t *testing.T) *natsWakeFixture {
	t.Helper()
	svc := jkService("wake")
	key, err := DeriveKey(svc, "render", []byte(`{"t":"acme"}`), []string{"/t"})
	require.NoError(t, err)
	return &natsWakeFixture{srv: natstest.Run(t), service: svc, kvKey: key.KVKey}
}

// store returns a wake-up store on a connection of its own.
func (f *natsWakeFixture) store(t *testing.T, opts ...NATSStoreOption) (*NATSStore, *nats.Conn) {
	t.Helper()
	nc, js := natstest.Connect(t, f.srv)
	s, err := NewNATSStore(js, append([]NATSStoreOption{WithWakeUps("")}, opts...)...)
	require.NoError(t, err)
	require.True(t, s.wakeUps())
	return s, nc
}

// wait subscribes a test waiter for job on store s and makes sure the
// server has the subscription.
func (f *natsWakeFixture) wait(t *testing.T, s *NATSStore, nc *nats.Conn, job string) (*natsWakeLog, func()) {
	t.Helper()
	l := newNATSWakeLog()
	stop, err := s.subscribeWake(f.service, f.kvKey, job, l.fn)
	require.NoError(t, err)
	t.Cleanup(stop)
	require.NoError(t, nc.Flush())
	return l, stop
}

// firstAfterMarker publishes a marker wake-up (revision rev) from store
// pub to job's waiter alone, and returns the first wake-up l gets. Wake-ups
// from one connection reach a subscriber in order, so when it is the
// marker, the waiter got nothing from pub before.
func (f *natsWakeFixture) firstAfterMarker(t *testing.T, pub *NATSStore, l *natsWakeLog, job string, rev uint64) natsWakeGot {
	t.Helper()
	pub.publishWakes(f.service, f.kvKey, []byte("marker"), rev, []string{job}, 1)
	return l.next(t, "the marker wake-up of "+job)
}

// TestWakeUpsReachAnotherStore: a waiter on one store gets the wake-up
// another store (another connection) sends, with the exact revision, and
// without its value: a wake-up from the network is a hint, which anyone
// allowed to publish on its subject may have sent (TestWakeUpsSubject
// checks the bytes on the wire).
func TestWakeUpsReachAnotherStore(t *testing.T) {
	t.Parallel()
	f := newNATSWakeFixture(t)
	a, _ := f.store(t)
	b, ncB := f.store(t)
	l, _ := f.wait(t, b, ncB, "job-1")

	value := []byte("{\"version\":1}\x00\xff\n")
	a.publishWakes(f.service, f.kvKey, value, 1<<40+7, []string{"job-1"}, 1)
	got := l.next(t, "job-1's wake-up")
	assert.Equal(t, uint64(1<<40+7), got.rev)
	assert.Nil(t, got.value, "the value of a wake-up from the network")
	assert.Equal(t, uint64(1), a.wakeCounters().Published)
	assert.Zero(t, a.wakeCounters().Local)
	require.Eventually(t, func() bool { return b.wakeCounters().Received == 1 }, rtWait, time.Millisecond)
}

// TestWakeUpsSubject: the wire subject is "<prefix>.<bucket>.<kvKey>.<token>"
// with the token base64url(sha256(jobID)[:16]); a subscriber of that
// subject on a plain connection gets revision and value.
func TestWakeUpsSubject(t *testing.T) {
	t.Parallel()
	f := newNATSWakeFixture(t)
	a, _ := f.store(t, WithBucketPrefix("WAKE_KEYS"))
	nc, _ := natstest.Connect(t, f.srv)
	sum := sha256.Sum256([]byte("job-1"))
	subject := "jobkeys.wake.WAKE_KEYS_" + f.service + "." + f.kvKey + "." + base64.RawURLEncoding.EncodeToString(sum[:16])
	sub, err := nc.SubscribeSync(subject)
	require.NoError(t, err)
	require.NoError(t, nc.Flush())

	a.publishWakes(f.service, f.kvKey, []byte("v"), 258, []string{"job-1"}, 1)
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
	f := newNATSWakeFixture(t)
	a, _ := f.store(t)
	b, ncB := f.store(t)
	lb, _ := f.wait(t, b, ncB, "b")

	a.publishWakes(f.service, f.kvKey, []byte("s1"), 10, []string{"a", "b"}, 1)
	got := lb.next(t, "b's wake-up after a's no responders")
	assert.Equal(t, uint64(10), got.rev)
	assert.Nil(t, got.value, "the value of a wake-up from the network")
	c := a.wakeCounters()
	assert.Equal(t, uint64(1), c.NoResponders)
	assert.Equal(t, uint64(2), c.Published)

	// Now a waits too, on a third store: it alone is woken.
	w, ncW := f.store(t)
	la, _ := f.wait(t, w, ncW, "a")
	a.publishWakes(f.service, f.kvKey, []byte("s2"), 20, []string{"a", "b"}, 1)
	got = la.next(t, "a's wake-up")
	assert.Equal(t, uint64(20), got.rev)
	assert.Equal(t, uint64(30), f.firstAfterMarker(t, a, lb, "b", 30).rev, "b got a wake-up meant for a")
	assert.Equal(t, uint64(1), a.wakeCounters().NoResponders)
}

// TestWakeUpsFree: a wake-up with free 2 wakes two waiters, with free 1
// exactly one, the first in queue order.
func TestWakeUpsFree(t *testing.T) {
	t.Parallel()
	f := newNATSWakeFixture(t)
	a, _ := f.store(t)
	b, ncB := f.store(t)
	c, ncC := f.store(t)
	l1, _ := f.wait(t, b, ncB, "j1")
	l2, _ := f.wait(t, c, ncC, "j2")

	a.publishWakes(f.service, f.kvKey, []byte("two"), 5, []string{"j1", "j2"}, 2)
	assert.Equal(t, uint64(5), l1.next(t, "j1's wake-up").rev)
	assert.Equal(t, uint64(5), l2.next(t, "j2's wake-up").rev)

	a.publishWakes(f.service, f.kvKey, []byte("one"), 6, []string{"j1", "j2"}, 1)
	assert.Equal(t, uint64(6), l1.next(t, "j1's wake-up").rev)
	assert.Equal(t, uint64(7), f.firstAfterMarker(t, a, l2, "j2", 7).rev, "free 1 woke j2 too")
	assert.Zero(t, a.wakeCounters().NoResponders)
}

// TestWakeUpsLocal: a waiter of the same store is woken in memory: before
// publishWakes returns, and with no message sent.
func TestWakeUpsLocal(t *testing.T) {
	t.Parallel()
	f := newNATSWakeFixture(t)
	a, ncA := f.store(t)
	l, _ := f.wait(t, a, ncA, "j1")
	before := a.wakeCounters()

	a.publishWakes(f.service, f.kvKey, []byte("here"), 9, []string{"j1"}, 1)
	require.Len(t, l.ch, 1, "the local waiter was woken before publishWakes returned")
	got := l.next(t, "the local wake-up")
	assert.Equal(t, natsWakeGot{value: []byte("here"), rev: 9}, got)
	after := a.wakeCounters()
	assert.Equal(t, before.Published, after.Published, "a local wake-up sends no message")
	assert.Equal(t, before.Local+1, after.Local)
	assert.Zero(t, after.Received)

	// Local first, then remote: free 2 over [local j1, remote j2].
	b, ncB := f.store(t)
	l2, _ := f.wait(t, b, ncB, "j2")
	a.publishWakes(f.service, f.kvKey, []byte("both"), 10, []string{"j1", "j2"}, 2)
	require.Len(t, l.ch, 1, "the local waiter was woken before publishWakes returned")
	assert.Equal(t, uint64(10), l.next(t, "the local wake-up").rev)
	assert.Equal(t, uint64(10), l2.next(t, "j2's wake-up").rev)
	assert.Equal(t, after.Published+1, a.wakeCounters().Published)
}

// TestWakeUpsSharedJob: two waiters of one job on one store share one
// subscription; both are woken, and the subscription stays until the last
// stops.
func TestWakeUpsSharedJob(t *testing.T) {
	t.Parallel()
	f := newNATSWakeFixture(t)
	a, _ := f.store(t)
	b, ncB := f.store(t)
	l1, stop1 := f.wait(t, b, ncB, "j1")
	l2, stop2 := f.wait(t, b, ncB, "j1")

	a.publishWakes(f.service, f.kvKey, []byte("x"), 1, []string{"j1"}, 1)
	assert.Equal(t, uint64(1), l1.next(t, "the first waiter's wake-up").rev)
	assert.Equal(t, uint64(1), l2.next(t, "the second waiter's wake-up").rev)

	stop1()
	require.NoError(t, ncB.Flush())
	a.publishWakes(f.service, f.kvKey, []byte("x"), 2, []string{"j1"}, 1)
	assert.Equal(t, uint64(2), l2.next(t, "the remaining waiter's wake-up").rev)
	assert.False(t, pending(l1.ch))

	stop2()
	require.NoError(t, ncB.Flush())
	a.publishWakes(f.service, f.kvKey, []byte("x"), 3, []string{"j1"}, 1)
	require.Eventually(t, func() bool { return a.wakeCounters().NoResponders >= 1 }, rtWait, time.Millisecond,
		"the last stop unsubscribed: no responders")
}

// TestWakeUpsRetry: a wake-up nobody was waiting for (every target
// answered no responders) is sent once more after the retry delay, and
// reaches a waiter that subscribed meanwhile.
func TestWakeUpsRetry(t *testing.T) {
	t.Parallel()
	f := newNATSWakeFixture(t)
	a, ncA := f.store(t)
	a.wake.retry = 2 * time.Second // long enough for the waiter to subscribe on a loaded machine
	b, ncB := f.store(t)

	a.publishWakes(f.service, f.kvKey, []byte("late"), 3, []string{"j1"}, 1)
	require.NoError(t, ncA.Flush()) // the server took the publish: nobody waits
	l, _ := f.wait(t, b, ncB, "j1")
	got := l.next(t, "the retried wake-up")
	assert.Equal(t, natsWakeGot{rev: 3}, got, "the revision, not the value, of a wake-up from the network")
	c := a.wakeCounters()
	assert.Equal(t, uint64(1), c.NoResponders)
	assert.Equal(t, uint64(1), c.Retried)
	assert.Equal(t, uint64(2), c.Published)
}

// TestWakeUpsResentTwiceThenNoMore: a wake-up whose resends find nobody either is not
// sent again: it is resent wakeResends (2) times, after wakeRetry and
// wakeRetryLate, and then no more.
func TestWakeUpsResentTwiceThenNoMore(t *testing.T) {
	t.Parallel()
	f := newNATSWakeFixture(t)
	a, _ := f.store(t)
	a.publishWakes(f.service, f.kvKey, []byte("none"), 3, []string{"j1", "j2"}, 1)
	require.Eventually(t, func() bool { return a.wakeCounters().NoResponders == 6 }, rtWait, time.Millisecond)
	// A second key's chain, published after the first was over, ends the
	// same way; by then the first could have been sent a fourth time.
	a.publishWakes(f.service, f.kvKey+"x", []byte("none"), 4, []string{"j1"}, 1)
	require.Eventually(t, func() bool { return a.wakeCounters().NoResponders == 9 }, rtWait, time.Millisecond)
	c := a.wakeCounters()
	assert.Equal(t, uint64(4), c.Retried)
	assert.Equal(t, uint64(9), c.Published)
}

// TestWakeUpsStaleChain: a newer state of the key published before an
// older wake-up's retry stops that retry.
func TestWakeUpsStaleChain(t *testing.T) {
	t.Parallel()
	f := newNATSWakeFixture(t)
	a, _ := f.store(t)
	a.wake.retry = 2 * time.Second // long enough for the newer state to go out first on a loaded machine
	b, ncB := f.store(t)

	a.publishWakes(f.service, f.kvKey, []byte("old"), 1, []string{"j1"}, 1)
	require.Eventually(t, func() bool { return a.wakeCounters().NoResponders == 1 }, rtWait, time.Millisecond)
	l, _ := f.wait(t, b, ncB, "j1") // the old wake-up's retry would reach it
	a.publishWakes(f.service, f.kvKey, []byte("new"), 2, []string{"j2"}, 1)
	require.Eventually(t, func() bool { return a.wake.retrySkipped.Load() == 1 }, rtWait, time.Millisecond,
		"the old wake-up's retry ran")
	assert.Equal(t, uint64(9), f.firstAfterMarker(t, a, l, "j1", 9).rev, "the stale wake-up was retried")

	// An older state than one already published is not sent at all.
	published := a.wakeCounters().Published
	a.publishWakes(f.service, f.kvKey, []byte("older"), 5, []string{"j1"}, 1)
	assert.Equal(t, published, a.wakeCounters().Published)
}

// TestWakeUpsStaleNoResponders: a "no responders" answer for a wake-up
// that a newer one replaced moves nothing on.
func TestWakeUpsStaleNoResponders(t *testing.T) {
	t.Parallel()
	f := newNATSWakeFixture(t)
	a, ncA := f.store(t)
	b, ncB := f.store(t)
	l, _ := f.wait(t, b, ncB, "j2")
	reply, ok := a.wake.replySubjects()
	require.True(t, ok)
	// The older wake-up's answer for j1 waits for the hub's lock, which
	// the test holds until the newer wake-up went out.
	a.wake.mu.Lock()
	c, acts := a.wake.startLocked(a.BucketName(f.service), f.kvKey, []byte("old"), 1, []string{"j1", "j2"}, 1, time.Now(), false)
	require.NotNil(t, c)
	a.wake.act(c, reply, &acts)
	require.NoError(t, ncA.Flush()) // the server answered: no responders
	c2, acts2 := a.wake.startLocked(a.BucketName(f.service), f.kvKey, []byte("new"), 2, []string{"j3"}, 1, time.Now(), false)
	require.NotNil(t, c2)
	a.wake.act(c2, reply, &acts2)
	a.wake.mu.Unlock()
	require.Eventually(t, func() bool { return a.wakeCounters().NoResponders >= 2 }, rtWait, time.Millisecond)
	assert.Equal(t, uint64(7), f.firstAfterMarker(t, a, l, "j2", 7).rev, "the stale wake-up moved on to j2")
}

// TestWakeUpsStop: after stop the waiter's fn is never called again, and
// the subscription is gone from the server (no responders).
func TestWakeUpsStop(t *testing.T) {
	t.Parallel()
	f := newNATSWakeFixture(t)
	a, ncA := f.store(t)
	b, ncB := f.store(t)
	l, stop := f.wait(t, b, ncB, "j1")
	a.publishWakes(f.service, f.kvKey, []byte("x"), 1, []string{"j1"}, 1)
	assert.Equal(t, uint64(1), l.next(t, "the wake-up before stop").rev)

	stop()
	stop() // a second stop is harmless
	require.NoError(t, ncB.Flush())
	a.publishWakes(f.service, f.kvKey, []byte("x"), 2, []string{"j1"}, 1)
	require.Eventually(t, func() bool {
		c := a.wakeCounters()
		return c.NoResponders == 1+wakeResends && c.Retried == wakeResends
	}, rtWait, time.Millisecond, "no responders after stop, and after the resends")

	// A local waiter that stopped is not called either.
	ll, lstop := f.wait(t, a, ncA, "j3")
	lstop()
	a.publishWakes(f.service, f.kvKey, []byte("x"), 3, []string{"j3"}, 1)
	assert.Zero(t, a.wakeCounters().Local)
	require.Eventually(t, func() bool { return a.wakeCounters().NoResponders == 2*(1+wakeResends) }, rtWait, time.Millisecond)
	assert.False(t, pending(l.ch), "a stopped waiter was called")
	assert.False(t, pending(ll.ch), "a stopped local waiter was called")
	assert.Equal(t, uint64(1), b.wakeCounters().Received)
}

// TestWakeUpsMalformed: a message too short to be a wake-up is ignored
// and counted.
func TestWakeUpsMalformed(t *testing.T) {
	t.Parallel()
	f := newNATSWakeFixture(t)
	a, ncA := f.store(t)
	b, ncB := f.store(t)
	l, _ := f.wait(t, b, ncB, "j1")
	require.NoError(t, ncA.Publish(b.wake.subject(b.BucketName(f.service), f.kvKey, "j1"), []byte{1, 2, 3}))
	assert.Equal(t, uint64(4), f.firstAfterMarker(t, a, l, "j1", 4).rev)
	assert.Equal(t, uint64(1), b.wakeCounters().Malformed)
	require.Eventually(t, func() bool { return b.wakeCounters().Received == 1 }, rtWait, time.Millisecond)
}

// TestWakeUpsPrefix: WithWakeUps validates its prefix; wake-ups are off by
// default.
func TestWakeUpsPrefix(t *testing.T) {
	t.Parallel()
	s := natstest.Run(t)
	nc, js := natstest.Connect(t, s)

	off, err := NewNATSStore(js)
	require.NoError(t, err)
	assert.False(t, off.wakeUps())
	off.publishWakes("svc", "svc.render.h", []byte("x"), 1, []string{"j"}, 1) // does nothing
	assert.Equal(t, wakeCounts{}, off.wakeCounters())
	_, err = off.subscribeWake("svc", "svc.render.h", "j", func([]byte, uint64) {})
	require.ErrorIs(t, err, ErrInvalidRequest)

	for _, good := range []string{"", "jobkeys.wake", "my-app.wake_2", "w", strings.Repeat("a", WakePrefixMaxLength)} {
		st, err := NewNATSStore(js, WithWakeUps(good))
		require.NoError(t, err, good)
		assert.True(t, st.wakeUps(), good)
	}
	st, err := NewNATSStore(js, WithWakeUps(""))
	require.NoError(t, err)
	assert.Equal(t, WakePrefixDefault+".", st.wake.prefix)

	apiJS, err := jetstream.NewWithAPIPrefix(nc, "tenant.api")
	require.NoError(t, err)
	for _, tc := range []struct {
		prefix string
		js     jetstream.JetStream
	}{
		{"a..b", js}, {".a", js}, {"a.", js}, {".", js}, {"a*", js}, {"a.*", js}, {"a.>", js}, {">", js},
		{"a b", js}, {"a\tb", js}, {"a\nb", js}, {"$KV.x", js}, {"$JS.API", js}, {"wake!", js},
		{strings.Repeat("a", WakePrefixMaxLength+1), js},
		{"_INBOX", js}, {"_INBOX.wake", js}, // the connection's inboxes
		{"tenant", apiJS}, {"tenant.api.wake", apiJS}, // the JetStream API's subjects
	} {
		_, err := NewNATSStore(tc.js, WithWakeUps(tc.prefix))
		require.ErrorIs(t, err, ErrInvalidRequest, "prefix %q", tc.prefix)
		assert.Contains(t, err.Error(), strconv.Quote(tc.prefix), "the error names the prefix")
	}
	_, err = NewNATSStore(apiJS, WithWakeUps("tenant2.wake"))
	require.NoError(t, err)
}

// TestWakeUpsRefusedFailNoCall: a user without permission for the wake-up
// subjects reads and writes keys as before: the server's refusals of its
// wake-up subscription and publishes fail no store call, and are counted.
func TestWakeUpsRefusedFailNoCall(t *testing.T) {
	t.Parallel()
	svc := jkService("wakeperm")
	bucket := BucketPrefixDefault + "_" + svc
	const inbox = "_INBOX_wworker"
	s := permServer(t, permUser{name: "worker", publish: workerPublish(bucket), subsribe: workerSubscribe(inbox)})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, admin := natstest.Connect(t, s, nats.UserInfo("admin", "admin"))
	_, err := admin.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: bucket, Storage: jetstream.MemoryStorage})
	require.NoError(t, err)

	errc := make(chan error, 64)
	nc, js := natstest.Connect(t, s, nats.UserInfo("worker", "worker"), nats.CustomInboxPrefix(inbox),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			select {
			case errc <- err:
			default:
			}
		}))
	store, err := NewNATSStore(js, WithWakeUps(""))
	require.NoError(t, err)
	key := svc + ".render.k"

	l := newNATSWakeLog()
	stop, err := store.subscribeWake(svc, key, "j1", l.fn)
	require.NoError(t, err, "the subscription is sent without waiting for it")
	defer stop()
	rev, err := store.Create(ctx, svc, key, []byte("v1"))
	require.NoError(t, err)
	// Refusals arrive while KV calls run.
	for i := range 20 {
		store.publishWakes(svc, key, []byte("v"), rev+uint64(i), []string{"j2"}, 1)
		_, got, err := store.Get(ctx, svc, key)
		require.NoError(t, err, "get %d", i)
		rev, err = store.Update(ctx, svc, key, []byte("v2"), got)
		require.NoError(t, err, "update %d", i)
	}
	require.NoError(t, nc.Flush())
	require.Eventually(t, func() bool { return store.wakeCounters().Refused >= 21 }, rtWait, time.Millisecond,
		"the refused subscription and publishes are counted")
	_, _, err = store.Get(ctx, svc, key)
	require.NoError(t, err)
	assert.NotEmpty(t, errc, "the connection's own handler still sees the refusals")
	assert.False(t, pending(l.ch))
}

// TestWakeUpsStopRace: a waiter that stops after a wake-up chose it but
// before the wake-up reached it is not called.
func TestWakeUpsStopRace(t *testing.T) {
	t.Parallel()
	f := newNATSWakeFixture(t)
	a, ncA := f.store(t)
	l, stop := f.wait(t, a, ncA, "j1")
	reply, ok := a.wake.replySubjects()
	require.True(t, ok)
	a.wake.mu.Lock()
	c, acts := a.wake.startLocked(a.BucketName(f.service), f.kvKey, []byte("x"), 1, []string{"j1"}, 1, time.Now(), false)
	a.wake.mu.Unlock()
	require.NotNil(t, c)
	require.Len(t, acts.local, 1, "the walk chose the local waiter")
	stop()
	a.wake.act(c, reply, &acts)
	assert.Empty(t, l.ch, "a stopped waiter was called")
	assert.Zero(t, a.wakeCounters().Local)
}

// TestWakeUpsConnectionClosed: closing the connection ends the store's
// dispatcher even while waiters are subscribed; later wake-ups are dropped
// and counted, later subscriptions fail.
func TestWakeUpsConnectionClosed(t *testing.T) {
	t.Parallel()
	f := newNATSWakeFixture(t)
	b, ncB := f.store(t)
	_, stop := f.wait(t, b, ncB, "j1")
	_, _ = f.wait(t, b, ncB, "j2")
	ncB.Close()
	require.Eventually(t, func() bool {
		b.wake.mu.Lock()
		defer b.wake.mu.Unlock()
		return b.wake.disp == nil && b.wake.live == 0 && len(b.wake.subs) == 0
	}, rtWait, time.Millisecond, "the dispatcher ended with the connection")
	stop() // harmless after the close

	b.publishWakes(f.service, f.kvKey, []byte("x"), 1, []string{"j1"}, 1)
	assert.Equal(t, uint64(1), b.wakeCounters().Dropped)
	_, err := b.subscribeWake(f.service, f.kvKey, "j3", func([]byte, uint64) {})
	require.ErrorIs(t, err, nats.ErrConnectionClosed)
}

// TestWakeUpsBounded: the delivery state kept for wake-ups stays bounded
// however many keys are woken, and expires.
func TestWakeUpsBounded(t *testing.T) {
	t.Parallel()
	f := newNATSWakeFixture(t)
	a, _ := f.store(t)
	h := a.wake
	kept := func() (order, latest, chains int) {
		h.mu.Lock()
		defer h.mu.Unlock()
		return len(h.order), len(h.latest), len(h.chains)
	}
	for i := range wakeChainsMax + 500 {
		a.publishWakes(f.service, f.kvKey+strconv.Itoa(i), []byte("x"), 1, []string{"j"}, 1)
		order, latest, chains := kept()
		require.LessOrEqual(t, order, wakeChainsMax)
		require.LessOrEqual(t, latest, wakeChainsMax)
		require.LessOrEqual(t, chains, wakeChainsMax)
	}
	require.Eventually(t, func() bool { _, _, chains := kept(); return chains == 0 }, rtWait, time.Millisecond,
		"every wake-up ended")

	// Targets beyond free+wakeWalkExtra are never tried.
	before := a.wakeCounters()
	many := make([]string, 1000)
	for i := range many {
		many[i] = "nobody-" + strconv.Itoa(i)
	}
	a.publishWakes(f.service, f.kvKey, []byte("x"), 1, many, 1)
	require.Eventually(t, func() bool { _, _, chains := kept(); return chains == 0 }, rtWait, time.Millisecond)
	after := a.wakeCounters()
	assert.Equal(t, before.Retried+wakeResends, after.Retried)
	assert.Equal(t, before.Published+(1+wakeResends)*(1+wakeWalkExtra), after.Published)
	assert.Equal(t, before.NoResponders+(1+wakeResends)*(1+wakeWalkExtra), after.NoResponders)

	// Large states: the bytes kept are bounded too.
	big := make([]byte, 600<<10)
	for i := range 20 {
		a.publishWakes(f.service, f.kvKey+"big"+strconv.Itoa(i), big, 1, []string{"j"}, 1)
		h.mu.Lock()
		keptBytes := h.keptBytes
		h.mu.Unlock()
		require.LessOrEqual(t, keptBytes, wakeKeptBytesMax+len(big)+wakeRevLen)
	}
	require.Eventually(t, func() bool { _, _, chains := kept(); return chains == 0 }, rtWait, time.Millisecond)

	h.mu.Lock()
	defer h.mu.Unlock()
	assert.Zero(t, h.keptBytes)
	h.expireLocked(time.Now().Add(2 * wakeChainTTL))
	assert.Empty(t, h.order)
	assert.Empty(t, h.latest)
}

// BenchmarkWakeUps measures one wake-up of a one-slot state: to a waiter
// of the same store (in memory), and to a waiter on another connection,
// received before the next is sent; beside it, a bare core NATS publish
// and receipt over the same connections as the baseline.
func BenchmarkWakeUps(b *testing.B) {
	srv := natstest.Run(b)
	svc := jkService("wakebench")
	key, err := DeriveKey(svc, "render", []byte(`{"t":"acme"}`), []string{"/t"})
	require.NoError(b, err)
	value := []byte(`{"version":1,"service":"` + svc + `","jobType":"render","key":"acme","keyHash":"` + key.KeyHash +
		`","maxActive":1,"maxQueuedPerKey":16,"active":[],"queued":[{"jobId":"j1","createdAt":"2026-12-01T00:00:00.000Z","requestId":"r"}],"staleTakeoverCount":0,"updatedAt":"2026-12-01T00:00:00.000Z"}`)
	open := func() (*NATSStore, *nats.Conn) {
		nc, js := natstest.Connect(b, srv)
		s, err := NewNATSStore(js, WithWakeUps(""))
		require.NoError(b, err)
		return s, nc
	}
	got := make(chan uint64, 1)
	fn := func(_ []byte, rev uint64) { got <- rev }

	b.Run("local", func(b *testing.B) {
		a, _ := open()
		stop, err := a.subscribeWake(svc, key.KVKey, "j1", fn)
		require.NoError(b, err)
		defer stop()
		b.ReportAllocs()
		for i := range b.N {
			a.publishWakes(svc, key.KVKey, value, uint64(i+1), []string{"j1"}, 1)
			<-got
		}
	})
	b.Run("remote", func(b *testing.B) {
		a, _ := open()
		w, ncW := open()
		stop, err := w.subscribeWake(svc, key.KVKey, "j1", fn)
		require.NoError(b, err)
		defer stop()
		require.NoError(b, ncW.Flush())
		b.ReportAllocs()
		for i := range b.N {
			a.publishWakes(svc, key.KVKey, value, uint64(i+1), []string{"j1"}, 1)
			<-got
		}
	})
	b.Run("core-nats-baseline", func(b *testing.B) {
		_, ncA := open()
		_, ncW := open()
		subject := "bench." + svc
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

// TestWakeUpsSameConnection: a second store on the same connection is
// another process as far as wake-ups go: it is woken by a message, which
// the server echoes to the connection.
func TestWakeUpsSameConnection(t *testing.T) {
	t.Parallel()
	f := newNATSWakeFixture(t)
	nc, js := natstest.Connect(t, f.srv)
	a, err := NewNATSStore(js, WithWakeUps(""))
	require.NoError(t, err)
	b, err := NewNATSStore(js, WithWakeUps(""))
	require.NoError(t, err)
	l, _ := f.wait(t, b, nc, "j1")
	a.publishWakes(f.service, f.kvKey, []byte("x"), 1, []string{"j1"}, 1)
	assert.Equal(t, natsWakeGot{rev: 1}, l.next(t, "j1's wake-up"), "the revision, not the value, of a wake-up from the network")
	assert.Equal(t, uint64(1), a.wakeCounters().Published)
	assert.Zero(t, a.wakeCounters().Local)
}

// TestWakeUpsRefusalConcernsNoCall: the server's refusal of a wake-up
// subject cancels no store call in flight, even one whose subjects the
// wake-up subject's tokens resemble (a service named after another's
// stream, a job type named like an API verb), and is counted.
func TestWakeUpsRefusalConcernsNoCall(t *testing.T) {
	t.Parallel()
	srv := natstest.Run(t)
	nc, js := natstest.Connect(t, srv)
	store, err := NewNATSStore(js, WithWakeUps(""))
	require.NoError(t, err)
	svc1 := jkService("wakeg")
	svc2 := "KV_" + store.BucketName(svc1) // a service named after svc1's stream
	require.NoError(t, validateService(svc2))
	kvKey2 := svc2 + ".CONSUMER." + strings.Repeat("a", 64)
	subject := store.wake.subject(store.BucketName(svc2), kvKey2, "j1")
	violation := func(what, subject string) error {
		return fmt.Errorf("%w: Permissions Violation for %s %q", nats.ErrPermissionViolation, what, subject)
	}

	gctx, pg := store.guards.guard(context.Background(), natsOpRead|natsOpWatch, store.prefix, svc1)
	defer pg.done()
	store.guards.record(nc, violation("Publish to", subject))
	store.guards.record(nc, violation("Subscription to", subject))
	require.NoError(t, gctx.Err(), "a refused wake-up subject cancelled a call on another bucket")
	assert.Equal(t, uint64(2), store.wakeCounters().Refused)

	// The guard does work: a refusal of its stream's consumer creation
	// cancels it.
	store.guards.record(nc, violation("Publish to", "$JS.API.CONSUMER.CREATE.KV_"+store.BucketName(svc1)+".c"))
	require.Error(t, gctx.Err())
	var v *permissionViolation
	require.ErrorAs(t, context.Cause(gctx), &v)
}
