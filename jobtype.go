package jobkeys

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"
	"unicode/utf8"
)

// JobType is one job type of one service bound to its policy: the handle
// producers and workers call with just the job. Make one with
// [KeyCoordinator.JobType] when the program starts and share it; the names
// and the policy are checked once there, and every call after that only
// checks what varies with the job (its id, its payload, its options).
//
// A JobType never changes after it is made and is safe for concurrent use.
// The zero value is not usable.
type JobType struct {
	coord   *KeyCoordinator
	service string
	name    string
	policy  Policy // normalized, with a Key slice of its own; never modified
}

// JobType returns the handle of jobType of service under policy. service
// names the bucket (JOBS_KEYS_<service>) and jobType is one token of the KV
// key; a bad name is an error wrapping [ErrInvalidName]. policy is
// normalized ([Policy.Normalize]); a bad one is an error wrapping
// [ErrInvalidPolicy] that names the field. The handle keeps its own copy of
// the policy: changing policy afterwards does not change the handle.
//
// Every producer and worker of a job type must use the same policy: the key
// template decides which key a payload belongs to.
func (c *KeyCoordinator) JobType(service, jobType string, policy Policy) (*JobType, error) {
	if err := validateService(service); err != nil {
		return nil, err
	}
	if err := validateJobType(jobType); err != nil {
		return nil, err
	}
	p, err := policy.Normalize()
	if err != nil {
		return nil, err
	}
	return &JobType{coord: c, service: service, name: jobType, policy: p}, nil
}

// Service returns the service the job type belongs to.
func (jt *JobType) Service() string { return jt.service }

// Name returns the job type's name.
func (jt *JobType) Name() string { return jt.name }

// Policy returns the normalized policy: defaults filled in. The Key slice is
// a copy.
func (jt *JobType) Policy() Policy {
	p := jt.policy
	p.Key = slices.Clone(p.Key)
	return p
}

// Key derives the key payload belongs to under the job type's template:
// the KV key its state lives at (to watch it with a [Watcher], or look at
// it) and the display key. See [DeriveKey].
func (jt *JobType) Key(payload any) (JobKey, error) {
	return deriveKey(jt.service, jt.name, payload, jt.policy.Key)
}

// Admit queues job jobID under the key its payload derives, or rejects,
// coalesces or replaces as the policy's WhenFull says. payload is JSON text
// ([]byte or [encoding/json.RawMessage]) or a value [encoding/json.Marshal]
// encodes; see [DeriveKey]. A job id that is empty or not valid UTF-8 is an
// error wrapping [ErrInvalidRequest]; a payload the key template cannot
// resolve is one wrapping [ErrInvalidKey].
//
// Options: [WithStrictCreate], [WithTraceContext].
func (jt *JobType) Admit(ctx context.Context, jobID string, payload any, opts ...AdmitOption) (Admission, error) {
	key, err := jt.key(jobID, payload)
	if err != nil {
		return Admission{}, err
	}
	req := AdmitRequest{Service: jt.service, JobType: jt.name, JobID: jobID}
	for i, o := range opts {
		if o == nil {
			return Admission{}, fmt.Errorf("%w: admit option %d is nil", ErrInvalidRequest, i)
		}
		req = o.applyAdmit(req)
	}
	return jt.coord.admitKey(ctx, key, jt.policy, req)
}

// Acquire gives job jobID a slot on its payload's key if the rules allow;
// the outcome's Lease is what [JobType.Renew] and [JobType.Release] need.
// A job that was not admitted, and is not a retry ([WithRetry]), is blocked
// with [ReasonNotQueued]. Most workers call [Runner.Run] instead, which
// also renews and releases.
//
// An acquisition that returns an error leaves no slot of the job behind:
// when ctx ends (or the store fails) while its write is under way, the
// write may land all the same, so before returning it takes the slot back
// and puts the job back at the head of the queue, with one more
// compare-and-swap on a context that keeps ctx's values but not its
// cancellation (bounded by 10 s), which also makes sure the write can no
// longer land. Only if that fails too (the connection lost, say) may a
// slot the write took stay until its lease expires; a logger in
// [Config] hears of it.
//
// Options: [WithRetry], [WithTries], [WithInstanceID], [WithTraceContext].
func (jt *JobType) Acquire(ctx context.Context, jobID string, payload any, opts ...AcquireOption) (Acquisition, error) {
	key, err := jt.key(jobID, payload)
	if err != nil {
		return Acquisition{}, err
	}
	return jt.acquire(ctx, key, jobID, opts, nil)
}

