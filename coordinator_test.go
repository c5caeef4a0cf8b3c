package jobkeys

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jobkeys/jobkeys/internal/natstest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const cJobType = "sync"

var cPayload = []byte(`{"tenant":"acme","n":1}`)

func cPolicy() Policy {
	return Policy{Key: []string{"tenant", "/tenant"}, MaxActive: 1, MaxQueuedPerKey: 4}
}

func cAdmit(svc, id string, p Policy) AdmitRequest {
	return AdmitRequest{Service: svc, JobType: cJobType, JobID: id, Payload: cPayload, Context: rctx(id), Policy: p}
}

func cAcquire(svc, id string, p Policy, retry bool) AcquireRequest {
	return AcquireRequest{Service: svc, JobType: cJobType, JobID: id, Payload: cPayload, Context: rctx(id), Policy: p, Retry: retry, Tries: 1}
}

func cKey(t testing.TB, svc string) JobKey {
	t.Helper()
	k, err := DeriveKey(svc, cJobType, cPayload, cPolicy().Key)
	require.NoError(t, err)
	return k
}

func cCoordinator(t testing.TB, st Store, cfg *Config) *KeyCoordinator {
	t.Helper()
	c, err := NewCoordinator(st, cfg)
	require.NoError(t, err)
	return c
}

// coordBackend is a store the coordinator tests run on.
type coordBackend struct {
	name string
	// open returns a store, a fresh service, and a way to open a second
	// store on the same data (for NATS, over another connection).
	open        func(t *testing.T) (st Store, svc string, another func(t *testing.T) Store)
	openLimited func(t *testing.T, maxValueSize int) (Store, string)
	// fresh returns a store that shares no bucket with any other, for tests
	// that must use a given service name.
	fresh func(t *testing.T) Store
}

func coordBackends(t *testing.T) []coordBackend {
	t.Helper()
	n := startJKNATS(t)
	return []coordBackend{
		{
			name: "Memory",
			open: func(t *testing.T) (Store, string, func(*testing.T) Store) {
				m := NewMemoryStore()
				return m, jkService("coord"), func(*testing.T) Store { return m }
			},
			openLimited: memoryHarness().openLimited,
			fresh:       func(*testing.T) Store { return NewMemoryStore() },
		},
		{
			name: "NATS",
			open: func(t *testing.T) (Store, string, func(*testing.T) Store) {
				return n.store(t), jkService("coord"), func(t *testing.T) Store {
					_, js := natstest.Connect(t, n.srv)
					st, err := NewNATSStore(js, WithCreateBuckets(jetstream.MemoryStorage, 1))
					require.NoError(t, err)
					return st
				}
			},
			openLimited: n.harness().openLimited,
			fresh: func(t *testing.T) Store {
				st, err := NewNATSStore(n.js, WithBucketPrefix(strings.ReplaceAll(jkService("P"), "-", "_")),
					WithCreateBuckets(jetstream.MemoryStorage, 1))
				require.NoError(t, err)
				return st
			},
		},
	}
}

// stored returns the bytes and revision under the test key.
func stored(t testing.TB, st Store, svc, kvKey string) ([]byte, uint64) {
	t.Helper()
	v, rev, err := st.Get(context.Background(), svc, kvKey)
	require.NoError(t, err, "Get %s", kvKey)
	return v, rev
}

func storedState(t testing.TB, st Store, svc, kvKey string) *KeyState {
	t.Helper()
	v, _ := stored(t, st, svc, kvKey)
	s, err := ParseState(v)
	require.NoError(t, err, "stored state")
	return s
}

func queuedIDs(s *KeyState) []string {
	ids := []string{}
	for _, q := range s.Queued {
		ids = append(ids, q.JobID)
	}
	return ids
}

func activeJobIDs(s *KeyState) []string {
	ids := []string{}
	for _, a := range s.Active {
		ids = append(ids, a.JobID)
	}
	return ids
}

// everyOperation calls each coordinator method once on the test key and
// returns the errors by method name.
func everyOperation(ctx context.Context, c *KeyCoordinator, key JobKey) map[string]error {
	p := cPolicy()
	np, _ := p.Normalize()
	lease := Lease{Service: key.Service, JobType: key.JobType, JobID: "j1", DisplayKey: key.DisplayKey, KeyHash: key.KeyHash, SlotToken: "tok-1", Policy: np}
	errs := map[string]error{}
	_, errs["Admit"] = c.Admit(ctx, cAdmit(key.Service, "j9", p))
	_, errs["Acquire"] = c.Acquire(ctx, cAcquire(key.Service, "j1", p, true))
	_, errs["Renew"] = c.Renew(ctx, RenewRequest{Lease: lease})
	_, errs["Release"] = c.Release(ctx, ReleaseRequest{Lease: lease})
	_, errs["RemoveQueued"] = c.RemoveQueued(ctx, RemoveRequest{Service: key.Service, JobType: cJobType, JobID: "j1", Payload: cPayload, Policy: p})
	_, errs["RestoreReplaced"] = c.RestoreReplaced(ctx, RestoreRequest{Service: key.Service, JobType: cJobType, ReplacementJobID: "j9",
		Replaced: ReplacedJob{JobRef: JobRef{Service: key.Service, JobType: cJobType, ID: "j1"}, CreatedAt: rt0, RequestID: "r", Context: rctx("j1")},
		Payload:  cPayload, Policy: p})
	return errs
}

// checkStateErr checks that err is a *StateError for kvKey wrapping sentinel.
func checkStateErr(t testing.TB, what string, err, sentinel error, kvKey string) {
	t.Helper()
	require.True(t, errors.Is(err, sentinel), "%s: want %v, got %v", what, sentinel, err)
	var se *StateError
	require.True(t, errors.As(err, &se), "%s: not a *StateError: %v", what, err)
	require.Equal(t, kvKey, se.KVKey, "%s: StateError.KVKey", what)
	require.True(t, se.Err == sentinel, "%s: StateError.Err is %v, want %v", what, se.Err, sentinel)
	require.True(t, strings.Contains(err.Error(), kvKey), "%s: error does not name the KV key: %v", what, err)
}

