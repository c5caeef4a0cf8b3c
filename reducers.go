package jobkeys

import (
	"time"
)

// Kind names the outcome of an operation. Business outcomes (rejected,
// blocked, lost, ...) are values, not errors.
type Kind string

// Outcome kinds. Their string values are the names the wire format's
// other implementations use.
const (
	KindAccepted        Kind = "accepted"         // Admit: the job was queued (or already there)
	KindRejected        Kind = "rejected"         // Admit: the queue is full and the job was not queued
	KindCoalesced       Kind = "coalesced"        // Admit: the job folds into an existing one
	KindReplaced        Kind = "replaced"         // Admit: the oldest queued job was dropped for this one
	KindAcquired        Kind = "acquired"         // Acquire: the job holds a slot
	KindBlocked         Kind = "blocked"          // Acquire: no slot for the job now
	KindRenewed         Kind = "renewed"          // Renew: the lease was extended
	KindLost            Kind = "lost"             // Renew: the slot is gone (taken over or released)
	KindReleased        Kind = "released"         // Release: the slot was freed
	KindStaleCompletion Kind = "stale-completion" // Release: the slot was already gone
	KindRemoved         Kind = "removed"          // RemoveQueued: the queued job was removed
	KindNotFound        Kind = "not-found"        // RemoveQueued: the job was not queued
)

// Reason says why an admission was rejected or coalesced, or why an
// acquisition was blocked.
type Reason string

// Reasons.
const (
	ReasonActiveLimit   Reason = "active-limit"   // every slot is taken
	ReasonQueueDepth    Reason = "queue-depth"    // the queue is at its limit
	ReasonStaleBlocked  Reason = "stale-blocked"  // an expired slot is kept under the Block stale policy
	ReasonNotQueued     Reason = "not-queued"     // the job was never admitted (and is not a retry)
	ReasonQueueFull     Reason = "queue-full"     // coalesced into the oldest queued job
	ReasonAlreadyActive Reason = "already-active" // the job already holds a live slot
)

// JobRef identifies a job.
type JobRef struct {
	Service string // the job's service
	JobType string // the job's type
	ID      string // the job id
}

// ReplacedJob is a queued job that [ReplaceOldest] dropped. Pass it to
// RestoreReplaced to put it back if the replacing job cannot be published.
type ReplacedJob struct {
	JobRef
	CreatedAt time.Time    // when the dropped job was admitted
	RequestID string       // its request id
	Context   TraceContext // its trace context
}

// Admission is the outcome of Admit.
type Admission struct {
	Kind       Kind   // accepted, rejected, coalesced or replaced
	DisplayKey string // display key
	KeyHash    string // the key hash
	// AlreadyPresent is set with KindAccepted when the job id was already
	// queued or active: no second entry was added.
	AlreadyPresent bool
	Reason         Reason       // KindRejected, KindCoalesced
	Active         int          // KindRejected: active slots seen
	Queued         int          // KindRejected: queued jobs seen
	Limit          int          // KindRejected: the limit that was hit
	Existing       *JobRef      // KindCoalesced: the job the new one folds into
	Replaced       *ReplacedJob // KindReplaced: the dropped job
	// State is the new key state when the operation changed it, else nil.
	State *KeyState
}

// Acquisition is the outcome of Acquire.
type Acquisition struct {
	Kind       Kind   // acquired or blocked
	DisplayKey string // display key
	KeyHash    string // the key hash
	// Lease is the slot's lease (KindAcquired): pass it to Renew and Release.
	Lease Lease
	// Stale lists expired slots of other jobs that this acquisition dropped
	// under FailStale; record those jobs as failed.
	Stale  []ActiveSlot
	Reason Reason // KindBlocked
	Active int    // KindBlocked: live slots seen
	Queued int    // KindBlocked: queued jobs seen
	Limit  int    // KindBlocked: the limit that was hit
	// NextExpiry (KindBlocked) is the earliest lease expiry after now among
	// the key's slots, zero if none: a slot whose lease runs out frees up
	// without any write to the key, so a waiter should look again then.
	NextExpiry time.Time
	// StoredLimits is set when the key's state was last written under
	// other limits than this acquisition's policy (a producer or worker
	// binary with another policy, or a policy changed since): it holds the
	// limits the state recorded. The acquisition applied its own policy's
	// limits and, if it wrote, recorded those instead. Nil when they agree
	// or the key had no state.
	StoredLimits *Limits
	State        *KeyState // the new key state (KindAcquired), else nil
}

