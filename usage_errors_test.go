package jobkeys_test

// Usage mistakes a newcomer makes (found by a review of a first hour with
// the library): each error says what was wrong.

import (
	"context"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jobkeys/jobkeys"
)

// A Go string holding JSON text is the commonest way to get a payload
// wrong (string(msg.Data()), a JSON literal in a test): it is marshaled as
// a JSON string, so every pointer resolves to nothing: the error says the
// payload was a Go string, not an object.
func TestStringPayloadErrorNamesTheString(t *testing.T) {
	ctx := context.Background()
	coord, err := jobkeys.NewCoordinator(jobkeys.NewMemoryStore(), nil)
	require.NoError(t, err)
	jt, err := coord.JobType("billing", "sync", jobkeys.Policy{Key: []string{"tenant", "/tenant"}})
	require.NoError(t, err)

	_, err = jt.Admit(ctx, "sync-1", `{"tenant":"acme"}`)
	require.ErrorIs(t, err, jobkeys.ErrInvalidKey)
	assert.Regexp(t, `payload[^:]* string`, err.Error(), "the error should say the payload is a JSON string (a Go string is marshaled, not read as JSON text)")
}

// The Go string the error quotes is cut short on a character boundary: a
// long string of non-ASCII text was cut inside a character, which left
// the error message invalid UTF-8.
func TestStringPayloadErrorIsValidUTF8(t *testing.T) {
	ctx := context.Background()
	coord, err := jobkeys.NewCoordinator(jobkeys.NewMemoryStore(), nil)
	require.NoError(t, err)
	jt, err := coord.JobType("billing", "sync", jobkeys.Policy{Key: []string{"tenant", "/tenant"}})
	require.NoError(t, err)

	_, err = jt.Admit(ctx, "sync-1", `{"tenant":"`+strings.Repeat("é", 40)+`"}`)
	require.ErrorIs(t, err, jobkeys.ErrInvalidKey)
	assert.True(t, utf8.ValidString(err.Error()), "the error message should be valid UTF-8: %q", err.Error())
	assert.Contains(t, err.Error(), `"{\"tenant\":\"éé`, "the error should quote the string's start")
}

// Release (and Renew) of a zero Lease, the usual result of using the
// Lease of an acquisition that was not KindAcquired, is called empty (it
// named a job "" of job type "" of service "").
func TestZeroLeaseErrorSaysEmpty(t *testing.T) {
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
