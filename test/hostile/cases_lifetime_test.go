//go:build linux

package hostile

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/testutil"
)

// Processes, threads, signals and exits: however the code ends or tries
// not to, the run returns on time and nothing of it outlives the run.
var lifetimeCases = []hostileCase{
	{
		name: "processes_outlive_the_run",
		code: `
import os, subprocess, sys
m = os.environ["MARKER"]
subprocess.Popen(["sh", "-c", "trap '' HUP TERM INT; while :; do sleep 1; done", m], start_new_session=True)
subprocess.Popen(["nohup", sys.executable, "-c", "import time\nwhile True: time.sleep(1)", m],
                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execv(sys.executable, [sys.executable, "-c",
            "import signal, time\nfor s in (1, 2, 15): signal.signal(s, signal.SIG_IGN)\nwhile True: time.sleep(1)", m])
    os._exit(0)
print("spawned")
`,
		prepare: func(t *testing.T, h *harness, j *job) {
			j.vars["MARKER"] = marker()
		},
		check: func(t *testing.T, h *harness, o *outcome) {
			wantOK(t, o, lines("spawned"))
			wantPrompt(t, o)
			if left := testutil.ProcessesMatching(o.vars["MARKER"]); len(left) > 0 {
				t.Fatalf("processes outlived the run: %v", left)
			}
		},
	},
	{
		name: "daemon_writes_stdout_forever",
		code: `
import os, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        while True:
            try:
                os.write(1, b"daemon\n")
            except OSError:
                pass
            time.sleep(0.001)
    os._exit(0)
print("parent done", flush=True)
`,
		check: func(t *testing.T, h *harness, o *outcome) {
			wantStatus(t, o, sandbox.StatusOK, 0)
			wantPrompt(t, o)
			if !strings.HasPrefix(o.Stdout, "parent done\n") && !strings.Contains(o.Stdout, "parent done\n") {
				t.Fatalf("stdout lacks the parent's line: %.200q", o.Stdout)
			}
			if int64(len(o.Stdout)) > o.limits.MaxOutput {
				t.Fatalf("stdout %d bytes, over the %d limit", len(o.Stdout), o.limits.MaxOutput)
			}
		},
	},
	{
		name: "child_holds_stdout_open",
		code: `
import subprocess
subprocess.Popen(["sleep", "1000"])
subprocess.Popen(["sh", "-c", "trap '' HUP; exec sleep 1000"], start_new_session=True)
print("parent done")
`,
		check: func(t *testing.T, h *harness, o *outcome) {
			wantOK(t, o, lines("parent done"))
			wantPrompt(t, o)
		},
	},
	{
		name:   "sigstop_self",
		limits: sandbox.Limits{Timeout: 2 * time.Second},
		code: `
import os, signal
print("stopping", flush=True)
os.kill(os.getpid(), signal.SIGSTOP)
print("resumed")
`,
		check: func(t *testing.T, h *harness, o *outcome) {
			wantTimeout(t, o)
			if o.Stdout != "stopping\n" {
				t.Fatalf("stdout %q", o.Stdout)
			}
		},
	},
	{
		name:   "thread_keeps_running",
		limits: sandbox.Limits{Timeout: 2 * time.Second},
		code: `
import threading, time
def forever():
    while True:
        time.sleep(0.1)
threading.Thread(target=forever).start()
print("main done")
`,
		check: func(t *testing.T, h *harness, o *outcome) {
			// Python waits for non-daemon threads at exit: the wall clock
			// ends it.
			wantTimeout(t, o)
			if o.Stdout != "main done\n" {
				t.Fatalf("stdout %q", o.Stdout)
			}
		},
	},
	{
		name: "daemon_thread_keeps_printing",
		code: `
import sys, threading, time
def spam():
    while True:
        sys.stdout.write("spam\n")
threading.Thread(target=spam, daemon=True).start()
time.sleep(0.2)
sys.stderr.write("main done\n")
`,
		check: func(t *testing.T, h *harness, o *outcome) {
			// The thread dies with the interpreter. If it holds stdout's
			// lock at that moment, CPython aborts ("could not acquire lock
			// for <stdout> at interpreter shutdown"): killed by SIGABRT,
			// the interpreter's own doing, reported as such.
			aborted := o.Status == sandbox.StatusKilled && o.ExitCode == 128+int(syscall.SIGABRT) &&
				strings.Contains(o.Stderr, "Fatal Python error")
			if !aborted {
				wantStatus(t, o, sandbox.StatusOK, 0)
			}
			wantPrompt(t, o)
			if !strings.HasPrefix(o.Stderr, "main done\n") || int64(len(o.Stdout)) > o.limits.MaxOutput || strings.Trim(o.Stdout, "spam\n") != "" {
				t.Fatalf("stderr %q, stdout %d bytes: %.100q", o.Stderr, len(o.Stdout), o.Stdout)
			}
		},
	},
	{
		name: "sys_exit_in_thread",
		code: `
import sys, threading
t = threading.Thread(target=sys.exit, args=(3,))
t.start()
t.join()
print("alive")
`,
		check: func(t *testing.T, h *harness, o *outcome) {
			// SystemExit in a thread ends the thread only.
			wantOK(t, o, lines("alive"))
		},
	},
	{
		name: "os_exit_in_thread",
		code: `
import os, threading, time
threading.Thread(target=os._exit, args=(7,)).start()
time.sleep(10)
print("not reached")
`,
		check: func(t *testing.T, h *harness, o *outcome) {
			wantStatus(t, o, sandbox.StatusError, 7)
			if o.Stdout != "" {
				t.Fatalf("stdout %q", o.Stdout)
			}
			wantPrompt(t, o)
		},
	},
	{
		name:   "del_hangs_at_exit",
		limits: sandbox.Limits{Timeout: 2 * time.Second},
		code: `
class Stubborn:
    def __del__(self):
        while True:
            pass
keep = Stubborn()
print("set")
`,
		check: func(t *testing.T, h *harness, o *outcome) {
			// The runner exits without tearing down the objects still
			// alive (Python does not promise to): the hang never comes.
			// Were it to come, the wall clock would end it.
			if o.Status != sandbox.StatusOK && o.Status != sandbox.StatusTimeout {
				t.Fatalf("%s", describe(o))
			}
			if o.Stdout != "set\n" {
				t.Fatalf("stdout %q", o.Stdout)
			}
		},
	},
	{
		name: "del_raises_at_exit",
		code: `
class Broken:
    def __del__(self):
        raise RuntimeError("from __del__")
keep = Broken()
print("set")
`,
		check: func(t *testing.T, h *harness, o *outcome) {
			// Whether or not the finalizer runs at exit (Python does not
			// promise it, and the runner skips the teardown), the run
			// ends well.
			wantOK(t, o, lines("set"))
		},
	},
	{
		name: "atexit_changes_exit_code",
		code: `
import atexit, os
atexit.register(os._exit, 5)
print("registered")
`,
		check: func(t *testing.T, h *harness, o *outcome) {
			// The exit status is the process's own, as the kernel saw it.
			wantStatus(t, o, sandbox.StatusError, 5)
			if o.Stdout != "registered\n" {
				t.Fatalf("stdout %q", o.Stdout)
			}
		},
	},
	{
		name: "kill_processes_outside",
		code: withProbes(`
import signal
victim = int(os.environ["VICTIM_PID"])
attempt("kill host victim", os.kill, victim, signal.SIGKILL)
attempt("killpg host victim", os.killpg, victim, signal.SIGKILL)
attempt("kill host test process", os.kill, int(os.environ["HOST_PID"]), signal.SIGKILL)
attempt("kill -1", os.kill, -1, signal.SIGKILL)
attempt("pidfd_open host victim", lambda: os.pidfd_open(victim))
print("survived")
`),
		prepare: func(t *testing.T, h *harness, j *job) {
			// A host process of a uid a sandbox user of this backend maps
			// to (every sandbox is a user of its own; this is the first
			// range's): only the PID namespace keeps the sandbox from it.
			if h.be.SandboxUID < 0 {
				t.Skip("the backend's sandbox user has no host uid")
			}
			victim := exec.Command("sleep", "60")
			victim.SysProcAttr = &syscall.SysProcAttr{
				Credential: &syscall.Credential{Uid: uint32(h.be.SandboxUID), Gid: uint32(h.be.SandboxUID)},
				Setsid:     true,
			}
			if err := victim.Start(); err != nil {
				t.Fatal(err)
			}
			exited := make(chan struct{})
			go func() { victim.Wait(); close(exited) }()
			t.Cleanup(func() {
				victim.Process.Kill()
				<-exited
			})
			j.vars["VICTIM_PID"] = fmt.Sprint(victim.Process.Pid)
			j.vars["HOST_PID"] = fmt.Sprint(os.Getpid())
		},
		check: func(t *testing.T, h *harness, o *outcome) {
			wantOK(t, o, lines("kill host victim ESRCH", "killpg host victim ESRCH", "kill host test process ESRCH",
				"kill -1 ESRCH", "pidfd_open host victim ESRCH", "survived"))
			var pid int
			fmt.Sscan(o.vars["VICTIM_PID"], &pid)
			if !alive(pid) {
				t.Fatalf("the host victim (pid %d) died", pid)
			}
		},
	},
	{
		name: "signal_namespace_init",
		code: withProbes(`
import signal
for s in ("SIGKILL", "SIGTERM", "SIGSTOP", "SIGINT", "SIGHUP", "SIGSEGV", "SIGCHLD"):
    attempt(s, os.kill, 1, getattr(signal, s))
print("init alive", os.path.exists("/proc/1"))
`),
		check: func(t *testing.T, h *harness, o *outcome) {
			wantOK(t, o, lines("SIGKILL EPERM", "SIGTERM EPERM", "SIGSTOP EPERM", "SIGINT EPERM", "SIGHUP EPERM",
				"SIGSEGV EPERM", "SIGCHLD EPERM", "init alive True"))
		},
	},
}

// alive reports whether pid is a running (not zombie) process.
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// pid (comm) state ...: the state follows the last ')'.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i >= 0 && i+2 < len(s) && s[i+2] != 'Z' && s[i+2] != 'X'
}
