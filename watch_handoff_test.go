package jobkeys

// Tests of the handoff inside a process (issue 11): a coordinator's
// committed write wakes the waiters of its process's Watchers at once,
// without waiting for the watch to deliver it (the echo); the echo then
// wakes nobody again and moves nothing backwards; waiters of other
// processes keep their wake-ups by the watch and their turns.
//
// The tests hold back the deliveries of one Watcher's watch: over a
// MemoryStore by gating the watch's hook in the store, over NATS by
// pausing a TCP proxy between the Watcher's connection and the server.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jobkeys/jobkeys/internal/natstest"
)

// heldWatcher is a Watcher whose watch deliveries the test can hold back
// (hold) and let through again, in order (release).
type heldWatcher struct {
	*Watcher
	hold, release func()
}

// handoffEnv is one store setting of the handoff tests.
type handoffEnv struct {
	// store is this process's store, for its coordinators.
	store Store
	// held returns a Watcher of this process over store whose deliveries
	// can be held, its watch of service started.
	held func(t *testing.T, service string) *heldWatcher
	// otherProcess returns the store and a Watcher of another process:
	// another connection to the same server, or the same MemoryStore.
	otherProcess func(t *testing.T) (Store, *Watcher)
}

func handoffEnvs() map[string]func(t *testing.T) *handoffEnv {
	return map[string]func(t *testing.T) *handoffEnv{
		"memory": func(t *testing.T) *handoffEnv {
			mem := NewMemoryStore()
			return &handoffEnv{
				store: mem,
				held: func(t *testing.T, service string) *heldWatcher {
					return heldMemoryWatcher(t, mem, service)
				},
				otherProcess: func(t *testing.T) (Store, *Watcher) {
					w, err := NewWatcher(mem)
					require.NoError(t, err)
					t.Cleanup(w.Close)
					return mem, w
				},
			}
		},
		"nats": func(t *testing.T) *handoffEnv {
			s := natstest.Run(t)
			open := func(t *testing.T, url string) *NATSStore {
				_, js := natstest.ConnectURL(t, url)
				store, err := NewNATSStore(js, WithCreateBuckets(jetstream.MemoryStorage, 1))
				require.NoError(t, err)
				return store
			}
			return &handoffEnv{
				store: open(t, s.ClientURL()),
				held: func(t *testing.T, service string) *heldWatcher {
					p := startPausableProxy(t, s.Addr().String())
					w, err := NewWatcher(open(t, p.url()))
					require.NoError(t, err)
					t.Cleanup(w.Close)
					return &heldWatcher{Watcher: w, hold: p.pause, release: p.resume}
				},
				otherProcess: func(t *testing.T) (Store, *Watcher) {
					store := open(t, s.ClientURL())
					w, err := NewWatcher(store)
					require.NoError(t, err)
					t.Cleanup(w.Close)
					return store, w
				},
			}
		},
	}
}

// heldMemoryWatcher starts a Watcher's watch of service over mem and
// gates the hook it registered in mem: while held, the changes mem
// reports to it are kept back, in order.
func heldMemoryWatcher(t *testing.T, mem *MemoryStore, service string) *heldWatcher {
	w, err := NewWatcher(mem)
	require.NoError(t, err)
	t.Cleanup(w.Close)
	mem.mu.Lock()
	before := make(map[*memoryWatcher]bool)
	for _, mw := range mem.watchers {
		before[mw] = true
	}
	mem.mu.Unlock()
	sub, err := w.Subscribe(context.Background(), service, service+".start.watch")
	require.NoError(t, err)
	sub.Close() // the service's watch goes on

	var mu sync.Mutex
	held := false
	var kept []func()
	mem.mu.Lock()
	gated := 0
	for _, mw := range mem.watchers {
		if before[mw] {
			continue
		}
		gated++
		fn := mw.fn
		mw.fn = func(key string, value []byte, rev uint64, deleted bool) { // called with mem.mu held
			mu.Lock()
			defer mu.Unlock()
			if held {
				v := bytes.Clone(value) // the writer's buffer
				kept = append(kept, func() { fn(key, v, rev, deleted) })
				return
			}
			fn(key, value, rev, deleted)
		}
	}
	mem.mu.Unlock()
	require.Equal(t, 1, gated, "the Watcher's watch hook")
	return &heldWatcher{
		Watcher: w,
		hold: func() {
			mu.Lock()
			held = true
			mu.Unlock()
		},
		release: func() {
			mu.Lock()
			defer mu.Unlock()
			held = false
			for _, f := range kept {
				f()
			}
			kept = nil
		},
	}
}

