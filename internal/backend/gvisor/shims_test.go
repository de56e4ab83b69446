package gvisor_test

import (
	"context"
	"io"
	"testing"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

// python is a command here too (the skeleton's shims), and the sandbox
// reports its CPU and memory from its cgroup.
func TestPythonCommandAndUsage(t *testing.T) {
	const parent = "vivarium-gvisor-shims-test"
	dir := t.TempDir()
	b := newBackend(t, parent, dir)
	defer func() {
		b.Close()
		if left := leftoversOf(t, parent, dir); len(left) > 0 {
			t.Errorf("left behind: %v", left)
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sb, err := b.Create(ctx, sandbox.Spec{})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close() // before the backend's
	p, err := sb.Start(ctx, sandbox.Command{Argv: []string{"sh", "-c", "python -c 'print(6 * 7)'"}})
	if err != nil {
		t.Fatal(err)
	}
	p.Stdin().Close()
	out, _ := io.ReadAll(p.Stdout())
	errOut, _ := io.ReadAll(p.Stderr())
	<-p.Done()
	if p.ExitCode() != 0 || string(out) != "42\n" {
		t.Fatalf("python: exit %d, stdout %q, stderr %q", p.ExitCode(), out, errOut)
	}
	u, err := sb.(sandbox.UsageReporter).Usage()
	if err != nil || u.CPU <= 0 || u.Memory <= 0 {
		t.Fatalf("usage: %+v %v", u, err)
	}
	if used, err := sb.Workspace().(sandbox.DiskUser).DiskUsed(); err != nil || used < 0 {
		t.Fatalf("disk: %d %v", used, err)
	}
}
