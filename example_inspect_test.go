package jobkeys_test

import (
	"context"
	"fmt"
	"time"

	"github.com/jobkeys/jobkeys"
)

// An operator lists a job type's keys with their occupancy.
func ExampleKeyCoordinator_InspectKeys() {
	ctx := context.Background()
	now := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	coord, err := jobkeys.NewCoordinator(jobkeys.NewMemoryStore(), &jobkeys.Config{Now: func() time.Time { return now }})
	if err != nil {
		fmt.Println(err)
		return
	}
	jt, err := coord.JobType("billing", "sync", jobkeys.Policy{Key: []string{"/account"}, MaxQueuedPerKey: 2})
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, id := range []string{"sync-1", "sync-2"} {
		if _, err := jt.Admit(ctx, id, []byte(`{"account":"a-42"}`)); err != nil {
			fmt.Println(err)
			return
		}
	}
	if _, err := jt.Acquire(ctx, "sync-1", []byte(`{"account":"a-42"}`)); err != nil {
		fmt.Println(err)
		return
	}
	keys, err := coord.InspectKeys(ctx, "billing", "sync")
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, k := range keys {
		fmt.Printf("%s active %d/%d queued %d/%d next expiry %s\n",
			k.DisplayKey, k.Active, k.MaxActive, k.Queued, k.QueueLimit, k.NextLeaseExpiry.Format(time.TimeOnly))
	}
	// Output:
	// a-42 active 1/1 queued 1/2 next expiry 10:02:00
}

// An operator follows a job type's keys: the keys as they are, then each
// change of occupancy; the renewal in between is not an event.
func ExampleKeyCoordinator_WatchOccupancy() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	coord, err := jobkeys.NewCoordinator(jobkeys.NewMemoryStore(), nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	jt, err := coord.JobType("billing", "sync", jobkeys.Policy{Key: []string{"/account"}})
	if err != nil {
		fmt.Println(err)
		return
	}
	payload := []byte(`{"account":"a-42"}`)
	if _, err := jt.Admit(ctx, "sync-1", payload); err != nil {
		fmt.Println(err)
		return
	}
	w, err := coord.WatchOccupancy(ctx, "billing", "sync")
	if err != nil {
		fmt.Println(err)
		return
	}
	print := func() {
		ch := <-w.Changes()
		fmt.Printf("%s initial=%t deleted=%t active %d queued %d\n", ch.Info.DisplayKey, ch.Initial, ch.Deleted, ch.Info.Active, ch.Info.Queued)
	}
	print()
	acq, err := jt.Acquire(ctx, "sync-1", payload)
	if err != nil {
		fmt.Println(err)
		return
	}
	print()
	if _, err := jt.Renew(ctx, acq.Lease); err != nil {
		fmt.Println(err)
		return
	}
	if _, err := jt.Release(ctx, acq.Lease); err != nil {
		fmt.Println(err)
		return
	}
	print()
	cancel()
	for range w.Changes() {
	}
	fmt.Println(w.Err())
	// Output:
	// a-42 initial=true deleted=false active 0 queued 1
	// a-42 initial=false deleted=false active 1 queued 0
	//  initial=false deleted=true active 0 queued 0
	// context canceled
}
