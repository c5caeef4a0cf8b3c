package jobs

import (
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Table tests of the pure rules at fixed times; the stores' behaviour is
// the conformance suite's (package jobstest).

func TestPrepareNormalises(t *testing.T) {
	local := time.FixedZone("X", 3600)
	at := time.Now().In(local) // carries a monotonic reading and a zone
	req, err := prepareEnqueue(EnqueueRequest{ID: "j", ChannelID: "c", Type: "t", Version: 1, TargetKey: "d",
		IdempotencyKey: "k", Fingerprint: "f", Input: json.RawMessage(" { \"a\" : [ 1 , 2 ] } "), AvailableAt: at})
	require.NoError(t, err)
	assert.Equal(t, `{"a":[1,2]}`, string(req.Input))
	assert.Equal(t, time.UTC, req.AvailableAt.Location())
	assert.True(t, req.AvailableAt.Equal(at))
	assert.Equal(t, req.AvailableAt, req.AvailableAt.Round(0), "no monotonic reading")

	for _, in := range []string{"", "  ", "null", " null "} {
		req, err := prepareEnqueue(EnqueueRequest{ChannelID: "c", Input: json.RawMessage(in)})
		require.NoError(t, err)
		assert.Nil(t, req.Input, "Input %q", in)
	}

	c, err := prepareClaim(ClaimRequest{Owner: "w", Count: 5000, TTL: time.Second})
	require.NoError(t, err)
	assert.Equal(t, ClaimCountLimit, c.Count)

	for limit, want := range map[int]int{-1: 1, 0: 1, 7: 7, ListLimit + 1: ListLimit} {
		l, err := prepareList(ListRequest{ChannelID: "c", Limit: limit})
		require.NoError(t, err)
		assert.Equal(t, want, l.Limit, "Limit %d", limit)
	}

	label, err := checkProgressRequest(ProgressRequest{Stage: "s", Label: "\t label \n", State: ProgressStarted})
	require.NoError(t, err)
	assert.Equal(t, "label", label)
}

func TestClaimable(t *testing.T) {
	now := testNow
	cases := []struct {
		name  string
		job   Job
		gen   uint64
		want  bool
		due   time.Time
		label string
	}{
		{name: "pending due", job: Job{State: StatePending, TargetGeneration: 1, AvailableAt: now}, gen: 1, want: true, due: now},
		{name: "pending due earlier", job: Job{State: StatePending, TargetGeneration: 1, AvailableAt: now.Add(-time.Hour)}, gen: 1, want: true, due: now.Add(-time.Hour)},
		{name: "pending not yet due", job: Job{State: StatePending, TargetGeneration: 1, AvailableAt: now.Add(time.Nanosecond)}, gen: 1},
		{name: "pending of an old generation", job: Job{State: StatePending, TargetGeneration: 1, AvailableAt: now}, gen: 2},
		{name: "running expired", job: Job{State: StateRunning, TargetGeneration: 2, ClaimExpiresAt: now}, gen: 2, want: true, due: now},
		{name: "running valid", job: Job{State: StateRunning, TargetGeneration: 2, ClaimExpiresAt: now.Add(time.Nanosecond)}, gen: 2},
		{name: "running without expiry", job: Job{State: StateRunning, TargetGeneration: 2}, gen: 2},
		{name: "paused", job: Job{State: StatePaused, TargetGeneration: 1, AvailableAt: now.Add(-time.Hour)}, gen: 1},
		{name: "completed", job: Job{State: StateCompleted, TargetGeneration: 1, AvailableAt: now.Add(-time.Hour)}, gen: 1},
		{name: "failed", job: Job{State: StateFailed, TargetGeneration: 1, AvailableAt: now.Add(-time.Hour)}, gen: 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, claimable(&tc.job, tc.gen, now))
			if tc.want {
				assert.True(t, claimDue(&tc.job).Equal(tc.due))
			}
		})
	}
}

