package jobkeys

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jobkeys/jobkeys/internal/jscas"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// This file holds NATSStore's targeted wake-ups (WithWakeUps; the protocol
// is described in docs/design/keys-engine.md): a write that
// leaves a slot free sends the state it wrote, on core NATS, to the queue
// head's own subject, where that job's blocked Runner waits, instead of
// every waiter of the key learning of the change from a KV watch and
// reading the key.
//
// Wire: subject "<prefix>.<bucket>.<kvKey>.<jobToken>", jobToken the
// unpadded base64url of the first 16 bytes of SHA-256(jobID); payload the
// revision (8 bytes, big-endian) followed by the state's value exactly as
// stored in KV (a wake-up a blocked Run sends again, see
// KeyCoordinator.wakeAhead, carries this package's encoding of it).
//
// A wake-up received from the network is a hint, never a state to write
// on: the server does not vouch for it, and anyone allowed to publish on
// the wake-up subjects can send any revision and any state. Its receiver
// keeps only the revision, and its next try reads the key unless its
// coordinator holds that revision already (its own write, the Watcher's
// watch, an earlier read); see keyEntry.hinted. The state is still sent,
// for processes of earlier versions, which write on it.

// WakePrefixDefault is the subject prefix of targeted wake-ups when
// [WithWakeUps] is given "".
const WakePrefixDefault = "jobkeys.wake"

// WakePrefixMaxLength bounds the length of a wake-up subject prefix in bytes.
const WakePrefixMaxLength = 64

const (
	// wakeRetry is how long a wake-up that found no waiter at all (every
	// target answered "no responders") waits before it is sent once more:
	// a waiter that had just blocked may not have its subscription at the
	// server yet. wakeRetryLate is how long it waits after that resend,
	// if it found no waiter either, before its second and last resend:
	// a blocked Run waits on a state without a read if its request for it
	// was sent less than their sum before its subscription was confirmed
	// (see wakeTrustSent), which on a loaded host or over a network takes
	// longer than wakeRetry alone.
	wakeRetry     = 2 * time.Millisecond
	wakeRetryLate = 8 * time.Millisecond
	// wakeResends is how many times a wake-up that found no waiter at all
	// is sent again: after wakeRetry, then after wakeRetryLate.
	wakeResends = 2
	// wakeChainTTL is how long a wake-up's delivery state is kept: a
	// "no responders" answer comes within a round trip.
	wakeChainTTL = time.Second
	// wakeChainsMax bounds the wake-ups whose delivery state is kept; the
	// oldest are dropped first.
	wakeChainsMax = 4096
	// wakeKeptBytesMax bounds the size of the states kept for wake-ups
	// whose delivery may go on; the oldest are dropped first.
	wakeKeptBytesMax = 8 << 20
	// wakeWalkExtra bounds the targets a wake-up tries beyond its free
	// slots.
	wakeWalkExtra = 64
	// wakeDispatchBuffer is the capacity of the channel the wake-up
	// subscriptions of a store deliver to.
	wakeDispatchBuffer = 1024
	// wakeSubscribeConfirm bounds how long a new wake-up subscription
	// waits for the server to confirm it (a PING's PONG): a waiter
	// confirmed later than wakeTrustSent after its request for the state
	// was sent (or wakeTrustAge after it saw one it did not ask for)
	// reads the key anyway (its read follows the SUB on the connection),
	// so one not confirmed within it does.
	wakeSubscribeConfirm = wakeTrustSent
	// wakeRevLen is the length of the revision in front of a wake-up's
	// value.
	wakeRevLen = 8
)

// wakeStore is implemented by stores that carry targeted wake-ups (see
// WithWakeUps).
type wakeStore interface {
	// wakeUps reports whether targeted wake-ups are on.
	wakeUps() bool
	// publishWakes sends the state value (as stored) at revision rev of
	// kvKey in service's bucket to the waiters of the first free of
	// targets (job IDs, in queue order) that have one. It never blocks on
	// the network and copies value if it keeps it.
	publishWakes(service, kvKey string, value []byte, rev uint64, targets []string, free int)
	// subscribeWake calls fn with every wake-up sent to job jobID of kvKey
	// until stop is called: with its state's value for one this store
	// hands over in memory (a write of this process, stored as it says),
	// with value nil for one from the network, which anyone allowed to
	// publish on the subject may have sent: its revision is a hint,
	// nothing a write may start from. fn must not block. It returns once
	// the server has confirmed the subscription, or after
	// wakeSubscribeConfirm without that.
	subscribeWake(service, kvKey, jobID string, fn func(value []byte, rev uint64)) (stop func(), err error)
}

var _ wakeStore = (*NATSStore)(nil)

