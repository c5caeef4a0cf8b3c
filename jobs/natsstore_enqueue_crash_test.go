package jobs

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jobkeys/jobkeys/internal/natstest"
)

// The crash windows of the unbatched enqueue (natsstore_enqueue.go): an
// enqueue is killed after each of its writes in turn, on a fresh bucket
// each time, and what is left is checked from other stores (other
// processes, as far as the server can tell): no job that was not committed
// is visible, the target has at most one active job, the old job is
// untouched until the commit, and then a replay of the request, or another
// enqueue of the target followed by the replay, ends as clean enqueues in
// that order would.

// newUnbatchedStore opens a store over a new memory bucket whose stream
// does not allow atomic publish: enqueues are written key by key, as on
// R1 file storage, at memory speed.
func newUnbatchedStore(t *testing.T, s *server.Server) *NATSStore {
	t.Helper()
	_, js := natstest.Connect(t, s)
	bucket := fmt.Sprintf("JOBS_U%d", natsBucketSeq.Add(1))
	_, err := js.CreateKeyValue(context.Background(), jetstream.KeyValueConfig{Bucket: bucket, History: 1, Storage: jetstream.MemoryStorage})
	require.NoError(t, err)
	st, err := NewNATSStore(js, nil, WithBucket(bucket))
	require.NoError(t, err)
	require.True(t, st.unbatched)
	return st
}

// crashScenario is what a target holds before the enqueue that is killed.
type crashScenario struct {
	name string
	// setup enqueues (and claims) through st; it returns the generation
	// the killed enqueue takes.
	setup func(t *testing.T, st *NATSStore) uint64
}

const crashChannel = "ch"

func crashScenarios() []crashScenario {
	ctx := context.Background()
	enqueue := func(t *testing.T, st *NATSStore, id string) {
		t.Helper()
		_, err := st.Enqueue(ctx, testEnqueueRequest(crashChannel, id, "doc"))
		require.NoError(t, err)
	}
	return []crashScenario{
		{"new-target", func(*testing.T, *NATSStore) uint64 { return 1 }},
		// old is staged and committed: its enqueue's finishing is left to
		// the next change, here the killed enqueue.
		{"pending-old", func(t *testing.T, st *NATSStore) uint64 {
			enqueue(t, st, "old")
			return 2
		}},
		// old supersedes older, both left marked: the killed enqueue
		// writes older superseded for good and unstages old first.
		{"chain", func(t *testing.T, st *NATSStore) uint64 {
			enqueue(t, st, "older")
			enqueue(t, st, "old")
			return 3
		}},
		// old is running: the killed enqueue marks a claimed job.
		{"running-old", func(t *testing.T, st *NATSStore) uint64 {
			enqueue(t, st, "old")
			_, err := st.ClaimJob(ctx, ClaimJobRequest{ChannelID: crashChannel, JobID: "old", Owner: "w", TTL: time.Hour})
			require.NoError(t, err)
			return 2
		}},
	}
}

// jobStates maps each job a List shows to its state.
func jobStates(t *testing.T, st *NATSStore) map[string]State {
	t.Helper()
	page, err := st.List(context.Background(), ListRequest{ChannelID: crashChannel, Limit: 100})
	require.NoError(t, err)
	out := map[string]State{}
	for _, j := range page.Jobs {
		out[j.ID] = j.State
	}
	return out
}

