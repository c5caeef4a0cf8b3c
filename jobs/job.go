package jobs

import (
	"context"
	"encoding/json"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel/metric"
)

// State is where a job is in its lifecycle. Pending, paused and running jobs
// are active; completed, failed, cancelled and superseded jobs are terminal
// and never change again.
type State string

// The states of a job.
const (
	// StatePending: waiting to be claimed once AvailableAt has come.
	StatePending State = "pending"
	// StatePaused: held by an operator; Resume makes it pending again.
	StatePaused State = "paused"
	// StateRunning: claimed by ClaimOwner until ClaimExpiresAt.
	StateRunning State = "running"
	// StateCompleted: settled with an artifact.
	StateCompleted State = "completed"
	// StateFailed: given up by its worker (Fail).
	StateFailed State = "failed"
	// StateCancelled: cancelled by an operator.
	StateCancelled State = "cancelled"
	// StateSuperseded: replaced by a newer job for the same target, or
	// superseded explicitly.
	StateSuperseded State = "superseded"
)

// Valid reports whether s is one of the seven states.
func (s State) Valid() bool {
	switch s {
	case StatePending, StatePaused, StateRunning, StateCompleted, StateFailed, StateCancelled, StateSuperseded:
		return true
	}
	return false
}

// Active reports whether s is pending, paused or running: a state a job can
// leave.
func (s State) Active() bool {
	return s == StatePending || s == StatePaused || s == StateRunning
}

// Job is a job record as a store holds it. Values a store returns are copies:
// changing them changes nothing stored. Times are in UTC without a monotonic
// clock reading.
type Job struct {
	// ID identifies the job; unique within its channel.
	ID string `json:"id"`
	// ChannelID is the channel (a tenant, a workspace) the job belongs to.
	ChannelID string `json:"channelId"`
	// Type is the kind of work, such as "render".
	Type string `json:"type"`
	// Version is the version of Type's input format; at least 1.
	Version int `json:"version"`
	// Origin says who enqueued the job ("scheduler", "planner", "user", …);
	// it may be empty.
	Origin string `json:"origin,omitempty"`
	// TargetKey is the resource the job updates. A newer job for the same
	// target supersedes the older active ones.
	TargetKey string `json:"targetKey"`
	// TargetGeneration is 1 for a target's first job, 2 for the next, …
	// Only a job of the target's current generation can be claimed or
	// controlled.
	TargetGeneration uint64 `json:"targetGeneration"`
	// IdempotencyKey is unique per channel: an enqueue with a key already
	// used returns the existing job.
	IdempotencyKey string `json:"idempotencyKey"`
	// Fingerprint identifies the request content: a replay of an
	// IdempotencyKey with another fingerprint is a conflict.
	Fingerprint string `json:"fingerprint"`
	// Input is the job's input, compact JSON; nil when none (or null).
	Input json.RawMessage `json:"input,omitempty"`
	// State is the lifecycle state.
	State State `json:"state"`
	// Revision is the channel revision of the job's last change.
	Revision uint64 `json:"revision"`
	// Attempts counts the claims so far.
	Attempts int `json:"attempts"`
	// Failures counts the attempts that consumed the failure budget (a
	// Requeue with CountFailure, a Fail).
	Failures int `json:"failures"`
	// ClaimGeneration fences claimed calls: it grows by one on every claim.
	ClaimGeneration uint64 `json:"claimGeneration"`
	// ClaimOwner is the worker holding the claim; set only while running.
	ClaimOwner string `json:"claimOwner,omitempty"`
	// ClaimBinding is what the last Renew bound to the claim; nil when none.
	ClaimBinding json.RawMessage `json:"claimBinding,omitempty"`
	// ClaimExpiresAt is when the claim lapses; zero when not running.
	ClaimExpiresAt time.Time `json:"claimExpiresAt,omitzero"`
	// AvailableAt is the earliest time a pending job may be claimed.
	AvailableAt time.Time `json:"availableAt"`
	// Reason says why the job was last requeued, failed, paused or
	// superseded explicitly; empty otherwise.
	Reason string `json:"reason,omitempty"`
	// Progress holds the last ProgressLimit progress entries, oldest first.
	Progress []Progress `json:"progress,omitempty"`
	// CreatedAt is when the job was enqueued.
	CreatedAt time.Time `json:"createdAt"`
	// UpdatedAt is when the job last changed, by the clock of the store
	// that changed it: before CreatedAt (or an earlier UpdatedAt) when
	// that clock was behind (see Clocks in the package doc).
	UpdatedAt time.Time `json:"updatedAt"`
}