// stateDoc is a valid state document for key with one queued job j1,
// changed by f.
func stateDoc(t testing.TB, key JobKey, f func(*KeyState)) []byte {
	t.Helper()
	s := &KeyState{Version: 1, Service: key.Service, JobType: key.JobType, DisplayKey: key.DisplayKey, KeyHash: key.KeyHash,
		MaxActive: 1, MaxQueuedPerKey: 4, Queued: []QueuedJob{rq("j1", rt0)}, UpdatedAt: rt0}
	if f != nil {
		f(s)
	}
	return encodeState(t, s)
}

func TestCoordinatorCorruptState(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, b := range coordBackends(t) {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			st, svc, _ := b.open(t)
			key := cKey(t, svc)
			good := stateDoc(t, key, nil)
			bad := map[string][]byte{
				"not JSON":           []byte("not json at all"),
				"truncated":          good[:len(good)/2],
				"empty object":       []byte("{}"),
				"version 2":          bytes.Replace(good, []byte(`"version":1`), []byte(`"version":2`), 1),
				"maxActive 1.5":      bytes.Replace(good, []byte(`"maxActive":1`), []byte(`"maxActive":1.5`), 1),
				"queued entry empty": bytes.Replace(good, []byte(`"queued":[`), []byte(`"queued":[{},`), 1),
			}
			for name, value := range bad {
				t.Run(name, func(t *testing.T) {
					require.True(t, tsCheckStateJSON(value) != "", "test bug: %s is valid", name)
					svc := jkService("corrupt")
					key := cKey(t, svc)
					_, err := st.Create(ctx, svc, key.KVKey, value)
					require.NoError(t, err)
					before, rev := stored(t, st, svc, key.KVKey)
					c := cCoordinator(t, st, nil)
					for op, err := range everyOperation(ctx, c, key) {
						checkStateErr(t, op, err, ErrCorruptState, key.KVKey)
					}
					after, rev2 := stored(t, st, svc, key.KVKey)
					require.Equal(t, string(before), string(after), "corrupt state was changed")
					require.Equal(t, rev, rev2, "corrupt state was rewritten")
				})
			}

			// A coordinator with a warm cache finds the corruption too, on
			// writing and on non-writing outcomes.
			t.Run("behind a warm cache", func(t *testing.T) {
				c := cCoordinator(t, st, nil)
				p := cPolicy()
				_, err := c.Admit(ctx, cAdmit(svc, "j1", p))
				require.NoError(t, err)
				_, rev := stored(t, st, svc, key.KVKey)
				rev, err = st.Update(ctx, svc, key.KVKey, []byte("garbage"), rev)
				require.NoError(t, err)
				_, err = c.Admit(ctx, cAdmit(svc, "j2", p))
				checkStateErr(t, "Admit", err, ErrCorruptState, key.KVKey)
				_, err = c.Admit(ctx, cAdmit(svc, "j1", p)) // AlreadyPresent per the cache
				checkStateErr(t, "Admit of a cached job", err, ErrCorruptState, key.KVKey)
				_, err = c.Acquire(ctx, cAcquire(svc, "j7", p, false)) // not-queued per the cache
				checkStateErr(t, "Acquire", err, ErrCorruptState, key.KVKey)
				v, rev2 := stored(t, st, svc, key.KVKey)
				require.Equal(t, "garbage", string(v))
				require.Equal(t, rev, rev2)
			})
		})
	}
}

func TestCoordinatorForeignState(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, b := range coordBackends(t) {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			st, _, _ := b.open(t)
			for name, f := range map[string]func(*KeyState){
				"another key hash": func(s *KeyState) { s.KeyHash = strings.Repeat("0", 64) },
				"another service":  func(s *KeyState) { s.Service = "someone-else" },
				"another job type": func(s *KeyState) { s.JobType = "other" },
			} {
				t.Run(name, func(t *testing.T) {
					svc := jkService("foreign")
					key := cKey(t, svc)
					doc := stateDoc(t, key, f)
					require.Equal(t, "", tsCheckStateJSON(doc), "test bug: the foreign state should be valid")
					_, err := st.Create(ctx, svc, key.KVKey, doc)
					require.NoError(t, err)
					before, rev := stored(t, st, svc, key.KVKey)
					c := cCoordinator(t, st, nil)
					for op, err := range everyOperation(ctx, c, key) {
						checkStateErr(t, op, err, ErrForeignState, key.KVKey)
					}
					after, rev2 := stored(t, st, svc, key.KVKey)
					require.Equal(t, string(before), string(after), "foreign state was changed")
					require.Equal(t, rev, rev2, "foreign state was rewritten")
				})
			}
		})
	}
}

func TestCoordinatorStateTooLarge(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, b := range coordBackends(t) {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			st, svc := b.openLimited(t, 4096)
			key := cKey(t, svc)
			c := cCoordinator(t, st, nil)
			p := Policy{Key: cPolicy().Key, MaxActive: 1, MaxQueuedPerKey: 1000}
			accepted := 0
			var err error
			var before []byte
			var rev uint64
			for i := 0; i < 1000; i++ {
				if accepted > 0 {
					before, rev = stored(t, st, svc, key.KVKey)
				}
				var adm Admission
				adm, err = c.Admit(ctx, cAdmit(svc, fmt.Sprintf("job-%03d", i), p))
				if err != nil {
					break
				}
				require.Equal(t, KindAccepted, adm.Kind)
				accepted++
			}
			require.True(t, err != nil, "1000 admissions fit in 4096 bytes")
			require.True(t, accepted > 3, "only %d admissions fit", accepted)
			checkStateErr(t, "Admit over the size limit", err, ErrStateTooLarge, key.KVKey)
			_, isStateErr := err.(*StateError)
			require.True(t, isStateErr, "the error is %T, want *StateError", err)
			after, rev2 := stored(t, st, svc, key.KVKey)
			require.Equal(t, string(before), string(after), "state changed by a failed write")
			require.Equal(t, rev, rev2)
			require.Equal(t, accepted, len(storedState(t, st, svc, key.KVKey).Queued))

			// The key is not stuck: an operation that shrinks the state works.
			rem, err := c.RemoveQueued(ctx, RemoveRequest{Service: svc, JobType: cJobType, JobID: "job-000", Payload: cPayload, Policy: p})
			require.NoError(t, err)
			require.Equal(t, KindRemoved, rem.Kind)
			require.Equal(t, accepted-1, len(storedState(t, st, svc, key.KVKey).Queued))
		})
	}
}

