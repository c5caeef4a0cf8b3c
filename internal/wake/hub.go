package wake

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
)

// PrefixMaxLength bounds the length of a wake-up subject prefix in bytes
// (the root package's WakePrefixMaxLength).
const PrefixMaxLength = 64

// The hub's timings and bounds (see the package documentation, "Timings").
const (
	// Retry is how long a wake-up that found no waiter at all (every
	// target answered "no responders") waits before it is sent once more:
	// a waiter that had just blocked may not have its subscription at the
	// server yet. RetryLate is how long it waits after that resend,
	// if it found no waiter either, before its second and last resend:
	// a waiter that trusts a state it saw less than their sum before its
	// subscription was confirmed (see [Config].Confirm) must still be
	// reached, which on a loaded host or over a network takes longer than
	// Retry alone.
	Retry     = 2 * time.Millisecond
	RetryLate = 8 * time.Millisecond
	// Resends is how many times a wake-up that found no waiter at all
	// is sent again: after Retry, then after RetryLate.
	Resends = 2
	// ChainTTL is how long a wake-up's delivery state is kept: a
	// "no responders" answer comes within a round trip.
	ChainTTL = time.Second
	// WalkExtra bounds the targets a wake-up tries beyond its free
	// slots.
	WalkExtra = 64
	// chainsMax bounds the wake-ups whose delivery state is kept; the
	// oldest are dropped first.
	chainsMax = 4096
	// keptBytesMax bounds the size of the states kept for wake-ups
	// whose delivery may go on; the oldest are dropped first.
	keptBytesMax = 8 << 20
	// dispatchBuffer is the capacity of the channel the wake-up
	// subscriptions of a hub deliver to.
	dispatchBuffer = 1024
	// revLen is the length of the revision in front of a wake-up's
	// value.
	revLen = 8
)

// Counts are a hub's wake-up counters since it was made.
type Counts struct {
	Published    uint64 // wake-ups published to other processes (PUBs sent)
	Local        uint64 // wake-ups handed to a waiter of the same hub in memory
	NoResponders uint64 // "no responders" answers: a target without a waiter
	Retried      uint64 // resends of wake-ups that found no waiter (at most Resends each)
	Dropped      uint64 // wake-ups dropped: a publish failed (connection closed, reconnect buffer full), the reply subscription could not be made, or the caller found the service or key invalid (Drop)
	Received     uint64 // wake-ups from other processes handed to waiters
	Malformed    uint64 // received messages too short to be a wake-up, ignored
	// Refused counts the server's refusals of wake-up subjects (publish
	// or subscribe) on the hub's connection under its prefix, as
	// [Config].Refused reports them.
	Refused uint64
}

// ValidatePrefix checks a wake-up subject prefix: dot-separated tokens of
// letters, digits, '_' and '-', at most PrefixMaxLength bytes: no '$' (the
// server's and JetStream's subjects), no wildcards, no spaces. Its error
// names the prefix.
func ValidatePrefix(prefix string) error {
	if len(prefix) > PrefixMaxLength {
		return fmt.Errorf("wake-up prefix %q is %d bytes, more than %d", prefix, len(prefix), PrefixMaxLength)
	}
	for tok := range strings.SplitSeq(prefix, ".") {
		if !validToken(tok) {
			return fmt.Errorf("wake-up prefix %q must be dot-separated tokens of letters, digits, '_' or '-'", prefix)
		}
	}
	return nil
}

// validToken reports whether tok is a non-empty run of ASCII letters,
// digits, '_' and '-'.
func validToken(tok string) bool {
	if tok == "" {
		return false
	}
	for i := 0; i < len(tok); i++ {
		switch c := tok[i]; {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '_', c == '-':
		default:
			return false
		}
	}
	return true
}

// subjectsOverlap reports whether a subject could start with both prefixes
// a and b, each ending in ".".
func subjectsOverlap(a, b string) bool {
	return strings.HasPrefix(a, b) || strings.HasPrefix(b, a)
}

// Token is the last token of job jobID's wake-up subject.
func Token(jobID string) string {
	sum := sha256.Sum256([]byte(jobID))
	return base64.RawURLEncoding.EncodeToString(sum[:16])
}

