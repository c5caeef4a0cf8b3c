package jobkeys_test

import (
	"context"
	"fmt"

	"github.com/jobkeys/jobkeys"
)

// A Watcher holds one watch per service and wakes whoever waits for a key:
// here a blocked Run, which starts the moment the holder releases the slot
// instead of polling for it.
func ExampleWatcher() {
	ctx := context.Background()
	store := jobkeys.NewMemoryStore()
	coord, err := jobkeys.NewCoordinator(store, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	jt, err := coord.JobType("billing", "sync", jobkeys.Policy{Key: []string{"tenant", "/tenant"}, MaxActive: 1, MaxQueuedPerKey: 1})
	if err != nil {
		fmt.Println(err)
		return
	}
	watcher, err := jobkeys.NewWatcher(store)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer watcher.Close()
	payload := []byte(`{"tenant":"acme"}`)

	// Anyone may subscribe to a key's changes.
	key, err := jt.Key(payload)
	if err != nil {
		fmt.Println(err)
		return
	}
	sub, err := watcher.Subscribe(ctx, jt.Service(), key.KVKey)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer sub.Close()
	for _, id := range []string{"sync-1", "sync-2"} {
		if _, err := jt.Admit(ctx, id, payload); err != nil {
			fmt.Println(err)
			return
		}
	}
	<-sub.Changed()
	fmt.Println("key", key.Key, "changed")

	// A Runner with the watcher waits for the key to change.
	blocked := make(chan jobkeys.Reason, 1)
	runner, err := jobkeys.NewRunner(jt, &jobkeys.RunnerConfig{
		Watcher:   watcher,
		OnBlocked: func(jobID string, a jobkeys.Acquisition) { blocked <- a.Reason },
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	holder, err := jt.Acquire(ctx, "sync-1", payload)
	if err != nil {
		fmt.Println(err)
		return
	}
	ran := make(chan string, 1)
	done := make(chan error, 1)
	go func() {
		_, err := runner.Run(ctx, "sync-2", payload, func(ctx context.Context, lease jobkeys.Lease) error {
			ran <- lease.JobID
			return nil
		})
		done <- err
	}()
	fmt.Println("sync-2 waits:", <-blocked)
	if _, err := jt.Release(ctx, holder.Lease); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("sync-1 released")
	fmt.Println(<-ran, "ran")
	fmt.Println(<-done)
	// Output:
	// key tenant:acme changed
	// sync-2 waits: active-limit
	// sync-1 released
	// sync-2 ran
	// <nil>
}
