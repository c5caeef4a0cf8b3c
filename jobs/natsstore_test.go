package jobs

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jobkeys/jobkeys/internal/natstest"
)

var natsBucketSeq atomic.Int64

// newTestNATSStore returns a store over a new memory-storage bucket of s
// on a connection of its own.
func newTestNATSStore(t testing.TB, s *server.Server, cfg *Config) (*NATSStore, jetstream.JetStream) {
	t.Helper()
	_, js := natstest.Connect(t, s)
	bucket := fmt.Sprintf("JOBS_T%d", natsBucketSeq.Add(1))
	st, err := NewNATSStore(js, cfg, WithBucket(bucket), WithCreateBucket(jetstream.MemoryStorage, 1))
	require.NoError(t, err)
	return st, js
}

// openTestNATSStore opens another store (another connection: another
// process, as far as the server can tell) over st's bucket.
func openTestNATSStore(t testing.TB, s *server.Server, st *NATSStore, cfg *Config) *NATSStore {
	t.Helper()
	_, js := natstest.Connect(t, s)
	other, err := NewNATSStore(js, cfg, WithBucket(st.Bucket()))
	require.NoError(t, err)
	return other
}

// fixedClock is a clock that moves only when told.
type fixedClock struct{ ns atomic.Int64 }

func newFixedClock() *fixedClock {
	c := &fixedClock{}
	c.ns.Store(time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC).UnixNano())
	return c
}

func (c *fixedClock) Now() time.Time          { return time.Unix(0, c.ns.Load()).UTC() }
func (c *fixedClock) Advance(d time.Duration) { c.ns.Add(int64(d)) }

func testEnqueueRequest(channel, id, target string) EnqueueRequest {
	return EnqueueRequest{
		ID: id, ChannelID: channel, Type: "render", Version: 1, Origin: "user",
		TargetKey: target, IdempotencyKey: "idem-" + id, Fingerprint: "fp-" + id,
		Input: json.RawMessage(`{"n":1}`),
	}
}

func TestNATSStoreMissingBucket(t *testing.T) {
	t.Parallel()
	s := natstest.Run(t)
	_, js := natstest.Connect(t, s)
	_, err := NewNATSStore(js, nil, WithBucket("NOPE"))
	require.ErrorIs(t, err, ErrNotFound)
	assert.Contains(t, err.Error(), `"NOPE"`)
	assert.Contains(t, err.Error(), "WithCreateBucket")
}

// TestNATSStoreEnqueuePathByStream shows which enqueue a bucket gets from
// its stream: one atomic batch where a batch costs about one write
// (memory storage that allows atomic publish), key by key on an R1
// file-storage stream and on a stream that does not allow atomic publish
// (which NewNATSStore refused before enqueues could do without a batch).
// On each an enqueue, its replay and a supersede work.
func TestNATSStoreEnqueuePathByStream(t *testing.T) {
	t.Parallel()
	s := natstest.Run(t)
	_, js := natstest.Connect(t, s)
	ctx := context.Background()
	_, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "PLAIN", Storage: jetstream.MemoryStorage})
	require.NoError(t, err)
	for _, tc := range []struct {
		name      string
		opts      []NATSStoreOption
		unbatched bool
	}{
		{"memory", []NATSStoreOption{WithBucket("MEM"), WithCreateBucket(jetstream.MemoryStorage, 1)}, false},
		{"file-R1", []NATSStoreOption{WithBucket("FILE"), WithCreateBucket(jetstream.FileStorage, 1)}, true},
		{"no-atomic-publish", []NATSStoreOption{WithBucket("PLAIN")}, true},
	} {
		st, err := NewNATSStore(js, nil, tc.opts...)
		require.NoError(t, err, tc.name)
		assert.Equal(t, tc.unbatched, st.unbatched, tc.name)
		first, err := st.Enqueue(ctx, testEnqueueRequest("ch", "a", "doc"))
		require.NoError(t, err, tc.name)
		again, err := st.Enqueue(ctx, testEnqueueRequest("ch", "a", "doc"))
		require.NoError(t, err, tc.name)
		assert.True(t, again.Repeated, tc.name)
		assert.Equal(t, first.Job, again.Job, tc.name)
		second, err := st.Enqueue(ctx, testEnqueueRequest("ch", "b", "doc"))
		require.NoError(t, err, tc.name)
		d, err := st.Get(ctx, "ch", "a")
		require.NoError(t, err, tc.name)
		assert.Equal(t, StateSuperseded, d.Job.State, tc.name)
		assert.Equal(t, second.Job.Revision, d.Job.Revision, "%s: superseded by the enqueue's change", tc.name)
		assert.Equal(t, uint64(2), d.Target.Generation, tc.name)
	}
}

