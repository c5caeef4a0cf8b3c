package jobkeys

// The fixtures of the wake-up tests, one per concern:
//
//   - wakeProc: one worker process. Its own connection, a NATSStore with
//     targeted wake-ups, a coordinator, a job type, a Watcher and a Runner;
//     wakeProcConfig says what differs (no wake-ups, a bucket the test
//     made, the coordinator's Config or store wrapper, uncounted, the
//     recheck).
//   - natsWakeFixture: a server and a key of a service of its own, for the
//     tests of the store's wake-ups themselves (publish, subscribe,
//     confirm) that run below any coordinator.
//   - jobWakeFixture: that key between two wakeProcs, a writer (a) and a
//     waiter (b), whose tests drive the coordinators by hand.
//
// Kept apart, being different: the forgery tests' forgeScene (a server
// with users and permissions, a forger's connection, a ledger of the
// handlers; its processes are wakeProcs), the soak's wakeSoak (a load
// generator; its connections are wakeProcs), the liveness test's
// processes (package jobkeys_test, crashed and restarted: made by hand,
// without testing.T), the benchmarks' processes (bench_test.go,
// bench_procs_test.go: child processes and measured paths), watch_wake's
// wakeFixture (one coordinator and its Watcher on a memory or NATS store,
// no wake-ups) and acquire_undo's undoFixture (a lost write's undo, no
// wake-ups).

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jobkeys/jobkeys/internal/natstest"
)

// wakeProc is one process of the wake-up tests: its own connection, a
// store with targeted wake-ups (or without), a coordinator writing through
// a countingStore (or straight to the store), a job type, a Watcher over
// the store and a Runner.
type wakeProc struct {
	store *NATSStore
	nc    *nats.Conn  // the process's connection; nil when the test gave one
	ops   *raceTotals // the coordinator's reads and writes; nil when uncounted
	c     *KeyCoordinator
	jt    *JobType
	w     *Watcher
	r     *Runner
	// blocked receives the job ID of each Run that starts to wait
	// (RunnerConfig.OnBlocked: after its tries, including the read of a
	// state seen too long ago), up to 64 unread; more are dropped.
	blocked chan string
}

// wakeProcConfig is what differs between the processes of the wake-up
// tests. The zero value is a process on a connection of its own whose
// store creates missing buckets (in memory, one replica) and carries
// wake-ups, whose coordinator (default Config) writes through a
// countingStore, with a job type benchJobType and a Runner that rechecks
// every hour.
type wakeProcConfig struct {
	// js is the process's connection; nil: a new one to the server.
	js jetstream.JetStream
	// jobType is the job type's name; "": benchJobType.
	jobType string
	// noWakes: the store carries no wake-ups.
	noWakes bool
	// noCreate: the store creates no bucket (the test made it, or another
	// process will).
	noCreate bool
	// uncounted: the coordinator writes to the store itself, not through a
	// countingStore (which hides the store's clock); ops is nil.
	uncounted bool
	// wrap, when set, wraps the store the coordinator writes through
	// (after the countingStore, if any).
	wrap func(Store) Store
	// coord is the coordinator's Config; nil: the defaults.
	coord *Config
	// recheck is the Runner's RecheckInterval; 0: an hour.
	recheck time.Duration
}

// newWakeProc returns a process of cfg on server s (unless cfg.js is set)
// whose job type of service has policy.
func newWakeProc(t *testing.T, s *server.Server, service string, policy Policy, cfg wakeProcConfig) *wakeProc {
	t.Helper()
	p := &wakeProc{blocked: make(chan string, 64)}
	js := cfg.js
	if js == nil {
		p.nc, js = natstest.Connect(t, s)
	}
	var opts []NATSStoreOption
	if !cfg.noCreate {
		opts = append(opts, WithCreateBuckets(jetstream.MemoryStorage, 1))
	}
	if !cfg.noWakes {
		opts = append(opts, WithWakeUps(""))
	}
	var err error
	p.store, err = NewNATSStore(js, opts...)
	require.NoError(t, err)
	var st Store = p.store
	if !cfg.uncounted {
		cs := newCountingStore(p.store)
		st, p.ops = cs, cs.totals
	}
	if cfg.wrap != nil {
		st = cfg.wrap(st)
	}
	p.c, err = NewCoordinator(st, cfg.coord)
	require.NoError(t, err)
	if cfg.wrap == nil {
		require.Equal(t, !cfg.noWakes, p.c.wakes != nil, "the coordinator sees the store's wake-ups")
	}
	jobType := cfg.jobType
	if jobType == "" {
		jobType = benchJobType
	}
	p.jt, err = p.c.JobType(service, jobType, policy)
	require.NoError(t, err)
	p.w, err = NewWatcher(p.store)
	require.NoError(t, err)
	t.Cleanup(p.w.Close)
	recheck := cfg.recheck
	if recheck == 0 {
		recheck = time.Hour
	}
	p.r, err = NewRunner(p.jt, &RunnerConfig{Watcher: p.w, RecheckInterval: recheck, OnBlocked: func(jobID string, _ Acquisition) {
		select {
		case p.blocked <- jobID:
		default:
		}
	}})
	require.NoError(t, err)
	return p
}