// localWaiters is implemented by wake-up stores that tell whether one of
// their own waiters waits for a job's wake-ups.
type localWaiters interface {
	// waitsFor reports whether a waiter of this store waits for the
	// wake-ups of job jobID of kvKey in service's bucket.
	waitsFor(service, kvKey, jobID string) bool
}

var _ localWaiters = (*NATSStore)(nil)

// wakeCounts are a store's wake-up counters since it was made.
type wakeCounts struct {
	Published    uint64 // wake-ups published to other processes (PUBs sent)
	Local        uint64 // wake-ups handed to a waiter of the same store in memory
	NoResponders uint64 // "no responders" answers: a target without a waiter
	Retried      uint64 // resends of wake-ups that found no waiter (at most wakeResends each)
	Dropped      uint64 // wake-ups dropped: a publish failed (connection closed, reconnect buffer full), the reply subscription could not be made, or the service or key was invalid
	Received     uint64 // wake-ups from other processes handed to waiters
	Malformed    uint64 // received messages too short to be a wake-up, ignored
	// Refused counts the server's refusals of wake-up subjects (publish
	// or subscribe) on the store's connection under its prefix, shared
	// by the stores there with that prefix.
	Refused uint64
}

// validateWakePrefix checks a wake-up subject prefix: dot-separated tokens
// of letters, digits, '_' and '-', at most WakePrefixMaxLength bytes: no
// '$' (the server's and JetStream's subjects), no wildcards, no spaces.
func validateWakePrefix(prefix string) error {
	if len(prefix) > WakePrefixMaxLength {
		return fmt.Errorf("%w: wake-up prefix %q is %d bytes, more than %d", ErrInvalidRequest, prefix, len(prefix), WakePrefixMaxLength)
	}
	for tok := range strings.SplitSeq(prefix, ".") {
		if !bucketTokenRe.MatchString(tok) {
			return fmt.Errorf("%w: wake-up prefix %q must be dot-separated tokens of letters, digits, '_' or '-'", ErrInvalidRequest, prefix)
		}
	}
	return nil
}

// subjectsOverlap reports whether a subject could start with both prefixes
// a and b, each ending in ".".
func subjectsOverlap(a, b string) bool {
	return strings.HasPrefix(a, b) || strings.HasPrefix(b, a)
}

// wakeToken is the last token of job jobID's wake-up subject.
func wakeToken(jobID string) string {
	sum := sha256.Sum256([]byte(jobID))
	return base64.RawURLEncoding.EncodeToString(sum[:16])
}

// wakeRefusals counts, per wake-up prefix, the refusals of wake-up subjects
// the server reports on one connection (see permissionGuards.record): they
// concern no store call. The zero value is ready; safe for concurrent use.
type wakeRefusals struct {
	mu       sync.Mutex
	prefixes map[string]*atomic.Uint64 // "<prefix>." → refusals
}

// register returns the counter of prefix (ending in ".").
func (r *wakeRefusals) register(prefix string) *atomic.Uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.prefixes == nil {
		r.prefixes = make(map[string]*atomic.Uint64)
	}
	n := r.prefixes[prefix]
	if n == nil {
		n = new(atomic.Uint64)
		r.prefixes[prefix] = n
	}
	return n
}

// take reports whether v refuses a wake-up subject, and counts it if so.
func (r *wakeRefusals) take(v *permissionViolation) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for p, n := range r.prefixes {
		if strings.HasPrefix(v.subject, p) {
			n.Add(1)
			return true
		}
	}
	return false
}

// wakeHub is a store's wake-up state: its waiters, the delivery of the
// wake-ups it publishes, and its counters. Its methods are safe for
// concurrent use.
//
// Lock order: mu is never held while calling into nats.go, because nats.go
// calls subscriptions' closed handlers (subClosed, which takes mu) under
// its own locks; replyMu is taken before nats.go calls, never with mu.
type wakeHub struct {
	prefix string // "<prefix>."
	nc     *nats.Conn
	// retry and retryLate are wakeRetry and wakeRetryLate; tests may
	// change them before the store is used.
	retry, retryLate time.Duration

	published, local, noResponders, retried, dropped, received, malformed atomic.Uint64
	refused                                                               *atomic.Uint64
	retrySkipped                                                          atomic.Uint64 // retries of stale chains, for tests

	replyMu     sync.Mutex
	replyPrefix atomic.Pointer[string] // "<inbox>.", set once the reply subscription is made

	mu     sync.Mutex
	subs   map[string]*wakeSubject // by subject: this store's waiters
	disp   *wakeDispatcher         // nil when no subscription is live
	live   int                     // subscriptions not yet closed
	chains map[uint64]*wakeChain   // wake-ups whose delivery may go on, by id
	order  []*wakeChain            // every kept wake-up, oldest first
	latest map[string]*wakeChain   // the newest kept wake-up per bucket and key
	// keptBytes is the size of the payloads of the chains in h.chains.
	keptBytes int
	nextID    uint64
}