// TestNATSStoreCreateBucketFinishesAnotherCreation is the window between
// one process creating the bucket and allowing atomic publish on it: a
// second process with WithCreateBucket that opens the bucket then must
// finish the job, not fail with "does not allow atomic batch publish".
func TestNATSStoreCreateBucketFinishesAnotherCreation(t *testing.T) {
	t.Parallel()
	s := natstest.Run(t)
	_, js := natstest.Connect(t, s)
	ctx := context.Background()
	// What the first process's createNATSBucket has done so far.
	_, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "HALF", History: 1, Storage: jetstream.MemoryStorage})
	require.NoError(t, err)

	st, err := NewNATSStore(js, nil, WithBucket("HALF"), WithCreateBucket(jetstream.MemoryStorage, 1))
	require.NoError(t, err)
	stream, err := js.Stream(ctx, "KV_HALF")
	require.NoError(t, err)
	assert.True(t, stream.CachedInfo().Config.AllowAtomicPublish)
	_, err = st.Enqueue(ctx, EnqueueRequest{ID: "j1", ChannelID: "c", Type: "t", Version: 1,
		TargetKey: "tk", IdempotencyKey: "ik", Fingerprint: "fp", Input: []byte(`{}`)})
	require.NoError(t, err)
}

func TestNATSStoreOptions(t *testing.T) {
	t.Parallel()
	s := natstest.Run(t)
	_, js := natstest.Connect(t, s)
	for _, name := range []string{"", "a.b", "a b", string(make([]byte, 65))} {
		_, err := NewNATSStore(js, nil, WithBucket(name))
		assert.ErrorIs(t, err, ErrConflict, "bucket %q", name)
	}
	_, err := NewNATSStore(js, nil, WithCreateBucket(jetstream.FileStorage, 0))
	assert.ErrorIs(t, err, ErrConflict)
	_, err = NewNATSStore(nil, nil)
	assert.ErrorIs(t, err, ErrConflict)
	st, err := NewNATSStore(js, nil, WithCreateBucket(jetstream.MemoryStorage, 1))
	require.NoError(t, err)
	assert.Equal(t, NATSBucketDefault, st.Bucket())
}

