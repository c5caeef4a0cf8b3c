package jobs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
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

// keyBucketPublish is what README.md ("Running on NATS: permissions") says
// a worker of service needs to publish to for the key bucket, which an
// operator created (the root package's TestNATSStoreWorkerPermissions
// checks that list).
func keyBucketPublish(service string) []string {
	bucket := jobkeys.BucketPrefixDefault + "_" + service
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

// dispatchProducerPublish is what README.md ("The runtime's dispatch
// stream") says a producer of service needs to publish to for the
// dispatch stream, which exists already; dispatchWorkerPublish what a
// worker needs; dispatchCreate what creating the stream takes besides.
// Keep them and the README in step: TestDispatchPermissionList checks
// that they are enough and that each is needed.
func dispatchProducerPublish(service string) []string {
	return []string{
		dispatchSubjectPrefix + service + ".>",               // announcements, checks and their schedules
		"$JS.API.STREAM.INFO." + dispatchStreamName(service), // opening the stream
	}
}

func dispatchWorkerPublish(service string) []string {
	stream := dispatchStreamName(service)
	return append(dispatchProducerPublish(service),
		"$JS.API.CONSUMER.CREATE."+stream+".>",   // its consumers workers and checkers
		"$JS.API.CONSUMER.MSG.NEXT."+stream+".>", // pulling
		"$JS.ACK."+stream+".>",                   // ending, handing back, marking in progress
	)
}

func dispatchCreate(service string) []string {
	return []string{"$JS.API.STREAM.CREATE." + dispatchStreamName(service)}
}

// permLog keeps the errors a client logs.
type permLog struct {
	mu   sync.Mutex
	errs []error
}

func (l *permLog) Enabled(context.Context, slog.Level) bool { return true }

func (l *permLog) Handle(_ context.Context, r slog.Record) error {
	r.Attrs(func(a slog.Attr) bool {
		if err, ok := a.Value.Any().(error); ok {
			l.mu.Lock()
			l.errs = append(l.errs, fmt.Errorf("%s: %w", r.Message, err))
			l.mu.Unlock()
		}
		return true
	})
	return nil
}

func (l *permLog) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *permLog) WithGroup(string) slog.Handler      { return l }

// refusal returns the first logged error that wraps jobkeys.ErrPermission
// and names subject, or nil.
func (l *permLog) refusal(subject string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, err := range l.errs {
		if errors.Is(err, jobkeys.ErrPermission) && strings.Contains(err.Error(), `"`+subject) {
			return err
		}
	}
	return nil
}

// asyncErrs keeps the errors a connection reports asynchronously.
type asyncErrs struct {
	mu   sync.Mutex
	errs []error
}

func (a *asyncErrs) handler(_ *nats.Conn, _ *nats.Subscription, err error) {
	a.mu.Lock()
	a.errs = append(a.errs, err)
	a.mu.Unlock()
}

func (a *asyncErrs) all() []error {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.errs)
}

