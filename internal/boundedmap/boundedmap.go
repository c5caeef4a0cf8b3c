package boundedmap

import "sync"

// DefaultMax is the bound of a [Map] whose Max is zero or less.
const DefaultMax = 4096

// Map is a map of at most Max entries (DefaultMax when Max is zero or
// less). Putting a key it does not hold into a full map first evicts an
// arbitrary entry. The zero value is an empty map bounded by DefaultMax;
// Max must not change once the map is in use. A Map is safe for
// concurrent use and must not be copied after first use.
type Map[K comparable, V any] struct {
	// Max bounds the entries.
	Max int

	mu sync.Mutex
	m  map[K]V
}

func (m *Map[K, V]) bound() int {
	if m.Max <= 0 {
		return DefaultMax
	}
	return m.Max
}

// Put sets k's value to v, evicting an arbitrary other entry when k is new
// and the map is full.
func (m *Map[K, V]) Put(k K, v V) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.m == nil {
		m.m = make(map[K]V)
	}
	if _, ok := m.m[k]; !ok && len(m.m) >= m.bound() {
		for victim := range m.m {
			delete(m.m, victim)
			break
		}
	}
	m.m[k] = v
}

// Get returns k's value and whether the map holds k.
func (m *Map[K, V]) Get(k K) (V, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	v, ok := m.m[k]
	return v, ok
}

// Take returns k's value and whether the map held k, and removes it.
func (m *Map[K, V]) Take(k K) (V, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	v, ok := m.m[k]
	if ok {
		delete(m.m, k)
	}
	return v, ok
}

// Delete removes k, if the map holds it.
func (m *Map[K, V]) Delete(k K) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.m, k)
}

// Len returns the number of entries.
func (m *Map[K, V]) Len() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.m)
}

// Range calls f with the entries, in no particular order, until f returns
// false. It holds the map's lock: f must not call the map's methods.
func (m *Map[K, V]) Range(f func(K, V) bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for k, v := range m.m {
		if !f(k, v) {
			return
		}
	}
}

// Clear removes every entry.
func (m *Map[K, V]) Clear() {
	m.mu.Lock()
	defer m.mu.Unlock()
	clear(m.m)
}
