package jobkeys

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"weak"
)

// Watcher holds one watch per service on a store's keys and fans the changes
// out in memory to the goroutines waiting for particular keys, so that any
// number of blocked acquisitions cost one watch. Create one per store and
// process with [NewWatcher], share it between [Runner]s, and [Watcher.Close]
// it when done.
//
// For the [Runner]s it serves, a Watcher over a [NATSStore] or
// [MemoryStore] does more than signal: its watch carries the values of the
// keys they wait on, and it wakes only as many waiting Runners as a change
// leaves slots free (a heartbeat wakes none), in the order of their jobs in
// the key's queue, holding back those whose jobs have other processes'
// jobs queued ahead of them for a short grace per job ahead; a Run whose
// job is queued behind others does not try before its turn either (see
// [Runner.Run]). It hands each such key's latest state and
// revision to the waiters' coordinators, so that a woken Runner decides and
// writes without reading the key, and keeps doing so for a second after the
// last waiter leaves, for the release and the next admission. A write of
// such a key by a coordinator whose Runners have waited through the
// Watcher (a release, most of all) reaches it as soon as the write's reply
// does, not when its watch delivers the write: the waiters in the process
// the write frees slots for are woken at once. A store that
// wraps one of these (its own type) gets plain signals. The cost: the
// service's watch carries every value written to any of its keys, not only
// the keys waited on (those alone are decoded), so each Watcher receives the
// service's write rate times its states' size.
//
// Over a [NATSStore] made with [WithWakeUps], the Runners' blocked
// acquisitions of queued jobs do not use the watch at all: each waits for
// the wake-ups sent to its own job's subject by the writes that leave a
// slot free for it (see WithWakeUps), so a process receives one message
// per slot freed for one of its jobs instead of every change of the key.
// Subscribe, and retries (WithRetry), still use the watch.
//
// A service's watch starts with the first [Watcher.Subscribe] for it and
// lasts until Close, or until the store ends it (a closed connection); the
// next Subscribe then starts a new one. A Watcher is safe for concurrent use.
//
// The zero value has no store to watch: its Subscribe fails with an error
// wrapping [ErrInvalidRequest] (or [ErrWatcherClosed] after Close) and its
// Close does nothing. Create a Watcher with [NewWatcher].
type Watcher struct {
	store  WatchableStore
	ctx    context.Context // parent of every watch; cancelled by Close
	cancel context.CancelFunc
	wg     sync.WaitGroup // one per running watch's monitor goroutine

	grace time.Duration // waiterGrace; tests change it before subscribing

	mu      sync.Mutex
	closed  bool
	watches map[string]*serviceWatch
	decodes uint64 // watched values decoded (see keyWatch.decode)
	// linked are the key tables of the coordinators whose Runners waited
	// through this Watcher: each wakes its waiters ahead of a batch's
	// write (see prewake) until Close. Weak: a coordinator its user drops
	// is not kept alive by a Watcher that outlives it (dead entries are
	// pruned as the map grows).
	linked map[weak.Pointer[keyTable]]struct{}
	// waited maps the KV key of every keyWatch of a running watch to it,
	// for prewake to find without the lock. Written under mu.
	waited sync.Map
	// wakeSubs are the open subscriptions of subscribeWake, which Close
	// ends.
	wakeSubs map[string]map[*Subscription]struct{} // by KV key
}

// serviceWatch is the watch of one service and its subscribers. Its fields
// other than service and ready are guarded by Watcher.mu.
type serviceWatch struct {
	service string
	ready   chan struct{} // closed once the start attempt has finished
	err     error         // why the watch did not start; set before ready closes
	ended   bool          // the watch has stopped
	subs    map[string]map[*Subscription]struct{}
	keys    map[string]*keyWatch // the keys waiters wait on
}