// TestDispatchPermissionList: a producer and a worker allowed exactly the
// subjects the README lists (the job store's, the key bucket's, and the
// dispatch stream's for a producer or for a worker), on buckets and a
// dispatch stream an operator made, enqueue and run three jobs (two on
// one key of MaxActive 1, so that a release hands the slot on) to
// completion, leave the dispatch stream empty, and see no refusal on
// either connection. Without any one of the dispatch grants something
// fails naming the refused subject:
//
//   - the stream's info: NewClient fails (ErrPermission);
//   - publishing on the dispatch subjects: a producer's Enqueue fails,
//     having written nothing (ErrPermission); a worker logs the refused
//     announcement of the next job on the key, which never runs;
//   - creating the consumers: the worker's Start fails (ErrPermission);
//   - pulling: the worker runs nothing and logs the refused pull;
//   - acknowledging: the jobs run, but the announcements stay in the
//     stream (redelivered each AckWait) and the connection reports the
//     refused acknowledgements.
//
// A producer that creates the stream needs the create grant too, and
// fails naming it without.
func TestDispatchPermissionList(t *testing.T) {
	t.Parallel()
	const inbox = "_INBOX_jobs_dispatch"
	type scenario struct {
		name             string
		service          string
		producer, worker []string // what each may publish to
		create           bool     // the producer creates the dispatch stream; else the operator did
		refusedBy        string   // "producer", "worker" or "" (every grant)
		refused          string   // the subject the failure names
	}
	var cases []scenario
	add := func(name string, create bool, producer, worker func(service string) []string, refusedBy string, refused func(service string) string) {
		service := fmt.Sprintf("dp%d", len(cases))
		sc := scenario{name: name, service: service, create: create, refusedBy: refusedBy,
			producer: producer(service), worker: worker(service)}
		if refused != nil {
			sc.refused = refused(service)
		}
		cases = append(cases, sc)
	}
	base := func(service string) []string {
		return append(jobStorePublish("JOBS_"+strings.ToUpper(service)), keyBucketPublish(service)...)
	}
	producerAll := func(service string) []string { return append(base(service), dispatchProducerPublish(service)...) }
	workerAll := func(service string) []string { return append(base(service), dispatchWorkerPublish(service)...) }
	add("all", false, producerAll, workerAll, "", nil)
	for i, p := range dispatchProducerPublish("S") {
		add("producer without "+p, false, func(service string) []string {
			return slices.Delete(producerAll(service), len(base(service))+i, len(base(service))+i+1)
		}, workerAll, "producer", func(service string) string { return strings.TrimSuffix(dispatchProducerPublish(service)[i], ">") })
	}
	for i, p := range dispatchWorkerPublish("S") {
		add("worker without "+p, false, producerAll, func(service string) []string {
			return slices.Delete(workerAll(service), len(base(service))+i, len(base(service))+i+1)
		}, "worker", func(service string) string { return strings.TrimSuffix(dispatchWorkerPublish(service)[i], ">") })
	}
	withCreate := func(service string) []string { return append(producerAll(service), dispatchCreate(service)...) }
	add("producer creating the stream", true, withCreate, workerAll, "", nil)
	add("producer creating the stream without "+dispatchCreate("S")[0], true, producerAll, workerAll, "producer",
		func(service string) string { return dispatchCreate(service)[0] })

	srv := natstest.RunWith(t, natstest.Options{Configure: func(o *server.Options) {
		o.Users = append(o.Users, &server.User{Username: "admin", Password: "admin"})
		for _, sc := range cases {
			for role, publish := range map[string][]string{"p": sc.producer, "w": sc.worker} {
				o.Users = append(o.Users, &server.User{Username: sc.service + role, Password: "pw", Permissions: &server.Permissions{
					Publish:   &server.SubjectPermission{Allow: publish},
					Subscribe: &server.SubjectPermission{Allow: []string{inbox + ".>"}},
				}})
			}
		}
	}})
	hostPort := strings.TrimPrefix(srv.ClientURL(), "nats://")
	_, adminJS := natstest.ConnectURL(t, "nats://admin:admin@"+hostPort)

	policy := jobkeys.Policy{Key: []string{"doc", "/doc"}, MaxActive: 1, MaxQueuedPerKey: 5,
		HeartbeatInterval: 100 * time.Millisecond, HeartbeatTTL: 3 * time.Second}
	for _, sc := range cases {
		t.Run(sc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			bucket := "JOBS_" + strings.ToUpper(sc.service)
			admin, err := NewNATSStore(adminJS, nil, WithBucket(bucket), WithCreateBucket(jetstream.MemoryStorage, 1))
			require.NoError(t, err)
			adminKeys, err := jobkeys.NewNATSStore(adminJS, jobkeys.WithCreateBuckets(jetstream.MemoryStorage, 1))
			require.NoError(t, err)
			_, _, err = adminKeys.Get(ctx, sc.service, "none") // creates the service's key bucket
			require.ErrorIs(t, err, jobkeys.ErrKeyNotFound)
			if !sc.create {
				// The operator's client makes the dispatch stream.
				coord, err := jobkeys.NewCoordinator(adminKeys, nil)
				require.NoError(t, err)
				_, err = NewClient(admin, coord, &ClientConfig{KeyStore: adminKeys, Service: sc.service})
				require.NoError(t, err)
			}

			// A refusal shows when a request times out: a short timeout
			// keeps the refused cases short.
			timeout := 5 * time.Second
			if sc.refused != "" {
				timeout = 2 * time.Second
			}
			type process struct {
				client *Client
				log    permLog
				async  asyncErrs
				err    error // of NewClient
			}
			ran := make(chan string, 16)
			open := func(role string) *process {
				p := &process{}
				nc, _ := natstest.ConnectURL(t, "nats://"+sc.service+role[:1]+":pw@"+hostPort, nats.CustomInboxPrefix(inbox),
					nats.ErrorHandler(p.async.handler))
				js, err := jetstream.New(nc, jetstream.WithDefaultTimeout(timeout))
				require.NoError(t, err)
				st, err := NewNATSStore(js, nil, WithBucket(bucket))
				require.NoError(t, err, "%s: the job store", role)
				keys, err := jobkeys.NewNATSStore(js)
				require.NoError(t, err, "%s: the key store", role)
				coord, err := jobkeys.NewCoordinator(keys, nil)
				require.NoError(t, err)
				p.client, p.err = NewClient(st, coord, &ClientConfig{KeyStore: keys, Service: sc.service,
					AdmitGrace: 300 * time.Millisecond, Logger: slog.New(&p.log)})
				if p.err != nil {
					return p
				}
				t.Cleanup(func() {
					sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
					defer cancel()
					assert.NoError(t, p.client.Stop(sctx))
				})
				// The producer registers the kind (Enqueue admits under
				// its policy) but never starts: its Work never runs.
				require.NoError(t, Register(p.client, Kind[json.RawMessage, json.RawMessage]{Type: "render", Policy: policy,
					Work: func(_ context.Context, run *Run, _ json.RawMessage) (json.RawMessage, error) {
						if role != "worker" {
							t.Errorf("the %s ran job %s", role, run.Job().ID)
						}
						ran <- run.Job().ID
						return json.RawMessage(`{}`), nil
					}}))
				return p
			}
			expectRefused := func(err error) {
				t.Helper()
				t.Logf("%v", err)
				require.ErrorIs(t, err, jobkeys.ErrPermission)
				assert.Contains(t, err.Error(), `"`+sc.refused)
			}

			producer := open("producer")
			if sc.refusedBy == "producer" && strings.Contains(sc.refused, "STREAM.") {
				expectRefused(producer.err)
				return
			}
			require.NoError(t, producer.err)
			jobs := []struct{ id, doc string }{{"j1", "a"}, {"j2", "a"}, {"j3", "b"}}
			for _, j := range jobs {
				req := testEnqueueRequest("ch", j.id, j.id)
				req.Type, req.Input = "render", json.RawMessage(`{"doc":"`+j.doc+`"}`)
				_, err := producer.client.Enqueue(ctx, req)
				if sc.refusedBy == "producer" {
					expectRefused(err)
					_, gerr := admin.Get(ctx, "ch", j.id)
					require.ErrorIs(t, gerr, ErrNotFound, "a refused Enqueue writes nothing")
					return
				}
				require.NoError(t, err)
			}

			worker := open("worker")
			if sc.refusedBy == "worker" && strings.Contains(sc.refused, "STREAM.") {
				expectRefused(worker.err)
				return
			}
			require.NoError(t, worker.err)
			err = worker.client.Start(ctx)
			if sc.refusedBy == "worker" && strings.Contains(sc.refused, "CONSUMER.CREATE.") {
				expectRefused(err)
				return
			}
			require.NoError(t, err)

			guard := time.After(time.Minute) // a failure guard, never a timing
			completed := func() (done []string) {
				for _, j := range jobs {
					if d, err := admin.Get(ctx, "ch", j.id); err == nil && d.Job.State == StateCompleted {
						done = append(done, j.id)
					}
				}
				return done
			}
			switch {
			case sc.refusedBy == "worker" && !strings.HasPrefix(sc.refused, "$JS.ACK."):
				// The refusal is logged; what needs the refused grant
				// does not happen.
				for worker.log.refusal(sc.refused) == nil {
					select {
					case <-guard:
						t.Fatalf("no logged refusal of %q; logged %v", sc.refused, worker.log.errs)
					case <-time.After(20 * time.Millisecond):
					}
				}
				expectRefused(worker.log.refusal(sc.refused))
				assert.NotContains(t, completed(), "j2", "j2 runs only once something announces it")
			default:
				for len(completed()) < len(jobs) {
					select {
					case <-guard:
						t.Fatalf("completed %v of %v", completed(), jobs)
					case id := <-ran:
						t.Logf("ran %s", id)
					case <-time.After(20 * time.Millisecond):
					}
				}
				stream, err := adminJS.Stream(ctx, dispatchStreamName(sc.service))
				require.NoError(t, err)
				if sc.refusedBy == "" {
					// Every announcement and check is ended, once the
					// checks' schedules fired.
					for {
						info, err := stream.Info(ctx)
						require.NoError(t, err)
						if info.State.Msgs == 0 {
							break
						}
						select {
						case <-guard:
							t.Fatalf("the dispatch stream still holds %d messages", info.State.Msgs)
						case <-time.After(50 * time.Millisecond):
						}
					}
					assert.Empty(t, producer.async.all(), "the producer's connection reports errors")
					assert.Empty(t, worker.async.all(), "the worker's connection reports errors")
					return
				}
				// Without the acknowledgements: the stream keeps them,
				// and the connection says why.
				info, err := stream.Info(ctx)
				require.NoError(t, err)
				assert.Positive(t, info.State.Msgs, "announcements never acknowledged are still in the stream")
				for {
					i := slices.IndexFunc(worker.async.all(), func(err error) bool {
						return errors.Is(err, nats.ErrPermissionViolation) && strings.Contains(err.Error(), `"`+sc.refused)
					})
					if i >= 0 {
						t.Logf("%v", worker.async.all()[i])
						break
					}
					select {
					case <-guard:
						t.Fatalf("the worker's connection did not report the refused acknowledgements: %v", worker.async.all())
					case <-time.After(20 * time.Millisecond):
					}
				}
			}
		})
	}
}
