//go:build linux

package conformance

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

var cases = []conformanceCase{
	{name: "print_and_streams", run: func(t *testing.T, be *backend) {
		res := be.oneShot(t, "import sys\nprint('out 1')\nprint('err 1', file=sys.stderr)\nprint('out 2')")
		wantStdout(t, res, "out 1\nout 2\n")
		if res.Stderr != "err 1\n" {
			t.Fatalf("stderr %q", res.Stderr)
		}
		if res.DurationMS <= 0 || res.CPUMS <= 0 || res.PeakMemoryBytes <= 0 {
			t.Fatalf("accounting missing: %+v", res)
		}
	}},
	{name: "exception_traceback", run: func(t *testing.T, be *backend) {
		res := be.oneShot(t, "def f(x):\n    return 1 / x\n\nf(0)\n")
		wantStatus(t, res, sandbox.StatusError, 1)
		e := res.Error
		if e == nil || e.Name != "ZeroDivisionError" || e.Value != "division by zero" {
			t.Fatalf("error = %+v", e)
		}
		for _, want := range []string{"Traceback (most recent call last):", `File "<cell>", line 4`, "return 1 / x"} {
			if !strings.Contains(e.Traceback, want) {
				t.Errorf("traceback lacks %q:\n%s", want, e.Traceback)
			}
		}
		if strings.Contains(e.Traceback, "runner") {
			t.Errorf("traceback shows the runner's frames:\n%s", e.Traceback)
		}
	}},
	{name: "syntax_error", run: func(t *testing.T, be *backend) {
		res := be.oneShot(t, "def (:\n")
		wantStatus(t, res, sandbox.StatusError, 1)
		if res.Error.Name != "SyntaxError" {
			t.Fatalf("error = %+v", res.Error)
		}
	}},
	{name: "exit_codes", run: func(t *testing.T, be *backend) {
		for c, want := range map[string]int{
			"import sys; sys.exit(3)":     3,
			"import sys; sys.exit()":      0,
			"import sys; sys.exit('bye')": 1,
			"import os; os._exit(7)":      7,
			"raise SystemExit(42)":        42,
		} {
			if res := be.oneShot(t, c); res.ExitCode != want {
				t.Errorf("%s: exit %d, want %d (status %s, error %+v)", c, res.ExitCode, want, res.Status, res.Error)
			}
		}
	}},
	{name: "rich_results", run: func(t *testing.T, be *backend) {
		res := be.oneShot(t, `
class Rich:
    def _repr_html_(self): return "<b>rich</b>"
    def _repr_markdown_(self): return "**rich**"
    def _repr_json_(self): return {"rich": True}
    def _repr_svg_(self): return "<svg></svg>"
    def __repr__(self): return "Rich()"
display(Rich())
x = None
x
20 + 22
`)
		wantStatus(t, res, sandbox.StatusOK, 0)
		if len(res.Results) != 2 {
			t.Fatalf("results = %+v", res.Results)
		}
		r := res.Results[0]
		if r.IsMainResult || r.Text != "Rich()" || r.HTML != "<b>rich</b>" || r.Markdown != "**rich**" ||
			string(r.JSON) != `{"rich": true}` || r.SVG != "<svg></svg>" {
			t.Fatalf("display result = %+v", r)
		}
		if m := res.Results[1]; !m.IsMainResult || m.Text != "42" {
			t.Fatalf("main result = %+v", m)
		}
	}},
	{name: "dataframe_and_chart", run: func(t *testing.T, be *backend) {
		res := be.oneShot(t, `
import pandas as pd
import matplotlib.pyplot as plt
df = pd.DataFrame({"a": [1, 2, 3], "b": [4, 5, 6]})
plt.plot(df["a"], df["b"])
plt.show()
df
`)
		wantStatus(t, res, sandbox.StatusOK, 0)
		if len(res.Results) != 2 {
			t.Fatalf("results = %+v", res.Results)
		}
		png, err := base64.StdEncoding.DecodeString(res.Results[0].PNG)
		if err != nil || !bytes.HasPrefix(png, []byte("\x89PNG\r\n\x1a\n")) {
			t.Fatalf("chart: not a PNG (%v)", err)
		}
		if m := res.Results[1]; !m.IsMainResult || !strings.Contains(m.HTML, "<table") {
			t.Fatalf("DataFrame = %+v", m)
		}
	}},
	{name: "scientific_stack", run: func(t *testing.T, be *backend) {
		res := be.oneShot(t, `
import numpy as np, scipy.linalg
a = np.random.default_rng(0).random((200, 200))
print(round(float(np.abs(scipy.linalg.inv(a) @ a - np.eye(200)).max()), 6))
`)
		wantStdout(t, res, "0.0\n")
	}},
	{name: "files_in_and_out", run: func(t *testing.T, be *backend) {
		out := t.TempDir()
		in := filepath.Join(t.TempDir(), "data.csv")
		if err := os.WriteFile(in, []byte("a,b\n1,2\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		res := be.oneShot(t, `
import os
print(open("input/data.csv").read().strip().replace("\n", ";"))
os.makedirs("results", exist_ok=True)
open("results/sum.txt", "w").write("3")
`, func(j *sandbox.OneShot) {
			j.Files = []sandbox.InputFile{{Name: "input/data.csv", Open: func() (io.ReadCloser, error) { return os.Open(in) }}}
			j.OutDir = out
		})
		wantStdout(t, res, "a,b;1,2\n")
		if b, err := os.ReadFile(filepath.Join(out, "results", "sum.txt")); err != nil || string(b) != "3" {
			t.Fatalf("copied out: %q, %v", b, err)
		}
		var paths []string
		for _, f := range res.Files {
			paths = append(paths, f.Path)
		}
		if strings.Join(paths, ",") != "input/data.csv,results/sum.txt" {
			t.Fatalf("files = %v", paths)
		}
	}},
	{name: "workspace_api", run: func(t *testing.T, be *backend) {
		sb := be.create(t, sandbox.Spec{})
		ws := sb.Workspace()
		if err := ws.WriteFile("dir/in.txt", strings.NewReader("from the host"), 1<<20); err != nil {
			t.Fatal(err)
		}
		res := exec(t, sb, code("print(open('dir/in.txt').read()); open('dir/out.txt', 'w').write('from the code')"))
		wantStdout(t, res, "from the host\n")
		f, _, err := ws.OpenFile("dir/out.txt")
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(f)
		f.Close()
		if err != nil || string(got) != "from the code" {
			t.Fatalf("read back %q, %v", got, err)
		}
		// A link the code makes leads nowhere outside.
		exec(t, sb, code("import os; os.symlink('/etc/passwd', 'link')"))
		if f, _, err := ws.OpenFile("link"); err == nil {
			f.Close()
			t.Fatal("opening a link the code made succeeded")
		}
	}},
	{name: "threads_processes_subprocess", run: func(t *testing.T, be *backend) {
		res := be.oneShot(t, `
import multiprocessing as mp, subprocess, threading
def sq(x): return x * x
if __name__ == "__main__":
    out = []
    ts = [threading.Thread(target=lambda i=i: out.append(i)) for i in range(8)]
    [t.start() for t in ts]; [t.join() for t in ts]
    print(sorted(out))
    with mp.Pool(4) as p:
        print(p.map(sq, range(5)))
    print(subprocess.run(["sh", "-c", "echo from shell; id -un"], capture_output=True, text=True).stdout.split())
`)
		wantStdout(t, res, "[0, 1, 2, 3, 4, 5, 6, 7]\n[0, 1, 4, 9, 16]\n['from', 'shell', 'sandbox']\n")
	}},
	{name: "environment_is_only_what_was_given", run: func(t *testing.T, be *backend) {
		// TestMain set VIVARIUM_HOST_ONLY in this process's environment.
		res := be.oneShot(t, `import os; print(sorted(os.environ.get(k, "-") for k in ("VIVARIUM_HOST_ONLY", "GREETING"))); print(os.getcwd(), os.environ["HOME"])`,
			func(j *sandbox.OneShot) { j.Spec.Env = map[string]string{"GREETING": "hello"} })
		wantStdout(t, res, "['-', 'hello']\n/workspace /workspace\n")
	}},
	{name: "limit_wall_clock", run: func(t *testing.T, be *backend) {
		res := be.oneShot(t, "import time; print('start', flush=True); time.sleep(60)", limited(sandbox.Limits{Timeout: time.Second}))
		wantStatus(t, res, sandbox.StatusTimeout, sandbox.ExitTimeout)
		if res.Stdout != "start\n" {
			t.Fatalf("stdout %q", res.Stdout)
		}
	}},
	{name: "limit_cpu_time", run: func(t *testing.T, be *backend) {
		res := be.oneShot(t, "while True: pass", limited(sandbox.Limits{Timeout: 60 * time.Second, CPUTime: time.Second}))
		wantStatus(t, res, sandbox.StatusTimeout, sandbox.ExitTimeout)
		if !strings.Contains(res.Error.Value, "CPU time") {
			t.Fatalf("error = %+v", res.Error)
		}
	}},
	{name: "limit_memory", run: func(t *testing.T, be *backend) {
		res := be.oneShot(t, "x = []\nwhile True: x.append(bytearray(16 << 20))", limited(sandbox.Limits{Memory: 128 << 20}))
		wantStatus(t, res, sandbox.StatusMemoryLimit, sandbox.ExitMemoryLimit)
	}},
	{name: "limit_pids", run: func(t *testing.T, be *backend) {
		res := be.oneShot(t, `
import os, time
n = 0
try:
    while True:
        if os.fork() == 0:
            time.sleep(30); os._exit(0)
        n += 1
except OSError as e:
    print("stopped", e.errno, n <= 16)
`, limited(sandbox.Limits{Pids: 16}))
		wantStdout(t, res, "stopped 11 True\n")
	}},
	{name: "limit_output", run: func(t *testing.T, be *backend) {
		res := be.oneShot(t, "import sys\nfor _ in range(1000): sys.stdout.write('x' * 10000)", limited(sandbox.Limits{MaxOutput: 64 << 10}))
		wantStatus(t, res, sandbox.StatusOK, 0)
		if len(res.Stdout) != 64<<10 || !res.StdoutTruncated || res.StderrTruncated {
			t.Fatalf("stdout %d bytes, truncated %v", len(res.Stdout), res.StdoutTruncated)
		}
	}},
	{name: "limit_disk", run: func(t *testing.T, be *backend) {
		res := be.oneShot(t, `
try:
    with open("big", "wb") as f:
        while True: f.write(b"x" * (1 << 20))
except OSError as e:
    print(e.errno)
`, limited(sandbox.Limits{Disk: 16 << 20}))
		// ENOSPC from the disk, or EFBIG from the file-size limit that
		// matches it: either way the limit held.
		wantStatus(t, res, sandbox.StatusOK, 0)
		if res.Stdout != "28\n" && res.Stdout != "27\n" {
			t.Fatalf("stdout %q stderr %q", res.Stdout, res.Stderr)
		}
	}},
	{name: "persistent_state", run: func(t *testing.T, be *backend) {
		sb := be.create(t, sandbox.Spec{})
		if res := exec(t, sb, code("x = 1\nprint('set')")); res.Stdout != "set\n" {
			t.Fatalf("%+v", res)
		}
		if res := exec(t, sb, code("x + 1")); len(res.Results) != 1 || res.Results[0].Text != "2" || res.Stdout != "" {
			t.Fatalf("%+v", res)
		}
		if res := exec(t, sb, code("1/0")); res.Status != sandbox.StatusError || res.Error.Name != "ZeroDivisionError" {
			t.Fatalf("%+v", res)
		}
		if res := exec(t, sb, code("import sys; sys.exit(4)")); res.Status != sandbox.StatusError || res.ExitCode != 4 {
			t.Fatalf("%+v", res)
		}
		// An exception or sys.exit does not end the sandbox.
		if res := exec(t, sb, code("x")); len(res.Results) != 1 || res.Results[0].Text != "1" {
			t.Fatalf("%+v", res)
		}
		exec(t, sb, code("open('kept.txt', 'w').write('still here')"))
		// A limit restarts Python: state is lost, files are kept.
		res := exec(t, sb, sandbox.ExecRequest{Code: "while True: pass", Timeout: time.Second})
		if res.Status != sandbox.StatusTimeout || !res.StateLost {
			t.Fatalf("%+v", res)
		}
		res = exec(t, sb, code("print(open('kept.txt').read()); x"))
		if res.Stdout != "still here\n" || res.Error == nil || res.Error.Name != "NameError" || res.StateLost {
			t.Fatalf("after the restart: %+v", res)
		}
		// So does a Python that exits; the next execution works again.
		if res := exec(t, sb, code("y = 5\nimport os; os._exit(9)")); res.ExitCode != 9 || !res.StateLost {
			t.Fatalf("os._exit: %+v", res)
		}
		if res := exec(t, sb, code("'y' in globals()")); len(res.Results) != 1 || res.Results[0].Text != "False" {
			t.Fatalf("%+v", res)
		}
	}},
	{name: "memory_limit_in_a_stateful_sandbox", run: func(t *testing.T, be *backend) {
		sb := be.create(t, sandbox.Spec{Limits: sandbox.Limits{Memory: 128 << 20}})
		exec(t, sb, code("x = 1\nopen('f', 'w').write('kept')"))
		res := exec(t, sb, code("y = []\nwhile True: y.append(bytearray(16 << 20))"))
		wantStatus(t, res, sandbox.StatusMemoryLimit, sandbox.ExitMemoryLimit)
		// The sandbox carries on, with its files; its state survives
		// unless the result said it was lost.
		after := exec(t, sb, code("print(open('f').read()); 'x' in globals()"))
		if after.Stdout != "kept\n" || len(after.Results) != 1 || after.Results[0].Text != map[bool]string{true: "False", false: "True"}[res.StateLost] {
			t.Fatalf("after the limit (state lost: %v): %+v", res.StateLost, after)
		}
	}},
	{name: "interrupt_keeps_state", run: func(t *testing.T, be *backend) {
		sb := be.create(t, sandbox.Spec{})
		exec(t, sb, code("n = 0"))
		started := make(chan struct{})
		var once sync.Once
		go func() {
			<-started
			if err := sb.Interrupt(); err != nil {
				t.Errorf("interrupt: %v", err)
			}
		}()
		res := exec(t, sb, code("while True:\n    n += 1\n    if n == 1000: print('looping', flush=True)"),
			sinkFunc(func([]byte) { once.Do(func() { close(started) }) }))
		if res.Status != sandbox.StatusError || res.Error == nil || res.Error.Name != "KeyboardInterrupt" || res.StateLost {
			t.Fatalf("%+v", res)
		}
		if res := exec(t, sb, code("n > 0")); len(res.Results) != 1 || res.Results[0].Text != "True" {
			t.Fatalf("state after the interrupt: %+v", res)
		}
	}},
	{name: "interrupts_at_any_moment", run: func(t *testing.T, be *backend) {
		// The code sends results all the time, each waiting for its ack,
		// and interrupts come at any moment, again and again until the
		// cell ends, the last ones after it has: none may break the
		// runner's channel or end the runner.
		sb := be.create(t, sandbox.Spec{Limits: sandbox.Limits{Timeout: 60 * time.Second}})
		exec(t, sb, code("n = 0"))
		rng := rand.New(rand.NewPCG(27, 1))
		for round := range 20 {
			done := make(chan *sandbox.Result, 1)
			go func() {
				res, err := sb.Execute(context.Background(), code("while True:\n    n += 1\n    display(n)"), nil)
				if err != nil {
					t.Errorf("round %d: %v", round, err)
				}
				done <- res
			}()
			var res *sandbox.Result
		wait:
			for {
				select {
				case res = <-done:
					break wait
				case <-time.After(time.Duration(rng.IntN(3000)) * time.Microsecond):
					sb.Interrupt()
				}
			}
			if res == nil {
				t.FailNow()
			}
			if res.Error == nil || res.Error.Name != "KeyboardInterrupt" || res.StateLost {
				t.Fatalf("round %d: %s lost=%v %+v", round, res.Status, res.StateLost, res.Error)
			}
		}
		if res := exec(t, sb, code("isinstance(n, int)")); len(res.Results) != 1 || res.Results[0].Text != "True" {
			t.Fatalf("after the interrupts: %+v", res)
		}
	}},
	{name: "restart_keeps_files", run: func(t *testing.T, be *backend) {
		sb := be.create(t, sandbox.Spec{})
		exec(t, sb, code("z = 1\nopen('f', 'w').write('kept')"))
		if err := sb.Restart(context.Background()); err != nil {
			t.Fatal(err)
		}
		res := exec(t, sb, code(`print(open("f").read(), "z" in globals())`))
		if res.Stdout != "kept False\n" || res.StateLost {
			t.Fatalf("%+v", res)
		}
	}},
	{name: "restart_ends_processes", run: func(t *testing.T, be *backend) {
		sb := be.create(t, sandbox.Spec{})
		exec(t, sb, code("import subprocess\np = subprocess.Popen(['sleep', '1000'])\nopen('pid', 'w').write(str(p.pid))"))
		if err := sb.Restart(context.Background()); err != nil {
			t.Fatal(err)
		}
		res := exec(t, sb, code(`
import os
try:
    os.kill(int(open("pid").read()), 0)
    print("alive")
except ProcessLookupError:
    print("gone")`))
		wantStdout(t, res, "gone\n")
	}},
	{name: "commands", run: func(t *testing.T, be *backend) {
		sb := be.create(t, sandbox.Spec{Env: map[string]string{"FROM_SPEC": "s"}})
		ctx := context.Background()
		p, err := sb.Start(ctx, sandbox.Command{Argv: []string{"sh", "-c", "read line; echo got $line $FROM_SPEC $FROM_CMD; pwd; id -un; echo oops >&2; exit 3"},
			Env: map[string]string{"FROM_CMD": "c"}, Dir: "/tmp"})
		if err != nil {
			t.Fatal(err)
		}
		io.WriteString(p.Stdin(), "hello\n")
		p.Stdin().Close()
		var out, errOut []byte
		var wg sync.WaitGroup
		wg.Add(1)
		go func() { defer wg.Done(); errOut, _ = io.ReadAll(p.Stderr()) }()
		out, _ = io.ReadAll(p.Stdout())
		wg.Wait()
		<-p.Done()
		if string(out) != "got hello s c\n/tmp\nsandbox\n" || string(errOut) != "oops\n" || p.ExitCode() != 3 {
			t.Fatalf("stdout %q stderr %q exit %d", out, errOut, p.ExitCode())
		}
		// A command runs beside an execution, and is killed with its children.
		long, err := sb.Start(ctx, sandbox.Command{Argv: []string{"sh", "-c", "sleep 1000 & sleep 1000"}})
		if err != nil {
			t.Fatal(err)
		}
		go io.Copy(io.Discard, long.Stdout())
		go io.Copy(io.Discard, long.Stderr())
		if res := exec(t, sb, code("1 + 1")); len(res.Results) != 1 || res.Results[0].Text != "2" {
			t.Fatalf("%+v", res)
		}
		if err := long.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		select {
		case <-long.Done():
		case <-time.After(30 * time.Second):
			t.Fatal("a killed command did not end")
		}
		if long.ExitCode() != 128+9 {
			t.Fatalf("exit %d", long.ExitCode())
		}
		if _, err := sb.Start(ctx, sandbox.Command{Argv: []string{"/no/such/program"}}); err == nil {
			t.Fatal("starting a missing program succeeded")
		}
	}},
	{name: "terminal", run: runTerminal},
	{name: "terminal_jobs", run: runTerminalJobs},
	{name: "streaming_sink", run: func(t *testing.T, be *backend) {
		// The code waits for a file the host writes only once it has seen
		// the first line: output reaches the sink while the code runs.
		sb := be.create(t, sandbox.Spec{})
		var mu sync.Mutex
		var got []string
		sink := sinkFunc(func(p []byte) {
			mu.Lock()
			defer mu.Unlock()
			got = append(got, string(p))
			if len(got) == 1 && strings.Contains(got[0], "early\n") {
				if err := sb.Workspace().WriteFile("go", strings.NewReader("1"), 10); err != nil {
					t.Error(err)
				}
			}
		})
		res := exec(t, sb, code(`
import os, time
print("early", flush=True)
for _ in range(3000):
    if os.path.exists("go"):
        print("streamed")
        break
    time.sleep(0.01)
else:
    print("not streamed")
`), sink)
		wantStdout(t, res, "early\nstreamed\n")
		mu.Lock()
		defer mu.Unlock()
		if strings.Join(got, "") != res.Stdout {
			t.Fatalf("streamed %q", got)
		}
	}},
	{name: "output_and_results_in_order", run: func(t *testing.T, be *backend) {
		sb := be.create(t, sandbox.Spec{})
		var events []string
		var mu sync.Mutex
		sink := &orderSink{add: func(e string) { mu.Lock(); events = append(events, e); mu.Unlock() }}
		res := exec(t, sb, code("print('a')\ndisplay('b')\nprint('c')\n'd'"), sink)
		wantStatus(t, res, sandbox.StatusOK, 0)
		mu.Lock()
		defer mu.Unlock()
		if strings.Join(events, ",") != "out:a\n,result:'b',out:c\n,result:'d'" {
			t.Fatalf("events %q", events)
		}
	}},
	{name: "code_may_patch_the_protocols_modules", run: func(t *testing.T, be *backend) {
		// A notebook may patch json for its own output: the runner's
		// channel does not depend on what the code does to its modules.
		res := be.oneShot(t, `
import json, os, struct
json.dumps = lambda *a, **k: 1/0
json.loads = None
os.write = None
struct.pack = None
display("still works")
print("printed")
5
`)
		wantStdout(t, res, "printed\n")
		if len(res.Results) != 2 || res.Results[0].Text != "'still works'" || res.Results[1].Text != "5" {
			t.Fatalf("results %+v", res.Results)
		}
	}},
	{name: "sandboxes_are_separate", run: func(t *testing.T, be *backend) {
		a, b := be.create(t, sandbox.Spec{}), be.create(t, sandbox.Spec{})
		exec(t, a, code("secret = 'a'\nopen('mine', 'w').write('a')\nopen('/tmp/mine', 'w').write('a')\nimport json; json.marker = 1"))
		res := exec(t, b, code("import os, json; print('secret' in globals(), os.listdir('.'), os.path.exists('/tmp/mine'), hasattr(json, 'marker'))"))
		wantStdout(t, res, "False [] False False\n")
	}},
	{name: "code_contexts", run: func(t *testing.T, be *backend) {
		sb := be.create(t, sandbox.Spec{})
		keeper, ok := sb.(sandbox.ContextKeeper)
		if !ok {
			t.Fatal("the sandbox keeps no code contexts")
		}
		in := func(id, c string) *sandbox.Result {
			t.Helper()
			return exec(t, sb, sandbox.ExecRequest{Code: c, Context: id})
		}
		other, err := keeper.CreateContext("python", "/tmp")
		if err != nil {
			t.Fatal(err)
		}
		in("", "v = 'default'")
		in(other.ID, "v = 'other'")
		if res := in("", "import os; print(v, os.getcwd())"); res.Stdout != "default /workspace\n" {
			t.Fatalf("default context: %+v", res)
		}
		if res := in(other.ID, "import os; print(v, os.getcwd())"); res.Stdout != "other /tmp\n" {
			t.Fatalf("other context: %+v", res)
		}
		if err := keeper.RestartContext(other.ID); err != nil {
			t.Fatal(err)
		}
		if res := in(other.ID, "'v' in globals()"); len(res.Results) != 1 || res.Results[0].Text != "False" {
			t.Fatalf("after its restart: %+v", res)
		}
		if res := in("", "v"); len(res.Results) != 1 || res.Results[0].Text != "'default'" {
			t.Fatalf("the default context after another's restart: %+v", res)
		}
		// A bash context keeps its shell's variables and directory.
		in(sandbox.BashContext, "GREETING=hello\ncd /tmp")
		if res := in(sandbox.BashContext, "echo $GREETING; pwd"); res.Stdout != "hello\n/tmp\n" {
			t.Fatalf("bash: %+v", res)
		}
		if err := keeper.RemoveContext(other.ID); err != nil {
			t.Fatal(err)
		}
		if _, err := sb.Execute(context.Background(), sandbox.ExecRequest{Code: "1", Context: other.ID}, nil); !errors.Is(err, sandbox.ErrNoContext) {
			t.Fatalf("a removed context: %v", err)
		}
	}},
}

type orderSink struct{ add func(string) }

func (s *orderSink) Stdout(p []byte)         { s.add("out:" + string(p)) }
func (s *orderSink) Stderr(p []byte)         { s.add("err:" + string(p)) }
func (s *orderSink) Result(o sandbox.Output) { s.add("result:" + o.Text) }
