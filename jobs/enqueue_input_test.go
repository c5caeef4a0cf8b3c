package jobs_test

// Usage mistakes a newcomer makes (found by a review of a first hour with
// the library): each is refused where it is made, with an error saying what
// was wrong.

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jobkeys/jobkeys"
	"github.com/jobkeys/jobkeys/jobs"
)

// Client.Enqueue knows the kind, and so its In type: an Input that can
// never decode into it (a number where In has a string) is refused there,
// not found at run time as a "decode input" failure of every attempt,
// retried with backoff until MaxFailures fails the job.
func TestEnqueueRefusesInputTheKindCannotDecode(t *testing.T) {
	ctx := context.Background()
	store, err := jobs.NewMemoryStore(nil)
	require.NoError(t, err)
	keys := jobkeys.NewMemoryStore()
	coord, err := jobkeys.NewCoordinator(keys, nil)
	require.NoError(t, err)
	client, err := jobs.NewClient(store, coord, &jobs.ClientConfig{KeyStore: keys})
	require.NoError(t, err)
	type sync struct {
		Tenant string `json:"tenant"`
	}
	require.NoError(t, jobs.Register(client, jobs.Kind[sync, string]{
		Type: "sync", Version: 1, Policy: jobkeys.Policy{Key: []string{"/tenant"}},
		Work: func(context.Context, *jobs.Run, sync) (string, error) { return "", nil },
	}))

	_, err = client.Enqueue(ctx, jobs.EnqueueRequest{
		ID: "sync-1", ChannelID: "c", Type: "sync", TargetKey: "t",
		IdempotencyKey: "sync-1", Fingerprint: "f", Input: []byte(`{"tenant":5}`),
	})
	require.ErrorIs(t, err, jobs.ErrConflict, "an Input the kind cannot decode should be refused at enqueue")
	assert.Contains(t, err.Error(), "sync-1", "the error should name the job")
	assert.Contains(t, err.Error(), "tenant", "the error should name the field that does not decode")
	_, err = client.Get(ctx, "c", "sync-1")
	assert.ErrorIs(t, err, jobs.ErrNotFound, "no record should be left behind")
}
