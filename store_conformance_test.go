package jobkeys

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jobkeys/jobkeys/internal/natstest"
)

// storeHarness makes stores for the conformance suite.
type storeHarness struct {
	// open returns a store and a service (bucket) that no other test uses.
	open func(t *testing.T) (Store, string)
	// openLimited is open for a bucket whose values may be at most
	// maxValueSize bytes.
	openLimited func(t *testing.T, maxValueSize int) (Store, string)
}

// jkServiceSeq makes service names unique within the test binary, so that
// every test and subtest gets its own bucket on a shared server.
var jkServiceSeq atomic.Int64

func jkService(prefix string) string {
	return prefix + "-" + strconv.FormatInt(jkServiceSeq.Add(1), 10)
}

// jkNATS is an embedded JetStream server shared by the subtests of one test.
type jkNATS struct {
	srv *server.Server
	js  jetstream.JetStream
}

func startJKNATS(t *testing.T) *jkNATS {
	t.Helper()
	s := natstest.Run(t)
	_, js := natstest.Connect(t, s)
	return &jkNATS{srv: s, js: js}
}

// store returns a NATSStore over the shared connection that creates
// missing buckets in memory with one replica.
func (n *jkNATS) store(t *testing.T) *NATSStore {
	t.Helper()
	st, err := NewNATSStore(n.js, WithCreateBuckets(jetstream.MemoryStorage, 1))
	require.NoError(t, err)
	return st
}

// createBucket creates service's bucket with a value size limit (0: none)
// and history 1, as WithCreateBuckets would, but before any store opens it.
func (n *jkNATS) createBucket(t *testing.T, service string, maxValueSize int32, history uint8) jetstream.KeyValue {
	t.Helper()
	kv, err := n.js.CreateKeyValue(context.Background(), jetstream.KeyValueConfig{
		Bucket: BucketPrefixDefault + "_" + service, History: history, MaxValueSize: maxValueSize,
		Storage: jetstream.MemoryStorage, Replicas: 1,
	})
	require.NoError(t, err, "create bucket for %s", service)
	return kv
}

func (n *jkNATS) harness() storeHarness {
	return storeHarness{
		open: func(t *testing.T) (Store, string) { return n.store(t), jkService("conf") },
		openLimited: func(t *testing.T, maxValueSize int) (Store, string) {
			svc := jkService("conf-small")
			n.createBucket(t, svc, int32(maxValueSize), 1)
			return n.store(t), svc
		},
	}
}

func memoryHarness() storeHarness {
	return storeHarness{
		open: func(t *testing.T) (Store, string) { return NewMemoryStore(), jkService("conf") },
		openLimited: func(t *testing.T, maxValueSize int) (Store, string) {
			m := NewMemoryStore()
			require.NoError(t, m.SetMaxValueSize(maxValueSize))
			return m, jkService("conf-small")
		},
	}
}

func TestStoreConformanceMemory(t *testing.T) {
	t.Parallel()
	exerciseStore(t, memoryHarness())
}

func TestStoreConformanceNATS(t *testing.T) {
	t.Parallel()
	exerciseStore(t, startJKNATS(t).harness())
}

// The zero MemoryStore is a usable empty store with the default limit.
func TestMemoryStoreZeroValue(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var m MemoryStore
	_, _, err := m.Get(ctx, "s", "k")
	require.ErrorIs(t, err, ErrKeyNotFound, "Get on the zero store: %v", err)
	rev, err := m.Create(ctx, "s", "k", []byte("v"))
	require.NoError(t, err, "Create on the zero store")
	value, got, err := m.Get(ctx, "s", "k")
	require.NoError(t, err)
	require.Equal(t, "v", string(value))
	require.Equal(t, rev, got)
	_, err = m.Create(ctx, "s", "big", bytes.Repeat([]byte("x"), MemoryStoreMaxValueSizeDefault+1))
	require.ErrorIs(t, err, ErrStateTooLarge, "over the default limit: %v", err)
}

