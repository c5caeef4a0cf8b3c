package main

import (
	"context"
	"io"
	"net/http"
	"regexp"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jobkeys/jobkeys/jobs"
)

// "jobkeys ui" serves the dashboard of the service's keys on the address
// it prints, and stops when interrupted; a bad --listen is a usage error.
func TestUI(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 1)
	_, err := jobs.NewNATSStore(f.js, nil, jobs.WithCreateBucket(jetstream.MemoryStorage, 1))
	require.NoError(t, err)
	r := newRunner(t, f.srv.ClientURL())

	assert.Equal(t, exitUsage, r.run("ui", "--listen", "nope").code)
	assert.Equal(t, exitUsage, r.run("ui", "extra").code)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out, errOut syncBuffer
	done := make(chan cliRun, 1)
	go func() {
		done <- r.runCtx(ctx, &out, &errOut, "ui", "--listen", "127.0.0.1:0", "--service", "svc", "--read-only")
	}()
	addr := regexp.MustCompile(`on (http://127\.0\.0\.1:\d+/) \(read-only\)`)
	var url string
	require.Eventually(t, func() bool {
		m := addr.FindStringSubmatch(out.String())
		if m != nil {
			url = m[1]
		}
		return m != nil
	}, 30*time.Second, 10*time.Millisecond, "no address printed; stderr: %s", errOut.String())
	assert.Empty(t, errOut.String(), "a loopback address is no warning")

	// The fixture's full key (one slot held, one job waiting), as the key
	// watch listed it.
	var body string
	require.Eventually(t, func() bool {
		resp, err := http.Get(url + "keys?blocked=1")
		if err != nil {
			return false
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		body = string(b)
		return resp.StatusCode == http.StatusOK && regexp.MustCompile(`data-status="(limit|full|stale)"`).MatchString(body)
	}, 30*time.Second, 20*time.Millisecond, "the keys page never showed a key at its limit")
	assert.Contains(t, body, `<span class="dkey">full</span>`)
	assert.Contains(t, body, "read-only")

	cancel()
	select {
	case res := <-done:
		assert.Equal(t, exitOK, res.code, res.stderr)
	case <-time.After(30 * time.Second): // a failure guard
		t.Fatal("jobkeys ui did not stop when interrupted")
	}

	// When its connection closes (the server went away), the command ends
	// with an error that says so, instead of serving errors.
	var out2, errOut2 syncBuffer
	go func() {
		done <- r.runCtx(context.Background(), &out2, &errOut2, "ui", "--listen", "127.0.0.1:0", "--service", "svc")
	}()
	require.Eventually(t, func() bool { return addr2.MatchString(out2.String()) }, 30*time.Second, 10*time.Millisecond,
		"no address printed; stderr: %s", errOut2.String())
	f.srv.Shutdown()
	select {
	case res := <-done:
		assert.Equal(t, exitError, res.code)
		assert.Contains(t, res.stderr, "the NATS connection closed")
	case <-time.After(60 * time.Second): // a failure guard
		t.Fatal("jobkeys ui went on after its connection closed")
	}
}

var addr2 = regexp.MustCompile(`on http://127\.0\.0\.1:\d+/;`)
