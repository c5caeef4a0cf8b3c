//go:build !linux

package jobkeys

import "time"

// delayUntil sleeps until t (with the runtime timers' precision, which
// can be a millisecond; see the Linux version).
func delayUntil(t time.Time) { time.Sleep(time.Until(t)) }
