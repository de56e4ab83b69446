package native

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/testutil"
)

// TestPauseTerminal: a shell in a terminal goes on across a pause, on
// the same process with its variables, its terminal its controlling one
// (Ctrl-C reaches its job, a resize reaches it), what is typed while the
// sandbox is paused read once it resumes; the sandbox forks with the
// shell running, which goes on in the source and is hung up in the copy,
// whose supervisor does not read it. Once the shell has exited, nothing of
// its terminal is left to pause.
func TestPauseTerminal(t *testing.T) {
	bothKinds(t, func(t *testing.T, b *Backend) {
		ctx := context.Background()
		sbx, err := b.Create(ctx, sandbox.Spec{})
		if err != nil {
			t.Fatal(err)
		}
		s := sbx.(*Sandbox)
		defer s.Close()
		p, err := s.Start(ctx, sandbox.Command{Argv: []string{"bash", "--norc", "--noprofile", "-i"},
			Env: map[string]string{"PS1": "READY$ "}, Terminal: &sandbox.TerminalSize{Rows: 24, Cols: 80}})
		if err != nil {
			t.Fatal(err)
		}
		scr := testutil.Watch(p.Stdout())
		scr.Expect(t, `READY\$ `)
		testutil.TypeIn(t, p, "x=kept; echo pid=$$\n")
		pid := scr.Expect(t, `\rpid=([0-9]+)\r\n`)[1]
		// Its confinement, as the kernel tells it.
		const confinement = "grep -E '^(Seccomp|Seccomp_filters|NoNewPrivs|CapInh|CapPrm|CapEff|CapBnd|CapAmb):' /proc/$$/status | tr -s '\\t ' ' ' | tr '\\n' ';'; echo END\n"
		const confined = `((?:(?:Seccomp|Seccomp_filters|NoNewPrivs|Cap[A-Za-z]+): [^;]*;)+)END`
		testutil.TypeIn(t, p, confinement)
		before := scr.Expect(t, confined)[1]

		for round := 1; round <= 2; round++ {
			if err := s.Pause(ctx); err != nil {
				t.Fatalf("pause %d with a shell in a terminal: %v", round, err)
			}
			typed := make(chan error, 1)
			go func() {
				_, err := p.Stdin().Write([]byte(fmt.Sprintf("echo round=%d x=$x pid=$$\n", round)))
				typed <- err
			}()
			if err := p.(sandbox.Resizer).Resize(sandbox.TerminalSize{Rows: 30 + uint16(round), Cols: 90}); err != nil {
				t.Fatal(err)
			}
			select {
			case <-p.Done():
				t.Fatalf("the shell ended when the sandbox paused: %d", p.ExitCode())
			default:
			}
			if err := s.Resume(ctx); err != nil {
				t.Fatalf("resume %d: %v", round, err)
			}
			if err := <-typed; err != nil {
				t.Fatalf("typed while paused: %v", err)
			}
			scr.Expect(t, fmt.Sprintf(`\rround=%d x=kept pid=%s\r\n`, round, pid))
			testutil.TypeIn(t, p, "stty size\n")
			scr.Expect(t, fmt.Sprintf(`\r%d 90\r\n`, 30+round))
		}
		testutil.TypeIn(t, p, confinement)
		if after := scr.Expect(t, confined)[1]; after != before {
			t.Errorf("the shell's confinement after two pauses: %s, before: %s", after, before)
		}
		if !strings.Contains(before, "NoNewPrivs: 1;") || !strings.Contains(before, "Seccomp: 2;") ||
			!strings.Contains(before, "CapEff: 0000000000000000;") {
			t.Errorf("the shell's confinement: %s", before)
		}
		// Still its controlling terminal: Ctrl-C interrupts the job.
		testutil.TypeIn(t, p, "sh -c 'echo sleeping; exec sleep 1000'\n")
		scr.Expect(t, `\rsleeping\r\n`)
		testutil.TypeIn(t, p, "\x03")
		scr.Expect(t, `READY\$ `)
		testutil.TypeIn(t, p, "echo status=$?; tty\n")
		scr.Expect(t, `\rstatus=130\r\n/dev/pts/[0-9]+\r\n`)

		copies, err := s.Fork(ctx, 1, sandbox.ForkOptions{})
		if err != nil {
			t.Fatalf("fork with a shell in a terminal: %v", err)
		}
		c := copies[0].(*Sandbox)
		defer c.Close()
		// In the copy nobody reads the terminal: hung up, the shell ends.
		shells := "import os\nsum(1 for d in os.listdir('/proc') if d.isdigit() and open(f'/proc/{d}/comm').read() == 'bash\\n')"
		for deadline := time.Now().Add(30 * time.Second); execText(t, c, shells) != "0"; time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("the source's shell still runs in the copy")
			}
		}
		testutil.TypeIn(t, p, "echo after-fork x=$x\n")
		scr.Expect(t, `\rafter-fork x=kept\r\n`)

		testutil.TypeIn(t, p, "exit 7\n")
		<-p.Done()
		if p.ExitCode() != 7 {
			t.Fatalf("exit code %d, want 7", p.ExitCode())
		}
		<-scr.EOF()
		if strings.Contains(scr.Shown(), "Hangup") {
			t.Errorf("the source's terminal was hung up: %q", scr.Shown())
		}
		s.mu.Lock()
		left := len(s.terminals)
		s.mu.Unlock()
		if left != 0 {
			t.Errorf("%d terminal(s) still known once the shell's output ended", left)
		}
		// Its pty is gone (neither the supervisor nor init holds a
		// master): the sandbox pauses with nothing of it.
		pauseResume(t, s)
	})
}
