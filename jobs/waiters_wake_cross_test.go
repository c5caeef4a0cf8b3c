package jobs_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jobkeys/jobkeys"
	"github.com/jobkeys/jobkeys/internal/natstest"
	"github.com/jobkeys/jobkeys/jobs"
)

// TestClientPerKeyConcurrencyAcrossClientsWakeUps is
// TestClientPerKeyConcurrencyAcrossClients over key stores with targeted
// wake-ups: three clients on their own connections, whose blocked jobs
// wait for their own jobs' wake-ups. Per-key concurrency never exceeds
// MaxActive, audited from the handlers' start and end times; every job
// completes exactly once; and with rechecks a minute apart they all
// complete well within that (only wake-ups move the queues on).
func TestClientPerKeyConcurrencyAcrossClientsWakeUps(t *testing.T) {
	t.Parallel()
	srv := natstest.Run(t)
	n := runtimeSeq.Add(1)
	bucket, service := fmt.Sprintf("JOBS_WX%d", n), fmt.Sprintf("wx%d", n)
	p := jobkeys.Policy{Key: []string{"doc", "/doc"}, MaxActive: 2, MaxQueuedPerKey: 100}
	audit := newKeyAudit()
	clients := make([]*jobs.Client, 3)
	for i := range clients {
		_, js := natstest.Connect(t, srv)
		st, err := jobs.NewNATSStore(js, nil, jobs.WithBucket(bucket), jobs.WithCreateBucket(jetstream.MemoryStorage, 1))
		require.NoError(t, err)
		ks, err := jobkeys.NewNATSStore(js, jobkeys.WithCreateBuckets(jetstream.MemoryStorage, 1), jobkeys.WithWakeUps(""))
		require.NoError(t, err)
		coord, err := jobkeys.NewCoordinator(ks, nil)
		require.NoError(t, err)
		c, err := jobs.NewClient(st, coord, &jobs.ClientConfig{KeyStore: ks, Service: service, MaxWorkers: 4,
			PollInterval: 50 * time.Millisecond, RecheckInterval: time.Minute, ReconcileInterval: -1, StopGrace: 2 * time.Second})
		require.NoError(t, err)
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			assert.NoError(t, c.Stop(ctx))
		})
		require.NoError(t, jobs.Register(c, jobs.Kind[docIn, docOut]{
			Type: "work", Policy: p,
			Work: audit.work(fmt.Sprint(i)),
		}))
		clients[i] = c
	}
	ctx := context.Background()
	var ids []string
	for i := range 30 {
		req := enqueueReq("work", fmt.Sprintf("w%02d", i), fmt.Sprintf("t%d", i), fmt.Sprintf("k%d", i%3))
		req.Input = json.RawMessage(fmt.Sprintf(`{"doc":"k%d","n":%d}`, i%3, i))
		_, err := clients[0].Enqueue(ctx, req)
		require.NoError(t, err)
		ids = append(ids, req.ID)
	}
	for _, c := range clients {
		require.NoError(t, c.Start(ctx))
	}
	require.Eventually(t, func() bool {
		for _, id := range ids {
			d, err := clients[0].Get(ctx, "ch", id)
			if err != nil || d.Job.State != jobs.StateCompleted {
				return false
			}
		}
		return true
	}, 50*time.Second, 20*time.Millisecond, "every job completes before the first recheck")
	audit.check(t, ids, []string{"k0", "k1", "k2"}, p.MaxActive)
}
