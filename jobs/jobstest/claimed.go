package jobstest

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jobkeys/jobkeys/jobs"
)

func init() {
	register("ClaimedCallsFenced", testClaimedFenced)
	register("Renew", testRenew)
	register("RenewBadRequest", testRenewBad)
	register("Requeue", testRequeue)
	register("Progress", testProgress)
	register("ProgressBadRequest", testProgressBad)
	register("ProgressKeepsTheLast", testProgressBounded)
	register("Settle", testSettle)
	register("SettleOnce", testSettleOnce)
	register("SettleBadRequest", testSettleBad)
	register("Fail", testFail)
}

// claimedCall is one of the five claimed calls made with a claim; it
// returns the call's error.
type claimedCall struct {
	name string
	call func(h *harness, c jobs.Claim, rev uint64) error
}

var claimedCalls = []claimedCall{
	{"Renew", func(h *harness, c jobs.Claim, rev uint64) error {
		_, err := h.store.Renew(h.ctx, jobs.RenewRequest{Claim: c, ExpectedRevision: rev, TTL: time.Hour})
		return err
	}},
	{"Requeue", func(h *harness, c jobs.Claim, _ uint64) error {
		_, err := h.store.Requeue(h.ctx, jobs.RequeueRequest{Claim: c})
		return err
	}},
	{"AppendProgress", func(h *harness, c jobs.Claim, _ uint64) error {
		_, err := h.store.AppendProgress(h.ctx, jobs.ProgressRequest{Claim: c, Stage: "fetch", Label: "fetching", State: jobs.ProgressStarted})
		return err
	}},
	{"Settle", func(h *harness, c jobs.Claim, _ uint64) error {
		_, err := h.store.Settle(h.ctx, jobs.SettleRequest{Claim: c, Artifact: json.RawMessage(`{"ok":true}`)})
		return err
	}},
	{"Fail", func(h *harness, c jobs.Claim, _ uint64) error {
		_, err := h.store.Fail(h.ctx, jobs.FailRequest{Claim: c, Reason: "boom"})
		return err
	}},
}

