package docker_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/vivarium-sandbox/vivarium/internal/backend/container"
	"github.com/vivarium-sandbox/vivarium/internal/backend/docker"
	"github.com/vivarium-sandbox/vivarium/internal/hostuid"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/testutil"
)

// hogCode takes all it can of three per-user kernel budgets and keeps it
// (the sandbox is persistent: held lives on): inotify instances, pipe
// buffers (F_SETPIPE_SZ to 1 MiB until the user's soft limit refuses) and
// descriptors in flight over Unix sockets (SCM_RIGHTS until
// ETOOMANYREFS). It prints how many of each it got and the errno that
// stopped it.
const hogCode = `
import ctypes, errno, fcntl, os, socket
libc = ctypes.CDLL(None, use_errno=True)
held = []

def inotify():
    n = 0
    while True:
        fd = libc.inotify_init1(os.O_CLOEXEC)
        if fd < 0:
            return n, errno.errorcode[ctypes.get_errno()]
        held.append(fd)
        n += 1

def pipes():
    n = 0
    while True:
        r, w = os.pipe()
        held.extend((r, w))
        try:
            fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, 1 << 20)
        except OSError as e:
            return n, errno.errorcode[e.errno]
        n += 1

def inflight():
    n, fd = 0, os.open("/dev/null", os.O_RDONLY)
    while True:
        a, b = socket.socketpair()
        a.setblocking(False)
        held.extend((a, b))
        while True:
            try:
                socket.send_fds(a, [b"x"], [fd] * 64)
            except BlockingIOError:
                break
            except OSError as e:
                return n, errno.errorcode[e.errno]
            n += 64

print("uid", os.getuid())
print("inotify", *inotify())
print("pipes", *pipes())
print("inflight", *inflight())
`

// probeCode asks once for each budget hogCode takes.
const probeCode = `
import ctypes, errno, fcntl, os, socket
libc = ctypes.CDLL(None, use_errno=True)
fd = libc.inotify_init1(os.O_CLOEXEC)
print("inotify", "ok" if fd >= 0 else errno.errorcode[ctypes.get_errno()])
r, w = os.pipe()
try:
    fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, 1 << 20)
    print("pipe", "ok")
except OSError as e:
    print("pipe", errno.errorcode[e.errno])
a, b = socket.socketpair()
try:
    socket.send_fds(a, [b"x"], [r])
    print("inflight", "ok")
except OSError as e:
    print("inflight", errno.errorcode[e.errno])
`

// Every sandbox is a host user of its own: its processes have a host uid
// of its range (read from the host's /proc), which it holds while it
// lives and gives back when it is closed; one that takes all of its
// per-user budgets (inotify instances, pipe buffers, descriptors in
// flight) leaves another sandbox's, and the host root's, untouched.
func TestSandboxesAreHostUsersOfTheirOwn(t *testing.T) {
	testutil.RequirePython(t)
	b := newBackend(t, "vivarium-docker-users-test", docker.Config{})
	ctx := context.Background()
	hog, err := b.Create(ctx, sandbox.Spec{})
	if err != nil {
		t.Fatal(err)
	}
	defer hog.Close()
	res := run(t, hog, hogCode)
	wantStatus(t, res, sandbox.StatusOK)
	got := fields(res.Stdout)
	t.Logf("the hog: %q", res.Stdout)
	maxInotify := readInt(t, "/proc/sys/fs/inotify/max_user_instances")
	if got["inotify"] != fmt.Sprintf("%d EMFILE", maxInotify) {
		t.Errorf("the hog got inotify instances %q, want all %d of its user's", got["inotify"], maxInotify)
	}
	if !strings.HasSuffix(got["pipes"], " EPERM") {
		t.Errorf("the hog's pipe buffers: %q, want it stopped by the per-user limit (EPERM)", got["pipes"])
	}
	if !strings.HasSuffix(got["inflight"], " ETOOMANYREFS") {
		t.Errorf("the hog's descriptors in flight: %q, want it stopped by the per-user limit (ETOOMANYREFS)", got["inflight"])
	}

	// Another sandbox, while the hog holds all that.
	other, err := b.Create(ctx, sandbox.Spec{})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	res = run(t, other, "import os\nprint('uid', os.getuid())\n"+probeCode)
	wantStatus(t, res, sandbox.StatusOK)
	probe := fields(res.Stdout)
	if probe["inotify"] != "ok" || probe["pipe"] != "ok" || probe["inflight"] != "ok" {
		t.Errorf("another sandbox, beside the hog: %q", res.Stdout)
	}
	// The host's root.
	if fd, err := unix.InotifyInit1(unix.IN_CLOEXEC); err != nil {
		t.Errorf("the host root's inotify_init1 beside the hog: %v", err)
	} else {
		unix.Close(fd)
	}
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	if _, err := unix.FcntlInt(uintptr(p[1]), unix.F_SETPIPE_SZ, 1<<20); err != nil {
		t.Errorf("the host root's F_SETPIPE_SZ beside the hog: %v", err)
	}
	unix.Close(p[0])
	unix.Close(p[1])
	s, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Sendmsg(s[0], []byte("x"), unix.UnixRights(s[1]), nil, 0); err != nil {
		t.Errorf("the host root's SCM_RIGHTS beside the hog: %v", err)
	}
	unix.Close(s[0])
	unix.Close(s[1])

	// Two users, each of a range of the pool, each the uid (and gid) of
	// its sandbox's processes on the host.
	uids := []int{wantSandboxUID(t, got["uid"]), wantSandboxUID(t, probe["uid"])}
	if uids[0] == uids[1] {
		t.Fatalf("both sandboxes are uid %d", uids[0])
	}
	var ranges []*hostuid.Pool
	for _, uid := range uids {
		procs := processesOf(uid)
		if len(procs) == 0 {
			t.Errorf("no host process has uid %d", uid)
		}
		for pid, ids := range procs {
			want := fmt.Sprintf("uid %[1]d %[1]d %[1]d %[1]d gid %[1]d %[1]d %[1]d %[1]d groups []", uid)
			if ids != want {
				t.Errorf("host process %d: %s, want %s", pid, ids, want)
			}
		}
		// A pool of the one range, to see whether anyone holds it.
		r, err := hostuid.New(hostuid.Config{Base: uint32(uid - container.SandboxUID), Ranges: 1})
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		if n, err := r.InUse(); err != nil || n != 1 {
			t.Errorf("the range of uid %d: held %d times (%v), want once", uid, n, err)
		}
		ranges = append(ranges, r)
	}

	// Closed, each gives its range back, and nothing of it is left.
	for _, sb := range []sandbox.Sandbox{hog, other} {
		if err := sb.Close(); err != nil {
			t.Fatal(err)
		}
	}
	for i, uid := range uids {
		if n, err := ranges[i].InUse(); err != nil || n != 0 {
			t.Errorf("the range of uid %d: held %d times (%v) after Close, want free", uid, n, err)
		}
		if procs := processesOf(uid); len(procs) > 0 {
			t.Errorf("processes of uid %d after Close: %v", uid, procs)
		}
	}
	if left := b.leftovers(t); len(left) > 0 {
		t.Errorf("left behind: %v", left)
	}
}

