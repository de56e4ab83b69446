//go:build linux

package hostile

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

// observeCases watch the host and other tenants through what the kernel
// keeps per file and shows in /proc: inotify events on the files every
// sandbox sees, locks on them, and the host's identity and activity. While
// each runs, the host (a goroutine of the test) and a neighbour sandbox
// use the same files, and the host checks that it is still served: its
// own `flock -n` succeeds.
var observeCases = []hostileCase{
	{
		name: "watch_host_file_activity",
		code: observePrelude + `
import time
WATCHED = ["/usr/bin", LIBDIR, "/etc", "/", "/opt/vivarium", "/dev/null", "/dev/urandom"]
ino = _libc.inotify_init1(os.O_NONBLOCK)
watches = {_libc.inotify_add_watch(ino, p.encode(), 0xfff): p for p in WATCHED}
print("watches", sorted(watches.values()) == sorted(WATCHED) and min(watches) > 0)

def drain():
    seen = set()
    while True:
        try:
            buf = os.read(ino, 1 << 16)
        except BlockingIOError:
            return sorted(seen)
        i = 0
        while i < len(buf):
            wd, mask, cookie, n = struct.unpack_from("iIII", buf, i)
            name = buf[i + 16:i + 16 + n].rstrip(b"\0").decode()
            seen.add(os.path.join(watches.get(wd, "?"), name) if name else watches.get(wd, "?"))
            i += 16 + n

# The host and the neighbour read and run files here all along.
time.sleep(3)
print("events", drain())
# The sandbox's own reads show: the watches work.
for p in ("/usr/bin/env", LIBDIR + "/libc.so.6", "/etc/passwd", "/dev/null", "/dev/urandom"):
    open(p, "rb").read(1)
os.listdir("/")
os.listdir("/opt/vivarium")
print("own", {"/usr/bin/env", LIBDIR + "/libc.so.6", "/etc/passwd", "/", "/opt/vivarium", "/dev/null",
              "/dev/urandom"} <= set(drain()))
`,
		prepare: func(t *testing.T, h *harness, j *job) {
			host := hostFileActivity(t)
			ticks := neighbourFileActivity(t, h)
			t.Cleanup(func() {
				if host.Load() == 0 || ticks.Load() == 0 {
					t.Errorf("the activity to watch did not happen: %d rounds on the host, %d in the neighbour",
						host.Load(), ticks.Load())
				}
			})
		},
		check: func(t *testing.T, h *harness, o *outcome) {
			wantOK(t, o, lines("watches True", "events []", "own True"))
		},
	},
	{
		name: "lock_host_files",
		code: observePrelude + `
import errno, time
held = []
for p in ("/usr/bin/env", LIBDIR + "/libc.so.6", "/etc/passwd", "/", "/opt/vivarium", "/dev/null"):
    fd, r = flock_nb(p)
    held.append(fd)
    print("flock", p.replace(LIBDIR, "LIBDIR"), r)
for p in ("/usr/bin/env", "/etc/passwd"):
    try:
        seen = ofd(os.open(p, os.O_RDONLY), F_OFD_GETLK, fcntl.F_WRLCK) != fcntl.F_UNLCK
    except OSError as e:
        seen = errno.errorcode[e.errno]
    print("lock seen on", p, seen)
try:
    print("/proc/locks", open("/proc/locks").read().splitlines())
except FileNotFoundError:
    print("/proc/locks absent")
# Held while the host tries to take it, with flock -n, again and again.
fd, r = flock_nb("/usr/bin/md5sum")
print("hold md5sum", r)
time.sleep(3)
`,
		prepare: func(t *testing.T, h *harness, j *job) {
			// The host holds a flock and an OFD read lock on /usr/bin/env:
			// shared ones, which another run of this case on the host
			// does not conflict with, but which a sandbox's exclusive
			// lock would.
			fd, err := unix.Open("/usr/bin/env", unix.O_RDONLY|unix.O_CLOEXEC, 0)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { unix.Close(fd) })
			if err := unix.Flock(fd, unix.LOCK_SH|unix.LOCK_NB); err != nil {
				t.Fatalf("flock /usr/bin/env on the host: %v", err)
			}
			// And on /dev/null, whose node is the host's own inode too.
			null, err := unix.Open("/dev/null", unix.O_RDONLY|unix.O_CLOEXEC, 0)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { unix.Close(null) })
			if err := unix.Flock(null, unix.LOCK_SH|unix.LOCK_NB); err != nil {
				t.Fatalf("flock /dev/null on the host: %v", err)
			}
			if err := unix.FcntlFlock(uintptr(fd), unix.F_OFD_SETLK, &unix.Flock_t{Type: unix.F_RDLCK}); err != nil {
				t.Fatalf("OFD lock on /usr/bin/env: %v", err)
			}
			// A neighbour sandbox holds them on its own files.
			neighbour, err := h.be.B.Create(context.Background(), sandbox.Spec{Limits: baseLimits})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { neighbour.Close() })
			res, err := neighbour.Execute(context.Background(), sandbox.ExecRequest{Code: observePrelude + `
held = [flock_nb(p) for p in (LIBDIR + "/libc.so.6", "/etc/passwd", "/", "/opt/vivarium")]
readlock = os.open("/etc/passwd", os.O_RDONLY)
try:
    ofd(readlock, F_OFD_SETLK, fcntl.F_RDLCK)
except OSError:
    pass  # no OFD locks on this backend: the case says so
print([r for _, r in held])
`}, nil)
			if err != nil || res.Status != sandbox.StatusOK || res.Stdout != "['ok', 'ok', 'ok', 'ok']\n" {
				t.Fatalf("the neighbour did not take its locks: %v %+v", err, res)
			}
			// The host's flock -n on the file the case holds (shared, as
			// above).
			var tries, refused atomic.Int64
			stop, done := make(chan struct{}), make(chan struct{})
			go func() {
				defer close(done)
				for {
					select {
					case <-stop:
						return
					case <-time.After(10 * time.Millisecond):
					}
					fd, err := unix.Open("/usr/bin/md5sum", unix.O_RDONLY|unix.O_CLOEXEC, 0)
					if err != nil {
						continue
					}
					tries.Add(1)
					if unix.Flock(fd, unix.LOCK_SH|unix.LOCK_NB) != nil {
						refused.Add(1)
					}
					unix.Close(fd)
				}
			}()
			t.Cleanup(func() {
				close(stop)
				<-done
				if refused.Load() > 0 || tries.Load() == 0 {
					t.Errorf("the host's flock -n /usr/bin/md5sum failed %d times of %d", refused.Load(), tries.Load())
				}
			})
		},
		check: func(t *testing.T, h *harness, o *outcome) {
			wantOK(t, o, lines("flock /usr/bin/env ok", "flock LIBDIR/libc.so.6 ok", "flock /etc/passwd ok", "flock / ok",
				"flock /opt/vivarium ok", "flock /dev/null ok", "lock seen on /usr/bin/env False", "lock seen on /etc/passwd False",
				"/proc/locks []", "hold md5sum ok"))
		},
	},
	{
		// A runner forked from a zygote runs the zygote's interpreter
		// file, which /proc/self/exe opens: one file for all the
		// sandboxes of that zygote, outside any of their roots.
		name: "lock_own_executable",
		code: `import errno, fcntl, os
try:
    fd = os.open("/proc/self/exe", os.O_RDONLY)
except OSError as e:
    print("open", errno.errorcode[e.errno])
else:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        print("flock ok")
    except BlockingIOError:
        print("flock EWOULDBLOCK")
`,
		prepare: func(t *testing.T, h *harness, j *job) {
			neighbour, err := h.be.B.Create(context.Background(), sandbox.Spec{Limits: baseLimits})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { neighbour.Close() })
			res, err := neighbour.Execute(context.Background(), sandbox.ExecRequest{Code: `import fcntl, os
try:
    held = os.open("/proc/self/exe", os.O_RDONLY)
    fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
    print("held")
except OSError as e:
    print("refused", e.errno)
`}, nil)
			if err != nil || res.Status != sandbox.StatusOK {
				t.Fatalf("the neighbour: %v %+v", err, res)
			}
		},
		check: func(t *testing.T, h *harness, o *outcome) {
			if h.be.Name == "native-zygote" {
				// Landlock: nothing outside the sandbox's root opens.
				wantOK(t, o, lines("open EACCES"))
				return
			}
			if o.Stdout != "flock ok\n" && o.Stdout != "open EACCES\n" {
				t.Fatalf("the neighbour's lock on its own executable reached this sandbox: %s", describe(o))
			}
		},
	},
	{
		name: "proc_reveals_host",
		code: `import os, re
def read(p):
    try:
        with open("/proc/" + p, "rb") as f:
            return f.read().decode(errors="replace")
    except OSError:
        return None
def shown(p, listing=False):
    try:
        if listing:
            return "shown" if os.listdir("/proc/" + p) else "hidden"
        with open("/proc/" + p, "rb") as f:
            return "shown" if f.read(1) else "hidden"
    except OSError:
        return "hidden"
boot = read("sys/kernel/random/boot_id")
if boot is None:
    print("boot_id absent")
else:
    print("boot_id", "host's" if boot.strip() == os.environ["HOST_BOOT_ID"] else "own",
          bool(re.fullmatch(r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}\n", boot)))
cmdline = read("cmdline")
print("cmdline", "hidden" if not cmdline else "host's" if cmdline == os.environ["HOST_CMDLINE"] else "own")
for p in ("config.gz", "interrupts", "softirqs", "diskstats", "partitions", "iomem", "ioports",
          "devices", "buddyinfo", "zoneinfo", "locks"):
    print(p, shown(p))
for p in ("bus", "fs", "irq", "pressure"):
    print(p, shown(p, listing=True))
print("loadavg", read("loadavg").split()[:3])
stat = [l.split() for l in read("stat").splitlines()]
print("stat cpus", sum(bool(re.fullmatch(r"cpu\d+", l[0])) for l in stat) == len(os.sched_getaffinity(0)))
print("stat counters", sorted({n for l in stat if l[0] not in ("btime", "procs_running") for n in l[1:]}))
print("cgroups", sorted({l.split("\t")[2] for l in read("cgroups").splitlines() if not l.startswith("#")}))
print("MemTotal", [l.split()[1] for l in read("meminfo").splitlines() if l.startswith("MemTotal:")])
filenr = read("sys/fs/file-nr")
print("file-nr", "absent" if filenr is None else filenr.split())
`,
		prepare: func(t *testing.T, h *harness, j *job) {
			boot, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
			if err != nil {
				t.Fatal(err)
			}
			j.vars["HOST_BOOT_ID"] = strings.TrimSpace(string(boot))
			cmdline, err := os.ReadFile("/proc/cmdline")
			if err != nil {
				t.Fatal(err)
			}
			j.vars["HOST_CMDLINE"] = string(cmdline)
		},
		check: func(t *testing.T, h *harness, o *outcome) {
			want := []string{"boot_id own True", "cmdline hidden"}
			for _, p := range []string{"config.gz", "interrupts", "softirqs", "diskstats", "partitions",
				"iomem", "ioports", "devices", "buddyinfo", "zoneinfo", "locks", "bus", "fs", "irq", "pressure"} {
				want = append(want, p+" hidden")
			}
			want = append(want, "loadavg ['0.00', '0.00', '0.00']", "stat cpus True", "stat counters ['0']",
				"cgroups ['1']", "MemTotal ['131072']", "file-nr ['0', '0', '0']")
			wantOK(t, o, lines(want...))
		},
	},
}

