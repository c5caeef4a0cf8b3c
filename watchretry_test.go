package jobkeys

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestAwaitCreatedIsNotADelete: a create that lost on the absence its
// key's feed delivered waits for the create that won; a delete delivered
// meanwhile (this coordinator's own, say) is not it.
func TestAwaitCreatedIsNotADelete(t *testing.T) {
	t.Parallel()
	keys := newKeyTable(8)
	const k = "jobkeys.svc.jt.key"
	assert.False(t, keys.pin(k).View().Absent, "an entry no feed feeds holds nothing as absent")
	keys.unpin(k, keys.entry(k))

	keys.attach(k)
	defer keys.detach(k)
	e := keys.entry(k)
	require.NotNil(t, e)
	keys.watched(k, nil, 5, true) // the key's delete
	v := e.View()
	require.True(t, v.Absent, "the feed delivered the key's delete")
	require.Equal(t, uint64(5), v.Delivered)

	keys.watched(k, nil, 7, true) // another delete after it
	assert.False(t, e.AwaitCreated(context.Background(), v.Delivered, 20*time.Millisecond),
		"a delete was taken for the create that won")

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	assert.False(t, e.AwaitCreated(ctx, 7, rtWait), "an ended context still waited")

	keys.watched(k, &KeyState{Service: "svc"}, 8, true) // the create
	assert.True(t, e.AwaitCreated(context.Background(), v.Delivered, rtWait))
	assert.False(t, e.View().Absent)
}
