package jobsweb_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jobkeys/jobkeys"
	"github.com/jobkeys/jobkeys/jobs"
	"github.com/jobkeys/jobkeys/jobs/jobsweb"
)

// Every page renders what the deployment holds: a key at its limit with
// its holder and a waiting job, the jobs of the channel, one job with its
// input and progress, the confirmation of an action.
func TestPages(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	e.enqueue("run-1", "acme", "")
	e.waitState("run-1", jobs.StateRunning)
	e.enqueue("wait-1", "acme", "")

	// Keys: acme is at its limit, run-1 holds it, one job waits.
	body := e.waitFor("/keys", `<span class="waiting">1/5</span>`)
	assert.Contains(t, body, `data-status="limit"`)
	assert.Contains(t, body, `<span class="running">1/1</span>`)
	assert.Regexp(t, `href="/job\?channel=tenants&amp;id=run-1" title="tenants/run-1">run-1</a>`, body)
	assert.Contains(t, body, "at its limit: 1 of 1 slots held; 1 waiting for a slot")

	// Overview: the type's running and waiting jobs, the key at its limit.
	code, body := e.get("/")
	require.Equal(t, http.StatusOK, code, body)
	assert.Regexp(t, `(?s)<a href="/keys\?type=render">render</a></td>\s*<td class="num">1</td><td class="num">1</td>`, body)
	assert.Contains(t, body, "Keys at their limit")
	assert.Regexp(t, `<a href="/keys\?q=[^"]+">tenant:acme</a>`, body)

	// Jobs: both, newest first.
	code, body = e.get("/jobs?channel=tenants")
	require.Equal(t, http.StatusOK, code, body)
	assert.Regexp(t, `(?s)wait-1.*run-1`, body)
	assert.Contains(t, body, `state-running`)
	assert.Contains(t, body, `data-gap="5000"`, "a jobs page follows changes at most every 5 s")
	// Filtered by state.
	code, body = e.get("/jobs?channel=tenants&state=pending")
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, "wait-1")
	assert.NotContains(t, body, ">run-1<")
	// A search by id goes to the job.
	resp, err := e.http.Get(e.srv.URL + "/jobs?channel=tenants&id=run-1")
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusSeeOther, resp.StatusCode)
	assert.Equal(t, "/job?channel=tenants&id=run-1", resp.Header.Get("Location"))

	// Job: input, progress of attempt 1 (which its work writes once it
	// runs), its place on the key, its actions.
	body = e.waitFor("/job?channel=tenants&id=run-1", "drawing for acme")
	assert.Contains(t, body, "&#34;tenant&#34;: &#34;acme&#34;")
	assert.Contains(t, body, "Attempt 1")
	assert.Contains(t, body, "this job holds a slot")
	assert.Contains(t, body, "action=pause")
	assert.Contains(t, body, "action=cancel")
	code, body = e.get("/job?channel=tenants&id=wait-1")
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, "this job waits for a slot: 1 of 1 in the queue")

	// Confirmation: a POST form with the token and the job's revision.
	code, body = e.get("/job/confirm?action=cancel&channel=tenants&id=wait-1")
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, `<form method="post" action="/job/action"`)
	assert.Contains(t, body, "This is final")
	assert.Regexp(t, `name="csrf" value="[A-Za-z0-9_-]{20,}"`, body)

	// Downloads serve the raw input as an attachment.
	resp, err = e.http.Get(e.srv.URL + "/job/input?channel=tenants&id=run-1")
	require.NoError(t, err)
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.JSONEq(t, `{"tenant":"acme"}`, string(raw))
	assert.Contains(t, resp.Header.Get("Content-Disposition"), "attachment")

	// A job that does not exist, a bad state: errors that say so.
	code, body = e.get("/job?channel=tenants&id=nope")
	assert.Equal(t, http.StatusNotFound, code)
	assert.Contains(t, body, "job &#34;nope&#34; of channel &#34;tenants&#34;")
	code, _ = e.get("/jobs?channel=tenants&state=sleeping")
	assert.Equal(t, http.StatusBadRequest, code)
	code, _ = e.get("/job/artifact?channel=tenants&id=run-1")
	assert.Equal(t, http.StatusNotFound, code)
	close(e.release)
}