// conflictFault is a fault injector: while failing is set, Create, Update
// and Delete report a revision conflict without writing (the store of a key
// that every other writer always wins). onConflict, if set, runs on each.
type conflictFault struct {
	failing    atomic.Bool
	writes     atomic.Int64
	onConflict func(n int64)
}

// newFaultStore returns a store over inner (passing no optional capability
// through) whose writes fail as f says.
func newFaultStore(inner Store) (*hookStore, *conflictFault) {
	f := &conflictFault{}
	return newHookStore(inner, passNone).withHook(f.hook), f
}

func (f *conflictFault) hook(_ context.Context, c storeCall, call func() storeResult) storeResult {
	if !c.op.writes() || !f.failing.Load() {
		return call()
	}
	n := f.writes.Add(1)
	if f.onConflict != nil {
		f.onConflict(n)
	}
	return storeResult{err: fmt.Errorf("%w: injected on %s %s", ErrRevisionConflict, c.op, c.key)}
}

func TestCoordinatorContention(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p := cPolicy()
	for _, attempts := range []int{1, 3, 10} {
		t.Run(fmt.Sprintf("MaxAttempts=%d", attempts), func(t *testing.T) {
			t.Parallel()
			svc := jkService("contention")
			key := cKey(t, svc)
			faulty, fs := newFaultStore(NewMemoryStore())
			c := cCoordinator(t, faulty, &Config{MaxAttempts: attempts, RetryBackoff: time.Microsecond, MaxRetryBackoff: 10 * time.Microsecond})

			// Absent key.
			fs.failing.Store(true)
			_, err := c.Admit(ctx, cAdmit(svc, "j1", p))
			require.True(t, errors.Is(err, ErrContention), "want ErrContention, got %v", err)
			require.True(t, strings.Contains(err.Error(), key.KVKey), "error does not name the KV key: %v", err)
			n := fs.writes.Load()
			require.True(t, n >= int64(attempts) && n <= int64(attempts)+1, "%d write attempts for MaxAttempts %d", n, attempts)

			// Existing key: the state stays as it was.
			fs.failing.Store(false)
			_, err = c.Admit(ctx, cAdmit(svc, "j1", p))
			require.NoError(t, err)
			before, rev := stored(t, faulty, svc, key.KVKey)
			fs.failing.Store(true)
			fs.writes.Store(0)
			_, err = c.Acquire(ctx, cAcquire(svc, "j1", p, false))
			require.True(t, errors.Is(err, ErrContention), "Acquire: want ErrContention, got %v", err)
			n = fs.writes.Load()
			require.True(t, n >= int64(attempts) && n <= int64(attempts)+1, "%d write attempts for MaxAttempts %d", n, attempts)
			after, rev2 := stored(t, faulty, svc, key.KVKey)
			require.Equal(t, string(before), string(after))
			require.Equal(t, rev, rev2)

			// Once the contention ends the same coordinator carries on.
			fs.failing.Store(false)
			acq, err := c.Acquire(ctx, cAcquire(svc, "j1", p, false))
			require.NoError(t, err)
			require.Equal(t, KindAcquired, acq.Kind)
		})
	}
}

func TestCoordinatorContextCancelledDuringContention(t *testing.T) {
	t.Parallel()
	p := cPolicy()

	t.Run("cancelled by the store's caller mid-write", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		faulty, fs := newFaultStore(NewMemoryStore())
		fs.failing.Store(true)
		fs.onConflict = func(n int64) {
			if n == 3 {
				cancel()
			}
		}
		c := cCoordinator(t, faulty, &Config{MaxAttempts: 1 << 20, RetryBackoff: time.Microsecond, MaxRetryBackoff: time.Microsecond})
		_, err := c.Admit(ctx, cAdmit(jkService("cancel"), "j1", p))
		require.True(t, err == context.Canceled, "want ctx.Err() unchanged, got %v", err)
		require.Equal(t, int64(3), fs.writes.Load(), "write attempts after the cancel")
	})

	t.Run("cancelled during the backoff", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		faulty, fs := newFaultStore(NewMemoryStore())
		fs.failing.Store(true)
		first := make(chan struct{})
		var once sync.Once
		fs.onConflict = func(int64) { once.Do(func() { close(first) }) }
		c := cCoordinator(t, faulty, &Config{MaxAttempts: 1 << 20, RetryBackoff: time.Hour, MaxRetryBackoff: time.Hour})
		done := make(chan error, 1)
		go func() {
			_, err := c.Admit(ctx, cAdmit(jkService("cancel"), "j1", p))
			done <- err
		}()
		<-first
		cancel()
		select {
		case err := <-done:
			require.True(t, err == context.Canceled, "want ctx.Err() unchanged, got %v", err)
		case <-time.After(30 * time.Second):
			t.Fatal("Admit did not return within 30s of its context being cancelled while backing off")
		}
	})

	t.Run("deadline", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		faulty, fs := newFaultStore(NewMemoryStore())
		fs.failing.Store(true)
		c := cCoordinator(t, faulty, &Config{MaxAttempts: 1 << 30, RetryBackoff: time.Millisecond, MaxRetryBackoff: 5 * time.Millisecond})
		_, err := c.Admit(ctx, cAdmit(jkService("cancel"), "j1", p))
		require.True(t, err == context.DeadlineExceeded, "want context.DeadlineExceeded, got %v", err)
	})

	t.Run("cancelled before the call", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		c := cCoordinator(t, NewMemoryStore(), nil)
		svc := jkService("cancel")
		_, err := c.Admit(ctx, cAdmit(svc, "j1", p))
		require.True(t, err == context.Canceled, "Admit: %v", err)
		_, err = c.Acquire(ctx, cAcquire(svc, "j1", p, true))
		require.True(t, err == context.Canceled, "Acquire: %v", err)
	})
}

