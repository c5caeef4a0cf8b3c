package jobs

import (
	"context"
	"time"

	"github.com/jobkeys/jobkeys"
)

// keyWaiters are this client's jobs waiting for a slot on one key (over
// targeted wake-ups only those no wake-up names: retries and jobs not
// queued yet; see subscribeJob). They share one watch subscription, and a
// change of the key lets one of them try (a read), not all: if it gets a
// slot it passes the turn on, since more slots may be free; if it is
// blocked, so would the others be, and they wait for the next change (or
// their own recheck or lease expiry).
type keyWaiters struct {
	n    int           // jobs waiting; guarded by Client.mu
	turn chan struct{} // a change not yet tried; capacity 1
	stop context.CancelFunc
}

// joinWaiters adds a waiter on kvKey and returns its group, whose turn
// channel its turns come on; nil when the client has no watch (rechecks
// only). Call leaveWaiters with the group when it stops waiting.
func (c *Client) joinWaiters(ctx context.Context, kvKey string) *keyWaiters {
	if c.watcher == nil {
		return nil
	}
	c.mu.Lock()
	if w := c.keyWaiters[kvKey]; w != nil {
		w.n++
		c.mu.Unlock()
		return w
	}
	c.mu.Unlock()
	// Subscribe without the lock (starting a watch is a round trip), and
	// not for long: the waiter falls back to rechecks.
	sctx, cancel := context.WithTimeout(ctx, max(c.cfg.RecheckInterval, 5*time.Second))
	sub, err := c.watcher.Subscribe(sctx, c.cfg.Service, kvKey)
	cancel()
	if err != nil {
		c.cfg.Logger.Warn("jobs: watch key", "key", kvKey, "err", err)
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if w := c.keyWaiters[kvKey]; w != nil { // another waiter was quicker
		sub.Close()
		w.n++
		return w
	}
	wctx, stop := context.WithCancel(ctx)
	w := &keyWaiters{n: 1, turn: make(chan struct{}, 1), stop: stop}
	c.keyWaiters[kvKey] = w
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		defer sub.Close()
		for {
			select {
			case <-wctx.Done():
				return
			case <-sub.Done():
				// The watch ended: these waiters fall back to rechecks,
				// and the next one to join starts a new watch.
				c.mu.Lock()
				if c.keyWaiters[kvKey] == w {
					delete(c.keyWaiters, kvKey)
				}
				c.mu.Unlock()
				return
			case <-sub.Changed():
				w.pass()
			}
		}
	}()
	return w
}

// wakeUps reports whether the client's key store sends targeted wake-ups
// (a NATSStore made with jobkeys.WithWakeUps): then a queued job blocked
// on its key waits for the wake-ups of its own job (subscribeJob), not in
// its key's group.
func (c *Client) wakeUps() bool {
	return c.watcher != nil && c.watcher.WakeUps()
}

// subscribeJob subscribes a job blocked on kvKey to the wake-ups sent to
// its own key-layer job kid: a write that frees a slot for it sends one to
// it alone, so no other waiter of the key tries, and a heartbeat of a
// full key, which frees nothing, sends none. Unlike a group's turn, a wake-up is not
// passed on after an acquisition: the writer wakes as many jobs as it left
// slots free; a job that leaves without a slot hands its wake-up on
// (passWakeUp). nil when it cannot subscribe (the waiter joins its key's
// group instead). The caller closes the subscription when it stops
// waiting.
func (c *Client) subscribeJob(ctx context.Context, k *kind, kvKey, kid string) *jobkeys.Subscription {
	// Not for long (subscribing is a round trip): the waiter falls back.
	sctx, cancel := context.WithTimeout(ctx, max(c.cfg.RecheckInterval, 5*time.Second))
	defer cancel()
	sub, err := c.watcher.SubscribeJob(sctx, k.jt, kvKey, kid)
	if err != nil {
		c.cfg.Logger.Warn("jobs: subscribe to wake-ups", "key", kvKey, "job", kid, "err", err)
		return nil
	}
	return sub
}

// leaveWaiters removes a waiter from group w of kvKey; the last one stops
// the watch.
func (c *Client) leaveWaiters(kvKey string, w *keyWaiters) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if w.n--; w.n == 0 {
		if c.keyWaiters[kvKey] == w {
			delete(c.keyWaiters, kvKey)
		}
		w.stop()
	}
}

// passTurn gives the next waiter on kvKey a try: after a slot was taken
// (another may be free too).
func (c *Client) passTurn(kvKey string) {
	c.mu.Lock()
	w := c.keyWaiters[kvKey]
	c.mu.Unlock()
	if w != nil {
		w.pass()
	}
}

func (w *keyWaiters) pass() {
	select {
	case w.turn <- struct{}{}:
	default:
	}
}
