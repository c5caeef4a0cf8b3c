package jobkeys

import (
	"errors"
	"fmt"
	"sync/atomic"
	"time"
)

// Targeted wake-ups (see WithWakeUps): the coordinator side, which sends a
// wake-up after each committed write that leaves slots free with jobs
// queued, and the Watcher side, on which a Runner's blocked acquisition
// waits for the wake-ups of its own job instead of a watch of the key.
//
// The protocol (concepts, messages, timings, why no wake-up is lost, and
// the test that holds each invariant) is described in
// docs/design/keys-engine.md.

// errWakeLost ends a woken waiter's try whose write lost its
// compare-and-swap (see waitTry.wake): the Runner waits for the next
// wake-up, which the write that won sends when it leaves a slot free.
var errWakeLost = errors.New("jobkeys: a woken acquisition lost its compare-and-swap")

// wakeStoreOf returns store's targeted wake-ups, or nil when it has none
// or they are off.
func wakeStoreOf(store any) wakeStore {
	ws, ok := store.(wakeStore)
	if !ok || !ws.wakeUps() {
		return nil
	}
	return ws
}

// wakeTrustAge is how recently a Run's coordinator must have learned the
// state by which the Run is blocked, when it did not learn it from a
// request of its own (the watch's, or a wake-up's handed over in memory),
// for the Run to wait on it for a wake-up once subscribed, without a read:
// below wakeRetry, so that the resend of a wake-up sent before the
// subscription reached the server finds it. A state from the
// coordinator's own read or write is held to wakeTrustSent instead (see
// docs/design/keys-engine.md, "Why no wake-up is lost").
const wakeTrustAge = time.Millisecond

// wakeTrustSent is how recently the request that returned the state by
// which a Run is blocked (a read or write of its coordinator's: see
// keycache.Entry.Learned) must have been sent, when the server confirmed the
// Run's wake-up subscription, for the Run to wait on that state without a
// read: below the sum of the resend delays, so that the last resend of any
// later write's wake-up reaches the server after the subscription did. The
// margin below the sum is for the rates of two hosts' clocks, not for any
// latency; the request's round trip is inside the bound. The proof is in
// docs/design/keys-engine.md, "Why no wake-up is lost".
const wakeTrustSent = wakeRetry + wakeRetryLate - 100*time.Microsecond

// wakeTurnMin is the least time a Run over wake-ups queued behind jobs
// that free slots are for waits before it tries anyway (see wakeTurn).
const wakeTurnMin = time.Second

// wakeTurn is how long a Run over wake-ups that found ahead jobs queued
// before its turn, with slots free for them, waits before it tries anyway:
// the write that freed them woke the first of them that wait, and one of
// theirs wakes it when its turn comes; its own wake-up of the jobs ahead
// (wakeAhead) wakes it when none of them waits. The try is for what those
// miss (more jobs ahead nobody waits for than a wake-up passes over, a
// lost wake-up). It is the Watcher's turn (waiterGrace per job ahead, see
// keyWatch.turn), but at least wakeTurnMin: over a network a woken job's
// acquisition takes a wake-up's hop and a write's round trip, more when it
// loses a race or two, and every job's turn behind it as long again; a
// try before it would take the slot it was woken for.
func wakeTurn(ahead int) time.Duration {
	return max(time.Duration(ahead)*waiterGrace, wakeTurnMin)
}

// wakeTargetsMax bounds the queued jobs one wake-up may be offered to
// beyond the free slots (the store moves it on past jobs with no waiter,
// one "no responders" answer each): a Run with more queued jobs ahead of
// it that nobody waits for is woken by its recheck, or, blocked in turn
// (see wakeAhead), tries at its turn (wakeTurn).
const wakeTargetsMax = wakeWalkExtra

