package jobstest

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jobkeys/jobkeys/jobs"
)

func init() {
	register("ControlStates", testControlStates)
	register("ControlExpectedRevision", testControlExpectedRevision)
	register("ControlEffects", testControlEffects)
	register("ControlMissingAndStale", testControlMissingAndStale)
	register("CancelArchivedChannel", testCancelArchived)
}

// control is one control call on a job, with the revision to expect.
type control struct {
	name string
	call func(h *harness, id string, rev uint64) (jobs.Job, error)
}

var controls = []control{
	{"Pause", func(h *harness, id string, rev uint64) (jobs.Job, error) {
		return h.store.Pause(h.ctx, jobs.PauseRequest{ChannelID: h.ch, JobID: id, ExpectedRevision: rev, Reason: "operator"})
	}},
	{"Resume", func(h *harness, id string, rev uint64) (jobs.Job, error) {
		return h.store.Resume(h.ctx, jobs.ResumeRequest{ChannelID: h.ch, JobID: id, ExpectedRevision: rev})
	}},
	{"Cancel", func(h *harness, id string, _ uint64) (jobs.Job, error) {
		return h.store.Cancel(h.ctx, jobs.CancelRequest{ChannelID: h.ch, JobID: id})
	}},
	{"Supersede", func(h *harness, id string, rev uint64) (jobs.Job, error) {
		return h.store.Supersede(h.ctx, jobs.SupersedeRequest{ChannelID: h.ch, JobID: id, ExpectedRevision: rev, Reason: "replaced"})
	}},
}

// inState puts a new job id into state s and returns it.
func (h *harness) inState(id string, s jobs.State) jobs.Job {
	h.t.Helper()
	h.add(id, "t-"+id)
	j := h.get(id).Job
	var err error
	switch s {
	case jobs.StatePending:
		return j
	case jobs.StatePaused:
		j, err = h.store.Pause(h.ctx, jobs.PauseRequest{ChannelID: h.ch, JobID: id, ExpectedRevision: j.Revision})
	case jobs.StateRunning:
		return h.claimOne("w", id, time.Hour)
	case jobs.StateCompleted:
		var d jobs.Detail
		d, err = h.store.Settle(h.ctx, jobs.SettleRequest{Claim: jobs.ClaimOf(h.claimOne("w", id, time.Hour))})
		j = d.Job
	case jobs.StateFailed:
		j, err = h.store.Fail(h.ctx, jobs.FailRequest{Claim: jobs.ClaimOf(h.claimOne("w", id, time.Hour))})
	case jobs.StateCancelled:
		j, err = h.store.Cancel(h.ctx, jobs.CancelRequest{ChannelID: h.ch, JobID: id})
	case jobs.StateSuperseded:
		j, err = h.store.Supersede(h.ctx, jobs.SupersedeRequest{ChannelID: h.ch, JobID: id, ExpectedRevision: j.Revision})
	}
	if err != nil {
		h.t.Fatalf("put %s into %s: %v", id, s, err)
	}
	if j.State != s {
		h.t.Fatalf("put %s into %s: got %s", id, s, j.State)
	}
	return j
}

var allStates = []jobs.State{jobs.StatePending, jobs.StatePaused, jobs.StateRunning, jobs.StateCompleted, jobs.StateFailed, jobs.StateCancelled, jobs.StateSuperseded}

