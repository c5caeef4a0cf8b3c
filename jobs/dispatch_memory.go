package jobs

import (
	"context"
	"sync"
	"time"
)

// memDispatcher is a dispatcher within one process: a FIFO of
// announcements, timers for those not yet due, and a de-duplication window.
// It serves every client of one store in the process (see
// MemoryStore.dispatcher); nothing survives the process, which is what a
// MemoryStore's records do too.
type memDispatcher struct {
	mu      sync.Mutex
	lanes   map[lane]*memLane
	seen    map[string]time.Time
	pending map[*time.Timer]struct{} // announcements and hand-backs not yet due
	closed  bool
	window  time.Duration
	now     func() time.Time
}

// memDedupeWindow is how long a memDispatcher remembers an announcement id.
const memDedupeWindow = 2 * time.Minute

// memLane is one lane's FIFO.
type memLane struct {
	queue []*memDelivery
	avail chan struct{} // closed when queue gains an entry (then replaced)
}

func newMemDispatcher() *memDispatcher {
	return &memDispatcher{
		lanes: map[lane]*memLane{
			laneReady: {avail: make(chan struct{})},
			laneCheck: {avail: make(chan struct{})},
		},
		seen:    make(map[string]time.Time),
		pending: make(map[*time.Timer]struct{}),
		window:  memDedupeWindow,
		now:     time.Now,
	}
}

type memDelivery struct {
	d   *memDispatcher
	ln  lane
	typ string
	ref jobRef
}

func (m *memDelivery) jobType() string { return m.typ }
func (m *memDelivery) job() jobRef     { return m.ref }
func (m *memDelivery) done()           {}
func (m *memDelivery) running()        {}
func (m *memDelivery) later(delay time.Duration) {
	m.d.push(&memDelivery{d: m.d, ln: m.ln, typ: m.typ, ref: m.ref}, delay)
}

func (d *memDispatcher) announce(ctx context.Context, ln lane, typ string, ref jobRef, at time.Time, id string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	now := d.now()
	if id != "" {
		d.mu.Lock()
		if len(d.seen) > 1024 {
			for k, t := range d.seen {
				if now.Sub(t) > d.window {
					delete(d.seen, k)
				}
			}
		}
		if t, ok := d.seen[id]; ok && now.Sub(t) <= d.window {
			d.mu.Unlock()
			return nil
		}
		d.seen[id] = now
		d.mu.Unlock()
	}
	d.push(&memDelivery{d: d, ln: ln, typ: typ, ref: ref}, at.Sub(now))
	return nil
}

// push queues m now (delay ≤ 0) or after delay.
func (d *memDispatcher) push(m *memDelivery, delay time.Duration) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return
	}
	if delay > 0 {
		var t *time.Timer
		t = time.AfterFunc(delay, func() {
			d.mu.Lock()
			_, live := d.pending[t]
			delete(d.pending, t)
			d.mu.Unlock()
			if live {
				d.push(m, 0)
			}
		})
		d.pending[t] = struct{}{}
		return
	}
	l := d.lanes[m.ln]
	l.queue = append(l.queue, m)
	close(l.avail)
	l.avail = make(chan struct{})
}

func (d *memDispatcher) next(ctx context.Context, ln lane) (delivery, error) {
	for {
		d.mu.Lock()
		if d.closed {
			d.mu.Unlock()
			return nil, errDispatchClosed
		}
		l := d.lanes[ln]
		if len(l.queue) > 0 {
			m := l.queue[0]
			l.queue[0] = nil
			l.queue = l.queue[1:]
			d.mu.Unlock()
			return m, nil
		}
		avail := l.avail
		d.mu.Unlock()
		select {
		case <-avail:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// close stops the timers and ends every next call. Being shared by the
// clients of a store, a memDispatcher is closed by none of them.
func (d *memDispatcher) close() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return
	}
	d.closed = true
	for t := range d.pending {
		t.Stop()
	}
	clear(d.pending)
	for _, l := range d.lanes {
		close(l.avail)
	}
}
