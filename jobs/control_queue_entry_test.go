package jobs_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jobkeys/jobkeys"
	"github.com/jobkeys/jobkeys/jobs"
)

// TestClientControlCallsRemoveQueueEntry shows that cancelling or
// superseding a waiting job through a client frees its place in its
// key's queue at once (no worker runs, no reconciliation): through the
// kind's key in a client that registered the kind, and by reading the
// type's keys in one that did not (an operator's tool, as the CLI's
// "jobs cancel"), which used to leave the entry, and the key full, until
// reconciliation. A paused job keeps its place (it runs after Resume).
func TestClientControlCallsRemoveQueueEntry(t *testing.T) {
	t.Parallel()
	env := newRuntimeEnv(t)
	policy := jobkeys.Policy{Key: []string{"doc", "/doc"}, MaxActive: 2, MaxQueuedPerKey: 3, WhenFull: jobkeys.Reject}
	producer := env.newNode(jobs.ClientConfig{}, nil)
	require.NoError(t, jobs.Register(producer.client, jobs.Kind[docIn, docOut]{Type: "ctl", Policy: policy, Work: noWork}))
	operator := env.newNode(jobs.ClientConfig{}, nil) // no kinds
	ctx := context.Background()
	for i := 1; i <= 5; i++ {
		_, err := producer.client.Enqueue(ctx, enqueueReq("ctl", fmt.Sprintf("K%d", i), fmt.Sprintf("t%d", i), "d"))
		require.NoError(t, err)
	}
	_, err := producer.client.Enqueue(ctx, enqueueReq("ctl", "full", "t-full", "d"))
	require.ErrorIs(t, err, jobs.ErrRejected, "the key holds five jobs")
	queued := func() []string {
		q, _ := queuedOn(t, producer, env.service, "ctl", policy, "d")
		return q
	}
	supersede := func(n *node, id string) {
		t.Helper()
		j := getJob(t, n, id)
		_, err := n.client.Supersede(ctx, jobs.SupersedeRequest{ChannelID: "ch", JobID: id, ExpectedRevision: j.Revision, Reason: "test"})
		require.NoError(t, err)
	}

	_, err = producer.client.Cancel(ctx, jobs.CancelRequest{ChannelID: "ch", JobID: "K1"})
	require.NoError(t, err)
	assert.Equal(t, []string{"ch/K2", "ch/K3", "ch/K4", "ch/K5"}, queued(), "cancel, with the kind")
	supersede(producer, "K2")
	assert.Equal(t, []string{"ch/K3", "ch/K4", "ch/K5"}, queued(), "supersede, with the kind")

	_, err = operator.client.Cancel(ctx, jobs.CancelRequest{ChannelID: "ch", JobID: "K3"})
	require.NoError(t, err)
	assert.Equal(t, []string{"ch/K4", "ch/K5"}, queued(), "cancel, without the kind")
	supersede(operator, "K4")
	assert.Equal(t, []string{"ch/K5"}, queued(), "supersede, without the kind")

	j := getJob(t, producer, "K5")
	_, err = operator.client.Pause(ctx, jobs.PauseRequest{ChannelID: "ch", JobID: "K5", ExpectedRevision: j.Revision, Reason: "hold"})
	require.NoError(t, err)
	assert.Equal(t, []string{"ch/K5"}, queued(), "a paused job keeps its place")

	for i := 6; i <= 9; i++ {
		_, err := producer.client.Enqueue(ctx, enqueueReq("ctl", fmt.Sprintf("K%d", i), fmt.Sprintf("t%d", i), "d"))
		require.NoError(t, err, "the freed places take new jobs")
	}
	_, err = producer.client.Enqueue(ctx, enqueueReq("ctl", "full2", "t-full2", "d"))
	require.ErrorIs(t, err, jobs.ErrRejected)
}
