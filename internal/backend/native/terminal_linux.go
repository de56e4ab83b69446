package native

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

// Terminals. Every sandbox (not a zygote, which runs no user code) mounts
// a devpts instance of its own at /dev/pts, with /dev/ptmx a link to its
// ptmx: the pseudo-terminals a sandbox opens, for a command started with a
// terminal or by its own code (os.openpty, pty.spawn, script, tmux), are
// numbered and listed there only, never beside the host's or another
// sandbox's.
//
// A command with a terminal is started by init, inside the sandbox: it
// opens a pair on the sandbox's ptmx, makes the slave the command's
// stdin, stdout, stderr and controlling terminal (setsid, TIOCSCTTY),
// and passes the master to the supervisor over the control socket. The
// supervisor reads, writes and resizes (TIOCSWINSZ) the master; it never
// interprets a byte of it.

// maxPTYs bounds the pseudo-terminals one sandbox holds at once (devpts'
// max=). kernel.pty.max is one pool for the whole host, of which every
// instance but the host's own may take all but kernel.pty.reserve (1024
// by default): without a bound, one sandbox could take the rest of the
// pool from every other sandbox. 16 is a handful of terminals and the
// ptys their programs open (tmux, script, expect), well under the pool
// divided by the sandboxes a server runs.
const maxPTYs = 16

// mountPTS mounts the sandbox's own devpts instance at dev/pts and links
// dev/ptmx to its ptmx. New ptys are the opener's, mode 0620; ptmx is
// open to everyone in the sandbox.
func mountPTS(dev string) error {
	pts := filepath.Join(dev, "pts")
	if err := os.Mkdir(pts, 0o755); err != nil {
		return step("/dev/pts", err)
	}
	opts := fmt.Sprintf("newinstance,ptmxmode=0666,mode=0620,max=%d", maxPTYs)
	if err := unix.Mount("devpts", pts, "devpts", unix.MS_NOSUID|unix.MS_NOEXEC, opts); err != nil {
		return step("mount /dev/pts", err)
	}
	if err := os.Symlink("pts/ptmx", filepath.Join(dev, "ptmx")); err != nil {
		return step("/dev/ptmx", err)
	}
	return nil
}

// openTerminal opens a pseudo-terminal pair on the sandbox's ptmx (in
// init), sized size, its slave owned by uid and gid as a login's is. The
// slave is opened through the master (TIOCGPTPEER), not by its name, so
// that it is the master's own peer whatever /dev/pts holds.
func openTerminal(size sandbox.TerminalSize, uid, gid int) (master, slave *os.File, err error) {
	m, err := unix.Open("/dev/ptmx", unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, unix.ENOSPC) {
			return nil, nil, fmt.Errorf("open a terminal: the sandbox holds %d already, its most", maxPTYs)
		}
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
	if err := setSize(m, size); err != nil {
		return nil, nil, err
	}
	// TIOCGPTPEER's argument is the slave's open flags.
	r, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(m), unix.TIOCGPTPEER,
		unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC)
	if errno != 0 {
		return nil, nil, fmt.Errorf("open the terminal's slave: %w", errno)
	}
	s := int(r)
	if err := unix.Fchown(s, uid, gid); err != nil {
		unix.Close(s)
		return nil, nil, fmt.Errorf("give the terminal to its user: %w", err)
	}
	return os.NewFile(uintptr(m), "ptmx"), os.NewFile(uintptr(s), "pts"), nil
}

// signalSession signals every process of a terminal's session (in init):
// a shell's jobs are process groups of their own, which a signal to the
// command's group alone would leave running on the terminal. Processes
// forked while it looks are caught by a second look.
func signalSession(sid int, sig unix.Signal) {
	unix.Kill(-sid, sig)
	for pass := 0; pass < 2; pass++ {
		for _, pid := range sessionMembers(sid) {
			unix.Kill(pid, sig)
		}
	}
}

// sessionMembers lists the processes of session sid, from /proc.
func sessionMembers(sid int) []int {
	dirs, _ := os.ReadDir("/proc")
	var out []int
	for _, d := range dirs {
		pid, err := strconv.Atoi(d.Name())
		if err != nil || pid == 1 {
			continue
		}
		if s, ok := sessionOf(pid); ok && s == sid {
			out = append(out, pid)
		}
	}
	return out
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

func setSize(fd int, size sandbox.TerminalSize) error {
	err := unix.IoctlSetWinsize(fd, unix.TIOCSWINSZ, &unix.Winsize{Row: size.Rows, Col: size.Cols})
	if err != nil {
		return fmt.Errorf("resize the terminal: %w", err)
	}
	return nil
}

// terminalFiles makes the supervisor's files of a terminal from the
// master init passed: the same descriptor to write input to and to read
// output from, and resize through.
func terminalFiles(fd int) (in, out *os.File, resize func(sandbox.TerminalSize) error, err error) {
	dup, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		unix.Close(fd)
		return nil, nil, nil, err
	}
	// Non-blocking descriptors make pollable files, whose Close
	// interrupts a pending Read and whose writes take deadlines.
	unix.SetNonblock(fd, true)
	out = os.NewFile(uintptr(fd), "terminal")
	in = os.NewFile(uintptr(dup), "terminal")
	resize = func(size sandbox.TerminalSize) error {
		// Through the output's descriptor: the input may be closed
		// (CloseStdin) while the terminal lives on.
		rc, err := out.SyscallConn()
		if err != nil {
			return err
		}
		var serr error
		if err := rc.Control(func(fd uintptr) { serr = setSize(int(fd), size) }); err != nil {
			return fmt.Errorf("resize the terminal: %w", err)
		}
		return serr
	}
	return in, out, resize, nil
}

// terminalReader reads a terminal's master: the end of the terminal
// (every slave closed: the command and what it left are gone) reads as
// EIO, which is the output's end, io.EOF.
type terminalReader struct{ *os.File }

func (r terminalReader) Read(p []byte) (int, error) {
	n, err := r.File.Read(p)
	if err != nil && errors.Is(err, syscall.EIO) {
		err = io.EOF
	}
	return n, err
}

// noOutput is a terminal's Stderr: everything the command writes is on
// the terminal.
type noOutput struct{}

func (noOutput) Read([]byte) (int, error) { return 0, io.EOF }
func (noOutput) Close() error             { return nil }