func TestNATSStoreCycle(t *testing.T) {
	t.Parallel()
	s := natstest.Run(t)
	clk := newFixedClock()
	st, _ := newTestNATSStore(t, s, &Config{Now: clk.Now})
	ctx := context.Background()

	enq, err := st.Enqueue(ctx, testEnqueueRequest("ch/1", "job.1", "doc 1"))
	require.NoError(t, err)
	require.False(t, enq.Repeated)
	assert.Equal(t, StatePending, enq.Job.State)
	assert.Equal(t, uint64(1), enq.Job.TargetGeneration)
	assert.NotZero(t, enq.Job.Revision)

	again, err := st.Enqueue(ctx, testEnqueueRequest("ch/1", "job.1", "doc 1"))
	require.NoError(t, err)
	assert.True(t, again.Repeated)
	assert.Equal(t, enq.Job, again.Job)

	claimed, err := st.Claim(ctx, ClaimRequest{ChannelID: "ch/1", Owner: "w1", Count: 5, TTL: time.Minute})
	require.NoError(t, err)
	require.Len(t, claimed, 1)
	j := claimed[0]
	assert.Equal(t, StateRunning, j.State)
	assert.Greater(t, j.Revision, enq.Job.Revision)

	clk.Advance(time.Second)
	p, err := st.AppendProgress(ctx, ProgressRequest{Claim: ClaimOf(j), Stage: "fetch", Label: "fetching", State: ProgressStarted})
	require.NoError(t, err)
	require.Len(t, p.Progress, 1)
	assert.Equal(t, p.Revision, p.Progress[0].Revision)

	r, err := st.Renew(ctx, RenewRequest{Claim: ClaimOf(j), ExpectedRevision: p.Revision, TTL: 2 * time.Minute, Binding: json.RawMessage(`{"slot":"x"}`)})
	require.NoError(t, err)
	assert.Equal(t, p.Progress[0].Revision, r.Progress[0].Revision, "an older entry keeps its revision")

	d, err := st.Settle(ctx, SettleRequest{Claim: ClaimOf(j), Artifact: json.RawMessage(`{"ok":true}`)})
	require.NoError(t, err)
	assert.Equal(t, StateCompleted, d.Job.State)
	require.NotNil(t, d.Artifact)
	assert.Equal(t, d.Job.Revision, d.Artifact.Revision)

	got, err := st.Get(ctx, "ch/1", "job.1")
	require.NoError(t, err)
	assert.Equal(t, d.Job, got.Job)
	assert.Equal(t, d.Artifact, got.Artifact)
	assert.Equal(t, Target{ChannelID: "ch/1", TargetKey: "doc 1", Generation: 1}, got.Target)

	page, err := st.List(ctx, ListRequest{ChannelID: "ch/1", Limit: 10})
	require.NoError(t, err)
	require.Len(t, page.Jobs, 1)
	assert.GreaterOrEqual(t, page.Revision, d.Job.Revision)

	none, err := st.Claim(ctx, ClaimRequest{ChannelID: "ch/1", Owner: "w1", Count: 5, TTL: time.Minute})
	require.NoError(t, err)
	assert.Empty(t, none)

	require.NoError(t, st.DeleteChannel(ctx, "ch/1"))
	_, err = st.Get(ctx, "ch/1", "job.1")
	require.ErrorIs(t, err, ErrNotFound)
	fresh, err := st.Enqueue(ctx, testEnqueueRequest("ch/1", "job.1", "doc 1"))
	require.NoError(t, err)
	assert.False(t, fresh.Repeated)
	assert.Greater(t, fresh.Job.Revision, d.Job.Revision, "revisions are never reused")
}

// TestNATSStoreCorruptRecords stores job records that do not decode or
// validate and checks that every call reading them fails with ErrCorrupt
// naming the job and the KV key, and that none overwrites them.
func TestNATSStoreCorruptRecords(t *testing.T) {
	t.Parallel()
	s := natstest.Run(t)
	ctx := context.Background()
	cases := []struct {
		name   string
		mutate func(m map[string]any) // nil: raw is stored
		raw    string
	}{
		{name: "not JSON", raw: `{"v":1,`},
		{name: "trailing data", raw: `{"v":1} {}`},
		{name: "unknown field", mutate: func(m map[string]any) { m["extra"] = 1 }},
		{name: "unknown state", mutate: func(m map[string]any) { m["state"] = "lost" }},
		{name: "running without owner", mutate: func(m map[string]any) { delete(m, "claimOwner") }},
		{name: "running without expiry", mutate: func(m map[string]any) { delete(m, "claimExpiresAt") }},
		{name: "pending with a claim", mutate: func(m map[string]any) { m["state"] = "pending" }},
		{name: "completed without artifact", mutate: func(m map[string]any) {
			m["state"] = "completed"
			delete(m, "claimOwner")
			delete(m, "claimExpiresAt")
		}},
		{name: "bad progress stage", mutate: func(m map[string]any) {
			m["progress"] = []any{map[string]any{"attempt": 1, "stage": "Bad Stage", "label": "x", "state": "started", "createdAt": "2026-03-04T05:06:07Z"}}
		}},
		{name: "another job's record", mutate: func(m map[string]any) { m["id"] = "other" }},
		{name: "another format version", mutate: func(m map[string]any) { m["v"] = 2 }},
		{name: "version 0", mutate: func(m map[string]any) { m["version"] = 0 }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			st, js := newTestNATSStore(t, s, nil)
			_, err := st.Enqueue(ctx, testEnqueueRequest("ch", "job-1", "doc"))
			require.NoError(t, err)
			claimed, err := st.Claim(ctx, ClaimRequest{ChannelID: "ch", Owner: "w", Count: 1, TTL: time.Hour})
			require.NoError(t, err)
			require.Len(t, claimed, 1)
			kv, err := js.KeyValue(ctx, st.Bucket())
			require.NoError(t, err)
			key := st.keys.job("ch", "job-1")
			e, err := kv.Get(ctx, key)
			require.NoError(t, err)
			value := []byte(tc.raw)
			if tc.mutate != nil {
				var m map[string]any
				require.NoError(t, json.Unmarshal(e.Value(), &m))
				tc.mutate(m)
				value, err = json.Marshal(m)
				require.NoError(t, err)
			}
			rev, err := kv.Put(ctx, key, value)
			require.NoError(t, err)

			claim := ClaimOf(claimed[0])
			calls := map[string]func() error{
				"get": func() error { _, err := st.Get(ctx, "ch", "job-1"); return err },
				"renew": func() error {
					_, err := st.Renew(ctx, RenewRequest{Claim: claim, ExpectedRevision: rev, TTL: 2 * time.Hour})
					return err
				},
				"settle": func() error { _, err := st.Settle(ctx, SettleRequest{Claim: claim}); return err },
				"cancel": func() error { _, err := st.Cancel(ctx, CancelRequest{ChannelID: "ch", JobID: "job-1"}); return err },
				"claim": func() error {
					_, err := st.Claim(ctx, ClaimRequest{ChannelID: "ch", Owner: "w2", Count: 1, TTL: time.Hour})
					return err
				},
				"list":   func() error { _, err := st.List(ctx, ListRequest{ChannelID: "ch", Limit: 10}); return err },
				"replay": func() error { _, err := st.Enqueue(ctx, testEnqueueRequest("ch", "job-1", "doc")); return err },
			}
			for name, call := range calls {
				err := call()
				require.ErrorIs(t, err, ErrCorrupt, name)
				assert.Contains(t, err.Error(), `"job-1"`, name)
				assert.Contains(t, err.Error(), key, name)
				assert.Equal(t, 1, strings.Count(err.Error(), ErrCorrupt.Error()), "%s: %v", name, err)
			}
			after, err := kv.Get(ctx, key)
			require.NoError(t, err)
			assert.Equal(t, rev, after.Revision(), "the corrupt record was overwritten")
			assert.Equal(t, value, after.Value())
		})
	}
}

