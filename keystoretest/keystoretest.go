// Package keystoretest is the conformance suite for implementations of
// [jobkeys.Store]: the contract of its four methods (a missing key, a
// revision conflict, a value over the store's size limit, a cancelled
// context, revisions that increase, copies in and out, concurrent
// compare-and-swaps), checked the same way against every store (as
// jobs/jobstest does for [jobs.Store]). A store's tests call [Run] with a
// [Harness] that makes empty stores:
//
//	func TestMyStore(t *testing.T) {
//		keystoretest.Run(t, keystoretest.Harness{
//			Open: func(t *testing.T) (jobkeys.Store, string) {
//				s := mystore.New() // or over a bucket of its own
//				t.Cleanup(func() { s.Close() })
//				return s, "svc-" + strconv.Itoa(next())
//			},
//		})
//	}
//
// Beside the four methods of [jobkeys.Store], the suite checks each
// optional capability the store implements, and skips the checks of the
// others with the reason (go test -v shows the skips):
//
//   - [jobkeys.BatchWriter], when Batches is true for a key of the
//     service once the key exists: a batch is written at consecutive
//     revisions after the one it was written on, all or nothing; a stale
//     revision is a conflict and a value over the limit (told by a
//     [jobkeys.ValueLimiter]) is refused, each writing nothing; a batch
//     that deletes ends in a delete marker at the last revision;
//   - [jobkeys.ValueWatcher]: the changes of the service's keys after the
//     watch started, each with the value and revision written, in
//     revision order up to each key's latest, deletes included (at the
//     marker's revision), no other service's; none after the watch ended;
//   - [jobkeys.ValueLimiter]: a value of MaxValueSize bytes is taken, one
//     byte more refused with [jobkeys.ErrStateTooLarge]; with
//     Harness.OpenLimited, MaxValueSize is no more than the limit asked;
//   - [jobkeys.ClockSource]: consistent bounds, at the time of the call,
//     with a cancelled context too.
//
// The targeted wake-ups of [jobkeys.WithWakeUps] are [jobkeys.NATSStore]'s
// own protocol, not a capability, and are not checked here. The package
// uses only the standard testing package, so importing it adds no test
// dependency to a module.
//
// The root package runs it on [jobkeys.MemoryStore] and on
// [jobkeys.NATSStore] over an embedded server (store_conformance_test.go).
package keystoretest

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"

	"github.com/jobkeys/jobkeys"
)

// Harness makes the stores the suite runs on. Its functions are called
// from parallel subtests; cleanup belongs in t.Cleanup.
type Harness struct {
	// Open returns a store and a service (for NATSStore, a bucket) that no
	// other subtest uses, with no keys. Required.
	Open func(t *testing.T) (jobkeys.Store, string)
	// OpenLimited is Open for a service whose values may be at most
	// maxValueSize bytes: a larger Create or Update must fail with an
	// error wrapping jobkeys.ErrStateTooLarge and write nothing. nil
	// skips that subtest, for a store without a limit.
	OpenLimited func(t *testing.T, maxValueSize int) (jobkeys.Store, string)
}

