package jobs_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jobkeys/jobkeys"
	"github.com/jobkeys/jobkeys/jobs"
)

// TestEnqueueManyOutcomes: one result per request, in order, each as
// Enqueue gives it: accepted ones, a rejection by a full key, a conflict
// of two requests with one idempotency key and different fingerprints, a
// replay, invalid requests and an unknown type; the other requests go in.
func TestEnqueueManyOutcomes(t *testing.T) {
	t.Parallel()
	env := newNATSClientEnv(t)
	ctx := context.Background()
	c := env.client(jobs.ClientConfig{})
	// d-full takes one job running and one waiting: with none running, a
	// queue of two; the third is rejected.
	require.NoError(t, jobs.Register(c, jobs.Kind[docIn, docOut]{Type: "render",
		Policy: jobkeys.Policy{Key: []string{"doc", "/doc"}, MaxActive: 1, MaxQueuedPerKey: 1, WhenFull: jobkeys.Reject}}))

	reqs := []jobs.EnqueueRequest{
		{Type: "render", Input: docInput("d-full")},                                          // 0 accepted
		{Type: "render", Input: docInput("d-full")},                                          // 1 accepted
		{Type: "render", Input: docInput("d-full")},                                          // 2 rejected: the key is full
		{Type: "render", Input: docInput("d-1"), IdempotencyKey: "k"},                        // 3 accepted
		{Type: "render", Input: docInput("d-2"), IdempotencyKey: "k"},                        // 4 conflict: k with another fingerprint
		{Type: "render", Input: docInput("d-1"), IdempotencyKey: "k"},                        // 5 a replay of 3
		{Type: "render", Input: json.RawMessage(`{"doc":`)},                                  // 6 invalid JSON
		{Type: "render", Input: json.RawMessage(`{"doc":7}`)},                                // 7 does not decode into docIn
		{Type: "print", Input: docInput("d-3")},                                              // 8 unknown type
		{Type: "render", Input: docInput("d-4"), Version: -1},                                // 9 bad version
		{Type: "render", Input: docInput("d-5")},                                             // 10 accepted
		{Type: "render", Input: docInput("d-6"), TargetKey: "t"},                             // 11 accepted
		{Type: "render", Input: docInput("d-7"), TargetKey: "t"},                             // 12 accepted, superseding 11
		{Type: "render", Input: docInput("d-8"), ID: string(make([]byte, 300)), Origin: "x"}, // 13 an id over the limit
	}
	res := c.EnqueueMany(ctx, reqs)
	require.Len(t, res, len(reqs))
	for _, i := range []int{0, 1, 3, 10, 11, 12} {
		if assert.NoErrorf(t, res[i].Err, "request %d", i) {
			assert.Equalf(t, jobs.OutcomeAccepted, res[i].Result.Outcome, "request %d", i)
			assert.Equalf(t, jobs.StatePending, res[i].Result.Job.State, "request %d", i)
		}
	}
	var rej *jobs.RejectedError
	require.ErrorAs(t, res[2].Err, &rej, "request 2")
	assert.Equal(t, "doc:d-full", rej.Key)
	assert.ErrorIs(t, res[4].Err, jobs.ErrConflict, "request 4")
	assert.ErrorContains(t, res[4].Err, "Fingerprint")
	if assert.NoError(t, res[5].Err) {
		assert.True(t, res[5].Result.Repeated, "request 5 replays 3")
		assert.Equal(t, res[3].Result.Job.ID, res[5].Result.Job.ID)
	}
	assert.ErrorIs(t, res[6].Err, jobs.ErrConflict, "request 6")
	assert.ErrorIs(t, res[7].Err, jobs.ErrConflict, "request 7")
	assert.ErrorIs(t, res[8].Err, jobs.ErrUnknownKind, "request 8")
	assert.ErrorIs(t, res[9].Err, jobs.ErrConflict, "request 9")
	assert.ErrorIs(t, res[13].Err, jobs.ErrConflict, "request 13")
	if assert.Len(t, res[12].Result.Superseded, 1) {
		assert.Equal(t, res[11].Result.Job.ID, res[12].Result.Superseded[0].ID, "12 supersedes 11, its target's older job")
	}
	// Ids given in slice order sort in it.
	var ids []string
	for _, i := range []int{0, 1, 2, 3, 10, 11, 12} {
		if res[i].Err == nil {
			ids = append(ids, res[i].Result.Job.ID)
		}
	}
	ids = append(ids, rej.Job.ID)
	assert.True(t, slices.IsSorted(ids[:len(ids)-1]), "ids in slice order: %v", ids)

	// Each result is what the store holds.
	for _, i := range []int{0, 1, 3, 10, 12} {
		d, err := c.Get(ctx, jobs.ChannelDefault, res[i].Result.Job.ID)
		require.NoError(t, err)
		assert.Equalf(t, jobs.StatePending, d.Job.State, "request %d", i)
	}
	d, err := c.Get(ctx, jobs.ChannelDefault, rej.Job.ID)
	require.NoError(t, err)
	assert.Equal(t, jobs.StateSuperseded, d.Job.State, "the rejected job's record")
	assert.Equal(t, jobs.ReasonRejected, d.Job.Reason)
	d, err = c.Get(ctx, jobs.ChannelDefault, res[11].Result.Job.ID)
	require.NoError(t, err)
	assert.Equal(t, jobs.StateSuperseded, d.Job.State, "request 11's job, superseded by 12")

	// A context that ended: every request gets its error, nothing is written.
	done, cancel := context.WithCancel(ctx)
	cancel()
	for i, r := range c.EnqueueMany(done, []jobs.EnqueueRequest{{Type: "render", Input: docInput("d-9"), ID: "late"}, {Type: "render", Input: docInput("d-9")}}) {
		assert.ErrorIsf(t, r.Err, context.Canceled, "request %d", i)
	}
	_, err = c.Get(ctx, jobs.ChannelDefault, "late")
	assert.ErrorIs(t, err, jobs.ErrNotFound)
	assert.Empty(t, c.EnqueueMany(ctx, nil))
}

