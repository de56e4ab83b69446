package native

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/testutil"
)

// zygotePauseBackend is a backend with a zygote (numpy preloaded) whose
// checkpoints go to a directory of the test's.
func zygotePauseBackend(t testing.TB) *Backend {
	t.Helper()
	testutil.RequireRoot(t)
	testutil.RequirePythonModules(t, "numpy")
	if testutil.ZygoteMode() {
		t.Skip("runs once, with its own zygote")
	}
	b, err := New(Config{CgroupParent: pauseCgroupParent, UIDBase: pauseUIDBase, UIDRanges: 4, Zygote: true,
		Preload: []string{"numpy"}, CheckpointDir: checkpointRoot(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		b.Close()
		noGroupsLeft(t, pauseCgroupParent)
	})
	return b
}

// zygoteSandbox is a sandbox of spec forked from the zygote of a backend of
// zygotePauseBackend's that pauses with CRIU, closed when the test ends.
func zygoteSandbox(t *testing.T, spec sandbox.Spec) (*Backend, *Sandbox) {
	t.Helper()
	bin := requireCRIU(t)
	b := zygotePauseBackend(t)
	b.criuBin = bin
	sbx, err := b.Create(context.Background(), spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := sbx.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return b, sbx.(*Sandbox)
}

// TestOneTreePause: a sandbox forked from a zygote is one process tree,
// its runner init's child, which pauses and resumes with its state (twice),
// forks into copies that go on and pause in turn; its runner is confined
// by Landlock again after every restore.
func TestOneTreePause(t *testing.T) {
	ctx := context.Background()
	// A CPU cap, as a server's sandboxes have.
	_, s := zygoteSandbox(t, sandbox.Spec{Limits: sandbox.Limits{CPUs: 1}})
	// Forked from the zygote: its preloads are there before any import.
	if got := execText(t, s, "import sys\n'numpy' in sys.modules"); got != "True" {
		t.Fatalf("numpy preloaded in the runner: %s", got)
	}
	if got := execText(t, s, "import os, numpy\nx = numpy.arange(5)\nos.getppid()"); got != "1" {
		t.Fatalf("the runner's parent: %s", got)
	}
	// Landlock keeps the runner's file access beneath its root (the
	// zygote's interpreter, its /proc/self/exe, is outside): one domain,
	// which a restore applies again (CRIU saves none).
	oneLandlockDomain(t, s, "before a pause")
	for round := 1; round <= 2; round++ {
		if err := s.Pause(ctx); err != nil {
			t.Fatalf("pause %d: %v", round, err)
		}
		if err := s.Resume(ctx); err != nil {
			t.Fatalf("resume %d: %v", round, err)
		}
		if got := execText(t, s, "x += 1\nint(x.sum())"); got != fmt.Sprint(10+5*round) {
			t.Fatalf("after resume %d: %s", round, got)
		}
		oneLandlockDomain(t, s, fmt.Sprintf("after resume %d", round))
	}
	copies, err := s.Fork(ctx, 2, sandbox.ForkOptions{})
	if err != nil {
		t.Fatalf("fork: %v", err)
	}
	for i, c := range copies {
		defer c.Close()
		if got := execText(t, c.(*Sandbox), "int(x.sum())"); got != "20" {
			t.Errorf("copy %d: %s", i, got)
		}
		oneLandlockDomain(t, c.(*Sandbox), fmt.Sprintf("copy %d", i))
		if err := c.(*Sandbox).Pause(ctx); err != nil {
			t.Fatalf("pause copy %d: %v", i, err)
		}
		if err := c.(*Sandbox).Resume(ctx); err != nil {
			t.Fatalf("resume copy %d: %v", i, err)
		}
		if got := execText(t, c.(*Sandbox), "int(x.sum())"); got != "20" {
			t.Errorf("copy %d resumed: %s", i, got)
		}
	}
}

// oneLandlockDomain fails t unless s's runner is in one Landlock domain:
// the zygote's child confines itself once, and a restore gives it back.
func oneLandlockDomain(t *testing.T, s *Sandbox, when string) {
	t.Helper()
	if got := execText(t, s, landlockLayersCode); got != "1" {
		t.Errorf("%s: the runner is in %s Landlock domains, not 1", when, got)
	}
}

// openResumed opens the paused sandbox kept at dir, as another server
// would, and resumes it; it is closed when t ends.
func openResumed(t *testing.T, b *Backend, dir string, opts sandbox.FromSnapshot) *Sandbox {
	t.Helper()
	o, err := b.OpenPaused(context.Background(), dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { o.Close() })
	if err := o.(*Sandbox).Resume(context.Background()); err != nil {
		t.Fatal(err)
	}
	return o.(*Sandbox)
}

// landlockLayersCode counts the Landlock domains the runner is in.
const landlockLayersCode = testutil.LandlockLayersPython + "landlock_layers()"

// TestOneTreeSnapshot: a forked sandbox saved as a snapshot comes back, in
// a new sandbox, with its state and its runner confined as before; so does
// a paused one written down and opened by another backend.
func TestOneTreeSnapshot(t *testing.T) {
	ctx := context.Background()
	b, s := zygoteSandbox(t, sandbox.Spec{})
	execText(t, s, "import numpy\nx = numpy.arange(4)")
	dir := filepath.Join(t.TempDir(), "snap")
	if _, err := s.SaveSnapshot(ctx, dir); err != nil {
		t.Fatalf("save: %v", err)
	}
	c, err := b.CreateFromSnapshot(ctx, dir, sandbox.FromSnapshot{})
	if err != nil {
		t.Fatalf("from the snapshot: %v", err)
	}
	defer c.Close()
	if got := execText(t, c.(*Sandbox), "int(x.sum())"); got != "6" {
		t.Errorf("from the snapshot: %s", got)
	}
	oneLandlockDomain(t, c.(*Sandbox), "from the snapshot")
}

// TestOneTreeRunnerRestartsAfterRestore: a restored copy of a forked
// sandbox is no longer under its zygote: a runner that dies there is
// started again by the sandbox's own init, and the sandbox goes on.
func TestOneTreeRunnerRestartsAfterRestore(t *testing.T) {
	ctx := context.Background()
	_, s := zygoteSandbox(t, sandbox.Spec{})
	execText(t, s, "x = 1")
	if err := s.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	copies, err := s.Fork(ctx, 1, sandbox.ForkOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer copies[0].Close()
	for name, c := range map[string]*Sandbox{"resumed": s, "copy": copies[0].(*Sandbox)} {
		res, err := c.Execute(ctx, sandbox.ExecRequest{Code: "import os\nos._exit(3)"}, nil)
		if err != nil {
			t.Fatalf("%s: the runner's exit: %v", name, err)
		}
		if res.Status == sandbox.StatusOK {
			t.Fatalf("%s: os._exit answered ok", name)
		}
		if got := execText(t, c, "1 + 1"); got != "2" {
			t.Errorf("%s: after its runner died: %s", name, got)
		}
	}
}

// TestPauseRefusesWhatCannotBeKept: a TCP connection open in the sandbox
// (CRIU does not keep established connections) makes a pause a clear
// refusal that names it, and the sandbox goes on.
func TestPauseRefusesWhatCannotBeKept(t *testing.T) {
	ctx := context.Background()
	_, s := zygoteSandbox(t, sandbox.Spec{})
	execText(t, s, "import socket\nsrv = socket.socket()\nsrv.bind(('127.0.0.1', 0))\nsrv.listen()\n"+
		"c = socket.create_connection(srv.getsockname())\na, _ = srv.accept()\n1")
	err := s.Pause(ctx)
	t.Logf("pause: %v", err)
	if !errors.Is(err, sandbox.ErrCannotKeep) || !strings.Contains(err.Error(), "TCP") {
		t.Fatalf("a pause with a TCP connection open: %v", err)
	}
	if got := execText(t, s, "c.sendall(b'x')\na.recv(1)"); got != "b'x'" {
		t.Errorf("the connection after the refused pause: %s", got)
	}
}
