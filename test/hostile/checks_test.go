//go:build linux

package hostile

import (
	"fmt"
	"runtime"
	"sort"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

// probePrelude gives case code three helpers that print one line per
// attempt, so that a check compares the whole stdout against the exact
// outcome of every attempt:
//
//	attempt(label, fn, *args)  "label ok", "label EPERM" or "label ValueError"
//	syscall(label, name, *args) a raw system call by name (NR, from Go), or
//	                           "label no syscalls" where there is no ctypes
//	write(path, data)          open, write and close, so errors surface
const probePrelude = `import errno as _errno, os, sys
try:
    import ctypes as _ctypes
except ImportError:  # no native code at all (the wasm backend): no system calls to make
    _ctypes = None

def _outcome(e):
    if isinstance(e, OSError) and e.errno in _errno.errorcode:
        return _errno.errorcode[e.errno]
    return type(e).__name__

def attempt(label, fn, *args):
    try:
        fn(*args)
    except BaseException as e:
        print(label, _outcome(e), flush=True)
    else:
        print(label, "ok", flush=True)

def write(path, data="x"):
    with open(path, "w") as f:
        f.write(data)

_libc = None
if _ctypes is not None:
    _libc = _ctypes.CDLL(None, use_errno=True)
    _libc.syscall.restype = _ctypes.c_long

def _arg(a):
    if isinstance(a, int):
        return _ctypes.c_long(a)
    if isinstance(a, str):
        return _ctypes.c_char_p(a.encode())
    return a

def syscall(label, name, *args):
    if _libc is None:
        print(label, "no syscalls", flush=True)
        return -1
    _ctypes.set_errno(0)
    r = _libc.syscall(_ctypes.c_long(NR[name]), *[_arg(a) for a in args])
    if r == 0 and name == "clone":
        os._exit(0)  # a child was created after all: it must not run the rest
    print(label, "ok" if r >= 0 else _errno.errorcode.get(_ctypes.get_errno(), "?"), flush=True)
    return r

`

// syscallNumbers are the host architecture's numbers for the system
// calls cases make through syscall(); Go knows them for every
// architecture, so the Python side needs no table of its own.
var syscallNumbers = map[string]uintptr{
	"acct": unix.SYS_ACCT, "add_key": unix.SYS_ADD_KEY, "adjtimex": unix.SYS_ADJTIMEX,
	"bpf": unix.SYS_BPF, "chroot": unix.SYS_CHROOT, "clock_settime": unix.SYS_CLOCK_SETTIME,
	"clone": unix.SYS_CLONE, "clone3": unix.SYS_CLONE3, "delete_module": unix.SYS_DELETE_MODULE,
	"fanotify_init": unix.SYS_FANOTIFY_INIT, "finit_module": unix.SYS_FINIT_MODULE,
	"fsopen": unix.SYS_FSOPEN, "getpid": unix.SYS_GETPID, "init_module": unix.SYS_INIT_MODULE,
	"io_uring_enter": unix.SYS_IO_URING_ENTER, "io_uring_register": unix.SYS_IO_URING_REGISTER,
	"io_uring_setup": unix.SYS_IO_URING_SETUP, "ioctl": unix.SYS_IOCTL, "kcmp": unix.SYS_KCMP,
	"kexec_file_load": unix.SYS_KEXEC_FILE_LOAD, "kexec_load": unix.SYS_KEXEC_LOAD,
	"keyctl": unix.SYS_KEYCTL, "mount": unix.SYS_MOUNT, "mount_setattr": unix.SYS_MOUNT_SETATTR,
	"move_mount": unix.SYS_MOVE_MOUNT, "name_to_handle_at": unix.SYS_NAME_TO_HANDLE_AT,
	"open_by_handle_at": unix.SYS_OPEN_BY_HANDLE_AT, "open_tree": unix.SYS_OPEN_TREE,
	"perf_event_open": unix.SYS_PERF_EVENT_OPEN, "personality": unix.SYS_PERSONALITY,
	"pidfd_getfd": unix.SYS_PIDFD_GETFD, "pidfd_open": unix.SYS_PIDFD_OPEN,
	"pivot_root": unix.SYS_PIVOT_ROOT, "process_vm_readv": unix.SYS_PROCESS_VM_READV,
	"process_vm_writev": unix.SYS_PROCESS_VM_WRITEV, "ptrace": unix.SYS_PTRACE,
	"quotactl": unix.SYS_QUOTACTL, "reboot": unix.SYS_REBOOT, "request_key": unix.SYS_REQUEST_KEY,
	"setdomainname": unix.SYS_SETDOMAINNAME, "sethostname": unix.SYS_SETHOSTNAME, "setns": unix.SYS_SETNS, "settimeofday": unix.SYS_SETTIMEOFDAY, "swapoff": unix.SYS_SWAPOFF,
	"swapon": unix.SYS_SWAPON, "syslog": unix.SYS_SYSLOG, "umount2": unix.SYS_UMOUNT2,
	"unshare": unix.SYS_UNSHARE, "userfaultfd": unix.SYS_USERFAULTFD, "vhangup": unix.SYS_VHANGUP,
}

// x32Bit marks a system call number as the x32 ABI's (amd64 only).
const x32Bit = 0x40000000

func syscallTable() string {
	names := make([]string, 0, len(syscallNumbers))
	for n := range syscallNumbers {
		names = append(names, n)
	}
	sort.Strings(names)
	var b strings.Builder
	b.WriteString("NR = {\n")
	for _, n := range names {
		fmt.Fprintf(&b, "    %q: %d,\n", n, syscallNumbers[n])
	}
	if runtime.GOARCH == "amd64" {
		fmt.Fprintf(&b, "    \"x32_getpid\": %d,\n", x32Bit|unix.SYS_GETPID)
	}
	b.WriteString("}\n\n")
	return b.String()
}

// withProbes prepends the probe helpers to a case's code.
func withProbes(code string) string {
	return probePrelude + syscallTable() + code
}

// lines is the stdout of code that prints each of ls on a line.
func lines(ls ...string) string {
	return strings.Join(ls, "\n") + "\n"
}

func describe(o *outcome) string {
	e := "none"
	if o.Error != nil {
		e = fmt.Sprintf("%s: %s", o.Error.Name, o.Error.Value)
	}
	return fmt.Sprintf("status %s, exit %d, error %s, took %v\nstdout: %.2000q\nstderr: %.2000q",
		o.Status, o.ExitCode, e, o.took.Round(time.Millisecond), o.Stdout, o.Stderr)
}

func wantStatus(t *testing.T, o *outcome, status sandbox.Status, code int) {
	t.Helper()
	if o.Status != status || o.ExitCode != code {
		t.Fatalf("want status %s exit %d; got %s", status, code, describe(o))
	}
}

// wantOK: the code ran to its end, and its stdout is exactly want.
func wantOK(t *testing.T, o *outcome, want string) {
	t.Helper()
	wantStatus(t, o, sandbox.StatusOK, 0)
	if o.Stdout != want {
		t.Fatalf("stdout:\n%s\nwant:\n%s\n(stderr: %s)", o.Stdout, want, o.Stderr)
	}
}

// wantTimeout: a time limit ended the run, which returned within the
// limit plus grace (checked for every run).
func wantTimeout(t *testing.T, o *outcome) {
	t.Helper()
	wantStatus(t, o, sandbox.StatusTimeout, sandbox.ExitTimeout)
	if o.Error == nil || o.Error.Name != "TimeoutError" {
		t.Fatalf("want a TimeoutError; got %s", describe(o))
	}
}

// Runs get a long wall clock (longLimit, the base). Cases that check a
// run returns promptly, although the code tries to keep it alive, want it
// back well before (prompt): a run kept alive ends at the limit instead.
// The margin is wide because a loaded two-core machine can take seconds
// just to start a sandbox.
const (
	longLimit = 30 * time.Second
	prompt    = 15 * time.Second
)

// wantPrompt: the run returned well before its wall-clock limit.
func wantPrompt(t *testing.T, o *outcome) {
	t.Helper()
	if o.took > prompt {
		t.Fatalf("the run took %v, want under %v; %s", o.took.Round(time.Millisecond), prompt, describe(o))
	}
}