// acquire is Acquire of job jobID, whose key (jt.key) is key, as try wt of
// a waiting Runner (nil: no such try; see waitTry).
func (jt *JobType) acquire(ctx context.Context, key JobKey, jobID string, opts []AcquireOption, wt *waitTry) (Acquisition, error) {
	req := AcquireRequest{Service: jt.service, JobType: jt.name, JobID: jobID}
	for i, o := range opts {
		if o == nil {
			return Acquisition{}, fmt.Errorf("%w: acquire option %d is nil", ErrInvalidRequest, i)
		}
		req = o.applyAcquire(req)
	}
	acq, err := jt.coord.acquireKey(ctx, key, jt.policy, req, wt)
	if acq.Kind == KindAcquired {
		// The lease is the caller's: it must not share the handle's template.
		acq.Lease.Policy = jt.Policy()
	}
	return acq, err
}

// Renew extends lease by the job type's HeartbeatTTL from now, or reports
// it lost (KindLost) when the slot was taken over or released. The TTL is
// the handle's, whatever lease.Policy says. A lease of another job type is
// an error wrapping [ErrInvalidRequest].
func (jt *JobType) Renew(ctx context.Context, lease Lease) (Renewal, error) {
	lease, err := jt.own(lease)
	if err != nil {
		return Renewal{}, err
	}
	return jt.coord.Renew(ctx, RenewRequest{Lease: lease})
}

// Release frees lease's slot, or reports a stale completion
// (KindStaleCompletion) when the slot was gone already (taken over or swept
// after the lease expired). A lease of another job type is an error
// wrapping [ErrInvalidRequest].
func (jt *JobType) Release(ctx context.Context, lease Lease) (ReleaseOutcome, error) {
	lease, err := jt.own(lease)
	if err != nil {
		return ReleaseOutcome{}, err
	}
	return jt.coord.Release(ctx, ReleaseRequest{Lease: lease})
}

// RemoveQueued takes job jobID out of its key's queue (KindRemoved), or
// reports that it was not queued (KindNotFound): for a job that ends before
// it starts, such as one whose publish failed after [JobType.Admit].
func (jt *JobType) RemoveQueued(ctx context.Context, jobID string, payload any) (Removal, error) {
	key, err := jt.key(jobID, payload)
	if err != nil {
		return Removal{}, err
	}
	return jt.coord.removeQueuedKey(ctx, key, jobID)
}

// RestoreReplaced undoes a replacement: it puts replaced (from
// Admission.Replaced) back at the head of the queue and takes job jobID,
// whose admission replaced it, out of the queue, for when jobID's publish
// failed. payload is jobID's payload.
func (jt *JobType) RestoreReplaced(ctx context.Context, jobID string, payload any, replaced ReplacedJob) (Restoration, error) {
	key, err := jt.key(jobID, payload)
	if err != nil {
		return Restoration{}, err
	}
	req := RestoreRequest{Service: jt.service, JobType: jt.name, ReplacementJobID: jobID, Replaced: replaced}
	return jt.coord.restoreKey(ctx, key, jt.policy, req)
}

// key checks jobID and derives payload's key with the handle's names and
// template, which were checked when the handle was made.
func (jt *JobType) key(jobID string, payload any) (JobKey, error) {
	if jobID == "" || !utf8.ValidString(jobID) {
		// Strings are stored as JSON text: invalid UTF-8 would come back
		// as U+FFFD and no longer match the job.
		return JobKey{}, fmt.Errorf("%w: job id %q is empty or not valid UTF-8", ErrInvalidRequest, jobID)
	}
	return deriveKey(jt.service, jt.name, payload, jt.policy.Key)
}

// own returns lease with the handle's policy, or an error if lease belongs
// to another job type.
func (jt *JobType) own(lease Lease) (Lease, error) {
	if err := zeroLease(lease); err != nil {
		return Lease{}, err
	}
	if lease.Service != jt.service || lease.JobType != jt.name {
		return Lease{}, fmt.Errorf("%w: lease of job %q is of job type %q of service %q, not %q of %q",
			ErrInvalidRequest, lease.JobID, lease.JobType, lease.Service, jt.name, jt.service)
	}
	lease.Policy = jt.policy
	return lease, nil
}

