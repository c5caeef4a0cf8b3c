package jobkeys_test

// Findings of the ux7 review (a newcomer's first hour): each test states
// what a user should see and fails on the code as it is; each is skipped
// so that the suite stays green until the lead fixes or assigns it.

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jobkeys/jobkeys"
)

// A Go string holding JSON text is the commonest way to get a payload
// wrong (string(msg.Data()), a JSON literal in a test): it is marshaled as
// a JSON string, so every pointer "resolves to nothing", and the error
// does not say that the payload was a string rather than an object.
func TestUX7FindingStringPayloadErrorNamesTheString(t *testing.T) {
	t.Skip("ux7: a JSON text passed as a Go string fails with \"resolved to nothing\", not saying the payload is a JSON string (pass []byte)")
	ctx := context.Background()
	coord, err := jobkeys.NewCoordinator(jobkeys.NewMemoryStore(), nil)
	require.NoError(t, err)
	jt, err := coord.JobType("billing", "sync", jobkeys.Policy{Key: []string{"tenant", "/tenant"}})
	require.NoError(t, err)

	_, err = jt.Admit(ctx, "sync-1", `{"tenant":"acme"}`)
	require.ErrorIs(t, err, jobkeys.ErrInvalidKey)
	assert.Regexp(t, `payload[^:]* string`, err.Error(), "the error should say the payload is a JSON string (a Go string is marshaled, not read as JSON text)")
}

// Release (and Renew) of a zero Lease, the usual result of using the
// Lease of an acquisition that was not KindAcquired, names a job "" of job
// type "" of service "" instead of saying that the lease is empty.
func TestUX7FindingZeroLeaseErrorSaysEmpty(t *testing.T) {
	t.Skip("ux7: Release of a zero Lease says `lease of job \"\" is of job type \"\" of service \"\"`, not that the lease is empty (not acquired)")
	ctx := context.Background()
	coord, err := jobkeys.NewCoordinator(jobkeys.NewMemoryStore(), nil)
	require.NoError(t, err)
	jt, err := coord.JobType("billing", "sync", jobkeys.Policy{Key: []string{"/tenant"}})
	require.NoError(t, err)

	_, err = jt.Release(ctx, jobkeys.Lease{})
	require.ErrorIs(t, err, jobkeys.ErrInvalidRequest)
	assert.Contains(t, err.Error(), "empty", "a zero lease should be called empty (never acquired)")
	_, err = jt.Renew(ctx, jobkeys.Lease{})
	require.ErrorIs(t, err, jobkeys.ErrInvalidRequest)
	assert.Contains(t, err.Error(), "empty")
}

// RunnerConfig.Watcher "must watch the coordinator's store", but NewRunner
// takes a Watcher of any store: a Run blocked behind another process's
// slot then wakes only at its RecheckInterval (5 s instead of about the
// release's round trip, seen in a scratch program), and nothing says why.
// Watcher.SubscribeJob refuses a JobType of another store; NewRunner could
// do the same.
func TestUX7FindingNewRunnerRefusesWatcherOfAnotherStore(t *testing.T) {
	t.Skip("ux7: NewRunner accepts a RunnerConfig.Watcher over another store than the coordinator's; its Runs then wake only at RecheckInterval")
	coord, err := jobkeys.NewCoordinator(jobkeys.NewMemoryStore(), nil)
	require.NoError(t, err)
	jt, err := coord.JobType("billing", "sync", jobkeys.Policy{Key: []string{"/tenant"}})
	require.NoError(t, err)
	other, err := jobkeys.NewWatcher(jobkeys.NewMemoryStore())
	require.NoError(t, err)
	defer other.Close()

	_, err = jobkeys.NewRunner(jt, &jobkeys.RunnerConfig{Watcher: other})
	require.ErrorIs(t, err, jobkeys.ErrInvalidRequest, "a Watcher of another store should be refused")
	assert.Contains(t, err.Error(), "Watcher", "the error should name the field")
}