// Run runs the suite against the stores h makes, one parallel subtest per
// rule, the checks of the optional capabilities included (see the package
// doc). A Harness without Open fails the test.
func Run(t *testing.T, h Harness) {
	t.Helper()
	if h.Open == nil {
		t.Fatal("keystoretest: Harness.Open is nil")
	}
	ctx := context.Background()
	const key = "svc.sync.0123abcd"

	t.Run("GetMissing", func(t *testing.T) {
		t.Parallel()
		st, svc := h.Open(t)
		missing(t, ctx, st, svc, key)
	})

	t.Run("CreateThenGet", func(t *testing.T) {
		t.Parallel()
		st, svc := h.Open(t)
		value := []byte(`{"v":1}`)
		rev, err := st.Create(ctx, svc, key, value)
		noError(t, err)
		greater(t, rev, 0, "the revision of a Create")
		value[2] = 'X' // the store keeps its own copy
		holds(t, ctx, st, svc, key, []byte(`{"v":1}`), rev)
		got, _, err := st.Get(ctx, svc, key)
		noError(t, err)
		got[0] = 'X' // and hands out copies
		holds(t, ctx, st, svc, key, []byte(`{"v":1}`), rev)
	})

	t.Run("CreateExisting", func(t *testing.T) {
		t.Parallel()
		st, svc := h.Open(t)
		rev, err := st.Create(ctx, svc, key, []byte("one"))
		noError(t, err)
		_, err = st.Create(ctx, svc, key, []byte("two"))
		isConflict(t, err, "second Create")
		holds(t, ctx, st, svc, key, []byte("one"), rev)
	})

	t.Run("Update", func(t *testing.T) {
		t.Parallel()
		st, svc := h.Open(t)
		rev1, err := st.Create(ctx, svc, key, []byte("one"))
		noError(t, err)
		rev2, err := st.Update(ctx, svc, key, []byte("two"), rev1)
		noError(t, err)
		greater(t, rev2, rev1)
		holds(t, ctx, st, svc, key, []byte("two"), rev2)

		for _, wrong := range []uint64{rev1, rev2 + 1, rev2 + 1000, 0} {
			_, err = st.Update(ctx, svc, key, []byte("three"), wrong)
			isConflict(t, err, fmt.Sprintf("Update at revision %d (current %d)", wrong, rev2))
			holds(t, ctx, st, svc, key, []byte("two"), rev2)
		}
		rev3, err := st.Update(ctx, svc, key, []byte("three"), rev2)
		noError(t, err)
		greater(t, rev3, rev2)
	})

	t.Run("UpdateMissing", func(t *testing.T) {
		t.Parallel()
		st, svc := h.Open(t)
		// Give the bucket some history so that revision 1 exists somewhere.
		rev, err := st.Create(ctx, svc, "other.key", []byte("x"))
		noError(t, err)
		for _, r := range []uint64{0, 1, rev} {
			_, err = st.Update(ctx, svc, key, []byte("v"), r)
			isConflict(t, err, fmt.Sprintf("Update of a missing key at revision %d", r))
		}
		missing(t, ctx, st, svc, key)
	})

	t.Run("Delete", func(t *testing.T) {
		t.Parallel()
		st, svc := h.Open(t)
		rev1, err := st.Create(ctx, svc, key, []byte("one"))
		noError(t, err)
		rev2, err := st.Update(ctx, svc, key, []byte("two"), rev1)
		noError(t, err)

		for _, wrong := range []uint64{rev1, rev2 + 1, 0} {
			err = st.Delete(ctx, svc, key, wrong)
			isConflict(t, err, fmt.Sprintf("Delete at revision %d (current %d)", wrong, rev2))
			holds(t, ctx, st, svc, key, []byte("two"), rev2)
		}
		noError(t, st.Delete(ctx, svc, key, rev2))
		missing(t, ctx, st, svc, key)

		isConflict(t, st.Delete(ctx, svc, key, rev2), "Delete of a deleted key")
		_, err = st.Update(ctx, svc, key, []byte("three"), rev2)
		isConflict(t, err, "Update of a deleted key at its last revision")
		missing(t, ctx, st, svc, key)
		isConflict(t, st.Delete(ctx, svc, "never.written", 1), "Delete of a key never written")
	})

	// A deleted key is deleted whatever revision is presented, including
	// the revision of the delete itself (which a KV watcher reports). In a
	// fresh bucket the delete is the write right after rev; a store whose
	// revisions skip numbers passes trivially.
	t.Run("DeletedKeyAtTheDeletesRevision", func(t *testing.T) {
		// As in NATS KV, the delete marker has a revision (the next one in
		// this fresh bucket) and Update/Delete compare against it.
		t.Parallel()
		st, svc := h.Open(t)
		rev, err := st.Create(ctx, svc, key, []byte("one"))
		noError(t, err)
		noError(t, st.Delete(ctx, svc, key, rev))
		_, err = st.Update(ctx, svc, key, []byte("stale"), rev)
		isConflict(t, err, "Update of a deleted key at the revision before the delete")
		missing(t, ctx, st, svc, key)
		isConflict(t, st.Delete(ctx, svc, key, rev), "Delete of a deleted key at the revision before the delete")
		missing(t, ctx, st, svc, key)
		rev2, err := st.Update(ctx, svc, key, []byte("again"), rev+1)
		noError(t, err, "Update at the delete marker's revision")
		holds(t, ctx, st, svc, key, []byte("again"), rev2)
	})

	t.Run("CreateAfterDelete", func(t *testing.T) {
		t.Parallel()
		st, svc := h.Open(t)
		rev1, err := st.Create(ctx, svc, key, []byte("one"))
		noError(t, err)
		noError(t, st.Delete(ctx, svc, key, rev1))
		rev2, err := st.Create(ctx, svc, key, []byte("again"))
		noError(t, err, "Create after Delete")
		greater(t, rev2, rev1)
		holds(t, ctx, st, svc, key, []byte("again"), rev2)
		_, err = st.Create(ctx, svc, key, []byte("thrice"))
		isConflict(t, err, "Create over the recreated key")
		rev3, err := st.Update(ctx, svc, key, []byte("updated"), rev2)
		noError(t, err)
		holds(t, ctx, st, svc, key, []byte("updated"), rev3)
	})

	t.Run("RevisionsIncrease", func(t *testing.T) {
		t.Parallel()
		st, svc := h.Open(t)
		var last uint64
		next := func(rev uint64, err error) uint64 {
			t.Helper()
			noError(t, err)
			greater(t, rev, last)
			last = rev
			return rev
		}
		a := next(st.Create(ctx, svc, "k.a", []byte("1")))
		b := next(st.Create(ctx, svc, "k.b", []byte("1")))
		a = next(st.Update(ctx, svc, "k.a", []byte("2"), a))
		b = next(st.Update(ctx, svc, "k.b", []byte("2"), b))
		noError(t, st.Delete(ctx, svc, "k.a", a))
		a = next(st.Create(ctx, svc, "k.a", []byte("3")))
		next(st.Update(ctx, svc, "k.a", []byte("4"), a))
		next(st.Update(ctx, svc, "k.b", []byte("3"), b))
	})

	t.Run("ServicesAreSeparate", func(t *testing.T) {
		t.Parallel()
		st, svc := h.Open(t)
		other := svc + "b"
		ra, err := st.Create(ctx, svc, key, []byte("a"))
		noError(t, err)
		missing(t, ctx, st, other, key)
		rb, err := st.Create(ctx, other, key, []byte("b"))
		noError(t, err, "the same key in another service")
		noError(t, st.Delete(ctx, svc, key, ra))
		holds(t, ctx, st, other, key, []byte("b"), rb)
	})

	t.Run("ValueTooLarge", func(t *testing.T) {
		t.Parallel()
		if h.OpenLimited == nil {
			t.Skip("the store has no value size limit (Harness.OpenLimited is nil)")
		}
		const limit = 1024
		st, svc := h.OpenLimited(t, limit)
		big := bytes.Repeat([]byte("x"), limit+1)
		_, err := st.Create(ctx, svc, key, big)
		errorIs(t, err, jobkeys.ErrStateTooLarge, "Create of %d bytes: want jobkeys.ErrStateTooLarge, got %v", len(big), err)
		missing(t, ctx, st, svc, key)

		small := bytes.Repeat([]byte("y"), limit/2)
		rev, err := st.Create(ctx, svc, key, small)
		noError(t, err, "Create of %d bytes", len(small))
		_, err = st.Update(ctx, svc, key, big, rev)
		errorIs(t, err, jobkeys.ErrStateTooLarge, "Update of %d bytes: want jobkeys.ErrStateTooLarge, got %v", len(big), err)
		holds(t, ctx, st, svc, key, small, rev)
		_, err = st.Update(ctx, svc, key, bytes.Repeat([]byte("z"), 10*limit), rev)
		errorIs(t, err, jobkeys.ErrStateTooLarge, "Update of %d bytes: %v", 10*limit, err)
		holds(t, ctx, st, svc, key, small, rev)
	})

	t.Run("ContextCancelled", func(t *testing.T) {
		t.Parallel()
		cancelled, cancel := context.WithCancel(ctx)
		cancel()
		isCancelled := func(t *testing.T, err error, what string) {
			t.Helper()
			errorIs(t, err, context.Canceled, "%s with a cancelled ctx: want context.Canceled, got %v", what, err)
		}
		// A store that has not opened the bucket yet.
		st, svc := h.Open(t)
		_, _, err := st.Get(cancelled, svc, key)
		isCancelled(t, err, "first Get")
		_, err = st.Create(cancelled, svc, key, []byte("v"))
		isCancelled(t, err, "first Create")

		// A store with the bucket open and a value in it.
		rev, err := st.Create(ctx, svc, key, []byte("v"))
		noError(t, err)
		_, _, err = st.Get(cancelled, svc, key)
		isCancelled(t, err, "Get")
		_, err = st.Create(cancelled, svc, "another.key", []byte("v"))
		isCancelled(t, err, "Create")
		_, err = st.Update(cancelled, svc, key, []byte("w"), rev)
		isCancelled(t, err, "Update")
		isCancelled(t, st.Delete(cancelled, svc, key, rev), "Delete")
		holds(t, ctx, st, svc, key, []byte("v"), rev)
		missing(t, ctx, st, svc, "another.key")
	})

	t.Run("ConcurrentCreateHasOneWinner", func(t *testing.T) {
		t.Parallel()
		st, svc := h.Open(t)
		const n = 8
		var wg sync.WaitGroup
		errs := make([]error, n)
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, errs[i] = st.Create(ctx, svc, key, []byte(strconv.Itoa(i)))
			}()
		}
		wg.Wait()
		wins := 0
		for i, err := range errs {
			if err == nil {
				wins++
				continue
			}
			isConflict(t, err, fmt.Sprintf("losing Create %d", i))
		}
		equal(t, 1, wins, "successful concurrent Creates")
	})

	t.Run("ConcurrentCompareAndSwapLosesNoUpdate", func(t *testing.T) {
		t.Parallel()
		st, svc := h.Open(t)
		_, err := st.Create(ctx, svc, key, []byte("0"))
		noError(t, err)
		const workers, each = 4, 10
		var wg sync.WaitGroup
		errc := make(chan error, workers)
		var revs sync.Map
		for range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for done := 0; done < each; {
					v, rev, err := st.Get(ctx, svc, key)
					if err != nil {
						errc <- err
						return
					}
					n, _ := strconv.Atoi(string(v))
					newRev, err := st.Update(ctx, svc, key, []byte(strconv.Itoa(n+1)), rev)
					if errors.Is(err, jobkeys.ErrRevisionConflict) {
						continue
					}
					if err != nil {
						errc <- err
						return
					}
					if _, dup := revs.LoadOrStore(newRev, true); dup {
						errc <- fmt.Errorf("revision %d returned twice", newRev)
						return
					}
					done++
				}
			}()
		}
		wg.Wait()
		close(errc)
		for err := range errc {
			noError(t, err)
		}
		v, _, err := st.Get(ctx, svc, key)
		noError(t, err)
		equal(t, strconv.Itoa(workers*each), string(v), "counter after %d compare-and-swap increments", workers*each)
	})

	runCapabilities(t, h, ctx)
}

