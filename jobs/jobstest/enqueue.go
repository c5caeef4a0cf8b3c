package jobstest

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/jobkeys/jobkeys/jobs"
)

func init() {
	register("EnqueueNew", testEnqueueNew)
	register("EnqueueReplay", testEnqueueReplay)
	register("EnqueueFingerprintConflict", testEnqueueFingerprintConflict)
	register("EnqueueBadInput", testEnqueueBadInput)
	register("EnqueueIDsPerChannel", testEnqueueIDsPerChannel)
	register("EnqueueSupersedesOlderGenerations", testEnqueueSupersedes)
}

func testEnqueueNew(t *testing.T, h *harness) {
	before := h.rev()
	req := h.req("j1", "doc-1")
	req.Input = json.RawMessage(" {\"subject\" : \"j1\",\n \"n\": [1, 2]} ")
	j := h.enqueue(req)
	equal(t, j.ID, "j1", "ID")
	equal(t, j.ChannelID, h.ch, "ChannelID")
	equal(t, j.Type, "render", "Type")
	equal(t, j.Version, 1, "Version")
	equal(t, j.Origin, "user", "Origin")
	equal(t, j.TargetKey, "doc-1", "TargetKey")
	equal(t, j.TargetGeneration, uint64(1), "TargetGeneration")
	equal(t, j.IdempotencyKey, "idem-j1", "IdempotencyKey")
	equal(t, j.Fingerprint, "fp-j1", "Fingerprint")
	sameJSON(t, j.Input, `{"subject":"j1","n":[1,2]}`, "Input")
	equal(t, j.State, jobs.StatePending, "State")
	equal(t, j.Attempts, 0, "Attempts")
	equal(t, j.Failures, 0, "Failures")
	equal(t, j.ClaimGeneration, uint64(0), "ClaimGeneration")
	equal(t, j.ClaimOwner, "", "ClaimOwner")
	equal(t, len(j.ClaimBinding), 0, "len(ClaimBinding)")
	equal(t, j.ClaimExpiresAt.IsZero(), true, "ClaimExpiresAt zero")
	equal(t, j.Reason, "", "Reason")
	equal(t, len(j.Progress), 0, "len(Progress)")
	sameTime(t, j.AvailableAt, start, "AvailableAt (zero in the request: now)")
	sameTime(t, j.CreatedAt, start, "CreatedAt")
	sameTime(t, j.UpdatedAt, start, "UpdatedAt")
	if j.Revision <= before {
		t.Errorf("Revision %d not above the channel's %d before", j.Revision, before)
	}
	d := h.get("j1")
	equal(t, d.Job, j, "Get(j1).Job")
	equal(t, d.Revision, j.Revision, "Detail.Revision after one change")
	equal(t, d.Target, jobs.Target{ChannelID: h.ch, TargetKey: "doc-1", Generation: 1}, "Detail.Target")
	if d.Artifact != nil {
		t.Errorf("Artifact %+v on a pending job", d.Artifact)
	}

	later := h.req("j2", "doc-2")
	later.AvailableAt = start.Add(time.Hour)
	j2 := h.enqueue(later)
	sameTime(t, j2.AvailableAt, start.Add(time.Hour), "AvailableAt given")
	if j2.Revision <= j.Revision {
		t.Errorf("second enqueue Revision %d not above the first's %d", j2.Revision, j.Revision)
	}

	none := h.req("j3", "doc-3")
	none.Input = nil
	j3 := h.enqueue(none)
	sameJSON(t, j3.Input, "", "nil Input")
}