// keyWatch is what a Watcher keeps of one key that waiters (the blocked
// acquisitions of Runners, see subscribeQueued) wait on: the waiters (in
// arrival order, sorted by their jobs' places in the queue at each wake),
// the latest change the watch delivered, and the key tables of the
// coordinators it feeds that change to. Guarded by Watcher.mu, but w, sw
// and kvKey, which are set once, and the atomics.
type keyWatch struct {
	w       *Watcher
	sw      *serviceWatch
	kvKey   string
	waiters []*Subscription
	// nwaiting is len(waiters), for prewake to read without the lock.
	nwaiting atomic.Int32
	tables   map[*keyTable]int // coordinators' key tables, by waiters using them
	rev      uint64            // the revision of the latest change delivered; 0 before one
	seq      uint64            // changes delivered
	at       time.Time         // when the latest change was delivered
	// deferred wakes the waiters whose turn (see turn) comes after the
	// latest change: it runs wake again at deferredAt (zero when not
	// armed).
	deferred   *time.Timer
	deferredAt time.Time
	rewake     func()        // wake under Watcher.mu, for deferred
	grace      time.Duration // Watcher.grace
	decodes    *uint64       // Watcher.decodes
	service    string
	// pending is the latest change while no waiter waits, not decoded
	// (no wake-up needs it): wake decodes it when a waiter comes.
	pending *ValueChange
	// linger keeps feeding the key's changes to the tables in it (each
	// holding one attachment of its own, counted in tables) for
	// feedLinger after their last waiter left, so that the process's
	// next operations on the key (the release of the slot the waiter
	// took, the next admission) start from the watched state without a
	// read. idleAt is when the last waiter left; dropLinger ends it.
	linger     map[*keyTable]bool
	idleAt     time.Time
	dropLinger *time.Timer
	// state is the key's state at rev (nil when deleted), valid when
	// decoded; a watch without values, or a value that does not decode as
	// this key's state, leaves decoded false and every waiter is woken on
	// every change.
	state   *KeyState
	decoded bool
}

