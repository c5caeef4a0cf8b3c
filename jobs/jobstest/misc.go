package jobstest

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/jobkeys/jobkeys/jobs"
)

func init() {
	register("ValuesAreCopies", testCopies)
	register("RevisionsIncrease", testRevisions)
	register("GuardRefusesEveryWrite", testGuard)
	register("RegistryErrorsAreUnavailable", testRegistryErrors)
	register("CancelledContext", testCancelledContext)
	register("ZeroRequestsRefused", testZeroRequests)
}

func testCopies(t *testing.T, h *harness) {
	r := h.req("j1", "doc")
	input := json.RawMessage(`{"subject":"s"}`)
	r.Input = input
	out := h.enqueue(r)
	input[2] = 'X' // the caller's buffer after the call
	out.Input[2] = 'Y'
	sameJSON(t, h.get("j1").Job.Input, `{"subject":"s"}`, "Input after mutating the request and the result")

	c := h.claimOne("w", "j1", time.Hour)
	c.Input[2] = 'Z'
	binding := json.RawMessage(`{"b":1}`)
	rn, err := h.store.Renew(h.ctx, jobs.RenewRequest{Claim: jobs.ClaimOf(c), ExpectedRevision: c.Revision, TTL: 2 * time.Hour, Binding: binding})
	noErr(t, err, "renew")
	binding[2] = 'X'
	rn.ClaimBinding[2] = 'Y'
	sameJSON(t, h.get("j1").Job.ClaimBinding, `{"b":1}`, "ClaimBinding after mutation")

	p, err := h.store.AppendProgress(h.ctx, jobs.ProgressRequest{Claim: jobs.ClaimOf(c), Stage: "s", Label: "label", State: jobs.ProgressStarted})
	noErr(t, err, "progress")
	p.Progress[0].Label = "changed"
	p.Progress = append(p.Progress[:0], jobs.Progress{Label: "other"})
	g := h.get("j1")
	equal(t, g.Job.Progress[0].Label, "label", "Progress after mutating a returned job")
	g.Job.Progress[0].Label = "changed via Get"
	equal(t, h.get("j1").Job.Progress[0].Label, "label", "Progress after mutating a Get result")

	page, err := h.store.List(h.ctx, jobs.ListRequest{ChannelID: h.ch, Limit: 5})
	noErr(t, err, "list")
	page.Jobs[0].Progress[0].Label = "changed via List"
	equal(t, h.get("j1").Job.Progress[0].Label, "label", "Progress after mutating a List result")

	art := json.RawMessage(`{"a":1}`)
	d, err := h.store.Settle(h.ctx, jobs.SettleRequest{Claim: jobs.ClaimOf(c), Artifact: art})
	noErr(t, err, "settle")
	art[2] = 'X'
	d.Artifact.Value[2] = 'Y'
	d.Job.Progress[0].Label = "changed via Settle"
	g = h.get("j1")
	sameJSON(t, g.Artifact.Value, `{"a":1}`, "artifact after mutation")
	equal(t, g.Job.Progress[0].Label, "label", "Progress after mutating a Settle result")
	g.Artifact.Value[2] = 'Z'
	sameJSON(t, h.get("j1").Artifact.Value, `{"a":1}`, "artifact after mutating a Get result")

	out2, err := h.store.Enqueue(h.ctx, h.req("j1", "doc"))
	noErr(t, err, "replay")
	out2.Job.Input[2] = 'Q'
	sameJSON(t, h.get("j1").Job.Input, `{"subject":"s"}`, "Input after mutating a replay")

	h.add("j2", "doc2")
	cl := h.claim("w", 1, time.Hour)
	cl[0].Input[2] = 'Q'
	sameJSON(t, h.get("j2").Job.Input, `{"subject":"j2","n":1}`, "Input after mutating a claim result")
}

