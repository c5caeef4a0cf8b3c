//go:build linux

package jobkeys

import (
	"syscall"
	"time"
)

// delayUntil sleeps until t with the kernel's precision: the Go runtime's
// timers wait at least a millisecond when the process is otherwise idle
// (epoll's timeout is in milliseconds), which would make a delay line of
// 250µs one of about 1.2ms. The goroutine blocks in nanosleep instead,
// its thread leaving the scheduler to the others (a system call).
func delayUntil(t time.Time) {
	for {
		wait := time.Until(t)
		if wait <= 0 {
			return
		}
		ts := syscall.NsecToTimespec(wait.Nanoseconds())
		_ = syscall.Nanosleep(&ts, nil) // EINTR: the loop sleeps the rest
	}
}
