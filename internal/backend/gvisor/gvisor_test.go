package gvisor_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

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

// leftoversOf lists what a backend's state directory and cgroup parent
// hold beyond a backend's own: probe directories, runsc's containers,
// cgroups, processes of runsc started on dir.
func leftoversOf(t *testing.T, parent, dir string) []string {
	t.Helper()
	var left []string
	probes, _ := filepath.Glob(filepath.Join(dir, "probe-*"))
	left = append(left, probes...)
	left = append(left, testutil.CgroupsUnder(parent)...)
	left = append(left, testutil.ProcessesMatching(dir)...)
	return left
}

// An explicitly requested platform is started for real before New returns:
// one that does not work here fails in seconds (the probe's timeout, not
// the two minutes a sandbox's start may take), names the platform, and
// leaves nothing behind. A name runsc does not know fails at once.
func TestRequestedPlatformFailsFast(t *testing.T) {
	testutil.RequireRoot(t)
	if err := gvisor.Check(); err != nil {
		t.Skip(err)
	}
	const parent = "vivarium-gvisor-platform-test"
	dir := t.TempDir()
	_, err := gvisor.New(gvisor.Config{Platform: "bogus", CgroupParent: parent, StateDir: dir})
	if err == nil {
		t.Fatal("New succeeded with the platform bogus")
	}
	if !errors.Is(err, sandbox.ErrUnsupported) || !strings.Contains(err.Error(), "platform bogus") ||
		!strings.Contains(err.Error(), "unknown platform") {
		t.Errorf("error %q: want ErrUnsupported naming the platform and runsc's reason", err)
	}
	if left := leftoversOf(t, parent, dir); len(left) > 0 {
		t.Errorf("left after a failed probe: %v", left)
	}

	// kvm: where /dev/kvm opens but the platform cannot start a sandbox
	// (this nested VM), the probe gives up after its timeout; where it
	// works, a sandbox runs code on it.
	b, err := gvisor.New(gvisor.Config{Platform: "kvm", CgroupParent: parent, StateDir: dir, ProbeTimeout: 5 * time.Second})
	if err != nil {
		t.Logf("kvm: %v", err)
		if !errors.Is(err, sandbox.ErrUnsupported) || !strings.Contains(err.Error(), "platform kvm") {
			t.Errorf("error %q: want ErrUnsupported naming kvm", err)
		}
		if left := leftoversOf(t, parent, dir); len(left) > 0 {
			t.Errorf("left after a failed probe: %v", left)
		}
		return
	}
	defer b.Close()
	if got := b.Platform(); got.Platform != "kvm" || !got.Requested {
		t.Errorf("platform %v, want kvm as requested", got)
	}
	runPrint(t, b)
}

// Without a platform, New uses the first of PlatformOrder that starts a
// sandbox, says which and why the ones before it were passed over, and
// sandboxes run on it.
func TestDefaultPlatformWorks(t *testing.T) {
	const parent = "vivarium-gvisor-platform-test"
	dir := t.TempDir()
	testutil.RequireRoot(t)
	if err := gvisor.Check(); err != nil {
		t.Skip(err)
	}
	var log bytes.Buffer
	b, err := gvisor.New(gvisor.Config{CgroupParent: parent, StateDir: dir, Logger: slog.New(slog.NewTextHandler(&log, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	c := b.Platform()
	// The server's log names it.
	if want := "gvisor: platform " + c.String(); !strings.Contains(log.String(), strconv.Quote(want)) {
		t.Errorf("log %q lacks %q", log.String(), want)
	}
	order := gvisor.PlatformOrder(gvisor.InVirtualMachine())
	i := slices.Index(order, c.Platform)
	if i < 0 || c.Requested {
		t.Fatalf("platform %v: want one of %v, not requested", c, order)
	}
	if len(c.Rejected) != i {
		t.Errorf("%v: %d platforms before it in %v, %d rejections", c, i, order, len(c.Rejected))
	}
	for j, r := range c.Rejected {
		if r.Platform != order[j] || !strings.Contains(c.String(), r.Err.Error()) {
			t.Errorf("rejection %d: %v (order %v; %q)", j, r, order, c)
		}
	}
	t.Logf("platform %s", c)
	runPrint(t, b)
	if left := leftoversOf(t, parent, dir); len(left) > 0 {
		t.Errorf("left after the probe and a sandbox: %v", left)
	}
}

func runPrint(t *testing.T, b sandbox.Backend) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := sandbox.RunOnce(ctx, b, sandbox.OneShot{Request: sandbox.ExecRequest{Code: "print(6*7)"}})
	if err != nil || res.Status != sandbox.StatusOK || res.Stdout != "42\n" {
		t.Fatalf("%+v %v", res, err)
	}
}

// A gVisor sandbox's interpreter is the host's: it loads the runner's
// bytecode the host's python3 compiled (runner.Bytecode) instead of
// compiling the runner at its start.
func TestRunnerStartsFromBytecode(t *testing.T) {
	b := newBackend(t, "vivarium-gvisor-bytecode-test", t.TempDir())
	defer b.Close()
	sb, err := b.Create(context.Background(), sandbox.Spec{})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	testutil.RequireRunnerFromBytecode(t, sb)
}