// NewWatcher returns a watcher over store, which should be the store of the
// [KeyCoordinator]s whose acquisitions it wakes. No watch starts until the
// first Subscribe.
func NewWatcher(store WatchableStore) (*Watcher, error) {
	if store == nil {
		return nil, fmt.Errorf("%w: watcher store is nil", ErrInvalidRequest)
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Watcher{store: store, ctx: ctx, cancel: cancel, grace: waiterGrace, watches: make(map[string]*serviceWatch),
		linked: make(map[weak.Pointer[keyTable]]struct{})}, nil
}

// Subscribe registers interest in changes of kvKey (a [JobKey.KVKey]) in
// service's bucket, starting the service's watch if it is not running; ctx
// bounds that start. Every change made after Subscribe returns is signalled on
// the subscription's Changed channel. Close the subscription when done.
//
// It fails with an error wrapping [ErrWatcherClosed] after [Watcher.Close],
// with one wrapping [ErrInvalidRequest] on a Watcher not made by
// [NewWatcher], with ctx.Err() when ctx ends first, or with the store's
// error when the watch cannot start.
func (w *Watcher) Subscribe(ctx context.Context, service, kvKey string) (*Subscription, error) {
	return w.subscribe(ctx, service, kvKey, nil)
}

// subscribeQueued is Subscribe for a blocked acquisition of job jobID
// whose policy allows limit slots, run by a coordinator whose key table
// is t; retry says the acquisition is a retry (WithRetry), whose job need
// not be queued (see wakeLeft). The subscription is signalled only when a change can help it
// (see Watcher.wake): with behind 0 it starts out woken, and after each
// try that found the key busy at revision seen the waiter calls
// rearm(seen). While it lasts, the watch feeds the key's changes to t
// (see keyTable.watched).
//
// With behind not 0, the job's coordinator's watch-fed state at revision
// behind has it queued behind the jobs that may take the key's free
// slots (see Runner.queuedBehind): the waiter starts out not woken, as if
// its try had found the key busy just before revision behind, so that it
// is woken by the same rules as any waiter (see wake and turn) once this
// Watcher holds revision behind or a later one. A Watcher that holds no
// state of the key (its watch of the key just began) wakes it at once: it
// has no queue to take turns by.
func (w *Watcher) subscribeQueued(ctx context.Context, service, kvKey, jobID string, limit int, t *keyTable, behind uint64, retry bool) (*Subscription, error) {
	if valueWatcherOf(w.store) == nil {
		t = nil // a watch without values has no state to feed, nor turns: a waiter behind is woken at once
	}
	wt := &waiter{jobID: jobID, limit: limit, table: t, woken: true, index: -1, retry: retry}
	if behind != 0 {
		wt.woken, wt.seen = false, behind-1
	}
	return w.subscribe(ctx, service, kvKey, wt)
}

func (w *Watcher) subscribe(ctx context.Context, service, kvKey string, wt *waiter) (*Subscription, error) {
	if _, err := keyFilter(service, ""); err != nil {
		return nil, err
	}
	if !strings.HasPrefix(kvKey, service+".") {
		return nil, fmt.Errorf("%w: KV key %q is not a key of service %q", ErrInvalidRequest, kvKey, service)
	}
	for {
		sw, owner, err := w.serviceWatch(service, kvKey)
		if err != nil {
			return nil, err
		}

		if owner {
			w.start(ctx, sw)
		}
		select {
		case <-sw.ready:
		case <-ctx.Done():
			return nil, ctx.Err()
		}

		if wt != nil && wt.table != nil {
			// Before the watch can feed the entry: the entry's state is
			// not trusted until it is refreshed after this point.
			wt.table.attach(kvKey)
		}
		w.mu.Lock()
		if sw.err == nil && !sw.ended && !w.closed {
			sub := &Subscription{w: w, sw: sw, kvKey: kvKey, changed: make(chan struct{}, 1), done: make(chan struct{}), waiter: wt}
			if wt == nil {
				subs := sw.subs[kvKey]
				if subs == nil {
					subs = make(map[*Subscription]struct{})
					sw.subs[kvKey] = subs
				}
				subs[sub] = struct{}{}
			} else {
				w.addWaiterLocked(sw, kvKey, sub, wt)
			}
			w.mu.Unlock()
			return sub, nil
		}
		err, closed := sw.err, w.closed
		w.mu.Unlock()
		if wt != nil && wt.table != nil {
			wt.table.detach(kvKey)
		}
		switch {
		case closed:
			return nil, fmt.Errorf("%w: subscribe to %s", ErrWatcherClosed, kvKey)
		case ctx.Err() != nil:
			return nil, ctx.Err()
		case owner:
			return nil, err
		case err != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded):
			return nil, err
		}
		// Another caller's start gave up on its own context, or the watch
		// ended just now: start again.
	}
}

// serviceWatch returns service's watch, made (owner: the caller starts
// it) if there is none, or the error of a Watcher closed or made without
// NewWatcher.
func (w *Watcher) serviceWatch(service, kvKey string) (sw *serviceWatch, owner bool, _ error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return nil, false, fmt.Errorf("%w: subscribe to %s", ErrWatcherClosed, kvKey)
	}
	if w.store == nil {
		return nil, false, fmt.Errorf("%w: subscribe to %s: the Watcher has no store; create it with NewWatcher", ErrInvalidRequest, kvKey)
	}
	sw = w.watches[service]
	owner = sw == nil
	if owner {
		sw = &serviceWatch{service: service, ready: make(chan struct{}), subs: make(map[string]map[*Subscription]struct{}),
			keys: make(map[string]*keyWatch)}
		w.watches[service] = sw
	}
	return sw, owner, nil
}

// addWaiterLocked adds sub, of waiter wt, to the waiters of kvKey in sw,
// making the key's watch if needed, and links the waiter's key table.
// Called with w.mu held.
func (w *Watcher) addWaiterLocked(sw *serviceWatch, kvKey string, sub *Subscription, wt *waiter) {
	kw := sw.keys[kvKey]
	if kw == nil {
		kw = w.newKeyWatch(sw, kvKey)
		sw.keys[kvKey] = kw
	}
	wt.wokenAt = kw.seq
	kw.waiters = append(kw.waiters, sub)
	kw.nwaiting.Store(int32(len(kw.waiters)))
	if t := wt.table; t != nil {
		kw.tables[t]++
		if wt := weak.Make(t); !w.isLinked(wt) {
			w.linked[wt] = struct{}{}
			t.link(w)
		}
	}
	if !wt.woken {
		// Queued behind others (subscribeQueued): woken when its turn
		// comes, or at once without a state to take turns by.
		if !kw.decoded && kw.pending == nil {
			wt.woken = true
			sub.signal()
		} else {
			kw.wake(time.Now())
		}
	}
}

