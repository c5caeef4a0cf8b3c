package jobstest

import (
	"encoding/json"
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/jobkeys/jobkeys/jobs"
)

func init() {
	register("ClaimBadRequest", testClaimBadRequest)
	register("ClaimFields", testClaimFields)
	register("ClaimOrder", testClaimOrder)
	register("ClaimBatchedAndCapped", testClaimBatchedAndCapped)
	register("ClaimNoneDue", testClaimNoneDue)
	register("ClaimSkipsPausedAndTerminal", testClaimSkips)
	register("ClaimReclaimsExpired", testClaimReclaims)
	register("ClaimAcrossChannels", testClaimAcrossChannels)
	register("ClaimConcurrentNoDoubleClaim", testClaimConcurrent)
}

func testClaimBadRequest(t *testing.T, h *harness) {
	h.add("j1", "doc")
	cases := []struct {
		name string
		req  jobs.ClaimRequest
		word string
	}{
		{"empty Owner", jobs.ClaimRequest{ChannelID: h.ch, Count: 1, TTL: time.Second}, "Owner"},
		{"Count 0", jobs.ClaimRequest{ChannelID: h.ch, Owner: "w", TTL: time.Second}, "Count"},
		{"negative Count", jobs.ClaimRequest{ChannelID: h.ch, Owner: "w", Count: -1, TTL: time.Second}, "Count"},
		{"TTL 0", jobs.ClaimRequest{ChannelID: h.ch, Owner: "w", Count: 1}, "TTL"},
		{"negative TTL", jobs.ClaimRequest{ChannelID: h.ch, Owner: "w", Count: 1, TTL: -time.Second}, "TTL"},
		{"Owner not UTF-8", jobs.ClaimRequest{ChannelID: h.ch, Owner: "\xff", Count: 1, TTL: time.Second}, "Owner"},
	}
	for _, tc := range cases {
		rev := h.rev()
		got, err := h.store.Claim(h.ctx, tc.req)
		wantErr(t, err, jobs.ErrConflict, tc.name, tc.word)
		if len(got) != 0 {
			t.Errorf("%s: claimed %v", tc.name, ids(got))
		}
		h.unchanged(rev, tc.name)
	}
	equal(t, h.get("j1").Job.State, jobs.StatePending, "j1 after bad claims")
}

func testClaimFields(t *testing.T, h *harness) {
	j := h.add("j1", "doc")
	h.clock.Advance(3 * time.Second)
	now := h.clock.Now()
	c := h.claimOne("w1", "j1", 30*time.Second)
	equal(t, c.State, jobs.StateRunning, "State")
	equal(t, c.Attempts, 1, "Attempts")
	equal(t, c.ClaimGeneration, uint64(1), "ClaimGeneration")
	equal(t, c.ClaimOwner, "w1", "ClaimOwner")
	sameTime(t, c.ClaimExpiresAt, now.Add(30*time.Second), "ClaimExpiresAt = now + TTL")
	sameTime(t, c.UpdatedAt, now, "UpdatedAt")
	sameTime(t, c.CreatedAt, j.CreatedAt, "CreatedAt kept")
	sameTime(t, c.AvailableAt, j.AvailableAt, "AvailableAt kept")
	if c.Revision <= j.Revision {
		t.Errorf("claim Revision %d not above the enqueue's %d", c.Revision, j.Revision)
	}
	equal(t, h.get("j1").Job, c, "Get after claim")
	equal(t, jobs.ClaimOf(c), jobs.Claim{ChannelID: h.ch, JobID: "j1", Owner: "w1", Generation: 1}, "ClaimOf")

	// A claim clears the binding and the reason of the previous attempt.
	r, err := h.store.Renew(h.ctx, jobs.RenewRequest{Claim: jobs.ClaimOf(c), ExpectedRevision: c.Revision, TTL: time.Minute, Binding: json.RawMessage(`{"lease":1}`)})
	noErr(t, err, "renew with binding")
	_, err = h.store.Requeue(h.ctx, jobs.RequeueRequest{Claim: jobs.ClaimOf(r), Reason: "retry"})
	noErr(t, err, "requeue")
	c2 := h.claimOne("w2", "j1", time.Minute)
	equal(t, c2.Reason, "", "Reason cleared by the claim")
	equal(t, len(c2.ClaimBinding), 0, "ClaimBinding cleared by the claim")
	equal(t, c2.Attempts, 2, "Attempts after a second claim")
	equal(t, c2.ClaimGeneration, uint64(2), "ClaimGeneration after a second claim")
	equal(t, c2.ClaimOwner, "w2", "ClaimOwner of the second claim")

	// A reclaim of an expired claim clears its binding too.
	r2, err := h.store.Renew(h.ctx, jobs.RenewRequest{Claim: jobs.ClaimOf(c2), ExpectedRevision: c2.Revision, TTL: 2 * time.Minute, Binding: json.RawMessage(`{"lease":2}`)})
	noErr(t, err, "renew the second claim with a binding")
	h.clock.Set(r2.ClaimExpiresAt)
	c3 := h.claimOne("w3", "j1", time.Minute)
	equal(t, len(c3.ClaimBinding), 0, "ClaimBinding cleared by a reclaim")
	equal(t, c3.ClaimOwner, "w3", "ClaimOwner of the reclaim")
}

