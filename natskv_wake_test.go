package jobkeys

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jobkeys/jobkeys/internal/natstest"
)

// natsWakeGot is one wake-up a test waiter received.
type natsWakeGot struct {
	value []byte
	rev   uint64
}

// natsWakeLog is a test waiter: its fn records every wake-up, without
// blocking.
type natsWakeLog struct{ ch chan natsWakeGot }

func newNATSWakeLog() *natsWakeLog { return &natsWakeLog{ch: make(chan natsWakeGot, 64)} }

func (l *natsWakeLog) fn(value []byte, rev uint64) {
	select {
	case l.ch <- natsWakeGot{value: slices.Clone(value), rev: rev}:
	default:
		panic("test waiter's log is full")
	}
}

// TestWakeUpsPrefix: WithWakeUps validates its prefix; wake-ups are off by
// default.
func TestWakeUpsPrefix(t *testing.T) {
	t.Parallel()
	s := natstest.Run(t)
	nc, js := natstest.Connect(t, s)

	off, err := NewNATSStore(js)
	require.NoError(t, err)
	assert.False(t, off.wakeUps())
	off.publishWakes("svc", "svc.render.h", []byte("x"), 1, []string{"j"}, 1) // does nothing
	assert.Equal(t, wakeCounts{}, off.wakeCounters())
	_, err = off.subscribeWake("svc", "svc.render.h", "j", func([]byte, uint64) {})
	require.ErrorIs(t, err, ErrInvalidRequest)

	for _, good := range []string{"", "jobkeys.wake", "my-app.wake_2", "w", strings.Repeat("a", WakePrefixMaxLength)} {
		st, err := NewNATSStore(js, WithWakeUps(good))
		require.NoError(t, err, good)
		assert.True(t, st.wakeUps(), good)
	}
	st, err := NewNATSStore(js, WithWakeUps(""))
	require.NoError(t, err)
	assert.Equal(t, WakePrefixDefault+".", st.wake.Prefix())

	apiJS, err := jetstream.NewWithAPIPrefix(nc, "tenant.api")
	require.NoError(t, err)
	for _, tc := range []struct {
		prefix string
		js     jetstream.JetStream
	}{
		{"a..b", js}, {".a", js}, {"a.", js}, {".", js}, {"a*", js}, {"a.*", js}, {"a.>", js}, {">", js},
		{"a b", js}, {"a\tb", js}, {"a\nb", js}, {"$KV.x", js}, {"$JS.API", js}, {"wake!", js},
		{strings.Repeat("a", WakePrefixMaxLength+1), js},
		{"_INBOX", js}, {"_INBOX.wake", js}, // the connection's inboxes
		{"tenant", apiJS}, {"tenant.api.wake", apiJS}, // the JetStream API's subjects
	} {
		_, err := NewNATSStore(tc.js, WithWakeUps(tc.prefix))
		require.ErrorIs(t, err, ErrInvalidRequest, "prefix %q", tc.prefix)
		assert.Contains(t, err.Error(), strconv.Quote(tc.prefix), "the error names the prefix")
	}
	_, err = NewNATSStore(apiJS, WithWakeUps("tenant2.wake"))
	require.NoError(t, err)
}

// TestWakeUpsRefusedFailNoCall: a user without permission for the wake-up
// subjects reads and writes keys as before: the server's refusals of its
// wake-up subscription and publishes fail no store call, and are counted.
func TestWakeUpsRefusedFailNoCall(t *testing.T) {
	t.Parallel()
	svc := jkService("wakeperm")
	bucket := BucketPrefixDefault + "_" + svc
	const inbox = "_INBOX_wworker"
	s := permServer(t, permUser{name: "worker", publish: workerPublish(bucket), subsribe: workerSubscribe(inbox)})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, admin := natstest.Connect(t, s, nats.UserInfo("admin", "admin"))
	_, err := admin.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: bucket, Storage: jetstream.MemoryStorage})
	require.NoError(t, err)

	errc := make(chan error, 64)
	nc, js := natstest.Connect(t, s, nats.UserInfo("worker", "worker"), nats.CustomInboxPrefix(inbox),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			select {
			case errc <- err:
			default:
			}
		}))
	store, err := NewNATSStore(js, WithWakeUps(""))
	require.NoError(t, err)
	key := svc + ".render.k"

	l := newNATSWakeLog()
	stop, err := store.subscribeWake(svc, key, "j1", l.fn)
	require.NoError(t, err, "the subscription is sent without waiting for it")
	defer stop()
	rev, err := store.Create(ctx, svc, key, []byte("v1"))
	require.NoError(t, err)
	// Refusals arrive while KV calls run.
	for i := range 20 {
		store.publishWakes(svc, key, []byte("v"), rev+uint64(i), []string{"j2"}, 1)
		_, got, err := store.Get(ctx, svc, key)
		require.NoError(t, err, "get %d", i)
		rev, err = store.Update(ctx, svc, key, []byte("v2"), got)
		require.NoError(t, err, "update %d", i)
	}
	require.NoError(t, nc.Flush())
	require.Eventually(t, func() bool { return store.wakeCounters().Refused >= 21 }, rtWait, time.Millisecond,
		"the refused subscription and publishes are counted")
	_, _, err = store.Get(ctx, svc, key)
	require.NoError(t, err)
	assert.NotEmpty(t, errc, "the connection's own handler still sees the refusals")
	assert.False(t, pending(l.ch))
}