// Hub is a store's wake-up state: its waiters, the delivery of the
// wake-ups it publishes, and its counters. Make one with [New]; the zero
// value is not usable. Its methods are safe for concurrent use. A hub
// lives as long as its connection: closing the connection ends its
// subscriptions and its dispatcher, and later Publishes are dropped
// (counted) and later Subscribes fail.
//
// Lock order: mu is never held while calling into nats.go, because nats.go
// calls subscriptions' closed handlers (subClosed, which takes mu) under
// its own locks; replyMu is taken before nats.go calls, never with mu.
type Hub struct {
	prefix string // "<prefix>."
	nc     *nats.Conn
	// retry and retryLate are Retry and RetryLate; tests may
	// change them before the hub is used.
	retry, retryLate time.Duration

	published, local, noResponders, retried, dropped, received, malformed atomic.Uint64
	refused                                                               func() uint64 // Config.Refused
	confirm                                                               time.Duration // Config.Confirm
	retrySkipped                                                          atomic.Uint64 // retries of stale chains, for tests

	replyMu     sync.Mutex
	replyPrefix atomic.Pointer[string] // "<inbox>.", set once the reply subscription is made

	mu     sync.Mutex
	subs   map[string]*subjectWaiters // by subject: this hub's waiters
	disp   *dispatcher                // nil when no subscription is live
	live   int                        // subscriptions not yet closed
	chains map[uint64]*chain          // wake-ups whose delivery may go on, by id
	order  []*chain                   // every kept wake-up, oldest first
	latest map[string]*chain          // the newest kept wake-up per bucket and key
	// keptBytes is the size of the payloads of the chains in h.chains.
	keptBytes int
	nextID    uint64
}

// subjectWaiters is one subject this hub's waiters wait on.
type subjectWaiters struct {
	subject string
	waiters []*waiter
	disp    *dispatcher
	sub     *nats.Subscription // nil while it is being made
	closed  bool               // unsubscribed, or the connection closed
	// confirmed is closed once the subject's first waiter is done
	// subscribing: the server confirmed the subscription, or
	// the hub's confirmation bound passed without that, or it failed.
	confirmed chan struct{}
}

// waiter is one Subscribe.
type waiter struct {
	mu      sync.Mutex
	fn      func(value []byte, rev uint64)
	stopped bool
}

// deliver calls the waiter's fn unless it has stopped.
func (w *waiter) deliver(value []byte, rev uint64) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stopped {
		return false
	}
	w.fn(value, rev)
	return true
}

// dispatcher is the goroutine that hands the messages of a hub's
// wake-up subscriptions to their waiters; it runs while a subscription is
// live.
type dispatcher struct {
	ch   chan *nats.Msg
	quit chan struct{}
}

// Target states of a wake-up chain.
const (
	targetUnused   uint8 = iota
	targetLocal          // handed to a waiter of this hub
	targetSent           // published; no "no responders" answer so far
	targetNoWaiter       // published and answered "no responders"
)

// chain is the delivery of one published wake-up: its targets in queue
// order, walked on as targets answer that they have no waiter.
type chain struct {
	id uint64
	// key is "<prefix>.<bucket>.<kvKey>.", the prefix of its targets'
	// subjects, and its key in h.latest.
	key     string
	rev     uint64
	payload []byte // revision, then value
	targets []target
	free    int
	next    int // index of the next unused target
	sent    int // targets in state targetSent
	// delivered counts the targets in state targetLocal.
	delivered int
	resends   int  // resends made or scheduled (at most Resends)
	done      bool // over, stale or expired: nothing moves it on
	born      time.Time
}

// target is one job a wake-up may go to.
type target struct {
	job     string
	subject string // once the walk reached it
	state   uint8
}

// actions are what a walk decided, done outside the hub's lock.
type actions struct {
	payload []byte // the chain's, which it drops when it ends
	local   []*waiter
	localTo []int // the target of each of local (an index in the chain's targets)
	// rest, when the walk ended the chain (every target it took handed
	// over in memory), is its targets it did not take, for a hand-over
	// no waiter took to move on to (see moveOnLocal).
	rest    []target
	publish []string // subjects
	// retry schedules the chain's next resend, retryAfter from now.
	retry      bool
	retryAfter time.Duration
}

// Config is what [New] needs besides the connection.
type Config struct {
	// Prefix is the subjects' prefix, without its trailing dot; it must
	// pass [ValidatePrefix].
	Prefix string
	// Reserved are subject prefixes, each ending in ".", that no wake-up
	// subject may share a subject with: the connection's inboxes and the
	// JetStream API's subjects, so that the server's refusal of a wake-up
	// subject is never taken for the refusal of a call's.
	Reserved []string
	// Confirm bounds how long [Hub.Subscribe] waits for the server to
	// confirm a new subscription (a PING's PONG). It must be positive:
	// the caller's waiters trust a state seen less than Confirm before
	// their subscription was confirmed (see the package documentation).
	Confirm time.Duration
	// Refused, when not nil, is the hook through which the hub learns the
	// server's refusals of its subjects on the connection: it returns how
	// many there were so far (the caller counts them from the
	// connection's error handler, which the hub does not own). It must be
	// safe for concurrent use. Nil reports none.
	Refused func() uint64
}

