package keycache

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A create that lost on the absence its key's feed delivered waits for the
// create that won; a delete delivered meanwhile (this coordinator's own,
// say) is not it.
func TestAwaitCreatedIsNotADelete(t *testing.T) {
	t.Parallel()
	var e Entry[state]
	assert.False(t, e.View().Absent, "an entry no feed feeds holds nothing as absent")

	e.Attach()
	defer e.Detach()
	e.Watched(nil, 5, true) // the key's delete
	v := e.View()
	require.True(t, v.Absent, "the feed delivered the key's delete")
	require.Equal(t, uint64(5), v.Delivered)

	e.Watched(nil, 7, true) // another delete after it
	assert.False(t, e.AwaitCreated(context.Background(), v.Delivered, 20*time.Millisecond),
		"a delete was taken for the create that won")

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	assert.False(t, e.AwaitCreated(ctx, 7, time.Minute), "an ended context still waited")

	e.Watched(&state{n: 1}, 8, true) // the create
	assert.True(t, e.AwaitCreated(context.Background(), v.Delivered, time.Minute))
	assert.False(t, e.View().Absent)
}
