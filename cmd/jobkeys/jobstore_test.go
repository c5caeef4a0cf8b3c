package main

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jobkeys/jobkeys/internal/natstest"
	"github.com/jobkeys/jobkeys/jobs"
)

// TestJobsCommandClosesTheJobStore is the regression test for the jobs
// commands never closing the job store they open: a cancel (a write that
// finishes a job) leaves the store's background purge of the job's
// active-index entry in flight when the command returns, its timer
// pending for --timeout and its answer unread, and a purge the server
// refuses was never told. The store is closed now, on every path, after
// waiting for the purges in flight; a refused purge is reported on stderr.
func TestJobsCommandClosesTheJobStore(t *testing.T) {
	t.Parallel()
	// ops may do everything but purge: its purges get no answer.
	srv := natstest.RunWith(t, natstest.Options{Configure: func(o *server.Options) {
		o.Users = append(o.Users, &server.User{Username: "admin", Password: "admin"},
			&server.User{Username: "ops", Password: "ops", Permissions: &server.Permissions{
				Publish: &server.SubjectPermission{Allow: []string{">"}, Deny: []string{"$JS.API.STREAM.PURGE.>"}},
			}})
	}})
	hostPort := strings.TrimPrefix(srv.ClientURL(), "nats://")
	_, js := natstest.ConnectURL(t, "nats://admin:admin@"+hostPort)
	st, err := jobs.NewNATSStore(js, nil, jobs.WithCreateBucket(jetstream.MemoryStorage, 1))
	require.NoError(t, err)
	jobFixture(t, st)

	var mu sync.Mutex
	var opened []*jobs.NATSStore
	last := func(n int) *jobs.NATSStore {
		mu.Lock()
		defer mu.Unlock()
		require.Len(t, opened, n)
		return opened[n-1]
	}
	r := newRunner(t, "nats://ops:ops@"+hostPort)
	r.jobStore = func(ctx context.Context, s *session, o *options) (jobs.Store, error) {
		js, err := openNATSJobs(ctx, s, o)
		if err == nil {
			mu.Lock()
			opened = append(opened, js.(*jobs.NATSStore))
			mu.Unlock()
		}
		return js, err
	}
	res := r.run("jobs", "cancel", "-f", "ch", "j-running", "--timeout", "5s")
	require.Equal(t, exitOK, res.code, res.stderr)
	assert.Equal(t, jobs.StateCancelled, jobState(t, st, "j-running").State)
	assert.Contains(t, res.stderr, "refuses this store's purges", "the refused purge is reported")
	assert.NotContains(t, res.stderr, "warning", "the command's close waited for the purge to time out")

	// A purge in flight would hold Close up to its deadline (its answer
	// never comes: it times out after --timeout, far later).
	closeNow := func(st *jobs.NATSStore) error {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		return st.Close(ctx)
	}
	assert.NoError(t, closeNow(last(1)), "no purge is left in flight once the command has returned")

	// An error path closes it too: the job is final now.
	res = r.run("jobs", "cancel", "-f", "ch", "j-running", "--timeout", "5s")
	assert.Equal(t, exitConflict, res.code, res.stderr)
	assert.NoError(t, closeNow(last(2)))
}