// wantSandboxUID checks that s is a sandbox user's uid of the tests' pool
// (id SandboxUID of one of its ranges), and returns it.
func wantSandboxUID(t *testing.T, s string) int {
	t.Helper()
	uid, err := strconv.Atoi(s)
	if err != nil {
		t.Fatalf("uid %q", s)
	}
	off := uid - testUIDBase
	if off < 0 || off >= testUIDRanges*hostuid.RangeSize || off%hostuid.RangeSize != container.SandboxUID {
		t.Fatalf("uid %d is no sandbox user of the pool (%d ranges from %d)", uid, testUIDRanges, testUIDBase)
	}
	return uid
}

// processesOf maps the host processes whose real uid is uid to their ids
// (real, effective, saved and file-system uids and gids; supplementary
// groups), as their /proc/PID/status says.
func processesOf(uid int) map[int]string {
	out := map[int]string{}
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		b, err := os.ReadFile(filepath.Join(d, "status"))
		if err != nil {
			continue
		}
		st := map[string][]string{}
		for _, line := range strings.Split(string(b), "\n") {
			k, v, _ := strings.Cut(line, ":")
			st[k] = strings.Fields(v)
		}
		if len(st["Uid"]) == 0 || st["Uid"][0] != strconv.Itoa(uid) {
			continue
		}
		pid, _ := strconv.Atoi(filepath.Base(d))
		out[pid] = fmt.Sprintf("uid %s gid %s groups %v", strings.Join(st["Uid"], " "), strings.Join(st["Gid"], " "), st["Groups"])
	}
	return out
}

// fields maps the first word of each line to the rest.
func fields(out string) map[string]string {
	m := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		k, v, _ := strings.Cut(line, " ")
		m[k] = v
	}
	return m
}

func readInt(t *testing.T, path string) int {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// A container's /usr is an overlay of its own, not the host's inodes: an
// inotify watch in it sees no access of the host's or of another
// sandbox's, and a lock on a /usr file in it is not the host's or another
// sandbox's. (The watch does see the sandbox's own access: it works.)
func TestUsrIsTheContainersOwn(t *testing.T) {
	testutil.RequirePython(t)
	const watched, locked = "/usr/bin/md5sum", "/usr/bin/sha1sum"
	b := newBackend(t, "vivarium-docker-usr-test", docker.Config{})
	ctx := context.Background()
	sb, err := b.Create(ctx, sandbox.Spec{})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	res := run(t, sb, `
import ctypes, fcntl, os
libc = ctypes.CDLL(None, use_errno=True)
w = libc.inotify_init1(os.O_NONBLOCK)
print("watch", libc.inotify_add_watch(w, b"`+watched+`", 0xfff) >= 0)
lock = open("`+locked+`", "rb")
fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
print("locked")
def events():
    try:
        return len(os.read(w, 65536))
    except BlockingIOError:
        return 0
`)
	if res.Stdout != "watch True\nlocked\n" {
		t.Fatalf("the watch and the lock: %+v", res)
	}
	// The host reads the watched file and locks the locked one ...
	if _, err := os.ReadFile(watched); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(locked)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		t.Errorf("the host's flock -n on %s, which a sandbox locked: %v", locked, err)
	}
	unix.Flock(int(f.Fd()), unix.LOCK_UN)
	// ... so does another sandbox.
	res, warn := sandbox.RunOnce(ctx, b, sandbox.OneShot{Request: sandbox.ExecRequest{Code: `
import fcntl
open("` + watched + `", "rb").read()
fcntl.flock(open("` + locked + `", "rb"), fcntl.LOCK_EX | fcntl.LOCK_NB)
print("locked too")
`}})
	if warn != nil {
		t.Error(warn)
	}
	if res.Stdout != "locked too\n" {
		t.Errorf("another sandbox's flock -n on %s, which the first locked: %+v %+v", locked, res, res.Error)
	}
	if res := run(t, sb, "print('events of others', events())\nopen('"+watched+"', 'rb').read()\nprint('events of its own', events() > 0)"); res.Stdout != "events of others 0\nevents of its own True\n" {
		t.Errorf("inotify on %s: %+v", watched, res)
	}
}
