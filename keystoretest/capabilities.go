package keystoretest

// The checks of a store's optional capabilities ([jobkeys.BatchWriter],
// [jobkeys.ValueWatcher], [jobkeys.ValueLimiter], [jobkeys.ClockSource]),
// each run when the store implements it and skipped with the reason when
// it does not.

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jobkeys/jobkeys"
)

// waitGuard bounds the waits for a watch: a failure guard only, never a
// measure (a watch that works delivers in milliseconds).
const waitGuard = time.Minute

// capabilities runs the checks of a store's optional capabilities.
type capabilities struct {
	h   Harness
	ctx context.Context
}

// runCapabilities runs the checks of the optional capabilities, one
// parallel subtest each.
func runCapabilities(t *testing.T, h Harness, ctx context.Context) {
	t.Helper()
	s := capabilities{h: h, ctx: ctx}
	for _, c := range []struct {
		name  string
		check func(*testing.T)
	}{
		{"BatchWritesConsecutiveRevisions", s.batchWritesConsecutiveRevisions},
		{"BatchDeleteMarkerLast", s.batchDeleteMarkerLast},
		{"BatchStaleRevisionConflicts", s.batchStaleRevisionConflicts},
		{"BatchTooLargeWritesNothing", s.batchTooLargeWritesNothing},
		{"WatchValuesInRevisionOrder", s.watchValuesInRevisionOrder},
		{"ValueLimitRefusesLarger", s.valueLimitRefusesLarger},
		{"ClockSourceBounds", s.clockSourceBounds},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			c.check(t)
		})
	}
}

// batcher opens a store, writes "v0" to a key of its service, and
// returns them with the key's revision, skipping the test when the
// store does not batch writes to that key.
func (s capabilities) batcher(t *testing.T) (jobkeys.Store, jobkeys.BatchWriter, string, string, uint64) {
	t.Helper()
	st, svc := s.h.Open(t)
	bw, ok := st.(jobkeys.BatchWriter)
	if !ok {
		t.Skipf("%T implements no jobkeys.BatchWriter", st)
	}
	key := svc + ".t.batch"
	rev, err := st.Create(s.ctx, svc, key, []byte("v0"))
	noError(t, err, "Create %s", key)
	if !bw.Batches(svc, key) {
		t.Skipf("%T does not batch writes to %s (Batches is false)", st, key)
	}
	return st, bw, svc, key, rev
}

// batchWritesConsecutiveRevisions is the check BatchWritesConsecutiveRevisions.
func (s capabilities) batchWritesConsecutiveRevisions(t *testing.T) {
	st, bw, svc, key, rev0 := s.batcher(t)
	w := startWatch(t, s.ctx, st, svc) // nil without a ValueWatcher
	values := [][]byte{[]byte("v1"), []byte("v2"), []byte("v3")}
	last, err := bw.WriteBatch(s.ctx, svc, key, values, rev0, false)
	noError(t, err, "WriteBatch of 3 at revision %d", rev0)
	if last < rev0+uint64(len(values)) {
		t.Fatalf("WriteBatch of %d at revision %d returned %d: its writes cannot all be after revision %d", len(values), rev0, last, rev0)
	}
	first := last - uint64(len(values)) + 1
	holds(t, s.ctx, st, svc, key, []byte("v3"), last)
	// The batch's earlier revisions are not the key's latest.
	_, err = st.Update(s.ctx, svc, key, []byte("x"), last-1)
	isConflict(t, err, fmt.Sprintf("Update at revision %d, the batch's second write", last-1))
	other, err := st.Create(s.ctx, svc, svc+".t.other", []byte("o"))
	noError(t, err)
	greater(t, other, last, "the revision of a write after the batch")
	if w == nil {
		return
	}
	// What the watch reports of the batch is values[i] at first+i (a
	// write replaced before the watch read it may be left out).
	changes := w.until(t, other)
	seen := false
	for _, c := range changes {
		if c.KVKey != key {
			continue
		}
		if c.Revision < first || c.Revision > last {
			t.Fatalf("the watch reports %s at revision %d, outside the batch's %d..%d", key, c.Revision, first, last)
		}
		want := values[c.Revision-first]
		if c.Deleted || !bytes.Equal(c.Value, want) {
			t.Fatalf("the watch reports %s at revision %d as %q (deleted %v); the batch wrote %q there", key, c.Revision, c.Value, c.Deleted, want)
		}
		seen = seen || c.Revision == last
	}
	if !seen {
		t.Fatalf("the watch did not report the batch's last write (%s at revision %d): %v", key, last, changes)
	}
}