// AdmitOption changes how [JobType.Admit] queues a job.
type AdmitOption interface {
	// applyAdmit returns r with the option applied. (By value: a pointer
	// through an interface would move every request to the heap.)
	applyAdmit(r AdmitRequest) AdmitRequest
}

// AcquireOption changes how [JobType.Acquire] (and [Runner.Run]) takes a
// slot.
type AcquireOption interface {
	applyAcquire(r AcquireRequest) AcquireRequest // as applyAdmit
}

// JobOption is an option of both [JobType.Admit] and [JobType.Acquire].
type JobOption interface {
	AdmitOption
	AcquireOption
}

type admitOptionFunc func(AdmitRequest) AdmitRequest

func (f admitOptionFunc) applyAdmit(r AdmitRequest) AdmitRequest { return f(r) }

type acquireOptionFunc func(AcquireRequest) AcquireRequest

func (f acquireOptionFunc) applyAcquire(r AcquireRequest) AcquireRequest { return f(r) }

type traceOption TraceContext

func (o traceOption) applyAdmit(r AdmitRequest) AdmitRequest {
	r.Context = TraceContext(o)
	return r
}

func (o traceOption) applyAcquire(r AcquireRequest) AcquireRequest {
	r.Context = TraceContext(o)
	return r
}

// WithTraceContext records tc (W3C trace context) with the queued job or
// the slot. Without it, or when tc has neither TraceID nor Traceparent,
// the trace id, traceparent and tracestate come from the caller's
// OpenTelemetry span when ctx carries a valid one
// ([go.opentelemetry.io/otel/trace.SpanContextFromContext]); fields still
// empty are derived from the job id when written.
func WithTraceContext(tc TraceContext) JobOption { return traceOption(tc) }

// WithStrictCreate makes an admission to a full queue a rejection, whatever
// the policy's WhenFull says: the job is never coalesced and never replaces
// another.
func WithStrictCreate() AdmitOption {
	return admitOptionFunc(func(r AdmitRequest) AdmitRequest {
		r.StrictCreate = true
		return r
	})
}

// WithRetry lets a job that is not queued take a slot: a job that ran
// before, failed and released its slot, and runs again. The coordinator
// cannot check that the job really is a retry (see the package docs,
// "Retries").
func WithRetry() AcquireOption {
	return acquireOptionFunc(func(r AcquireRequest) AcquireRequest {
		r.Retry = true
		return r
	})
}

// WithTries records n, the attempt number, in the slot; it must be between
// 0 and 2^53-1. Without it the slot records 0.
func WithTries(n int) AcquireOption {
	return acquireOptionFunc(func(r AcquireRequest) AcquireRequest {
		r.Tries = n
		return r
	})
}

// WithInstanceID names the worker in the slot instead of
// Config.InstanceID; id must be valid UTF-8.
func WithInstanceID(id string) AcquireOption {
	return acquireOptionFunc(func(r AcquireRequest) AcquireRequest {
		r.InstanceID = id
		return r
	})
}

// The operations below take a key derived and a policy normalized by the
// caller ([JobType] or the request-struct methods) and check only the
// request's own fields.

func (c *KeyCoordinator) admitKey(ctx context.Context, key JobKey, policy Policy, req AdmitRequest) (Admission, error) {
	req.Context = spanTraceContext(ctx, req.Context)
	var out Admission
	var err error
	defer c.obs.end(ctx, metricOpAdmit, &key, c.obs.begin(), &out.Kind, &err)
	err = c.run(ctx, key, retry{assumeAbsent: true, stale: policy.StalePolicy}, func(st *KeyState, now time.Time) *KeyState {
		out = ReduceAdmission(st, key, req, policy, now)
		return out.State
	})
	if err != nil {
		return Admission{}, err
	}
	return out, nil
}

