package jobstest

import (
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/jobkeys/jobkeys/jobs"
)

func init() {
	register("ListPages", testListPages)
	register("ListLimitClamped", testListLimit)
	register("ListEmptyAndMissing", testListEmptyAndMissing)
	register("ListSummary", testListSummary)
	register("ListFilters", testListFilters)
	register("ListEveryChannel", testListEveryChannel)
	register("ListFiltersRefused", testListFiltersRefused)
	register("Get", testGet)
	register("DeleteChannel", testDeleteChannel)
}

func testListPages(t *testing.T, h *harness) {
	// 25 jobs over 5 creation times, 5 per time, ids not in creation order.
	var want []struct {
		at time.Time
		id string
	}
	for i := range 25 {
		if i%5 == 0 && i > 0 {
			h.clock.Advance(time.Second)
		}
		id := fmt.Sprintf("j%02d", (i*7)%25)
		h.add(id, "t-"+id)
		want = append(want, struct {
			at time.Time
			id string
		}{h.clock.Now(), id})
	}
	sort.Slice(want, func(a, b int) bool {
		if !want[a].at.Equal(want[b].at) {
			return want[a].at.After(want[b].at)
		}
		return want[a].id < want[b].id
	})
	var wantIDs []string
	for _, w := range want {
		wantIDs = append(wantIDs, w.id)
	}
	var got []string
	var after *jobs.Cursor
	pages := 0
	for {
		p, err := h.store.List(h.ctx, jobs.ListRequest{ChannelID: h.ch, Limit: 7, After: after})
		noErr(t, err, "list")
		pages++
		if pages > 10 {
			t.Fatal("list does not end")
		}
		if p.Next == nil && len(p.Jobs) == 7 && len(got)+7 < 25 {
			t.Errorf("page %d: no Next with jobs remaining", pages)
		}
		got = append(got, summaryIDs(p.Jobs)...)
		if p.Next == nil {
			break
		}
		if len(p.Jobs) != 7 {
			t.Errorf("page %d: %d jobs with a Next, want 7", pages, len(p.Jobs))
		}
		last := p.Jobs[len(p.Jobs)-1]
		equal(t, p.Next.ID, last.ID, "Next.ID is the page's last")
		sameTime(t, p.Next.CreatedAt, last.CreatedAt, "Next.CreatedAt is the page's last")
		after = p.Next
		// A job enqueued meanwhile (newer than everything) does not disturb
		// the rest of the list.
		if pages == 2 {
			h.clock.Advance(time.Minute)
			h.add("zz-newer", "t-newer")
		}
	}
	equal(t, got, wantIDs, "every job once, newest first then by id")
	equal(t, pages, 4, "pages of 7 for 25 jobs")

	// The cursor continues exactly after its position, even when a job of
	// that position is gone from the page (the cursor is a position).
	p, err := h.store.List(h.ctx, jobs.ListRequest{ChannelID: h.ch, Limit: 3, After: &jobs.Cursor{CreatedAt: want[4].at, ID: want[4].id}})
	noErr(t, err, "list after a chosen cursor")
	equal(t, summaryIDs(p.Jobs), wantIDs[5:8], "page after a chosen cursor")
	p, err = h.store.List(h.ctx, jobs.ListRequest{ChannelID: h.ch, Limit: 3, After: &jobs.Cursor{CreatedAt: want[4].at, ID: want[4].id + "-"}})
	noErr(t, err, "list after a cursor between ids")
	equal(t, summaryIDs(p.Jobs), wantIDs[5:8], "page after a cursor between ids")
	p, err = h.store.List(h.ctx, jobs.ListRequest{ChannelID: h.ch, Limit: 3, After: &jobs.Cursor{CreatedAt: start.Add(-time.Hour), ID: "a"}})
	noErr(t, err, "list after the oldest")
	equal(t, len(p.Jobs), 0, "jobs after the oldest")
	if p.Next != nil {
		t.Errorf("Next %+v on an empty page", p.Next)
	}
}

