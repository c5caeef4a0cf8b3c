package jobs

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jobkeys/jobkeys/internal/natstest"
)

// retentionFixture fills channel "ch" of st with finished jobs (completed,
// failed, cancelled, superseded by a call and by an enqueue) and live ones
// (pending, running, paused, and a pending job whose target a finished job
// held before it). It returns the ids of both.
func retentionFixture(t *testing.T, st Store) (finished, live []string) {
	t.Helper()
	ctx := context.Background()
	enqueue := func(id, target string) Job {
		out, err := st.Enqueue(ctx, testEnqueueRequest("ch", id, target))
		require.NoError(t, err)
		require.False(t, out.Repeated)
		return out.Job
	}
	claim := func(id string) Job {
		j, err := st.(interface {
			ClaimJob(context.Context, ClaimJobRequest) (Job, error)
		}).ClaimJob(ctx, ClaimJobRequest{ChannelID: "ch", JobID: id, Owner: "w", TTL: time.Hour})
		require.NoError(t, err)
		return j
	}
	enqueue("done", "t-done")
	_, err := st.Settle(ctx, SettleRequest{Claim: ClaimOf(claim("done")), Artifact: json.RawMessage(`{"ok":true}`)})
	require.NoError(t, err)
	enqueue("broke", "t-broke")
	_, err = st.Fail(ctx, FailRequest{Claim: ClaimOf(claim("broke")), Reason: "broken"})
	require.NoError(t, err)
	enqueue("dropped", "t-dropped")
	_, err = st.Cancel(ctx, CancelRequest{ChannelID: "ch", JobID: "dropped"})
	require.NoError(t, err)
	sup := enqueue("replaced", "t-replaced")
	_, err = st.Supersede(ctx, SupersedeRequest{ChannelID: "ch", JobID: "replaced", ExpectedRevision: sup.Revision, Reason: "replaced"})
	require.NoError(t, err)
	enqueue("older", "t-shared") // superseded by the enqueue of "newer"
	enqueue("newer", "t-shared")
	// A finished job whose target a later job took: the target entry,
	// given the finished job's retention first, must stay.
	enqueue("first", "t-again")
	_, err = st.Settle(ctx, SettleRequest{Claim: ClaimOf(claim("first"))})
	require.NoError(t, err)
	enqueue("second", "t-again")
	enqueue("waiting", "t-waiting")
	claim(enqueue("working", "t-working").ID)
	p := enqueue("held", "t-held")
	_, err = st.Pause(ctx, PauseRequest{ChannelID: "ch", JobID: "held", ExpectedRevision: p.Revision, Reason: "hold"})
	require.NoError(t, err)
	return []string{"done", "broke", "dropped", "replaced", "older", "first"},
		[]string{"newer", "second", "waiting", "working", "held"}
}

// checkRetained checks, once retention has removed the finished jobs, that
// the live jobs are untouched: found in their state with their target,
// listed, replayed by their idempotency key; and that an enqueue with a
// removed job's idempotency key makes a new job.
func checkRetained(t *testing.T, st Store, finished, live []string) {
	t.Helper()
	ctx := context.Background()
	want := map[string]State{"newer": StatePending, "second": StatePending, "waiting": StatePending, "working": StateRunning, "held": StatePaused}
	for _, id := range live {
		d, err := st.Get(ctx, "ch", id)
		require.NoError(t, err, id)
		assert.Equal(t, want[id], d.Job.State, id)
		assert.Equal(t, d.Job.TargetGeneration, d.Target.Generation, "%s holds its target", id)
		out, err := st.Enqueue(ctx, testEnqueueRequest("ch", id, d.Job.TargetKey))
		require.NoError(t, err)
		assert.True(t, out.Repeated, "%s is replayed by its idempotency key", id)
	}
	d, err := st.Get(ctx, "ch", "second")
	require.NoError(t, err)
	assert.Equal(t, uint64(2), d.Target.Generation, "the target a finished job held before stays with the live one")
	for _, id := range finished {
		_, err := st.Get(ctx, "ch", id)
		assert.ErrorIs(t, err, ErrNotFound, id)
	}
	p, err := st.List(ctx, ListRequest{ChannelID: "ch", Limit: 100})
	require.NoError(t, err)
	var listed []string
	for _, s := range p.Jobs {
		listed = append(listed, s.ID)
	}
	assert.ElementsMatch(t, live, listed, "only the live jobs are listed")
	// A replay after the record is gone is a new job.
	out, err := st.Enqueue(ctx, testEnqueueRequest("ch", "done", "t-done"))
	require.NoError(t, err)
	assert.False(t, out.Repeated, "an enqueue with a removed job's idempotency key makes a new job")
	assert.Equal(t, StatePending, out.Job.State)
}

