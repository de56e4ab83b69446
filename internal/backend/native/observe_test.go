package native_test

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/vivarium-sandbox/vivarium/internal/backend/native"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/testutil"
)

// observePrelude gives the code of the tests below locks and inotify
// watches on the files every sandbox sees.
const observePrelude = `import ctypes, fcntl, json, os, struct, subprocess, sysconfig
_libc = ctypes.CDLL(None, use_errno=True)
F_OFD_GETLK, F_OFD_SETLK = 36, 37
LIBDIR = "/usr/lib/" + sysconfig.get_config_var("MULTIARCH")
# Files and directories the host or the zygote provides: the same for
# every sandbox unless each gets inodes of its own.
SHARED = ["/usr/bin/env", LIBDIR + "/libc.so.6", "/usr/bin", "/etc/passwd", "/etc", "/", "/opt/vivarium"]

def ofd(fd, cmd, kind):
    raw = fcntl.fcntl(fd, cmd, struct.pack("@hhqqi4x", kind, 0, 0, 0, 0))
    return struct.unpack("@hhqqi4x", raw)[0]

def flock_nb(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return fd, "ok"
    except BlockingIOError:
        os.close(fd)
        return None, "EWOULDBLOCK"

def lease(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_RDLCK)
        return "ok"
    except OSError as e:
        return os.strerror(e.errno)
    finally:
        os.close(fd)

def touch():
    """Opens, reads and runs what SHARED names."""
    for p in SHARED:
        if os.path.isdir(p):
            os.listdir(p)
        else:
            with open(p, "rb") as f:
                f.read(1)
    subprocess.run(["/usr/bin/env", "true"], check=True)
`

// Every sandbox sees the host's files, and a zygote's, through inodes of
// its own: locks taken in one sandbox neither block nor show in another or
// on the host, the host's locks are not seen in a sandbox, and an inotify
// watch in one sandbox sees nothing of what the host or another sandbox
// opens, reads or runs. The watching sandbox sees its own activity: the
// watches work.
func TestSandboxesShareNoInodes(t *testing.T) {
	t.Parallel()
	b := newBackend(t)
	ctx := context.Background()
	libdir := "/usr/lib/" + multiarch(t)
	hostFiles := []string{"/usr/bin/env", libdir + "/libc.so.6"}

	watcher, err := b.Create(ctx, sandbox.Spec{Limits: sandbox.Limits{Timeout: 60e9}})
	if err != nil {
		t.Fatal(err)
	}
	defer watcher.Close()
	res, err := watcher.Execute(ctx, sandbox.ExecRequest{Code: observePrelude + `
held = [flock_nb(p) for p in SHARED]
print("flock", [r for _, r in held])
readlocks = [os.open(p, os.O_RDONLY) for p in ("/usr/bin/env", "/etc/passwd")]
print("ofd", [ofd(fd, F_OFD_SETLK, fcntl.F_RDLCK) for fd in readlocks])
print("lease", lease("/usr/bin/env"), lease("/etc/passwd"))
ino = _libc.inotify_init1(os.O_NONBLOCK)
watches = {_libc.inotify_add_watch(ino, p.encode(), 0xfff): p for p in SHARED}
print("watches", sorted(watches.values()) == sorted(SHARED))

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
`}, nil)
	if err != nil || res.Status != sandbox.StatusOK {
		t.Fatalf("%v %+v", err, res)
	}
	want := "flock ['ok', 'ok', 'ok', 'ok', 'ok', 'ok', 'ok']\nofd [0, 0]\n" +
		"lease Permission denied Permission denied\nwatches True\n"
	if res.Stdout != want {
		t.Fatalf("the watcher's set-up:\n%s\nwant:\n%s\n(stderr %s)", res.Stdout, want, res.Stderr)
	}

	// The host: the watcher's locks are not on the host's inodes, and the
	// host's own lock, held while the other sandbox runs, is not on the
	// sandboxes'. A shared lock: the sandboxes' exclusive ones conflict
	// with it, other tests' shared ones on the same files do not.
	for _, p := range hostFiles {
		fd, err := unix.Open(p, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Close(fd)
		if err := unix.Flock(fd, unix.LOCK_SH|unix.LOCK_NB); err != nil {
			t.Errorf("the host's flock -n %s: %v, while a sandbox holds a lock on its %s", p, err, p)
		}
		lk := unix.Flock_t{Type: unix.F_WRLCK}
		if err := unix.FcntlFlock(uintptr(fd), unix.F_OFD_GETLK, &lk); err != nil || lk.Type != unix.F_UNLCK {
			t.Errorf("the host's F_OFD_GETLK on %s: %v, lock type %d; want no lock seen", p, err, lk.Type)
		}
	}
	if out, err := exec.Command("/usr/bin/env", "md5sum", hostFiles[1]).CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}

	other := run(t, observePrelude+`
print("flock", [flock_nb(p)[1] for p in SHARED])
print("ofd", [ofd(os.open(p, os.O_RDONLY), F_OFD_GETLK, fcntl.F_WRLCK) for p in ("/usr/bin/env", "/etc/passwd")])
touch()
`)
	wantStatus(t, other, sandbox.StatusOK, 0)
	if want := "flock ['ok', 'ok', 'ok', 'ok', 'ok', 'ok', 'ok']\nofd [2, 2]\n"; other.Stdout != want {
		t.Errorf("the other sandbox:\n%s\nwant (F_UNLCK is 2):\n%s", other.Stdout, want)
	}

	res, err = watcher.Execute(ctx, sandbox.ExecRequest{Code: `
print("events", drain())
touch()
print("own", set(SHARED) <= set(drain()))
`}, nil)
	if err != nil || res.Status != sandbox.StatusOK {
		t.Fatalf("%v %+v", err, res)
	}
	if res.Stdout != "events []\nown True\n" {
		t.Errorf("the watcher saw the host's and the other sandbox's activity, or not its own:\n%s", res.Stdout)
	}
}

