package jobs

import (
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jobkeys/jobkeys/internal/natstest"
)

// TestNATSStoreRequestTimeout shows which bound a store's requests get
// when the caller's ctx has none: WithTimeout's; else a default timeout
// set on js; else NATSTimeoutDefault, not JetStream's 5 s, which most
// enqueues of a loaded machine overran on a healthy server.
func TestNATSStoreRequestTimeout(t *testing.T) {
	t.Parallel()
	s := natstest.Run(t)
	nc, plain := natstest.Connect(t, s)
	bucket := fmt.Sprintf("JOBS_T%d", natsBucketSeq.Add(1))
	open := func(js jetstream.JetStream, opts ...NATSStoreOption) *NATSStore {
		t.Helper()
		st, err := NewNATSStore(js, nil, append([]NATSStoreOption{WithBucket(bucket), WithCreateBucket(jetstream.MemoryStorage, 1)}, opts...)...)
		require.NoError(t, err)
		return st
	}
	assert.Equal(t, NATSTimeoutDefault, open(plain).requestTimeout(), "js with JetStream's default")
	assert.Equal(t, time.Minute, open(plain, WithTimeout(time.Minute)).requestTimeout())
	short, err := jetstream.New(nc, jetstream.WithDefaultTimeout(2*time.Second))
	require.NoError(t, err)
	assert.Equal(t, 2*time.Second, open(short).requestTimeout(), "a timeout set on js")
	assert.Equal(t, time.Minute, open(short, WithTimeout(time.Minute)).requestTimeout())
	_, err = NewNATSStore(plain, nil, WithBucket(bucket), WithTimeout(0))
	assert.ErrorIs(t, err, ErrConflict)
}