func testListLimit(t *testing.T, h *harness) {
	for i := range jobs.ListLimit + 3 {
		h.add(fmt.Sprintf("j%03d", i), fmt.Sprintf("t%03d", i))
	}
	for _, tc := range []struct{ limit, want int }{{0, 1}, {-5, 1}, {1, 1}, {50, 50}, {jobs.ListLimit, jobs.ListLimit}, {1000, jobs.ListLimit}} {
		p, err := h.store.List(h.ctx, jobs.ListRequest{ChannelID: h.ch, Limit: tc.limit})
		noErr(t, err, "list")
		equal(t, len(p.Jobs), tc.want, fmt.Sprintf("jobs for Limit %d", tc.limit))
		if p.Next == nil {
			t.Errorf("Limit %d: no Next with jobs remaining", tc.limit)
		}
	}
}

func testListEmptyAndMissing(t *testing.T, h *harness) {
	p, err := h.store.List(h.ctx, jobs.ListRequest{ChannelID: "chan-empty", Limit: 10})
	noErr(t, err, "list an existing channel without jobs")
	equal(t, p.Revision, uint64(0), "Revision of a channel without jobs")
	equal(t, len(p.Jobs), 0, "jobs of a channel without jobs")
	if p.Next != nil {
		t.Errorf("Next %+v for an empty channel", p.Next)
	}
	_, err = h.store.List(h.ctx, jobs.ListRequest{ChannelID: "missing-x", Limit: 10})
	wantErr(t, err, jobs.ErrNotFound, "list a missing channel", "missing-x")
	p, err = h.store.List(h.ctx, jobs.ListRequest{Limit: 10})
	noErr(t, err, "list every channel of a store without jobs")
	equal(t, len(p.Jobs), 0, "jobs of every channel of a store without jobs")
	equal(t, p.Revision, uint64(0), "Revision of every channel of a store without jobs")

	j := h.add("j1", "doc")
	p, err = h.store.List(h.ctx, jobs.ListRequest{ChannelID: h.ch, Limit: 10})
	noErr(t, err, "list")
	equal(t, p.Revision, j.Revision, "page Revision after one change")
	c := h.claimOne("w", "j1", time.Minute)
	p, err = h.store.List(h.ctx, jobs.ListRequest{ChannelID: h.ch, Limit: 10})
	noErr(t, err, "list")
	equal(t, p.Revision, c.Revision, "page Revision after the claim")
	equal(t, h.get("j1").Revision, c.Revision, "Detail.Revision is the channel revision")
}

func testListSummary(t *testing.T, h *harness) {
	r := h.req("j1", "doc")
	r.Input = json.RawMessage(`{"subject":"Quarterly report","secret":"x"}`)
	h.enqueue(r)
	r2 := h.req("j2", "doc2")
	r2.Input = json.RawMessage(`[1,2]`)
	h.enqueue(r2)
	c := h.claimOne("w", "j1", time.Minute)
	c, err := h.store.AppendProgress(h.ctx, jobs.ProgressRequest{Claim: jobs.ClaimOf(c), Stage: "render", Label: "Rendering", State: jobs.ProgressStarted})
	noErr(t, err, "progress")
	p, err := h.store.List(h.ctx, jobs.ListRequest{ChannelID: h.ch, Limit: 10})
	noErr(t, err, "list")
	byID := map[string]jobs.Summary{}
	for _, s := range p.Jobs {
		byID[s.ID] = s
	}
	s := byID["j1"]
	equal(t, s.Subject, "render: Quarterly report", "Subject from Config.Subject")
	equal(t, byID["j2"].Subject, "", "Subject for an input without one")
	want := jobs.Summary{
		ID: c.ID, ChannelID: c.ChannelID, Type: c.Type, Version: c.Version, Origin: c.Origin,
		TargetKey: c.TargetKey, TargetGeneration: c.TargetGeneration, State: c.State, Revision: c.Revision,
		Attempts: c.Attempts, Failures: c.Failures, ClaimGeneration: c.ClaimGeneration, ClaimOwner: c.ClaimOwner,
		ClaimExpiresAt: c.ClaimExpiresAt, AvailableAt: c.AvailableAt, Reason: c.Reason, Progress: c.Progress,
		CreatedAt: c.CreatedAt, UpdatedAt: c.UpdatedAt, Subject: "render: Quarterly report",
	}
	equal(t, s, want, "summary of j1")
}

