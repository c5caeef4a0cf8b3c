package otelmetric

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric/noop"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

func TestProvider(t *testing.T) {
	t.Parallel()
	assert.Nil(t, Provider(nil))
	assert.Nil(t, Provider(noop.NewMeterProvider()), "the no-op provider measures nothing")
	mp := sdkmetric.NewMeterProvider()
	assert.Equal(t, mp, Provider(mp))
}

// AttrSets builds a key's set once while it has room, and past
// MaxAttrSets builds it per measurement without keeping it; the option
// carries the attributes build returned.
func TestAttrSets(t *testing.T) {
	t.Parallel()
	builds := map[int]int{}
	build := func(k int) []attribute.KeyValue {
		builds[k]++
		return []attribute.KeyValue{attribute.Int("k", k)}
	}
	var sets AttrSets[int]
	for range 2 {
		for k := range MaxAttrSets + 1 {
			sets.Get(k, build)
		}
	}
	assert.Equal(t, MaxAttrSets, sets.Len())
	assert.Equal(t, 1, builds[0], "kept: built once")
	assert.Equal(t, 1, builds[MaxAttrSets-1])
	assert.Equal(t, 2, builds[MaxAttrSets], "past the bound: built per measurement")

	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	c, err := mp.Meter("test").Int64Counter("c")
	require.NoError(t, err)
	c.Add(context.Background(), 1, sets.Get(7, build))
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(context.Background(), &rm))
	sum := rm.ScopeMetrics[0].Metrics[0].Data.(metricdata.Sum[int64])
	v, ok := sum.DataPoints[0].Attributes.Value("k")
	require.True(t, ok)
	assert.Equal(t, int64(7), v.AsInt64())
}

func TestDurationBuckets(t *testing.T) {
	t.Parallel()
	b := DurationBuckets()
	require.NotEmpty(t, b)
	for i := 1; i < len(b); i++ {
		assert.Less(t, b[i-1], b[i], "increasing")
	}
	b[0] = -1
	assert.Positive(t, DurationBuckets()[0], "a new slice each call")
}