// testRevisions runs one job through every kind of change and checks that
// each raises the channel revision and stamps the job with it.
func testRevisions(t *testing.T, h *harness) {
	last := h.rev()
	step := func(what string, j jobs.Job) {
		t.Helper()
		if j.Revision <= last {
			t.Errorf("%s: Revision %d not above the previous %d", what, j.Revision, last)
		}
		if now := h.rev(); now != j.Revision {
			t.Errorf("%s: channel revision %d, want the changed job's %d", what, now, j.Revision)
		}
		last = j.Revision
	}
	j := h.add("j1", "doc")
	step("enqueue", j)
	h.clock.Advance(time.Second)
	j = h.claimOne("w", "j1", time.Minute)
	step("claim", j)
	j, err := h.store.Renew(h.ctx, jobs.RenewRequest{Claim: jobs.ClaimOf(j), ExpectedRevision: j.Revision, TTL: 2 * time.Minute})
	noErr(t, err, "renew")
	step("renew", j)
	j, err = h.store.AppendProgress(h.ctx, jobs.ProgressRequest{Claim: jobs.ClaimOf(j), Stage: "s", Label: "l", State: jobs.ProgressStarted})
	noErr(t, err, "progress")
	step("progress", j)
	j, err = h.store.Requeue(h.ctx, jobs.RequeueRequest{Claim: jobs.ClaimOf(j)})
	noErr(t, err, "requeue")
	step("requeue", j)
	j, err = h.store.Pause(h.ctx, jobs.PauseRequest{ChannelID: h.ch, JobID: "j1", ExpectedRevision: j.Revision})
	noErr(t, err, "pause")
	step("pause", j)
	j, err = h.store.Resume(h.ctx, jobs.ResumeRequest{ChannelID: h.ch, JobID: "j1", ExpectedRevision: j.Revision})
	noErr(t, err, "resume")
	step("resume", j)
	j = h.claimOne("w", "j1", time.Minute)
	step("claim again", j)
	d, err := h.store.Settle(h.ctx, jobs.SettleRequest{Claim: jobs.ClaimOf(j)})
	noErr(t, err, "settle")
	step("settle", d.Job)
	j = h.add("j2", "doc")
	step("enqueue j2", j)
	j, err = h.store.Supersede(h.ctx, jobs.SupersedeRequest{ChannelID: h.ch, JobID: "j2", ExpectedRevision: j.Revision})
	noErr(t, err, "supersede")
	step("supersede", j)
	j = h.add("j3", "doc")
	step("enqueue j3", j)
	j, err = h.store.Cancel(h.ctx, jobs.CancelRequest{ChannelID: h.ch, JobID: "j3"})
	noErr(t, err, "cancel")
	step("cancel", j)
	j = h.add("j4", "doc")
	step("enqueue j4", j)
	j, err = h.store.Fail(h.ctx, jobs.FailRequest{Claim: jobs.ClaimOf(h.claimOne("w", "j4", time.Minute))})
	noErr(t, err, "fail")
	step("fail", j)
	// Another channel's changes do not move this one.
	rev := h.rev()
	h.ch = "chan-b"
	h.add("b1", "doc")
	h.ch = "chan-a"
	h.unchanged(rev, "a change in another channel")
}

var errGuard = errors.New("writer lease lost")

func testGuard(t *testing.T, h *harness) {
	h.add("j1", "doc")
	c := h.claimOne("w", "j1", time.Hour)
	h.add("j2", "doc2")
	j2 := h.get("j2").Job
	h.guard.fail(errGuard)
	rev := h.rev()
	claim := jobs.ClaimOf(c)
	writes := map[string]func() error{
		"Enqueue": func() error { _, err := h.store.Enqueue(h.ctx, h.req("j3", "doc3")); return err },
		"Claim": func() error {
			_, err := h.store.Claim(h.ctx, jobs.ClaimRequest{Owner: "w", Count: 1, TTL: time.Minute})
			return err
		},
		"Renew": func() error {
			_, err := h.store.Renew(h.ctx, jobs.RenewRequest{Claim: claim, ExpectedRevision: c.Revision, TTL: 2 * time.Hour})
			return err
		},
		"Requeue": func() error { _, err := h.store.Requeue(h.ctx, jobs.RequeueRequest{Claim: claim}); return err },
		"AppendProgress": func() error {
			_, err := h.store.AppendProgress(h.ctx, jobs.ProgressRequest{Claim: claim, Stage: "s", Label: "l", State: jobs.ProgressStarted})
			return err
		},
		"Settle": func() error { _, err := h.store.Settle(h.ctx, jobs.SettleRequest{Claim: claim}); return err },
		"Fail":   func() error { _, err := h.store.Fail(h.ctx, jobs.FailRequest{Claim: claim}); return err },
		"Pause": func() error {
			_, err := h.store.Pause(h.ctx, jobs.PauseRequest{ChannelID: h.ch, JobID: "j2", ExpectedRevision: j2.Revision})
			return err
		},
		"Resume": func() error {
			_, err := h.store.Resume(h.ctx, jobs.ResumeRequest{ChannelID: h.ch, JobID: "j2", ExpectedRevision: j2.Revision})
			return err
		},
		"Cancel": func() error {
			_, err := h.store.Cancel(h.ctx, jobs.CancelRequest{ChannelID: h.ch, JobID: "j2"})
			return err
		},
		"Supersede": func() error {
			_, err := h.store.Supersede(h.ctx, jobs.SupersedeRequest{ChannelID: h.ch, JobID: "j2", ExpectedRevision: j2.Revision})
			return err
		},
		"DeleteChannel": func() error { return h.store.DeleteChannel(h.ctx, h.ch) },
	}
	for _, name := range sortedKeys(writes) {
		err := writes[name]()
		wantErr(t, err, jobs.ErrConflict, name+" with a failing guard", errGuard.Error())
		if err != nil && !errors.Is(err, errGuard) {
			t.Errorf("%s: error %q does not wrap the guard's error", name, err)
		}
		h.unchanged(rev, name+" with a failing guard")
	}
	// Reads are not guarded.
	equal(t, h.get("j1").Job, c, "Get with a failing guard")
	h.guard.fail(nil)
	_, err := h.store.Settle(h.ctx, jobs.SettleRequest{Claim: claim})
	noErr(t, err, "settle once the guard passes")
}

