package jobsweb_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jobkeys/jobkeys"
	"github.com/jobkeys/jobkeys/jobs"
	"github.com/jobkeys/jobkeys/jobs/jobsweb"
)

// endingWatches is a memory key store whose watches the test can end, as
// a lost connection ends a NATSStore's.
type endingWatches struct {
	*jobkeys.MemoryStore
	mu      sync.Mutex
	cancels []context.CancelFunc
	started int
}

func (s *endingWatches) WatchKeys(ctx context.Context, service, jobType string, changed func(string)) (<-chan struct{}, error) {
	wctx, cancel := context.WithCancel(ctx)
	s.mu.Lock()
	s.cancels = append(s.cancels, cancel)
	s.started++
	s.mu.Unlock()
	return s.MemoryStore.WatchKeys(wctx, service, jobType, changed)
}

func (s *endingWatches) end() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.cancels {
		c()
	}
	s.cancels = nil
}

func (s *endingWatches) watches() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.started
}

// lockedBuffer is a log destination safe for concurrent writes.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// When the store stops watching, the dashboard logs it and watches again:
// a key written after that shows on the keys page, which reads only what
// the watch brings.
func TestKeyWatchRestarts(t *testing.T) {
	t.Parallel()
	keys := &endingWatches{MemoryStore: jobkeys.NewMemoryStore()}
	coord, err := jobkeys.NewCoordinator(keys, nil)
	require.NoError(t, err)
	jt, err := coord.JobType("jobs", "sync", jobkeys.Policy{Key: []string{"account", "/a"}, MaxActive: 1, MaxQueuedPerKey: 2})
	require.NoError(t, err)
	store, err := jobs.NewMemoryStore(nil)
	require.NoError(t, err)
	var logs lockedBuffer
	h, err := jobsweb.New(&jobsweb.Config{Store: store, KeyStore: keys, Keys: coord, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	require.NoError(t, err)
	defer h.Close()
	srv := httptest.NewServer(h)
	defer srv.Close()
	get := func(path string) string {
		resp, err := http.Get(srv.URL + path)
		require.NoError(t, err)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return string(b)
	}
	admit := func(account string) {
		_, err := jt.Admit(context.Background(), "ch/"+account, []byte(fmt.Sprintf(`{"a":%q}`, account)))
		require.NoError(t, err)
	}
	waitKey := func(account string) {
		require.Eventually(t, func() bool { return strings.Contains(get("/keys"), "account:"+account) },
			30*time.Second, 20*time.Millisecond, "the keys page never showed %s", account)
	}

	admit("before")
	waitKey("before")
	require.Equal(t, 1, keys.watches())
	keys.end()
	require.Eventually(t, func() bool { return keys.watches() == 2 }, 30*time.Second, 10*time.Millisecond, "the dashboard did not watch again")
	admit("after")
	waitKey("after")
	assert.Contains(t, logs.String(), "key watch ended; watching again")
}
