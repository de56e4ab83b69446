package native_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/testutil"
)

// A shell in a terminal: its own pty, a size that follows resizes, echo
// of what is typed, Ctrl-C to the foreground job, and its exit status.
func TestTerminalShell(t *testing.T) {
	t.Parallel()
	sb, err := newBackend(t).Create(context.Background(), sandbox.Spec{})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	p, err := sb.Start(context.Background(), sandbox.Command{Argv: []string{"bash", "--norc", "--noprofile", "-i"},
		Env: map[string]string{"PS1": "READY$ "}, Terminal: &sandbox.TerminalSize{Rows: 24, Cols: 80}})
	if err != nil {
		t.Fatal(err)
	}
	if errOut, _ := io.ReadAll(p.Stderr()); len(errOut) > 0 {
		t.Fatalf("a terminal's stderr is %q, want nothing", errOut)
	}
	s := testutil.Watch(p.Stdout())
	s.Expect(t, `READY\$ `)

	// Standard streams and controlling terminal are one pty of the
	// sandbox's own devpts, the user's.
	testutil.TypeIn(t, p, "tty; stty size; echo term=$TERM; stat -c '%U %a' $(tty); [ -t 2 ] && echo err-is-tty\n")
	s.Expect(t, `\r/dev/pts/[0-9]+\r\n24 80\r\nterm=xterm-256color\r\nsandbox 620\r\nerr-is-tty\r\n`)

	// A resize reaches the terminal (and the shell, by SIGWINCH).
	if err := p.(sandbox.Resizer).Resize(sandbox.TerminalSize{Rows: 33, Cols: 101}); err != nil {
		t.Fatal(err)
	}
	testutil.TypeIn(t, p, "stty size; echo cols=$COLUMNS\n")
	s.Expect(t, `\r33 101\r\ncols=101\r\n`)
	if err := p.(sandbox.Resizer).Resize(sandbox.TerminalSize{Rows: 0, Cols: 10}); !errors.Is(err, sandbox.ErrInvalidSpec) {
		t.Fatalf("resize to 0 rows: %v", err)
	}

	// The line discipline echoes what is typed; the shell runs it.
	testutil.TypeIn(t, p, "echo ab''cd\n")
	s.Expect(t, `echo ab''cd\r\n(?:\x1b\[\?2004l\r)?abcd\r\n`)

	// Ctrl-C interrupts the foreground job, not the shell.
	testutil.TypeIn(t, p, "sh -c 'echo sleeping; exec sleep 1000'\n")
	s.Expect(t, `\rsleeping\r\n`)
	testutil.TypeIn(t, p, "\x03")
	s.Expect(t, `READY\$ `)
	testutil.TypeIn(t, p, "echo status=$?\n")
	s.Expect(t, `\rstatus=130\r\n`)

	testutil.TypeIn(t, p, "exit 7\n")
	<-p.Done()
	if p.ExitCode() != 7 {
		t.Fatalf("exit code %d, want 7", p.ExitCode())
	}
	<-s.EOF() // the terminal's end reads as end-of-file
}