// newKeyWatch returns the keyWatch of kvKey in sw. Called with w.mu held.
func (w *Watcher) newKeyWatch(sw *serviceWatch, kvKey string) *keyWatch {
	kw := &keyWatch{w: w, sw: sw, kvKey: kvKey, tables: make(map[*keyTable]int), grace: w.grace, decodes: &w.decodes,
		service: sw.service, linger: make(map[*keyTable]bool)}
	w.waited.Store(kvKey, kw)
	kw.rewake = func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		if !sw.ended && sw.keys[kvKey] == kw {
			kw.deferredAt = time.Time{}
			kw.wake(time.Now())
		}
	}
	return kw
}

// feedLinger is how long a Watcher keeps feeding a key's changes to a
// coordinator after its last waiter on the key left (see keyWatch.linger).
// Such changes are not decoded unless an operation uses them.
const feedLinger = time.Second

// idle starts kw's linger after its last waiter left: it is dropped
// feedLinger later unless a waiter comes meanwhile. Called with
// Watcher.mu held.
func (w *Watcher) idle(sw *serviceWatch, kvKey string, kw *keyWatch) {
	kw.idleAt = time.Now()
	if len(kw.linger) == 0 || sw.ended {
		w.drop(sw, kvKey, kw)
		return
	}
	if kw.dropLinger == nil {
		kw.dropLinger = time.AfterFunc(feedLinger, func() {
			w.mu.Lock()
			defer w.mu.Unlock()
			if sw.keys[kvKey] != kw || len(kw.waiters) > 0 {
				return // dropped, or waited on again: idle re-arms it
			}
			if left := feedLinger - time.Since(kw.idleAt); left > 0 {
				kw.dropLinger.Reset(left)
				return
			}
			w.drop(sw, kvKey, kw)
		})
	} else {
		kw.dropLinger.Reset(feedLinger)
	}
}

// drop forgets kw, which has no waiters, and ends its lingering feeds.
// Called with Watcher.mu held.
func (w *Watcher) drop(sw *serviceWatch, kvKey string, kw *keyWatch) {
	kw.stop()
	for t := range kw.linger {
		t.detach(kvKey)
	}
	clear(kw.linger)
	clear(kw.tables)
	if sw.keys[kvKey] == kw {
		delete(sw.keys, kvKey)
	}
	w.waited.CompareAndDelete(kvKey, kw)
}

// stop stops kw's timers, for a keyWatch no longer used. Called with
// Watcher.mu held.
func (kw *keyWatch) stop() {
	if kw.deferred != nil {
		kw.deferred.Stop()
	}
	kw.deferredAt = time.Time{}
	if kw.dropLinger != nil {
		kw.dropLinger.Stop()
	}
}

// start starts sw's watch; the caller registered sw in w.watches.
func (w *Watcher) start(ctx context.Context, sw *serviceWatch) {
	wctx, cancel := context.WithCancel(w.ctx)
	abandon := context.AfterFunc(ctx, cancel) // the starter gave up
	var ended <-chan struct{}
	var err error
	if vw := valueWatcherOf(w.store); vw != nil {
		ended, err = vw.WatchValues(wctx, sw.service, func(c ValueChange) { w.dispatchChange(sw, c) })
	} else {
		ended, err = w.store.WatchKeys(wctx, sw.service, "", func(kvKey string) {
			w.dispatchChange(sw, ValueChange{KVKey: kvKey})
		})
	}
	started := err == nil
	if !abandon() && started { // abandon() on every path: it holds ctx until called
		err = ctx.Err()
	}
	if err != nil {
		cancel()
		err = fmt.Errorf("jobkeys: watch keys of service %q: %w", sw.service, err)
	}

	w.mu.Lock()
	if started && err == nil && w.closed {
		cancel()
		err = fmt.Errorf("%w: watch of service %q", ErrWatcherClosed, sw.service)
	}
	sw.err = err
	if err != nil && w.watches[sw.service] == sw {
		delete(w.watches, sw.service)
	}
	monitored := started && !w.closed // Close waits only for watches it can see
	if monitored {
		w.wg.Add(1)
		go w.monitor(sw, ended, cancel)
	}
	close(sw.ready)
	w.mu.Unlock()
	if started && !monitored {
		<-ended // cancelled above; wait outside the lock, since changed takes it
	}
}

