package jobs

// The pure transition rules both stores apply. No function here reads a
// clock, draws a random number or does I/O: each takes the stored record(s)
// the store read, the request, the store's time and the revision to stamp,
// and returns the new record(s) or an ErrConflict / ErrNotFound error whose
// message names the field.
//
// Conventions shared by every rule:
//   - A store first runs the request's prepareX function, before its guard
//     and before any read or write; it validates every field that does not
//     depend on stored state (sizes, encodings, JSON, time ranges) and
//     returns the normalised request (compact JSON, UTC times, capped
//     counts) that the later rules expect. The exception is progress:
//     as in the seed, its stage, label, state and reason are checked after
//     the job is found and its claim fenced ([progressJob]).
//   - A *Job argument is the stored job, or nil when the store found none.
//     It is never modified. A returned Job may share Input, ClaimBinding and
//     Progress memory with the argument (rules never mutate those slices;
//     a changed Progress is a fresh slice): a store that hands values out
//     must copy them ([cloneJob]).
//   - generation is the current Generation of the job's target (0 when the
//     target record is missing, which makes every job of it stale).
//   - now is the store's clock reading ([config.now]): UTC, no monotonic
//     reading. A rule stamps it as it is, even when it is before the
//     times already on the record (a writer whose clock is behind): as in
//     the seed, only renew and progress refuse a now before UpdatedAt, and
//     no rule moves now forward to meet a record's times (see Clocks in
//     the package doc).
//   - rev is the revision to stamp on every record the rule changes; the
//     store guarantees it is greater than any revision the channel has
//     handed out.

import (
	"bytes"
	"cmp"
	"encoding/json"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"
)

// normTime is how stores keep times: UTC, without monotonic reading, so a
// time survives a JSON round trip unchanged.
func normTime(t time.Time) time.Time {
	if t.IsZero() {
		return time.Time{}
	}
	return t.Round(0).UTC()
}

// checkTime refuses a time a JSON encoding cannot carry (outside years
// 1..9999). The zero time is allowed (it means "now" in requests).
func checkTime(op, field string, t time.Time) error {
	if t.IsZero() {
		return nil
	}
	if y := t.UTC().Year(); y < 1 || y > 9999 {
		return conflictf("%s: %s %s is outside years 1..9999", op, field, t.UTC().Format(time.RFC3339Nano))
	}
	return nil
}

// normJSON validates raw as UTF-8 JSON of at most limit bytes and returns a
// compact copy; empty input and JSON null become nil.
func normJSON(op, field string, raw json.RawMessage, limit int) (json.RawMessage, error) {
	if len(raw) > limit {
		return nil, conflictf("%s: %s is %d bytes, over the limit of %d bytes", op, field, len(raw), limit)
	}
	if len(bytes.TrimSpace(raw)) == 0 {
		return nil, nil
	}
	if !utf8.Valid(raw) || !json.Valid(raw) {
		return nil, conflictf("%s: %s is not valid UTF-8 JSON", op, field)
	}
	var buf bytes.Buffer
	buf.Grow(len(raw))
	if err := json.Compact(&buf, raw); err != nil {
		return nil, conflictf("%s: %s is not valid JSON: %v", op, field, err)
	}
	if bytes.Equal(buf.Bytes(), []byte("null")) {
		return nil, nil
	}
	return json.RawMessage(buf.Bytes()), nil
}

// checkString refuses a string over limit bytes or not valid UTF-8. It does
// not refuse an empty string.
func checkString(op, field, v string, limit int) error {
	if len(v) > limit {
		return conflictf("%s: %s is %d bytes, over the limit of %d bytes", op, field, len(v), limit)
	}
	if !utf8.ValidString(v) {
		return conflictf("%s: %s is not valid UTF-8", op, field)
	}
	return nil
}

// isToken reports whether s matches ^[a-z][a-z0-9-]{0,63}$ (progress stages
// and reasons).
func isToken(s string) bool {
	if len(s) < 1 || len(s) > 64 || s[0] < 'a' || s[0] > 'z' {
		return false
	}
	for i := 1; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}

// checkClaimFields refuses a claim whose fields are too long or not UTF-8.
// Empty fields are left to the claimed rules (they find no job or no owner).
func checkClaimFields(op string, c Claim) error {
	if err := checkString(op, "Claim.ChannelID", c.ChannelID, IdentifierSizeLimit); err != nil {
		return err
	}
	if err := checkString(op, "Claim.JobID", c.JobID, IdentifierSizeLimit); err != nil {
		return err
	}
	return checkString(op, "Claim.Owner", c.Owner, IdentifierSizeLimit)
}

