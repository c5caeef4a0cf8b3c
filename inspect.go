package jobkeys

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"
)

// The inspect API shows key state as an operator needs it: which keys of a
// job type exist, how full each is, what is stuck, and what changes. It only
// reads; the operator operations in operator.go change what it shows. The
// jobkeys CLI (cmd/jobkeys) is built on it.

// KeyInfo is one KV key of a job type as an operator sees it: the raw
// [Inspection] and the occupancy figures derived from it at the time it was
// read. When the value cannot be used (Problem is set) only KVKey and the
// Inspection fields are filled in.
type KeyInfo struct {
	KVKey string // the KV key, "<service>.<jobType>.<keyHash>"
	Inspection

	DisplayKey string // the display key
	Active     int    // slots held, expired ones included
	MaxActive  int    // the MaxActive the state was last written under
	Queued     int    // jobs waiting
	MaxQueued  int    // the MaxQueuedPerKey the state was last written under
	QueueLimit int    // what admission allows now: MaxQueued + max(0, MaxActive − Active)
	// OldestQueuedAt is when the longest-waiting job was admitted; zero when
	// nothing is queued.
	OldestQueuedAt time.Time
	// NextLeaseExpiry is the earliest lease expiry of a slot still live at
	// ReadAt; zero when no slot is live.
	NextLeaseExpiry time.Time
	// ExpiredSlots counts the slots whose lease expired at or before ReadAt:
	// their holders stopped renewing, and a sweep or an acquisition takes
	// them over (FailStale) or they block the key (Block).
	ExpiredSlots int
	StaleCount   int       // the state's staleTakeoverCount
	UpdatedAt    time.Time // the state's updatedAt
	ReadAt       time.Time // the coordinator's clock when the key was read
}

// Corrupt reports whether the key's value cannot be used as key state: it
// does not parse or validate, or it belongs to another key. Problem says why.
func (k *KeyInfo) Corrupt() bool { return k.Problem != nil }

// OldestQueuedAge is how long the longest-waiting job had waited at ReadAt;
// 0 when nothing is queued.
func (k *KeyInfo) OldestQueuedAge() time.Duration {
	if k.OldestQueuedAt.IsZero() {
		return 0
	}
	return k.ReadAt.Sub(k.OldestQueuedAt)
}

// keyInfo derives the occupancy figures of in at now.
func keyInfo(kvKey string, in Inspection, now time.Time) KeyInfo {
	info := KeyInfo{KVKey: kvKey, Inspection: in, ReadAt: now}
	st := in.State
	if st == nil {
		return info
	}
	info.DisplayKey = st.DisplayKey
	info.Active, info.MaxActive = len(st.Active), st.MaxActive
	info.Queued, info.MaxQueued = len(st.Queued), st.MaxQueuedPerKey
	info.QueueLimit = st.MaxQueuedPerKey + max(0, st.MaxActive-len(st.Active))
	info.StaleCount, info.UpdatedAt = st.StaleTakeoverCount, st.UpdatedAt
	for _, q := range st.Queued {
		if info.OldestQueuedAt.IsZero() || q.CreatedAt.Before(info.OldestQueuedAt) {
			info.OldestQueuedAt = q.CreatedAt
		}
	}
	for _, s := range st.Active {
		if !s.LeaseExpiresAt.After(now) {
			info.ExpiredSlots++
		} else if info.NextLeaseExpiry.IsZero() || s.LeaseExpiresAt.Before(info.NextLeaseExpiry) {
			info.NextLeaseExpiry = s.LeaseExpiresAt
		}
	}
	return info
}

// InspectKeys lists the keys of jobType in service's bucket (every job type
// when jobType is ""), sorted by KV key, each with its occupancy. A key whose
// value is corrupt or belongs to another key is listed with its Problem, not
// an error of the listing; a key deleted between listing and reading is left
// out. The store must list keys (implement [ListableStore], as [NATSStore] and
// [MemoryStore] do); otherwise the error wraps [ErrInvalidRequest]. A missing
// bucket is an error wrapping [ErrBucketNotFound].
func (c *KeyCoordinator) InspectKeys(ctx context.Context, service, jobType string) ([]KeyInfo, error) {
	lister, ok := c.store.(ListableStore)
	if !ok {
		return nil, fmt.Errorf("%w: store %T cannot list keys (it does not implement ListableStore)", ErrInvalidRequest, c.store)
	}
	kvKeys, err := lister.ListKeys(ctx, service, jobType)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, err
	}
	infos := make([]KeyInfo, 0, len(kvKeys))
	for _, kvKey := range kvKeys {
		info, err := c.InspectKey(ctx, service, kvKey)
		switch {
		case errors.Is(err, ErrKeyNotFound):
			continue
		case errors.Is(err, ErrInvalidRequest):
			// Not "<service>.<jobType>.<keyHash>": list it as foreign.
			info = KeyInfo{KVKey: kvKey, ReadAt: c.cfg.Now()}
			info.Problem = &StateError{KVKey: kvKey, Err: ErrForeignState, Reason: err.Error()}
		case err != nil:
			return nil, err
		}
		infos = append(infos, info)
	}
	return infos, nil
}