func TestMemoryStoreSetMaxValueSize(t *testing.T) {
	t.Parallel()
	m := NewMemoryStore()
	for _, n := range []int{0, -1} {
		err := m.SetMaxValueSize(n)
		require.ErrorIs(t, err, ErrInvalidRequest, "SetMaxValueSize(%d): %v", n, err)
	}
	big := bytes.Repeat([]byte("x"), MemoryStoreMaxValueSizeDefault)
	_, err := m.Create(context.Background(), "s", "k", big)
	require.NoError(t, err, "a value of exactly the default limit")
	_, err = m.Create(context.Background(), "s", "k2", append(big, 'x'))
	require.ErrorIs(t, err, ErrStateTooLarge, "one byte over the default limit: %v", err)
}

// exerciseStore is the Store contract, run against every implementation.
func exerciseStore(t *testing.T, h storeHarness) {
	ctx := context.Background()
	const key = "svc.sync.0123abcd"
	isNotFound := func(t *testing.T, err error, what string) {
		t.Helper()
		require.ErrorIs(t, err, ErrKeyNotFound, "%s: want ErrKeyNotFound, got %v", what, err)
	}
	isConflict := func(t *testing.T, err error, what string) {
		t.Helper()
		require.ErrorIs(t, err, ErrRevisionConflict, "%s: want ErrRevisionConflict, got %v", what, err)
	}
	holds := func(t *testing.T, st Store, svc, key string, value []byte, rev uint64) {
		t.Helper()
		v, r, err := st.Get(ctx, svc, key)
		require.NoError(t, err, "Get %s", key)
		require.Equal(t, string(value), string(v), "value of %s", key)
		require.Equal(t, rev, r, "revision of %s", key)
	}
	missing := func(t *testing.T, st Store, svc, key string) {
		t.Helper()
		_, _, err := st.Get(ctx, svc, key)
		isNotFound(t, err, "Get "+key)
	}

	t.Run("GetMissing", func(t *testing.T) {
		t.Parallel()
		st, svc := h.open(t)
		missing(t, st, svc, key)
	})

	t.Run("CreateThenGet", func(t *testing.T) {
		t.Parallel()
		st, svc := h.open(t)
		value := []byte(`{"v":1}`)
		rev, err := st.Create(ctx, svc, key, value)
		require.NoError(t, err)
		require.Positive(t, rev)
		value[2] = 'X' // the store keeps its own copy
		holds(t, st, svc, key, []byte(`{"v":1}`), rev)
		got, _, err := st.Get(ctx, svc, key)
		require.NoError(t, err)
		got[0] = 'X' // and hands out copies
		holds(t, st, svc, key, []byte(`{"v":1}`), rev)
	})

	t.Run("CreateExisting", func(t *testing.T) {
		t.Parallel()
		st, svc := h.open(t)
		rev, err := st.Create(ctx, svc, key, []byte("one"))
		require.NoError(t, err)
		_, err = st.Create(ctx, svc, key, []byte("two"))
		isConflict(t, err, "second Create")
		holds(t, st, svc, key, []byte("one"), rev)
	})

	t.Run("Update", func(t *testing.T) {
		t.Parallel()
		st, svc := h.open(t)
		rev1, err := st.Create(ctx, svc, key, []byte("one"))
		require.NoError(t, err)
		rev2, err := st.Update(ctx, svc, key, []byte("two"), rev1)
		require.NoError(t, err)
		require.Greater(t, rev2, rev1)
		holds(t, st, svc, key, []byte("two"), rev2)

		for _, wrong := range []uint64{rev1, rev2 + 1, rev2 + 1000, 0} {
			_, err = st.Update(ctx, svc, key, []byte("three"), wrong)
			isConflict(t, err, fmt.Sprintf("Update at revision %d (current %d)", wrong, rev2))
			holds(t, st, svc, key, []byte("two"), rev2)
		}
		rev3, err := st.Update(ctx, svc, key, []byte("three"), rev2)
		require.NoError(t, err)
		require.Greater(t, rev3, rev2)
	})

	t.Run("UpdateMissing", func(t *testing.T) {
		t.Parallel()
		st, svc := h.open(t)
		// Give the bucket some history so that revision 1 exists somewhere.
		rev, err := st.Create(ctx, svc, "other.key", []byte("x"))
		require.NoError(t, err)
		for _, r := range []uint64{0, 1, rev} {
			_, err = st.Update(ctx, svc, key, []byte("v"), r)
			isConflict(t, err, fmt.Sprintf("Update of a missing key at revision %d", r))
		}
		missing(t, st, svc, key)
	})

	t.Run("Delete", func(t *testing.T) {
		t.Parallel()
		st, svc := h.open(t)
		rev1, err := st.Create(ctx, svc, key, []byte("one"))
		require.NoError(t, err)
		rev2, err := st.Update(ctx, svc, key, []byte("two"), rev1)
		require.NoError(t, err)

		for _, wrong := range []uint64{rev1, rev2 + 1, 0} {
			err = st.Delete(ctx, svc, key, wrong)
			isConflict(t, err, fmt.Sprintf("Delete at revision %d (current %d)", wrong, rev2))
			holds(t, st, svc, key, []byte("two"), rev2)
		}
		require.NoError(t, st.Delete(ctx, svc, key, rev2))
		missing(t, st, svc, key)

		isConflict(t, st.Delete(ctx, svc, key, rev2), "Delete of a deleted key")
		_, err = st.Update(ctx, svc, key, []byte("three"), rev2)
		isConflict(t, err, "Update of a deleted key at its last revision")
		missing(t, st, svc, key)
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
		st, svc := h.open(t)
		rev, err := st.Create(ctx, svc, key, []byte("one"))
		require.NoError(t, err)
		require.NoError(t, st.Delete(ctx, svc, key, rev))
		_, err = st.Update(ctx, svc, key, []byte("stale"), rev)
		isConflict(t, err, "Update of a deleted key at the revision before the delete")
		missing(t, st, svc, key)
		isConflict(t, st.Delete(ctx, svc, key, rev), "Delete of a deleted key at the revision before the delete")
		missing(t, st, svc, key)
		rev2, err := st.Update(ctx, svc, key, []byte("again"), rev+1)
		require.NoError(t, err, "Update at the delete marker's revision")
		holds(t, st, svc, key, []byte("again"), rev2)
	})

	t.Run("CreateAfterDelete", func(t *testing.T) {
		t.Parallel()
		st, svc := h.open(t)
		rev1, err := st.Create(ctx, svc, key, []byte("one"))
		require.NoError(t, err)
		require.NoError(t, st.Delete(ctx, svc, key, rev1))
		rev2, err := st.Create(ctx, svc, key, []byte("again"))
		require.NoError(t, err, "Create after Delete")
		require.Greater(t, rev2, rev1)
		holds(t, st, svc, key, []byte("again"), rev2)
		_, err = st.Create(ctx, svc, key, []byte("thrice"))
		isConflict(t, err, "Create over the recreated key")
		rev3, err := st.Update(ctx, svc, key, []byte("updated"), rev2)
		require.NoError(t, err)
		holds(t, st, svc, key, []byte("updated"), rev3)
	})

	t.Run("RevisionsIncrease", func(t *testing.T) {
		t.Parallel()
		st, svc := h.open(t)
		var last uint64
		next := func(rev uint64, err error) uint64 {
			t.Helper()
			require.NoError(t, err)
			require.Greater(t, rev, last)
			last = rev
			return rev
		}
		a := next(st.Create(ctx, svc, "k.a", []byte("1")))
		b := next(st.Create(ctx, svc, "k.b", []byte("1")))
		a = next(st.Update(ctx, svc, "k.a", []byte("2"), a))
		b = next(st.Update(ctx, svc, "k.b", []byte("2"), b))
		require.NoError(t, st.Delete(ctx, svc, "k.a", a))
		a = next(st.Create(ctx, svc, "k.a", []byte("3")))
		next(st.Update(ctx, svc, "k.a", []byte("4"), a))
		next(st.Update(ctx, svc, "k.b", []byte("3"), b))
	})

	t.Run("ServicesAreSeparate", func(t *testing.T) {
		t.Parallel()
		st, svc := h.open(t)
		other := svc + "b"
		ra, err := st.Create(ctx, svc, key, []byte("a"))
		require.NoError(t, err)
		missing(t, st, other, key)
		rb, err := st.Create(ctx, other, key, []byte("b"))
		require.NoError(t, err, "the same key in another service")
		require.NoError(t, st.Delete(ctx, svc, key, ra))
		holds(t, st, other, key, []byte("b"), rb)
	})

	t.Run("ValueTooLarge", func(t *testing.T) {
		t.Parallel()
		const limit = 1024
		st, svc := h.openLimited(t, limit)
		big := bytes.Repeat([]byte("x"), limit+1)
		_, err := st.Create(ctx, svc, key, big)
		require.ErrorIs(t, err, ErrStateTooLarge, "Create of %d bytes: want ErrStateTooLarge, got %v", len(big), err)
		missing(t, st, svc, key)

		small := bytes.Repeat([]byte("y"), limit/2)
		rev, err := st.Create(ctx, svc, key, small)
		require.NoError(t, err, "Create of %d bytes", len(small))
		_, err = st.Update(ctx, svc, key, big, rev)
		require.ErrorIs(t, err, ErrStateTooLarge, "Update of %d bytes: want ErrStateTooLarge, got %v", len(big), err)
		holds(t, st, svc, key, small, rev)
		_, err = st.Update(ctx, svc, key, bytes.Repeat([]byte("z"), 10*limit), rev)
		require.ErrorIs(t, err, ErrStateTooLarge, "Update of %d bytes: %v", 10*limit, err)
		holds(t, st, svc, key, small, rev)
	})

	t.Run("ContextCancelled", func(t *testing.T) {
		t.Parallel()
		cancelled, cancel := context.WithCancel(ctx)
		cancel()
		isCancelled := func(t *testing.T, err error, what string) {
			t.Helper()
			require.ErrorIs(t, err, context.Canceled, "%s with a cancelled ctx: want context.Canceled, got %v", what, err)
		}
		// A store that has not opened the bucket yet.
		st, svc := h.open(t)
		_, _, err := st.Get(cancelled, svc, key)
		isCancelled(t, err, "first Get")
		_, err = st.Create(cancelled, svc, key, []byte("v"))
		isCancelled(t, err, "first Create")

		// A store with the bucket open and a value in it.
		rev, err := st.Create(ctx, svc, key, []byte("v"))
		require.NoError(t, err)
		_, _, err = st.Get(cancelled, svc, key)
		isCancelled(t, err, "Get")
		_, err = st.Create(cancelled, svc, "another.key", []byte("v"))
		isCancelled(t, err, "Create")
		_, err = st.Update(cancelled, svc, key, []byte("w"), rev)
		isCancelled(t, err, "Update")
		isCancelled(t, st.Delete(cancelled, svc, key, rev), "Delete")
		holds(t, st, svc, key, []byte("v"), rev)
		missing(t, st, svc, "another.key")
	})

	t.Run("ConcurrentCreateHasOneWinner", func(t *testing.T) {
		t.Parallel()
		st, svc := h.open(t)
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
		require.Equal(t, 1, wins, "successful concurrent Creates")
	})

	t.Run("ConcurrentCompareAndSwapLosesNoUpdate", func(t *testing.T) {
		t.Parallel()
		st, svc := h.open(t)
		_, err := st.Create(ctx, svc, key, []byte("0"))
		require.NoError(t, err)
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
					if errors.Is(err, ErrRevisionConflict) {
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
			require.NoError(t, err)
		}
		v, _, err := st.Get(ctx, svc, key)
		require.NoError(t, err)
		require.Equal(t, strconv.Itoa(workers*each), string(v), "counter after %d compare-and-swap increments", workers*each)
	})
}