// ProgressState is the state a progress entry reports for its stage.
type ProgressState string

// The progress states.
const (
	// ProgressStarted: the stage began.
	ProgressStarted ProgressState = "started"
	// ProgressCompleted: the stage finished.
	ProgressCompleted ProgressState = "completed"
	// ProgressInterrupted: the stage stopped early; the entry has a Reason.
	ProgressInterrupted ProgressState = "interrupted"
)

// Valid reports whether s is one of the three progress states.
func (s ProgressState) Valid() bool {
	return s == ProgressStarted || s == ProgressCompleted || s == ProgressInterrupted
}

// Progress is one entry of a job's progress log.
type Progress struct {
	// Revision is the channel revision of the change that appended it.
	Revision uint64 `json:"revision"`
	// Attempt is the job's Attempts when the entry was appended.
	Attempt int `json:"attempt"`
	// Stage names the stage; it matches ^[a-z][a-z0-9-]{0,63}$.
	Stage string `json:"stage"`
	// Label is a human-readable description, trimmed, of 1 to LabelLimit
	// UTF-16 code units (see ProgressRequest.Label).
	Label string `json:"label"`
	// State is the stage's state.
	State ProgressState `json:"state"`
	// Reason is required for ProgressInterrupted and empty otherwise; it
	// matches ^[a-z][a-z0-9-]{0,63}$.
	Reason string `json:"reason,omitempty"`
	// CreatedAt is when the entry was appended.
	CreatedAt time.Time `json:"createdAt"`
}

// Target is the generation counter of one target key in a channel.
type Target struct {
	// ChannelID is the target's channel.
	ChannelID string `json:"channelId"`
	// TargetKey is the resource, as in [Job.TargetKey].
	TargetKey string `json:"targetKey"`
	// Generation is the generation of the target's newest job.
	Generation uint64 `json:"generation"`
}

// Artifact is the immutable result a job was settled with.
type Artifact struct {
	// JobID is the settled job.
	JobID string `json:"jobId"`
	// Revision is the channel revision of the settle.
	Revision uint64 `json:"revision"`
	// Value is the result, compact JSON; nil when none (or null).
	Value json.RawMessage `json:"value,omitempty"`
	// CreatedAt is when the job was settled.
	CreatedAt time.Time `json:"createdAt"`
}

// Detail is a job with its target and artifact.
type Detail struct {
	// Revision is the channel revision when the detail was read.
	Revision uint64
	// Target is the job's target as it is now (its Generation may be newer
	// than the job's TargetGeneration).
	Target Target
	// Job is the job.
	Job Job
	// Artifact is the job's artifact; nil unless the job completed.
	Artifact *Artifact
}

// Summary is a job as a list shows it: without Input, Fingerprint,
// IdempotencyKey and ClaimBinding, with the Subject [Config.Subject] gives it.
type Summary struct {
	// The fields of the job, as in [Job].
	ID               string
	ChannelID        string
	Type             string
	Version          int
	Origin           string
	TargetKey        string
	TargetGeneration uint64
	State            State
	Revision         uint64
	Attempts         int
	Failures         int
	ClaimGeneration  uint64
	ClaimOwner       string
	ClaimExpiresAt   time.Time
	AvailableAt      time.Time
	Reason           string
	Progress         []Progress
	CreatedAt        time.Time
	UpdatedAt        time.Time
	// Subject is what [Config.Subject] returned for the job; empty when no
	// Subject function is configured.
	Subject string
}

// Cursor is a position in a list: the list continues after the job with
// this CreatedAt, ID and ChannelID.
type Cursor struct {
	// CreatedAt is the CreatedAt of the job the page ended with.
	CreatedAt time.Time
	// ID is the ID of the job the page ended with.
	ID string
	// ChannelID is the channel of the job the page ended with: it orders
	// jobs of equal CreatedAt and ID in a list of every channel (ids are
	// unique per channel only). Empty in a list of one channel means that
	// channel.
	ChannelID string
}

// Page is one page of a list, newest jobs first.
type Page struct {
	// Revision is the channel revision when the page was read; 0 for a
	// channel without jobs. A list of every channel carries the latest
	// revision of any channel (0 when no channel has jobs).
	Revision uint64
	// Jobs are the page's jobs, ordered by CreatedAt descending, then ID,
	// then ChannelID.
	Jobs []Summary
	// Next continues the list; nil on its last page.
	Next *Cursor
}

