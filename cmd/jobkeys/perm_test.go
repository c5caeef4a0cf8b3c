package main

import (
	"context"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jobkeys/jobkeys/internal/natstest"
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
}
