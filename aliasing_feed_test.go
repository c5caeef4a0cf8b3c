package jobkeys

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
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

// Review of the pooled encode buffers and the shared arrays of key entries
// (snapshotOver) on the paths TestReturnedStatesBelongToTheCaller does not
// take: a Watcher feeding the key entries of two coordinators of one
// process (keyTable.watched, held, materialize), Runners waiting on that
// feed, lost races that the watch answers or does not (fake conflicts),
// replies lost after the write (the watch delivers a write whose reply
// failed), and batches the store refuses as too large (the solo reruns).

// bufferCheckStore checks that a value handed to Create or Update does not
// change while the call runs (an encode buffer reused under a write in
// flight), records a copy of every value written, and injects faults: fake
// conflicts that write nothing, and for admissions only, lost replies (the
// write is made, the reply says it lost a race). It hides the inner store's
// value limit, so that too-large batches reach the store (and rerun solo).
type bufferCheckStore struct {
	inner Store
	rec   *recordingStore
	mu    sync.Mutex
	rng   *rand.Rand
	// changed counts values that changed during the call that wrote them.
	changed   atomic.Int64
	fakes     atomic.Int64
	lostReply atomic.Int64
	tooLarge  atomic.Int64
}

type admitMark struct{}

func (s *bufferCheckStore) roll(n int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.rng.IntN(n) == 0
}

// admissionsOnly reports whether every operation the write is for is an
// admission of the test's (its context carries admitMark).
func admissionsOnly(ctx context.Context) bool {
	for _, c := range batchContexts(ctx) {
		if c.Value(admitMark{}) == nil {
			return false
		}
	}
	return true
}

func (s *bufferCheckStore) write(ctx context.Context, value []byte, do func() (uint64, error)) (uint64, error) {
	if s.roll(10) {
		s.fakes.Add(1)
		return 0, fmt.Errorf("%w: injected by the test", ErrRevisionConflict)
	}
	before := bytes.Clone(value)
	rev, err := do()
	if !bytes.Equal(before, value) {
		s.changed.Add(1)
	}
	if errors.Is(err, ErrStateTooLarge) {
		s.tooLarge.Add(1)
	}
	if err != nil {
		return rev, err
	}
	s.rec.record(before)
	if admissionsOnly(ctx) && s.roll(5) {
		s.lostReply.Add(1)
		return 0, fmt.Errorf("%w: reply lost (injected by the test; the write was made)", ErrRevisionConflict)
	}
	return rev, nil
}

func (s *bufferCheckStore) Get(ctx context.Context, service, key string) ([]byte, uint64, error) {
	return s.inner.Get(ctx, service, key)
}

func (s *bufferCheckStore) Create(ctx context.Context, service, key string, value []byte) (uint64, error) {
	return s.write(ctx, value, func() (uint64, error) { return s.inner.Create(ctx, service, key, value) })
}

func (s *bufferCheckStore) Update(ctx context.Context, service, key string, value []byte, revision uint64) (uint64, error) {
	return s.write(ctx, value, func() (uint64, error) { return s.inner.Update(ctx, service, key, value, revision) })
}

func (s *bufferCheckStore) Delete(ctx context.Context, service, key string, revision uint64) error {
	return s.inner.Delete(ctx, service, key, revision)
}