// multiarch is Debian's directory of the architecture's libraries.
func multiarch(t *testing.T) string {
	out, err := exec.Command("/usr/bin/python3", "-c", "import sysconfig; print(sysconfig.get_config_var('MULTIARCH'))").Output()
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(out))
}

// A sandbox's /proc tells nothing of the host or of other tenants: the
// files that would are empty or absent, and those that programs read are
// the sandbox's own.
func TestProcShowsTheSandbox(t *testing.T) {
	t.Parallel()
	const memory = 200 << 20
	code := `import json, os
def read(p):
    try:
        with open("/proc/" + p, errors="replace") as f:
            return f.read()
    except OSError as e:
        return "error " + os.strerror(e.errno)
def listdir(p):
    try:
        return os.listdir("/proc/" + p)
    except OSError as e:
        return []
files = ["sys/kernel/random/boot_id", "meminfo", "stat", "loadavg", "cgroups", "vmstat", "swaps",
         "config.gz", "cmdline", "interrupts", "softirqs", "diskstats", "partitions", "iomem", "ioports",
         "devices", "buddyinfo", "zoneinfo", "misc", "consoles", "dma", "keys", "timer_list",
         "sys/fs/file-nr", "sys/fs/inode-nr", "sys/fs/dentry-state", "sys/fs/aio-nr", "sys/kernel/pty/nr"]
dirs = ["bus", "fs", "irq", "pressure", "acpi", "sys/fs/quota"]
print(json.dumps({"files": {p: read(p) for p in files}, "dirs": {p: listdir(p) for p in dirs},
                  "root": sorted(os.listdir("/"))}))
`
	limit := func(j *sandbox.OneShot) { j.Spec.Limits.Memory = memory }
	var views [2]struct {
		Files map[string]string
		Dirs  map[string][]string
		Root  []string
	}
	for i := range views {
		res := run(t, code, limit)
		wantStatus(t, res, sandbox.StatusOK, 0)
		if err := json.Unmarshal([]byte(res.Stdout), &views[i]); err != nil {
			t.Fatalf("%v: %s", err, res.Stdout)
		}
	}
	v := views[0]
	hostBoot, _ := os.ReadFile("/proc/sys/kernel/random/boot_id")
	uuid := regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}\n$`)
	switch boot := v.Files["sys/kernel/random/boot_id"]; {
	case !uuid.MatchString(boot):
		t.Errorf("boot_id %q: want a random uuid", boot)
	case boot == string(hostBoot):
		t.Errorf("boot_id is the host's")
	case boot == views[1].Files["sys/kernel/random/boot_id"]:
		t.Errorf("two sandboxes have the same boot_id")
	}

	meminfo := fields(v.Files["meminfo"])
	for _, k := range []string{"MemTotal", "MemFree", "MemAvailable"} {
		if got := meminfo[k]; got != strconv.Itoa(memory>>10)+" kB" {
			t.Errorf("meminfo %s: %q, want the memory limit, %d kB", k, got, memory>>10)
		}
	}
	for _, k := range []string{"Cached", "Shmem", "Slab", "Committed_AS"} {
		if got := meminfo[k]; got != "0 kB" {
			t.Errorf("meminfo %s: %q, want 0 kB", k, got)
		}
	}

	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		t.Fatal(err)
	}
	var cpus []string
	hostStat, _ := os.ReadFile("/proc/stat")
	btime := regexp.MustCompile(`(?m)^btime .*$`).FindString(string(hostStat))
	for _, l := range strings.Split(strings.TrimSpace(v.Files["stat"]), "\n") {
		name, rest, _ := strings.Cut(l, " ")
		switch {
		case name == "btime":
			if l != btime {
				t.Errorf("stat: %q, want the host's %q (the start times in /proc/PID/stat count from it)", l, btime)
			}
		case name == "procs_running":
		case strings.Trim(rest, "0 ") != "":
			t.Errorf("stat: %q, want zeros", l)
		}
		if strings.HasPrefix(name, "cpu") && name != "cpu" {
			cpus = append(cpus, name)
		}
	}
	if len(cpus) != set.Count() {
		t.Errorf("stat: %v, want a line for each of the %d CPUs the sandbox may use", cpus, set.Count())
	}
	if l := v.Files["loadavg"]; !strings.HasPrefix(l, "0.00 0.00 0.00 ") {
		t.Errorf("loadavg %q: want the sandbox's, not the host's", l)
	}
	for _, l := range strings.Split(strings.TrimSpace(v.Files["cgroups"]), "\n")[1:] {
		if f := strings.Split(l, "\t"); len(f) != 4 || f[2] != "1" {
			t.Errorf("cgroups: %q, want num_cgroups 1 (the sandbox's own)", l)
		}
	}
	for _, p := range []string{"vmstat", "sys/fs/file-nr", "sys/fs/inode-nr", "sys/fs/dentry-state", "sys/fs/aio-nr", "sys/kernel/pty/nr"} {
		if strings.Trim(regexp.MustCompile(`[a-z_0-9]*[a-z_][a-z_0-9]*`).ReplaceAllString(v.Files[p], ""), "0 \t\n") != "" {
			t.Errorf("%s: %q, want only zeros", p, v.Files[p])
		}
	}
	if want := "Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n"; v.Files["swaps"] != want {
		t.Errorf("swaps %q, want no swap", v.Files["swaps"])
	}
	for _, p := range []string{"config.gz", "cmdline", "interrupts", "softirqs", "diskstats", "partitions", "iomem",
		"ioports", "devices", "buddyinfo", "zoneinfo", "misc", "consoles", "dma", "keys", "timer_list"} {
		if got := v.Files[p]; got != "" && !strings.HasPrefix(got, "error ") {
			t.Errorf("/proc/%s: %.80q, want it empty or absent", p, got)
		}
	}
	for p, names := range v.Dirs {
		if len(names) > 0 {
			t.Errorf("/proc/%s: %v, want it empty or absent", p, names)
		}
	}
	if want := []string{"bin", "dev", "etc", "home", "lib", "lib64", "opt", "proc", "root", "run", "sbin", "tmp", "usr", "var", "workspace"}; !slices.Equal(v.Root, want) && !slices.Equal(v.Root, hostRootNames(want)) {
		t.Errorf("/ holds %v, want %v: nothing of the root's assembly", v.Root, want)
	}
}

// hostRootNames is want with only the top-level directories this host has.
func hostRootNames(want []string) []string {
	var out []string
	for _, n := range want {
		switch n {
		case "bin", "sbin", "lib", "lib64":
			if _, err := os.Lstat(filepath.Join("/", n)); err != nil {
				continue
			}
		}
		out = append(out, n)
	}
	return out
}

// fields parses "Key: value" lines.
func fields(text string) map[string]string {
	m := map[string]string{}
	for _, l := range strings.Split(text, "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok {
			m[k] = strings.TrimSpace(v)
		}
	}
	return m
}

// The programs that read what /proc synthesises or hides still work, and
// count the CPUs the sandbox may use.
func TestProgramsReadingProc(t *testing.T) {
	t.Parallel()
	res := run(t, `import multiprocessing, os, subprocess
for cmd in (["ps", "aux"], ["top", "-bn1"], ["free"], ["uptime"], ["nproc"], ["df"], ["vmstat"]):
    p = subprocess.run(cmd, capture_output=True, text=True)
    print(cmd[0], p.returncode, p.stderr.strip()[:300])
print("cpus", os.cpu_count() == multiprocessing.cpu_count() == len(os.sched_getaffinity(0)))
import numpy, pandas
print("imports", numpy.ones(3).sum(), len(pandas.DataFrame({"a": [1, 2]})))
`)
	wantStatus(t, res, sandbox.StatusOK, 0)
	want := "ps 0 \ntop 0 \nfree 0 \nuptime 0 \nnproc 0 \ndf 0 \nvmstat 0 \ncpus True\nimports 3.0 2\n"
	if res.Stdout != want {
		t.Errorf("stdout:\n%s\nwant:\n%s\nstderr: %s", res.Stdout, want, res.Stderr)
	}
}

// This host lets a sandbox's init mount the overlays its root is made of:
// the doctor's probe says so.
func TestCheckOverlay(t *testing.T) {
	testutil.RequireRoot(t)
	if err := native.CheckOverlay(); err != nil {
		t.Fatal(err)
	}
}