// Limits are a key's admission limits as its state records them
// (KeyState.MaxActive and MaxQueuedPerKey).
type Limits struct {
	MaxActive       int // the most slots
	MaxQueuedPerKey int // the most queued jobs beyond the free slots
}

// Lease is a job's hold on a slot, returned by Acquire. It is a plain value:
// copy it freely.
type Lease struct {
	Service        string    // the job's service
	JobType        string    // the job's type
	JobID          string    // the job holding the slot
	DisplayKey     string    // display key
	KeyHash        string    // the key hash
	SlotToken      string    // the slot's token; Renew and Release must present it
	Policy         Policy    // the normalized policy the slot was acquired under
	LeaseExpiresAt time.Time // when the lease lapses unless renewed
}

// Renewal is the outcome of Renew.
type Renewal struct {
	Kind           Kind      // renewed or lost
	LeaseExpiresAt time.Time // KindRenewed: the new expiry
	State          *KeyState // the new key state (KindRenewed), else nil
}

// ReleaseOutcome is the outcome of a release (ReduceRelease, Release).
type ReleaseOutcome struct {
	Kind  Kind      // released or stale-completion
	State *KeyState // the new key state when it changed, else nil
}

// Removal is the outcome of RemoveQueued.
type Removal struct {
	Kind  Kind      // removed or not-found
	State *KeyState // the new key state when it changed, else nil
}

// Restoration is the outcome of RestoreReplaced: the replaced job is
// queued again (or was already queued or active).
type Restoration struct {
	State *KeyState // the new key state when it changed, else nil
}

// jsNow returns t as key state holds times: UTC, milliseconds.
func jsNow(t time.Time) time.Time { return t.UTC().Truncate(time.Millisecond) }

func emptyState(key JobKey, policy Policy, now time.Time) *KeyState {
	return &KeyState{
		Version:         StateVersion,
		Service:         key.Service,
		JobType:         key.JobType,
		DisplayKey:      key.DisplayKey,
		KeyHash:         key.KeyHash,
		MaxActive:       policy.MaxActive,
		MaxQueuedPerKey: policy.MaxQueuedPerKey,
		UpdatedAt:       now,
	}
}

func indexQueued(q []QueuedJob, jobID string) int {
	for i := range q {
		if q[i].JobID == jobID {
			return i
		}
	}
	return -1
}

func indexActive(a []ActiveSlot, jobID string) int {
	for i := range a {
		if a[i].JobID == jobID {
			return i
		}
	}
	return -1
}

