package jobs

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jobkeys/jobkeys"
)

// Runtime defaults, used for zero-valued [ClientConfig] fields.
const (
	ServiceDefault           = "jobs"
	MaxWorkersDefault        = 10
	PollIntervalDefault      = time.Second
	RecheckIntervalDefault   = 5 * time.Second
	AdmitGraceDefault        = 30 * time.Second
	ReconcileIntervalDefault = 30 * time.Second
	StopGraceDefault         = 10 * time.Second
	UnknownKindDelayDefault  = time.Minute
	MaxFailuresDefault       = 5
	BackoffBaseDefault       = time.Second
	BackoffCapDefault        = 5 * time.Minute
)

// DefaultBackoff is the retry delay after the failures-th failure:
// 1 s · 2^(failures−1), capped at 5 minutes.
func DefaultBackoff(failures int) time.Duration {
	return ExponentialBackoff(BackoffBaseDefault, BackoffCapDefault)(failures)
}

// ExponentialBackoff returns a backoff of base · 2^(failures−1), capped at
// limit (and base for failures below 1).
func ExponentialBackoff(base, limit time.Duration) func(failures int) time.Duration {
	return func(failures int) time.Duration {
		d := base
		for i := 1; i < failures && d < limit; i++ {
			d *= 2
		}
		return min(d, limit)
	}
}

// ClientConfig configures a [Client]. Only KeyStore is required, by
// [NewClient]; [NewNATSClient] makes the key store, and needs nothing.
type ClientConfig struct {
	// KeyStore is the key store the coordinator was made with. The client
	// reads it to hand a slot's room on (see Dispatch in the package doc)
	// and lists and reads it to reconcile queue entries against job
	// records. Required by NewClient; NewNATSClient refuses one (it makes
	// its own).
	KeyStore jobkeys.Store

	// Service is the key-layer service of every kind: the key bucket is
	// JOBS_KEYS_<Service>. Defaults to ServiceDefault ("jobs").
	Service string

	// Owner names this client in the claims it takes: at most
	// IdentifierSizeLimit bytes of valid UTF-8. Defaults to the
	// coordinator's instance id and a random suffix, unique per client.
	Owner string

	// MaxWorkers bounds how many handlers this client runs at once, beside
	// the per-key limits of the kinds' policies. Defaults to
	// MaxWorkersDefault (10).
	MaxWorkers int

	// PollInterval is how often a client whose clock is too far from the
	// NATS server's (see Clock skew in the package doc) looks again
	// whether it may take jobs. Defaults to PollIntervalDefault (1s).
	PollInterval time.Duration

	// RecheckInterval is how long an announced job that could not be
	// looked at (the store or the key layer failed) is left before a
	// worker looks at it again. Defaults to RecheckIntervalDefault (5s).
	RecheckInterval time.Duration

	// AdmitGrace is how long after its creation a pending job without a
	// key admission is left to its producer (which writes the record, then
	// the admission) before a client's checker admits it, strictly (see
	// Dispatch in the package doc), and how long a queue entry whose job
	// record is missing is kept before reconciliation removes it. Defaults
	// to AdmitGraceDefault (30s).
	AdmitGrace time.Duration

	// ReconcileInterval is how often the client reconciles (sweeps expired
	// slots, removes queue entries of finished or missing jobs); negative
	// disables it. Defaults to ReconcileIntervalDefault (30s).
	ReconcileInterval time.Duration

	// StopGrace is how long [Client.Stop] lets running handlers finish
	// before it cancels them. Defaults to StopGraceDefault (10s).
	StopGrace time.Duration

	// UnknownKindDelay is how long a claimed job of a type (or version)
	// this client has no kind for is handed back for, without a failure.
	// Defaults to UnknownKindDelayDefault (1m).
	UnknownKindDelay time.Duration

	// Backoff is the retry delay after a job's n-th failure. Defaults to
	// DefaultBackoff (1 s · 2^(n−1), capped at 5 minutes).
	Backoff func(failures int) time.Duration

	// Now is the clock for the times the client computes (retry times).
	// It should be the store's clock. Defaults to time.Now.
	Now func() time.Time

	// JetStream is the connection the client's dispatch runs over: the
	// service's dispatch stream, JOBS_DISPATCH_<Service>, created when
	// missing (with the job bucket's storage and replicas, or file storage
	// and one replica when the job store is not a [NATSStore]). Defaults to
	// the job store's connection when it is a NATSStore and KeyStore is not
	// a [jobkeys.MemoryStore]. Without either, jobs are dispatched within
	// this process only: the clients of one [MemoryStore] share its queue,
	// a client of another store has its own.
	JetStream jetstream.JetStream

	// Logger receives what the client cannot return to a caller (a failed
	// heartbeat, a reconciliation error). Defaults to none.
	Logger *slog.Logger

	// Buckets is how [NewNATSClient] opens and creates the job bucket and
	// the key bucket; [NewClient], whose stores the caller made, refuses
	// a non-zero one. Defaults to the zero [Buckets]: the default job
	// bucket, missing buckets created with file storage and one replica.
	Buckets Buckets

	// Retention is how long finished jobs are kept, by final state, before
	// their records and entries are deleted (see [Retention]); the client
	// hands it to its store, which applies it to every job that finishes
	// from then on. Defaults to 24h for completed, cancelled and
	// superseded jobs and 7 days for failed ones.
	Retention Retention

	// Periodic are the jobs enqueued on a schedule while the client runs
	// (see [Periodic]): one job per tick whatever the number of clients.
	// Each Type must be registered when Start is called. Defaults to none.
	Periodic []Periodic
}