// checkJobRef refuses a channel/job reference that is too long or not UTF-8.
func checkJobRef(op, channelID, jobID string) error {
	if err := checkString(op, "ChannelID", channelID, IdentifierSizeLimit); err != nil {
		return err
	}
	return checkString(op, "JobID", jobID, IdentifierSizeLimit)
}

// ---- Enqueue ----

// prepareEnqueue validates req's sizes and encodings and returns it with
// Input compact (nil for none) and AvailableAt normalised (zero stays zero).
// An empty ChannelID is ErrNotFound. Empty identifiers and Version < 1 are
// left to [checkNewJob], which runs after the idempotency replay as in the
// seed.
func prepareEnqueue(req EnqueueRequest) (EnqueueRequest, error) {
	const op = "enqueue"
	if req.ChannelID == "" {
		return req, notFoundf("%s: ChannelID is empty: channel does not exist", op)
	}
	for _, f := range []struct{ name, v string }{
		{"ChannelID", req.ChannelID}, {"ID", req.ID}, {"Type", req.Type}, {"Origin", req.Origin},
		{"TargetKey", req.TargetKey}, {"IdempotencyKey", req.IdempotencyKey}, {"Fingerprint", req.Fingerprint},
	} {
		if err := checkString(op, f.name, f.v, IdentifierSizeLimit); err != nil {
			return req, err
		}
	}
	if err := checkTime(op, "AvailableAt", req.AvailableAt); err != nil {
		return req, err
	}
	in, err := normJSON(op, "Input", req.Input, InputSizeLimit)
	if err != nil {
		return req, err
	}
	req.Input = in
	req.AvailableAt = normTime(req.AvailableAt)
	return req, nil
}

// replay answers an enqueue whose (channel, idempotency key) is already
// stored for job repeated (non-nil): the job as it is, Repeated, when the
// fingerprints match; ErrConflict naming Fingerprint otherwise. Nothing is
// to be written either way. The returned job shares memory with repeated.
func replay(req EnqueueRequest, repeated *Job) (Enqueued, error) {
	if repeated.Fingerprint != req.Fingerprint {
		return Enqueued{}, conflictf("enqueue: IdempotencyKey %q was used by job %q with another Fingerprint (stored %q, given %q)",
			req.IdempotencyKey, repeated.ID, repeated.Fingerprint, req.Fingerprint)
	}
	return Enqueued{Job: *repeated, Repeated: true}, nil
}

// checkNewJob is the part of enqueue after the replay: required
// identifiers, a job id not yet used in the channel (idTaken) and Version
// at least 1.
func checkNewJob(req EnqueueRequest, idTaken bool) error {
	const op = "enqueue"
	for _, f := range []struct{ name, v string }{
		{"ID", req.ID}, {"Type", req.Type}, {"TargetKey", req.TargetKey},
		{"IdempotencyKey", req.IdempotencyKey}, {"Fingerprint", req.Fingerprint},
	} {
		if f.v == "" {
			return conflictf("%s: %s must not be empty", op, f.name)
		}
	}
	if idTaken {
		return conflictf("%s: ID %q already exists in channel %q", op, req.ID, req.ChannelID)
	}
	if req.Version < 1 {
		return conflictf("%s: Version %d must be at least 1", op, req.Version)
	}
	return nil
}

// enqueueJob builds the new job of a prepared and checked request: pending,
// target generation = generation+1, AvailableAt = req.AvailableAt or now.
// targetJobs are the stored jobs of the same target (any state; others are
// ignored): each active one of an older generation comes back superseded,
// claim and reason cleared, stamped rev. The store writes the job, the
// target, the idempotency key and the superseded jobs as one change.
func enqueueJob(req EnqueueRequest, generation uint64, targetJobs []Job, now time.Time, rev uint64) (Job, Target, []Job) {
	next := generation + 1
	var superseded []Job
	for i := range targetJobs {
		p := &targetJobs[i]
		if p.ChannelID != req.ChannelID || p.TargetKey != req.TargetKey || p.TargetGeneration >= next || !p.State.Active() {
			continue
		}
		s := clearClaim(*p)
		s.State = StateSuperseded
		s.Revision = rev
		s.Reason = ""
		s.UpdatedAt = now
		superseded = append(superseded, s)
	}
	available := req.AvailableAt
	if available.IsZero() {
		available = now
	}
	j := Job{
		ID: req.ID, ChannelID: req.ChannelID, Type: req.Type, Version: req.Version, Origin: req.Origin,
		TargetKey: req.TargetKey, TargetGeneration: next,
		IdempotencyKey: req.IdempotencyKey, Fingerprint: req.Fingerprint,
		Input: req.Input, State: StatePending, Revision: rev,
		AvailableAt: available, CreatedAt: now, UpdatedAt: now,
	}
	return j, Target{ChannelID: req.ChannelID, TargetKey: req.TargetKey, Generation: next}, superseded
}

