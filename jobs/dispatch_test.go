package jobs

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jobkeys/jobkeys/internal/natstest"
)

// dispatchers returns each kind of dispatcher, fresh, for one test: the
// in-process one and one over a NATSStore's dispatch stream on an embedded
// server.
func dispatchers(t *testing.T) map[string]func(t *testing.T) dispatcher {
	return map[string]func(t *testing.T) dispatcher{
		"memory": func(t *testing.T) dispatcher {
			d := newMemDispatcher()
			t.Cleanup(d.close)
			return d
		},
		"nats": func(t *testing.T) dispatcher {
			s := natstest.Run(t)
			_, js := natstest.Connect(t, s)
			d, err := newNATSDispatcher(context.Background(), js, fmt.Sprintf("d%d", natsBucketSeq.Add(1)), jetstream.MemoryStorage, 1)
			require.NoError(t, err)
			require.NoError(t, d.consume(context.Background(), time.Minute))
			t.Cleanup(d.close)
			return d
		},
	}
}

// nextWithin takes the next delivery, failing the test after a generous
// bound (the bound fails a test that would hang; it asserts no speed).
func nextWithin(t *testing.T, d dispatcher) delivery {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	m, err := d.next(ctx, laneReady)
	require.NoError(t, err)
	return m
}

// requireEmpty asserts that nothing is delivered while a marker announced
// after the calls under test comes through: what was announced before the
// marker and not dropped would come first (deliveries are FIFO).
func requireEmpty(t *testing.T, d dispatcher, typ string) {
	t.Helper()
	marker := jobRef{"marker", fmt.Sprint(time.Now().UnixNano())}
	require.NoError(t, d.announce(context.Background(), laneReady, typ, marker, time.Time{}, ""))
	m := nextWithin(t, d)
	assert.Equal(t, marker, m.job(), "a delivery came before the marker")
	m.done()
}

func TestDispatcherDeliversInOrderOnce(t *testing.T) {
	t.Parallel()
	for name, mk := range dispatchers(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			d := mk(t)
			ctx := context.Background()
			for i := range 5 {
				require.NoError(t, d.announce(ctx, laneReady, "render", jobRef{"c", fmt.Sprint(i)}, time.Time{}, ""))
			}
			for i := range 5 {
				m := nextWithin(t, d)
				assert.Equal(t, "render", m.jobType())
				assert.Equal(t, jobRef{"c", fmt.Sprint(i)}, m.job())
				m.done()
			}
			requireEmpty(t, d, "render")
		})
	}
}

func TestDispatcherDropsRepeatedID(t *testing.T) {
	t.Parallel()
	for name, mk := range dispatchers(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			d := mk(t)
			ctx := context.Background()
			require.NoError(t, d.announce(ctx, laneReady, "render", jobRef{"c", "a"}, time.Time{}, "a@1"))
			require.NoError(t, d.announce(ctx, laneReady, "render", jobRef{"c", "a"}, time.Time{}, "a@1"))
			require.NoError(t, d.announce(ctx, laneReady, "render", jobRef{"c", "a"}, time.Time{}, "a@2"))
			for range 2 {
				m := nextWithin(t, d)
				assert.Equal(t, jobRef{"c", "a"}, m.job())
				m.done()
			}
			requireEmpty(t, d, "render")
		})
	}
}

func TestDispatcherHandsBackLater(t *testing.T) {
	t.Parallel()
	for name, mk := range dispatchers(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			d := mk(t)
			require.NoError(t, d.announce(context.Background(), laneReady, "render", jobRef{"c", "a"}, time.Time{}, ""))
			m := nextWithin(t, d)
			m.later(0)
			again := nextWithin(t, d)
			assert.Equal(t, jobRef{"c", "a"}, again.job())
			again.later(300 * time.Millisecond)
			again = nextWithin(t, d)
			assert.Equal(t, jobRef{"c", "a"}, again.job())
			again.done()
			requireEmpty(t, d, "render")
		})
	}
}

// An announcement for later is not delivered before an announcement for
// now made after it, and is delivered once due: in the process for a short
// delay, by the server's message schedule for a long one.
func TestDispatcherDueTimes(t *testing.T) {
	t.Parallel()
	for name, mk := range dispatchers(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			d := mk(t)
			ctx := context.Background()
			start := time.Now()
			require.NoError(t, d.announce(ctx, laneReady, "render", jobRef{"c", "long"}, start.Add(dispatchScheduleMin+500*time.Millisecond), ""))
			require.NoError(t, d.announce(ctx, laneReady, "render", jobRef{"c", "short"}, start.Add(200*time.Millisecond), ""))
			require.NoError(t, d.announce(ctx, laneReady, "render", jobRef{"c", "now"}, time.Time{}, ""))
			for _, want := range []string{"now", "short", "long"} {
				m := nextWithin(t, d)
				assert.Equal(t, want, m.job().id)
				m.done()
			}
			assert.False(t, time.Now().Before(start.Add(dispatchScheduleMin+500*time.Millisecond)), "the long announcement came before its time")
			requireEmpty(t, d, "render")
		})
	}
}

// Anything published on a ready subject reaches a worker only as a job
// reference: what does not decode is dropped, not delivered.
func TestNATSDispatcherDropsWhatIsNoAnnouncement(t *testing.T) {
	t.Parallel()
	s := natstest.Run(t)
	nc, js := natstest.Connect(t, s)
	d, err := newNATSDispatcher(context.Background(), js, fmt.Sprintf("d%d", natsBucketSeq.Add(1)), jetstream.MemoryStorage, 1)
	require.NoError(t, err)
	require.NoError(t, d.consume(context.Background(), time.Minute))
	t.Cleanup(d.close)
	for _, body := range []string{"", "{", `{"c":"x"}`, `{"c":"","j":"a"}`, `[1,2]`} {
		_, err := js.PublishMsg(context.Background(), &nats.Msg{Subject: d.subject(laneReady, "render"), Data: []byte(body)})
		require.NoError(t, err)
	}
	_, err = js.Publish(context.Background(), d.prefix+"ready.render.extra", []byte(`{"c":"c","j":"a"}`))
	require.NoError(t, err)
	_ = nc
	requireEmpty(t, d, "render")
}

// A check goes to the checkers' lane, never to the workers', and is kept
// by the server however short its delay: the process that announced it
// may be gone when it is due (that is what checks are for).
func TestNATSDispatcherChecksOutliveTheirAnnouncer(t *testing.T) {
	t.Parallel()
	s := natstest.Run(t)
	_, js := natstest.Connect(t, s)
	service := fmt.Sprintf("d%d", natsBucketSeq.Add(1))
	announcer, err := newNATSDispatcher(context.Background(), js, service, jetstream.MemoryStorage, 1)
	require.NoError(t, err)
	require.NoError(t, announcer.announce(context.Background(), laneCheck, "render", jobRef{"c", "orphan"}, time.Now().Add(300*time.Millisecond), ""))
	announcer.close() // the producer dies
	_, js2 := natstest.Connect(t, s)
	d, err := newNATSDispatcher(context.Background(), js2, service, jetstream.MemoryStorage, 1)
	require.NoError(t, err)
	require.NoError(t, d.consume(context.Background(), time.Minute))
	t.Cleanup(d.close)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	m, err := d.next(ctx, laneCheck)
	require.NoError(t, err)
	assert.Equal(t, jobRef{"c", "orphan"}, m.job())
	m.done()
	requireEmpty(t, d, "render") // nothing reached the workers' lane
}