// Client is the job runtime: it enqueues jobs through the job store and
// the key layer as one outcome, and runs the registered kinds' jobs under
// their keys' limits. Make it with [NewNATSClient] (or [NewClient] for
// stores of your own), register kinds with
// [Register], then [Client.Start] it; [Client.Stop] drains it. A Client is
// safe for concurrent use; any number of clients, in any number of
// processes, may share a store and a key bucket.
type Client struct {
	store Store
	coord *jobkeys.KeyCoordinator
	cfg   ClientConfig

	mu       sync.Mutex
	kinds    map[string]*kind
	state    clientState
	runs     map[jobRef]*activeRun   // jobs this client holds a claim on
	byTarget map[jobRef][]*activeRun // the same, by channel and target key
	stopCh   chan struct{}           // closed by Stop: no new jobs taken
	killCh   chan struct{}           // closed when StopGrace passed: cancel handlers
	wg       sync.WaitGroup          // the workers and the reconciliation loop
	bgCancel context.CancelFunc
	// reconcileCancel ends the reconciliation pass in flight; set by Start
	// when it reconciles.
	reconcileCancel context.CancelFunc
	claimTTL        time.Duration // the longest HeartbeatTTL of the kinds; set by Start
	// skewLimit is the least proven clock offset from the NATS server at
	// which the workers take nothing (see claimSkewLimit); set by Start.
	// skewed is whether the last check found it, guarded by skewMu.
	skewLimit time.Duration
	skewed    bool
	skewMu    sync.Mutex // serializes the takers' clock checks

	// disp carries the announcements that jobs may start (see
	// dispatcher); dispOwned says whether Stop closes it.
	disp      dispatcher
	dispOwned bool
	peeker    jobPeeker // the store, when it reads a record alone; else nil

	// made is the job store NewNATSClient made, which Stop closes; nil
	// for a client of NewClient.
	made *NATSStore
	// periodic enqueues ClientConfig.Periodic's jobs; set by Start when
	// there are any.
	periodic *periodicRunner
}

type clientState int

const (
	clientNew clientState = iota
	clientStarted
	clientStopped
)

type jobRef struct{ channel, id string }