// Claim is the claim a worker holds on a running job; every claimed call
// presents it. [ClaimOf] gives the claim of a claimed job. A claim is lost
// — its calls are ErrConflict — once the job is no longer running under
// this owner and generation, the claim expired, or a newer job of the
// target exists.
type Claim struct {
	// ChannelID is the job's channel.
	ChannelID string
	// JobID is the claimed job.
	JobID string
	// Owner is the claiming worker ([ClaimRequest.Owner]).
	Owner string
	// Generation is the job's ClaimGeneration when it was claimed.
	Generation uint64
}

// ClaimOf returns the claim j is held by: its channel, id, owner and claim
// generation.
func ClaimOf(j Job) Claim {
	return Claim{ChannelID: j.ChannelID, JobID: j.ID, Owner: j.ClaimOwner, Generation: j.ClaimGeneration}
}

// EnqueueRequest asks for a new job. A [Store] requires every field
// marked so; [Client.Enqueue] and [Client.EnqueueMany] need only Type and
// Input, and give the others their defaults (see Client.Enqueue).
type EnqueueRequest struct {
	// ID of the new job; unique within the channel. Required (the
	// client's default: [NewID]).
	ID string
	// ChannelID is the channel; it must exist ([Config.Channels]). Required
	// (the client's default: [ChannelDefault]).
	ChannelID string
	// Type of work. Required.
	Type string
	// Version of the input format; at least 1 (the client's default: its
	// kind's version).
	Version int
	// Origin says who enqueues; optional.
	Origin string
	// TargetKey is the resource the job updates: a newer job for it
	// supersedes the older active ones. Required (the client's default:
	// the ID, which supersedes nothing).
	TargetKey string
	// IdempotencyKey makes the enqueue idempotent within the channel.
	// Required (the client's default: the ID).
	IdempotencyKey string
	// Fingerprint identifies the request content. Required (the client's
	// default: [Fingerprint] of Type, Version and Input).
	Fingerprint string
	// Input is JSON of at most InputSizeLimit bytes; empty or null for none.
	Input json.RawMessage
	// AvailableAt is the earliest claim time; zero: now.
	AvailableAt time.Time
}

// Enqueued is the outcome of an enqueue.
type Enqueued struct {
	// Job is the new job, or the existing job as it is now when Repeated.
	Job Job
	// Repeated reports an enqueue whose idempotency key was already used
	// with the same fingerprint: nothing was changed.
	Repeated bool
	// Superseded are the jobs of the target this enqueue superseded (its
	// active jobs of older generations), as they are stored after it;
	// nil when Repeated or when none was active.
	Superseded []Job
}

// ClaimRequest asks for due jobs.
type ClaimRequest struct {
	// ChannelID limits the claim to one channel; empty: every channel.
	ChannelID string
	// Owner names the claiming worker. Required.
	Owner string
	// Count is the most jobs to claim; positive, capped at ClaimCountLimit.
	Count int
	// TTL is how long the claims last; positive.
	TTL time.Duration
}

// ClaimJobRequest asks for one named job (see [Store.ClaimJob]).
type ClaimJobRequest struct {
	// ChannelID and JobID name the job. Required.
	ChannelID, JobID string
	// Owner names the claiming worker. Required.
	Owner string
	// TTL is how long the claim lasts; positive.
	TTL time.Duration
}

// RenewRequest extends a claim.
type RenewRequest struct {
	// Claim is the claim the worker holds ([ClaimOf]).
	Claim Claim
	// ExpectedRevision must be the job's current Revision.
	ExpectedRevision uint64
	// TTL from now; the new expiry must be later than the current one.
	TTL time.Duration
	// Binding is JSON of at most BindingSizeLimit bytes bound to the claim
	// (such as a key-layer lease); empty or null clears it.
	Binding json.RawMessage
}

// RequeueRequest hands a claimed job back as pending.
type RequeueRequest struct {
	// Claim is the claim the worker holds ([ClaimOf]).
	Claim Claim
	// AvailableAt is when it may be claimed again; zero: now.
	AvailableAt time.Time
	// Reason says why; optional, at most ReasonSizeLimit bytes.
	Reason string
	// CountFailure adds one to the job's Failures.
	CountFailure bool
}

// ProgressRequest appends a progress entry to a claimed job.
type ProgressRequest struct {
	// Claim is the claim the worker holds ([ClaimOf]).
	Claim Claim
	// Stage matches ^[a-z][a-z0-9-]{0,63}$.
	Stage string
	// Label is 1–LabelLimit UTF-16 code units (JavaScript's String length:
	// a character outside the Basic Multilingual Plane counts two) after
	// trimming what JavaScript's String.prototype.trim trims (Unicode
	// space separators, TAB, VT, FF, LF, CR, U+2028, U+2029 and U+FEFF;
	// not U+0085), as in the seed. It is stored trimmed.
	Label string
	// State of the stage.
	State ProgressState
	// Reason is required for ProgressInterrupted, forbidden otherwise; it
	// matches ^[a-z][a-z0-9-]{0,63}$.
	Reason string
}