func testClaimedFenced(t *testing.T, h *harness) {
	cases := []struct {
		name string
		// prepare returns the claim to present after setting up job id.
		prepare func(h *harness, id string) jobs.Claim
		kind    error
	}{
		{"another owner", func(h *harness, id string) jobs.Claim {
			c := jobs.ClaimOf(h.claimOne("w1", id, time.Minute))
			c.Owner = "w2"
			return c
		}, jobs.ErrConflict},
		{"empty owner", func(h *harness, id string) jobs.Claim {
			c := jobs.ClaimOf(h.claimOne("w1", id, time.Minute))
			c.Owner = ""
			return c
		}, jobs.ErrConflict},
		{"another generation", func(h *harness, id string) jobs.Claim {
			c := jobs.ClaimOf(h.claimOne("w1", id, time.Minute))
			c.Generation++
			return c
		}, jobs.ErrConflict},
		{"expired claim", func(h *harness, id string) jobs.Claim {
			c := h.claimOne("w1", id, time.Minute)
			h.clock.Set(c.ClaimExpiresAt)
			return jobs.ClaimOf(c)
		}, jobs.ErrConflict},
		{"not running (pending)", func(h *harness, id string) jobs.Claim {
			return jobs.Claim{ChannelID: h.ch, JobID: id, Owner: "w1", Generation: 0}
		}, jobs.ErrConflict},
		{"not running (requeued)", func(h *harness, id string) jobs.Claim {
			c := jobs.ClaimOf(h.claimOne("w1", id, time.Minute))
			_, err := h.store.Requeue(h.ctx, jobs.RequeueRequest{Claim: c, AvailableAt: start.Add(24 * time.Hour)})
			noErr(h.t, err, "requeue")
			return c
		}, jobs.ErrConflict},
		{"paused", func(h *harness, id string) jobs.Claim {
			c := h.claimOne("w1", id, time.Minute)
			_, err := h.store.Pause(h.ctx, jobs.PauseRequest{ChannelID: h.ch, JobID: id, ExpectedRevision: c.Revision})
			noErr(h.t, err, "pause")
			return jobs.ClaimOf(c)
		}, jobs.ErrConflict},
		{"superseded by a newer job", func(h *harness, id string) jobs.Claim {
			c := h.claimOne("w1", id, time.Minute)
			h.add(id+"-newer", c.TargetKey)
			return jobs.ClaimOf(c)
		}, jobs.ErrConflict},
		{"missing job", func(h *harness, id string) jobs.Claim {
			c := jobs.ClaimOf(h.claimOne("w1", id, time.Minute))
			c.JobID = "nope"
			return c
		}, jobs.ErrNotFound},
		{"another channel", func(h *harness, id string) jobs.Claim {
			c := jobs.ClaimOf(h.claimOne("w1", id, time.Minute))
			c.ChannelID = "chan-z"
			return c
		}, jobs.ErrNotFound},
		{"empty channel", func(h *harness, id string) jobs.Claim {
			c := jobs.ClaimOf(h.claimOne("w1", id, time.Minute))
			c.ChannelID = ""
			return c
		}, jobs.ErrNotFound},
	}
	n := 0
	for _, tc := range cases {
		for _, call := range claimedCalls {
			// Each case in its own channel: nothing left from one case is
			// claimable in the next.
			n++
			h.ch = fmt.Sprintf("fence-%03d", n)
			h.clock.Set(start)
			h.add("j1", "doc")
			c := tc.prepare(h, "j1")
			before := h.get("j1").Job
			rev := h.rev()
			err := call.call(h, c, before.Revision)
			what := call.name + " with " + tc.name
			wantErr(t, err, tc.kind, what)
			h.unchanged(rev, what)
			equal(t, h.get("j1").Job, before, what+": job after the refused call")
		}
	}
}

func testRenew(t *testing.T, h *harness) {
	h.add("j1", "doc")
	c := h.claimOne("w1", "j1", 10*time.Second)
	h.clock.Advance(4 * time.Second)
	r, err := h.store.Renew(h.ctx, jobs.RenewRequest{Claim: jobs.ClaimOf(c), ExpectedRevision: c.Revision, TTL: 10 * time.Second, Binding: json.RawMessage(` {"lease": "k1"} `)})
	noErr(t, err, "renew")
	sameTime(t, r.ClaimExpiresAt, h.clock.Now().Add(10*time.Second), "renewed ClaimExpiresAt")
	sameJSON(t, r.ClaimBinding, `{"lease":"k1"}`, "ClaimBinding")
	equal(t, r.ClaimOwner, "w1", "ClaimOwner kept")
	equal(t, r.ClaimGeneration, c.ClaimGeneration, "ClaimGeneration kept")
	equal(t, r.Attempts, 1, "Attempts kept")
	equal(t, r.State, jobs.StateRunning, "State")
	sameTime(t, r.UpdatedAt, h.clock.Now(), "UpdatedAt")
	if r.Revision <= c.Revision {
		t.Errorf("renew Revision %d not above the claim's %d", r.Revision, c.Revision)
	}
	equal(t, h.get("j1").Job, r, "Get after renew")

	// The old revision is stale now.
	rev := h.rev()
	_, err = h.store.Renew(h.ctx, jobs.RenewRequest{Claim: jobs.ClaimOf(c), ExpectedRevision: c.Revision, TTL: time.Minute})
	wantErr(t, err, jobs.ErrConflict, "renew with a stale ExpectedRevision", "ExpectedRevision")
	h.unchanged(rev, "renew with a stale ExpectedRevision")

	// The expiry must move strictly later: the same expiry is refused.
	_, err = h.store.Renew(h.ctx, jobs.RenewRequest{Claim: jobs.ClaimOf(r), ExpectedRevision: r.Revision, TTL: 10 * time.Second})
	wantErr(t, err, jobs.ErrConflict, "renew to the same expiry", "TTL")
	_, err = h.store.Renew(h.ctx, jobs.RenewRequest{Claim: jobs.ClaimOf(r), ExpectedRevision: r.Revision, TTL: time.Second})
	wantErr(t, err, jobs.ErrConflict, "renew to an earlier expiry", "TTL")
	h.unchanged(rev, "refused renewals")

	// A clock behind the job's last change is refused.
	h.clock.Set(r.UpdatedAt.Add(-time.Second))
	_, err = h.store.Renew(h.ctx, jobs.RenewRequest{Claim: jobs.ClaimOf(r), ExpectedRevision: r.Revision, TTL: time.Hour})
	wantErr(t, err, jobs.ErrConflict, "renew with the clock before UpdatedAt")
	h.clock.Set(r.UpdatedAt)

	// Renewing without a binding clears it.
	r2, err := h.store.Renew(h.ctx, jobs.RenewRequest{Claim: jobs.ClaimOf(r), ExpectedRevision: r.Revision, TTL: time.Minute})
	noErr(t, err, "renew without binding")
	equal(t, len(r2.ClaimBinding), 0, "ClaimBinding cleared")
	r3, err := h.store.Renew(h.ctx, jobs.RenewRequest{Claim: jobs.ClaimOf(r2), ExpectedRevision: r2.Revision, TTL: 2 * time.Minute, Binding: json.RawMessage(`null`)})
	noErr(t, err, "renew with null binding")
	equal(t, len(r3.ClaimBinding), 0, "null ClaimBinding is none")
}