// NewClient returns a client over store and coord. cfg holds the
// required KeyStore; a bad field is an error naming it.
func NewClient(store Store, coord *jobkeys.KeyCoordinator, cfg *ClientConfig) (*Client, error) {
	if store == nil || coord == nil {
		return nil, errors.New("jobs: NewClient: store and coordinator are required")
	}
	if cfg == nil || cfg.KeyStore == nil {
		return nil, errors.New("jobs: NewClient: ClientConfig.KeyStore is required")
	}
	if cfg.Buckets != (Buckets{}) {
		return nil, errors.New("jobs: NewClient: ClientConfig.Buckets is set, which only NewNATSClient reads: NewClient uses the stores it is given")
	}
	c := *cfg
	if c.Service == "" {
		c.Service = ServiceDefault
	}
	if c.Owner == "" {
		var b [6]byte
		_, _ = rand.Read(b[:])
		c.Owner = coord.InstanceID() + "-" + hex.EncodeToString(b[:])
	}
	if len(c.Owner) > IdentifierSizeLimit {
		return nil, fmt.Errorf("jobs: NewClient: ClientConfig.Owner is over %d bytes", IdentifierSizeLimit)
	}
	if !utf8.ValidString(c.Owner) {
		return nil, fmt.Errorf("jobs: NewClient: ClientConfig.Owner %q is not valid UTF-8, which the store refuses in a claim", c.Owner)
	}
	for _, d := range []struct {
		name string
		v    *time.Duration
		def  time.Duration
	}{
		{"PollInterval", &c.PollInterval, PollIntervalDefault},
		{"RecheckInterval", &c.RecheckInterval, RecheckIntervalDefault},
		{"AdmitGrace", &c.AdmitGrace, AdmitGraceDefault},
		{"StopGrace", &c.StopGrace, StopGraceDefault},
		{"UnknownKindDelay", &c.UnknownKindDelay, UnknownKindDelayDefault},
	} {
		switch {
		case *d.v == 0:
			*d.v = d.def
		case *d.v < 0:
			return nil, fmt.Errorf("jobs: NewClient: ClientConfig.%s %v is negative", d.name, *d.v)
		}
	}
	if c.ReconcileInterval == 0 {
		c.ReconcileInterval = ReconcileIntervalDefault
	}
	switch {
	case c.MaxWorkers == 0:
		c.MaxWorkers = MaxWorkersDefault
	case c.MaxWorkers < 0:
		return nil, fmt.Errorf("jobs: NewClient: ClientConfig.MaxWorkers %d is negative", c.MaxWorkers)
	}
	if c.Backoff == nil {
		c.Backoff = DefaultBackoff
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if err := useRetention(store, c.Retention); err != nil {
		return nil, fmt.Errorf("jobs: NewClient: %w", err)
	}
	disp, owned, err := openDispatch(store, &c)
	if err != nil {
		return nil, fmt.Errorf("jobs: NewClient: %w", err)
	}
	cl := &Client{
		coord: coord, cfg: c, disp: disp, dispOwned: owned,
		kinds:    make(map[string]*kind),
		runs:     make(map[jobRef]*activeRun),
		byTarget: make(map[jobRef][]*activeRun),
		stopCh:   make(chan struct{}),
		killCh:   make(chan struct{}),
	}
	cl.store = announcingStore{Store: store, c: cl}
	cl.peeker, _ = store.(jobPeeker)
	return cl, nil
}

// Owner returns the name this client claims jobs under.
func (c *Client) Owner() string { return c.cfg.Owner }

// Outcome is how an enqueue ended (a rejection is a [*RejectedError]).
type Outcome string

// Enqueue outcomes.
const (
	// OutcomeAccepted: the job is pending and queued on its key.
	OutcomeAccepted Outcome = "accepted"
	// OutcomeCoalesced: the key's queue was full and the job folded into
	// the existing job, which EnqueueResult.Job is. The new job's record
	// is superseded with reason "coalesced".
	OutcomeCoalesced Outcome = "coalesced"
	// OutcomeReplaced: the job is pending and queued, and the oldest queued
	// job of its key was dropped: its record (EnqueueResult.Replaced) is
	// superseded with reason "replaced".
	OutcomeReplaced Outcome = "replaced"
)

// Reasons the runtime writes into job records.
const (
	ReasonReplaced  = "replaced"  // superseded: a newer job replaced it in its key's queue
	ReasonCoalesced = "coalesced" // superseded: folded into an existing job of its key
	ReasonRejected  = "rejected"  // superseded: its key's queue was full
	ReasonBadKey    = "bad-key"   // superseded: its input derives no key under its kind's policy
)

// EnqueueResult is the outcome of [Client.Enqueue].
type EnqueueResult struct {
	// Outcome says how the enqueue ended.
	Outcome Outcome
	// Job is the new job (accepted, replaced) or the existing job the new
	// one folded into (coalesced); with Repeated, the job enqueued before
	// under the same idempotency key, as it is now (for a coalesced one,
	// its own superseded record, unless the replay made the admission).
	Job Job
	// Replaced is the replaced job's record (OutcomeReplaced), else nil.
	Replaced *Job
	// Repeated reports a replay of an idempotency key: the store wrote no
	// new job, and Outcome is the first enqueue's as the record tells it
	// (OutcomeAccepted or OutcomeCoalesced: OutcomeReplaced is reported as
	// OutcomeAccepted, and a rejected or bad-key job replays its error).
	// A replay of a job whose record was written and never admitted on its
	// key (its first enqueue failed or crashed in between) makes that
	// admission, with the writes it takes (the queue entry; a replaced,
	// coalesced or rejected record superseded), and reports its outcome as
	// a first enqueue would.
	Repeated bool
	// Key is the display key the job was admitted under (empty when
	// Repeated and the record alone told the outcome).
	Key string
	// Superseded are the jobs of the new job's target that this enqueue
	// superseded (the target's older active jobs; see
	// EnqueueRequest.TargetKey), as stored after it: their State is
	// StateSuperseded with an empty Reason. nil when Repeated, and
	// when the target had no active job — always so for a request whose
	// TargetKey defaulted to its (new) ID.
	Superseded []Job
}

// ErrRejected reports an enqueue its key's policy rejected; the error is
// a [*RejectedError].
var ErrRejected = errors.New("jobs: rejected by key policy")

// RejectedError is the error of an enqueue its key's policy rejected. The
// new job's record is left superseded with reason "rejected": no pending
// record remains. A replay of the enqueue (its idempotency key again) is
// the same error with Repeated set: the record keeps the outcome, not the
// key, the reason or the counts, which are then zero (unless the replay
// made the admission its first enqueue had not made, and saw them).
type RejectedError struct {
	Job      Job            // the rejected job's record
	Key      string         // the display key
	Reason   jobkeys.Reason // why: the limit that was hit
	Active   int            // active slots seen
	Queued   int            // queued jobs seen
	Limit    int            // the limit
	Repeated bool           // a replay of the enqueue
}

// Error says which job was rejected on which key, and by which limit.
func (e *RejectedError) Error() string {
	if e.Repeated && e.Key == "" {
		return fmt.Sprintf("jobs: job %q of type %q was rejected by its key policy (a replay of its enqueue)", e.Job.ID, e.Job.Type)
	}
	return fmt.Sprintf("jobs: job %q of type %q rejected on key %q: %s (limit %d, %d active, %d queued)",
		e.Job.ID, e.Job.Type, e.Key, e.Reason, e.Limit, e.Active, e.Queued)
}

// Unwrap returns ErrRejected.
func (e *RejectedError) Unwrap() error { return ErrRejected }

// Enqueue writes the job record and admits it on its key under its kind's
// policy, as one outcome. req.Type must be a registered kind; only Type
// and Input are needed, and the fields left empty default (here, in the
// client: a [Store]'s Enqueue keeps its contract and refuses them):
//
//   - Version: the kind's version;
//   - ID: a new id of [NewID] (unique, ordered by time);
//   - ChannelID: [ChannelDefault] ("default");
//   - TargetKey: the ID, so that the job supersedes no other job; give
//     the resource the job updates to have a newer job for it supersede
//     the older ones (reported in EnqueueResult.Superseded);
//   - IdempotencyKey: the ID, so that a request with neither ID nor
//     IdempotencyKey is never a replay (set either to make replays, as
//     after an [ErrOutcomeUnknown], return the first enqueue's job);
//   - Fingerprint: [Fingerprint] of the type, version and input.
//
// The store's rules apply first:
// idempotency (a replay returns the job as it is, Repeated, with the first
// enqueue's outcome: a rejection again, for one) and target supersede (an
// older job of the target running in this client sees its context end at
// once with [ErrSuperseded]; in another, at its next heartbeat). A rejection is a [*RejectedError] (match [ErrRejected]). A
// job is never coalesced into one that is over (whose slot is not released
// yet): such an enqueue is admitted strictly, accepted or rejected.
//
// An Input that does not decode into the kind's input type (as its Work
// would decode it, when req.Version is the kind's) is an error wrapping
// [ErrConflict], and nothing is written; except a JSON Input that derives
// no key under the kind's policy either, which is refused as an Input
// that derives no key is (an error wrapping [jobkeys.ErrInvalidKey], its
// record superseded with ReasonBadKey).
//
// The record is written first, then the admission. A crash between them
// leaves a pending job without an admission, which a replay of the
// enqueue makes (see below), and otherwise a client's checker after
// AdmitGrace, strictly (never replacing or coalescing another job), on a
// check this call scheduled before writing the record.
//
// An error that matches [ErrOutcomeUnknown] is an enqueue that may have
// written, or did write, more than it says: the record's write had no
// answer (a timeout, a lost connection), or the record was written and a
// later step failed (the admission, or the supersede of the replaced,
// coalesced or rejected record). The error says what stands and names
// the job and its idempotency key. Replay the request (the same
// idempotency key and fingerprint): a replay returns the job with the
// outcome that stands, and makes an admission the record never got. Any
// other error (an unknown kind, an invalid or conflicting request, a
// write the store refused, a read that failed before the write) wrote
// nothing, except a rejection or a bad key, which leave the record
// superseded as they say.
//
// A replay costs a read of the job's key (no write) when the job's
// record is pending or paused and never claimed: that is how it learns
// whether the admission was made.
func (c *Client) Enqueue(ctx context.Context, req EnqueueRequest) (EnqueueResult, error) {
	k, err := c.kindOf(req.Type)
	if err != nil {
		return EnqueueResult{}, err
	}
	return c.enqueue(ctx, k, withDefaults(req, k))
}

// withDefaults fills the empty fields of req, of kind k, as Enqueue
// documents.
func withDefaults(req EnqueueRequest, k *kind) EnqueueRequest {
	if req.Version == 0 {
		req.Version = k.version
	}
	if req.ID == "" {
		req.ID = NewID()
	}
	if req.ChannelID == "" {
		req.ChannelID = ChannelDefault
	}
	if req.TargetKey == "" {
		req.TargetKey = req.ID
	}
	if req.IdempotencyKey == "" {
		req.IdempotencyKey = req.ID
	}
	if req.Fingerprint == "" {
		req.Fingerprint = Fingerprint(req.Type, req.Version, req.Input)
	}
	return req
}

// enqueue is Enqueue of a request of kind k with its defaults applied.
func (c *Client) enqueue(ctx context.Context, k *kind, req EnqueueRequest) (EnqueueResult, error) {
	if req.Version == k.version {
		// An input the kind's Work cannot decode would fail every attempt.
		// (An input that derives no key goes on: its record is superseded
		// as a bad key, below.)
		if err := k.decode(req.Input); err != nil && k.derives(req.Input) {
			return EnqueueResult{}, conflictf("enqueue job %q of type %q: its Input does not decode into the kind's input type, as every attempt would decode it: %v", req.ID, req.Type, err)
		}
	}
	enq, err := c.write(ctx, req)
	if errors.Is(err, ErrOutcomeUnknown) {
		// The store's error names the job and its idempotency key.
		return EnqueueResult{}, fmt.Errorf("jobs: enqueue job %q of type %q: not admitted on its key, which a replay does: %w", req.ID, req.Type, err)
	}
	if err != nil {
		return EnqueueResult{}, err
	}
	if enq.Repeated {
		return c.replay(ctx, enq.Job)
	}
	c.notifyTarget(enq.Job)
	res, err := c.admit(ctx, k, enq.Job)
	if err == nil {
		res.Superseded = enq.Superseded
	}
	return res, err
}

// write writes the record of req after announcing the check that admits
// it should its producer die before the admission (see Client.check):
// a client's checker makes the decision after AdmitGrace. Nothing is
// written without that check.
func (c *Client) write(ctx context.Context, req EnqueueRequest) (Enqueued, error) {
	if req.ID != "" && req.ChannelID != "" {
		at := c.cfg.Now().Add(c.cfg.AdmitGrace)
		if err := c.disp.announce(ctx, laneCheck, req.Type, jobRef{req.ChannelID, req.ID}, at, ""); err != nil {
			return Enqueued{}, fmt.Errorf("jobs: enqueue job %q of type %q: nothing written: %w: %w", req.ID, req.Type, ErrUnavailable, err)
		}
	}
	return c.store.Enqueue(ctx, req)
}

// replay is the outcome of an enqueue whose idempotency key enqueued j
// before. A record the runtime may never have admitted on its key
// (pending or paused, never claimed: once a worker claimed it, the
// worker's repair admits it) is admitted now, which changes nothing when
// the admission was made (the key layer keeps one entry per job id), and
// otherwise makes the first enqueue's decision; any other record tells
// the outcome (replayed).
//
// A job whose queue entry another job's admission just replaced, and
// whose record that admission's producer has not superseded yet, looks
// like one never admitted: a replay in that moment admits it again, as a
// worker's repair does once AdmitGrace passed since the job's creation.
func (c *Client) replay(ctx context.Context, j Job) (EnqueueResult, error) {
	k, err := c.kindOf(j.Type)
	if err != nil || j.Attempts > 0 || (j.State != StatePending && j.State != StatePaused) {
		return replayed(j)
	}
	res, err := c.admit(ctx, k, j)
	var rej *RejectedError
	switch {
	case err == nil:
		res.Repeated = true
	case errors.As(err, &rej):
		rej.Repeated = true
	}
	return res, err
}

// replayed is the outcome of an enqueue whose idempotency key enqueued j
// before: the first enqueue's outcome, as j's record tells it. A record
// superseded as rejected is a [*RejectedError], one superseded for a bad
// key is an error wrapping [jobkeys.ErrInvalidKey], one superseded as
// coalesced is OutcomeCoalesced; any other is OutcomeAccepted.
func replayed(j Job) (EnqueueResult, error) {
	res := EnqueueResult{Outcome: OutcomeAccepted, Job: j, Repeated: true}
	if j.State != StateSuperseded {
		return res, nil
	}
	switch j.Reason {
	case ReasonRejected:
		return EnqueueResult{}, &RejectedError{Job: j, Repeated: true}
	case ReasonBadKey:
		return EnqueueResult{}, fmt.Errorf("jobs: enqueue job %q of type %q (a replay): its input derives no key: %w", j.ID, j.Type, jobkeys.ErrInvalidKey)
	case ReasonCoalesced:
		res.Outcome = OutcomeCoalesced
	}
	return res, nil
}

// admit admits job (pending, of kind k) on its key and applies the
// outcome to the records: the decision Enqueue makes, the repair of a job
// whose producer died before making it, and a replay's. Its errors, but
// a rejection ([*RejectedError]) and a bad key whose record it superseded,
// wrap ErrOutcomeUnknown and say what stands (unfinished).
func (c *Client) admit(ctx context.Context, k *kind, job Job) (EnqueueResult, error) {
	kid := keyJobID(job.ChannelID, job.ID)
	var opts []jobkeys.AdmitOption
	for pruned := false; ; pruned = true {
		adm, err := k.jt.Admit(ctx, kid, []byte(inputOf(job)), opts...)
		if errors.Is(err, jobkeys.ErrInvalidKey) {
			// The input can never be admitted: do not leave it pending.
			if _, serr := c.supersede(ctx, job.ChannelID, job.ID, ReasonBadKey); serr != nil {
				return EnqueueResult{}, unfinished(job, "its input derives no key ("+err.Error()+") and its record could not be superseded as "+ReasonBadKey, serr)
			}
			return EnqueueResult{}, fmt.Errorf("jobs: enqueue job %q of type %q: %w", job.ID, job.Type, err)
		}
		if err != nil {
			return EnqueueResult{}, unfinished(job, "its admission on its key failed (it may have been made)", err)
		}
		switch adm.Kind {
		case jobkeys.KindAccepted:
			c.announceAdmitted(ctx, k, job, adm.State)
			return EnqueueResult{Outcome: OutcomeAccepted, Job: job, Key: adm.DisplayKey}, nil
		case jobkeys.KindReplaced:
			c.announceAdmitted(ctx, k, job, adm.State)
			c.announceReplacedRoom(ctx, k, job, adm.State)
			res := EnqueueResult{Outcome: OutcomeReplaced, Job: job, Key: adm.DisplayKey}
			if ch, id, ok := parseKeyJobID(adm.Replaced.ID); ok {
				r, err := c.supersede(ctx, ch, id, ReasonReplaced)
				if err != nil && !errors.Is(err, ErrNotFound) {
					return EnqueueResult{}, c.undoReplace(ctx, k, job, *adm.Replaced, id, adm.DisplayKey, err)
				}
				if err == nil {
					res.Replaced = &r
				}
			}
			return res, nil
		case jobkeys.KindCoalesced:
			existing, live, err := c.liveJob(ctx, adm.Existing.ID)
			if err != nil {
				return EnqueueResult{}, unfinished(job, fmt.Sprintf("its key %q is full and coalesces it into job %q, whose record could not be read", adm.DisplayKey, adm.Existing.ID), err)
			}
			if !live && !pruned {
				// Folded into an entry whose job is over: prune and retry.
				if _, err := c.pruneKey(ctx, k, job); err != nil {
					return EnqueueResult{}, unfinished(job, fmt.Sprintf("its key %q is full and the finished jobs' entries could not be pruned from it", adm.DisplayKey), err)
				}
				continue
			}
			if !live {
				// Still folded into a job that is over: a slot not released
				// yet (pruning removes queue entries only). That job never
				// runs this one: admit it strictly, which accepts it or
				// rejects it.
				opts = []jobkeys.AdmitOption{jobkeys.WithStrictCreate()}
				continue
			}
			if _, err := c.supersede(ctx, job.ChannelID, job.ID, ReasonCoalesced); err != nil {
				return EnqueueResult{}, unfinished(job, fmt.Sprintf("its key %q coalesces it into job %q and its record could not be superseded as %s", adm.DisplayKey, adm.Existing.ID, ReasonCoalesced), err)
			}
			return EnqueueResult{Outcome: OutcomeCoalesced, Job: existing, Key: adm.DisplayKey}, nil
		default: // rejected
			if !pruned {
				n, err := c.pruneKey(ctx, k, job)
				if err != nil {
					return EnqueueResult{}, unfinished(job, fmt.Sprintf("its key %q is full and the finished jobs' entries could not be pruned from it", adm.DisplayKey), err)
				}
				if n > 0 {
					continue
				}
			}
			r, err := c.supersede(ctx, job.ChannelID, job.ID, ReasonRejected)
			if err != nil {
				return EnqueueResult{}, unfinished(job, fmt.Sprintf("its key %q rejects it (%s) and its record could not be superseded as %s", adm.DisplayKey, adm.Reason, ReasonRejected), err)
			}
			return EnqueueResult{}, &RejectedError{Job: r, Key: adm.DisplayKey, Reason: adm.Reason, Active: adm.Active, Queued: adm.Queued, Limit: adm.Limit}
		}
	}
}

// unfinished is the error of an admission of job that stopped before its
// outcome was applied: the record stands pending (or paused), without a
// queue entry (or with one, if the failed step was the admission itself),
// and a replay of the enqueue, or a client's checker after AdmitGrace,
// finishes it. step says what happened; err is the failure.
func unfinished(job Job, step string, err error) error {
	return fmt.Errorf("%w: jobs: enqueue job %q of type %q in channel %q (idempotency key %q): its record is written and %s, but %s; "+
		"a replay of the request (the same idempotency key and fingerprint) completes it, as does, strictly, a client's checker after AdmitGrace: %w",
		ErrOutcomeUnknown, job.ID, job.Type, job.ChannelID, job.IdempotencyKey, job.State, step, err)
}

// undoReplaceTimeout bounds undoReplace's write, which runs even when the
// caller's ctx has ended.
const undoReplaceTimeout = 10 * time.Second

// undoReplace undoes the admission of job that replaced the queue entry
// of job replacedID (replaced), whose record could not be superseded
// (serr): it puts replaced back at the head of the queue and takes job
// out, so that the record of neither is left pending without an entry.
// job is then pending and not admitted, which a replay of its enqueue
// admits again. It returns the error Enqueue returns: unfinished, or, if
// the undo failed too, what stands then.
func (c *Client) undoReplace(ctx context.Context, k *kind, job Job, replaced jobkeys.ReplacedJob, replacedID, key string, serr error) error {
	uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), undoReplaceTimeout)
	defer cancel()
	_, rerr := k.jt.RestoreReplaced(uctx, keyJobID(job.ChannelID, job.ID), []byte(inputOf(job)), replaced)
	if rerr == nil {
		return unfinished(job, fmt.Sprintf("its admission replaced job %q on key %q, whose record could not be superseded, and was undone (job %q is queued again, and this one's entry is removed)", replacedID, key, replacedID), serr)
	}
	return fmt.Errorf("%w: jobs: enqueue job %q of type %q in channel %q (idempotency key %q): the job is queued on key %q, replacing job %q, "+
		"whose record could not be superseded (%w) nor the replacement undone (%w): job %q stays pending without a queue entry, and a replay of this enqueue does not change that; "+
		"supersede it (Client.Supersede, reason %q): no worker takes it up",
		ErrOutcomeUnknown, job.ID, job.Type, job.ChannelID, job.IdempotencyKey, key, replacedID, serr, rerr, replacedID, ReasonReplaced)
}

