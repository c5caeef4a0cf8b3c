package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jobkeys/jobkeys"
	"github.com/jobkeys/jobkeys/internal/natstest"
	"github.com/jobkeys/jobkeys/jobs"
)

// keyQueued returns the QUEUED column ("queued/limit") of display key
// key in "keys ls SERVICE JOBTYPE".
func keyQueued(t *testing.T, r *runner, service, jobType, key string) string {
	t.Helper()
	res := r.run("keys", "ls", service, jobType)
	require.Equal(t, exitOK, res.code, res.stderr)
	for _, l := range strings.Split(strings.TrimSpace(res.stdout), "\n")[1:] {
		if f := strings.Fields(l); len(f) > 2 && f[0] == key {
			return f[2]
		}
	}
	t.Fatalf("key %q not listed:\n%s", key, res.stdout)
	return ""
}

// TestJobsCancelRemovesQueueEntry is the regression test for "jobs
// cancel" of a waiting job with no worker running: it cancelled the
// record through the job store alone, and "keys ls" showed the key full
// (5/5) until reconciliation removed the entry. The command now cancels
// through the runtime's client, which removes the entry at once.
func TestJobsCancelRemovesQueueEntry(t *testing.T) {
	t.Parallel()
	srv := natstest.Run(t)
	_, js := natstest.Connect(t, srv)
	st, err := jobs.NewNATSStore(js, nil, jobs.WithCreateBucket(jetstream.MemoryStorage, 1))
	require.NoError(t, err)
	ks, err := jobkeys.NewNATSStore(js, jobkeys.WithCreateBuckets(jetstream.MemoryStorage, 1))
	require.NoError(t, err)
	coord, err := jobkeys.NewCoordinator(ks, nil)
	require.NoError(t, err)
	producer, err := jobs.NewClient(st, coord, &jobs.ClientConfig{KeyStore: ks}) // service "jobs"
	require.NoError(t, err)
	type in struct {
		Doc string `json:"doc"`
	}
	require.NoError(t, jobs.Register(producer, jobs.Kind[in, struct{}]{Type: "render",
		Policy: jobkeys.Policy{Key: []string{"doc", "/doc"}, MaxActive: 2, MaxQueuedPerKey: 3, WhenFull: jobkeys.Reject},
		Work:   func(context.Context, *jobs.Run, in) (struct{}, error) { return struct{}{}, nil }}))
	ctx := context.Background()
	for i := 1; i <= 5; i++ {
		id := fmt.Sprintf("K%d", i)
		_, err := producer.Enqueue(ctx, jobs.EnqueueRequest{ID: id, ChannelID: "ch", Type: "render", TargetKey: "t-" + id,
			IdempotencyKey: "idem-" + id, Fingerprint: "fp", Input: json.RawMessage(`{"doc":"d"}`)})
		require.NoError(t, err)
	}
	r := newRunner(t, srv.ClientURL())
	require.Equal(t, "5/5", keyQueued(t, r, "jobs", "render", "doc:d"))

	res := r.run("jobs", "cancel", "-f", "ch", "K1")
	require.Equal(t, exitOK, res.code, res.stderr)
	assert.Empty(t, res.stderr)
	d, err := st.Get(ctx, "ch", "K1")
	require.NoError(t, err)
	assert.Equal(t, jobs.StateCancelled, d.Job.State)
	assert.Equal(t, "4/5", keyQueued(t, r, "jobs", "render", "doc:d"), "the cancelled job's queue entry is removed")

	// Another service's keys do not hold it: nothing removed, no error.
	res = r.run("jobs", "cancel", "-f", "--service", "other", "ch", "K2")
	require.Equal(t, exitOK, res.code, res.stderr)
	assert.Empty(t, res.stderr, "a service without a bucket queues nothing")
	assert.Equal(t, "4/5", keyQueued(t, r, "jobs", "render", "doc:d"))
	res = r.run("jobs", "cancel", "-f", "--service", "", "ch", "K3")
	assert.Equal(t, exitUsage, res.code, res.stderr)
}