func testRenewBad(t *testing.T, h *harness) {
	h.add("j1", "doc")
	c := h.claimOne("w1", "j1", time.Minute)
	cases := []struct {
		name  string
		req   jobs.RenewRequest
		words []string
	}{
		{"TTL 0", jobs.RenewRequest{Claim: jobs.ClaimOf(c), ExpectedRevision: c.Revision}, []string{"TTL"}},
		{"negative TTL", jobs.RenewRequest{Claim: jobs.ClaimOf(c), ExpectedRevision: c.Revision, TTL: -time.Second}, []string{"TTL"}},
		{"Binding not JSON", jobs.RenewRequest{Claim: jobs.ClaimOf(c), ExpectedRevision: c.Revision, TTL: time.Hour, Binding: json.RawMessage(`{`)}, []string{"Binding"}},
		{"Binding oversize", jobs.RenewRequest{Claim: jobs.ClaimOf(c), ExpectedRevision: c.Revision, TTL: time.Hour,
			Binding: json.RawMessage(`"` + strings.Repeat("b", jobs.BindingSizeLimit) + `"`)}, []string{"Binding", itoa(jobs.BindingSizeLimit)}},
	}
	for _, tc := range cases {
		rev := h.rev()
		_, err := h.store.Renew(h.ctx, tc.req)
		wantErr(t, err, jobs.ErrConflict, tc.name, tc.words...)
		h.unchanged(rev, tc.name)
	}
	equal(t, h.get("j1").Job, c, "job after bad renewals")
}

