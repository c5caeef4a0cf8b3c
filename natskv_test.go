package jobkeys

import (
	"context"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jobkeys/jobkeys/internal/jscas"
	"github.com/jobkeys/jobkeys/internal/natstest"
)

func TestNATSStoreMissingBucket(t *testing.T) {
	t.Parallel()
	n := startJKNATS(t)
	ctx := context.Background()
	st, err := NewNATSStore(n.js) // no WithCreateBuckets
	require.NoError(t, err)
	svc := jkService("missing")
	bucket := "JOBS_KEYS_" + svc
	require.Equal(t, bucket, st.BucketName(svc))

	check := func(what string, err error) {
		t.Helper()
		require.ErrorIs(t, err, ErrBucketNotFound, "%s: want ErrBucketNotFound, got %v", what, err)
		require.ErrorContains(t, err, bucket, "%s: the error names the bucket", what)
	}
	_, _, err = st.Get(ctx, svc, "k")
	check("Get", err)
	_, err = st.Create(ctx, svc, "k", []byte("v"))
	check("Create", err)
	_, err = st.Update(ctx, svc, "k", []byte("v"), 1)
	check("Update", err)
	check("Delete", st.Delete(ctx, svc, "k", 1))
	_, err = st.KeyValue(ctx, svc)
	check("KeyValue", err)

	// Through a coordinator, the same error comes out.
	c, err := NewCoordinator(st, nil)
	require.NoError(t, err)
	_, err = c.Admit(ctx, AdmitRequest{Service: svc, JobType: "job", JobID: "j1", Payload: []byte(`{"tenant":"a"}`),
		Policy: Policy{Key: []string{"/tenant"}}})
	check("Admit", err)

	// Nothing was created behind our back, and a failure is not cached:
	// once the bucket exists the same store uses it.
	_, err = n.js.KeyValue(ctx, bucket)
	require.ErrorIs(t, err, jetstream.ErrBucketNotFound, "the store created the bucket without WithCreateBuckets: %v", err)
	n.createBucket(t, svc, 0, 1)
	rev, err := st.Create(ctx, svc, "k", []byte("v"))
	require.NoError(t, err, "Create once the bucket exists")
	require.Positive(t, rev)
}

func TestNATSStoreCreatesBucket(t *testing.T) {
	t.Parallel()
	n := startJKNATS(t)
	ctx := context.Background()
	svc := jkService("create")
	st, err := NewNATSStore(n.js, WithCreateBuckets(jetstream.MemoryStorage, 1))
	require.NoError(t, err)
	_, err = st.Create(ctx, svc, "k", []byte("v"))
	require.NoError(t, err)
	kv, err := n.js.KeyValue(ctx, "JOBS_KEYS_"+svc)
	require.NoError(t, err, "bucket JOBS_KEYS_%s", svc)
	status, err := kv.Status(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(1), status.History(), "bucket history")
	cfg := status.(*jetstream.KeyValueBucketStatus).StreamInfo().Config
	require.Equal(t, jetstream.MemoryStorage, cfg.Storage)
	require.Equal(t, 1, cfg.Replicas)

	// Stores on other connections find the bucket, and a second store with
	// the create option does not fail because it exists.
	_, js2 := natstest.Connect(t, n.srv)
	st2, err := NewNATSStore(js2, WithCreateBuckets(jetstream.MemoryStorage, 1))
	require.NoError(t, err)
	v, _, err := st2.Get(ctx, svc, "k")
	require.NoError(t, err)
	require.Equal(t, "v", string(v))

	// Another prefix is another bucket.
	st3, err := NewNATSStore(n.js, WithBucketPrefix("OTHER_KEYS"), WithCreateBuckets(jetstream.MemoryStorage, 1))
	require.NoError(t, err)
	require.Equal(t, "OTHER_KEYS_"+svc, st3.BucketName(svc))
	_, _, err = st3.Get(ctx, svc, "k")
	require.ErrorIs(t, err, ErrKeyNotFound, "key in another prefix's bucket: %v", err)
}

