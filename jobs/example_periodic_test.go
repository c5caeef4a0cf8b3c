package jobs_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/jobkeys/jobkeys"
	"github.com/jobkeys/jobkeys/jobs"
)

// ExamplePeriodic runs a report every hour: a client that starts enqueues
// the latest tick at once (the catch-up), then one job per hour, however
// many clients share the schedule.
func ExamplePeriodic() {
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
	client, err := jobs.NewClient(store, coord, &jobs.ClientConfig{
		KeyStore: keys,
		Periodic: []jobs.Periodic{
			{Name: "hourly-report", Type: "report", Input: json.RawMessage(`{"scope":"all"}`), Every: time.Hour},
			// or a five-field cron expression, in UTC: Cron: "0 3 * * *"
		},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	type report struct {
		Scope string `json:"scope"`
	}
	ran := make(chan jobs.Job, 1)
	err = jobs.Register(client, jobs.Kind[report, struct{}]{
		Type: "report", Version: 1,
		Policy: jobkeys.Policy{Key: []string{"report", "/scope"}, MaxActive: 1, MaxQueuedPerKey: 1},
		Work: func(ctx context.Context, run *jobs.Run, in report) (struct{}, error) {
			ran <- run.Job()
			return struct{}{}, nil
		},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := client.Start(ctx); err != nil {
		fmt.Println(err)
		return
	}
	defer client.Stop(ctx)
	j := <-ran
	fmt.Println("channel:", j.ChannelID)
	fmt.Println("origin:", j.Origin)
	fmt.Println("id names the schedule and its tick:", strings.HasPrefix(j.ID, "periodic-hourly-report-"))
	// Output:
	// channel: default
	// origin: periodic
	// id names the schedule and its tick: true
}