// Two coordinators of one process share a Watcher over one memory store;
// workers admit jobs on one key (scribbling over each admission's State),
// run them with each coordinator's Runner (renewing once in the handler and
// scribbling over the renewal's State), while some admissions are refused
// as too large. Every value written parses and carries nothing scribbled,
// every State returned was stored as returned, and no value changed while
// it was being written.
func TestFedStatesAndEncodeBuffersUnderFaults(t *testing.T) {
	t.Parallel()
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	ctx := context.Background()
	mem := NewMemoryStore()
	// The coordinators do not see the store's limit: a state over it is
	// refused by the store.
	require.NoError(t, mem.SetMaxValueSize(3000))
	st := &bufferCheckStore{inner: mem, rec: newRecordingStore(mem), rng: rand.New(rand.NewPCG(uint64(seed), 1))}
	w, err := NewWatcher(mem)
	require.NoError(t, err)
	t.Cleanup(w.Close)
	svc := jkService("feed")
	policy := Policy{Key: []string{"tenant", "/tenant"}, MaxActive: 2, MaxQueuedPerKey: 64, HeartbeatInterval: time.Second, HeartbeatTTL: 10 * time.Second}
	payload := benchPayload(0)

	type process struct {
		jt *JobType
		r  *Runner
	}
	var procs []process
	for range 2 {
		c := cCoordinator(t, st, &Config{RetryBackoff: time.Millisecond, MaxRetryBackoff: 5 * time.Millisecond, MaxAttempts: 1000})
		jt, err := c.JobType(svc, benchJobType, policy)
		require.NoError(t, err)
		r, err := NewRunner(jt, &RunnerConfig{Watcher: w, RecheckInterval: 20 * time.Millisecond, MaxWait: time.Minute})
		require.NoError(t, err)
		procs = append(procs, process{jt: jt, r: r})
	}

	var (
		mu       sync.Mutex
		returned [][]byte
		ran      atomic.Int64
		refused  atomic.Int64
	)
	took := func(s *KeyState) {
		if s == nil {
			return
		}
		v := appendState(nil, s)
		scribble(s)
		mu.Lock()
		returned = append(returned, v)
		mu.Unlock()
	}
	const workers, jobs = 6, 15
	var wg sync.WaitGroup
	for wk := range workers {
		p := procs[wk%len(procs)]
		wg.Go(func() {
			for j := range jobs {
				id := fmt.Sprintf("w%d-j%d", wk, j)
				adm, err := p.jt.Admit(context.WithValue(ctx, admitMark{}, true), id, payload)
				if errors.Is(err, ErrStateTooLarge) {
					refused.Add(1)
					continue
				}
				if !assert.NoError(t, err, "admit %s", id) || !assert.Equal(t, KindAccepted, adm.Kind, "admit %s", id) {
					return
				}
				took(adm.State)
				_, err = p.r.Run(ctx, id, payload, func(hctx context.Context, lease Lease) error {
					ren, err := p.jt.Renew(hctx, lease)
					if err != nil {
						return err
					}
					if ren.Kind != KindRenewed {
						return fmt.Errorf("renewal of %s: %s", id, ren.Kind)
					}
					took(ren.State)
					return nil
				})
				if !assert.NoError(t, err, "run %s", id) {
					return
				}
				ran.Add(1)
			}
		})
	}
	// Admissions of jobs whose ids alone outgrow the store's limit, riding
	// in the workers' batches: refused by the store, each batch reruns solo.
	stop := make(chan struct{})
	var big sync.WaitGroup
	big.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			id := fmt.Sprintf("big-%d-%s", i, strings.Repeat("x", 3000))
			_, err := procs[i%len(procs)].jt.Admit(context.WithValue(ctx, admitMark{}, true), id, payload)
			if !assert.ErrorIs(t, err, ErrStateTooLarge, "admit %d", i) {
				return
			}
			refused.Add(1)
		}
	})
	wg.Wait()
	close(stop)
	big.Wait()
	t.Logf("ran %d, refused %d; fake conflicts %d, lost replies %d, too large %d",
		ran.Load(), refused.Load(), st.fakes.Load(), st.lostReply.Load(), st.tooLarge.Load())

	assert.Zero(t, st.changed.Load(), "values changed while they were being written")
	st.rec.check(t)
	for i, v := range returned {
		assert.True(t, st.rec.has(v), "returned state %d was never stored as returned: %s", i, v)
	}
	require.Positive(t, ran.Load())
	require.Positive(t, st.fakes.Load(), "no fake conflict: the test did not test lost races")
	require.Positive(t, st.lostReply.Load(), "no lost reply: the test did not test them")
	require.Positive(t, st.tooLarge.Load(), "no value refused as too large: the test did not test it")
	// Every job either ran or was refused: the key ends empty.
	_, _, err = mem.Get(ctx, svc, mustKey(t, procs[0].jt, payload).KVKey)
	require.ErrorIs(t, err, ErrKeyNotFound, "the key holds jobs no one ran")
}

// fakeConflictStore fails every Update with a conflict that writes
// nothing while armed, and counts them.
type fakeConflictStore struct {
	*MemoryStore
	armed atomic.Bool
	fakes atomic.Int64
}

func (s *fakeConflictStore) Update(ctx context.Context, service, key string, value []byte, revision uint64) (uint64, error) {
	if s.armed.Load() {
		s.fakes.Add(1)
		return 0, fmt.Errorf("%w: injected by the test", ErrRevisionConflict)
	}
	return s.MemoryStore.Update(ctx, service, key, value, revision)
}