// isNotFound fails t unless err wraps jobkeys.ErrKeyNotFound.
func isNotFound(t *testing.T, err error, what string) {
	t.Helper()
	errorIs(t, err, jobkeys.ErrKeyNotFound, "%s: want jobkeys.ErrKeyNotFound, got %v", what, err)
}

// isConflict fails t unless err wraps jobkeys.ErrRevisionConflict.
func isConflict(t *testing.T, err error, what string) {
	t.Helper()
	errorIs(t, err, jobkeys.ErrRevisionConflict, "%s: want jobkeys.ErrRevisionConflict, got %v", what, err)
}

// holds fails t unless key of svc holds value at revision rev.
func holds(t *testing.T, ctx context.Context, st jobkeys.Store, svc, key string, value []byte, rev uint64) {
	t.Helper()
	v, r, err := st.Get(ctx, svc, key)
	noError(t, err, "Get %s", key)
	equal(t, string(value), string(v), "value of %s", key)
	equal(t, rev, r, "revision of %s", key)
}

// missing fails t unless key of svc does not exist.
func missing(t *testing.T, ctx context.Context, st jobkeys.Store, svc, key string) {
	t.Helper()
	_, _, err := st.Get(ctx, svc, key)
	isNotFound(t, err, "Get "+key)
}

