package jobkeys_test

import (
	"context"
	"fmt"
	"time"

	"github.com/jobkeys/jobkeys"
)

// One tenant, one slot and one waiting place: the third job is rejected, the
// second waits until the first releases its slot.
func Example() {
	ctx := context.Background()
	coord, err := jobkeys.NewCoordinator(jobkeys.NewMemoryStore(), &jobkeys.Config{InstanceID: "worker-1"})
	if err != nil {
		fmt.Println(err)
		return
	}
	// Bind the job type once: names and policy are checked here.
	jt, err := coord.JobType("billing", "sync", jobkeys.Policy{Key: []string{"tenant", "/tenant"}, MaxActive: 1, MaxQueuedPerKey: 1})
	if err != nil {
		fmt.Println(err)
		return
	}
	payload := []byte(`{"tenant":"acme"}`)

	for _, id := range []string{"job-1", "job-2", "job-3"} {
		adm, err := jt.Admit(ctx, id, payload)
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Println("admit", id, outcome(adm.Kind, adm.Reason))
	}

	acquire := func(id string) jobkeys.Acquisition {
		acq, err := jt.Acquire(ctx, id, payload)
		if err != nil {
			fmt.Println(err)
		}
		fmt.Println("acquire", id, acq.Key, outcome(acq.Kind, acq.Reason))
		return acq
	}
	first := acquire("job-1")
	acquire("job-2")

	rel, err := jt.Release(ctx, first.Lease)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("release job-1", rel.Kind)
	acquire("job-2")
	// Output:
	// admit job-1 accepted
	// admit job-2 accepted
	// admit job-3 rejected queue-depth
	// acquire job-1 tenant:acme acquired
	// acquire job-2 tenant:acme blocked active-limit
	// release job-1 released
	// acquire job-2 tenant:acme acquired
}

func outcome(k jobkeys.Kind, r jobkeys.Reason) string {
	if r == "" {
		return string(k)
	}
	return string(k) + " " + string(r)
}

// The reducers are pure: the same state, request, policy, time and token
// give the same outcome.
func ExampleReduceAdmission() {
	policy, err := jobkeys.Policy{Key: []string{"/doc"}, MaxActive: 1, WhenFull: jobkeys.ReplaceOldest}.Normalize()
	if err != nil {
		fmt.Println(err)
		return
	}
	key, err := jobkeys.DeriveKey("docs", "render", []byte(`{"doc":"d-7"}`), policy.Key)
	if err != nil {
		fmt.Println(err)
		return
	}
	now := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)

	first := jobkeys.ReduceAdmission(nil, key, jobkeys.AdmitRequest{JobID: "render-1"}, policy, now)
	second := jobkeys.ReduceAdmission(first.State, key, jobkeys.AdmitRequest{JobID: "render-2"}, policy, now.Add(time.Second))
	fmt.Println(first.Kind, len(first.State.Queued))
	fmt.Println(second.Kind, second.Replaced.ID, second.State.Queued[0].JobID)
	// Output:
	// accepted 1
	// replaced render-1 render-2
}

// Policy.Normalize fills defaults and names the field it rejects.
func ExamplePolicy_Normalize() {
	p, err := jobkeys.Policy{Key: []string{"/account"}}.Normalize()
	fmt.Println(p.MaxActive, p.HeartbeatInterval, p.HeartbeatTTL, p.StalePolicy, p.WhenFull, err)

	_, err = jobkeys.Policy{Key: []string{"/account"}, HeartbeatInterval: time.Minute, HeartbeatTTL: time.Minute}.Normalize()
	fmt.Println(err)
	// Output:
	// 1 30s 2m0s fail-stale reject <nil>
	// jobkeys: invalid policy: field HeartbeatTTL: 1m0s does not exceed HeartbeatInterval 1m0s
}
