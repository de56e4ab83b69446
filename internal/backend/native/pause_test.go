package native

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vivarium-sandbox/vivarium/internal/criu"
	"github.com/vivarium-sandbox/vivarium/internal/fileutil"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/testutil"
)

// Cgroup parents and host users of the pause tests' own, apart from the
// other tests' (and from the checkpoint tests').
const (
	pauseCgroupParent = "vivarium-native-pause-test"
	pauseUIDBase      = DefaultUIDBase + 28<<24
	benchCgroupParent = "vivarium-native-pause-bench"
	benchUIDBase      = DefaultUIDBase + 29<<24
)

// pauseBackend is a classic backend whose checkpoints go to a directory
// of the test's, closed when the test ends.
func pauseBackend(t testing.TB, parent string, uidBase uint32) *Backend {
	t.Helper()
	testutil.RequireRoot(t)
	testutil.RequirePython(t)
	if testutil.ZygoteMode() {
		t.Skip("pause is of classic sandboxes only, tested in the classic run")
	}
	b, err := New(Config{CgroupParent: parent, UIDBase: uidBase, UIDRanges: 4, CheckpointDir: checkpointRoot(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		b.Close()
		noGroupsLeft(t, parent)
	})
	return b
}

// noGroupsLeft fails t if a sandbox's group is left under parent once t
// has closed its sandboxes: the test that leaves it is named, not the
// next one that looks.
func noGroupsLeft(t testing.TB, parent string) {
	t.Helper()
	if left := testutil.CgroupsUnder(parent); len(left) != 0 {
		t.Errorf("cgroups left: %s", testutil.DescribeCgroups(left))
	}
}

// TestPauseResume pauses a sandbox that holds Python state, an imported
// module, an open file, a child process, a listening socket and a second
// code context: its processes end and its cgroup's memory drops, every
// call but file access answers ErrPaused; resumed, all of it is there,
// confined as before, and new commands start. Twice; then Close leaves
// nothing behind.
func TestPauseResume(t *testing.T) {
	bin := requireCRIU(t)
	b := pauseBackend(t, pauseCgroupParent, pauseUIDBase)
	b.criuBin = bin
	ctx := context.Background()
	sbx, err := b.Create(ctx, sandbox.Spec{})
	if err != nil {
		t.Fatal(err)
	}
	s := sbx.(*Sandbox)
	closed := false
	t.Cleanup(func() {
		if !closed {
			s.Close()
		}
	})
	code := "x = 41\nimport decimal, sys, os, socket\nopen('kept.txt', 'w').write('kept')\n" +
		"f = open('open.txt', 'w+')\nf.write('abc')\nf.flush()\n" +
		"import subprocess\nchild = subprocess.Popen(['sleep', '600'])\n" +
		"os.makedirs('sub', exist_ok=True)\nos.chdir('sub')\n" +
		"srv = socket.socket()\nsrv.bind(('127.0.0.1', 8765))\nsrv.listen()"
	if res, err := s.Execute(ctx, sandbox.ExecRequest{Code: code}, nil); err != nil || res.Status != sandbox.StatusOK {
		t.Fatalf("%s: %+v %v", code, res, err)
	}
	cc, err := s.CreateContext("python", "")
	if err != nil {
		t.Fatal(err)
	}
	if res, err := s.Execute(ctx, sandbox.ExecRequest{Code: "y = 7", Context: cc.ID}, nil); err != nil || res.Status != sandbox.StatusOK {
		t.Fatalf("y = 7 in a context: %+v %v", res, err)
	}
	// What confines it, as its processes see it, before.
	confinement := func() map[string]string {
		m := map[string]string{
			"mounts":  execText(t, s, mountsCode),
			"uid_map": execText(t, s, "' '.join(open('/proc/self/uid_map').read().split())"),
			"gid_map": execText(t, s, "' '.join(open('/proc/self/gid_map').read().split())"),
			"cgroup":  execText(t, s, "open('/proc/self/cgroup').read().strip()"),
			"keys":    execText(t, s, "len(open('/proc/keys').read())"),
		}
		for _, name := range budgetFiles {
			m[name] = execText(t, s, readCode(name))
		}
		return m
	}
	before := confinement()
	if !strings.HasPrefix(before["unshare"], "(-1, ") {
		t.Fatalf("unshare(CLONE_NEWUSER) in the sandbox: %s", before["unshare"])
	}
	if !strings.Contains(before["/proc/self/status"], "NoNewPrivs: 1") || !strings.Contains(before["/proc/self/status"], "Seccomp: 2") {
		t.Fatalf("the runner's confinement: %s", before["/proc/self/status"])
	}
	hostCgroup := s.cg.Path()

	for round := 1; round <= 2; round++ {
		t.Run(fmt.Sprintf("round%d", round), func(t *testing.T) {
			tree, err := processTree(s.init.pid)
			if err != nil {
				t.Fatal(err)
			}
			memBefore := cgroupMemory(s)
			pauseTook := testutil.Pause(t, s)
			memAfter := cgroupMemory(s)
			t.Logf("pause: %v; the cgroup holds %d KiB before, %d KiB after", pauseTook.Round(time.Millisecond), memBefore>>10, memAfter>>10)
			// Its processes are gone and their memory with them; what the
			// cgroup keeps is the root tmpfs (its files).
			if memAfter < 0 || memAfter > memBefore/2 {
				t.Errorf("the cgroup's memory went from %d KiB to %d KiB: no real drop", memBefore>>10, memAfter>>10)
			}
			if pids, err := s.cg.Procs(); err != nil || len(pids) != 0 {
				t.Errorf("processes left in the paused sandbox's cgroup: %v %v", pids, err)
			}
			for _, pid := range tree {
				if st := procState(pid); st != "" && st != "Z" {
					t.Errorf("process %d of the paused sandbox still runs", pid)
				}
			}
			// Every call that needs its processes says it is paused; its
			// files are still there.
			testutil.CheckPaused(t, s, 8765, "kept.txt")

			t.Logf("resume: %v", testutil.Resume(t, s).Round(time.Millisecond))
			for code, want := range map[string]string{
				"x + 1":                      "42",
				"'decimal' in sys.modules":   "True",
				"f.seek(0); f.read()":        "abc",
				"child.poll() is None":       "True",
				"open('../kept.txt').read()": "kept",
				"os.getcwd()":                "/workspace/sub",
			} {
				if got := execText(t, s, code); got != want {
					t.Errorf("%s after resume: %q, want %q", code, got, want)
				}
			}
			res, err := s.Execute(ctx, sandbox.ExecRequest{Code: "y", Context: cc.ID}, nil)
			if err != nil || res.Status != sandbox.StatusOK || len(res.Results) == 0 || res.Results[0].Text != "7" {
				t.Errorf("y in its context after resume: %+v %v", res, err)
			}
			// Confined as before: mounts and their flags, uid and gid
			// maps, cgroup, seccomp (an unshare refused the same way),
			// no_new_privs, capabilities, budgets, rlimits.
			after := confinement()
			for k, v := range before {
				if after[k] != v {
					t.Errorf("%s after resume:\n%s\nbefore:\n%s", k, after[k], v)
				}
			}
			if s.cg.Path() != hostCgroup {
				t.Errorf("cgroup %s after resume, %s before", s.cg.Path(), hostCgroup)
			}
			// Every restored process, each of its threads too (init's are
			// many), is in the group in every hierarchy: CRIU moved each
			// task there before it made its threads.
			pids, err := s.cg.Procs()
			if err != nil || len(pids) < 3 {
				t.Errorf("the resumed sandbox's group holds %v (%v): want init, the runner and the child", pids, err)
			}
			for _, pid := range pids {
				threadsInGroup(t, "after resume", b.cgroups.Version(), pid, hostCgroup)
			}
			// New commands start, and the listening socket is reached in
			// the restored network namespace.
			p, err := s.Start(ctx, sandbox.Command{Argv: []string{"sh", "-c", "echo started; pwd"}})
			if err != nil {
				t.Fatalf("start a command after resume: %v", err)
			}
			if out, _ := io.ReadAll(p.Stdout()); !strings.HasPrefix(string(out), "started\n") || p.ExitCode() != 0 {
				t.Errorf("command after resume: %q, exit %d", out, p.ExitCode())
			}
			conn, err := s.DialPort(ctx, 8765)
			if err != nil {
				t.Errorf("DialPort to the listening socket after resume: %v", err)
			} else {
				conn.Close()
			}
			if got := execText(t, s, "c, _ = srv.accept(); c.close(); 'accepted'"); got != "accepted" {
				t.Errorf("accept after resume: %q", got)
			}
		})
	}

	dir := filepath.Join(b.cfg.CheckpointDir, s.id)
	// What is left of two pauses: the last checkpoint, without its
	// images (the /proc masks' copies, bound in the sandbox), and the
	// masks' files they are links to (maskStore).
	entries, err := os.ReadDir(dir)
	entries = slices.DeleteFunc(entries, func(e os.DirEntry) bool { return e.Name() == "masks" })
	if err != nil || len(entries) != 1 {
		t.Errorf("the sandbox's checkpoint directory holds %v (%v), want the last checkpoint", entries, err)
	} else if _, err := os.Stat(filepath.Join(dir, entries[0].Name(), "images")); !os.IsNotExist(err) {
		t.Errorf("the images of a resumed sandbox: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	closed = true
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("the checkpoint directory after Close: %v", err)
	}
	noGroupsLeft(t, pauseCgroupParent)
	if left := testutil.ProcessesOwnedBy(int(pauseUIDBase), int(pauseUIDBase)+4<<16); len(left) != 0 {
		t.Errorf("processes left: %v", left)
	}
	for _, m := range testutil.Mounts() {
		if strings.Contains(m, filepath.Dir(b.cfg.CheckpointDir)) {
			t.Errorf("mount left: %s", m)
		}
	}
}

// TestPauseClosePaused closes a paused sandbox: its checkpoint, files and
// cgroup go, and nothing of it is left.
func TestPauseClosePaused(t *testing.T) {
	bin := requireCRIU(t)
	b := pauseBackend(t, pauseCgroupParent, pauseUIDBase)
	b.criuBin = bin
	ctx := context.Background()
	sbx, err := b.Create(ctx, sandbox.Spec{})
	if err != nil {
		t.Fatal(err)
	}
	s := sbx.(*Sandbox)
	if res, err := s.Execute(ctx, sandbox.ExecRequest{Code: "import subprocess; p = subprocess.Popen(['sleep', '600'])"}, nil); err != nil || res.Status != sandbox.StatusOK {
		t.Fatalf("%+v %v", res, err)
	}
	if err := s.Pause(ctx); err != nil {
		s.Close()
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Resume(ctx); !errors.Is(err, sandbox.ErrClosed) {
		t.Errorf("Resume after Close: %v", err)
	}
	if entries, _ := os.ReadDir(b.cfg.CheckpointDir); len(entries) != 0 {
		t.Errorf("checkpoints left: %v", entries)
	}
	noGroupsLeft(t, pauseCgroupParent)
	if left := testutil.ProcessesOwnedBy(int(pauseUIDBase), int(pauseUIDBase)+4<<16); len(left) != 0 {
		t.Errorf("processes left: %v", left)
	}
}

// TestPauseFailedResume: a resume that fails (here criu itself) leaves
// the sandbox paused, and a second one resumes it.
func TestPauseFailedResume(t *testing.T) {
	bin := requireCRIU(t)
	b := pauseBackend(t, pauseCgroupParent, pauseUIDBase)
	b.criuBin = bin
	ctx := context.Background()
	sbx, err := b.Create(ctx, sandbox.Spec{})
	if err != nil {
		t.Fatal(err)
	}
	s := sbx.(*Sandbox)
	defer s.Close()
	execText(t, s, "x = 41")
	if err := s.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	fake := filepath.Join(t.TempDir(), "criu")
	if err := os.WriteFile(fake, []byte("#!/bin/sh\necho 'Error (criu/cr-restore.c:1): refused' >&2\nexit 1\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	b.criuMu.Lock()
	b.criuBin = fake
	b.criuMu.Unlock()
	if err := s.Resume(ctx); err == nil || !strings.Contains(err.Error(), "refused") {
		t.Fatalf("resume with a failing criu: %v", err)
	}
	if !s.Paused() {
		t.Fatal("not paused after a failed resume")
	}
	if _, err := s.Execute(ctx, sandbox.ExecRequest{Code: "x"}, nil); !errors.Is(err, sandbox.ErrPaused) {
		t.Errorf("Execute after a failed resume: %v", err)
	}
	b.criuMu.Lock()
	b.criuBin = bin
	b.criuMu.Unlock()
	if err := s.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	if got := execText(t, s, "x + 1"); got != "42" {
		t.Errorf("x + 1 after resume: %q", got)
	}
}

// TestPauseUnsupported: sandboxes that cannot be paused say why, as
// ErrUnsupported, and go on.
func TestPauseUnsupported(t *testing.T) {
	b := pauseBackend(t, pauseCgroupParent, pauseUIDBase)
	ctx := context.Background()
	sbx, err := b.Create(ctx, sandbox.Spec{OneShot: true})
	if err != nil {
		t.Fatal(err)
	}
	defer sbx.Close()
	if err := sbx.(sandbox.Pauser).Pause(ctx); !errors.Is(err, sandbox.ErrUnsupported) || !strings.Contains(err.Error(), "one-shot") {
		t.Errorf("pause a one-shot sandbox: %v", err)
	}
	// Without CRIU: named, with how to get it.
	sbx2, err := b.Create(ctx, sandbox.Spec{})
	if err != nil {
		t.Fatal(err)
	}
	defer sbx2.Close()
	t.Setenv("VIVARIUM_CRIU", "/nonexistent/criu")
	t.Setenv("VIVARIUM_CRIU_DIR", "/nonexistent")
	t.Setenv("PATH", "/nonexistent")
	t.Setenv("HOME", t.TempDir())
	err = sbx2.(sandbox.Pauser).Pause(ctx)
	if !errors.Is(err, sandbox.ErrUnsupported) || !strings.Contains(err.Error(), "make criu") {
		t.Errorf("pause without CRIU: %v", err)
	}
	if res, err := sbx2.Execute(ctx, sandbox.ExecRequest{Code: "1 + 1"}, nil); err != nil || res.Status != sandbox.StatusOK {
		t.Errorf("the sandbox after a refused pause: %+v %v", res, err)
	}
}

// TestPauseOldCRIU: a CRIU that make criu built before the patches pausing
// needs is refused, naming them and make criu.
func TestPauseOldCRIU(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "BUILD-INFO"), []byte("criu 4.1.1\npatched: external-deleted-mount.patch\n"+
		"patched: rlimits-from-proc.patch\nVersion: 4.1.1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	got := criu.MissingPatches(filepath.Join(dir, "criu"), criuPatches)
	if want := []string{"socket-pass-opts.patch", "userns-check-fds.patch", "landlock-restore.patch"}; !slices.Equal(got, want) {
		t.Errorf("missing patches: %v, want %v", got, want)
	}
	if got := criu.MissingPatches(filepath.Join(t.TempDir(), "criu"), criuPatches); got != nil {
		t.Errorf("a CRIU without BUILD-INFO: %v", got)
	}
	for _, p := range criuPatches {
		if _, err := os.Stat(filepath.Join("..", "..", "..", "scripts", "criu", p)); err != nil {
			t.Errorf("criuPatches names %s: %v", p, err)
		}
	}
}

// BenchmarkPauseResume pauses and resumes one sandbox over and over:
// idle (x = 41), and holding pandas and a DataFrame. It reports each
// step's mean time ("pause-ms", "resume-ms"), the images' size and what
// the cgroup keeps while paused (its files). Run with:
// VIVARIUM_TEST_ONE_MODE=1 go test -run '^$' -bench PauseResume ./internal/backend/native/
func BenchmarkPauseResume(b *testing.B) {
	for _, bc := range []struct{ name, code string }{
		{"idle", "x = 41"},
		{"pandas", "import pandas as pd\ndf = pd.DataFrame({'a': range(1000)})\nx = 41"},
	} {
		b.Run(bc.name, func(b *testing.B) {
			bin := requireCRIU(b)
			bk := pauseBackend(b, benchCgroupParent, benchUIDBase)
			bk.criuBin = bin
			ctx := context.Background()
			sbx, err := bk.Create(ctx, sandbox.Spec{})
			if err != nil {
				b.Fatal(err)
			}
			s := sbx.(*Sandbox)
			defer s.Close()
			if res, err := s.Execute(ctx, sandbox.ExecRequest{Code: bc.code}, nil); err != nil || res.Status != sandbox.StatusOK {
				b.Skipf("%s: %+v %v", bc.code, res, err)
			}
			var pause, resume time.Duration
			var images, kept int64
			n := 0
			for b.Loop() {
				start := time.Now()
				if err := s.Pause(ctx); err != nil {
					b.Fatal(err)
				}
				pause += time.Since(start)
				images += fileutil.DirSize(s.cp.images())
				kept += cgroupMemory(s)
				start = time.Now()
				if err := s.Resume(ctx); err != nil {
					b.Fatal(err)
				}
				resume += time.Since(start)
				n++
			}
			b.StopTimer()
			if res, err := s.Execute(ctx, sandbox.ExecRequest{Code: "x + 1"}, nil); err != nil || len(res.Results) == 0 || res.Results[0].Text != "42" {
				b.Fatalf("x + 1 after %d pauses: %+v %v", n, res, err)
			}
			b.ReportMetric(float64(pause.Microseconds())/1000/float64(n), "pause-ms")
			b.ReportMetric(float64(resume.Microseconds())/1000/float64(n), "resume-ms")
			b.ReportMetric(float64(images)/float64(n)/(1<<20), "images-MiB")
			b.ReportMetric(float64(kept)/float64(n)/(1<<20), "paused-cgroup-MiB")
		})
	}
}

// pausableSandbox makes a sandbox on the pause backend, with CRIU,
// closed with the test.
func pausableSandbox(t *testing.T) *Sandbox {
	t.Helper()
	bin := requireCRIU(t)
	b := pauseBackend(t, pauseCgroupParent, pauseUIDBase)
	b.criuBin = bin
	sbx, err := b.Create(context.Background(), sandbox.Spec{})
	if err != nil {
		t.Fatal(err)
	}
	s := sbx.(*Sandbox)
	t.Cleanup(func() { s.Close() })
	return s
}

// TestPauseBusy: a sandbox running an execution is not paused
// (ErrBusy), and goes on.
func TestPauseBusy(t *testing.T) {
	s := pausableSandbox(t)
	ctx := context.Background()
	done := make(chan error, 1)
	go func() {
		_, err := s.Execute(ctx, sandbox.ExecRequest{Code: "import time; time.sleep(1.5); x = 41"}, nil)
		done <- err
	}()
	for !s.Busy() {
		time.Sleep(5 * time.Millisecond)
	}
	if err := s.Pause(ctx); !errors.Is(err, sandbox.ErrBusy) {
		t.Errorf("pause during an execution: %v", err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := s.Pause(ctx); err != nil {
		t.Fatalf("pause once the execution ended: %v", err)
	}
	if err := s.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	if got := execText(t, s, "x + 1"); got != "42" {
		t.Errorf("x + 1 after resume: %q", got)
	}
}

// TestPauseAllDescriptorsTaken: a sandbox one of whose processes has
// opened files up to its RLIMIT_NOFILE cannot be saved (CRIU's parasite
// opens its own in each process): the pause is refused as busy, saying
// why, and the sandbox goes on; once it closes them it pauses.
func TestPauseAllDescriptorsTaken(t *testing.T) {
	s := pausableSandbox(t)
	ctx := context.Background()
	execText(t, s, `import os
x = 41
fs = []
try:
    while True: fs.append(os.open("/dev/null", os.O_RDONLY))
except OSError:
    pass
len(fs)`)
	err := s.Pause(ctx)
	if !errors.Is(err, sandbox.ErrBusy) || !strings.Contains(err.Error(), "files open") || s.Paused() {
		t.Fatalf("pause with every descriptor taken: %v", err)
	}
	if got := execText(t, s, "for f in fs: os.close(f)\nx + 1"); got != "42" {
		t.Fatalf("after the refused pause: %q", got)
	}
	pauseResume(t, s)
	if got := execText(t, s, "x + 1"); got != "42" {
		t.Errorf("x + 1 after resume: %q", got)
	}
}

// TestPauseRunnersDaemon: a daemon the sandbox's code forked from the
// runner keeps the runner's pipes (a fork keeps its parent's
// descriptors). After a restore it may come before the runner in the
// tree, and the next pause named it as their holder: the resume then
// failed ("lacks the runner's pipes") and the sandbox stayed paused.
func TestPauseRunnersDaemon(t *testing.T) {
	s := pausableSandbox(t)
	execText(t, s, `import os, time
if os.fork() == 0:
    if os.fork() == 0:
        os.setsid()
        while True: time.sleep(1)
    os._exit(0)
os.wait()
x = 41`)
	for round := range 4 {
		pauseResume(t, s)
		if got := execText(t, s, "x + 1"); got != "42" {
			t.Fatalf("round %d: x + 1 after resume: %q", round, got)
		}
	}
}

// TestPauseSweep: a killed supervisor's checkpoints are removed by the
// next one's Sweep (their files died with it), with what it left mounted
// there (a fork's files, a killed criu's cgroup yard).
func TestPauseSweep(t *testing.T) {
	b := pauseBackend(t, pauseCgroupParent, pauseUIDBase)
	left := filepath.Join(b.cfg.CheckpointDir, "0123456789abcdef", "1", "images")
	if err := os.MkdirAll(filepath.Join(left, ".criu.cgyard.x"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", filepath.Join(left, ".criu.cgyard.x"), "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Sweep(); err != nil {
		t.Fatal(err)
	}
	if entries, err := os.ReadDir(b.cfg.CheckpointDir); err != nil || len(entries) != 0 {
		t.Errorf("after Sweep: %v %v", entries, err)
	}
}

// TestPauseKeepsCommands: a command started before the pause goes on
// after the resume, on the same Process: its output before and after, its
// input written while paused, its exit status. It cannot be signalled
// while paused (ErrPaused), and Close of a paused sandbox ends it.
func TestPauseKeepsCommands(t *testing.T) {
	s := pausableSandbox(t)
	ctx := context.Background()
	p, err := s.Start(ctx, sandbox.Command{Argv: []string{"sh", "-c", "echo one; read x; echo got $x; echo err >&2; exit 3"}})
	if err != nil {
		t.Fatal(err)
	}
	out := bufio.NewReader(p.Stdout())
	if l, err := out.ReadString('\n'); l != "one\n" || err != nil {
		t.Fatalf("before the pause: %q %v", l, err)
	}
	for round := 1; round <= 2; round++ {
		if err := s.Pause(ctx); err != nil {
			t.Fatal(err)
		}
		select {
		case <-p.Done():
			t.Fatalf("the command ended when the sandbox paused (round %d): %d", round, p.ExitCode())
		case <-time.After(100 * time.Millisecond):
		}
		if err := p.Signal(syscall.SIGTERM); !errors.Is(err, sandbox.ErrPaused) {
			t.Errorf("signal a command while paused: %v", err)
		}
		if round == 2 {
			// Written while paused: the command reads it once resumed.
			if _, err := io.WriteString(p.Stdin(), "hello\n"); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.Resume(ctx); err != nil {
			t.Fatal(err)
		}
	}
	rest, _ := io.ReadAll(out)
	errOut, _ := io.ReadAll(p.Stderr())
	if string(rest) != "got hello\n" || string(errOut) != "err\n" || p.ExitCode() != 3 {
		t.Errorf("after two pauses: stdout %q, stderr %q, exit %d", rest, errOut, p.ExitCode())
	}

	// A command running when a paused sandbox closes ends with it.
	p2, err := s.Start(ctx, sandbox.Command{Argv: []string{"sleep", "600"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p2.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("a command of a paused sandbox did not end with its Close")
	}
	if left := testutil.ProcessesOwnedBy(int(pauseUIDBase), int(pauseUIDBase)+4<<16); len(left) != 0 {
		t.Errorf("processes left: %v", left)
	}
}

// TestPauseResumedSandboxWorks: after a resume the sandbox is a sandbox
// like any: output streams, an interrupt stops a loop and keeps the state,
// Restart gives a fresh runner, a runner that exits (os._exit) or runs out
// its time is replaced (the state reported lost), and it pauses again. With pandas, when the host has it, a DataFrame made
// before the pause is read back.
func TestPauseResumedSandboxWorks(t *testing.T) {
	s := pausableSandbox(t)
	ctx := context.Background()
	pandas := execText(t, s, "import importlib.util; importlib.util.find_spec('pandas') is not None") == "True"
	code := "n = 0"
	if pandas {
		code = "import pandas as pd\ndf = pd.DataFrame({'a': [1, 2, 3]})\nn = 0"
	}
	execText(t, s, code)
	if err := s.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	if pandas {
		if got := execText(t, s, "int(df['a'].sum())"); got != "6" {
			t.Errorf("the DataFrame after resume: %q", got)
		}
	}
	// Streaming and an interrupt.
	started := make(chan struct{})
	var once sync.Once
	go func() {
		<-started
		s.Interrupt()
	}()
	res, err := s.Execute(ctx, sandbox.ExecRequest{Code: "while True:\n    n += 1\n    if n == 1000: print('looping', flush=True)"},
		sinkFunc(func([]byte) { once.Do(func() { close(started) }) }))
	if err != nil || res.Status != sandbox.StatusError || res.Error == nil || res.Error.Name != "KeyboardInterrupt" || res.StateLost {
		t.Fatalf("interrupt after resume: %+v %v", res, err)
	}
	if got := execText(t, s, "n > 0"); got != "True" {
		t.Errorf("state after the interrupt: %q", got)
	}
	// Restart: a fresh runner, from the restored init.
	if err := s.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	if got := execText(t, s, "'n' in dir()"); got != "False" {
		t.Errorf("state after Restart: %q", got)
	}
	// A runner that exits reports it (state lost); the next execution
	// gets a new one. So does a timeout.
	execText(t, s, "y = 5")
	res, err = s.Execute(ctx, sandbox.ExecRequest{Code: "import os; os._exit(9)"}, nil)
	if err != nil || res.ExitCode != 9 || !res.StateLost {
		t.Errorf("os._exit after resume: %+v %v", res, err)
	}
	if got := execText(t, s, "'y' in globals()"); got != "False" {
		t.Errorf("state after the runner exited: %q", got)
	}
	res, err = s.Execute(ctx, sandbox.ExecRequest{Code: "while True: pass", Timeout: 500 * time.Millisecond}, nil)
	if err != nil || res.Status != sandbox.StatusTimeout || !res.StateLost {
		t.Errorf("timeout after resume: %+v %v", res, err)
	}
	// And it pauses again.
	execText(t, s, "m = 5")
	pauseResume(t, s)
	if got := execText(t, s, "m * 2"); got != "10" {
		t.Errorf("m * 2 after a restart and a second pause: %q", got)
	}
}

type sinkFunc func([]byte)

func (f sinkFunc) Stdout(p []byte) { f(p) }
func (f sinkFunc) Stderr(p []byte) { f(p) }

// TestPauseEgress: a sandbox with network access (its proxy listening in
// its network namespace) is paused and resumed, and finds its proxy again
// at the same address; the proxy's old listener is closed, and nothing
// of it is left after Close. A classic sandbox and a zygote's.
func TestPauseEgress(t *testing.T) {
	for _, kind := range []struct {
		name    string
		backend func(testing.TB) *Backend
	}{
		{"classic", func(t testing.TB) *Backend { return pauseBackend(t, pauseCgroupParent, pauseUIDBase) }},
		{"forked", zygotePauseBackend},
	} {
		t.Run(kind.name, func(t *testing.T) { testPauseEgress(t, kind.backend) })
	}
}

func testPauseEgress(t *testing.T, backend func(testing.TB) *Backend) {
	bin := requireCRIU(t)
	b := backend(t)
	b.criuBin = bin
	ctx := context.Background()
	e := testutil.NewEgress(t, testutil.EgressConfig{Allow: []string{"example.com"}, Names: map[string][]netip.Addr{}})
	sbx, err := b.Create(ctx, sandbox.Spec{Egress: e})
	if err != nil {
		t.Fatal(err)
	}
	s := sbx.(*Sandbox)
	defer s.Close()
	if got := execText(t, s, askProxy); !strings.HasPrefix(got, "HTTP/1.") {
		t.Fatalf("the proxy before the pause: %q", got)
	}
	for round := 1; round <= 2; round++ {
		if err := s.Pause(ctx); err != nil {
			t.Fatal(err)
		}
		if err := s.Resume(ctx); err != nil {
			t.Fatal(err)
		}
		if got := execText(t, s, askProxy); !strings.HasPrefix(got, "HTTP/1.") {
			t.Errorf("the proxy after resume %d: %q", round, got)
		}
	}
	// Kept on disk and released, then resumed from there: its proxy again.
	if err := s.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	kept := filepath.Join(t.TempDir(), "kept")
	if _, err := s.PersistPaused(ctx, kept); err != nil {
		t.Fatal(err)
	}
	if err := s.ReleasePaused(kept); err != nil {
		t.Fatal(err)
	}
	if err := s.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	if got := execText(t, s, askProxy); !strings.HasPrefix(got, "HTTP/1.") {
		t.Errorf("the proxy after a resume from disk: %q", got)
	}
	// Opened by another server, which gives it a proxy of its own.
	if err := s.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	again := filepath.Join(t.TempDir(), "again")
	if _, err := s.PersistPaused(ctx, again); err != nil {
		t.Fatal(err)
	}
	e2 := testutil.NewEgress(t, testutil.EgressConfig{Allow: []string{"example.com"}, Names: map[string][]netip.Addr{}})
	o := openResumed(t, b, again, sandbox.FromSnapshot{Egress: e2})
	if got := execText(t, o, askProxy); !strings.HasPrefix(got, "HTTP/1.") {
		t.Errorf("the proxy of a sandbox opened from disk: %q", got)
	}
	if err := s.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	// An open connection to the proxy (an established TCP connection) is
	// not dumped: the pause fails, the sandbox goes on.
	execText(t, s, "held = socket.create_connection(('127.0.0.1', 3128), timeout=10)")
	if err := s.Pause(ctx); err == nil || s.Paused() {
		t.Errorf("pause with a connection to the proxy open: %v", err)
	}
	if got := execText(t, s, "held.close(); 1 + 1"); got != "2" {
		t.Errorf("after the refused pause: %q", got)
	}
}

// askProxy is code that asks the sandbox's proxy for a CONNECT to
// example.com, and returns the first word of its answer: "HTTP/1.1" where
// a proxy answers (here with a refusal: the name does not resolve).
const askProxy = "import socket\nc = socket.create_connection(('127.0.0.1', 3128), timeout=10)\n" +
	"c.sendall(b'CONNECT example.com:443 HTTP/1.1\\r\\nHost: example.com:443\\r\\n\\r\\n')\n" +
	"r = c.recv(64).split(b' ')[0].decode()\nc.close()\nr"

// pauseResume pauses s and resumes it, failing the test if either fails.
func pauseResume(t *testing.T, s *Sandbox) {
	t.Helper()
	if err := s.Pause(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := s.Resume(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// TestPauseFilesNotChanged: a paused sandbox's files can be read through
// the files API but not changed, as its user or as its root
// (ErrPaused): CRIU reopens the files the paused processes hold by their
// path and refuses a resume where one is not the size it was, so a file
// replaced meanwhile made every resume fail. A change under way refuses
// a pause (ErrBusy). Resumed, the code's file is as it left it and
// changes go through again.
func TestPauseFilesNotChanged(t *testing.T) {
	s := pausableSandbox(t)
	ctx := context.Background()
	execText(t, s, "f = open('held.txt', 'w+')\nf.write('abc')\nf.flush()")

	if err := s.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	root, err := s.Root(sandbox.UserRoot)
	if err != nil {
		t.Fatal(err)
	}
	user, err := s.Root(sandbox.UserSandbox)
	if err != nil {
		t.Fatal(err)
	}
	ws := s.Workspace()
	for what, change := range map[string]func() error{
		"write":         func() error { return ws.WriteFile("held.txt", strings.NewReader("longer than it was"), 1<<20) },
		"write as root": func() error { return root.WriteFile("workspace/held.txt", strings.NewReader("x"), 1<<20) },
		"write as user": func() error { return user.WriteFile("tmp/new.txt", strings.NewReader("x"), 1<<20) },
		"remove":        func() error { return ws.Remove("held.txt") },
		"mkdir":         func() error { return ws.(sandbox.WorkspaceEditor).Mkdir("dir") },
		"rename":        func() error { return ws.(sandbox.WorkspaceEditor).Rename("held.txt", "moved.txt") },
		"metadata": func() error {
			return ws.(sandbox.WorkspaceMetadata).SetFileMetadata("held.txt", map[string]string{"k": "v"})
		},
		"mkdir for the user": func() error { return root.(sandbox.DirGiver).MkdirAllFor("srv/data", user) },
	} {
		if err := change(); !errors.Is(err, sandbox.ErrPaused) {
			t.Errorf("%s while paused: %v, want ErrPaused", what, err)
		}
	}
	r, _, err := ws.OpenFile("held.txt")
	if err != nil {
		t.Fatalf("read while paused: %v", err)
	}
	b, _ := io.ReadAll(r)
	r.Close()
	if string(b) != "abc" {
		t.Errorf("held.txt while paused: %q", b)
	}

	if err := s.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	if got := execText(t, s, "f.seek(0); f.read()"); got != "abc" {
		t.Errorf("the held file after resume: %q", got)
	}
	if err := s.Workspace().WriteFile("held.txt", strings.NewReader("new"), 1<<20); err != nil {
		t.Errorf("write once resumed: %v", err)
	}
	if root, err = s.Root(sandbox.UserRoot); err == nil {
		user, err = s.Root(sandbox.UserSandbox)
	}
	if err != nil {
		t.Fatal(err)
	}
	if err := root.(sandbox.DirGiver).MkdirAllFor("srv/data", user); err != nil {
		t.Errorf("mkdir for the user once resumed: %v", err)
	}

	// An upload under way: no pause until it ends.
	pr, pw := io.Pipe()
	defer pw.Close() // the upload ends with the test, whatever happens
	uploaded := make(chan error, 1)
	go func() { uploaded <- s.Workspace().WriteFile("upload.txt", pr, 1<<20) }()
	if _, err := pw.Write([]byte("part")); err != nil {
		t.Fatal(err)
	}
	if err := s.Pause(ctx); !errors.Is(err, sandbox.ErrBusy) || s.Paused() {
		t.Fatalf("pause during an upload: %v", err)
	}
	pw.Close()
	if err := <-uploaded; err != nil {
		t.Fatal(err)
	}
	pauseResume(t, s)
}

// TestPauseFailedRestoreReaped: a resume that CRIU refuses after it has
// forked the restored init (here a file the paused code holds open, its
// size changed behind the files API's back, which no client can do since
// the files API refuses changes while paused) leaves the sandbox paused
// and nothing of it running, not even a zombie: restoreTree reaps the
// init CRIU forked as the supervisor's child (criu restore
// --restore-sibling). Without that, every failed resume left a zombie of
// the sandbox's host root until the supervisor exited. Once the file has
// its size again, the resume succeeds.
func TestPauseFailedRestoreReaped(t *testing.T) {
	s := pausableSandbox(t)
	ctx := context.Background()
	execText(t, s, "held = open('held.txt', 'w+')\nheld.write('abc')\nheld.flush()\nx = 41")
	if err := s.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	lo := int(s.owner.ID(0))
	write := func(content string) {
		t.Helper()
		if err := s.ws.WriteFile("held.txt", strings.NewReader(content), 1<<20); err != nil {
			t.Fatal(err)
		}
	}
	write("a longer content")
	for i := 1; i <= 3; i++ {
		err := s.Resume(ctx)
		if err == nil {
			t.Fatalf("resume %d: CRIU restored a file whose size changed", i)
		}
		if i == 1 {
			t.Logf("resume refused: %v", err)
		}
		if !s.Paused() {
			t.Fatal("a failed resume left the sandbox unpaused")
		}
		if left := testutil.ProcessesOwnedBy(lo, lo+1<<16); len(left) > 0 {
			t.Errorf("after failed resume %d, processes of the paused sandbox's host user: %v", i, left)
		}
	}
	write("abc")
	if err := s.Resume(ctx); err != nil {
		t.Fatalf("resume once the file has its size again: %v", err)
	}
	if got := execText(t, s, "held.seek(0); print(held.read(), x + 1)"); got != "abc 42" {
		t.Errorf("after the resume: %q", got)
	}
}

// TestPauseMasksKept: the /proc masks' files of a sandbox's checkpoints
// are kept once for the sandbox (maskStore): a second pause links the
// first's, and the sandbox reads them as before. Another sandbox's are
// its own.
func TestPauseMasksKept(t *testing.T) {
	const bootID = "open('/proc/sys/kernel/random/boot_id').read().strip()"
	s := pausableSandbox(t)
	ctx := context.Background()
	id := execText(t, s, bootID)
	masks := func(s *Sandbox) map[uint64]string {
		t.Helper()
		out := maskFiles(t, filepath.Join(s.cp.dir, "ext"))
		for ino, name := range out {
			var st syscall.Stat_t
			if err := syscall.Lstat(filepath.Join(s.cp.dir, "ext", name), &st); err != nil || st.Ino != ino || st.Nlink < 2 {
				t.Errorf("mask %s: %d links (%v): not a kept copy", name, st.Nlink, err)
			}
		}
		return out
	}
	if err := s.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	first := masks(s)
	resumeAndPause := func() {
		if err := s.Resume(ctx); err != nil {
			t.Fatal(err)
		}
		if err := s.Pause(ctx); err != nil {
			t.Fatal(err)
		}
	}
	resumeAndPause()
	second := masks(s)
	for ino, name := range second {
		if _, ok := first[ino]; !ok {
			t.Errorf("the second pause's mask %s is a new file", name)
		}
	}
	if err := s.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	if got := execText(t, s, bootID); got != id {
		t.Errorf("boot id %s after two pauses, %s before", got, id)
	}

	other, err := s.b.Create(ctx, sandbox.Spec{})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	o := other.(*Sandbox)
	if got := execText(t, o, bootID); got == id {
		t.Fatalf("two sandboxes have the boot id %s", id)
	}
	if err := o.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	for ino, name := range masks(o) {
		if _, ok := first[ino]; ok {
			t.Errorf("another sandbox's mask %s is the first's file", name)
		}
	}
	if err := o.Resume(ctx); err != nil {
		t.Fatal(err)
	}
}

// maskFiles lists the /proc masks' files in a checkpoint's ext directory
// (by inode), each of which must be root's and read-only (its group may
// be the sandbox's); it fails the test where there is none.
func maskFiles(t *testing.T, ext string) map[uint64]string {
	t.Helper()
	ents, err := os.ReadDir(ext)
	if err != nil {
		t.Fatal(err)
	}
	out := map[uint64]string{}
	for _, e := range ents {
		var st syscall.Stat_t
		if err := syscall.Lstat(filepath.Join(ext, e.Name()), &st); err != nil {
			t.Fatal(err)
		}
		if st.Mode&syscall.S_IFMT != syscall.S_IFREG {
			continue
		}
		if st.Uid != 0 || st.Mode&0o777 != 0o444 {
			t.Errorf("mask %s: owner %d, mode %o", e.Name(), st.Uid, st.Mode&0o777)
		}
		out[st.Ino] = e.Name()
	}
	if len(out) == 0 {
		t.Fatal("the checkpoint has no mask's file")
	}
	return out
}
