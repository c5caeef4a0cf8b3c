package jobkeys_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sort"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jobkeys/jobkeys"
)

// The key layer on NATS: a JetStream-enabled server (here one embedded in
// the process, as examples/ start it; in production the URL of yours), a
// store that creates the bucket of each service it is asked for, and the
// same calls as on the memory store. A store without WithCreateBuckets
// fails on a bucket that does not exist, naming it.
func ExampleNewNATSStore() {
	dir, err := os.MkdirTemp("", "jobkeys-example")
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

	// Without WithCreateBuckets the bucket must exist.
	plain, err := jobkeys.NewNATSStore(js)
	if err != nil {
		fmt.Println(err)
		return
	}
	coord, err := jobkeys.NewCoordinator(plain, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	jt, err := coord.JobType("billing", "sync", jobkeys.Policy{Key: []string{"tenant", "/tenant"}})
	if err != nil {
		fmt.Println(err)
		return
	}
	payload := []byte(`{"tenant":"acme"}`)
	_, err = jt.Admit(ctx, "sync-1", payload)
	fmt.Println("no bucket:", errors.Is(err, jobkeys.ErrBucketNotFound))

	// This one creates JOBS_KEYS_billing on first use (memory storage, one
	// replica; FileStorage and 3 replicas on a production cluster).
	store, err := jobkeys.NewNATSStore(js, jobkeys.WithCreateBuckets(jetstream.MemoryStorage, 1))
	if err != nil {
		fmt.Println(err)
		return
	}
	coord, err = jobkeys.NewCoordinator(store, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	jt, err = coord.JobType("billing", "sync", jobkeys.Policy{Key: []string{"tenant", "/tenant"}})
	if err != nil {
		fmt.Println(err)
		return
	}
	adm, err := jt.Admit(ctx, "sync-1", payload)
	if err != nil {
		fmt.Println(err)
		return
	}
	acq, err := jt.Acquire(ctx, "sync-1", payload)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(adm.Kind, acq.Kind, acq.Lease.DisplayKey, "in bucket", store.BucketName("billing"))
	rel, err := jt.Release(ctx, acq.Lease)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(rel.Kind)
	// Output:
	// no bucket: true
	// accepted acquired tenant:acme in bucket JOBS_KEYS_billing
	// released
}

// DeriveKey is what a JobType does with a payload: the display key people
// read, and the KV key (with the hash of the segments) the state lives at.
func ExampleDeriveKey() {
	key, err := jobkeys.DeriveKey("billing", "sync", []byte(`{"tenant":"acme","region":"eu","n":7}`), []string{"tenant", "/tenant", "/region"})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(key.DisplayKey)
	fmt.Println(key.KVKey == "billing.sync."+key.KeyHash, len(key.KeyHash))

	// A pointer that does not resolve to a string, a finite number or a
	// boolean is an error naming it.
	_, err = jobkeys.DeriveKey("billing", "sync", []byte(`{"region":"eu"}`), []string{"/tenant"})
	fmt.Println(errors.Is(err, jobkeys.ErrInvalidKey))
	fmt.Println(err)
	// Output:
	// tenant:acme:eu
	// true 64
	// true
	// jobkeys: cannot derive job key: key pointer "/tenant" did not resolve to a string, finite number or boolean (it resolved to nothing)
}

// The keys of a job type as an operator sees them: who runs, who waits,
// against which limits.
func ExampleJobType_InspectKeys() {
	ctx := context.Background()
	now := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	coord, err := jobkeys.NewCoordinator(jobkeys.NewMemoryStore(), &jobkeys.Config{Now: func() time.Time { return now }})
	if err != nil {
		fmt.Println(err)
		return
	}
	jt, err := coord.JobType("billing", "sync", jobkeys.Policy{Key: []string{"tenant", "/tenant"}, MaxActive: 2, MaxQueuedPerKey: 1})
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, j := range []struct{ id, tenant string }{{"sync-1", "acme"}, {"sync-2", "acme"}, {"sync-3", "acme"}, {"sync-4", "globex"}} {
		if _, err := jt.Admit(ctx, j.id, fmt.Appendf(nil, `{"tenant":%q}`, j.tenant)); err != nil {
			fmt.Println(err)
			return
		}
	}
	if _, err := jt.Acquire(ctx, "sync-1", []byte(`{"tenant":"acme"}`)); err != nil {
		fmt.Println(err)
		return
	}
	keys, err := jt.InspectKeys(ctx)
	if err != nil {
		fmt.Println(err)
		return
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i].DisplayKey < keys[j].DisplayKey })
	for _, k := range keys {
		if k.Corrupt() {
			fmt.Println(k.KVKey, "cannot be read:", k.Problem)
			continue
		}
		fmt.Printf("%-14s running %d/%d, waiting %d/%d, oldest waiting %s\n",
			k.DisplayKey, k.Active, k.MaxActive, k.Queued, k.QueueLimit, k.OldestQueuedAge())
	}
	// Output:
	// tenant:acme    running 1/2, waiting 2/2, oldest waiting 0s
	// tenant:globex  running 0/2, waiting 1/3, oldest waiting 0s
}