// TestNATSStoreTwoProcessesClaim has workers over separate connections
// claim the same channel's jobs at once: every job is claimed exactly once.
func TestNATSStoreTwoProcessesClaim(t *testing.T) {
	t.Parallel()
	s := natstest.Run(t)
	ctx := context.Background()
	first, _ := newTestNATSStore(t, s, nil)
	const jobs = 60
	for i := range jobs {
		_, err := first.Enqueue(ctx, testEnqueueRequest("ch", fmt.Sprintf("job-%02d", i), fmt.Sprintf("doc-%d", i)))
		require.NoError(t, err)
	}
	stores := []*NATSStore{first, openTestNATSStore(t, s, first, nil), openTestNATSStore(t, s, first, nil)}
	var mu sync.Mutex
	owners := map[string]string{}
	var wg sync.WaitGroup
	for w, st := range stores {
		for g := range 2 {
			owner := fmt.Sprintf("w%d-%d", w, g)
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					got, err := st.Claim(ctx, ClaimRequest{ChannelID: "ch", Owner: owner, Count: 3, TTL: time.Hour})
					if !assert.NoError(t, err) || len(got) == 0 {
						return
					}
					mu.Lock()
					for _, j := range got {
						assert.Empty(t, owners[j.ID], "job %s claimed twice", j.ID)
						assert.Equal(t, owner, j.ClaimOwner)
						owners[j.ID] = owner
					}
					mu.Unlock()
				}
			}()
		}
	}
	wg.Wait()
	assert.Len(t, owners, jobs)
}