// acquireKey is the acquisition of req on key, as try wt of a waiting
// Runner (nil: no such try; see waitTry).
func (c *KeyCoordinator) acquireKey(ctx context.Context, key JobKey, policy Policy, req AcquireRequest, wt *waitTry) (Acquisition, error) {
	if req.Tries < 0 || int64(req.Tries) > 1<<53-1 {
		return Acquisition{}, fmt.Errorf("%w: Tries %d is not between 0 and 2^53-1", ErrInvalidRequest, req.Tries)
	}
	if req.InstanceID != "" && !utf8.ValidString(req.InstanceID) {
		return Acquisition{}, fmt.Errorf("%w: InstanceID %q is not valid UTF-8", ErrInvalidRequest, req.InstanceID)
	}
	if req.InstanceID == "" {
		req.InstanceID = c.cfg.InstanceID
	}
	token := c.cfg.NewSlotToken()
	if token == "" || !utf8.ValidString(token) {
		return Acquisition{}, fmt.Errorf("%w: Config.NewSlotToken returned %q, not a non-empty UTF-8 token", ErrInvalidRequest, token)
	}
	req.Context = spanTraceContext(ctx, req.Context)
	var out Acquisition
	var err error
	defer c.obs.acquired(ctx, &key, c.obs.begin(), &out, &err)
	if refuse := c.clockSkew(ctx, key.Service, policy); refuse != nil { // see clock.go
		err = refuse(fmt.Sprintf("acquisition of job %q on KV key %q", req.JobID, key.KVKey))
		return Acquisition{}, err
	}
	inTurn := wt != nil && wt.inTurn && !req.Retry
	// unsure says the write of an acquired slot failed with its outcome
	// unknown; queued is the job's queue entry in the state that write was
	// reduced from (nil: not queued), for undoAcquire.
	var unsure bool
	var queued *QueuedJob
	err = c.run(ctx, key, retry{stale: policy.StalePolicy, wait: wt, unsure: &unsure}, func(st *KeyState, now time.Time) *KeyState {
		if inTurn {
			wt.ahead = 0
			if st != nil {
				// Under Block an expired slot stays taken while the key is
				// at capacity, and counts as taken below it (see
				// ReduceAcquire): it frees no slot for the jobs ahead.
				limit := policy.MaxActive
				if policy.StalePolicy == Block {
					for k := range st.Active {
						if !st.Active[k].LeaseExpiresAt.After(now) {
							limit--
						}
					}
				}
				if behind, i, ok := queuedBehindIn(st, key, req.JobID, limit, now); ok && behind.Active < limit {
					// Slots are free, for jobs queued before it: its turn
					// comes after them (see waitTry.inTurn), unless all of
					// them wait here, in this process, where a wake-up is
					// handed over in memory and the first of them to reach
					// the key's lane may take a slot, in the batch of the
					// write that freed it. (With none free, the reducer
					// blocks it.)
					// A job queued past every wake-up's reach
					// (wakeTargetsMax past the free slots) is not held
					// back: no wake-up of the jobs ahead could come to it
					// (see wakeAhead), and the slot would stay free until
					// its turn's timer.
					free := limit - behind.Active
					if i < free+wakeTargetsMax && !c.waitHere(key, st.Queued[:free]) {
						behind.Active, behind.Limit = behind.Active+policy.MaxActive-limit, policy.MaxActive
						out, wt.ahead = behind, i-free+1
						return nil // writes nothing
					}
				}
			}
		}
		out = ReduceAcquire(st, key, req, policy, now, token)
		queued = nil
		if out.Kind == KindAcquired && st != nil {
			if i := indexQueued(st.Queued, req.JobID); i >= 0 {
				q := st.Queued[i]
				queued = &q
			}
		}
		return out.State
	})
	if err != nil && unsure {
		// The slot may be taken, or be taken yet, by a write whose reply
		// never came: no caller holds its lease. Take it back before
		// saying the acquisition failed.
		c.undoAcquire(ctx, key, policy, req.JobID, token, queued)
	}
	if errors.Is(err, errWakeLost) {
		// A woken waiter's write lost (see waitTry.wake): it is blocked
		// until the next wake-up, which the write it lost to sends if it
		// leaves a slot free.
		out, err = c.wakeLost(key, policy, req, wt), nil
	}
	if err != nil {
		return Acquisition{}, err
	}
	return out, nil
}

