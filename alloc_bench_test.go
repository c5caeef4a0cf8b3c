package jobkeys

import (
	"context"
	"fmt"
	"strconv"
	"testing"
)

// BenchmarkCycleQueuedMemory is BenchmarkCycleQueued over a MemoryStore:
// one cycle (admit → acquire → release of a new job) on a key that holds
// one active slot and n queued jobs, with no network in the way, so that
// B/op and allocs/op are the coordinator's own (and the store's copy of
// each value).
func BenchmarkCycleQueuedMemory(b *testing.B) {
	for _, n := range benchQueueLengths {
		b.Run(fmt.Sprintf("queued=%d", n), func(b *testing.B) {
			c, err := NewCoordinator(NewMemoryStore(), nil)
			if err != nil {
				b.Fatal(err)
			}
			ctx, service, payload := context.Background(), benchService(), benchPayload(0)
			policy := Policy{Key: benchPolicy.Key, MaxActive: 2, MaxQueuedPerKey: 2000}
			for i := range n + 1 {
				adm, err := c.Admit(ctx, AdmitRequest{Service: service, JobType: benchJobType, JobID: fmt.Sprintf("queued-%08d", i), Payload: payload, Policy: policy})
				if err != nil || adm.Kind != KindAccepted {
					b.Fatalf("preload %d: %s %v", i, adm.Kind, err)
				}
			}
			acq, err := c.Acquire(ctx, AcquireRequest{Service: service, JobType: benchJobType, JobID: "queued-00000000", Payload: payload, Policy: policy})
			if err != nil || acq.Kind != KindAcquired {
				b.Fatalf("preload acquire: %s %v", acq.Kind, err)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				if err := benchCycle(ctx, c, service, policy, payload, "job-"+strconv.Itoa(i)); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			benchReportRate(b, "cycles/s")
			b.ReportMetric(float64(len(benchStateBytes(b, n))), "state-B")
		})
	}
}