func testRequeue(t *testing.T, h *harness) {
	h.add("j1", "doc")
	c := h.claimOne("w1", "j1", time.Minute)
	h.clock.Advance(time.Second)
	later := h.clock.Now().Add(time.Hour)
	q, err := h.store.Requeue(h.ctx, jobs.RequeueRequest{Claim: jobs.ClaimOf(c), AvailableAt: later, Reason: "backoff"})
	noErr(t, err, "requeue")
	equal(t, q.State, jobs.StatePending, "State")
	sameTime(t, q.AvailableAt, later, "AvailableAt")
	equal(t, q.Reason, "backoff", "Reason")
	equal(t, q.Failures, 0, "Failures without CountFailure")
	equal(t, q.Attempts, 1, "Attempts kept")
	equal(t, q.ClaimGeneration, c.ClaimGeneration, "ClaimGeneration kept")
	equal(t, q.ClaimOwner, "", "ClaimOwner cleared")
	equal(t, q.ClaimExpiresAt.IsZero(), true, "ClaimExpiresAt cleared")
	sameTime(t, q.UpdatedAt, h.clock.Now(), "UpdatedAt")
	if q.Revision <= c.Revision {
		t.Errorf("requeue Revision %d not above %d", q.Revision, c.Revision)
	}
	equal(t, len(h.claim("w1", 1, time.Minute)), 0, "claim before the new AvailableAt")
	h.clock.Set(later)
	c2 := h.claimOne("w2", "j1", time.Minute)
	q2, err := h.store.Requeue(h.ctx, jobs.RequeueRequest{Claim: jobs.ClaimOf(c2), CountFailure: true, Reason: "error"})
	noErr(t, err, "requeue counting a failure")
	equal(t, q2.Failures, 1, "Failures with CountFailure")
	equal(t, q2.Attempts, 2, "Attempts")
	sameTime(t, q2.AvailableAt, h.clock.Now(), "zero AvailableAt is now")
	c3 := h.claimOne("w3", "j1", time.Minute)
	equal(t, c3.ClaimGeneration, uint64(3), "ClaimGeneration on the third claim")
	equal(t, c3.Failures, 1, "Failures kept by a claim")

	_, err = h.store.Requeue(h.ctx, jobs.RequeueRequest{Claim: jobs.ClaimOf(c3), Reason: strings.Repeat("r", jobs.ReasonSizeLimit+1)})
	wantErr(t, err, jobs.ErrConflict, "oversize Reason", "Reason", itoa(jobs.ReasonSizeLimit))
	_, err = h.store.Requeue(h.ctx, jobs.RequeueRequest{Claim: jobs.ClaimOf(c3), AvailableAt: time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)})
	wantErr(t, err, jobs.ErrConflict, "AvailableAt beyond 9999", "AvailableAt")
	equal(t, h.get("j1").Job, c3, "job after refused requeues")
}

func testProgress(t *testing.T, h *harness) {
	h.add("j1", "doc")
	c := h.claimOne("w1", "j1", time.Minute)
	h.clock.Advance(time.Second)
	p, err := h.store.AppendProgress(h.ctx, jobs.ProgressRequest{Claim: jobs.ClaimOf(c), Stage: "fetch", Label: "  Fetching sources  ", State: jobs.ProgressStarted})
	noErr(t, err, "progress")
	if p.Revision <= c.Revision {
		t.Errorf("progress Revision %d not above %d", p.Revision, c.Revision)
	}
	equal(t, len(p.Progress), 1, "entries")
	if len(p.Progress) == 1 {
		e := p.Progress[0]
		equal(t, e.Revision, p.Revision, "entry Revision is the job's")
		equal(t, e.Attempt, 1, "entry Attempt")
		equal(t, e.Stage, "fetch", "entry Stage")
		equal(t, e.Label, "Fetching sources", "entry Label trimmed")
		equal(t, e.State, jobs.ProgressStarted, "entry State")
		equal(t, e.Reason, "", "entry Reason")
		sameTime(t, e.CreatedAt, h.clock.Now(), "entry CreatedAt")
	}
	equal(t, p.ClaimOwner, "w1", "claim kept")
	sameTime(t, p.ClaimExpiresAt, c.ClaimExpiresAt, "ClaimExpiresAt kept")
	equal(t, p.State, jobs.StateRunning, "State")

	p2, err := h.store.AppendProgress(h.ctx, jobs.ProgressRequest{Claim: jobs.ClaimOf(c), Stage: "fetch", Label: "gave up", State: jobs.ProgressInterrupted, Reason: "rate-limited"})
	noErr(t, err, "interrupted progress")
	equal(t, len(p2.Progress), 2, "entries after two")
	equal(t, p2.Progress[1].Reason, "rate-limited", "interrupted Reason")
	equal(t, p2.Progress[0], p.Progress[0], "first entry unchanged")
	equal(t, h.get("j1").Job, p2, "Get after progress")

	// A renewal still works after progress, with the new revision.
	_, err = h.store.Renew(h.ctx, jobs.RenewRequest{Claim: jobs.ClaimOf(c), ExpectedRevision: p2.Revision, TTL: time.Hour})
	noErr(t, err, "renew after progress")

	// The clock must not be behind the last change.
	h.clock.Set(start)
	_, err = h.store.AppendProgress(h.ctx, jobs.ProgressRequest{Claim: jobs.ClaimOf(c), Stage: "late", Label: "late", State: jobs.ProgressStarted})
	wantErr(t, err, jobs.ErrConflict, "progress with the clock before UpdatedAt")
}

