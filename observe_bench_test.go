package jobkeys

import (
	"context"
	"log/slog"
	"strconv"
	"testing"

	"go.opentelemetry.io/otel/metric/noop"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
)

// BenchmarkObserveKeyCycle measures a key cycle (admit, acquire, release)
// on the memory store without observation (the baseline), with the no-op
// meter provider, with a logger whose handler drops everything below
// error, and with the SDK's meter provider, so that the cost of each is
// the difference to the baseline in the same run.
func BenchmarkObserveKeyCycle(b *testing.B) {
	for _, bc := range []struct {
		name string
		cfg  func() *Config
	}{
		{"baseline", func() *Config { return nil }},
		{"noop-meter", func() *Config { return &Config{MeterProvider: noop.NewMeterProvider()} }},
		{"logger", func() *Config {
			return &Config{Logger: slog.New(slog.DiscardHandler)}
		}},
		{"sdk-meter", func() *Config {
			return &Config{MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))}
		}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			coord, err := NewCoordinator(NewMemoryStore(), bc.cfg())
			if err != nil {
				b.Fatal(err)
			}
			jt, err := coord.JobType("bench", "cycle", Policy{Key: []string{"/k"}, MaxQueuedPerKey: 1})
			if err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			payload := []byte(`{"k":"a"}`)
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				id := "j" + strconv.Itoa(i)
				if _, err := jt.Admit(ctx, id, payload); err != nil {
					b.Fatal(err)
				}
				acq, err := jt.Acquire(ctx, id, payload)
				if err != nil || acq.Kind != KindAcquired {
					b.Fatal(acq.Kind, err)
				}
				if _, err := jt.Release(ctx, acq.Lease); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkObserveHook measures the hook an operation defers, alone:
// without an observer (what every operation pays when nothing is
// configured) beside a function without the hook, and with the SDK.
func BenchmarkObserveHook(b *testing.B) {
	key := JobKey{Service: "bench", JobType: "hook", KVKey: "bench.hook.x"}
	ctx := context.Background()
	withHook := func(o *observer) (Admission, error) {
		var out Admission
		var err error
		defer o.end(ctx, metricOpAdmit, &key, o.begin(), &out.Kind, &err)
		out.Kind = KindAccepted
		return out, err
	}
	without := func() (Admission, error) {
		var out Admission
		out.Kind = KindAccepted
		return out, nil
	}
	b.Run("no-hook", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_, _ = without()
		}
	})
	b.Run("nil-observer", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_, _ = withHook(nil)
		}
	})
	b.Run("sdk-meter", func(b *testing.B) {
		o, err := newObserver(sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader())), nil)
		if err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		for b.Loop() {
			_, _ = withHook(o)
		}
	})
}
