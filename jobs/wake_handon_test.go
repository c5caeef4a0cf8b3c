package jobs

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
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

// handOnClient is a client over key stores with wake-ups on its own
// connection, whose jobs run until their gates close. The clients of one
// test share the key layer (the service and its KV bucket) but each has
// a job store (bucket) of its own: a job is enqueued in the client that
// must claim it, so that the test knows which process waits for what.
// Reconciliation is off: it would take the other clients' queue entries
// for entries of jobs that do not exist.
type handOnClient struct {
	c       *Client
	mu      sync.Mutex
	gates   map[string]chan struct{}
	started chan string
}

func newHandOnClient(t *testing.T, srv *server.Server, service string, workers int) *handOnClient {
	t.Helper()
	return newHandOnClientConf(t, srv, service, handOnConfig{workers: workers})
}

// handOnConfig is what newHandOnClientConf sets beyond newHandOnClient's
// kind, policy and intervals.
type handOnConfig struct {
	workers, maxWaiting int               // MaxWorkers, MaxWaiting (0: the default)
	wrap                func(Store) Store // the job store the client uses, over the NATS one; nil: that one
	logger              *slog.Logger      // nil: none
	keyNow              func() time.Time  // the key coordinator's clock; nil: time.Now
}

// newHandOnClientConf is newHandOnClient with cfg.
func newHandOnClientConf(t *testing.T, srv *server.Server, service string, cfg handOnConfig) *handOnClient {
	t.Helper()
	_, js := natstest.Connect(t, srv)
	nst, err := NewNATSStore(js, nil, WithBucket(fmt.Sprintf("JOBS_HO%d", natsBucketSeq.Add(1))), WithCreateBucket(jetstream.MemoryStorage, 1))
	require.NoError(t, err)
	var st Store = nst
	if cfg.wrap != nil {
		st = cfg.wrap(nst)
	}
	keys, err := jobkeys.NewNATSStore(js, jobkeys.WithCreateBuckets(jetstream.MemoryStorage, 1), jobkeys.WithWakeUps(""))
	require.NoError(t, err)
	coord, err := jobkeys.NewCoordinator(keys, &jobkeys.Config{Now: cfg.keyNow})
	require.NoError(t, err)
	h := &handOnClient{gates: map[string]chan struct{}{}, started: make(chan string, 8)}
	// The recheck is a minute away: only a wake-up starts a waiting job
	// in time.
	h.c, err = NewClient(st, coord, &ClientConfig{KeyStore: keys, Service: service, MaxWorkers: cfg.workers, MaxWaiting: cfg.maxWaiting,
		Logger: cfg.logger, PollInterval: 20 * time.Millisecond, RecheckInterval: time.Minute, ReconcileInterval: -1, StopGrace: 2 * time.Second})
	require.NoError(t, err)
	t.Cleanup(func() {
		h.mu.Lock()
		for id, g := range h.gates {
			close(g)
			delete(h.gates, id)
		}
		h.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		assert.NoError(t, h.c.Stop(ctx))
	})
	// Claims and leases last two minutes; a running job heartbeats every
	// 50 ms (heartbeats of a full key wake nobody).
	p := jobkeys.Policy{Key: []string{"/doc"}, MaxActive: 1, MaxQueuedPerKey: 5,
		HeartbeatInterval: 50 * time.Millisecond, HeartbeatTTL: 2 * time.Minute}
	require.NoError(t, Register(h.c, Kind[json.RawMessage, string]{Type: "w", Policy: p,
		Work: func(ctx context.Context, run *Run, in json.RawMessage) (string, error) {
			h.started <- run.Job().ID
			h.mu.Lock()
			g := h.gates[run.Job().ID]
			h.mu.Unlock()
			if g != nil {
				select {
				case <-g:
				case <-ctx.Done():
				}
			}
			return "", nil
		}}))
	return h
}

// enqueue enqueues job id on key doc, to run until open(id) when gated.
func (h *handOnClient) enqueue(t *testing.T, id, target, doc string, gated bool) {
	t.Helper()
	if gated {
		h.mu.Lock()
		h.gates[id] = make(chan struct{})
		h.mu.Unlock()
	}
	_, err := h.c.Enqueue(context.Background(), EnqueueRequest{ID: id, ChannelID: "ch", Type: "w", TargetKey: target,
		IdempotencyKey: id, Fingerprint: id, Input: json.RawMessage(fmt.Sprintf(`{"doc":%q}`, doc))})
	require.NoError(t, err)
}