// wakeLost returns the blocked outcome of a woken try of req whose write
// lost its compare-and-swap (errWakeLost), which read nothing. Holding a
// state of the key now (the watch, or a wake-up in memory of a write of
// this process it lost to, may have brought it), it says what ReduceAcquire says on that state when that blocks the
// job for its slots (ReasonActiveLimit, or under StalePolicy Block
// ReasonStaleBlocked): the same reason and figures. Otherwise (that state
// would let it in, or blocks it for another reason a read should confirm,
// or the lost write left the key unknown) its figures are those of the
// live slots, the earliest expiry of theirs and the queued jobs, of the
// state held or, holding none, of the state the write was made on
// (wt.lostOn); under StalePolicy Block an expired slot counts as live. The
// write it lost to took that state's free slot, or may have: on that state
// the live slots are counted as at least the limit, which the outcome's
// reason says was met (ReasonStaleBlocked when Block keeps an expired slot
// of another job there, as ReduceAcquire would say at the limit).
func (c *KeyCoordinator) wakeLost(key JobKey, policy Policy, req AcquireRequest, wt *waitTry) Acquisition {
	out := Acquisition{Kind: KindBlocked, Reason: ReasonActiveLimit, DisplayKey: key.DisplayKey, KeyHash: key.KeyHash, Limit: policy.MaxActive}
	var st *KeyState
	if e := c.keys.entry(key.KVKey); e != nil {
		st, _, _ = e.Known()
	}
	held := st != nil
	if !held && wt != nil {
		st = wt.lostOn
	}
	if st == nil {
		return out
	}
	now := c.cfg.Now()
	if held {
		// A blocked outcome builds no state: the token is never used.
		if b := ReduceAcquire(st, key, req, policy, now, "-"); b.Kind == KindBlocked && (b.Reason == ReasonActiveLimit || b.Reason == ReasonStaleBlocked) {
			return b
		}
	}
	out.Queued = len(st.Queued)
	staleOthers := false
	for i := range st.Active {
		if exp := st.Active[i].LeaseExpiresAt; exp.After(now) {
			out.Active++
			if out.NextExpiry.IsZero() || exp.Before(out.NextExpiry) {
				out.NextExpiry = exp
			}
		} else if policy.StalePolicy == Block {
			out.Active++ // an expired slot Block keeps (see ReduceAcquire)
			staleOthers = staleOthers || st.Active[i].JobID != req.JobID
		}
	}
	if !held {
		out.Active = max(out.Active, policy.MaxActive)
		if staleOthers {
			out.Reason = ReasonStaleBlocked
		}
	}
	return out
}

// waitHere reports whether every one of jobs waits for its wake-ups in
// this coordinator's store (see localWaiters).
func (c *KeyCoordinator) waitHere(key JobKey, jobs []QueuedJob) bool {
	l, ok := c.wakes.(localWaiters)
	if !ok {
		return false
	}
	for i := range jobs {
		if !l.waitsFor(key.Service, key.KVKey, jobs[i].JobID) {
			return false
		}
	}
	return true
}

func (c *KeyCoordinator) removeQueuedKey(ctx context.Context, key JobKey, jobID string) (Removal, error) {
	var out Removal
	var err error
	defer c.obs.end(ctx, metricOpRemove, &key, c.obs.begin(), &out.Kind, &err)
	err = c.update(ctx, key, false, func(st *KeyState, now time.Time) *KeyState {
		out = ReduceRemoveQueued(st, jobID, now)
		return out.State
	})
	if err != nil {
		return Removal{}, err
	}
	return out, nil
}

func (c *KeyCoordinator) restoreKey(ctx context.Context, key JobKey, policy Policy, req RestoreRequest) (Restoration, error) {
	if req.Replaced.ID == "" || !utf8.ValidString(req.Replaced.ID) {
		return Restoration{}, fmt.Errorf("%w: Replaced.ID %q is empty or not valid UTF-8", ErrInvalidRequest, req.Replaced.ID)
	}
	if !inJSYears(req.Replaced.CreatedAt) {
		return Restoration{}, fmt.Errorf("%w: Replaced.CreatedAt %v is outside the years 0000 to 9999", ErrInvalidRequest, req.Replaced.CreatedAt)
	}
	var out Restoration
	var err error
	defer c.obs.restored(ctx, &key, c.obs.begin(), &out, &err)
	err = c.run(ctx, key, retry{stale: policy.StalePolicy}, func(st *KeyState, now time.Time) *KeyState {
		out = ReduceRestoreReplaced(st, key, req, policy, now)
		return out.State
	})
	if err != nil {
		return Restoration{}, err
	}
	return out, nil
}