// wakeSubject is one subject this store's waiters wait on.
type wakeSubject struct {
	subject string
	waiters []*wakeWaiter
	disp    *wakeDispatcher
	sub     *nats.Subscription // nil while it is being made
	closed  bool               // unsubscribed, or the connection closed
	// confirmed is closed once the subject's first waiter is done
	// subscribing: the server confirmed the subscription, or
	// wakeSubscribeConfirm passed without that, or it failed.
	confirmed chan struct{}
}

// wakeWaiter is one subscribeWake.
type wakeWaiter struct {
	mu      sync.Mutex
	fn      func(value []byte, rev uint64)
	stopped bool
}

// deliver calls the waiter's fn unless it has stopped.
func (w *wakeWaiter) deliver(value []byte, rev uint64) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stopped {
		return false
	}
	w.fn(value, rev)
	return true
}

// wakeDispatcher is the goroutine that hands the messages of a store's
// wake-up subscriptions to their waiters; it runs while a subscription is
// live.
type wakeDispatcher struct {
	ch   chan *nats.Msg
	quit chan struct{}
}

// Target states of a wake-up chain.
const (
	wakeUnused   uint8 = iota
	wakeLocal          // handed to a waiter of this store
	wakeSent           // published; no "no responders" answer so far
	wakeNoWaiter       // published and answered "no responders"
)

// wakeChain is the delivery of one published wake-up: its targets in queue
// order, walked on as targets answer that they have no waiter.
type wakeChain struct {
	id uint64
	// key is "<prefix>.<bucket>.<kvKey>.", the prefix of its targets'
	// subjects, and its key in h.latest.
	key     string
	rev     uint64
	payload []byte // revision, then value
	targets []wakeTarget
	free    int
	next    int // index of the next unused target
	sent    int // targets in state wakeSent
	// delivered counts the targets in state wakeLocal.
	delivered int
	resends   int  // resends made or scheduled (at most wakeResends)
	done      bool // over, stale or expired: nothing moves it on
	born      time.Time
}

// wakeTarget is one job a wake-up may go to.
type wakeTarget struct {
	job     string
	subject string // once the walk reached it
	state   uint8
}

// wakeActions are what a walk decided, done outside the hub's lock.
type wakeActions struct {
	payload []byte // the chain's, which it drops when it ends
	local   []*wakeWaiter
	localTo []int // the target of each of local (an index in the chain's targets)
	// rest, when the walk ended the chain (every target it took handed
	// over in memory), is its targets it did not take, for a hand-over
	// no waiter took to move on to (see moveOnLocal).
	rest    []wakeTarget
	publish []string // subjects
	// retry schedules the chain's next resend, retryAfter from now.
	retry      bool
	retryAfter time.Duration
}

// newWakeHub returns the wake-up state of a store on nc with prefix; it
// fails when the prefix could overlap the connection's inboxes or the
// JetStream context's subjects (a refusal of a wake-up subject must never
// be taken for the refusal of a call's).
func newWakeHub(prefix string, js jetstream.JetStream, guards *permissionGuards) (*wakeHub, error) {
	nc := js.Conn()
	if nc == nil {
		return nil, fmt.Errorf("%w: wake-ups need a NATS connection", ErrInvalidRequest)
	}
	p := prefix + "."
	for _, other := range []string{inboxPrefix(nc), jscas.APIPrefix(js.Options())} {
		if subjectsOverlap(p, other) {
			return nil, fmt.Errorf("%w: wake-up prefix %q overlaps the subjects %s…", ErrInvalidRequest, prefix, other)
		}
	}
	return &wakeHub{
		prefix: p,
		nc:     nc,
		retry:  wakeRetry, retryLate: wakeRetryLate,
		refused: guards.wakes.register(p),
		subs:    make(map[string]*wakeSubject),
		chains:  make(map[uint64]*wakeChain),
		latest:  make(map[string]*wakeChain),
	}, nil
}

// subject is the wake-up subject of job jobID of kvKey in bucket.
func (h *wakeHub) subject(bucket, kvKey, jobID string) string {
	return h.prefix + bucket + "." + kvKey + "." + wakeToken(jobID)
}

// wakeUps implements wakeStore.
func (s *NATSStore) wakeUps() bool { return s.wake != nil }

// publishWakes implements wakeStore.
func (s *NATSStore) publishWakes(service, kvKey string, value []byte, rev uint64, targets []string, free int) {
	s.publishWake(service, kvKey, value, rev, targets, free, false)
}

