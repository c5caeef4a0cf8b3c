package jobs_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jobkeys/jobkeys"
	"github.com/jobkeys/jobkeys/jobs"
)

// An error from Work is a failed attempt: the client requeues the job with
// backoff and counts a failure, and fails the job for good when its
// failures reach MaxFailures. The attempt counts live in the job record,
// so every process sees the same ones.
func ExampleClient_retries() {
	ctx := context.Background()
	store, err := jobs.NewMemoryStore(nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	keys := jobkeys.NewMemoryStore()
	coord, err := jobkeys.NewCoordinator(keys, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	client, err := jobs.NewClient(store, coord, &jobs.ClientConfig{
		KeyStore: keys,
		// Quick retries for the example; the default is DefaultBackoff,
		// 1 s·2^(failures−1) up to 5 min.
		Backoff:      func(failures int) time.Duration { return 10 * time.Millisecond },
		PollInterval: 10 * time.Millisecond,
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	type sync struct {
		Account string `json:"account"`
		Broken  bool   `json:"broken"`
	}
	err = jobs.Register(client, jobs.Kind[sync, string]{
		Type: "sync", Version: 1,
		Policy:      jobkeys.Policy{Key: []string{"account", "/account"}},
		MaxFailures: 3,
		Work: func(ctx context.Context, run *jobs.Run, in sync) (string, error) {
			job := run.Job() // Attempts and Failures so far, from the record
			if in.Broken || job.Failures == 0 {
				return "", fmt.Errorf("upstream refused account %s (attempt %d)", in.Account, job.Attempts)
			}
			return "synced", nil
		},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, j := range []struct{ id, input string }{
		{"flaky", `{"account":"a-1"}`},                // fails once, then succeeds
		{"broken", `{"account":"a-2","broken":true}`}, // fails every time
	} {
		if _, err := client.Enqueue(ctx, jobs.EnqueueRequest{
			ID: j.id, ChannelID: "accounts", Type: "sync", TargetKey: j.id,
			IdempotencyKey: j.id, Fingerprint: j.id, Input: []byte(j.input),
		}); err != nil {
			fmt.Println(err)
			return
		}
	}
	if err := client.Start(ctx); err != nil {
		fmt.Println(err)
		return
	}
	defer client.Stop(ctx)
	for _, id := range []string{"flaky", "broken"} {
		d, err := waitOver(ctx, client, "accounts", id)
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Printf("%s: %s after %d attempts, %d failures; reason %q\n", id, d.Job.State, d.Job.Attempts, d.Job.Failures, d.Job.Reason)
	}
	// Output:
	// flaky: completed after 2 attempts, 1 failures; reason ""
	// broken: failed after 3 attempts, 3 failures; reason "upstream refused account a-2 (attempt 3)"
}

// Cancel ends a job whatever state it is in: a pending job never runs, and
// a running one's handler sees its context end with ErrCancelled.
func ExampleClient_Cancel() {
	ctx := context.Background()
	store, err := jobs.NewMemoryStore(nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	keys := jobkeys.NewMemoryStore()
	coord, err := jobkeys.NewCoordinator(keys, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	client, err := jobs.NewClient(store, coord, &jobs.ClientConfig{KeyStore: keys, PollInterval: 10 * time.Millisecond})
	if err != nil {
		fmt.Println(err)
		return
	}
	started := make(chan string, 2) // room for export-2, should it ever run
	stopped := make(chan error, 1)
	err = jobs.Register(client, jobs.Kind[struct{}, struct{}]{
		Type: "export", Version: 1,
		Policy: jobkeys.Policy{Key: []string{"export"}, MaxQueuedPerKey: 1}, // one key for every export: one runs, one waits
		Work: func(ctx context.Context, run *jobs.Run, _ struct{}) (struct{}, error) {
			started <- run.Job().ID
			<-ctx.Done()                  // a long export, until it is told to stop
			stopped <- context.Cause(ctx) // why it must stop
			return struct{}{}, context.Cause(ctx)
		},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	enqueue := func(id string) error {
		_, err := client.Enqueue(ctx, jobs.EnqueueRequest{
			ID: id, ChannelID: "exports", Type: "export", TargetKey: id,
			IdempotencyKey: id, Fingerprint: id,
		})
		return err
	}
	if err := enqueue("export-1"); err != nil {
		fmt.Println(err)
		return
	}
	if err := client.Start(ctx); err != nil {
		fmt.Println(err)
		return
	}
	defer client.Stop(ctx)
	fmt.Println(<-started, "runs")
	if err := enqueue("export-2"); err != nil {
		fmt.Println(err)
		return
	}

	// export-2 waits for the key's only slot (pending, or claimed and
	// waiting in the client): cancelled, it never runs.
	if _, err := client.Cancel(ctx, jobs.CancelRequest{ChannelID: "exports", JobID: "export-2"}); err != nil {
		fmt.Println(err)
		return
	}
	if _, err := client.Cancel(ctx, jobs.CancelRequest{ChannelID: "exports", JobID: "export-1"}); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("export-1 stopped, cancelled:", errors.Is(<-stopped, jobs.ErrCancelled))
	for _, id := range []string{"export-1", "export-2"} {
		d, err := waitOver(ctx, client, "exports", id)
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Println(id, d.Job.State)
	}
	// export-2 may have been claimed (an attempt counted) while it waited
	// for the slot, but its Work never ran.
	fmt.Println("export-2 ran:", len(started) > 0)
	// Output:
	// export-1 runs
	// export-1 stopped, cancelled: true
	// export-1 cancelled
	// export-2 cancelled
	// export-2 ran: false
}

// waitOver polls until the job is over (completed, failed, cancelled or
// superseded) and returns it.
func waitOver(ctx context.Context, client *jobs.Client, channelID, jobID string) (jobs.Detail, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		d, err := client.Get(ctx, channelID, jobID)
		if err != nil || !d.Job.State.Active() {
			return d, err
		}
		select {
		case <-ctx.Done():
			return d, fmt.Errorf("job %s is still %s: %w", jobID, d.Job.State, ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
}
