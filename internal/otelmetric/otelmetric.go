package otelmetric

import (
	"sync"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
)

// Provider returns mp, or nil when mp is nil or OpenTelemetry's no-op
// provider: nothing would be measured, and the caller then makes no
// instruments at all.
func Provider(mp metric.MeterProvider) metric.MeterProvider {
	if _, ok := mp.(noop.MeterProvider); ok {
		return nil
	}
	return mp
}

// DurationBuckets returns the bucket boundaries, in seconds, of the
// latency histograms: a KV round trip is well under a millisecond on a
// LAN, a contended operation can take tens of milliseconds, a call
// waiting on a slow server seconds. Each call returns a new slice.
func DurationBuckets() []float64 {
	return []float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}
}

// MaxAttrSets bounds the attribute sets an [AttrSets] keeps.
const MaxAttrSets = 4096

// AttrSets caches the measurement option of the attribute set of each
// key K, at most [MaxAttrSets] of them: past that, the sets of new keys
// are built for each measurement (a program that makes attribute values
// without bound pays for it, but memory stays bounded). The zero value
// is ready; it is safe for concurrent use and must not be copied after
// first use.
type AttrSets[K comparable] struct {
	mu   sync.RWMutex
	sets map[K]metric.MeasurementOption
}

// Get returns the measurement option of k's attribute set, the
// attributes build returns for k, built once while the cache has room.
func (a *AttrSets[K]) Get(k K, build func(K) []attribute.KeyValue) metric.MeasurementOption {
	a.mu.RLock()
	opt, ok := a.sets[k]
	a.mu.RUnlock()
	if ok {
		return opt
	}
	opt = metric.WithAttributeSet(attribute.NewSet(build(k)...))
	a.mu.Lock()
	if a.sets == nil {
		a.sets = make(map[K]metric.MeasurementOption)
	}
	if len(a.sets) < MaxAttrSets {
		a.sets[k] = opt
	}
	a.mu.Unlock()
	return opt
}

// Len returns the number of attribute sets kept.
func (a *AttrSets[K]) Len() int {
	a.mu.RLock()
	defer a.mu.RUnlock()
	return len(a.sets)
}