// message formats msgAndArgs (a format and its arguments) for a failure.
func message(msgAndArgs []any) string {
	if len(msgAndArgs) == 0 {
		return ""
	}
	if format, ok := msgAndArgs[0].(string); ok {
		return ": " + fmt.Sprintf(format, msgAndArgs[1:]...)
	}
	return ": " + fmt.Sprint(msgAndArgs...)
}

// noError fails t at once when err is not nil.
func noError(t *testing.T, err error, msgAndArgs ...any) {
	t.Helper()
	if err != nil {
		t.Fatalf("unexpected error %v%s", err, message(msgAndArgs))
	}
}

// errorIs fails t at once when err does not wrap target.
func errorIs(t *testing.T, err, target error, msgAndArgs ...any) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Fatalf("error %v does not wrap %v%s", err, target, message(msgAndArgs))
	}
}

// equal fails t at once when got is not want.
func equal[T comparable](t *testing.T, want, got T, msgAndArgs ...any) {
	t.Helper()
	if got != want {
		t.Fatalf("got %v, want %v%s", got, want, message(msgAndArgs))
	}
}

// greater fails t at once when a is not greater than b.
func greater[T cmp.Ordered](t *testing.T, a, b T, msgAndArgs ...any) {
	t.Helper()
	if a <= b {
		t.Fatalf("%v is not greater than %v%s", a, b, message(msgAndArgs))
	}
}