// TestNATSStoreGuessesAreChecked covers the two guesses a store makes from
// what it wrote itself — a new target's keys are all absent, a running job
// is as this store last wrote it — when another process proved them wrong.
func TestNATSStoreGuessesAreChecked(t *testing.T) {
	t.Parallel()
	s := natstest.Run(t)
	ctx := context.Background()
	clk := newFixedClock()
	a, _ := newTestNATSStore(t, s, &Config{Now: clk.Now})
	b := openTestNATSStore(t, s, a, &Config{Now: clk.Now})

	first, err := a.Enqueue(ctx, testEnqueueRequest("ch", "j1", "doc"))
	require.NoError(t, err)
	// b has seen none of it: its guesses fail and it reads.
	replayed, err := b.Enqueue(ctx, testEnqueueRequest("ch", "j1", "doc"))
	require.NoError(t, err)
	assert.True(t, replayed.Repeated)
	assert.Equal(t, first.Job, replayed.Job)
	emptyType := testEnqueueRequest("ch", "j1", "doc")
	emptyType.Type = ""
	replayed, err = openTestNATSStore(t, s, a, nil).Enqueue(ctx, emptyType)
	require.NoError(t, err, "a replay is answered before the new job's fields are checked")
	assert.True(t, replayed.Repeated)
	second, err := openTestNATSStore(t, s, a, &Config{Now: clk.Now}).Enqueue(ctx, testEnqueueRequest("ch", "j2", "doc"))
	require.NoError(t, err)
	assert.Equal(t, uint64(2), second.Job.TargetGeneration)
	old, err := a.Get(ctx, "ch", "j1")
	require.NoError(t, err)
	assert.Equal(t, StateSuperseded, old.Job.State)
	assert.Equal(t, second.Job.Revision, old.Job.Revision, "superseded in the enqueue's change")

	// a claims j2 and remembers it; b renews it under the same claim; a's
	// renewal with b's revision succeeds (a reads), and a's settle after b
	// paused the job fails.
	claimed, err := a.Claim(ctx, ClaimRequest{ChannelID: "ch", Owner: "w", Count: 1, TTL: time.Minute})
	require.NoError(t, err)
	require.Len(t, claimed, 1)
	clk.Advance(time.Second)
	byB, err := b.Renew(ctx, RenewRequest{Claim: ClaimOf(claimed[0]), ExpectedRevision: claimed[0].Revision, TTL: time.Minute})
	require.NoError(t, err)
	clk.Advance(time.Second)
	byA, err := a.Renew(ctx, RenewRequest{Claim: ClaimOf(claimed[0]), ExpectedRevision: byB.Revision, TTL: time.Minute})
	require.NoError(t, err)
	assert.Greater(t, byA.Revision, byB.Revision)
	_, err = b.Pause(ctx, PauseRequest{ChannelID: "ch", JobID: "j2", ExpectedRevision: byA.Revision})
	require.NoError(t, err)
	_, err = a.Settle(ctx, SettleRequest{Claim: ClaimOf(claimed[0])})
	require.ErrorIs(t, err, ErrConflict)
	got, err := a.Get(ctx, "ch", "j2")
	require.NoError(t, err)
	assert.Equal(t, StatePaused, got.Job.State)
	assert.Nil(t, got.Artifact)
}

// TestNATSStoreActiveIndex checks that claiming reads only the active
// index: a terminal write removes the job's entry, and an entry left
// behind (its removal lost) is removed by the next claim.
func TestNATSStoreActiveIndex(t *testing.T) {
	t.Parallel()
	s := natstest.Run(t)
	ctx := context.Background()
	st, js := newTestNATSStore(t, s, nil)
	for i := range 5 {
		_, err := st.Enqueue(ctx, testEnqueueRequest("ch", fmt.Sprintf("j%d", i), fmt.Sprintf("doc%d", i)))
		require.NoError(t, err)
	}
	active := func() []string {
		keys, _, err := st.subjects(ctx, "test", st.keys.activeFilter("ch"))
		require.NoError(t, err)
		return keys
	}
	require.Len(t, active(), 5)
	claimed, err := st.Claim(ctx, ClaimRequest{ChannelID: "ch", Owner: "w", Count: 5, TTL: time.Minute})
	require.NoError(t, err)
	require.Len(t, claimed, 5)
	for _, j := range claimed[:3] {
		_, err := st.Settle(ctx, SettleRequest{Claim: ClaimOf(j)})
		require.NoError(t, err)
	}
	_, err = st.Cancel(ctx, CancelRequest{ChannelID: "ch", JobID: claimed[3].ID})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return len(active()) == 1 }, 10*time.Second, 10*time.Millisecond,
		"terminal jobs leave the active index")

	// A lost removal: the entry of a completed job written back.
	kv, err := js.KeyValue(ctx, st.Bucket())
	require.NoError(t, err)
	_, err = kv.Put(ctx, st.keys.active("ch", claimed[0].ID), nil)
	require.NoError(t, err)
	require.Len(t, active(), 2)
	none, err := st.Claim(ctx, ClaimRequest{ChannelID: "ch", Owner: "w", Count: 5, TTL: time.Minute})
	require.NoError(t, err)
	assert.Empty(t, none)
	require.Eventually(t, func() bool { return len(active()) == 1 }, 10*time.Second, 10*time.Millisecond,
		"the claim removes the stale entry")
	assert.Equal(t, []string{st.keys.active("ch", claimed[4].ID)}, active())
}

