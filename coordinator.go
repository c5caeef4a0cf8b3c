package jobkeys

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"os"
	"strconv"
	"sync"
	"time"
)

// Coordinator is the keyed concurrency contract: one method per reducer.
// [KeyCoordinator] implements it over a [Store].
type Coordinator interface {
	Admit(ctx context.Context, req AdmitRequest) (Admission, error)
	Acquire(ctx context.Context, req AcquireRequest) (Acquisition, error)
	Renew(ctx context.Context, req RenewRequest) (Renewal, error)
	Release(ctx context.Context, req ReleaseRequest) (Release, error)
	RemoveQueued(ctx context.Context, req RemoveRequest) (Removal, error)
	RestoreReplaced(ctx context.Context, req RestoreRequest) (Restoration, error)
}

var _ Coordinator = (*KeyCoordinator)(nil)

// AdmitRequest asks to queue a job under its key.
type AdmitRequest struct {
	Service string // the service; names the bucket JOBS_KEYS_<Service>
	JobType string
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
	Service string
	JobType string
	JobID   string
	Payload any // as in AdmitRequest; must derive the same key
	Context TraceContext
	// Retry lets a job that is not queued take a slot (a retry of a job
	// that ran before), as the TS original's lifecycle state "retry".
	Retry bool
	Tries int // the attempt number recorded in the slot
	// InstanceID names the worker in the slot. Defaults to Config.InstanceID.
	InstanceID string
	Policy     Policy
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
	Service string
	JobType string
	JobID   string
	Payload any
	Policy  Policy
}