// ---- Claim ----

// prepareClaim validates a claim request: Owner non-empty, Count and TTL
// positive; Count is capped at ClaimCountLimit.
func prepareClaim(req ClaimRequest) (ClaimRequest, error) {
	const op = "claim"
	if err := checkString(op, "ChannelID", req.ChannelID, IdentifierSizeLimit); err != nil {
		return req, err
	}
	if err := checkString(op, "Owner", req.Owner, IdentifierSizeLimit); err != nil {
		return req, err
	}
	if req.Owner == "" {
		return req, conflictf("%s: Owner must not be empty", op)
	}
	if req.Count < 1 {
		return req, conflictf("%s: Count %d must be positive", op, req.Count)
	}
	if req.TTL <= 0 {
		return req, conflictf("%s: TTL %v must be positive", op, req.TTL)
	}
	req.Count = min(req.Count, ClaimCountLimit)
	return req, nil
}

// claimable reports whether j can be claimed at now: of its target's
// current generation, and pending with AvailableAt ≤ now or running with
// an expired claim (ClaimExpiresAt ≤ now, a reclaim).
func claimable(j *Job, generation uint64, now time.Time) bool {
	if j.TargetGeneration != generation {
		return false
	}
	switch j.State {
	case StatePending:
		return !j.AvailableAt.After(now)
	case StateRunning:
		return !j.ClaimExpiresAt.IsZero() && !j.ClaimExpiresAt.After(now)
	}
	return false
}

// claimDue is the time a claimable job became due: AvailableAt when
// pending, ClaimExpiresAt when running.
func claimDue(j *Job) time.Time {
	if j.State == StateRunning {
		return j.ClaimExpiresAt
	}
	return j.AvailableAt
}

// claimOrder orders claimable jobs (for slices.SortFunc): due time, then
// CreatedAt, then ID, then ChannelID (claims across channels).
func claimOrder(a, b *Job) int {
	if c := claimDue(a).Compare(claimDue(b)); c != 0 {
		return c
	}
	if c := a.CreatedAt.Compare(b.CreatedAt); c != 0 {
		return c
	}
	if c := cmp.Compare(a.ID, b.ID); c != 0 {
		return c
	}
	return cmp.Compare(a.ChannelID, b.ChannelID)
}

// claimJob claims j (which [claimable] accepted) for a prepared request:
// running, Attempts+1, ClaimGeneration+1, owner set, expiry now+TTL,
// binding and reason cleared, stamped rev.
func claimJob(j *Job, req ClaimRequest, now time.Time, rev uint64) Job {
	c := *j
	c.State = StateRunning
	c.Revision = rev
	c.Attempts++
	c.ClaimGeneration++
	c.ClaimOwner = req.Owner
	c.ClaimBinding = nil
	c.ClaimExpiresAt = normTime(now.Add(req.TTL))
	c.Reason = ""
	c.UpdatedAt = now
	return c
}

// ---- Claimed calls ----

// checkClaimed is the fence of every claimed call: the job must exist in
// the claim's channel (ErrNotFound), be running with the claim's owner and
// generation, a claim not yet expired at now, and be of its target's
// current generation (ErrConflict otherwise).
func checkClaimed(op string, j *Job, c Claim, generation uint64, now time.Time) error {
	if j == nil || j.ChannelID != c.ChannelID || j.ID != c.JobID {
		return notFoundf("%s: job %q does not exist in channel %q", op, c.JobID, c.ChannelID)
	}
	switch {
	case j.State != StateRunning:
		return conflictf("%s: job %q is %s, not running: claim is no longer active", op, j.ID, j.State)
	case j.ClaimOwner != c.Owner:
		return conflictf("%s: job %q: Claim.Owner %q does not hold the claim: claim is no longer active", op, j.ID, c.Owner)
	case j.ClaimGeneration != c.Generation:
		return conflictf("%s: job %q: Claim.Generation %d is not the claim generation %d: claim is no longer active", op, j.ID, c.Generation, j.ClaimGeneration)
	case j.ClaimExpiresAt.IsZero() || !j.ClaimExpiresAt.After(now):
		return conflictf("%s: job %q: claim expired at %s: claim is no longer active", op, j.ID, j.ClaimExpiresAt.Format(time.RFC3339Nano))
	case j.TargetGeneration != generation:
		return conflictf("%s: job %q: target %q is at generation %d, the job's is %d: claim is no longer active", op, j.ID, j.TargetKey, generation, j.TargetGeneration)
	}
	return nil
}