// ReduceAdmission applies the admission rules to state (nil when the key has
// none) for job req.JobID under policy, which must come from
// [Policy.Normalize]; key is the job's derived key. req.Payload and
// req.Policy are not read. It is pure: the same inputs give the same outcome,
// and state is not modified.
//
// The queue limit is policy.MaxQueuedPerKey plus the free slots. Below it the
// job is accepted; at it a strict create is rejected, and otherwise
// policy.WhenFull decides. A job id already queued or active is accepted
// without a second entry.
func ReduceAdmission(state *KeyState, key JobKey, req AdmitRequest, policy Policy, now time.Time) Admission {
	now = jsNow(now)
	if state == nil {
		state = emptyState(key, policy, now)
	}
	out := Admission{DisplayKey: state.DisplayKey, KeyHash: state.KeyHash}
	if indexQueued(state.Queued, req.JobID) >= 0 || indexActive(state.Active, req.JobID) >= 0 {
		out.Kind, out.AlreadyPresent = KindAccepted, true
		return out
	}
	active, queued := len(state.Active), len(state.Queued)
	queueLimit := policy.MaxQueuedPerKey + max(0, policy.MaxActive-active)
	if queued < queueLimit {
		out.Kind, out.State = KindAccepted, appendQueued(state.clone(), req, policy, now)
		return out
	}
	if !req.StrictCreate {
		if policy.WhenFull == Coalesce && (queued > 0 || active > 0) {
			out.Kind = KindCoalesced
			if queued > 0 {
				out.Existing = &JobRef{Service: state.Service, JobType: state.JobType, ID: state.Queued[0].JobID}
				out.Reason = ReasonQueueFull
			} else {
				out.Existing = &JobRef{Service: state.Service, JobType: state.JobType, ID: state.Active[0].JobID}
				out.Reason = ReasonActiveLimit
			}
			return out
		}
		if policy.WhenFull == ReplaceOldest && queued > 0 {
			old := state.Queued[0]
			next := state.rebuilt(len(state.Active), len(state.Queued))
			next.Active = append(next.Active, state.Active...)
			next.Queued = append(next.Queued, state.Queued[1:]...)
			out.Kind = KindReplaced
			out.Replaced = &ReplacedJob{
				JobRef:    JobRef{Service: state.Service, JobType: state.JobType, ID: old.JobID},
				CreatedAt: old.CreatedAt,
				RequestID: old.RequestID,
				Context:   old.Context,
			}
			out.State = appendQueued(next, req, policy, now)
			return out
		}
	}
	out.Kind, out.Active, out.Queued = KindRejected, active, queued
	if active >= policy.MaxActive {
		out.Reason, out.Limit = ReasonActiveLimit, policy.MaxActive
	} else {
		out.Reason, out.Limit = ReasonQueueDepth, queueLimit
	}
	return out
}

func appendQueued(s *KeyState, req AdmitRequest, policy Policy, now time.Time) *KeyState {
	ctx := wireContext(req.Context, req.JobID, "")
	s.MaxActive = policy.MaxActive
	s.MaxQueuedPerKey = policy.MaxQueuedPerKey
	s.Queued = append(s.Queued, QueuedJob{JobID: req.JobID, CreatedAt: now, RequestID: ctx.RequestID, Context: ctx})
	s.UpdatedAt = now
	return s
}

// ReduceRestoreReplaced puts replaced back at the head of the queue and
// removes the job that replaced it (replacementJobID) from the queue: what a
// producer does when publishing the replacing job fails. If replaced is
// already queued or active it is not added twice. policy must come from
// [Policy.Normalize]. Pure.
func ReduceRestoreReplaced(state *KeyState, key JobKey, req RestoreRequest, policy Policy, now time.Time) Restoration {
	now = jsNow(now)
	base := state
	if base == nil {
		base = emptyState(key, policy, now)
	}
	next := base.rebuilt(len(base.Active), len(base.Queued)+1)
	next.Active = append(next.Active, base.Active...)
	for _, q := range base.Queued {
		if q.JobID != req.ReplacementJobID {
			next.Queued = append(next.Queued, q)
		}
	}
	present := indexQueued(next.Queued, req.Replaced.ID) >= 0 || indexActive(base.Active, req.Replaced.ID) >= 0
	if !present {
		ctx := wireContext(req.Replaced.Context, req.Replaced.ID, "")
		reqID := req.Replaced.RequestID
		if reqID == "" {
			reqID = ctx.RequestID
		}
		next.Queued = append(next.Queued, QueuedJob{})
		copy(next.Queued[1:], next.Queued)
		next.Queued[0] = QueuedJob{JobID: req.Replaced.ID, CreatedAt: jsNow(req.Replaced.CreatedAt), RequestID: reqID, Context: ctx}
	}
	if state != nil && present && len(next.Queued) == len(state.Queued) &&
		state.MaxActive == policy.MaxActive && state.MaxQueuedPerKey == policy.MaxQueuedPerKey {
		return Restoration{} // nothing to change
	}
	next.MaxActive = policy.MaxActive
	next.MaxQueuedPerKey = policy.MaxQueuedPerKey
	next.UpdatedAt = now
	return Restoration{State: next}
}