func testGet(t *testing.T, h *harness) {
	h.add("j1", "doc")
	h.add("j2", "doc")
	d := h.get("j1")
	equal(t, d.Job.State, jobs.StateSuperseded, "j1 after j2")
	equal(t, d.Target, jobs.Target{ChannelID: h.ch, TargetKey: "doc", Generation: 2}, "j1's target is at j2's generation")
	equal(t, d.Revision, h.rev(), "Detail.Revision is the channel revision")
	_, err := h.store.Get(h.ctx, h.ch, "nope")
	wantErr(t, err, jobs.ErrNotFound, "get a missing job", "nope")
	_, err = h.store.Get(h.ctx, "chan-b", "j1")
	wantErr(t, err, jobs.ErrNotFound, "get a job of another channel", "j1")
	_, err = h.store.Get(h.ctx, "missing-1", "j1")
	wantErr(t, err, jobs.ErrNotFound, "get in a missing channel", "missing-1")
	_, err = h.store.Get(h.ctx, "", "j1")
	wantErr(t, err, jobs.ErrNotFound, "get with an empty channel")
	_, err = h.store.Get(h.ctx, h.ch, "")
	wantErr(t, err, jobs.ErrNotFound, "get with an empty job id")
}

func testDeleteChannel(t *testing.T, h *harness) {
	h.add("j1", "doc")
	c := h.claimOne("w", "j1", time.Minute)
	_, err := h.store.Settle(h.ctx, jobs.SettleRequest{Claim: jobs.ClaimOf(c), Artifact: json.RawMessage(`1`)})
	noErr(t, err, "settle")
	h.add("j2", "doc")
	h.add("j3", "other")
	// Another channel with the same ids is untouched.
	h.ch = "chan-keep"
	kept := h.add("j1", "doc")
	h.ch = "chan-a"

	noErr(t, h.store.DeleteChannel(h.ctx, "chan-a"), "delete channel")
	for _, id := range []string{"j1", "j2", "j3"} {
		_, err := h.store.Get(h.ctx, "chan-a", id)
		wantErr(t, err, jobs.ErrNotFound, "get "+id+" after delete")
	}
	p, err := h.store.List(h.ctx, jobs.ListRequest{ChannelID: "chan-a", Limit: 10})
	noErr(t, err, "list after delete")
	equal(t, len(p.Jobs), 0, "jobs after delete")
	equal(t, p.Revision, uint64(0), "revision after delete")
	equal(t, len(h.claim("w", 10, time.Minute)), 0, "claimable after delete")

	// An identical enqueue is new, with a fresh target generation and no
	// artifact.
	out, err := h.store.Enqueue(h.ctx, h.req("j1", "doc"))
	noErr(t, err, "enqueue after delete")
	equal(t, out.Repeated, false, "Repeated after delete")
	equal(t, out.Job.TargetGeneration, uint64(1), "TargetGeneration after delete")
	equal(t, out.Job.State, jobs.StatePending, "State after delete")
	if h.get("j1").Artifact != nil {
		t.Error("artifact survived the delete")
	}

	d, err := h.store.Get(h.ctx, "chan-keep", "j1")
	noErr(t, err, "get in the kept channel")
	equal(t, d.Job, kept, "job of the kept channel")

	noErr(t, h.store.DeleteChannel(h.ctx, "chan-never-used"), "delete a channel without jobs")
	noErr(t, h.store.DeleteChannel(h.ctx, "chan-a"), "delete again")
}

// listAll follows the pages of req (Limit as given) and returns every
// summary, failing the test on an error, a page over Limit, or a Next that
// is not the page's last job.
func (h *harness) listAll(req jobs.ListRequest) []jobs.Summary {
	h.t.Helper()
	var out []jobs.Summary
	for pages := 0; ; pages++ {
		if pages > 1000 {
			h.t.Fatal("list does not end")
		}
		p, err := h.store.List(h.ctx, req)
		noErr(h.t, err, "list")
		if len(p.Jobs) > req.Limit {
			h.t.Fatalf("page of %d jobs over Limit %d", len(p.Jobs), req.Limit)
		}
		out = append(out, p.Jobs...)
		if p.Next == nil {
			return out
		}
		if len(p.Jobs) == 0 {
			h.t.Fatalf("an empty page with Next %+v", p.Next)
		}
		last := p.Jobs[len(p.Jobs)-1]
		equal(h.t, *p.Next, jobs.Cursor{CreatedAt: last.CreatedAt, ID: last.ID, ChannelID: last.ChannelID}, "Next is the page's last job")
		req.After = p.Next
	}
}