// Each action runs through the client from its confirmation page, and
// sends the browser back to the job, which shows its new state.
func TestActions(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	e.enqueue("holder", "acme", "")
	e.waitState("holder", jobs.StateRunning)
	e.enqueue("w1", "acme", "")
	e.enqueue("w2", "acme", "")

	// Pause a waiting job, then resume it.
	csrf, rev := e.confirm("pause", "w1")
	code, loc, body := e.post(actionForm("pause", "w1", csrf, rev), nil)
	require.Equal(t, http.StatusSeeOther, code, body)
	assert.Equal(t, "/job?channel=tenants&id=w1&done=pause", loc)
	assert.Equal(t, jobs.StatePaused, e.state("w1"))
	_, body = e.get(loc)
	assert.Contains(t, body, "Done: pause. The job is now paused.")
	assert.Contains(t, body, "action=resume")

	csrf, rev = e.confirm("resume", "w1")
	code, _, body = e.post(actionForm("resume", "w1", csrf, rev), nil)
	require.Equal(t, http.StatusSeeOther, code, body)
	assert.Equal(t, jobs.StatePending, e.state("w1"))

	// A revision the job has moved past is a conflict, and changes nothing.
	code, _, body = e.post(actionForm("pause", "w1", csrf, rev), nil)
	assert.Equal(t, http.StatusConflict, code)
	assert.Contains(t, body, "pause job &#34;w1&#34;")
	assert.Contains(t, body, "look at it again")
	assert.Equal(t, jobs.StatePending, e.state("w1"))

	// Cancel a waiting job: final, and its queue entry goes at once.
	csrf, rev = e.confirm("cancel", "w2")
	code, _, body = e.post(actionForm("cancel", "w2", csrf, rev), nil)
	require.Equal(t, http.StatusSeeOther, code, body)
	assert.Equal(t, jobs.StateCancelled, e.state("w2"))
	e.waitFor("/job?channel=tenants&id=w1", `this job waits for a slot: 1 of 1 in the queue`)

	// Cancel the running job: its handler's context ends.
	csrf, rev = e.confirm("cancel", "holder")
	code, _, body = e.post(actionForm("cancel", "holder", csrf, rev), nil)
	require.Equal(t, http.StatusSeeOther, code, body)
	assert.Equal(t, jobs.StateCancelled, e.state("holder"))

	// Retry a cancelled job: a new job of the same input, whose page the
	// browser goes to, saying what it retries.
	csrf, rev = e.confirm("retry", "w2")
	code, loc, body = e.post(actionForm("retry", "w2", csrf, rev), nil)
	require.Equal(t, http.StatusSeeOther, code, body)
	u, err := url.Parse(loc)
	require.NoError(t, err)
	newID := u.Query().Get("id")
	require.NotEqual(t, "w2", newID)
	d, err := e.client.Get(context.Background(), "tenants", newID)
	require.NoError(t, err)
	assert.Equal(t, jobs.RetryOriginPrefix+"w2", d.Job.Origin)
	_, body = e.get(loc)
	assert.Contains(t, body, "Done: retry. This is the new job")
	assert.Contains(t, body, `a retry of</span> <a href="/job?channel=tenants&amp;id=w2">w2</a>`)
	// A job that is not over has nothing to retry.
	csrf, rev = e.confirm("retry", "w1")
	code, _, body = e.post(actionForm("retry", "w1", csrf, rev), nil)
	assert.Equal(t, http.StatusConflict, code)
	assert.Contains(t, body, "only a failed, cancelled or superseded job runs again")
	close(e.release)
}

