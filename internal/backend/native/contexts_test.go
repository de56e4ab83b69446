package native_test

import (
	"context"
	"errors"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

func TestCodeContexts(t *testing.T) {
	t.Parallel()
	sb, err := newBackend(t).Create(context.Background(), sandbox.Spec{})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	keeper := sb.(sandbox.ContextKeeper)
	exec := func(ctxID, code string) *sandbox.Result {
		t.Helper()
		res, err := sb.Execute(context.Background(), sandbox.ExecRequest{Code: code, Context: ctxID}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	text := func(res *sandbox.Result) string {
		if len(res.Results) == 0 {
			return "<none: " + res.Stdout + res.Stderr + ">"
		}
		return res.Results[0].Text
	}

	// The default contexts, as E2B lists them: python, bash, javascript.
	if got := keeper.Contexts(); len(got) != 3 || got[0].ID != sandbox.DefaultContext || got[1].ID != sandbox.BashContext ||
		got[2].ID != "javascript" {
		t.Fatalf("default contexts: %+v", got)
	}
	a, err := keeper.CreateContext("python", "/home/user")
	if err != nil {
		t.Fatal(err)
	}
	b, err := keeper.CreateContext("", "/tmp")
	if err != nil {
		t.Fatal(err)
	}
	exec("", "x = 'default'")
	exec(a.ID, "x = 'a'\nimport os; os.chdir('/workspace'); os.makedirs('sub', exist_ok=True); os.chdir('sub')")
	exec(b.ID, "x = 'b'")
	// Each context has its own variables and working directory, kept
	// between executions; the default one is untouched.
	for _, c := range []struct{ id, want string }{
		{"", "('default', '/workspace')"},
		{sandbox.DefaultContext, "('default', '/workspace')"},
		{a.ID, "('a', '/workspace/sub')"},
		{b.ID, "('b', '/tmp')"},
	} {
		if got := text(exec(c.id, "import os\nx, os.getcwd()")); got != c.want {
			t.Errorf("context %q: %s, want %s", c.id, got, c.want)
		}
	}
	if res := exec(a.ID, "__name__"); text(res) != "'__main__'" {
		t.Errorf("__name__ in a context: %s", text(res))
	}

	// Restarting a context forgets its state only.
	if err := keeper.RestartContext(a.ID); err != nil {
		t.Fatal(err)
	}
	if res := exec(a.ID, "x"); res.Error == nil || res.Error.Name != "NameError" {
		t.Errorf("after restart: %+v", res)
	}
	if got := text(exec(b.ID, "x")); got != "'b'" {
		t.Errorf("other context after restart: %s", got)
	}
	if err := keeper.RestartContext(sandbox.DefaultContext); err != nil {
		t.Fatal(err)
	}
	if res := exec("", "x"); res.Error == nil || res.Error.Name != "NameError" {
		t.Errorf("default context after its restart: %+v", res)
	}

	if err := keeper.RemoveContext(b.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := sb.Execute(context.Background(), sandbox.ExecRequest{Code: "1", Context: b.ID}, nil); !errors.Is(err, sandbox.ErrNoContext) {
		t.Errorf("removed context: %v", err)
	}
	for _, id := range []string{sandbox.DefaultContext, sandbox.BashContext} {
		if err := keeper.RemoveContext(id); !errors.Is(err, sandbox.ErrInvalidSpec) {
			t.Errorf("removing %s: %v", id, err)
		}
	}
	if _, err := keeper.CreateContext("cobol", ""); !errors.Is(err, sandbox.ErrInvalidSpec) {
		t.Errorf("cobol: %v", err)
	}
	if _, err := keeper.CreateContext("python", "relative"); !errors.Is(err, sandbox.ErrInvalidSpec) {
		t.Errorf("relative cwd: %v", err)
	}
	if got := len(keeper.Contexts()); got != 4 {
		t.Errorf("%d contexts left, want 4 (3 default, 1 made)", got)
	}
}

func TestBashContext(t *testing.T) {
	t.Parallel()
	sb, err := newBackend(t).Create(context.Background(), sandbox.Spec{})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	keeper := sb.(sandbox.ContextKeeper)
	ctx := context.Background()
	bash := func(id, code string, env map[string]string) *sandbox.Result {
		t.Helper()
		res, err := sb.Execute(ctx, sandbox.ExecRequest{Code: code, Context: id, Env: env}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	// Variables, functions and the working directory survive; stdin is
	// not the shell's command stream.
	bash(sandbox.BashContext, "GREETING=hello\ngreet() { echo \"$GREETING $1\"; }\ncd /tmp", nil)
	res := bash(sandbox.BashContext, "cat; greet world; pwd; echo oops >&2", nil)
	if res.Status != sandbox.StatusOK || res.Stdout != "hello world\n/tmp\n" || res.Stderr != "oops\n" {
		t.Fatalf("%+v", res)
	}
	// Environment of one execution only.
	res = bash(sandbox.BashContext, `echo "[$ONLY_NOW]"`, map[string]string{"ONLY_NOW": "it's here"})
	if res.Stdout != "[it's here]\n" {
		t.Fatalf("env: %q", res.Stdout)
	}
	if res := bash(sandbox.BashContext, `echo "[${ONLY_NOW-unset}]"`, nil); res.Stdout != "[unset]\n" {
		t.Fatalf("env afterwards: %q", res.Stdout)
	}
	// A failing last command is an error with its status.
	res = bash(sandbox.BashContext, "ls /nonexistent", nil)
	if res.Status != sandbox.StatusError || res.ExitCode != 2 || res.Error == nil || res.Error.Value != "2" {
		t.Fatalf("failure: %+v", res)
	}
	// exit ends the shell, not the sandbox: the next cell gets a new one.
	res = bash(sandbox.BashContext, "exit 3", nil)
	if res.ExitCode != 3 || res.Error == nil {
		t.Fatalf("exit: %+v", res)
	}
	if res := bash(sandbox.BashContext, `echo "${GREETING-gone}"`, nil); res.Stdout != "gone\n" || res.Status != sandbox.StatusOK {
		t.Fatalf("after exit: %+v", res)
	}
	// A second bash context is a different shell; Python is untouched.
	other, err := keeper.CreateContext("bash", "/workspace")
	if err != nil {
		t.Fatal(err)
	}
	bash(sandbox.BashContext, "V=first", nil)
	if res := bash(other.ID, `echo "${V-none} $(pwd)"`, nil); res.Stdout != "none /workspace\n" {
		t.Fatalf("other bash: %q", res.Stdout)
	}
	if res, _ := sb.Execute(ctx, sandbox.ExecRequest{Code: "1 + 1"}, nil); len(res.Results) != 1 || res.Results[0].Text != "2" {
		t.Fatalf("python beside bash: %+v", res)
	}
	// An interrupt stops the cell.
	started := make(chan struct{})
	var once sync.Once
	go func() {
		<-started
		sb.Interrupt()
	}()
	res, err = sb.Execute(ctx, sandbox.ExecRequest{Code: "echo start; sleep 100", Context: sandbox.BashContext, Timeout: 20 * time.Second},
		sinkFunc(func([]byte) { once.Do(func() { close(started) }) }))
	if err != nil || res.Error == nil || res.Error.Name != "KeyboardInterrupt" || res.StateLost {
		t.Fatalf("interrupt: %+v %v", res, err)
	}
	if res := bash(sandbox.BashContext, "echo again", nil); res.Stdout != "again\n" {
		t.Fatalf("after interrupt: %+v", res)
	}
	// Invalid variable names are refused, not interpolated.
	res = bash(sandbox.BashContext, "true", map[string]string{"A;rm -rf /": "x"})
	if res.Error == nil || !strings.Contains(res.Error.Value, "not a shell variable name") {
		t.Fatalf("bad name: %+v", res)
	}
}

// A context's own process killed by the memory limit (a kernel of another
// language, a bash cell's command) is the memory limit, as the runner's
// death is, not an error of the code: the runner lives on where one OOM
// kill does not end the whole sandbox (cgroup v1), and says which signal
// ended the process. The next cell gets a fresh kernel.
func TestContextKilledByTheMemoryLimit(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("node"); err != nil {
		t.Skip("needs Node.js (node) for a javascript context")
	}
	sb, err := newBackend(t).Create(context.Background(), sandbox.Spec{Limits: sandbox.Limits{Memory: 192 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	cell := func(ctxID, code string) *sandbox.Result {
		t.Helper()
		res, err := sb.Execute(context.Background(), sandbox.ExecRequest{Code: code, Context: ctxID, Timeout: time.Minute}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	for _, c := range []struct{ ctx, code, trace string }{
		{"javascript", "const a = []; while (true) a.push(Buffer.alloc(16 << 20, 1));", "the javascript kernel exited"},
		{sandbox.BashContext, "python3 -c 'x = []\nwhile True: x.append(bytearray(16 << 20))'", "last command exited with status 137"},
	} {
		res := cell(c.ctx, c.code)
		if res.Status != sandbox.StatusMemoryLimit || res.ExitCode != sandbox.ExitMemoryLimit || res.Error == nil ||
			res.Error.Name != "MemoryError" || !strings.Contains(res.Error.Value, "192 MiB memory limit") ||
			!strings.Contains(res.Error.Traceback, c.trace) {
			t.Errorf("%s over the memory limit: %s %d %+v", c.ctx, res.Status, res.ExitCode, res.Error)
		}
	}
	if res := cell("javascript", "1 + 1"); res.Status != sandbox.StatusOK || len(res.Results) != 1 || res.Results[0].Text != "2" {
		t.Errorf("javascript after its kernel was killed: %+v", res)
	}
	// A kernel that ends by itself is the code's error, whatever its status.
	if res := cell("javascript", "process.kill(process.pid, 'SIGKILL')"); res.Status != sandbox.StatusError || res.Error == nil ||
		res.Error.Name != "KernelDied" {
		t.Errorf("javascript killing its own kernel: %s %+v", res.Status, res.Error)
	}
}