func testRegistryErrors(t *testing.T, h *harness) {
	h.add("j1", "doc")
	before := h.rev()
	h.reg.fail(errors.New("registry down"))
	defer h.reg.fail(nil)
	_, err := h.store.Enqueue(h.ctx, h.req("j2", "doc2"))
	wantErr(t, err, jobs.ErrUnavailable, "enqueue with the registry down", "registry down")
	_, err = h.store.List(h.ctx, jobs.ListRequest{ChannelID: h.ch, Limit: 1})
	wantErr(t, err, jobs.ErrUnavailable, "list with the registry down")
	_, err = h.store.Get(h.ctx, h.ch, "j1")
	wantErr(t, err, jobs.ErrUnavailable, "get with the registry down")
	_, err = h.store.Cancel(h.ctx, jobs.CancelRequest{ChannelID: h.ch, JobID: "j1"})
	wantErr(t, err, jobs.ErrUnavailable, "cancel with the registry down")
	h.reg.fail(nil)
	equal(t, h.get("j1").Job.State, jobs.StatePending, "j1 after the registry failures")
	_, err = h.store.Get(h.ctx, h.ch, "j2")
	wantErr(t, err, jobs.ErrNotFound, "j2 after a failed enqueue")
	h.unchanged(before, "registry failures")
}

func testCancelledContext(t *testing.T, h *harness) {
	h.add("j1", "doc")
	rev := h.rev()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := h.store.Enqueue(ctx, h.req("j2", "doc2"))
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Enqueue with a cancelled context: %v, want context.Canceled", err)
	}
	_, err = h.store.Claim(ctx, jobs.ClaimRequest{Owner: "w", Count: 1, TTL: time.Minute})
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Claim with a cancelled context: %v, want context.Canceled", err)
	}
	_, err = h.store.List(ctx, jobs.ListRequest{ChannelID: h.ch})
	if !errors.Is(err, context.Canceled) {
		t.Errorf("List with a cancelled context: %v, want context.Canceled", err)
	}
	h.unchanged(rev, "calls with a cancelled context")
}

// testZeroRequests sends every call its zero request: each is refused
// without a panic, and nothing is written.
func testZeroRequests(t *testing.T, h *harness) {
	h.add("j1", "doc")
	rev := h.rev()
	ctx := h.ctx
	errs := map[string]error{}
	_, errs["Enqueue"] = h.store.Enqueue(ctx, jobs.EnqueueRequest{})
	_, errs["Claim"] = h.store.Claim(ctx, jobs.ClaimRequest{})
	_, errs["Renew"] = h.store.Renew(ctx, jobs.RenewRequest{})
	_, errs["Requeue"] = h.store.Requeue(ctx, jobs.RequeueRequest{})
	_, errs["AppendProgress"] = h.store.AppendProgress(ctx, jobs.ProgressRequest{})
	_, errs["Settle"] = h.store.Settle(ctx, jobs.SettleRequest{})
	_, errs["Fail"] = h.store.Fail(ctx, jobs.FailRequest{})
	_, errs["Pause"] = h.store.Pause(ctx, jobs.PauseRequest{})
	_, errs["Resume"] = h.store.Resume(ctx, jobs.ResumeRequest{})
	_, errs["Cancel"] = h.store.Cancel(ctx, jobs.CancelRequest{})
	_, errs["Supersede"] = h.store.Supersede(ctx, jobs.SupersedeRequest{})
	_, errs["Get"] = h.store.Get(ctx, "", "")
	for _, name := range sortedKeys(errs) {
		err := errs[name]
		if !errors.Is(err, jobs.ErrConflict) && !errors.Is(err, jobs.ErrNotFound) {
			t.Errorf("%s with a zero request: %v, want a conflict or not found", name, err)
		}
	}
	// A zero ListRequest lists every channel (see ListEveryChannel).
	p, err := h.store.List(ctx, jobs.ListRequest{})
	noErr(t, err, "List with a zero request")
	equal(t, summaryIDs(p.Jobs), []string{"j1"}, "List with a zero request: every channel's jobs")
	h.unchanged(rev, "zero requests")
}