func TestCoordinatorDeletesEmptyState(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, b := range coordBackends(t) {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			st, svc, _ := b.open(t)
			key := cKey(t, svc)
			c := cCoordinator(t, st, nil)
			p := cPolicy()
			gone := func(what string) {
				t.Helper()
				_, _, err := st.Get(ctx, svc, key.KVKey)
				require.True(t, errors.Is(err, ErrKeyNotFound), "%s: the empty state was not deleted: %v", what, err)
			}

			_, err := c.Admit(ctx, cAdmit(svc, "j1", p))
			require.NoError(t, err)
			acq, err := c.Acquire(ctx, cAcquire(svc, "j1", p, false))
			require.NoError(t, err)
			require.Equal(t, KindAcquired, acq.Kind)
			rel, err := c.Release(ctx, ReleaseRequest{Lease: acq.Lease})
			require.NoError(t, err)
			require.Equal(t, KindReleased, rel.Kind)
			gone("after the last release")

			// Releasing again is a stale completion and writes nothing.
			rel, err = c.Release(ctx, ReleaseRequest{Lease: acq.Lease})
			require.NoError(t, err)
			require.Equal(t, KindStaleCompletion, rel.Kind)
			gone("after a stale completion")

			// A later admission recreates the state.
			adm, err := c.Admit(ctx, cAdmit(svc, "j2", p))
			require.NoError(t, err)
			require.Equal(t, KindAccepted, adm.Kind)
			require.Equal(t, []string{"j2"}, queuedIDs(storedState(t, st, svc, key.KVKey)))

			// Removing the only queued job deletes it again, and so does
			// a second coordinator's admission afterwards recreate it.
			rem, err := c.RemoveQueued(ctx, RemoveRequest{Service: svc, JobType: cJobType, JobID: "j2", Payload: cPayload, Policy: p})
			require.NoError(t, err)
			require.Equal(t, KindRemoved, rem.Kind)
			gone("after removing the last queued job")
			c2 := cCoordinator(t, st, nil)
			_, err = c2.Admit(ctx, cAdmit(svc, "j3", p))
			require.NoError(t, err)
			// The first coordinator's cache says "deleted"; it must still see j3.
			adm, err = c.Admit(ctx, cAdmit(svc, "j3", p))
			require.NoError(t, err)
			require.True(t, adm.AlreadyPresent, "j3 admitted twice: %+v", adm)
			require.Equal(t, []string{"j3"}, queuedIDs(storedState(t, st, svc, key.KVKey)))
		})
	}
}

// Coordinator A caches what it read and wrote; B changes the key behind
// A's back. A must never report an outcome that rests on its stale cache.
func TestCoordinatorCacheIsNotTrustedBlindly(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, b := range coordBackends(t) {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			st, svc, another := b.open(t)
			key := cKey(t, svc)
			clock := &jkClock{t: rt0}
			a := cCoordinator(t, st, &Config{InstanceID: "A", IgnoreClockSkew: true, Now: clock.Now})
			bc := cCoordinator(t, another(t), &Config{InstanceID: "B", IgnoreClockSkew: true, Now: clock.Now})
			p := Policy{Key: cPolicy().Key, MaxActive: 1, MaxQueuedPerKey: 4, HeartbeatInterval: time.Second, HeartbeatTTL: 2 * time.Second}

			// A fills the key: j1 running, j2 queued.
			_, err := a.Admit(ctx, cAdmit(svc, "j1", p))
			require.NoError(t, err)
			acq1, err := a.Acquire(ctx, cAcquire(svc, "j1", p, false))
			require.NoError(t, err)
			require.Equal(t, KindAcquired, acq1.Kind)
			_, err = a.Admit(ctx, cAdmit(svc, "j2", p))
			require.NoError(t, err)

			// B frees the slot; A's cache still shows it taken.
			rel, err := bc.Release(ctx, ReleaseRequest{Lease: acq1.Lease})
			require.NoError(t, err)
			require.Equal(t, KindReleased, rel.Kind)
			acq2, err := a.Acquire(ctx, cAcquire(svc, "j2", p, false))
			require.NoError(t, err)
			require.Equal(t, KindAcquired, acq2.Kind, "A trusted its cache of a full key")

			// B queues j3; A's write of j4 must keep it.
			_, err = bc.Admit(ctx, cAdmit(svc, "j3", p))
			require.NoError(t, err)
			_, err = a.Admit(ctx, cAdmit(svc, "j4", p))
			require.NoError(t, err)
			require.Equal(t, []string{"j3", "j4"}, queuedIDs(storedState(t, st, svc, key.KVKey)), "A's write lost B's admission")

			// B removes j4; A's cache still has it queued.
			rem, err := bc.RemoveQueued(ctx, RemoveRequest{Service: svc, JobType: cJobType, JobID: "j4", Payload: cPayload, Policy: p})
			require.NoError(t, err)
			require.Equal(t, KindRemoved, rem.Kind)
			adm, err := a.Admit(ctx, cAdmit(svc, "j4", p))
			require.NoError(t, err)
			require.True(t, adm.Kind == KindAccepted && !adm.AlreadyPresent, "A said j4 was already there: %+v", adm)
			require.Equal(t, []string{"j3", "j4"}, queuedIDs(storedState(t, st, svc, key.KVKey)))
			rem, err = bc.RemoveQueued(ctx, RemoveRequest{Service: svc, JobType: cJobType, JobID: "j4", Payload: cPayload, Policy: p})
			require.NoError(t, err)
			require.Equal(t, KindRemoved, rem.Kind)
			rem, err = a.RemoveQueued(ctx, RemoveRequest{Service: svc, JobType: cJobType, JobID: "j4", Payload: cPayload, Policy: p})
			require.NoError(t, err)
			require.Equal(t, KindNotFound, rem.Kind, "A removed a job B had removed already")

			// j2's lease lapses and B's j3 takes the slot over; A's renewal
			// of j2 must come back lost, not renewed from the cache.
			clock.Advance(3 * time.Second)
			acq3, err := bc.Acquire(ctx, cAcquire(svc, "j3", p, false))
			require.NoError(t, err)
			require.Equal(t, KindAcquired, acq3.Kind)
			require.Equal(t, []string{"j2"}, activeJobIDs(&KeyState{Active: acq3.Stale}), "stale slots taken over")
			ren, err := a.Renew(ctx, RenewRequest{Lease: acq2.Lease})
			require.NoError(t, err)
			require.Equal(t, KindLost, ren.Kind, "A renewed a slot that was taken over")
			rel, err = a.Release(ctx, ReleaseRequest{Lease: acq2.Lease})
			require.NoError(t, err)
			require.Equal(t, KindStaleCompletion, rel.Kind)
			require.Equal(t, []string{"j3"}, activeJobIDs(storedState(t, st, svc, key.KVKey)))

			// B releases the last slot (the key is deleted); A's cache still
			// shows j3 running.
			rel, err = bc.Release(ctx, ReleaseRequest{Lease: acq3.Lease})
			require.NoError(t, err)
			require.Equal(t, KindReleased, rel.Kind)
			acq, err := a.Acquire(ctx, cAcquire(svc, "j5", p, true))
			require.NoError(t, err)
			require.Equal(t, KindAcquired, acq.Kind, "A blocked on a slot that was released")
		})
	}
}

