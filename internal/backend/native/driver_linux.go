package native

import (
	"context"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vivarium-sandbox/vivarium/internal/cgroups"
	"github.com/vivarium-sandbox/vivarium/internal/core"
	"github.com/vivarium-sandbox/vivarium/internal/runner"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

// driver is a Sandbox as the core drives it (core.Driver): what a native
// sandbox does differently from other backends' during an execution.
type driver Sandbox

var _ core.Driver = (*driver)(nil)

func (d *driver) s() *Sandbox { return (*Sandbox)(d) }

// Prepare: a native sandbox whose init died is over; a paused one runs
// no code until it is resumed. The pids limit follows init's threads.
func (d *driver) Prepare(context.Context) error {
	if d.Core.Paused() {
		return sandbox.ErrPaused
	}
	if isClosed(d.s().dead()) {
		return sandbox.ErrClosed
	}
	d.s().fitPids()
	return nil
}

// Closed: init died, and not because the sandbox was paused (its init
// ends then, and a resume gives it another).
func (d *driver) Closed() bool { return !d.Core.Paused() && isClosed(d.s().dead()) }

func (d *driver) Dead() <-chan struct{} { return d.s().dead() }

// Restart has init kill every process of the sandbox but itself and start
// a runner (readControl hands it over): from the zygote for a forked
// sandbox, by itself (as a classic sandbox's init does) for a restored one,
// whose PID namespace is no longer one the zygote's can enter (setns:
// EINVAL). That runner maps nothing of the zygote's.
func (d *driver) Restart(context.Context) error {
	if d.Core.Paused() {
		return sandbox.ErrPaused
	}
	m := ctlMsg{Op: opRestart}
	if d.ownRunners.Load() {
		// runner.py itself, which also runs as a script: a sandbox paused
		// by an older server has no start.py in its runner's directory.
		m.Argv = scriptArgs(runner.SourceName, false)
	}
	return d.s().send(m)
}

// Interrupt sends SIGINT to the runner, which Python turns into
// KeyboardInterrupt.
func (d *driver) Interrupt(r *core.Runner) error {
	rp := r.Conn().(*runnerProc)
	d.mu.Lock()
	byInit := d.z == nil || rp.pidfd < 0
	var err error
	if !byInit {
		// A runner the zygote forked, with a pidfd of it (a one-shot's
		// is not init's child): signal it directly.
		err = signalMainThread(rp.pidfd, unix.SIGINT)
	}
	d.mu.Unlock()
	if byInit {
		// Init's child, or adopted by init (a restored sandbox's).
		return d.s().interrupt()
	}
	return err
}

func (d *driver) Usage() core.Usage {
	st := d.s().stats()
	return core.Usage{CPU: st.CPU, MemoryPeak: st.MemoryPeak, OOMKills: st.OOMKills}
}

// CPUWatch: CPU time is the cgroup's.
func (d *driver) CPUWatch() bool { return d.cg != nil }

func (d *driver) Kill() { d.s().kill() }

func (d *driver) SyncOutput() {
	d.stdout.sync()
	d.stderr.sync()
}

func (d *driver) Executed(context.Context, *sandbox.Result) {}

// Finish: init's status says how the runner of a one-shot ended; a dead
// sandbox's output is all delivered once init is reaped and the pipes
// reach their end.
func (d *driver) Finish(r *core.Runner, why sandbox.Status) core.Exit {
	s := d.s()
	rp := r.Conn().(*runnerProc)
	if why == "" && isClosed(s.runnerGone) && !isClosed(s.initDone) {
		// A one-shot's runner has exited, having written all it wrote:
		// its status is the program's and its output is in the pipes.
		// What is left is the tear-down, which the answer does not wait
		// for (Close does); processes the code left behind are killed
		// now, and what they write from here on is not the code's.
		s.kill()
		rp.events.drained(r.EventsDone())
		d.SyncOutput()
		return s.runnerExitStatus()
	}
	if why != "" {
		s.kill()
	}
	// Every process is gone once init is reaped; then the pipes hit EOF
	// and everything written has been delivered.
	<-s.initDone
	<-s.statusDone
	timeout := time.After(drainTimeout)
	for _, c := range []*pipeReader{s.stdout, s.stderr} {
		select {
		case <-c.done:
		case <-timeout:
			return s.runnerExitStatus()
		}
	}
	select {
	case <-r.EventsDone():
	case <-timeout:
	}
	return s.runnerExitStatus()
}

// runnerExitStatus is how init saw a one-shot's runner end, if it did.
func (s *Sandbox) runnerExitStatus() core.Exit {
	s.statusMu.Lock()
	defer s.statusMu.Unlock()
	if s.runnerExit == nil {
		return core.Exit{}
	}
	return core.Exit{Exited: true, Code: s.runnerExit.Code, Signal: s.runnerExit.Signal}
}

func (s *Sandbox) stats() cgroups.Stats {
	if s.cg == nil {
		return cgroups.Stats{}
	}
	st, _ := s.cg.Stats()
	return st
}

// pidfdSignalThread is PIDFD_SIGNAL_THREAD (Linux 6.9): the signal goes to
// the thread the pidfd names, a process's main thread for its pid.
const pidfdSignalThread = 1

// signalMainThread sends sig to the main thread of the process pidfd
// names: Python handles signals on its main thread, and only the thread a
// signal is delivered to leaves a call that blocks; sent to the process,
// it may go to another thread (a library's, numpy's), and a runner
// blocked in a read would not see it. A kernel before 6.9 sends it to the
// process.
func signalMainThread(pidfd int, sig unix.Signal) error {
	err := unix.PidfdSendSignal(pidfd, sig, nil, pidfdSignalThread)
	if err == unix.EINVAL {
		err = unix.PidfdSendSignal(pidfd, sig, nil, 0)
	}
	return err
}