// A command as root gets a terminal that is root's; bytes of every value
// are passed through as they are, escape sequences included; Python in
// the sandbox opens terminals of its own.
func TestTerminalBytesAndPython(t *testing.T) {
	t.Parallel()
	sb, err := newBackend(t).Create(context.Background(), sandbox.Spec{})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	p, err := sb.Start(context.Background(), sandbox.Command{Argv: []string{"sh", "-c",
		`stty raw -echo; stat -c '%U' $(tty); printf '\033]0;title\007\033[31mred\033[0m\377\000end'`},
		User: sandbox.UserRoot, Env: map[string]string{"TERM": "dumb"}, Terminal: &sandbox.TerminalSize{Rows: 5, Cols: 5}})
	if err != nil {
		t.Fatal(err)
	}
	out, err := io.ReadAll(p.Stdout())
	if err != nil {
		t.Fatal(err)
	}
	if want := "root\n\x1b]0;title\a\x1b[31mred\x1b[0m\xff\x00end"; string(out) != want {
		t.Fatalf("terminal showed %q, want %q", out, want)
	}
	if p.ExitCode() != 0 {
		t.Fatalf("exit %d", p.ExitCode())
	}

	res, err := sb.Execute(context.Background(), sandbox.ExecRequest{Code: `
import os, pty
m, s = os.openpty()
print(os.ttyname(s).startswith("/dev/pts/"), os.isatty(s))
pid, fd = pty.fork()
if pid == 0:
    os.execvp("sh", ["sh", "-c", "tty >/dev/null && echo child-has-tty; echo $$"])
out = b""
while True:
    try:
        chunk = os.read(fd, 1024)
    except OSError:
        break
    if not chunk:
        break
    out += chunk
os.waitpid(pid, 0)
print(out.split(b"\r\n")[0].decode())
`}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != sandbox.StatusOK || res.Stdout != "True True\nchild-has-tty\n" {
		t.Fatalf("%s: stdout %q stderr %q", res.Status, res.Stdout, res.Stderr)
	}
	// A terminal whose input is closed is still resized (SIGWINCH).
	w, err := sb.Start(context.Background(), sandbox.Command{Argv: []string{"sh", "-c",
		`trap 'stty size; exit 0' WINCH; echo ready; while :; do sleep 0.05; done`}, Terminal: &sandbox.TerminalSize{Rows: 5, Cols: 5}})
	if err != nil {
		t.Fatal(err)
	}
	ws := testutil.Watch(w.Stdout())
	ws.Expect(t, "ready\r\n")
	w.Stdin().Close()
	if err := w.(sandbox.Resizer).Resize(sandbox.TerminalSize{Rows: 7, Cols: 9}); err != nil {
		t.Fatal(err)
	}
	ws.Expect(t, "7 9\r\n")
	<-w.Done()

	// A command without a terminal has none to resize.
	q, err := sb.Start(context.Background(), sandbox.Command{Argv: []string{"true"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := q.(sandbox.Resizer).Resize(sandbox.TerminalSize{Rows: 1, Cols: 1}); !errors.Is(err, sandbox.ErrNoTerminal) {
		t.Fatalf("resizing a process without a terminal: %v", err)
	}
	io.ReadAll(q.Stdout())
}

// A sandbox holds at most 16 ptys, its own code's and its terminals'
// together; at the bound the host (and so every other sandbox) can still
// open one, and the sandbox can again once it closes one.
func TestTerminalsAreBounded(t *testing.T) {
	t.Parallel()
	sb, err := newBackend(t).Create(context.Background(), sandbox.Spec{})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	ctx := context.Background()
	term, err := sb.Start(ctx, sandbox.Command{Argv: []string{"sleep", "1000"}, Terminal: &sandbox.TerminalSize{Rows: 2, Cols: 2}})
	if err != nil {
		t.Fatal(err)
	}
	res, err := sb.Execute(ctx, sandbox.ExecRequest{Code: `
import os, errno
held = []
while True:
    try:
        held.append(os.openpty())
    except OSError as e:
        print(len(held), errno.errorcode[e.errno])
        break
    if len(held) > 100:
        print("unbounded")
        break
`}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.Stdout != "15 ENOSPC\n" {
		t.Fatalf("opening ptys in the sandbox: stdout %q stderr %q", res.Stdout, res.Stderr)
	}
	_, err = sb.Start(ctx, sandbox.Command{Argv: []string{"true"}, Terminal: &sandbox.TerminalSize{Rows: 2, Cols: 2}})
	if err == nil || !strings.Contains(err.Error(), "holds 16 already") {
		t.Fatalf("a 17th terminal: %v", err)
	}
	// The host's own instance is another pool.
	m, s, err := openHostPTY()
	if err != nil {
		t.Fatalf("the host cannot open a pty while a sandbox holds its most: %v", err)
	}
	unix.Close(m)
	unix.Close(s)
	if _, err := sb.Execute(ctx, sandbox.ExecRequest{Code: "for m, s in held[:2]: os.close(m); os.close(s)"}, nil); err != nil {
		t.Fatal(err)
	}
	ok, err := sb.Start(ctx, sandbox.Command{Argv: []string{"tty"}, Terminal: &sandbox.TerminalSize{Rows: 2, Cols: 2}})
	if err != nil {
		t.Fatalf("a terminal once the sandbox closed some: %v", err)
	}
	if out, _ := io.ReadAll(ok.Stdout()); !strings.HasPrefix(string(out), "/dev/pts/") {
		t.Fatalf("tty printed %q", out)
	}
	term.Signal(unix.SIGKILL)
	<-term.Done()
}

// openHostPTY opens a pty pair on the host's devpts.
func openHostPTY() (int, int, error) {
	m, err := unix.Open("/dev/ptmx", unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, -1, err
	}
	if err := unix.IoctlSetPointerInt(m, unix.TIOCSPTLCK, 0); err != nil {
		unix.Close(m)
		return -1, -1, err
	}
	n, err := unix.IoctlGetInt(m, unix.TIOCGPTN)
	if err != nil {
		unix.Close(m)
		return -1, -1, err
	}
	s, err := unix.Open(fmt.Sprintf("/dev/pts/%d", n), unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		unix.Close(m)
		return -1, -1, err
	}
	return m, s, nil
}

// What runs in a terminal dies with its sandbox, detached children
// included; closing the sandbox ends the terminal's output.
func TestTerminalDiesWithSandbox(t *testing.T) {
	t.Parallel()
	sb, err := newBackend(t).Create(context.Background(), sandbox.Spec{})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	marker := fmt.Sprintf("vivarium-pty-leftover-%d", os.Getpid())
	p, err := sb.Start(context.Background(), sandbox.Command{Argv: []string{"bash", "--norc", "-i"},
		Env: map[string]string{"PS1": "READY$ "}, Terminal: &sandbox.TerminalSize{Rows: 24, Cols: 80}})
	if err != nil {
		t.Fatal(err)
	}
	s := testutil.Watch(p.Stdout())
	s.Expect(t, `READY\$ `)
	testutil.TypeIn(t, p, fmt.Sprintf("(setsid bash -c 'exec -a %s sleep 1000' &) ; nohup bash -c 'exec -a %s sleep 1000' >/dev/null 2>&1 & echo started\n",
		marker, marker))
	s.Expect(t, `\nstarted\r\n`)
	testutil.WaitFor(t, 30*time.Second, "the sandbox's sleeps", func() bool { return len(testutil.ProcessesMatching(marker)) == 2 })
	sb.Close()
	<-p.Done()
	<-s.EOF()
	testutil.WaitFor(t, 30*time.Second, "the sandbox's processes to go", func() bool { return len(testutil.ProcessesMatching(marker)) == 0 })
}