// A caller that changes an outcome's state (sorts it, trims it for
// display) must not change what the coordinator writes next.
func TestCoordinatorOutcomeStateIsTheCallers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := NewMemoryStore()
	svc := jkService("alias")
	key := cKey(t, svc)
	c := cCoordinator(t, st, nil)
	p := cPolicy()
	adm, err := c.Admit(ctx, cAdmit(svc, "j1", p))
	require.NoError(t, err)
	require.True(t, adm.State != nil, "no state in the outcome")
	adm.State.Queued[0].JobID = "changed-by-caller"
	adm.State.Queued = adm.State.Queued[:0]
	_, err = c.Admit(ctx, cAdmit(svc, "j2", p))
	require.NoError(t, err)
	require.Equal(t, []string{"j1", "j2"}, queuedIDs(storedState(t, st, svc, key.KVKey)),
		"the caller's change to Admission.State reached the store through the coordinator's cache")
}

// What the coordinator writes is what its outcome says, and what the TS
// original accepts.
func TestCoordinatorWritesTheOutcomeState(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := NewMemoryStore()
	svc := jkService("writes")
	key := cKey(t, svc)
	c := cCoordinator(t, st, &Config{StateCacheSize: -1})
	p := Policy{Key: cPolicy().Key, MaxActive: 2, MaxQueuedPerKey: 1, WhenFull: ReplaceOldest}
	check := func(what string, s *KeyState) {
		t.Helper()
		v, _ := stored(t, st, svc, key.KVKey)
		checkWritten(t, v)
		got, err := ParseState(v)
		require.NoError(t, err)
		require.Equal(t, normState(s), normState(got), "%s: stored state differs from the outcome's", what)
	}
	for _, id := range []string{"j1", "j2", "j3"} {
		adm, err := c.Admit(ctx, cAdmit(svc, id, p))
		require.NoError(t, err)
		require.Equal(t, KindAccepted, adm.Kind, "admit %s", id)
		check("admit "+id, adm.State)
	}
	rev := func() uint64 { _, r := stored(t, st, svc, key.KVKey); return r }
	// Full: replace-oldest drops j1 for j4; restoring puts j1 back.
	adm, err := c.Admit(ctx, cAdmit(svc, "j4", p))
	require.NoError(t, err)
	require.Equal(t, KindReplaced, adm.Kind)
	require.Equal(t, "j1", adm.Replaced.ID)
	check("replace", adm.State)
	res, err := c.RestoreReplaced(ctx, RestoreRequest{Service: svc, JobType: cJobType, ReplacementJobID: "j4", Replaced: *adm.Replaced, Payload: cPayload, Policy: p})
	require.NoError(t, err)
	check("restore", res.State)
	require.Equal(t, []string{"j1", "j2", "j3"}, queuedIDs(res.State))
	// Non-writing outcomes leave the revision alone.
	r := rev()
	strict := cAdmit(svc, "j5", p)
	strict.StrictCreate = true
	adm, err = c.Admit(ctx, strict)
	require.NoError(t, err)
	require.Equal(t, KindRejected, adm.Kind)
	acq, err := c.Acquire(ctx, cAcquire(svc, "j9", p, false))
	require.NoError(t, err)
	require.Equal(t, ReasonNotQueued, acq.Reason)
	require.Equal(t, r, rev(), "a non-writing outcome wrote")
	acq, err = c.Acquire(ctx, cAcquire(svc, "j2", p, false))
	require.NoError(t, err)
	require.Equal(t, KindAcquired, acq.Kind)
	check("acquire", acq.State)
	ren, err := c.Renew(ctx, RenewRequest{Lease: acq.Lease})
	require.NoError(t, err)
	require.Equal(t, KindRenewed, ren.Kind)
	check("renew", ren.State)
}

// jkClock is a settable clock for Config.Now.
type jkClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *jkClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }

func (c *jkClock) Advance(d time.Duration) { c.mu.Lock(); c.t = c.t.Add(d); c.mu.Unlock() }

// With Config.Now and Config.NewSlotToken fixed, a run is deterministic:
// the same operations give the same outcomes and the same stored bytes.
func TestCoordinatorDeterministic(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	run := func() ([]string, []byte, Lease) {
		st := NewMemoryStore()
		svc := "determinism"
		n := 0
		c := cCoordinator(t, st, &Config{InstanceID: "inst-a", Now: func() time.Time { return rt0 },
			NewSlotToken: func() string { n++; return "tok-" + strconv.Itoa(n) }})
		p := Policy{Key: cPolicy().Key, MaxActive: 1, MaxQueuedPerKey: 2}
		var trace []string
		for _, id := range []string{"j1", "j2"} {
			adm, err := c.Admit(ctx, cAdmit(svc, id, p))
			require.NoError(t, err)
			trace = append(trace, string(adm.Kind))
		}
		acq, err := c.Acquire(ctx, cAcquire(svc, "j1", p, false))
		require.NoError(t, err)
		trace = append(trace, string(acq.Kind), acq.Lease.SlotToken)
		blk, err := c.Acquire(ctx, cAcquire(svc, "j2", p, false))
		require.NoError(t, err)
		trace = append(trace, string(blk.Kind), string(blk.Reason))
		v, _ := stored(t, st, svc, cKey(t, svc).KVKey)
		return trace, v, acq.Lease
	}
	trace1, bytes1, lease := run()
	trace2, bytes2, _ := run()
	require.Equal(t, trace1, trace2)
	require.Equal(t, string(bytes1), string(bytes2))
	// Tokens are drawn per Acquire call, blocked ones included.
	require.Equal(t, []string{"accepted", "accepted", "acquired", "tok-1", "blocked", "active-limit"}, trace1)

	key := cKey(t, "determinism")
	np, _ := Policy{Key: cPolicy().Key, MaxActive: 1, MaxQueuedPerKey: 2}.Normalize()
	want := &KeyState{Version: 1, Service: "determinism", JobType: cJobType, DisplayKey: "tenant:acme", KeyHash: key.KeyHash,
		MaxActive: 1, MaxQueuedPerKey: 2,
		Active: []ActiveSlot{{JobID: "j1", SlotToken: "tok-1", InstanceID: "inst-a", StartedAt: rt0, HeartbeatAt: rt0,
			LeaseExpiresAt: rt0.Add(120 * time.Second), Tries: 1, Context: rctx("j1")}},
		Queued:    []QueuedJob{rq("j2", rt0)},
		UpdatedAt: rt0}
	require.Equal(t, string(encodeState(t, want)), string(bytes1))
	require.Equal(t, Lease{Service: "determinism", JobType: cJobType, JobID: "j1", DisplayKey: "tenant:acme", KeyHash: key.KeyHash,
		SlotToken: "tok-1", Policy: np, LeaseExpiresAt: rt0.Add(120 * time.Second)}, lease)
}