// clearClaim returns j without owner, binding and expiry (ClaimGeneration
// stays: it is the fence).
func clearClaim(j Job) Job {
	j.ClaimOwner = ""
	j.ClaimBinding = nil
	j.ClaimExpiresAt = time.Time{}
	return j
}

// prepareRenew validates a renew request: claim fields, TTL positive,
// Binding JSON of at most BindingSizeLimit bytes (compact; nil for none).
func prepareRenew(req RenewRequest) (RenewRequest, error) {
	const op = "renew"
	if err := checkClaimFields(op, req.Claim); err != nil {
		return req, err
	}
	if req.TTL <= 0 {
		return req, conflictf("%s: TTL %v must be positive", op, req.TTL)
	}
	b, err := normJSON(op, "Binding", req.Binding, BindingSizeLimit)
	if err != nil {
		return req, err
	}
	req.Binding = b
	return req, nil
}

// renewJob extends j's claim: [checkClaimed], then ExpectedRevision must be
// j.Revision, now must not be before UpdatedAt, and now+TTL must be later
// than the current expiry. The claim keeps its owner and generation; the
// binding becomes req.Binding.
func renewJob(j *Job, req RenewRequest, generation uint64, now time.Time, rev uint64) (Job, error) {
	const op = "renew"
	if err := checkClaimed(op, j, req.Claim, generation, now); err != nil {
		return Job{}, err
	}
	expires := normTime(now.Add(req.TTL))
	switch {
	case j.Revision != req.ExpectedRevision:
		return Job{}, conflictf("%s: job %q: ExpectedRevision %d is not the job's revision %d: it changed before its claim renewal", op, j.ID, req.ExpectedRevision, j.Revision)
	case now.Before(j.UpdatedAt):
		return Job{}, conflictf("%s: job %q: the store's time %s is before the job's UpdatedAt %s", op, j.ID, now.Format(time.RFC3339Nano), j.UpdatedAt.Format(time.RFC3339Nano))
	case !expires.After(j.ClaimExpiresAt):
		return Job{}, conflictf("%s: job %q: TTL %v gives expiry %s, not later than the current %s", op, j.ID, req.TTL, expires.Format(time.RFC3339Nano), j.ClaimExpiresAt.Format(time.RFC3339Nano))
	}
	c := *j
	c.Revision = rev
	c.ClaimBinding = req.Binding
	c.ClaimExpiresAt = expires
	c.UpdatedAt = now
	return c, nil
}

// prepareRequeue validates a requeue request: claim fields, Reason,
// AvailableAt (normalised; zero stays zero and means now).
func prepareRequeue(req RequeueRequest) (RequeueRequest, error) {
	const op = "requeue"
	if err := checkClaimFields(op, req.Claim); err != nil {
		return req, err
	}
	if err := checkString(op, "Reason", req.Reason, ReasonSizeLimit); err != nil {
		return req, err
	}
	if err := checkTime(op, "AvailableAt", req.AvailableAt); err != nil {
		return req, err
	}
	req.AvailableAt = normTime(req.AvailableAt)
	return req, nil
}

// requeueJob makes a claimed job pending again ([checkClaimed] first):
// claim cleared, AvailableAt = req.AvailableAt or now, Reason set,
// Failures+1 when CountFailure.
func requeueJob(j *Job, req RequeueRequest, generation uint64, now time.Time, rev uint64) (Job, error) {
	if err := checkClaimed("requeue", j, req.Claim, generation, now); err != nil {
		return Job{}, err
	}
	available := req.AvailableAt
	if available.IsZero() {
		available = now
	}
	c := finish(j, StatePending, req.Reason, now, rev)
	c.AvailableAt = available
	if req.CountFailure {
		c.Failures++
	}
	return c, nil
}

// finish is the common end of a claimed or control transition: the new
// state and reason, claim cleared, stamped rev at now.
func finish(j *Job, state State, reason string, now time.Time, rev uint64) Job {
	c := clearClaim(*j)
	c.State = state
	c.Reason = reason
	c.Revision = rev
	c.UpdatedAt = now
	return c
}

