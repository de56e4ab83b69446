package native_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vivarium-sandbox/vivarium/internal/backend/native"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/testutil"
)

// The test binary is re-executed as every sandbox's init. The whole suite
// runs twice: with a classic init per sandbox, then (in a re-executed test
// binary) with sandboxes forked from a zygote.
func TestMain(m *testing.M) {
	if native.IsInit() {
		native.RunInit()
	}
	code := testutil.RunBothModes(m)
	// The backend the tests share, and its zygote's cgroup with it.
	if backend != nil {
		backend.Close()
	}
	for _, b := range benchBackends {
		b.Close()
	}
	os.Exit(code)
}

// Each test package has its own cgroup parent and uid range, so that
// leftover checks are not confused by packages testing in parallel.
const (
	cgroupParent = "vivarium-native-test"
	uidBase      = native.DefaultUIDBase + 1<<24
)

var (
	backendOnce sync.Once
	backend     *native.Backend
	backendErr  error
)

func newBackend(t *testing.T) *native.Backend {
	t.Helper()
	testutil.RequireRoot(t)
	testutil.RequirePython(t)
	backendOnce.Do(func() {
		backend, backendErr = native.New(native.Config{CgroupParent: cgroupParent, UIDBase: uidBase, UIDRanges: testutil.UIDRanges,
			Zygote: testutil.ZygoteMode(), Preload: []string{"numpy"}})
	})
	if backendErr != nil {
		t.Fatal(backendErr)
	}
	return backend
}

// run executes code in a fresh one-shot sandbox.
func run(t *testing.T, code string, opts ...func(*sandbox.OneShot)) *sandbox.Result {
	t.Helper()
	job := sandbox.OneShot{
		Spec:    sandbox.Spec{Limits: sandbox.Limits{Timeout: 30 * time.Second}},
		Request: sandbox.ExecRequest{Code: code},
	}
	for _, o := range opts {
		o(&job)
	}
	res, warn := sandbox.RunOnce(context.Background(), newBackend(t), job)
	if warn != nil {
		t.Errorf("warning: %v", warn)
	}
	if res.Status == sandbox.StatusSetupFailed {
		t.Fatalf("setup failed: %s", res.Error.Value)
	}
	return res
}

// A one-shot answer comes before the sandbox's tear-down, but after all
// that python3 does at exit: non-daemon threads joined, atexit handlers
// run, the streams flushed, the exit status theirs.
func TestOneShotEndsAsPython(t *testing.T) {
	t.Parallel()
	res := run(t, `import atexit, sys, threading, time
def late():
    time.sleep(0.3)
    print("thread")
def bye():
    print("atexit", file=sys.stderr)
    sys.stdout.write("unflushed")
atexit.register(bye)
threading.Thread(target=late).start()
print("main")
sys.exit(3)
`)
	wantStatus(t, res, sandbox.StatusError, 3)
	if res.Stdout != "main\nthread\nunflushed" || res.Stderr != "atexit\n" {
		t.Fatalf("stdout %q stderr %q", res.Stdout, res.Stderr)
	}
}

func wantStatus(t *testing.T, res *sandbox.Result, status sandbox.Status, code int) {
	t.Helper()
	if res.Status != status || res.ExitCode != code {
		t.Fatalf("status %s exit %d, want %s exit %d\nstdout: %s\nstderr: %s\nerror: %+v",
			res.Status, res.ExitCode, status, code, res.Stdout, res.Stderr, res.Error)
	}
}

func TestPrintAndStreams(t *testing.T) {
	t.Parallel()
	res := run(t, "import sys\nprint('out 1')\nprint('err 1', file=sys.stderr)\nprint('out 2')")
	wantStatus(t, res, sandbox.StatusOK, 0)
	if res.Stdout != "out 1\nout 2\n" || res.Stderr != "err 1\n" {
		t.Fatalf("stdout %q stderr %q", res.Stdout, res.Stderr)
	}
	if res.DurationMS <= 0 || res.CPUMS <= 0 || res.PeakMemoryBytes <= 0 {
		t.Fatalf("missing accounting: %+v", res)
	}
}

