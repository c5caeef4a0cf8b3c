package jobkeys

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// KeyWatcher is an optional capability of a [Store]: telling which keys of a
// service's bucket change. A [Watcher] needs it to wake blocked acquisitions
// when a slot is released. [NATSStore] and [MemoryStore] implement it.
type KeyWatcher interface {
	// WatchKeys starts watching the keys of service's bucket that belong to
	// jobType, or to every job type when jobType is "", and returns once the
	// watch is in place: every write or delete after it returns is reported
	// by calling changed with the KV key, in the order of the writes, from
	// one goroutine at a time. changed should return quickly; while it runs,
	// further changes wait.
	//
	// The watch ends when ctx is cancelled, or when the store can no longer
	// watch (its connection closed). The returned channel is closed once the
	// watch has ended; changed is not called after that. An error means no
	// watch was started.
	WatchKeys(ctx context.Context, service, jobType string, changed func(kvKey string)) (ended <-chan struct{}, err error)
}

// KeyLister is an optional capability of a [Store]: listing the keys of a
// service's bucket. A [Sweeper] needs it. [NATSStore] and [MemoryStore]
// implement it.
type KeyLister interface {
	// ListKeys returns the KV keys of service's bucket that belong to
	// jobType, or to every job type when jobType is "", sorted. Deleted keys
	// are left out. A bucket with no such key returns an empty list and no
	// error.
	ListKeys(ctx context.Context, service, jobType string) ([]string, error)
}

var (
	_ KeyWatcher = (*MemoryStore)(nil)
	_ KeyLister  = (*MemoryStore)(nil)
	_ KeyWatcher = (*NATSStore)(nil)
	_ KeyLister  = (*NATSStore)(nil)
)

// keyFilter validates service and jobType ("" for all job types) and returns
// the KV key prefix they select, ending in ".".
func keyFilter(service, jobType string) (string, error) {
	if err := validateService(service); err != nil {
		return "", err
	}
	if jobType == "" {
		return service + ".", nil
	}
	if err := validateJobType(jobType); err != nil {
		return "", err
	}
	return service + "." + jobType + ".", nil
}

// Watcher holds one watch per service on a store's keys and fans the changes
// out in memory to the goroutines waiting for particular keys, so that any
// number of blocked acquisitions cost one watch. Create one per store and
// process with [NewWatcher], share it between [Runner]s, and [Watcher.Close]
// it when done.
//
// A service's watch starts with the first [Watcher.Subscribe] for it and
// lasts until Close, or until the store ends it (a closed connection); the
// next Subscribe then starts a new one. A Watcher is safe for concurrent use.
// The zero value is not usable: create one with [NewWatcher].
type Watcher struct {
	store  KeyWatcher
	ctx    context.Context // parent of every watch; cancelled by Close
	cancel context.CancelFunc
	wg     sync.WaitGroup // one per running watch's monitor goroutine

	mu      sync.Mutex
	closed  bool
	watches map[string]*serviceWatch
}

// serviceWatch is the watch of one service and its subscribers. Its fields
// other than service and ready are guarded by Watcher.mu.
type serviceWatch struct {
	service string
	ready   chan struct{} // closed once the start attempt has finished
	err     error         // why the watch did not start; set before ready closes
	ended   bool          // the watch has stopped
	subs    map[string]map[*Subscription]struct{}
}

