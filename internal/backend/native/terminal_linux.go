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
	"sync"
	"syscall"
	"time"

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
// and passes the master to the supervisor over the control socket,
// keeping a copy of its own (see terminal: across a pause). The
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

// terminal is the supervisor's side of a command's terminal: the master
// init passed, read for the output, written (through a duplicate, which
// CloseStdin closes alone) for the input, and resized.
//
// Across a pause the master is replaced. Init keeps a copy of every
// terminal's master (keepMaster), so that CRIU finds each pair whole in
// the tree it dumps and restores it, in the restored sandbox's devpts,
// with the command's session and controlling terminal. In order:
//  1. before the dump, hold: from here an end of the master (EIO: the
//     dumped tree's slaves are gone) is the dump's, not the command's;
//     reads and writes wait instead of ending;
//  2. a dump that fails releases: the old master is read on, and its end
//     is the command's again;
//  3. after a restore, the supervisor asks init for the masters again
//     (opTerminals), and swap puts each in place of the old one: the
//     Process the core holds reads and writes on, never having seen an
//     end. A terminal init no longer holds is released at its answer's
//     end, and ends.
type terminal struct {
	id    uint64
	ended func(id uint64) // told once, when its output ends (finish)
	once  sync.Once

	mu        sync.Mutex
	out       *os.File // the master: read, resized
	in        *os.File // nil once closed
	outClosed bool
	over      bool          // its output ended (finish): reads say io.EOF
	gen       uint64        // counts the masters it has had
	held      bool          // a pause is under way (step 1)
	changed   chan struct{} // closed, and made again, at each change of the above or of wdeadline
	wdeadline time.Time
	size      *sandbox.TerminalSize // a resize asked while held, for the next master
}

// newTerminal makes the supervisor's terminal of command id from the
// master fd init passed.
func newTerminal(id uint64, fd int, ended func(uint64)) (*terminal, error) {
	t := &terminal{id: id, ended: ended, changed: make(chan struct{})}
	if err := t.setMaster(fd); err != nil {
		return nil, err
	}
	return t, nil
}

// setMaster makes fd the terminal's master (t.mu held, or t not yet
// shared); the caller closes the files it replaces.
func (t *terminal) setMaster(fd int) error {
	dup, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		unix.Close(fd)
		return err
	}
	// Non-blocking descriptors make pollable files, whose Close
	// interrupts a pending Read and whose writes take deadlines.
	unix.SetNonblock(fd, true)
	t.out = os.NewFile(uintptr(fd), "terminal")
	in := os.NewFile(uintptr(dup), "terminal")
	if t.gen > 0 && t.in == nil {
		in.Close() // its input was closed before the pause
	} else {
		t.in = in
		in.SetWriteDeadline(t.wdeadline)
	}
	return nil
}

// notify wakes whoever waits on a change (t.mu held).
func (t *terminal) notify() {
	close(t.changed)
	t.changed = make(chan struct{})
}

// hold is step 1 of a pause.
func (t *terminal) hold() {
	t.mu.Lock()
	t.held = true
	t.notify()
	t.mu.Unlock()
}

// release is step 2, and what ends a terminal whose master does not come
// back.
func (t *terminal) release() {
	t.mu.Lock()
	t.held = false
	t.notify()
	t.mu.Unlock()
}

// swap is step 3: fd, the restored tree's master, takes the place of the
// old one, which is closed (a read or write on it returns, and goes on on
// the new one).
func (t *terminal) swap(fd int) error {
	t.mu.Lock()
	if t.over {
		t.mu.Unlock()
		unix.Close(fd) // ended meanwhile: nobody reads it
		return nil
	}
	oldOut, oldIn := t.out, t.in
	t.gen++
	err := t.setMaster(fd)
	if err != nil {
		t.gen--
		t.held = false
		t.notify()
		t.mu.Unlock()
		return err
	}
	if t.size != nil {
		setSize(rawFD(t.out), *t.size) // asked while paused: the restore set the dumped size
		t.size = nil
	}
	t.held = false
	if t.outClosed {
		t.out.Close()
	}
	t.notify()
	t.mu.Unlock()
	oldOut.Close()
	if oldIn != nil {
		oldIn.Close()
	}
	return nil
}

