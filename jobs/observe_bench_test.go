package jobs

import (
	"context"
	"strconv"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
)

// BenchmarkObserveJobCycle measures a job cycle (enqueue, claim, settle) on
// the memory store without metrics (the baseline) and with the SDK's meter
// provider, in the same run.
func BenchmarkObserveJobCycle(b *testing.B) {
	for _, bc := range []struct {
		name string
		cfg  func() *Config
	}{
		{"baseline", func() *Config { return nil }},
		{"sdk-meter", func() *Config {
			return &Config{MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))}
		}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			st, err := NewMemoryStore(bc.cfg())
			if err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				id := "j" + strconv.Itoa(i)
				if _, err := st.Enqueue(ctx, testEnqueueRequest("ch", id, "doc-"+id)); err != nil {
					b.Fatal(err)
				}
				claimed, err := st.Claim(ctx, ClaimRequest{ChannelID: "ch", Owner: "w", Count: 1, TTL: time.Minute})
				if err != nil || len(claimed) != 1 {
					b.Fatal(len(claimed), err)
				}
				if _, err := st.Settle(ctx, SettleRequest{Claim: ClaimOf(claimed[0])}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