// liveJob returns the job a key-layer job id names and whether it is
// still active (pending, paused or running).
func (c *Client) liveJob(ctx context.Context, kid string) (Job, bool, error) {
	ch, id, ok := parseKeyJobID(kid)
	if !ok {
		return Job{}, false, nil
	}
	j, err := c.peek(ctx, jobRef{ch, id})
	if errors.Is(err, ErrNotFound) {
		return Job{}, false, nil
	}
	if err != nil {
		return Job{}, false, err
	}
	return j, j.State.Active(), nil
}

// supersede makes job id of channel superseded with reason, unless it is
// over already; it returns the record as it is then.
func (c *Client) supersede(ctx context.Context, channel, id, reason string) (Job, error) {
	var err error
	for range 5 {
		var cur Job
		cur, err = c.peek(ctx, jobRef{channel, id})
		if err != nil {
			return Job{}, err
		}
		if !cur.State.Active() {
			return cur, nil
		}
		var j Job
		j, err = c.store.Supersede(ctx, SupersedeRequest{ChannelID: channel, JobID: id, ExpectedRevision: cur.Revision, Reason: reason})
		if err == nil {
			c.notify(j, ErrSuperseded)
			return j, nil
		}
		if !errors.Is(err, ErrConflict) {
			return Job{}, err
		}
	}
	return Job{}, err
}

