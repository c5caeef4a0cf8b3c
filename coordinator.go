package jobkeys

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"os"
	"reflect"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"
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
	Release(ctx context.Context, req ReleaseRequest) (Release, error)
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
	// Context is the job's trace context. Missing fields are derived from
	// the job id when written, since the TS original requires them.
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
	Context TraceContext // the trace context recorded in the slot
	// Retry lets a job that is not queued take a slot (a retry of a job
	// that ran before), as the TS original's lifecycle state "retry".
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

	// MaxAttempts bounds the compare-and-swap attempts of one operation;
	// when all lose to concurrent writers the operation fails with
	// ErrContention. Defaults to MaxAttemptsDefault (64).
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

	// NewSlotToken makes slot tokens. Defaults to random UUIDs (version 4).
	NewSlotToken func() string
}

// KeyCoordinator runs operations against a [Store]: derive the key, read the
// state (or use the state it last read or wrote), reduce, compare-and-swap,
// retry on conflict. It is safe for concurrent use.
//
// Operations of one coordinator on one key run one at a time, each starting
// from the state the one before it wrote, so they never race each other;
// operations on different keys run in parallel. Races with other processes
// are settled by compare-and-swap: a lost race is followed by a jittered
// pause drawn from the key's backoff window, which starts at
// Config.RetryBackoff, doubles with every race lost on the key, halves with
// every successful write, never exceeds Config.MaxRetryBackoff, and while
// it is open also delays the first attempt of new operations on the key.
// Contending writers thus keep about an even chance per attempt and spread
// out when woken together, instead of the losers backing off ever further.
//
// The zero value is not usable: create one with [NewCoordinator].
type KeyCoordinator struct {
	store Store
	cfg   Config
	keys  *keyTable
	stats contentionStats
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
	return &KeyCoordinator{store: store, cfg: c, keys: newKeyTable(c.StateCacheSize)}, nil
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
// is what Renew and Release need.
func (c *KeyCoordinator) Acquire(ctx context.Context, req AcquireRequest) (Acquisition, error) {
	policy, key, err := c.prepare(req.Service, req.JobType, req.JobID, req.Payload, req.Policy)
	if err != nil {
		return Acquisition{}, err
	}
	return c.acquireKey(ctx, key, policy, req)
}

// Renew extends the lease, or reports it lost.
func (c *KeyCoordinator) Renew(ctx context.Context, req RenewRequest) (Renewal, error) {
	key, err := leaseKey(req.Lease)
	if err != nil {
		return Renewal{}, err
	}
	var out Renewal
	err = c.update(ctx, key, false, func(st *KeyState, now time.Time) *KeyState {
		out = ReduceRenew(st, req.Lease, now)
		return out.State
	})
	if err != nil {
		return zeroOf(out), err
	}
	return out, nil
}

// Release frees the slot, or reports a stale completion when it was
// already gone (taken over after its lease expired).
func (c *KeyCoordinator) Release(ctx context.Context, req ReleaseRequest) (Release, error) {
	key, err := leaseKey(req.Lease)
	if err != nil {
		return Release{}, err
	}
	var out Release
	err = c.update(ctx, key, false, func(st *KeyState, now time.Time) *KeyState {
		out = ReduceRelease(st, req.Lease, now)
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

func leaseKey(l Lease) (JobKey, error) {
	if err := validateService(l.Service); err != nil {
		return JobKey{}, err
	}
	if err := validateJobType(l.JobType); err != nil {
		return JobKey{}, err
	}
	switch {
	case l.JobID == "":
		return JobKey{}, fmt.Errorf("%w: Lease.JobID is empty", ErrInvalidRequest)
	case l.SlotToken == "":
		return JobKey{}, fmt.Errorf("%w: Lease.SlotToken is empty", ErrInvalidRequest)
	case !isKeyHash(l.KeyHash):
		return JobKey{}, fmt.Errorf("%w: Lease.KeyHash %q is not 64 lowercase hex digits", ErrInvalidRequest, l.KeyHash)
	case l.Policy.HeartbeatTTL <= 0:
		return JobKey{}, fmt.Errorf("%w: Lease.Policy.HeartbeatTTL %v is not positive (use the Lease from Acquire)", ErrInvalidRequest, l.Policy.HeartbeatTTL)
	}
	return JobKey{Service: l.Service, JobType: l.JobType, Key: l.Key, KeyHash: l.KeyHash,
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

// update runs one operation on key: it takes the key's lane (one write of
// this coordinator per key at a time; see keyTable), runs the
// read-reduce-CAS loop and records the contention it met.
func (c *KeyCoordinator) update(ctx context.Context, key JobKey, assumeAbsent bool, reduce func(*KeyState, time.Time) *KeyState) error {
	e := c.keys.pin(key.KVKey)
	defer c.keys.unpin(key.KVKey, e)
	if err := e.lock(ctx); err != nil {
		return err
	}
	conflicts, err := c.casLoop(ctx, e, key, assumeAbsent, reduce)
	c.stats.record(conflicts)
	return err
}

// casLoop is the read-reduce-CAS loop. It is called holding e's lane and
// returns having released it. reduce returns the new state, or nil when
// the outcome writes nothing; it may be called several times and must
// leave its outcome from the last call.
//
// The first attempt writes on the state this coordinator remembers, or,
// with assumeAbsent, creates a key it knows nothing of (admission always
// writes to an absent key), without a read. A write on such a guess that
// turns out stale costs one failed write and a read, and is not a lost
// race; a failed write on state this call read is, and is followed by a
// backoff. It returns the number of races lost.
//
// Reads happen outside the lane, so that an operation that only needs to
// look (an acquisition that finds every slot taken) does not hold up this
// coordinator's writes to the key; an operation that read and then writes
// takes the lane again and, if another of this coordinator's operations
// wrote meanwhile, starts from that newer state.
func (c *KeyCoordinator) casLoop(ctx context.Context, e *keyEntry, key JobKey, assumeAbsent bool, reduce func(*KeyState, time.Time) *KeyState) (int, error) {
	held := true // whether this call holds e's lane
	defer func() {
		if held {
			e.unlock()
		}
	}()
	var (
		state    *KeyState
		rev      uint64
		have     bool // state and rev are what we believe is stored
		verified bool // state and rev were read (or confirmed by a write) during this call
	)
	conflicts := 0
	if e.window > 0 && time.Since(e.lostAt) < windowMemory*e.window {
		// A contended key: pace this operation's first attempt too, without
		// holding the lane, so that this coordinator's other operations on
		// the key (a renewal) are not held up by the pause.
		window := e.window
		e.unlock()
		held = false
		if err := sleepJitter(ctx, window); err != nil {
			return conflicts, err
		}
		if err := e.lock(ctx); err != nil {
			return conflicts, err
		}
		held = true
	} else {
		e.window = 0 // cold again
	}
	if e.known && c.keys.max > 0 {
		state, rev, have = e.state, e.rev, true
	} else if assumeAbsent {
		have = true
	}
	var buf []byte
	for {
		if !have {
			if held {
				e.unlock()
				held = false
			}
			st, r, err := c.read(ctx, key)
			if err != nil {
				return conflicts, err
			}
			next := reduce(st, c.cfg.Now())
			writes := next != nil && !(next.Empty() && st == nil)
			if err := e.lock(ctx); err != nil {
				return conflicts, err
			}
			held = true
			if !writes && !(e.known && r > 0 && e.rev > r) {
				return conflicts, nil // nothing to write, and nothing newer known
			}
			if e.known && r > 0 && e.rev > r {
				// Written by another operation of this coordinator after
				// the read (or the read came from a lagging replica):
				// newer, and confirmed by the store then. An absent key
				// has no revision to compare; the write settles it.
				st, r = e.state, e.rev
			} else {
				e.remember(st, r)
			}
			state, rev, have, verified = st, r, true, true
		}
		next := reduce(state, c.cfg.Now())
		if next == nil || (next.Empty() && state == nil) {
			if !verified {
				// An outcome that writes nothing must not rest on a guess.
				have = false
				continue
			}
			return conflicts, nil
		}
		var err error
		if next.Empty() {
			err = c.store.Delete(ctx, key.Service, key.KVKey, rev)
			if err == nil {
				e.forget() // absent now; Admit creates it without a read
				e.settle(c.cfg.RetryBackoff)
				return conflicts, nil
			}
		} else {
			if buf == nil {
				buf = make([]byte, 0, encodedSizeEstimate(next))
			}
			buf = appendState(buf[:0], next)
			var newRev uint64
			if state == nil {
				newRev, err = c.store.Create(ctx, key.Service, key.KVKey, buf)
			} else {
				newRev, err = c.store.Update(ctx, key.Service, key.KVKey, buf, rev)
			}
			if err == nil {
				// next is also the outcome's State, which belongs to the
				// caller: remember a copy.
				e.remember(snapshot(next), newRev)
				e.settle(c.cfg.RetryBackoff)
				return conflicts, nil
			}
		}
		e.forget()
		switch {
		case errors.Is(err, ErrStateTooLarge):
			return conflicts, &StateError{KVKey: key.KVKey, Reason: fmt.Sprintf("new state of %d bytes (%d active, %d queued): %v", len(buf), len(next.Active), len(next.Queued), err), Err: ErrStateTooLarge}
		case ctx.Err() != nil:
			return conflicts, ctx.Err()
		case !errors.Is(err, ErrRevisionConflict):
			return conflicts, fmt.Errorf("jobkeys: KV key %q: %w", key.KVKey, err)
		}
		have = false
		if !verified {
			// The remembered or assumed state was stale: not a lost race,
			// read and try again.
			c.stats.staleGuesses.Add(1)
			continue
		}
		verified = false
		conflicts++
		if conflicts >= c.cfg.MaxAttempts {
			return conflicts, fmt.Errorf("%w: KV key %q: %d compare-and-swap attempts lost to concurrent writers", ErrContention, key.KVKey, conflicts)
		}
		window := c.widen(e)
		e.unlock() // sleep without the lane; the read that follows needs none
		held = false
		if err := sleepJitter(ctx, window); err != nil {
			return conflicts, err
		}
	}
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
	st, err := decodeState(value)
	if err != nil {
		return nil, 0, &StateError{KVKey: key.KVKey, Reason: fmt.Sprintf("revision %d: %v", rev, err), Err: ErrCorruptState}
	}
	if st.Service != key.Service || st.JobType != key.JobType || st.KeyHash != key.KeyHash {
		return nil, 0, &StateError{KVKey: key.KVKey, Err: ErrForeignState,
			Reason: fmt.Sprintf("revision %d holds service %q, job type %q, key hash %q", rev, st.Service, st.JobType, st.KeyHash)}
	}
	return st, rev, nil
}

// widen returns the pause after a lost race on e's key and widens the key's
// window; the caller holds e's lane, and sleeps a time drawn uniformly (full
// jitter) from (0, window] after releasing it. The window is:
// RetryBackoff on a key without contention, doubled by every race lost on
// the key and halved by every successful write (see keyEntry.settle),
// within MaxRetryBackoff, and forgotten once the key has been quiet for
// windowMemory windows. All of this coordinator's
// operations on the key share the window, and on a contended key every
// operation, not only the losers, waits a share of it before its first
// attempt (see casLoop): so writers settle near an even chance per attempt,
// instead of early losers backing off ever further while fresh writers
// keep winning, and writers woken together spread out.
func (c *KeyCoordinator) widen(e *keyEntry) time.Duration {
	window := max(e.window, c.cfg.RetryBackoff)
	e.window = min(2*window, c.cfg.MaxRetryBackoff)
	e.lostAt = time.Now()
	return window
}

// sleepJitter sleeps for a uniformly random duration in (0, window].
func sleepJitter(ctx context.Context, window time.Duration) error {
	t := time.NewTimer(time.Duration(mrand.Int64N(int64(window))) + 1)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
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

// keyTable is what a coordinator keeps per KV key: a lane that lets one of
// its operations write the key at a time, the state and revision it last
// read or wrote, and the key's backoff window, its estimate of contention.
//
// The lane costs nothing on distinct keys and turns concurrent writes of
// one process to one key, which would otherwise lose compare-and-swap
// races to each other, into a queue in memory where each write starts from
// the state the one before it wrote: no read, no conflict. Reads are not
// queued (see casLoop). Races with other processes are still settled by
// compare-and-swap.
//
// Entries in use are never evicted; idle entries are kept only while they
// remember something (state, or an open backoff window), and at most max
// of them (evicting an arbitrary one), so memory stays bounded however many
// keys pass through. With max 0 no state is remembered between operations.
type keyTable struct {
	mu      sync.Mutex
	max     int
	entries map[string]*keyEntry
}

// keyEntry is one key's entry. users is guarded by keyTable.mu; the other
// fields (but lane) belong to whoever holds the lane.
type keyEntry struct {
	lane  chan struct{} // holds one token while an operation may write
	users int           // operations that pinned the entry

	state  *KeyState // last state read or written; immutable once stored
	rev    uint64
	known  bool          // state and rev are what this coordinator last saw stored
	window time.Duration // backoff window; 0 while the key is not contended
	lostAt time.Time     // when an operation last lost a race on the key
}

// windowMemory is how many backoff windows after its last lost race a key
// counts as contended: a key that has been quiet that long is cold again.
const windowMemory = 16

func newKeyTable(size int) *keyTable {
	return &keyTable{max: max(size, 0), entries: make(map[string]*keyEntry)}
}

// pin returns k's entry, creating it if needed, and keeps it in the
// table until unpin.
func (t *keyTable) pin(k string) *keyEntry {
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.entries[k]
	if e == nil {
		t.evictIdle()
		e = &keyEntry{lane: make(chan struct{}, 1)}
		t.entries[k] = e
	}
	e.users++
	return e
}

// unpin ends a pin. An entry no longer pinned is dropped when the table is
// over its bound or the entry remembers nothing.
func (t *keyTable) unpin(k string, e *keyEntry) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e.users--
	// With no users left nobody else can touch e, so its fields may be read.
	if e.users == 0 && (len(t.entries) > t.max || !e.known && e.window == 0) {
		delete(t.entries, k)
	}
}

// lock takes e's lane, waiting for it or for ctx to end.
func (e *keyEntry) lock(ctx context.Context) error {
	select {
	case e.lane <- struct{}{}:
		return nil
	default:
	}
	select {
	case e.lane <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// unlock releases e's lane.
func (e *keyEntry) unlock() { <-e.lane }

// evictIdle makes room for one entry by evicting an arbitrary idle one.
// Called with t.mu held.
func (t *keyTable) evictIdle() {
	if len(t.entries) < t.max || t.max == 0 {
		return
	}
	for k, e := range t.entries {
		if e.users == 0 {
			delete(t.entries, k)
			return
		}
	}
}

func (e *keyEntry) remember(state *KeyState, rev uint64) {
	e.state, e.rev, e.known = state, rev, state != nil
}

func (e *keyEntry) forget() { e.state, e.rev, e.known = nil, 0, false }

// settle halves the backoff window after a successful write, down to zero
// below floor.
func (e *keyEntry) settle(floor time.Duration) {
	if e.window /= 2; e.window < floor {
		e.window = 0
	}
}

// contentionStats counts what the compare-and-swap loop met, for tests and
// benchmarks.
type contentionStats struct {
	ops          atomic.Int64 // operations that reached the store
	conflicts    atomic.Int64 // races lost to concurrent writers
	staleGuesses atomic.Int64 // writes on remembered or assumed state that found it changed
	maxConflicts atomic.Int64 // most races lost by one operation
	// lost[n] counts operations that lost n races (the last bucket: n or
	// more): the tail says how far MaxAttempts is.
	lost [16]atomic.Int64
}

func (s *contentionStats) record(conflicts int) {
	s.ops.Add(1)
	s.lost[min(conflicts, len(s.lost)-1)].Add(1)
	if conflicts == 0 {
		return
	}
	s.conflicts.Add(int64(conflicts))
	for {
		m := s.maxConflicts.Load()
		if int64(conflicts) <= m || s.maxConflicts.CompareAndSwap(m, int64(conflicts)) {
			return
		}
	}
}