func testEnqueueReplay(t *testing.T, h *harness) {
	first := h.add("j1", "doc")
	rev := h.rev()

	// The same key and fingerprint replays, whatever else differs.
	again := h.req("j1", "doc")
	again.ID, again.Type, again.TargetKey, again.Input = "other", "other-type", "other-doc", json.RawMessage(`[1]`)
	out, err := h.store.Enqueue(h.ctx, again)
	noErr(t, err, "replay")
	equal(t, out.Repeated, true, "Repeated")
	equal(t, out.Job, first, "replayed job")
	h.unchanged(rev, "replay")
	if _, err := h.store.Get(h.ctx, h.ch, "other"); err == nil {
		t.Errorf("replay created job %q", "other")
	}

	// A replay returns the job as it is now.
	claimed := h.claimOne("w1", "j1", time.Minute)
	rev = h.rev()
	out, err = h.store.Enqueue(h.ctx, h.req("j1", "doc"))
	noErr(t, err, "replay after claim")
	equal(t, out.Repeated, true, "Repeated after claim")
	equal(t, out.Job, claimed, "replay after claim returns the claimed job")
	h.unchanged(rev, "replay after claim")

	// Even an empty ID replays (the replay comes before the field checks).
	empty := h.req("j1", "doc")
	empty.ID = ""
	out, err = h.store.Enqueue(h.ctx, empty)
	noErr(t, err, "replay with empty ID")
	equal(t, out.Repeated, true, "Repeated with empty ID")
	equal(t, out.Job.ID, "j1", "replay with empty ID returns j1")
}

func testEnqueueFingerprintConflict(t *testing.T, h *harness) {
	h.add("j1", "doc")
	rev := h.rev()
	other := h.req("j2", "doc")
	other.IdempotencyKey = "idem-j1"
	_, err := h.store.Enqueue(h.ctx, other)
	wantErr(t, err, jobs.ErrConflict, "reused idempotency key", "Fingerprint", "idem-j1")
	h.unchanged(rev, "fingerprint conflict")
	equal(t, h.get("j1").Job.State, jobs.StatePending, "j1 state after the conflict")

	// The key is per channel: the same key in another channel is new.
	other.ChannelID = "chan-b"
	out, err := h.store.Enqueue(h.ctx, other)
	noErr(t, err, "same idempotency key in another channel")
	equal(t, out.Repeated, false, "Repeated in another channel")
}