func TestNATSStoreOptionsAndNames(t *testing.T) {
	t.Parallel()
	_, err := NewNATSStore(nil)
	require.ErrorIs(t, err, ErrInvalidRequest, "nil JetStream: %v", err)

	n := startJKNATS(t)
	for _, bad := range []NATSStoreOption{
		WithCreateBuckets(jetstream.MemoryStorage, 0),
		WithCreateBuckets(jetstream.FileStorage, 6),
		WithCreateBuckets(jetstream.StorageType(7), 1),
		WithBucketPrefix(""),
		WithBucketPrefix("a.b"),
		WithBucketPrefix("a*"),
	} {
		_, err := NewNATSStore(n.js, bad)
		require.Error(t, err, "a bad option was accepted")
	}

	st := n.store(t)
	ctx := context.Background()
	for _, svc := range []string{"", "a.b", "a b", "a*", "a>"} {
		_, _, err := st.Get(ctx, svc, "k")
		require.ErrorIs(t, err, ErrInvalidName, "service %q: want ErrInvalidName, got %v", svc, err)
	}
}

// A compare-and-swap conflict on a single-replica bucket is JetStream error
// 10071, and the store reports it as ErrRevisionConflict keeping the
// server's error in the chain.
func TestNATSStoreConflictByErrorCode(t *testing.T) {
	t.Parallel()
	n := startJKNATS(t)
	ctx := context.Background()
	st := n.store(t)
	svc := jkService("cas")
	rev, err := st.Create(ctx, svc, "k", []byte("v1"))
	require.NoError(t, err)
	_, err = st.Update(ctx, svc, "k", []byte("v2"), rev)
	require.NoError(t, err)

	check := func(what string, err error) {
		t.Helper()
		require.ErrorIs(t, err, ErrRevisionConflict, "%s: want ErrRevisionConflict, got %v", what, err)
		var apiErr *jetstream.APIError
		require.ErrorAs(t, err, &apiErr, "%s: a *jetstream.APIError in the chain", what)
		require.Equal(t, jetstream.JSErrCodeStreamWrongLastSequence, apiErr.ErrorCode, "%s: error code", what)
		require.Equal(t, jetstream.ErrorCode(10071), apiErr.ErrorCode)
	}
	_, err = st.Update(ctx, svc, "k", []byte("v3"), rev)
	check("Update at a stale revision", err)
	check("Delete at a stale revision", st.Delete(ctx, svc, "k", rev))
	_, err = st.Create(ctx, svc, "k", []byte("v3"))
	check("Create of an existing key", err)

	// The raw client sees the same code, which is what the store matches.
	kv, err := st.KeyValue(ctx, svc)
	require.NoError(t, err)
	_, raw := kv.Update(ctx, "k", []byte("v3"), rev)
	var apiErr *jetstream.APIError
	require.True(t, errors.As(raw, &apiErr) && apiErr.ErrorCode == 10071, "raw Update error: %v", raw)
	require.True(t, jscas.IsConflict(raw), "jscas.IsConflict(%v)", raw)
	require.True(t, jscas.IsConflict(&jetstream.APIError{ErrorCode: 10164}), "10164 (replicated streams)")
	require.False(t, jscas.IsConflict(&jetstream.APIError{ErrorCode: 10037, Description: "wrong last sequence"}), "a message that merely reads like a conflict")
	require.False(t, jscas.IsConflict(errors.New("wrong last sequence: 5")), "matched by message text")
}

// concurrentRun describes one run of TestNATSConcurrentWorkers.
type concurrentRun struct {
	workers, jobsPerWorker int
	batch                  int // jobs a worker admits ahead of running them
	tenant                 func(worker, job int) string
	policy                 Policy
}

