//go:build linux

package conformance

import (
	"context"
	"io"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/testutil"
)

// runTerminal: a command in a terminal has a pty of the sandbox's as its
// controlling terminal and standard streams, follows resizes, echoes what
// is typed, takes Ctrl-C, and its stderr is empty; the sandbox's code
// opens ptys of its own.
func runTerminal(t *testing.T, be *backend) { terminalCase(t, be, true) }

// terminalCase is runTerminal; without ctrlC, the command is interrupted
// by a signal to its group rather than by typing Ctrl-C.
func terminalCase(t *testing.T, be *backend, ctrlC bool) {
	sb := be.create(t, sandbox.Spec{})
	p, err := sb.Start(context.Background(), sandbox.Command{Argv: []string{"sh", "-c",
		`tty; stty size; echo term=$TERM; IFS= read -r line; echo got=$line; stty size; exec sleep 1000`},
		Terminal: &sandbox.TerminalSize{Rows: 24, Cols: 80}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Signal(9) })
	s := testutil.Watch(p.Stdout())
	s.Expect(t, regexp.QuoteMeta("24 80\r\nterm=xterm-256color\r\n"))
	if !strings.HasPrefix(s.Shown(), "/dev/pts/") {
		t.Fatalf("tty printed %q", s.Shown())
	}
	if err := p.(sandbox.Resizer).Resize(sandbox.TerminalSize{Rows: 30, Cols: 100}); err != nil {
		t.Fatal(err)
	}
	io.WriteString(p.Stdin(), "hello\n")
	s.Expect(t, regexp.QuoteMeta("hello\r\ngot=hello\r\n30 100\r\n"))
	if ctrlC {
		io.WriteString(p.Stdin(), "\x03") // SIGINT to the foreground group: sleep
	} else if err := p.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.Done():
	case <-time.After(30 * time.Second):
		t.Fatalf("the interrupt did not end the command; the terminal showed %q", s.Shown())
	}
	if p.ExitCode() != 130 {
		t.Fatalf("exit %d, want 130 (SIGINT)", p.ExitCode())
	}
	if errOut, _ := io.ReadAll(p.Stderr()); len(errOut) > 0 {
		t.Fatalf("stderr %q, want nothing", errOut)
	}
	res := exec(t, sb, code("import os\nm, s = os.openpty()\nprint(os.ttyname(s).startswith('/dev/pts/'), os.isatty(s))"))
	wantStdout(t, res, "True True\n")
}

// runTerminalJobs: signalling a command in a terminal reaches every
// process of its session, the jobs of a shell in it too (process groups
// of their own), and the sandbox lives on.
func runTerminalJobs(t *testing.T, be *backend) {
	sb := be.create(t, sandbox.Spec{})
	p, err := sb.Start(context.Background(), sandbox.Command{Argv: []string{"bash", "--norc", "--noprofile", "-i"},
		Terminal: &sandbox.TerminalSize{Rows: 24, Cols: 80}})
	if err != nil {
		t.Fatal(err)
	}
	s := testutil.Watch(p.Stdout())
	io.WriteString(p.Stdin(), "sleep 1234 & sleep 1235 & echo started-$((2*3))\n")
	s.Expect(t, regexp.QuoteMeta("started-6\r\n"))
	count := `
import os, time
def sleeps():
    n = 0
    for pid in os.listdir("/proc"):
        try:
            if pid.isdigit() and open("/proc/%s/cmdline" % pid, "rb").read().startswith(b"sleep\x00123"):
                n += 1
        except OSError:
            pass
    return n
`
	// The jobs are forked before the echo, but may exec later: the
	// bound is for a failing test only.
	wantStdout(t, exec(t, sb, code(count+`
for _ in range(300):
    if sleeps() == 2:
        break
    time.sleep(0.05)
print(sleeps())`)), "2\n")
	if err := p.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("SIGKILL did not end the command")
	}
	// The bound is for a failing test only.
	res := exec(t, sb, code(count+`
for _ in range(300):
    if sleeps() == 0:
        break
    time.sleep(0.05)
print(sleeps())`))
	wantStdout(t, res, "0\n")
}