// batchDeleteMarkerLast is the check BatchDeleteMarkerLast.
func (s capabilities) batchDeleteMarkerLast(t *testing.T) {
	st, bw, svc, key, rev0 := s.batcher(t)
	w := startWatch(t, s.ctx, st, svc)
	last, err := bw.WriteBatch(s.ctx, svc, key, [][]byte{[]byte("v1"), []byte("not written")}, rev0, true)
	noError(t, err, "WriteBatch of a write and a delete at revision %d", rev0)
	if last < rev0+2 {
		t.Fatalf("WriteBatch of a write and a delete at revision %d returned %d: both cannot be after revision %d", rev0, last, rev0)
	}
	missing(t, s.ctx, st, svc, key)
	_, err = st.Update(s.ctx, svc, key, []byte("x"), last-1)
	isConflict(t, err, fmt.Sprintf("Update at revision %d, the batch's write before its delete", last-1))
	if w != nil {
		changes := w.until(t, last)
		c := changes[len(changes)-1]
		if c.KVKey != key || !c.Deleted || len(c.Value) != 0 {
			t.Fatalf("the watch reports revision %d as %s (deleted %v, value %q); want the delete of %s", last, c.KVKey, c.Deleted, c.Value, key)
		}
	}
	// As for Update, the delete marker's revision is the key's latest.
	rev, err := st.Update(s.ctx, svc, key, []byte("again"), last)
	noError(t, err, "Update at the revision of the batch's delete marker (%d)", last)
	holds(t, s.ctx, st, svc, key, []byte("again"), rev)
}

// batchStaleRevisionConflicts is the check BatchStaleRevisionConflicts.
func (s capabilities) batchStaleRevisionConflicts(t *testing.T) {
	st, bw, svc, key, rev0 := s.batcher(t)
	rev1, err := st.Update(s.ctx, svc, key, []byte("v1"), rev0)
	noError(t, err)
	for _, del := range []bool{false, true} {
		for _, wrong := range []uint64{rev0, rev1 + 1, 0} {
			_, err = bw.WriteBatch(s.ctx, svc, key, [][]byte{[]byte("a"), []byte("b")}, wrong, del)
			isConflict(t, err, fmt.Sprintf("WriteBatch (delete %v) at revision %d (current %d)", del, wrong, rev1))
			holds(t, s.ctx, st, svc, key, []byte("v1"), rev1)
		}
	}
	never := svc + ".t.never"
	_, err = bw.WriteBatch(s.ctx, svc, never, [][]byte{[]byte("a"), []byte("b")}, rev1, false)
	isConflict(t, err, "WriteBatch of a key never written")
	missing(t, s.ctx, st, svc, never)
}

// batchTooLargeWritesNothing is the check BatchTooLargeWritesNothing.
func (s capabilities) batchTooLargeWritesNothing(t *testing.T) {
	st, bw, svc, key, rev0 := s.batcher(t)
	vl, ok := st.(jobkeys.ValueLimiter)
	if !ok {
		t.Skipf("%T implements no jobkeys.ValueLimiter: the suite cannot tell its value size limit", st)
	}
	limit, err := vl.MaxValueSize(s.ctx, svc)
	noError(t, err, "MaxValueSize")
	big := bytes.Repeat([]byte("x"), limit+1)
	for _, del := range []bool{false, true} {
		_, err = bw.WriteBatch(s.ctx, svc, key, [][]byte{[]byte("a"), big, []byte("c")}, rev0, del)
		errorIs(t, err, jobkeys.ErrStateTooLarge, "WriteBatch (delete %v) with a second value of %d bytes: want jobkeys.ErrStateTooLarge, got %v", del, len(big), err)
		holds(t, s.ctx, st, svc, key, []byte("v0"), rev0)
	}
	last, err := bw.WriteBatch(s.ctx, svc, key, [][]byte{[]byte("a"), []byte("c")}, rev0, false)
	noError(t, err, "the same batch without the large value, at the same revision")
	holds(t, s.ctx, st, svc, key, []byte("c"), last)
}