// publishWake is publishWakes, or with again publishWakesAgain.
func (s *NATSStore) publishWake(service, kvKey string, value []byte, rev uint64, targets []string, free int, again bool) {
	if s.wake == nil || free <= 0 || len(targets) == 0 {
		return
	}
	if validateService(service) != nil || !validKVKey(kvKey) {
		s.wake.dropped.Add(1)
		return
	}
	s.wake.publish(s.BucketName(service), kvKey, value, rev, targets, free, again)
}

// wakeAheadStore is implemented by wake-up stores that send a wake-up of
// a revision again (see KeyCoordinator.wakeAhead).
type wakeAheadStore interface {
	// publishWakesAgain is publishWakes, sent even when a wake-up of
	// that revision (or, for this store, of no newer one) went out
	// already, to other targets: the one before it ends. When that one,
	// of the same revision, found no waiter and waits for its retry, this
	// one is sent in its stead after wakeRetry.
	publishWakesAgain(service, kvKey string, value []byte, rev uint64, targets []string, free int)
}

var _ wakeAheadStore = (*NATSStore)(nil)

// publishWakesAgain implements wakeAheadStore.
func (s *NATSStore) publishWakesAgain(service, kvKey string, value []byte, rev uint64, targets []string, free int) {
	s.publishWake(service, kvKey, value, rev, targets, free, true)
}

// subscribeWake implements wakeStore. fn must not call stop, nor modify
// value (which it may keep: the store does not change it either).
func (s *NATSStore) subscribeWake(service, kvKey, jobID string, fn func(value []byte, rev uint64)) (func(), error) {
	if s.wake == nil {
		return nil, fmt.Errorf("%w: wake-ups of job %q of %s: the store has no wake-ups (WithWakeUps)", ErrInvalidRequest, jobID, kvKey)
	}
	if fn == nil {
		return nil, fmt.Errorf("%w: wake-ups of job %q of %s: function is nil", ErrInvalidRequest, jobID, kvKey)
	}
	if err := validateService(service); err != nil {
		return nil, fmt.Errorf("wake-ups of job %q of %s: %w", jobID, kvKey, err)
	}
	if !validKVKey(kvKey) {
		return nil, fmt.Errorf("%w: wake-ups of job %q: %q is not a KV key", ErrInvalidRequest, jobID, kvKey)
	}
	return s.wake.subscribe(s.wake.subject(s.BucketName(service), kvKey, jobID), fn)
}

// waitsFor implements localWaiters.
func (s *NATSStore) waitsFor(service, kvKey, jobID string) bool {
	h := s.wake
	if h == nil {
		return false
	}
	subject := h.subject(s.BucketName(service), kvKey, jobID)
	h.mu.Lock()
	defer h.mu.Unlock()
	e := h.subs[subject]
	return e != nil && len(e.waiters) > 0
}

// wakeCounters returns the store's wake-up counters (zero when off).
func (s *NATSStore) wakeCounters() wakeCounts {
	h := s.wake
	if h == nil {
		return wakeCounts{}
	}
	return wakeCounts{
		Published:    h.published.Load(),
		Local:        h.local.Load(),
		NoResponders: h.noResponders.Load(),
		Retried:      h.retried.Load(),
		Dropped:      h.dropped.Load(),
		Received:     h.received.Load(),
		Malformed:    h.malformed.Load(),
		Refused:      h.refused.Load(),
	}
}

// publish starts the delivery of a wake-up (see publishWakes); again
// sends it even if one of that revision went out already (see
// wakeAheadStore).
func (h *wakeHub) publish(bucket, kvKey string, value []byte, rev uint64, targets []string, free int, again bool) {
	reply, ok := h.replySubjects()
	if !ok {
		h.dropped.Add(1)
		return
	}
	free = min(free, len(targets))
	if n := free + wakeWalkExtra; len(targets) > n {
		targets = targets[:n]
	}
	h.mu.Lock()
	c, acts := h.startLocked(bucket, kvKey, value, rev, targets, free, time.Now(), again)
	h.mu.Unlock()
	if c != nil {
		h.act(c, reply, &acts)
	}
}

// startLocked makes the chain of a wake-up and walks it (see publish); nil
// when a state of the key at rev or newer was published already.
func (h *wakeHub) startLocked(bucket, kvKey string, value []byte, rev uint64, targets []string, free int, now time.Time, again bool) (*wakeChain, wakeActions) {
	return h.startKeyLocked(h.prefix+bucket+"."+kvKey+".", value, rev, targets, free, now, again)
}