// noIOStore returns a store that fails t on any call (and wraps no store):
// for checks that must happen before any I/O.
func noIOStore(t testing.TB) *hookStore {
	return newHookStore(nil, passNone).withHook(func(_ context.Context, c storeCall, _ func() storeResult) storeResult {
		t.Errorf("unexpected %s", c.op)
		return storeResult{err: errors.New("no I/O")}
	})
}

func TestCoordinatorRejectsBadInputBeforeIO(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := cCoordinator(t, noIOStore(t), nil)
	p := cPolicy()
	np, _ := p.Normalize()
	svc := "svc"
	key := cKey(t, svc)
	lease := Lease{Service: svc, JobType: cJobType, JobID: "j1", DisplayKey: key.DisplayKey, KeyHash: key.KeyHash, SlotToken: "tok", Policy: np}
	is := func(what string, err, want error) {
		t.Helper()
		require.True(t, errors.Is(err, want), "%s: want %v, got %v", what, want, err)
	}
	_, err := c.Admit(ctx, cAdmit(svc, "", p))
	is("empty job id", err, ErrInvalidRequest)
	_, err = c.Admit(ctx, cAdmit("bad.service", "j1", p))
	is("bad service", err, ErrInvalidName)
	bad := cAdmit(svc, "j1", Policy{Key: []string{"/a~2"}})
	_, err = c.Admit(ctx, bad)
	is("bad policy", err, ErrInvalidPolicy)
	noKey := cAdmit(svc, "j1", Policy{Key: []string{"/missing"}})
	_, err = c.Admit(ctx, noKey)
	is("pointer to nothing", err, ErrInvalidKey)
	acq := cAcquire(svc, "j1", p, true)
	acq.Tries = -1
	_, err = c.Acquire(ctx, acq)
	is("negative tries", err, ErrInvalidRequest)
	for name, l := range map[string]Lease{
		"zero lease":       {},
		"no token":         func() Lease { l := lease; l.SlotToken = ""; return l }(),
		"no job id":        func() Lease { l := lease; l.JobID = ""; return l }(),
		"bad key hash":     func() Lease { l := lease; l.KeyHash = "ABC"; return l }(),
		"no policy":        func() Lease { l := lease; l.Policy = Policy{}; return l }(),
		"bad service":      func() Lease { l := lease; l.Service = "a b"; return l }(),
		"upper-case hash":  func() Lease { l := lease; l.KeyHash = strings.ToUpper(key.KeyHash); return l }(),
		"hash of 63 chars": func() Lease { l := lease; l.KeyHash = key.KeyHash[:63]; return l }(),
	} {
		_, err := c.Renew(ctx, RenewRequest{Lease: l})
		require.True(t, err != nil, "Renew with %s accepted", name)
		_, err = c.Release(ctx, ReleaseRequest{Lease: l})
		require.True(t, err != nil, "Release with %s accepted", name)
	}
	_, err = c.RestoreReplaced(ctx, RestoreRequest{Service: svc, JobType: cJobType, ReplacementJobID: "j2", Payload: cPayload, Policy: p})
	is("restore without a replaced job", err, ErrInvalidRequest)

	tok := cCoordinator(t, noIOStore(t), &Config{NewSlotToken: func() string { return "" }})
	_, err = tok.Acquire(ctx, cAcquire(svc, "j1", p, true))
	is("empty slot token", err, ErrInvalidRequest)
}

func TestNewCoordinatorConfig(t *testing.T) {
	t.Parallel()
	_, err := NewCoordinator(nil, nil)
	require.True(t, err != nil, "nil store accepted")
	for field, cfg := range map[string]*Config{
		"MaxAttempts":     {MaxAttempts: -1},
		"RetryBackoff":    {RetryBackoff: -time.Second},
		"MaxRetryBackoff": {RetryBackoff: time.Second, MaxRetryBackoff: time.Millisecond},
	} {
		_, err := NewCoordinator(NewMemoryStore(), cfg)
		require.True(t, err != nil, "bad %s accepted", field)
		require.True(t, strings.Contains(err.Error(), field), "error does not name %s: %v", field, err)
	}
	c, err := NewCoordinator(NewMemoryStore(), nil)
	require.NoError(t, err)
	require.True(t, c.InstanceID() != "", "no default instance id")
	c, err = NewCoordinator(NewMemoryStore(), &Config{InstanceID: "me"})
	require.NoError(t, err)
	require.Equal(t, "me", c.InstanceID())

	// Default slot tokens are random version 4 UUIDs.
	st := NewMemoryStore()
	c = cCoordinator(t, st, nil)
	seen := map[string]bool{}
	for i := range 20 {
		acq, err := c.Acquire(context.Background(), cAcquire("uuid", "j"+strconv.Itoa(i), Policy{Key: cPolicy().Key, MaxActive: 100}, true))
		require.NoError(t, err)
		require.Regexp(t, `^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`, acq.Lease.SlotToken)
		require.True(t, !seen[acq.Lease.SlotToken], "token repeated")
		seen[acq.Lease.SlotToken] = true
	}
}

