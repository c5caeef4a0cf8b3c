package jobs

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jobkeys/jobkeys"
	"github.com/jobkeys/jobkeys/internal/natstest"
)

// jobStorePublish is what README.md ("The job store", the paragraph on the
// job store's user) says a user of a NATSStore over bucket must be allowed
// to publish to, and jobStoreSubscribe what it must be allowed to
// subscribe to, for inboxes under the prefix inbox. Keep them and the
// README in step: TestNATSStorePermissionList checks that they are enough
// and that each is needed.
func jobStorePublish(bucket string) []string {
	stream := "KV_" + bucket
	return []string{
		"$KV." + bucket + ".>",                // records and enqueue batches
		"$JS.API.STREAM.INFO." + stream,       // opening the bucket; listing a channel's keys
		"$JS.API.DIRECT.GET." + stream,        // batched reads
		"$JS.API.DIRECT.GET." + stream + ".>", // single reads
		"$JS.API.STREAM.MSG.GET." + stream,    // reads through the stream leader
		"$JS.API.STREAM.PURGE." + stream,      // a finished job's active entry; DeleteChannel
	}
}

func jobStoreSubscribe(inbox string) []string { return []string{inbox + ".>"} }

// jobStoreCreate is what the README says WithCreateBucket needs besides
// jobStorePublish, on a bucket that does not exist yet.
func jobStoreCreate(bucket string) []string {
	stream := "KV_" + bucket
	return []string{
		"$JS.API.INFO",                    // the account's limits, which nats.go reads first
		"$JS.API.STREAM.CREATE." + stream, // creating it
		"$JS.API.STREAM.UPDATE." + stream, // allowing atomic publish on it
	}
}

// permListStep is one step of the job store's lifecycle as
// TestNATSStorePermissionList runs it.
type permListStep struct {
	name string
	run  func(ctx context.Context, l *permLifecycle) error
}

// permLifecycle is the state the lifecycle's steps share.
type permLifecycle struct {
	js     jetstream.JetStream
	bucket string
	create bool // open with WithCreateBucket
	clock  *fixedClock
	store  *NATSStore
	claims map[string]Claim // by job id
	revs   map[string]uint64
}

// claimOne claims one job and remembers its claim.
func (l *permLifecycle) claimOne(ctx context.Context, want string) error {
	got, err := l.store.Claim(ctx, ClaimRequest{Owner: "w1", Count: 1, TTL: time.Minute})
	if err != nil {
		return err
	}
	if len(got) != 1 || got[0].ID != want {
		return fmt.Errorf("claim: got %v, want job %s", got, want)
	}
	l.claims[want] = ClaimOf(got[0])
	l.revs[want] = got[0].Revision
	return nil
}

// enqueue enqueues job id of target.
func (l *permLifecycle) enqueue(ctx context.Context, id, target string) error {
	out, err := l.store.Enqueue(ctx, testEnqueueRequest("ch", id, target))
	if err != nil {
		return err
	}
	l.revs[id] = out.Job.Revision
	return nil
}

