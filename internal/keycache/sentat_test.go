package keycache

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The send time an entry keeps with its state vouches for that state and
// later ones only (every write after it was committed after that instant;
// the root's wakeTrustSent rests on it). Once the entry knows nothing (a
// feed delivered a value that is not the key's state, an operator's write
// failed), the feed's next state may be older than the one the send time
// came with: it must come with no send time, so that a Run waits on it
// only by wakeTrustAge from its arrival. A newer state the feed delivers
// over a known one may keep it. (The entry once kept the send time of
// revision 5's read with revision 4's state.)
func TestSentAtNotKeptForAnOlderState(t *testing.T) {
	t.Parallel()
	st := &state{n: 1}
	for _, reset := range []string{"feed-not-a-state", "operator-conflict"} {
		t.Run(reset, func(t *testing.T) {
			t.Parallel()
			var e Entry[state]
			e.Attach()
			defer e.Detach()

			sent := time.Now()
			e.Watched(st, 2, true)                   // the feed is at revision 2
			e.ObserveSent(st, 5, e.FeedMark(), sent) // this coordinator's read found revision 5
			rev, _, got := e.Learned()
			require.Equal(t, uint64(5), rev)
			require.Equal(t, sent, got)

			switch reset {
			case "feed-not-a-state":
				e.Watched(nil, 3, false)
			case "operator-conflict":
				e.Conflict()
			}
			e.Watched(st, 4, true) // the lagging feed: older than the read
			rev, _, got = e.Learned()
			require.Equal(t, uint64(4), rev)
			assert.True(t, got.IsZero(), "revision 4, older than the read of revision 5, came with its send time")

			// A newer state over a known one keeps it: the read's send
			// time bounds every write after revision 4 too.
			e.ObserveSent(st, 5, e.FeedMark(), sent)
			e.Watched(st, 6, true)
			rev, _, got = e.Learned()
			require.Equal(t, uint64(6), rev)
			assert.Equal(t, sent, got, "a newer state may keep the send time")
			e.WatchedValue("svc", "k", []byte("x"), 7)
			_, _, got = e.Learned()
			assert.Equal(t, sent, got)
			e.Conflict()
			e.WatchedValue("svc", "k", []byte("x"), 8)
			_, _, got = e.Learned()
			assert.True(t, got.IsZero(), "an undecoded state the feed delivered after the entry knew nothing came with a send time")
		})
	}
}
