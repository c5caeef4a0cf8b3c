package jobkeys_test

// The key-store conformance suite (package keystoretest) run on both of
// the package's stores.

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jobkeys/jobkeys"
	"github.com/jobkeys/jobkeys/internal/natstest"
	"github.com/jobkeys/jobkeys/keystoretest"
)

// conformanceSeq makes the suite's service names unique in the test
// binary: a bucket per subtest.
var conformanceSeq atomic.Int64

func conformanceService(prefix string) string {
	return prefix + "-" + strconv.FormatInt(conformanceSeq.Add(1), 10)
}

// The capabilities each store has: the suite checks them (and skips the
// checks of the others: MemoryStore is no ClockSource).
var (
	_ jobkeys.WatchableStore = (*jobkeys.MemoryStore)(nil)
	_ jobkeys.ValueWatcher   = (*jobkeys.MemoryStore)(nil)
	_ jobkeys.ListableStore  = (*jobkeys.MemoryStore)(nil)
	_ jobkeys.BatchWriter    = (*jobkeys.MemoryStore)(nil)
	_ jobkeys.ValueLimiter   = (*jobkeys.MemoryStore)(nil)

	_ jobkeys.WatchableStore = (*jobkeys.NATSStore)(nil)
	_ jobkeys.ValueWatcher   = (*jobkeys.NATSStore)(nil)
	_ jobkeys.ListableStore  = (*jobkeys.NATSStore)(nil)
	_ jobkeys.BatchWriter    = (*jobkeys.NATSStore)(nil)
	_ jobkeys.ValueLimiter   = (*jobkeys.NATSStore)(nil)
	_ jobkeys.ClockSource    = (*jobkeys.NATSStore)(nil)
)

func TestStoreConformanceMemory(t *testing.T) {
	t.Parallel()
	keystoretest.Run(t, keystoretest.Harness{
		// Batches on, so that the suite checks the BatchWriter too.
		Open: func(t *testing.T) (jobkeys.Store, string) {
			return jobkeys.NewMemoryStoreWithBatches(), conformanceService("conf")
		},
		OpenLimited: func(t *testing.T, maxValueSize int) (jobkeys.Store, string) {
			m := jobkeys.NewMemoryStore()
			if err := m.SetMaxValueSize(maxValueSize); err != nil {
				t.Fatal(err)
			}
			return m, conformanceService("conf-small")
		},
	})
}

func TestStoreConformanceNATS(t *testing.T) {
	t.Parallel()
	s := natstest.Run(t)
	_, js := natstest.Connect(t, s)
	// store returns a NATSStore over the shared connection that creates
	// missing buckets in memory with one replica.
	store := func(t *testing.T) jobkeys.Store {
		st, err := jobkeys.NewNATSStore(js, jobkeys.WithCreateBuckets(jetstream.MemoryStorage, 1))
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	keystoretest.Run(t, keystoretest.Harness{
		Open: func(t *testing.T) (jobkeys.Store, string) { return store(t), conformanceService("conf") },
		OpenLimited: func(t *testing.T, maxValueSize int) (jobkeys.Store, string) {
			// The bucket exists, with the limit, before the store opens it.
			svc := conformanceService("conf-small")
			_, err := js.CreateKeyValue(context.Background(), jetstream.KeyValueConfig{
				Bucket: jobkeys.BucketPrefixDefault + "_" + svc, History: 1, MaxValueSize: int32(maxValueSize),
				Storage: jetstream.MemoryStorage, Replicas: 1,
			})
			if err != nil {
				t.Fatalf("create the bucket of %s: %v", svc, err)
			}
			return store(t), svc
		},
	})
}
