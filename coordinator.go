package jobkeys

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"reflect"
	"slices"
	"strconv"
	"sync"
	"time"
	"unicode/utf8"

	"go.opentelemetry.io/otel/metric"

	"github.com/jobkeys/jobkeys/internal/jsjson"
	"github.com/jobkeys/jobkeys/internal/keycache"
)

// Coordinator is the keyed concurrency contract: one method per reducer.
// [KeyCoordinator] implements it over a [Store].
//
// Every method returns a business outcome (a Kind) or an error, never both:
// on error the outcome is the zero value.
type Coordinator interface {
	// Admit queues a job under its key, or rejects, coalesces or replaces
	// as the policy says (ReduceAdmission).
	Admit(ctx context.Context, req AdmitRequest) (Admission, error)
	// Acquire gives an admitted job (or a retry) a slot, or says why it is
	// blocked (ReduceAcquire).
	Acquire(ctx context.Context, req AcquireRequest) (Acquisition, error)
	// Renew extends a lease, or reports it lost (ReduceRenew).
	Renew(ctx context.Context, req RenewRequest) (Renewal, error)
	// Release frees a slot, or reports a stale completion (ReduceRelease).
	Release(ctx context.Context, req ReleaseRequest) (ReleaseOutcome, error)
	// RemoveQueued takes a job out of the queue (ReduceRemoveQueued).
	RemoveQueued(ctx context.Context, req RemoveRequest) (Removal, error)
	// RestoreReplaced undoes a replacement (ReduceRestoreReplaced).
	RestoreReplaced(ctx context.Context, req RestoreRequest) (Restoration, error)
}

var _ Coordinator = (*KeyCoordinator)(nil)

// AdmitRequest asks to queue a job under its key.
type AdmitRequest struct {
	Service string // the service; names the bucket JOBS_KEYS_<Service>
	JobType string // the job type; one KV key token
	JobID   string // required; unique per job
	// Payload is the job payload the policy's key template points into:
	// []byte or json.RawMessage are parsed as JSON, any other value is
	// marshalled with encoding/json first.
	Payload any
	// Context is the job's trace context. Without a TraceID or Traceparent
	// it takes them from the caller's span when ctx carries one (see
	// [WithTraceContext]); fields still missing are derived from the job id
	// when written: every reader of the key state requires them.
	Context TraceContext
	Policy  Policy // normalized by the coordinator
	// StrictCreate rejects when the queue is full, whatever Policy.WhenFull says.
	StrictCreate bool
}

// AcquireRequest asks for a slot for an admitted job (or a retry).
type AcquireRequest struct {
	Service string       // as in AdmitRequest
	JobType string       // as in AdmitRequest
	JobID   string       // the admitted job
	Payload any          // as in AdmitRequest; must derive the same key
	Context TraceContext // the trace context recorded in the slot; as in AdmitRequest
	// Retry lets a job that is not queued take a slot: a retry of a job
	// that ran before and whose queue entry is gone.
	Retry bool
	Tries int // the attempt number recorded in the slot
	// InstanceID names the worker in the slot. Defaults to Config.InstanceID.
	InstanceID string
	Policy     Policy // the same policy the job was admitted under
}

// RenewRequest asks to extend a lease.
type RenewRequest struct {
	Lease Lease // from Acquisition.Lease
}

// ReleaseRequest asks to free a slot.
type ReleaseRequest struct {
	Lease Lease // from Acquisition.Lease
}

// RemoveRequest asks to remove a queued job (terminal before it started).
type RemoveRequest struct {
	Service string // as in AdmitRequest
	JobType string // as in AdmitRequest
	JobID   string // the queued job to remove
	Payload any    // the job's payload, to derive its key
	Policy  Policy // the job type's policy
}

// RestoreRequest asks to undo a replacement: put Replaced back at the head
// of the queue and drop ReplacementJobID from it.
type RestoreRequest struct {
	Service          string      // as in AdmitRequest
	JobType          string      // as in AdmitRequest
	ReplacementJobID string      // the job whose admission replaced Replaced
	Replaced         ReplacedJob // from Admission.Replaced
	Payload          any         // the replacing job's payload
	Policy           Policy      // the job type's policy
}

// Coordinator defaults, used for zero-valued [Config] fields.
const (
	MaxAttemptsDefault     = 64
	RetryBackoffDefault    = 500 * time.Microsecond
	MaxRetryBackoffDefault = 50 * time.Millisecond
	StateCacheSizeDefault  = 4096
)

