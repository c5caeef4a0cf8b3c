package jobsweb_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jobkeys/jobkeys"
	"github.com/jobkeys/jobkeys/internal/leakcheck"
	"github.com/jobkeys/jobkeys/internal/natstest"
	"github.com/jobkeys/jobkeys/jobs"
	"github.com/jobkeys/jobkeys/jobs/jobsweb"
)

// TestMain fails the package's test binary when its tests leave goroutines
// running (watches, streams, clients not closed).
func TestMain(m *testing.M) { leakcheck.Main(m) }

var envSeq atomic.Int64

// env is a deployment on an embedded server: a client with kind "render"
// (one job per tenant at a time, five waiting), started, whose work holds
// its slot until the test releases it, and a dashboard over it served by
// an httptest server.
type env struct {
	t       *testing.T
	client  *jobs.Client
	coord   *jobkeys.KeyCoordinator
	service string
	web     *jobsweb.Handler
	srv     *httptest.Server
	http    *http.Client // with a cookie jar, no redirects followed
	release chan struct{}
}

type renderIn struct {
	Tenant string `json:"tenant"`
	Note   string `json:"note,omitempty"`
}

// newEnv starts the deployment; change edits the dashboard's config
// before it is made (the client and coordinator are set).
func newEnv(t *testing.T, change func(*jobsweb.Config)) *env {
	t.Helper()
	n := envSeq.Add(1)
	srv := natstest.Run(t)
	_, js := natstest.Connect(t, srv)
	store, err := jobs.NewNATSStore(js, nil, jobs.WithBucket(fmt.Sprintf("JOBS_WEB%d", n)), jobs.WithCreateBucket(jetstream.MemoryStorage, 1))
	require.NoError(t, err)
	keys, err := jobkeys.NewNATSStore(js, jobkeys.WithCreateBuckets(jetstream.MemoryStorage, 1))
	require.NoError(t, err)
	coord, err := jobkeys.NewCoordinator(keys, nil)
	require.NoError(t, err)
	e := &env{t: t, coord: coord, service: fmt.Sprintf("web%d", n), release: make(chan struct{})}
	e.client, err = jobs.NewClient(store, coord, &jobs.ClientConfig{KeyStore: keys, Service: e.service, JetStream: js})
	require.NoError(t, err)
	require.NoError(t, jobs.Register(e.client, jobs.Kind[renderIn, struct{}]{
		Type:   "render",
		Policy: jobkeys.Policy{Key: []string{"tenant", "/tenant"}, MaxActive: 1, MaxQueuedPerKey: 5},
		Work: func(ctx context.Context, run *jobs.Run, in renderIn) (struct{}, error) {
			if err := run.Progress("draw", "drawing for "+in.Tenant, jobs.ProgressStarted); err != nil {
				return struct{}{}, err
			}
			select {
			case <-e.release:
				return struct{}{}, nil
			case <-ctx.Done():
				return struct{}{}, context.Cause(ctx)
			}
		},
	}))
	require.NoError(t, e.client.Start(context.Background()))
	// The client alone: the dashboard shows its coordinator's keys of its
	// service.
	cfg := &jobsweb.Config{Client: e.client}
	if change != nil {
		change(cfg)
	}
	e.web, err = jobsweb.New(cfg)
	require.NoError(t, err)
	e.srv = httptest.NewServer(e.web)
	jar, err := cookiejar.New(nil)
	require.NoError(t, err)
	e.http = &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	t.Cleanup(func() {
		e.web.Close()
		e.srv.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		assert.NoError(t, e.client.Stop(ctx))
	})
	return e
}

// enqueue enqueues a render job of tenant into channel "tenants".
func (e *env) enqueue(id, tenant string, input string) jobs.EnqueueResult {
	e.t.Helper()
	if input == "" {
		b, _ := json.Marshal(renderIn{Tenant: tenant})
		input = string(b)
	}
	res, err := e.client.Enqueue(context.Background(), jobs.EnqueueRequest{
		ID: id, ChannelID: "tenants", Type: "render", Version: 1, Origin: "test", TargetKey: id,
		IdempotencyKey: "idem-" + id, Fingerprint: "fp-" + id, Input: json.RawMessage(input),
	})
	require.NoError(e.t, err)
	return res
}

// get fetches path and returns the status and body.
func (e *env) get(path string) (int, string) {
	e.t.Helper()
	resp, err := e.http.Get(e.srv.URL + path)
	require.NoError(e.t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(e.t, err)
	return resp.StatusCode, string(b)
}

// waitFor fetches path until its body matches re: the key watch delivers
// changes asynchronously. The bound is a failure guard only.
func (e *env) waitFor(path string, re string) string {
	e.t.Helper()
	rx := regexp.MustCompile(re)
	var body string
	require.Eventually(e.t, func() bool {
		var code int
		code, body = e.get(path)
		return code == http.StatusOK && rx.MatchString(body)
	}, 20*time.Second, 20*time.Millisecond, "page %s never matched %q", path, re)
	return body
}

// state reads a job's state through the client.
func (e *env) state(id string) jobs.State {
	e.t.Helper()
	d, err := e.client.Get(context.Background(), "tenants", id)
	require.NoError(e.t, err)
	return d.Job.State
}

// waitState waits until job id is in state s (the runtime moves it).
func (e *env) waitState(id string, s jobs.State) {
	e.t.Helper()
	require.Eventually(e.t, func() bool { return e.state(id) == s }, 20*time.Second, 10*time.Millisecond, "job %s never became %s", id, s)
}

var csrfRx = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// confirm opens the confirmation page of action on job id and returns the
// form's CSRF token and revision.
func (e *env) confirm(action, id string) (csrf, rev string) {
	e.t.Helper()
	d, err := e.client.Get(context.Background(), "tenants", id)
	require.NoError(e.t, err)
	q := url.Values{"action": {action}, "channel": {"tenants"}, "id": {id}}
	code, body := e.get("/job/confirm?" + q.Encode())
	require.Equal(e.t, http.StatusOK, code, body)
	m := csrfRx.FindStringSubmatch(body)
	require.NotNil(e.t, m, "no CSRF token in the confirmation page")
	return m[1], fmt.Sprint(d.Job.Revision)
}

// post posts an action form and returns the status, Location and body.
func (e *env) post(form url.Values, header http.Header) (int, string, string) {
	e.t.Helper()
	req, err := http.NewRequest(http.MethodPost, e.srv.URL+"/job/action", strings.NewReader(form.Encode()))
	require.NoError(e.t, err)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := e.http.Do(req)
	require.NoError(e.t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(e.t, err)
	return resp.StatusCode, resp.Header.Get("Location"), string(b)
}

func actionForm(action, id, csrf, rev string) url.Values {
	return url.Values{"action": {action}, "channel": {"tenants"}, "id": {id}, "csrf": {csrf}, "revision": {rev}}
}

func newJar() (http.CookieJar, error) { return cookiejar.New(nil) }
