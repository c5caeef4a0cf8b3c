package jobkeys

// Targeted wake-ups across the connection's life: a worker's permissions,
// a subscription still on the wire, Watcher.Close while subscribing, a
// reconnect.

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jobkeys/jobkeys/internal/natstest"
)

// TestWakeUpsWorkerPermissions: two workers allowed exactly the key
// store's documented subjects (see NATSStore, TestNATSStoreWorkerPermissions)
// plus the wake-up subjects WithWakeUps names ("<prefix>.<bucket>.>",
// publish and subscribe) run a wake-up cycle across their two connections:
// the Run blocked in one is woken by the other's release through its
// wake-up (no recheck: it is an hour away), with no permission error on
// either connection and no refused wake-up subject.
func TestWakeUpsWorkerPermissions(t *testing.T) {
	t.Parallel()
	svc := jkService("wakeperm")
	bucket := BucketPrefixDefault + "_" + svc
	wakes := WakePrefixDefault + "." + bucket + ".>"
	const inbox = "_INBOX_wakeworker"
	s := permServer(t, permUser{name: "worker",
		publish:  append(workerPublish(bucket), wakes),
		subsribe: append(workerSubscribe(inbox), wakes)})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	_, admin := natstest.Connect(t, s, nats.UserInfo("admin", "admin"))
	_, err := admin.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: bucket, Storage: jetstream.MemoryStorage})
	require.NoError(t, err)

	policy := Policy{Key: []string{"/tenant"}, MaxActive: 1, MaxQueuedPerKey: 4}
	payload := []byte(`{"tenant":"acme"}`)
	errc := make(chan error, 16)
	newWorker := func(instance string) *wakeProc {
		_, js := natstest.Connect(t, s, nats.UserInfo("worker", "worker"), nats.CustomInboxPrefix(inbox),
			nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { errc <- err }))
		return newWakeProc(t, s, svc, policy, wakeProcConfig{
			js: js, noCreate: true, uncounted: true, jobType: "render", coord: &Config{InstanceID: instance},
		})
	}
	a, b := newWorker("worker-a"), newWorker("worker-b")

	for _, id := range []string{"j1", "j2"} {
		adm, err := a.jt.Admit(ctx, id, payload)
		require.NoError(t, err, "admit %s", id)
		require.Equal(t, KindAccepted, adm.Kind, "admit %s", id)
	}
	acq, err := a.jt.Acquire(ctx, "j1", payload)
	require.NoError(t, err, "acquire j1")
	require.Equal(t, KindAcquired, acq.Kind)

	ran := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		_, err := b.r.Run(ctx, "j2", payload, func(context.Context, Lease) error {
			close(ran)
			return nil
		})
		done <- err
	}()
	assert.Equal(t, "j2", recv(t, b.blocked, "j2's Run waiting"))
	require.Eventually(t, func() bool { return b.r.cfg.Watcher.wakeSubscriptions() == 1 }, 10*time.Second, time.Millisecond)
	// Make sure the wait's subscription is at the server before the
	// release (a lost wake-up would be a recheck, an hour away).
	require.NoError(t, b.store.js.Conn().FlushWithContext(ctx))

	rel, err := a.jt.coord.Release(ctx, ReleaseRequest{Lease: acq.Lease})
	require.NoError(t, err, "release j1")
	require.Equal(t, KindReleased, rel.Kind)
	select {
	case <-ran:
	case <-ctx.Done():
		t.Fatal("j2's Run was not woken by the release on the other connection")
	}
	require.NoError(t, <-done, "j2's Run")
	assert.Zero(t, b.r.rechecks.Load(), "rechecks")
	assert.Positive(t, b.store.wakeCounters().Received, "wake-ups received")
	for _, w := range []*wakeProc{a, b} {
		assert.Zero(t, w.store.wakeCounters().Refused, "refused wake-up subjects")
	}

	var asyncErrs []error
	for len(errc) > 0 {
		asyncErrs = append(asyncErrs, <-errc)
	}
	assert.Empty(t, asyncErrs, "errors reported on the workers' connections")
}