// permListSteps is the job store's whole lifecycle: enqueue (and its
// replay), claim, renew, progress, settle with an artifact, fail, requeue
// and retry, pause, resume, cancel, supersede (by an enqueue and by a
// call), reclaim of an expired claim, a runtime reconciliation pass,
// listing, reading and deleting the channel.
func permListSteps() []permListStep {
	return []permListStep{
		{"open", func(ctx context.Context, l *permLifecycle) error {
			opts := []NATSStoreOption{WithBucket(l.bucket)}
			if l.create {
				opts = append(opts, WithCreateBucket(jetstream.MemoryStorage, 1))
			}
			st, err := NewNATSStore(l.js, &Config{Now: l.clock.Now}, opts...)
			l.store = st
			return err
		}},
		{"enqueue", func(ctx context.Context, l *permLifecycle) error { return l.enqueue(ctx, "j1", "doc-1") }},
		{"enqueue replay", func(ctx context.Context, l *permLifecycle) error {
			out, err := l.store.Enqueue(ctx, testEnqueueRequest("ch", "j1", "doc-1"))
			if err == nil && !out.Repeated {
				err = fmt.Errorf("replay not repeated: %+v", out)
			}
			return err
		}},
		{"claim", func(ctx context.Context, l *permLifecycle) error { return l.claimOne(ctx, "j1") }},
		{"renew", func(ctx context.Context, l *permLifecycle) error {
			j, err := l.store.Renew(ctx, RenewRequest{Claim: l.claims["j1"], ExpectedRevision: l.revs["j1"], TTL: 2 * time.Minute})
			l.revs["j1"] = j.Revision
			return err
		}},
		{"progress", func(ctx context.Context, l *permLifecycle) error {
			_, err := l.store.AppendProgress(ctx, ProgressRequest{Claim: l.claims["j1"], Stage: "render", Label: "Rendering", State: ProgressStarted})
			return err
		}},
		{"settle", func(ctx context.Context, l *permLifecycle) error {
			_, err := l.store.Settle(ctx, SettleRequest{Claim: l.claims["j1"], Artifact: json.RawMessage(`{"pages":3}`)})
			return err
		}},
		{"fail", func(ctx context.Context, l *permLifecycle) error {
			if err := l.enqueue(ctx, "j2", "doc-2"); err != nil {
				return err
			}
			if err := l.claimOne(ctx, "j2"); err != nil {
				return err
			}
			_, err := l.store.Fail(ctx, FailRequest{Claim: l.claims["j2"], Reason: "broken"})
			return err
		}},
		{"requeue and retry", func(ctx context.Context, l *permLifecycle) error {
			if err := l.enqueue(ctx, "j3", "doc-3"); err != nil {
				return err
			}
			if err := l.claimOne(ctx, "j3"); err != nil {
				return err
			}
			if _, err := l.store.Requeue(ctx, RequeueRequest{Claim: l.claims["j3"], AvailableAt: l.clock.Now().Add(time.Second),
				Reason: "flaky", CountFailure: true}); err != nil {
				return err
			}
			l.clock.Advance(2 * time.Second)
			if err := l.claimOne(ctx, "j3"); err != nil {
				return err
			}
			_, err := l.store.Settle(ctx, SettleRequest{Claim: l.claims["j3"], Artifact: json.RawMessage(`{}`)})
			return err
		}},
		{"pause, resume, cancel", func(ctx context.Context, l *permLifecycle) error {
			if err := l.enqueue(ctx, "j4", "doc-4"); err != nil {
				return err
			}
			j, err := l.store.Pause(ctx, PauseRequest{ChannelID: "ch", JobID: "j4", ExpectedRevision: l.revs["j4"], Reason: "hold"})
			if err != nil {
				return err
			}
			if j, err = l.store.Resume(ctx, ResumeRequest{ChannelID: "ch", JobID: "j4", ExpectedRevision: j.Revision}); err != nil {
				return err
			}
			_, err = l.store.Cancel(ctx, CancelRequest{ChannelID: "ch", JobID: "j4"})
			return err
		}},
		{"supersede", func(ctx context.Context, l *permLifecycle) error {
			if err := l.enqueue(ctx, "j5", "doc-5"); err != nil {
				return err
			}
			if err := l.enqueue(ctx, "j6", "doc-5"); err != nil { // supersedes j5
				return err
			}
			_, err := l.store.Supersede(ctx, SupersedeRequest{ChannelID: "ch", JobID: "j6", ExpectedRevision: l.revs["j6"], Reason: "obsolete"})
			return err
		}},
		{"reclaim", func(ctx context.Context, l *permLifecycle) error {
			if err := l.enqueue(ctx, "j7", "doc-7"); err != nil {
				return err
			}
			if err := l.claimOne(ctx, "j7"); err != nil {
				return err
			}
			l.clock.Advance(2 * time.Minute) // the claim expires
			if err := l.claimOne(ctx, "j7"); err != nil {
				return err
			}
			_, err := l.store.Settle(ctx, SettleRequest{Claim: l.claims["j7"], Artifact: json.RawMessage(`{}`)})
			return err
		}},
		{"reconcile", func(ctx context.Context, l *permLifecycle) error {
			// The runtime's pass over a key whose queue holds a job
			// cancelled in the store alone: it reads the job through
			// the store and removes the entry. The key layer's store
			// is not the one under test.
			keys := jobkeys.NewMemoryStore()
			coord, err := jobkeys.NewCoordinator(keys, nil)
			if err != nil {
				return err
			}
			c, err := NewClient(l.store, coord, &ClientConfig{KeyStore: keys, Now: l.clock.Now})
			if err != nil {
				return err
			}
			if err := Register(c, Kind[json.RawMessage, json.RawMessage]{Type: "render",
				Policy: jobkeys.Policy{Key: []string{"doc"}, MaxActive: 1, MaxQueuedPerKey: 5},
				Work:   func(context.Context, *Run, json.RawMessage) (json.RawMessage, error) { return nil, nil }}); err != nil {
				return err
			}
			if _, err := c.Enqueue(ctx, testEnqueueRequest("ch", "j8", "doc-8")); err != nil {
				return err
			}
			if _, err := l.store.Cancel(ctx, CancelRequest{ChannelID: "ch", JobID: "j8"}); err != nil {
				return err
			}
			rep, err := c.Reconcile(ctx)
			if err == nil && rep.QueueEntriesRemoved != 1 {
				err = fmt.Errorf("reconcile removed %d queue entries, want 1", rep.QueueEntriesRemoved)
			}
			return err
		}},
		{"list", func(ctx context.Context, l *permLifecycle) error {
			page, err := l.store.List(ctx, ListRequest{ChannelID: "ch", Limit: 100})
			if err == nil && len(page.Jobs) != 8 {
				err = fmt.Errorf("listed %d jobs, want 8", len(page.Jobs))
			}
			return err
		}},
		{"get", func(ctx context.Context, l *permLifecycle) error {
			d, err := l.store.Get(ctx, "ch", "j1")
			if err == nil && (d.Job.State != StateCompleted || d.Artifact == nil) {
				err = fmt.Errorf("got %s job, artifact %v", d.Job.State, d.Artifact)
			}
			return err
		}},
		{"delete channel", func(ctx context.Context, l *permLifecycle) error {
			return l.store.DeleteChannel(ctx, "ch")
		}},
	}
}

