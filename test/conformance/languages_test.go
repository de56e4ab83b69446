//go:build linux

package conformance

import (
	"context"
	"errors"
	osexec "os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

// The code contexts of other languages than Python: each runs a process of
// its own in the sandbox (internal/runner/kernels.py).
func init() {
	cases = append(cases, languageCases...)
	for _, c := range languageCases {
		wasmDifferences[c.name] = difference{why: "a wasm sandbox runs Python only: it has no code contexts and no processes",
			run: func(t *testing.T, be *backend) {
				sb := be.create(t, sandbox.Spec{})
				if _, err := sb.Execute(context.Background(), sandbox.ExecRequest{Code: "1", Context: "javascript"}, nil); !errors.Is(err, sandbox.ErrNoContext) {
					t.Fatalf("an execution in the javascript context: %v", err)
				}
			}}
	}
}

// needTool skips a language whose runtime this host lacks: the sandbox
// shows the host's /usr.
func needTool(t *testing.T, tool, what string) {
	t.Helper()
	if _, err := osexec.LookPath(tool); err != nil {
		t.Skipf("needs %s (%s) on the host", tool, what)
	}
}

// wantResult checks an execution ended well with one main result.
func wantResult(t *testing.T, res *sandbox.Result, text string) {
	t.Helper()
	wantStatus(t, res, sandbox.StatusOK, 0)
	if len(res.Results) != 1 || res.Results[0].Text != text || !res.Results[0].IsMainResult {
		t.Fatalf("results %+v, want one main result %q\nstdout: %s\nstderr: %s", res.Results, text, res.Stdout, res.Stderr)
	}
}

var languageCases = []conformanceCase{
	{name: "javascript_context", run: func(t *testing.T, be *backend) {
		needTool(t, "node", "Node.js")
		sb := be.create(t, sandbox.Spec{Limits: sandbox.Limits{Timeout: 60 * time.Second}})
		keeper := sb.(sandbox.ContextKeeper)
		in := func(id, c string, env map[string]string) *sandbox.Result {
			t.Helper()
			return exec(t, sb, sandbox.ExecRequest{Code: c, Context: id, Env: env})
		}
		// The default context is listed from the start, as E2B lists it.
		listed := false
		for _, c := range keeper.Contexts() {
			listed = listed || (c.ID == "javascript" && c.Language == "javascript")
		}
		if !listed {
			t.Fatalf("contexts %+v lack javascript", keeper.Contexts())
		}
		wantStdout(t, in("javascript", "const z = 41", nil), "")
		wantResult(t, in("javascript", "z + 1", nil), "42")
		res := in("javascript", "console.log('out'); console.error('err'); 'text'", nil)
		wantResult(t, res, "text")
		if res.Stdout != "out\n" || res.Stderr != "err\n" {
			t.Fatalf("streams %q %q", res.Stdout, res.Stderr)
		}
		wantResult(t, in("javascript", "async function f() { return 7 }\nconst v = await f()\nv * 2", nil), "14")
		wantResult(t, in("javascript", "process.env.FOO", map[string]string{"FOO": "bar"}), "bar")
		wantResult(t, in("javascript", "process.env.FOO || 'unset'", nil), "unset")
		wantResult(t, in("javascript", "process.cwd()", nil), "/workspace")
		wantResult(t, in("javascript", "process.getuid() !== 0 && require('os').userInfo().uid === process.getuid()", nil), "true")

		res = in("javascript", "null.x", nil)
		wantStatus(t, res, sandbox.StatusError, 1)
		if res.Error.Name != "TypeError" || !strings.Contains(res.Error.Traceback, "<cell>") {
			t.Fatalf("error %+v", res.Error)
		}

		other, err := keeper.CreateContext("js", "/tmp")
		if err != nil {
			t.Fatal(err)
		}
		if other.Language != "javascript" {
			t.Fatalf("context %+v", other)
		}
		wantResult(t, in(other.ID, "typeof z + ' ' + process.cwd()", nil), "undefined /tmp")

		// An interrupt ends a busy loop and keeps the variables.
		var once sync.Once
		sink := sinkFunc(func(p []byte) {
			if strings.Contains(string(p), "looping") {
				once.Do(func() { go sb.Interrupt() })
			}
		})
		res = exec(t, sb, sandbox.ExecRequest{Code: "console.log('looping'); for (;;) {}", Context: "javascript"}, sink)
		if res.Error == nil || res.Error.Name != "KeyboardInterrupt" || res.StateLost {
			t.Fatalf("interrupted: %+v %+v", res, res.Error)
		}
		wantResult(t, in("javascript", "z", nil), "41")

		// The timeout stops a runaway loop; the state is reported lost.
		res = exec(t, sb, sandbox.ExecRequest{Code: "while (true) {}", Context: "javascript", Timeout: 2 * time.Second})
		if res.Status != sandbox.StatusTimeout || !res.StateLost {
			t.Fatalf("a runaway loop: %s lost=%v", res.Status, res.StateLost)
		}
		wantResult(t, in("javascript", "typeof z", nil), "undefined")
	}},
	{name: "typescript_context", run: func(t *testing.T, be *backend) {
		needTool(t, "node", "Node.js")
		sb := be.create(t, sandbox.Spec{Limits: sandbox.Limits{Timeout: 60 * time.Second}})
		res := exec(t, sb, sandbox.ExecRequest{Context: "typescript", Code: "interface P { x: number; y?: string }\n" +
			"function f(p: P, n: number = 2): number { return p.x * n }\nconst p: P = { x: 3 } as P\nf(p)"})
		wantResult(t, res, "6")
	}},
	{name: "r_context", run: func(t *testing.T, be *backend) {
		needTool(t, "Rscript", "Debian's r-base-core")
		sb := be.create(t, sandbox.Spec{Limits: sandbox.Limits{Timeout: 60 * time.Second}})
		in := func(c string, env map[string]string) *sandbox.Result {
			t.Helper()
			return exec(t, sb, sandbox.ExecRequest{Code: c, Context: "r", Env: env})
		}
		wantStdout(t, in("x <- 41", nil), "")
		wantResult(t, in("x + 1", nil), "[1] 42")
		wantResult(t, in(`Sys.getenv("FOO")`, map[string]string{"FOO": "bar"}), `[1] "bar"`)
		wantResult(t, in(`Sys.getenv("FOO", unset = "default")`, nil), `[1] "default"`)
		res := in(`stop("boom")`, nil)
		wantStatus(t, res, sandbox.StatusError, 1)
		if res.Error.Value != "boom" {
			t.Fatalf("error %+v", res.Error)
		}
		// A plot is a PNG result.
		res = in("plot(1:10)", nil)
		wantStatus(t, res, sandbox.StatusOK, 0)
		if len(res.Results) != 1 || !strings.HasPrefix(res.Results[0].PNG, "iVBORw0KGgo") {
			t.Fatalf("a plot: %+v\nstderr: %s", res.Results, res.Stderr)
		}
	}},
	{name: "java_context", run: func(t *testing.T, be *backend) {
		needTool(t, "jshell", "a JDK: Debian's default-jdk-headless")
		sb := be.create(t, sandbox.Spec{Limits: sandbox.Limits{Timeout: 120 * time.Second}})
		in := func(c string, env map[string]string) *sandbox.Result {
			t.Helper()
			return exec(t, sb, sandbox.ExecRequest{Code: c, Context: "java", Env: env})
		}
		wantStdout(t, in("int x = 41;", nil), "")
		wantResult(t, in("x + 1", nil), "42")
		res := in(`System.out.println("hello"); "text"`, nil)
		wantResult(t, res, "text")
		if res.Stdout != "hello\n" {
			t.Fatalf("stdout %q", res.Stdout)
		}
		wantResult(t, in(`System.getProperty("FOO")`, map[string]string{"FOO": "bar"}), "bar")
		wantResult(t, in(`System.getProperty("FOO", "default")`, nil), "default")
		// An execution's variables are the environment's too (System.getenv,
		// and a ProcessBuilder's environment), and only for it.
		wantResult(t, in(`System.getenv("FOO")`, map[string]string{"FOO": "bar"}), "bar")
		wantResult(t, in(`new ProcessBuilder("true").environment().get("FOO")`, map[string]string{"FOO": "child"}), "child")
		wantResult(t, in(`System.getenv().getOrDefault("FOO", "default")`, nil), "default")
		res = in("int y = 1 / 0;", nil)
		wantStatus(t, res, sandbox.StatusError, 1)
		if res.Error.Name != "java.lang.ArithmeticException" {
			t.Fatalf("error %+v", res.Error)
		}
	}},
	{name: "language_refused", run: func(t *testing.T, be *backend) {
		sb := be.create(t, sandbox.Spec{})
		if _, err := sb.(sandbox.ContextKeeper).CreateContext("cobol", ""); !errors.Is(err, sandbox.ErrInvalidSpec) {
			t.Fatalf("a context in cobol: %v", err)
		}
	}},
}
