package boundedmap

import (
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A full map evicts one entry for each new key and none for a key it
// holds; Get, Take and Delete see what Put left.
func TestMapBound(t *testing.T) {
	t.Parallel()
	m := Map[string, int]{Max: 3}
	for i := range 3 {
		m.Put(fmt.Sprint(i), i)
	}
	require.Equal(t, 3, m.Len())
	m.Put("1", 10) // held: no eviction
	assert.Equal(t, 3, m.Len())
	for i := range 3 {
		_, ok := m.Get(fmt.Sprint(i))
		assert.True(t, ok, "key %d kept", i)
	}
	m.Put("new", 4)
	assert.Equal(t, 3, m.Len(), "one evicted for the new key")
	v, ok := m.Get("new")
	require.True(t, ok)
	assert.Equal(t, 4, v)

	v, ok = m.Take("new")
	require.True(t, ok)
	assert.Equal(t, 4, v)
	_, ok = m.Take("new")
	assert.False(t, ok, "taken once")
	assert.Equal(t, 2, m.Len())
	m.Put("x", 1)
	m.Delete("x")
	_, ok = m.Get("x")
	assert.False(t, ok)

	n := 0
	m.Range(func(string, int) bool { n++; return false })
	assert.Equal(t, 1, n, "Range stops when f says so")
}

// The zero value is bounded by DefaultMax, also under concurrent puts.
func TestMapZeroValue(t *testing.T) {
	t.Parallel()
	var m Map[int, struct{}]
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range DefaultMax {
				m.Put(w*DefaultMax+i, struct{}{})
			}
		}()
	}
	wg.Wait()
	assert.Equal(t, DefaultMax, m.Len())
}
