package jobs_test

// Findings of the ux7 review (a newcomer's first hour): each test states
// what a user should see and fails on the code as it is; each is skipped
// so that the suite stays green until the lead fixes or assigns it.

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jobkeys/jobkeys"
	"github.com/jobkeys/jobkeys/jobs"
)

// Client.Enqueue knows the kind, and so its In type, but accepts an Input
// that can never decode into it (a number where In has a string): the
// mistake surfaces only at run time, as a "decode input" failure of every
// attempt, retried with backoff (1 s, 2 s, 4 s, 8 s by default) until
// MaxFailures fails the job, far from the enqueue that was wrong.
func TestUX7FindingEnqueueRefusesInputTheKindCannotDecode(t *testing.T) {
	t.Skip("ux7: Client.Enqueue accepts an Input that cannot decode into the kind's In; each attempt then fails and is retried until MaxFailures")
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
	require.Error(t, err, "an Input the kind cannot decode should be refused at enqueue")
	assert.Contains(t, err.Error(), "sync-1", "the error should name the job")
	assert.Contains(t, err.Error(), "tenant", "the error should name the field that does not decode")
	_, err = client.Get(ctx, "c", "sync-1")
	assert.ErrorIs(t, err, jobs.ErrNotFound, "no record should be left behind")
}

// ClientConfig.KeyStore must be "the key store the coordinator was made
// with", and a newcomer passes it twice (NewCoordinator's store, then
// KeyStore). NewClient does not check that they are the same: with
// another store the client watches and reconciles keys the coordinator
// never writes (jobs waiting for a slot are woken only by rechecks, stale
// queue entries are never removed), and nothing says so.
func TestUX7FindingNewClientRefusesAnotherKeyStore(t *testing.T) {
	t.Skip("ux7: NewClient accepts a ClientConfig.KeyStore other than the store its coordinator was made with")
	store, err := jobs.NewMemoryStore(nil)
	require.NoError(t, err)
	coord, err := jobkeys.NewCoordinator(jobkeys.NewMemoryStore(), nil)
	require.NoError(t, err)

	_, err = jobs.NewClient(store, coord, &jobs.ClientConfig{KeyStore: jobkeys.NewMemoryStore()})
	require.Error(t, err, "a KeyStore that is not the coordinator's store should be refused")
	assert.Contains(t, err.Error(), "KeyStore", "the error should name the field")
}
