// Package leakcheck fails a test binary whose tests leave goroutines behind.
// Each package's TestMain calls Main; nothing here is part of the library.
package leakcheck

import (
	"fmt"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"
)

// ignored are stack frames of goroutines that outlive every test by design:
// the runtime's and the testing package's own, and the signal handling and
// scheduling goroutines the embedded nats-server starts once per process.
var ignored = []string{
	"testing.Main(",
	"testing.(*M).",
	"testing.tRunner(",
	"testing.runTests(",
	"os/signal.signal_recv",
	"os/signal.loop",
	"runtime.ensureSigM",
	"created by runtime.gc",
	"runtime.MHeap_Scavenger",
	"github.com/nats-io/nats-server/v2/server.(*srvMemStore).",
	"github.com/nats-io/nats-server/v2/server.init",
	"go.opencensus.io",
	"internal/poll.runtime_pollWait",
}

// Main runs the tests, then waits up to five seconds for the goroutines they
// started to end, and exits non-zero listing those that did not.
func Main(m *testing.M) {
	code := m.Run()
	if code == 0 {
		if leaked := wait(5 * time.Second); len(leaked) > 0 {
			fmt.Fprintf(os.Stderr, "leakcheck: %d goroutine(s) outlived the tests:\n\n%s\n",
				len(leaked), strings.Join(leaked, "\n\n"))
			code = 1
		}
	}
	os.Exit(code)
}

func wait(d time.Duration) []string {
	deadline := time.Now().Add(d)
	for {
		leaked := running()
		if len(leaked) == 0 || time.Now().After(deadline) {
			return leaked
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// running lists the stacks of the goroutines other than this one that are
// not ignored.
func running() []string {
	var leaked []string
	for i, g := range strings.Split(stack(), "\n\n") {
		if i == 0 { // the calling goroutine
			continue
		}
		if !isIgnored(g) {
			leaked = append(leaked, g)
		}
	}
	return leaked
}

func isIgnored(stack string) bool {
	for _, s := range ignored {
		if strings.Contains(stack, s) {
			return true
		}
	}
	return false
}

// stack returns the stacks of all goroutines, the calling one first.
func stack() string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return string(buf[:n])
		}
		buf = make([]byte, 2*len(buf))
	}
}
