package jobkeys

// Hooks for the tests of package jobkeys_test (store_conformance_test.go).

// NewMemoryStoreWithBatches returns an empty MemoryStore whose Batches is
// true for every key, so that the conformance suite checks its
// BatchWriter (a MemoryStore batches only in tests).
func NewMemoryStoreWithBatches() *MemoryStore {
	m := NewMemoryStore()
	m.batching = true
	return m
}