// pausableProxy forwards TCP connections to a server; while paused, it
// holds back what the server sends.
type pausableProxy struct {
	l      net.Listener
	target string
	mu     sync.Mutex
	cond   *sync.Cond
	paused bool
	closed bool
	conns  []net.Conn
	wg     sync.WaitGroup
}

func startPausableProxy(t *testing.T, target string) *pausableProxy {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &pausableProxy{l: l, target: target}
	p.cond = sync.NewCond(&p.mu)
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

func (p *pausableProxy) url() string { return "nats://" + p.l.Addr().String() }

func (p *pausableProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.l.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			c.Close()
			s.Close()
			return
		}
		p.conns = append(p.conns, c, s)
		p.wg.Add(2)
		p.mu.Unlock()
		go p.pipe(c, s, false)
		go p.pipe(s, c, true)
	}
}

// pipe copies from to to; held marks the server-to-client direction.
func (p *pausableProxy) pipe(from, to net.Conn, held bool) {
	defer p.wg.Done()
	defer to.Close()
	defer from.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := from.Read(buf)
		if n > 0 {
			if held {
				p.mu.Lock()
				for p.paused && !p.closed {
					p.cond.Wait()
				}
				p.mu.Unlock()
			}
			if _, err := to.Write(buf[:n]); err != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// pause holds back, from now on, what the server sends.
func (p *pausableProxy) pause() {
	p.mu.Lock()
	p.paused = true
	p.mu.Unlock()
}

// resume lets it through again.
func (p *pausableProxy) resume() {
	p.mu.Lock()
	p.paused = false
	p.cond.Broadcast()
	p.mu.Unlock()
}

func (p *pausableProxy) close() {
	p.mu.Lock()
	p.closed = true
	p.cond.Broadcast()
	conns := p.conns
	p.mu.Unlock()
	p.l.Close()
	for _, c := range conns {
		c.Close()
	}
	p.wg.Wait()
}

// handoffKey is one key with MaxActive 1 in a fresh service, and its
// job type on a coordinator of the store.
type handoffKey struct {
	t       *testing.T
	store   Store
	service string
	payload []byte
	kvKey   string
}

func newHandoffKey(t *testing.T, store Store) *handoffKey {
	return &handoffKey{t: t, store: store, service: rtService(), payload: benchPayload(0)}
}

var handoffPolicy = Policy{Key: benchPolicy.Key, MaxActive: 1, MaxQueuedPerKey: 16}

// jobType returns a job type of the key on a new coordinator of store.
func (k *handoffKey) jobType(store Store) *JobType {
	c, err := NewCoordinator(store, nil)
	require.NoError(k.t, err)
	jt, err := c.JobType(k.service, benchJobType, handoffPolicy)
	require.NoError(k.t, err)
	k.kvKey = mustKey(k.t, jt, k.payload).KVKey
	return jt
}

func (k *handoffKey) admit(jt *JobType, ids ...string) {
	for _, id := range ids {
		adm, err := jt.Admit(context.Background(), id, k.payload)
		require.NoError(k.t, err)
		require.Equal(k.t, KindAccepted, adm.Kind, "admit %s", id)
	}
}

func (k *handoffKey) acquire(jt *JobType, id string) Lease {
	acq, err := jt.Acquire(context.Background(), id, k.payload)
	require.NoError(k.t, err)
	require.Equal(k.t, KindAcquired, acq.Kind, "acquire %s", id)
	return acq.Lease
}

func (k *handoffKey) release(jt *JobType, lease Lease) {
	rel, err := jt.Release(context.Background(), lease)
	require.NoError(k.t, err)
	require.Equal(k.t, KindReleased, rel.Kind, "release %s", lease.JobID)
}

// rev returns the key's revision in the store.
func (k *handoffKey) rev() uint64 {
	_, rev, err := k.store.Get(context.Background(), k.service, k.kvKey)
	require.NoError(k.t, err)
	return rev
}

// waiter subscribes a waiter of job id through w for jt's coordinator,
// having found the key busy at its current revision.
func (k *handoffKey) waiter(w *Watcher, jt *JobType, id string) *Subscription {
	sub, err := w.subscribeWaiter(context.Background(), k.service, k.kvKey, id, handoffPolicy.MaxActive, jt.coord.keys)
	require.NoError(k.t, err)
	k.t.Cleanup(sub.Close)
	sub.rearm(k.rev())
	return sub
}

// keyWatch runs f on w's keyWatch of the key (nil when none), under
// w.mu.
func (k *handoffKey) keyWatch(w *Watcher, f func(kw *keyWatch)) {
	w.mu.Lock()
	defer w.mu.Unlock()
	var kw *keyWatch
	if sw := w.watches[k.service]; sw != nil {
		kw = sw.keys[k.kvKey]
	}
	f(kw)
}

// watchedRev returns the revision w's keyWatch of the key holds.
func (k *handoffKey) watchedRev(w *Watcher) uint64 {
	var rev uint64
	k.keyWatch(w, func(kw *keyWatch) {
		if kw != nil {
			rev = kw.rev
		}
	})
	return rev
}

// awaitWatched waits until w's keyWatch of the key holds revision rev or
// a later one.
func (k *handoffKey) awaitWatched(w *Watcher, rev uint64) {
	k.t.Helper()
	require.Eventually(k.t, func() bool { return k.watchedRev(w) >= rev }, rtWait, time.Millisecond,
		"the watcher never got to revision %d", rev)
}

// awaitWaiting waits until n waiters wait on the key through w, none of
// them woken.
func (k *handoffKey) awaitWaiting(w *Watcher, n int) {
	k.t.Helper()
	require.Eventually(k.t, func() bool {
		ok := false
		k.keyWatch(w, func(kw *keyWatch) {
			if kw == nil || len(kw.waiters) != n {
				return
			}
			for _, s := range kw.waiters {
				if s.waiter.woken {
					return
				}
			}
			ok = true
		})
		return ok
	}, rtWait, time.Millisecond, "%d waiters never waited", n)
}

// A release committed by a coordinator of the process wakes the process's
// first waiter before the watch delivers it, and the acquisition that
// follows is known at once too; the watch's later deliveries of both (the
// echoes) wake nobody and move nothing backwards.
func TestWatcherHandoffWakesBeforeEcho(t *testing.T) {
	t.Parallel()
	for name, open := range handoffEnvs() {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			env := open(t)
			k := newHandoffKey(t, env.store)
			jt := k.jobType(env.store)
			other := k.jobType(env.store) // another coordinator, never waited: not linked
			w := env.held(t, k.service)
			k.admit(jt, "h", "a", "b")
			lh := k.acquire(jt, "h")
			subs := []*Subscription{k.waiter(w.Watcher, jt, "a"), k.waiter(w.Watcher, jt, "b")}
			require.Empty(t, woken(subs))

			w.hold()
			k.release(jt, lh)
			released := k.rev()
			assert.Equal(t, []int{0}, woken(subs), "the release woke the first waiter (only) before the watch delivered it")
			assert.Equal(t, released, k.watchedRev(w.Watcher), "the watcher holds the release")

			// The first waiter's try, on the handed-off state, acquires.
			wt := &waitTry{trustWatch: true}
			acq, err := acquireJobTry(ctx, jt, wt, "a", k.payload)
			require.NoError(t, err)
			require.Equal(t, KindAcquired, acq.Kind)
			subs[0].Close()
			acquired := k.rev()
			assert.Equal(t, acquired, k.watchedRev(w.Watcher), "the watcher holds the acquisition")
			assert.Empty(t, woken(subs[1:]), "the acquisition took the slot: nobody to wake")

			// Another process's write after both; then the watch delivers
			// all three, in order.
			k.admit(other, "z")
			admitted := k.rev()
			w.release()
			k.awaitWatched(w.Watcher, admitted)
			assert.Empty(t, woken(subs[1:]), "the watch's echoes woke a waiter")
			k.keyWatch(w.Watcher, func(kw *keyWatch) {
				require.NotNil(t, kw)
				assert.Equal(t, admitted, kw.rev)
				require.NotNil(t, kw.state)
				assert.Len(t, kw.state.Queued, 2, "b and z queued")
			})
			e := jt.coord.keys.entry(k.kvKey)
			require.NotNil(t, e)
			m := e.Marks()
			assert.Equal(t, admitted, m.Rev, "the coordinator's entry holds the latest revision")
			assert.True(t, m.Trusted, "and trusts it")

			// The key goes on working: the release of a wakes b.
			k.release(jt, acq.Lease)
			assert.Equal(t, []int{0}, woken(subs[1:]), "the release of a woke b")
		})
	}
}