// publishWakes sends, after a committed write of key that left it at state
// st (revision rev, its stored value value) from state prev, a wake-up to
// the waiters of the first queued jobs that may take the slots st leaves
// free: every queued job but those this write queued (whoever admitted
// them acts on the outcome). Any write does, a renewal too: a woken
// waiter's acquisition in flight loses to it, and waits for the wake-up
// of the write it lost to (see errWakeLost). A state with no slot free, or
// no job queued before the write, sends nothing: a heartbeat of a full key
// wakes nobody. Called holding the key's lane, with no lock held.
func (c *KeyCoordinator) publishWakes(key JobKey, prev, st *KeyState, rev uint64, value []byte) {
	e := c.keys.entry(key.KVKey) // pinned by the write's operation
	if prev == nil || len(st.Queued) == 0 {
		return
	}
	free := st.MaxActive - liveSlots(st, c.cfg.Now())
	if free > st.MaxActive-len(st.Active) && e != nil && e.blocksStale() {
		// An expired slot counts free, as under FailStale; under Block it
		// stays taken (see freeSlots), which the key's entry says.
		free = st.MaxActive - len(st.Active)
	}
	if free <= 0 {
		return
	}
	var targets []string
	// The reducers keep the order of the queued jobs (they remove some and
	// append): each is looked for in prev's queue after the last one found
	// there, and only one not found there (queued by this write, or the
	// order changed) in all of it, in a set once it is long. The walk
	// stops at the targets' bound: a long queue costs no more than its
	// first targets.
	var before map[string]struct{} // prev's queue, once needed
	from := 0                      // prev.Queued[from:] follows the last job found
	for i := range st.Queued {
		id := st.Queued[i].JobID
		if k := indexQueued(prev.Queued[from:], id); k >= 0 {
			from += k + 1
		} else {
			if before == nil && len(prev.Queued) > 16 {
				before = make(map[string]struct{}, len(prev.Queued))
				for j := range prev.Queued {
					before[prev.Queued[j].JobID] = struct{}{}
				}
			}
			if before != nil {
				if _, ok := before[id]; !ok {
					continue // queued by this write
				}
			} else if indexQueued(prev.Queued[:from], id) < 0 {
				continue // queued by this write
			}
		}
		targets = append(targets, id)
		if len(targets) == free+wakeTargetsMax {
			break
		}
	}
	if len(targets) == 0 {
		return
	}
	c.wakes.publishWakes(key.Service, key.KVKey, value, rev, targets, free)
}

// wakeAhead sends, for a Run of job jobID blocked in turn (see
// waitTry.inTurn) on the state its coordinator's entry e holds at
// revision rev, the wake-up a write leaving that state sends, with jobID
// as the last target: a job ahead with a waiter is woken for a free slot
// (again, if the write that freed it woke it already), jobs ahead nobody
// waits for are passed over ("no responders"), down to jobID, whose Run
// this store then wakes in memory. So a Run behind jobs nobody waits for
// does not wait for its turn (wakeTurn) to take a slot left free, and
// one behind a waiting job does not take it. It sends nothing when e
// holds another revision now, no slot is free for jobs ahead of jobID, or
// jobID is past a wake-up's targets (see wakeTargetsMax). policy is the
// job type's: its MaxActive and StalePolicy say which slots are free (see
// freeSlots). The value sent is this coordinator's encoding of
// the state (appendState), the stored bytes of a state this package
// wrote, not necessarily of one another writer (the TS original) wrote.
func (c *KeyCoordinator) wakeAhead(service, kvKey string, e *keyEntry, rev uint64, jobID string, policy Policy) {
	if c.wakes == nil || e == nil {
		return
	}
	now := c.cfg.Now()
	st, held, ok := e.Known() // immutable once stored: read without the entry's lock
	if !ok || held != rev {
		return
	}
	free := freeSlots(st, policy, now)
	i := indexQueued(st.Queued, jobID)
	if free <= 0 || i < free || i >= free+wakeTargetsMax {
		return
	}
	targets := make([]string, i+1)
	for k := range targets {
		targets[k] = st.Queued[k].JobID
	}
	value := appendState(nil, st)
	if again, ok := c.wakes.(wakeAheadStore); ok {
		// This store may have sent a wake-up of rev already (its own
		// write), to the jobs ahead but not this one.
		again.publishWakesAgain(service, kvKey, value, rev, targets, free)
		return
	}
	c.wakes.publishWakes(service, kvKey, value, rev, targets, free)
}