func testEnqueueBadInput(t *testing.T, h *harness) {
	h.add("taken", "doc")
	long := strings.Repeat("x", jobs.IdentifierSizeLimit+1)
	cases := []struct {
		name  string
		edit  func(r *jobs.EnqueueRequest)
		kind  error
		words []string
	}{
		{"empty ID", func(r *jobs.EnqueueRequest) { r.ID = "" }, jobs.ErrConflict, []string{"ID"}},
		{"empty Type", func(r *jobs.EnqueueRequest) { r.Type = "" }, jobs.ErrConflict, []string{"Type"}},
		{"empty TargetKey", func(r *jobs.EnqueueRequest) { r.TargetKey = "" }, jobs.ErrConflict, []string{"TargetKey"}},
		{"empty IdempotencyKey", func(r *jobs.EnqueueRequest) { r.IdempotencyKey = "" }, jobs.ErrConflict, []string{"IdempotencyKey"}},
		{"empty Fingerprint", func(r *jobs.EnqueueRequest) { r.Fingerprint = "" }, jobs.ErrConflict, []string{"Fingerprint"}},
		{"Version 0", func(r *jobs.EnqueueRequest) { r.Version = 0 }, jobs.ErrConflict, []string{"Version"}},
		{"negative Version", func(r *jobs.EnqueueRequest) { r.Version = -3 }, jobs.ErrConflict, []string{"Version"}},
		{"ID taken", func(r *jobs.EnqueueRequest) { r.ID = "taken" }, jobs.ErrConflict, []string{"ID", "taken"}},
		{"Input not JSON", func(r *jobs.EnqueueRequest) { r.Input = json.RawMessage(`{"a":`) }, jobs.ErrConflict, []string{"Input"}},
		{"Input oversize", func(r *jobs.EnqueueRequest) {
			r.Input = json.RawMessage(`"` + strings.Repeat("a", jobs.InputSizeLimit) + `"`)
		}, jobs.ErrConflict, []string{"Input", itoa(jobs.InputSizeLimit)}},
		{"ID oversize", func(r *jobs.EnqueueRequest) { r.ID = long }, jobs.ErrConflict, []string{"ID", itoa(jobs.IdentifierSizeLimit)}},
		{"TargetKey oversize", func(r *jobs.EnqueueRequest) { r.TargetKey = long }, jobs.ErrConflict, []string{"TargetKey", itoa(jobs.IdentifierSizeLimit)}},
		{"IdempotencyKey oversize", func(r *jobs.EnqueueRequest) { r.IdempotencyKey = long }, jobs.ErrConflict, []string{"IdempotencyKey", itoa(jobs.IdentifierSizeLimit)}},
		{"Type not UTF-8", func(r *jobs.EnqueueRequest) { r.Type = "a\xffb" }, jobs.ErrConflict, []string{"Type", "UTF-8"}},
		{"AvailableAt beyond year 9999", func(r *jobs.EnqueueRequest) {
			r.AvailableAt = time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)
		}, jobs.ErrConflict, []string{"AvailableAt"}},
		{"missing channel", func(r *jobs.EnqueueRequest) { r.ChannelID = "missing-1" }, jobs.ErrNotFound, []string{"missing-1"}},
		{"empty ChannelID", func(r *jobs.EnqueueRequest) { r.ChannelID = "" }, jobs.ErrNotFound, []string{"ChannelID"}},
	}
	for _, tc := range cases {
		rev := h.rev()
		r := h.req("new", "doc")
		tc.edit(&r)
		_, err := h.store.Enqueue(h.ctx, r)
		wantErr(t, err, tc.kind, tc.name, tc.words...)
		h.unchanged(rev, tc.name)
		if _, err := h.store.Get(h.ctx, h.ch, "new"); err == nil {
			t.Errorf("%s: job %q exists after a refused enqueue", tc.name, "new")
		}
	}
	// The largest input that fits is accepted.
	r := h.req("big", "doc-big")
	r.Input = json.RawMessage(`"` + strings.Repeat("a", jobs.InputSizeLimit-2) + `"`)
	h.enqueue(r)
}

func testEnqueueIDsPerChannel(t *testing.T, h *harness) {
	a := h.add("j1", "doc")
	r := h.req("j1", "doc")
	r.ChannelID = "chan-b"
	r.IdempotencyKey = "other-key"
	out, err := h.store.Enqueue(h.ctx, r)
	noErr(t, err, "same id in another channel")
	equal(t, out.Job.ChannelID, "chan-b", "ChannelID")
	equal(t, out.Job.TargetGeneration, uint64(1), "targets are per channel")
	equal(t, h.get("j1").Job, a, "the first channel's job")
	d, err := h.store.Get(h.ctx, "chan-b", "j1")
	noErr(t, err, "Get chan-b/j1")
	equal(t, d.Job, out.Job, "the second channel's job")
}

