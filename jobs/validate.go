package jobs

import (
	"encoding/json"
	"strconv"
	"strings"
	"unicode/utf8"
)

// What ErrCorrupt means. A store that reads a record runs these validators
// on it and refuses (ErrCorrupt, naming the job and the KV key) to act on a
// record that fails, never overwriting it. The rules mirror what the
// transition rules can produce: a record that fails was not written by them.

// validateJob checks a stored job: identifiers present and within limits,
// a known state, Version ≥ 1, TargetGeneration ≥ 1, counters consistent
// (0 ≤ Failures ≤ Attempts ≤ ClaimGeneration), a running job with owner,
// expiry and ClaimGeneration ≥ 1, any other job without owner, binding or
// expiry, valid JSON input and binding, set times, and a progress log of at
// most ProgressLimit entries that each follow the progress rules. The
// error wraps ErrCorrupt and names the job and what is wrong.
func validateJob(j *Job) error {
	if err := checkJob(j); err != "" {
		return corruptf("job %q in channel %q: %s", j.ID, j.ChannelID, err)
	}
	return nil
}

func checkJob(j *Job) string {
	for _, f := range []struct{ name, v string }{
		{"id", j.ID}, {"channelId", j.ChannelID}, {"type", j.Type}, {"targetKey", j.TargetKey},
		{"idempotencyKey", j.IdempotencyKey}, {"fingerprint", j.Fingerprint},
	} {
		if f.v == "" {
			return f.name + " is empty"
		}
		if len(f.v) > IdentifierSizeLimit || !utf8.ValidString(f.v) {
			return f.name + " is over the identifier limit or not UTF-8"
		}
	}
	if len(j.Origin) > IdentifierSizeLimit || !utf8.ValidString(j.Origin) {
		return "origin is over the identifier limit or not UTF-8"
	}
	if len(j.Reason) > ReasonSizeLimit || !utf8.ValidString(j.Reason) {
		return "reason is over the limit or not UTF-8"
	}
	if !j.State.Valid() {
		return "unknown state " + quote(string(j.State))
	}
	switch {
	case j.Version < 1:
		return "version is below 1"
	case j.TargetGeneration < 1:
		return "targetGeneration is 0"
	case j.Revision < 1:
		return "revision is 0"
	case j.Attempts < 0 || j.Failures < 0:
		return "negative attempts or failures"
	case j.Failures > j.Attempts:
		return "more failures than attempts"
	case uint64(j.Attempts) > j.ClaimGeneration:
		return "more attempts than claim generations"
	case j.CreatedAt.IsZero() || j.UpdatedAt.IsZero() || j.AvailableAt.IsZero():
		return "createdAt, updatedAt or availableAt is missing"
	case j.UpdatedAt.Before(j.CreatedAt):
		return "updatedAt is before createdAt"
	}
	if j.State == StateRunning {
		switch {
		case j.ClaimOwner == "":
			return "running without claimOwner"
		case j.ClaimExpiresAt.IsZero():
			return "running without claimExpiresAt"
		case j.ClaimGeneration < 1:
			return "running with claimGeneration 0"
		}
	} else if j.ClaimOwner != "" || !j.ClaimExpiresAt.IsZero() || j.ClaimBinding != nil {
		return string(j.State) + " with a claim (owner, expiry or binding)"
	}
	if len(j.ClaimOwner) > IdentifierSizeLimit || !utf8.ValidString(j.ClaimOwner) {
		return "claimOwner is over the identifier limit or not UTF-8"
	}
	if j.Input != nil && (len(j.Input) > InputSizeLimit || !json.Valid(j.Input)) {
		return "input is over the limit or not valid JSON"
	}
	if j.ClaimBinding != nil && (len(j.ClaimBinding) > BindingSizeLimit || !json.Valid(j.ClaimBinding)) {
		return "claimBinding is over the limit or not valid JSON"
	}
	if len(j.Progress) > ProgressLimit {
		return "more than ProgressLimit progress entries"
	}
	for i := range j.Progress {
		if msg := checkProgress(&j.Progress[i], j.Attempts); msg != "" {
			return "progress entry " + itoa(i) + ": " + msg
		}
	}
	return ""
}

// checkProgress checks one stored progress entry.
func checkProgress(p *Progress, attempts int) string {
	switch {
	case !isToken(p.Stage):
		return "stage " + quote(p.Stage) + " breaks ^[a-z][a-z0-9-]{0,63}$"
	case !utf8.ValidString(p.Label) || strings.TrimSpace(p.Label) != p.Label:
		return "label is not trimmed UTF-8"
	case utf8.RuneCountInString(p.Label) < 1 || utf8.RuneCountInString(p.Label) > LabelLimit:
		return "label length outside 1..LabelLimit"
	case !p.State.Valid():
		return "unknown progress state " + quote(string(p.State))
	case p.State == ProgressInterrupted && !isToken(p.Reason):
		return "interrupted without a valid reason"
	case p.State != ProgressInterrupted && p.Reason != "":
		return "reason on a " + string(p.State) + " entry"
	case p.Revision < 1:
		return "revision is 0"
	case p.Attempt < 0 || p.Attempt > attempts:
		return "attempt outside 0..attempts"
	case p.CreatedAt.IsZero():
		return "createdAt is missing"
	}
	return ""
}

// validateTarget checks a stored target: identifiers present, Generation ≥ 1.
func validateTarget(t *Target) error {
	switch {
	case t.ChannelID == "" || t.TargetKey == "":
		return corruptf("target %q in channel %q: channelId or targetKey is empty", t.TargetKey, t.ChannelID)
	case t.Generation < 1:
		return corruptf("target %q in channel %q: generation is 0", t.TargetKey, t.ChannelID)
	}
	return nil
}

// validateArtifact checks a stored artifact of job j (j may be nil when the
// store reads the artifact alone): JobID set (and j's), Revision ≥ 1,
// valid JSON within ArtifactSizeLimit, CreatedAt set; a job with an
// artifact must be completed.
func validateArtifact(a *Artifact, j *Job) error {
	switch {
	case a.JobID == "":
		return corruptf("artifact: jobId is empty")
	case j != nil && a.JobID != j.ID:
		return corruptf("artifact of job %q in channel %q names job %q", j.ID, j.ChannelID, a.JobID)
	case j != nil && j.State != StateCompleted:
		return corruptf("artifact of job %q in channel %q: the job is %s, not completed", j.ID, j.ChannelID, j.State)
	case a.Revision < 1:
		return corruptf("artifact of job %q: revision is 0", a.JobID)
	case a.Value != nil && (len(a.Value) > ArtifactSizeLimit || !json.Valid(a.Value)):
		return corruptf("artifact of job %q: value is over the limit or not valid JSON", a.JobID)
	case a.CreatedAt.IsZero():
		return corruptf("artifact of job %q: createdAt is missing", a.JobID)
	}
	return nil
}

// quote quotes s for a message, cut to 80 bytes.
func quote(s string) string {
	if len(s) > 80 {
		s = s[:80]
	}
	return strconv.Quote(s)
}

func itoa(i int) string { return strconv.Itoa(i) }
