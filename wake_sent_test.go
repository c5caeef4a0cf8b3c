package jobkeys

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestKeyEntrySentAtNotKeptForAnOlderState: the send time an entry keeps
// with its state vouches for that state and later ones only (every write
// after it was committed after that instant, see wakeTrustSent). Once the
// entry knows nothing (a feed delivered a value that is not the key's
// state, an operator's write failed), the feed's next state may be older
// than the one the send time came with: it must come with no send time,
// so that a Run waits on it only by wakeTrustAge from its arrival. A
// newer state the feed delivers over a known one may keep it. (The entry
// kept the send time of revision 5's read with revision 4's state.)
func TestKeyEntrySentAtNotKeptForAnOlderState(t *testing.T) {
	const k = "svc.t.h"
	st := &KeyState{Version: 1, Service: "svc", JobType: "t", KeyHash: "h"}
	for _, reset := range []string{"feed-not-a-state", "operator-conflict"} {
		t.Run(reset, func(t *testing.T) {
			tab := newKeyTable(8)
			tab.attach(k)
			defer tab.detach(k)
			e := tab.pin(k)
			defer tab.unpin(k, e)

			sent := time.Now()
			tab.watched(k, st, 2, true)              // the feed is at revision 2
			e.ObserveSent(st, 5, e.FeedMark(), sent) // this coordinator's read found revision 5
			rev, _, got := e.Learned()
			require.Equal(t, uint64(5), rev)
			require.Equal(t, sent, got)

			switch reset {
			case "feed-not-a-state":
				tab.watched(k, nil, 3, false)
			case "operator-conflict":
				e.Conflict()
			}
			tab.watched(k, st, 4, true) // the lagging feed: older than the read
			rev, _, got = e.Learned()
			require.Equal(t, uint64(4), rev)
			assert.True(t, got.IsZero(), "revision 4, older than the read of revision 5, came with its send time")

			// A newer state over a known one keeps it: the read's send
			// time bounds every write after revision 4 too.
			e.ObserveSent(st, 5, e.FeedMark(), sent)
			tab.watched(k, st, 6, true)
			rev, _, got = e.Learned()
			require.Equal(t, uint64(6), rev)
			assert.Equal(t, sent, got, "a newer state may keep the send time")
			tab.watchedValue(k, "svc", []byte("x"), 7)
			_, _, got = e.Learned()
			assert.Equal(t, sent, got)
			e.Conflict()
			tab.watchedValue(k, "svc", []byte("x"), 8)
			_, _, got = e.Learned()
			assert.True(t, got.IsZero(), "an undecoded state the feed delivered after the entry knew nothing came with a send time")
		})
	}
}
