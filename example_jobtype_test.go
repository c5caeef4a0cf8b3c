package jobkeys_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/jobkeys/jobkeys"
)

// A producer and a worker share one handle per job type: the service, the
// job type and the policy are bound once, and every call takes the job.
func ExampleKeyCoordinator_JobType() {
	coord, err := jobkeys.NewCoordinator(jobkeys.NewMemoryStore(), nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	jt, err := coord.JobType("docs", "render", jobkeys.Policy{Key: []string{"/doc"}})
	if err != nil {
		fmt.Println(err)
		return
	}
	p := jt.Policy() // defaults filled in
	fmt.Println(jt.Service(), jt.Name(), p.MaxActive, p.HeartbeatInterval, p.HeartbeatTTL, p.WhenFull)

	// A bad name or policy is an error when the handle is made, never later.
	_, err = coord.JobType("docs", "render.pdf", jobkeys.Policy{Key: []string{"/doc"}})
	fmt.Println(errors.Is(err, jobkeys.ErrInvalidName))
	_, err = coord.JobType("docs", "render", jobkeys.Policy{Key: []string{"/doc"}, MaxActive: -1})
	fmt.Println(err)
	// Output:
	// docs render 1 30s 2m0s reject
	// true
	// jobkeys: invalid policy: field MaxActive: -1 is less than 1
}

// With ReplaceOldest a full queue drops its oldest waiting job for the new
// one; RestoreReplaced undoes that when the new job cannot be published.
func ExampleJobType_Admit() {
	ctx := context.Background()
	coord, err := jobkeys.NewCoordinator(jobkeys.NewMemoryStore(), nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	jt, err := coord.JobType("docs", "render", jobkeys.Policy{Key: []string{"/doc"}, MaxActive: 1, WhenFull: jobkeys.ReplaceOldest})
	if err != nil {
		fmt.Println(err)
		return
	}
	payload := []byte(`{"doc":"d-7"}`)
	for _, id := range []string{"render-1", "render-2"} {
		adm, err := jt.Admit(ctx, id, payload)
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Println(id, adm.Kind)
		if adm.Kind == jobkeys.KindReplaced {
			fmt.Println("  dropped", adm.Replaced.ID)
			// Say render-2's publish failed: put render-1 back.
			res, err := jt.RestoreReplaced(ctx, id, payload, *adm.Replaced)
			if err != nil {
				fmt.Println(err)
				return
			}
			fmt.Println("  restored; first in the queue:", res.State.Queued[0].JobID)
		}
	}
	// A strict create never replaces.
	adm, err := jt.Admit(ctx, "render-3", payload, jobkeys.WithStrictCreate())
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("render-3", adm.Kind, adm.Reason)
	// Output:
	// render-1 accepted
	// render-2 replaced
	//   dropped render-1
	//   restored; first in the queue: render-1
	// render-3 rejected queue-depth
}

// A job that is not queued cannot take a slot, unless it is a retry of a job
// that ran before and released its slot.
func ExampleJobType_Acquire() {
	ctx := context.Background()
	coord, err := jobkeys.NewCoordinator(jobkeys.NewMemoryStore(), &jobkeys.Config{InstanceID: "worker-1"})
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

	acq, err := jt.Acquire(ctx, "sync-1", payload)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(acq.Kind, acq.Reason)

	acq, err = jt.Acquire(ctx, "sync-1", payload, jobkeys.WithRetry(), jobkeys.WithTries(2))
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(acq.Kind, acq.Lease.JobID, acq.Lease.Key, acq.State.Active[0].Tries, acq.State.Active[0].InstanceID)
	if _, err := jt.Release(ctx, acq.Lease); err != nil {
		fmt.Println(err)
	}
	// Output:
	// blocked not-queued
	// acquired sync-1 a-42 2 worker-1
}