func (h *handOnClient) open(id string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if g := h.gates[id]; g != nil {
		close(g)
		delete(h.gates, id)
	}
}

func (h *handOnClient) next(t *testing.T, within time.Duration, what string) string {
	t.Helper()
	select {
	case id := <-h.started:
		return id
	case <-time.After(within):
		t.Fatalf("no job started within %v: %s", within, what)
		return ""
	}
}

func (h *handOnClient) waitingIs(t *testing.T, n int, what string) {
	t.Helper()
	require.Eventually(t, func() bool {
		h.c.mu.Lock()
		defer h.c.mu.Unlock()
		return h.c.waiting == n
	}, 30*time.Second, 5*time.Millisecond, what)
}

// wokenWaitingForToken sets the scene of the hand-on tests: h (gated)
// holds key d in c2; a waits for d in c1; x, on another key, takes c1's
// only worker token; with behind, b waits for d in c2, queued behind a;
// then h ends, and a, woken by its release, waits for a worker token.
// gateA gates a's handler too.
func wokenWaitingForToken(t *testing.T, c1, c2 *handOnClient, gateA, behind bool) {
	t.Helper()
	ctx := context.Background()
	c2.enqueue(t, "h", "h", "d", true)
	require.NoError(t, c2.c.Start(ctx))
	require.Equal(t, "h", c2.next(t, 30*time.Second, "h"))
	c1.enqueue(t, "a", "a", "d", gateA)
	require.NoError(t, c1.c.Start(ctx))
	c1.waitingIs(t, 1, "a waits for d in client 1")
	c1.enqueue(t, "x", "x", "other", true)
	require.Equal(t, "x", c1.next(t, 30*time.Second, "x takes client 1's only worker token"))
	if behind {
		c2.enqueue(t, "b", "b", "d", false)
		c2.waitingIs(t, 1, "b waits for d in client 2, queued behind a")
	}
	c2.open("h")
	c1.waitingIs(t, 0, "a, woken by h's release, waits for a worker token")
}

// TestClientWokenJobThatLeavesHandsItsWakeUpOn is the regression test for
// a jobs-runtime job that, woken for a freed slot, left without acquiring
// it: the writer woke as many jobs as it freed slots, the woken job took
// the wake-up and did not act on it, and the job queued behind it, in
// another process, waited for its recheck (a minute here). Job a waits
// in client 1 for key d, held by h in client 2, with b queued behind it
// in client 2; client 1's only worker token is busy with x (another key),
// so that a, woken by h's release, waits for a token, and leaves while it
// does: paused, cancelled, superseded by a newer job of its target, or
// its client stopping. b must start long before its recheck. (A
// cancellation takes a's entry out of the queue, which wakes b; the
// others leave the entry queued.)
func TestClientWokenJobThatLeavesHandsItsWakeUpOn(t *testing.T) {
	t.Parallel()
	for _, leave := range []string{"pause", "cancel", "supersede", "stop"} {
		t.Run(leave, func(t *testing.T) {
			t.Parallel()
			srv := natstest.Run(t)
			service := fmt.Sprintf("ho%d", natsBucketSeq.Add(1))
			c1 := newHandOnClient(t, srv, service, 1)
			c2 := newHandOnClient(t, srv, service, 4)
			ctx := context.Background()

			wokenWaitingForToken(t, c1, c2, false, true)
			switch leave {
			case "pause":
				d, err := c1.c.Get(ctx, "ch", "a")
				require.NoError(t, err)
				_, err = c1.c.Pause(ctx, PauseRequest{ChannelID: "ch", JobID: "a", ExpectedRevision: d.Job.Revision})
				require.NoError(t, err)
			case "cancel":
				_, err := c1.c.Cancel(ctx, CancelRequest{ChannelID: "ch", JobID: "a"})
				require.NoError(t, err)
			case "supersede":
				// A newer job of a's target; it queues behind b.
				c1.enqueue(t, "a2", "a", "d", false)
			case "stop":
				sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
				defer cancel()
				require.NoError(t, c1.c.Stop(sctx))
			}
			// Long before b's recheck (a minute): only a wake-up starts it.
			assert.Equal(t, "b", c2.next(t, 20*time.Second, "b woken after a left"))
			select {
			case id := <-c1.started:
				t.Fatalf("job %s started in client 1", id)
			default:
			}
		})
	}
}

