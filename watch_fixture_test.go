package jobkeys

// Fixtures of the tests of Watchers inside a process, and the test of
// many Runners of two coordinators sharing one: a Watcher whose watch
// deliveries the test holds back (over a MemoryStore by gating the watch's
// hook in the store, over NATS by pausing a TCP proxy between the
// Watcher's connection and the server), and one key's job type.

import (
	"bytes"
	"context"
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

// heldEnv is one store setting of the tests that hold a watch back.
type heldEnv struct {
	// store is this process's store, for its coordinators.
	store Store
	// held returns a Watcher of this process over store whose deliveries
	// can be held, its watch of service started.
	held func(t *testing.T, service string) *heldWatcher
	// otherProcess returns the store and a Watcher of another process:
	// another connection to the same server, or the same MemoryStore.
	otherProcess func(t *testing.T) (Store, *Watcher)
}

func heldEnvs() map[string]func(t *testing.T) *heldEnv {
	return map[string]func(t *testing.T) *heldEnv{
		"memory": func(t *testing.T) *heldEnv {
			mem := NewMemoryStore()
			return &heldEnv{
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
		"nats": func(t *testing.T) *heldEnv {
			s := natstest.Run(t)
			open := func(t *testing.T, url string) *NATSStore {
				_, js := natstest.ConnectURL(t, url)
				store, err := NewNATSStore(js, WithCreateBuckets(jetstream.MemoryStorage, 1))
				require.NoError(t, err)
				return store
			}
			return &heldEnv{
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

// sharedKey is one key with MaxActive 1 in a fresh service, and its
// job type on a coordinator of the store.
type sharedKey struct {
	t       *testing.T
	store   Store
	service string
	payload []byte
	kvKey   string
}

func newSharedKey(t *testing.T, store Store) *sharedKey {
	return &sharedKey{t: t, store: store, service: rtService(), payload: benchPayload(0)}
}

var sharedKeyPolicy = Policy{Key: benchPolicy.Key, MaxActive: 1, MaxQueuedPerKey: 16}

// jobType returns a job type of the key on a new coordinator of store.
func (k *sharedKey) jobType(store Store) *JobType {
	c, err := NewCoordinator(store, nil)
	require.NoError(k.t, err)
	jt, err := c.JobType(k.service, benchJobType, sharedKeyPolicy)
	require.NoError(k.t, err)
	k.kvKey = mustKey(k.t, jt, k.payload).KVKey
	return jt
}

// Many Runners of two coordinators sharing a Watcher on one key, woken by
// its watch and by their own coordinator's batches ahead of the writes
// (prewake): every job runs once, never two at a time, and nothing
// deadlocks (run with -race).
func TestWatcherConcurrentRunnersOfTwoCoordinators(t *testing.T) {
	t.Parallel()
	for name, open := range heldEnvs() {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			env := open(t)
			k := newSharedKey(t, env.store)
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
