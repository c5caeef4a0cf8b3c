package jobs

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// validateJob is checkJob as an error wrapping ErrCorrupt that names the
// job: the tests check with it what the rules and stores wrote.
func validateJob(j *Job) error {
	if err := checkJob(j); err != "" {
		return corruptf("job %q in channel %q: %s", j.ID, j.ChannelID, err)
	}
	return nil
}

// validateTarget checks a target a store returned: identifiers present,
// Generation ≥ 1.
func validateTarget(t *Target) error {
	switch {
	case t.ChannelID == "" || t.TargetKey == "":
		return corruptf("target %q in channel %q: channelId or targetKey is empty", t.TargetKey, t.ChannelID)
	case t.Generation < 1:
		return corruptf("target %q in channel %q: generation is 0", t.TargetKey, t.ChannelID)
	}
	return nil
}

var testNow = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// runningJob is a valid running job with one progress entry, built by the
// rules.
func runningJob(t *testing.T) Job {
	t.Helper()
	req, err := prepareEnqueue(EnqueueRequest{ID: "j1", ChannelID: "c", Type: "render", Version: 1, TargetKey: "doc",
		IdempotencyKey: "k", Fingerprint: "f", Input: json.RawMessage(`{"a":1}`)})
	require.NoError(t, err)
	j, _, _ := enqueueJob(req, 0, nil, testNow, 1)
	require.NoError(t, validateJob(&j))
	c, err := prepareClaim(ClaimRequest{Owner: "w", Count: 1, TTL: time.Minute})
	require.NoError(t, err)
	require.True(t, claimable(&j, 1, testNow))
	j = claimJob(&j, c, testNow, 2)
	p, err := prepareProgress(ProgressRequest{Claim: ClaimOf(j), Stage: "s", Label: "l", State: ProgressStarted})
	require.NoError(t, err)
	j, err = progressJob(&j, p, 1, testNow, 3)
	require.NoError(t, err)
	require.NoError(t, validateJob(&j))
	return j
}

func TestValidateJobCorrupt(t *testing.T) {
	cases := []struct {
		name string
		edit func(j *Job)
		word string
	}{
		{"unknown state", func(j *Job) { j.State = "done" }, "unknown state"},
		{"empty state", func(j *Job) { j.State = "" }, "unknown state"},
		{"running without owner", func(j *Job) { j.ClaimOwner = "" }, "claimOwner"},
		{"running without expiry", func(j *Job) { j.ClaimExpiresAt = time.Time{} }, "claimExpiresAt"},
		{"running with claim generation 0", func(j *Job) { j.ClaimGeneration, j.Attempts = 0, 0 }, "claimGeneration"},
		{"pending with an owner", func(j *Job) { j.State = StatePending }, "claim"},
		{"completed with a binding", func(j *Job) {
			*j = clearClaim(*j)
			j.State = StateCompleted
			j.ClaimBinding = json.RawMessage(`1`)
		}, "claim"},
		{"empty id", func(j *Job) { j.ID = "" }, "id"},
		{"empty channel", func(j *Job) { j.ChannelID = "" }, "channelId"},
		{"empty fingerprint", func(j *Job) { j.Fingerprint = "" }, "fingerprint"},
		{"version 0", func(j *Job) { j.Version = 0 }, "version"},
		{"target generation 0", func(j *Job) { j.TargetGeneration = 0 }, "targetGeneration"},
		{"revision 0", func(j *Job) { j.Revision = 0 }, "revision"},
		{"more failures than attempts", func(j *Job) { j.Failures = 2 }, "failures"},
		{"more attempts than claims", func(j *Job) { j.Attempts = 2 }, "attempts"},
		{"negative attempts", func(j *Job) { j.Attempts = -1 }, "negative"},
		{"missing createdAt", func(j *Job) { j.CreatedAt = time.Time{} }, "createdAt"},
		{"input not JSON", func(j *Job) { j.Input = json.RawMessage(`{`) }, "input"},
		{"binding not JSON", func(j *Job) { j.ClaimBinding = json.RawMessage(`x`) }, "claimBinding"},
		{"identifier not UTF-8", func(j *Job) { j.Type = "\xff" }, "type"},
		{"progress bad stage", func(j *Job) { j.Progress[0].Stage = "Bad" }, "stage"},
		{"progress untrimmed label", func(j *Job) { j.Progress[0].Label = " l" }, "label"},
		{"progress empty label", func(j *Job) { j.Progress[0].Label = "" }, "label"},
		{"progress unknown state", func(j *Job) { j.Progress[0].State = "x" }, "progress state"},
		{"progress interrupted without reason", func(j *Job) { j.Progress[0].State = ProgressInterrupted }, "reason"},
		{"progress reason on started", func(j *Job) { j.Progress[0].Reason = "why" }, "reason"},
		{"progress attempt beyond attempts", func(j *Job) { j.Progress[0].Attempt = 5 }, "attempt"},
		{"too many progress entries", func(j *Job) {
			for len(j.Progress) <= ProgressLimit {
				j.Progress = append(j.Progress, j.Progress[0])
			}
		}, "33 progress entries, over the limit of 32"},
		// Regressions: each message names the one field that is wrong (they
		// used to name a group: "createdAt, updatedAt or availableAt").
		{"missing updatedAt", func(j *Job) { j.UpdatedAt = time.Time{} }, "updatedAt is missing"},
		{"missing availableAt", func(j *Job) { j.AvailableAt = time.Time{} }, "availableAt is missing"},
		{"negative failures", func(j *Job) { j.Failures = -1 }, "failures -1 is negative"},
		{"pending with an expiry only", func(j *Job) {
			j.State, j.ClaimOwner = StatePending, ""
		}, "pending with a claimExpiresAt"},
		{"identifier too long", func(j *Job) { j.Type = strings.Repeat("t", 300) }, "type is 300 bytes, over the limit of 256"},
		{"input too large", func(j *Job) {
			j.Input = json.RawMessage(`"` + strings.Repeat("x", InputSizeLimit) + `"`)
		}, "input is 262146 bytes, over the limit of 262144"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			j := runningJob(t)
			j.Progress = append([]Progress(nil), j.Progress...)
			tc.edit(&j)
			err := validateJob(&j)
			require.ErrorIs(t, err, ErrCorrupt)
			assert.Contains(t, err.Error(), tc.word)
			assert.Contains(t, err.Error(), fmt.Sprintf("job %q", j.ID))
		})
	}
}

