package jobs

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jobkeys/jobkeys"
	"github.com/jobkeys/jobkeys/internal/natstest"
)

// periodicClock is the clock of a periodic test's clients: it moves only
// when told.
type periodicClock struct{ ns atomic.Int64 }

func (c *periodicClock) Now() time.Time      { return time.Unix(0, c.ns.Load()).UTC() }
func (c *periodicClock) Set(t time.Time)     { c.ns.Store(t.UnixNano()) }
func (c *periodicClock) Add(d time.Duration) { c.ns.Add(int64(d)) }

type periodicIn struct {
	Doc string `json:"doc"`
}

// periodicEnv is one test's buckets on one server; each client made from
// it is a process of its own (its own connection and stores).
type periodicEnv struct {
	t       *testing.T
	srv     *server.Server
	bucket  string
	service string
	clock   *periodicClock
}

func newPeriodicEnv(t *testing.T, start time.Time) *periodicEnv {
	n := natsBucketSeq.Add(1)
	e := &periodicEnv{t: t, srv: natstest.Run(t), bucket: fmt.Sprintf("JOBS_P%d", n), service: fmt.Sprintf("per%d", n), clock: &periodicClock{}}
	e.clock.Set(start)
	return e
}

// client makes a started client with the schedules, stopped when the
// test ends (or by the caller).
func (e *periodicEnv) client(periodic []Periodic) *Client {
	e.t.Helper()
	_, js := natstest.Connect(e.t, e.srv)
	st, err := NewNATSStore(js, &Config{Now: e.clock.Now}, WithBucket(e.bucket), WithCreateBucket(jetstream.MemoryStorage, 1))
	require.NoError(e.t, err)
	ks, err := jobkeys.NewNATSStore(js, jobkeys.WithCreateBuckets(jetstream.MemoryStorage, 1))
	require.NoError(e.t, err)
	coord, err := jobkeys.NewCoordinator(ks, &jobkeys.Config{Now: e.clock.Now})
	require.NoError(e.t, err)
	c, err := NewClient(st, coord, &ClientConfig{KeyStore: ks, Service: e.service, JetStream: js, Now: e.clock.Now, Periodic: periodic})
	require.NoError(e.t, err)
	require.NoError(e.t, Register(c, Kind[periodicIn, struct{}]{Type: "report",
		Policy: jobkeys.Policy{Key: []string{"doc", "/doc"}, MaxActive: 1, MaxQueuedPerKey: 100},
		Work:   func(context.Context, *Run, periodicIn) (struct{}, error) { return struct{}{}, nil }}))
	require.NoError(e.t, c.Start(context.Background()))
	e.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		assert.NoError(e.t, c.Stop(ctx))
	})
	return c
}

// latest is the latest tick of schedule name this runner enqueued (or
// found enqueued).
func (r *periodicRunner) latest(name string) time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.done[name]
}

// poke makes the runner look at the clock now.
func (r *periodicRunner) poke() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// awaitTick waits until each client's schedule name has enqueued tick
// (its own job or a replay of another client's): bounded by the work
// done, with a generous failure guard.
func awaitTick(t *testing.T, name string, tick time.Time, clients ...*Client) {
	t.Helper()
	for _, c := range clients {
		c.periodic.poke()
	}
	require.Eventually(t, func() bool {
		for _, c := range clients {
			if !c.periodic.latest(name).Equal(tick) {
				c.periodic.poke()
				return false
			}
		}
		return true
	}, 30*time.Second, 5*time.Millisecond, "tick %s of %q", tick, name)
}

// periodicJobs lists the ids of the periodic jobs of type "report".
func periodicJobs(t *testing.T, c *Client) []string {
	t.Helper()
	var ids []string
	var after *Cursor
	for {
		p, err := c.store.List(context.Background(), ListRequest{ChannelID: PeriodicChannel, Types: []string{"report"}, Limit: ListLimit, After: after})
		require.NoError(t, err)
		for _, s := range p.Jobs {
			assert.Equal(t, PeriodicOrigin, s.Origin)
			ids = append(ids, s.ID)
		}
		if p.Next == nil {
			return ids
		}
		after = p.Next
	}
}

// TestPeriodicOneJobPerTickAcrossClients: three clients with the same
// schedule, the clock moved through ten ticks: ten jobs, one per tick.
func TestPeriodicOneJobPerTickAcrossClients(t *testing.T) {
	t.Parallel()
	start := time.Now().UTC().Truncate(time.Minute)
	e := newPeriodicEnv(t, start)
	sched := []Periodic{{Name: "tick", Type: "report", Input: json.RawMessage(`{"doc":"d"}`), Every: time.Minute}}
	clients := []*Client{e.client(sched), e.client(sched), e.client(sched)}
	var want []string
	for k := range 10 {
		tick := start.Add(time.Duration(k) * time.Minute)
		e.clock.Set(tick.Add(time.Duration(k) * time.Second)) // anywhere within the tick
		awaitTick(t, "tick", tick, clients...)
		want = append([]string{periodicID("tick", tick)}, want...) // newest first
	}
	assert.Equal(t, want, periodicJobs(t, clients[0]), "one job per tick")
}