// observePrelude gives the cases above locks and the architecture's
// library directory.
const observePrelude = `import ctypes, errno, fcntl, os, struct, subprocess, sysconfig
_libc = ctypes.CDLL(None, use_errno=True)
F_OFD_GETLK, F_OFD_SETLK = 36, 37
LIBDIR = "/usr/lib/" + sysconfig.get_config_var("MULTIARCH")

def ofd(fd, cmd, kind):
    raw = fcntl.fcntl(fd, cmd, struct.pack("@hhqqi4x", kind, 0, 0, 0, 0))
    return struct.unpack("@hhqqi4x", raw)[0]

def flock_nb(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return fd, "ok"
    except OSError as e:
        os.close(fd)
        return None, "EWOULDBLOCK" if isinstance(e, BlockingIOError) else errno.errorcode[e.errno]
`

// hostFileActivity reads and runs files of the host's /usr, ten times a
// second, until the test ends; it counts the rounds.
func hostFileActivity(t *testing.T) *atomic.Int64 {
	libdir, err := filepath.Glob("/usr/lib/*-linux-gnu*/libc.so.6")
	if err != nil || len(libdir) == 0 {
		t.Fatalf("no libc.so.6 in /usr/lib/*-linux-gnu*: %v", err)
	}
	var rounds atomic.Int64
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
			for _, p := range []string{"/usr/bin/env", libdir[0], "/dev/null", "/dev/urandom"} {
				if f, err := os.Open(p); err == nil {
					f.Read(make([]byte, 64))
					f.Close()
				}
			}
			os.ReadDir("/usr/bin")
			if exec.Command("/usr/bin/env", "true").Run() == nil {
				rounds.Add(1)
			}
		}
	}()
	t.Cleanup(func() { close(stop); <-done })
	return &rounds
}

// neighbourFileActivity starts a sandbox that reads and runs what every
// sandbox sees, ten times a second, until the test ends; it counts the
// rounds.
func neighbourFileActivity(t *testing.T, h *harness) *atomic.Int64 {
	neighbour, err := h.be.B.Create(context.Background(), sandbox.Spec{Limits: baseLimits})
	if err != nil {
		t.Fatal(err)
	}
	var ticks atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		neighbour.Execute(context.Background(), sandbox.ExecRequest{Code: observePrelude + `
import time
while True:
    for p in ("/usr/bin/env", LIBDIR + "/libc.so.6", "/etc/passwd", "/dev/null", "/dev/urandom"):
        open(p, "rb").read(1)
    os.listdir("/")
    os.listdir("/opt/vivarium")
    subprocess.run(["/usr/bin/env", "true"])
    print("tick", flush=True)
    time.sleep(0.1)
`}, stdoutSink(func(p []byte) { ticks.Add(int64(strings.Count(string(p), "tick"))) }))
	}()
	t.Cleanup(func() { neighbour.Close(); <-done })
	return &ticks
}
