package jobkeys

import (
	"bytes"
	"context"
	"testing"

	"github.com/stretchr/testify/require"
)

// The zero MemoryStore is a usable empty store with the default limit.
func TestMemoryStoreZeroValue(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var m MemoryStore
	_, _, err := m.Get(ctx, "s", "k")
	require.ErrorIs(t, err, ErrKeyNotFound, "Get on the zero store: %v", err)
	rev, err := m.Create(ctx, "s", "k", []byte("v"))
	require.NoError(t, err, "Create on the zero store")
	value, got, err := m.Get(ctx, "s", "k")
	require.NoError(t, err)
	require.Equal(t, "v", string(value))
	require.Equal(t, rev, got)
	_, err = m.Create(ctx, "s", "big", bytes.Repeat([]byte("x"), MemoryStoreMaxValueSizeDefault+1))
	require.ErrorIs(t, err, ErrStateTooLarge, "over the default limit: %v", err)
}

func TestMemoryStoreSetMaxValueSize(t *testing.T) {
	t.Parallel()
	m := NewMemoryStore()
	for _, n := range []int{0, -1} {
		err := m.SetMaxValueSize(n)
		require.ErrorIs(t, err, ErrInvalidRequest, "SetMaxValueSize(%d): %v", n, err)
	}
	big := bytes.Repeat([]byte("x"), MemoryStoreMaxValueSizeDefault)
	_, err := m.Create(context.Background(), "s", "k", big)
	require.NoError(t, err, "a value of exactly the default limit")
	_, err = m.Create(context.Background(), "s", "k2", append(big, 'x'))
	require.ErrorIs(t, err, ErrStateTooLarge, "one byte over the default limit: %v", err)
}
