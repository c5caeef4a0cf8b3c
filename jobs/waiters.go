package jobs

import (
	"context"
)

// keyWaiters are this client's jobs waiting for a slot on one key. They
// share one watch subscription, and a change of the key lets one of them
// try (a read), not all: if it gets a slot it passes the turn on, since
// more slots may be free; if it is blocked, so would the others be, and
// they wait for the next change (or their own recheck or lease expiry).
type keyWaiters struct {
	n    int           // jobs waiting; guarded by Client.mu
	turn chan struct{} // a change not yet tried; capacity 1
	stop context.CancelFunc
}

// joinWaiters adds a waiter on kvKey and returns the channel its turns
// come on; nil when the client has no watch (rechecks only). Call
// leaveWaiters when it stops waiting.
func (c *Client) joinWaiters(ctx context.Context, kvKey string) <-chan struct{} {
	if c.watcher == nil {
		return nil
	}
	c.mu.Lock()
	if w := c.keyWaiters[kvKey]; w != nil {
		w.n++
		c.mu.Unlock()
		return w.turn
	}
	c.mu.Unlock()
	// Subscribe without the lock: starting a watch is a round trip.
	sub, err := c.watcher.Subscribe(ctx, c.cfg.Service, kvKey)
	if err != nil {
		c.cfg.Logger.Warn("jobs: watch key", "key", kvKey, "err", err)
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if w := c.keyWaiters[kvKey]; w != nil { // another waiter was quicker
		sub.Close()
		w.n++
		return w.turn
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
				return // the watch ended: the waiters fall back to rechecks
			case <-sub.Changed():
				w.pass()
			}
		}
	}()
	return w.turn
}

// leaveWaiters removes a waiter on kvKey; the last one stops the watch.
func (c *Client) leaveWaiters(kvKey string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	w := c.keyWaiters[kvKey]
	if w == nil {
		return
	}
	if w.n--; w.n == 0 {
		delete(c.keyWaiters, kvKey)
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