// testListFilters lists by state and by type, page by page: exactly the
// jobs that pass, in list order, with Next nil on the last page (a page
// that is exactly full ends the list too).
func testListFilters(t *testing.T, h *harness) {
	type made struct {
		id, typ string
		state   jobs.State
	}
	var all []made
	mk := func(id, typ string, st jobs.State) {
		h.clock.Advance(time.Second)
		r := h.req(id, "t-"+id)
		r.Type = typ
		h.enqueue(r)
		switch st {
		case jobs.StateCompleted:
			_, err := h.store.Settle(h.ctx, jobs.SettleRequest{Claim: jobs.ClaimOf(h.claimOne("w", id, time.Hour))})
			noErr(t, err, "settle "+id)
		case jobs.StateFailed:
			_, err := h.store.Fail(h.ctx, jobs.FailRequest{Claim: jobs.ClaimOf(h.claimOne("w", id, time.Hour)), Reason: "broken"})
			noErr(t, err, "fail "+id)
		case jobs.StateCancelled:
			_, err := h.store.Cancel(h.ctx, jobs.CancelRequest{ChannelID: h.ch, JobID: id})
			noErr(t, err, "cancel "+id)
		}
		all = append(all, made{id, typ, st})
	}
	for i := range 4 {
		mk(fmt.Sprintf("c%d", i), "render", jobs.StateCompleted)
	}
	for i := range 3 {
		mk(fmt.Sprintf("f%d", i), "mail", jobs.StateFailed)
	}
	mk("x0", "render", jobs.StateCancelled)
	for i := range 5 {
		mk(fmt.Sprintf("p%d", i), []string{"render", "mail"}[i%2], jobs.StatePending)
	}
	for _, tc := range []struct {
		states []jobs.State
		types  []string
		limit  int
	}{
		{states: []jobs.State{jobs.StateCompleted}, limit: 2},
		{states: []jobs.State{jobs.StateFailed}, limit: 3}, // exactly one full page
		{states: []jobs.State{jobs.StateFailed, jobs.StateCancelled}, limit: 1},
		{types: []string{"mail"}, limit: 2},
		{types: []string{"mail", "render"}, limit: 5},
		{states: []jobs.State{jobs.StatePending}, types: []string{"render"}, limit: 2},
		{states: []jobs.State{jobs.StateRunning}, limit: 2},
		{types: []string{"nothing-of-this-type"}, limit: 2},
	} {
		want := []string{}
		for i := len(all) - 1; i >= 0; i-- { // newest first
			m := all[i]
			if (len(tc.states) == 0 || slices.Contains(tc.states, m.state)) && (len(tc.types) == 0 || slices.Contains(tc.types, m.typ)) {
				want = append(want, m.id)
			}
		}
		what := fmt.Sprintf("States %v Types %v Limit %d", tc.states, tc.types, tc.limit)
		got := h.listAll(jobs.ListRequest{ChannelID: h.ch, States: tc.states, Types: tc.types, Limit: tc.limit})
		if !equal(t, summaryIDs(got), want, what) {
			continue
		}
		for _, s := range got {
			if (len(tc.states) > 0 && !slices.Contains(tc.states, s.State)) || (len(tc.types) > 0 && !slices.Contains(tc.types, s.Type)) {
				t.Errorf("%s: job %s is %s of type %s", what, s.ID, s.State, s.Type)
			}
		}
	}
	p, err := h.store.List(h.ctx, jobs.ListRequest{ChannelID: h.ch, States: []jobs.State{jobs.StateFailed}, Limit: 3})
	noErr(t, err, "list the failed jobs")
	equal(t, len(p.Jobs), 3, "failed jobs on one page")
	if p.Next != nil {
		t.Errorf("Next %+v on a page that holds every failed job", p.Next)
	}
	equal(t, p.Revision, h.rev(), "a filtered page carries the channel revision")
}

