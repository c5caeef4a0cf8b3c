package jobkeys

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
)

// Watcher holds one watch per service on a store's keys and fans the changes
// out in memory to the goroutines waiting for particular keys, so that any
// number of blocked acquisitions cost one watch. Create one per store and
// process with [NewWatcher], share it between [Runner]s, and [Watcher.Close]
// it when done.
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
func NewWatcher(store WatchableStore) (*Watcher, error) {
	if store == nil {
		return nil, fmt.Errorf("%w: watcher store is nil", ErrInvalidRequest)
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
// with one wrapping [ErrInvalidRequest] on a Watcher not made by
// [NewWatcher], with ctx.Err() when ctx ends first, or with the store's
// error when the watch cannot start.
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
		if w.store == nil {
			w.mu.Unlock()
			return nil, fmt.Errorf("%w: subscribe to %s: the Watcher has no store; create it with NewWatcher", ErrInvalidRequest, kvKey)
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