func testClaimOrder(t *testing.T, h *harness) {
	// Due times: b and c due at start+1s, a at start+2s, d at start+3s;
	// b and c share the due time, c created first; e and f share due and
	// creation time and order by id.
	at := func(id string, due time.Duration) {
		r := h.req(id, "t-"+id)
		r.AvailableAt = start.Add(due)
		h.enqueue(r)
	}
	at("c", time.Second)
	h.clock.Advance(time.Millisecond)
	at("b", time.Second)
	at("a", 2*time.Second)
	at("d", 3*time.Second)
	at("f", 4*time.Second)
	at("e", 4*time.Second)
	at("later", time.Hour)

	h.clock.Set(start.Add(1500 * time.Millisecond))
	equal(t, ids(h.claim("w", 10, 2*time.Hour)), []string{"c", "b"}, "due at 1.5s")
	h.clock.Set(start.Add(5 * time.Second))
	equal(t, ids(h.claim("w", 10, 2*time.Hour)), []string{"a", "d", "e", "f"}, "due at 5s: due time, creation, id")
	equal(t, len(h.claim("w", 10, 2*time.Hour)), 0, "nothing more due before an hour")
	h.clock.Set(start.Add(time.Hour))
	equal(t, ids(h.claim("w", 10, 2*time.Hour)), []string{"later"}, "AvailableAt = now is due")
}

func testClaimBatchedAndCapped(t *testing.T, h *harness) {
	n := jobs.ClaimCountLimit + 5
	for i := range n {
		h.add(fmt.Sprintf("j%03d", i), fmt.Sprintf("t%03d", i))
	}
	got := h.claim("w", 3, time.Minute)
	equal(t, ids(got), []string{"j000", "j001", "j002"}, "a batch of 3")
	got = h.claim("w", 1000, time.Minute)
	equal(t, len(got), jobs.ClaimCountLimit, "a batch over the cap")
	if len(got) > 0 {
		equal(t, got[0].ID, "j003", "first of the capped batch")
	}
	got = h.claim("w", 1000, time.Minute)
	equal(t, ids(got), []string{fmt.Sprintf("j%03d", n-2), fmt.Sprintf("j%03d", n-1)}, "the rest")
}

func testClaimNoneDue(t *testing.T, h *harness) {
	got, err := h.store.Claim(h.ctx, jobs.ClaimRequest{ChannelID: h.ch, Owner: "w", Count: 5, TTL: time.Second})
	noErr(t, err, "claim an empty channel")
	equal(t, len(got), 0, "claimed from an empty channel")
	r := h.req("j1", "doc")
	r.AvailableAt = start.Add(time.Minute)
	h.enqueue(r)
	rev := h.rev()
	got, err = h.store.Claim(h.ctx, jobs.ClaimRequest{Owner: "w", Count: 5, TTL: time.Second})
	noErr(t, err, "claim with nothing due")
	equal(t, len(got), 0, "claimed with nothing due")
	h.unchanged(rev, "claim with nothing due")
}

func testClaimSkips(t *testing.T, h *harness) {
	h.add("paused", "t1")
	p := h.get("paused").Job
	_, err := h.store.Pause(h.ctx, jobs.PauseRequest{ChannelID: h.ch, JobID: "paused", ExpectedRevision: p.Revision})
	noErr(t, err, "pause")
	h.add("cancelled", "t2")
	_, err = h.store.Cancel(h.ctx, jobs.CancelRequest{ChannelID: h.ch, JobID: "cancelled"})
	noErr(t, err, "cancel")
	h.add("failed", "t3")
	c := h.claimOne("w", "failed", time.Second)
	_, err = h.store.Fail(h.ctx, jobs.FailRequest{Claim: jobs.ClaimOf(c), Reason: "boom"})
	noErr(t, err, "fail")
	h.add("done", "t4")
	c = h.claimOne("w", "done", time.Second)
	_, err = h.store.Settle(h.ctx, jobs.SettleRequest{Claim: jobs.ClaimOf(c)})
	noErr(t, err, "settle")
	h.add("held", "t5")
	h.claimOne("w", "held", time.Hour)
	h.clock.Advance(time.Minute)
	rev := h.rev()
	equal(t, len(h.claim("w", 10, time.Second)), 0, "claimable among paused, terminal and validly claimed jobs")
	h.unchanged(rev, "claim with nothing claimable")
}

