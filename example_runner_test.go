package jobkeys_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/jobkeys/jobkeys"
)

// A Runner acquires the slot, renews the lease while the handler runs and
// releases the slot when it returns. While render-1 holds the document's
// only slot, render-2 is handed back at once by TryRun (Run would wait).
func ExampleRunner() {
	ctx := context.Background()
	coord, err := jobkeys.NewCoordinator(jobkeys.NewMemoryStore(), nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	jt, err := coord.JobType("docs", "render", jobkeys.Policy{Key: []string{"/doc"}, MaxActive: 1, MaxQueuedPerKey: 1})
	if err != nil {
		fmt.Println(err)
		return
	}
	runner, err := jobkeys.NewRunner(jt, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	payload := []byte(`{"doc":"d-7"}`)
	for _, id := range []string{"render-1", "render-2"} {
		if _, err := jt.Admit(ctx, id, payload); err != nil {
			fmt.Println(err)
			return
		}
	}
	render := func(ctx context.Context, lease jobkeys.Lease) error {
		fmt.Println("rendering", lease.JobID, "of", lease.Key)
		return nil
	}

	res, err := runner.Run(ctx, "render-1", payload, func(ctx context.Context, lease jobkeys.Lease) error {
		_, err := runner.TryRun(ctx, "render-2", payload, render)
		var blocked *jobkeys.BlockedError
		if errors.As(err, &blocked) {
			fmt.Println("render-2 is blocked:", blocked.Acquisition.Reason)
		}
		return render(ctx, lease)
	})
	fmt.Println("render-1:", res.Release, err)

	res, err = runner.Run(ctx, "render-2", payload, render)
	fmt.Println("render-2:", res.Release, err)
	// Output:
	// render-2 is blocked: active-limit
	// rendering render-1 of d-7
	// render-1: released <nil>
	// rendering render-2 of d-7
	// render-2: released <nil>
}