// InspectKeys lists the job type's keys as [KeyCoordinator.InspectKeys] does.
func (jt *JobType) InspectKeys(ctx context.Context) ([]KeyInfo, error) {
	return jt.coord.InspectKeys(ctx, jt.service, jt.name)
}

// InspectKey reads the KV key kvKey of service's bucket with its occupancy.
// A corrupt or foreign value is a KeyInfo with Problem set, not an error; a
// missing key is an error wrapping [ErrKeyNotFound].
func (c *KeyCoordinator) InspectKey(ctx context.Context, service, kvKey string) (KeyInfo, error) {
	in, err := c.Inspect(ctx, service, kvKey)
	if err != nil {
		return KeyInfo{}, err
	}
	if in.Revision == 0 {
		return KeyInfo{}, fmt.Errorf("%w: KV key %q in the bucket of service %q", ErrKeyNotFound, kvKey, service)
	}
	return keyInfo(kvKey, in, c.cfg.Now()), nil
}

// InspectKey reads the key that payload derives under the job type's key
// template, as [KeyCoordinator.InspectKey] does. A payload that derives no
// key is an error wrapping [ErrInvalidKey]; a key without state (nothing
// admitted or running) is an error wrapping [ErrKeyNotFound].
func (jt *JobType) InspectKey(ctx context.Context, payload any) (KeyInfo, error) {
	key, err := jt.Key(payload)
	if err != nil {
		return KeyInfo{}, err
	}
	return jt.coord.InspectKey(ctx, jt.service, key.KVKey)
}

// KeyChange is one event of an [OccupancyWatch]: a key whose occupancy
// changed, or, with Initial set, a key as it was when the watch started.
type KeyChange struct {
	// KVKey is the key that changed (or was listed).
	KVKey string
	// Initial marks the keys listed when the watch started, before any
	// change.
	Initial bool
	// Deleted reports that the key was deleted (its state became empty).
	Deleted bool
	// Info is the key as read after the change; only KVKey is set when
	// Deleted or Err is.
	Info KeyInfo
	// Err is set when the key changed but could not be read; the watch
	// goes on.
	Err error
}

// OccupancyWatch follows the occupancy of a job type's keys; see
// [KeyCoordinator.WatchOccupancy]. Its methods are safe for concurrent use.
type OccupancyWatch struct {
	changes chan KeyChange
	mu      sync.Mutex
	err     error
}

// Changes returns the events, in the order they were seen. The channel is
// closed when the watch ends; Err then says why.
func (w *OccupancyWatch) Changes() <-chan KeyChange { return w.changes }

// Err returns why the watch ended once Changes is closed: ctx's error when
// it was cancelled, or an error saying the store stopped watching. Nil
// while the watch runs.
func (w *OccupancyWatch) Err() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

// occupancy is what an OccupancyWatch compares: everything but the times a
// renewal moves (heartbeatAt, leaseExpiresAt, updatedAt).
type occupancy struct {
	problem   string
	maxActive int
	maxQueued int
	stale     int
	slots     []string // job id and slot token of each slot
	queued    []string // job ids
}

func occupancyOf(info KeyInfo) occupancy {
	var o occupancy
	if info.Problem != nil {
		o.problem = info.Problem.Error()
		return o
	}
	st := info.State
	o.maxActive, o.maxQueued, o.stale = st.MaxActive, st.MaxQueuedPerKey, st.StaleTakeoverCount
	for _, s := range st.Active {
		o.slots = append(o.slots, s.JobID+"\x00"+s.SlotToken)
	}
	for _, q := range st.Queued {
		o.queued = append(o.queued, q.JobID)
	}
	return o
}

func (o occupancy) equal(p occupancy) bool {
	return o.problem == p.problem && o.maxActive == p.maxActive && o.maxQueued == p.maxQueued &&
		o.stale == p.stale && slices.Equal(o.slots, p.slots) && slices.Equal(o.queued, p.queued)
}