// prepareProgress validates a progress request's encodings: the claim
// fields and a Label of valid UTF-8. What the seed checks (stage, label,
// state and reason) [checkProgressRequest] checks after the job is found,
// in the seed's order.
func prepareProgress(req ProgressRequest) (ProgressRequest, error) {
	const op = "progress"
	if err := checkClaimFields(op, req.Claim); err != nil {
		return req, err
	}
	if !utf8.ValidString(req.Label) {
		return req, conflictf("%s: Label is not valid UTF-8", op)
	}
	return req, nil
}

// checkProgressRequest is the seed's check of a progress entry: Stage
// matches ^[a-z][a-z0-9-]{0,63}$, the label trimmed as JavaScript trims
// ([trimLabel]) is 1..LabelLimit UTF-16 code units ([labelLength]), State
// is known, Reason is required (and a token) for ProgressInterrupted and
// empty otherwise. It returns the label trimmed.
func checkProgressRequest(req ProgressRequest) (string, error) {
	const op = "progress"
	if !isToken(req.Stage) {
		return "", conflictf("%s: Stage %.80q must match ^[a-z][a-z0-9-]{0,63}$", op, req.Stage)
	}
	label := trimLabel(req.Label)
	if n := labelLength(label); n < 1 || n > LabelLimit {
		return "", conflictf("%s: Label is %d UTF-16 code units after trimming, must be 1..%d", op, n, LabelLimit)
	}
	if !req.State.Valid() {
		return "", conflictf("%s: State %.80q must be started, completed or interrupted", op, req.State)
	}
	if req.State == ProgressInterrupted {
		if !isToken(req.Reason) {
			return "", conflictf("%s: Reason %.80q must match ^[a-z][a-z0-9-]{0,63}$ for an interrupted stage", op, req.Reason)
		}
	} else if req.Reason != "" {
		return "", conflictf("%s: Reason must be empty unless State is interrupted", op)
	}
	return label, nil
}

// isJSSpace reports whether JavaScript's String.prototype.trim removes r:
// ECMAScript's WhiteSpace (TAB, VT, FF, SP, NBSP, ZWNBSP U+FEFF and every
// space separator, category Zs) and LineTerminator (LF, CR, U+2028,
// U+2029). Unlike [unicode.IsSpace] it removes U+FEFF and keeps U+0085.
func isJSSpace(r rune) bool {
	switch r {
	case '\t', '\n', '\v', '\f', '\r', ' ', 0x00A0, 0xFEFF, 0x2028, 0x2029:
		return true
	}
	return unicode.Is(unicode.Zs, r)
}

// trimLabel trims a progress label as the seed does (JavaScript's trim).
func trimLabel(s string) string { return strings.TrimFunc(s, isJSSpace) }

// labelLength is a label's length as the seed counts it: UTF-16 code units
// (JavaScript's String length), so a character outside the Basic
// Multilingual Plane, such as most emoji, counts two. s is valid UTF-8.
func labelLength(s string) int {
	n := 0
	for _, r := range s {
		n += utf16.RuneLen(r)
	}
	return n
}

// progressJob appends a progress entry to a claimed job, in the seed's
// order: [checkClaimed] (so a missing job is ErrNotFound whatever the
// entry), now not before UpdatedAt, then [checkProgressRequest]. The entry
// carries rev, the job's Attempts, the trimmed label and now; the list
// keeps the last ProgressLimit entries in a fresh slice. The claim stays.
func progressJob(j *Job, req ProgressRequest, generation uint64, now time.Time, rev uint64) (Job, error) {
	const op = "progress"
	if err := checkClaimed(op, j, req.Claim, generation, now); err != nil {
		return Job{}, err
	}
	if now.Before(j.UpdatedAt) {
		return Job{}, conflictf("%s: job %q: the store's time %s is before the job's UpdatedAt %s", op, j.ID, now.Format(time.RFC3339Nano), j.UpdatedAt.Format(time.RFC3339Nano))
	}
	label, err := checkProgressRequest(req)
	if err != nil {
		return Job{}, err
	}
	keep := j.Progress
	if len(keep) >= ProgressLimit {
		keep = keep[len(keep)-ProgressLimit+1:]
	}
	p := make([]Progress, 0, len(keep)+1)
	p = append(p, keep...)
	p = append(p, Progress{
		Revision: rev, Attempt: j.Attempts, Stage: req.Stage, Label: label,
		State: req.State, Reason: req.Reason, CreatedAt: now,
	})
	c := *j
	c.Progress = p
	c.Revision = rev
	c.UpdatedAt = now
	return c, nil
}