// TestEnqueueManyAsOneByOne: random batches over a few keys, targets and
// idempotency keys, under each WhenFull policy, give through EnqueueMany
// the outcomes, errors and records that Enqueue gives one request after
// the other (memory stores, one pair per seed).
func TestEnqueueManyAsOneByOne(t *testing.T) {
	t.Parallel()
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 0))
	for round := range 20 {
		reqs := randomBatch(rng, 60)
		loop, many := memClient(t), memClient(t)
		ctx := context.Background()
		var want []jobs.BatchResult
		for _, r := range reqs {
			res, err := loop.Enqueue(ctx, r)
			want = append(want, jobs.BatchResult{Result: res, Err: err})
		}
		got := many.EnqueueMany(ctx, reqs)
		require.Len(t, got, len(reqs))
		for i := range reqs {
			if batchView(want[i]) != batchView(got[i]) {
				for j := range reqs {
					t.Logf("%d %s %s %s %s %s\n  loop %s\n  many %s", j, reqs[j].ID, reqs[j].Type, reqs[j].Input, reqs[j].TargetKey, reqs[j].IdempotencyKey, batchView(want[j]), batchView(got[j]))
				}
			}
			require.Equalf(t, batchView(want[i]), batchView(got[i]), "round %d (seed %d), request %d: %+v", round, seed, i, reqs[i])
		}
		require.Equalf(t, listView(t, loop), listView(t, many), "round %d (seed %d): the records", round, seed)
	}
}

// memClient is a client over memory stores with the kinds of randomBatch.
func memClient(t *testing.T) *jobs.Client {
	t.Helper()
	store, err := jobs.NewMemoryStore(nil)
	require.NoError(t, err)
	keys := jobkeys.NewMemoryStore()
	coord, err := jobkeys.NewCoordinator(keys, nil)
	require.NoError(t, err)
	c, err := jobs.NewClient(store, coord, &jobs.ClientConfig{KeyStore: keys})
	require.NoError(t, err)
	for typ, when := range map[string]jobkeys.WhenFull{"rej": jobkeys.Reject, "coal": jobkeys.Coalesce, "repl": jobkeys.ReplaceOldest} {
		require.NoError(t, jobs.Register(c, jobs.Kind[docIn, docOut]{Type: typ,
			Policy: jobkeys.Policy{Key: []string{"doc", "/doc"}, MaxActive: 1, MaxQueuedPerKey: 2, WhenFull: when}}))
	}
	return c
}

// randomBatch is n requests drawn from few types, docs (keys), targets,
// ids and idempotency keys, some invalid.
func randomBatch(rng *rand.Rand, n int) []jobs.EnqueueRequest {
	types := []string{"rej", "coal", "repl", "rej", "coal", "repl", "none"}
	reqs := make([]jobs.EnqueueRequest, n)
	for i := range reqs {
		doc := fmt.Sprintf("d%d", rng.IntN(4))
		r := jobs.EnqueueRequest{
			ID:    fmt.Sprintf("j%02d", rng.IntN(n+n/4)), // some ids twice
			Type:  types[rng.IntN(len(types))],
			Input: docInput(doc),
		}
		if rng.IntN(3) == 0 {
			r.TargetKey = fmt.Sprintf("t%d", rng.IntN(3))
		}
		switch rng.IntN(4) {
		case 0:
			r.IdempotencyKey = fmt.Sprintf("k%d", rng.IntN(5)) // replays and conflicts
		case 1:
			r.ChannelID = "other"
		}
		switch rng.IntN(20) {
		case 0:
			r.Input = json.RawMessage(`{"doc":`)
		case 1:
			r.Version = -1
		}
		reqs[i] = r
	}
	return reqs
}

// batchView is what is compared of a result: the outcome and the ids.
func batchView(r jobs.BatchResult) string {
	if r.Err != nil {
		return "error: " + r.Err.Error()
	}
	res := r.Result
	replaced := ""
	if res.Replaced != nil {
		replaced = res.Replaced.ID
	}
	var sup []string
	for _, j := range res.Superseded {
		sup = append(sup, j.ID+"/"+string(j.State))
	}
	return fmt.Sprintf("%s job %s/%s %s gen %d repeated %v key %q replaced %q superseded %v",
		res.Outcome, res.Job.ChannelID, res.Job.ID, res.Job.State, res.Job.TargetGeneration, res.Repeated, res.Key, replaced, sup)
}

// listView is every job of both channels: id, state, reason, generation.
func listView(t *testing.T, c *jobs.Client) []string {
	t.Helper()
	var out []string
	for _, ch := range []string{jobs.ChannelDefault, "other"} {
		var after *jobs.Cursor
		for {
			p, err := c.List(context.Background(), jobs.ListRequest{ChannelID: ch, Limit: 100, After: after})
			if errors.Is(err, jobs.ErrNotFound) {
				break
			}
			require.NoError(t, err)
			for _, j := range p.Jobs {
				out = append(out, fmt.Sprintf("%s/%s %s %q gen %d", ch, j.ID, j.State, j.Reason, j.TargetGeneration))
			}
			if p.Next == nil {
				break
			}
			after = p.Next
		}
	}
	slices.Sort(out)
	return out
}
