package docker_test

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/backend/docker"
	"github.com/vivarium-sandbox/vivarium/internal/hostuid"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/testutil"
)

// The tests start a Docker daemon of their own (testutil.RequireDockerd)
// and stop it at the end.
func TestMain(m *testing.M) {
	code := m.Run()
	if err := testutil.StopDockerd(); err != nil {
		fmt.Fprintln(os.Stderr, "stop the test dockerd:", err)
		code = 1
	}
	os.Exit(code)
}

// testBackend is a backend of the package's tests, with what they need to
// find its leftovers.
type testBackend struct {
	sandbox.Backend
	host, name, dir string
}

func (b *testBackend) Close() error { return b.Backend.(io.Closer).Close() }

func (b *testBackend) Sweep() ([]string, error) { return b.Backend.(sandbox.Sweeper).Sweep() }

// The package's host uids: above the default pool, apart from other
// packages' tests (which take the next regions of 1<<22 ids).
const (
	testUIDBase   = docker.DefaultUIDBase + docker.DefaultUIDRanges*hostuid.RangeSize
	testUIDRanges = 32
)

// newBackend opens a backend on the test daemon, named name and the
// daemon's own suffix: its containers' label, cgroup parent and state
// directory are apart from those of the same tests run at the same time
// by another process.
func newBackend(t *testing.T, name string, cfg docker.Config) *testBackend {
	t.Helper()
	d := testutil.RequireDockerd(t)
	name += "-" + strings.TrimPrefix(filepath.Base(d.Dir), "vd-")
	cfg.Host, cfg.Name = d.Host, name
	if cfg.UIDBase == 0 {
		cfg.UIDBase, cfg.UIDRanges = testUIDBase, testUIDRanges
	}
	cfg.StateDir = "/run/vivarium/" + strings.TrimPrefix(name, "vivarium-")
	b, err := docker.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	tb := &testBackend{Backend: b, host: d.Host, name: name, dir: cfg.StateDir}
	t.Cleanup(func() {
		tb.Close()
		os.RemoveAll(cfg.StateDir)
	})
	return tb
}

// leftovers closes the backend and lists what it left on the host.
func (b *testBackend) leftovers(t *testing.T) []string {
	t.Helper()
	var left []string
	if err := b.Close(); err != nil {
		left = append(left, "close: "+err.Error())
	}
	ids, err := docker.Containers(b.host, b.name)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		left = append(left, "container "+id)
	}
	for _, m := range testutil.Mounts() {
		if strings.Contains(m, b.dir) {
			left = append(left, "mount "+m)
		}
	}
	// The cgroup parent Docker made in every hierarchy, and any group in it.
	for _, d := range append(testutil.CgroupsUnder(b.name), parentGroups(b.name)...) {
		left = append(left, "cgroup "+d)
	}
	if entries, _ := os.ReadDir(filepath.Join(b.dir, "sandboxes")); len(entries) > 0 {
		left = append(left, fmt.Sprintf("%d sandbox directories", len(entries)))
	}
	if roots, _ := filepath.Glob(filepath.Join(b.dir, "root-*")); len(roots) > 0 {
		left = append(left, fmt.Sprintf("root skeletons %v", roots))
	}
	if views, _ := filepath.Glob(filepath.Join(b.dir, "views", "*")); len(views) > 0 {
		left = append(left, fmt.Sprintf("container views %v", views))
	}
	left = append(left, testutil.ProcessesOwnedBy(testUIDBase, testUIDBase+testUIDRanges*hostuid.RangeSize)...)
	return left
}

func parentGroups(name string) []string {
	dirs, _ := filepath.Glob("/sys/fs/cgroup/*/" + name)
	return dirs
}

func run(t *testing.T, sb sandbox.Sandbox, code string) *sandbox.Result {
	t.Helper()
	res, err := sb.Execute(context.Background(), sandbox.ExecRequest{Code: code}, nil)
	if err != nil {
		t.Fatalf("execute %q: %v", code, err)
	}
	return res
}

type sinkFunc func([]byte)

func (f sinkFunc) Stdout(p []byte) { f(p) }
func (f sinkFunc) Stderr(p []byte) { f(p) }

func wantStatus(t *testing.T, res *sandbox.Result, st sandbox.Status) {
	t.Helper()
	if res.Status != st {
		t.Fatalf("status %s, want %s: %+v %+v", res.Status, st, res, res.Error)
	}
}