// A read-only dashboard shows no actions and refuses them, with a valid
// token too; nothing changes.
func TestReadOnly(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *jobsweb.Config) { c.ReadOnly = true })
	e.enqueue("j1", "acme", "")
	code, body := e.get("/job?channel=tenants&id=j1")
	require.Equal(t, http.StatusOK, code, body)
	assert.NotContains(t, body, "/job/confirm")
	assert.Contains(t, body, "read-only")

	const refused = "the dashboard is read-only: actions are turned off"
	code, body = e.get("/job/confirm?action=cancel&channel=tenants&id=j1")
	assert.Equal(t, http.StatusForbidden, code)
	assert.Contains(t, body, refused)
	for _, a := range []string{"cancel", "pause", "resume", "retry"} {
		code, _, body = e.post(actionForm(a, "j1", "token", "1"), nil)
		assert.Equal(t, http.StatusForbidden, code, a)
		assert.Contains(t, body, refused, a)
	}
	assert.True(t, e.state("j1").Active())
	assert.NotEqual(t, jobs.StatePaused, e.state("j1"))
	close(e.release)
}

// An action without the form's token, with another browser's token, or
// from another origin is refused, and changes nothing.
func TestCSRF(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	e.enqueue("j1", "acme", "")
	csrf, rev := e.confirm("cancel", "j1")

	code, _, body := e.post(actionForm("cancel", "j1", "", rev), nil)
	assert.Equal(t, http.StatusForbidden, code)
	assert.Contains(t, body, "no CSRF token")

	// A token made for another browser's cookie.
	other := newBrowser(t, e)
	otherToken, _ := other.confirm("cancel", "j1")
	require.NotEqual(t, csrf, otherToken)
	code, _, body = e.post(actionForm("cancel", "j1", otherToken, rev), nil)
	assert.Equal(t, http.StatusForbidden, code)
	assert.Contains(t, body, "does not match")

	// The right token, from a cross-site page.
	code, _, _ = e.post(actionForm("cancel", "j1", csrf, rev), http.Header{"Sec-Fetch-Site": {"cross-site"}})
	assert.Equal(t, http.StatusForbidden, code)
	code, _, _ = e.post(actionForm("cancel", "j1", csrf, rev), http.Header{"Origin": {"https://evil.example"}})
	assert.Equal(t, http.StatusForbidden, code)

	// A GET does not act.
	code, _ = e.get("/job/action?" + actionForm("cancel", "j1", csrf, rev).Encode())
	assert.Equal(t, http.StatusMethodNotAllowed, code)

	assert.True(t, e.state("j1").Active(), "a refused action changed the job")
	// And the right token from the same browser works.
	code, _, body = e.post(actionForm("cancel", "j1", csrf, rev), nil)
	assert.Equal(t, http.StatusSeeOther, code, body)
	assert.Equal(t, jobs.StateCancelled, e.state("j1"))
	close(e.release)
}

// newBrowser is another cookie jar on e's server.
func newBrowser(t *testing.T, e *env) *env {
	other := *e
	jar, err := newJar()
	require.NoError(t, err)
	other.http = &http.Client{Jar: jar, CheckRedirect: e.http.CheckRedirect}
	return &other
}

// The authorization hook sees every request with its action; its error
// refuses the request with its message.
func TestAuthorize(t *testing.T) {
	t.Parallel()
	errNope := errors.New("operators only")
	e := newEnv(t, func(c *jobsweb.Config) {
		c.Authorize = func(r *http.Request, a jobsweb.Action) error {
			if a == jobsweb.ActionView && r.Header.Get("X-User") == "" {
				return errNope
			}
			if a == jobsweb.ActionCancel && r.Header.Get("X-User") != "admin" {
				return errNope
			}
			return nil
		}
	})
	e.enqueue("j1", "acme", "")
	code, body := e.get("/")
	assert.Equal(t, http.StatusForbidden, code)
	assert.Contains(t, body, "not authorized to view: operators only")

	viewer := newBrowser(t, e)
	viewer.http.Transport = headerTransport{"X-User": "viewer"}
	code, body = viewer.get("/job/confirm?action=cancel&channel=tenants&id=j1")
	assert.Equal(t, http.StatusForbidden, code)
	assert.Contains(t, body, "not authorized to cancel")
	// Pause is allowed to a viewer: the hook decides per action.
	csrf, rev := viewer.confirm("pause", "j1")
	code, _, _ = viewer.post(actionForm("cancel", "j1", csrf, rev), nil)
	assert.Equal(t, http.StatusForbidden, code)
	assert.True(t, e.state("j1").Active())

	admin := newBrowser(t, e)
	admin.http.Transport = headerTransport{"X-User": "admin"}
	csrf, rev = admin.confirm("cancel", "j1")
	code, _, body = admin.post(actionForm("cancel", "j1", csrf, rev), nil)
	assert.Equal(t, http.StatusSeeOther, code, body)
	assert.Equal(t, jobs.StateCancelled, e.state("j1"))
	close(e.release)
}