// freeSlots is the number of st's slots free for a queued job under
// policy at now, as ReduceAcquire counts them: under FailStale a slot
// whose lease expired is free, under Block it stays taken.
func freeSlots(st *KeyState, policy Policy, now time.Time) int {
	if policy.StalePolicy == Block {
		return policy.MaxActive - len(st.Active)
	}
	return policy.MaxActive - liveSlots(st, now)
}

// liveSlots is the number of st's slots whose lease lasts past now.
func liveSlots(st *KeyState, now time.Time) int {
	live := 0
	for i := range st.Active {
		if st.Active[i].LeaseExpiresAt.After(now) {
			live++
		}
	}
	return live
}

// lastValue returns the value of the last state a committed write stored:
// buf itself, or, for a batch (ends the end of each of its values in
// buf), the last of them.
func lastValue(buf []byte, ends []int, batch bool) []byte {
	if !batch || len(ends) == 0 {
		return buf
	}
	from := 0
	if len(ends) > 1 {
		from = ends[len(ends)-2]
	}
	return buf[from:ends[len(ends)-1]]
}

// wakeUps returns the targeted wake-ups of w's store, or nil: a Watcher
// over a store with them on lets its Runners' blocked acquisitions wait
// for wake-ups (subscribeWake) instead of its watch.
func (w *Watcher) wakeUps() wakeStore {
	if w == nil || w.store == nil {
		return nil
	}
	return wakeStoreOf(w.store)
}

// subscribeWake is subscribeQueued over targeted wake-ups: the
// subscription is signalled by the wake-ups sent to job jobID of kvKey.
// A wake-up handed over in memory by this store (a write of this process,
// whose state the server stored as it says) is handed to t, the key table
// of the waiter's coordinator, as a state seen stored (keycache.Entry.Observe:
// the next try starts from it, without a read). One from another process
// is a hint: anyone allowed to publish on its subject could have sent it,
// so only its revision is kept (keycache.Entry.Hinted), and the next try reads
// the key unless t's entry holds that revision or a later one already
// (its own write, the watch, a read). It does not start the Watcher's
// watch. t's entry of the key is kept while the subscription lasts.
func (w *Watcher) subscribeWake(service, kvKey, jobID string, t *keyTable) (*Subscription, error) {
	ws := w.wakeUps()
	if ws == nil {
		return nil, fmt.Errorf("%w: subscribe to %s: the Watcher's store has no wake-ups", ErrInvalidRequest, kvKey)
	}
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return nil, fmt.Errorf("%w: subscribe to %s", ErrWatcherClosed, kvKey)
	}
	sub := &Subscription{w: w, kvKey: kvKey, changed: make(chan struct{}, 1), done: make(chan struct{}), wake: &wakeWait{table: t}}
	if w.wakeSubs == nil {
		w.wakeSubs = make(map[string]map[*Subscription]struct{})
	}
	subs := w.wakeSubs[kvKey]
	if subs == nil {
		subs = make(map[*Subscription]struct{})
		w.wakeSubs[kvKey] = subs
	}
	subs[sub] = struct{}{}
	w.mu.Unlock()

	e := t.pin(kvKey)
	stop, err := ws.subscribeWake(service, kvKey, jobID, func(value []byte, rev uint64) {
		if value == nil {
			// From another process: a hint (see wakeStore.subscribeWake).
			e.Hinted(rev)
		} else {
			st := t.held(kvKey, rev, value)
			if st == nil {
				var err error
				if st, err = decodeState(value); err != nil || st.Service != service || kvKeyFor(st.Service, st.JobType, st.KeyHash) != kvKey {
					return // not this key's state: the Runner's recheck reads it
				}
			}
			e.Observe(st, rev, e.FeedMark())
		}
		for old := sub.wake.rev.Load(); old < rev && !sub.wake.rev.CompareAndSwap(old, rev); old = sub.wake.rev.Load() {
		}
		sub.wakeSignal() // after the revision is stored: see rearmWake
	})
	if err != nil {
		t.unpin(kvKey, e)
		w.mu.Lock()
		w.forgetWake(sub)
		w.mu.Unlock()
		return nil, err
	}
	w.mu.Lock()
	if sub.wake.closed {
		// Closed meanwhile (Watcher.Close), before it had these to end.
		// The entry stays for the caller to look at (Runner.acquire),
		// unpinned: Done is closed, the caller goes no further.
		sub.wake.entry = e
		w.mu.Unlock()
		stop()
		t.unpin(kvKey, e)
		return sub, nil
	}
	sub.wake.entry, sub.wake.stop = e, stop
	w.mu.Unlock()
	return sub, nil
}