func TestClaimOrderRule(t *testing.T) {
	a := func(id, ch string, due, created int) *Job {
		return &Job{ID: id, ChannelID: ch, State: StatePending, AvailableAt: testNow.Add(time.Duration(due) * time.Second), CreatedAt: testNow.Add(time.Duration(created) * time.Second)}
	}
	reclaim := &Job{ID: "r", ChannelID: "c", State: StateRunning, ClaimExpiresAt: testNow.Add(2 * time.Second), AvailableAt: testNow, CreatedAt: testNow}
	js := []*Job{a("z", "c", 3, 0), a("b", "c", 1, 5), a("a", "c", 1, 5), a("a", "b", 1, 5), a("y", "c", 1, 0), reclaim}
	slices.SortFunc(js, claimOrder)
	var got []string
	for _, j := range js {
		got = append(got, j.ChannelID+"/"+j.ID)
	}
	assert.Equal(t, []string{"c/y", "b/a", "c/a", "c/b", "c/r", "c/z"}, got, "due, created, id, channel; a reclaim is due at its expiry")
}

func TestEnqueueJobSupersedes(t *testing.T) {
	req := EnqueueRequest{ID: "new", ChannelID: "c", Type: "t", Version: 1, TargetKey: "doc", IdempotencyKey: "k", Fingerprint: "f"}
	old := func(id string, s State, gen uint64) Job {
		j := Job{ID: id, ChannelID: "c", TargetKey: "doc", State: s, TargetGeneration: gen, Reason: "r"}
		if s == StateRunning {
			j.ClaimOwner, j.ClaimExpiresAt, j.ClaimBinding, j.ClaimGeneration = "w", testNow.Add(time.Hour), json.RawMessage(`1`), 4
		}
		return j
	}
	targetJobs := []Job{
		old("p", StatePending, 1), old("q", StatePaused, 2), old("r", StateRunning, 3),
		old("done", StateCompleted, 1), old("cx", StateCancelled, 2),
		{ID: "other-target", ChannelID: "c", TargetKey: "x", State: StatePending, TargetGeneration: 1},
		{ID: "other-channel", ChannelID: "d", TargetKey: "doc", State: StatePending, TargetGeneration: 1},
	}
	before := slices.Clone(targetJobs)
	j, tgt, sup := enqueueJob(req, 3, targetJobs, testNow, 9)
	assert.Equal(t, before, targetJobs, "arguments unchanged")
	assert.Equal(t, Target{ChannelID: "c", TargetKey: "doc", Generation: 4}, tgt)
	assert.Equal(t, uint64(4), j.TargetGeneration)
	assert.Equal(t, StatePending, j.State)
	assert.Equal(t, testNow, j.AvailableAt, "zero AvailableAt is now")
	var ids []string
	for _, s := range sup {
		ids = append(ids, s.ID)
		assert.Equal(t, StateSuperseded, s.State)
		assert.Equal(t, uint64(9), s.Revision)
		assert.Empty(t, s.ClaimOwner)
		assert.Nil(t, s.ClaimBinding)
		assert.True(t, s.ClaimExpiresAt.IsZero())
		assert.Empty(t, s.Reason)
		assert.Equal(t, testNow, s.UpdatedAt)
		require.NoError(t, checkNotCorrupt(s))
	}
	assert.Equal(t, []string{"p", "q", "r"}, ids)
	assert.Equal(t, uint64(4), sup[2].ClaimGeneration, "the fence counter stays")
}

// checkNotCorrupt runs validateJob on a job filled up to a valid record.
func checkNotCorrupt(j Job) error {
	j.Type, j.IdempotencyKey, j.Fingerprint, j.Version = "t", "k", "f", 1
	j.Attempts = int(j.ClaimGeneration)
	j.CreatedAt, j.AvailableAt = testNow, testNow
	return validateJob(&j)
}