// Get returns a job with its target and artifact (the store's Get).
func (c *Client) Get(ctx context.Context, channelID, jobID string) (Detail, error) {
	return c.store.Get(ctx, channelID, jobID)
}

// List lists a channel's jobs (the store's List).
func (c *Client) List(ctx context.Context, req ListRequest) (Page, error) {
	return c.store.List(ctx, req)
}

// Cancel cancels a job (the store's Cancel). A job running in this client
// sees its context end at once with [ErrCancelled]; in another client, at
// its next heartbeat. Its queue entry, if any, is removed at once, so its
// key has room for another job: through the kind's key, or, in a client
// without a kind for the job's type (an operator's tool), by reading the
// keys of that type until one holds the entry. A failure to remove it is
// logged (ClientConfig.Logger), and reconciliation removes the entry
// later.
func (c *Client) Cancel(ctx context.Context, req CancelRequest) (Job, error) {
	j, err := c.store.Cancel(ctx, req)
	if err != nil {
		return j, err
	}
	c.notify(j, ErrCancelled)
	c.dropQueued(ctx, j)
	return j, nil
}

// Supersede supersedes a job (the store's Supersede); as [Client.Cancel],
// with [ErrSuperseded].
func (c *Client) Supersede(ctx context.Context, req SupersedeRequest) (Job, error) {
	j, err := c.store.Supersede(ctx, req)
	if err != nil {
		return j, err
	}
	c.notify(j, ErrSuperseded)
	c.dropQueued(ctx, j)
	return j, nil
}