func TestExceptionTraceback(t *testing.T) {
	t.Parallel()
	res := run(t, "def f(x):\n    return 1 / x\n\nf(0)\n")
	wantStatus(t, res, sandbox.StatusError, 1)
	e := res.Error
	if e == nil || e.Name != "ZeroDivisionError" || e.Value != "division by zero" {
		t.Fatalf("error = %+v", e)
	}
	for _, want := range []string{"Traceback (most recent call last):", `File "<cell>", line 4`, "return 1 / x", "ZeroDivisionError: division by zero"} {
		if !strings.Contains(e.Traceback, want) {
			t.Errorf("traceback lacks %q:\n%s", want, e.Traceback)
		}
	}
	if strings.Contains(e.Traceback, "runner.py") {
		t.Errorf("traceback shows the runner's frames:\n%s", e.Traceback)
	}
}

func TestSyntaxError(t *testing.T) {
	t.Parallel()
	res := run(t, "def (:\n")
	wantStatus(t, res, sandbox.StatusError, 1)
	if res.Error.Name != "SyntaxError" || !strings.Contains(res.Error.Traceback, "SyntaxError") {
		t.Fatalf("error = %+v", res.Error)
	}
}

func TestExitCodes(t *testing.T) {
	t.Parallel()
	for code, want := range map[string]int{
		"import sys; sys.exit(3)":                                 3,
		"import sys; sys.exit(0)":                                 0,
		"import sys; sys.exit()":                                  0,
		"import sys; sys.exit('bye')":                             1,
		"import os; os._exit(7)":                                  7,
		"raise SystemExit(42)":                                    42,
		"import os, signal; os.kill(os.getpid(), signal.SIGTERM)": 128 + 15,
	} {
		res := run(t, code)
		if res.ExitCode != want {
			t.Errorf("%s: exit %d, want %d (status %s, error %+v)", code, res.ExitCode, want, res.Status, res.Error)
		}
	}
}

func TestLastExpressionAndRichResults(t *testing.T) {
	t.Parallel()
	res := run(t, `
class Rich:
    def _repr_html_(self): return "<b>rich</b>"
    def _repr_markdown_(self): return "**rich**"
    def _repr_json_(self): return {"rich": True}
    def _repr_latex_(self): return r"$\alpha$"
    def _repr_svg_(self): return "<svg></svg>"
    def __repr__(self): return "Rich()"
display(Rich())
x = 20
x + 22
`)
	wantStatus(t, res, sandbox.StatusOK, 0)
	if len(res.Results) != 2 {
		t.Fatalf("results = %+v", res.Results)
	}
	r := res.Results[0]
	if r.IsMainResult || r.Text != "Rich()" || r.HTML != "<b>rich</b>" || r.Markdown != "**rich**" ||
		string(r.JSON) != `{"rich": true}` || r.LaTeX != `$\alpha$` || r.SVG != "<svg></svg>" {
		t.Fatalf("display result = %+v", r)
	}
	if m := res.Results[1]; !m.IsMainResult || m.Text != "42" {
		t.Fatalf("main result = %+v", m)
	}
}

func TestNoResultForNoneOrStatement(t *testing.T) {
	t.Parallel()
	for _, code := range []string{"x = 1", "None", "print('hi')", "for i in range(2): i"} {
		if res := run(t, code); len(res.Results) != 0 {
			t.Errorf("%q gave results %+v", code, res.Results)
		}
	}
}