// TestNATSStoreActiveSeqIsExact checks that every job record knows the
// sequence of its active entry, so that the purge after a terminal write
// is bounded by that one message.
func TestNATSStoreActiveSeqIsExact(t *testing.T) {
	t.Parallel()
	s := natstest.Run(t)
	ctx := context.Background()
	st, _ := newTestNATSStore(t, s, nil)
	check := func(id, when string) {
		t.Helper()
		_, _, _, activeSeq, found, err := st.readJobMeta(ctx, "test", "ch", id)
		require.NoError(t, err)
		require.True(t, found)
		m, ok, err := st.getOne(ctx, "test", st.keys.active("ch", id))
		require.NoError(t, err)
		require.True(t, ok, "%s: %s has no active entry", when, id)
		assert.Equal(t, m.rev, activeSeq, "%s: %s", when, id)
	}
	_, err := st.Enqueue(ctx, testEnqueueRequest("ch", "a", "doc"))
	require.NoError(t, err)
	check("a", "enqueued")
	_, err = st.Enqueue(ctx, testEnqueueRequest("ch", "b", "doc")) // supersedes a
	require.NoError(t, err)
	check("b", "enqueued, superseding")
	claimed, err := st.Claim(ctx, ClaimRequest{ChannelID: "ch", Owner: "w", Count: 1, TTL: time.Minute})
	require.NoError(t, err)
	require.Len(t, claimed, 1)
	check("b", "claimed")
	_, err = st.Renew(ctx, RenewRequest{Claim: ClaimOf(claimed[0]), ExpectedRevision: claimed[0].Revision, TTL: 2 * time.Minute})
	require.NoError(t, err)
	check("b", "renewed")
}

// TestNATSStoreLargeRecordsInBatchedReads claims jobs whose records
// together exceed what one batched read returns (the store asks the server
// to stop at natsBatchMaxBytes): the batch ends early, and the records it
// left out are read alone, not taken for deleted jobs (whose active
// entries a claim removes).
func TestNATSStoreLargeRecordsInBatchedReads(t *testing.T) {
	t.Parallel()
	s := natstest.Run(t)
	st, _ := newTestNATSStore(t, s, nil)
	ctx := context.Background()
	big := json.RawMessage(`"` + strings.Repeat("x", 200<<10) + `"`)
	const jobs = 12 // 2.4 MB of records
	for i := range jobs {
		req := testEnqueueRequest("ch", fmt.Sprintf("j%02d", i), fmt.Sprintf("doc%d", i))
		req.Input = big
		_, err := st.Enqueue(ctx, req)
		require.NoError(t, err)
	}
	other := openTestNATSStore(t, s, st, nil) // no hints: every record in batched reads
	claimed, err := other.Claim(ctx, ClaimRequest{ChannelID: "ch", Owner: "w", Count: jobs, TTL: time.Minute})
	require.NoError(t, err)
	assert.Equal(t, jobs, len(claimed), "jobs claimed")
}