// Pause pauses a job (the store's Pause). A running job's context ends
// with [ErrPaused] (at once in this client, at the next heartbeat in
// another); a job waiting for its key's slot, or acquiring it, in this
// client does not start; one paused in another process in the moment
// between its claim and its slot may start and is stopped at its first
// heartbeat. It keeps its queue entry and runs again after
// [Client.Resume].
func (c *Client) Pause(ctx context.Context, req PauseRequest) (Job, error) {
	j, err := c.store.Pause(ctx, req)
	if err != nil {
		return j, err
	}
	c.notify(j, ErrPaused)
	return j, nil
}

// Resume resumes a paused job (the store's Resume); it is announced to
// the workers at its AvailableAt.
func (c *Client) Resume(ctx context.Context, req ResumeRequest) (Job, error) {
	return c.store.Resume(ctx, req)
}

// dropQueued removes a finished job's queue entry, best effort:
// reconciliation removes what this misses. Without a kind for the job's
// type it finds the entry by reading the type's keys (dropQueuedByScan).
func (c *Client) dropQueued(ctx context.Context, j Job) {
	c.mu.Lock()
	k := c.kinds[j.Type]
	c.mu.Unlock()
	if k == nil {
		if err := c.dropQueuedByScan(ctx, j); err != nil {
			c.cfg.Logger.Warn("jobs: remove queue entry", "job", j.ID, "channel", j.ChannelID, "type", j.Type, "err", err)
		}
		return
	}
	rem, err := k.jt.RemoveQueued(ctx, keyJobID(j.ChannelID, j.ID), []byte(inputOf(j)))
	if err != nil {
		c.cfg.Logger.Warn("jobs: remove queue entry", "job", j.ID, "channel", j.ChannelID, "type", j.Type, "err", err)
		return
	}
	c.announceRoom(ctx, k, rem.State, 0)
}

