package jobs_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jobkeys/jobkeys"
	"github.com/jobkeys/jobkeys/jobs"
)

// The runtime on the memory stores: a kind with a key policy, an
// enqueue per outcome, and the workers that run what was accepted.
func ExampleClient() {
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
	type render struct {
		Doc string `json:"doc"`
	}
	type rendered struct {
		Pages int `json:"pages"`
	}
	err = jobs.Register(client, jobs.Kind[render, rendered]{
		Type: "render", Version: 1,
		// One render per document at a time, one more waiting; a newer
		// request replaces the waiting one.
		Policy:      jobkeys.Policy{Key: []string{"doc", "/doc"}, MaxActive: 1, MaxQueuedPerKey: 1, WhenFull: jobkeys.ReplaceOldest},
		MaxFailures: 3, Timeout: time.Minute,
		Work: func(ctx context.Context, run *jobs.Run, in render) (rendered, error) {
			if err := run.Progress("layout", "laying out "+in.Doc, jobs.ProgressStarted); err != nil {
				return rendered{}, err
			}
			return rendered{Pages: 12}, nil
		},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	// The key takes one job running and one waiting: two queued before any
	// runs, and the third replaces the oldest.
	for _, id := range []string{"r1", "r2", "r3"} {
		res, err := client.Enqueue(ctx, jobs.EnqueueRequest{
			ID: id, ChannelID: "docs", Type: "render", TargetKey: id,
			IdempotencyKey: id, Fingerprint: id, Input: []byte(`{"doc":"manual"}`),
		})
		var rej *jobs.RejectedError
		switch {
		case errors.As(err, &rej):
			fmt.Println(id, "rejected:", rej.Reason)
		case err != nil:
			fmt.Println(err)
			return
		case res.Replaced != nil:
			fmt.Println(id, res.Outcome, res.Replaced.ID, "on key", res.Key)
		default:
			fmt.Println(id, res.Outcome, "on key", res.Key)
		}
	}
	if err := client.Start(ctx); err != nil {
		fmt.Println(err)
		return
	}
	defer client.Stop(ctx)
	for _, id := range []string{"r1", "r2", "r3"} {
		for {
			d, err := client.Get(ctx, "docs", id)
			if err != nil {
				fmt.Println(err)
				return
			}
			if !d.Job.State.Active() {
				out := d.Job.Reason
				if d.Artifact != nil {
					out = string(d.Artifact.Value)
				}
				fmt.Println(id, d.Job.State, out)
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	// Output:
	// r1 accepted on key doc:manual
	// r2 accepted on key doc:manual
	// r3 replaced r1 on key doc:manual
	// r1 superseded replaced
	// r2 completed {"pages":12}
	// r3 completed {"pages":12}
}