// Sixteen workers, each with its own connection, NATSStore and coordinator
// on one bucket, admit (strict: a full queue rejects, and they try again
// later), acquire (blocked: wait and try again) and release jobs. Every job
// must complete without an error; no worker may see more than MaxActive
// jobs running on a key at once; and a watcher must never see a state with
// more than MaxActive slots.
func TestNATSConcurrentWorkers(t *testing.T) {
	t.Parallel()
	n := startJKNATS(t)
	policy := Policy{Key: []string{"tenant", "/tenant"}, MaxActive: 2, MaxQueuedPerKey: 32}
	// JOBKEYS_LONG=1 runs ten times the jobs.
	scale := 1
	if os.Getenv("JOBKEYS_LONG") == "1" {
		scale = 10
	}
	t.Run("OneKey", func(t *testing.T) {
		runConcurrentWorkers(t, n, concurrentRun{workers: 16, jobsPerWorker: 3 * scale, batch: 4, policy: policy,
			tenant: func(int, int) string { return "hot" }})
	})
	t.Run("ManyKeys", func(t *testing.T) {
		runConcurrentWorkers(t, n, concurrentRun{workers: 16, jobsPerWorker: 6 * scale, batch: 3, policy: policy,
			tenant: func(w, j int) string { return fmt.Sprintf("t%d", (w*7+j)%8) }})
	})
}