// valueWatcherOf returns store as a ValueWatcher, or nil when it has no
// value watch.
func valueWatcherOf(store WatchableStore) ValueWatcher {
	vw, _ := store.(ValueWatcher)
	return vw
}

// monitor waits for sw's watch to end, then wakes its subscribers so that
// they notice and subscribe again.
func (w *Watcher) monitor(sw *serviceWatch, ended <-chan struct{}, cancel context.CancelFunc) {
	defer w.wg.Done()
	<-ended
	cancel()
	w.mu.Lock()
	defer w.mu.Unlock()
	sw.ended = true
	if w.watches[sw.service] == sw {
		delete(w.watches, sw.service)
	}
	for _, subs := range sw.subs {
		for sub := range subs {
			sub.end()
		}
	}
	clear(sw.subs)
	for kvKey, kw := range sw.keys {
		kw.stop()
		w.waited.CompareAndDelete(kvKey, kw) // nothing to prewake any more
		for t := range kw.tables {
			t.unwatched(kvKey) // changes from now on may be missed
		}
		for t := range kw.linger {
			if kw.tables[t]--; kw.tables[t] == 0 {
				delete(kw.tables, t)
			}
			t.detach(kvKey)
		}
		clear(kw.linger)
		if len(kw.waiters) == 0 {
			delete(sw.keys, kvKey)
		}
		for _, sub := range kw.waiters {
			sub.end()
		}
	}
	// The waiters' Close still detaches them from their tables.
}

// dispatchChange signals the subscribers of c's key, and wakes the waiters
// on it that the change can help. A change without a revision comes from a
// watch without values. It never blocks.
func (w *Watcher) dispatchChange(sw *serviceWatch, c ValueChange) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for sub := range sw.subs[c.KVKey] {
		sub.signal()
	}
	kw := sw.keys[c.KVKey]
	if kw == nil {
		return
	}
	if c.Revision != 0 && c.Revision <= kw.rev {
		return // delivered before: a restarted consumer delivers it again
	}
	kw.seq++
	kw.at = time.Now()
	switch {
	case c.Revision == 0: // no values: every change may help anyone
		kw.decoded = false
	case len(kw.waiters) == 0 && !c.Deleted:
		// Only lingering feeds: no wake-up needs the state, and the
		// coordinators decode it if an operation uses it.
		kw.rev, kw.state, kw.decoded, kw.pending = c.Revision, nil, false, &c
		for t := range kw.tables {
			t.watchedValue(c.KVKey, sw.service, c.Value, c.Revision)
		}
		return
	default:
		kw.rev, kw.state, kw.decoded, kw.pending = c.Revision, nil, true, nil
		if !c.Deleted {
			kw.state, kw.decoded = kw.decode(sw.service, c)
		}
		for t := range kw.tables {
			t.watched(c.KVKey, kw.state, c.Revision, kw.decoded)
		}
	}
	kw.wake(kw.at)
}

// decode returns c's state and true, or false when c's value is not this
// key's state. A state one of the fed coordinators holds at c's revision
// (its own write, typically) is taken from it, not decoded again.
func (kw *keyWatch) decode(service string, c ValueChange) (*KeyState, bool) {
	for t := range kw.tables {
		if st := t.held(c.KVKey, c.Revision, c.Value); st != nil {
			return st, true
		}
	}
	*kw.decodes++
	st, err := decodeState(c.Value)
	if err != nil || st.Service != service || kvKeyFor(st.Service, st.JobType, st.KeyHash) != c.KVKey {
		return nil, false
	}
	return st, true
}