// One backend for the functional tests; each closes its sandboxes, and the
// last test checks that nothing is left.
func TestSandboxes(t *testing.T) {
	testutil.RequirePython(t)
	b := newBackend(t, "vivarium-docker-test", docker.Config{})
	ctx := context.Background()
	oneShot := func(t *testing.T, code string, l sandbox.Limits) *sandbox.Result {
		t.Helper()
		res, warn := sandbox.RunOnce(ctx, b, sandbox.OneShot{Spec: sandbox.Spec{Limits: l},
			Request: sandbox.ExecRequest{Code: code}})
		if warn != nil {
			t.Errorf("RunOnce: %v", warn)
		}
		return res
	}
	t.Run("cases", func(t *testing.T) {
		t.Run("one_shot", func(t *testing.T) {
			t.Parallel()
			res := oneShot(t, "import os, sys\nprint('hi', os.getcwd(), os.getuid())\nsys.exit(3)", sandbox.Limits{})
			if !strings.HasPrefix(res.Stdout, "hi /workspace ") || res.ExitCode != 3 || res.Status != sandbox.StatusError {
				t.Fatalf("%+v", res)
			}
			wantSandboxUID(t, strings.Fields(res.Stdout)[2])
		})
		t.Run("state_interrupt_restart", func(t *testing.T) {
			t.Parallel()
			sb, err := b.Create(ctx, sandbox.Spec{})
			if err != nil {
				t.Fatal(err)
			}
			defer sb.Close()
			run(t, sb, "x = 41")
			if res := run(t, sb, "x + 1"); len(res.Results) != 1 || res.Results[0].Text != "42" {
				t.Fatalf("state lost: %+v", res)
			}
			// Interrupted once its first output shows it running.
			started := make(chan struct{})
			var once sync.Once
			go func() {
				<-started
				sb.Interrupt()
			}()
			res, err := sb.Execute(ctx, sandbox.ExecRequest{Code: "import time\nprint('looping', flush=True)\nwhile True: time.sleep(0.05)"},
				sinkFunc(func([]byte) { once.Do(func() { close(started) }) }))
			if err != nil {
				t.Fatal(err)
			}
			if res.Error == nil || res.Error.Name != "KeyboardInterrupt" || res.StateLost {
				t.Fatalf("interrupt: %+v", res)
			}
			if res := run(t, sb, "x"); len(res.Results) != 1 || res.Results[0].Text != "41" {
				t.Fatalf("state lost by the interrupt: %+v", res)
			}
			if err := sb.Restart(ctx); err != nil {
				t.Fatal(err)
			}
			if res := run(t, sb, "x"); res.Error == nil || res.Error.Name != "NameError" {
				t.Fatalf("state kept by a restart: %+v", res)
			}
		})
		t.Run("commands", func(t *testing.T) {
			t.Parallel()
			sb, err := b.Create(ctx, sandbox.Spec{})
			if err != nil {
				t.Fatal(err)
			}
			defer sb.Close()
			p, err := sb.Start(ctx, sandbox.Command{Argv: []string{"sh", "-c", "read line; echo got $line; id -un; echo oops >&2; exit 7"}})
			if err != nil {
				t.Fatal(err)
			}
			io.WriteString(p.Stdin(), "hello\n")
			p.Stdin().Close()
			out, _ := io.ReadAll(p.Stdout())
			errOut, _ := io.ReadAll(p.Stderr())
			<-p.Done()
			if code := p.ExitCode(); code != 7 || string(out) != "got hello\nsandbox\n" || string(errOut) != "oops\n" {
				t.Fatalf("code %d, stdout %q, stderr %q", code, out, errOut)
			}
		})
		t.Run("command_output_after_exit", func(t *testing.T) {
			t.Parallel()
			sb, err := b.Create(ctx, sandbox.Spec{})
			if err != nil {
				t.Fatal(err)
			}
			defer sb.Close()
			// The shell exits first; what it started writes after.
			for range 20 {
				p, err := sb.Start(ctx, sandbox.Command{Argv: []string{"sh", "-c", "(sleep 0.1; echo late) & echo early"}})
				if err != nil {
					t.Fatal(err)
				}
				p.Stdin().Close()
				out, _ := io.ReadAll(p.Stdout())
				io.ReadAll(p.Stderr())
				<-p.Done()
				if string(out) != "early\nlate\n" || p.ExitCode() != 0 {
					t.Fatalf("stdout %q, exit %d", out, p.ExitCode())
				}
			}
		})
		t.Run("files", func(t *testing.T) {
			t.Parallel()
			sb, err := b.Create(ctx, sandbox.Spec{})
			if err != nil {
				t.Fatal(err)
			}
			defer sb.Close()
			if err := sb.Workspace().WriteFile("in.txt", strings.NewReader("from the host"), 1<<20); err != nil {
				t.Fatal(err)
			}
			res := run(t, sb, "s = open('in.txt').read()\nopen('out.txt', 'w').write(s.upper())\nprint(len(s))")
			wantStatus(t, res, sandbox.StatusOK)
			f, _, err := sb.Workspace().OpenFile("out.txt")
			if err != nil {
				t.Fatal(err)
			}
			data, _ := io.ReadAll(f)
			f.Close()
			if string(data) != "FROM THE HOST" {
				t.Fatalf("out.txt: %q", data)
			}
		})
		t.Run("scientific_stack", func(t *testing.T) {
			t.Parallel()
			testutil.RequirePythonModules(t, "numpy", "pandas", "matplotlib")
			res := oneShot(t, `
import numpy as np, pandas as pd, matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
a = np.random.default_rng(0).random((200, 200))
print("det finite", np.isfinite(np.linalg.det(a @ a.T)))
print("pandas", pd.DataFrame({"x": [1, 2, 3]})["x"].sum())
plt.plot([1, 2, 3])
plt.show()
`, sandbox.Limits{})
			wantStatus(t, res, sandbox.StatusOK)
			if res.Stdout != "det finite True\npandas 6\n" || len(res.Results) != 1 || res.Results[0].PNG == "" {
				t.Fatalf("%+v", res)
			}
		})
		t.Run("proc", func(t *testing.T) {
			t.Parallel()
			testProc(t, oneShot)
		})
		t.Run("timeout", func(t *testing.T) {
			t.Parallel()
			res := oneShot(t, "while True: pass", sandbox.Limits{Timeout: time.Second})
			wantStatus(t, res, sandbox.StatusTimeout)
		})
		t.Run("cpu_time", func(t *testing.T) {
			t.Parallel()
			res := oneShot(t, "while True: pass", sandbox.Limits{CPUTime: time.Second})
			wantStatus(t, res, sandbox.StatusTimeout)
			// RLIMIT_CPU, the backstop, counts the runner's start too.
			if res.CPUMS < 500 {
				t.Errorf("CPU time %v ms, want about 1000", res.CPUMS)
			}
		})
		t.Run("memory", func(t *testing.T) {
			t.Parallel()
			res := oneShot(t, "x = []\nwhile True: x.append(bytearray(8 << 20))", sandbox.Limits{Memory: 64 << 20})
			wantStatus(t, res, sandbox.StatusMemoryLimit)
			if res.PeakMemoryBytes < 48<<20 || res.PeakMemoryBytes > 64<<20+64<<10 {
				t.Errorf("peak memory %d, want near the 64 MiB limit", res.PeakMemoryBytes)
			}
		})
		t.Run("memory_persistent", func(t *testing.T) {
			t.Parallel()
			sb, err := b.Create(ctx, sandbox.Spec{Limits: sandbox.Limits{Memory: 64 << 20}})
			if err != nil {
				t.Fatal(err)
			}
			defer sb.Close()
			for range 2 {
				res := run(t, sb, "x = []\nwhile True: x.append(bytearray(8 << 20))")
				wantStatus(t, res, sandbox.StatusMemoryLimit)
				if !res.StateLost {
					t.Errorf("the runner was killed, state not reported lost: %+v", res)
				}
			}
			wantStatus(t, run(t, sb, "1"), sandbox.StatusOK)
		})
		t.Run("pids", func(t *testing.T) {
			// RLIMIT_NPROC of the sandbox's own user stops the code
			// at its limit; the container's pids cgroup, which counts
			// the agent's threads too, has room for them.
			t.Parallel()
			res := oneShot(t, fmt.Sprintf(`
import os, time
n = 0
try:
    while True:
        if os.fork() == 0:
            time.sleep(30)
            os._exit(0)
        n += 1
except OSError as e:
    print("stopped", e.errno, n < %d)
`, 16), sandbox.Limits{Pids: 16})
			wantStatus(t, res, sandbox.StatusOK)
			if res.Stdout != "stopped 11 True\n" {
				t.Fatalf("%+v", res)
			}
		})
		t.Run("user_limits", func(t *testing.T) {
			t.Parallel()
			res := oneShot(t, `
import resource, subprocess
for r in ("CORE", "SIGPENDING", "MSGQUEUE", "MEMLOCK", "NPROC"):
    print(r, *resource.getrlimit(getattr(resource, "RLIMIT_" + r)))
for p in ("kernel/shmmni", "kernel/msgmni", "kernel/sem", "kernel/shm_rmid_forced", "fs/mqueue/queues_max"):
    print(p, *open("/proc/sys/" + p).read().split())
print(subprocess.run(["id"], capture_output=True, text=True).stdout.strip())
`, sandbox.Limits{Pids: 20})
			wantStatus(t, res, sandbox.StatusOK)
			lines := strings.Split(strings.TrimSpace(res.Stdout), "\n")
			want := []string{"CORE 1 1", "SIGPENDING 1024 1024", "MSGQUEUE 262144 262144", "MEMLOCK 65536 65536",
				"NPROC 20 20", "kernel/shmmni 32", "kernel/msgmni 32", "kernel/sem 250 2000 32 32",
				"kernel/shm_rmid_forced 1", "fs/mqueue/queues_max 32"}
			if len(lines) != len(want)+1 || strings.Join(lines[:len(want)], "\n") != strings.Join(want, "\n") {
				t.Fatalf("limits inside:\n%s\nwant\n%s", res.Stdout, strings.Join(want, "\n"))
			}
			// The sandbox user keeps its name (and home): only its
			// number is the host's.
			var uid int
			fmt.Sscanf(lines[len(want)], "uid=%d", &uid)
			wantSandboxUID(t, fmt.Sprint(uid))
			if id := fmt.Sprintf("uid=%[1]d(sandbox) gid=%[1]d(sandbox) groups=%[1]d(sandbox)", uid); lines[len(want)] != id {
				t.Errorf("id says %q, want %q", lines[len(want)], id)
			}
		})
		t.Run("output_cap", func(t *testing.T) {
			t.Parallel()
			res := oneShot(t, "import sys\nfor _ in range(1000): sys.stdout.write('x' * 1000)", sandbox.Limits{MaxOutput: 10000})
			wantStatus(t, res, sandbox.StatusOK)
			if len(res.Stdout) != 10000 || !res.StdoutTruncated {
				t.Fatalf("%d bytes kept, truncated %v", len(res.Stdout), res.StdoutTruncated)
			}
		})
		t.Run("close_ends_everything", func(t *testing.T) {
			t.Parallel()
			sb, err := b.Create(ctx, sandbox.Spec{})
			if err != nil {
				t.Fatal(err)
			}
			// A process that ignores everything, and output nobody reads.
			run(t, sb, "import subprocess\nsubprocess.Popen(['sh', '-c', 'trap \"\" TERM INT HUP; while :; do echo x; done'])")
			if err := sb.Close(); err != nil {
				t.Fatal(err)
			}
			if ids, _ := docker.Containers(b.host, b.name); len(ids) > 0 {
				// Other cases' sandboxes may be running: this one's is
				// checked by the leftovers below.
				t.Logf("containers of other cases: %d", len(ids))
			}
		})
	})
	if left := b.leftovers(t); len(left) > 0 {
		t.Errorf("left behind: %v", left)
	}
}