// Config configures a [KeyCoordinator]. The zero value is ready to use.
type Config struct {
	// InstanceID names this worker process in the slots it acquires.
	// Defaults to "<hostname>-<pid>".
	InstanceID string

	// MaxAttempts bounds the compare-and-swap races one operation may lose
	// to concurrent writers before it fails with ErrContention. Renew and
	// Release are bounded by their lease instead (they retry until it
	// expires). Defaults to MaxAttemptsDefault (64).
	MaxAttempts int

	// RetryBackoff is the longest first pause after a lost compare-and-swap
	// on a key without contention; a key's backoff window then doubles with
	// every race lost on it and halves with every successful write (see
	// [KeyCoordinator]). Pauses are drawn at random up to the window.
	// Defaults to RetryBackoffDefault (500µs).
	RetryBackoff time.Duration

	// MaxRetryBackoff caps a key's backoff window, and so every pause.
	// Defaults to MaxRetryBackoffDefault (50ms).
	MaxRetryBackoff time.Duration

	// StateCacheSize is how many idle keys' last read or written state and
	// revision the coordinator keeps to skip reads; 0 means the default,
	// negative disables the cache. Defaults to StateCacheSizeDefault (4096).
	StateCacheSize int

	// Now is the clock. Defaults to time.Now. Tests inject a fixed clock.
	Now func() time.Time

	// IgnoreClockSkew turns off the refusal of acquisitions and sweeps on
	// a host whose clock (Now) is proven too far from the NATS server's
	// (see [ErrClockSkew]): for a server whose own clock is off, which
	// would refuse every host, or tests that move Now to make leases
	// expire. It also turns off the claim check of the package jobs
	// clients built on the coordinator. Defaults to false: the check is on.
	IgnoreClockSkew bool

	// NewSlotToken makes slot tokens. Defaults to random UUIDs (version 4).
	NewSlotToken func() string

	// MeterProvider receives the coordinator's metrics, and those of the
	// Runners of its job types (see the package docs, "Metrics and logs", and the README).
	// Pass otel.GetMeterProvider() for the global one. Defaults to nil: no
	// metrics, and no cost.
	MeterProvider metric.MeterProvider

	// Logger receives the coordinator's logs: unusable key state (error),
	// acquisitions under other limits than the state's (warn), expired
	// slots taken over (info), sweeps (debug, or info when they
	// found expired slots), repairs (warn). Defaults to nil: no logs.
	Logger *slog.Logger
}

// KeyCoordinator runs operations against a [Store]: derive the key, read the
// state (or use the state it last read or wrote), reduce, compare-and-swap,
// retry on conflict. It is safe for concurrent use.
//
// The writes of one coordinator to one key run one at a time, each starting
// from the state the one before it wrote, so they never race each other;
// reads do not wait for them, and operations on different keys run in
// parallel. Operations that queue on a key behind a write go with the next
// write: those whose outcomes write nothing (an acquisition that finds
// every slot taken, say) rest on it and need no read of their own. Races with other processes are settled by compare-and-swap: a
// lost race is followed by a jittered pause drawn from the key's backoff
// window, which starts at Config.RetryBackoff, doubles with every race lost
// on the key, halves with every successful write, never exceeds
// Config.MaxRetryBackoff, and while it is open also delays the first
// attempt of new operations on the key. Contending writers thus keep about
// an even chance per attempt and spread out when woken together, instead of
// the losers backing off ever further. Renew and Release are never delayed
// by that first-attempt pacing, and retry until their lease expires rather
// than Config.MaxAttempts times: a slot holder keeps its slot while the
// lease runs. On a key a [Watcher] feeds to the coordinator (while a
// [Runner] of it waits on the key, and a second after), they retry as soon
// as the watch delivers the write they lost to, without the pause: it
// would keep the slot held, and the key idle, for nothing.
//
// Every time the coordinator writes must fall in the years 0000 to 9999
// (the clock's now, and leases from it); a clock outside them is refused
// with ErrClockOutOfRange before anything is written. Admission keeps every
// key small enough for all its queued jobs to take slots within the
// store's value size limit (for [MemoryStore] and [NATSStore], which report
// their limit): a full key rejects with ErrStateTooLarge rather than
// filling up with jobs that could never start.
//
// The zero value is not usable: create one with [NewCoordinator].
type KeyCoordinator struct {
	store    Store
	cfg      Config
	keys     *keyTable
	slotRoom int // see checkRoom
	// groupWriters is the most operations whose outcomes write that one
	// batch carries (see groupcommit.go): groupWritersDefault.
	groupWriters int
	obs          *observer // metrics and logs; nil: none
	// wakes is the store's targeted wake-ups (see WithWakeUps), nil when
	// it has none: each committed write that leaves slots free with jobs
	// queued wakes their waiters (see publishWakes).
	wakes wakeStore
	// tryContext, set by tests only before the coordinator is used (nil
	// otherwise), derives the context of each operation that is a try of
	// a waiting Runner's from that try, for store wrappers that tell the
	// tries apart (bench_test.go's benchRecheckStore).
	tryContext func(context.Context, *waitTry) context.Context
}