// TestNATSStorePermissionList: a user allowed exactly the subjects the
// README lists for the job store (jobStorePublish, jobStoreSubscribe), on
// a bucket an operator created, runs the store's whole lifecycle with no
// error and no refusal on its connection, and its background purges leave
// only the active jobs in the active index. A user without any one of
// them fails some step with an error wrapping jobkeys.ErrPermission that
// names the refused subject.
func TestNATSStorePermissionList(t *testing.T) {
	t.Parallel()
	const inbox = "_INBOX_jobs_worker"
	type user struct {
		name               string
		bucket             string
		publish, subscribe []string
		create             bool   // the user creates the bucket (WithCreateBucket); else the operator does
		refused            string // what the error must name; "" for the users with every permission
	}
	var users []user
	add := func(name string, create bool, publish func(bucket string) []string, subscribe []string, refused func(bucket string) string) {
		bucket := fmt.Sprintf("JOBS_PL%d", len(users))
		users = append(users, user{name: name, bucket: bucket, publish: publish(bucket), subscribe: subscribe, create: create, refused: refused(bucket)})
	}
	none := func(string) string { return "" }
	add("all", false, jobStorePublish, jobStoreSubscribe(inbox), none)
	for i, p := range jobStorePublish("BUCKET") {
		add("no "+p, false, func(bucket string) []string { return slices.Delete(jobStorePublish(bucket), i, i+1) }, jobStoreSubscribe(inbox),
			func(bucket string) string { return strings.TrimSuffix(jobStorePublish(bucket)[i], ".>") })
	}
	add("no inbox", false, jobStorePublish, jobStoreSubscribe("_INBOX_other"), func(string) string { return inbox + "." })
	withCreate := func(bucket string) []string { return append(jobStorePublish(bucket), jobStoreCreate(bucket)...) }
	add("create", true, withCreate, jobStoreSubscribe(inbox), none)
	for i, p := range jobStoreCreate("BUCKET") {
		add("create, no "+p, true, func(bucket string) []string {
			return slices.Delete(withCreate(bucket), len(jobStorePublish(bucket))+i, len(jobStorePublish(bucket))+i+1)
		},
			jobStoreSubscribe(inbox), func(bucket string) string { return jobStoreCreate(bucket)[i] })
	}

	srv := natstest.RunWith(t, natstest.Options{Configure: func(o *server.Options) {
		o.Users = append(o.Users, &server.User{Username: "admin", Password: "admin"})
		for _, u := range users {
			o.Users = append(o.Users, &server.User{Username: u.bucket, Password: u.bucket, Permissions: &server.Permissions{
				Publish:   &server.SubjectPermission{Allow: u.publish},
				Subscribe: &server.SubjectPermission{Allow: u.subscribe},
			}})
		}
	}})
	hostPort := strings.TrimPrefix(srv.ClientURL(), "nats://")
	_, adminJS := natstest.ConnectURL(t, "nats://admin:admin@"+hostPort)

	for _, u := range users {
		t.Run(u.name, func(t *testing.T) {
			t.Parallel()
			if !u.create {
				_, err := NewNATSStore(adminJS, nil, WithBucket(u.bucket), WithCreateBucket(jetstream.MemoryStorage, 1))
				require.NoError(t, err)
			}
			userErrs := make(chan error, 64)
			// A refusal shows when a request times out: a short store
			// timeout keeps the refused cases short. The user with every
			// permission keeps the default, for a loaded machine.
			timeout := 5 * time.Second
			if u.refused != "" {
				timeout = 2 * time.Second
			}
			nc, _ := natstest.ConnectURL(t, "nats://"+u.bucket+":"+u.bucket+"@"+hostPort, nats.CustomInboxPrefix(inbox),
				nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
					select {
					case userErrs <- err:
					default:
					}
				}))
			js, err := jetstream.New(nc, jetstream.WithDefaultTimeout(timeout))
			require.NoError(t, err)
			l := &permLifecycle{js: js, bucket: u.bucket, create: u.create, clock: newFixedClock(), claims: map[string]Claim{}, revs: map[string]uint64{}}
			// No deadline of the caller's: each request ends at the
			// store's own timeout.
			ctx := context.Background()
			var failed string
			steps := permListSteps()
			for i, step := range steps {
				if i == len(steps)-1 && failed == "" {
					// Before the channel goes: the background purges
					// of the finished jobs' active entries.
					cctx, cancel := context.WithTimeout(ctx, time.Minute)
					require.NoError(t, l.store.Close(cctx), "waiting for the purges' answers")
					cancel()
					if u.refused == "" {
						assert.Zero(t, l.store.purges.refused.Load()+l.store.purges.failed.Load(), "purges refused or failed")
						admin, err := NewNATSStore(adminJS, nil, WithBucket(u.bucket))
						require.NoError(t, err)
						entries, _, err := admin.listActive(ctx, "list", "ch", nil)
						require.NoError(t, err)
						assert.Empty(t, entries, "every job is finished: the active index is empty")
					}
					if strings.Contains(u.refused, ".STREAM.PURGE.") {
						assert.Positive(t, l.store.purges.refused.Load(), "the refused purges are counted")
					}
				}
				if err = step.run(ctx, l); err != nil {
					failed = step.name
					break
				}
			}
			if u.refused == "" {
				require.NoError(t, err, "step %q", failed)
				assert.Empty(t, userErrs, "errors reported on the connection")
				return
			}
			t.Logf("step %q: %v", failed, err)
			require.ErrorIs(t, err, jobkeys.ErrPermission, "step %q", failed)
			assert.Contains(t, err.Error(), `"`+u.refused, "step %q", failed)
		})
	}
}
