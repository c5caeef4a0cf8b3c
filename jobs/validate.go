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

// checkJob checks a stored job: identifiers present and within limits,
// a known state, Version ≥ 1, TargetGeneration ≥ 1, counters consistent
// (0 ≤ Failures ≤ Attempts ≤ ClaimGeneration), a running job with owner,
// expiry and ClaimGeneration ≥ 1, any other job without owner, binding or
// expiry, valid JSON input and binding, set times, and a progress log of at
// most ProgressLimit entries that each follow the progress rules. It says
// what is wrong; "" when nothing is (the store's error names the job and
// the KV key, see natsCorrupt).
//
// It checks no order between the times: each is the clock reading of the
// store that wrote it, and a writer whose clock is behind (or jumped back)
// writes an UpdatedAt before CreatedAt, or a progress entry older than the
// one before it; the rules write those (see Clocks in the package doc).
func checkJob(j *Job) string {
	for _, f := range []struct{ name, v string }{
		{"id", j.ID}, {"channelId", j.ChannelID}, {"type", j.Type}, {"targetKey", j.TargetKey},
		{"idempotencyKey", j.IdempotencyKey}, {"fingerprint", j.Fingerprint},
	} {
		if f.v == "" {
			return f.name + " is empty"
		}
		if msg := checkStored(f.name, f.v, IdentifierSizeLimit); msg != "" {
			return msg
		}
	}
	if msg := checkStored("origin", j.Origin, IdentifierSizeLimit); msg != "" {
		return msg
	}
	if msg := checkStored("reason", j.Reason, ReasonSizeLimit); msg != "" {
		return msg
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
	case j.Attempts < 0:
		return "attempts " + itoa(j.Attempts) + " is negative"
	case j.Failures < 0:
		return "failures " + itoa(j.Failures) + " is negative"
	case j.Failures > j.Attempts:
		return "failures " + itoa(j.Failures) + " exceed attempts " + itoa(j.Attempts)
	case uint64(j.Attempts) > j.ClaimGeneration:
		return "attempts " + itoa(j.Attempts) + " exceed claimGeneration " + strconv.FormatUint(j.ClaimGeneration, 10)
	case j.CreatedAt.IsZero():
		return "createdAt is missing"
	case j.UpdatedAt.IsZero():
		return "updatedAt is missing"
	case j.AvailableAt.IsZero():
		return "availableAt is missing"
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
	} else {
		switch {
		case j.ClaimOwner != "":
			return string(j.State) + " with a claimOwner"
		case !j.ClaimExpiresAt.IsZero():
			return string(j.State) + " with a claimExpiresAt"
		case j.ClaimBinding != nil:
			return string(j.State) + " with a claimBinding"
		}
	}
	if msg := checkStored("claimOwner", j.ClaimOwner, IdentifierSizeLimit); msg != "" {
		return msg
	}
	if msg := checkStoredJSON("input", j.Input, InputSizeLimit); msg != "" {
		return msg
	}
	if msg := checkStoredJSON("claimBinding", j.ClaimBinding, BindingSizeLimit); msg != "" {
		return msg
	}
	if len(j.Progress) > ProgressLimit {
		return itoa(len(j.Progress)) + " progress entries, over the limit of " + itoa(ProgressLimit)
	}
	for i := range j.Progress {
		if msg := checkProgress(&j.Progress[i], j.Attempts); msg != "" {
			return "progress entry " + itoa(i) + ": " + msg
		}
	}
	return ""
}

// checkProgress checks one stored progress entry. It accepts a label
// trimmed and counted as the rules do (JavaScript's trim, 1..LabelLimit
// UTF-16 code units, the seed's rule) or as they did before they matched
// the seed (Go's unicode.IsSpace, 1..LabelLimit runes), so that records
// written then stay readable: trimmed by either, 1..LabelLimit runes.
func checkProgress(p *Progress, attempts int) string {
	switch {
	case !isToken(p.Stage):
		return "stage " + quote(p.Stage) + " breaks ^[a-z][a-z0-9-]{0,63}$"
	case !utf8.ValidString(p.Label) || trimLabel(p.Label) != p.Label && strings.TrimSpace(p.Label) != p.Label:
		return "label is not trimmed UTF-8"
	case p.Label == "" || utf8.RuneCountInString(p.Label) > LabelLimit:
		return "label is " + itoa(utf8.RuneCountInString(p.Label)) + " characters, outside 1.." + itoa(LabelLimit)
	case !p.State.Valid():
		return "unknown progress state " + quote(string(p.State))
	case p.State == ProgressInterrupted && !isToken(p.Reason):
		return "interrupted without a valid reason"
	case p.State != ProgressInterrupted && p.Reason != "":
		return "reason on a " + string(p.State) + " entry"
	case p.Revision < 1:
		return "revision is 0"
	case p.Attempt < 0 || p.Attempt > attempts:
		return "attempt " + itoa(p.Attempt) + " is outside 0.." + itoa(attempts)
	case p.CreatedAt.IsZero():
		return "createdAt is missing"
	}
	return ""
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
	case checkStoredJSON("value", a.Value, ArtifactSizeLimit) != "":
		return corruptf("artifact of job %q: %s", a.JobID, checkStoredJSON("value", a.Value, ArtifactSizeLimit))
	case a.CreatedAt.IsZero():
		return corruptf("artifact of job %q: createdAt is missing", a.JobID)
	}
	return nil
}

// checkStored says what is wrong with a stored string field: over limit
// bytes or not UTF-8; "" when nothing is.
func checkStored(name, v string, limit int) string {
	switch {
	case len(v) > limit:
		return name + " is " + itoa(len(v)) + " bytes, over the limit of " + itoa(limit)
	case !utf8.ValidString(v):
		return name + " is not valid UTF-8"
	}
	return ""
}

// checkStoredJSON says what is wrong with a stored JSON field (nil: none):
// over limit bytes or not valid JSON; "" when nothing is.
func checkStoredJSON(name string, v json.RawMessage, limit int) string {
	switch {
	case v == nil:
	case len(v) > limit:
		return name + " is " + itoa(len(v)) + " bytes, over the limit of " + itoa(limit)
	case !json.Valid(v):
		return name + " is not valid JSON"
	}
	return ""
}

// quote quotes s for a message, cut to 80 bytes.
func quote(s string) string {
	if len(s) > 80 {
		s = s[:80]
	}
	return strconv.Quote(s)
}

func itoa(i int) string { return strconv.Itoa(i) }
