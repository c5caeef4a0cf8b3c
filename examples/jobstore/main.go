// Command jobstore walks through the job store (package jobs) over NATS
// JetStream KV on an embedded server: enqueue, an idempotent replay, a
// newer job superseding an older one for the same target, claim, progress,
// settle with an artifact, and a worker that crashes holding a claim whose
// job another worker reclaims once the claim's TTL runs out.
//
//	go run ./examples/jobstore
package main

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

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "jobstore:", err)
		os.Exit(1)
	}
}

// startServer starts an embedded JetStream server with its storage in a
// temporary directory; stop shuts it down and removes the directory.
func startServer() (srv *server.Server, stop func(), err error) {
	dir, err := os.MkdirTemp("", "jobstore-example-*")
	if err != nil {
		return nil, nil, err
	}
	srv, err = server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: dir, NoLog: true, NoSigs: true})
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, nil, err
	}
	stop = func() {
		srv.Shutdown()
		srv.WaitForShutdown()
		_ = os.RemoveAll(dir)
	}
	go srv.Start()
	if !srv.ReadyForConnections(10*time.Second) || !srv.JetStreamEnabled() {
		stop()
		return nil, nil, errors.New("embedded NATS server did not start with JetStream")
	}
	return srv, stop, nil
}

func run() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	srv, stop, err := startServer()
	if err != nil {
		return err
	}
	defer stop()
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	store, err := jobs.NewNATSStore(js, nil, jobs.WithCreateBucket(jetstream.FileStorage, 1))
	if err != nil {
		return err
	}
	fmt.Printf("job store in KV bucket %s on the embedded server at %s\n\n", store.Bucket(), srv.ClientURL())

	// 1. Enqueue a job for target "doc-1".
	req := jobs.EnqueueRequest{
		ID: "render-1", ChannelID: "workspace-7", Type: "render", Version: 1, Origin: "user",
		TargetKey: "doc-1", IdempotencyKey: "doc-1@v1", Fingerprint: "sha256:aa11",
		Input: json.RawMessage(`{"doc":"doc-1","rev":1}`),
	}
	first, err := store.Enqueue(ctx, req)
	if err != nil {
		return err
	}
	fmt.Printf("1. enqueue   %s: %s, target %s generation %d, revision %d\n",
		first.Job.ID, first.Job.State, first.Job.TargetKey, first.Job.TargetGeneration, first.Job.Revision)

	// 2. The same request again (a retried HTTP call, say) is a replay.
	again, err := store.Enqueue(ctx, req)
	if err != nil {
		return err
	}
	fmt.Printf("2. replay    %s: repeated=%t, still revision %d (nothing written)\n", again.Job.ID, again.Repeated, again.Job.Revision)
	conflicting := req
	conflicting.Fingerprint = "sha256:bb22"
	if _, err := store.Enqueue(ctx, conflicting); errors.Is(err, jobs.ErrConflict) {
		fmt.Printf("   the same idempotency key with another fingerprint is a conflict:\n     %v\n", err)
	} else {
		return fmt.Errorf("replay with another fingerprint: got %v, want a conflict", err)
	}

	// 3. A newer job for the same target supersedes the older one.
	newer := req
	newer.ID, newer.IdempotencyKey, newer.Fingerprint = "render-2", "doc-1@v2", "sha256:cc33"
	newer.Input = json.RawMessage(`{"doc":"doc-1","rev":2}`)
	second, err := store.Enqueue(ctx, newer)
	if err != nil {
		return err
	}
	old, err := store.Get(ctx, "workspace-7", "render-1")
	if err != nil {
		return err
	}
	fmt.Printf("3. supersede %s: %s, generation %d; %s is now %s (same change, revision %d)\n",
		second.Job.ID, second.Job.State, second.Job.TargetGeneration, old.Job.ID, old.Job.State, old.Job.Revision)

	// 4. A worker claims due jobs: only render-2 is left to run.
	claimed, err := store.Claim(ctx, jobs.ClaimRequest{ChannelID: "workspace-7", Owner: "worker-a", Count: 10, TTL: 30 * time.Second})
	if err != nil {
		return err
	}
	if len(claimed) != 1 {
		return fmt.Errorf("claimed %d jobs, want 1", len(claimed))
	}
	job := claimed[0]
	fmt.Printf("4. claim     worker-a holds %s: %s, attempt %d, claim generation %d, expires %s\n",
		job.ID, job.State, job.Attempts, job.ClaimGeneration, job.ClaimExpiresAt.Format(time.TimeOnly))

	// 5. It reports progress, then settles with an artifact.
	job, err = store.AppendProgress(ctx, jobs.ProgressRequest{Claim: jobs.ClaimOf(job), Stage: "rasterize", Label: "page 1 of 3", State: jobs.ProgressStarted})
	if err != nil {
		return err
	}
	fmt.Printf("5. progress  %s: %q %s (%d entry)\n", job.ID, job.Progress[0].Label, job.Progress[0].State, len(job.Progress))
	done, err := store.Settle(ctx, jobs.SettleRequest{Claim: jobs.ClaimOf(job), Artifact: json.RawMessage(`{"pdf":"s3://out/doc-1-v2.pdf"}`)})
	if err != nil {
		return err
	}
	fmt.Printf("   settle    %s: %s, artifact %s\n", done.Job.ID, done.Job.State, done.Artifact.Value)

	// 6. A worker claims a job with a short TTL and crashes: it never
	// renews or settles. Once the claim expires, another worker reclaims
	// the job; the crashed worker's claim is fenced off.
	crashReq := jobs.EnqueueRequest{
		ID: "render-3", ChannelID: "workspace-7", Type: "render", Version: 1, Origin: "scheduler",
		TargetKey: "doc-2", IdempotencyKey: "doc-2@v1", Fingerprint: "sha256:dd44",
		Input: json.RawMessage(`{"doc":"doc-2","rev":1}`),
	}
	if _, err := store.Enqueue(ctx, crashReq); err != nil {
		return err
	}
	lost, err := store.Claim(ctx, jobs.ClaimRequest{ChannelID: "workspace-7", Owner: "worker-b", Count: 1, TTL: 500 * time.Millisecond})
	if err != nil || len(lost) != 1 {
		return fmt.Errorf("worker-b claim: %v (%d jobs)", err, len(lost))
	}
	fmt.Printf("6. claim     worker-b holds %s for 500ms, then crashes\n", lost[0].ID)
	time.Sleep(600 * time.Millisecond)
	taken, err := store.Claim(ctx, jobs.ClaimRequest{ChannelID: "workspace-7", Owner: "worker-c", Count: 1, TTL: 30 * time.Second})
	if err != nil || len(taken) != 1 {
		return fmt.Errorf("worker-c reclaim: %v (%d jobs)", err, len(taken))
	}
	fmt.Printf("   reclaim   worker-c holds %s: attempt %d, claim generation %d\n", taken[0].ID, taken[0].Attempts, taken[0].ClaimGeneration)
	if _, err := store.Settle(ctx, jobs.SettleRequest{Claim: jobs.ClaimOf(lost[0])}); errors.Is(err, jobs.ErrConflict) {
		fmt.Printf("   worker-b's late settle is refused:\n     %v\n", err)
	} else {
		return fmt.Errorf("late settle of a reclaimed job: got %v, want a conflict", err)
	}
	if _, err := store.Settle(ctx, jobs.SettleRequest{Claim: jobs.ClaimOf(taken[0]), Artifact: json.RawMessage(`{"pdf":"s3://out/doc-2-v1.pdf"}`)}); err != nil {
		return err
	}

	// 7. The channel's jobs, newest first.
	page, err := store.List(ctx, jobs.ListRequest{ChannelID: "workspace-7", Limit: 20})
	if err != nil {
		return err
	}
	fmt.Printf("\n7. list      workspace-7 at revision %d:\n", page.Revision)
	for _, j := range page.Jobs {
		fmt.Printf("     %-9s %-10s target %s generation %d, attempts %d\n", j.ID, j.State, j.TargetKey, j.TargetGeneration, j.Attempts)
	}
	return nil
}
