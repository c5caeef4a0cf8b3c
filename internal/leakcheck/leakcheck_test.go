package leakcheck

import (
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestWaitReportsAndForgetsAGoroutine(t *testing.T) {
	stop := make(chan struct{})
	go blockedForTest(stop)
	var once sync.Once
	end := func() { once.Do(func() { close(stop) }) }
	t.Cleanup(end)

	leaked := wait(100 * time.Millisecond)
	require.Len(t, leaked, 1, "the blocked goroutine is the only one left")
	assert.True(t, strings.Contains(leaked[0], "blockedForTest"), "the stack names it:\n%s", leaked[0])

	end()
	assert.Empty(t, wait(2*time.Second), "a goroutine that ended is not reported")
}

func blockedForTest(stop <-chan struct{}) { <-stop }
