package jobs_test

import (
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jobkeys/jobkeys/internal/natstest"
	"github.com/jobkeys/jobkeys/jobs"
	"github.com/jobkeys/jobkeys/jobs/jobstest"
)

var conformanceBucket atomic.Int64

// TestNATSStoreConformance runs the conformance suite and the model test
// against NATSStore on one embedded server, each subtest on a bucket (and
// connection) of its own: on memory storage, where an enqueue is one
// atomic batch, and on R1 file storage, where it is written key by key.
func TestNATSStoreConformance(t *testing.T) {
	t.Parallel()
	s := natstest.Run(t)
	for _, storage := range []jetstream.StorageType{jetstream.MemoryStorage, jetstream.FileStorage} {
		t.Run(storage.String(), func(t *testing.T) {
			t.Parallel()
			jobstest.Run(t, func(t *testing.T, cfg *jobs.Config) jobs.Store {
				_, js := natstest.Connect(t, s)
				bucket := fmt.Sprintf("JOBS_C%d", conformanceBucket.Add(1))
				st, err := jobs.NewNATSStore(js, cfg, jobs.WithBucket(bucket), jobs.WithCreateBucket(storage, 1))
				require.NoError(t, err)
				return st
			})
		})
	}
}