type headerTransport map[string]string

func (h headerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	for k, v := range h {
		r.Header.Set(k, v)
	}
	return http.DefaultTransport.RoundTrip(r)
}

// A hostile input, reason and progress label are shown as text, never as
// markup; a large input is cut with a link to all of it.
func TestEscapingAndTruncation(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *jobsweb.Config) { c.FieldLimit = 200 })
	const hostile = `<script>alert(1)</script>`
	e.enqueue("evil", "acme", `{"tenant":"acme","note":"`+hostile+`"}`)
	big := strings.Repeat("x", 500)
	e.enqueue("big", "globex", `{"tenant":"globex","note":"`+big+`"}`)

	code, body := e.get("/job?channel=tenants&id=evil")
	require.Equal(t, http.StatusOK, code, body)
	assert.NotContains(t, body, hostile)
	assert.Contains(t, body, "&lt;script&gt;alert(1)&lt;/script&gt;")
	assert.Equal(t, "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
		headerOf(t, e, "/job?channel=tenants&id=evil", "Content-Security-Policy"))

	code, body = e.get("/job?channel=tenants&id=big")
	require.Equal(t, http.StatusOK, code, body)
	assert.NotContains(t, body, big)
	assert.Regexp(t, `Cut at \d+ of \d+ bytes\. <a href="/job/input\?channel=tenants&amp;id=big" download>`, body)
	resp, err := e.http.Get(e.srv.URL + "/job/input?channel=tenants&id=big")
	require.NoError(t, err)
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Contains(t, string(raw), big)
	close(e.release)
}

func headerOf(t *testing.T, e *env, path, name string) string {
	t.Helper()
	resp, err := e.http.Get(e.srv.URL + path)
	require.NoError(t, err)
	resp.Body.Close()
	return resp.Header.Get(name)
}

// A channel of 10,000 jobs lists one page at a time: 50 rows, a link to
// the next page, and the next page's rows are the next 50.
func TestTenThousandJobs(t *testing.T) {
	t.Parallel()
	store, err := jobs.NewMemoryStore(nil)
	require.NoError(t, err)
	keys := jobkeys.NewMemoryStore()
	coord, err := jobkeys.NewCoordinator(keys, nil)
	require.NoError(t, err)
	ctx := context.Background()
	const n = 10000
	base := time.Now().Add(-time.Hour)
	for i := range n {
		_, err := store.Enqueue(ctx, jobs.EnqueueRequest{ID: fmt.Sprintf("job-%05d", i), ChannelID: "big", Type: "render", Version: 1,
			TargetKey: fmt.Sprintf("t%d", i), IdempotencyKey: fmt.Sprint(i), Fingerprint: "f", Input: json.RawMessage(`{"i":1}`),
			AvailableAt: base})
		require.NoError(t, err)
	}
	h, err := jobsweb.New(&jobsweb.Config{Store: store, KeyStore: keys, Keys: coord, Channels: []string{"big"}})
	require.NoError(t, err)
	defer h.Close()
	srv := httptest.NewServer(h)
	defer srv.Close()

	rows := regexp.MustCompile(`<tr class="job" data-id="(job-\d+)">`)
	next := regexp.MustCompile(`<a href="([^"]+)" rel="next">`)
	page := func(path string) ([]string, string) {
		resp, err := http.Get(srv.URL + path)
		require.NoError(t, err)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode, string(b))
		var ids []string
		for _, m := range rows.FindAllStringSubmatch(string(b), -1) {
			ids = append(ids, m[1])
		}
		m := next.FindStringSubmatch(string(b))
		require.NotNil(t, m, "no next link")
		return ids, strings.ReplaceAll(m[1], "&amp;", "&")
	}
	first, link := page("/jobs?channel=big")
	require.Len(t, first, jobsweb.PageSizeDefault)
	second, _ := page(link)
	require.Len(t, second, jobsweb.PageSizeDefault)
	assert.NotContains(t, second, first[len(first)-1])
	// Newest first: the second page goes on where the first ended.
	assert.Greater(t, first[len(first)-1], second[0])
	// The overview samples StatsSampleDefault of them.
	resp, err := http.Get(srv.URL + "/")
	require.NoError(t, err)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Contains(t, string(b), fmt.Sprintf("count the newest %d jobs of 1 channel", jobsweb.StatsSampleDefault))
	assert.Regexp(t, fmt.Sprintf(`<td class="num">%d</td>`, jobsweb.StatsSampleDefault), string(b))
}

