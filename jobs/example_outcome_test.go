package jobs_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jobkeys/jobkeys"
	"github.com/jobkeys/jobkeys/jobs"
)

// A handler that knows retrying cannot help returns its error marked
// Permanent (here wrapped further): the job fails at once, with the
// error kept, rather than after MaxFailures attempts.
func ExamplePermanent() {
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
	errBadInput := errors.New("bad input")
	type render struct {
		Doc   string `json:"doc"`
		Pages int    `json:"pages"`
	}
	err = jobs.Register(client, jobs.Kind[render, string]{
		Type: "render", Version: 1,
		Policy:      jobkeys.Policy{Key: []string{"doc", "/doc"}},
		MaxFailures: 5,
		Work: func(ctx context.Context, run *jobs.Run, in render) (string, error) {
			if in.Pages <= 0 {
				err := jobs.Permanent(fmt.Errorf("%d pages: %w", in.Pages, errBadInput))
				fmt.Println("is bad input:", errors.Is(err, errBadInput))
				return "", fmt.Errorf("render %s: %w", in.Doc, err)
			}
			return "rendered", nil
		},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	if _, err := client.Enqueue(ctx, jobs.EnqueueRequest{
		ID: "r1", ChannelID: "docs", Type: "render", TargetKey: "r1",
		IdempotencyKey: "r1", Fingerprint: "r1", Input: []byte(`{"doc":"manual","pages":0}`),
	}); err != nil {
		fmt.Println(err)
		return
	}
	if err := client.Start(ctx); err != nil {
		fmt.Println(err)
		return
	}
	defer client.Stop(ctx)
	d, err := waitOver(ctx, client, "docs", "r1")
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("%s after %d attempt; reason %q\n", d.Job.State, d.Job.Attempts, d.Job.Reason)
	// Output:
	// is bad input: true
	// failed after 1 attempt; reason "permanent: render manual: 0 pages: bad input"
}

// A handler that cannot go on yet (an upstream asks to come back later)
// snoozes: the job is handed back, due again after the delay, and no
// failure is counted. Attempts counts every claim, the snoozed one too.
func ExampleSnooze() {
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
	err = jobs.Register(client, jobs.Kind[struct{}, string]{
		Type: "report", Version: 1,
		Policy:      jobkeys.Policy{Key: []string{"report"}},
		MaxFailures: 1, // a counted failure would fail the job
		Work: func(ctx context.Context, run *jobs.Run, _ struct{}) (string, error) {
			job := run.Job()
			if job.Attempts == 1 {
				return "", fmt.Errorf("warehouse still loading: %w", jobs.Snooze(20*time.Millisecond))
			}
			return fmt.Sprintf("attempt %d, %d failures", job.Attempts, job.Failures), nil
		},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	if _, err := client.Enqueue(ctx, jobs.EnqueueRequest{
		ID: "daily", ChannelID: "reports", Type: "report", TargetKey: "daily",
		IdempotencyKey: "daily", Fingerprint: "daily",
	}); err != nil {
		fmt.Println(err)
		return
	}
	if err := client.Start(ctx); err != nil {
		fmt.Println(err)
		return
	}
	defer client.Stop(ctx)
	d, err := waitOver(ctx, client, "reports", "daily")
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(d.Job.State, string(d.Artifact.Value))
	// Output:
	// completed "attempt 2, 0 failures"
}