// A Runner waiting in the process runs its job on a release of the
// process while the Watcher's watch delivers nothing, without reading the
// key.
func TestRunnerHandoffRunsBeforeEcho(t *testing.T) {
	t.Parallel()
	for name, open := range handoffEnvs() {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			env := open(t)
			k := newHandoffKey(t, env.store)
			cs := newCountingStore(env.store)
			jt := k.jobType(cs)
			w := env.held(t, k.service)
			r, err := NewRunner(jt, &RunnerConfig{Watcher: w.Watcher, RecheckInterval: time.Minute})
			require.NoError(t, err)
			k.admit(jt, "h", "a")
			lh := k.acquire(jt, "h")

			started, finish := make(chan struct{}), make(chan struct{})
			done := goRun(ctx, r, "a", k.payload, func(context.Context, Lease) error {
				close(started)
				<-finish
				return nil
			})
			k.awaitWaiting(w.Watcher, 1)

			w.hold()
			reads := cs.totals.reads.Load()
			k.release(jt, lh)
			recv(t, started, "the waiter to run while the watch delivered nothing")
			assert.Equal(t, reads, cs.totals.reads.Load(), "the waiter read the key")
			w.release()
			close(finish)
			require.NoError(t, recv(t, done, "the run"))
		})
	}
}

