package gvisor_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vivarium-sandbox/vivarium/internal/backend/gvisor"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/testutil"
)

// The functional and hostile suites (test/conformance, test/hostile) run
// against this backend; these tests are about what is its own.

func newBackend(t *testing.T, parent, dir string) *gvisorBackend {
	t.Helper()
	testutil.RequireRoot(t)
	if err := gvisor.Check(); err != nil {
		t.Skip(err)
	}
	b, err := gvisor.New(gvisor.Config{CgroupParent: parent, StateDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	return &gvisorBackend{b, dir}
}

type gvisorBackend struct {
	sandbox.Backend
	dir string
}

func (g *gvisorBackend) Close() error { return g.Backend.(interface{ Close() error }).Close() }

func (g *gvisorBackend) Sweep() ([]string, error) {
	return g.Backend.(sandbox.Sweeper).Sweep()
}

func containers(t *testing.T, dir string) []string {
	out, err := exec.Command("runsc", "--root", filepath.Join(dir, "runsc"), "list", "-quiet").Output()
	if err != nil {
		t.Fatalf("runsc list: %v", err)
	}
	return strings.Fields(string(out))
}

// A supervisor that died left a running sandbox: the next one's Sweep ends
// it and removes its container, mounts, directories and cgroup.
func TestSweepRemovesWhatACrashLeft(t *testing.T) {
	const parent = "vivarium-gvisor-sweep-test"
	dir := "/run/vivarium/gvisor-sweep-test"
	crashed := newBackend(t, parent, dir)
	sb, err := crashed.Create(context.Background(), sandbox.Spec{})
	if err != nil {
		t.Fatal(err)
	}
	if res, err := sb.Execute(context.Background(), sandbox.ExecRequest{Code: "import subprocess; subprocess.Popen(['sleep', '1000']); 1"}, nil); err != nil || res.Status != sandbox.StatusOK {
		t.Fatalf("%+v %v", res, err)
	}
	if n := len(containers(t, dir)); n != 1 {
		t.Fatalf("%d containers, want 1", n)
	}
	// The successor, as after a crash: the sandbox above is never closed.
	next := newBackend(t, parent, dir)
	swept, err := next.Sweep()
	if err != nil {
		t.Fatal(err)
	}
	if len(swept) == 0 {
		t.Fatal("Sweep found nothing")
	}
	if left := containers(t, dir); len(left) > 0 {
		t.Fatalf("containers left: %v", left)
	}
	if left := testutil.CgroupsUnder(parent); len(left) > 0 {
		t.Fatalf("cgroups left: %v", left)
	}
	for _, m := range testutil.Mounts() {
		if strings.Contains(m, dir) {
			t.Fatalf("mount left: %s", m)
		}
	}
	if entries, _ := os.ReadDir(filepath.Join(dir, "sandboxes")); len(entries) > 0 {
		t.Fatalf("sandbox directories left: %v", entries)
	}
	// The crashed backend's root skeleton went too; the successor's stays
	// until it closes.
	if roots, _ := filepath.Glob(filepath.Join(dir, "root-*")); len(roots) != 1 {
		t.Fatalf("root skeletons %v, want the successor's alone", roots)
	}
	sb.Close() // what the dead supervisor never did: harmless now
	if err := next.Close(); err != nil {
		t.Fatal(err)
	}
	if roots, _ := filepath.Glob(filepath.Join(dir, "root-*")); len(roots) != 0 {
		t.Fatalf("root skeletons left after Close: %v", roots)
	}
}

// A missing runsc is an error that says what to install.
func TestMissingRunsc(t *testing.T) {
	testutil.RequireRoot(t)
	_, err := gvisor.New(gvisor.Config{Runsc: "/nonexistent/runsc", CgroupParent: "vivarium-gvisor-missing-test",
		StateDir: t.TempDir()})
	if err == nil {
		t.Fatal("New succeeded without runsc")
	}
}