// waiterGrace is how long after a change that frees slots a waiter whose
// job is not among the first queued jobs waits before it tries anyway,
// per queued job ahead of it beyond the free slots: the jobs ahead, in
// other processes, go first, and only if they do not take the slots (their
// process crashed or stopped waiting) do the ones behind try.
const waiterGrace = 2 * time.Millisecond

// wake signals the waiters the latest change can help: as many as it
// leaves slots free, counting those already woken and not yet back, in
// the order of their jobs in the key's queue (waiters whose jobs are not
// queued, retries, first, then in arrival order), passing over waiters
// that found the key busy at that revision or later, and those whose turn
// has not come (see turn; a timer wakes them when it does). Without a
// decoded state it wakes, in arrival order, every waiter that no change
// has been delivered to since it was last woken.
func (kw *keyWatch) wake(now time.Time) {
	if c := kw.pending; c != nil {
		kw.pending = nil
		kw.state, kw.decoded = kw.decode(kw.service, *c)
	}
	free := len(kw.waiters)
	var queued []QueuedJob // the queue the waiters' turns follow; nil: none
	if kw.decoded && kw.state != nil {
		limit := kw.state.MaxActive
		for _, sub := range kw.waiters {
			limit = max(limit, sub.waiter.limit)
		}
		live := 0
		for i := range kw.state.Active {
			if kw.state.Active[i].LeaseExpiresAt.After(now) {
				live++
			}
		}
		free = max(limit-live, 0)
		queued = kw.state.Queued
		kw.order(queued)
		kw.wakeLeft()
	}
	woken := 0
	for _, sub := range kw.waiters {
		if sub.waiter.woken {
			woken++
		}
	}
	var later time.Time // the earliest turn still to come
	local := 0          // waiters passed whose jobs are queued (ahead of the next)
	for _, sub := range kw.waiters {
		if woken >= free {
			break
		}
		wt := sub.waiter
		i := -1
		if queued != nil {
			i = wt.index
		}
		ahead := i - local // jobs queued ahead of wt's that no waiter here waits for
		if i >= 0 {
			local++
		}
		if wt.woken || !(kw.decoded && wt.seen < kw.rev || !kw.decoded && wt.wokenAt < kw.seq) {
			continue
		}
		if at := kw.turn(i, ahead, free); !at.IsZero() && now.Before(at) {
			// Its turn comes after the jobs of other processes ahead of
			// it.
			if later.IsZero() || at.Before(later) {
				later = at
			}
			continue
		}
		wt.woken, wt.wokenAt = true, kw.seq
		woken++
		sub.signal()
	}
	if !later.IsZero() && woken < free && (kw.deferredAt.IsZero() || later.Before(kw.deferredAt)) {
		kw.deferredAt = later
		if kw.deferred == nil {
			kw.deferred = time.AfterFunc(later.Sub(now), kw.rewake)
		} else {
			kw.deferred.Reset(later.Sub(now))
		}
	}
}

// wakeLeft signals the waiters not trying already whose queued jobs have
// left the queue since their last tries found the key busy (removed,
// replaced, or run elsewhere): at the revision such a try rested on
// (waiter.seen) the job was queued, and in the latest state, later, it is
// not. Each waits for a slot its job can no longer take; its try ends the
// wait (a Run returns ReasonNotQueued) instead of the next recheck. They
// count as woken until they come back, as any waiter that tries (see
// wake). Called with Watcher.mu held, after order.
func (kw *keyWatch) wakeLeft() {
	for _, sub := range kw.waiters {
		wt := sub.waiter
		if wt.index >= 0 {
			break // sorted: the waiters whose jobs are not queued come first
		}
		if !wt.woken && !wt.retry && wt.seen != 0 && kw.rev > wt.seen {
			wt.woken, wt.wokenAt = true, kw.seq
			sub.signal()
		}
	}
}