func testProgressBad(t *testing.T, h *harness) {
	h.add("j1", "doc")
	c := jobs.ClaimOf(h.claimOne("w1", "j1", time.Minute))
	ok := jobs.ProgressRequest{Claim: c, Stage: "s", Label: "l", State: jobs.ProgressStarted}
	cases := []struct {
		name string
		edit func(r *jobs.ProgressRequest)
		word string
	}{
		{"empty Stage", func(r *jobs.ProgressRequest) { r.Stage = "" }, "Stage"},
		{"upper-case Stage", func(r *jobs.ProgressRequest) { r.Stage = "Fetch" }, "Stage"},
		{"Stage starting with a digit", func(r *jobs.ProgressRequest) { r.Stage = "1st" }, "Stage"},
		{"Stage with underscore", func(r *jobs.ProgressRequest) { r.Stage = "a_b" }, "Stage"},
		{"Stage of 65", func(r *jobs.ProgressRequest) { r.Stage = "a" + strings.Repeat("b", 64) }, "Stage"},
		{"empty Label", func(r *jobs.ProgressRequest) { r.Label = "" }, "Label"},
		{"blank Label", func(r *jobs.ProgressRequest) { r.Label = " \t\n " }, "Label"},
		{"Label of 161", func(r *jobs.ProgressRequest) { r.Label = strings.Repeat("é", jobs.LabelLimit+1) }, "Label"},
		{"Label not UTF-8", func(r *jobs.ProgressRequest) { r.Label = "a\xff" }, "Label"},
		{"unknown State", func(r *jobs.ProgressRequest) { r.State = "done" }, "State"},
		{"empty State", func(r *jobs.ProgressRequest) { r.State = "" }, "State"},
		{"interrupted without Reason", func(r *jobs.ProgressRequest) { r.State = jobs.ProgressInterrupted }, "Reason"},
		{"interrupted with a bad Reason", func(r *jobs.ProgressRequest) { r.State = jobs.ProgressInterrupted; r.Reason = "Bad reason" }, "Reason"},
		{"Reason on started", func(r *jobs.ProgressRequest) { r.Reason = "why" }, "Reason"},
		{"Reason on completed", func(r *jobs.ProgressRequest) { r.State = jobs.ProgressCompleted; r.Reason = "why" }, "Reason"},
	}
	for _, tc := range cases {
		rev := h.rev()
		r := ok
		tc.edit(&r)
		_, err := h.store.AppendProgress(h.ctx, r)
		wantErr(t, err, jobs.ErrConflict, tc.name, tc.word)
		h.unchanged(rev, tc.name)
	}
	// The bounds themselves are accepted.
	edge := ok
	edge.Stage = "a" + strings.Repeat("-", 63)
	edge.Label = "  " + strings.Repeat("é", jobs.LabelLimit) + "  "
	p, err := h.store.AppendProgress(h.ctx, edge)
	noErr(t, err, "progress at the bounds")
	equal(t, p.Progress[len(p.Progress)-1].Label, strings.Repeat("é", jobs.LabelLimit), "label at the limit, trimmed")
}