// startKeyLocked is startLocked for the chain key key (see wakeChain.key).
func (h *wakeHub) startKeyLocked(key string, value []byte, rev uint64, targets []string, free int, now time.Time, again bool) (*wakeChain, wakeActions) {
	var acts wakeActions
	h.expireLocked(now)
	// waitRetry: sent again while the wake-up it ends, of the same
	// revision, waits for its retry (it found no waiter; one may be
	// subscribing): it waits in its stead, and then walks its targets
	// from the first, so that it does not hand the slot to a job behind
	// the one the retry would have reached.
	waitRetry, resends := false, 0
	if prev := h.latest[key]; prev != nil {
		if prev.rev > rev || prev.rev == rev && !again {
			return nil, acts // a newer state of the key went out already
		}
		if again && prev.rev == rev && h.coveredLocked(prev, targets, free) {
			// Sent again while this store's wake-up of that revision is
			// still out to the jobs ahead (in flight, or handed over):
			// they are not woken a second time for it. The chain goes on
			// with the targets sent again past those it walked, so that
			// a "no responders" answer of a job ahead moves it on to
			// them, down to the job that sent it again, as the wake-up
			// sent again would have.
			h.walkLocked(prev, &acts)
			return prev, acts
		}
		waitRetry = prev.rev == rev && prev.resends > 0 && !prev.done && prev.sent == 0
		resends = prev.resends
		h.endLocked(prev) // stale, or sent again: a 503 for it moves nothing on
	}
	payload := make([]byte, wakeRevLen+len(value))
	binary.BigEndian.PutUint64(payload, rev)
	copy(payload[wakeRevLen:], value)
	h.nextID++
	c := &wakeChain{
		id: h.nextID, key: key, rev: rev, payload: payload,
		targets: make([]wakeTarget, len(targets)),
		free:    min(free, len(targets)), born: now,
	}
	for i, job := range targets {
		c.targets[i].job = job
	}
	h.chains[c.id] = c
	h.keptBytes += len(payload)
	h.order = append(h.order, c)
	h.latest[key] = c
	if waitRetry {
		c.resends = resends
		acts.payload, acts.retry, acts.retryAfter = c.payload, true, h.resendDelay(c.resends)
		return c, acts
	}
	h.walkLocked(c, &acts)
	return c, acts
}

// coveredLocked reports whether chain c, of the revision of a wake-up
// sent again to targets (see wakeAheadStore), has every target it walked
// so far in targets' order at their head, and one of them still awaiting
// an answer or handed to a waiter of this store: the wake-up sent again
// would send the same state to the same first jobs, the ones the free
// slots are for, a second time. It then makes targets past those walked
// c's remaining targets, for c's walk to go on with. Called with h.mu
// held.
//
// Only the second copy of a delivery is not made: why that loses no
// wake-up is in docs/design/keys-engine.md, "Why no wake-up is lost". A
// copy that reached a subscription of a job none of whose waiters took it
// is not left awaiting an answer: it is answered "no responders" (see
// answerNoWaiter; in memory, moveOnLocal), and c moves on past it.
func (h *wakeHub) coveredLocked(c *wakeChain, targets []string, free int) bool {
	if c.done || c.sent+c.delivered == 0 || c.next > len(targets) {
		return false
	}
	for k := range c.targets[:c.next] {
		if c.targets[k].job != targets[k] {
			return false
		}
	}
	rest := targets[c.next:]
	c.targets = append(c.targets[:c.next:c.next], make([]wakeTarget, len(rest))...)
	for k, job := range rest {
		c.targets[c.next+k].job = job
	}
	c.free = min(max(c.free, free), len(c.targets))
	return true
}

// replySubjects returns the prefix of the reply subjects of this store's
// wake-ups, subscribing to them on first use; false when that fails.
func (h *wakeHub) replySubjects() (string, bool) {
	if p := h.replyPrefix.Load(); p != nil {
		return *p, true
	}
	h.replyMu.Lock()
	defer h.replyMu.Unlock()
	if p := h.replyPrefix.Load(); p != nil {
		return *p, true
	}
	p := h.nc.NewInbox() + "."
	if _, err := h.nc.Subscribe(p+"*", h.onReply); err != nil {
		return "", false
	}
	h.replyPrefix.Store(&p)
	return p, true
}