func TestDataFrameAndChart(t *testing.T) {
	t.Parallel()
	testutil.RequirePythonModules(t, "pandas", "matplotlib")
	res := run(t, `
import pandas as pd
import matplotlib.pyplot as plt
df = pd.DataFrame({"a": [1, 2, 3], "b": [4, 5, 6]})
plt.plot(df["a"], df["b"])
plt.show()
fig = plt.figure()
plt.bar(["x"], [1])
df
`)
	wantStatus(t, res, sandbox.StatusOK, 0)
	var pngs int
	var main *sandbox.Output
	for i, r := range res.Results {
		if r.PNG != "" {
			b, err := base64.StdEncoding.DecodeString(r.PNG)
			if err != nil || !bytes.HasPrefix(b, []byte("\x89PNG\r\n\x1a\n")) {
				t.Fatalf("result %d: not a PNG (%v)", i, err)
			}
			pngs++
		}
		if r.IsMainResult {
			main = &res.Results[i]
		}
	}
	// One figure from show(), one left open at the end.
	if pngs != 2 {
		t.Errorf("%d PNG results, want 2", pngs)
	}
	if main == nil || !strings.Contains(main.HTML, "<table") || !strings.Contains(main.Text, "a  b") {
		t.Fatalf("DataFrame main result = %+v", main)
	}
}

func TestScientificStack(t *testing.T) {
	t.Parallel()
	testutil.RequirePythonModules(t, "numpy", "pandas", "matplotlib", "scipy")
	res := run(t, `
import numpy as np, scipy.linalg, pandas, matplotlib
a = np.random.default_rng(0).random((200, 200))
print(round(float(np.abs(scipy.linalg.inv(a) @ a - np.eye(200)).max()), 6))
`)
	wantStatus(t, res, sandbox.StatusOK, 0)
	if strings.TrimSpace(res.Stdout) != "0.0" {
		t.Fatalf("stdout %q stderr %q", res.Stdout, res.Stderr)
	}
}

