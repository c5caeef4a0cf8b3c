package jobs_test

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/jobkeys/jobkeys"
	"github.com/jobkeys/jobkeys/jobs"
)

// fencedTarget is an external system that takes a fencing token with each
// write and refuses a write whose token is lower than one it has seen
// for the same key (a database row with a token column, an object store
// with a conditional write).
type fencedTarget struct {
	mu     sync.Mutex
	tokens map[string]uint64
	values map[string]string
}

func (t *fencedTarget) Put(key string, token uint64, value string) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if token < t.tokens[key] {
		return fmt.Errorf("write of %s with token %d refused: token %d has written", key, token, t.tokens[key])
	}
	t.tokens[key], t.values[key] = token, value
	return nil
}

// The claim's generation is the fencing token a handler hands to the
// systems it writes to: every claim of a job has a higher one than the
// claims before it. A handler whose claim was lost without its knowing
// (its process stopped past the claim's TTL while another worker took the
// job) may still reach the target; the token lets the target refuse it.
// Check the context right before the write too: past the claim's local
// deadline it has ended with ErrClaimLost.
func ExampleRun_Job_fencing() {
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
	target := &fencedTarget{tokens: map[string]uint64{}, values: map[string]string{}}
	type publish struct {
		Doc string `json:"doc"`
	}
	err = jobs.Register(client, jobs.Kind[publish, uint64]{
		Type: "publish", Version: 1,
		Policy: jobkeys.Policy{Key: []string{"doc", "/doc"}},
		Work: func(ctx context.Context, run *jobs.Run, in publish) (uint64, error) {
			token := run.Job().ClaimGeneration
			// ... the work ...
			if err := ctx.Err(); err != nil {
				return 0, context.Cause(ctx) // the claim is lost, or the job stopped: no effect
			}
			return token, target.Put(in.Doc, token, "published")
		},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	if _, err := client.Enqueue(ctx, jobs.EnqueueRequest{
		ID: "p1", ChannelID: "docs", Type: "publish", TargetKey: "p1",
		IdempotencyKey: "p1", Fingerprint: "p1", Input: []byte(`{"doc":"manual"}`),
	}); err != nil {
		fmt.Println(err)
		return
	}
	if err := client.Start(ctx); err != nil {
		fmt.Println(err)
		return
	}
	defer client.Stop(ctx)
	d, err := waitOver(ctx, client, "docs", "p1")
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(d.Job.State, "with token", string(d.Artifact.Value))
	// A handler of an earlier claim, waking late, is refused.
	fmt.Println(target.Put("manual", d.Job.ClaimGeneration-1, "stale"))
	// Output:
	// completed with token 1
	// write of manual with token 0 refused: token 1 has written
}