// A supervisor that died left a running sandbox: the next one's Sweep
// removes its container, its disk and its root view.
func TestSweepRemovesWhatACrashLeft(t *testing.T) {
	const name = "vivarium-docker-sweep-test"
	crashed := newBackend(t, name, docker.Config{})
	sb, err := crashed.Create(context.Background(), sandbox.Spec{})
	if err != nil {
		t.Fatal(err)
	}
	wantStatus(t, run(t, sb, "import subprocess; subprocess.Popen(['sleep', '1000']); 1"), sandbox.StatusOK)
	if ids, _ := docker.Containers(crashed.host, crashed.name); len(ids) != 1 {
		t.Fatalf("containers %v, want 1", ids)
	}
	// The successor, as after a crash: the sandbox above is never closed.
	next := newBackend(t, name, docker.Config{})
	swept, err := next.Sweep()
	if err != nil {
		t.Fatal(err)
	}
	if len(swept) == 0 {
		t.Fatal("Sweep found nothing")
	}
	if ids, _ := docker.Containers(next.host, next.name); len(ids) != 0 {
		t.Fatalf("containers left: %v", ids)
	}
	if roots, _ := filepath.Glob(filepath.Join(next.dir, "root-*")); len(roots) != 1 {
		t.Fatalf("root views %v, want the successor's alone", roots)
	}
	sb.Close() // what the dead supervisor never did: harmless now
	crashed.Close()
	if left := next.leftovers(t); len(left) > 0 {
		t.Errorf("left behind: %v", left)
	}
}