// checkCrashed checks what a killed enqueue of "new" left, from reader, a
// store of its own: committed says whether its commit (its last write)
// was written; before is every job before the enqueue.
func checkCrashed(t *testing.T, name string, reader *NATSStore, committed bool, before map[string]Detail) {
	t.Helper()
	ctx := context.Background()
	states := jobStates(t, reader)
	active := 0
	for id, state := range states {
		if state.Active() {
			active++
		}
		if id == "new" {
			assert.True(t, committed, "%s: List shows job new, not committed", name)
		}
	}
	assert.LessOrEqual(t, active, 1, "%s: the target has %d active jobs: %v", name, active, states)
	d, err := reader.Get(ctx, crashChannel, "new")
	if !committed {
		assert.ErrorIs(t, err, ErrNotFound, "%s: Get shows job new, not committed", name)
		for id, was := range before {
			got, err := reader.Get(ctx, crashChannel, id)
			require.NoError(t, err, name)
			assert.Equal(t, was.Job, got.Job, "%s: job %s changed by an enqueue that did not commit", name, id)
		}
		return
	}
	require.NoError(t, err, name)
	assert.Equal(t, StatePending, d.Job.State, name)
	assert.Contains(t, states, "new", "%s: List misses the committed job", name)
	if _, ok := before["old"]; ok {
		old, err := reader.Get(ctx, crashChannel, "old")
		require.NoError(t, err, name)
		assert.Equal(t, StateSuperseded, old.Job.State, "%s: old after the commit", name)
		assert.Equal(t, d.Job.Revision, old.Job.Revision, "%s: old superseded by the enqueue's change", name)
	}
}

// TestNATSStoreUnbatchedEnqueueCrashAtEveryWrite kills an unbatched
// enqueue after each of its writes (k = 1 … n, a fresh bucket each time),
// for each shape of its target and with a writer that reads first (it
// knows the target) or writes first (a target new to it: its first writes
// are tried without a read and conflict). After each: checkCrashed; then
// either the request replayed, or another enqueue of the target and then
// the replay, must end as clean enqueues in that order: the replayed job
// the target's newest, pending, every older one superseded, one job
// claimable, and Repeated exactly when the killed enqueue had committed.
func TestNATSStoreUnbatchedEnqueueCrashAtEveryWrite(t *testing.T) {
	t.Parallel()
	s := natstest.Run(t)
	ctx := context.Background()
	for _, sc := range crashScenarios() {
		for _, reads := range []bool{true, false} {
			for _, other := range []bool{false, true} {
				t.Run(fmt.Sprintf("%s/reads=%t/other=%t", sc.name, reads, other), func(t *testing.T) {
					t.Parallel()
					n, commit := 0, 0 // writes in all, and up to the commit's
					for k := 1; n == 0 || k <= n; k++ {
						name := fmt.Sprintf("after=%d", k)
						healthy := newUnbatchedStore(t, s)
						gen := sc.setup(t, healthy)
						before := map[string]Detail{}
						for id := range jobStates(t, healthy) {
							d, err := healthy.Get(ctx, crashChannel, id)
							require.NoError(t, err)
							before[id] = d
						}

						writer := openTestNATSStore(t, s, healthy, nil)
						if reads {
							writer.targets.add(writer.keys.target(crashChannel, "doc"))
						}
						const most = 1000
						cut := &natsWriteCut{left: k}
						if n == 0 {
							cut.left = most // the first round counts the writes
						}
						writer.writeCut = cut
						_, err := writer.Enqueue(ctx, testEnqueueRequest(crashChannel, "new", "doc"))
						if n == 0 {
							require.NoError(t, err)
							n, commit = most-cut.left, cut.committedAt
							t.Logf("%d writes, the commit the %dth", n, commit)
							k = 0 // start over: crash after each
							continue
						}
						committed := k >= commit // the writes after it finish what the commit decided, best effort
						if committed {
							require.NoError(t, err, name)
						} else {
							require.ErrorIs(t, err, errWritesCut, name)
						}
						checkCrashed(t, name, openTestNATSStore(t, s, healthy, nil), committed, before)

						finisher := openTestNATSStore(t, s, healthy, nil)
						newGen := gen
						if other {
							// Another enqueue of the target, then the replay.
							o, err := finisher.Enqueue(ctx, testEnqueueRequest(crashChannel, "other", "doc"))
							require.NoError(t, err, name)
							want := gen
							if committed {
								want = gen + 1
							}
							assert.Equal(t, want, o.Job.TargetGeneration, "%s: other's generation", name)
							if !committed {
								_, err := finisher.Get(ctx, crashChannel, "new")
								assert.ErrorIs(t, err, ErrNotFound, "%s: new after other", name)
								newGen = gen + 1
							}
						}
						out, err := finisher.Enqueue(ctx, testEnqueueRequest(crashChannel, "new", "doc"))
						require.NoError(t, err, name)
						assert.Equal(t, committed, out.Repeated, "%s: Repeated", name)
						assert.Equal(t, "new", out.Job.ID, name)
						assert.Equal(t, newGen, out.Job.TargetGeneration, "%s: new's generation", name)

						reader := openTestNATSStore(t, s, healthy, nil)
						got, err := reader.Get(ctx, crashChannel, "new")
						require.NoError(t, err, name)
						assert.Equal(t, out.Job, got.Job, "%s: the replay's answer is the job stored", name)
						wantState := StatePending
						if other && committed {
							wantState = StateSuperseded // other came after it
						}
						assert.Equal(t, wantState, got.Job.State, name)
						states := jobStates(t, reader)
						var ids []string
						for id, state := range states {
							ids = append(ids, id)
							if id != "new" && !(other && committed && id == "other") {
								assert.NotEqual(t, true, state.Active(), "%s: %s is %s beside the target's newest job", name, id, state)
							}
						}
						slices.Sort(ids)
						want := []string{"new"}
						for id := range before {
							want = append(want, id)
						}
						if other {
							want = append(want, "other")
						}
						slices.Sort(want)
						assert.Equal(t, want, ids, "%s: the jobs listed", name)
						claimed, err := reader.Claim(ctx, ClaimRequest{ChannelID: crashChannel, Owner: "w2", Count: 10, TTL: time.Minute})
						require.NoError(t, err, name)
						newest := "new"
						if other && committed {
							newest = "other"
						}
						if sc.name == "running-old" && !committed && !other {
							// The replay superseded the running old job.
							require.Len(t, claimed, 1, name)
						}
						require.Len(t, claimed, 1, "%s: claimable after the replay", name)
						assert.Equal(t, newest, claimed[0].ID, name)

						// And the next enqueue of the target supersedes it.
						next, err := reader.Enqueue(ctx, testEnqueueRequest(crashChannel, "next", "doc"))
						require.NoError(t, err, name)
						assert.Equal(t, claimed[0].TargetGeneration+1, next.Job.TargetGeneration, name)
						prev, err := reader.Get(ctx, crashChannel, newest)
						require.NoError(t, err, name)
						assert.Equal(t, StateSuperseded, prev.Job.State, name)
						assert.Equal(t, next.Job.Revision, prev.Job.Revision, name)
					}
				})
			}
		}
	}
}

