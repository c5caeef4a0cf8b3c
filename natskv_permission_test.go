package jobkeys

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jobkeys/jobkeys/internal/natstest"
)

// workerPublish is what NATSStore's documentation says a worker of bucket
// must be allowed to publish to; workerSubscribe what it must be allowed to
// subscribe to, for inboxes under the prefix inbox.
func workerPublish(bucket string) []string {
	stream := "KV_" + bucket
	return []string{
		"$KV." + bucket + ".>",
		"$JS.API.STREAM.INFO." + stream,
		"$JS.API.DIRECT.GET." + stream + ".>",
		"$JS.API.STREAM.MSG.GET." + stream,
		"$JS.API.CONSUMER.CREATE." + stream + ".>",
		"$JS.API.CONSUMER.DELETE." + stream + ".>",
		"$JS.FC." + stream + ".>",
	}
}

func workerSubscribe(inbox string) []string { return []string{inbox + ".>"} }

// permServer is a server with an admin user (no restrictions, who creates
// the buckets) and one worker user per entry of users, each allowed to
// publish and subscribe to exactly the subjects given.
type permUser struct {
	name     string
	publish  []string
	subsribe []string
}

func permServer(t *testing.T, users ...permUser) *server.Server {
	t.Helper()
	return natstest.RunWith(t, natstest.Options{Configure: func(o *server.Options) {
		o.Users = append(o.Users, &server.User{Username: "admin", Password: "admin"})
		for _, u := range users {
			o.Users = append(o.Users, &server.User{Username: u.name, Password: u.name, Permissions: &server.Permissions{
				Publish:   &server.SubjectPermission{Allow: u.publish},
				Subscribe: &server.SubjectPermission{Allow: u.subsribe},
			}})
		}
	}})
}

// TestNATSStoreWorkerPermissions: a user allowed exactly the documented
// subjects (see NATSStore) on a bucket an operator created admits,
// acquires, renews and releases jobs, watches and lists keys.
func TestNATSStoreWorkerPermissions(t *testing.T) {
	t.Parallel()
	svc := jkService("perm")
	bucket := BucketPrefixDefault + "_" + svc
	const inbox = "_INBOX_worker"
	s := permServer(t, permUser{name: "worker", publish: workerPublish(bucket), subsribe: workerSubscribe(inbox)})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	_, admin := natstest.Connect(t, s, nats.UserInfo("admin", "admin"))
	_, err := admin.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: bucket, Storage: jetstream.MemoryStorage})
	require.NoError(t, err)

	var asyncErrs []error // the worker's own handler still sees every error
	errc := make(chan error, 16)
	_, js := natstest.Connect(t, s, nats.UserInfo("worker", "worker"), nats.CustomInboxPrefix(inbox),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { errc <- err }))
	store, err := NewNATSStore(js)
	require.NoError(t, err)
	coord, err := NewCoordinator(store, &Config{InstanceID: "worker-1"})
	require.NoError(t, err)
	watcher, err := NewWatcher(store)
	require.NoError(t, err)
	defer watcher.Close()

	policy := Policy{Key: []string{"/tenant"}, MaxActive: 1, MaxQueuedPerKey: 2}
	payload := []byte(`{"tenant":"acme"}`)
	key, err := DeriveKey(svc, "render", payload, policy.Key)
	require.NoError(t, err)
	sub, err := watcher.Subscribe(ctx, svc, key.KVKey)
	require.NoError(t, err)
	defer sub.Close()

	adm, err := coord.Admit(ctx, AdmitRequest{Service: svc, JobType: "render", JobID: "j1", Payload: payload, Policy: policy})
	require.NoError(t, err, "admit")
	require.Equal(t, KindAccepted, adm.Kind)
	recv(t, sub.Changed(), "the watch's report of the admission")

	keys, err := store.ListKeys(ctx, svc, "render")
	require.NoError(t, err, "list")
	assert.Equal(t, []string{key.KVKey}, keys)

	acq, err := coord.Acquire(ctx, AcquireRequest{Service: svc, JobType: "render", JobID: "j1", Payload: payload, Policy: policy, Tries: 1})
	require.NoError(t, err, "acquire")
	require.Equal(t, KindAcquired, acq.Kind)
	ren, err := coord.Renew(ctx, RenewRequest{Lease: acq.Lease})
	require.NoError(t, err, "renew")
	require.Equal(t, KindRenewed, ren.Kind)
	rel, err := coord.Release(ctx, ReleaseRequest{Lease: acq.Lease})
	require.NoError(t, err, "release")
	require.Equal(t, KindReleased, rel.Kind)
	recv(t, sub.Changed(), "the watch's report of the release")

	keys, err = store.ListKeys(ctx, svc, "")
	require.NoError(t, err, "list")
	assert.Empty(t, keys, "the released key is deleted")

	for len(errc) > 0 {
		asyncErrs = append(asyncErrs, <-errc)
	}
	assert.Empty(t, asyncErrs, "errors reported on the worker's connection")
}

