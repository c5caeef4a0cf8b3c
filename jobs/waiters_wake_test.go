package jobs

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jobkeys/jobkeys"
	"github.com/jobkeys/jobkeys/internal/natstest"
)

// blockedLog counts, per job, the client's "jobs: blocked" lines: the
// tries of a waiting job that found its key busy.
type blockedLog struct {
	mu sync.Mutex
	n  map[string]int
}

func (l *blockedLog) Enabled(context.Context, slog.Level) bool { return true }
func (l *blockedLog) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *blockedLog) WithGroup(string) slog.Handler            { return l }

func (l *blockedLog) Handle(_ context.Context, r slog.Record) error {
	if r.Message != "jobs: blocked" {
		return nil
	}
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "job" {
			l.mu.Lock()
			l.n[a.Value.String()]++
			l.mu.Unlock()
			return false
		}
		return true
	})
	return nil
}

func (l *blockedLog) count(job string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.n[job]
}

// wakeClient is a client over a key store with wake-ups on one connection,
// whose jobs "a" and "b" run until their gates close.
type wakeClient struct {
	c       *Client
	srv     *server.Server
	log     *blockedLog
	gates   map[string]chan struct{}
	started chan string
}

func newWakeClient(t *testing.T) *wakeClient {
	s := natstest.Run(t)
	_, js := natstest.Connect(t, s)
	n := natsBucketSeq.Add(1)
	st, err := NewNATSStore(js, nil, WithBucket(fmt.Sprintf("JOBS_WW%d", n)), WithCreateBucket(jetstream.MemoryStorage, 1))
	require.NoError(t, err)
	keys, err := jobkeys.NewNATSStore(js, jobkeys.WithCreateBuckets(jetstream.MemoryStorage, 1), jobkeys.WithWakeUps(""))
	require.NoError(t, err)
	coord, err := jobkeys.NewCoordinator(keys, nil)
	require.NoError(t, err)
	w := &wakeClient{srv: s, log: &blockedLog{n: map[string]int{}}, started: make(chan string, 8),
		gates: map[string]chan struct{}{"a": make(chan struct{}), "b": make(chan struct{})}}
	// The recheck is a minute away: only a wake-up starts a waiting job
	// in time.
	w.c, err = NewClient(st, coord, &ClientConfig{KeyStore: keys, Service: fmt.Sprintf("ww%d", n), Logger: slog.New(w.log),
		PollInterval: 20 * time.Millisecond, RecheckInterval: time.Minute, ReconcileInterval: -1, StopGrace: 2 * time.Second})
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		assert.NoError(t, w.c.Stop(ctx))
	})
	// Claims and leases last two minutes; the running job heartbeats
	// every 50 ms.
	p := jobkeys.Policy{Key: []string{"/doc"}, MaxActive: 1, MaxQueuedPerKey: 5,
		HeartbeatInterval: 50 * time.Millisecond, HeartbeatTTL: 2 * time.Minute}
	require.NoError(t, Register(w.c, Kind[json.RawMessage, string]{Type: "w", Policy: p,
		Work: func(ctx context.Context, run *Run, in json.RawMessage) (string, error) {
			w.started <- run.Job().ID
			if g := w.gates[run.Job().ID]; g != nil {
				select {
				case <-g:
				case <-ctx.Done():
				}
			}
			return "", nil
		}}))
	return w
}

func (w *wakeClient) enqueue(t *testing.T, id string) {
	t.Helper()
	_, err := w.c.Enqueue(context.Background(), EnqueueRequest{ID: id, ChannelID: "ch", Type: "w", TargetKey: id,
		IdempotencyKey: id, Fingerprint: id, Input: json.RawMessage(`{"doc":"d"}`)})
	require.NoError(t, err)
}

func (w *wakeClient) next(t *testing.T, what string) string {
	t.Helper()
	select {
	case id := <-w.started:
		return id
	case <-time.After(30 * time.Second):
		t.Fatalf("no job started: %s", what)
		return ""
	}
}

