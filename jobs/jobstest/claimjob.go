package jobstest

import (
	"sync"
	"testing"
	"time"

	"github.com/jobkeys/jobkeys/jobs"
)

func init() {
	register("ClaimJobBadRequest", testClaimJobBadRequest)
	register("ClaimJobAsClaim", testClaimJobAsClaim)
	register("ClaimJobNotClaimable", testClaimJobNotClaimable)
	register("ClaimJobReclaimsExpired", testClaimJobReclaims)
	register("ClaimJobConcurrentOnce", testClaimJobConcurrent)
}

func (h *harness) claimJob(id, owner string, ttl time.Duration) (jobs.Job, error) {
	return h.store.ClaimJob(h.ctx, jobs.ClaimJobRequest{ChannelID: h.ch, JobID: id, Owner: owner, TTL: ttl})
}

func testClaimJobBadRequest(t *testing.T, h *harness) {
	h.add("j1", "doc")
	cases := []struct {
		name string
		req  jobs.ClaimJobRequest
		word string
	}{
		{"empty Owner", jobs.ClaimJobRequest{ChannelID: h.ch, JobID: "j1", TTL: time.Second}, "Owner"},
		{"empty JobID", jobs.ClaimJobRequest{ChannelID: h.ch, Owner: "w", TTL: time.Second}, "JobID"},
		{"empty ChannelID", jobs.ClaimJobRequest{JobID: "j1", Owner: "w", TTL: time.Second}, "ChannelID"},
		{"TTL 0", jobs.ClaimJobRequest{ChannelID: h.ch, JobID: "j1", Owner: "w"}, "TTL"},
		{"Owner not UTF-8", jobs.ClaimJobRequest{ChannelID: h.ch, JobID: "j1", Owner: "\xff", TTL: time.Second}, "Owner"},
	}
	for _, tc := range cases {
		rev := h.rev()
		_, err := h.store.ClaimJob(h.ctx, tc.req)
		wantErr(t, err, jobs.ErrConflict, tc.name, tc.word)
		h.unchanged(rev, tc.name)
	}
	_, err := h.claimJob("missing", "w", time.Second)
	wantErr(t, err, jobs.ErrNotFound, "a job not in the channel", "missing")
	equal(t, h.get("j1").Job.State, jobs.StatePending, "j1 after bad claims")
}

// ClaimJob claims a job exactly as Claim would: the same fields, and the
// job is then fenced as any claimed job.
func testClaimJobAsClaim(t *testing.T, h *harness) {
	j := h.add("j1", "doc")
	h.add("j0", "doc0") // older, due: ClaimJob takes the job it names all the same
	h.clock.Advance(3 * time.Second)
	now := h.clock.Now()
	c, err := h.claimJob("j1", "w1", 30*time.Second)
	noErr(t, err, "claim j1")
	equal(t, c.State, jobs.StateRunning, "State")
	equal(t, c.Attempts, 1, "Attempts")
	equal(t, c.ClaimGeneration, uint64(1), "ClaimGeneration")
	equal(t, c.ClaimOwner, "w1", "ClaimOwner")
	sameTime(t, c.ClaimExpiresAt, now.Add(30*time.Second), "ClaimExpiresAt = now + TTL")
	sameTime(t, c.CreatedAt, j.CreatedAt, "CreatedAt kept")
	if c.Revision <= j.Revision {
		t.Errorf("claim Revision %d not above the enqueue's %d", c.Revision, j.Revision)
	}
	equal(t, h.get("j1").Job, c, "Get after the claim")
	equal(t, h.get("j0").Job.State, jobs.StatePending, "j0 untouched")
	_, err = h.store.Settle(h.ctx, jobs.SettleRequest{Claim: jobs.ClaimOf(c)})
	noErr(t, err, "settle with the claim ClaimJob gave")
	equal(t, ids(h.claim("w2", 10, time.Minute)), []string{"j0"}, "Claim after: only j0 is left")
}

func testClaimJobNotClaimable(t *testing.T, h *harness) {
	later := h.req("later", "t-later")
	later.AvailableAt = start.Add(time.Hour)
	h.enqueue(later)
	h.add("running", "t-running")
	_, err := h.claimJob("running", "w1", time.Minute)
	noErr(t, err, "first claim of running")
	h.inState("paused", jobs.StatePaused)
	h.inState("done", jobs.StateCompleted)
	h.add("old", "same")
	h.add("new", "same") // supersedes old
	for _, tc := range []struct{ id, word string }{
		{"later", "not due"},
		{"running", "claimed until"},
		{"paused", "paused"},
		{"done", "completed"},
		{"old", "superseded"},
	} {
		rev := h.rev()
		_, err := h.claimJob(tc.id, "w2", time.Minute)
		wantErr(t, err, jobs.ErrConflict, "ClaimJob of "+tc.id, tc.word)
		h.unchanged(rev, "ClaimJob of "+tc.id)
	}
	h.clock.Set(start.Add(time.Hour))
	c, err := h.claimJob("later", "w2", time.Minute)
	noErr(t, err, "ClaimJob of later once due")
	equal(t, c.State, jobs.StateRunning, "later's state once claimed")
}

func testClaimJobReclaims(t *testing.T, h *harness) {
	h.add("j1", "doc")
	old, err := h.claimJob("j1", "w1", 10*time.Second)
	noErr(t, err, "first claim")
	h.clock.Set(old.ClaimExpiresAt)
	re, err := h.claimJob("j1", "w2", time.Minute)
	noErr(t, err, "reclaim at the expiry")
	equal(t, re.ClaimOwner, "w2", "reclaimed ClaimOwner")
	equal(t, re.Attempts, 2, "reclaimed Attempts")
	equal(t, re.ClaimGeneration, old.ClaimGeneration+1, "reclaimed ClaimGeneration")
	_, err = h.store.Settle(h.ctx, jobs.SettleRequest{Claim: jobs.ClaimOf(old)})
	wantErr(t, err, jobs.ErrConflict, "Settle with the expired claim")
}

func testClaimJobConcurrent(t *testing.T, h *harness) {
	h.add("j1", "doc")
	const n = 8
	var wg sync.WaitGroup
	var mu sync.Mutex
	won := 0
	for i := range n {
		wg.Go(func() {
			_, err := h.claimJob("j1", "w"+string(rune('a'+i)), time.Minute)
			if err == nil {
				mu.Lock()
				won++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	equal(t, won, 1, "ClaimJob calls that won")
	equal(t, h.get("j1").Job.Attempts, 1, "Attempts after concurrent ClaimJob calls")
}
