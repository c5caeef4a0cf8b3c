package jobsweb

import (
	"fmt"
	"log/slog"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jobkeys/jobkeys"
)

// A live stream that falls behind gets a resync (nil) as its last event:
// its page reloads instead of missing changes silently.
func TestHubResyncsASlowStream(t *testing.T) {
	t.Parallel()
	h := newKeyHub(nil, "jobs", nil, slog.New(slog.DiscardHandler))
	sub, cancel := h.subscribe()
	defer cancel()
	for i := range subscriberBuffer + 10 {
		kv := fmt.Sprintf("jobs.render.%064d", i)
		h.apply(jobkeys.KeyChange{KVKey: kv, Info: jobkeys.KeyInfo{KVKey: kv}})
	}
	var got [][]byte
	for range subscriberBuffer {
		got = append(got, <-sub)
	}
	select {
	case extra := <-sub:
		t.Fatalf("more than %d events buffered: %s", subscriberBuffer, extra)
	default:
	}
	require.Len(t, got, subscriberBuffer)
	assert.Nil(t, got[len(got)-1], "the last event is a resync")
	assert.NotNil(t, got[0])
	// An initial listing (a watch starting again) is no event.
	h.apply(jobkeys.KeyChange{KVKey: "jobs.render.x", Initial: true, Info: jobkeys.KeyInfo{KVKey: "jobs.render.x"}})
	select {
	case ev := <-sub:
		t.Fatalf("an initial key was sent as a change: %s", ev)
	default:
	}
}
