package lane

import (
	"context"
	"slices"
	"sync"
	"time"
)

// Op is one operation's turn at a lane. The caller's operation type embeds
// it (see Member); its exported fields are set by the caller before Enter.
type Op struct {
	// Ctx is the operation's context: while the operation waits in the
	// queue, its end takes the operation out with nothing applied.
	Ctx context.Context
	// Solo keeps the operation out of batches: it takes the lane only when
	// handed it, and takes no one along, and a holder's Take stops at it.
	Solo bool
	// Lease marks an operation of a lease (a release or a renewal), which
	// Linger(lease true) waits for; Trust a waiting acquisition that
	// trusts the key's watch feed, which Linger(lease false) waits for.
	Lease, Trust bool
	// Dropped is set, when Enter returns lead false, to the error of the
	// operation's context when it ended in the queue before a batch took
	// it: nothing of it was applied. It is nil when a batch carried it.
	Dropped error

	// wake receives one signal per turn that did not find the lane free:
	// the lane was handed to the operation (handed), or a batch took it
	// and its result is in (Send, Deliver).
	wake   chan struct{}
	handed bool
}

// LaneOp returns o; through embedding it makes any type that embeds Op a
// Member.
func (o *Op) LaneOp() *Op { return o }

// Reset clears o for reuse by another operation, keeping what it
// allocated. Every signal sent to an operation is received before its
// Enter returns, so a reset Op carries none.
func (o *Op) Reset() { *o = Op{wake: o.wake} }

// Member is an operation that can queue at a lane: a pointer to a type
// that embeds Op.
type Member interface{ LaneOp() *Op }

// Probes, when a lane has them (diagnostics only: see the root package's
// bench_linger_test.go), are told of every operation's arrival, under the
// lane's lock (busy: it queues), and of every linger.
type Probes[T Member] struct {
	Arrive func(l *Lane[T], op T, busy bool)
	Linger func(l *Lane[T], lease, met bool, d time.Duration)
}

// Lane lets one operation at a time hold a key, and queues the others, in
// arrival order, where the holder can take them into its batch. The zero
// value is a free lane. Probes may be set before the lane is used.
type Lane[T Member] struct {
	Probes *Probes[T]

	mu    sync.Mutex
	busy  bool
	queue []T // waiting, oldest first
	// While the holder lingers (see Linger), arrived receives a signal
	// once lingerFor more operations of the kind it waits for (lingerLease:
	// a lease's, else waiting acquisitions) have queued.
	lingering   bool
	lingerLease bool
	lingerFor   int
	arrived     chan struct{}
	timer       *time.Timer
	// returns counts the slots the lane's latest batches acquired whose
	// releases have not come through the lane yet, and returnsAt is when
	// the latest of those batches committed: their handlers may return at
	// once, and their releases join the next batch (see LingerForRelease).
	// skip counts batches that will not linger for them after lingers
	// that waited in vain, and misses those lingers in a row. Only the
	// holder uses them.
	returns   int
	returnsAt time.Time
	skip      int
	misses    int
}

// Enter waits for op's turn: it reports lead when op holds the lane (it
// must call Leave), and otherwise a batch carried op and left op's result
// where the holder puts results (or op.Dropped says why none: its context
// ended before a batch took it). When op's context ends while it waits in
// the queue, it leaves the queue and Enter returns the context's error;
// once a batch has taken it, it waits for that batch's result, which is its
// outcome.
func (l *Lane[T]) Enter(op T) (lead bool, err error) {
	o := op.LaneOp()
	if o.wake == nil {
		o.wake = make(chan struct{}, 1)
	}
	o.handed, o.Dropped = false, nil
	l.mu.Lock()
	if p := l.Probes; p != nil && p.Arrive != nil {
		p.Arrive(l, op, l.busy)
	}
	if !l.busy {
		l.busy = true
		l.mu.Unlock()
		return true, nil
	}
	l.queue = append(l.queue, op)
	if l.lingering && o.Lease == l.lingerLease && (l.lingerLease || o.Trust) {
		if l.lingerFor--; l.lingerFor == 0 {
			l.lingering = false
			l.arrived <- struct{}{}
		}
	}
	l.mu.Unlock()
	select {
	case <-o.wake:
	case <-o.Ctx.Done():
		l.mu.Lock()
		if i := slices.IndexFunc(l.queue, func(x T) bool { return x.LaneOp() == o }); i >= 0 {
			l.queue = slices.Delete(l.queue, i, i+1)
			l.mu.Unlock()
			return false, o.Ctx.Err()
		}
		l.mu.Unlock()
		<-o.wake // handed the lane or taken into a batch: under way
	}
	if o.handed && o.Ctx.Err() != nil {
		l.Leave()
		return false, o.Ctx.Err()
	}
	return o.handed, nil
}

// Leave hands the lane to the oldest waiting operation, or frees it.
func (l *Lane[T]) Leave() {
	l.mu.Lock()
	if len(l.queue) == 0 {
		l.busy = false
		l.mu.Unlock()
		return
	}
	next := l.queue[0]
	var zero T
	l.queue[0] = zero
	l.queue = l.queue[1:]
	o := next.LaneOp()
	o.handed = true
	l.mu.Unlock()
	o.wake <- struct{}{}
}

