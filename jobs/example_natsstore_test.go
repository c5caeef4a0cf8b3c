package jobs_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jobkeys/jobkeys/jobs"
)

// The job store on NATS: a JetStream-enabled server (embedded here, as
// examples/ start one; in production the URL of yours) and one bucket for
// every job record, created on request. Without WithCreateBucket the bucket
// must exist.
func ExampleNewNATSStore() {
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
	nc, err := nats.Connect(srv.ClientURL()) // nats.Connect("nats://your-server:4222", ...)
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

	_, err = jobs.NewNATSStore(js, nil)
	fmt.Println("no bucket:", errors.Is(err, jobs.ErrNotFound))

	// Memory storage for the example; FileStorage (and 3 replicas on a
	// cluster) in production.
	store, err := jobs.NewNATSStore(js, nil, jobs.WithCreateBucket(jetstream.MemoryStorage, 1))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer store.Close(ctx) // waits for the background purges of finished jobs

	out, err := store.Enqueue(ctx, jobs.EnqueueRequest{
		ID: "render-1", ChannelID: "acme", Type: "render", Version: 1,
		TargetKey: "doc-42", IdempotencyKey: "doc-42@v7", Fingerprint: "sha256:aa",
		Input: json.RawMessage(`{"doc":42}`),
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("enqueued", out.Job.ID, out.Job.State, "in bucket", store.Bucket())
	claimed, err := store.Claim(ctx, jobs.ClaimRequest{Owner: "worker-1", Count: 10, TTL: time.Minute})
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, job := range claimed {
		done, err := store.Settle(ctx, jobs.SettleRequest{Claim: jobs.ClaimOf(job), Artifact: json.RawMessage(`{"pages":3}`)})
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Println("settled", done.Job.ID, done.Job.State, string(done.Artifact.Value))
	}
	// Output:
	// no bucket: true
	// enqueued render-1 pending in bucket JOBKEYS_JOBS
	// settled render-1 completed {"pages":3}
}