// Errors name what is missing: the daemon, the runtime.
func TestUnavailable(t *testing.T) {
	testutil.RequireRoot(t)
	_, err := docker.New(docker.Config{Host: "unix:///nonexistent/docker.sock", Name: "vivarium-docker-missing-test"})
	if !errors.Is(err, docker.ErrNoDaemon) || !errors.Is(err, sandbox.ErrUnsupported) ||
		!strings.Contains(err.Error(), "/nonexistent/docker.sock") {
		t.Errorf("no daemon: %v", err)
	}
	_, err = docker.New(docker.Config{Host: "tcp://10.0.0.1:2375", Name: "vivarium-docker-missing-test"})
	if !errors.Is(err, docker.ErrNoDaemon) || !strings.Contains(err.Error(), "local daemon") {
		t.Errorf("remote daemon: %v", err)
	}
	d := testutil.RequireDockerd(t)
	_, err = docker.New(docker.Config{Host: d.Host, Runtime: "nope", Name: "vivarium-docker-missing-test"})
	if !errors.Is(err, docker.ErrNoRuntime) || !strings.Contains(err.Error(), `no runtime "nope"`) {
		t.Errorf("unknown runtime: %v", err)
	}
}

// With runsc registered in the daemon, --docker-runtime runsc runs the
// sandbox under gVisor.
func TestRunsc(t *testing.T) {
	testutil.RequirePython(t)
	d := testutil.RequireDockerd(t)
	if _, err := docker.Check(d.Host, "runsc"); err != nil {
		t.Skipf("runsc: %v", err)
	}
	b := newBackend(t, "vivarium-docker-runsc-test", docker.Config{Runtime: "runsc"})
	res, warn := sandbox.RunOnce(context.Background(), b, sandbox.OneShot{Request: sandbox.ExecRequest{
		Code: "import os\nprint(os.uname().release, os.getuid())"}})
	if warn != nil {
		t.Error(warn)
	}
	wantStatus(t, res, sandbox.StatusOK)
	// gVisor's kernel says it is Linux 4.4.0.
	if res.Stdout != "4.4.0 1000\n" {
		t.Errorf("not under gVisor? %q", res.Stdout)
	}
	// Its /proc is its kernel's, which shows nothing of the host: the
	// backend binds no file over it (the loadavg would be the native
	// backend's, 1/1 1).
	res, warn = sandbox.RunOnce(context.Background(), b, sandbox.OneShot{Request: sandbox.ExecRequest{Code: `import os
for p in ("sys/kernel/random/boot_id", "cmdline", "loadavg", "locks"):
    try:
        print(p, open("/proc/" + p).read().strip())
    except OSError as e:
        print(p, os.strerror(e.errno))
`}})
	if warn != nil {
		t.Error(warn)
	}
	wantStatus(t, res, sandbox.StatusOK)
	if want := "sys/kernel/random/boot_id No such file or directory\ncmdline BOOT_IMAGE=/vmlinuz-4.4.0-gvisor quiet\n" +
		"loadavg 0.00 0.00 0.00 0/0 0\nlocks No such file or directory\n"; res.Stdout != want {
		t.Errorf("/proc under gVisor:\n%s\nwant\n%s", res.Stdout, want)
	}
	if left := b.leftovers(t); len(left) > 0 {
		t.Errorf("left behind: %v", left)
	}
}

