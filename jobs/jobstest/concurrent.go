package jobstest

import (
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jobkeys/jobkeys/jobs"
)

func init() {
	register("ConcurrentEnqueueSameKey", testConcurrentEnqueueSameKey)
	register("ConcurrentEnqueueSameTarget", testConcurrentEnqueueSameTarget)
	register("ConcurrentSettleOnce", testConcurrentSettleOnce)
	register("ConcurrentRenewOnce", testConcurrentRenewOnce)
}

const racers = 6

// race runs fn(i) for i in 0..racers-1 at once and returns the results.
func race[T any](fn func(i int) (T, error)) ([]T, []error) {
	out := make([]T, racers)
	errs := make([]error, racers)
	var wg sync.WaitGroup
	startGun := make(chan struct{})
	for i := range racers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-startGun
			out[i], errs[i] = fn(i)
		}()
	}
	close(startGun)
	wg.Wait()
	return out, errs
}

// Enqueues of one idempotency key at once make one job; the others replay
// it.
func testConcurrentEnqueueSameKey(t *testing.T, h *harness) {
	outs, errs := race(func(i int) (jobs.Enqueued, error) {
		r := h.req(fmt.Sprintf("j%d", i), "doc")
		r.IdempotencyKey, r.Fingerprint = "same", "same"
		return h.store.Enqueue(h.ctx, r)
	})
	created := ""
	for i, err := range errs {
		if err != nil {
			t.Errorf("racer %d: %v (a concurrent enqueue of a used key must replay it)", i, err)
			continue
		}
		if !outs[i].Repeated {
			if created != "" {
				t.Errorf("racers created %s and %s for one idempotency key", created, outs[i].Job.ID)
			}
			created = outs[i].Job.ID
		}
	}
	if created == "" {
		t.Fatal("no racer created the job")
	}
	for i, out := range outs {
		if errs[i] == nil && out.Job.ID != created {
			t.Errorf("racer %d got job %s, want %s", i, out.Job.ID, created)
		}
	}
	p, err := h.store.List(h.ctx, jobs.ListRequest{ChannelID: h.ch, Limit: 100})
	noErr(t, err, "list")
	equal(t, summaryIDs(p.Jobs), []string{created}, "jobs after the race")
}

// Enqueues of one target at once take distinct generations; only the
// newest stays pending.
func testConcurrentEnqueueSameTarget(t *testing.T, h *harness) {
	outs, errs := race(func(i int) (jobs.Enqueued, error) {
		return h.store.Enqueue(h.ctx, h.req(fmt.Sprintf("j%d", i), "doc"))
	})
	gens := map[uint64]string{}
	var newest uint64
	for i, err := range errs {
		noErr(t, err, fmt.Sprintf("racer %d", i))
		j := outs[i].Job
		if prev, ok := gens[j.TargetGeneration]; ok {
			t.Errorf("jobs %s and %s share target generation %d", prev, j.ID, j.TargetGeneration)
		}
		gens[j.TargetGeneration] = j.ID
		newest = max(newest, j.TargetGeneration)
	}
	equal(t, newest, uint64(racers), "the newest generation")
	for g, id := range gens {
		d := h.get(id)
		want := jobs.StateSuperseded
		if g == newest {
			want = jobs.StatePending
		}
		equal(t, d.Job.State, want, fmt.Sprintf("%s (generation %d)", id, g))
		equal(t, d.Target.Generation, newest, "target generation seen from "+id)
	}
	got := h.claim("w", 10, time.Minute)
	equal(t, ids(got), []string{gens[newest]}, "claimable after the race")
}

// Settles of one claim at once: exactly one wins, and its artifact stays.
func testConcurrentSettleOnce(t *testing.T, h *harness) {
	h.add("j1", "doc")
	c := jobs.ClaimOf(h.claimOne("w", "j1", time.Hour))
	outs, errs := race(func(i int) (jobs.Detail, error) {
		return h.store.Settle(h.ctx, jobs.SettleRequest{Claim: c, Artifact: json.RawMessage(fmt.Sprintf(`{"racer":%d}`, i))})
	})
	winner := -1
	for i, err := range errs {
		if err == nil {
			if winner >= 0 {
				t.Errorf("racers %d and %d both settled", winner, i)
			}
			winner = i
			continue
		}
		wantErr(t, err, jobs.ErrConflict, fmt.Sprintf("losing settle %d", i))
	}
	if winner < 0 {
		t.Fatal("no settle won")
	}
	d := h.get("j1")
	equal(t, d.Job.State, jobs.StateCompleted, "State")
	sameJSON(t, d.Artifact.Value, fmt.Sprintf(`{"racer":%d}`, winner), "the winner's artifact")
	equal(t, d.Job, outs[winner].Job, "the winner's job")
}

// Renewals presenting one revision at once: exactly one wins.
func testConcurrentRenewOnce(t *testing.T, h *harness) {
	h.add("j1", "doc")
	j := h.claimOne("w", "j1", time.Minute)
	outs, errs := race(func(i int) (jobs.Job, error) {
		return h.store.Renew(h.ctx, jobs.RenewRequest{Claim: jobs.ClaimOf(j), ExpectedRevision: j.Revision,
			TTL: time.Duration(2+i) * time.Minute, Binding: json.RawMessage(fmt.Sprint(i))})
	})
	winner := -1
	for i, err := range errs {
		if err == nil {
			if winner >= 0 {
				t.Errorf("racers %d and %d both renewed revision %d", winner, i, j.Revision)
			}
			winner = i
			continue
		}
		wantErr(t, err, jobs.ErrConflict, fmt.Sprintf("losing renew %d", i))
	}
	if winner < 0 {
		t.Fatal("no renew won")
	}
	equal(t, h.get("j1").Job, outs[winner], "the winner's renewal is stored")
}