func (t *terminal) resize(size sandbox.TerminalSize) error {
	t.mu.Lock()
	out := t.out
	if t.held {
		t.size = &size
	}
	t.mu.Unlock()
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

// waitChange waits for ch, or until deadline (none: zero).
func waitChange(ch <-chan struct{}, deadline time.Time) error {
	if deadline.IsZero() {
		<-ch
		return nil
	}
	d := time.Until(deadline)
	if d <= 0 {
		return os.ErrDeadlineExceeded
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ch:
		return nil
	case <-timer.C:
		return os.ErrDeadlineExceeded
	}
}

// terminalOut is a terminal's output: the end of the terminal (every
// slave closed: the command and what it left are gone) reads as EIO,
// which is the output's end, io.EOF.
type terminalOut struct{ t *terminal }

func (o terminalOut) Read(p []byte) (int, error) {
	t := o.t
	for {
		t.mu.Lock()
		f, gen, ch, closed, over := t.out, t.gen, t.changed, t.outClosed, t.over
		t.mu.Unlock()
		if over {
			return 0, io.EOF
		}
		if closed {
			return 0, os.ErrClosed
		}
		n, err := f.Read(p)
		if err == nil {
			return n, nil
		}
		t.mu.Lock()
		swapped, held := t.gen != gen, t.held && !t.outClosed
		t.mu.Unlock()
		switch {
		case swapped:
			continue
		case held:
			waitChange(ch, time.Time{})
			continue
		case errors.Is(err, syscall.EIO):
			t.finish()
			return n, io.EOF
		}
		return n, err
	}
}

// finish ends a terminal whose output ended, once: the supervisor's
// masters are closed first, then init is told to close its copy, the
// last, and the pty is gone. (Were init's closed first, a process of the
// sandbox could open the pty's slave again by its path, with its master
// only outside the tree, which CRIU cannot dump.)
func (t *terminal) finish() {
	t.once.Do(func() {
		t.mu.Lock()
		t.over = true
		out, in := t.out, t.in
		t.in = nil
		t.notify()
		t.mu.Unlock()
		out.Close()
		if in != nil {
			in.Close()
		}
		t.ended(t.id)
	})
}

func (o terminalOut) Close() error {
	t := o.t
	t.mu.Lock()
	t.outClosed = true
	f, over := t.out, t.over
	t.notify()
	t.mu.Unlock()
	if over {
		return nil // closed by finish
	}
	return f.Close()
}

// terminalIn is a terminal's input. Written while the sandbox pauses, or
// is paused, it is written once the sandbox resumes, as a pipe's would
// be read then; the deadline bounds the wait too.
type terminalIn struct{ t *terminal }

func (w terminalIn) Write(p []byte) (int, error) {
	t := w.t
	total := 0
	for {
		t.mu.Lock()
		f, gen, ch, held, deadline := t.in, t.gen, t.changed, t.held, t.wdeadline
		t.mu.Unlock()
		if f == nil {
			return total, os.ErrClosed
		}
		if held {
			if err := waitChange(ch, deadline); err != nil {
				return total, err
			}
			continue
		}
		n, err := f.Write(p)
		total, p = total+n, p[n:]
		if err == nil {
			return total, nil
		}
		t.mu.Lock()
		again := t.gen != gen || t.held
		t.mu.Unlock()
		if !again {
			return total, err
		}
	}
}

// SetWriteDeadline bounds Write, as an *os.File's does (the service's
// WriteStdin sets one).
func (w terminalIn) SetWriteDeadline(d time.Time) error {
	t := w.t
	t.mu.Lock()
	t.wdeadline = d
	f := t.in
	t.notify()
	t.mu.Unlock()
	if f == nil {
		return os.ErrClosed
	}
	return f.SetWriteDeadline(d)
}

func (w terminalIn) Close() error {
	t := w.t
	t.mu.Lock()
	f := t.in
	t.in = nil
	t.notify()
	t.mu.Unlock()
	if f == nil {
		return nil
	}
	return f.Close()
}

// keepMaster keeps init's copy of command id's terminal master (see
// terminal).
func keepMaster(masters map[uint64]int, id uint64, fd int) error {
	dup, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("keep the terminal: %w", err)
	}
	masters[id] = dup
	return nil
}

// noOutput is a terminal's Stderr: everything the command writes is on
// the terminal.
type noOutput struct{}

func (noOutput) Read([]byte) (int, error) { return 0, io.EOF }
func (noOutput) Close() error             { return nil }