// The live stream sends a key's change when a job takes its slot, and
// ends when the handler closes.
func TestEvents(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	// A key that exists before the stream opens: the watch is running.
	e.enqueue("first", "initech", "")
	e.waitFor("/keys", "initech")

	// The bound is a failure guard: the stream never ends on its own.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, e.srv.URL+"/events", nil)
	require.NoError(t, err)
	resp, err := e.http.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, "text/event-stream", resp.Header.Get("Content-Type"))

	e.enqueue("j1", "acme", "")
	sc := bufio.NewScanner(resp.Body)
	var ev struct {
		Type       string   `json:"type"`
		DisplayKey string   `json:"displayKey"`
		Jobs       []string `json:"jobs"`
	}
	event := ""
	for sc.Scan() {
		line := sc.Text()
		if v, ok := strings.CutPrefix(line, "event: "); ok {
			event = v
		}
		if v, ok := strings.CutPrefix(line, "data: "); ok && event == "key" {
			require.NoError(t, json.Unmarshal([]byte(v), &ev))
			if ev.DisplayKey == "tenant:acme" {
				break
			}
		}
	}
	require.NoError(t, sc.Err(), "the stream ended without the change")
	assert.Equal(t, "render", ev.Type)
	assert.Contains(t, ev.Jobs, "tenants/j1")

	// Closing the handler ends the stream (before the guard ends it).
	require.NoError(t, e.web.Close())
	for sc.Scan() {
	}
	assert.NoError(t, sc.Err(), "the stream did not end when the handler closed")
	close(e.release)
}

// Mounted under a prefix, every link and the cookie carry it.
func TestMountedUnderPrefix(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	e.enqueue("j1", "acme", "")
	mux := http.NewServeMux()
	mux.Handle("/admin/jobs/", http.StripPrefix("/admin/jobs", e.web))
	srv := httptest.NewServer(mux)
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/admin/jobs/job?channel=tenants&id=j1")
	require.NoError(t, err)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode, string(b))
	body := string(b)
	assert.Contains(t, body, `href="/admin/jobs/static/style.css"`)
	assert.Contains(t, body, `href="/admin/jobs/keys"`)
	assert.Contains(t, body, `href="/admin/jobs/job/confirm?action=pause&amp;channel=tenants&amp;id=j1`)
	assert.Contains(t, body, `data-events="/admin/jobs/events"`)
	assert.Contains(t, resp.Header.Get("Set-Cookie"), "Path=/admin/jobs/")
	u, _ := url.Parse(srv.URL + "/admin/jobs/static/app.js")
	resp, err = http.Get(u.String())
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	close(e.release)
}

