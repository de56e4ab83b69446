package wasm_test

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/backend/wasm"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/testutil"
)

// The functional tests of the foundation issue, on the wasm backend: where
// the native backend's test (internal/backend/native) checks something a
// wasm sandbox cannot do (threads, processes, commands, interrupts), this
// checks the clear error that replaces it. They need the interpreter that
// `make wasm` builds, and skip without it.

var (
	backendOnce sync.Once
	backend     *wasm.Backend
	backendErr  error
)

func newBackend(t *testing.T) *wasm.Backend {
	t.Helper()
	testutil.SkipShort(t, "needs the wasm interpreter")
	backendOnce.Do(func() {
		backend, backendErr = wasm.New(wasm.Config{})
		if backendErr == nil {
			// The first compilation can take a while; do it once, here.
			backendErr = backend.Warm(context.Background())
		}
	})
	if wasm.IsNotBuilt(backendErr) {
		t.Skipf("the wasm interpreter is not built (run `make wasm`): %v", backendErr)
	}
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

func wantStatus(t *testing.T, res *sandbox.Result, status sandbox.Status, code int) {
	t.Helper()
	if res.Status != status || res.ExitCode != code {
		t.Fatalf("status %s exit %d, want %s exit %d\nstdout: %s\nstderr: %s\nerror: %+v",
			res.Status, res.ExitCode, status, code, res.Stdout, res.Stderr, res.Error)
	}
}

func limited(l sandbox.Limits) func(*sandbox.OneShot) {
	return func(j *sandbox.OneShot) { j.Spec.Limits = l }
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
		"import sys; sys.exit(3)":     3,
		"import sys; sys.exit(0)":     0,
		"import sys; sys.exit()":      0,
		"import sys; sys.exit('bye')": 1,
		"import os; os._exit(7)":      7,
		"raise SystemExit(42)":        42,
		// Differs from native: WASI has no signals, so no os.kill.
		"import os; os.kill(os.getpid(), 15)": 1,
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

// Printed text never becomes a result, however it looks.
func TestPrintedFramesAreOutput(t *testing.T) {
	t.Parallel()
	res := run(t, `
import json, struct, sys
body = json.dumps({"type": "result", "data": {"text/plain": "forged"}, "is_main_result": True}).encode()
sys.stdout.buffer.write(struct.pack(">I", len(body)) + body)
sys.stdout.flush()
print()
try:
    open("/dev/vivarium", "wb")
except OSError as e:
    print("channel", e.errno)
`)
	wantStatus(t, res, sandbox.StatusOK, 0)
	if len(res.Results) != 0 || !strings.Contains(res.Stdout, "forged") || !strings.Contains(res.Stdout, "channel 2\n") {
		t.Fatalf("results %+v, stdout %q", res.Results, res.Stdout)
	}
}

// The standard library works, including the modules that need the C
// libraries built with it (zlib, expat, decimal, hashes).
func TestStandardLibrary(t *testing.T) {
	t.Parallel()
	res := run(t, `
import decimal, gzip, hashlib, json
import xml.etree.ElementTree as ET, statistics
data = gzip.compress(b"x" * 1000)
print(len(gzip.decompress(data)), hashlib.sha256(b"a").hexdigest()[:8])
print(ET.fromstring("<a><b>1</b></a>").find("b").text, decimal.Decimal("0.1") + decimal.Decimal("0.2"))
print(statistics.mean([1, 2, 3, 4]), json.dumps({"k": [1, 2]}))
`)
	wantStatus(t, res, sandbox.StatusOK, 0)
	if res.Stdout != "1000 ca978112\n1 0.3\n2.5 {\"k\": [1, 2]}\n" {
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

// What the wasm backend cannot do fails with an error that says so.
func TestThreadsProcessesSocketsNativeExtensions(t *testing.T) {
	t.Parallel()
	res := run(t, `
import os, subprocess, threading
def attempt(label, fn):
    try:
        fn()
        print(label, "ok")
    except Exception as e:
        print(label, type(e).__name__, e)
attempt("thread", lambda: threading.Thread(target=print).start())
attempt("subprocess", lambda: subprocess.run(["sh", "-c", "echo hi"]))
attempt("system", lambda: os.system("echo hi"))
def sock():
    import socket
    socket.socket()
attempt("socket", sock)
attempt("numpy", lambda: __import__("numpy"))
attempt("ctypes", lambda: __import__("ctypes"))
`)
	wantStatus(t, res, sandbox.StatusOK, 0)
	for _, want := range []string{
		"thread RuntimeError can't start new thread: the wasm backend has no threads",
		"subprocess OSError [Errno 58] the wasm backend cannot start processes",
		"system AttributeError module 'os' has no attribute 'system'",
		"socket OSError",
		"the wasm backend has no network",
		"numpy ModuleNotFoundError No module named 'numpy': the wasm backend runs CPython's standard library only: no native extensions",
		"ctypes ModuleNotFoundError No module named '_ctypes': the wasm backend cannot load native code",
	} {
		if !strings.Contains(res.Stdout, want) {
			t.Errorf("stdout lacks %q:\n%s", want, res.Stdout)
		}
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

// Nothing of the host's file system is visible, and only /workspace is
// writable.
func TestFileSystemView(t *testing.T) {
	t.Parallel()
	res := run(t, `
import os
def attempt(label, fn):
    try:
        fn()
        print(label, "ok")
    except OSError as e:
        print(label, os.strerror(e.errno))
print(sorted(os.listdir("/")))
attempt("read /etc/passwd", lambda: open("/etc/passwd").read())
attempt("write stdlib", lambda: open("/usr/local/lib/python3.11/os.py", "a"))
attempt("write runner", lambda: open("/opt/vivarium/runner.py", "w"))
attempt("create in /", lambda: open("/evil", "w"))
attempt("mkdir /usr/x", lambda: os.mkdir("/usr/x"))
attempt("escape", lambda: open("/workspace/../../../etc/passwd").read())
attempt("symlink", lambda: os.symlink("/etc/passwd", "link"))
attempt("write workspace", lambda: open("/workspace/ok.txt", "w").write("ok"))
`)
	wantStatus(t, res, sandbox.StatusOK, 0)
	want := "['dev', 'opt', 'usr', 'workspace']\n" +
		"read /etc/passwd No such file or directory\n" +
		"write stdlib Read-only file system\n" +
		"write runner Read-only file system\n" +
		"create in / Read-only file system\n" +
		"mkdir /usr/x Read-only file system\n" +
		// wazero refuses a path that climbs above "/" (Linux would
		// stay at "/" and find nothing).
		"escape Operation not permitted\n" +
		"symlink Operation not permitted\n" +
		"write workspace ok\n"
	if res.Stdout != want {
		t.Fatalf("stdout:\n%s\nwant:\n%s\nstderr: %s", res.Stdout, want, res.Stderr)
	}
}

func TestLimits(t *testing.T) {
	t.Parallel()
	t.Run("wall clock", func(t *testing.T) {
		t.Parallel()
		start := time.Now()
		res := run(t, "import time; print('start', flush=True); time.sleep(60)", limited(sandbox.Limits{Timeout: time.Second}))
		wantStatus(t, res, sandbox.StatusTimeout, sandbox.ExitTimeout)
		if res.Stdout != "start\n" || time.Since(start) > 15*time.Second {
			t.Fatalf("stdout %q after %v", res.Stdout, time.Since(start))
		}
	})
	t.Run("wall clock in a tight loop", func(t *testing.T) {
		t.Parallel()
		res := run(t, "while True: pass", limited(sandbox.Limits{Timeout: time.Second}))
		wantStatus(t, res, sandbox.StatusTimeout, sandbox.ExitTimeout)
	})
	t.Run("cpu time", func(t *testing.T) {
		t.Parallel()
		res := run(t, "while True: pass", limited(sandbox.Limits{Timeout: 30 * time.Second, CPUTime: time.Second}))
		wantStatus(t, res, sandbox.StatusTimeout, sandbox.ExitTimeout)
		if !strings.Contains(res.Error.Value, "CPU time") {
			t.Fatalf("error = %+v", res.Error)
		}
	})
	t.Run("sleeping is not cpu time", func(t *testing.T) {
		t.Parallel()
		res := run(t, "import time; time.sleep(1.5); print('slept')", limited(sandbox.Limits{Timeout: 30 * time.Second, CPUTime: time.Second}))
		wantStatus(t, res, sandbox.StatusOK, 0)
		if res.CPUMS > 1000 {
			t.Fatalf("cpu %v ms for a sleep", res.CPUMS)
		}
	})
	t.Run("memory", func(t *testing.T) {
		t.Parallel()
		res := run(t, "x = []\nwhile True: x.append(bytearray(16 << 20))", limited(sandbox.Limits{Memory: 128 << 20}))
		wantStatus(t, res, sandbox.StatusMemoryLimit, sandbox.ExitMemoryLimit)
		if res.PeakMemoryBytes > 128<<20 {
			t.Fatalf("peak memory %d over the limit", res.PeakMemoryBytes)
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
		// EIO: WASI as wazero implements it has no ENOSPC; stderr says why.
		if res.Stdout != "29\n" || !strings.Contains(res.Stderr, "the workspace is full") {
			t.Fatalf("stdout %q stderr %q", res.Stdout, res.Stderr)
		}
	})
	t.Run("open files", func(t *testing.T) {
		t.Parallel()
		res := run(t, `
import os
n = 0
try:
    while True:
        os.open("/dev/null", os.O_RDONLY)
        n += 1
except OSError as e:
    print(e.errno, n < 64)
`, limited(sandbox.Limits{OpenFiles: 64}))
		wantStatus(t, res, sandbox.StatusOK, 0)
		if res.Stdout != "29 True\n" || !strings.Contains(res.Stderr, "too many open files") {
			t.Fatalf("stdout %q stderr %q", res.Stdout, res.Stderr)
		}
	})
	t.Run("sparse disk", func(t *testing.T) {
		t.Parallel()
		res := run(t, `
try:
    with open("sparse", "wb") as f:
        f.truncate(1 << 30)
except OSError as e:
    print(e.errno)
`, limited(sandbox.Limits{Disk: 16 << 20}))
		wantStatus(t, res, sandbox.StatusOK, 0)
		if res.Stdout != "29\n" {
			t.Fatalf("stdout %q stderr %q", res.Stdout, res.Stderr)
		}
	})
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
	if res := exec("x"); res.Results[0].Text != "1" {
		t.Fatalf("%+v", res)
	}
	// Running out of memory is Python's MemoryError: the state survives.
	if res := exec("y = bytearray(1 << 30)"); res.Status != sandbox.StatusMemoryLimit || res.StateLost {
		t.Fatalf("memory: %+v", res)
	}
	if res := exec("open('kept.txt', 'w').write('still here')"); res.Status != sandbox.StatusOK {
		t.Fatalf("%+v", res)
	}
	// A limit restarts the interpreter: state is lost, files are kept.
	res, err := sb.Execute(context.Background(), sandbox.ExecRequest{Code: "while True: pass", Timeout: 500 * time.Millisecond}, nil)
	if err != nil || res.Status != sandbox.StatusTimeout || !res.StateLost {
		t.Fatalf("%+v, %v", res, err)
	}
	if res := exec("print(open('kept.txt').read()); x"); res.Stdout != "still here\n" || res.Error == nil || res.Error.Name != "NameError" || res.StateLost {
		t.Fatalf("after restart: %+v", res)
	}
	// So does an interpreter that exits; the next execution works again.
	if res := exec("y = 5\nimport os; os._exit(9)"); res.ExitCode != 9 || !res.StateLost {
		t.Fatalf("os._exit: %+v", res)
	}
	if res := exec("'y' in globals()"); res.Results[0].Text != "False" {
		t.Fatalf("%+v", res)
	}
}

// Code that crashes the interpreter (here, C recursion past the stack)
// ends the execution as killed; a stateful sandbox gets a new one.
func TestCrash(t *testing.T) {
	t.Parallel()
	sb, err := newBackend(t).Create(context.Background(), sandbox.Spec{})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	ctx := context.Background()
	res, err := sb.Execute(ctx, sandbox.ExecRequest{Code: `
import sys
sys.setrecursionlimit(10**6)
x = []
for i in range(10**5): x = [x]
repr(x)`}, nil)
	if err != nil || res.Status != sandbox.StatusKilled || res.ExitCode != 134 || !res.StateLost ||
		!strings.HasPrefix(res.Error.Value, "the interpreter crashed (out of bounds memory access)") {
		t.Fatalf("%+v %+v %v", res, res.Error, err)
	}
	if res, err := sb.Execute(ctx, sandbox.ExecRequest{Code: "1 + 1"}, nil); err != nil || res.Results[0].Text != "2" {
		t.Fatalf("after the crash: %+v %v", res, err)
	}
}

// Interrupting running code is not possible (no signals); it says so, and
// the time limit still ends the code.
func TestInterruptUnsupported(t *testing.T) {
	t.Parallel()
	sb, err := newBackend(t).Create(context.Background(), sandbox.Spec{})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	if err := sb.Interrupt(); err != nil {
		t.Fatalf("interrupt while idle: %v", err)
	}
	started := make(chan struct{})
	var once sync.Once
	errc := make(chan error, 1)
	go func() {
		<-started
		errc <- sb.Interrupt()
	}()
	res, err := sb.Execute(context.Background(), sandbox.ExecRequest{Timeout: time.Second, Code: "print('looping', flush=True)\nwhile True: pass"},
		sinkFunc(func([]byte) { once.Do(func() { close(started) }) }))
	if err != nil || res.Status != sandbox.StatusTimeout || !res.StateLost {
		t.Fatalf("%+v %v", res, err)
	}
	if err := <-errc; !errors.Is(err, sandbox.ErrUnsupported) {
		t.Fatalf("interrupt while running: %v", err)
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
	sb.Execute(ctx, sandbox.ExecRequest{Code: "z = 1\nopen('f', 'w').write('kept')"}, nil)
	if err := sb.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	res, err := sb.Execute(ctx, sandbox.ExecRequest{Code: `print(open("f").read(), "z" in globals())`}, nil)
	if err != nil || res.Stdout != "kept False\n" || res.StateLost {
		t.Fatalf("%+v %v", res, err)
	}
}

func TestCommandsUnsupported(t *testing.T) {
	t.Parallel()
	sb, err := newBackend(t).Create(context.Background(), sandbox.Spec{})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	if _, err := sb.Start(context.Background(), sandbox.Command{Argv: []string{"sh", "-c", "true"}}); !errors.Is(err, sandbox.ErrUnsupported) {
		t.Fatalf("Start: %v", err)
	}
	_, err = sb.Start(context.Background(), sandbox.Command{Argv: []string{"sh"}, Terminal: &sandbox.TerminalSize{Rows: 24, Cols: 80}})
	if !errors.Is(err, sandbox.ErrUnsupported) || !strings.Contains(err.Error(), "the wasm backend has no terminals") {
		t.Fatalf("Start with a terminal: %v", err)
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

// Results and output reach a ResultSink in the order they happened.
func TestResultOrder(t *testing.T) {
	t.Parallel()
	b := newBackend(t)
	sb, err := b.Create(context.Background(), sandbox.Spec{})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	var events []string
	sink := &orderSink{events: &events}
	res, err := sb.Execute(context.Background(), sandbox.ExecRequest{Code: "print('a')\ndisplay('b')\nprint('c')\n'd'"}, sink)
	if err != nil {
		t.Fatal(err)
	}
	wantStatus(t, res, sandbox.StatusOK, 0)
	if strings.Join(events, ",") != "out:a\n,result:'b',out:c\n,result:'d'" {
		t.Fatalf("events %q", events)
	}
}

type orderSink struct{ events *[]string }

func (s *orderSink) Stdout(p []byte)         { *s.events = append(*s.events, "out:"+string(p)) }
func (s *orderSink) Stderr(p []byte)         { *s.events = append(*s.events, "err:"+string(p)) }
func (s *orderSink) Result(o sandbox.Output) { *s.events = append(*s.events, "result:"+o.Text) }

type sinkFunc func([]byte)

func (f sinkFunc) Stdout(p []byte) { f(p) }
func (f sinkFunc) Stderr(p []byte) { f(p) }

// Sandboxes do not see each other: each has its own interpreter and files.
func TestSandboxesAreSeparate(t *testing.T) {
	t.Parallel()
	b := newBackend(t)
	ctx := context.Background()
	a, err := b.Create(ctx, sandbox.Spec{})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	c, err := b.Create(ctx, sandbox.Spec{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	a.Execute(ctx, sandbox.ExecRequest{Code: "secret = 'a'\nopen('mine', 'w').write('a')\nimport json; json.marker = 1"}, nil)
	res, err := c.Execute(ctx, sandbox.ExecRequest{Code: "import os, json; print('secret' in globals(), os.listdir('.'), hasattr(json, 'marker'))"}, nil)
	if err != nil || res.Stdout != "False [] False\n" {
		t.Fatalf("%+v %v", res, err)
	}
}

func TestLocateNamesMakeWasm(t *testing.T) {
	t.Setenv(wasm.DirEnv, t.TempDir())
	_, err := wasm.Locate()
	if !wasm.IsNotBuilt(err) || !strings.Contains(err.Error(), "make wasm") {
		t.Fatalf("Locate: %v", err)
	}
	if _, err := wasm.New(wasm.Config{}); !errors.Is(err, sandbox.ErrUnsupported) {
		t.Fatalf("New: %v", err)
	}
}

// The CPU-time clocks count the guest's running time: a busy loop
// advances them, a sleep does not, and they never pass the wall clock.
func TestProcessTime(t *testing.T) {
	res := run(t, `import time
w0, c0 = time.perf_counter(), time.process_time()
time.sleep(0.3)
w1, c1 = time.perf_counter(), time.process_time()
s = 0
for i in range(300000):
    s += i
w2, c2 = time.perf_counter(), time.process_time()
print("sleep counted", c1 - c0 > 0.2)
print("loop counted", c2 - c1 > 0)
print("within the wall clock", 0 <= c2 - c0 <= w2 - w0)
print(time.get_clock_info("process_time").implementation)
`)
	wantStatus(t, res, sandbox.StatusOK, 0)
	want := "sleep counted False\nloop counted True\nwithin the wall clock True\n" +
		"clock_gettime(CLOCK_PROCESS_CPUTIME_ID)\n"
	if res.Stdout != want {
		t.Fatalf("stdout %q, want %q (stderr %q)", res.Stdout, want, res.Stderr)
	}
}
