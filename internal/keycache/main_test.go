package keycache

import (
	"testing"

	"github.com/jobkeys/jobkeys/internal/leakcheck"
)

// TestMain fails the package's tests if any leave a goroutine behind (an
// AwaitChange that never returned, say).
func TestMain(m *testing.M) { leakcheck.Main(m) }