// The image holds directories and links only, in a stable archive: the
// same layout makes the same image.
func TestImageContent(t *testing.T) {
	dir := t.TempDir()
	for _, d := range []string{"usr", "etc/alternatives", "opt/vivarium/bin", "workspace"} {
		os.MkdirAll(filepath.Join(dir, d), 0o755)
	}
	os.WriteFile(filepath.Join(dir, "etc/passwd"), []byte("root"), 0o644)
	os.WriteFile(filepath.Join(dir, "opt/vivarium/runner.py"), []byte("x"), 0o644)
	os.Symlink("usr/bin", filepath.Join(dir, "bin"))
	a, err := docker.ImageTar(dir)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := docker.ImageTar(dir)
	if !bytes.Equal(a, b) {
		t.Error("two archives of the same layout differ")
	}
	var names []string
	tr := tar.NewReader(bytes.NewReader(a))
	for {
		h, err := tr.Next()
		if err != nil {
			break
		}
		if h.Typeflag == tar.TypeReg {
			t.Errorf("a file in the image: %s", h.Name)
		}
		names = append(names, h.Name)
	}
	want := "bin etc/ opt/ opt/vivarium/ usr/ workspace/ sys/"
	if got := strings.Join(names, " "); got != want {
		t.Errorf("image entries %q, want %q", got, want)
	}
}