// walkLocked moves chain c on: it takes unused targets in order while
// fewer than free are delivered or awaiting an answer, a target with a
// waiter of this store delivered in memory, any other published. When
// nothing is left in flight the chain is over, or, if nobody was woken at
// all and it was not resent wakeResends times yet, it is sent again after
// h.retry (the first time) or h.retryLate (the second).
func (h *wakeHub) walkLocked(c *wakeChain, acts *wakeActions) {
	acts.payload = c.payload
	for c.delivered+c.sent < c.free && c.next < len(c.targets) {
		tg := &c.targets[c.next]
		c.next++
		if tg.subject == "" {
			tg.subject = c.key + wakeToken(tg.job)
		}
		if e := h.subs[tg.subject]; e != nil && len(e.waiters) > 0 {
			tg.state = wakeLocal
			c.delivered++
			acts.local = append(acts.local, e.waiters...)
			for range e.waiters {
				acts.localTo = append(acts.localTo, c.next-1)
			}
			continue
		}
		tg.state = wakeSent
		c.sent++
		acts.publish = append(acts.publish, tg.subject)
	}
	if c.sent > 0 {
		return // answers may come
	}
	if c.delivered == 0 && c.resends < wakeResends {
		c.resends++
		acts.retry, acts.retryAfter = true, h.resendDelay(c.resends)
		return
	}
	if len(acts.local) > 0 {
		acts.rest = c.targets[c.next:] // endLocked drops c.targets, not the array
	}
	h.endLocked(c)
}

// act does what a walk of c decided, outside the hub's lock.
func (h *wakeHub) act(c *wakeChain, reply string, acts *wakeActions) {
	var missed []int // targets none of whose waiters took it
	if len(acts.local) > 0 {
		value, rev := acts.payload[wakeRevLen:], c.rev
		for i := 0; i < len(acts.local); {
			tg, took := acts.localTo[i], false
			for ; i < len(acts.local) && acts.localTo[i] == tg; i++ {
				if acts.local[i].deliver(value, rev) {
					h.local.Add(1)
					took = true
				}
			}
			if !took {
				missed = append(missed, tg)
			}
		}
	}
	if len(missed) > 0 {
		// Its waiters stopped since the walk chose it: move on, as a
		// "no responders" answer does (see answerNoWaiter), once this
		// walk's other actions are done.
		defer h.moveOnLocal(c, reply, missed, acts)
	}
	if len(acts.publish) > 0 {
		replyTo := reply + strconv.FormatUint(c.id, 10)
		for _, subj := range acts.publish {
			h.published.Add(1) // before the send: the waiter may count first
			if err := h.nc.PublishRequest(subj, replyTo, acts.payload); err != nil {
				h.published.Add(^uint64(0))
				// A closed connection, or a buffer full while
				// reconnecting: the wake-up is lost, the waiters'
				// rechecks find the state.
				h.dropped.Add(1)
				h.mu.Lock()
				h.endLocked(c)
				h.mu.Unlock()
				return
			}
		}
	}
	if acts.retry {
		time.AfterFunc(acts.retryAfter, func() { h.retryChain(c, reply) })
	}
}

// moveOnLocal moves chain c on past its targets missed, handed in memory
// (by the walk whose actions were done) to waiters that had all stopped
// (see act), as onReply moves it on past a target that answered "no
// responders". A chain that walk ended (it handed every target it took
// over in memory) goes on as a wake-up of the same state sent again to
// the targets it did not take, one for each missed, unless a newer state
// of its key went out meanwhile (see startLocked).
func (h *wakeHub) moveOnLocal(c *wakeChain, reply string, missed []int, done *wakeActions) {
	var acts wakeActions
	h.mu.Lock()
	if c.done {
		if len(done.rest) == 0 || h.latest[c.key] != c {
			h.mu.Unlock()
			return
		}
		targets := make([]string, len(done.rest))
		for k := range done.rest {
			targets[k] = done.rest[k].job
		}
		next, nextActs := h.startKeyLocked(c.key, done.payload[wakeRevLen:], c.rev, targets, len(missed), time.Now(), true)
		h.mu.Unlock()
		if next != nil {
			h.act(next, reply, &nextActs)
		}
		return
	}
	moved := false
	for _, i := range missed {
		// Still handed over: a chain that walks its targets again
		// (retryChain) has none so.
		if i < len(c.targets) && c.targets[i].state == wakeLocal {
			c.targets[i].state = wakeNoWaiter
			c.delivered--
			moved = true
		}
	}
	if moved {
		h.walkLocked(c, &acts)
	}
	h.mu.Unlock()
	if moved {
		h.act(c, reply, &acts)
	}
}

// resendDelay is how long after a walk that found no waiter a chain's
// n-th resend (from 1) is sent.
func (h *wakeHub) resendDelay(n int) time.Duration {
	if n <= 1 {
		return h.retry
	}
	return h.retryLate
}

