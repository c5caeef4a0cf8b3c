package main

import (
	"context"
	"fmt"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jobkeys/jobkeys/internal/natstest"
	"github.com/jobkeys/jobkeys/jobs"
)

// Environment variables of the browser test.
const (
	// requireBrowserEnv set to 1 makes a missing browser a failure, not a
	// skip: .ci/run sets it after installing Chromium.
	requireBrowserEnv = "JOBKEYS_REQUIRE_BROWSER"
	// browserEnv names the browser binary; default: the first of
	// browserNames on PATH.
	browserEnv = "JOBKEYS_BROWSER"
	// screenshotsEnv names a directory the test also writes its
	// screenshots to (dashboard-<page>.png), after letting the example
	// run for screenshotWarmUp so that its pages have history: the
	// README's screenshot is made so.
	screenshotsEnv = "JOBKEYS_SCREENSHOTS"
)

const screenshotWarmUp = 20 * time.Second

var browserNames = []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome", "headless-shell"}

// browserPath finds the browser to drive; "" when there is none.
func browserPath() string {
	if p := os.Getenv(browserEnv); p != "" {
		return p
	}
	for _, name := range browserNames {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	return ""
}

// The dashboard of the running example, in headless Chromium: every page
// loads; a key reaches its limit on the keys page without a reload; a
// waiting job is cancelled from its page, through the confirmation, and
// its page shows it cancelled; the running job's open page shows it
// cancelled, without a reload, when it is cancelled elsewhere. A screenshot of each page goes to the
// test's temp dir (and to $JOBKEYS_SCREENSHOTS when set).
func TestBrowser(t *testing.T) {
	browser := browserPath()
	if browser == "" {
		msg := fmt.Sprintf("NO BROWSER: TestBrowser (the dashboard in headless Chromium) did not run: none of %s is on PATH and %s is not set; install Debian's chromium (apt-get install chromium) to run it",
			strings.Join(browserNames, ", "), browserEnv)
		if os.Getenv(requireBrowserEnv) == "1" {
			t.Fatalf("%s, and %s=1 requires it", msg, requireBrowserEnv)
		}
		fmt.Fprintln(os.Stderr, "=== "+msg)
		t.Skip(msg)
	}
	shots := t.TempDir()
	extraShots := os.Getenv(screenshotsEnv)

	srv := natstest.Run(t)
	_, js := natstest.Connect(t, srv)
	d, err := startDemo(js, false)
	require.NoError(t, err)
	t.Cleanup(d.close)
	web := httptest.NewServer(d.web)
	t.Cleanup(web.Close)
	if extraShots != "" {
		time.Sleep(screenshotWarmUp) // history for the README's pictures; not a wait for a result
	}

	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(browser), chromedp.WindowSize(1280, 860), chromedp.DisableGPU)
	if os.Geteuid() == 0 {
		opts = append(opts, chromedp.NoSandbox) // Chromium refuses to run as root with its sandbox
	}
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	defer cancelAlloc()
	bctx, cancelBrowser := chromedp.NewContext(allocCtx)
	defer cancelBrowser()
	// A failure guard: every step below waits for something to happen.
	ctx, cancel := context.WithTimeout(bctx, 3*time.Minute)
	defer cancel()

	shoot := func(name string) {
		t.Helper()
		png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
		require.NoError(t, err, "screenshot %s", name)
		require.NoError(t, os.WriteFile(filepath.Join(shots, name+".png"), png, 0o644))
		if extraShots != "" {
			require.NoError(t, os.WriteFile(filepath.Join(extraShots, "dashboard-"+name+".png"), png, 0o644))
		}
	}
	text := func(sel string) string {
		t.Helper()
		s, err := chromedp.Run(ctx, chromedp.Text(sel))
		require.NoError(t, err, "text of %s", sel)
		return s
	}
	// hasText waits until sel's text contains want (a live page may be
	// re-rendering the region sel is in) and returns its text; the
	// failure guard is ctx.
	hasText := func(sel, want string) string {
		t.Helper()
		for {
			s := text(sel)
			if strings.Contains(s, want) || ctx.Err() != nil {
				return s
			}
			time.Sleep(20 * time.Millisecond)
		}
	}

	// Overview: the job types of the example.
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(web.URL+"/"), chromedp.WaitVisible(`a[href="/keys?type=render"]`)))
	assert.Contains(t, hasText("h1", "Overview"), "Overview")
	shoot("overview")
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(web.URL+"/keys"), chromedp.WaitVisible(`tr.key`)))
	shoot("keys-all")

	// Keys, filtered to a tenant of the test's own: empty until its jobs
	// come. The page is marked, so a reload would show (the mark is gone).
	const tenant = "browser-test"
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(web.URL+"/keys?q="+tenant), chromedp.WaitVisible(`p.empty`)))
	_, err = chromedp.Run(ctx, chromedp.Evaluate[bool](`window.jobkeysMark = true`))
	require.NoError(t, err)
	bg := context.Background()
	_, err = d.enqueue(bg, "hold-1", "export", work{Tenant: tenant, Ms: 10 * 60 * 1000})
	require.NoError(t, err)
	waitState(t, d, tenant, "hold-1", jobs.StateRunning)
	_, err = d.enqueue(bg, "wait-1", "export", work{Tenant: tenant, Ms: 1000})
	require.NoError(t, err)
	// The key at its limit (1 of 1 running) with wait-1 waiting, as the
	// live stream brings it.
	atLimit := `(() => { const r = document.querySelector('tr.key'); return !!r && r.dataset.status !== 'ok' && r.dataset.queued === '1'; })()`
	_, err = chromedp.Run(ctx, chromedp.Poll[bool](atLimit, chromedp.WithPollingInterval(50*time.Millisecond)))
	require.NoError(t, err, "the keys page never showed the key at its limit")
	mark, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`window.jobkeysMark === true && Number(document.getElementById('live').dataset.loaded) > 0`))
	require.NoError(t, err)
	assert.True(t, mark, "the key's change came by a reload of the page, not live")
	assert.Contains(t, text("tr.key .dkey"), "tenant:"+tenant)
	assert.Contains(t, hasText("tr.key .running", "1/1"), "1/1")
	assert.Contains(t, hasText("tr.key .why", "at its limit"), "at its limit")
	shoot("keys")

	// Jobs of the tenant's channel.
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(web.URL+"/jobs?channel="+tenant), chromedp.WaitVisible(`tr.job[data-id="wait-1"]`)))
	assert.Contains(t, hasText("table.jobs", "hold-1"), "hold-1")
	shoot("jobs")

	// Cancel the waiting job from its page.
	jobPage := web.URL + "/job?" + url.Values{"channel": {tenant}, "id": {"wait-1"}}.Encode()
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(jobPage), chromedp.WaitVisible(`h1 .state-pending`)))
	assert.Contains(t, hasText("dl.facts", "waits for a slot: 1 of 1 in the queue"), "waits for a slot: 1 of 1 in the queue")
	shoot("job")
	require.NoError(t, chromedp.Do(ctx, chromedp.Click(`a.action-cancel`), chromedp.WaitVisible(`#confirm`)))
	assert.Contains(t, hasText("p.question", "Cancel job wait-1?"), "Cancel job wait-1?")
	shoot("confirm")
	require.NoError(t, chromedp.Do(ctx, chromedp.Click(`#confirm`), chromedp.WaitVisible(`h1 .state-cancelled`)))
	assert.Contains(t, hasText(".banner.ok", "The job is now cancelled."), "The job is now cancelled.")
	shoot("job-cancelled")
	det, err := d.client.Get(bg, tenant, "wait-1")
	require.NoError(t, err)
	assert.Equal(t, jobs.StateCancelled, det.Job.State)

	// The running job's page follows it live: cancelled elsewhere (here,
	// through the client), it shows cancelled without a reload. This also
	// lets the client stop at once.
	holdPage := web.URL + "/job?" + url.Values{"channel": {tenant}, "id": {"hold-1"}}.Encode()
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(holdPage), chromedp.WaitVisible(`h1 .state-running`)))
	_, err = chromedp.Run(ctx, chromedp.Evaluate[bool](`window.jobkeysMark = true`))
	require.NoError(t, err)
	_, err = d.client.Cancel(bg, jobs.CancelRequest{ChannelID: tenant, JobID: "hold-1"})
	require.NoError(t, err)
	_, err = chromedp.Run(ctx, chromedp.Poll[bool](`!!document.querySelector('h1 .state-cancelled')`, chromedp.WithPollingInterval(50*time.Millisecond)))
	require.NoError(t, err, "the running job's page never showed it cancelled")
	mark, err = chromedp.Run(ctx, chromedp.Evaluate[bool](`window.jobkeysMark === true`))
	require.NoError(t, err)
	assert.True(t, mark, "the job's page was reloaded, not updated live")
}

// waitState waits until a job of the example is in state s.
func waitState(t *testing.T, d *demo, channel, id string, s jobs.State) {
	t.Helper()
	require.Eventually(t, func() bool {
		det, err := d.client.Get(context.Background(), channel, id)
		return err == nil && det.Job.State == s
	}, time.Minute, 20*time.Millisecond, "job %s never became %s", id, s)
}