// New returns the wake-up hub of prefix on nc. It fails when nc is nil,
// when the prefix is invalid, when Confirm is not positive, or when the
// prefix could overlap one of cfg.Reserved. The error names what was
// wrong.
func New(nc *nats.Conn, cfg Config) (*Hub, error) {
	if nc == nil {
		return nil, errors.New("wake-ups need a NATS connection")
	}
	if err := ValidatePrefix(cfg.Prefix); err != nil {
		return nil, err
	}
	if cfg.Confirm <= 0 {
		return nil, fmt.Errorf("wake-up prefix %q: confirmation bound %v is not positive", cfg.Prefix, cfg.Confirm)
	}
	p := cfg.Prefix + "."
	for _, other := range cfg.Reserved {
		if subjectsOverlap(p, other) {
			return nil, fmt.Errorf("wake-up prefix %q overlaps the subjects %s…", cfg.Prefix, other)
		}
	}
	refused := cfg.Refused
	if refused == nil {
		refused = func() uint64 { return 0 }
	}
	return &Hub{
		prefix:    p,
		nc:        nc,
		retry:     Retry,
		retryLate: RetryLate,
		confirm:   cfg.Confirm,
		refused:   refused,
		subs:      make(map[string]*subjectWaiters),
		chains:    make(map[uint64]*chain),
		latest:    make(map[string]*chain),
	}, nil
}

// Subject is the wake-up subject of job jobID of kvKey in bucket:
// "<prefix>.<bucket>.<kvKey>.<Token(jobID)>".
func (h *Hub) Subject(bucket, kvKey, jobID string) string {
	return h.prefix + bucket + "." + kvKey + "." + Token(jobID)
}

// Prefix returns the hub's subject prefix, ending in ".".
func (h *Hub) Prefix() string { return h.prefix }

// Drop counts a wake-up the caller did not hand to [Hub.Publish] because
// its service or key was invalid (see [Counts].Dropped).
func (h *Hub) Drop() { h.dropped.Add(1) }

// WaitsFor reports whether a waiter of this hub waits on subject.
func (h *Hub) WaitsFor(subject string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	e := h.subs[subject]
	return e != nil && len(e.waiters) > 0
}

// Counters returns the hub's counters.
func (h *Hub) Counters() Counts {
	return Counts{
		Published:    h.published.Load(),
		Local:        h.local.Load(),
		NoResponders: h.noResponders.Load(),
		Retried:      h.retried.Load(),
		Dropped:      h.dropped.Load(),
		Received:     h.received.Load(),
		Malformed:    h.malformed.Load(),
		Refused:      h.refused(),
	}
}

// Size is what a hub holds at one instant.
type Size struct {
	Subjects    int  // subjects with a waiter or a subscription being made
	Live        int  // subscriptions not yet closed
	Chains      int  // wake-ups whose delivery may go on
	Dispatching bool // the dispatcher goroutine runs
}

// Size returns what the hub holds now. Delivery state past [ChainTTL] is
// forgotten lazily, by the next Publish or by [Hub.Expire].
func (h *Hub) Size() Size {
	h.mu.Lock()
	defer h.mu.Unlock()
	return Size{Subjects: len(h.subs), Live: h.live, Chains: len(h.chains), Dispatching: h.disp != nil}
}

// Expire forgets the delivery state of the wake-ups published more than
// [ChainTTL] before now, as the next Publish would.
func (h *Hub) Expire(now time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.expireLocked(now)
}

// Publish sends the state value (as stored) at revision rev of kvKey in
// bucket to the waiters of the first free of targets (job IDs, in queue
// order) that have one: a target with a waiter of this hub is handed it
// in memory, any other is published to, and one that answers "no
// responders" is walked past. bucket and kvKey must be valid subject
// tokens (the caller checks them; see [Hub.Drop]). It never blocks on the
// network and copies value if it keeps it; it does nothing when free is
// not positive or targets is empty.
//
// It sends nothing when a state of the key at rev or newer was published
// already, unless again is set: again sends the state of a revision even
// when a wake-up of it went out already, to other targets, the one before
// it ending; when that one found no waiter and waits for its resend, this
// one is sent in its stead after Retry; when that one is still out to the
// same first targets, they are not woken a second time (see coveredLocked).
func (h *Hub) Publish(bucket, kvKey string, value []byte, rev uint64, targets []string, free int, again bool) {
	if free <= 0 || len(targets) == 0 {
		return
	}
	reply, ok := h.replySubjects()
	if !ok {
		h.dropped.Add(1)
		return
	}
	free = min(free, len(targets))
	if n := free + WalkExtra; len(targets) > n {
		targets = targets[:n]
	}
	h.mu.Lock()
	c, acts := h.startLocked(bucket, kvKey, value, rev, targets, free, time.Now(), again)
	h.mu.Unlock()
	if c != nil {
		h.act(c, reply, &acts)
	}
}