// TestNATSStoreUnbatchedEnqueueKeyKeepsItsFingerprint: an enqueue killed
// after its idempotency record (and after its staged job record) holds
// its key: a request of the same key with another fingerprint is a
// conflict, as after a clean enqueue, and commits nothing; the request
// replayed then makes its job.
func TestNATSStoreUnbatchedEnqueueKeyKeepsItsFingerprint(t *testing.T) {
	t.Parallel()
	s := natstest.Run(t)
	ctx := context.Background()
	for _, after := range []int{1, 2} {
		st := newUnbatchedStore(t, s)
		writer := openTestNATSStore(t, s, st, nil)
		writer.writeCut = &natsWriteCut{left: after}
		req := testEnqueueRequest(crashChannel, "new", "doc")
		_, err := writer.Enqueue(ctx, req)
		require.ErrorIs(t, err, errWritesCut)
		require.ErrorIs(t, err, ErrOutcomeUnknown, "after=%d", after)

		other := testEnqueueRequest(crashChannel, "other", "doc")
		other.IdempotencyKey, other.Fingerprint = req.IdempotencyKey, "another"
		_, err = st.Enqueue(ctx, other)
		require.ErrorIs(t, err, ErrConflict, "after=%d", after)
		assert.Contains(t, err.Error(), "another Fingerprint", "after=%d", after)
		assert.Empty(t, jobStates(t, st), "after=%d: a job was committed", after)

		out, err := st.Enqueue(ctx, req)
		require.NoError(t, err, "after=%d", after)
		assert.False(t, out.Repeated, "after=%d", after)
		assert.Equal(t, map[string]State{"new": StatePending}, jobStates(t, st), "after=%d", after)
	}
}