// RestoreRequest asks to undo a replacement: put Replaced back at the head
// of the queue and drop ReplacementJobID from it.
type RestoreRequest struct {
	Service          string
	JobType          string
	ReplacementJobID string
	Replaced         ReplacedJob // from Admission.Replaced
	Payload          any         // the replacing job's payload
	Policy           Policy
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

	// RetryBackoff is the first pause after a lost compare-and-swap; pauses
	// grow with jitter up to MaxRetryBackoff. Defaults to
	// RetryBackoffDefault (500µs).
	RetryBackoff time.Duration

	// MaxRetryBackoff caps the pause between attempts. Defaults to
	// MaxRetryBackoffDefault (50ms).
	MaxRetryBackoff time.Duration

	// StateCacheSize is how many keys' last read or written state and
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
type KeyCoordinator struct {
	store Store
	cfg   Config
	cache *stateCache
}

// NewCoordinator returns a coordinator over store. cfg may be nil for the
// defaults; a bad cfg value is an error naming the field.
func NewCoordinator(store Store, cfg *Config) (*KeyCoordinator, error) {
	if store == nil {
		return nil, fmt.Errorf("%w: store is nil", ErrInvalidRequest)
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
	switch {
	case c.MaxAttempts == 0:
		c.MaxAttempts = MaxAttemptsDefault
	case c.MaxAttempts < 0:
		return nil, fmt.Errorf("jobkeys: Config.MaxAttempts %d is negative", c.MaxAttempts)
	}
	switch {
	case c.RetryBackoff == 0:
		c.RetryBackoff = RetryBackoffDefault
	case c.RetryBackoff < 0:
		return nil, fmt.Errorf("jobkeys: Config.RetryBackoff %v is negative", c.RetryBackoff)
	}
	switch {
	case c.MaxRetryBackoff == 0:
		c.MaxRetryBackoff = max(MaxRetryBackoffDefault, c.RetryBackoff)
	case c.MaxRetryBackoff < c.RetryBackoff:
		return nil, fmt.Errorf("jobkeys: Config.MaxRetryBackoff %v is less than RetryBackoff %v", c.MaxRetryBackoff, c.RetryBackoff)
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
	return &KeyCoordinator{store: store, cfg: c, cache: newStateCache(c.StateCacheSize)}, nil
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
	var out Admission
	err = c.update(ctx, key, true, func(st *KeyState, now time.Time) *KeyState {
		out = ReduceAdmission(st, key, req, policy, now)
		return out.State
	})
	return out, err
}

// Acquire gives req.JobID a slot if the rules allow; the outcome's Lease
// is what Renew and Release need.
func (c *KeyCoordinator) Acquire(ctx context.Context, req AcquireRequest) (Acquisition, error) {
	policy, key, err := c.prepare(req.Service, req.JobType, req.JobID, req.Payload, req.Policy)
	if err != nil {
		return Acquisition{}, err
	}
	if req.Tries < 0 {
		return Acquisition{}, fmt.Errorf("%w: Tries %d is negative", ErrInvalidRequest, req.Tries)
	}
	if req.InstanceID == "" {
		req.InstanceID = c.cfg.InstanceID
	}
	token := c.cfg.NewSlotToken()
	if token == "" {
		return Acquisition{}, fmt.Errorf("%w: Config.NewSlotToken returned an empty token", ErrInvalidRequest)
	}
	var out Acquisition
	err = c.update(ctx, key, false, func(st *KeyState, now time.Time) *KeyState {
		out = ReduceAcquire(st, key, req, policy, now, token)
		return out.State
	})
	return out, err
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
	return out, err
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
	return out, err
}

// RemoveQueued removes a queued job, or reports it not found.
func (c *KeyCoordinator) RemoveQueued(ctx context.Context, req RemoveRequest) (Removal, error) {
	_, key, err := c.prepare(req.Service, req.JobType, req.JobID, req.Payload, req.Policy)
	if err != nil {
		return Removal{}, err
	}
	var out Removal
	err = c.update(ctx, key, false, func(st *KeyState, now time.Time) *KeyState {
		out = ReduceRemoveQueued(st, req.JobID, now)
		return out.State
	})
	return out, err
}

// RestoreReplaced undoes a replacement (see [RestoreRequest]).
func (c *KeyCoordinator) RestoreReplaced(ctx context.Context, req RestoreRequest) (Restoration, error) {
	policy, key, err := c.prepare(req.Service, req.JobType, req.ReplacementJobID, req.Payload, req.Policy)
	if err != nil {
		return Restoration{}, err
	}
	if req.Replaced.ID == "" {
		return Restoration{}, fmt.Errorf("%w: Replaced.ID is empty", ErrInvalidRequest)
	}
	var out Restoration
	err = c.update(ctx, key, false, func(st *KeyState, now time.Time) *KeyState {
		out = ReduceRestoreReplaced(st, key, req, policy, now)
		return out.State
	})
	return out, err
}

func (c *KeyCoordinator) prepare(service, jobType, jobID string, payload any, p Policy) (Policy, JobKey, error) {
	if jobID == "" {
		return Policy{}, JobKey{}, fmt.Errorf("%w: JobID is empty", ErrInvalidRequest)
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

// update is the read-reduce-CAS loop. reduce returns the new state, or nil
// when the outcome writes nothing; it may be called several times and must
// leave its outcome from the last call. assumeAbsent lets a key the cache
// knows nothing of be created without a read first (admission always writes
// to an absent key); a wrong guess costs one conflict and a read.
func (c *KeyCoordinator) update(ctx context.Context, key JobKey, assumeAbsent bool, reduce func(*KeyState, time.Time) *KeyState) error {
	var (
		state    *KeyState
		rev      uint64
		have     bool // state and rev are what we believe is stored
		verified bool // state and rev were read from the store by this call
	)
	if cached, ok := c.cache.get(key.KVKey); ok {
		state, rev, have = cached.state, cached.rev, true
	} else if assumeAbsent {
		have = true
	}
	var buf []byte
	conflicts := 0
	for {
		if !have {
			var err error
			state, rev, err = c.read(ctx, key)
			if err != nil {
				return err
			}
			have, verified = true, true
		}
		next := reduce(state, c.cfg.Now())
		if next == nil || (next.Empty() && state == nil) {
			if !verified {
				// An outcome that writes nothing must not rest on a guess.
				have = false
				continue
			}
			return nil
		}
		var err error
		if next.Empty() {
			err = c.store.Delete(ctx, key.Service, key.KVKey, rev)
			if err == nil {
				c.cache.drop(key.KVKey)
				return nil
			}
		} else {
			buf = appendState(buf[:0], next)
			var newRev uint64
			if state == nil {
				newRev, err = c.store.Create(ctx, key.Service, key.KVKey, buf)
			} else {
				newRev, err = c.store.Update(ctx, key.Service, key.KVKey, buf, rev)
			}
			if err == nil {
				c.cache.put(key.KVKey, next, newRev)
				return nil
			}
		}
		c.cache.drop(key.KVKey)
		switch {
		case errors.Is(err, ErrStateTooLarge):
			return &StateError{KVKey: key.KVKey, Reason: fmt.Sprintf("new state of %d bytes (%d active, %d queued): %v", len(buf), len(next.Active), len(next.Queued), err), Err: ErrStateTooLarge}
		case ctx.Err() != nil:
			return ctx.Err()
		case !errors.Is(err, ErrRevisionConflict):
			return err
		}
		have = false
		if !verified {
			continue // the guess was stale, not a lost race: read and try again
		}
		verified = false
		conflicts++
		if conflicts >= c.cfg.MaxAttempts {
			return fmt.Errorf("%w: KV key %q: %d compare-and-swap attempts lost to concurrent writers", ErrContention, key.KVKey, conflicts)
		}
		if err := c.pause(ctx, conflicts); err != nil {
			return err
		}
	}
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

// pause sleeps before the next attempt: exponential in the number of lost
// races, with full jitter so that contending writers spread out.
func (c *KeyCoordinator) pause(ctx context.Context, conflicts int) error {
	ceiling := c.cfg.RetryBackoff << min(conflicts-1, 20)
	if ceiling <= 0 || ceiling > c.cfg.MaxRetryBackoff {
		ceiling = c.cfg.MaxRetryBackoff
	}
	d := time.Duration(mrand.Int64N(int64(ceiling)) + 1)
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

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

// stateCache remembers the last state and revision this coordinator read or
// wrote per KV key. Entries are immutable; a stale entry only costs a failed
// compare-and-swap and a read.
type stateCache struct {
	mu      sync.Mutex
	max     int
	entries map[string]cachedState
}

type cachedState struct {
	state *KeyState
	rev   uint64
}

func newStateCache(size int) *stateCache {
	if size < 0 {
		size = 0
	}
	return &stateCache{max: size, entries: make(map[string]cachedState)}
}

func (c *stateCache) get(k string) (cachedState, bool) {
	if c.max == 0 {
		return cachedState{}, false
	}
	c.mu.Lock()
	e, ok := c.entries[k]
	c.mu.Unlock()
	return e, ok
}

func (c *stateCache) put(k string, st *KeyState, rev uint64) {
	if c.max == 0 {
		return
	}
	c.mu.Lock()
	if _, ok := c.entries[k]; !ok && len(c.entries) >= c.max {
		for victim := range c.entries { // evict an arbitrary entry
			delete(c.entries, victim)
			break
		}
	}
	c.entries[k] = cachedState{state: st, rev: rev}
	c.mu.Unlock()
}

func (c *stateCache) drop(k string) {
	if c.max == 0 {
		return
	}
	c.mu.Lock()
	delete(c.entries, k)
	c.mu.Unlock()
}
