//go:build linux

package conformance

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

// wasmDifferences: a wasm sandbox is one CPython interpreter compiled to
// WebAssembly, with the standard library only, and WASI's system interface:
// no processes, threads, signals, sockets or native extensions. What it
// cannot do fails with an error that says so.
var wasmDifferences = map[string]difference{
	"dataframe_and_chart": {why: "no native extensions: pandas and matplotlib need them",
		run: wantModuleError("import pandas", "No module named 'pandas'")},
	"scientific_stack": {why: "no native extensions: numpy and scipy need them",
		run: wantModuleError("import numpy", "no native extensions")},
	"threads_processes_subprocess": {why: "no threads or processes: each says so", run: func(t *testing.T, be *backend) {
		res := be.oneShot(t, `
import subprocess, threading
for label, fn in (("thread", lambda: threading.Thread(target=print).start()),
                  ("subprocess", lambda: subprocess.run(["true"]))):
    try:
        fn()
    except Exception as e:
        print(label, type(e).__name__, e)
`)
		wantStatus(t, res, sandbox.StatusOK, 0)
		for _, want := range []string{"thread RuntimeError can't start new thread: the wasm backend has no threads",
			"subprocess OSError [Errno 58] the wasm backend cannot start processes"} {
			if !strings.Contains(res.Stdout, want) {
				t.Errorf("stdout lacks %q:\n%s", want, res.Stdout)
			}
		}
	}},
	"limit_pids":               {why: "no processes or threads to count"},
	"interrupts_at_any_moment": {why: "no signals: an interrupt is refused while code runs (interrupt_keeps_state)"},
	"limit_disk": {why: "WASI preview 1 in wazero has no ENOSPC: the limit holds with EIO, and stderr says why",
		run: func(t *testing.T, be *backend) {
			res := be.oneShot(t, `
try:
    with open("big", "wb") as f:
        while True: f.write(b"x" * (1 << 20))
except OSError as e:
    print(e.errno)
`, limited(sandbox.Limits{Disk: 16 << 20}))
			wantStdout(t, res, "29\n")
			if !strings.Contains(res.Stderr, "the workspace is full") {
				t.Fatalf("stderr %q", res.Stderr)
			}
		}},
	"interrupt_keeps_state": {why: "no signals: an interrupt is refused while code runs (the time limit still ends it)",
		run: func(t *testing.T, be *backend) {
			sb := be.create(t, sandbox.Spec{})
			errc := make(chan error, 1)
			res := exec(t, sb, sandbox.ExecRequest{Code: "import time\nprint('x', flush=True)\ntime.sleep(1)"},
				sinkFunc(func([]byte) {
					select {
					case errc <- sb.Interrupt():
					default:
					}
				}))
			wantStdout(t, res, "x\n")
			if err := <-errc; !errors.Is(err, sandbox.ErrUnsupported) {
				t.Fatalf("interrupt: %v", err)
			}
		}},
	"restart_ends_processes": {why: "no processes"},
	"python_command": {why: "no processes: no command runs, python or other", run: func(t *testing.T, be *backend) {
		sb := be.create(t, sandbox.Spec{})
		if _, err := sb.Start(context.Background(), sandbox.Command{Argv: []string{"python"}}); !errors.Is(err, sandbox.ErrUnsupported) {
			t.Fatalf("start: %v", err)
		}
	}},
	"usage": {why: "an interpreter in this process: no cgroup tells its CPU and memory apart", run: func(t *testing.T, be *backend) {
		if _, ok := be.create(t, sandbox.Spec{}).(sandbox.UsageReporter); ok {
			t.Fatal("a wasm sandbox claims to report its usage")
		}
	}},
	"ports": {why: "no sockets: the interpreter serves nothing, and the sandbox has no ports", run: func(t *testing.T, be *backend) {
		sb := be.create(t, sandbox.Spec{})
		if d, ok := sb.(sandbox.PortDialer); ok {
			if _, err := d.DialPort(context.Background(), 8000); !errors.Is(err, sandbox.ErrUnsupported) {
				t.Fatalf("dial: %v", err)
			}
		}
	}},
	"terminal": {why: "no processes: starting one in a terminal is refused", run: func(t *testing.T, be *backend) {
		sb := be.create(t, sandbox.Spec{})
		_, err := sb.Start(context.Background(), sandbox.Command{Argv: []string{"sh"}, Terminal: &sandbox.TerminalSize{Rows: 2, Cols: 2}})
		if !errors.Is(err, sandbox.ErrUnsupported) {
			t.Fatalf("start: %v", err)
		}
	}},
	"terminal_jobs": {why: "no processes, no terminals"},
	"commands": {why: "no processes: starting a command is refused", run: func(t *testing.T, be *backend) {
		sb := be.create(t, sandbox.Spec{})
		if _, err := sb.Start(context.Background(), sandbox.Command{Argv: []string{"sh"}}); !errors.Is(err, sandbox.ErrUnsupported) {
			t.Fatalf("start: %v", err)
		}
	}},
	"sandboxes_are_separate": {why: "no /tmp: only /workspace is writable", run: func(t *testing.T, be *backend) {
		a, b := be.create(t, sandbox.Spec{}), be.create(t, sandbox.Spec{})
		exec(t, a, code("secret = 'a'\nopen('mine', 'w').write('a')\nimport json; json.marker = 1"))
		res := exec(t, b, code("import os, json; print('secret' in globals(), os.listdir('.'), hasattr(json, 'marker'))"))
		wantStdout(t, res, "False [] False\n")
	}},
	"code_contexts": {why: "one interpreter per sandbox, and no bash: a wasm sandbox has no code contexts",
		run: func(t *testing.T, be *backend) {
			sb := be.create(t, sandbox.Spec{})
			if _, ok := sb.(sandbox.ContextKeeper); ok {
				t.Fatal("the wasm sandbox now keeps contexts: test them, and remove this difference")
			}
			if _, err := sb.Execute(context.Background(), sandbox.ExecRequest{Code: "1", Context: "other"}, nil); !errors.Is(err, sandbox.ErrNoContext) {
				t.Fatalf("an execution in a context that does not exist: %v", err)
			}
		}},
}

// wantModuleError: importing a module fails with a message that says why.
func wantModuleError(c, msg string) func(t *testing.T, be *backend) {
	return func(t *testing.T, be *backend) {
		res := be.oneShot(t, c)
		wantStatus(t, res, sandbox.StatusError, 1)
		if res.Error == nil || res.Error.Name != "ModuleNotFoundError" || !strings.Contains(res.Error.Value, msg) {
			t.Fatalf("error %+v, want a ModuleNotFoundError saying %q", res.Error, msg)
		}
	}
}