// TestNATSRetentionRemovesFinishedJobs gives a NATSStore a one-second
// retention: its bucket then holds no key of a finished job — no record,
// no idempotency, target, list or active entry — and the live jobs, their
// entries and their targets are untouched.
func TestNATSRetentionRemovesFinishedJobs(t *testing.T) {
	t.Parallel()
	// Memory storage enqueues in atomic batches; R1 file storage key by
	// key (see NATSStore), where a superseded job is marked first.
	for _, storage := range []jetstream.StorageType{jetstream.MemoryStorage, jetstream.FileStorage} {
		t.Run(storage.String(), func(t *testing.T) {
			t.Parallel()
			testNATSRetention(t, storage)
		})
	}
}

func testNATSRetention(t *testing.T, storage jetstream.StorageType) {
	s := natstest.Run(t)
	_, js := natstest.Connect(t, s)
	st, err := NewNATSStore(js, nil, WithBucket(fmt.Sprintf("JOBS_T%d", natsBucketSeq.Add(1))), WithCreateBucket(storage, 1))
	require.NoError(t, err)
	require.Equal(t, storage == jetstream.FileStorage, st.unbatched, "the enqueue path")
	require.NoError(t, useRetention(st, Retention{Completed: time.Second, Failed: time.Second, Cancelled: time.Second, Superseded: time.Second}))
	finished, live := retentionFixture(t, st)
	ctx := context.Background()
	kv, err := js.KeyValue(ctx, st.Bucket())
	require.NoError(t, err)
	ofFinished := func(key string) bool {
		for _, id := range finished {
			if strings.HasSuffix(key, "."+id) || strings.HasSuffix(key, ".idem-"+id) {
				return true
			}
		}
		// The targets only finished jobs held.
		return slices.Contains([]string{"target.ch.t-done", "target.ch.t-broke", "target.ch.t-dropped", "target.ch.t-replaced"}, key)
	}
	var left []string
	deadline := time.Now().Add(30 * time.Second) // a failure guard: the server removes them about a second after they finish
	for {
		// nats.go's listing ends when it has received as many keys as the
		// stream held when it began; keys that expire meanwhile never
		// come, and the listing would wait for them forever. Each listing
		// is bounded; one cut short proves nothing and is made again.
		lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		keys, err := kv.ListKeys(lctx)
		require.NoError(t, err)
		left = left[:0]
		for k := range keys.Keys() {
			if ofFinished(k) {
				left = append(left, k)
			}
		}
		complete := lctx.Err() == nil
		cancel()
		if complete && len(left) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	require.Empty(t, left, "keys of finished jobs after their retention")
	// No record of the bucket is a finished job's.
	keys, err := kv.ListKeys(ctx, jetstream.IgnoreDeletes())
	require.NoError(t, err)
	for k := range keys.Keys() {
		if !strings.HasPrefix(k, familyJob+".") {
			continue
		}
		e, err := kv.Get(ctx, k)
		require.NoError(t, err)
		j, _, err := decodeNATSJob(k, e.Revision(), e.Value(), "", "")
		if err == nil {
			assert.True(t, j.State.Active(), "record %s is %s", k, j.State)
		}
	}
	checkRetained(t, st, finished, live)
}

// TestMemoryRetentionRemovesFinishedJobs is the same on a MemoryStore,
// whose clock is the test's.
func TestMemoryRetentionRemovesFinishedJobs(t *testing.T) {
	t.Parallel()
	clock := newFixedClock()
	st, err := NewMemoryStore(&Config{Now: clock.Now})
	require.NoError(t, err)
	require.NoError(t, useRetention(st, Retention{Completed: time.Minute, Failed: time.Hour, Cancelled: time.Minute, Superseded: time.Minute}))
	finished, live := retentionFixture(t, st)
	ctx := context.Background()
	clock.Advance(time.Minute)
	_, err = st.Get(ctx, "ch", "broke")
	require.NoError(t, err, "a failed job is kept for its own, longer retention")
	for _, id := range []string{"done", "dropped", "replaced", "older", "first"} {
		_, err := st.Get(ctx, "ch", id)
		assert.ErrorIs(t, err, ErrNotFound, id)
	}
	clock.Advance(time.Hour)
	_, err = st.List(ctx, ListRequest{ChannelID: "ch"}) // a call: the store deletes what is due
	require.NoError(t, err)
	st.mu.Lock()
	ch := st.channels["ch"]
	for _, id := range finished {
		assert.NotContains(t, ch.jobs, id)
		assert.NotContains(t, ch.artifacts, id)
		assert.NotContains(t, ch.idempotency, "idem-"+id)
	}
	st.mu.Unlock()
	checkRetained(t, st, finished, live)
	st.mu.Lock()
	defer st.mu.Unlock()
	for _, tk := range []string{"t-done", "t-broke", "t-dropped", "t-replaced"} {
		if tk != "t-done" { // re-enqueued by checkRetained
			assert.NotContains(t, ch.targets, tk)
		}
	}
}

// TestRetentionKeepAndValidation: a negative field keeps such jobs; a
// positive one under a second is refused naming the field; an explicit
// retention on a bucket that does not allow per-message TTL is refused by
// NewClient's hook, the default one is not.
func TestRetentionKeepAndValidation(t *testing.T) {
	t.Parallel()
	_, err := Retention{Failed: 500 * time.Millisecond}.resolve()
	require.ErrorIs(t, err, ErrConflict)
	assert.Contains(t, err.Error(), "Retention.Failed")
	r, err := Retention{Completed: RetentionKeep}.resolve()
	require.NoError(t, err)
	assert.Equal(t, RetentionKeep, r.of(StateCompleted))
	assert.Equal(t, RetentionFailedDefault, r.of(StateFailed))
	assert.Equal(t, RetentionKeep, r.of(StateRunning))

	clock := newFixedClock()
	mem, err := NewMemoryStore(&Config{Now: clock.Now})
	require.NoError(t, err)
	require.NoError(t, useRetention(mem, Retention{Completed: RetentionKeep, Cancelled: time.Second}))
	ctx := context.Background()
	for _, id := range []string{"kept", "gone"} {
		_, err := mem.Enqueue(ctx, testEnqueueRequest("ch", id, id))
		require.NoError(t, err)
	}
	c, err := mem.ClaimJob(ctx, ClaimJobRequest{ChannelID: "ch", JobID: "kept", Owner: "w", TTL: time.Hour})
	require.NoError(t, err)
	_, err = mem.Settle(ctx, SettleRequest{Claim: ClaimOf(c)})
	require.NoError(t, err)
	_, err = mem.Cancel(ctx, CancelRequest{ChannelID: "ch", JobID: "gone"})
	require.NoError(t, err)
	clock.Advance(365 * 24 * time.Hour)
	_, err = mem.Get(ctx, "ch", "kept")
	require.NoError(t, err, "a completed job under RetentionKeep")
	_, err = mem.Get(ctx, "ch", "gone")
	require.ErrorIs(t, err, ErrNotFound)

	s := natstest.Run(t)
	_, js := natstest.Connect(t, s)
	_, err = js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "NOTTL", History: 1, Storage: jetstream.MemoryStorage})
	require.NoError(t, err)
	stream, err := js.Stream(ctx, "KV_NOTTL")
	require.NoError(t, err)
	cfg := stream.CachedInfo().Config
	cfg.AllowAtomicPublish = true
	_, err = js.UpdateStream(ctx, cfg)
	require.NoError(t, err)
	st, err := NewNATSStore(js, nil, WithBucket("NOTTL"))
	require.NoError(t, err)
	err = useRetention(st, Retention{Completed: time.Hour})
	require.ErrorIs(t, err, ErrConflict)
	assert.Contains(t, err.Error(), "KV_NOTTL")
	assert.Contains(t, err.Error(), "per-message TTL")
	require.NoError(t, useRetention(st, Retention{}), "the default retention on such a bucket keeps every job")
	assert.Nil(t, st.retention.Load())

	// WithCreateBucket allows it on the existing bucket.
	st, err = NewNATSStore(js, nil, WithBucket("NOTTL"), WithCreateBucket(jetstream.MemoryStorage, 1))
	require.NoError(t, err)
	require.NoError(t, useRetention(st, Retention{Completed: time.Hour}))
	assert.NotNil(t, st.retention.Load())
}

