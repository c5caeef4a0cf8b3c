package jobkeys

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jobkeys/jobkeys/internal/natstest"
)

// TestNATSStoreCreateBucketPermissions: WithCreateBuckets under users
// allowed less. Creating needs account info and the stream's create; a
// refusal of either fails the call at once with ErrPermission naming the
// subject (both used to wait for the caller's deadline: the call's guard
// did not know those subjects). Allowing atomic publish needs the stream's
// update; without it the bucket works, one state per round trip (it used
// to wait for the caller's deadline too, and fail).
func TestNATSStoreCreateBucketPermissions(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name    string
		extra   func(stream string) []string
		refused string // the subject a refusal names; "" works
		batches bool
	}{
		{"create and update", func(st string) []string {
			return []string{"$JS.API.INFO", "$JS.API.STREAM.CREATE." + st, "$JS.API.STREAM.UPDATE." + st}
		}, "", true},
		{"no stream update", func(st string) []string { return []string{"$JS.API.INFO", "$JS.API.STREAM.CREATE." + st} }, "", false},
		{"no account info", func(st string) []string { return []string{"$JS.API.STREAM.CREATE." + st} }, "$JS.API.INFO", false},
		{"no stream create", func(string) []string { return []string{"$JS.API.INFO"} }, "$JS.API.STREAM.CREATE.", false},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			svc := jkService("permcreate" + string(rune('a'+i)))
			bucket := BucketPrefixDefault + "_" + svc
			const inbox = "_INBOX_creator"
			publish := append(workerPublish(bucket), tc.extra("KV_"+bucket)...)
			s := permServer(t, permUser{name: "creator", publish: publish, subsribe: workerSubscribe(inbox)})
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()

			_, js := natstest.Connect(t, s, nats.UserInfo("creator", "creator"), nats.CustomInboxPrefix(inbox),
				nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
			store, err := NewNATSStore(js, WithCreateBuckets(jetstream.MemoryStorage, 1))
			require.NoError(t, err)
			coord, err := NewCoordinator(store, &Config{InstanceID: "creator-1"})
			require.NoError(t, err)
			policy := Policy{Key: []string{"/tenant"}, MaxActive: 1, MaxQueuedPerKey: 2}
			adm, err := coord.Admit(ctx, AdmitRequest{Service: svc, JobType: "render", JobID: "j1", Payload: []byte(`{"tenant":"acme"}`), Policy: policy})
			require.NoError(t, ctx.Err(), "the call waited for the caller's deadline")
			if tc.refused != "" {
				require.ErrorIs(t, err, ErrPermission)
				assert.Contains(t, err.Error(), tc.refused)
				return
			}
			require.NoError(t, err, "admit on a bucket the user created")
			assert.Equal(t, KindAccepted, adm.Kind)

			_, admin := natstest.Connect(t, s, nats.UserInfo("admin", "admin"))
			st, err := admin.Stream(ctx, "KV_"+bucket)
			require.NoError(t, err)
			assert.Equal(t, tc.batches, st.CachedInfo().Config.AllowAtomicPublish, "atomic publish on the created stream")
			b, err := store.bucket(ctx, svc)
			require.NoError(t, err)
			assert.Equal(t, tc.batches, b.batches.Load(), "the store batches where the stream allows it")
		})
	}
}