// SettleRequest completes a claimed job with its artifact.
type SettleRequest struct {
	// Claim is the claim the worker holds ([ClaimOf]).
	Claim Claim
	// Artifact is JSON of at most ArtifactSizeLimit bytes; empty or null
	// for none.
	Artifact json.RawMessage
}

// FailRequest gives a claimed job up.
type FailRequest struct {
	// Claim is the claim the worker holds ([ClaimOf]).
	Claim Claim
	// Reason says why; optional, at most ReasonSizeLimit bytes.
	Reason string
}

// PauseRequest pauses a pending or running job.
type PauseRequest struct {
	// ChannelID and JobID name the job.
	ChannelID, JobID string
	// ExpectedRevision must be the job's current Revision.
	ExpectedRevision uint64
	// Reason says why; optional, at most ReasonSizeLimit bytes.
	Reason string
}

// ResumeRequest makes a paused job pending again.
type ResumeRequest struct {
	// ChannelID and JobID name the job.
	ChannelID, JobID string
	// ExpectedRevision must be the job's current Revision.
	ExpectedRevision uint64
	// AvailableAt is when it may be claimed; zero: now.
	AvailableAt time.Time
}

// CancelRequest cancels a pending, paused or running job.
type CancelRequest struct {
	// ChannelID and JobID name the job.
	ChannelID, JobID string
	// AllowArchived permits cancelling a job of a channel that exists but
	// is not active ([ChannelRegistry.ChannelActive]).
	AllowArchived bool
}

// SupersedeRequest supersedes a pending, paused or running job.
type SupersedeRequest struct {
	// ChannelID and JobID name the job.
	ChannelID, JobID string
	// ExpectedRevision must be the job's current Revision.
	ExpectedRevision uint64
	// Reason says why; optional, at most ReasonSizeLimit bytes.
	Reason string
}

// ListRequest asks for a page of a channel's jobs, or of every channel's,
// optionally only those in some states or of some types.
type ListRequest struct {
	// ChannelID is the channel; it must exist. Empty lists every channel
	// (the channel registry is not asked).
	ChannelID string
	// States keeps only the jobs in one of these states; empty: every
	// state. A state that is not one of the State constants is ErrConflict.
	States []State
	// Types keeps only the jobs of one of these types; empty: every type.
	// An empty type is ErrConflict.
	Types []string
	// Limit is the page size, clamped to 1..ListLimit.
	Limit int
	// After continues a list from a previous Page.Next; nil: from the newest.
	After *Cursor
}