// notifyTarget ends, with ErrSuperseded, the runs in this client of the
// older jobs of j's target, which j's enqueue superseded.
func (c *Client) notifyTarget(j Job) {
	c.mu.Lock()
	var older []*activeRun
	for _, r := range c.byTarget[jobRef{j.ChannelID, j.TargetKey}] {
		if r.generation < j.TargetGeneration {
			older = append(older, r)
		}
	}
	c.mu.Unlock()
	for _, r := range older {
		r.stopWith(ErrSuperseded)
	}
}

// notify ends the context of j's run in this client, if any, with cause.
func (c *Client) notify(j Job, cause error) {
	c.mu.Lock()
	r := c.runs[jobRef{j.ChannelID, j.ID}]
	c.mu.Unlock()
	if r != nil {
		r.stopWith(cause)
	}
}

// keyJobID is the job id a job has in the key layer: its channel
// (path-escaped, so it holds no '/') and its id.
func keyJobID(channel, id string) string { return url.PathEscape(channel) + "/" + id }

// parseKeyJobID reverses keyJobID.
func parseKeyJobID(kid string) (channel, id string, ok bool) {
	esc, id, found := strings.Cut(kid, "/")
	if !found {
		return "", "", false
	}
	channel, err := url.PathUnescape(esc)
	if err != nil {
		return "", "", false
	}
	return channel, id, true
}

// inputOf is the payload the key is derived from: the job's input, or
// JSON null when it has none.
func inputOf(j Job) string {
	if len(j.Input) == 0 {
		return "null"
	}
	return string(j.Input)
}
