package jobstest

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/jobkeys/jobkeys/jobs"
)

func init() {
	register("ClocksBehindTheRecord", testClocksBehindTheRecord)
}

// testClocksBehindTheRecord changes jobs with the store's clock behind the
// times already on them (a writer whose clock is behind the one that wrote
// before it), at fixed times. Each step's outcome is the seed's: every
// transition stamps the clock reading as it is (UpdatedAt may fall before
// CreatedAt), only renew and progress refuse a clock before UpdatedAt, and
// every job stays readable, listable and claimable.
func testClocksBehindTheRecord(t *testing.T, h *harness) {
	back := func(d time.Duration) time.Time {
		h.clock.Set(start.Add(-d))
		return h.clock.Now()
	}
	// stamped(what)(j, err) fails the test unless the call succeeded and
	// stamped the store's time.
	stamped := func(what string) func(jobs.Job, error) jobs.Job {
		return func(j jobs.Job, err error) jobs.Job {
			t.Helper()
			if err != nil {
				t.Fatalf("%s: %v", what, err)
			}
			sameTime(t, j.UpdatedAt, h.clock.Now(), what+": UpdatedAt is the store's time")
			return j
		}
	}
	due := func(id, target string) jobs.EnqueueRequest {
		r := h.req(id, target)
		r.AvailableAt = start.Add(-time.Hour)
		return r
	}

	// Cancel, 1.1 s behind the enqueue (the seed: cancelled, updatedAt = now).
	h.enqueue(h.req("j1", "d1"))
	h.enqueue(due("j2", "d2"))
	h.enqueue(h.req("j3", "d3"))
	h.enqueue(due("j6", "d6"))
	back(1100 * time.Millisecond)
	j, err := h.store.Cancel(h.ctx, jobs.CancelRequest{ChannelID: h.ch, JobID: "j1"})
	stamped("cancel behind")(j, err)
	d := h.get("j1")
	sameTime(t, d.Job.CreatedAt, start, "j1 CreatedAt")
	sameTime(t, d.Job.UpdatedAt, start.Add(-1100*time.Millisecond), "j1 UpdatedAt, before CreatedAt")

	// Claim behind; renew and progress later than the claim but still
	// behind the enqueue (the seed: both succeed, now ≥ updatedAt).
	c := h.claimOne("w1", "j2", time.Minute)
	stamped("claim behind")(c, nil)
	back(time.Second)
	c = stamped("renew behind the enqueue, after the claim")(h.store.Renew(h.ctx, jobs.RenewRequest{Claim: jobs.ClaimOf(c), ExpectedRevision: c.Revision, TTL: time.Minute}))
	c = stamped("progress behind the enqueue, after the renew")(h.store.AppendProgress(h.ctx, jobs.ProgressRequest{Claim: jobs.ClaimOf(c), Stage: "s", Label: "l", State: jobs.ProgressStarted}))

	// Renew and progress before UpdatedAt: the seed refuses both (conflict).
	back(2 * time.Second)
	_, err = h.store.Renew(h.ctx, jobs.RenewRequest{Claim: jobs.ClaimOf(c), ExpectedRevision: c.Revision, TTL: time.Minute})
	wantErr(t, err, jobs.ErrConflict, "renew before UpdatedAt")
	_, err = h.store.AppendProgress(h.ctx, jobs.ProgressRequest{Claim: jobs.ClaimOf(c), Stage: "s", Label: "l", State: jobs.ProgressStarted})
	wantErr(t, err, jobs.ErrConflict, "progress before UpdatedAt")

	// Every other transition stamps a clock behind UpdatedAt (the seed: all
	// succeed).
	q := stamped("requeue behind")(h.store.Requeue(h.ctx, jobs.RequeueRequest{Claim: jobs.ClaimOf(c), AvailableAt: start.Add(-time.Hour)}))
	back(3 * time.Second)
	p := stamped("pause behind")(h.store.Pause(h.ctx, jobs.PauseRequest{ChannelID: h.ch, JobID: "j2", ExpectedRevision: q.Revision}))
	back(4 * time.Second)
	stamped("resume behind")(h.store.Resume(h.ctx, jobs.ResumeRequest{ChannelID: h.ch, JobID: "j2", ExpectedRevision: p.Revision, AvailableAt: start.Add(-2 * time.Hour)}))
	c = h.claimOne("w1", "j2", time.Minute)
	stamped("claim again behind")(c, nil)
	back(5 * time.Second)
	s, err := h.store.Settle(h.ctx, jobs.SettleRequest{Claim: jobs.ClaimOf(c), Artifact: json.RawMessage(`1`)})
	stamped("settle behind")(s.Job, err)
	if s.Artifact != nil {
		sameTime(t, s.Artifact.CreatedAt, h.clock.Now(), "artifact CreatedAt")
	}

	// An enqueue behind the target's job supersedes it with the reading.
	back(6 * time.Second)
	h.enqueue(h.req("j5", "d3"))
	d = h.get("j3")
	equal(t, d.Job.State, jobs.StateSuperseded, "j3 superseded by an enqueue behind it")
	sameTime(t, d.Job.UpdatedAt, h.clock.Now(), "j3 UpdatedAt")
	back(7 * time.Second)
	stamped("supersede behind")(h.store.Supersede(h.ctx, jobs.SupersedeRequest{ChannelID: h.ch, JobID: "j5", ExpectedRevision: h.get("j5").Job.Revision}))
	back(8 * time.Second)
	f := h.claimOne("w1", "j6", time.Minute)
	back(9 * time.Second)
	stamped("fail behind")(h.store.Fail(h.ctx, jobs.FailRequest{Claim: jobs.ClaimOf(f), Reason: "boom"}))

	// Every job reads, lists and claims as before.
	h.enqueue(due("j7", "d7"))
	back(10 * time.Second)
	page, err := h.store.List(h.ctx, jobs.ListRequest{ChannelID: h.ch, Limit: 100})
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	equal(t, len(page.Jobs), 6, "jobs listed")
	for _, id := range []string{"j1", "j2", "j3", "j5", "j6", "j7"} {
		if _, err := h.store.Get(h.ctx, h.ch, id); err != nil {
			t.Errorf("Get(%s): %v", id, err)
		}
	}
	got, err := h.store.Claim(h.ctx, jobs.ClaimRequest{ChannelID: h.ch, Owner: "w2", Count: 10, TTL: time.Minute})
	if err != nil || len(got) != 1 || got[0].ID != "j7" {
		t.Errorf("Claim after the writes behind: got %v, %v; want [j7]", ids(got), err)
	}
	if errors.Is(err, jobs.ErrCorrupt) {
		t.Errorf("Claim skipped records: %v", err)
	}
}