// wakeWait is the state of a Subscription made by subscribeWake.
type wakeWait struct {
	table *keyTable
	// entry (pinned while the subscription lasts) and stop (ends the
	// store's subscription) are set once subscribed; guarded by
	// Watcher.mu.
	entry *keyEntry
	stop  func()
	// rev is the latest revision the wake-ups delivered since the Run's
	// current try began (see beginTry) named; 0: none.
	rev atomic.Uint64
	// closed is set once Close ran; guarded by Watcher.mu.
	closed bool
}

// wakeSignal is signal for a wake-up subscription, from the store's
// delivery.
func (s *Subscription) wakeSignal() {
	select {
	case s.changed <- struct{}{}:
	default:
	}
}

// beginTry is called before each try of the Run waiting on wake-up
// subscription s (nil: none): the revisions wake-ups named before it are
// the try's to act on (a hint above what the coordinator holds makes it
// read), so rearmWake weighs only those delivered after. Without this, a
// wake-up naming a revision the key never reaches (a forgery) would
// signal the Run again after each of its tries, for ever.
func (s *Subscription) beginTry() {
	if s != nil && s.wake != nil {
		s.wake.rev.Store(0)
	}
}

// rearmWake is rearm for a wake-up subscription: a signal pending from
// before the try is dropped, unless a wake-up of a later revision than the
// try's came meanwhile (since beginTry). The drain comes first: a wake-up
// whose revision is stored after the check below signals after the drain
// (see subscribeWake), so none is lost between them.
func (s *Subscription) rearmWake(seen uint64) {
	select {
	case <-s.changed:
	default:
	}
	if h := rearmWakeHook; h != nil {
		h(s)
	}
	if seen != 0 && s.wake.rev.Load() > seen {
		s.wakeSignal()
	}
}

// rearmWakeHook, when set (by a test, before any Run), runs in rearmWake
// between its drain and its check, where a wake-up's delivery may come.
var rearmWakeHook func(*Subscription)

// closeWake ends a wake-up subscription, once.
func (s *Subscription) closeWake() {
	s.w.mu.Lock()
	if s.wake.closed {
		s.w.mu.Unlock()
		return
	}
	s.wake.closed = true
	s.w.forgetWake(s)
	// nil while subscribeWake is still subscribing: it ends them then.
	stop, entry := s.wake.stop, s.wake.entry
	s.w.mu.Unlock()
	if stop != nil {
		stop()
	}
	if entry != nil {
		s.wake.table.unpin(s.kvKey, entry)
	}
	s.end()
}

// forgetWake removes s from w.wakeSubs. Called with w.mu held.
func (w *Watcher) forgetWake(s *Subscription) {
	subs := w.wakeSubs[s.kvKey]
	delete(subs, s)
	if len(subs) == 0 {
		delete(w.wakeSubs, s.kvKey)
	}
}