// TestNATSStoreHonoursContext: a cancelled context ends every call with
// the context's error, unchanged.
func TestNATSStoreHonoursContext(t *testing.T) {
	t.Parallel()
	s := natstest.Run(t)
	st, _ := newTestNATSStore(t, s, nil)
	ok := context.Background()
	_, err := st.Enqueue(ok, testEnqueueRequest("ch", "j", "doc"))
	require.NoError(t, err)
	claimed, err := st.Claim(ok, ClaimRequest{ChannelID: "ch", Owner: "w", Count: 1, TTL: time.Minute})
	require.NoError(t, err)
	require.Len(t, claimed, 1)
	claim := ClaimOf(claimed[0])
	ctx, cancel := context.WithCancel(ok)
	cancel()
	calls := map[string]func() error{
		"enqueue": func() error { _, err := st.Enqueue(ctx, testEnqueueRequest("ch", "k", "doc2")); return err },
		"claim": func() error {
			_, err := st.Claim(ctx, ClaimRequest{ChannelID: "ch", Owner: "w", Count: 1, TTL: time.Minute})
			return err
		},
		"renew": func() error {
			_, err := st.Renew(ctx, RenewRequest{Claim: claim, ExpectedRevision: claimed[0].Revision, TTL: 2 * time.Minute})
			return err
		},
		"settle":         func() error { _, err := st.Settle(ctx, SettleRequest{Claim: claim}); return err },
		"list":           func() error { _, err := st.List(ctx, ListRequest{ChannelID: "ch"}); return err },
		"get":            func() error { _, err := st.Get(ctx, "ch", "j"); return err },
		"delete channel": func() error { return st.DeleteChannel(ctx, "ch") },
	}
	for name, call := range calls {
		assert.ErrorIs(t, call(), context.Canceled, name)
	}
	got, err := st.Get(ok, "ch", "j")
	require.NoError(t, err)
	assert.Equal(t, StateRunning, got.Job.State, "nothing was written")
}

// TestNATSStoreListSeesOtherWriters checks the kept listing: a job another
// store enqueues, and a channel another store deletes, show in the next
// List.
func TestNATSStoreListSeesOtherWriters(t *testing.T) {
	t.Parallel()
	s := natstest.Run(t)
	ctx := context.Background()
	clk := newFixedClock()
	a, _ := newTestNATSStore(t, s, &Config{Now: clk.Now})
	b := openTestNATSStore(t, s, a, &Config{Now: clk.Now})
	ids := func(st *NATSStore) []string {
		page, err := st.List(ctx, ListRequest{ChannelID: "ch", Limit: 100})
		require.NoError(t, err)
		var out []string
		for _, j := range page.Jobs {
			out = append(out, j.ID)
		}
		return out
	}
	_, err := a.Enqueue(ctx, testEnqueueRequest("ch", "j1", "d1"))
	require.NoError(t, err)
	assert.Equal(t, []string{"j1"}, ids(a))
	clk.Advance(time.Second)
	_, err = b.Enqueue(ctx, testEnqueueRequest("ch", "j2", "d2"))
	require.NoError(t, err)
	assert.Equal(t, []string{"j2", "j1"}, ids(a))
	require.NoError(t, b.DeleteChannel(ctx, "ch"))
	assert.Empty(t, ids(a))
	_, err = b.Enqueue(ctx, testEnqueueRequest("ch", "j3", "d3"))
	require.NoError(t, err)
	assert.Equal(t, []string{"j3"}, ids(a))
}

// TestNATSStoreCASWrite checks the store's own compare-and-swap write
// against kv.Update's on the same bucket: a write over the current
// revision lands at the next one, a write over an old revision or onto a
// key that has none is a conflict, and nothing is written then.
func TestNATSStoreCASWrite(t *testing.T) {
	t.Parallel()
	s := natstest.Run(t)
	st, js := newTestNATSStore(t, s, nil)
	require.True(t, st.plainWrites)
	kv, err := js.KeyValue(context.Background(), st.Bucket())
	require.NoError(t, err)
	ctx := context.Background()
	rev, err := kv.Put(ctx, "job.ch.j", []byte(`{"n":0}`))
	require.NoError(t, err)
	for _, plain := range []bool{true, false} {
		st.plainWrites = plain
		next, conflict, err := st.update(ctx, "test", "job.ch.j", []byte(`{"n":1}`), rev)
		require.NoError(t, err)
		require.False(t, conflict, "plain %t", plain)
		assert.Greater(t, next, rev)
		_, conflict, err = st.update(ctx, "test", "job.ch.j", []byte(`{"n":2}`), rev)
		require.NoError(t, err)
		assert.True(t, conflict, "plain %t: a write over an old revision", plain)
		_, conflict, err = st.update(ctx, "test", "job.ch.none", []byte(`{"n":3}`), rev)
		require.NoError(t, err)
		assert.True(t, conflict, "plain %t: a write over a revision of a key that has none", plain)
		e, err := kv.Get(ctx, "job.ch.j")
		require.NoError(t, err)
		assert.Equal(t, next, e.Revision())
		assert.Equal(t, `{"n":1}`, string(e.Value()))
		_, err = kv.Get(ctx, "job.ch.none")
		assert.ErrorIs(t, err, jetstream.ErrKeyNotFound)
		rev = next
	}
}