// prepareSettle validates a settle request: claim fields and Artifact JSON
// of at most ArtifactSizeLimit bytes (compact; nil for none).
func prepareSettle(req SettleRequest) (SettleRequest, error) {
	const op = "settle"
	if err := checkClaimFields(op, req.Claim); err != nil {
		return req, err
	}
	a, err := normJSON(op, "Artifact", req.Artifact, ArtifactSizeLimit)
	if err != nil {
		return req, err
	}
	req.Artifact = a
	return req, nil
}

// settleJob completes a claimed job ([checkClaimed] first) and returns it
// with its artifact, both stamped rev: completed, claim and reason cleared.
// A second settle fails the fence (the job is no longer running). A store
// that keeps artifacts apart must refuse to overwrite an existing one.
func settleJob(j *Job, req SettleRequest, generation uint64, now time.Time, rev uint64) (Job, Artifact, error) {
	if err := checkClaimed("settle", j, req.Claim, generation, now); err != nil {
		return Job{}, Artifact{}, err
	}
	c := finish(j, StateCompleted, "", now, rev)
	return c, Artifact{JobID: j.ID, Revision: rev, Value: req.Artifact, CreatedAt: now}, nil
}

// prepareFail validates a fail request: claim fields and Reason.
func prepareFail(req FailRequest) (FailRequest, error) {
	const op = "fail"
	if err := checkClaimFields(op, req.Claim); err != nil {
		return req, err
	}
	if err := checkString(op, "Reason", req.Reason, ReasonSizeLimit); err != nil {
		return req, err
	}
	return req, nil
}

// failJob gives a claimed job up ([checkClaimed] first): failed, claim
// cleared, Failures+1, Reason set, AvailableAt kept.
func failJob(j *Job, req FailRequest, generation uint64, now time.Time, rev uint64) (Job, error) {
	if err := checkClaimed("fail", j, req.Claim, generation, now); err != nil {
		return Job{}, err
	}
	c := finish(j, StateFailed, req.Reason, now, rev)
	c.Failures++
	return c, nil
}

// ---- Control calls ----

// checkControlled is the check of every control call: the job must exist in
// the channel (ErrNotFound), be in one of the allowed states, have the
// expected revision when expected is non-nil, and be of its target's
// current generation (ErrConflict otherwise).
func checkControlled(op string, j *Job, channelID, jobID string, expected *uint64, generation uint64, allowed ...State) error {
	if j == nil || j.ChannelID != channelID || j.ID != jobID {
		return notFoundf("%s: job %q does not exist in channel %q", op, jobID, channelID)
	}
	if expected != nil && *expected != j.Revision {
		return conflictf("%s: job %q: ExpectedRevision %d is not the job's revision %d: it changed", op, j.ID, *expected, j.Revision)
	}
	if !slices.Contains(allowed, j.State) {
		names := make([]string, len(allowed))
		for i, s := range allowed {
			names[i] = string(s)
		}
		return conflictf("%s: job %q is %s: %s needs %s", op, j.ID, j.State, op, strings.Join(names, " or "))
	}
	if j.TargetGeneration != generation {
		return conflictf("%s: job %q: target %q is at generation %d, the job's is %d: it changed", op, j.ID, j.TargetKey, generation, j.TargetGeneration)
	}
	return nil
}

// preparePause validates a pause request: the reference and Reason.
func preparePause(req PauseRequest) (PauseRequest, error) {
	const op = "pause"
	if err := checkJobRef(op, req.ChannelID, req.JobID); err != nil {
		return req, err
	}
	return req, checkString(op, "Reason", req.Reason, ReasonSizeLimit)
}

// pauseJob pauses a pending or running job with the expected revision:
// paused, claim cleared, Reason set, AvailableAt kept.
func pauseJob(j *Job, req PauseRequest, generation uint64, now time.Time, rev uint64) (Job, error) {
	if err := checkControlled("pause", j, req.ChannelID, req.JobID, &req.ExpectedRevision, generation, StatePending, StateRunning); err != nil {
		return Job{}, err
	}
	return finish(j, StatePaused, req.Reason, now, rev), nil
}

// prepareResume validates a resume request: the reference and AvailableAt
// (normalised; zero stays zero and means now).
func prepareResume(req ResumeRequest) (ResumeRequest, error) {
	const op = "resume"
	if err := checkJobRef(op, req.ChannelID, req.JobID); err != nil {
		return req, err
	}
	if err := checkTime(op, "AvailableAt", req.AvailableAt); err != nil {
		return req, err
	}
	req.AvailableAt = normTime(req.AvailableAt)
	return req, nil
}