// A release on a key the Watcher feeds (3c67174: it does not pause after a
// lost race there) whose lost races the watch never answers, since nothing
// was written: it falls back to a read after watchFallback each time, not
// a busy loop, and succeeds once the races stop, not held up by the key's
// backoff window (an hour here).
func TestFedReleaseLostRacesWithoutDelivery(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	mem := NewMemoryStore()
	st := &fakeConflictStore{MemoryStore: mem}
	c := cCoordinator(t, st, &Config{RetryBackoff: time.Hour, MaxRetryBackoff: time.Hour})
	w, err := NewWatcher(mem)
	require.NoError(t, err)
	t.Cleanup(w.Close)
	svc := jkService("nodeliver")
	p := Policy{Key: cPolicy().Key, MaxActive: 1, MaxQueuedPerKey: 4, HeartbeatInterval: time.Second, HeartbeatTTL: time.Minute}
	key := cKey(t, svc)

	// A waiter's subscription feeds the key's changes to c's entry.
	sub, err := w.subscribeWaiter(ctx, svc, key.KVKey, "other", p.MaxActive, c.keys)
	require.NoError(t, err)
	defer sub.Close()
	for _, id := range []string{"j1", "j2"} { // j2 stays queued: the release is an Update
		_, err = c.Admit(ctx, cAdmit(svc, id, p))
		require.NoError(t, err)
	}
	acq, err := c.Acquire(ctx, cAcquire(svc, "j1", p, false))
	require.NoError(t, err)
	require.Equal(t, KindAcquired, acq.Kind)
	e := c.keys.entry(key.KVKey)
	require.NotNil(t, e)
	require.Eventually(t, e.fed, rtWait, time.Millisecond, "the entry is never fed")

	const racing = 500 * time.Millisecond
	st.armed.Store(true)
	time.AfterFunc(racing, func() { st.armed.Store(false) })
	rctx, cancel := context.WithTimeout(ctx, rtWait)
	defer cancel()
	start := time.Now()
	rel, err := c.Release(rctx, ReleaseRequest{Lease: acq.Lease})
	took := time.Since(start)
	require.NoError(t, err, "the release paused by the key's window (an hour) after %v", took)
	assert.Equal(t, KindReleased, rel.Kind)
	fakes := st.fakes.Load()
	t.Logf("%d lost races in %v", fakes, took)
	require.Positive(t, fakes, "the release never lost a race: the test did not test it")
	// One attempt per watchFallback at most (and the first at once), with
	// room for a loaded machine's late timers: not a loop without pauses.
	assert.LessOrEqual(t, fakes, int64(2+racing/watchFallback), "attempts while the races lasted")
}

// A Runner waiting through its Watcher on a NATS key, whose watch's
// consumer lags behind two writes of the key (55fbf73: the first, the
// release that frees the slot, is replaced in the bucket's stream by the
// second, an admission, before the consumer reads it): the waiter is woken
// by the later revision alone and takes the slot. No recheck covers for a
// missed wake-up (RecheckInterval an hour, the other lease an hour too).
func TestRunnerWokenThroughReplacedRevision(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := natstest.Run(t)
	service := rtService()
	policy := Policy{Key: benchPolicy.Key, MaxActive: 1, MaxQueuedPerKey: 8, HeartbeatInterval: time.Minute, HeartbeatTTL: time.Hour}
	payload := benchPayload(0)
	mine := newWorkerProcess(t, s, service, policy, nil, nil)
	other := newWorkerProcess(t, s, service, policy, nil, nil)
	r, err := NewRunner(mine.jt, &RunnerConfig{Watcher: mine.w, RecheckInterval: time.Hour})
	require.NoError(t, err)
	kvKey := mustKey(t, mine.jt, payload).KVKey

	_, err = other.jt.Admit(ctx, "o1", payload)
	require.NoError(t, err)
	held, err := other.jt.Acquire(ctx, "o1", payload)
	require.NoError(t, err)
	require.Equal(t, KindAcquired, held.Kind)
	_, err = mine.jt.Admit(ctx, "m1", payload)
	require.NoError(t, err)

	done := make(chan struct{})
	var runErr error
	go func() {
		defer close(done)
		_, runErr = r.Run(ctx, "m1", payload, func(context.Context, Lease) error { return nil })
	}()
	require.Eventually(t, func() bool {
		mine.w.mu.Lock()
		defer mine.w.mu.Unlock()
		sw := mine.w.watches[service]
		return sw != nil && sw.keys[kvKey] != nil && len(sw.keys[kvKey].waiters) == 1
	}, rtWait, time.Millisecond, "m1 never waited")

	// mine's Watcher's consumer is the only one on the bucket's stream.
	stream, err := mine.store.js.Stream(ctx, "KV_"+mine.store.BucketName(service))
	require.NoError(t, err)
	var consumers []string
	for name := range stream.ConsumerNames(ctx).Name() {
		consumers = append(consumers, name)
	}
	require.Len(t, consumers, 1, "consumers of the bucket's stream")
	_, err = stream.PauseConsumer(ctx, consumers[0], time.Now().Add(time.Hour))
	require.NoError(t, err)
	rel, err := other.jt.Release(ctx, held.Lease)
	require.NoError(t, err)
	require.Equal(t, KindReleased, rel.Kind)
	_, relRev, err := other.store.Get(ctx, service, kvKey)
	require.NoError(t, err)
	adm, err := other.jt.Admit(ctx, "o2", payload) // replaces the release in the stream
	require.NoError(t, err)
	require.Equal(t, KindAccepted, adm.Kind)
	_, err = stream.GetMsg(ctx, relRev)
	require.ErrorIs(t, err, jetstream.ErrMsgNotFound, "the release is still in the stream: the watch can deliver it, and the test tests nothing")
	select {
	case <-done:
		t.Fatalf("m1 ran while the watch's consumer was paused: %v", runErr)
	default:
	}
	_, err = stream.ResumeConsumer(ctx, consumers[0])
	require.NoError(t, err)
	_, err = other.store.Create(ctx, service, service+".other.wake", []byte("x")) // wakes the resumed consumer
	require.NoError(t, err)

	select {
	case <-done:
	case <-time.After(rtWait):
		t.Fatal("m1 was never woken by the admission that replaced the release")
	}
	require.NoError(t, runErr)
}
