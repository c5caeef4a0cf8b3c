package jobsweb_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jobkeys/jobkeys"
	"github.com/jobkeys/jobkeys/jobs"
	"github.com/jobkeys/jobkeys/jobs/jobsweb"
)

// BenchmarkPages10000 renders the keys page of a service of 10,000 keys
// and the jobs page of a channel of 10,000 jobs (memory stores), as a
// browser asks for them: the cost of one page, whatever the number.
func BenchmarkPages10000(b *testing.B) {
	keys := jobkeys.NewMemoryStore()
	coord, err := jobkeys.NewCoordinator(keys, nil)
	require.NoError(b, err)
	jt, err := coord.JobType("jobs", "sync", jobkeys.Policy{Key: []string{"account", "/a"}, MaxActive: 1, MaxQueuedPerKey: 2})
	require.NoError(b, err)
	store, err := jobs.NewMemoryStore(nil)
	require.NoError(b, err)
	ctx := context.Background()
	const n = 10000
	for i := range n {
		_, err := jt.Admit(ctx, fmt.Sprintf("big/job-%05d", i), []byte(fmt.Sprintf(`{"a":"acct-%05d"}`, i)))
		require.NoError(b, err)
		_, err = store.Enqueue(ctx, jobs.EnqueueRequest{ID: fmt.Sprintf("job-%05d", i), ChannelID: "big", Type: "sync", Version: 1,
			TargetKey: fmt.Sprint(i), IdempotencyKey: fmt.Sprint(i), Fingerprint: "f", Input: json.RawMessage(`{"a":1}`)})
		require.NoError(b, err)
	}
	h, err := jobsweb.New(&jobsweb.Config{Store: store, KeyStore: keys, Keys: coord})
	require.NoError(b, err)
	defer h.Close()
	srv := httptest.NewServer(h)
	defer srv.Close()
	get := func(path string) string {
		resp, err := http.Get(srv.URL + path)
		require.NoError(b, err)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.Equal(b, http.StatusOK, resp.StatusCode)
		return string(body)
	}
	deadline := time.Now().Add(time.Minute)
	for !strings.Contains(get("/keys"), fmt.Sprintf("%d of %d keys", n, n)) {
		require.True(b, time.Now().Before(deadline), "the watch never listed the keys")
		time.Sleep(50 * time.Millisecond)
	}
	for _, path := range []string{"/keys", "/keys?q=acct-0123", "/jobs?channel=big", "/jobs?channel=big&state=completed", "/"} {
		b.Run(path, func(b *testing.B) {
			b.ReportAllocs()
			var size int
			for b.Loop() {
				size = len(get(path))
			}
			b.ReportMetric(float64(size), "bytes/page")
		})
	}
}
