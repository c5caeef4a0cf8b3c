package jobs_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jobkeys/jobkeys/jobs"
)

// A job's life: enqueue, claim, progress, settle.
func ExampleMemoryStore() {
	ctx := context.Background()
	store, err := jobs.NewMemoryStore(nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	out, err := store.Enqueue(ctx, jobs.EnqueueRequest{
		ID: "render-1", ChannelID: "acme", Type: "render", Version: 1,
		TargetKey: "doc-42", IdempotencyKey: "doc-42@v7", Fingerprint: "sha256:aa",
		Input: json.RawMessage(`{"doc": 42}`),
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("enqueued:", out.Job.ID, out.Job.State, "generation", out.Job.TargetGeneration)

	claimed, err := store.Claim(ctx, jobs.ClaimRequest{ChannelID: "acme", Owner: "worker-1", Count: 10, TTL: time.Minute})
	if err != nil {
		fmt.Println(err)
		return
	}
	job := claimed[0]
	fmt.Println("claimed:", job.ID, job.State, "attempt", job.Attempts, "by", job.ClaimOwner)

	claim := jobs.ClaimOf(job)
	if _, err := store.AppendProgress(ctx, jobs.ProgressRequest{
		Claim: claim, Stage: "render", Label: "Rendering 3 pages", State: jobs.ProgressStarted,
	}); err != nil {
		fmt.Println(err)
		return
	}
	done, err := store.Settle(ctx, jobs.SettleRequest{Claim: claim, Artifact: json.RawMessage(`{"pages": 3}`)})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("settled:", done.Job.State, string(done.Artifact.Value), "progress entries", len(done.Job.Progress))

	// A second settle is refused: the artifact is immutable.
	_, err = store.Settle(ctx, jobs.SettleRequest{Claim: claim, Artifact: json.RawMessage(`{"pages": 4}`)})
	fmt.Println("settle again is a conflict:", errors.Is(err, jobs.ErrConflict))
	// Output:
	// enqueued: render-1 pending generation 1
	// claimed: render-1 running attempt 1 by worker-1
	// settled: completed {"pages":3} progress entries 1
	// settle again is a conflict: true
}

// An enqueue with a used idempotency key replays the job; a newer job for
// the same target supersedes the older one.
func ExampleMemoryStore_Enqueue() {
	ctx := context.Background()
	store, err := jobs.NewMemoryStore(nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	req := jobs.EnqueueRequest{
		ID: "r1", ChannelID: "acme", Type: "render", Version: 1,
		TargetKey: "doc-42", IdempotencyKey: "doc-42@v7", Fingerprint: "sha256:aa",
	}
	first, err := store.Enqueue(ctx, req)
	if err != nil {
		fmt.Println(err)
		return
	}
	again, err := store.Enqueue(ctx, req)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("replay:", again.Repeated, again.Job.ID == first.Job.ID)

	other := req
	other.Fingerprint = "sha256:bb"
	_, err = store.Enqueue(ctx, other)
	fmt.Println("same key, other fingerprint is a conflict:", errors.Is(err, jobs.ErrConflict))

	newer := req
	newer.ID, newer.IdempotencyKey, newer.Fingerprint = "r2", "doc-42@v8", "sha256:cc"
	second, err := store.Enqueue(ctx, newer)
	if err != nil {
		fmt.Println(err)
		return
	}
	old, err := store.Get(ctx, "acme", "r1")
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("r2 generation:", second.Job.TargetGeneration, "r1 now:", old.Job.State)
	// Output:
	// replay: true true
	// same key, other fingerprint is a conflict: true
	// r2 generation: 2 r1 now: superseded
}

// A worker that crashes leaves its claim to expire; another worker
// reclaims the job, and the first worker's claim is fenced off.
func ExampleMemoryStore_Claim_reclaim() {
	ctx := context.Background()
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	store, err := jobs.NewMemoryStore(&jobs.Config{Now: func() time.Time { return now }})
	if err != nil {
		fmt.Println(err)
		return
	}
	if _, err := store.Enqueue(ctx, jobs.EnqueueRequest{
		ID: "r1", ChannelID: "acme", Type: "render", Version: 1,
		TargetKey: "doc-42", IdempotencyKey: "k1", Fingerprint: "f1",
	}); err != nil {
		fmt.Println(err)
		return
	}
	crashed, err := store.Claim(ctx, jobs.ClaimRequest{Owner: "worker-1", Count: 1, TTL: 30 * time.Second})
	if err != nil {
		fmt.Println(err)
		return
	}

	now = now.Add(31 * time.Second) // the claim expired
	taken, err := store.Claim(ctx, jobs.ClaimRequest{Owner: "worker-2", Count: 1, TTL: 30 * time.Second})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("reclaimed by", taken[0].ClaimOwner, "attempt", taken[0].Attempts, "claim generation", taken[0].ClaimGeneration)

	_, err = store.Settle(ctx, jobs.SettleRequest{Claim: jobs.ClaimOf(crashed[0])})
	fmt.Println("the old claim is fenced:", errors.Is(err, jobs.ErrConflict))
	// Output:
	// reclaimed by worker-2 attempt 2 claim generation 2
	// the old claim is fenced: true
}

// Lists come newest first, a page at a time.
func ExampleMemoryStore_List() {
	ctx := context.Background()
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	store, err := jobs.NewMemoryStore(&jobs.Config{
		Now: func() time.Time { return now },
		Subject: func(jobType string, input json.RawMessage) string {
			var in struct{ Title string }
			_ = json.Unmarshal(input, &in)
			return in.Title
		},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	for i, title := range []string{"Q1 report", "Q2 report", "Q3 report"} {
		now = now.Add(time.Minute)
		if _, err := store.Enqueue(ctx, jobs.EnqueueRequest{
			ID: fmt.Sprintf("r%d", i+1), ChannelID: "acme", Type: "render", Version: 1,
			TargetKey: title, IdempotencyKey: title, Fingerprint: "f",
			Input: json.RawMessage(`{"Title":"` + title + `"}`),
		}); err != nil {
			fmt.Println(err)
			return
		}
	}
	req := jobs.ListRequest{ChannelID: "acme", Limit: 2}
	for {
		page, err := store.List(ctx, req)
		if err != nil {
			fmt.Println(err)
			return
		}
		for _, s := range page.Jobs {
			fmt.Println(s.ID, s.State, s.Subject)
		}
		if page.Next == nil {
			break
		}
		fmt.Println("-- next page")
		req.After = page.Next
	}
	// Output:
	// r3 pending Q3 report
	// r2 pending Q2 report
	// -- next page
	// r1 pending Q1 report
}