// Whatever request the coordinator accepts, it must write a state that it
// (and any other worker) can read back with the same job ids: otherwise one
// bad request makes the key corrupt for everyone, or strands a job that
// only the writer's cache can see. Rejecting the request before writing
// (ErrInvalidRequest or ErrInvalidPolicy) is the other acceptable answer.
func TestCoordinatorNeverWritesWhatItCannotRead(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p := cPolicy()
	huge := 1 << 60
	cases := []struct {
		name string
		job  string
		op   func(c *KeyCoordinator, svc string) error
	}{
		{"Tries above 2^53", "j1", func(c *KeyCoordinator, svc string) error {
			r := cAcquire(svc, "j1", p, true)
			r.Tries = huge
			_, err := c.Acquire(ctx, r)
			return err
		}},
		{"MaxActive above 2^53", "j1", func(c *KeyCoordinator, svc string) error {
			hp := p
			hp.MaxActive = huge
			_, err := c.Admit(ctx, cAdmit(svc, "j1", hp))
			return err
		}},
		{"MaxQueuedPerKey above 2^53", "j1", func(c *KeyCoordinator, svc string) error {
			hp := p
			hp.MaxQueuedPerKey = huge
			_, err := c.Admit(ctx, cAdmit(svc, "j1", hp))
			return err
		}},
		{"job id not UTF-8, admitted", "bad\xff", func(c *KeyCoordinator, svc string) error {
			_, err := c.Admit(ctx, cAdmit(svc, "bad\xff", p))
			return err
		}},
		{"job id not UTF-8, acquired as a retry", "bad\xfe", func(c *KeyCoordinator, svc string) error {
			_, err := c.Acquire(ctx, cAcquire(svc, "bad\xfe", p, true))
			return err
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			st := NewMemoryStore()
			svc := jkService("unreadable")
			key := cKey(t, svc)
			err := c.op(cCoordinator(t, st, nil), svc)
			if err != nil {
				require.True(t, errors.Is(err, ErrInvalidRequest) || errors.Is(err, ErrInvalidPolicy), "rejected with an unexpected error: %v", err)
				_, _, gerr := st.Get(ctx, svc, key.KVKey)
				require.True(t, errors.Is(gerr, ErrKeyNotFound), "a rejected request wrote: %v", gerr)
				return
			}
			v, _ := stored(t, st, svc, key.KVKey)
			s, perr := ParseState(v)
			if perr != nil {
				t.Fatalf("the coordinator wrote a state it cannot read back (every later operation on the key fails as corrupt): %v\n%s", perr, v)
			}
			ids := append(activeJobIDs(s), queuedIDs(s)...)
			require.Equal(t, []string{c.job}, ids, "job ids as another worker reads them")
			// Another coordinator carries on with the key.
			_, err = cCoordinator(t, st, nil).Admit(ctx, cAdmit(svc, "next", p))
			require.NoError(t, err, "the next operation on the key")
		})
	}
}

// A Go worker picks up state the TS original (or its Rust port) wrote:
// the vectors in testdata/states, stored under the KV key the policy
// derives. It updates them keeping the other side's entries, and what it
// writes passes the TS original's isJobKeyState.
func TestCoordinatorContinuesStateWrittenByOthers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// The vectors' policy: key ["tenant","/tenant"], maxActive 2, maxQueuedPerKey 3, replace-oldest.
	p := Policy{Key: []string{"tenant", "/tenant"}, MaxActive: 2, MaxQueuedPerKey: 3, WhenFull: ReplaceOldest}
	payload := []byte(`{"tenant":"acme"}`)
	for _, b := range coordBackends(t) {
		for _, name := range stateVectorNames(t) {
			t.Run(b.name+"/"+name, func(t *testing.T) {
				// The vectors are of service "fixtures": a store of its own.
				st := b.fresh(t)
				key, err := DeriveKey("fixtures", "sync", payload, p.Key)
				require.NoError(t, err)
				doc := readStateVector(t, name)
				orig, err := ParseState(doc)
				require.NoError(t, err)
				require.Equal(t, orig.KeyHash, key.KeyHash, "the vector's keyHash is not the one DeriveKey gives for its policy")
				_, err = st.Create(ctx, "fixtures", key.KVKey, doc)
				require.NoError(t, err)
				clock := &jkClock{t: time.Date(2026, 11, 30, 10, 0, 40, 0, time.UTC)}
				c := cCoordinator(t, st, &Config{InstanceID: "go-worker", IgnoreClockSkew: true, Now: clock.Now})

				adm, err := c.Admit(ctx, AdmitRequest{Service: "fixtures", JobType: "sync", JobID: "go-job", Payload: payload, Policy: p, Context: rctx("go-job")})
				require.NoError(t, err)
				require.Equal(t, KindAccepted, adm.Kind)
				v, _ := stored(t, st, "fixtures", key.KVKey)
				checkWritten(t, v)
				s := storedState(t, st, "fixtures", key.KVKey)
				require.Equal(t, append(queuedIDs(orig), "go-job"), queuedIDs(s), "queue after the Go admission")
				require.Equal(t, len(orig.Active), len(s.Active))
				for i := range orig.Active {
					want := orig.Active[i]
					if want.Context.IsZero() {
						require.True(t, !s.Active[i].Context.IsZero(), "slot %d written back without context", i)
						want.Context = s.Active[i].Context
					}
					require.Equal(t, want, s.Active[i], "the other side's slot %d", i)
				}

				// Go acquires the other side's queued job (a redelivery), and
				// releases the other side's running job with its token.
				acq, err := c.Acquire(ctx, AcquireRequest{Service: "fixtures", JobType: "sync", JobID: orig.Queued[0].JobID, Payload: payload, Policy: p})
				require.NoError(t, err)
				if len(orig.Active) >= p.MaxActive {
					require.Equal(t, KindBlocked, acq.Kind)
				} else {
					require.Equal(t, KindAcquired, acq.Kind)
				}
				np, err := p.Normalize()
				require.NoError(t, err)
				for _, slot := range orig.Active {
					rel, err := c.Release(ctx, ReleaseRequest{Lease: Lease{Service: "fixtures", JobType: "sync", JobID: slot.JobID,
						DisplayKey: key.DisplayKey, KeyHash: key.KeyHash, SlotToken: slot.SlotToken, Policy: np}})
					require.NoError(t, err)
					require.Equal(t, KindReleased, rel.Kind, "release of the other side's slot %s", slot.JobID)
				}
				v, _ = stored(t, st, "fixtures", key.KVKey)
				checkWritten(t, v)
			})
		}
	}
}

