package jobs_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jobkeys/jobkeys"
	"github.com/jobkeys/jobkeys/jobs"
)

// A batch of enqueues: one result per request, in order; a request that
// fails fails alone. A producer's kind needs no Work.
func ExampleClient_EnqueueMany() {
	ctx := context.Background()
	store, err := jobs.NewMemoryStore(nil) // NewNATSClient(js, cfg) on NATS
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
	client, err := jobs.NewClient(store, coord, &jobs.ClientConfig{KeyStore: keys})
	if err != nil {
		fmt.Println(err)
		return
	}
	type render struct {
		Doc string `json:"doc"`
	}
	err = jobs.Register(client, jobs.Kind[render, struct{}]{
		Type: "render",
		// One render per document at a time, one more waiting; a third is rejected.
		Policy: jobkeys.Policy{Key: []string{"doc", "/doc"}, MaxActive: 1, MaxQueuedPerKey: 1, WhenFull: jobkeys.Reject},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	var reqs []jobs.EnqueueRequest
	for _, doc := range []string{"a", "a", "a", "b"} {
		reqs = append(reqs, jobs.EnqueueRequest{Type: "render", Input: json.RawMessage(`{"doc":"` + doc + `"}`)})
	}
	reqs = append(reqs, jobs.EnqueueRequest{Type: "print", Input: json.RawMessage(`{"doc":"c"}`)})
	for i, r := range client.EnqueueMany(ctx, reqs) {
		var rej *jobs.RejectedError
		switch {
		case errors.As(r.Err, &rej):
			fmt.Println(i, "rejected on", rej.Key)
		case r.Err != nil:
			fmt.Println(i, "error:", errors.Is(r.Err, jobs.ErrUnknownKind))
		default:
			fmt.Println(i, r.Result.Outcome, "on", r.Result.Key)
		}
	}
	// Output:
	// 0 accepted on doc:a
	// 1 accepted on doc:a
	// 2 rejected on doc:a
	// 3 accepted on doc:b
	// 4 error: true
}
