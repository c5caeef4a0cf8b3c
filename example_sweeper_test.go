package jobkeys_test

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/jobkeys/jobkeys"
)

// A worker crashed holding a slot, and no other job of the key comes to take
// it over: the Sweeper removes it once its lease has expired and reports the
// job, so that it can be recorded as failed.
func ExampleSweeper() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// A clock the example moves on.
	var (
		mu  sync.Mutex
		now = time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	)
	clock := func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		return now
	}
	coord, err := jobkeys.NewCoordinator(jobkeys.NewMemoryStore(), &jobkeys.Config{Now: clock})
	if err != nil {
		fmt.Println(err)
		return
	}
	jt, err := coord.JobType("billing", "sync", jobkeys.Policy{
		Key: []string{"/account"}, HeartbeatInterval: time.Second, HeartbeatTTL: 5 * time.Second})
	if err != nil {
		fmt.Println(err)
		return
	}
	payload := []byte(`{"account":"a-42"}`)
	if _, err := jt.Admit(ctx, "sync-1", payload); err != nil {
		fmt.Println(err)
		return
	}
	if _, err := jt.Acquire(ctx, "sync-1", payload, jobkeys.WithInstanceID("worker-7")); err != nil {
		fmt.Println(err)
		return
	}
	// worker-7 crashes: no more heartbeats. Ten seconds later:
	mu.Lock()
	now = now.Add(10 * time.Second)
	mu.Unlock()

	sweeper, err := jobkeys.NewSweeper(jt, time.Minute, func(rep jobkeys.SweepReport, err error) {
		for _, s := range rep.Removed {
			fmt.Println("removed", s.Slot.JobID, "of", s.Slot.InstanceID, "from key", s.Key)
		}
		fmt.Println("keys:", rep.Keys, "deleted:", rep.Deleted, "error:", err)
		cancel() // one sweep is enough here
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(sweeper.Run(ctx))
	// Output:
	// removed sync-1 of worker-7 from key a-42
	// keys: 1 deleted: 1 error: <nil>
	// context canceled
}