// TestWakeUpsSubscriptionInFlight: a Run whose connection is slow to the
// server (30 ms each way) blocks on a state its coordinator has just
// written (its own admission) and waits for its wake-up without a read,
// and the release comes as soon as it waits: its wake-up subscription has
// not reached the server then, nor when the store sends the wake-up once
// more 2 ms later. The Run must still be woken, not wait for its recheck
// (an hour away): it used to, trusting a state seen within 1 ms although
// its subscription was still on the wire.
func TestWakeUpsSubscriptionInFlight(t *testing.T) {
	t.Parallel()
	s := natstest.Run(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	policy := Policy{Key: benchPolicy.Key, MaxActive: 1, MaxQueuedPerKey: 8}
	a := newWakeProc(t, s, "wakeinflight", policy, wakeProcConfig{})
	line := startDelayLine(t, benchHostPort(t, s.ClientURL()), 30*time.Millisecond)
	_, js := natstest.ConnectURL(t, line.URL())
	b := newWakeProc(t, nil, "wakeinflight", policy, wakeProcConfig{js: js})

	releaseA := a.holdSlot(t, ctx, "job-a")
	heldB, doneB := b.runAsync(t, ctx, "job-b", released())
	b.waitBlocked(t, ctx, "job-b")
	releaseA() // at once: job-b's subscription may be on the wire
	select {
	case <-heldB:
	case <-time.After(20 * time.Second):
		t.Fatalf("job-b was not woken by job-a's release (wake-ups of the release: %+v)", a.store.wakeCounters())
	}
	require.NoError(t, <-doneB)
	assert.Zero(t, b.r.rechecks.Load(), "rechecks")
}

// TestWakeUpsWatcherCloseWhileSubscribing: the Watcher closes while a
// blocked Run is making its wake-up subscription (on a slow connection,
// the server's confirmation takes 60 ms). The Run fails with
// ErrWatcherClosed and the store's subscription ends with it: it used to
// be left open (Close found no stop function yet, and the Run's own close
// found the subscription closed already), with the store's dispatcher
// goroutine.
func TestWakeUpsWatcherCloseWhileSubscribing(t *testing.T) {
	t.Parallel()
	s := natstest.Run(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	policy := Policy{Key: benchPolicy.Key, MaxActive: 1, MaxQueuedPerKey: 8}
	a := newWakeProc(t, s, "wakeclosesub", policy, wakeProcConfig{})
	line := startDelayLine(t, benchHostPort(t, s.ClientURL()), 30*time.Millisecond)
	_, js := natstest.ConnectURL(t, line.URL())
	b := newWakeProc(t, nil, "wakeclosesub", policy, wakeProcConfig{js: js})

	releaseA := make(chan struct{})
	defer close(releaseA)
	heldA, _ := a.runAsync(t, ctx, "job-a", releaseA)
	recv(t, heldA, "job-a's slot")
	_, doneB := b.runAsync(t, ctx, "job-b", released())
	// The Run's first try decides on the admission's state, without a
	// read: it subscribes at once, and waits for the confirmation.
	require.Eventually(t, func() bool { return b.w.wakeSubscriptions() == 1 }, 10*time.Second, 100*time.Microsecond)
	b.w.Close()
	err := recv(t, doneB, "job-b's Run")
	require.ErrorIs(t, err, ErrWatcherClosed)
	h := b.store.wake
	require.Eventually(t, func() bool {
		n := h.Size()
		return n.Live == 0 && n.Subjects == 0 && !n.Dispatching
	}, 10*time.Second, time.Millisecond, "the store's wake-up subscriptions end")
}

// TestWakeUpsAfterReconnect: the connection of a process whose Run waits
// for its wake-up drops and reconnects; the client subscribes again, and
// the release made after that wakes the Run through its wake-up (no
// recheck: it is an hour away). A wake-up sent while the connection is
// down is lost, and left to the recheck (see WithWakeUps).
func TestWakeUpsAfterReconnect(t *testing.T) {
	t.Parallel()
	s := natstest.Run(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	policy := Policy{Key: benchPolicy.Key, MaxActive: 1, MaxQueuedPerKey: 8}
	a := newWakeProc(t, s, "wakereconnect", policy, wakeProcConfig{})
	p := startPausableProxy(t, benchHostPort(t, s.ClientURL()))
	reconnected := make(chan struct{}, 4)
	nc, js := natstest.ConnectURL(t, p.url(), nats.MaxReconnects(-1), nats.ReconnectWait(10*time.Millisecond),
		nats.ReconnectHandler(func(*nats.Conn) { reconnected <- struct{}{} }))
	b := newWakeProc(t, nil, "wakereconnect", policy, wakeProcConfig{js: js})

	releaseA := a.holdSlot(t, ctx, "job-a")
	heldB, doneB := b.runAsync(t, ctx, "job-b", released())
	b.waitBlocked(t, ctx, "job-b")

	// Drop b's connection (the proxy's side of it); the client reconnects
	// through the proxy.
	p.mu.Lock()
	conns := p.conns
	p.conns = nil
	p.mu.Unlock()
	for _, c := range conns {
		c.Close()
	}
	recv(t, reconnected, "b's reconnection")
	require.NoError(t, nc.FlushWithContext(ctx), "b's subscriptions are at the server again")

	releaseA()
	select {
	case <-heldB:
	case <-time.After(20 * time.Second):
		t.Fatalf("job-b was not woken after its connection reconnected (wake-ups of the release: %+v)", a.store.wakeCounters())
	}
	require.NoError(t, <-doneB)
	assert.Zero(t, b.r.rechecks.Load(), "rechecks")
	assert.Positive(t, b.store.wakeCounters().Received, "wake-ups received")
}