// Coordinators of one process sharing a Watcher: a release by one wakes
// the other's waiter at once, and feeds the other's entry, whose waiter
// then acquires without a read.
func TestWatcherHandoffReachesOtherCoordinators(t *testing.T) {
	t.Parallel()
	for name, open := range handoffEnvs() {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			env := open(t)
			k := newHandoffKey(t, env.store)
			jt1 := k.jobType(env.store)
			cs := newCountingStore(env.store)
			jt2 := k.jobType(cs)
			w := env.held(t, k.service)
			// One of the first coordinator's Runners waited through the
			// Watcher once: it is linked to it.
			k.admit(jt1, "h")
			k.waiter(w.Watcher, jt1, "x").Close()

			r2, err := NewRunner(jt2, &RunnerConfig{Watcher: w.Watcher, RecheckInterval: time.Minute})
			require.NoError(t, err)
			lh := k.acquire(jt1, "h")
			k.admit(jt2, "a")
			started := make(chan struct{})
			done := goRun(ctx, r2, "a", k.payload, func(context.Context, Lease) error {
				close(started)
				return nil
			})
			k.awaitWaiting(w.Watcher, 1)

			w.hold()
			reads := cs.totals.reads.Load()
			k.release(jt1, lh)
			recv(t, started, "the other coordinator's waiter to run while the watch delivered nothing")
			assert.Equal(t, reads, cs.totals.reads.Load(), "the other coordinator's waiter read the key")
			w.release()
			require.NoError(t, recv(t, done, "the run"))
		})
	}
}

// A waiter of another process is woken by its own watch, and the turns
// of waiters behind other processes' jobs are kept: the process's waiter
// behind the other's job waits for its grace from the watch's delivery,
// not from the handoff (the other process learns of the release from the
// watch); the process's waiter ahead of the other's is woken at once.
func TestWatcherHandoffKeepsOtherProcessesTurns(t *testing.T) {
	t.Parallel()
	for name, open := range handoffEnvs() {
		for _, localFirst := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/localFirst=%v", name, localFirst), func(t *testing.T) {
				t.Parallel()
				env := open(t)
				k := newHandoffKey(t, env.store)
				jtA := k.jobType(env.store)
				wA := env.held(t, k.service)
				storeB, wB := env.otherProcess(t)
				jtB := k.jobType(storeB)
				k.admit(jtA, "h")
				if localFirst {
					k.admit(jtA, "aj")
					k.admit(jtB, "bj")
				} else {
					k.admit(jtB, "bj")
					k.admit(jtA, "aj")
				}
				lh := k.acquire(jtA, "h")
				subB := k.waiter(wB, jtB, "bj")
				subA := k.waiter(wA.Watcher, jtA, "aj")

				wA.hold()
				k.release(jtA, lh)
				if localFirst {
					assert.True(t, pending(subA.Changed()), "the process's waiter at the head was not woken by its release")
				} else {
					recv(t, subB.Changed(), "the other process's waiter at the head, woken by its watch")
					time.Sleep(10 * waiterGrace)
					assert.False(t, pending(subA.Changed()),
						"the process's waiter behind the other's job was woken before the watch delivered the release")
				}
				wA.release()
				// The job at the head does not take the slot: the one
				// behind it tries after its grace.
				if localFirst {
					recv(t, subB.Changed(), "the other process's waiter, after its grace")
				} else {
					recv(t, subA.Changed(), "the process's waiter, after its grace")
				}
			})
		}
	}
}