// order sets each waiter's index, the place of its job in queued (-1: not
// queued), and sorts kw.waiters by it, stably: waiters whose jobs are not
// queued first, in arrival order. A job's place only moves forward while it
// is queued (jobs leave the queue, and join at its tail), so each search
// starts from the waiter's last index and usually ends there or one place
// before. Called with Watcher.mu held.
func (kw *keyWatch) order(queued []QueuedJob) {
	sorted := true
	for k, sub := range kw.waiters {
		wt := sub.waiter
		wt.index = queuedFrom(queued, wt.jobID, wt.index)
		if k > 0 && wt.index < kw.waiters[k-1].waiter.index {
			sorted = false
		}
	}
	if sorted {
		return
	}
	for k := 1; k < len(kw.waiters); k++ { // insertion sort: stable, and the waiters are nearly sorted
		for j := k; j > 0 && kw.waiters[j].waiter.index < kw.waiters[j-1].waiter.index; j-- {
			kw.waiters[j], kw.waiters[j-1] = kw.waiters[j-1], kw.waiters[j]
		}
	}
}

// queuedFrom is indexQueued(queued, jobID), searching from index hint
// towards the head first (a hint of -1 or past the tail starts at the
// tail).
func queuedFrom(queued []QueuedJob, jobID string, hint int) int {
	if hint < 0 || hint >= len(queued) {
		hint = len(queued) - 1
	}
	for i := hint; i >= 0; i-- {
		if queued[i].JobID == jobID {
			return i
		}
	}
	for i := hint + 1; i < len(queued); i++ {
		if queued[i].JobID == jobID {
			return i
		}
	}
	return -1
}

// turn returns when the waiter whose job is at index i of the key's queue
// (-1: not queued, a retry) may try for one of free slots after the latest
// change, ahead being the jobs queued before it that no waiter of this
// Watcher waits for: at once (the zero time) for the head, a job not
// queued, or fewer jobs ahead than free slots; else waiterGrace after the
// change per such job beyond the free slots. The jobs queued ahead would
// take the slots first (every process wakes its waiters by the same
// queue), so trying at once would only lose races to them, or take their
// turns; should they not try, the waiters behind them still do.
func (kw *keyWatch) turn(i, ahead, free int) time.Time {
	if i <= 0 || ahead < free {
		return time.Time{}
	}
	return kw.at.Add(time.Duration(ahead-free+1) * kw.grace)
}

// isLinked reports whether t is among w's linked tables; when it is not,
// and the map's size is a power of two from 64 on, it first drops the
// entries of tables already collected. Called with w.mu held.
func (w *Watcher) isLinked(t weak.Pointer[keyTable]) bool {
	if _, ok := w.linked[t]; ok {
		return true
	}
	if n := len(w.linked); n >= 64 && n&(n-1) == 0 {
		for wt := range w.linked {
			if wt.Value() == nil {
				delete(w.linked, wt)
			}
		}
	}
	return false
}

// Close stops every watch, ends every subscription (their Done channels
// close) and waits for the watches' goroutines to finish. Later Subscribe
// calls fail with [ErrWatcherClosed]. Close is idempotent.
func (w *Watcher) Close() {
	w.mu.Lock()
	w.closed = true
	for wt := range w.linked {
		if t := wt.Value(); t != nil {
			t.unlink(w)
		}
	}
	clear(w.linked)
	var wakes []*Subscription
	for _, subs := range w.wakeSubs {
		for s := range subs {
			wakes = append(wakes, s)
		}
	}
	w.mu.Unlock()
	for _, s := range wakes {
		s.closeWake()
	}
	if w.cancel != nil { // nil in the zero value, which has no watches
		w.cancel()
	}
	w.wg.Wait()
}

// Subscription is one waiter's interest in one KV key; see
// [Watcher.Subscribe]. It is safe for concurrent use. A Subscription comes
// from Subscribe; the zero value is never signalled and its Close does
// nothing.
type Subscription struct {
	w       *Watcher
	sw      *serviceWatch
	kvKey   string
	changed chan struct{}
	done    chan struct{}
	once    sync.Once
	waiter  *waiter   // a Runner's blocked acquisition; see subscribeQueued
	wake    *wakeWait // one over targeted wake-ups; see subscribeWake
}