// watchValuesInRevisionOrder is the check WatchValuesInRevisionOrder.
func (s capabilities) watchValuesInRevisionOrder(t *testing.T) {
	st, svc := s.h.Open(t)
	w := startWatch(t, s.ctx, st, svc)
	if w == nil {
		t.Skipf("%T implements no jobkeys.ValueWatcher", st)
	}
	type write struct{ key, value string }
	written := make(map[uint64]write)
	a, b := svc+".t.a", svc+".u.b"
	// put records the write of value to key that returns.
	put := func(key, value string) func(uint64, error) uint64 {
		return func(rev uint64, err error) uint64 {
			t.Helper()
			noError(t, err, "write %s", key)
			written[rev] = write{key: key, value: value}
			return rev
		}
	}
	ra := put(a, "a1")(st.Create(s.ctx, svc, a, []byte("a1")))
	rb := put(b, "b1")(st.Create(s.ctx, svc, b, []byte("b1")))
	ra = put(a, "a2")(st.Update(s.ctx, svc, a, []byte("a2"), ra))
	noError(t, st.Delete(s.ctx, svc, b, rb), "Delete %s", b)
	// Another service's writes are not this watch's.
	_, err := st.Create(s.ctx, svc+"x", svc+"x.t.a", []byte("other"))
	noError(t, err, "write to another service")
	ra = put(a, "a3")(st.Update(s.ctx, svc, a, []byte("a3"), ra))

	changes := w.until(t, ra)
	var prev uint64
	var deletedAt uint64
	for _, c := range changes {
		greater(t, c.Revision, prev, "the revision of %s after the change before it", c.KVKey)
		prev = c.Revision
		if c.Deleted {
			if c.KVKey != b || len(c.Value) != 0 || c.Revision <= rb {
				t.Fatalf("the watch reports a delete of %s at revision %d with value %q; only %s was deleted, after revision %d", c.KVKey, c.Revision, c.Value, b, rb)
			}
			deletedAt = c.Revision
			continue
		}
		want, ok := written[c.Revision]
		if !ok || want.key != c.KVKey || want.value != string(c.Value) {
			t.Fatalf("the watch reports %s = %q at revision %d; written there: %+v", c.KVKey, c.Value, c.Revision, want)
		}
	}
	if deletedAt == 0 {
		t.Fatalf("the watch did not report the delete of %s: %v", b, changes)
	}
	// The reported revision is the delete marker's: the key's latest.
	rev, err := st.Update(s.ctx, svc, b, []byte("b2"), deletedAt)
	noError(t, err, "Update %s at the revision the watch reported for its delete (%d)", b, deletedAt)
	w.until(t, rev)
	w.stop(t)
}

// valueLimitRefusesLarger is the check ValueLimitRefusesLarger.
func (s capabilities) valueLimitRefusesLarger(t *testing.T) {
	check := func(t *testing.T, st jobkeys.Store, svc string, atMost int) {
		t.Helper()
		vl, ok := st.(jobkeys.ValueLimiter)
		if !ok {
			t.Skipf("%T implements no jobkeys.ValueLimiter", st)
		}
		limit, err := vl.MaxValueSize(s.ctx, svc)
		noError(t, err, "MaxValueSize of service %s", svc)
		greater(t, limit, 0, "MaxValueSize of service %s", svc)
		if atMost > 0 && limit > atMost {
			t.Fatalf("MaxValueSize of service %s is %d, over the %d bytes its values may have", svc, limit, atMost)
		}
		key, big := svc+".t.limit", svc+".t.big"
		rev, err := st.Create(s.ctx, svc, key, bytes.Repeat([]byte("x"), limit))
		noError(t, err, "Create of MaxValueSize (%d) bytes", limit)
		_, err = st.Update(s.ctx, svc, key, bytes.Repeat([]byte("y"), limit+1), rev)
		errorIs(t, err, jobkeys.ErrStateTooLarge, "Update of MaxValueSize+1 (%d) bytes: want jobkeys.ErrStateTooLarge, got %v", limit+1, err)
		_, err = st.Create(s.ctx, svc, big, bytes.Repeat([]byte("y"), limit+1))
		errorIs(t, err, jobkeys.ErrStateTooLarge, "Create of MaxValueSize+1 (%d) bytes: want jobkeys.ErrStateTooLarge, got %v", limit+1, err)
		holds(t, s.ctx, st, svc, key, bytes.Repeat([]byte("x"), limit), rev)
		missing(t, s.ctx, st, svc, big)
	}
	st, svc := s.h.Open(t)
	check(t, st, svc, 0)
	if s.h.OpenLimited != nil {
		const limit = 1024
		st, svc := s.h.OpenLimited(t, limit)
		check(t, st, svc, limit)
	}
}

