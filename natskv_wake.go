package jobkeys

import (
	"fmt"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/jobkeys/jobkeys/internal/jscas"
	"github.com/jobkeys/jobkeys/internal/wake"
	"github.com/nats-io/nats.go/jetstream"
)

// This file holds NATSStore's side of targeted wake-ups (WithWakeUps): the
// capabilities the coordinator finds by type assertion, wired to the
// store's hub in package internal/wake, which carries the protocol (its
// messages, subjects, walk, resends and confirmation are described there
// and in docs/design/keys-engine.md).
//
// A wake-up received from the network is a hint, never a state to write
// on: the server does not vouch for it, and anyone allowed to publish on
// the wake-up subjects can send any revision and any state. Its receiver
// keeps only the revision, and its next try reads the key unless its
// coordinator holds that revision already (its own write, the Watcher's
// watch, an earlier read); see keycache.Entry.Hinted. The state is still sent,
// for processes of earlier versions, which write on it.

// WakePrefixDefault is the subject prefix of targeted wake-ups when
// [WithWakeUps] is given "".
const WakePrefixDefault = "jobkeys.wake"

// WakePrefixMaxLength bounds the length of a wake-up subject prefix in bytes.
// (wake.PrefixMaxLength, which the hub checks, is the same; TestWakeUpsPrefix
// holds them together.)
const WakePrefixMaxLength = 64

// The hub's timings the key layer's waiting builds on (see wake.go).
const (
	wakeRetry     = wake.Retry
	wakeRetryLate = wake.RetryLate
	wakeWalkExtra = wake.WalkExtra
	// wakeSubscribeConfirm bounds how long a new wake-up subscription
	// waits for the server to confirm it (a PING's PONG): a waiter
	// confirmed later than wakeTrustSent after its request for the state
	// was sent (or wakeTrustAge after it saw one it did not ask for)
	// reads the key anyway (its read follows the SUB on the connection),
	// so one not confirmed within it does.
	wakeSubscribeConfirm = wakeTrustSent
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
type wakeCounts = wake.Counts

// validateWakePrefix checks a wake-up subject prefix (see
// wake.ValidatePrefix); its error wraps ErrInvalidRequest.
func validateWakePrefix(prefix string) error {
	if err := wake.ValidatePrefix(prefix); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalidRequest, err)
	}
	return nil
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

// newWakeHub returns the wake-up hub of a store over js with prefix,
// wired to guards: the refusals of its subjects that the connection's
// error handler reports (see permissionGuards.record) are its Refused
// counter. It fails, wrapping ErrInvalidRequest, when the prefix could
// overlap the connection's inboxes or the JetStream context's subjects
// (a refusal of a wake-up subject must never be taken for the refusal of
// a call's).
func newWakeHub(prefix string, js jetstream.JetStream, guards *permissionGuards) (*wake.Hub, error) {
	nc := js.Conn()
	if nc == nil {
		return nil, fmt.Errorf("%w: wake-ups need a NATS connection", ErrInvalidRequest)
	}
	// The counter is registered once the hub is made: a prefix refused
	// here (one overlapping the inboxes) must not claim the connection's
	// refusals under it.
	var refused *atomic.Uint64
	h, err := wake.New(nc, wake.Config{
		Prefix:   prefix,
		Reserved: []string{inboxPrefix(nc), jscas.APIPrefix(js.Options())},
		Confirm:  wakeSubscribeConfirm,
		Refused:  func() uint64 { return refused.Load() },
	})
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidRequest, err)
	}
	refused = guards.wakes.register(prefix + ".")
	return h, nil
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
		s.wake.Drop()
		return
	}
	s.wake.Publish(s.BucketName(service), kvKey, value, rev, targets, free, again)
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
	return s.wake.Subscribe(s.wake.Subject(s.BucketName(service), kvKey, jobID), fn)
}

// waitsFor implements localWaiters.
func (s *NATSStore) waitsFor(service, kvKey, jobID string) bool {
	h := s.wake
	if h == nil {
		return false
	}
	return h.WaitsFor(h.Subject(s.BucketName(service), kvKey, jobID))
}

// wakeCounters returns the store's wake-up counters (zero when off).
func (s *NATSStore) wakeCounters() wakeCounts {
	if s.wake == nil {
		return wakeCounts{}
	}
	return s.wake.Counters()
}
