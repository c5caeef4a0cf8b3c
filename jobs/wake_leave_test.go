package jobs

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jobkeys/jobkeys"
	"github.com/jobkeys/jobkeys/internal/natstest"
)

// logHook is a slog handler that records every record's message and
// "job" and "err" attributes, and holds the goroutine that logs the
// holdAt-th "jobs: blocked" of job holdJob until release is called: held
// is closed then.
type logHook struct {
	holdJob string
	holdAt  int
	held    chan struct{}
	gate    chan struct{}
	once    sync.Once

	mu      sync.Mutex
	blocked int
	records []logRecord
}

type logRecord struct {
	msg, job string
	err      error
}

func newLogHook(holdJob string, holdAt int) *logHook {
	return &logHook{holdJob: holdJob, holdAt: holdAt, held: make(chan struct{}), gate: make(chan struct{})}
}

func (h *logHook) release() { h.once.Do(func() { close(h.gate) }) }

func (h *logHook) Enabled(context.Context, slog.Level) bool { return true }
func (h *logHook) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *logHook) WithGroup(string) slog.Handler            { return h }

func (h *logHook) Handle(_ context.Context, r slog.Record) error {
	rec := logRecord{msg: r.Message}
	r.Attrs(func(a slog.Attr) bool {
		switch a.Key {
		case "job":
			rec.job = a.Value.String()
		case "err":
			rec.err, _ = a.Value.Any().(error)
		}
		return true
	})
	h.mu.Lock()
	h.records = append(h.records, rec)
	hold := false
	if rec.msg == "jobs: blocked" && rec.job == h.holdJob {
		h.blocked++
		hold = h.blocked == h.holdAt
	}
	h.mu.Unlock()
	if hold {
		close(h.held)
		<-h.gate
	}
	return nil
}

// logged returns the records of message msg about job.
func (h *logHook) logged(msg, job string) []logRecord {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []logRecord
	for _, r := range h.records {
		if r.msg == msg && r.job == job {
			out = append(out, r)
		}
	}
	return out
}

// keyEmpty waits until no slot of key doc is held.
func keyEmpty(t *testing.T, h *handOnClient, doc, what string) {
	t.Helper()
	ctx := context.Background()
	k := h.c.kinds["w"]
	key, err := k.jt.Key([]byte(fmt.Sprintf(`{"doc":%q}`, doc)))
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		value, _, err := h.c.cfg.KeyStore.Get(ctx, h.c.cfg.Service, key.KVKey)
		if err != nil {
			return false
		}
		st, err := jobkeys.ParseState(value)
		return err == nil && len(st.Active) == 0
	}, 30*time.Second, 5*time.Millisecond, what)
}

// TestClientJobLeavingAFullWaitingListHandsItsWakeUpOn: a job waiting for
// its wake-ups that leaves because MaxWaiting is full hands on the wake-up
// it was sent meanwhile. Job a waits for its wake-ups in client 1
// (MaxWaiting 1) for key d, held by h in client 2; its try right after
// subscribing is blocked, and held there (by the logger) while b queues
// behind it in client 2, w takes client 1's only waiting place (key e,
// held by g in client 2), and h ends: h's release wakes a, and a alone.
// Then a goes on, finds the waiting list full, and is handed back
// ("key-full"): b must start long before its recheck (a minute).
func TestClientJobLeavingAFullWaitingListHandsItsWakeUpOn(t *testing.T) {
	t.Parallel()
	srv := natstest.Run(t)
	service := fmt.Sprintf("hl%d", natsBucketSeq.Add(1))
	hook := newLogHook("a", 2)
	c1 := newHandOnClientConf(t, srv, service, handOnConfig{workers: 2, maxWaiting: 1, logger: slog.New(hook)})
	c2 := newHandOnClient(t, srv, service, 4)
	t.Cleanup(hook.release) // before the clients' Stop (cleanups run last first)
	ctx := context.Background()

	c2.enqueue(t, "h", "h", "d", true)
	c2.enqueue(t, "g", "g", "e", true)
	require.NoError(t, c2.c.Start(ctx))
	started := map[string]bool{c2.next(t, 30*time.Second, "h or g"): true}
	started[c2.next(t, 30*time.Second, "g or h")] = true
	require.Equal(t, map[string]bool{"h": true, "g": true}, started)

	c1.enqueue(t, "a", "a", "d", false)
	require.NoError(t, c1.c.Start(ctx))
	select {
	case <-hook.held:
	case <-time.After(30 * time.Second):
		t.Fatal("a's try after subscribing was not blocked")
	}
	c2.enqueue(t, "b", "b", "d", false)
	c2.waitingIs(t, 1, "b waits for d in client 2, queued behind a")
	c1.enqueue(t, "w", "w", "e", false)
	c1.waitingIs(t, 1, "w waits for e in client 1: the waiting list is full")
	c2.open("h")
	keyEmpty(t, c2, "d", "h released d")
	// h's release wakes a (through the server): a margin for the wake-up
	// to reach a's subscription, not an assertion.
	time.Sleep(300 * time.Millisecond)
	hook.release()

	// Long before b's recheck (a minute): only a wake-up starts it.
	assert.Equal(t, "b", c2.next(t, 20*time.Second, "b woken after a left"))
	require.Eventually(t, func() bool {
		d, err := c1.c.Get(ctx, "ch", "a")
		return err == nil && d.Job.State == StatePending
	}, 30*time.Second, 5*time.Millisecond, "a handed back")
	select {
	case id := <-c1.started:
		t.Fatalf("job %s started in client 1", id)
	default:
	}
}

// TestClientWokenJobLeavingOnAKeyLayerErrorHandsItsWakeUpOn: a woken job
// whose try fails in the key layer hands its wake-up on. Job a waits in
// client 1 for key d, held by h in client 2, with b queued behind it in
// client 2; a, woken by h's release, waits for client 1's only worker
// token (held by x). Client 1's key coordinator's clock then jumps ten
// minutes ahead, so that a's try, once x ends, is refused
// (jobkeys.ErrClockSkew) and a is handed back ("key-unavailable"): b must
// start long before its recheck (a minute).
func TestClientWokenJobLeavingOnAKeyLayerErrorHandsItsWakeUpOn(t *testing.T) {
	t.Parallel()
	srv := natstest.Run(t)
	service := fmt.Sprintf("hl%d", natsBucketSeq.Add(1))
	var skewed atomic.Bool
	keyNow := func() time.Time {
		if skewed.Load() {
			return time.Now().Add(10 * time.Minute)
		}
		return time.Now()
	}
	hook := newLogHook("", 0)
	c1 := newHandOnClientConf(t, srv, service, handOnConfig{workers: 1, logger: slog.New(hook), keyNow: keyNow})
	c2 := newHandOnClient(t, srv, service, 4)

	wokenWaitingForToken(t, c1, c2, false, true)
	skewed.Store(true)
	c1.open("x")

	// Long before b's recheck (a minute): only a wake-up starts it.
	assert.Equal(t, "b", c2.next(t, 20*time.Second, "b woken after a left"))
	var refused bool
	for _, r := range hook.logged("jobs: acquire slot", "a") {
		refused = refused || errors.Is(r.err, jobkeys.ErrClockSkew)
	}
	assert.True(t, refused, "a's try was refused by the key layer: %v", hook.logged("jobs: acquire slot", "a"))
	select {
	case id := <-c1.started:
		t.Fatalf("job %s started in client 1", id)
	default:
	}
}