// noKVUpdates fails the test on any compare-and-swap write through the KV
// layer: the store is to send its own.
type noKVUpdates struct {
	jetstream.KeyValue
	t *testing.T
}

func (k noKVUpdates) Update(ctx context.Context, key string, value []byte, last uint64) (uint64, error) {
	k.t.Errorf("kv.Update(%q, revision %d): the store's own write expected", key, last)
	return k.KeyValue.Update(ctx, key, value, last)
}

// The store's own compare-and-swap writes (casWrite) store exactly what
// kv.Update stores, also behind a JetStream domain or API prefix, where
// they go to the subjects kv.Update writes to: the same subjects, header
// blocks, data and revisions, and the same conflicts.
func TestNATSStoreWritesAsKVLayer(t *testing.T) {
	t.Parallel()
	nc, contexts := natstest.RunDomain(t, "hub")
	for _, tc := range contexts {
		t.Run(tc.Name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			open := func() *NATSStore {
				st, err := NewNATSStore(tc.JS, nil, WithBucket(fmt.Sprintf("JOBS_T%d", natsBucketSeq.Add(1))), WithCreateBucket(jetstream.MemoryStorage, 1))
				require.NoError(t, err)
				return st
			}
			old, own := open(), open()
			require.True(t, own.plainWrites)
			require.Equal(t, tc.WritePrefix+"$KV."+own.Bucket()+".", own.writePrefix, "kv.Update's subjects")
			own.kv = noKVUpdates{KeyValue: own.kv, t: t}
			kv, err := tc.JS.KeyValue(ctx, old.Bucket())
			require.NoError(t, err)
			oldStart, err := old.stream.Info(ctx)
			require.NoError(t, err)
			ownStart, err := own.stream.Info(ctx)
			require.NoError(t, err)

			// The bucket keeps one message per key: each write is read back
			// before the next.
			const key = "job.ch.j"
			var oldRev, ownRev uint64 // 0: the key has no message yet
			for i, v := range []string{`{"n":1}`, `{"n":2}`, `{"n":3}`} {
				r, err := kv.Update(ctx, key, []byte(v), oldRev)
				require.NoError(t, err)
				oldRev = r
				r, conflict, err := own.update(ctx, "test", key, []byte(v), ownRev)
				require.NoError(t, err)
				require.False(t, conflict, "write %d", i)
				ownRev = r
				assert.Equal(t, oldRev-oldStart.State.LastSeq, ownRev-ownStart.State.LastSeq, "revision of write %d, from each stream's start", i)
				want := natstest.ReadStored(t, nc, "KV_"+old.Bucket(), oldRev)
				got := natstest.ReadStored(t, nc, "KV_"+own.Bucket(), ownRev)
				assert.Equal(t, want.Subject, strings.Replace(got.Subject, own.Bucket(), old.Bucket(), 1), "subject of write %d", i)
				assert.Equal(t, string(want.Hdrs), string(got.Hdrs), "header block of write %d", i)
				assert.Equal(t, want.Data, got.Data, "data of write %d", i)
			}

			// A conflict, as kv.Update's: nothing written.
			_, err = kv.Update(ctx, key, []byte(`{"n":4}`), oldRev-1)
			assert.ErrorIs(t, err, jetstream.ErrKeyRevisionMismatch)
			_, conflict, err := own.update(ctx, "test", key, []byte(`{"n":4}`), ownRev-1)
			require.NoError(t, err)
			assert.True(t, conflict, "a write over an old revision")
			_, conflict, err = own.update(ctx, "test", "job.ch.none", []byte(`{"n":5}`), ownRev)
			require.NoError(t, err)
			assert.True(t, conflict, "a write over a revision of a key that has none")
			info, err := own.stream.Info(ctx)
			require.NoError(t, err)
			assert.Equal(t, ownRev, info.State.LastSeq, "nothing written on a conflict")
		})
	}
}