// holdSlot runs job id through p's Runner and returns once its handler
// holds the slot; release makes the handler return and waits for the Run
// to end with no error.
func (p *wakeProc) holdSlot(t *testing.T, ctx context.Context, id string) (release func()) {
	t.Helper()
	unblock := make(chan struct{})
	held, done := p.runAsync(t, ctx, id, unblock)
	select {
	case <-held:
	case <-ctx.Done():
		t.Fatalf("%s never got the slot", id)
	}
	return func() {
		t.Helper()
		close(unblock)
		require.NoError(t, <-done)
	}
}

// awaitRun waits until a runAsync's handler ran (held) and its Run
// returned with no error; what says what failed if the handler did not
// run before ctx ended.
func awaitRun(t *testing.T, ctx context.Context, held chan struct{}, done chan error, what string) {
	t.Helper()
	select {
	case <-held:
	case <-ctx.Done():
		t.Fatal(what)
	}
	require.NoError(t, <-done)
}

// released returns a closed channel: a runAsync handler that returns at
// once.
func released() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}

// waitBlocked waits until p's Runs of jobs ids (in any order) start to
// wait.
func (p *wakeProc) waitBlocked(t *testing.T, ctx context.Context, ids ...string) {
	t.Helper()
	var got []string
	for range ids {
		select {
		case id := <-p.blocked:
			got = append(got, id)
		case <-ctx.Done():
			t.Fatalf("the Runs of %v did not all start to wait: only %v did", ids, got)
		}
	}
	require.ElementsMatch(t, ids, got, "the Runs that started to wait")
}

// runAsync admits job id and runs it through p's Runner in a goroutine,
// holding the slot until release is closed; acquired is closed once the
// handler runs, and the Run's error (or nil) is sent on done.
func (p *wakeProc) runAsync(t *testing.T, ctx context.Context, id string, release <-chan struct{}) (acquired chan struct{}, done chan error) {
	t.Helper()
	payload := benchPayload(0)
	adm, err := p.jt.Admit(ctx, id, payload)
	require.NoError(t, err)
	require.Equal(t, KindAccepted, adm.Kind, "admit %s", id)
	acquired, done = make(chan struct{}), make(chan error, 1)
	go func() {
		_, err := p.r.Run(ctx, id, payload, func(context.Context, Lease) error {
			close(acquired)
			select {
			case <-release:
			case <-ctx.Done():
			}
			return nil
		})
		done <- err
	}()
	return acquired, done
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
	key, err := DeriveKey(svc, "render", jobWakePayload, jobWakePolicy.Key)
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

// jobWakeFixture is the natsWakeFixture's key between two processes
// (wakeProc, job type "render", coordinators straight over their stores):
// a writer (a), whose store creates the bucket, and a waiter (b).
type jobWakeFixture struct {
	*natsWakeFixture
	pa, pb   *wakeProc
	a, b     *NATSStore
	ncA      *nats.Conn // a's connection
	jta, jtb *JobType
	wb       *Watcher // over b
}

// jobWakePayload is the payload of the jobWakeFixture's jobs: its key.
var jobWakePayload = []byte(`{"t":"acme"}`)

// jobWakePolicy is the jobWakeFixture's default policy.
var jobWakePolicy = Policy{Key: []string{"/t"}, MaxActive: 1, MaxQueuedPerKey: 5}

// newJobWakeFixture returns a jobWakeFixture with jobWakePolicy and
// default processes.
func newJobWakeFixture(t *testing.T) *jobWakeFixture {
	t.Helper()
	return newJobWakeFixtureWith(t, jobWakePolicy, wakeProcConfig{}, wakeProcConfig{})
}

// newJobWakeFixtureWith returns a jobWakeFixture whose job types have
// policy p and whose processes differ from the default as a and b say
// (their job type, connections, counting and bucket creation are the
// fixture's).
func newJobWakeFixtureWith(t *testing.T, p Policy, a, b wakeProcConfig) *jobWakeFixture {
	t.Helper()
	f := &jobWakeFixture{natsWakeFixture: newNATSWakeFixture(t)}
	a.jobType, a.uncounted, a.js, a.noCreate = "render", true, nil, false
	b.jobType, b.uncounted, b.js, b.noCreate = "render", true, nil, true
	f.pa = newWakeProc(t, f.srv, f.service, p, a)
	f.pb = newWakeProc(t, f.srv, f.service, p, b)
	f.a, f.ncA, f.jta = f.pa.store, f.pa.nc, f.pa.jt
	f.b, f.jtb, f.wb = f.pb.store, f.pb.jt, f.pb.w
	return f
}
