//go:build linux

package hostile

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

// Bombs and fills: every one ends at a limit, and the limit holds for the
// sandbox as a whole.
var resourceCases = []hostileCase{
	{
		name:   "fork_bomb",
		limits: sandbox.Limits{Timeout: 3 * time.Second},
		code: `
import os
while True:
    try:
        os.fork()
    except OSError:
        pass
`,
		check: func(t *testing.T, h *harness, o *outcome) {
			wantTimeout(t, o)
			wantPeakWithin(t, o)
		},
	},
	{
		name: "shell_fork_bomb",
		code: `
import subprocess, time
with open("/tmp/bomb.err", "w") as err:
    subprocess.Popen(["sh", "-c", "b(){ b|b& }; b"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err)
time.sleep(2)
print("forks refused", "Cannot fork" in open("/tmp/bomb.err").read())
`,
		check: func(t *testing.T, h *harness, o *outcome) {
			wantOK(t, o, lines("forks refused True"))
		},
	},
	{
		name: "thread_bomb",
		code: `
import threading, time
n = 0
try:
    while True:
        threading.Thread(target=time.sleep, args=(30,), daemon=True).start()
        n += 1
except RuntimeError as e:
    print("stopped", type(e).__name__, "under the pids limit", n < 32)
`,
		check: func(t *testing.T, h *harness, o *outcome) {
			wantOK(t, o, lines("stopped RuntimeError under the pids limit True"))
		},
	},
	{
		name: "memory_bomb",
		code: `
x = []
while True:
    x.append(bytearray(8 << 20))
`,
		check: func(t *testing.T, h *harness, o *outcome) {
			wantStatus(t, o, sandbox.StatusMemoryLimit, sandbox.ExitMemoryLimit)
			wantPeakWithin(t, o)
		},
	},
	{
		name: "memory_bomb_in_children",
		code: `
import os, time
pids = []
for _ in range(4):
    pid = os.fork()
    if pid == 0:
        b = bytearray(60 << 20)
        time.sleep(1)
        os._exit(0)
    pids.append(pid)
codes = [os.waitstatus_to_exitcode(os.waitpid(p, 0)[1]) for p in pids]
print("some killed", -9 in codes, "others finished", set(codes) <= {0, -9})
`,
		check: func(t *testing.T, h *harness, o *outcome) {
			// Four children of 60 MiB cannot live in 128 MiB together: the
			// kernel kills some, the sandbox as a whole stays under its
			// limit, and the parent carries on.
			wantOK(t, o, lines("some killed True others finished True"))
			wantPeakWithin(t, o)
		},
	},
	{
		name: "sysv_shared_memory_bomb",
		code: `
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
key = int(os.environ["KEY"])
for i in range(8):
    shmid = libc.shmget(key + i, 32 << 20, 0o1000 | 0o600)
    addr = libc.shmat(shmid, None, 0)
    ctypes.memset(addr, 1, 32 << 20)
    print("segment", i, flush=True)
`,
		prepare: func(t *testing.T, h *harness, j *job) {
			j.vars["KEY"] = fmt.Sprint(randomKey())
		},
		check: func(t *testing.T, h *harness, o *outcome) {
			// Shared memory is charged to the sandbox, and the segments
			// die with its IPC namespace.
			wantStatus(t, o, sandbox.StatusMemoryLimit, sandbox.ExitMemoryLimit)
			wantPeakWithin(t, o)
			var key int
			fmt.Sscan(o.vars["KEY"], &key)
			hostShm, _ := os.ReadFile("/proc/sysvipc/shm")
			for _, l := range strings.Split(string(hostShm), "\n") {
				f := strings.Fields(l)
				for i := 0; i < 8 && len(f) > 0; i++ {
					if f[0] == fmt.Sprint(key+i) {
						t.Errorf("segment with key %d exists on the host: %s", key+i, l)
					}
				}
			}
		},
	},
	{
		name: "disk_fill",
		code: `
import errno
try:
    with open("big", "wb") as f:
        while True:
            f.write(b"x" * (1 << 20))
except OSError as e:
    print("stopped", e.errno in (errno.ENOSPC, errno.EFBIG))
`,
		check: func(t *testing.T, h *harness, o *outcome) {
			// ENOSPC from the disk, or EFBIG from the file-size limit
			// that matches it.
			wantOK(t, o, lines("stopped True"))
			wantFilesWithin(t, o)
		},
	},
	{
		name: "disk_fill_tmp_and_shm",
		code: withProbes(`
m = os.environ["MARKER"]
total = 0
for d in ("/tmp", "/dev/shm", "/workspace"):
    try:
        for i in range(64):
            with open("%s/%s-%d" % (d, m, i), "wb") as f:
                f.write(b"x" * (1 << 20))
            total += 1 << 20
        print(d, "not full")
    except OSError as e:
        print(d, _errno.errorcode[e.errno])
print("total within the limit", total <= 16 << 20)
`),
		prepare: func(t *testing.T, h *harness, j *job) {
			j.vars["MARKER"] = marker()
		},
		check: func(t *testing.T, h *harness, o *outcome) {
			// One limit for all three: /tmp fills it, the others are full.
			wantOK(t, o, lines("/tmp ENOSPC", "/dev/shm ENOSPC", "/workspace ENOSPC", "total within the limit True"))
			for _, dir := range []string{"/tmp", "/dev/shm"} {
				if m, _ := filepath.Glob(filepath.Join(dir, o.vars["MARKER"]+"*")); len(m) > 0 {
					t.Errorf("sandbox files on the host: %v", m)
				}
			}
		},
	},
	{
		name: "inode_fill",
		code: `
import errno
n = 0
try:
    while True:
        open("f%d" % n, "w").close()
        n += 1
except OSError as e:
    print("stopped", errno.errorcode[e.errno], "bounded", n < 16384)
`,
		check: func(t *testing.T, h *harness, o *outcome) {
			wantOK(t, o, lines("stopped ENOSPC bounded True"))
			if len(o.Files) > sandbox.MaxListedFiles {
				t.Errorf("%d files listed, over the %d cap", len(o.Files), sandbox.MaxListedFiles)
			}
		},
	},
	{
		name: "huge_sparse_file",
		code: withProbes(`
f = open("sparse", "wb")
attempt("truncate 1 TiB", f.truncate, 1 << 40)
attempt("write at 1 GiB", lambda: (f.seek(1 << 30), f.write(b"x"), f.flush()))
attempt("fallocate 1 GiB", os.posix_fallocate, f.fileno(), 0, 1 << 30)
files = [open("a%d" % i, "wb") for i in range(2)]
attempt("fallocate 15 MiB twice", lambda: [os.posix_fallocate(f.fileno(), 0, 15 << 20) for f in files])
`),
		check: func(t *testing.T, h *harness, o *outcome) {
			wantOK(t, o, lines("truncate 1 TiB EFBIG", "write at 1 GiB EFBIG", "fallocate 1 GiB EFBIG",
				"fallocate 15 MiB twice ENOSPC"))
			wantFilesWithin(t, o)
		},
	},
	{
		name:   "fd_exhaustion",
		limits: sandbox.Limits{OpenFiles: 128},
		code: `
import errno, os, resource, socket
n = 0
try:
    while True:
        if n % 2:
            os.pipe()
        else:
            socket.socket()
        n += 1
except OSError as e:
    print(errno.errorcode[e.errno], "under the limit", n < 128)
try:
    resource.setrlimit(resource.RLIMIT_NOFILE, (4096, 4096))
except ValueError:
    print("raise refused")
1 / 0
`,
		check: func(t *testing.T, h *harness, o *outcome) {
			// The runner still reports the exception without a free
			// descriptor.
			wantStatus(t, o, sandbox.StatusError, 1)
			if o.Stdout != lines("EMFILE under the limit True", "raise refused") {
				t.Fatalf("stdout %q", o.Stdout)
			}
			if o.Error == nil || o.Error.Name != "ZeroDivisionError" {
				t.Fatalf("error %+v, want the ZeroDivisionError", o.Error)
			}
		},
	},
	{
		// A limit the spec accepts must give a working sandbox.
		name:   "low_open_files_limit",
		limits: sandbox.Limits{OpenFiles: 64},
		code: `
import errno, os
n = 0
try:
    while True:
        os.open("/dev/null", os.O_RDONLY)
        n += 1
except OSError as e:
    print(errno.errorcode[e.errno], "under the limit", n < 64)
`,
		check: func(t *testing.T, h *harness, o *outcome) {
			wantOK(t, o, lines("EMFILE under the limit True"))
		},
	},
	{
		name:   "cpu_time_across_processes",
		limits: sandbox.Limits{Timeout: 30 * time.Second, CPUTime: time.Second},
		code: `
import os
for _ in range(3):
    if os.fork() == 0:
        while True:
            pass
while True:
    pass
`,
		check: func(t *testing.T, h *harness, o *outcome) {
			// Four processes burn a second of CPU together long before
			// the wall clock would end them.
			wantTimeout(t, o)
			if !strings.Contains(o.Error.Value, "CPU time") {
				t.Fatalf("error %q, want the CPU time limit", o.Error.Value)
			}
			// CPU time, not wall time: on a loaded machine the second
			// takes longer to burn, but no more is burnt.
			if o.CPUMS < 1000 || o.CPUMS > 3000 {
				t.Fatalf("%.0f ms of CPU, want the 1 s limit plus polling slack", o.CPUMS)
			}
		},
	},
	{
		name:   "catastrophic_regex",
		limits: sandbox.Limits{Timeout: 2 * time.Second},
		code: `
import re
re.match(r"(a+)+$", "a" * 64 + "b")
`,
		check: func(t *testing.T, h *harness, o *outcome) {
			// The regex engine holds the GIL in C: only a kill ends it.
			wantTimeout(t, o)
		},
	},
	{
		name:   "ignore_termination_signals",
		limits: sandbox.Limits{Timeout: 2 * time.Second},
		code: `
import signal
for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGXCPU, signal.SIGALRM):
    signal.signal(s, signal.SIG_IGN)
print("ignoring", flush=True)
while True:
    pass
`,
		check: func(t *testing.T, h *harness, o *outcome) {
			wantTimeout(t, o)
			if o.Stdout != "ignoring\n" {
				t.Fatalf("stdout %q", o.Stdout)
			}
		},
	},
	{
		name:   "child_sleeps_past_timeout",
		limits: sandbox.Limits{Timeout: 2 * time.Second},
		code: `
import subprocess
subprocess.run(["sh", "-c", "trap '' TERM INT HUP; sleep 60"])
`,
		check: func(t *testing.T, h *harness, o *outcome) {
			wantTimeout(t, o)
		},
	},
}

// wantPeakWithin: the sandbox's peak memory stayed under its limit.
func wantPeakWithin(t *testing.T, o *outcome) {
	t.Helper()
	if o.PeakMemoryBytes > o.limits.Memory {
		t.Errorf("peak memory %d bytes, over the %d limit", o.PeakMemoryBytes, o.limits.Memory)
	}
}

// wantFilesWithin: the workspace's files add up to no more than the disk
// limit.
func wantFilesWithin(t *testing.T, o *outcome) {
	t.Helper()
	var n int64
	for _, f := range o.Files {
		n += f.Size
	}
	if n > o.limits.Disk {
		t.Errorf("workspace files total %d bytes, over the %d disk limit", n, o.limits.Disk)
	}
}

// marker is a unique string for names a case plants and then looks for.
func marker() string {
	b := make([]byte, 6)
	rand.Read(b)
	return "vivarium-hostile-" + hex.EncodeToString(b)
}

// randomKey is a random positive SysV IPC key.
func randomKey() int32 {
	var b [4]byte
	rand.Read(b[:])
	return int32(binary.BigEndian.Uint32(b[:])>>2) + 1
}