// ReduceAcquire gives job req.JobID a slot if the rules allow, with the new
// slot's token slotToken. policy must come from [Policy.Normalize]. Pure.
//
// A slot whose lease expired at or before now is stale. A job's own stale
// slots are replaced by this acquisition (a retry after a crash); a job with
// a live slot of its own is blocked with [ReasonAlreadyActive]. Other stale slots
// are dropped and reported under FailStale, and block the key while it is at
// capacity under Block. The job must be queued, or a retry (req.Retry or an
// own stale slot); otherwise it is blocked with [ReasonNotQueued].
func ReduceAcquire(state *KeyState, key JobKey, req AcquireRequest, policy Policy, now time.Time, slotToken string) Acquisition {
	now = jsNow(now)
	base := state
	if base == nil {
		base = emptyState(key, policy, now)
	}
	out := Acquisition{DisplayKey: base.DisplayKey, KeyHash: base.KeyHash}
	if state != nil && (state.MaxActive != policy.MaxActive || state.MaxQueuedPerKey != policy.MaxQueuedPerKey) {
		out.StoredLimits = &Limits{MaxActive: state.MaxActive, MaxQueuedPerKey: state.MaxQueuedPerKey}
	}
	blocked := func(reason Reason, active, limit int) Acquisition {
		out.Kind, out.Reason, out.Active, out.Queued, out.Limit = KindBlocked, reason, active, len(base.Queued), limit
		for i := range base.Active {
			if e := base.Active[i].LeaseExpiresAt; e.After(now) && (out.NextExpiry.IsZero() || e.Before(out.NextExpiry)) {
				out.NextExpiry = e
			}
		}
		return out
	}

	// The job's own slots (other writers may have written more than one): a
	// live one blocks; expired ones are replaced by this acquisition.
	ownSlots, others, staleOthers := 0, 0, 0
	for i := range base.Active {
		slot := &base.Active[i]
		live := slot.LeaseExpiresAt.After(now)
		switch {
		case slot.JobID == req.JobID && live:
			return blocked(ReasonAlreadyActive, len(base.Active), policy.MaxActive)
		case slot.JobID == req.JobID:
			ownSlots++
		case live:
			others++
		default:
			others++
			staleOthers++
		}
	}
	if staleOthers > 0 && policy.StalePolicy == Block && others >= policy.MaxActive {
		return blocked(ReasonStaleBlocked, len(base.Active), policy.MaxActive)
	}
	live := others
	if policy.StalePolicy == FailStale {
		live -= staleOthers
	}
	isQueued := indexQueued(base.Queued, req.JobID) >= 0
	if !isQueued && ownSlots == 0 && !req.Retry {
		return blocked(ReasonNotQueued, live, policy.MaxQueuedPerKey)
	}
	if live >= policy.MaxActive {
		return blocked(ReasonActiveLimit, live, policy.MaxActive)
	}

	next := base.rebuilt(len(base.Active)+1, len(base.Queued))
	taken := 0
	for _, slot := range base.Active {
		switch {
		case slot.JobID == req.JobID: // expired, checked above
			taken++
		case policy.StalePolicy == FailStale && !slot.LeaseExpiresAt.After(now):
			taken++
			out.Stale = append(out.Stale, slot)
		default:
			next.Active = append(next.Active, slot)
		}
	}
	if isQueued {
		for _, q := range base.Queued {
			if q.JobID != req.JobID {
				next.Queued = append(next.Queued, q)
			}
		}
	} else {
		next.Queued = append(next.Queued, base.Queued...)
	}
	expires := now.Add(policy.HeartbeatTTL).Truncate(time.Millisecond)
	next.Active = append(next.Active, ActiveSlot{
		JobID:          req.JobID,
		SlotToken:      slotToken,
		InstanceID:     req.InstanceID,
		StartedAt:      now,
		HeartbeatAt:    now,
		LeaseExpiresAt: expires,
		Tries:          req.Tries,
		Context:        wireContext(req.Context, req.JobID, slotToken),
	})
	next.MaxActive = policy.MaxActive
	next.MaxQueuedPerKey = policy.MaxQueuedPerKey
	next.StaleTakeoverCount += taken
	next.UpdatedAt = now
	out.Kind, out.State = KindAcquired, next
	out.Lease = Lease{
		Service: next.Service, JobType: next.JobType, JobID: req.JobID,
		DisplayKey: next.DisplayKey, KeyHash: next.KeyHash, SlotToken: slotToken,
		Policy: policy, LeaseExpiresAt: expires,
	}
	return out
}

