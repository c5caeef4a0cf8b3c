package main

import (
	"testing"

	"github.com/jobkeys/jobkeys/internal/leakcheck"
)

// TestMain fails the test binary when its tests leave goroutines running
// (the demo's client, the dashboard's watch, the browser's connection).
func TestMain(m *testing.M) { leakcheck.Main(m) }