// startLocked makes the chain of a wake-up and walks it (see Publish); nil
// when a state of the key at rev or newer was published already.
func (h *Hub) startLocked(bucket, kvKey string, value []byte, rev uint64, targets []string, free int, now time.Time, again bool) (*chain, actions) {
	return h.startKeyLocked(h.prefix+bucket+"."+kvKey+".", value, rev, targets, free, now, again)
}

// startKeyLocked is startLocked for the chain key key (see chain.key).
func (h *Hub) startKeyLocked(key string, value []byte, rev uint64, targets []string, free int, now time.Time, again bool) (*chain, actions) {
	var acts actions
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
			// Sent again while this hub's wake-up of that revision is
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
	payload := make([]byte, revLen+len(value))
	binary.BigEndian.PutUint64(payload, rev)
	copy(payload[revLen:], value)
	h.nextID++
	c := &chain{
		id: h.nextID, key: key, rev: rev, payload: payload,
		targets: make([]target, len(targets)),
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
// sent again to targets (see Publish, again), has every target it walked
// so far in targets' order at their head, and one of them still awaiting
// an answer or handed to a waiter of this hub: the wake-up sent again
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
func (h *Hub) coveredLocked(c *chain, targets []string, free int) bool {
	if c.done || c.sent+c.delivered == 0 || c.next > len(targets) {
		return false
	}
	for k := range c.targets[:c.next] {
		if c.targets[k].job != targets[k] {
			return false
		}
	}
	rest := targets[c.next:]
	c.targets = append(c.targets[:c.next:c.next], make([]target, len(rest))...)
	for k, job := range rest {
		c.targets[c.next+k].job = job
	}
	c.free = min(max(c.free, free), len(c.targets))
	return true
}

// replySubjects returns the prefix of the reply subjects of this hub's
// wake-ups, subscribing to them on first use; false when that fails.
func (h *Hub) replySubjects() (string, bool) {
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
// waiter of this hub delivered in memory, any other published. When
// nothing is left in flight the chain is over, or, if nobody was woken at
// all and it was not resent Resends times yet, it is sent again after
// h.retry (the first time) or h.retryLate (the second).
func (h *Hub) walkLocked(c *chain, acts *actions) {
	acts.payload = c.payload
	for c.delivered+c.sent < c.free && c.next < len(c.targets) {
		tg := &c.targets[c.next]
		c.next++
		if tg.subject == "" {
			tg.subject = c.key + Token(tg.job)
		}
		if e := h.subs[tg.subject]; e != nil && len(e.waiters) > 0 {
			tg.state = targetLocal
			c.delivered++
			acts.local = append(acts.local, e.waiters...)
			for range e.waiters {
				acts.localTo = append(acts.localTo, c.next-1)
			}
			continue
		}
		tg.state = targetSent
		c.sent++
		acts.publish = append(acts.publish, tg.subject)
	}
	if c.sent > 0 {
		return // answers may come
	}
	if c.delivered == 0 && c.resends < Resends {
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
func (h *Hub) act(c *chain, reply string, acts *actions) {
	var missed []int // targets none of whose waiters took it
	if len(acts.local) > 0 {
		value, rev := acts.payload[revLen:], c.rev
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
func (h *Hub) moveOnLocal(c *chain, reply string, missed []int, done *actions) {
	var acts actions
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
		next, nextActs := h.startKeyLocked(c.key, done.payload[revLen:], c.rev, targets, len(missed), time.Now(), true)
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
		if i < len(c.targets) && c.targets[i].state == targetLocal {
			c.targets[i].state = targetNoWaiter
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
func (h *Hub) resendDelay(n int) time.Duration {
	if n <= 1 {
		return h.retry
	}
	return h.retryLate
}

// retryChain sends chain c, which found no waiter, again from its first
// target, unless a newer state of its key was published meanwhile.
func (h *Hub) retryChain(c *chain, reply string) {
	h.mu.Lock()
	if c.done || h.latest[c.key] != c {
		h.mu.Unlock()
		h.retrySkipped.Add(1)
		return
	}
	h.retried.Add(1)
	c.next, c.sent, c.delivered = 0, 0, 0
	for i := range c.targets {
		c.targets[i].state = targetUnused
	}
	var acts actions
	h.walkLocked(c, &acts)
	h.mu.Unlock()
	h.act(c, reply, &acts)
}

// answerNoWaiter answers wake-up m, which the server delivered to this
// hub's subscription but no waiter took (each stopped: its Run's wait
// ended while its UNSUB was not at the server yet), as the server answers
// one that finds no subscription: "no responders" (status 503, header
// Nats-Subject naming m's subject), which moves its chain on to the next
// target (see onReply). The server answers nothing for a message it
// delivered, so without this the chain waited for an answer until its
// delivery state expired, and a wake-up sent again for that revision was
// taken for one still out to the job (see coveredLocked). An error means
// the connection is closed: the publisher's chain then expires.
func (h *Hub) answerNoWaiter(m *nats.Msg) {
	a := nats.NewMsg(m.Reply)
	a.Header.Set("Status", "503")
	a.Header.Set("Nats-Subject", m.Subject)
	_ = h.nc.PublishMsg(a)
}

// onReply handles an answer to a published wake-up: "no responders" (status
// 503, header Nats-Subject naming the target) moves its chain on to the
// next target.
func (h *Hub) onReply(m *nats.Msg) {
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
	var acts actions
	for i := range c.targets[:c.next] {
		if tg := &c.targets[i]; tg.subject == target && tg.state == targetSent {
			tg.state = targetNoWaiter
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
func (h *Hub) endLocked(c *chain) {
	if c.done {
		return
	}
	c.done = true
	delete(h.chains, c.id)
	h.keptBytes -= len(c.payload)
	c.payload, c.targets = nil, nil
}

// expireLocked forgets the chains older than ChainTTL, and the oldest
// beyond chainsMax or keptBytesMax.
func (h *Hub) expireLocked(now time.Time) {
	n := 0
	for n < len(h.order) && (len(h.order)-n >= chainsMax || h.keptBytes > keptBytesMax || now.Sub(h.order[n].born) > ChainTTL) {
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
			h.order = append([]*chain(nil), h.order...) // let the old array go
		}
	}
}

// Subscribe calls fn with every wake-up sent to subject (see
// [Hub.Subject]) until stop is called: with the state's value for one
// this hub hands over in memory (a Publish of this process), with value
// nil for one from the network, which anyone allowed to publish on the
// subject may have sent: its revision is a hint, nothing a write may
// start from. fn must not block, call stop, nor modify value (which it
// may keep). The first waiter of a subject subscribes to it; Subscribe
// returns once the server has confirmed the subscription, or after
// [Config].Confirm without that (at once only when the subscription
// fails). stop is safe to call more than once.
func (h *Hub) Subscribe(subject string, fn func([]byte, uint64)) (func(), error) {
	w := &waiter{fn: fn}
	h.mu.Lock()
	e := h.subs[subject]
	if e != nil {
		e.waiters = append(e.waiters, w)
		confirmed := e.confirmed
		h.mu.Unlock()
		// The first waiter may still be subscribing (its SUB not sent,
		// or not confirmed yet): this one returns no sooner, as if it
		// had subscribed itself (see below).
		t := time.NewTimer(h.confirm)
		select {
		case <-confirmed:
		case <-t.C:
		}
		t.Stop()
		return h.stopper(e, w), nil
	}
	e = &subjectWaiters{subject: subject, waiters: []*waiter{w}, confirmed: make(chan struct{})}
	h.subs[subject] = e
	if h.disp == nil {
		h.disp = &dispatcher{ch: make(chan *nats.Msg, dispatchBuffer), quit: make(chan struct{})}
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
	if err := h.nc.FlushTimeout(h.confirm); err != nil {
		if rest := h.confirm - time.Since(begun); rest > 0 {
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
func (h *Hub) stopper(e *subjectWaiters, w *waiter) func() {
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

func indexOf(ws []*waiter, w *waiter) int {
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
func (h *Hub) subClosed(e *subjectWaiters) {
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
func (h *Hub) dispatch(d *dispatcher) {
	var waiters []*waiter
	for {
		select {
		case <-d.quit:
			return
		case m := <-d.ch:
			if len(m.Data) < revLen {
				h.malformed.Add(1)
				continue
			}
			// From the network: anyone allowed to publish on the subject
			// may have sent it. Only its revision is handed on, as a hint
			// (see Hub.Subscribe); its state is not.
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