func runConcurrentWorkers(t *testing.T, n *jkNATS, run concurrentRun) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	svc := jkService("conc")
	const jobType = "job"
	// History 64 lets the watcher see every revision even when it lags.
	kv := n.createBucket(t, svc, 0, 64)
	p, err := run.policy.Normalize()
	require.NoError(t, err)

	// The watcher: every state any worker wrote, in order.
	watch := watchStates(t, ctx, kv, p)
	defer watch.stop()

	var (
		running    sync.Map // display key -> *atomic.Int64: jobs between acquired and release
		maxSeen    atomic.Int64
		completed  atomic.Int64
		rejected   atomic.Int64
		blocked    atomic.Int64
		firstErrMu sync.Mutex
		firstErr   error
	)
	fail := func(err error) {
		firstErrMu.Lock()
		if firstErr == nil {
			firstErr = err
			cancel()
		}
		firstErrMu.Unlock()
	}
	type job struct {
		id      string
		payload []byte
		tenant  string
	}
	var wg sync.WaitGroup
	start := time.Now()
	for wi := range run.workers {
		_, js := natstest.Connect(t, n.srv) // each worker its own connection
		st, err := NewNATSStore(js)
		require.NoError(t, err)
		c, err := NewCoordinator(st, &Config{InstanceID: fmt.Sprintf("worker-%d", wi)})
		require.NoError(t, err)
		var pending []job
		for j := range run.jobsPerWorker {
			tenant := run.tenant(wi, j)
			pending = append(pending, job{id: fmt.Sprintf("w%d-j%d", wi, j), tenant: tenant,
				payload: []byte(fmt.Sprintf(`{"tenant":%q,"n":%d}`, tenant, j))})
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := mrand.New(mrand.NewPCG(uint64(wi), 7))
			nap := func() {
				time.Sleep(time.Duration(300+rng.IntN(1200)) * time.Microsecond)
			}
			var admitted []job
			for len(pending) > 0 || len(admitted) > 0 {
				if ctx.Err() != nil {
					fail(fmt.Errorf("worker %d: %w with %d jobs pending and %d admitted", wi, ctx.Err(), len(pending), len(admitted)))
					return
				}
				for len(pending) > 0 && len(admitted) < run.batch {
					j := pending[0]
					adm, err := c.Admit(ctx, AdmitRequest{Service: svc, JobType: jobType, JobID: j.id, Payload: j.payload,
						Policy: run.policy, StrictCreate: true})
					if err != nil {
						fail(fmt.Errorf("worker %d: admit %s: %w", wi, j.id, err))
						return
					}
					if adm.Kind == KindRejected {
						rejected.Add(1)
						break
					}
					if adm.Kind != KindAccepted || adm.AlreadyPresent {
						fail(fmt.Errorf("worker %d: admit %s: unexpected outcome %+v", wi, j.id, adm))
						return
					}
					admitted = append(admitted, j)
					pending = pending[1:]
				}
				if len(admitted) == 0 {
					nap() // the queue is full of other workers' jobs
					continue
				}
				j := admitted[0]
				admitted = admitted[1:]
				var lease Lease
				for {
					acq, err := c.Acquire(ctx, AcquireRequest{Service: svc, JobType: jobType, JobID: j.id, Payload: j.payload,
						Policy: run.policy, Tries: 1})
					if err != nil {
						fail(fmt.Errorf("worker %d: acquire %s: %w", wi, j.id, err))
						return
					}
					if acq.Kind == KindAcquired {
						lease = acq.Lease
						break
					}
					if acq.Kind != KindBlocked || acq.Reason != ReasonActiveLimit {
						fail(fmt.Errorf("worker %d: acquire %s: unexpected outcome %s/%s", wi, j.id, acq.Kind, acq.Reason))
						return
					}
					blocked.Add(1)
					nap()
				}
				counter, _ := running.LoadOrStore(lease.DisplayKey, new(atomic.Int64))
				now := counter.(*atomic.Int64).Add(1)
				for m := maxSeen.Load(); now > m && !maxSeen.CompareAndSwap(m, now); m = maxSeen.Load() {
				}
				if now > int64(p.MaxActive) {
					fail(fmt.Errorf("worker %d: %d jobs running on key %q at once (MaxActive %d)", wi, now, lease.DisplayKey, p.MaxActive))
				}
				time.Sleep(time.Duration(200+rng.IntN(800)) * time.Microsecond) // the job's work
				counter.(*atomic.Int64).Add(-1)
				rel, err := c.Release(ctx, ReleaseRequest{Lease: lease})
				if err != nil {
					fail(fmt.Errorf("worker %d: release %s: %w", wi, j.id, err))
					return
				}
				if rel.Kind != KindReleased {
					fail(fmt.Errorf("worker %d: release %s: %s", wi, j.id, rel.Kind))
					return
				}
				completed.Add(1)
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	require.NotErrorIs(t, firstErr, ErrContention, "a worker ran out of compare-and-swap attempts")
	require.NoError(t, firstErr)
	total := int64(run.workers * run.jobsPerWorker)
	require.Equal(t, total, completed.Load(), "completed jobs")
	require.LessOrEqual(t, maxSeen.Load(), int64(p.MaxActive), "peak running")

	// Every key ends empty, and empty state is deleted.
	keys, err := kv.Keys(ctx)
	require.ErrorIs(t, err, jetstream.ErrNoKeysFound, "keys left in the bucket after every job completed: %v", keys)

	// Let the watcher catch up to the last revision, then judge.
	info, err := n.js.Stream(ctx, "KV_"+BucketPrefixDefault+"_"+svc)
	require.NoError(t, err)
	si, err := info.Info(ctx)
	require.NoError(t, err)
	last := si.State.LastSeq
	watch.catchUp(last, 30*time.Second)
	watch.mu.Lock()
	defer watch.mu.Unlock()
	require.GreaterOrEqual(t, watch.lastRev, last, "the watcher's last revision")
	require.Empty(t, watch.problems, "bad states the watcher saw")
	t.Logf("%d jobs on %d workers in %v: %d admissions rejected, %d acquisitions blocked; watcher saw %d of %d revisions, peak %d running",
		total, run.workers, elapsed.Round(time.Millisecond), rejected.Load(), blocked.Load(), watch.seen, last, maxSeen.Load())
}

// stateWatch records what a watch of a bucket delivers, every revision in
// order: how many, the last revision, and what is wrong with any state
// (checkWatchedState).
type stateWatch struct {
	stop     context.CancelFunc
	done     chan struct{}
	mu       sync.Mutex
	seen     int
	lastRev  uint64
	problems []string
}

// watchStates starts a stateWatch of kv, whose states p must allow.
func watchStates(t *testing.T, ctx context.Context, kv jetstream.KeyValue, p Policy) *stateWatch {
	t.Helper()
	watchCtx, stop := context.WithCancel(ctx)
	w, err := kv.WatchAll(watchCtx)
	if err != nil {
		stop()
	}
	require.NoError(t, err)
	sw := &stateWatch{stop: stop, done: make(chan struct{})}
	go func() {
		defer close(sw.done)
		for e := range w.Updates() {
			if e == nil {
				continue // end of the initial values
			}
			sw.mu.Lock()
			sw.seen++
			sw.lastRev = e.Revision()
			if e.Operation() == jetstream.KeyValuePut {
				if problem := checkWatchedState(e.Key(), e.Value(), p); problem != "" {
					sw.problems = append(sw.problems, fmt.Sprintf("revision %d: %s", e.Revision(), problem))
				}
			}
			sw.mu.Unlock()
		}
	}()
	return sw
}

// catchUp waits until the watch delivered revision last, or bound passed,
// and stops it.
func (sw *stateWatch) catchUp(last uint64, bound time.Duration) {
	deadline := time.Now().Add(bound)
	for {
		sw.mu.Lock()
		caught := sw.lastRev >= last
		sw.mu.Unlock()
		if caught || time.Now().After(deadline) {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	sw.stop()
	<-sw.done
}

// checkWatchedState returns what is wrong with a state a watcher saw.
func checkWatchedState(kvKey string, value []byte, p Policy) string {
	s, err := ParseState(value)
	if err != nil {
		return fmt.Sprintf("%s does not parse: %v", kvKey, err)
	}
	if why := tsCheckStateJSON(value); why != "" {
		return fmt.Sprintf("%s fails the TS original's isJobKeyState: %s", kvKey, why)
	}
	if len(s.Active) > p.MaxActive {
		return fmt.Sprintf("%s has %d active slots (MaxActive %d)", kvKey, len(s.Active), p.MaxActive)
	}
	if len(s.Queued) > p.MaxQueuedPerKey+p.MaxActive {
		return fmt.Sprintf("%s has %d queued (limit %d)", kvKey, len(s.Queued), p.MaxQueuedPerKey+p.MaxActive)
	}
	seen := map[string]bool{}
	for _, a := range s.Active {
		if seen[a.JobID] {
			return fmt.Sprintf("%s holds job %s twice", kvKey, a.JobID)
		}
		seen[a.JobID] = true
	}
	for _, q := range s.Queued {
		if seen[q.JobID] {
			return fmt.Sprintf("%s holds job %s twice", kvKey, q.JobID)
		}
		seen[q.JobID] = true
	}
	if !strings.HasSuffix(kvKey, "."+s.KeyHash) {
		return fmt.Sprintf("%s holds state of key hash %s", kvKey, s.KeyHash)
	}
	return ""
}

// Keys deleted or purged by someone else (the TS original, an operator with
// the nats CLI) read as absent, and the coordinator starts them afresh.
func TestNATSStorePurgedAndDeletedKeysAreAbsent(t *testing.T) {
	t.Parallel()
	n := startJKNATS(t)
	ctx := context.Background()
	st := n.store(t)
	svc := jkService("purge")
	p := Policy{Key: []string{"/tenant"}, MaxActive: 1, MaxQueuedPerKey: 2}
	payload := []byte(`{"tenant":"acme"}`)
	key, err := DeriveKey(svc, "job", payload, p.Key)
	require.NoError(t, err)
	c := cCoordinator(t, st, nil)
	admit := func(id string) Admission {
		t.Helper()
		adm, err := c.Admit(ctx, AdmitRequest{Service: svc, JobType: "job", JobID: id, Payload: payload, Policy: p})
		require.NoError(t, err)
		return adm
	}
	for _, remove := range []struct {
		name string
		do   func(kv jetstream.KeyValue) error
	}{
		{"purge", func(kv jetstream.KeyValue) error { return kv.Purge(ctx, key.KVKey) }},
		{"delete", func(kv jetstream.KeyValue) error { return kv.Delete(ctx, key.KVKey) }},
	} {
		t.Run(remove.name, func(t *testing.T) {
			require.Equal(t, KindAccepted, admit("before-"+remove.name).Kind)
			kv, err := st.KeyValue(ctx, svc)
			require.NoError(t, err)
			require.NoError(t, remove.do(kv))
			_, _, err = st.Get(ctx, svc, key.KVKey)
			require.ErrorIs(t, err, ErrKeyNotFound, "Get after %s: %v", remove.name, err)
			// The coordinator's memory of the key is stale now; it must
			// still start afresh.
			adm := admit("after-" + remove.name)
			require.Equal(t, KindAccepted, adm.Kind)
			v, _, err := st.Get(ctx, svc, key.KVKey)
			require.NoError(t, err)
			s, err := ParseState(v)
			require.NoError(t, err)
			require.Equal(t, []string{"after-" + remove.name}, queuedIDs(s))
			rem, err := c.RemoveQueued(ctx, RemoveRequest{Service: svc, JobType: "job", JobID: "after-" + remove.name, Payload: payload, Policy: p})
			require.NoError(t, err)
			require.Equal(t, KindRemoved, rem.Kind)
		})
	}
}

// TestNATSStoreLeaderReadWithDomainAndAPIPrefix: on a replicated bucket the
// store reads through the stream leader (STREAM.MSG.GET) also when the
// JetStream context has a domain or an API prefix, sending the get to the
// prefixed API subject; it used to fall back to direct gets there, which a
// lagging replica may answer with a stale value. A spy on the API subjects
// (the server maps "$JS.hub.API.>" to "$JS.API.>") sees which get was sent.
func TestNATSStoreLeaderReadWithDomainAndAPIPrefix(t *testing.T) {
	t.Parallel()
	const domain = "hub"
	c := natstest.StartCluster(t, natstest.ClusterOptions{Nodes: 3, Configure: func(_ int, o *server.Options) {
		o.JetStreamDomain = domain
	}})
	nc, _ := natstest.ConnectURL(t, c.URLs(0))
	spy, _ := natstest.ConnectURL(t, c.URLs(1))

	withDomain, err := jetstream.NewWithDomain(nc, domain)
	require.NoError(t, err)
	withPrefix, err := jetstream.NewWithAPIPrefix(nc, "$JS."+domain+".API")
	require.NoError(t, err)

	for name, js := range map[string]jetstream.JetStream{"Domain": withDomain, "APIPrefix": withPrefix} {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			svc := jkService("leader" + name)
			bucket := BucketPrefixDefault + "_" + svc
			for { // the cluster may still be settling its meta leader
				_, err = js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: bucket, Replicas: 3, Storage: jetstream.MemoryStorage})
				if err == nil || ctx.Err() != nil {
					break
				}
				time.Sleep(200 * time.Millisecond)
			}
			require.NoError(t, err, "create R3 bucket %s", bucket)

			msgGets, directGets := make(chan string, 16), make(chan string, 16)
			for subject, ch := range map[string]chan string{
				"$JS.API.STREAM.MSG.GET.KV_" + bucket:    msgGets,
				"$JS.API.DIRECT.GET.KV_" + bucket + ".>": directGets,
				"$JS.API.DIRECT.GET.KV_" + bucket:        directGets,
			} {
				sub, err := spy.Subscribe(subject, func(m *nats.Msg) { ch <- m.Subject })
				require.NoError(t, err)
				t.Cleanup(func() { _ = sub.Unsubscribe() })
			}
			require.NoError(t, spy.Flush())

			st, err := NewNATSStore(js)
			require.NoError(t, err)
			key := svc + ".job.k"
			rev, err := st.Create(ctx, svc, key, []byte("v1"))
			require.NoError(t, err)
			rev, err = st.Update(ctx, svc, key, []byte("v2"), rev)
			require.NoError(t, err)

			value, got, err := st.Get(ctx, svc, key)
			require.NoError(t, err)
			assert.Equal(t, "v2", string(value))
			assert.Equal(t, rev, got)
			_, _, err = st.Get(ctx, svc, svc+".job.absent")
			assert.ErrorIs(t, err, ErrKeyNotFound)

			require.NoError(t, spy.Flush())
			select {
			case subject := <-msgGets:
				assert.Equal(t, "$JS.API.STREAM.MSG.GET.KV_"+bucket, subject)
			case <-time.After(rtWait):
				t.Fatal("no STREAM.MSG.GET request reached the server: the leader read was skipped")
			}
			assert.Empty(t, directGets, "Get used a direct get, which any replica may answer")
		})
	}
}
