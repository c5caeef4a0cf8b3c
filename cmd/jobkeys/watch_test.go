package main

import (
	"context"
	"errors"
	"io"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// brokenPipe is an output that fails every write, as a closed pipe does.
type brokenPipe struct{}

func (brokenPipe) Write([]byte) (int, error) { return 0, errors.New("broken pipe") }

// watchGoroutines counts the goroutines of occupancy watches.
func watchGoroutines() int {
	buf := make([]byte, 1<<22)
	buf = buf[:runtime.Stack(buf, true)]
	return strings.Count(string(buf), "jobkeys.(*KeyCoordinator).WatchOccupancy")
}

// TestKeysWatchEndsItsWatchOnAnOutputError is the regression test for
// "keys watch --json" returning on a failed write (its reader gone) while
// its occupancy watch went on, blocked on handing over the next change,
// until the command's context ended (in the binary, never before exit). The
// watch ends with the command now. Not parallel: it counts the process's
// watch goroutines.
func TestKeysWatchEndsItsWatchOnAnOutputError(t *testing.T) {
	f := newFixture(t, 1)
	r := newRunner(t, f.srv.ClientURL())
	ctx, cancel := context.WithCancel(context.Background()) // outlives the command
	defer cancel()
	var errOut syncBuffer
	c := &cli{stdin: strings.NewReader(""), stdout: brokenPipe{}, stderr: &errOut,
		getenv: func(k string) string { return r.env[k] }, isTerminal: func(io.Reader) bool { return false }}
	code := c.run(ctx, []string{"keys", "watch", "svc", "render", "--json"})
	require.Equal(t, exitError, code, errOut.String())
	assert.Contains(t, errOut.String(), "broken pipe")
	assert.Eventually(t, func() bool { return watchGoroutines() == 0 }, 10*time.Second, 20*time.Millisecond,
		"the occupancy watch ended with the command")
}