func testProgressBounded(t *testing.T, h *harness) {
	h.add("j1", "doc")
	c := jobs.ClaimOf(h.claimOne("w1", "j1", time.Hour))
	var last jobs.Job
	for i := range jobs.ProgressLimit + 8 {
		var err error
		last, err = h.store.AppendProgress(h.ctx, jobs.ProgressRequest{Claim: c, Stage: "step", Label: fmt.Sprintf("step %d", i), State: jobs.ProgressCompleted})
		noErr(t, err, "progress "+itoa(i))
	}
	equal(t, len(last.Progress), jobs.ProgressLimit, "entries kept")
	equal(t, last.Progress[0].Label, "step 8", "oldest kept entry")
	equal(t, last.Progress[jobs.ProgressLimit-1].Label, fmt.Sprintf("step %d", jobs.ProgressLimit+7), "newest entry")
	for i := 1; i < len(last.Progress); i++ {
		if last.Progress[i].Revision <= last.Progress[i-1].Revision {
			t.Errorf("progress entry %d Revision %d not above the previous %d", i, last.Progress[i].Revision, last.Progress[i-1].Revision)
		}
	}
	equal(t, h.get("j1").Job.Progress, last.Progress, "stored entries")
}

func testSettle(t *testing.T, h *harness) {
	h.add("j1", "doc")
	c := h.claimOne("w1", "j1", time.Minute)
	h.clock.Advance(2 * time.Second)
	d, err := h.store.Settle(h.ctx, jobs.SettleRequest{Claim: jobs.ClaimOf(c), Artifact: json.RawMessage(`{ "pages": [1, 2] }`)})
	noErr(t, err, "settle")
	j := d.Job
	equal(t, j.State, jobs.StateCompleted, "State")
	equal(t, j.ClaimOwner, "", "ClaimOwner cleared")
	equal(t, j.ClaimExpiresAt.IsZero(), true, "ClaimExpiresAt cleared")
	equal(t, j.Reason, "", "Reason")
	equal(t, j.ClaimGeneration, c.ClaimGeneration, "ClaimGeneration kept")
	sameTime(t, j.UpdatedAt, h.clock.Now(), "UpdatedAt")
	if j.Revision <= c.Revision {
		t.Errorf("settle Revision %d not above %d", j.Revision, c.Revision)
	}
	if d.Artifact == nil {
		t.Fatal("Settle returned no artifact")
	}
	equal(t, d.Artifact.JobID, "j1", "Artifact.JobID")
	equal(t, d.Artifact.Revision, j.Revision, "Artifact.Revision is the settle's")
	sameJSON(t, d.Artifact.Value, `{"pages":[1,2]}`, "Artifact.Value")
	sameTime(t, d.Artifact.CreatedAt, h.clock.Now(), "Artifact.CreatedAt")
	equal(t, d.Target, jobs.Target{ChannelID: h.ch, TargetKey: "doc", Generation: 1}, "Detail.Target")
	if d.Revision < j.Revision {
		t.Errorf("Detail.Revision %d below the job's %d", d.Revision, j.Revision)
	}
	g := h.get("j1")
	equal(t, g.Job, j, "Get after settle: job")
	equal(t, g.Artifact, d.Artifact, "Get after settle: artifact")

	// A settle without artifact value.
	h.add("j2", "doc2")
	c2 := h.claimOne("w1", "j2", time.Minute)
	d2, err := h.store.Settle(h.ctx, jobs.SettleRequest{Claim: jobs.ClaimOf(c2), Artifact: json.RawMessage(`null`)})
	noErr(t, err, "settle with null")
	if d2.Artifact == nil {
		t.Fatal("Settle(null) returned no artifact")
	}
	equal(t, len(d2.Artifact.Value), 0, "null artifact is no value")
}