// NewWatcher returns a watcher over store, which should be the store of the
// [KeyCoordinator]s whose acquisitions it wakes. No watch starts until the
// first Subscribe.
func NewWatcher(store KeyWatcher) (*Watcher, error) {
	if store == nil {
		return nil, fmt.Errorf("%w: KeyWatcher store is nil", ErrInvalidRequest)
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Watcher{store: store, ctx: ctx, cancel: cancel, watches: make(map[string]*serviceWatch)}, nil
}

// Subscribe registers interest in changes of kvKey (a [JobKey.KVKey]) in
// service's bucket, starting the service's watch if it is not running; ctx
// bounds that start. Every change made after Subscribe returns is signalled on
// the subscription's Changed channel. Close the subscription when done.
//
// It fails with an error wrapping [ErrWatcherClosed] after [Watcher.Close],
// with ctx.Err() when ctx ends first, or with the store's error when the
// watch cannot start.
func (w *Watcher) Subscribe(ctx context.Context, service, kvKey string) (*Subscription, error) {
	if _, err := keyFilter(service, ""); err != nil {
		return nil, err
	}
	if !strings.HasPrefix(kvKey, service+".") {
		return nil, fmt.Errorf("%w: KV key %q is not a key of service %q", ErrInvalidRequest, kvKey, service)
	}
	for {
		w.mu.Lock()
		if w.closed {
			w.mu.Unlock()
			return nil, fmt.Errorf("%w: subscribe to %s", ErrWatcherClosed, kvKey)
		}
		sw := w.watches[service]
		owner := sw == nil
		if owner {
			sw = &serviceWatch{service: service, ready: make(chan struct{}), subs: make(map[string]map[*Subscription]struct{})}
			w.watches[service] = sw
		}
		w.mu.Unlock()

		if owner {
			w.start(ctx, sw)
		}
		select {
		case <-sw.ready:
		case <-ctx.Done():
			return nil, ctx.Err()
		}

		w.mu.Lock()
		if sw.err == nil && !sw.ended && !w.closed {
			sub := &Subscription{w: w, sw: sw, kvKey: kvKey, changed: make(chan struct{}, 1), done: make(chan struct{})}
			subs := sw.subs[kvKey]
			if subs == nil {
				subs = make(map[*Subscription]struct{})
				sw.subs[kvKey] = subs
			}
			subs[sub] = struct{}{}
			w.mu.Unlock()
			return sub, nil
		}
		err, closed := sw.err, w.closed
		w.mu.Unlock()
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

// start starts sw's watch; the caller registered sw in w.watches.
func (w *Watcher) start(ctx context.Context, sw *serviceWatch) {
	wctx, cancel := context.WithCancel(w.ctx)
	abandon := context.AfterFunc(ctx, cancel) // the starter gave up
	ended, err := w.store.WatchKeys(wctx, sw.service, "", func(kvKey string) { w.dispatch(sw, kvKey) })
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
}

// dispatch signals the subscribers of kvKey. It never blocks.
func (w *Watcher) dispatch(sw *serviceWatch, kvKey string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for sub := range sw.subs[kvKey] {
		select {
		case sub.changed <- struct{}{}:
		default: // a signal is already pending
		}
	}
}

// Close stops every watch, ends every subscription (their Done channels
// close) and waits for the watches' goroutines to finish. Later Subscribe
// calls fail with [ErrWatcherClosed]. Close is idempotent.
func (w *Watcher) Close() {
	w.mu.Lock()
	w.closed = true
	w.mu.Unlock()
	w.cancel()
	w.wg.Wait()
}

// Subscription is one waiter's interest in one KV key; see
// [Watcher.Subscribe]. It is safe for concurrent use. The zero value is
// not usable: a Subscription comes from Subscribe.
type Subscription struct {
	w       *Watcher
	sw      *serviceWatch
	kvKey   string
	changed chan struct{}
	done    chan struct{}
	once    sync.Once
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
	s.w.mu.Lock()
	if subs := s.sw.subs[s.kvKey]; subs != nil {
		delete(subs, s)
		if len(subs) == 0 {
			delete(s.sw.subs, s.kvKey)
		}
	}
	s.w.mu.Unlock()
	s.end()
}

func (s *Subscription) end() { s.once.Do(func() { close(s.done) }) }

// WatchKeys implements [KeyWatcher]. Changes are queued in memory, so a slow
// changed function never holds up writers.
func (m *MemoryStore) WatchKeys(ctx context.Context, service, jobType string, changed func(kvKey string)) (<-chan struct{}, error) {
	prefix, err := keyFilter(service, jobType)
	if err != nil {
		return nil, err
	}
	if changed == nil {
		return nil, fmt.Errorf("%w: changed function is nil", ErrInvalidRequest)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	q := &keyQueue{signal: make(chan struct{}, 1)}
	mw := &memoryWatcher{service: service, fn: func(key string, _ []byte, _ uint64, _ bool) {
		if strings.HasPrefix(key, prefix) {
			q.push(key)
		}
	}}
	m.mu.Lock()
	m.watchers = append(m.watchers, mw)
	m.mu.Unlock()

	ended := make(chan struct{})
	go func() {
		defer close(ended)
		defer func() {
			m.mu.Lock()
			m.watchers = slices.DeleteFunc(m.watchers, func(x *memoryWatcher) bool { return x == mw })
			m.mu.Unlock()
		}()
		for {
			select {
			case <-ctx.Done():
				return
			case <-q.signal:
			}
			for _, key := range q.take() {
				if ctx.Err() != nil {
					return
				}
				changed(key)
			}
		}
	}()
	return ended, nil
}

// keyQueue is an unbounded FIFO of changed keys between a store's writers and
// a watch goroutine.
type keyQueue struct {
	mu     sync.Mutex
	keys   []string
	signal chan struct{} // capacity 1: "keys is not empty"
}

func (q *keyQueue) push(key string) {
	q.mu.Lock()
	q.keys = append(q.keys, key)
	q.mu.Unlock()
	select {
	case q.signal <- struct{}{}:
	default:
	}
}

func (q *keyQueue) take() []string {
	q.mu.Lock()
	keys := q.keys
	q.keys = nil
	q.mu.Unlock()
	return keys
}

// ListKeys implements [KeyLister].
func (m *MemoryStore) ListKeys(ctx context.Context, service, jobType string) ([]string, error) {
	prefix, err := keyFilter(service, jobType)
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	m.mu.Lock()
	keys := make([]string, 0, len(m.buckets[service]))
	for k, e := range m.buckets[service] {
		if !e.deleted && strings.HasPrefix(k, prefix) {
			keys = append(keys, k)
		}
	}
	m.mu.Unlock()
	slices.Sort(keys)
	return keys, nil
}

// natsWatchDrainTimeout bounds how long stopping a KV watch waits for the
// client library to close its channel.
const natsWatchDrainTimeout = 10 * time.Second

// WatchKeys implements [KeyWatcher] with one JetStream KV watch (an ordered
// push consumer) that delivers only new changes and no values.
func (s *NATSStore) WatchKeys(ctx context.Context, service, jobType string, changed func(kvKey string)) (<-chan struct{}, error) {
	prefix, err := keyFilter(service, jobType)
	if err != nil {
		return nil, err
	}
	if changed == nil {
		return nil, fmt.Errorf("%w: changed function is nil", ErrInvalidRequest)
	}
	kv, err := s.KeyValue(ctx, service)
	if err != nil {
		return nil, err
	}
	wctx, cancel := context.WithCancel(ctx)
	kw, err := kv.Watch(wctx, prefix+">", jetstream.UpdatesOnly(), jetstream.MetaOnly())
	if err != nil {
		cancel()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, fmt.Errorf("jobkeys: watch %s> in KV bucket %q: %w", prefix, kv.Bucket(), err)
	}
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		defer stopNATSWatch(kw, cancel)
		for {
			select {
			case <-wctx.Done():
				return
			case e, ok := <-kw.Updates():
				if !ok {
					return // the subscription closed (connection closed)
				}
				if e != nil {
					changed(e.Key())
				}
			}
		}
	}()
	return ended, nil
}

// stopNATSWatch stops a KV watch and drains its channel until the client
// closes it: the client's delivery goroutine may be blocked sending to the
// channel, and would never exit otherwise.
func stopNATSWatch(kw jetstream.KeyWatcher, cancel context.CancelFunc) {
	_ = kw.Stop() // fails only when already stopped or the connection is closed; both end the watch
	cancel()
	t := time.NewTimer(natsWatchDrainTimeout)
	defer t.Stop()
	for {
		select {
		case _, ok := <-kw.Updates():
			if !ok {
				return
			}
		case <-t.C:
			return
		}
	}
}

// ListKeys implements [KeyLister]: it reads the last entry of every key of
// the selection (headers only) and leaves out deleted keys.
func (s *NATSStore) ListKeys(ctx context.Context, service, jobType string) ([]string, error) {
	prefix, err := keyFilter(service, jobType)
	if err != nil {
		return nil, err
	}
	kv, err := s.KeyValue(ctx, service)
	if err != nil {
		return nil, err
	}
	lctx, cancel := context.WithCancel(ctx)
	kw, err := kv.Watch(lctx, prefix+">", jetstream.IgnoreDeletes(), jetstream.MetaOnly())
	if err != nil {
		cancel()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, fmt.Errorf("jobkeys: list %s> in KV bucket %q: %w", prefix, kv.Bucket(), err)
	}
	defer stopNATSWatch(kw, cancel)
	var keys []string
	for {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case e, ok := <-kw.Updates():
			if !ok {
				return nil, fmt.Errorf("jobkeys: list %s> in KV bucket %q: the watch closed before the listing was complete", prefix, kv.Bucket())
			}
			if e == nil { // all current keys delivered
				slices.Sort(keys)
				return slices.Compact(keys), nil
			}
			keys = append(keys, e.Key())
		}
	}
}