// A write whose reply was lost is not known to be stored: nothing is
// handed off, and the watch's delivery wakes the waiter.
func TestWatcherHandoffNothingOnLostReply(t *testing.T) {
	t.Parallel()
	for name, open := range handoffEnvs() {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			env := open(t)
			k := newHandoffKey(t, env.store)
			// Once lose is set, the store writes the next update and then
			// fails it, as when the reply is lost.
			var lose atomic.Bool
			lr := newHookStore(env.store, passNone).withHook(func(_ context.Context, c storeCall, call func() storeResult) storeResult {
				r := call()
				if c.op == opUpdate && r.err == nil && lose.CompareAndSwap(true, false) {
					return storeResult{err: errors.New("injected: reply lost")}
				}
				return r
			})
			jt := k.jobType(lr)
			w := env.held(t, k.service)
			k.admit(jt, "h", "a")
			lh := k.acquire(jt, "h")
			sub := k.waiter(w.Watcher, jt, "a")

			w.hold()
			lose.Store(true)
			_, err := jt.Release(ctx, lh)
			require.Error(t, err, "the release's reply was lost")
			assert.False(t, pending(sub.Changed()), "a write not known to be stored woke a waiter")
			assert.Less(t, k.watchedRev(w.Watcher), k.rev(), "a write not known to be stored was handed off")
			w.release()
			recv(t, sub.Changed(), "the waiter, woken by the watch's delivery of the release")
		})
	}
}

// Many Runners of two coordinators sharing a Watcher on one key, with
// handoffs between them and the watch's echoes racing them: every job
// runs once, never two at a time, and nothing deadlocks (run with -race).
func TestWatcherHandoffConcurrentRunners(t *testing.T) {
	t.Parallel()
	for name, open := range handoffEnvs() {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			env := open(t)
			k := newHandoffKey(t, env.store)
			w, err := NewWatcher(env.store.(WatchableStore))
			require.NoError(t, err)
			t.Cleanup(w.Close)
			const coords, workers, cycles = 2, 4, 25
			var running, overlap, ran atomic.Int64
			handler := func(context.Context, Lease) error {
				if running.Add(1) > 1 {
					overlap.Add(1)
				}
				time.Sleep(100 * time.Microsecond)
				running.Add(-1)
				ran.Add(1)
				return nil
			}
			errs := make(chan error, coords*workers)
			for c := range coords {
				jt := k.jobType(env.store)
				r, err := NewRunner(jt, &RunnerConfig{Watcher: w, RecheckInterval: 10 * time.Second})
				require.NoError(t, err)
				for i := range workers {
					go func() {
						for j := range cycles {
							id := fmt.Sprintf("c%d-w%d-j%d", c, i, j)
							if _, err := jt.Admit(ctx, id, k.payload); err != nil {
								errs <- err
								return
							}
							if _, err := r.Run(ctx, id, k.payload, handler); err != nil {
								errs <- fmt.Errorf("run %s: %w", id, err)
								return
							}
						}
						errs <- nil
					}()
				}
			}
			for range coords * workers {
				require.NoError(t, recv(t, errs, "a worker"))
			}
			assert.Equal(t, int64(coords*workers*cycles), ran.Load(), "jobs run")
			assert.Zero(t, overlap.Load(), "jobs ran two at a time on a key with MaxActive 1")
		})
	}
}

// goRun runs job id through r in a goroutine; the channel gets Run's error.
func goRun(ctx context.Context, r *Runner, id string, payload any, h Handler) <-chan error {
	done := make(chan error, 1)
	go func() {
		_, err := r.Run(ctx, id, payload, h)
		done <- err
	}()
	return done
}