func TestFilesInAndOut(t *testing.T) {
	t.Parallel()
	out := t.TempDir()
	in := filepath.Join(t.TempDir(), "data.csv")
	if err := os.WriteFile(in, []byte("a,b\n1,2\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	res := run(t, `
import os
print(open("input/data.csv").read().strip().replace("\n", ";"))
os.makedirs("results", exist_ok=True)
open("results/sum.txt", "w").write("3")
`, func(j *sandbox.OneShot) {
		j.Files = []sandbox.InputFile{{Name: "input/data.csv", Open: func() (io.ReadCloser, error) { return os.Open(in) }}}
		j.OutDir = out
	})
	wantStatus(t, res, sandbox.StatusOK, 0)
	if res.Stdout != "a,b;1,2\n" {
		t.Fatalf("stdout %q stderr %q", res.Stdout, res.Stderr)
	}
	b, err := os.ReadFile(filepath.Join(out, "results", "sum.txt"))
	if err != nil || string(b) != "3" {
		t.Fatalf("copied out: %q, %v", b, err)
	}
	var paths []string
	for _, f := range res.Files {
		paths = append(paths, f.Path)
	}
	if strings.Join(paths, ",") != "input/data.csv,results/sum.txt" {
		t.Fatalf("files = %v", paths)
	}
}

func TestThreadsProcessesSubprocess(t *testing.T) {
	t.Parallel()
	res := run(t, `
import multiprocessing as mp, subprocess, threading
def sq(x): return x * x
if __name__ == "__main__":
    out = []
    ts = [threading.Thread(target=lambda i=i: out.append(i)) for i in range(8)]
    [t.start() for t in ts]; [t.join() for t in ts]
    print(sorted(out))
    with mp.Pool(4) as p:
        print(p.map(sq, range(5)))
    print(subprocess.run(["sh", "-c", "echo from shell; id -u"], capture_output=True, text=True).stdout.split())
`)
	wantStatus(t, res, sandbox.StatusOK, 0)
	want := "[0, 1, 2, 3, 4, 5, 6, 7]\n[0, 1, 4, 9, 16]\n['from', 'shell', '1000']\n"
	if res.Stdout != want {
		t.Fatalf("stdout %q, want %q; stderr %s", res.Stdout, want, res.Stderr)
	}
}

func TestEnvironmentIsOnlyWhatWasGiven(t *testing.T) {
	t.Setenv("VIVARIUM_HOST_ONLY", "leak")
	res := run(t, `import os; print(sorted(os.environ.get(k, "-") for k in ("VIVARIUM_HOST_ONLY", "GREETING"))); print(os.getcwd(), os.environ["HOME"])`,
		func(j *sandbox.OneShot) { j.Spec.Env = map[string]string{"GREETING": "hello"} })
	wantStatus(t, res, sandbox.StatusOK, 0)
	if res.Stdout != "['-', 'hello']\n/workspace /workspace\n" {
		t.Fatalf("stdout %q", res.Stdout)
	}
}

func TestLimits(t *testing.T) {
	t.Parallel()
	limited := func(l sandbox.Limits) func(*sandbox.OneShot) {
		return func(j *sandbox.OneShot) { j.Spec.Limits = l }
	}
	t.Run("wall clock", func(t *testing.T) {
		t.Parallel()
		start := time.Now()
		res := run(t, "import time; print('start', flush=True); time.sleep(60)", limited(sandbox.Limits{Timeout: time.Second}))
		wantStatus(t, res, sandbox.StatusTimeout, sandbox.ExitTimeout)
		if res.Stdout != "start\n" || time.Since(start) > 15*time.Second {
			t.Fatalf("stdout %q after %v", res.Stdout, time.Since(start))
		}
	})
	t.Run("cpu time", func(t *testing.T) {
		t.Parallel()
		res := run(t, "while True: pass", limited(sandbox.Limits{Timeout: 30 * time.Second, CPUTime: time.Second}))
		wantStatus(t, res, sandbox.StatusTimeout, sandbox.ExitTimeout)
		if !strings.Contains(res.Error.Value, "CPU time") {
			t.Fatalf("error = %+v", res.Error)
		}
	})
	t.Run("memory", func(t *testing.T) {
		t.Parallel()
		res := run(t, "x = []\nwhile True: x.append(bytearray(16 << 20))", limited(sandbox.Limits{Memory: 128 << 20}))
		wantStatus(t, res, sandbox.StatusMemoryLimit, sandbox.ExitMemoryLimit)
	})
	t.Run("pids", func(t *testing.T) {
		t.Parallel()
		res := run(t, `
import os, time
n = 0
try:
    while True:
        if os.fork() == 0:
            time.sleep(30); os._exit(0)
        n += 1
except OSError as e:
    print("stopped", e.errno, n)
`, limited(sandbox.Limits{Pids: 16}))
		wantStatus(t, res, sandbox.StatusOK, 0)
		// The runner and its children are the code's 16; init's
		// threads are not taken from them (fitPids), though one init
		// makes while the code runs may be.
		var errno, n int
		if _, err := fmt.Sscanf(res.Stdout, "stopped %d %d\n", &errno, &n); err != nil || errno != 11 || n < 13 || n > 15 {
			t.Fatalf("want EAGAIN after 13 to 15 children: stdout %q stderr %q", res.Stdout, res.Stderr)
		}
	})
	t.Run("output", func(t *testing.T) {
		t.Parallel()
		res := run(t, "import sys\nfor _ in range(1000): sys.stdout.write('x' * 10000)", limited(sandbox.Limits{MaxOutput: 64 << 10}))
		wantStatus(t, res, sandbox.StatusOK, 0)
		if len(res.Stdout) != 64<<10 || !res.StdoutTruncated || res.StderrTruncated {
			t.Fatalf("stdout %d bytes, truncated %v", len(res.Stdout), res.StdoutTruncated)
		}
	})
	t.Run("disk", func(t *testing.T) {
		t.Parallel()
		res := run(t, `
try:
    with open("big", "wb") as f:
        while True: f.write(b"x" * (1 << 20))
except OSError as e:
    print(e.errno)
`, limited(sandbox.Limits{Disk: 16 << 20}))
		wantStatus(t, res, sandbox.StatusOK, 0)
		// ENOSPC from the tmpfs, or EFBIG from the file-size rlimit that
		// matches it: either way the disk limit held.
		if res.Stdout != "28\n" && res.Stdout != "27\n" {
			t.Fatalf("stdout %q stderr %q", res.Stdout, res.Stderr)
		}
	})
}

// A detached process holding stdout open must not keep a run alive, and
// nothing of a sandbox may outlive it.
func TestNothingOutlivesTheRun(t *testing.T) {
	newBackend(t)
	mounts := testutil.Mounts()
	groups := len(testutil.CgroupsUnder(cgroupParent))
	start := time.Now()
	res := run(t, `
import os, signal, subprocess
subprocess.Popen(["sh", "-c", "trap '' TERM HUP; while true; do echo alive; sleep 0.1; done"], start_new_session=True)
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        while True: pass
    os._exit(0)
print("parent done")
`)
	wantStatus(t, res, sandbox.StatusOK, 0)
	if time.Since(start) > 10*time.Second {
		t.Fatalf("run took %v: a detached child kept it alive", time.Since(start))
	}
	if left := testutil.ProcessesOwnedBy(uidBase, uidBase+testutil.UIDSpan); len(left) > 0 {
		out, _ := exec.Command("sh", "-c", "ps -eo pid,ppid,uid,stat,comm,args | grep -v ' 0 '").CombinedOutput()
		t.Fatalf("processes left behind: %v\n%s", left, out)
	}
	// This test is not parallel: no other sandbox is running now.
	if left := testutil.CgroupsUnder(cgroupParent); len(left) > groups {
		t.Fatalf("cgroups left behind: %v", left)
	}
	for _, m := range testutil.MountsAdded(mounts, 2*time.Second, "native") {
		t.Fatalf("mount left on the host: %s", m)
	}
}

// A persistent sandbox keeps state between executions, like a notebook.
func TestPersistentState(t *testing.T) {
	t.Parallel()
	b := newBackend(t)
	sb, err := b.Create(context.Background(), sandbox.Spec{})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	exec := func(code string) *sandbox.Result {
		t.Helper()
		res, err := sb.Execute(context.Background(), sandbox.ExecRequest{Code: code}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	if res := exec("x = 1\nprint('set')"); res.Status != sandbox.StatusOK || res.Stdout != "set\n" {
		t.Fatalf("%+v", res)
	}
	if res := exec("x + 1"); len(res.Results) != 1 || res.Results[0].Text != "2" || res.Stdout != "" {
		t.Fatalf("%+v", res)
	}
	if res := exec("1/0"); res.Status != sandbox.StatusError || res.Error.Name != "ZeroDivisionError" {
		t.Fatalf("%+v", res)
	}
	if res := exec("import sys; sys.exit(4)"); res.Status != sandbox.StatusError || res.ExitCode != 4 {
		t.Fatalf("%+v", res)
	}
	// An exception or sys.exit does not end the sandbox.
	if res := exec("x"); res.Results[0].Text != "1" {
		t.Fatalf("%+v", res)
	}
	if res := exec("open('kept.txt', 'w').write('still here')"); res.Status != sandbox.StatusOK {
		t.Fatalf("%+v", res)
	}
	// A limit restarts the Python process: state is lost, files are kept.
	res, err := sb.Execute(context.Background(), sandbox.ExecRequest{Code: "while True: pass", Timeout: 500 * time.Millisecond}, nil)
	if err != nil || res.Status != sandbox.StatusTimeout || !res.StateLost {
		t.Fatalf("%+v, %v", res, err)
	}
	if res := exec("print(open('kept.txt').read()); x"); res.Stdout != "still here\n" || res.Error == nil || res.Error.Name != "NameError" || res.StateLost {
		t.Fatalf("after restart: %+v", res)
	}
	// So does a runner that exits; the next execution works again.
	if res := exec("y = 5\nimport os; os._exit(9)"); res.ExitCode != 9 || !res.StateLost {
		t.Fatalf("os._exit: %+v", res)
	}
	if res := exec("'y' in globals()"); res.Results[0].Text != "False" {
		t.Fatalf("%+v", res)
	}
}

func TestInterruptKeepsState(t *testing.T) {
	t.Parallel()
	sb, err := newBackend(t).Create(context.Background(), sandbox.Spec{})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	ctx := context.Background()
	if _, err := sb.Execute(ctx, sandbox.ExecRequest{Code: "n = 0"}, nil); err != nil {
		t.Fatal(err)
	}
	started := make(chan struct{})
	var once sync.Once
	go func() {
		<-started
		sb.Interrupt()
	}()
	res, err := sb.Execute(ctx, sandbox.ExecRequest{Code: "while True:\n    n += 1\n    if n == 1000: print('looping', flush=True)"},
		sinkFunc(func([]byte) { once.Do(func() { close(started) }) }))
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != sandbox.StatusError || res.Error.Name != "KeyboardInterrupt" || res.StateLost {
		t.Fatalf("%+v", res)
	}
	if res, _ := sb.Execute(ctx, sandbox.ExecRequest{Code: "n > 0"}, nil); len(res.Results) != 1 || res.Results[0].Text != "True" {
		t.Fatalf("state after interrupt: %+v", res)
	}
	// Code that ignores the interrupt ends at its timeout, with a restart.
	once = sync.Once{}
	started = make(chan struct{})
	go func() {
		<-started
		sb.Interrupt()
	}()
	res, err = sb.Execute(ctx, sandbox.ExecRequest{Timeout: time.Second, Code: `
import signal
signal.signal(signal.SIGINT, signal.SIG_IGN)
print("ignoring", flush=True)
while True: pass`}, sinkFunc(func([]byte) { once.Do(func() { close(started) }) }))
	if err != nil || res.Status != sandbox.StatusTimeout || !res.StateLost {
		t.Fatalf("%+v %v", res, err)
	}
}

func TestRestart(t *testing.T) {
	t.Parallel()
	sb, err := newBackend(t).Create(context.Background(), sandbox.Spec{})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	ctx := context.Background()
	sb.Execute(ctx, sandbox.ExecRequest{Code: "z = 1\nopen('f', 'w').write('kept')\nimport subprocess\nsubprocess.Popen(['sleep', '1000'])"}, nil)
	if err := sb.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	res, err := sb.Execute(ctx, sandbox.ExecRequest{Code: `
import os
procs = [p for p in os.listdir("/proc") if p.isdigit()]
print(open("f").read(), "z" in globals(), len(procs))`}, nil)
	// init and the new runner: the old runner's child is gone.
	if err != nil || res.Stdout != "kept False 2\n" || res.StateLost {
		t.Fatalf("%+v %v", res, err)
	}
}

func TestCommands(t *testing.T) {
	t.Parallel()
	sb, err := newBackend(t).Create(context.Background(), sandbox.Spec{Env: map[string]string{"FROM_SPEC": "s"}})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	ctx := context.Background()
	p, err := sb.Start(ctx, sandbox.Command{Argv: []string{"sh", "-c", "read line; echo got $line $FROM_SPEC $FROM_CMD; pwd; id -u; echo oops >&2; exit 3"},
		Env: map[string]string{"FROM_CMD": "c"}, Dir: "/tmp"})
	if err != nil {
		t.Fatal(err)
	}
	io.WriteString(p.Stdin(), "hello\n")
	p.Stdin().Close()
	out, _ := io.ReadAll(p.Stdout())
	errOut, _ := io.ReadAll(p.Stderr())
	if string(out) != "got hello s c\n/tmp\n1000\n" || string(errOut) != "oops\n" || p.ExitCode() != 3 {
		t.Fatalf("stdout %q stderr %q exit %d", out, errOut, p.ExitCode())
	}
	// A command runs beside an execution, and can be killed with its children.
	long, err := sb.Start(ctx, sandbox.Command{Argv: []string{"sh", "-c", "sleep 1000 & sleep 1000"}})
	if err != nil {
		t.Fatal(err)
	}
	if res, err := sb.Execute(ctx, sandbox.ExecRequest{Code: "1 + 1"}, nil); err != nil || res.Results[0].Text != "2" {
		t.Fatalf("%+v %v", res, err)
	}
	if err := long.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-long.Done()
	if long.ExitCode() != 128+9 {
		t.Fatalf("exit %d", long.ExitCode())
	}
	if _, err := sb.Start(ctx, sandbox.Command{Argv: []string{"/no/such/program"}}); err == nil {
		t.Fatal("starting a missing program succeeded")
	}
}

// Output reaches the sink while the code runs: the code waits for a file
// that the host writes only after it has seen the first line.
func TestStreamingSink(t *testing.T) {
	t.Parallel()
	b := newBackend(t)
	sb, err := b.Create(context.Background(), sandbox.Spec{})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	var mu sync.Mutex
	var got []string
	sink := sinkFunc(func(p []byte) {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, string(p))
		if strings.Contains(strings.Join(got, ""), "early\n") && len(got) == 1 {
			if err := sb.Workspace().WriteFile("go", strings.NewReader("1"), 10); err != nil {
				t.Error(err)
			}
		}
	})
	res, err := sb.Execute(context.Background(), sandbox.ExecRequest{Code: `
import os, time
print("early", flush=True)
for _ in range(1000):
    if os.path.exists("go"):
        print("streamed")
        break
    time.sleep(0.01)
else:
    print("not streamed")
`}, sink)
	if err != nil {
		t.Fatal(err)
	}
	wantStatus(t, res, sandbox.StatusOK, 0)
	if res.Stdout != "early\nstreamed\n" || strings.Join(got, "") != res.Stdout {
		t.Fatalf("stdout %q, streamed %q", res.Stdout, got)
	}
}

type sinkFunc func([]byte)

func (f sinkFunc) Stdout(p []byte) { f(p) }
func (f sinkFunc) Stderr(p []byte) { f(p) }

// Descriptors the supervisor inherited from its own parent never reach
// the sandbox.
func TestNoInheritedDescriptors(t *testing.T) {
	f, err := os.Open("/etc/hostname")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	// A descriptor without close-on-exec, as a careless parent process
	// would leave, above the ones the sandbox's init is given.
	const leaked = 200
	if err := unix.Dup3(int(f.Fd()), leaked, 0); err != nil {
		t.Fatal(err)
	}
	defer unix.Close(leaked)
	res := run(t, `
import os
for fd in sorted(int(x) for x in os.listdir("/proc/self/fd")):
    try:
        print(fd, os.readlink(f"/proc/self/fd/{fd}"))
    except OSError:
        pass`)
	for _, line := range strings.Split(res.Stdout, "\n") {
		if strings.HasSuffix(line, "/etc/hostname") {
			t.Fatalf("host descriptor in the sandbox: %s\n%s", line, res.Stdout)
		}
	}
}

// Every sandbox is a host user of its own, from the backend's pool, and
// gives its ids back when it closes: with a pool of two, a third sandbox
// waits for one of the first two to close.
func TestEverySandboxIsItsOwnHostUser(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequirePython(t)
	// Past the shared backend's ranges, still within this package's.
	base := uint32(uidBase + testutil.UIDSpan)
	b, err := native.New(native.Config{CgroupParent: cgroupParent + "-owner", UIDBase: base, UIDRanges: 2,
		Zygote: testutil.ZygoteMode(), Preload: []string{"json"}})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ctx := context.Background()
	hostUID := func(s sandbox.Sandbox) uint32 {
		t.Helper()
		// The first line of uid_map: "0 <host uid> 65536".
		res, err := s.Execute(ctx, sandbox.ExecRequest{Code: `import os
print(open("/proc/self/uid_map").read().split()[1], os.getuid())`}, nil)
		if err != nil || res.Status != sandbox.StatusOK {
			t.Fatalf("uid_map: %v %+v", err, res)
		}
		var root, uid uint32
		if _, err := fmt.Sscan(res.Stdout, &root, &uid); err != nil || uid != native.SandboxUID {
			t.Fatalf("uid_map said %q", res.Stdout)
		}
		return root
	}
	first, max := base, base+2*65536
	a, err := b.Create(ctx, sandbox.Spec{})
	if err != nil {
		t.Fatal(err)
	}
	ua := hostUID(a)
	if ua < first || ua >= max || (ua-first)%65536 != 0 {
		t.Fatalf("sandbox's host root %d is not a range of the pool [%d, %d)", ua, first, max)
	}
	if testutil.ZygoteMode() {
		// The zygote is a host user too: the pool is full.
		if _, err := b.Create(ctx, sandbox.Spec{}); err == nil || !strings.Contains(err.Error(), "in use") {
			t.Fatalf("a sandbox beyond the pool: %v", err)
		}
		a.Close()
		return
	}
	c, err := b.Create(ctx, sandbox.Spec{})
	if err != nil {
		t.Fatal(err)
	}
	uc := hostUID(c)
	if uc == ua || uc < first || uc >= max {
		t.Fatalf("two sandboxes, host users %d and %d", ua, uc)
	}
	// Their processes, seen from the host, are those users.
	for _, u := range []uint32{ua, uc} {
		if procs := testutil.ProcessesOwnedBy(int(u)+native.SandboxUID, int(u)+native.SandboxUID+1); len(procs) == 0 {
			t.Errorf("no process of host user %d", u+native.SandboxUID)
		}
	}
	if _, err := b.Create(ctx, sandbox.Spec{}); err == nil || !strings.Contains(err.Error(), "in use") {
		t.Fatalf("a third sandbox in a pool of two: %v", err)
	}
	c.Close()
	if left := testutil.ProcessesOwnedBy(int(uc), int(uc)+65536); len(left) > 0 {
		t.Fatalf("closed, and still running as its host user: %v", left)
	}
	d, err := b.Create(ctx, sandbox.Spec{})
	if err != nil {
		t.Fatalf("after one closed: %v", err)
	}
	if ud := hostUID(d); ud != uc {
		t.Fatalf("the freed range %d was not reused (got %d)", uc, ud)
	}
	d.Close()
	a.Close()
}

// The runner, commands and what either starts go before init when the
// sandbox reaches its memory limit (a higher OOM score than init's): a
// sandbox of many small processes had lost its init, the largest, and
// with it everything. A command has its score from its fork: one written
// after its start missed the first child of a shell (seen in zygote mode).
func TestRunnerGoesBeforeInit(t *testing.T) {
	t.Parallel()
	b := newBackend(t)
	sb, err := b.Create(context.Background(), sandbox.Spec{})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	res, err := sb.Execute(context.Background(), sandbox.ExecRequest{Code: "import subprocess\n" +
		"print(open('/proc/self/oom_score_adj').read().strip(), open('/proc/1/oom_score_adj').read().strip(),\n" +
		"      subprocess.run(['cat', '/proc/self/oom_score_adj'], capture_output=True, text=True).stdout.strip())"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.Stdout != "500 0 500\n" {
		t.Fatalf("oom_score_adj of the runner, init and a child: %q %s", res.Stdout, res.Stderr)
	}
	// A command's (which init starts), as its user and as the sandbox's
	// root, and its children's.
	for _, user := range []string{"", sandbox.UserRoot} {
		out, code := command(t, sb, user, "sh", "-c", "cat /proc/self/oom_score_adj; sleep 0.1; sh -c 'cat /proc/$$/oom_score_adj'")
		if out != "500\n500\n" || code != 0 {
			t.Errorf("oom_score_adj of a command as %q and its child: %q (exit %d)", user, out, code)
		}
	}
}