// resumeJob makes a paused job with the expected revision pending again:
// reason cleared, AvailableAt = req.AvailableAt or now.
func resumeJob(j *Job, req ResumeRequest, generation uint64, now time.Time, rev uint64) (Job, error) {
	if err := checkControlled("resume", j, req.ChannelID, req.JobID, &req.ExpectedRevision, generation, StatePaused); err != nil {
		return Job{}, err
	}
	available := req.AvailableAt
	if available.IsZero() {
		available = now
	}
	c := finish(j, StatePending, "", now, rev)
	c.AvailableAt = available
	return c, nil
}

// prepareCancel validates a cancel request's reference. The store checks
// the channel is active (unless AllowArchived) with [config.channelActive]
// before reading the job.
func prepareCancel(req CancelRequest) (CancelRequest, error) {
	return req, checkJobRef("cancel", req.ChannelID, req.JobID)
}

// cancelJob cancels a pending, paused or running job (no expected
// revision): cancelled, claim and reason cleared.
func cancelJob(j *Job, req CancelRequest, generation uint64, now time.Time, rev uint64) (Job, error) {
	if err := checkControlled("cancel", j, req.ChannelID, req.JobID, nil, generation, StatePending, StatePaused, StateRunning); err != nil {
		return Job{}, err
	}
	return finish(j, StateCancelled, "", now, rev), nil
}

// prepareSupersede validates a supersede request: the reference and Reason.
func prepareSupersede(req SupersedeRequest) (SupersedeRequest, error) {
	const op = "supersede"
	if err := checkJobRef(op, req.ChannelID, req.JobID); err != nil {
		return req, err
	}
	return req, checkString(op, "Reason", req.Reason, ReasonSizeLimit)
}

// supersedeJob supersedes a pending, paused or running job with the
// expected revision: superseded, claim cleared, Reason set.
func supersedeJob(j *Job, req SupersedeRequest, generation uint64, now time.Time, rev uint64) (Job, error) {
	if err := checkControlled("supersede", j, req.ChannelID, req.JobID, &req.ExpectedRevision, generation, StatePending, StatePaused, StateRunning); err != nil {
		return Job{}, err
	}
	return finish(j, StateSuperseded, req.Reason, now, rev), nil
}

// ---- List and Get ----

// prepareList validates a list request: an empty ChannelID lists every
// channel; a State that is not valid or an empty type is ErrConflict;
// Limit is clamped to 1..ListLimit; the cursor is normalised (a copy, its
// ChannelID the listed channel when empty).
func prepareList(req ListRequest) (ListRequest, error) {
	const op = "list"
	if err := checkString(op, "ChannelID", req.ChannelID, IdentifierSizeLimit); err != nil {
		return req, err
	}
	for i, st := range req.States {
		if !st.Valid() {
			return req, conflictf("%s: States[%d] %q is not a job state", op, i, st)
		}
	}
	for i, typ := range req.Types {
		if typ == "" {
			return req, conflictf("%s: Types[%d] is empty", op, i)
		}
		if err := checkString(op, "Types["+strconv.Itoa(i)+"]", typ, IdentifierSizeLimit); err != nil {
			return req, err
		}
	}
	req.States = slices.Clone(req.States)
	req.Types = slices.Clone(req.Types)
	req.Limit = min(max(req.Limit, 1), ListLimit)
	if req.After != nil {
		if err := checkString(op, "After.ID", req.After.ID, IdentifierSizeLimit); err != nil {
			return req, err
		}
		if err := checkString(op, "After.ChannelID", req.After.ChannelID, IdentifierSizeLimit); err != nil {
			return req, err
		}
		if err := checkTime(op, "After.CreatedAt", req.After.CreatedAt); err != nil {
			return req, err
		}
		c := Cursor{CreatedAt: normTime(req.After.CreatedAt), ID: req.After.ID, ChannelID: req.After.ChannelID}
		if c.ChannelID == "" {
			c.ChannelID = req.ChannelID
		}
		req.After = &c
	}
	return req, nil
}

// listFiltered reports whether req lists only some states or types.
func listFiltered(req ListRequest) bool {
	return len(req.States) > 0 || len(req.Types) > 0
}

// listMatches reports whether j passes req's state and type filters.
func listMatches(req ListRequest, j *Job) bool {
	if len(req.States) > 0 && !slices.Contains(req.States, j.State) {
		return false
	}
	return len(req.Types) == 0 || slices.Contains(req.Types, j.Type)
}

