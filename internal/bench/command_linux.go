package bench

import (
	"context"
	"fmt"
	"os/exec"
	"runtime"
	"strings"
	"syscall"
	"time"
)

// command is an iteration that runs a program and checks what it printed:
// how `vivarium run`, python3, bwrap, runsc and docker are timed.
type command struct {
	argv []string
	env  []string
	want string
}

func (c command) run(ctx context.Context) error {
	cmd := exec.CommandContext(ctx, c.argv[0], c.argv[1:]...)
	cmd.Env = c.env
	var stdout, stderr capBuffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	// A bench killed half-way leaves no peer running.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s: %v: %s", c.argv[0], err, lastLine(stderr.String()))
	}
	if !strings.Contains(stdout.String(), c.want) {
		return fmt.Errorf("%w: %s printed %q, want %q", ErrOutput, c.argv[0], stdout.String(), c.want)
	}
	return nil
}

// peerEnv is the environment every peer runs with, the same base a
// Vivarium sandbox gets, so that no host variable (PYTHONPATH, an OpenBLAS
// setting) makes one subject do different work from another. The thread
// caps are Vivarium's too: numpy starts the same number of BLAS threads
// everywhere.
func peerEnv(extra ...string) []string {
	threads := fmt.Sprint(min(runtime.NumCPU(), 4))
	return append([]string{
		"PATH=/usr/bin:/bin",
		"HOME=/tmp",
		"LANG=C.UTF-8",
		"TZ=UTC",
		"OPENBLAS_NUM_THREADS=" + threads,
		"OMP_NUM_THREADS=" + threads,
		"MKL_NUM_THREADS=" + threads,
	}, extra...)
}

// capBuffer keeps the first 64 KiB written to it: enough to check an
// output or report an error, bounded whatever a broken peer prints.
type capBuffer struct{ b []byte }

const capBufferSize = 64 << 10

func (c *capBuffer) Write(p []byte) (int, error) {
	if room := capBufferSize - len(c.b); room > 0 {
		c.b = append(c.b, p[:min(len(p), room)]...)
	}
	return len(p), nil
}

func (c *capBuffer) String() string { return string(c.b) }

// lastLine is the last non-empty line of a program's stderr: where Python
// and most tools say what went wrong.
func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if l := strings.TrimSpace(lines[len(lines)-1]); l != "" {
		return l
	}
	return "(nothing on stderr)"
}