// NewCoordinator returns a coordinator over store. cfg may be nil for the
// defaults; a bad cfg value is an error naming the field.
func NewCoordinator(store Store, cfg *Config) (*KeyCoordinator, error) {
	if store == nil {
		return nil, fmt.Errorf("%w: store is nil", ErrInvalidRequest)
	}
	if v := reflect.ValueOf(store); v.Kind() == reflect.Pointer && v.IsNil() {
		return nil, fmt.Errorf("%w: store is a nil %T", ErrInvalidRequest, store)
	}
	var c Config
	if cfg != nil {
		c = *cfg
	}
	if c.InstanceID == "" {
		host, _ := os.Hostname()
		if host == "" {
			host = "jobkeys"
		}
		c.InstanceID = host + "-" + strconv.Itoa(os.Getpid())
	}
	if !utf8.ValidString(c.InstanceID) {
		return nil, fmt.Errorf("%w: Config.InstanceID %q is not valid UTF-8", ErrInvalidRequest, c.InstanceID)
	}
	switch {
	case c.MaxAttempts == 0:
		c.MaxAttempts = MaxAttemptsDefault
	case c.MaxAttempts < 0:
		return nil, fmt.Errorf("%w: Config.MaxAttempts %d is negative", ErrInvalidRequest, c.MaxAttempts)
	}
	switch {
	case c.RetryBackoff == 0:
		c.RetryBackoff = RetryBackoffDefault
	case c.RetryBackoff < 0:
		return nil, fmt.Errorf("%w: Config.RetryBackoff %v is negative", ErrInvalidRequest, c.RetryBackoff)
	}
	switch {
	case c.MaxRetryBackoff == 0:
		c.MaxRetryBackoff = max(MaxRetryBackoffDefault, c.RetryBackoff)
	case c.MaxRetryBackoff < c.RetryBackoff:
		return nil, fmt.Errorf("%w: Config.MaxRetryBackoff %v is less than RetryBackoff %v", ErrInvalidRequest, c.MaxRetryBackoff, c.RetryBackoff)
	}
	if c.StateCacheSize == 0 {
		c.StateCacheSize = StateCacheSizeDefault
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.NewSlotToken == nil {
		c.NewSlotToken = newUUID
	}
	obs, err := newObserver(c.MeterProvider, c.Logger)
	if err != nil {
		return nil, err
	}
	return &KeyCoordinator{store: store, cfg: c, keys: newKeyTable(c.StateCacheSize), slotRoom: slotRoom(c.InstanceID), obs: obs, groupWriters: groupWritersDefault,
		wakes: wakeStoreOf(store)}, nil
}

// InstanceID returns the instance id the coordinator writes into slots.
func (c *KeyCoordinator) InstanceID() string { return c.cfg.InstanceID }

// Admit queues req.JobID under its key, or rejects, coalesces or replaces
// as the policy says.
func (c *KeyCoordinator) Admit(ctx context.Context, req AdmitRequest) (Admission, error) {
	policy, key, err := c.prepare(req.Service, req.JobType, req.JobID, req.Payload, req.Policy)
	if err != nil {
		return Admission{}, err
	}
	return c.admitKey(ctx, key, policy, req)
}

// Acquire gives req.JobID a slot if the rules allow; the outcome's Lease
// is what Renew and Release need. An error leaves no slot of the job
// behind, as for [JobType.Acquire].
func (c *KeyCoordinator) Acquire(ctx context.Context, req AcquireRequest) (Acquisition, error) {
	policy, key, err := c.prepare(req.Service, req.JobType, req.JobID, req.Payload, req.Policy)
	if err != nil {
		return Acquisition{}, err
	}
	return c.acquireKey(ctx, key, policy, req, nil)
}

// Renew extends the lease by its policy's HeartbeatTTL from now, or reports
// it lost when the slot was taken over or released.
//
// A renewal is not paced on a contended key and does not give up after
// Config.MaxAttempts lost races: it retries until ctx ends or the slot's
// lease expires (then ErrContention), since until then the slot is still
// the holder's to keep.
func (c *KeyCoordinator) Renew(ctx context.Context, req RenewRequest) (Renewal, error) {
	lease, key, err := leaseKey(req.Lease)
	if err != nil {
		return Renewal{}, err
	}
	var out Renewal
	defer c.obs.end(ctx, metricOpRenew, &key, c.obs.begin(), &out.Kind, &err)
	err = c.run(ctx, key, retry{lease: &lease, stale: lease.Policy.StalePolicy}, func(st *KeyState, now time.Time) *KeyState {
		out = ReduceRenew(st, lease, now)
		return out.State
	})
	if err != nil {
		return zeroOf(out), err
	}
	return out, nil
}

// Release frees the slot, or reports a stale completion when it was
// already gone (taken over after its lease expired). Like Renew, it is not
// paced and retries until the lease expires.
func (c *KeyCoordinator) Release(ctx context.Context, req ReleaseRequest) (ReleaseOutcome, error) {
	lease, key, err := leaseKey(req.Lease)
	if err != nil {
		return ReleaseOutcome{}, err
	}
	var out ReleaseOutcome
	defer c.obs.end(ctx, metricOpRelease, &key, c.obs.begin(), &out.Kind, &err)
	err = c.run(ctx, key, retry{lease: &lease, stale: lease.Policy.StalePolicy}, func(st *KeyState, now time.Time) *KeyState {
		out = ReduceRelease(st, lease, now)
		return out.State
	})
	if err != nil {
		return zeroOf(out), err
	}
	return out, nil
}

// RemoveQueued removes a queued job, or reports it not found.
func (c *KeyCoordinator) RemoveQueued(ctx context.Context, req RemoveRequest) (Removal, error) {
	_, key, err := c.prepare(req.Service, req.JobType, req.JobID, req.Payload, req.Policy)
	if err != nil {
		return Removal{}, err
	}
	return c.removeQueuedKey(ctx, key, req.JobID)
}

// RestoreReplaced undoes a replacement (see [RestoreRequest]).
func (c *KeyCoordinator) RestoreReplaced(ctx context.Context, req RestoreRequest) (Restoration, error) {
	policy, key, err := c.prepare(req.Service, req.JobType, req.ReplacementJobID, req.Payload, req.Policy)
	if err != nil {
		return Restoration{}, err
	}
	return c.restoreKey(ctx, key, policy, req)
}

func (c *KeyCoordinator) prepare(service, jobType, jobID string, payload any, p Policy) (Policy, JobKey, error) {
	if jobID == "" || !utf8.ValidString(jobID) {
		// Strings are stored as JSON text: invalid UTF-8 would come back
		// as U+FFFD and no longer match the job.
		return Policy{}, JobKey{}, fmt.Errorf("%w: job id %q is empty or not valid UTF-8", ErrInvalidRequest, jobID)
	}
	policy, err := p.Normalize()
	if err != nil {
		return Policy{}, JobKey{}, err
	}
	key, err := DeriveKey(service, jobType, payload, policy.Key)
	if err != nil {
		return Policy{}, JobKey{}, err
	}
	return policy, key, nil
}

// zeroLease returns the error of a lease that is the zero Lease (most often
// the Lease of an acquisition that did not acquire), else nil.
func zeroLease(l Lease) error {
	if l.Service == "" && l.JobType == "" && l.JobID == "" && l.SlotToken == "" {
		return fmt.Errorf("%w: the lease is empty (the zero Lease): use the Lease of an acquisition whose Kind is KindAcquired", ErrInvalidRequest)
	}
	return nil
}

// leaseKey validates l and returns it with its policy normalized, and the
// key it holds a slot of. A lease's policy is checked as Acquire checks
// one, so a lease cannot claim what no policy may (a HeartbeatTTL past
// HeartbeatTTLLimit would push the expiry out by centuries).
func leaseKey(l Lease) (Lease, JobKey, error) {
	if err := zeroLease(l); err != nil {
		return Lease{}, JobKey{}, err
	}
	if err := validateService(l.Service); err != nil {
		return Lease{}, JobKey{}, err
	}
	if err := validateJobType(l.JobType); err != nil {
		return Lease{}, JobKey{}, err
	}
	switch {
	case l.JobID == "":
		return Lease{}, JobKey{}, fmt.Errorf("%w: Lease.JobID is empty", ErrInvalidRequest)
	case l.SlotToken == "":
		return Lease{}, JobKey{}, fmt.Errorf("%w: Lease.SlotToken is empty", ErrInvalidRequest)
	case !isKeyHash(l.KeyHash):
		return Lease{}, JobKey{}, fmt.Errorf("%w: Lease.KeyHash %q is not 64 lowercase hex digits", ErrInvalidRequest, l.KeyHash)
	case l.Policy.HeartbeatTTL <= 0:
		return Lease{}, JobKey{}, fmt.Errorf("%w: Lease.Policy.HeartbeatTTL %v is not positive (use the Lease from Acquire)", ErrInvalidRequest, l.Policy.HeartbeatTTL)
	}
	p, err := l.Policy.Normalize()
	if err != nil {
		return Lease{}, JobKey{}, fmt.Errorf("%w: Lease.Policy (use the Lease from Acquire): %w", ErrInvalidRequest, err)
	}
	l.Policy = p
	return l, JobKey{Service: l.Service, JobType: l.JobType, DisplayKey: l.DisplayKey, KeyHash: l.KeyHash,
		KVKey: kvKeyFor(l.Service, l.JobType, l.KeyHash)}, nil
}

func isKeyHash(s string) bool {
	if len(s) != 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// update runs one operation on key (see run) with the default retry rules:
// first attempts paced on a contended key, at most Config.MaxAttempts
// races lost. With assumeAbsent the first attempt creates a key this
// coordinator knows nothing of without reading it (admission). reduce
// returns the new state, or nil when the outcome writes nothing; it may be
// called several times and must leave its outcome from the last call.
func (c *KeyCoordinator) update(ctx context.Context, key JobKey, assumeAbsent bool, reduce func(*KeyState, time.Time) *KeyState) error {
	return c.run(ctx, key, retry{assumeAbsent: assumeAbsent}, reduce)
}

// retry says how an operation meets contention.
type retry struct {
	assumeAbsent bool // see update
	// lease, for a renewal or release, takes the operation out of the
	// pacing of a contended key and bounds its retries by the lease's
	// expiry instead of Config.MaxAttempts: the holder keeps trying while
	// its slot is still its own.
	lease *Lease
	// stale is the StalePolicy of the operation's policy, "" when it has
	// none at hand: the key's entry remembers it for the wake-ups of its
	// writes (see keyEntry.blocksStale).
	stale StalePolicy
	// wait is the try of a waiting Runner (or a try in turn) the
	// operation is, nil for any other operation: see waitTry.
	wait *waitTry
	// unsure, when not nil, is set when the operation ends with an error
	// after a write of its state whose outcome is unknown: it may have
	// landed, or may land yet (see laneResult.unsure).
	unsure *bool
}

// run is the read-reduce-compare-and-swap loop of one operation on key.
//
// The first attempt writes on the state this coordinator remembers, or,
// with assumeAbsent, creates the key, without a read. A write on such a
// guess that turns out stale costs one failed write and a read, and is not
// a lost race; a failed write on state this operation read is, and is
// followed by a pause drawn from the key's backoff window (see
// keycache.Entry.Lose). An outcome that writes nothing on a guess, or on state
// only the watch feed vouches for, is confirmed by a read at once.
//
// On a key a Watcher feeds to the coordinator (keycache.Entry.Fed), a lost race
// is answered by the watch's delivery of the write that won: the next
// attempt starts from it, without a read (after the pause, for operations
// that pause). So is a create made on the key's absence the feed
// delivered, which, when it fails, lost to another process's create: it
// counts as a lost race but is not paused for, as a stale guess is not
// (see internal/keycache/feedretry.go).
//
// Writes hold the key's lane, reads do not: an operation that only needs to
// look (an acquisition that finds every slot taken) never waits for this
// coordinator's writes to the key, and one that read and then writes takes
// the lane and, if another of this coordinator's operations wrote
// meanwhile, starts from that newer state (keycache.Entry.Begin). Operations
// waiting for the lane are written together with the one holding it, in
// one compare-and-swap (see groupcommit.go); each comes back here with its
// own result, and on a lost race follows its own retry rules.
func (c *KeyCoordinator) run(ctx context.Context, key JobKey, rt retry, reduce func(*KeyState, time.Time) *KeyState) error {
	e := c.keys.pin(key.KVKey)
	defer c.keys.unpin(key.KVKey, e)
	e.stalePolicy(rt.stale)
	wt := rt.wait
	if wt != nil && c.tryContext != nil {
		ctx = c.tryContext(ctx, wt)
	}
	if err := paceFirst(ctx, e, rt); err != nil {
		return err
	}
	op := newLaneOp(ctx, reduce, rt, wt != nil && wt.trustWatch)
	op.woken = wt != nil && wt.wake
	defer op.free()
	// The buffer the batches this operation leads encode into (see
	// encodeBuffers).
	buf := takeEncodeBuffer()
	defer putEncodeBuffer(buf)
	var (
		r        *keycache.Read[KeyState] // the last read, nil until one is needed
		readNext bool
		lost     int
	)
	for {
		if readNext {
			var done bool
			var err error
			if r, done, err = c.readFor(ctx, key, e, reduce, wt); err != nil || done {
				return err
			}
		}
		op.r = r
		view := e.View()
		res, err := c.turn(e, key, op, buf)
		if err != nil {
			return err
		}
		s := res.s
		if res.done {
			wt.decided(s.Rev)
		}
		if res.done || res.err != nil {
			if res.unsure && rt.unsure != nil {
				*rt.unsure = true
			}
			return res.err
		}
		readNext = true
		if op.woken && op.wrote != nil && s.State != nil {
			// A woken waiter's write lost: the write that won wakes it
			// again if it leaves a slot free (see publishWakes).
			wt.decided(s.Rev)
			wt.lostOn = s.State
			return errWakeLost
		}
		// A create of this operation's (op.wrote: the batch's holder sets
		// it) on the absence the feed delivered lost to another
		// process's create, which the feed delivers next.
		createLost := op.wrote != nil && s.State == nil && view.Absent && c.keys.max > 0 && e.Fed()
		if !createLost && !s.Verified && (!s.Watched || op.wrote == nil) {
			// A stale guess, not a lost race: read and try again. So is an
			// outcome that writes nothing on state the feed delivered,
			// which may be stale (only a waiter trusts it): the read
			// confirms it.
			continue
		}
		lost++
		fromFeed, err := c.afterLost(ctx, e, key, rt, res, view, createLost, lost)
		if err != nil {
			return err
		}
		if fromFeed {
			// The watch delivered the write that won: start from it,
			// without a read.
			r, readNext = nil, false
		}
	}
}

// paceFirst delays the first attempt of an operation on a contended key
// (a window open on e), so that a writer that keeps winning does not keep
// the others out. A renewal or release is not paced, nor a woken waiter's
// try, nor a waiter's on a key its watch feeds: its Watcher spaces the
// tries.
func paceFirst(ctx context.Context, e *keyEntry, rt retry) error {
	wt := rt.wait
	if rt.lease != nil || wt != nil && wt.wake || wt != nil && wt.trustWatch && e.Fed() {
		return nil
	}
	if window := e.PaceWindow(time.Now()); window > 0 {
		return keycache.SleepJitter(ctx, window)
	}
	return nil
}

// readFor reads key for an operation (reduce) that needs a read, and
// returns the read; done says the outcome on it writes nothing, which
// ends the operation (wt, nil but for a waiting Runner's try, learns
// the revision).
func (c *KeyCoordinator) readFor(ctx context.Context, key JobKey, e *keyEntry, reduce func(*KeyState, time.Time) *KeyState, wt *waitTry) (_ *keycache.Read[KeyState], done bool, _ error) {
	mark, feed, hints := e.Mark(), e.FeedMark(), e.HintMark()
	sent := time.Now() // the read's request goes out after this
	st, rev, err := c.read(ctx, key)
	if err != nil {
		return nil, false, err
	}
	e.SettleHint(rev, hints)
	if next := reduce(st, c.cfg.Now()); writesNothing(next, st) {
		e.ObserveSent(st, rev, feed, sent)
		wt.decided(rev)
		return nil, true, nil
	}
	return &keycache.Read[KeyState]{State: st, Sent: sent, Rev: rev, Mark: mark, Feed: feed}, false, nil
}

// afterLost follows the lost-th race an operation lost (res: its turn's
// result; view: the feed before it; createLost: a create on the absence
// the feed delivered lost): it fails the operation past its bound, else
// pauses as the retry rules say and waits a little for the watch to
// deliver the write that won. fromFeed says it did: the next attempt
// starts from it, without a read.
//
// A waiter's lost race is answered by the write that won it, which the
// watch delivers: no pause, and no wider backoff window for the key's
// other operations (its Watcher spaces the waiters). So is a renewal's or
// release's on a watched key: it holds the slot while it pauses, and on a
// contended key the window its pause is drawn from is widened by every
// race the coordinator's other operations lose there (admissions,
// typically), up to MaxRetryBackoff, while the write it lost to is a
// watch hop away. Each of its retries follows another writer's success,
// so the key still makes progress.
//
// A create lost on the absence the feed delivered is not paused for
// either: it was made on a guess, and a failed write on a guess never is.
func (c *KeyCoordinator) afterLost(ctx context.Context, e *keyEntry, key JobKey, rt retry, res laneResult, view keycache.FeedView, createLost bool, lost int) (fromFeed bool, _ error) {
	fed := e.Fed()
	watchAnswers := createLost || fed && (rt.lease != nil || rt.wait != nil && rt.wait.trustWatch)
	if rt.lease != nil {
		if until := leaseEnd(res.s.State, *rt.lease); !c.cfg.Now().Before(until) {
			return false, fmt.Errorf("%w: KV key %q: job %q lost %d compare-and-swap races to concurrent writers until its lease expired at %s",
				ErrContention, key.KVKey, rt.lease.JobID, lost, until.UTC().Format(time.RFC3339Nano))
		}
		// Unwatched, it backs off like any other operation: the pauses
		// keep its attempts, and the other writers', apart.
	} else if lost >= c.cfg.MaxAttempts {
		return false, fmt.Errorf("%w: KV key %q: %d compare-and-swap attempts lost to concurrent writers", ErrContention, key.KVKey, lost)
	}
	if !watchAnswers {
		// The batch that lost widened the key's window once for all its
		// operations; a turn that wrote nothing did not.
		pause := res.pause
		if pause == 0 {
			pause = e.Lose(c.cfg.RetryBackoff, c.cfg.MaxRetryBackoff, time.Now())
		}
		if err := keycache.SleepJitter(ctx, pause); err != nil {
			return false, err
		}
	}
	if createLost {
		// The watch delivers the create that won.
		return e.AwaitCreated(ctx, view.Delivered, watchFallback), nil
	}
	// The watch delivers what the write lost to.
	return fed && e.AwaitChange(ctx, res.s.Rev, watchFallback), nil
}

// watchFallback bounds how long an operation whose write lost a race on a
// watched key waits for the watch to deliver the winning write before it
// reads the key instead.
const watchFallback = 50 * time.Millisecond

// waitTry marks a Runner's acquisition while it waits for a slot with a
// Watcher (passed to KeyCoordinator.run as retry.wait), and carries back
// the revision its outcome rested on.
type waitTry struct {
	// trustWatch lets the acquisition find the key busy on the state the
	// watch feed vouches for, without a read (see keycache.Entry.Begin).
	trustWatch bool
	// wake marks a waiter's try over a store with targeted wake-ups: it
	// may find the key busy on any state its coordinator saw stored (its
	// own write's, a wake-up's handed over in memory by a write of this
	// process, or a read's) without a read, unless a wake-up from another
	// process named a later revision (a hint: then it reads, see
	// keycache.Entry.Hinted); it is not paced, and a write of its that loses
	// its compare-and-swap ends the try with errWakeLost instead of a
	// read (the write that won wakes it if it leaves a slot free).
	wake bool
	// inTurn keeps the queue's order: a queued job behind at least as
	// many queued jobs as there are free slots is blocked (ReasonActiveLimit,
	// writing nothing) rather than take a slot ahead of them, which the
	// reducer allows, unless all of those the free slots are for wait for
	// their wake-ups in the coordinator's own store; ahead then says how
	// many of them are before its turn. A Runner over targeted wake-ups tries so at its first try and
	// right after subscribing, not when a wake-up, its turn, a lease's
	// expiry or a recheck started the try (see Runner.acquire).
	inTurn bool
	ahead  int    // with inTurn: jobs before the job's turn when it was blocked so; else 0
	rev    uint64 // the revision the outcome rested on; 0 unknown
	// lostOn is, after a woken try's write lost (errWakeLost), the state
	// it was written on: the latest this coordinator knew stored then.
	lostOn *KeyState
}

// decided records the revision an outcome rested on; wt may be nil.
func (wt *waitTry) decided(rev uint64) {
	if wt != nil {
		wt.rev = rev
	}
}

// The times key state can hold: toISOString writes years outside 0000 to
// 9999 in an expanded form that older readers of the format reject.
var (
	firstStateTime = time.Date(0, 1, 1, 0, 0, 0, 0, time.UTC)
	lastStateTime  = time.Date(9999, 12, 31, 23, 59, 59, 999_000_000, time.UTC)
)

// checkTimes returns an error wrapping ErrClockOutOfRange when a time in
// s, the state about to be written to kvKey, falls outside the years key
// state can hold: the clock, or a lease from it, left them.
func checkTimes(kvKey string, s *KeyState, now func() time.Time) error {
	bad := func(what string, t time.Time) error {
		return fmt.Errorf("%w: KV key %q: %s would be %s, outside %s to %s, the times key state can hold (the clock, Config.Now, reads %s)",
			ErrClockOutOfRange, kvKey, what, t.UTC().Format(time.RFC3339Nano),
			firstStateTime.Format(jsjson.TimeLayout), lastStateTime.Format(jsjson.TimeLayout), now().UTC().Format(time.RFC3339Nano))
	}
	if !inJSYears(s.UpdatedAt) {
		return bad("updatedAt", s.UpdatedAt)
	}
	for i := range s.Active {
		a := &s.Active[i]
		switch {
		case !inJSYears(a.StartedAt):
			return bad(fmt.Sprintf("the startedAt of job %q's slot", a.JobID), a.StartedAt)
		case !inJSYears(a.HeartbeatAt):
			return bad(fmt.Sprintf("the heartbeatAt of job %q's slot", a.JobID), a.HeartbeatAt)
		case !inJSYears(a.LeaseExpiresAt):
			return bad(fmt.Sprintf("the leaseExpiresAt of job %q's slot", a.JobID), a.LeaseExpiresAt)
		}
	}
	for i := range s.Queued {
		if q := &s.Queued[i]; !inJSYears(q.CreatedAt) {
			return bad(fmt.Sprintf("the createdAt of queued job %q", q.JobID), q.CreatedAt)
		}
	}
	return nil
}

// Room for a slot: what a queued job's entry grows by, at most, when it
// becomes an active slot. The slot adds its token, instance id, two more
// timestamps and its tries; room is kept for tokens and instance ids of up
// to slotNameRoom bytes (a UUID token is 36), or this coordinator's
// instance id if longer.
const (
	slotNameRoom  = 64
	slotFixedRoom = len(`,"slotToken":""`) + len(`,"instanceId":""`) +
		len(`,"heartbeatAt":"0000-00-00T00:00:00.000Z"`) + len(`,"leaseExpiresAt":"0000-00-00T00:00:00.000Z"`) +
		len(`,"tries":9007199254740991`)
)

// slotRoom returns the most a queued entry grows by as a slot of this
// coordinator's instance.
func slotRoom(instanceID string) int {
	return slotFixedRoom + slotNameRoom + max(slotNameRoom, len(jsjson.AppendString(nil, instanceID)))
}

// checkRoom returns an error wrapping ErrStateTooLarge when next, a state
// of size bytes that adds queued jobs, would outgrow the store's value
// size limit once every queued job holds a slot: such a key could admit
// jobs it can never start. Stores that do not report their limit are not
// checked.
func (c *KeyCoordinator) checkRoom(ctx context.Context, key JobKey, next *KeyState, size int) error {
	l, ok := c.store.(ValueLimiter)
	if !ok {
		return nil
	}
	limit, err := l.MaxValueSize(ctx, key.Service)
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("jobkeys: KV key %q: %w", key.KVKey, err)
	}
	if need := size + len(next.Queued)*c.slotRoom; need > limit {
		return &StateError{KVKey: key.KVKey, Err: ErrStateTooLarge,
			Reason: fmt.Sprintf("new state of %d bytes (%d active, %d queued) leaves no room for its queued jobs to start: with each in a slot it may take %d bytes, over the store's limit of %d",
				size, len(next.Active), len(next.Queued), need, limit)}
	}
	return nil
}

// writesNothing reports whether next, reduced from state, needs no write.
func writesNothing(next, state *KeyState) bool {
	return next == nil || next.Empty() && state == nil
}

// leaseEnd returns when lease's slot lapses: the later of the lease's own
// expiry and that of its slot in state (renewals since the lease was
// handed out move it on).
func leaseEnd(state *KeyState, lease Lease) time.Time {
	end := lease.LeaseExpiresAt
	if state != nil {
		for i := range state.Active {
			if a := &state.Active[i]; a.JobID == lease.JobID && a.SlotToken == lease.SlotToken && a.LeaseExpiresAt.After(end) {
				end = a.LeaseExpiresAt
			}
		}
	}
	return end
}

// encodedSizeEstimate is a little over the usual JSON size of s, so that
// encoding it rarely grows the buffer.
func encodedSizeEstimate(s *KeyState) int {
	return 512 + 512*len(s.Active) + 320*len(s.Queued)
}

// snapshot returns a copy of s that shares no slice with it.
func snapshot(s *KeyState) *KeyState {
	c := *s
	c.Active = slices.Clone(s.Active)
	c.Queued = slices.Clone(s.Queued)
	return &c
}

// snapshotOver returns a copy of s, a state reduced from base, that shares
// no slice with s, for a key entry to keep: s belongs to the caller of the
// operation that produced it, who may modify it.
//
// base must be immutable (a state a key entry holds: see keycache.Entry),
// or nil. Where s's active slots or queued jobs are, element for element,
// a run of base's (all of them, as a release leaves the queue; or all but
// the first or the last, as an acquisition of the queue's head leaves it),
// the copy shares that run of base's array instead of copying it. That is
// safe because nothing writes to the elements of a state a key entry
// holds, its copies included: the reducers build every state they return
// in arrays of their own (KeyState.clone, KeyState.rebuilt). A shared run is
// cut to its length (cap == len), so that even an append to the copy
// cannot write past it into base's array.
func snapshotOver(s, base *KeyState) *KeyState {
	if base == nil {
		return snapshot(s)
	}
	c := *s
	c.Active = cloneOver(s.Active, base.Active)
	c.Queued = cloneOver(s.Queued, base.Queued)
	return &c
}

// cloneOver returns a copy of s for snapshotOver: the run of base that
// equals s, if base starts or ends with it, else a copy of its own. An
// empty s is copied (it shares no element), which keeps it nil or not.
func cloneOver[T comparable](s, base []T) []T {
	n := len(s)
	if n == 0 || n > len(base) {
		return slices.Clone(s)
	}
	if slices.Equal(s, base[:n]) {
		return base[:n:n]
	}
	if i := len(base) - n; i > 0 && slices.Equal(s, base[i:]) {
		return base[i:len(base):len(base)]
	}
	return slices.Clone(s)
}

// encodeBuffers holds the buffers operations encode states into
// (*[]byte), so that a state's wire form, some kilobytes on a key with a
// long queue, is not allocated again for every write. An operation takes
// one for its run (takeEncodeBuffer) and puts it back when the run
// returns (putEncodeBuffer); only a batch the operation leads, holding the
// key's lane, writes to it (KeyCoordinator.encode). Reusing it is safe
// because no one keeps the bytes once the write that sent them returns:
//
//   - a Store must not keep a value passed to Create or Update after
//     returning (see [Store]): MemoryStore copies it into its entry and its
//     watches copy it again, NATSStore copies it into the connection's
//     buffer before the request returns;
//   - the key entry refers to it only while the write is under way
//     (keycache.Entry.Writing), and forgets it before the batch ends
//     (keycache.Entry.Written), both under the entry's lock, which the watch's readers of it
//     (keyTable.held) take too;
//   - errors report its length, not its bytes.
var encodeBuffers = sync.Pool{New: func() any { return new([]byte) }}

// encodeBufferMax is the largest buffer put back into encodeBuffers: one
// for a value of a NATS server's default max_payload, or a memory store's
// default limit, and a little over.
const encodeBufferMax = MemoryStoreMaxValueSizeDefault + 64<<10

// takeEncodeBuffer returns an encode buffer from encodeBuffers.
func takeEncodeBuffer() *[]byte { return encodeBuffers.Get().(*[]byte) }

// putEncodeBuffer returns buf, from takeEncodeBuffer, to encodeBuffers,
// emptied; one grown past encodeBufferMax is dropped instead.
func putEncodeBuffer(buf *[]byte) {
	if cap(*buf) > encodeBufferMax {
		*buf = nil
	}
	*buf = (*buf)[:0]
	encodeBuffers.Put(buf)
}

// read fetches and validates a key's state; nil state means absent.
func (c *KeyCoordinator) read(ctx context.Context, key JobKey) (*KeyState, uint64, error) {
	value, rev, err := c.store.Get(ctx, key.Service, key.KVKey)
	if errors.Is(err, ErrKeyNotFound) {
		return nil, 0, nil
	}
	if err != nil {
		if ctx.Err() != nil {
			return nil, 0, ctx.Err()
		}
		return nil, 0, err
	}
	st, err := decodeFor(key, value, rev)
	if err != nil {
		return nil, 0, err
	}
	return st, rev, nil
}

// decodeFor decodes and validates value, read from key at revision rev.
func decodeFor(key JobKey, value []byte, rev uint64) (*KeyState, error) {
	st, err := decodeState(value)
	if err != nil {
		return nil, &StateError{KVKey: key.KVKey, Reason: fmt.Sprintf("revision %d: %v", rev, err), Err: ErrCorruptState}
	}
	if st.Service != key.Service || st.JobType != key.JobType || st.KeyHash != key.KeyHash {
		return nil, &StateError{KVKey: key.KVKey, Err: ErrForeignState,
			Reason: fmt.Sprintf("revision %d holds service %q, job type %q, key hash %q", rev, st.Service, st.JobType, st.KeyHash)}
	}
	return st, nil
}

// zeroOf returns the zero value of v's type: an operation that fails
// returns no outcome, not the outcome of a write that did not happen.
func zeroOf[T any](T) (zero T) { return zero }

// newUUID returns a random version 4 UUID.
func newUUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on supported platforms
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	var s [36]byte
	hex.Encode(s[0:8], b[0:4])
	s[8] = '-'
	hex.Encode(s[9:13], b[4:6])
	s[13] = '-'
	hex.Encode(s[14:18], b[6:8])
	s[18] = '-'
	hex.Encode(s[19:23], b[8:10])
	s[23] = '-'
	hex.Encode(s[24:36], b[10:16])
	return string(s[:])
}