// Store holds job records. Implementations ([MemoryStore], [NATSStore]) are
// safe for concurrent use and pass the conformance suite of package
// jobstest. Errors wrap [ErrConflict], [ErrNotFound], [ErrCorrupt] or
// [ErrUnavailable], or are the context's error unchanged.
type Store interface {
	// Enqueue adds a job, or returns the existing one when the idempotency
	// key was used before with the same fingerprint (another fingerprint is
	// ErrConflict). A missing channel is ErrNotFound; an empty identifier,
	// Version < 1, an id used in the channel or an oversize field is
	// ErrConflict. The new job supersedes the active jobs of older
	// generations of its target in the same change, and returns them in
	// Enqueued.Superseded.
	Enqueue(ctx context.Context, req EnqueueRequest) (Enqueued, error)
	// Claim claims up to req.Count due jobs (at most ClaimCountLimit) of
	// req.ChannelID, or of every channel when it is empty, ordered by due
	// time, creation time and id. None due is an empty slice and no error;
	// an empty Owner or a Count or TTL below 1 is ErrConflict. A returned
	// error never comes with claimed jobs: a Claim that fails after
	// claiming some (its ctx ended, the store stopped answering) returns
	// those and no error, and the next call reports the failure. A stored
	// record that does not validate is skipped, never claimed or
	// overwritten; when nothing else was claimed the call returns an error
	// wrapping ErrCorrupt naming every record it skipped.
	Claim(ctx context.Context, req ClaimRequest) ([]Job, error)
	// ClaimJob claims the job req names if Claim could claim it now (of its
	// target's current generation, pending and due, or running with an
	// expired claim), as Claim claims it: one compare-and-swap on the job,
	// whatever the number of other jobs. A job not in the channel is
	// ErrNotFound; a job that is not claimable now, an empty Owner, JobID or
	// ChannelID, or a TTL below 1 is ErrConflict. It is how a worker takes a
	// job it was told of (the runtime's dispatch) instead of searching.
	ClaimJob(ctx context.Context, req ClaimJobRequest) (Job, error)
	// Renew extends a claim and sets its binding. A job not in the channel
	// is ErrNotFound; a lost claim (see [Claim]), another revision than
	// ExpectedRevision or an expiry not later than the current one is
	// ErrConflict.
	Renew(ctx context.Context, req RenewRequest) (Job, error)
	// Requeue makes a claimed job pending again at req.AvailableAt,
	// counting a failure when asked. Errors as for Renew.
	Requeue(ctx context.Context, req RequeueRequest) (Job, error)
	// AppendProgress appends a progress entry to a claimed job, keeping the
	// last ProgressLimit; the claim stays. A bad stage, label, state or
	// reason is ErrConflict; other errors as for Renew.
	AppendProgress(ctx context.Context, req ProgressRequest) (Job, error)
	// Settle completes a claimed job and stores its artifact, once: a
	// second settle is ErrConflict (the claim is gone). Errors as for Renew.
	Settle(ctx context.Context, req SettleRequest) (Detail, error)
	// Fail gives a claimed job up, counting a failure. Errors as for Renew.
	Fail(ctx context.Context, req FailRequest) (Job, error)
	// Pause pauses a pending or running job of its target's current
	// generation whose revision is req.ExpectedRevision. A job not in the
	// channel is ErrNotFound; another revision, state or generation is
	// ErrConflict.
	Pause(ctx context.Context, req PauseRequest) (Job, error)
	// Resume makes a paused job pending. Errors as for Pause.
	Resume(ctx context.Context, req ResumeRequest) (Job, error)
	// Cancel cancels a pending, paused or running job, whatever its
	// revision. A job of an archived channel needs AllowArchived
	// (ErrConflict otherwise); other errors as for Pause.
	Cancel(ctx context.Context, req CancelRequest) (Job, error)
	// Supersede supersedes a pending, paused or running job. Errors as for
	// Pause.
	Supersede(ctx context.Context, req SupersedeRequest) (Job, error)
	// List returns a page of a channel's jobs (of every channel's when
	// req.ChannelID is empty), newest first, only those in req.States and
	// of req.Types when given. A missing channel is ErrNotFound; a channel
	// without jobs is an empty page with Revision 0. Next is nil exactly
	// when no job after the page passes the filters.
	List(ctx context.Context, req ListRequest) (Page, error)
	// Get returns a job with its target and artifact. A missing channel or
	// job is ErrNotFound.
	Get(ctx context.Context, channelID, jobID string) (Detail, error)
	// DeleteChannel removes the channel's jobs, targets, idempotency keys,
	// artifacts and revision: an identical enqueue afterwards makes a new
	// job. Deleting a channel without jobs is no error. It runs
	// Config.Guard first, as every write does (the seed's does not assert
	// the writer lease).
	DeleteChannel(ctx context.Context, channelID string) error
}

// Config configures a store. The zero value (or a nil *Config) is usable:
// the system clock, every channel exists and is active, no guard, no
// subjects.
type Config struct {
	// Now is the store's clock. Defaults to time.Now.
	Now func() time.Time
	// Channels says which channels exist and which are active. Defaults to
	// nil: every channel exists and is active.
	Channels ChannelRegistry
	// Guard runs before every write, DeleteChannel included; an error it
	// returns fails the write as ErrConflict (wrapping the error too). Use
	// it to assert a writer lease.
	// Defaults to nil: no guard.
	Guard func(ctx context.Context) error
	// Subject gives a listed job its Summary.Subject. Defaults to nil: no
	// subjects.
	Subject func(jobType string, input json.RawMessage) string
	// MeterProvider receives the store's metrics: its transitions by
	// outcome and job type, their latency, and gauges of pending and
	// running jobs by type (see the package docs, "Metrics and logs").
	// Pass otel.GetMeterProvider() for the global one. Defaults to
	// nil: no metrics, and no cost.
	MeterProvider metric.MeterProvider
	// Logger receives the store's logs: corrupt records (error, naming the
	// job and the KV key); a NATSStore's background purges the server
	// refuses (a warning, once per store). Defaults to nil: no logs.
	Logger *slog.Logger
}

// ChannelRegistry tells a store which channels exist and which are active
// (an inactive channel is archived). It must be safe for concurrent use.
// Its errors fail the store call as ErrUnavailable.
type ChannelRegistry interface {
	ChannelExists(ctx context.Context, channelID string) (bool, error)
	ChannelActive(ctx context.Context, channelID string) (bool, error)
}
