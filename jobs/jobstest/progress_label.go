package jobstest

import (
	"strings"
	"testing"
	"time"

	"github.com/jobkeys/jobkeys/jobs"
)

func init() {
	register("ProgressLabelAsTheSeed", testProgressLabelAsTheSeed)
	register("ProgressFindsTheJobFirst", testProgressFindsTheJobFirst)
}

// testProgressLabelAsTheSeed appends labels whose outcome depends on how
// they are trimmed and counted: the seed trims with JavaScript's trim and
// counts UTF-16 code units (String length), 1 to 160 after trimming. Each
// case's outcome is the seed's.
func testProgressLabelAsTheSeed(t *testing.T, h *harness) {
	h.add("j1", "doc")
	c := jobs.ClaimOf(h.claimOne("w1", "j1", time.Hour))
	cases := []struct {
		name, label string
		want        string // the stored label; "" when the seed refuses it
	}{
		{"U+FEFF is trimmed", "\uFEFFsyncing\uFEFF", "syncing"},
		{"U+0085 is not trimmed", "\u0085syncing", "\u0085syncing"},
		{"U+FEFF alone is empty", " \uFEFF ", ""},
		{"80 emoji: 160 code units", strings.Repeat("🙂", 80), strings.Repeat("🙂", 80)},
		{"81 emoji: 162 code units", strings.Repeat("🙂", 81), ""},
	}
	for _, tc := range cases {
		rev := h.rev()
		p, err := h.store.AppendProgress(h.ctx, jobs.ProgressRequest{Claim: c, Stage: "s", Label: tc.label, State: jobs.ProgressStarted})
		if tc.want == "" {
			wantErr(t, err, jobs.ErrConflict, tc.name, "Label")
			h.unchanged(rev, tc.name)
			continue
		}
		noErr(t, err, tc.name)
		equal(t, p.Progress[len(p.Progress)-1].Label, tc.want, tc.name+": stored label")
		equal(t, h.get("j1").Job.Progress[len(p.Progress)-1].Label, tc.want, tc.name+": label read back")
	}
}

// testProgressFindsTheJobFirst sends progress entries the seed refuses
// (bad stage, blank or long label, unknown state, missing reason) for jobs
// it refuses first: the seed finds the job and fences its claim before it
// looks at the entry, so a missing job is ErrNotFound and a lost claim or a
// clock before UpdatedAt is the claim's conflict, not the entry's.
func testProgressFindsTheJobFirst(t *testing.T, h *harness) {
	h.add("j1", "doc")
	c := h.claimOne("w1", "j1", time.Hour)
	bad := []jobs.ProgressRequest{
		{Stage: "Bad", Label: "l", State: jobs.ProgressStarted},
		{Stage: "s", Label: " \t ", State: jobs.ProgressStarted},
		{Stage: "s", Label: strings.Repeat("🙂", 81), State: jobs.ProgressStarted},
		{Stage: "s", Label: "l", State: "done"},
		{Stage: "s", Label: "l", State: jobs.ProgressInterrupted},
	}
	for _, r := range bad {
		rev := h.rev()
		missing := jobs.ClaimOf(c)
		missing.JobID = "nope"
		r.Claim = missing
		_, err := h.store.AppendProgress(h.ctx, r)
		wantErr(t, err, jobs.ErrNotFound, "progress of a missing job, "+r.Stage+"/"+r.Label+"/"+string(r.State), "nope")
		h.unchanged(rev, "progress of a missing job")

		stale := jobs.ClaimOf(c)
		stale.Generation++
		r.Claim = stale
		_, err = h.store.AppendProgress(h.ctx, r)
		wantErr(t, err, jobs.ErrConflict, "progress with a lost claim", "claim is no longer active")

		h.clock.Set(c.UpdatedAt.Add(-time.Second))
		r.Claim = jobs.ClaimOf(c)
		_, err = h.store.AppendProgress(h.ctx, r)
		wantErr(t, err, jobs.ErrConflict, "progress with the clock before UpdatedAt", "UpdatedAt")
		h.clock.Set(c.UpdatedAt)
		h.unchanged(rev, "refused progress")
	}
}