// A read that found the key absent and returns after this coordinator
// created the key must not discard that write: the operation continues from
// the coordinator's own newer state instead of creating the key again and
// losing a compare-and-swap race to itself. Before, it forgot the cached
// state and its Create failed: a race lost, and a backoff, with nobody else
// writing.
func TestCoordinatorAbsentReadDoesNotRaceItself(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// The store holds the first Get after armed is set until release,
	// having read the value already: a read that is answered late.
	var armed atomic.Bool
	entered, release := make(chan struct{}), make(chan struct{})
	gated := newHookStore(newCountingStore(NewMemoryStore()), passNone).withHook(func(_ context.Context, c storeCall, call func() storeResult) storeResult {
		r := call()
		if c.op == opGet && armed.CompareAndSwap(true, false) {
			close(entered)
			<-release
		}
		return r
	})
	c := cCoordinator(t, gated, nil)
	svc := jkService("absent")
	p := Policy{Key: cPolicy().Key, MaxActive: 2, MaxQueuedPerKey: 2}
	armed.Store(true)
	type result struct {
		acq  Acquisition
		err  error
		lost int
	}
	done := make(chan result, 1)
	go func() {
		actx, races := withRaceCounter(ctx)
		acq, err := c.Acquire(actx, cAcquire(svc, "retry", p, true))
		lost, stale := races.counts()
		done <- result{acq, err, lost + stale}
	}()
	<-entered // the acquisition read the key absent
	adm, err := c.Admit(ctx, cAdmit(svc, "queued", p))
	require.NoError(t, err)
	require.Equal(t, KindAccepted, adm.Kind)
	close(release)
	res := <-done
	require.NoError(t, res.err)
	assert.Equal(t, KindAcquired, res.acq.Kind)
	assert.Zero(t, res.lost, "compare-and-swap failures with no other writer")
	s := storedState(t, gated, svc, cKey(t, svc).KVKey)
	assert.Equal(t, []string{"retry"}, activeJobIDs(s))
	assert.Equal(t, []string{"queued"}, queuedIDs(s))
}

// Renew checks the lease's policy as Acquire checks a policy: a lease that
// claims a HeartbeatTTL of math.MaxInt64 is an error, and nothing is
// written. Before, it extended the lease to the year 2319.
func TestCoordinatorRenewValidatesLeasePolicy(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := NewMemoryStore()
	c := cCoordinator(t, st, nil)
	svc := jkService("leasepolicy")
	key := cKey(t, svc)
	p := cPolicy()
	_, err := c.Admit(ctx, cAdmit(svc, "j", p))
	require.NoError(t, err)
	acq, err := c.Acquire(ctx, cAcquire(svc, "j", p, false))
	require.NoError(t, err)
	require.Equal(t, KindAcquired, acq.Kind)
	before, _ := stored(t, st, svc, key.KVKey)

	for name, mutate := range map[string]func(*Lease){
		"HeartbeatTTL MaxInt64":   func(l *Lease) { l.Policy.HeartbeatTTL = math.MaxInt64 },
		"HeartbeatTTL over limit": func(l *Lease) { l.Policy.HeartbeatTTL = HeartbeatTTLLimit + time.Millisecond },
		"TTL not over interval":   func(l *Lease) { l.Policy.HeartbeatInterval = l.Policy.HeartbeatTTL },
	} {
		lease := acq.Lease
		mutate(&lease)
		_, err := c.Renew(ctx, RenewRequest{Lease: lease})
		require.ErrorIs(t, err, ErrInvalidRequest, name)
		require.ErrorIs(t, err, ErrInvalidPolicy, name)
		assert.Contains(t, err.Error(), "Lease.Policy", name)
		_, err = c.Release(ctx, ReleaseRequest{Lease: lease})
		require.ErrorIs(t, err, ErrInvalidPolicy, name)
	}
	after, _ := stored(t, st, svc, key.KVKey)
	assert.Equal(t, string(before), string(after))
	ren, err := c.Renew(ctx, RenewRequest{Lease: acq.Lease})
	require.NoError(t, err)
	assert.Equal(t, KindRenewed, ren.Kind)
}

// An acquisition under other limits than the state was written under says
// so in Acquisition.StoredLimits, acquired or blocked.
func TestCoordinatorAcquireReportsOtherLimits(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := cCoordinator(t, NewMemoryStore(), nil)
	svc := jkService("limits")
	producer := Policy{Key: cPolicy().Key, MaxActive: 1, MaxQueuedPerKey: 3}
	worker := Policy{Key: cPolicy().Key, MaxActive: 2, MaxQueuedPerKey: 3}
	for _, id := range []string{"a", "b", "c"} {
		_, err := c.Admit(ctx, cAdmit(svc, id, producer))
		require.NoError(t, err)
	}
	same, err := c.Acquire(ctx, cAcquire(svc, "a", producer, false))
	require.NoError(t, err)
	require.Equal(t, KindAcquired, same.Kind)
	assert.Nil(t, same.StoredLimits, "same limits")

	other, err := c.Acquire(ctx, cAcquire(svc, "b", worker, false))
	require.NoError(t, err)
	require.Equal(t, KindAcquired, other.Kind, "MaxActive 2 lets b start beside a")
	assert.Equal(t, &Limits{MaxActive: 1, MaxQueuedPerKey: 3}, other.StoredLimits)

	blocked, err := c.Acquire(ctx, cAcquire(svc, "c", producer, false))
	require.NoError(t, err)
	require.Equal(t, KindBlocked, blocked.Kind)
	assert.Equal(t, &Limits{MaxActive: 2, MaxQueuedPerKey: 3}, blocked.StoredLimits)
	assert.True(t, strings.Contains(string(blocked.Reason), "active"))
}