func testSettleOnce(t *testing.T, h *harness) {
	h.add("j1", "doc")
	c := h.claimOne("w1", "j1", time.Minute)
	d, err := h.store.Settle(h.ctx, jobs.SettleRequest{Claim: jobs.ClaimOf(c), Artifact: json.RawMessage(`"first"`)})
	noErr(t, err, "settle")
	rev := h.rev()
	_, err = h.store.Settle(h.ctx, jobs.SettleRequest{Claim: jobs.ClaimOf(c), Artifact: json.RawMessage(`"second"`)})
	wantErr(t, err, jobs.ErrConflict, "second settle")
	h.unchanged(rev, "second settle")
	g := h.get("j1")
	sameJSON(t, g.Artifact.Value, `"first"`, "artifact after a second settle")
	equal(t, g.Job, d.Job, "job after a second settle")
	// A completed job is not claimable again, so nothing can settle it.
	h.clock.Advance(time.Hour)
	equal(t, len(h.claim("w2", 1, time.Minute)), 0, "claim a completed job")
	// A replay of its enqueue returns it completed.
	out, err := h.store.Enqueue(h.ctx, h.req("j1", "doc"))
	noErr(t, err, "replay a completed job")
	equal(t, out.Job.State, jobs.StateCompleted, "replayed State")
}

func testSettleBad(t *testing.T, h *harness) {
	h.add("j1", "doc")
	c := h.claimOne("w1", "j1", time.Minute)
	cases := []struct {
		name     string
		artifact json.RawMessage
		words    []string
	}{
		{"Artifact not JSON", json.RawMessage(`[1,`), []string{"Artifact"}},
		{"Artifact oversize", json.RawMessage(`"` + strings.Repeat("a", jobs.ArtifactSizeLimit) + `"`), []string{"Artifact", itoa(jobs.ArtifactSizeLimit)}},
	}
	for _, tc := range cases {
		rev := h.rev()
		_, err := h.store.Settle(h.ctx, jobs.SettleRequest{Claim: jobs.ClaimOf(c), Artifact: tc.artifact})
		wantErr(t, err, jobs.ErrConflict, tc.name, tc.words...)
		h.unchanged(rev, tc.name)
	}
	g := h.get("j1")
	equal(t, g.Job, c, "job after bad settles")
	if g.Artifact != nil {
		t.Errorf("artifact %+v after bad settles", g.Artifact)
	}
	d, err := h.store.Settle(h.ctx, jobs.SettleRequest{Claim: jobs.ClaimOf(c), Artifact: json.RawMessage(`"` + strings.Repeat("a", jobs.ArtifactSizeLimit-2) + `"`)})
	noErr(t, err, "settle at the artifact limit")
	equal(t, len(d.Artifact.Value), jobs.ArtifactSizeLimit, "artifact at the limit")
}

func testFail(t *testing.T, h *harness) {
	r := h.req("j1", "doc")
	r.AvailableAt = start.Add(time.Second)
	h.enqueue(r)
	h.clock.Advance(2 * time.Second)
	c := h.claimOne("w1", "j1", time.Minute)
	f, err := h.store.Fail(h.ctx, jobs.FailRequest{Claim: jobs.ClaimOf(c), Reason: "bad input"})
	noErr(t, err, "fail")
	equal(t, f.State, jobs.StateFailed, "State")
	equal(t, f.Failures, 1, "Failures")
	equal(t, f.Reason, "bad input", "Reason")
	sameTime(t, f.AvailableAt, start.Add(time.Second), "AvailableAt kept")
	equal(t, f.ClaimOwner, "", "ClaimOwner cleared")
	equal(t, f.ClaimExpiresAt.IsZero(), true, "ClaimExpiresAt cleared")
	if f.Revision <= c.Revision {
		t.Errorf("fail Revision %d not above %d", f.Revision, c.Revision)
	}
	equal(t, h.get("j1").Job, f, "Get after fail")
	if h.get("j1").Artifact != nil {
		t.Error("a failed job has an artifact")
	}
	equal(t, len(h.claim("w1", 1, time.Minute)), 0, "claim a failed job")
	_, err = h.store.Fail(h.ctx, jobs.FailRequest{Claim: jobs.ClaimOf(c)})
	wantErr(t, err, jobs.ErrConflict, "fail twice")
}