// TestWakeUpsRefusalConcernsNoCall: the server's refusal of a wake-up
// subject cancels no store call in flight, even one whose subjects the
// wake-up subject's tokens resemble (a service named after another's
// stream, a job type named like an API verb), and is counted.
func TestWakeUpsRefusalConcernsNoCall(t *testing.T) {
	t.Parallel()
	srv := natstest.Run(t)
	nc, js := natstest.Connect(t, srv)
	store, err := NewNATSStore(js, WithWakeUps(""))
	require.NoError(t, err)
	svc1 := jkService("wakeg")
	svc2 := "KV_" + store.BucketName(svc1) // a service named after svc1's stream
	require.NoError(t, validateService(svc2))
	kvKey2 := svc2 + ".CONSUMER." + strings.Repeat("a", 64)
	subject := store.wake.Subject(store.BucketName(svc2), kvKey2, "j1")
	violation := func(what, subject string) error {
		return fmt.Errorf("%w: Permissions Violation for %s %q", nats.ErrPermissionViolation, what, subject)
	}

	gctx, pg := store.guards.guard(context.Background(), natsOpRead|natsOpWatch, store.prefix, svc1)
	defer pg.done()
	store.guards.record(nc, violation("Publish to", subject))
	store.guards.record(nc, violation("Subscription to", subject))
	require.NoError(t, gctx.Err(), "a refused wake-up subject cancelled a call on another bucket")
	assert.Equal(t, uint64(2), store.wakeCounters().Refused)

	// The guard does work: a refusal of its stream's consumer creation
	// cancels it.
	store.guards.record(nc, violation("Publish to", "$JS.API.CONSUMER.CREATE.KV_"+store.BucketName(svc1)+".c"))
	require.Error(t, gctx.Err())
	var v *permissionViolation
	require.ErrorAs(t, context.Cause(gctx), &v)
}

// TestWakeUpsStoreSubject: a store sends job J's wake-up of KV key K of
// service S on "<prefix>.<bucket prefix>_S.K.T", T the unpadded base64url
// of the first 16 bytes of SHA-256(J), with the revision (8 bytes,
// big-endian) and the value as payload; a wake-up of an invalid service
// or key is dropped and counted, and nothing is sent.
func TestWakeUpsStoreSubject(t *testing.T) {
	t.Parallel()
	f := newNATSWakeFixture(t)
	a, _ := f.store(t, WithBucketPrefix("WAKE_KEYS"))
	nc, _ := natstest.Connect(t, f.srv)
	sum := sha256.Sum256([]byte("job-1"))
	subject := "jobkeys.wake.WAKE_KEYS_" + f.service + "." + f.kvKey + "." + base64.RawURLEncoding.EncodeToString(sum[:16])
	sub, err := nc.SubscribeSync("jobkeys.wake.>")
	require.NoError(t, err)
	require.NoError(t, nc.Flush())

	a.publishWakes("bad service", f.kvKey, []byte("x"), 1, []string{"job-1"}, 1)
	a.publishWakes(f.service, "not a key", []byte("x"), 1, []string{"job-1"}, 1)
	assert.Equal(t, uint64(2), a.wakeCounters().Dropped)
	a.publishWakes(f.service, f.kvKey, []byte("v"), 258, []string{"job-1"}, 1)
	m, err := sub.NextMsg(rtWait)
	require.NoError(t, err)
	assert.Equal(t, subject, m.Subject, "the first wake-up on the wire")
	assert.Equal(t, []byte{0, 0, 0, 0, 0, 0, 1, 2, 'v'}, m.Data)
	assert.Equal(t, uint64(1), a.wakeCounters().Published)
}

// TestWakeUpsRefusedPrefixClaimsNoRefusal: a wake-up prefix refused
// because it overlaps the connection's inboxes does not count the
// connection's refusals under it as refusals of wake-up subjects: the
// refusal of the inbox subscription still fails the store's calls.
func TestWakeUpsRefusedPrefixClaimsNoRefusal(t *testing.T) {
	t.Parallel()
	srv := natstest.Run(t)
	nc, js := natstest.Connect(t, srv)
	_, err := NewNATSStore(js, WithWakeUps("_INBOX"))
	require.ErrorIs(t, err, ErrInvalidRequest)
	store, err := NewNATSStore(js, WithWakeUps(""))
	require.NoError(t, err)

	store.guards.record(nc, fmt.Errorf("%w: Permissions Violation for Subscription to %q", nats.ErrPermissionViolation, nats.InboxPrefix+"abc.*"))
	assert.NotNil(t, store.guards.refusedInbox(nc), "the inbox refusal was taken for a wake-up subject's")
	assert.Zero(t, store.wakeCounters().Refused)
	_, _, err = store.Get(context.Background(), "svc", "svc.render.h")
	require.ErrorIs(t, err, ErrPermission)
}