func testEnqueueSupersedes(t *testing.T, h *harness) {
	// doc: j1 completed, j2 running, j3 paused, j4 pending; other: o1.
	h.add("j1", "doc")
	c1 := h.claimOne("w", "j1", time.Minute)
	_, err := h.store.Settle(h.ctx, jobs.SettleRequest{Claim: jobs.ClaimOf(c1), Artifact: json.RawMessage(`1`)})
	noErr(t, err, "settle j1")
	// Enqueuing j2 superseded nothing active; j3 supersedes j2, and so on:
	// build the mix by pausing and claiming the newest each time.
	out2, err := h.store.Enqueue(h.ctx, h.req("j2", "doc"))
	noErr(t, err, "enqueue j2")
	j2 := out2.Job
	equal(t, j2.TargetGeneration, uint64(2), "j2 generation")
	equal(t, len(out2.Superseded), 0, "len(Enqueued.Superseded) of j2: completed j1 is not active")
	c2 := h.claimOne("w", "j2", time.Minute)
	o1 := h.add("o1", "other")
	h.clock.Advance(time.Second)
	rev := h.rev()
	out3, err := h.store.Enqueue(h.ctx, h.req("j3", "doc"))
	noErr(t, err, "enqueue j3")
	j3 := out3.Job
	equal(t, j3.TargetGeneration, uint64(3), "j3 generation")

	d2 := h.get("j2")
	equal(t, out3.Superseded, []jobs.Job{d2.Job}, "Enqueued.Superseded of j3: running j2, as stored")
	equal(t, d2.Job.State, jobs.StateSuperseded, "running j2 after j3")
	equal(t, d2.Job.ClaimOwner, "", "superseded j2 ClaimOwner")
	equal(t, d2.Job.ClaimExpiresAt.IsZero(), true, "superseded j2 ClaimExpiresAt zero")
	equal(t, d2.Job.Revision, j3.Revision, "superseded in the same change as the enqueue (same revision)")
	equal(t, d2.Job.ClaimGeneration, c2.ClaimGeneration, "ClaimGeneration kept")
	sameTime(t, d2.Job.UpdatedAt, h.clock.Now(), "superseded UpdatedAt")
	equal(t, d2.Target.Generation, uint64(3), "target generation seen from j2")
	if j3.Revision <= rev {
		t.Errorf("j3 Revision %d not above %d", j3.Revision, rev)
	}
	equal(t, h.get("j1").Job.State, jobs.StateCompleted, "completed j1 stays completed")
	equal(t, h.get("o1").Job, o1, "another target's job is untouched")

	// The superseded claim is fenced.
	_, err = h.store.Renew(h.ctx, jobs.RenewRequest{Claim: jobs.ClaimOf(c2), ExpectedRevision: d2.Job.Revision, TTL: time.Hour})
	wantErr(t, err, jobs.ErrConflict, "renew a superseded claim")

	// A paused and a pending job of the target are superseded too.
	j3p, err := h.store.Pause(h.ctx, jobs.PauseRequest{ChannelID: h.ch, JobID: "j3", ExpectedRevision: j3.Revision, Reason: "hold"})
	noErr(t, err, "pause j3")
	equal(t, j3p.State, jobs.StatePaused, "j3 paused")
	out4, err := h.store.Enqueue(h.ctx, h.req("j4", "doc"))
	noErr(t, err, "enqueue j4")
	equal(t, out4.Superseded, []jobs.Job{h.get("j3").Job}, "Enqueued.Superseded of j4: paused j3, as stored")
	out5, err := h.store.Enqueue(h.ctx, h.req("j5", "doc"))
	noErr(t, err, "enqueue j5")
	j5 := out5.Job
	equal(t, len(out5.Superseded), 1, "len(Enqueued.Superseded) of j5: pending j4")
	out5r, err := h.store.Enqueue(h.ctx, h.req("j5", "doc"))
	noErr(t, err, "replay j5")
	equal(t, len(out5r.Superseded), 0, "len(Enqueued.Superseded) of a replay")
	equal(t, j5.TargetGeneration, uint64(5), "j5 generation")
	equal(t, h.get("j3").Job.State, jobs.StateSuperseded, "paused j3 after j4")
	equal(t, h.get("j3").Job.Reason, "", "superseded j3 Reason cleared")
	equal(t, h.get("j4").Job.State, jobs.StateSuperseded, "pending j4 after j5")
	equal(t, h.get("j5").Job.State, jobs.StatePending, "j5 pending")

	// Only the newest generation is claimable.
	got := h.claim("w", 10, time.Minute)
	equal(t, ids(got), []string{"o1", "j5"}, "claimable after supersedes")
}

func itoa(n int) string {
	b, _ := json.Marshal(n)
	return string(b)
}
