package native

import (
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

type initPipes struct {
	ctrlW                     *os.File
	statusR, stdoutR, stderrR *os.File
	ctl                       int
	child                     []*os.File
}

func newInitPipes() (_ *initPipes, err error) {
	p := &initPipes{ctl: -1}
	defer func() {
		if err != nil {
			p.closeChild()
			p.closeParent()
			if p.ctl >= 0 {
				unix.Close(p.ctl)
			}
		}
	}()
	pipe := func(parentReads bool) (*os.File, error) {
		r, w, err := os.Pipe()
		if err != nil {
			return nil, err
		}
		if parentReads {
			p.child = append(p.child, w)
			return r, nil
		}
		p.child = append(p.child, r)
		return w, nil
	}
	if p.ctrlW, err = pipe(false); err != nil {
		return p, err
	}
	if p.statusR, err = pipe(true); err != nil {
		return p, err
	}
	if p.stdoutR, err = pipe(true); err != nil {
		return p, err
	}
	if p.stderrR, err = pipe(true); err != nil {
		return p, err
	}
	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return p, err
	}
	p.ctl = pair[0]
	p.child = append(p.child, os.NewFile(uintptr(pair[1]), "control"))
	return p, nil
}

func (p *initPipes) closeChild() {
	for _, f := range p.child {
		f.Close()
	}
	p.child = nil
}

// closeParent closes the supervisor's pipe ends (not the control socket,
// which the Sandbox owns).
func (p *initPipes) closeParent() {
	for _, f := range []*os.File{p.ctrlW, p.statusR, p.stdoutR, p.stderrR} {
		if f != nil {
			f.Close()
		}
	}
}

// initProc is a running init, started by the supervisor (cmd), by a
// zygote's init (a pidfd), or restored by CRIU as the supervisor's child
// (proc, pause_linux.go).
type initProc struct {
	pid      int // on the host
	cmd      *exec.Cmd
	proc     *os.Process
	pidfd    int
	inCgroup bool // born in its cgroup (clone3 CLONE_INTO_CGROUP)
}

// wait returns when init has exited.
func (p *initProc) wait() error {
	if p.cmd != nil {
		return p.cmd.Wait()
	}
	if p.proc != nil {
		_, err := p.proc.Wait()
		return err
	}
	return waitPidfd(p.pidfd)
}

// alive reports whether init has not been reaped: a path opened by its
// pid before alive said so was init's (a pid is not reused before its
// process is reaped).
func (p *initProc) alive() bool {
	switch {
	case p.cmd != nil:
		return p.cmd.Process.Signal(syscall.Signal(0)) == nil
	case p.proc != nil:
		return p.proc.Signal(syscall.Signal(0)) == nil
	}
	return unix.PidfdSendSignal(p.pidfd, 0, nil, 0) == nil
}

// nsKinds are the namespaces a zygote's child joins, in the order
// zygote.py takes them: user first, then the ones it owns.
var nsKinds = []string{"user", "pid", "mnt", "net", "ipc", "uts", "cgroup"}

// namespaces opens init's namespaces (nsKinds). The pidfd tells that the
// files are init's: it is checked alive after they are opened, so its pid
// was not reused for another process in between.
func (p *initProc) namespaces() ([]int, error) {
	fds := make([]int, 0, len(nsKinds))
	for _, kind := range nsKinds {
		fd, err := unix.Open(fmt.Sprintf("/proc/%d/ns/%s", p.pid, kind), unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			closeAll(fds)
			return nil, fmt.Errorf("open the sandbox's %s namespace: %w", kind, err)
		}
		fds = append(fds, fd)
	}
	if p.pidfd >= 0 {
		if err := unix.PidfdSendSignal(p.pidfd, 0, nil, 0); err != nil {
			closeAll(fds)
			return nil, fmt.Errorf("the sandbox's init is gone: %w", err)
		}
	}
	return fds, nil
}

// samePIDNamespace fails unless process pid is in init's PID namespace.
// Callers hold a pidfd of pid, so that it names the same process
// throughout.
func (p *initProc) samePIDNamespace(pid int) error {
	var mine, theirs unix.Stat_t
	if err := unix.Stat(fmt.Sprintf("/proc/%d/ns/pid", p.pid), &mine); err != nil {
		return fmt.Errorf("the sandbox's PID namespace: %w", err)
	}
	if err := unix.Stat(fmt.Sprintf("/proc/%d/ns/pid", pid), &theirs); err != nil {
		return fmt.Errorf("the PID namespace of process %d: %w", pid, err)
	}
	if mine.Dev != theirs.Dev || mine.Ino != theirs.Ino {
		return fmt.Errorf("process %d is not in the sandbox's PID namespace", pid)
	}
	return nil
}

// kill sends SIGKILL: init is PID 1 of the sandbox's PID namespace, so
// every process of the sandbox dies with it.
func (p *initProc) kill() {
	if p.cmd != nil {
		p.cmd.Process.Signal(syscall.SIGKILL)
		return
	}
	if p.proc != nil {
		p.proc.Signal(syscall.SIGKILL)
		return
	}
	unix.PidfdSendSignal(p.pidfd, unix.SIGKILL, nil, 0)
}

// awaitReaped waits (briefly) until the zygote's init has reaped an init
// that exited: until then it lingers as a zombie.
func (p *initProc) awaitReaped() {
	for delay, waited := 20*time.Microsecond, time.Duration(0); waited < time.Second; delay = min(2*delay, 10*time.Millisecond) {
		if unix.PidfdSendSignal(p.pidfd, 0, nil, 0) == unix.ESRCH {
			return
		}
		time.Sleep(delay)
		waited += delay
	}
}

// execInit starts a classic init from the supervisor: in new user, mount,
// PID, network, IPC and UTS namespaces, the user namespace owned by the
// sandbox's host user (spawn_linux.go).
func (b *Backend) execInit(child []*os.File, cgroupFD int, tasks *groupTasks, owner uint32, fixedLayout bool) (*initProc, error) {
	cmd := initCommand(b.cfg.Exe, child)
	// A session of its own: the sandbox shares no session or process
	// group with the supervisor, and CRIU can dump its tree (a session
	// leader outside the sandbox's PID namespace stops a dump).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	p := &initProc{cmd: cmd, pidfd: -1}
	if cgroupFD >= 0 {
		// cgroup v2: born inside its group (clone3 CLONE_INTO_CGROUP).
		cmd.SysProcAttr.UseCgroupFD = true
		cmd.SysProcAttr.CgroupFD = cgroupFD
		p.inCgroup = true
	}
	cg := b.spawnGroup(tasks)
	if cg != nil {
		// cgroup v1: born inside its group by the spawner's thread,
		// which enters it for the clone.
		p.inCgroup = true
	}
	if err := startOwned(cmd, owner, fixedLayout, cg); err != nil {
		return nil, fmt.Errorf("start init (user namespaces: %w)", err)
	}
	p.pid = cmd.Process.Pid
	return p, nil
}
