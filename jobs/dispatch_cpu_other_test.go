//go:build !linux

package jobs_test

import "time"

// selfCPU and pidCPU read /proc on Linux; elsewhere the dispatch
// benchmarks leave the CPU figures out.
func selfCPU() (time.Duration, bool) { return 0, false }

func pidCPU(int) (time.Duration, bool) { return 0, false }