func TestValidateArtifact(t *testing.T) {
	j := runningJob(t)
	s, err := prepareSettle(SettleRequest{Claim: ClaimOf(j), Artifact: json.RawMessage(`[1]`)})
	require.NoError(t, err)
	done, a, err := settleJob(&j, s, 1, testNow, 4)
	require.NoError(t, err)
	require.NoError(t, validateJob(&done))
	require.NoError(t, validateArtifact(&a, &done))
	require.NoError(t, validateArtifact(&a, nil))
	require.ErrorIs(t, validateArtifact(&a, &j), ErrCorrupt, "an artifact of a running job")
	bad := a
	bad.Value = json.RawMessage(`[`)
	require.ErrorIs(t, validateArtifact(&bad, nil), ErrCorrupt)
	bad = a
	bad.JobID = "other"
	require.ErrorIs(t, validateArtifact(&bad, &done), ErrCorrupt)
}

// A stored job survives a JSON round trip unchanged: what a store writes
// it reads back equal.
func TestJobJSONRoundTrip(t *testing.T) {
	j := runningJob(t)
	r, err := prepareRenew(RenewRequest{Claim: ClaimOf(j), ExpectedRevision: j.Revision, TTL: time.Hour, Binding: json.RawMessage(`{"x": [1, 2]}`)})
	require.NoError(t, err)
	j, err = renewJob(&j, r, 1, testNow.Add(time.Second), 5)
	require.NoError(t, err)
	b, err := json.Marshal(j)
	require.NoError(t, err)
	var back Job
	require.NoError(t, json.Unmarshal(b, &back))
	require.Equal(t, j, back)
	require.NoError(t, validateJob(&back))
}

func TestIsToken(t *testing.T) {
	for s, want := range map[string]bool{
		"a": true, "fetch": true, "a-1": true, "a" + strings.Repeat("z", 63): true,
		"": false, "A": false, "1a": false, "-a": false, "a_b": false, "a b": false, "é": false,
		"a" + strings.Repeat("z", 64): false,
	} {
		assert.Equal(t, want, isToken(s), "isToken(%q)", s)
	}
}