// TestClientFirstTryKeepsTheQueueOrder is the regression test for the
// jobs runtime's tries, which did not keep the queue's order over
// wake-ups: a job claimed while a slot was free took it, although a job
// queued ahead of it in another process had been woken for it. Job a
// waits in client 1 for key d, held by h in client 2; client 1's only
// worker token is busy with x, so that a, woken by h's release, waits for
// a token; n, enqueued in client 2 then, is queued behind a and finds the
// slot free: its first try is blocked in turn (jobkeys.WithQueueTurn),
// and it starts after a, woken by a's release.
func TestClientFirstTryKeepsTheQueueOrder(t *testing.T) {
	t.Parallel()
	srv := natstest.Run(t)
	service := fmt.Sprintf("ho%d", natsBucketSeq.Add(1))
	c1 := newHandOnClient(t, srv, service, 1)
	c2 := newHandOnClient(t, srv, service, 4)

	wokenWaitingForToken(t, c1, c2, true, false)

	c2.enqueue(t, "n", "n", "d", true)
	require.Eventually(t, func() bool {
		c2.c.mu.Lock()
		defer c2.c.mu.Unlock()
		return c2.c.waiting == 1 || len(c2.started) > 0
	}, 30*time.Second, time.Millisecond, "n waits, or starts")
	select {
	case id := <-c2.started:
		t.Fatalf("%s took the slot freed for a, queued ahead of it", id)
	default:
	}
	// n tries anyway a second after it was blocked in turn: a gets its
	// token at once.
	c1.open("x")
	require.Equal(t, "a", c1.next(t, 30*time.Second, "a takes the slot h's release freed for it"))
	c1.open("a")
	assert.Equal(t, "n", c2.next(t, 30*time.Second, "n, woken by a's release"))
}

// stallingStore is a job store whose hand-backs of a stopping client
// ("client-stopping") wait until release is closed (or their ctx ends),
// as over a connection that is down; handingBack is closed at the first.
type stallingStore struct {
	Store
	once        sync.Once
	handingBack chan struct{}
	release     chan struct{}
}

func (s *stallingStore) Requeue(ctx context.Context, req RequeueRequest) (Job, error) {
	if req.Reason == "client-stopping" {
		s.once.Do(func() { close(s.handingBack) })
		select {
		case <-s.release:
		case <-ctx.Done():
			return Job{}, ctx.Err()
		}
	}
	return s.Store.Requeue(ctx, req)
}

// TestClientStoppingHandsItsWakeUpOnWhileItHandsTheJobBack is the
// regression test for a stopping client's hand-on of a wake-up, which
// waited for the job's hand-back: over a connection that is down, each
// waits for its timeout (5s), and Stop took both, one after the other
// (10s, against 5s before the hand-on). Job a waits in client 1 for key d,
// held by h in client 2, with b queued behind it in client 2; a, woken by
// h's release, waits for client 1's only worker token (held by x) when
// client 1 stops. a's hand-back hangs until the test ends it: b must start
// meanwhile, woken by a's hand-on.
func TestClientStoppingHandsItsWakeUpOnWhileItHandsTheJobBack(t *testing.T) {
	t.Parallel()
	srv := natstest.Run(t)
	service := fmt.Sprintf("ho%d", natsBucketSeq.Add(1))
	stall := &stallingStore{handingBack: make(chan struct{}), release: make(chan struct{})}
	var releaseOnce sync.Once
	release := func() { releaseOnce.Do(func() { close(stall.release) }) }
	c1 := newHandOnClientConf(t, srv, service, handOnConfig{workers: 1, wrap: func(st Store) Store { stall.Store = st; return stall }})
	c2 := newHandOnClient(t, srv, service, 4)
	t.Cleanup(release) // before the clients' Stop (cleanups run last first)
	ctx := context.Background()

	wokenWaitingForToken(t, c1, c2, false, true)

	stopped := make(chan error, 1)
	go func() {
		sctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		stopped <- c1.c.Stop(sctx)
	}()
	select {
	case <-stall.handingBack:
	case <-time.After(30 * time.Second):
		t.Fatal("client 1 did not hand a back")
	}
	// Long before b's recheck (a minute), while a's hand-back hangs.
	assert.Equal(t, "b", c2.next(t, 20*time.Second, "b woken by a's hand-on while a's hand-back hangs"))
	release()
	c1.open("x")
	require.NoError(t, <-stopped)
}
