package jobs

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jobkeys/jobkeys"
	"github.com/jobkeys/jobkeys/internal/natstest"
)

// TestNATSStoreNamesRefusedPermission is the regression test for a store
// whose user may not make a request it needs (here the stream's direct
// gets): the server says so only to the connection's async error handler,
// and every read timed out as ErrUnavailable "context deadline exceeded",
// which sends an operator looking at the network. The error now wraps
// jobkeys.ErrPermission and names the refused subject (DESIGN §7), beside
// ErrUnavailable.
func TestNATSStoreNamesRefusedPermission(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := workerStore(t, "JOBS_PERM", "$JS.API.STREAM.INFO.>", "$JS.API.STREAM.MSG.GET.>", "$JS.API.STREAM.PURGE.>")

	_, err := st.Get(ctx, "ch", "j")
	require.ErrorIs(t, err, ErrUnavailable)
	require.ErrorIs(t, err, jobkeys.ErrPermission, "a refused read is a timeout: %v", err)
	assert.Contains(t, err.Error(), "$JS.API.DIRECT.GET.KV_JOBS_PERM")
	assert.Contains(t, err.Error(), `read KV key "job.ch.j"`, "the read is still named")

	// Behind the caller's deadline too: the deadline's error, and the
	// refusal.
	dctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	_, err = st.Get(dctx, "ch", "j")
	t.Logf("expired: %v", err)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.ErrorIs(t, err, jobkeys.ErrPermission, "%v", err)

	_, err = st.Claim(ctx, ClaimRequest{Owner: "w", Count: 1, TTL: time.Minute})
	require.ErrorIs(t, err, jobkeys.ErrPermission, "%v", err)
	assert.Contains(t, err.Error(), "$JS.API.DIRECT.GET.KV_JOBS_PERM")
	assert.Equal(t, "permission_denied", errorClass(err), "the metrics' error.type")
}

// TestNATSStoreStaleRefusalNamesNoOtherCall is the regression test for a
// refusal that outlived its call: nats.go keeps the connection's last
// error until a reconnect, so once one call was refused (here a purge the
// worker may not make), every later timeout of any other call (here a read
// behind an expired deadline, which the worker may make) wrapped
// jobkeys.ErrPermission and named the old refused subject, counted as
// permission_denied. A refusal now names only a call whose own subjects it
// refused (or the inbox, which every reply needs).
func TestNATSStoreStaleRefusalNamesNoOtherCall(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := workerStore(t, "JOBS_STALE", "$JS.API.STREAM.INFO.>", "$JS.API.STREAM.MSG.GET.>", "$JS.API.DIRECT.GET.>")
	_, err := st.Get(ctx, "ch", "j")
	require.NoError(t, err, "the worker may read")

	err = st.DeleteChannel(ctx, "ch")
	require.ErrorIs(t, err, jobkeys.ErrPermission, "the purge is refused: %v", err)
	assert.Contains(t, err.Error(), "$JS.API.STREAM.PURGE.KV_JOBS_STALE")

	// Reads whose deadlines pass before or while they are in flight time
	// out: the deadline's error, not the purge's refusal.
	inFlight := 0
	for d := 20 * time.Microsecond; d < 100*time.Millisecond; d = d * 5 / 4 {
		dctx, cancel := context.WithTimeout(ctx, d)
		_, err := st.Get(dctx, "ch", "j")
		cancel()
		if err == nil {
			continue
		}
		require.ErrorIs(t, err, context.DeadlineExceeded)
		if errors.Is(err, jobkeys.ErrPermission) {
			inFlight++
			t.Errorf("a read behind a %v deadline: %v", d, err)
		}
		assert.NotContains(t, err.Error(), "PURGE")
		assert.NotEqual(t, "permission_denied", errorClass(err))
	}
	assert.Zero(t, inFlight, "timeouts taken for the purge's refusal")

	_, err = st.Get(ctx, "ch", "j")
	require.NoError(t, err, "the worker still reads")
}

// workerStore starts a server with users admin (all permissions) and
// worker (publish to $KV.>, $JS.API.INFO and allow, subscribe to
// _INBOX.>), creates bucket as admin with job j of channel ch in it, and
// returns the worker's store of bucket (requests time out after 500 ms).
func workerStore(t *testing.T, bucket string, allow ...string) *NATSStore {
	t.Helper()
	return workerStoreWith(t, bucket, nil, 500*time.Millisecond, allow...)
}

// workerStoreWith is workerStore with the worker's store configured by cfg
// and its requests timing out after timeout.
func workerStoreWith(t *testing.T, bucket string, cfg *Config, timeout time.Duration, allow ...string) *NATSStore {
	t.Helper()
	srv := natstest.RunWith(t, natstest.Options{Configure: func(o *server.Options) {
		o.Users = append(o.Users, &server.User{Username: "admin", Password: "admin"},
			&server.User{Username: "worker", Password: "worker", Permissions: &server.Permissions{
				Publish:   &server.SubjectPermission{Allow: append([]string{"$KV.>", "$JS.API.INFO"}, allow...)},
				Subscribe: &server.SubjectPermission{Allow: []string{"_INBOX.>"}},
			}})
	}})
	hostPort := strings.TrimPrefix(srv.ClientURL(), "nats://")
	_, adminJS := natstest.ConnectURL(t, "nats://admin:admin@"+hostPort)
	admin, err := NewNATSStore(adminJS, nil, WithBucket(bucket), WithCreateBucket(jetstream.MemoryStorage, 1))
	require.NoError(t, err)
	_, err = admin.Enqueue(context.Background(), testEnqueueRequest("ch", "j", "doc"))
	require.NoError(t, err)

	nc, _ := natstest.ConnectURL(t, "nats://worker:worker@"+hostPort)
	js, err := jetstream.New(nc, jetstream.WithDefaultTimeout(timeout))
	require.NoError(t, err)
	st, err := NewNATSStore(js, cfg, WithBucket(bucket))
	require.NoError(t, err)
	return st
}