func testClaimReclaims(t *testing.T, h *harness) {
	h.add("j1", "doc")
	old := h.claimOne("w1", "j1", 10*time.Second)
	h.clock.Advance(5 * time.Second)
	equal(t, len(h.claim("w2", 1, time.Minute)), 0, "claim before the expiry")
	h.clock.Set(old.ClaimExpiresAt)
	// A pending job due later than the expiry comes after the reclaim.
	r := h.req("j2", "doc2")
	r.AvailableAt = old.ClaimExpiresAt
	h.enqueue(r)
	got := h.claim("w2", 2, time.Minute)
	equal(t, ids(got), []string{"j1", "j2"}, "reclaim at the expiry, then the job due at the same time but created later")
	if len(got) == 0 {
		return
	}
	re := got[0]
	equal(t, re.ClaimOwner, "w2", "reclaimed ClaimOwner")
	equal(t, re.Attempts, 2, "reclaimed Attempts")
	equal(t, re.ClaimGeneration, old.ClaimGeneration+1, "reclaimed ClaimGeneration")
	sameTime(t, re.ClaimExpiresAt, h.clock.Now().Add(time.Minute), "reclaimed ClaimExpiresAt")

	// The old claim is fenced on every claimed call, even back before the
	// expiry.
	stale := jobs.ClaimOf(old)
	fenced := map[string]error{}
	_, fenced["Renew"] = h.store.Renew(h.ctx, jobs.RenewRequest{Claim: stale, ExpectedRevision: re.Revision, TTL: time.Hour})
	_, fenced["Requeue"] = h.store.Requeue(h.ctx, jobs.RequeueRequest{Claim: stale})
	_, fenced["AppendProgress"] = h.store.AppendProgress(h.ctx, jobs.ProgressRequest{Claim: stale, Stage: "s", Label: "l", State: jobs.ProgressStarted})
	_, fenced["Settle"] = h.store.Settle(h.ctx, jobs.SettleRequest{Claim: stale})
	_, fenced["Fail"] = h.store.Fail(h.ctx, jobs.FailRequest{Claim: stale})
	// The same owner reclaiming does not revive an old generation either.
	sameOwner := jobs.ClaimOf(re)
	sameOwner.Generation = old.ClaimGeneration
	_, fenced["Settle same owner, old generation"] = h.store.Settle(h.ctx, jobs.SettleRequest{Claim: sameOwner})
	for _, op := range sortedKeys(fenced) {
		wantErr(t, fenced[op], jobs.ErrConflict, op+" with the reclaimed claim")
	}
	equal(t, h.get("j1").Job, re, "j1 after the fenced calls")
}

func testClaimAcrossChannels(t *testing.T, h *harness) {
	ra := h.req("a1", "doc")
	ra.AvailableAt = start.Add(2 * time.Second)
	h.enqueue(ra)
	rb := h.req("b1", "doc")
	rb.ChannelID = "chan-b"
	rb.AvailableAt = start.Add(time.Second)
	h.enqueue(rb)
	rc := h.req("c1", "doc")
	rc.ChannelID = "chan-c"
	rc.AvailableAt = start.Add(3 * time.Second)
	h.enqueue(rc)
	revA, revB, revC := h.revOf(h.ch), h.revOf("chan-b"), h.revOf("chan-c")

	h.clock.Set(start.Add(time.Minute))
	only, err := h.store.Claim(h.ctx, jobs.ClaimRequest{ChannelID: "chan-c", Owner: "w", Count: 10, TTL: time.Minute})
	noErr(t, err, "claim in chan-c")
	equal(t, ids(only), []string{"c1"}, "a claim in one channel takes only its jobs")

	got, err := h.store.Claim(h.ctx, jobs.ClaimRequest{Owner: "w", Count: 10, TTL: time.Minute})
	noErr(t, err, "claim in every channel")
	equal(t, ids(got), []string{"b1", "a1"}, "claim across channels, by due time")
	for _, j := range got {
		before := map[string]uint64{h.ch: revA, "chan-b": revB}[j.ChannelID]
		if j.Revision <= before {
			t.Errorf("%s/%s: Revision %d not above its channel's %d", j.ChannelID, j.ID, j.Revision, before)
		}
		if now := h.revOf(j.ChannelID); now < j.Revision {
			t.Errorf("%s: channel revision %d below its claimed job's %d", j.ChannelID, now, j.Revision)
		}
	}
	if got := h.revOf("chan-c"); got <= revC {
		t.Errorf("chan-c revision %d not above %d after its claim", got, revC)
	}
}

func testClaimConcurrent(t *testing.T, h *harness) {
	const n, workers = 30, 6
	for i := range n {
		h.add(fmt.Sprintf("j%02d", i), fmt.Sprintf("t%02d", i))
	}
	var mu sync.Mutex
	seen := map[string]string{}
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			owner := fmt.Sprintf("w%d", w)
			for {
				got, err := h.store.Claim(h.ctx, jobs.ClaimRequest{ChannelID: h.ch, Owner: owner, Count: 2, TTL: time.Hour})
				if err != nil {
					errs <- err
					return
				}
				if len(got) == 0 {
					return
				}
				mu.Lock()
				for _, j := range got {
					if prev, ok := seen[j.ID]; ok {
						errs <- fmt.Errorf("job %s claimed by %s and %s", j.ID, prev, owner)
					}
					seen[j.ID] = owner
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	equal(t, len(seen), n, "jobs claimed by the concurrent workers")
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
