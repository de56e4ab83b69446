package native

import (
	"runtime"
	"sync"
)

// initSpareThreads is how many threads init's runtime starts, beyond the
// ones its goroutines are using, before the sandbox's code runs.
const initSpareThreads = 8

// spareThreads makes the Go runtime start n threads now, which it keeps
// idle for init's life.
//
// Init's threads count against the sandbox's pids limit, and the code
// may fill that limit: fitPids leaves init only the threads it has. A
// thread the runtime wants later (when more of init's goroutines are in
// system calls at once than ever before) cannot be made then, and a Go
// program that cannot make a thread dies, and with it, being the PID
// namespace's init, the whole sandbox. A shell fork bomb on a loaded
// host did that (pthread_create: EAGAIN). The runtime never lets an
// idle thread go and takes one before it makes one, and init has few
// goroutines (the main loop, locked to its thread; the control socket's
// reader; the signal loop): n spare threads are more than they need.
//
// n goroutines each lock themselves to a thread and wait there, so that
// each holds a thread of its own; once all have, they unlock and end,
// and their threads go idle. A goroutine that waits while locked hands
// its P on at once, so this takes no longer than making the threads:
// about 1 ms for 8 here (a goroutine in a blocking system call would
// wait for the runtime's monitor to notice, up to 10 ms each).
func spareThreads(n int) {
	var ready, done sync.WaitGroup
	release := make(chan struct{})
	for range n {
		ready.Add(1)
		done.Go(func() {
			runtime.LockOSThread()
			ready.Done()
			<-release
			// Unlocked before it ends: a goroutine that ends locked
			// takes its thread with it.
			runtime.UnlockOSThread()
		})
	}
	ready.Wait()
	close(release)
	done.Wait()
}
