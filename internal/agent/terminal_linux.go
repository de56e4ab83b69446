package agent

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Terminals: a command started with Rows and Cols runs in a
// pseudo-terminal of the container's own devpts (Docker mounts one per
// container; gVisor's is the Sentry's), as its controlling terminal. Its
// stdout stream carries what the terminal shows, its stdin stream what is
// typed; its stderr stream ends at once. The agent keeps a descriptor of
// the master to resize it (OpResize) until the command exits.

// spawnTerminal starts a command in a new terminal and tells the
// supervisor; an error is for the caller to report.
func (a *agent) spawnTerminal(c Ctl, path string) error {
	master, slave, err := openTerminal(c.Rows, c.Cols, a.cfg.UID, a.cfg.GID)
	if err != nil {
		return err
	}
	dir := c.Dir
	if dir == "" {
		dir = a.cfg.Workspace
	}
	attr := a.userAttr()
	attr.Setctty, attr.Ctty = true, 0 // after setsid, descriptor 0 of the child
	cmd := &exec.Cmd{Path: path, Args: c.Argv, Env: c.Env, Dir: dir, Stdin: slave, Stdout: slave, Stderr: slave,
		SysProcAttr: attr}
	err = cmd.Start()
	slave.Close()
	if err != nil {
		master.Close()
		return err
	}
	pid := cmd.Process.Pid
	cmd.Process.Release()
	resizeFD, err := unix.FcntlInt(master.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		unix.Kill(-pid, unix.SIGKILL)
		master.Close()
		return err
	}
	inFD, err := unix.FcntlInt(master.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		unix.Kill(-pid, unix.SIGKILL)
		unix.Close(resizeFD)
		master.Close()
		return err
	}
	sin, sout, serr := CommandStreams(c.ID)
	// The pump makes the master's file description non-blocking, which
	// its copies share: the input's file, made after, is pollable, so
	// that a write the terminal cannot take yet waits in the poller.
	po := newPump(master, sout, a.out)
	in := os.NewFile(uintptr(inFD), "terminal")
	a.out.Write(KindClose, serr, nil)
	a.mu.Lock()
	a.commands[pid] = c.ID
	a.pgids[c.ID] = pid
	a.requests[sin] = newQueue(in)
	a.waiting[c.ID] = []*pump{po}
	a.terms[c.ID] = resizeFD
	a.mu.Unlock()
	a.out.Ctl(Ctl{Op: OpSpawned, ID: c.ID, PID: pid})
	return nil
}

// signalSession signals every process of a terminal's session: a
// shell's jobs are process groups of their own, which a signal to the
// command's group alone would leave running on the terminal. Processes
// forked while it looks are caught by a second look.
func signalSession(sid int, sig unix.Signal) {
	unix.Kill(-sid, sig)
	for pass := 0; pass < 2; pass++ {
		dirs, _ := os.ReadDir("/proc")
		for _, d := range dirs {
			pid, err := strconv.Atoi(d.Name())
			if err != nil || pid == 1 {
				continue
			}
			if s, ok := sessionOf(pid); ok && s == sid {
				unix.Kill(pid, sig)
			}
		}
	}
}

// sessionOf reads a process's session id: the fourth field after the
// command name in /proc/PID/stat (whose name may hold spaces and
// parentheses: the last ")" ends it).
func sessionOf(pid int) (int, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, false
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, false
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 4 {
		return 0, false
	}
	sid, err := strconv.Atoi(f[3])
	return sid, err == nil
}

// resize sets the size of a command's terminal, if it has one and runs.
func (a *agent) resize(c Ctl) {
	if c.Rows == 0 || c.Cols == 0 {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if fd, ok := a.terms[c.ID]; ok {
		unix.IoctlSetWinsize(fd, unix.TIOCSWINSZ, &unix.Winsize{Row: c.Rows, Col: c.Cols})
	}
}

// openTerminal opens a pseudo-terminal pair of the given size, owned by
// the sandbox user. The agent holds no CAP_CHOWN (nor CAP_DAC_OVERRIDE)
// to give a pty away after the fact, and gVisor has no setfsuid: both
// ends are opened with this thread's effective ids set to the user's, so
// that devpts makes the pty the user's from the start (as a login's is)
// and the user's permissions open it. In order:
//  1. the thread is locked (credentials are per thread at the system call,
//     and the Go runtime never clones a new thread from a locked one, so
//     nothing else runs with them);
//  2. the effective gid, then uid, become the user's (the saved ids stay
//     0, so the agent can come back);
//  3. the pair is opened;
//  4. the effective uid, then gid, are 0 again, with the permitted
//     capabilities; a thread that cannot come back ends the agent.
func openTerminal(rows, cols uint16, uid, gid int) (master, slave *os.File, err error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := setThreadEIDs(uid, gid); err != nil {
		if rerr := setThreadEIDs(0, 0); rerr != nil {
			panic(fmt.Sprintf("agent: back to root after a terminal: %v", rerr))
		}
		return nil, nil, fmt.Errorf("open a terminal as the sandbox user: %w", err)
	}
	defer func() {
		if rerr := setThreadEIDs(0, 0); rerr != nil {
			panic(fmt.Sprintf("agent: back to root after a terminal: %v", rerr))
		}
	}()
	m, err := unix.Open("/dev/ptmx", unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("open a terminal: %w", err)
	}
	defer func() {
		if err != nil {
			unix.Close(m)
		}
	}()
	if err := unix.IoctlSetPointerInt(m, unix.TIOCSPTLCK, 0); err != nil {
		return nil, nil, fmt.Errorf("unlock the terminal: %w", err)
	}
	if err := unix.IoctlSetWinsize(m, unix.TIOCSWINSZ, &unix.Winsize{Row: rows, Col: cols}); err != nil {
		return nil, nil, fmt.Errorf("size the terminal: %w", err)
	}
	n, err := unix.IoctlGetInt(m, unix.TIOCGPTN)
	if err != nil {
		return nil, nil, fmt.Errorf("number the terminal: %w", err)
	}
	// The container's own /dev/pts: nothing else is mounted there.
	s, err := unix.Open(fmt.Sprintf("/dev/pts/%d", n), unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("open the terminal's slave: %w", err)
	}
	return os.NewFile(uintptr(m), "ptmx"), os.NewFile(uintptr(s), "pts"), nil
}

// setThreadEIDs sets the calling thread's effective uid and gid only
// (raw system calls: libc and Go's syscall package change every thread's).
// To leave 0, the gid first; to come back to 0, the uid first.
func setThreadEIDs(uid, gid int) error {
	const keep = ^uintptr(0) // -1: unchanged
	setgid := func() error {
		if _, _, e := unix.RawSyscall(unix.SYS_SETRESGID, keep, uintptr(gid), keep); e != 0 {
			return e
		}
		return nil
	}
	setuid := func() error {
		if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, keep, uintptr(uid), keep); e != 0 {
			return e
		}
		return nil
	}
	first, second := setgid, setuid
	if uid == 0 {
		first, second = setuid, setgid
	}
	if err := first(); err != nil {
		return err
	}
	return second()
}
