package natsperm

import (
	"testing"

	"github.com/jobkeys/jobkeys/internal/leakcheck"
)

// TestMain fails the package's test binary when its tests leave goroutines
// running (connections, servers not closed).
func TestMain(m *testing.M) { leakcheck.Main(m) }
