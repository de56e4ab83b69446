package docker_test

import (
	"context"
	"io"
	"testing"

	"github.com/vivarium-sandbox/vivarium/internal/backend/docker"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/testutil"
)

// python is a command here too (the skeleton's shims); the disk is
// reported, CPU and memory are not (the cgroup is dockerd's).
func TestPythonCommandAndUsage(t *testing.T) {
	testutil.RequirePython(t)
	b := newBackend(t, "vivarium-docker-shims-test", docker.Config{})
	ctx := context.Background()
	sb, err := b.Create(ctx, sandbox.Spec{})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
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
	if _, err := sb.(sandbox.UsageReporter).Usage(); err == nil {
		t.Error("usage reported from a cgroup vivarium did not make")
	}
	if _, err := sb.Workspace().(sandbox.DiskUser).DiskUsed(); err != nil {
		t.Fatalf("disk: %v", err)
	}
}
