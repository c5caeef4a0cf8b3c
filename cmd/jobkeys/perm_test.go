package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jobkeys/jobkeys/internal/natstest"
	"github.com/jobkeys/jobkeys/jobs"
)

// A user the server refuses is told so, with exit code 7.
func TestPermissionDenied(t *testing.T) {
	t.Parallel()
	srv := natstest.RunWith(t, natstest.Options{Configure: func(o *server.Options) {
		o.Users = append(o.Users, &server.User{Username: "admin", Password: "admin"},
			&server.User{Username: "viewer", Password: "viewer", Permissions: &server.Permissions{
				Publish:   &server.SubjectPermission{Allow: []string{"$KV.>"}},
				Subscribe: &server.SubjectPermission{Allow: []string{"_INBOX.>"}},
			}})
	}})
	_, js := natstest.ConnectURL(t, "nats://admin:admin@"+strings.TrimPrefix(srv.ClientURL(), "nats://"))
	_, err := js.CreateKeyValue(context.Background(), jetstream.KeyValueConfig{Bucket: "JOBS_KEYS_svc", Storage: jetstream.MemoryStorage})
	require.NoError(t, err)

	r := newRunner(t, "nats://viewer:viewer@"+strings.TrimPrefix(srv.ClientURL(), "nats://"))
	res := r.run("keys", "ls", "svc", "--timeout", "3s")
	assert.Equal(t, exitPermission, res.code, res.stderr)
	assert.Contains(t, res.stderr, `"$JS.API.STREAM.INFO.KV_JOBS_KEYS_svc"`, "the refused subject is named")

	// The credentials of a nats CLI context are used: the admin's list, the
	// viewer's is refused.
	dir := t.TempDir()
	ctxDir := filepath.Join(dir, "nats", "context")
	require.NoError(t, os.MkdirAll(ctxDir, 0o700))
	for _, user := range []string{"admin", "viewer"} {
		require.NoError(t, os.WriteFile(filepath.Join(ctxDir, user+".json"),
			[]byte(`{"url":"`+srv.ClientURL()+`","user":"`+user+`","password":"`+user+`"}`), 0o600))
	}
	r = &runner{t: t, env: map[string]string{"XDG_CONFIG_HOME": dir}}
	res = r.run("keys", "ls", "svc", "--context", "admin")
	assert.Equal(t, exitOK, res.code, res.stderr)
	assert.Equal(t, "no keys\n", res.stdout)
	res = r.run("keys", "ls", "svc", "--context", "viewer", "--timeout", "3s")
	assert.Equal(t, exitPermission, res.code, res.stderr)
	res = r.run("keys", "ls", "svc", "--context", "viewer", "--server", srv.ClientURL(), "--timeout", "3s")
	assert.Equal(t, exitPermission, res.code, "--server replaces the context's URL, not its credentials: %s", res.stderr)
}

// TestJobsPermissionDenied is the regression test for a jobs command whose
// user may not read the job store's bucket directly (no direct gets): it
// timed out as an unavailable store (exit code 1, "context deadline
// exceeded"). It is a permission error now (exit code 7), naming the
// refused subject.
func TestJobsPermissionDenied(t *testing.T) {
	t.Parallel()
	srv := natstest.RunWith(t, natstest.Options{Configure: func(o *server.Options) {
		o.Users = append(o.Users, &server.User{Username: "admin", Password: "admin"},
			&server.User{Username: "viewer", Password: "viewer", Permissions: &server.Permissions{
				Publish: &server.SubjectPermission{Allow: []string{"$KV.>", "$JS.API.INFO",
					"$JS.API.STREAM.INFO.>", "$JS.API.STREAM.MSG.GET.>"}},
				Subscribe: &server.SubjectPermission{Allow: []string{"_INBOX.>"}},
			}})
	}})
	hostPort := strings.TrimPrefix(srv.ClientURL(), "nats://")
	_, js := natstest.ConnectURL(t, "nats://admin:admin@"+hostPort)
	st, err := jobs.NewNATSStore(js, nil, jobs.WithCreateBucket(jetstream.MemoryStorage, 1))
	require.NoError(t, err)
	jobFixture(t, st)

	r := newRunner(t, "nats://viewer:viewer@"+hostPort)
	res := r.run("jobs", "show", "ch", "j-pending", "--timeout", "2s")
	assert.Equal(t, exitPermission, res.code, res.stderr)
	assert.Contains(t, res.stderr, `"$JS.API.DIRECT.GET.KV_JOBKEYS_JOBS`, "the refused subject is named")
}