// TestPeriodicCatchUpAfterDowntime: a client stopped for five ticks and
// started again enqueues one job, for the latest tick, not one per missed
// tick; a client started again within a tick enqueues nothing new; running
// clients whose clock jumps ticks enqueue the latest only.
func TestPeriodicCatchUpAfterDowntime(t *testing.T) {
	t.Parallel()
	start := time.Now().UTC().Truncate(time.Minute)
	e := newPeriodicEnv(t, start)
	sched := []Periodic{{Name: "tick", Type: "report", Input: json.RawMessage(`{"doc":"d"}`), Every: time.Minute}}
	a := e.client(sched)
	awaitTick(t, "tick", start, a)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, a.Stop(ctx))

	e.clock.Set(start.Add(5*time.Minute + 30*time.Second)) // ticks 1 to 5 missed
	b := e.client(sched)
	awaitTick(t, "tick", start.Add(5*time.Minute), b)
	c := e.client(sched) // a restart within the same tick
	awaitTick(t, "tick", start.Add(5*time.Minute), c)
	assert.Equal(t, []string{periodicID("tick", start.Add(5*time.Minute)), periodicID("tick", start)}, periodicJobs(t, b),
		"one catch-up job for the five missed ticks")

	// Running clients whose clock jumps three ticks (a paused process):
	// one job, for the latest.
	e.clock.Set(start.Add(8*time.Minute + 10*time.Second))
	awaitTick(t, "tick", start.Add(8*time.Minute), b, c)
	assert.Equal(t, []string{periodicID("tick", start.Add(8*time.Minute)), periodicID("tick", start.Add(5*time.Minute)), periodicID("tick", start)},
		periodicJobs(t, b), "one job for the three ticks a jump skipped")
}

// TestPeriodicCron: a cron schedule's ticks are its matching minutes.
func TestPeriodicCron(t *testing.T) {
	t.Parallel()
	start := time.Now().UTC().Truncate(time.Hour).Add(7 * time.Minute)
	e := newPeriodicEnv(t, start)
	c := e.client([]Periodic{{Name: "quarter", Type: "report", Input: json.RawMessage(`{"doc":"q"}`), Cron: "*/15 * * * *"}})
	awaitTick(t, "quarter", start.Add(-7*time.Minute), c) // the latest tick at start: hh:00
	e.clock.Set(start.Add(10 * time.Minute))
	awaitTick(t, "quarter", start.Add(8*time.Minute), c) // hh:15
	assert.Equal(t, []string{periodicID("quarter", start.Add(8*time.Minute)), periodicID("quarter", start.Add(-7*time.Minute))}, periodicJobs(t, c))
}

// TestPeriodicRefusedAtStart: a schedule with a bad cron, both or neither
// of Every and Cron, an unknown type, a short Every, a bad or duplicate
// name, or an input the kind cannot decode is refused by Start, naming it.
func TestPeriodicRefusedAtStart(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		p    Periodic
		want string
	}{
		{Periodic{Name: "a", Type: "report", Cron: "61 * * * *"}, "minute field"},
		{Periodic{Name: "a", Type: "report", Cron: "* * *"}, "3 fields"},
		{Periodic{Name: "a", Type: "report", Cron: "0 0 30 2 *"}, "never matches"},
		{Periodic{Name: "a", Type: "report", Cron: "0 3 * * *", Every: time.Hour}, "both Every and Cron"},
		{Periodic{Name: "a", Type: "report"}, "neither Every nor Cron"},
		{Periodic{Name: "a", Type: "nope", Every: time.Hour}, `Type "nope" is not a registered kind`},
		{Periodic{Name: "a", Type: "report", Every: time.Millisecond}, "Every 1ms is under 1s"},
		{Periodic{Name: "", Type: "report", Every: time.Hour}, "Name must be"},
		{Periodic{Name: "a.b", Type: "report", Every: time.Hour}, "Name must be"},
		{Periodic{Name: "a", Type: "report", Every: time.Hour, Input: json.RawMessage(`{`)}, "not valid JSON"},
		{Periodic{Name: "a", Type: "report", Every: time.Hour, Input: json.RawMessage(`[1]`)}, "does not decode"},
	} {
		t.Run(tc.want, func(t *testing.T) {
			c := newMemoryPeriodicClient(t, []Periodic{tc.p})
			err := c.Start(context.Background())
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
			assert.Contains(t, err.Error(), "ClientConfig.Periodic[0]")
		})
	}
	c := newMemoryPeriodicClient(t, []Periodic{{Name: "a", Type: "report", Every: time.Hour}, {Name: "a", Type: "report", Every: time.Hour}})
	err := c.Start(context.Background())
	require.Error(t, err)
	assert.True(t, strings.Contains(err.Error(), "ClientConfig.Periodic[1]") && strings.Contains(err.Error(), "used by another"), err.Error())
}

func newMemoryPeriodicClient(t *testing.T, periodic []Periodic) *Client {
	t.Helper()
	st, err := NewMemoryStore(nil)
	require.NoError(t, err)
	keys := jobkeys.NewMemoryStore()
	coord, err := jobkeys.NewCoordinator(keys, nil)
	require.NoError(t, err)
	c, err := NewClient(st, coord, &ClientConfig{KeyStore: keys, Periodic: periodic})
	require.NoError(t, err)
	require.NoError(t, Register(c, Kind[periodicIn, struct{}]{Type: "report",
		Policy: jobkeys.Policy{Key: []string{"doc", "/doc"}, MaxActive: 1},
		Work:   func(context.Context, *Run, periodicIn) (struct{}, error) { return struct{}{}, nil }}))
	t.Cleanup(func() { _ = c.Stop(context.Background()) })
	return c
}