// New refuses a config without what it needs, naming the field.
func TestNewConfig(t *testing.T) {
	t.Parallel()
	_, err := jobsweb.New(nil)
	assert.ErrorContains(t, err, "Config is required")
	_, err = jobsweb.New(&jobsweb.Config{})
	assert.ErrorContains(t, err, "Config.Client, or Config.Keys (the key coordinator) with Config.Store and Config.KeyStore, is required")
	coord, err := jobkeys.NewCoordinator(jobkeys.NewMemoryStore(), nil)
	require.NoError(t, err)
	_, err = jobsweb.New(&jobsweb.Config{Keys: coord})
	assert.ErrorContains(t, err, "Config.Client, or Config.Store with Config.KeyStore")
	_, err = jobsweb.New(&jobsweb.Config{Keys: coord, Store: nil, KeyStore: jobkeys.NewMemoryStore(), PageSize: -1})
	assert.ErrorContains(t, err, "Config.PageSize -1 is negative")
}

// A service of 10,000 keys lists one page of them at a time, from the
// watch's copy: 50 rows, the page count, and the last page holds the rest.
func TestTenThousandKeys(t *testing.T) {
	t.Parallel()
	keys := jobkeys.NewMemoryStore()
	coord, err := jobkeys.NewCoordinator(keys, nil)
	require.NoError(t, err)
	jt, err := coord.JobType("jobs", "sync", jobkeys.Policy{Key: []string{"account", "/a"}, MaxActive: 1, MaxQueuedPerKey: 2})
	require.NoError(t, err)
	ctx := context.Background()
	const n = 10000
	for i := range n {
		_, err := jt.Admit(ctx, fmt.Sprintf("ch/job-%d", i), []byte(fmt.Sprintf(`{"a":"acct-%05d"}`, i)))
		require.NoError(t, err)
	}
	store, err := jobs.NewMemoryStore(nil)
	require.NoError(t, err)
	h, err := jobsweb.New(&jobsweb.Config{Store: store, KeyStore: keys, Keys: coord})
	require.NoError(t, err)
	defer h.Close()
	srv := httptest.NewServer(h)
	defer srv.Close()

	rows := regexp.MustCompile(`<tr class="key key-ok"`)
	get := func(path string) string {
		resp, err := http.Get(srv.URL + path)
		require.NoError(t, err)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode, string(b))
		return string(b)
	}
	// The watch lists the keys when it starts: wait until it has.
	var body string
	require.Eventually(t, func() bool {
		body = get("/keys")
		return strings.Contains(body, fmt.Sprintf("%d of %d keys", n, n))
	}, time.Minute, 50*time.Millisecond)
	assert.Len(t, rows.FindAllString(body, -1), jobsweb.PageSizeDefault)
	assert.Contains(t, body, "page 1 of 200")
	assert.Contains(t, body, `href="/keys?page=2"`)
	last := get("/keys?page=200")
	assert.Len(t, rows.FindAllString(last, -1), jobsweb.PageSizeDefault)
	assert.Contains(t, last, `href="/keys?page=199"`)
	assert.NotContains(t, last, `href="/keys?page=201"`)
	// A filter pages over what matches.
	one := get("/keys?q=acct-01234")
	assert.Len(t, rows.FindAllString(one, -1), 1)
	assert.Contains(t, one, "1 of 10000 keys")
}

// A request whose path would make links to another host gets root links.
func TestBasePathRefusesOtherHosts(t *testing.T) {
	t.Parallel()
	store, err := jobs.NewMemoryStore(nil)
	require.NoError(t, err)
	keys := jobkeys.NewMemoryStore()
	coord, err := jobkeys.NewCoordinator(keys, nil)
	require.NoError(t, err)
	h, err := jobsweb.New(&jobsweb.Config{Store: store, KeyStore: keys, Keys: coord})
	require.NoError(t, err)
	defer h.Close()
	for _, uri := range []string{"//evil.example/keys", "/admin/keys"} {
		req := httptest.NewRequest(http.MethodGet, "http://dash.example/keys", nil)
		req.RequestURI = uri
		req.URL.Path = "/keys"
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
		if uri == "/admin/keys" {
			assert.Contains(t, rec.Body.String(), `href="/admin/jobs"`)
		} else {
			assert.NotContains(t, rec.Body.String(), "evil.example")
			assert.Contains(t, rec.Body.String(), `href="/jobs"`)
		}
	}
}