// waiter is the wake-up state of a waiter's subscription, guarded by
// Watcher.mu.
type waiter struct {
	jobID string    // the job that waits
	limit int       // the slots its job type's policy allows
	table *keyTable // its coordinator's, fed the key's changes; nil without values
	// woken says it was signalled (or has just subscribed) and has not
	// come back: it is trying, and counts against the free slots.
	woken   bool
	seen    uint64 // the revision its last try found the key busy at; 0 unknown
	wokenAt uint64 // keyWatch.seq when it was last woken
	index   int    // its job's place in the queue at the last wake (see order); -1 not queued
	// retry says its job need not be queued (WithRetry): one not queued
	// has not left the queue (see wakeLeft).
	retry bool
}

// signal makes a value pending on Changed. Called with Watcher.mu held.
func (s *Subscription) signal() {
	select {
	case s.changed <- struct{}{}:
	default: // a signal is already pending
	}
}

// rearm tells the Watcher that the waiter's try found the key busy at
// revision seen (0 when not known): it waits again, to be woken by a later
// change that frees a slot. A slot still free at a later revision than
// seen wakes it again at once.
func (s *Subscription) rearm(seen uint64) {
	if s.wake != nil {
		s.rearmWake(seen)
		return
	}
	if s.waiter == nil {
		return
	}
	s.w.mu.Lock()
	defer s.w.mu.Unlock()
	s.waiter.woken, s.waiter.seen = false, seen
	select {
	case <-s.changed: // a signal from before the try is answered by it
	default:
	}
	if kw := s.sw.keys[s.kvKey]; kw != nil && !s.sw.ended {
		kw.wake(time.Now())
	}
}

// Changed delivers a value when the key has changed at least once since the
// last value was received; changes in between are coalesced.
func (s *Subscription) Changed() <-chan struct{} { return s.changed }

// Done is closed when the subscription ends: it was closed, or its watch
// ended (the Watcher was closed or the store stopped watching). Subscribe
// again to keep waiting for changes.
func (s *Subscription) Done() <-chan struct{} { return s.done }

// Close ends the subscription and forgets it. It is idempotent.
func (s *Subscription) Close() {
	if s.w == nil { // the zero value
		return
	}
	if s.wake != nil {
		s.closeWake()
		return
	}
	s.w.mu.Lock()
	if s.waiter != nil {
		s.closeWaiter()
	} else if subs := s.sw.subs[s.kvKey]; subs != nil {
		delete(subs, s)
		if len(subs) == 0 {
			delete(s.sw.subs, s.kvKey)
		}
	}
	s.w.mu.Unlock()
	s.end()
}

// closeWaiter forgets a waiter's subscription, once, and hands a wake-up
// it was given and did not use on to the next waiter. Called with
// Watcher.mu held.
func (s *Subscription) closeWaiter() {
	kw := s.sw.keys[s.kvKey]
	if kw == nil {
		return
	}
	i := slices.Index(kw.waiters, s)
	if i < 0 {
		return // closed before
	}
	kw.waiters = slices.Delete(kw.waiters, i, i+1)
	kw.nwaiting.Store(int32(len(kw.waiters)))
	if t := s.waiter.table; t != nil {
		switch {
		case kw.tables[t] == 1 && !kw.linger[t] && !s.sw.ended:
			kw.linger[t] = true // the last waiter's attachment lingers
		default:
			if kw.tables[t]--; kw.tables[t] == 0 {
				delete(kw.tables, t)
			}
			t.detach(s.kvKey)
		}
	}
	if len(kw.waiters) == 0 {
		s.w.idle(s.sw, s.kvKey, kw)
		return
	}
	if s.waiter.woken && !s.sw.ended {
		s.waiter.woken = false
		kw.wake(time.Now())
	}
}

func (s *Subscription) end() { s.once.Do(func() { close(s.done) }) }