// The rules never change their arguments, and a job they return shares no
// slice a later rule would write into.
func TestRulesDoNotMutateTheirArguments(t *testing.T) {
	j := runningJob(t)
	// Give Progress spare capacity: an append in place would show.
	j.Progress = append(make([]Progress, 0, 8), j.Progress...)
	snap := cloneJob(j)
	c := ClaimOf(j)
	gen := j.TargetGeneration
	now := testNow.Add(time.Second)

	p1, err := progressJob(&j, ProgressRequest{Claim: c, Stage: "a", Label: "one", State: ProgressStarted}, gen, now, 10)
	require.NoError(t, err)
	p2, err := progressJob(&j, ProgressRequest{Claim: c, Stage: "b", Label: "two", State: ProgressStarted}, gen, now, 11)
	require.NoError(t, err)
	assert.Equal(t, "one", p1.Progress[len(p1.Progress)-1].Label, "a later append from the same job must not overwrite an earlier result")
	assert.Equal(t, "two", p2.Progress[len(p2.Progress)-1].Label)

	_, err = renewJob(&j, RenewRequest{Claim: c, ExpectedRevision: j.Revision, TTL: time.Hour, Binding: json.RawMessage(`1`)}, gen, now, 12)
	require.NoError(t, err)
	_, err = requeueJob(&j, RequeueRequest{Claim: c, CountFailure: true}, gen, now, 13)
	require.NoError(t, err)
	_, _, err = settleJob(&j, SettleRequest{Claim: c}, gen, now, 14)
	require.NoError(t, err)
	_, err = failJob(&j, FailRequest{Claim: c}, gen, now, 15)
	require.NoError(t, err)
	_, err = pauseJob(&j, PauseRequest{ChannelID: j.ChannelID, JobID: j.ID, ExpectedRevision: j.Revision}, gen, now, 16)
	require.NoError(t, err)
	_, err = cancelJob(&j, CancelRequest{ChannelID: j.ChannelID, JobID: j.ID}, gen, now, 17)
	require.NoError(t, err)
	_, err = supersedeJob(&j, SupersedeRequest{ChannelID: j.ChannelID, JobID: j.ID, ExpectedRevision: j.Revision}, gen, now, 18)
	require.NoError(t, err)
	claimJob(&j, ClaimRequest{Owner: "x", Count: 1, TTL: time.Second}, now, 19)
	_ = summary(&j)
	assert.Equal(t, snap, j)
}

func TestProgressKeepsTheLastEntries(t *testing.T) {
	j := runningJob(t)
	c := ClaimOf(j)
	for i := range ProgressLimit + 3 {
		var err error
		j, err = progressJob(&j, ProgressRequest{Claim: c, Stage: "s", Label: string(rune('A' + i)), State: ProgressCompleted}, 1, testNow, uint64(10+i))
		require.NoError(t, err)
		require.LessOrEqual(t, len(j.Progress), ProgressLimit)
		require.NoError(t, validateJob(&j))
	}
	assert.Equal(t, string(rune('A'+3)), j.Progress[0].Label)
	assert.Equal(t, string(rune('A'+ProgressLimit+2)), j.Progress[ProgressLimit-1].Label)
}

func TestListPageCursor(t *testing.T) {
	mk := func(id string, sec int) *Job {
		return &Job{ID: id, CreatedAt: testNow.Add(time.Duration(sec) * time.Second)}
	}
	all := []*Job{mk("a", 1), mk("c", 2), mk("b", 2), mk("d", 0), mk("e", 2)}
	sum := func(j *Job) Summary { return summary(j) }
	var got []string
	req := ListRequest{ChannelID: "c", Limit: 2}
	for range 5 {
		p := listPage(slices.Clone(all), req, 7, sum)
		assert.Equal(t, uint64(7), p.Revision)
		for _, s := range p.Jobs {
			got = append(got, s.ID)
		}
		if p.Next == nil {
			break
		}
		req.After = p.Next
	}
	assert.Equal(t, []string{"b", "c", "e", "a", "d"}, got)

	// A cursor at the last job's position ends the list; Limit exactly the
	// rest gives no Next.
	p := listPage(slices.Clone(all), ListRequest{Limit: 5}, 7, sum)
	assert.Len(t, p.Jobs, 5)
	assert.Nil(t, p.Next)
	p = listPage(slices.Clone(all), ListRequest{Limit: 5, After: &Cursor{CreatedAt: testNow, ID: "d"}}, 7, sum)
	assert.Empty(t, p.Jobs)
	assert.NotNil(t, p.Jobs, "an empty page has an empty, non-nil Jobs")
}