// TestRetentionEntriesGoBeforeTheRecord: a finished job's entries,
// rewritten a moment after its record (up to half its retention later),
// expire at least half a second before it (TTLs are whole seconds), so an idempotency entry never names
// a job that is gone; and the record goes no sooner than its retention.
func TestRetentionEntriesGoBeforeTheRecord(t *testing.T) {
	t.Parallel()
	st := &NATSStore{}
	for _, r := range []time.Duration{time.Second, 1500 * time.Millisecond, 2 * time.Second, 90 * time.Second, 24 * time.Hour} {
		res, err := Retention{Completed: r}.resolve()
		require.NoError(t, err)
		st.retention.Store(&res)
		record := st.finalTTL(StateCompleted)
		recordRounded := (record + time.Second - 1) / time.Second * time.Second // as the header rounds it
		assert.GreaterOrEqual(t, recordRounded, r, "retention %v", r)
		for _, elapsed := range []time.Duration{0, 10 * time.Millisecond, 400 * time.Millisecond, r / 2} {
			entry := satelliteTTL(record, elapsed)
			assert.Zero(t, entry%time.Second, "whole seconds")
			assert.GreaterOrEqual(t, entry, time.Second)
			assert.LessOrEqual(t, elapsed+entry, recordRounded-500*time.Millisecond, "retention %v, entries rewritten %v after the record", r, elapsed)
		}
	}
	assert.Zero(t, st.finalTTL(StateRunning), "an active job has no TTL")
	st.retention.Store(nil)
	assert.Zero(t, st.finalTTL(StateCompleted), "no retention: no TTL")
}