// TestNATSStorePermissionErrors: a call the server refuses for lack of one
// permission fails at once, long before its deadline, with an error
// wrapping ErrPermission that names the refused subject (it used to time out
// as a bare "context deadline exceeded"), through the store, the
// coordinator and the Watcher alike; the user's own async error handler is
// still called.
func TestNATSStorePermissionErrors(t *testing.T) {
	t.Parallel()
	svc := jkService("permerr")
	bucket := BucketPrefixDefault + "_" + svc
	stream := "KV_" + bucket
	const inbox = "_INBOX_w"
	policy := Policy{Key: []string{"/tenant"}}
	payload := []byte(`{"tenant":"acme"}`)
	key, err := DeriveKey(svc, "render", payload, policy.Key)
	require.NoError(t, err)
	without := func(subject string) []string {
		all := workerPublish(bucket)
		i := slices.Index(all, subject)
		require.GreaterOrEqual(t, i, 0, subject)
		return slices.Delete(all, i, i+1)
	}
	type env struct {
		store   *NATSStore
		coord   *KeyCoordinator
		watcher *Watcher
	}
	get := func(ctx context.Context, e env) error {
		_, _, err := e.store.Get(ctx, svc, key.KVKey)
		return err
	}
	admit := func(ctx context.Context, e env) error {
		_, err := e.coord.Admit(ctx, AdmitRequest{Service: svc, JobType: "render", JobID: "j1", Payload: payload, Policy: policy})
		return err
	}
	cases := []struct {
		name      string
		publish   []string
		subscribe []string
		open      bool // open the bucket before the call
		call      func(ctx context.Context, e env) error
		refused   string // a prefix of the subject the error must name
	}{
		{name: "no-stream-info", publish: without("$JS.API.STREAM.INFO." + stream), subscribe: workerSubscribe(inbox),
			call: get, refused: "$JS.API.STREAM.INFO." + stream},
		{name: "no-stream-info-admit", publish: without("$JS.API.STREAM.INFO." + stream), subscribe: workerSubscribe(inbox),
			call: admit, refused: "$JS.API.STREAM.INFO." + stream},
		{name: "no-direct-get", publish: without("$JS.API.DIRECT.GET." + stream + ".>"), subscribe: workerSubscribe(inbox), open: true,
			call: get, refused: "$JS.API.DIRECT.GET." + stream},
		{name: "no-kv-publish", publish: without("$KV." + bucket + ".>"), subscribe: workerSubscribe(inbox), open: true,
			call: func(ctx context.Context, e env) error {
				_, err := e.store.Create(ctx, svc, key.KVKey, []byte("v"))
				return err
			}, refused: "$KV." + bucket + "."},
		{name: "no-kv-publish-admit", publish: without("$KV." + bucket + ".>"), subscribe: workerSubscribe(inbox), open: true,
			call: admit, refused: "$KV." + bucket + "."},
		{name: "no-consumer-create-list", publish: without("$JS.API.CONSUMER.CREATE." + stream + ".>"), subscribe: workerSubscribe(inbox), open: true,
			call: func(ctx context.Context, e env) error {
				_, err := e.store.ListKeys(ctx, svc, "")
				return err
			}, refused: "$JS.API.CONSUMER.CREATE." + stream},
		{name: "no-consumer-create-watch", publish: without("$JS.API.CONSUMER.CREATE." + stream + ".>"), subscribe: workerSubscribe(inbox), open: true,
			call: func(ctx context.Context, e env) error {
				_, err := e.watcher.Subscribe(ctx, svc, key.KVKey)
				return err
			}, refused: "$JS.API.CONSUMER.CREATE." + stream},
		{name: "no-inbox", publish: workerPublish(bucket), subscribe: workerSubscribe("_INBOX_other"),
			call: get, refused: inbox + "."},
	}
	var users []permUser
	for _, c := range cases {
		users = append(users, permUser{name: c.name, publish: c.publish, subsribe: c.subscribe})
	}
	s := permServer(t, users...)
	_, admin := natstest.Connect(t, s, nats.UserInfo("admin", "admin"))
	_, err = admin.CreateKeyValue(context.Background(), jetstream.KeyValueConfig{Bucket: bucket, Storage: jetstream.MemoryStorage})
	require.NoError(t, err)

	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			userErrs := make(chan error, 16)
			_, js := natstest.Connect(t, s, nats.UserInfo(c.name, c.name), nats.CustomInboxPrefix(inbox),
				nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { userErrs <- err }))
			st, err := NewNATSStore(js)
			require.NoError(t, err)
			coord, err := NewCoordinator(st, nil)
			require.NoError(t, err)
			w, err := NewWatcher(st)
			require.NoError(t, err)
			defer w.Close()
			if c.open {
				_, err := st.KeyValue(context.Background(), svc)
				require.NoError(t, err)
			}
			// The deadline is far: the refusal must end the call first.
			ctx, cancel := context.WithTimeout(context.Background(), 2*rtWait)
			defer cancel()
			err = c.call(ctx, env{store: st, coord: coord, watcher: w})
			require.ErrorIs(t, err, ErrPermission)
			t.Log(err)
			assert.Contains(t, err.Error(), `"`+c.refused)
			assert.NoError(t, ctx.Err(), "the call waited for its deadline")
			userErr := recv(t, userErrs, "the violation on the user's own error handler")
			assert.ErrorIs(t, userErr, nats.ErrPermissionViolation)

			if c.name == "no-inbox" { // every later request fails at once too
				_, err := st.Create(ctx, svc, key.KVKey, []byte("v"))
				require.ErrorIs(t, err, ErrPermission)
				assert.Contains(t, err.Error(), `"`+c.refused)
			}
		})
	}
}

