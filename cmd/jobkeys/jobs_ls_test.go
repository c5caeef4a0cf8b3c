package main

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jobkeys/jobkeys/jobs"
)

// listRecorder is a job store that remembers the list requests it answers.
type listRecorder struct {
	jobs.Store
	mu   sync.Mutex
	reqs []jobs.ListRequest
}

func (r *listRecorder) List(ctx context.Context, req jobs.ListRequest) (jobs.Page, error) {
	r.mu.Lock()
	r.reqs = append(r.reqs, req)
	r.mu.Unlock()
	return r.Store.List(ctx, req)
}

func (r *listRecorder) last() jobs.ListRequest {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.reqs[len(r.reqs)-1]
}

// TestJobsLsFiltersInTheStore: "jobs ls" without CHANNEL lists every
// channel; --state and --type (comma-separated) are passed to the store's
// List, which filters, and --limit counts the jobs that pass.
func TestJobsLsFiltersInTheStore(t *testing.T) {
	t.Parallel()
	mem, err := jobs.NewMemoryStore(nil)
	require.NoError(t, err)
	jobFixture(t, mem) // channel "ch": j-backoff, j-failed, j-running, j-paused, j-pending
	_, err = mem.Enqueue(context.Background(), jobs.EnqueueRequest{ID: "m-1", ChannelID: "other", Type: "mail", Version: 1,
		TargetKey: "m-1", IdempotencyKey: "m-1", Fingerprint: "fp", Input: json.RawMessage(`{}`)})
	require.NoError(t, err)
	st := &listRecorder{Store: mem}
	r := jobRunner(t, st)

	res := r.run("jobs", "ls", "--json", "--state", "failed,pending")
	require.Equal(t, exitOK, res.code, res.stderr)
	var list []summaryJSON
	require.NoError(t, json.Unmarshal([]byte(res.stdout), &list))
	got := make([]string, len(list))
	for i, j := range list {
		got[i] = j.ChannelID + "/" + j.ID
	}
	assert.Equal(t, []string{"other/m-1", "ch/j-pending", "ch/j-failed", "ch/j-backoff"}, got)
	req := st.last()
	assert.Equal(t, "", req.ChannelID, "every channel")
	assert.Equal(t, []jobs.State{jobs.StateFailed, jobs.StatePending}, req.States, "the store filters by state")

	res = r.run("jobs", "ls", "--type", "mail")
	require.Equal(t, exitOK, res.code, res.stderr)
	lines := strings.Split(strings.TrimSpace(res.stdout), "\n")
	require.Len(t, lines, 2, res.stdout)
	assert.Regexp(t, `^CHANNEL +ID +TYPE +STATE `, lines[0])
	assert.Regexp(t, `^other +m-1 +mail/v1 +pending `, lines[1])
	assert.Equal(t, []string{"mail"}, st.last().Types, "the store filters by type")

	res = r.run("jobs", "ls", "ch", "--state", "pending", "--limit", "1", "--json")
	require.Equal(t, exitOK, res.code, res.stderr)
	require.NoError(t, json.Unmarshal([]byte(res.stdout), &list))
	require.Len(t, list, 1)
	assert.Equal(t, "j-pending", list[0].ID)
	assert.Equal(t, 1, st.last().Limit, "--limit counts the jobs that pass")

	res = r.run("jobs", "ls", "ch", "--state", "pending,done")
	assert.Equal(t, exitUsage, res.code, res.stdout)
	assert.Contains(t, res.stderr, `"done"`)
	res = r.run("jobs", "ls", "--type", "mail,")
	assert.Equal(t, exitUsage, res.code, res.stdout)
	res = r.run("jobs", "ls", "--type", "nothing")
	require.Equal(t, exitOK, res.code, res.stderr)
	assert.Equal(t, "no jobs in any channel that pass --state/--type\n", res.stdout)
}
