package jobs

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jobkeys/jobkeys/internal/natstest"
)

// settleOne claims and settles job j of channel ch, which the store's
// bucket holds; the settle purges j's active entry in the background.
func settleOne(t *testing.T, st *NATSStore, id string) {
	t.Helper()
	ctx := context.Background()
	got, err := st.Claim(ctx, ClaimRequest{Owner: "w", Count: 1, TTL: time.Minute})
	require.NoError(t, err)
	require.Len(t, got, 1)
	require.Equal(t, id, got[0].ID)
	_, err = st.Settle(ctx, SettleRequest{Claim: ClaimOf(got[0]), Artifact: json.RawMessage(`{}`)})
	require.NoError(t, err)
}

// TestNATSStorePurgeRefusalObserved is the regression test for the
// settle's background purge of the job's active entry, which was sent
// without a reply and failed in silence when the user may not purge: the
// README's permission list could be wrong without anyone seeing it, and
// claims read every finished job. A refused purge is now counted and
// logged (once per store, a warning naming the subject), and Close waits
// for the purges' answers.
func TestNATSStorePurgeRefusalObserved(t *testing.T) {
	t.Parallel()
	var h logRecords
	st := workerStoreWith(t, "JOBS_NOPURGE", &Config{Logger: slog.New(&h)}, 2*time.Second,
		"$JS.API.STREAM.INFO.>", "$JS.API.STREAM.MSG.GET.>", "$JS.API.DIRECT.GET.>")
	ctx := context.Background()
	settleOne(t, st, "j")
	_, err := st.Enqueue(ctx, testEnqueueRequest("ch", "j2", "doc-2"))
	require.NoError(t, err)
	settleOne(t, st, "j2") // its claim purges j's entry again: two refusals at least

	cctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	require.NoError(t, st.Close(cctx), "the purges' timeouts end long before the deadline")
	assert.GreaterOrEqual(t, st.purges.refused.Load(), int64(3), "the settles' purges and the claim's")
	assert.Zero(t, st.purges.failed.Load(), "refusals are not counted as other failures")

	h.mu.Lock()
	defer h.mu.Unlock()
	var warnings []slog.Record
	for _, r := range h.records {
		if r.Level == slog.LevelWarn && strings.Contains(r.Message, "purge") {
			warnings = append(warnings, r)
		}
	}
	require.Len(t, warnings, 1, "logged once per store: %v", h.records)
	var subject string
	warnings[0].Attrs(func(a slog.Attr) bool {
		if a.Key == "subject" {
			subject = a.Value.String()
		}
		return true
	})
	assert.Equal(t, "$JS.API.STREAM.PURGE.KV_JOBS_NOPURGE", subject)
}

// TestNATSStoreCloseCancelsPurges: Close waits for the purges in flight
// until its ctx ends, then stops waiting for them: nothing of them is
// left (no timer to fire on the closed store), and they are counted
// neither as refused nor as failed.
func TestNATSStoreCloseCancelsPurges(t *testing.T) {
	t.Parallel()
	// Without the purge permission and with a long timeout, the settle's
	// purge stays unanswered for a minute.
	st := workerStoreWith(t, "JOBS_CLOSEPURGE", nil, time.Minute,
		"$JS.API.STREAM.INFO.>", "$JS.API.STREAM.MSG.GET.>", "$JS.API.DIRECT.GET.>")
	settleOne(t, st, "j")
	st.purges.mu.Lock()
	inFlight := len(st.purges.flying)
	st.purges.mu.Unlock()
	require.Equal(t, 1, inFlight, "the settle's purge waits for its answer")

	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	err := st.Close(ctx)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	assert.ErrorContains(t, err, "JOBS_CLOSEPURGE", "the error names the bucket")
	assert.ErrorContains(t, err, " 1 purge", "the error says how many purges it stopped waiting for")
	st.purges.mu.Lock()
	assert.Empty(t, st.purges.flying)
	assert.Zero(t, st.purges.live, "a purge is left after Close")
	st.purges.mu.Unlock()
	assert.Zero(t, st.purges.refused.Load()+st.purges.failed.Load())
	require.NoError(t, st.Close(context.Background()), "again: nothing to wait for")

	// The store still works after Close.
	_, err = st.Get(context.Background(), "ch", "j")
	require.NoError(t, err)
}

// TestNATSStorePurgesConcurrent: purges sent by concurrent settles are all
// answered, none refused or failed, and Close, after the last call, finds
// none left and ends the store's reply subscription (it used to live as
// long as the connection); the active index holds no finished job.
func TestNATSStorePurgesConcurrent(t *testing.T) {
	t.Parallel()
	st, _ := newTestNATSStore(t, natstest.Run(t), nil)
	ctx := context.Background()
	const workers, each = 4, 10
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			ch := fmt.Sprintf("ch%d", w)
			for i := range each {
				id := strconv.Itoa(i)
				if _, err := st.Enqueue(ctx, testEnqueueRequest(ch, id, id)); !assert.NoError(t, err) {
					return
				}
				got, err := st.Claim(ctx, ClaimRequest{ChannelID: ch, Owner: "w", Count: 1, TTL: time.Minute})
				if !assert.NoError(t, err) || !assert.Len(t, got, 1) {
					return
				}
				_, err = st.Settle(ctx, SettleRequest{Claim: ClaimOf(got[0]), Artifact: json.RawMessage(`{}`)})
				assert.NoError(t, err)
			}
		})
	}
	wg.Wait()
	subs := st.js.Conn().NumSubscriptions()
	cctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	require.NoError(t, st.Close(cctx))
	assert.Equal(t, subs-1, st.js.Conn().NumSubscriptions(), "Close ends the store's reply subscription")
	st.purges.mu.Lock()
	assert.Zero(t, st.purges.live)
	assert.Empty(t, st.purges.flying)
	st.purges.mu.Unlock()
	assert.Zero(t, st.purges.refused.Load()+st.purges.failed.Load())
	entries, _, err := st.listActive(ctx, "list", "", nil)
	require.NoError(t, err)
	assert.Empty(t, entries, "every job is finished")
}

// TestNATSStoreCloseEndedContextNothingInFlight: Close with a ctx that has
// already ended, on a store with no purge in flight, stopped waiting for
// nothing and returns no error (it used to fail about half the time,
// "stopped waiting for the answers of 0 purges", as select picked the
// ended ctx).
func TestNATSStoreCloseEndedContextNothingInFlight(t *testing.T) {
	t.Parallel()
	s := natstest.Run(t)
	st, _ := newTestNATSStore(t, s, nil)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for i := range 64 {
		require.NoError(t, st.Close(ctx), "close %d", i)
	}
}