// clockSourceBounds is the check ClockSourceBounds.
func (s capabilities) clockSourceBounds(t *testing.T) {
	st, svc := s.h.Open(t)
	cs, ok := st.(jobkeys.ClockSource)
	if !ok {
		t.Skipf("%T implements no jobkeys.ClockSource", st)
	}
	_, err := st.Create(s.ctx, svc, svc+".t.clock", []byte("v"))
	noError(t, err)
	cancelled, cancel := context.WithCancel(s.ctx)
	cancel()
	for _, c := range []context.Context{s.ctx, cancelled} {
		before := time.Now()
		off, at := cs.ServerClockOffset(c, svc)
		after := time.Now()
		if at.Before(before) || at.After(after) {
			t.Fatalf("ServerClockOffset's time %v is not the local time of the call (%v to %v)", at, before, after)
		}
		if off.MinKnown && off.MaxKnown && off.Min > off.Max {
			t.Fatalf("ServerClockOffset bounds the offset from below by %v and from above by %v", off.Min, off.Max)
		}
	}
}

// watch collects what a [jobkeys.ValueWatcher] reports.
type watch struct {
	cancel context.CancelFunc
	ended  <-chan struct{}

	mu      sync.Mutex
	changes []jobkeys.ValueChange
	late    bool          // a change reported after ended was closed
	more    chan struct{} // closed and replaced on every change
}

// startWatch starts st's value watch of svc when st is a ValueWatcher,
// ended when the test ends; nil otherwise.
func startWatch(t *testing.T, ctx context.Context, st jobkeys.Store, svc string) *watch {
	t.Helper()
	vw, ok := st.(jobkeys.ValueWatcher)
	if !ok {
		return nil
	}
	wctx, cancel := context.WithCancel(ctx)
	w := &watch{cancel: cancel, more: make(chan struct{})}
	ended, err := vw.WatchValues(wctx, svc, func(c jobkeys.ValueChange) {
		w.mu.Lock()
		defer w.mu.Unlock()
		select {
		case <-w.ended:
			w.late = true
		default:
		}
		w.changes = append(w.changes, c)
		close(w.more)
		w.more = make(chan struct{})
	})
	if err != nil {
		cancel()
		t.Fatalf("WatchValues of service %s: %v", svc, err)
	}
	w.mu.Lock()
	w.ended = ended
	w.mu.Unlock()
	t.Cleanup(func() { w.stop(t) })
	return w
}

// until waits until the watch has reported revision rev or a later one,
// and returns what it reported.
func (w *watch) until(t *testing.T, rev uint64) []jobkeys.ValueChange {
	t.Helper()
	guard := time.NewTimer(waitGuard)
	defer guard.Stop()
	for {
		w.mu.Lock()
		changes, more := w.changes, w.more
		w.mu.Unlock()
		if n := len(changes); n > 0 && changes[n-1].Revision >= rev {
			return changes
		}
		select {
		case <-more:
		case <-w.ended:
			t.Fatalf("the watch ended before it reported revision %d: %v", rev, changes)
		case <-guard.C:
			t.Fatalf("the watch did not report revision %d within %v: %v", rev, waitGuard, changes)
		}
	}
}

// stop ends the watch and waits until it has ended; a change reported
// after that fails the test.
func (w *watch) stop(t *testing.T) {
	t.Helper()
	w.cancel()
	guard := time.NewTimer(waitGuard)
	defer guard.Stop()
	select {
	case <-w.ended:
	case <-guard.C:
		t.Fatalf("the watch did not end within %v of its context's cancellation", waitGuard)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.late {
		t.Fatal("the watch reported a change after its ended channel was closed")
	}
}