// TestNATSStoresShareOneErrorHandler: stores on one connection share one
// handler in front of the user's (which still sees the errors), so that a
// store per request neither lengthens the chain nor stays reachable from
// the connection.
func TestNATSStoresShareOneErrorHandler(t *testing.T) {
	t.Parallel()
	s := permServer(t, permUser{name: "limited", publish: []string{"allowed"}, subsribe: workerSubscribe("_INBOX")})
	userErrs := make(chan error, 16)
	nc, js := natstest.Connect(t, s, nats.UserInfo("limited", "limited"),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { userErrs <- err }))
	var stores []*NATSStore
	for range 3 {
		st, err := NewNATSStore(js)
		require.NoError(t, err)
		stores = append(stores, st)
	}
	assert.Same(t, stores[0].guards, stores[1].guards)
	assert.Same(t, stores[0].guards, stores[2].guards)

	require.NoError(t, nc.Publish("forbidden", nil))
	require.NoError(t, nc.Flush())
	assert.ErrorIs(t, recv(t, userErrs, "the violation on the user's handler"), nats.ErrPermissionViolation)
}

// TestPermissionNeeds: which refused subjects cancel which calls.
func TestPermissionNeeds(t *testing.T) {
	t.Parallel()
	const bucket, inbox = "JOBS_KEYS_s", "_INBOX."
	all := natsOpRead | natsOpWrite | natsOpWatch
	for _, c := range []struct {
		subject string
		kind    natsOpKind
		want    bool
	}{
		{"_INBOX.abc.*", natsOpRead, true},
		{"_INBOXES.abc.*", all, false},
		{"$KV.JOBS_KEYS_s.s.t.k", natsOpWrite, true},
		{"$KV.JOBS_KEYS_s.s.t.k", natsOpRead | natsOpWatch, false},
		{"$JS.hub.API.$KV.JOBS_KEYS_s.s.t.k", natsOpWrite, true},
		{"$KV.JOBS_KEYS_s2.s.t.k", all, false},
		{"$JS.API.STREAM.INFO.KV_JOBS_KEYS_s", natsOpWatch, true},
		{"$JS.API.STREAM.INFO.KV_JOBS_KEYS_s2", all, false},
		{"$JS.API.DIRECT.GET.KV_JOBS_KEYS_s.$KV.JOBS_KEYS_s.s.t.k", natsOpRead, true},
		{"$JS.API.DIRECT.GET.KV_JOBS_KEYS_s.$KV.JOBS_KEYS_s.s.t.k", natsOpWrite, false},
		{"$JS.hub.API.STREAM.MSG.GET.KV_JOBS_KEYS_s", natsOpRead, true},
		{"$JS.API.CONSUMER.CREATE.KV_JOBS_KEYS_s.x.$KV.JOBS_KEYS_s.>", natsOpWatch, true},
		{"$JS.API.CONSUMER.CREATE.KV_JOBS_KEYS_s.x.$KV.JOBS_KEYS_s.>", natsOpRead, false},
		{"$JS.FC.KV_JOBS_KEYS_s.a.b", natsOpWatch, true},
		{"$JS.API.STREAM.CREATE.KV_JOBS_KEYS_s", all, false},
		{"orders.new", all, false},
		// Creating a bucket: account info and the stream's create; the
		// stream's update only for its own guard.
		{"$JS.API.INFO", natsOpCreate, true},
		{"$JS.API.INFO", all | natsOpUpdateStream, false},
		{"$JS.API.STREAM.CREATE.KV_JOBS_KEYS_s", natsOpCreate, true},
		{"$JS.API.STREAM.CREATE.KV_JOBS_KEYS_s2", natsOpCreate, false},
		{"$JS.API.STREAM.UPDATE.KV_JOBS_KEYS_s", natsOpUpdateStream, true},
		{"$JS.API.STREAM.UPDATE.KV_JOBS_KEYS_s", natsOpCreate, false},
		// Subjects of the application that end like account info are not it.
		{"orders.API.INFO", natsOpCreate, false},
		{"ordersAPI.INFO", natsOpCreate, false},
	} {
		assert.Equal(t, c.want, needs(c.kind, bucket, inbox, "$JS.API.", c.subject), "%s for kind %b", c.subject, c.kind)
	}
	// Account info behind a domain or an API prefix: the call's own.
	for _, c := range []struct {
		api, subject string
		want         bool
	}{
		{"$JS.hub.API.", "$JS.hub.API.INFO", true},
		{"$JS.hub.API.", "$JS.API.INFO", false},
		{"dlc.", "dlc.INFO", true},
		{"dlc.", "$JS.API.INFO", false},
	} {
		assert.Equal(t, c.want, needs(natsOpCreate, bucket, inbox, c.api, c.subject), "%s with API prefix %s", c.subject, c.api)
	}
}