// WatchOccupancy follows the keys of jobType in service's bucket (every job
// type when jobType is ""): it first sends every key as it is (Initial),
// then one KeyChange per change of a key's occupancy — a slot taken,
// released or taken over, a job queued or removed, a limit rewritten, the
// value becoming corrupt or readable again, the key deleted. Renewals, which
// only move heartbeat and lease times, are not events; neither is a lease
// expiring, which writes nothing (compare [KeyInfo.ExpiredSlots] of the
// next event). Rapid writes to one key may be seen as one change.
//
// The store must watch and list keys ([WatchableStore], [ListableStore]). The watch
// runs until ctx ends or the store stops watching; Changes is closed then. A
// consumer that does not keep up holds up the watch, not the store's
// writers.
func (c *KeyCoordinator) WatchOccupancy(ctx context.Context, service, jobType string) (*OccupancyWatch, error) {
	watcher, ok := c.store.(WatchableStore)
	if !ok {
		return nil, fmt.Errorf("%w: store %T cannot watch keys (it does not implement WatchableStore)", ErrInvalidRequest, c.store)
	}
	if _, ok := c.store.(ListableStore); !ok {
		return nil, fmt.Errorf("%w: store %T cannot list keys (it does not implement ListableStore)", ErrInvalidRequest, c.store)
	}
	wctx, cancel := context.WithCancel(ctx)
	p := &pendingKeys{signal: make(chan struct{}, 1), seen: make(map[string]bool)}
	ended, err := watcher.WatchKeys(wctx, service, jobType, p.push)
	if err != nil {
		cancel()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, err
	}
	initial, err := c.InspectKeys(wctx, service, jobType)
	if err != nil {
		cancel()
		<-ended
		return nil, err
	}
	w := &OccupancyWatch{changes: make(chan KeyChange)}
	go func() {
		defer close(w.changes)
		defer func() { <-ended }()
		defer cancel()
		last := make(map[string]occupancy, len(initial))
		send := func(ch KeyChange) bool {
			select {
			case w.changes <- ch:
				return true
			case <-wctx.Done():
				return false
			}
		}
		for _, info := range initial {
			last[info.KVKey] = occupancyOf(info)
			if !send(KeyChange{KVKey: info.KVKey, Initial: true, Info: info}) {
				w.end(ctx.Err())
				return
			}
		}
		for {
			select {
			case <-wctx.Done():
				w.end(ctx.Err())
				return
			case <-ended:
				if ctx.Err() != nil { // the store's watch ended because ctx did
					w.end(ctx.Err())
					return
				}
				w.end(fmt.Errorf("jobkeys: watch of service %q job type %q ended: the store stopped watching (connection closed?)", service, jobType))
				return
			case <-p.signal:
			}
			for _, kvKey := range p.take() {
				ch, changed := c.occupancyChange(wctx, service, kvKey, last)
				if !changed {
					continue
				}
				if !send(ch) {
					w.end(ctx.Err())
					return
				}
			}
		}
	}()
	return w, nil
}

func (w *OccupancyWatch) end(err error) {
	w.mu.Lock()
	w.err = err
	w.mu.Unlock()
}

// occupancyChange reads kvKey and reports whether its occupancy differs from
// last (which it updates).
func (c *KeyCoordinator) occupancyChange(ctx context.Context, service, kvKey string, last map[string]occupancy) (KeyChange, bool) {
	info, err := c.InspectKey(ctx, service, kvKey)
	switch {
	case errors.Is(err, ErrKeyNotFound):
		if _, ok := last[kvKey]; !ok {
			return KeyChange{}, false // deleted again, or never seen
		}
		delete(last, kvKey)
		return KeyChange{KVKey: kvKey, Deleted: true, Info: KeyInfo{KVKey: kvKey}}, true
	case errors.Is(err, ErrInvalidRequest):
		info = KeyInfo{KVKey: kvKey, ReadAt: c.cfg.Now()}
		info.Problem = &StateError{KVKey: kvKey, Err: ErrForeignState, Reason: err.Error()}
	case err != nil:
		return KeyChange{KVKey: kvKey, Info: KeyInfo{KVKey: kvKey}, Err: err}, ctx.Err() == nil
	}
	occ := occupancyOf(info)
	if prev, ok := last[kvKey]; ok && prev.equal(occ) {
		return KeyChange{}, false
	}
	last[kvKey] = occ
	return KeyChange{KVKey: kvKey, Info: info}, true
}

// pendingKeys collects changed keys between a store's watch callback and
// the goroutine that reads them: each key once, in the order first seen, so
// a burst of writes to one key is read once.
type pendingKeys struct {
	mu     sync.Mutex
	keys   []string
	seen   map[string]bool
	signal chan struct{} // capacity 1: "keys is not empty"
}

func (p *pendingKeys) push(kvKey string) {
	p.mu.Lock()
	if !p.seen[kvKey] {
		p.seen[kvKey] = true
		p.keys = append(p.keys, kvKey)
	}
	p.mu.Unlock()
	select {
	case p.signal <- struct{}{}:
	default:
	}
}

func (p *pendingKeys) take() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	keys := p.keys
	p.keys = nil
	clear(p.seen)
	return keys
}
