package jobkeys

// The stores the root package's tests run on: an embedded JetStream server
// shared by the subtests of a test, and a service (bucket) per test.

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jobkeys/jobkeys/internal/natstest"
)

// storeHarness makes stores for tests that run on both stores.
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