// wakeSubjects returns how many wake-up subjects the server has
// subscriptions on.
func (w *wakeClient) wakeSubjects(t *testing.T) int {
	t.Helper()
	cz, err := w.srv.Connz(&server.ConnzOptions{Subscriptions: true})
	require.NoError(t, err)
	n := 0
	for _, c := range cz.Conns {
		for _, s := range c.Subs {
			if strings.HasPrefix(s, jobkeys.WakePrefixDefault+".") {
				n++
			}
		}
	}
	return n
}

func (w *wakeClient) waitingIs(t *testing.T, n int) {
	t.Helper()
	require.Eventually(t, func() bool {
		w.c.mu.Lock()
		defer w.c.mu.Unlock()
		return w.c.waiting == n
	}, 30*time.Second, 5*time.Millisecond)
}

// TestClientWakeUpsWakeOnlyTheNextJob is the regression test for the
// jobs runtime's waiters over targeted wake-ups, which shared a watch of
// their key: a release let the first of them try, which, acquiring,
// passed the turn on to the next, which tried (a read) and found the key
// busy again. Now each queued job waits for the wake-ups of its own job,
// in no group of its key: the release of a wakes b alone, and c, behind
// b, is not tried until b's release wakes it.
func TestClientWakeUpsWakeOnlyTheNextJob(t *testing.T) {
	t.Parallel()
	w := newWakeClient(t)
	ctx := context.Background()
	w.enqueue(t, "a")
	require.NoError(t, w.c.Start(ctx))
	require.Equal(t, "a", w.next(t, "a"))
	w.enqueue(t, "b")
	w.waitingIs(t, 1)
	w.enqueue(t, "c")
	w.waitingIs(t, 2)
	w.c.mu.Lock()
	groups := len(w.c.keyWaiters)
	w.c.mu.Unlock()
	assert.Zero(t, groups, "key groups of jobs waiting for wake-ups")
	blockedC := w.log.count("c")

	close(w.gates["a"])
	require.Equal(t, "b", w.next(t, "b woken by a's release"))
	// b runs (and heartbeats) for a while: c, not woken, does not try.
	time.Sleep(300 * time.Millisecond)
	assert.Equal(t, blockedC, w.log.count("c"), "tries of c after a's release, which freed the slot b took")
	close(w.gates["b"])
	require.Equal(t, "c", w.next(t, "c woken by b's release"))
}

// TestClientWakeWaiterClosesItsSubscription: a job waiting for its
// wake-ups holds one subscription of its own job's subject, and closes it
// when it stops waiting: cancelled while it waits, or woken and started.
func TestClientWakeWaiterClosesItsSubscription(t *testing.T) {
	t.Parallel()
	w := newWakeClient(t)
	ctx := context.Background()
	w.enqueue(t, "a")
	require.NoError(t, w.c.Start(ctx))
	require.Equal(t, "a", w.next(t, "a"))
	assert.Zero(t, w.wakeSubjects(t))
	w.enqueue(t, "b")
	w.waitingIs(t, 1)
	w.enqueue(t, "c")
	w.waitingIs(t, 2)
	require.Eventually(t, func() bool { return w.wakeSubjects(t) == 2 }, 30*time.Second, 5*time.Millisecond,
		"subscriptions of two waiting jobs")

	_, err := w.c.Cancel(ctx, CancelRequest{ChannelID: "ch", JobID: "b"})
	require.NoError(t, err)
	w.waitingIs(t, 1)
	require.Eventually(t, func() bool { return w.wakeSubjects(t) == 1 }, 30*time.Second, 5*time.Millisecond,
		"the cancelled job's subscription is closed")

	close(w.gates["a"])
	require.Equal(t, "c", w.next(t, "c woken by a's release"))
	w.waitingIs(t, 0)
	require.Eventually(t, func() bool { return w.wakeSubjects(t) == 0 }, 30*time.Second, 5*time.Millisecond,
		"the started job's subscription is closed")
}