// testListEveryChannel lists with an empty ChannelID: every channel's jobs
// once, in list order (ties of CreatedAt and ID broken by ChannelID), page
// by page across channels, with the filters; the revision is the latest of
// any channel's.
func testListEveryChannel(t *testing.T, h *harness) {
	type ref struct {
		at     time.Time
		id, ch string
		typ    string
	}
	var all []ref
	for _, ch := range []string{"chan-b", "chan-a", "chan-c"} {
		h.ch = ch
		for i, id := range []string{"j2", "j1", "j3"} {
			r := h.req(id, "t-"+id)
			r.Type = []string{"render", "mail"}[i%2]
			j := h.enqueue(r) // same clock reading: ties in CreatedAt and ID across channels
			all = append(all, ref{j.CreatedAt, id, ch, r.Type})
		}
	}
	h.clock.Advance(time.Minute)
	h.ch = "chan-d"
	j := h.add("j0", "t-j0")
	all = append(all, ref{j.CreatedAt, "j0", "chan-d", "render"})
	h.ch = "chan-a"
	slices.SortFunc(all, func(a, b ref) int {
		if c := b.at.Compare(a.at); c != 0 {
			return c
		}
		if a.id != b.id {
			return strings.Compare(a.id, b.id)
		}
		return strings.Compare(a.ch, b.ch)
	})
	key := func(ch, id string) string { return ch + "/" + id }
	var want, wantMail []string
	for _, r := range all {
		want = append(want, key(r.ch, r.id))
		if r.typ == "mail" {
			wantMail = append(wantMail, key(r.ch, r.id))
		}
	}
	keys := func(ss []jobs.Summary) []string {
		out := make([]string, len(ss))
		for i, s := range ss {
			out[i] = key(s.ChannelID, s.ID)
		}
		return out
	}
	for _, limit := range []int{1, 2, 4, 100} {
		equal(t, keys(h.listAll(jobs.ListRequest{Limit: limit})), want, fmt.Sprintf("every channel, Limit %d", limit))
	}
	equal(t, keys(h.listAll(jobs.ListRequest{Types: []string{"mail"}, Limit: 2})), wantMail, "every channel's mail jobs")
	// A cursor between the tied jobs of two channels continues after it.
	p, err := h.store.List(h.ctx, jobs.ListRequest{Limit: 2, After: &jobs.Cursor{CreatedAt: all[1].at, ID: all[1].id, ChannelID: all[1].ch}})
	noErr(t, err, "list after a cursor naming a channel")
	equal(t, keys(p.Jobs), want[2:4], "the page after a cursor naming a channel")

	p, err = h.store.List(h.ctx, jobs.ListRequest{Limit: 1})
	noErr(t, err, "list every channel")
	var latest uint64
	for _, ch := range []string{"chan-a", "chan-b", "chan-c", "chan-d"} {
		latest = max(latest, h.revOf(ch))
	}
	equal(t, p.Revision, latest, "Revision of every channel is the latest of any channel")
	// One channel's list is untouched by the others.
	equal(t, keys(h.listAll(jobs.ListRequest{ChannelID: "chan-b", Limit: 2})), []string{"chan-b/j1", "chan-b/j2", "chan-b/j3"}, "one channel's jobs")
}

// testListFiltersRefused: a filter that names no state or an empty type is
// a conflict.
func testListFiltersRefused(t *testing.T, h *harness) {
	h.add("j1", "doc")
	_, err := h.store.List(h.ctx, jobs.ListRequest{ChannelID: h.ch, States: []jobs.State{jobs.StatePending, "done"}, Limit: 5})
	wantErr(t, err, jobs.ErrConflict, "list by an unknown state", "States[1]", "done")
	_, err = h.store.List(h.ctx, jobs.ListRequest{States: []jobs.State{""}})
	wantErr(t, err, jobs.ErrConflict, "list by an empty state", "States[0]")
	_, err = h.store.List(h.ctx, jobs.ListRequest{ChannelID: h.ch, Types: []string{"render", ""}})
	wantErr(t, err, jobs.ErrConflict, "list by an empty type", "Types[1]")
	_, err = h.store.List(h.ctx, jobs.ListRequest{ChannelID: "missing-q", Types: []string{"render"}})
	wantErr(t, err, jobs.ErrNotFound, "a filtered list of a missing channel", "missing-q")
}