// prepareGet validates a get's reference: an empty ChannelID or JobID is
// ErrNotFound.
func prepareGet(channelID, jobID string) error {
	const op = "get"
	if err := checkJobRef(op, channelID, jobID); err != nil {
		return err
	}
	if channelID == "" || jobID == "" {
		return notFoundf("%s: job %q does not exist in channel %q", op, jobID, channelID)
	}
	return nil
}

// listOrder orders a list (for slices.SortFunc): newest CreatedAt first,
// then ID ascending, then ChannelID ascending.
func listOrder(a, b *Job) int {
	if c := b.CreatedAt.Compare(a.CreatedAt); c != 0 {
		return c
	}
	if c := cmp.Compare(a.ID, b.ID); c != 0 {
		return c
	}
	return cmp.Compare(a.ChannelID, b.ChannelID)
}

// afterCursor reports whether j comes after c in list order.
func afterCursor(j *Job, c *Cursor) bool {
	if c == nil {
		return true
	}
	if x := j.CreatedAt.Compare(c.CreatedAt); x != 0 {
		return x < 0
	}
	if j.ID != c.ID {
		return j.ID > c.ID
	}
	return j.ChannelID > c.ChannelID
}

// cursorAt is the position of j in a list.
func cursorAt(j *Job) *Cursor {
	return &Cursor{CreatedAt: j.CreatedAt, ID: j.ID, ChannelID: j.ChannelID}
}

// listPage builds the page of a prepared request from the jobs of the
// listed channels (any order; the slice is sorted in place), stamped with
// the revision rev. summarize turns a job into its summary
// ([config.summarize]). Next is set when a job passing the filters
// remains after the page.
func listPage(jobs []*Job, req ListRequest, rev uint64, summarize func(*Job) Summary) Page {
	if listFiltered(req) {
		jobs = slices.DeleteFunc(jobs, func(j *Job) bool { return !listMatches(req, j) })
	}
	slices.SortFunc(jobs, listOrder)
	page, next := pageOf(jobs, req)
	out := Page{Revision: rev, Jobs: make([]Summary, 0, len(page)), Next: next}
	for _, j := range page {
		out.Jobs = append(out.Jobs, summarize(j))
	}
	return out
}

// listStart is the index in sorted (in list order) of the first job after
// req.After.
func listStart(sorted []*Job, req ListRequest) int {
	if req.After == nil {
		return 0
	}
	start, _ := slices.BinarySearchFunc(sorted, req.After, func(j *Job, c *Cursor) int {
		if afterCursor(j, c) {
			return 1
		}
		return -1
	})
	return start
}

// pageOf returns the jobs of sorted (in list order) that come after
// req.After, at most req.Limit of them, and the cursor of the next page:
// nil when no job remains after them.
func pageOf(sorted []*Job, req ListRequest) (page []*Job, next *Cursor) {
	rest := sorted[listStart(sorted, req):]
	page = rest[:min(len(rest), req.Limit)]
	if len(rest) > len(page) && len(page) > 0 {
		next = cursorAt(page[len(page)-1])
	}
	return page, next
}

// summary is j as a list shows it, without Subject; Progress is copied.
func summary(j *Job) Summary {
	return Summary{
		ID: j.ID, ChannelID: j.ChannelID, Type: j.Type, Version: j.Version, Origin: j.Origin,
		TargetKey: j.TargetKey, TargetGeneration: j.TargetGeneration, State: j.State,
		Revision: j.Revision, Attempts: j.Attempts, Failures: j.Failures,
		ClaimGeneration: j.ClaimGeneration, ClaimOwner: j.ClaimOwner, ClaimExpiresAt: j.ClaimExpiresAt,
		AvailableAt: j.AvailableAt, Reason: j.Reason, Progress: slices.Clone(j.Progress),
		CreatedAt: j.CreatedAt, UpdatedAt: j.UpdatedAt,
	}
}

// ---- Copies ----

// cloneRaw copies a JSON value (nil stays nil).
func cloneRaw(r json.RawMessage) json.RawMessage {
	if r == nil {
		return nil
	}
	return slices.Clone(r)
}

// cloneJob is a deep copy of j: no slice is shared.
func cloneJob(j Job) Job {
	j.Input = cloneRaw(j.Input)
	j.ClaimBinding = cloneRaw(j.ClaimBinding)
	j.Progress = slices.Clone(j.Progress)
	return j
}

// cloneArtifact is a deep copy of a (nil stays nil).
func cloneArtifact(a *Artifact) *Artifact {
	if a == nil {
		return nil
	}
	c := *a
	c.Value = cloneRaw(a.Value)
	return &c
}
