package jobs

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jobkeys/jobkeys/internal/natstest"
)

// TestNATSStoreDomainAndAPIPrefix: over a JetStream context whose options
// name both a domain and an API prefix, the store sends its reads (direct
// and leader gets), writes and purges under the prefix nats.go itself uses
// there (the one its constructor was given), so that a job's whole cycle
// works.
func TestNATSStoreDomainAndAPIPrefix(t *testing.T) {
	t.Parallel()
	_, contexts := natstest.RunDomainAndPrefix(t, "hub")
	for _, tc := range contexts {
		t.Run(tc.Name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			bucket := fmt.Sprintf("JOBS_P%d", natsBucketSeq.Add(1))
			st, err := NewNATSStore(tc.JS, nil, WithBucket(bucket), WithCreateBucket(jetstream.MemoryStorage, 1), WithTimeout(10*time.Second))
			require.NoError(t, err)
			t.Cleanup(func() { _ = st.Close(context.Background()) })
			api := tc.WritePrefix
			if api == "" {
				api = jetstream.DefaultAPIPrefix
			}
			assert.Equal(t, api+"STREAM.MSG.GET.KV_"+bucket, st.msgGet, "leader gets")
			assert.Equal(t, api+"DIRECT.GET.KV_"+bucket, st.directGet, "direct gets")
			assert.Equal(t, api+"STREAM.PURGE.KV_"+bucket, st.purge, "purges")
			assert.Equal(t, tc.WritePrefix+"$KV."+bucket+".", st.writePrefix, "kv.Update's subjects")

			enq, err := st.Enqueue(ctx, testEnqueueRequest("ch", "job.1", "doc"))
			require.NoError(t, err)
			claimed, err := st.Claim(ctx, ClaimRequest{ChannelID: "ch", Owner: "w", Count: 1, TTL: time.Minute})
			require.NoError(t, err, "a claim: batched reads and a write")
			require.Len(t, claimed, 1)
			assert.Greater(t, claimed[0].Revision, enq.Job.Revision)
			rev, err := st.channelRevision(ctx, "test", "ch")
			require.NoError(t, err, "a leader get")
			assert.GreaterOrEqual(t, rev, claimed[0].Revision)
			require.NoError(t, st.DeleteChannel(ctx, "ch"), "a purge")
			_, err = st.Get(ctx, "ch", "job.1")
			assert.ErrorIs(t, err, ErrNotFound)
		})
	}
}