// retryChain sends chain c, which found no waiter, again from its first
// target, unless a newer state of its key was published meanwhile.
func (h *wakeHub) retryChain(c *wakeChain, reply string) {
	h.mu.Lock()
	if c.done || h.latest[c.key] != c {
		h.mu.Unlock()
		h.retrySkipped.Add(1)
		return
	}
	h.retried.Add(1)
	c.next, c.sent, c.delivered = 0, 0, 0
	for i := range c.targets {
		c.targets[i].state = wakeUnused
	}
	var acts wakeActions
	h.walkLocked(c, &acts)
	h.mu.Unlock()
	h.act(c, reply, &acts)
}

// answerNoWaiter answers wake-up m, which the server delivered to this
// store's subscription but no waiter took (each stopped: its Run's wait
// ended while its UNSUB was not at the server yet), as the server answers
// one that finds no subscription: "no responders" (status 503, header
// Nats-Subject naming m's subject), which moves its chain on to the next
// target (see onReply). The server answers nothing for a message it
// delivered, so without this the chain waited for an answer until its
// delivery state expired, and a wake-up sent again for that revision was
// taken for one still out to the job (see coveredLocked). An error means
// the connection is closed: the publisher's chain then expires.
func (h *wakeHub) answerNoWaiter(m *nats.Msg) {
	a := nats.NewMsg(m.Reply)
	a.Header.Set("Status", "503")
	a.Header.Set("Nats-Subject", m.Subject)
	_ = h.nc.PublishMsg(a)
}

// onReply handles an answer to a published wake-up: "no responders" (status
// 503, header Nats-Subject naming the target) moves its chain on to the
// next target.
func (h *wakeHub) onReply(m *nats.Msg) {
	if m.Header.Get("Status") != "503" {
		return
	}
	h.noResponders.Add(1)
	reply, ok := h.replySubjects()
	if !ok {
		return
	}
	id, err := strconv.ParseUint(strings.TrimPrefix(m.Subject, reply), 10, 64)
	if err != nil {
		return
	}
	target := m.Header.Get("Nats-Subject")
	h.mu.Lock()
	c := h.chains[id]
	if c == nil || c.done {
		h.mu.Unlock()
		return
	}
	var acts wakeActions
	for i := range c.targets[:c.next] {
		if tg := &c.targets[i]; tg.subject == target && tg.state == wakeSent {
			tg.state = wakeNoWaiter
			c.sent--
			h.walkLocked(c, &acts)
			break
		}
	}
	h.mu.Unlock()
	h.act(c, reply, &acts)
}

// endLocked ends chain c: nothing moves it on any more. It stays in
// h.order (and in h.latest while it is the newest of its key) until it
// expires, so that an older state of its key is not published after it.
func (h *wakeHub) endLocked(c *wakeChain) {
	if c.done {
		return
	}
	c.done = true
	delete(h.chains, c.id)
	h.keptBytes -= len(c.payload)
	c.payload, c.targets = nil, nil
}

// expireLocked forgets the chains older than wakeChainTTL, and the oldest
// beyond wakeChainsMax or wakeKeptBytesMax.
func (h *wakeHub) expireLocked(now time.Time) {
	n := 0
	for n < len(h.order) && (len(h.order)-n >= wakeChainsMax || h.keptBytes > wakeKeptBytesMax || now.Sub(h.order[n].born) > wakeChainTTL) {
		c := h.order[n]
		h.endLocked(c)
		if h.latest[c.key] == c {
			delete(h.latest, c.key)
		}
		h.order[n] = nil
		n++
	}
	if n > 0 {
		h.order = h.order[n:]
		if cap(h.order) > 64 && len(h.order) < cap(h.order)/4 {
			h.order = append([]*wakeChain(nil), h.order...) // let the old array go
		}
	}
}