// Linger waits, holding the lane, until want operations of a kind (lease:
// those of a lease, a release or renewal; else waiting acquisitions, which
// trust the watch) are queued, counting those queued already (since the
// holder took its batch), or for at most bound, or until ctx ends. It
// reports whether they are, and whether any operation is queued: the
// holder takes it into its batch.
func (l *Lane[T]) Linger(ctx context.Context, lease bool, want int, bound time.Duration) (met, arrived bool) {
	l.mu.Lock()
	before := len(l.queue)
	for _, op := range l.queue { // queued since the holder took its batch
		if o := op.LaneOp(); o.Lease == lease && (lease || o.Trust) {
			want--
		}
	}
	if want <= 0 {
		l.mu.Unlock()
		return true, before > 0
	}
	if l.arrived == nil {
		l.arrived = make(chan struct{}, 1)
		l.timer = time.NewTimer(bound)
	} else {
		l.timer.Reset(bound)
	}
	l.lingering, l.lingerLease, l.lingerFor = true, lease, want
	l.mu.Unlock()
	start := time.Now()
	select {
	case <-l.arrived:
	case <-l.timer.C:
	case <-ctx.Done():
	}
	l.timer.Stop()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.lingering {
		l.lingering = false
	} else {
		met = true
		select { // signalled after the timer fired or ctx ended
		case <-l.arrived:
		default:
		}
	}
	if p := l.Probes; p != nil && p.Linger != nil {
		p.Linger(l, lease, met, time.Since(start))
	}
	return met, len(l.queue) > 0
}

// lingerMaxSkip bounds the batches that do not linger for releases after
// lingers that waited for one in vain.
const lingerMaxSkip = 64

// releaseSoon is how long, in lingers for a release (bound), after a
// batch that acquired slots their releases count as coming soon (see
// LingerForRelease): the handlers that return at once have returned by
// then.
const releaseSoon = 4

// LingerForRelease lingers, for the holder of a batch that is no release,
// for one release to join it for at most bound, when the lane's latest
// batch, less than releaseSoon bounds ago, acquired slots whose releases
// have not come yet (see Returned). It reports whether it lingered.
// Lingers that wait in vain (the handlers run on) make the next batches
// skip theirs, twice as many after each, up to lingerMaxSkip: a key whose
// handlers take their time pays for a linger rarely.
func (l *Lane[T]) LingerForRelease(ctx context.Context, bound time.Duration) bool {
	if l.returns == 0 || time.Since(l.returnsAt) >= releaseSoon*bound {
		return false
	}
	if l.skip > 0 {
		l.skip--
		return false
	}
	if met, _ := l.Linger(ctx, true, 1, bound); met {
		l.misses = 0
		return true
	}
	l.skip = min(1<<l.misses, lingerMaxSkip)
	l.misses = min(l.misses+1, 6)
	return true
}

// ReleasesDue reports whether the lane's latest batches acquired slots
// whose releases have not come through it yet (see Returned).
func (l *Lane[T]) ReleasesDue() bool { return l.returns > 0 }

// Returned records a committed batch that acquired slots and carried
// leases operations of a lease (releases or renewals). The holder calls
// it.
func (l *Lane[T]) Returned(acquired, leases int) {
	l.returns = max(l.returns+acquired-leases, 0)
	if acquired > 0 {
		l.returnsAt = time.Now()
	}
}

// Take appends to ops, for the holder's batch, the operations waiting at
// the head of the queue, up to limit in all, stopping at one that must run
// alone (Solo). A waiting operation whose context has ended is sent back
// with its context's error (Op.Dropped): nothing of it is applied.
func (l *Lane[T]) Take(ops []T, limit int) []T {
	l.mu.Lock()
	defer l.mu.Unlock()
	kept := l.queue[:0]
	i := 0
	for ; i < len(l.queue) && len(ops) < limit; i++ {
		op := l.queue[i]
		o := op.LaneOp()
		if o.Solo {
			break
		}
		if err := o.Ctx.Err(); err != nil {
			o.Dropped = err
			o.wake <- struct{}{}
			continue
		}
		ops = append(ops, op)
	}
	kept = append(kept, l.queue[i:]...)
	clear(l.queue[len(kept):])
	l.queue = kept
	return ops
}

// PutBack returns ops, taken by the holder, to the head of the queue, in
// their order.
func (l *Lane[T]) PutBack(ops []T) {
	if len(ops) == 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.queue = slices.Insert(l.queue, 0, ops...)
}

// Send tells op, taken into the holder's batch, that its result is in:
// its Enter returns.
func (l *Lane[T]) Send(op T) { op.LaneOp().wake <- struct{}{} }

// Deliver ends a batch of ops, ops[0] the holder, whose first n ran: it
// tells ops[1:n] their results are in and returns the others to the head
// of the queue.
func (l *Lane[T]) Deliver(ops []T, n int) {
	for _, op := range ops[1:n] {
		l.Send(op)
	}
	l.PutBack(ops[n:]) // cut off: they start the next batch
}

// Queued returns how many operations wait in the queue, and whether the
// holder lingers (for tests and diagnostics).
func (l *Lane[T]) Queued() (n int, lingering bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.queue), l.lingering
}
