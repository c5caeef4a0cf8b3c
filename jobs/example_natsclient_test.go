package jobs_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jobkeys/jobkeys"
	"github.com/jobkeys/jobkeys/jobs"
)

// The runtime on NATS in one call: NewNATSClient opens (and creates) the
// job bucket and the key bucket and makes the key coordinator. A job
// needs only its Type and Input: its id, channel, target, idempotency key
// and fingerprint default.
func ExampleNewNATSClient() {
	// An embedded server for the example; in production, connect to yours.
	dir, err := os.MkdirTemp("", "jobs-example")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer os.RemoveAll(dir)
	srv, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: dir, NoLog: true, NoSigs: true})
	if err != nil {
		fmt.Println(err)
		return
	}
	srv.Start()
	defer srv.WaitForShutdown()
	defer srv.Shutdown()
	if !srv.ReadyForConnections(10 * time.Second) {
		fmt.Println("the server did not start")
		return
	}

	nc, err := nats.Connect(srv.ClientURL()) // nats.Connect("nats://your-server:4222")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		fmt.Println(err)
		return
	}
	ctx := context.Background()
	client, err := jobs.NewNATSClient(js, nil) // or &jobs.ClientConfig{...}
	if err != nil {
		fmt.Println(err)
		return
	}
	defer client.Stop(ctx)

	type render struct {
		Doc string `json:"doc"`
	}
	type rendered struct {
		Pages int `json:"pages"`
	}
	err = jobs.Register(client, jobs.Kind[render, rendered]{
		Type: "render",
		// At most one render per document at a time.
		Policy: jobkeys.Policy{Key: []string{"doc", "/doc"}, MaxActive: 1, MaxQueuedPerKey: 10},
		Work: func(ctx context.Context, run *jobs.Run, in render) (rendered, error) {
			return rendered{Pages: 12}, nil
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

	res, err := client.Enqueue(ctx, jobs.EnqueueRequest{Type: "render", Input: json.RawMessage(`{"doc":"42"}`)})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("enqueued:", res.Outcome, "in channel", res.Job.ChannelID, "on key", res.Key)

	// Wait for the job to be over (a real producer does not wait).
	for range 500 {
		d, err := client.Get(ctx, res.Job.ChannelID, res.Job.ID)
		if err != nil {
			fmt.Println(err)
			return
		}
		if d.Job.State == jobs.StateCompleted {
			fmt.Println("completed:", string(d.Artifact.Value))
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	fmt.Println("not completed in 10s")
	// Output:
	// enqueued: accepted in channel default on key doc:42
	// completed: {"pages":12}
}