// subscribe registers fn as a waiter on subject, subscribing to it when it
// is the subject's first.
func (h *wakeHub) subscribe(subject string, fn func([]byte, uint64)) (func(), error) {
	w := &wakeWaiter{fn: fn}
	h.mu.Lock()
	e := h.subs[subject]
	if e != nil {
		e.waiters = append(e.waiters, w)
		confirmed := e.confirmed
		h.mu.Unlock()
		// The first waiter may still be subscribing (its SUB not sent,
		// or not confirmed yet): this one returns no sooner, as if it
		// had subscribed itself (see below).
		t := time.NewTimer(wakeSubscribeConfirm)
		select {
		case <-confirmed:
		case <-t.C:
		}
		t.Stop()
		return h.stopper(e, w), nil
	}
	e = &wakeSubject{subject: subject, waiters: []*wakeWaiter{w}, confirmed: make(chan struct{})}
	h.subs[subject] = e
	if h.disp == nil {
		h.disp = &wakeDispatcher{ch: make(chan *nats.Msg, wakeDispatchBuffer), quit: make(chan struct{})}
		go h.dispatch(h.disp)
	}
	h.live++
	e.disp = h.disp
	h.mu.Unlock()

	defer close(e.confirmed)
	sub, err := h.nc.ChanSubscribe(subject, e.disp.ch)
	if err != nil {
		h.subClosed(e)
		return nil, fmt.Errorf("jobkeys: subscribe to wake-up subject %q: %w", subject, err)
	}
	sub.SetClosedHandler(func(string) { h.subClosed(e) })
	h.mu.Lock()
	e.sub = sub
	orphan := len(e.waiters) == 0 // every waiter stopped meanwhile
	h.mu.Unlock()
	if !sub.IsValid() {
		h.subClosed(e) // closed before its handler was set
	}
	if orphan {
		_ = sub.Drain() // see stopper; an error means it is closed already
		return h.stopper(e, w), nil
	}
	// Wait (briefly) for the server to have the subscription: a waiter
	// that trusts a state it saw just before it subscribed must not be
	// left with a wake-up, and its one retry, sent while the SUB was
	// still in the client's buffer or on the wire. The caller measures
	// how long ago it saw the state after this returns, so a slow or
	// failed confirmation makes it read the key instead (the read's
	// request follows the SUB on the connection). A confirmation that
	// fails early (the connection dropped or closed while the PING was
	// out: nats.go ends the flush at once) is not one: it waits out the
	// bound as an unanswered one does, so that the caller reads.
	begun := time.Now()
	if err := h.nc.FlushTimeout(wakeSubscribeConfirm); err != nil {
		if rest := wakeSubscribeConfirm - time.Since(begun); rest > 0 {
			time.Sleep(rest)
		}
	}
	return h.stopper(e, w), nil
}

// stopper returns the stop function of waiter w on e. The last waiter's
// stop drains the subscription rather than unsubscribing at once: a
// wake-up the server delivers to it before the UNSUB reaches the server
// must still come to the dispatcher, to be answered "no responders" (see
// answerNoWaiter); nats.go drops a message for a subscription it has
// removed, and the wake-up then waited for an answer until its delivery
// state expired. The drain ends once the server answered a PING sent
// after the UNSUB (every message it delivered before is in by then).
func (h *wakeHub) stopper(e *wakeSubject, w *wakeWaiter) func() {
	var once sync.Once
	return func() {
		once.Do(func() {
			w.mu.Lock()
			w.stopped = true
			w.mu.Unlock()
			h.mu.Lock()
			if i := indexOf(e.waiters, w); i >= 0 {
				e.waiters = append(e.waiters[:i], e.waiters[i+1:]...)
			}
			var sub *nats.Subscription
			if len(e.waiters) == 0 {
				if h.subs[e.subject] == e {
					delete(h.subs, e.subject)
				}
				sub = e.sub // nil while subscribing: subscribe unsubscribes it
			}
			h.mu.Unlock()
			if sub != nil {
				_ = sub.Drain() // an error means it is closed already
			}
		})
	}
}

func indexOf(ws []*wakeWaiter, w *wakeWaiter) int {
	for i, x := range ws {
		if x == w {
			return i
		}
	}
	return -1
}

// subClosed records that e's subscription closed (unsubscribed, or the
// connection closed); the dispatcher ends with the last live one. nats.go
// calls it under its own locks: it must not call into nats.go.
func (h *wakeHub) subClosed(e *wakeSubject) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if e.closed {
		return
	}
	e.closed = true
	if h.subs[e.subject] == e {
		delete(h.subs, e.subject)
	}
	h.live--
	if h.live == 0 && h.disp != nil {
		close(h.disp.quit)
		h.disp = nil
	}
}

// dispatch hands the wake-ups delivered to d's channel to their waiters
// until d is no longer needed.
func (h *wakeHub) dispatch(d *wakeDispatcher) {
	var waiters []*wakeWaiter
	for {
		select {
		case <-d.quit:
			return
		case m := <-d.ch:
			if len(m.Data) < wakeRevLen {
				h.malformed.Add(1)
				continue
			}
			// From the network: anyone allowed to publish on the subject
			// may have sent it. Only its revision is handed on, as a hint
			// (see wakeStore.subscribeWake); its state is not.
			rev := binary.BigEndian.Uint64(m.Data)
			h.mu.Lock()
			if e := h.subs[m.Subject]; e != nil {
				waiters = append(waiters[:0], e.waiters...)
			}
			h.mu.Unlock()
			handed := false
			for _, w := range waiters {
				handed = w.deliver(nil, rev) || handed
			}
			if handed {
				h.received.Add(1)
			} else if m.Reply != "" {
				h.answerNoWaiter(m)
			}
			clear(waiters)
			waiters = waiters[:0]
		}
	}
}