func testControlStates(t *testing.T, h *harness) {
	// Which state each control call accepts, and the state it leads to.
	allowed := map[string]map[jobs.State]jobs.State{
		"Pause":     {jobs.StatePending: jobs.StatePaused, jobs.StateRunning: jobs.StatePaused},
		"Resume":    {jobs.StatePaused: jobs.StatePending},
		"Cancel":    {jobs.StatePending: jobs.StateCancelled, jobs.StatePaused: jobs.StateCancelled, jobs.StateRunning: jobs.StateCancelled},
		"Supersede": {jobs.StatePending: jobs.StateSuperseded, jobs.StatePaused: jobs.StateSuperseded, jobs.StateRunning: jobs.StateSuperseded},
	}
	n := 0
	for _, c := range controls {
		for _, from := range allStates {
			n++
			h.ch = fmt.Sprintf("ctl-%02d", n) // nothing claimable left from other cases
			id := fmt.Sprintf("j-%s-%s", strings.ToLower(c.name), from)
			j := h.inState(id, from)
			rev := h.rev()
			got, err := c.call(h, id, j.Revision)
			what := fmt.Sprintf("%s from %s", c.name, from)
			to, ok := allowed[c.name][from]
			if !ok {
				wantErr(t, err, jobs.ErrConflict, what, string(from))
				h.unchanged(rev, what)
				equal(t, h.get(id).Job, j, what+": job after the refusal")
				continue
			}
			if err != nil {
				t.Errorf("%s: %v", what, err)
				continue
			}
			equal(t, got.State, to, what+": State")
			if got.Revision <= rev {
				t.Errorf("%s: Revision %d not above the channel's %d", what, got.Revision, rev)
			}
			equal(t, got.ClaimOwner, "", what+": ClaimOwner cleared")
			equal(t, got.ClaimExpiresAt.IsZero(), true, what+": ClaimExpiresAt cleared")
			equal(t, len(got.ClaimBinding), 0, what+": ClaimBinding cleared")
			equal(t, got.ClaimGeneration, j.ClaimGeneration, what+": ClaimGeneration kept")
			equal(t, h.get(id).Job, got, what+": Get")
		}
	}
}

func testControlExpectedRevision(t *testing.T, h *harness) {
	for _, c := range controls {
		id := "j-" + strings.ToLower(c.name)
		from := jobs.StatePending
		if c.name == "Resume" {
			from = jobs.StatePaused
		}
		j := h.inState(id, from)
		rev := h.rev()
		for _, stale := range []uint64{j.Revision - 1, j.Revision + 1, 0} {
			got, err := c.call(h, id, stale)
			if c.name == "Cancel" {
				// Cancel takes no expected revision: the first call works.
				noErr(t, err, "Cancel")
				equal(t, got.State, jobs.StateCancelled, "Cancel ignores revisions")
				break
			}
			wantErr(t, err, jobs.ErrConflict, fmt.Sprintf("%s with ExpectedRevision %d (job at %d)", c.name, stale, j.Revision), "ExpectedRevision")
			h.unchanged(rev, c.name+" with a stale revision")
		}
	}
}