// ReduceRenew extends the lease of the slot that matches lease.JobID and
// lease.SlotToken by lease.Policy.HeartbeatTTL from now, or reports it lost.
// Pure.
func ReduceRenew(state *KeyState, lease Lease, now time.Time) Renewal {
	now = jsNow(now)
	if state == nil {
		return Renewal{Kind: KindLost}
	}
	for i := range state.Active {
		slot := &state.Active[i]
		if slot.JobID != lease.JobID || slot.SlotToken != lease.SlotToken {
			continue
		}
		next := state.clone()
		expires := now.Add(lease.Policy.HeartbeatTTL).Truncate(time.Millisecond)
		next.Active[i].HeartbeatAt = now
		next.Active[i].LeaseExpiresAt = expires
		next.UpdatedAt = now
		return Renewal{Kind: KindRenewed, LeaseExpiresAt: expires, State: next}
	}
	return Renewal{Kind: KindLost}
}

// ReduceRelease frees the slot that matches lease.JobID and
// lease.SlotToken, or reports a stale completion when it is gone. Pure.
func ReduceRelease(state *KeyState, lease Lease, now time.Time) ReleaseOutcome {
	now = jsNow(now)
	if state == nil {
		return ReleaseOutcome{Kind: KindStaleCompletion}
	}
	for i := range state.Active {
		slot := &state.Active[i]
		if slot.JobID != lease.JobID || slot.SlotToken != lease.SlotToken {
			continue
		}
		next := state.rebuilt(len(state.Active)-1, len(state.Queued))
		next.Active = append(append(next.Active, state.Active[:i]...), state.Active[i+1:]...)
		next.Queued = append(next.Queued, state.Queued...)
		next.UpdatedAt = now
		return ReleaseOutcome{Kind: KindReleased, State: next}
	}
	return ReleaseOutcome{Kind: KindStaleCompletion}
}

// ReduceRemoveQueued removes job jobID from the queue, or reports it not
// found. Pure.
func ReduceRemoveQueued(state *KeyState, jobID string, now time.Time) Removal {
	now = jsNow(now)
	if state == nil {
		return Removal{Kind: KindNotFound}
	}
	i := indexQueued(state.Queued, jobID)
	if i < 0 {
		return Removal{Kind: KindNotFound}
	}
	next := state.rebuilt(len(state.Active), len(state.Queued)-1)
	next.Active = append(next.Active, state.Active...)
	for _, q := range state.Queued {
		if q.JobID != jobID {
			next.Queued = append(next.Queued, q)
		}
	}
	next.UpdatedAt = now
	return Removal{Kind: KindRemoved, State: next}
}
