package gvisor_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vivarium-sandbox/vivarium/internal/backend/gvisor"
	"github.com/vivarium-sandbox/vivarium/internal/fileutil"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/testutil"
)

const pauseCgroupParent = "vivarium-gvisor-pause-test"

// pauseBackend makes a backend whose sandboxes are under
// pauseCgroupParent, its state in dir and its checkpoints in cps.
func pauseBackend(t testing.TB, cfg gvisor.Config) *gvisor.Backend {
	t.Helper()
	testutil.RequireRoot(t)
	if err := gvisor.Check(); err != nil {
		t.Skip(err)
	}
	cfg.CgroupParent = pauseCgroupParent
	b, err := gvisor.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

// sandboxMemory is what the memory cgroup of the one sandbox under
// pauseCgroupParent is charged (page cache included), or -1.
func sandboxMemory(t testing.TB) int64 {
	for _, g := range testutil.CgroupsUnder(pauseCgroupParent) {
		for _, f := range []string{"memory.usage_in_bytes", "memory.current"} {
			if b, err := os.ReadFile(filepath.Join(g, f)); err == nil {
				n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
				if err == nil {
					return n
				}
			}
		}
	}
	return -1
}

// sandboxProcs lists the processes in the sandbox's groups.
func sandboxProcs() []string {
	var out []string
	for _, g := range testutil.CgroupsUnder(pauseCgroupParent) {
		b, _ := os.ReadFile(filepath.Join(g, "cgroup.procs"))
		out = append(out, strings.Fields(string(b))...)
	}
	return out
}

func execValue(t testing.TB, s sandbox.Sandbox, code string) string {
	t.Helper()
	// Two minutes, not the default 30 s: on the ptrace platform, with the
	// rest of the suite loading two cores, a restored sandbox's first
	// executions (its memory coming back) took over 30 s once in CI. A
	// hang still fails.
	res, err := s.Execute(context.Background(), sandbox.ExecRequest{Code: code, Timeout: 2 * time.Minute}, nil)
	if err != nil {
		t.Fatalf("%s: %v", code, err)
	}
	if res.Status != sandbox.StatusOK {
		t.Fatalf("%s: %+v", code, res)
	}
	if len(res.Results) == 0 {
		return strings.TrimSpace(res.Stdout)
	}
	return res.Results[0].Text
}

func runCommand(t testing.TB, s sandbox.Sandbox, argv ...string) (string, int) {
	t.Helper()
	p, err := s.Start(context.Background(), sandbox.Command{Argv: argv})
	if err != nil {
		t.Fatalf("%v: %v", argv, err)
	}
	p.Stdin().Close()
	out, _ := io.ReadAll(p.Stdout())
	return string(out), p.ExitCode()
}

// TestPauseResume pauses a gVisor sandbox holding Python state with
// runsc's checkpoint: its processes end and its cgroup's memory drops,
// every call but file access answers ErrPaused; resumed (runsc restore,
// the agent reached through new pipes) the variables are there, files
// written before and while paused are seen, commands start. Twice; then
// Close leaves nothing behind.
func TestPauseResume(t *testing.T) {
	dir := t.TempDir()
	cps := filepath.Join(t.TempDir(), "checkpoints")
	b := pauseBackend(t, gvisor.Config{StateDir: dir, CheckpointDir: cps})
	ctx := context.Background()
	sb, err := b.Create(ctx, sandbox.Spec{})
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	t.Cleanup(func() {
		if !closed {
			sb.Close()
		}
	})
	p, ok := sb.(sandbox.Pauser)
	if !ok {
		t.Fatal("a gvisor sandbox is not a sandbox.Pauser")
	}
	if err := p.PauseSupported(); err != nil {
		t.Fatalf("PauseSupported: %v", err)
	}
	execValue(t, sb, "x = 41\nimport json, sys, subprocess\nopen('kept.txt', 'w').write('kept')\n"+
		"f = open('open.txt', 'w+')\nf.write('abc')\nf.flush()\nchild = subprocess.Popen(['sleep', '600'])")
	cc, err := sb.(sandbox.ContextKeeper).CreateContext("python", "")
	if err != nil {
		t.Fatal(err)
	}
	if res, err := sb.Execute(ctx, sandbox.ExecRequest{Code: "y = 7", Context: cc.ID}, nil); err != nil || res.Status != sandbox.StatusOK {
		t.Fatalf("y = 7 in a context: %+v %v", res, err)
	}
	// What confines the code, as it sees it: the same after each resume.
	confinement := func() map[string]string {
		m := map[string]string{}
		for name, code := range map[string]string{
			"mounts":   "''.join(sorted(' '.join(l.split()[4:6]) + '\\n' for l in open('/proc/self/mountinfo')))",
			"status":   "''.join(l for l in open('/proc/self/status') if l.split(':')[0] in ('Uid', 'Gid', 'Groups', 'NoNewPrivs', 'Seccomp', 'CapInh', 'CapPrm', 'CapEff', 'CapBnd', 'CapAmb'))",
			"limits":   "__import__('resource') and [__import__('resource').getrlimit(getattr(__import__('resource'), n)) for n in ('RLIMIT_NOFILE', 'RLIMIT_NPROC', 'RLIMIT_FSIZE', 'RLIMIT_CPU')]",
			"net":      "sorted(l.split(':')[0].strip() for l in open('/proc/net/dev').readlines()[2:])",
			"hostname": "open('/proc/sys/kernel/hostname').read()",
			"cgroup":   "open('/proc/self/cgroup').read()",
		} {
			m[name] = execValue(t, sb, code)
		}
		return m
	}
	before := confinement()
	if !strings.Contains(before["status"], `Seccomp:\t2`) || !strings.Contains(before["status"], `CapEff:\t0000000000000000`) ||
		before["net"] != "['lo']" {
		t.Fatalf("the runner's confinement: %s", before["status"])
	}

	for round := 1; round <= 2; round++ {
		t.Run(fmt.Sprintf("round%d", round), func(t *testing.T) {
			memBefore := sandboxMemory(t)
			pauseTook := testutil.Pause(t, p)
			memAfter := sandboxMemory(t)
			image := fileutil.DirSize(cps)
			t.Logf("pause: %v; the cgroup holds %d KiB before, %d KiB after; checkpoint %.1f MiB",
				pauseTook.Round(time.Millisecond), memBefore>>10, memAfter>>10, float64(image)/(1<<20))
			// gVisor's kernel and gofer are gone, and their memory with
			// them; what the cgroup keeps is the disk's files.
			if memBefore <= 0 || memAfter < 0 || memAfter > memBefore/4 {
				t.Errorf("the cgroup's memory went from %d KiB to %d KiB: no real drop", memBefore>>10, memAfter>>10)
			}
			if procs := sandboxProcs(); len(procs) > 0 {
				t.Errorf("processes left in the paused sandbox's cgroups: %v", procs)
			}
			if left := containers(t, dir); len(left) > 0 {
				t.Errorf("runsc still has containers of the paused sandbox: %v", left)
			}
			if image <= 0 {
				t.Errorf("no checkpoint under %s", cps)
			}
			// Every call that needs its processes says it is paused;
			// its files can be read, and written.
			testutil.CheckPaused(t, sb, 8000, "kept.txt")
			name := fmt.Sprintf("paused%d.txt", round)
			if err := sb.Workspace().WriteFile(name, strings.NewReader("written while paused"), 1<<20); err != nil {
				t.Errorf("write a workspace file while paused: %v", err)
			}

			t.Logf("resume: %v", testutil.Resume(t, p).Round(time.Millisecond))
			if image := fileutil.DirSize(cps); image != 0 {
				t.Errorf("the resumed sandbox's checkpoint is still there (%d bytes)", image)
			}
			for code, want := range map[string]string{
				"x + 1":                       "42",
				"'json' in sys.modules":       "True",
				"open('kept.txt').read()":     "'kept'",
				"f.seek(0); f.read()":         "'abc'",
				"open('" + name + "').read()": "'written while paused'",
				"child.poll() is None":        "True",
			} {
				if got := execValue(t, sb, code); got != want {
					t.Errorf("%s after resume: %q, want %q", code, got, want)
				}
			}
			res, err := sb.Execute(ctx, sandbox.ExecRequest{Code: "y", Context: cc.ID}, nil)
			if err != nil || res.Status != sandbox.StatusOK || len(res.Results) == 0 || res.Results[0].Text != "7" {
				t.Errorf("y in its context after resume: %+v %v", res, err)
			}
			if out, code := runCommand(t, sb, "sh", "-c", "echo hello from $(id -u)"); code != 0 || out != "hello from 1000\n" {
				t.Errorf("a command after resume: %q, exit %d", out, code)
			}
			for k, v := range confinement() {
				if v != before[k] {
					t.Errorf("%s after resume:\n%s\nbefore:\n%s", k, v, before[k])
				}
			}
		})
	}

	// Closed while paused: nothing of it is left.
	if err := p.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	if err := sb.Close(); err != nil {
		t.Fatal(err)
	}
	closed = true
	requireNothingLeft(t, b, dir, cps)
}

// requireNothingLeft closes the backend, whose sandboxes are closed, and
// fails if anything of them is left: runsc's containers, processes,
// cgroups, mounts, their directories, their checkpoints.
func requireNothingLeft(t *testing.T, b *gvisor.Backend, dir, cps string) {
	t.Helper()
	if err := b.Close(); err != nil {
		t.Errorf("the backend's Close: %v", err)
	}
	if left := containers(t, dir); len(left) > 0 {
		t.Errorf("containers left: %v", left)
	}
	if left := testutil.CgroupsUnder(pauseCgroupParent); len(left) > 0 {
		t.Errorf("cgroups left: %v", left)
	}
	if left := testutil.ProcessesMatching(dir); len(left) > 0 {
		t.Errorf("processes left: %v", left)
	}
	for _, m := range testutil.Mounts() {
		if strings.Contains(m, dir) {
			t.Errorf("mount left: %s", m)
		}
	}
	if entries, _ := os.ReadDir(filepath.Join(dir, "sandboxes")); len(entries) > 0 {
		t.Errorf("sandbox directories left: %v", entries)
	}
	if entries, _ := os.ReadDir(cps); len(entries) > 0 {
		t.Errorf("checkpoints left: %v", entries)
	}
}

// TestPauseRefused: what cannot be paused is refused, and the sandbox
// goes on as it was: a one-shot sandbox, a sandbox running a command, a
// sandbox whose restore would not fit in its memory limit, a checkpoint
// that would not fit on the disk.
func TestPauseRefused(t *testing.T) {
	testutil.RequireRoot(t, "a tmpfs of 1 MiB")
	dir := t.TempDir()
	small := filepath.Join(t.TempDir(), "small")
	if err := os.Mkdir(small, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", small, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(small, unix.MNT_DETACH) })
	cps := filepath.Join(small, "checkpoints")
	b := pauseBackend(t, gvisor.Config{StateDir: dir, CheckpointDir: cps})
	ctx := context.Background()

	// runsc's restore takes more memory than the sandbox held (see
	// restoreOverhead): one that holds most of its limit could be
	// paused, never resumed.
	full, err := b.Create(ctx, sandbox.Spec{Limits: sandbox.Limits{Memory: 128 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	execValue(t, full, "b = bytearray(64 << 20)\nb[::4096] = b'x' * len(b[::4096])")
	err = full.(sandbox.Pauser).Pause(ctx)
	t.Logf("refused: %v", err)
	if !errors.Is(err, sandbox.ErrUnsupported) || !strings.Contains(err.Error(), "could not be resumed") {
		t.Errorf("Pause of a sandbox near its memory limit: %v", err)
	}
	if got := execValue(t, full, "len(b)"); got != strconv.Itoa(64<<20) {
		t.Errorf("after the refused pause: %q", got)
	}
	full.Close()

	one, err := b.Create(ctx, sandbox.Spec{OneShot: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := one.(sandbox.Pauser).PauseSupported(); !errors.Is(err, sandbox.ErrUnsupported) {
		t.Errorf("PauseSupported of a one-shot sandbox: %v", err)
	}
	if err := one.(sandbox.Pauser).Pause(ctx); !errors.Is(err, sandbox.ErrUnsupported) {
		t.Errorf("Pause of a one-shot sandbox: %v", err)
	}
	one.Close()

	sb, err := b.Create(ctx, sandbox.Spec{})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	p := sb.(sandbox.Pauser)
	execValue(t, sb, "x = 41")

	cmd, err := sb.Start(ctx, sandbox.Command{Argv: []string{"sleep", "600"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Pause(ctx); !errors.Is(err, sandbox.ErrBusy) {
		t.Errorf("Pause while a command runs: %v", err)
	}
	cmd.Signal(unix.SIGKILL)
	<-cmd.Done()

	// The checkpoint directory's disk has 1 MiB: the sandbox's memory
	// would not fit, and runsc would end it with its failed checkpoint.
	// (The command's exit is told to the core a moment before the
	// Sandbox counts it gone: ErrBusy until then.)
	testutil.WaitFor(t, 5*time.Second, "the command to be gone", func() bool {
		err = p.Pause(ctx)
		return !errors.Is(err, sandbox.ErrBusy)
	})
	if !errors.Is(err, sandbox.ErrUnsupported) || !strings.Contains(err.Error(), "MiB free") {
		t.Errorf("Pause onto a full disk: %v", err)
	}
	t.Logf("refused: %v", err)
	if p.Paused() {
		t.Fatal("paused after a refused pause")
	}
	if got := execValue(t, sb, "x + 1"); got != "42" {
		t.Errorf("x + 1 after the refused pauses: %q", got)
	}
	if entries, _ := os.ReadDir(cps); len(entries) > 0 {
		if sub, _ := os.ReadDir(filepath.Join(cps, entries[0].Name())); len(sub) > 0 {
			t.Errorf("a refused pause left a checkpoint: %v", sub)
		}
	}
	sb.Close()
	requireNothingLeft(t, b, dir, cps)
}

// TestPauseFailedCheckpoint: a checkpoint runsc itself fails (its disk
// fills up half-way; the check before it is passed by a runsc that writes
// elsewhere) ends gVisor's sandbox, whatever the pause does: the sandbox
// runs again in a new container, with its files, and says its state was
// lost.
func TestPauseFailedCheckpoint(t *testing.T) {
	testutil.RequireRoot(t)
	if err := gvisor.Check(); err != nil {
		t.Skip(err)
	}
	runsc, err := exec.LookPath("runsc")
	if err != nil {
		t.Skip(err)
	}
	dir := t.TempDir()
	small := filepath.Join(t.TempDir(), "small")
	if err := os.Mkdir(small, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", small, "tmpfs", 0, "size=256k"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(small, unix.MNT_DETACH) })
	// A runsc whose checkpoints go to the small disk.
	wrapper := checkpointWrapper(t, runsc, `exec "$runsc" $(echo "$@" | sed 's|--image-path [^ ]*|--image-path `+small+`/img|')`)
	cps := filepath.Join(t.TempDir(), "cps")
	b := pauseBackend(t, gvisor.Config{Runsc: wrapper, StateDir: dir, CheckpointDir: cps})
	ctx := context.Background()
	sb, err := b.Create(ctx, sandbox.Spec{})
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	defer func() {
		if !closed {
			sb.Close()
		}
	}()
	p := sb.(sandbox.Pauser)
	execValue(t, sb, "x = 41\nopen('kept.txt', 'w').write('kept')")
	err = p.Pause(ctx)
	t.Logf("pause: %v", err)
	if err == nil || !strings.Contains(err.Error(), "no space left") || !strings.Contains(err.Error(), "runs again") {
		t.Fatalf("Pause whose checkpoint fills the disk: %v", err)
	}
	if p.Paused() {
		t.Fatal("paused after a failed pause")
	}
	res, err := sb.Execute(ctx, sandbox.ExecRequest{Code: "open('kept.txt').read()"}, nil)
	if err != nil || res.Status != sandbox.StatusOK || len(res.Results) == 0 || res.Results[0].Text != "'kept'" {
		t.Fatalf("after the failed pause: %+v %v", res, err)
	}
	if !res.StateLost {
		t.Errorf("the first execution after the failed pause does not say the state was lost: %+v", res)
	}
	if got := execValue(t, sb, "'x' in globals()"); got != "False" {
		t.Errorf("x after a failed pause: %q", got)
	}
	sb.Close()
	closed = true
	requireNothingLeft(t, b, dir, cps)
}

// checkpointWrapper writes a runsc that runs the shell's body for a
// checkpoint (runsc's arguments in "$@", runsc in $runsc) and is runsc
// otherwise, the backend's probe's checkpoint included (which would
// otherwise refuse every pause).
func checkpointWrapper(t *testing.T, runsc, body string) string {
	t.Helper()
	wrapper := filepath.Join(t.TempDir(), "runsc")
	script := "#!/bin/sh\nrunsc=" + runsc + "\n" +
		"case \" $* \" in\n" +
		"*\" vivarium-probe-\"*) exec \"$runsc\" \"$@\" ;;\n" +
		"*\" checkpoint \"*) " + body + " ;;\n" +
		"esac\n" +
		"exec \"$runsc\" \"$@\"\n"
	if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return wrapper
}

// TestPauseCheckpointFails: whether a sandbox runs on after a checkpoint
// that fails is found out, not timed. A runsc that refuses before saving
// anything leaves the sandbox running, its Python state kept; one whose
// sandbox stops and ends only seconds later (runsc kills a sandbox's
// kernel after a failed save, and a busy host ends it late: CI once took
// over 2 s) has the sandbox run again in a new container, its state lost.
func TestPauseCheckpointFails(t *testing.T) {
	testutil.RequireRoot(t)
	if err := gvisor.Check(); err != nil {
		t.Skip(err)
	}
	runsc, err := exec.LookPath("runsc")
	if err != nil {
		t.Skip(err)
	}
	// The platform this host starts sandboxes with, found once: each
	// wrapper's backend is told it rather than trying the others again
	// (beside the whole suite on two cores, one try of each took over
	// the default 30 s), with room for a loaded host.
	platform := pauseBackend(t, gvisor.Config{StateDir: t.TempDir(), CheckpointDir: filepath.Join(t.TempDir(), "cps")}).Platform().Platform
	for _, c := range []struct {
		name, body string
		ends       bool
	}{
		{"before the save", `echo "checkpoint refused before the save" >&2; exit 1`, false},
		// The sandbox's kernel stopped (runsc pause: no answer from it),
		// its process killed 4 s after runsc says the checkpoint failed.
		{"ends late", `state=$(echo "$@" | sed 's| checkpoint --image-path [^ ]*| state|')
			pause=$(echo "$@" | sed 's| checkpoint --image-path [^ ]*| pause|')
			pid=$("$runsc" $state | sed -n 's/^ *"pid": *\([0-9]*\).*/\1/p' | head -n 1)
			[ -n "$pid" ] && "$runsc" $pause || exit 2
			(sleep 4; kill -9 "$pid") </dev/null >/dev/null 2>&1 &
			echo "checkpoint failed: the sandbox ends late" >&2; exit 1`, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			cps := filepath.Join(t.TempDir(), "cps")
			b := pauseBackend(t, gvisor.Config{Runsc: checkpointWrapper(t, runsc, c.body), StateDir: dir, CheckpointDir: cps,
				Platform: platform, ProbeTimeout: 3 * gvisor.DefaultProbeTimeout})
			ctx := context.Background()
			sb, err := b.Create(ctx, sandbox.Spec{})
			if err != nil {
				t.Fatal(err)
			}
			closed := false
			defer func() {
				if !closed {
					sb.Close()
				}
			}()
			p := sb.(sandbox.Pauser)
			execValue(t, sb, "x = 41\nopen('kept.txt', 'w').write('kept')")
			err = p.Pause(ctx)
			t.Logf("pause: %v", err)
			if err == nil || !strings.Contains(err.Error(), "checkpoint") || strings.Contains(err.Error(), "runs again") != c.ends {
				t.Fatalf("Pause whose checkpoint fails: %v", err)
			}
			if p.Paused() {
				t.Fatal("paused after a failed pause")
			}
			res, err := sb.Execute(ctx, sandbox.ExecRequest{Code: "open('kept.txt').read()"}, nil)
			if err != nil || res.Status != sandbox.StatusOK || len(res.Results) == 0 || res.Results[0].Text != "'kept'" {
				t.Fatalf("after the failed pause: %+v %v", res, err)
			}
			if res.StateLost != c.ends {
				t.Errorf("StateLost %v after the failed pause, want %v", res.StateLost, c.ends)
			}
			want := "42"
			if c.ends {
				want = "False"
			}
			if got := execValue(t, sb, "x + 1 if 'x' in globals() else False"); got != want {
				t.Errorf("x after the failed pause: %q, want %q", got, want)
			}
			sb.Close()
			closed = true
			requireNothingLeft(t, b, dir, cps)
		})
	}
}

// BenchmarkPauseResume pauses and resumes one sandbox, idle after x = 41
// and after importing pandas: pause-ms and resume-ms per round (Resume
// until the restored agent answers), the checkpoint's size (image-MiB),
// the cgroup's memory before and while paused (MiB).
func BenchmarkPauseResume(b *testing.B) {
	for _, c := range []struct{ name, code string }{
		{"idle", "x = 41"},
		{"pandas", "import pandas as pd\ndf = pd.DataFrame({'a': range(1000)})"},
	} {
		b.Run(c.name, func(b *testing.B) {
			cps := b.TempDir()
			be := pauseBackend(b, gvisor.Config{StateDir: b.TempDir(), CheckpointDir: cps})
			ctx := context.Background()
			sb, err := be.Create(ctx, sandbox.Spec{})
			if err != nil {
				b.Fatal(err)
			}
			defer sb.Close()
			if res, err := sb.Execute(ctx, sandbox.ExecRequest{Code: c.code}, nil); err != nil || res.Status != sandbox.StatusOK {
				b.Skipf("%s: %+v %v", c.code, res, err)
			}
			p := sb.(sandbox.Pauser)
			// The backend's first pause probes checkpoints first: not
			// measured.
			if err := p.Pause(ctx); err != nil {
				b.Fatal(err)
			}
			if err := p.Resume(ctx); err != nil {
				b.Fatal(err)
			}
			var pause, resume time.Duration
			var image, memRunning, memPaused int64
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				memRunning += sandboxMemory(b)
				start := time.Now()
				if err := p.Pause(ctx); err != nil {
					b.Fatal(err)
				}
				pause += time.Since(start)
				image += fileutil.DirSize(cps)
				memPaused += sandboxMemory(b)
				start = time.Now()
				if err := p.Resume(ctx); err != nil {
					b.Fatal(err)
				}
				resume += time.Since(start)
			}
			n := float64(b.N)
			b.ReportMetric(float64(pause.Milliseconds())/n, "pause-ms")
			b.ReportMetric(float64(resume.Milliseconds())/n, "resume-ms")
			b.ReportMetric(float64(image)/n/(1<<20), "image-MiB")
			b.ReportMetric(float64(memRunning)/n/(1<<20), "running-MiB")
			b.ReportMetric(float64(memPaused)/n/(1<<20), "paused-MiB")
		})
	}
}

// TestPauseFailedResume: a resume that fails (its checkpoint damaged)
// leaves the sandbox paused, its checkpoint kept; once the checkpoint is
// whole again, a resume brings the sandbox back. An execution that runs
// makes Pause answer ErrBusy.
func TestPauseFailedResume(t *testing.T) {
	dir := t.TempDir()
	cps := filepath.Join(t.TempDir(), "cps")
	b := pauseBackend(t, gvisor.Config{StateDir: dir, CheckpointDir: cps})
	ctx := context.Background()
	sb, err := b.Create(ctx, sandbox.Spec{})
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	defer func() {
		if !closed {
			sb.Close()
		}
	}()
	p := sb.(sandbox.Pauser)
	execValue(t, sb, "x = 41")

	// The execution says it runs before a pause is tried: a pause tried
	// before it started would pause the sandbox, and it would never run.
	running := make(chan struct{})
	var once sync.Once
	done := make(chan error, 1)
	go func() {
		_, err := sb.Execute(ctx, sandbox.ExecRequest{Code: "import time; print('running', flush=True); time.sleep(2)"},
			testutil.SinkFunc(func([]byte) { once.Do(func() { close(running) }) }))
		done <- err
	}()
	select {
	case <-running:
	case err := <-done:
		t.Fatalf("the execution ended before it said it ran: %v", err)
	}
	if err := p.Pause(ctx); !errors.Is(err, sandbox.ErrBusy) {
		t.Fatalf("Pause while an execution runs: %v", err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if p.Paused() {
		t.Fatal("paused while an execution ran")
	}

	if err := p.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	images, _ := filepath.Glob(filepath.Join(cps, "*", "*", "checkpoint.img"))
	if len(images) != 1 {
		t.Fatalf("checkpoint images: %v", images)
	}
	whole, err := os.ReadFile(images[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(images[0], whole[:len(whole)/2], 0o600); err != nil {
		t.Fatal(err)
	}
	err = p.Resume(ctx)
	t.Logf("resume of a damaged checkpoint: %v", err)
	if err == nil {
		t.Fatal("a damaged checkpoint was resumed")
	}
	if !p.Paused() {
		t.Fatal("not paused after a failed resume")
	}
	if _, err := sb.Execute(ctx, sandbox.ExecRequest{Code: "x"}, nil); !errors.Is(err, sandbox.ErrPaused) {
		t.Errorf("Execute after a failed resume: %v", err)
	}
	if left := containers(t, dir); len(left) > 0 {
		t.Errorf("a failed resume left containers: %v", left)
	}
	if err := os.WriteFile(images[0], whole, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := p.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	if got := execValue(t, sb, "x + 1"); got != "42" {
		t.Errorf("x + 1 after the second resume: %q", got)
	}
	sb.Close()
	closed = true
	requireNothingLeft(t, b, dir, cps)
}

// TestPauseProbeRefuses: where runsc cannot checkpoint (here a runsc
// whose checkpoints all fail), the backend's first pause finds it out on
// a probe's sandbox, not on the sandbox being paused: the pause is
// refused with ErrUnsupported naming the platform, the sandbox runs on
// with its state, and PauseSupported says why from then on.
func TestPauseProbeRefuses(t *testing.T) {
	testutil.RequireRoot(t)
	if err := gvisor.Check(); err != nil {
		t.Skip(err)
	}
	runsc, err := exec.LookPath("runsc")
	if err != nil {
		t.Skip(err)
	}
	wrapper := filepath.Join(t.TempDir(), "runsc")
	script := "#!/bin/sh\ncase \" $* \" in *\" checkpoint \"*) echo 'checkpoint failed: not on this platform' >&2; exit 128 ;; esac\nexec " +
		runsc + " \"$@\"\n"
	if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cps := filepath.Join(t.TempDir(), "cps")
	b := pauseBackend(t, gvisor.Config{Runsc: wrapper, StateDir: dir, CheckpointDir: cps})
	ctx := context.Background()
	sb, err := b.Create(ctx, sandbox.Spec{})
	if err != nil {
		t.Fatal(err)
	}
	p := sb.(sandbox.Pauser)
	if err := p.PauseSupported(); err != nil {
		t.Fatalf("PauseSupported before any pause: %v", err)
	}
	execValue(t, sb, "x = 41")
	err = p.Pause(ctx)
	t.Logf("pause: %v", err)
	if !errors.Is(err, sandbox.ErrUnsupported) || !strings.Contains(err.Error(), "platform "+b.Platform().Platform) {
		t.Errorf("Pause where runsc cannot checkpoint: %v", err)
	}
	if p.Paused() {
		t.Fatal("paused")
	}
	if got := execValue(t, sb, "x + 1"); got != "42" {
		t.Errorf("x + 1 after the refused pause: %q", got)
	}
	if err := p.PauseSupported(); !errors.Is(err, sandbox.ErrUnsupported) {
		t.Errorf("PauseSupported after the probe failed: %v", err)
	}
	sb.Close()
	requireNothingLeft(t, b, dir, cps)
}