func testControlEffects(t *testing.T, h *harness) {
	// Pause keeps AvailableAt and sets the reason; resume clears it and
	// takes the new AvailableAt, or now.
	r := h.req("j1", "doc")
	r.AvailableAt = start.Add(time.Minute)
	j := h.enqueue(r)
	h.clock.Advance(time.Second)
	p, err := h.store.Pause(h.ctx, jobs.PauseRequest{ChannelID: h.ch, JobID: "j1", ExpectedRevision: j.Revision, Reason: "maintenance"})
	noErr(t, err, "pause")
	equal(t, p.Reason, "maintenance", "pause Reason")
	sameTime(t, p.AvailableAt, start.Add(time.Minute), "pause keeps AvailableAt")
	sameTime(t, p.UpdatedAt, h.clock.Now(), "pause UpdatedAt")
	h.clock.Set(start.Add(2 * time.Minute))
	equal(t, len(h.claim("w", 1, time.Minute)), 0, "claim a paused job")
	resumeAt := start.Add(time.Hour)
	res, err := h.store.Resume(h.ctx, jobs.ResumeRequest{ChannelID: h.ch, JobID: "j1", ExpectedRevision: p.Revision, AvailableAt: resumeAt})
	noErr(t, err, "resume")
	equal(t, res.State, jobs.StatePending, "resume State")
	equal(t, res.Reason, "", "resume clears Reason")
	sameTime(t, res.AvailableAt, resumeAt, "resume AvailableAt")
	equal(t, len(h.claim("w", 1, time.Minute)), 0, "claim before the resumed AvailableAt")

	// Pausing a running job fences its claim; resuming with zero
	// AvailableAt makes it due now, and the next claim is a new generation.
	h.clock.Set(resumeAt)
	c := h.claimOne("w", "j1", time.Hour)
	p2, err := h.store.Pause(h.ctx, jobs.PauseRequest{ChannelID: h.ch, JobID: "j1", ExpectedRevision: c.Revision})
	noErr(t, err, "pause running")
	_, err = h.store.Renew(h.ctx, jobs.RenewRequest{Claim: jobs.ClaimOf(c), ExpectedRevision: p2.Revision, TTL: 2 * time.Hour})
	wantErr(t, err, jobs.ErrConflict, "renew after pause")
	h.clock.Advance(time.Second)
	res2, err := h.store.Resume(h.ctx, jobs.ResumeRequest{ChannelID: h.ch, JobID: "j1", ExpectedRevision: p2.Revision})
	noErr(t, err, "resume with zero AvailableAt")
	sameTime(t, res2.AvailableAt, h.clock.Now(), "zero AvailableAt is now")
	c2 := h.claimOne("w", "j1", time.Hour)
	equal(t, c2.ClaimGeneration, c.ClaimGeneration+1, "ClaimGeneration after pause and resume")
	equal(t, c2.Attempts, 2, "Attempts after pause and resume")

	// Supersede sets the reason; cancel clears it.
	s, err := h.store.Supersede(h.ctx, jobs.SupersedeRequest{ChannelID: h.ch, JobID: "j1", ExpectedRevision: c2.Revision, Reason: "obsolete"})
	noErr(t, err, "supersede running")
	equal(t, s.Reason, "obsolete", "supersede Reason")
	_, err = h.store.Settle(h.ctx, jobs.SettleRequest{Claim: jobs.ClaimOf(c2)})
	wantErr(t, err, jobs.ErrConflict, "settle after supersede")
	h.inState("j2", jobs.StatePaused)
	cx, err := h.store.Cancel(h.ctx, jobs.CancelRequest{ChannelID: h.ch, JobID: "j2"})
	noErr(t, err, "cancel paused")
	equal(t, cx.Reason, "", "cancel clears Reason")

	long := strings.Repeat("r", jobs.ReasonSizeLimit+1)
	h.inState("j3", jobs.StatePending)
	j3 := h.get("j3").Job
	_, err = h.store.Pause(h.ctx, jobs.PauseRequest{ChannelID: h.ch, JobID: "j3", ExpectedRevision: j3.Revision, Reason: long})
	wantErr(t, err, jobs.ErrConflict, "pause with an oversize Reason", "Reason", itoa(jobs.ReasonSizeLimit))
	_, err = h.store.Supersede(h.ctx, jobs.SupersedeRequest{ChannelID: h.ch, JobID: "j3", ExpectedRevision: j3.Revision, Reason: long})
	wantErr(t, err, jobs.ErrConflict, "supersede with an oversize Reason", "Reason", itoa(jobs.ReasonSizeLimit))
	equal(t, h.get("j3").Job, j3, "j3 after refused controls")
}

func testControlMissingAndStale(t *testing.T, h *harness) {
	h.inState("j1", jobs.StatePending)
	for _, c := range controls {
		_, err := c.call(h, "nope", 1)
		wantErr(t, err, jobs.ErrNotFound, c.name+" of a missing job", "nope")
		old := h.ch
		h.ch = "chan-other"
		_, err = c.call(h, "j1", h.revOf(old))
		wantErr(t, err, jobs.ErrNotFound, c.name+" of a job of another channel")
		h.ch = old
	}
}

func testCancelArchived(t *testing.T, h *harness) {
	h.ch = "archived-1"
	// An archived channel still exists: its jobs can be enqueued in this
	// suite's registry, listed and read.
	h.add("j1", "doc")
	rev := h.rev()
	_, err := h.store.Cancel(h.ctx, jobs.CancelRequest{ChannelID: h.ch, JobID: "j1"})
	wantErr(t, err, jobs.ErrConflict, "cancel in an archived channel", "AllowArchived")
	h.unchanged(rev, "cancel in an archived channel")
	// The guard runs before every write, before the registry is asked.
	h.guard.fail(errGuard)
	_, err = h.store.Cancel(h.ctx, jobs.CancelRequest{ChannelID: h.ch, JobID: "j1"})
	wantErr(t, err, jobs.ErrConflict, "cancel in an archived channel with a failing guard", errGuard.Error())
	h.guard.fail(nil)
	calls := h.guard.count()
	got, err := h.store.Cancel(h.ctx, jobs.CancelRequest{ChannelID: h.ch, JobID: "j1", AllowArchived: true})
	noErr(t, err, "cancel with AllowArchived")
	equal(t, got.State, jobs.StateCancelled, "State with AllowArchived")
	equal(t, h.guard.count()-calls, 1, "guard calls of one cancel")
}
