package jobs_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jobkeys/jobkeys"
	"github.com/jobkeys/jobkeys/internal/natstest"
	"github.com/jobkeys/jobkeys/jobs"
)

// unansweredJS is a JetStream whose first publishes of announcements go
// unanswered: the first never reaches the stream, the second is written but
// its answer is lost, as during a stream leader's election.
type unansweredJS struct {
	jetstream.JetStream
	ready atomic.Int64
}

func (j *unansweredJS) PublishMsg(ctx context.Context, msg *nats.Msg, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	if strings.Contains(msg.Subject, ".ready.") {
		switch j.ready.Add(1) {
		case 1:
			return nil, jetstream.ErrNoStreamResponse
		case 2:
			if _, err := j.JetStream.PublishMsg(ctx, msg, opts...); err != nil {
				return nil, err
			}
			return nil, nats.ErrTimeout
		}
	}
	return j.JetStream.PublishMsg(ctx, msg, opts...)
}

// TestDispatchAnnouncementOutlivesUnansweredPublishes is the regression
// test for announcements lost to an election: a publish the server did not
// answer was logged and dropped, and the job waited for reconciliation
// (here an hour). The announcement is published again under its message
// id, which the stream de-duplicates: the job runs, announced once.
func TestDispatchAnnouncementOutlivesUnansweredPublishes(t *testing.T) {
	t.Parallel()
	env := newRuntimeEnv(t)
	_, js := natstest.Connect(t, env.srv)
	st, err := jobs.NewNATSStore(js, nil, jobs.WithBucket(env.bucket), jobs.WithCreateBucket(jetstream.MemoryStorage, 1))
	require.NoError(t, err)
	ks, err := jobkeys.NewNATSStore(js, jobkeys.WithCreateBuckets(jetstream.MemoryStorage, 1))
	require.NoError(t, err)
	coord, err := jobkeys.NewCoordinator(ks, nil)
	require.NoError(t, err)
	ujs := &unansweredJS{JetStream: js}
	cfg := fastConfig
	cfg.ReconcileInterval = time.Hour
	cfg.KeyStore, cfg.Service, cfg.JetStream = ks, env.service, ujs
	c, err := jobs.NewClient(st, coord, &cfg)
	require.NoError(t, err)
	ran := make(chan string, 2)
	require.NoError(t, jobs.Register(c, jobs.Kind[docIn, docOut]{Type: "once", Policy: quickPolicy,
		Work: func(_ context.Context, run *jobs.Run, _ docIn) (docOut, error) {
			ran <- run.Job().ID
			return docOut{}, nil
		}}))
	ctx := context.Background()
	require.NoError(t, c.Start(ctx))
	t.Cleanup(func() {
		sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		assert.NoError(t, c.Stop(sctx))
	})
	_, err = c.Enqueue(ctx, enqueueReq("once", "e1", "e1", "a"))
	require.NoError(t, err)
	select {
	case id := <-ran:
		require.Equal(t, "e1", id)
	case <-time.After(60 * time.Second):
		t.Fatal("the job never ran: its announcement was lost")
	}
	waitState(t, &node{client: c}, "e1", jobs.StateCompleted)
	cons, err := js.Consumer(ctx, "JOBS_DISPATCH_"+env.service, "workers")
	require.NoError(t, err)
	info, err := cons.Info(ctx)
	require.NoError(t, err)
	assert.Equal(t, uint64(1), info.Delivered.Consumer, "announcements delivered: the retried publish was de-duplicated")
	assert.GreaterOrEqual(t, ujs.ready.Load(), int64(3), "publishes of the announcement")
}
