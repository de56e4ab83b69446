package native_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/backend/native"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/testutil"
)

// newZygoteBackend is a backend of its own, with a zygote preloading
// numpy, whatever mode the suite runs in.
func newZygoteBackend(t *testing.T, parent string) *native.Backend {
	t.Helper()
	testutil.RequireRoot(t)
	testutil.RequirePythonModules(t, "numpy")
	b, err := native.New(native.Config{CgroupParent: parent, UIDBase: uidBase, UIDRanges: testutil.UIDRanges, Zygote: true, Preload: []string{"numpy", "json"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Warm(context.Background()); err != nil {
		t.Fatal(err)
	}
	return b
}

func runIn(t *testing.T, b *native.Backend, code string) *sandbox.Result {
	t.Helper()
	res, warn := sandbox.RunOnce(context.Background(), b, sandbox.OneShot{
		Spec: sandbox.Spec{Limits: sandbox.Limits{Timeout: 20 * time.Second}}, Request: sandbox.ExecRequest{Code: code}})
	if warn != nil {
		t.Errorf("warning: %v", warn)
	}
	if res.Status == sandbox.StatusSetupFailed {
		t.Fatalf("setup failed: %s", res.Error.Value)
	}
	return res
}

// What one sandbox does to the preloaded modules, the interpreter, /tmp or
// the random generators never reaches the next one forked from the same
// zygote.
func TestZygoteChildrenShareNothing(t *testing.T) {
	if testutil.ZygoteMode() {
		t.Skip("runs once, with its own zygote")
	}
	b := newZygoteBackend(t, "vivarium-zygote-test")
	defer b.Close()
	first := runIn(t, b, `
import numpy, json, sys, random, os
numpy.sum = lambda *a, **k: "poisoned"
json.dumps = lambda *a, **k: "poisoned"
sys.modules["os"].environ["LEAK"] = "1"
sys.modules["poison"] = sys
import builtins; builtins.leaked = True
open("/tmp/left-by-first", "w").write("x")
open("/workspace/left-by-first", "w").write("x")
print(random.random(), numpy.random.random(), os.getpid())`)
	wantStatus(t, first, sandbox.StatusOK, 0)
	// No writable shared mapping comes from the zygote: it would be one
	// memory for every sandbox.
	maps := runIn(t, b, `print([l for l in open("/proc/self/maps") if l.split()[1][1] == "w" and l.split()[1][3] == "s"])`)
	if maps.Stdout != "[]\n" {
		t.Errorf("writable shared mappings: %s", maps.Stdout)
	}
	second := runIn(t, b, `
import numpy, json, sys, random, os, builtins
print(numpy.sum([1, 2]), json.dumps(1), "LEAK" in os.environ, "poison" in sys.modules, hasattr(builtins, "leaked"),
      os.path.exists("/tmp/left-by-first"), os.path.exists("/workspace/left-by-first"))
print(random.random(), numpy.random.random(), os.getpid())`)
	wantStatus(t, second, sandbox.StatusOK, 0)
	lines := strings.Split(strings.TrimSpace(second.Stdout), "\n")
	if lines[0] != "3 1 False False False False False" {
		t.Errorf("the second sandbox saw the first's changes: %q", lines[0])
	}
	if strings.TrimSpace(first.Stdout) == lines[1] {
		t.Errorf("both sandboxes drew the same random numbers: %q", lines[1])
	}
}

// A sandbox that signals its own process group, or every process it may
// signal (kill -1), reaches nothing outside itself: not the zygote, not a
// sibling forked from it.
func TestZygoteSignalsStayInside(t *testing.T) {
	if testutil.ZygoteMode() {
		t.Skip("runs once, with its own zygote")
	}
	b := newZygoteBackend(t, "vivarium-zygote-signal-test")
	defer b.Close()
	sib, err := b.Create(context.Background(), sandbox.Spec{})
	if err != nil {
		t.Fatal(err)
	}
	defer sib.Close()
	if _, err := sib.Execute(context.Background(), sandbox.ExecRequest{Code: "alive = 1"}, nil); err != nil {
		t.Fatal(err)
	}
	res := runIn(t, b, `
import os, signal
for target in (0, -1):
    try:
        os.kill(target, signal.SIGKILL) if target == -1 else os.killpg(0, signal.SIGTERM)
    except OSError as e:
        print(target, e.errno)
print("still here")`)
	_ = res // the runner may well have killed itself: what matters is the rest
	got, err := sib.Execute(context.Background(), sandbox.ExecRequest{Code: "alive"}, nil)
	if err != nil || got.Status != sandbox.StatusOK || len(got.Results) != 1 || got.Results[0].Text != "1" || got.StateLost {
		t.Fatalf("a sibling sandbox was hit: %+v %v", got, err)
	}
	if again := runIn(t, b, "print('zygote alive')"); again.Stdout != "zygote alive\n" {
		t.Fatalf("the zygote was hit: %+v", again)
	}
}

// Closing the backend ends its zygote: nothing of it remains.
func TestZygoteCloseLeavesNothing(t *testing.T) {
	if testutil.ZygoteMode() {
		t.Skip("runs once, with its own zygote")
	}
	const parent = "vivarium-zygote-close-test"
	b := newZygoteBackend(t, parent)
	runIn(t, b, "print(1)")
	if len(testutil.ZygoteProcesses(uidBase, uidBase+testutil.UIDSpan)) == 0 {
		t.Fatal("no zygote process to begin with")
	}
	b.Close()
	testutil.WaitFor(t, 10*time.Second, "the zygote to be gone", func() bool {
		return len(testutil.ZygoteProcesses(uidBase, uidBase+testutil.UIDSpan)) == 0
	})
	if _, err := b.Create(context.Background(), sandbox.Spec{}); err == nil {
		t.Fatal("a closed backend made a sandbox")
	}
}

// A zygote that has served its number of sandboxes is replaced in the
// background: later sandboxes come from a new zygote, a host user of its
// own, and the old one goes with its last sandbox.
func TestZygoteReplacedAfterItsLimit(t *testing.T) {
	if testutil.ZygoteMode() {
		t.Skip("runs once, with its own zygote")
	}
	testutil.RequireRoot(t)
	b, err := native.New(native.Config{CgroupParent: "vivarium-zygote-replace-test", UIDBase: uidBase,
		UIDRanges: testutil.UIDRanges, Zygote: true, Preload: []string{"json"}, ZygoteMaxSandboxes: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ctx := context.Background()
	create := func() sandbox.Sandbox {
		t.Helper()
		s, err := b.Create(ctx, sandbox.Spec{Limits: sandbox.Limits{Timeout: 20 * time.Second}})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	current := func() native.ZygoteStatus {
		for _, z := range b.Zygotes() {
			if !z.Retired {
				return z
			}
		}
		t.Fatal("no current zygote")
		return native.ZygoteStatus{}
	}
	old := []sandbox.Sandbox{create(), create()}
	first := current()
	if first.Forked != 2 {
		t.Fatalf("the first zygote forked %d sandboxes, want 2", first.Forked)
	}
	// The third is still the old zygote's, and starts its replacement.
	old = append(old, create())
	testutil.WaitFor(t, time.Minute, "the replacement zygote", func() bool { return current().UID != first.UID })
	second := current()
	if second.PID == first.PID || second.Forked != 0 {
		t.Fatalf("replacement %+v, first %+v", second, first)
	}
	fresh := create()
	defer fresh.Close()
	if current().Forked != 1 {
		t.Fatalf("a sandbox after the replacement did not come from the new zygote: %+v", b.Zygotes())
	}
	// The retired zygote still serves its sandboxes (a restart forks a new
	// runner from it), and closes with the last of them.
	if err := old[0].Restart(ctx); err != nil {
		t.Fatalf("restart in a retired zygote's sandbox: %v", err)
	}
	res, err := old[0].Execute(ctx, sandbox.ExecRequest{Code: "print(6*7)"}, nil)
	if err != nil || res.Stdout != "42\n" {
		t.Fatalf("after restart: %v %+v", err, res)
	}
	for _, s := range old {
		s.Close()
	}
	testutil.WaitFor(t, 10*time.Second, "the retired zygote to close", func() bool { return len(b.Zygotes()) == 1 })
	if left := testutil.ProcessesOwnedBy(int(first.UID), int(first.UID)+65536); len(left) > 0 {
		t.Fatalf("the retired zygote left processes: %v", left)
	}
	if left := testutil.ZygoteProcesses(int(first.UID), int(first.UID)+65536); len(left) > 0 {
		t.Fatalf("the retired zygote's processes remain: %v", left)
	}
}

// Closing the backend while a replacement zygote starts in the background
// ends that one too before Close returns: the hostile suite once found a
// zygote's Python alive right after Close.
func TestZygoteCloseDuringReplacement(t *testing.T) {
	if testutil.ZygoteMode() {
		t.Skip("runs once, with its own zygote")
	}
	testutil.RequireRoot(t)
	b, err := native.New(native.Config{CgroupParent: "vivarium-zygote-replace-close-test", UIDBase: uidBase,
		UIDRanges: testutil.UIDRanges, Zygote: true, Preload: []string{"numpy", "pandas"}, ZygoteMaxSandboxes: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ctx := context.Background()
	first := -1 // where the first zygote's range of host users begins
	for range 2 {
		// The second is the first zygote's too, and starts its
		// replacement.
		s, err := b.Create(ctx, sandbox.Spec{})
		if err != nil {
			t.Fatal(err)
		}
		if first < 0 {
			first = uidBase + (int(b.Zygotes()[0].UID)-uidBase)/65536*65536
		}
		s.Close()
	}
	// Close once the replacement's processes are there, while it starts
	// (pandas imported: about a second). With Close waiting for it, the
	// check below holds whenever Close comes.
	testutil.WaitFor(t, time.Minute, "the replacement zygote to start", func() bool {
		return len(testutil.ZygoteProcesses(uidBase, first))+
			len(testutil.ZygoteProcesses(first+65536, uidBase+testutil.UIDSpan)) > 0
	})
	b.Close()
	left := append(testutil.ProcessesOwnedBy(uidBase, uidBase+testutil.UIDSpan),
		testutil.ZygoteProcesses(uidBase, uidBase+testutil.UIDSpan)...)
	if len(left) > 0 {
		t.Fatalf("processes left once Close returned: %v", left)
	}
}
