//go:build linux

package hostile

// Hostile code against fork (sandbox.Forker, issue 15) on the native
// backend, with CRIU: a forked copy must be a sandbox of its own, confined
// exactly like its source, and a source that plants things to exploit the
// fork (set-id binaries, ACLs, hard links, huge sparse files, thousands
// of files, links pointing out, FIFOs, locks, a fork storm) either forks
// into such copies or fails cleanly, leaving nothing:
//
//   - TestHostileForkIsolation: what a copy writes after the fork (SysV
//     shared memory, message queues and semaphores by key, a memfd,
//     files hard-linked or open before the fork, abstract Unix sockets, signals to the pids it shares with the
//     others) is seen by no other copy nor the source; each copy's
//     processes run as its own host users only, and every file of its
//     root tmpfs is owned by them (set-id bits, file capabilities, ACLs).
//   - TestHostileForkHostileSource: planted states; the fork succeeds and
//     each copy's view of its confinement is the source's, or it fails
//     and leaves nothing.
//   - TestHostileForkRootFS: the copy's root tmpfs is mounted by the
//     supervisor (its superblock is the host user namespace's, the
//     source's is its own user namespace's): what the sandbox's root can
//     do to its root file systems, and their flags and limits, must be
//     the same in a copy as in the source.
//
// Every test closes the source and its copies and checks that no
// process, cgroup, mount, checkpoint or temporary directory is left.
// The suite has its own backend (cgroup parent, host users, checkpoint
// directory), reusing the pause suite's helpers (pauseWorld).

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vivarium-sandbox/vivarium/internal/backend/native"
	"github.com/vivarium-sandbox/vivarium/internal/criu"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/testutil"
)

const (
	forkCgroupParent = "vivarium-hostile-fork-test"
	forkUIDBase      = native.DefaultUIDBase + 32<<24
	forkUIDRanges    = 16
	forkRangeSize    = 1 << 16
)

// forkWorld is the fork suite's backend and canaries: a pauseWorld of its
// own cgroup parent and host users.
type forkWorld struct {
	*pauseWorld
	mounts []string
	tmp    map[string]bool // os.TempDir's entries when the test began
}

func newForkWorld(t *testing.T) *forkWorld {
	testutil.RequireRoot(t)
	testutil.RequirePython(t)
	if _, err := criu.Usable(); err != nil {
		t.Skipf("fork needs CRIU 4 (internal/criu.Find: %v); make criu builds it", err)
	}
	testutil.RemoveStaleCgroups(forkCgroupParent)
	parent, err := os.MkdirTemp("", "vivarium-hostile-fork-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(parent) })
	if err := os.Chmod(parent, 0o711); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(parent, "checkpoints")
	cfg := ofKind(t, native.Config{CgroupParent: forkCgroupParent, UIDBase: forkUIDBase,
		UIDRanges: forkUIDRanges, CheckpointDir: dir})
	if os.Getenv("VIVARIUM_HOSTILE_FORK_DEBUG") != "" {
		cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	b, err := native.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	procs := map[string]bool{}
	for _, p := range testutil.ProcessesOwnedBy(int(forkUIDBase), int(forkUIDBase)+forkUIDRanges<<16) {
		procs[p] = true
	}
	w := &forkWorld{
		pauseWorld: &pauseWorld{b: b, dir: dir, canaries: testutil.SetupCanaries(t), procs: procs},
		mounts:     testutil.Mounts(),
		tmp:        tempEntries(),
	}
	return w
}

// tempEntries are the entries of os.TempDir() that CRIU or a fork could
// have made.
func tempEntries() map[string]bool {
	out := map[string]bool{}
	ents, _ := os.ReadDir(os.TempDir())
	for _, e := range ents {
		if n := strings.ToLower(e.Name()); strings.Contains(n, "criu") || strings.Contains(n, "fork") {
			out[e.Name()] = true
		}
	}
	return out
}

// checkLeftovers: nothing of the suite's sandboxes left on the host.
func (w *forkWorld) checkLeftovers(t *testing.T) {
	t.Helper()
	var left []string
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		if left = w.newProcesses(int(forkUIDBase), int(forkUIDBase)+forkUIDRanges<<16); len(left) == 0 {
			break
		}
	}
	if len(left) > 0 {
		t.Errorf("processes left: %v", describeProcs(left))
		killLeft(left)
	}
	if left := testutil.CgroupsUnder(forkCgroupParent); len(left) > 0 {
		t.Errorf("cgroups left: %v", left)
	}
	if left, err := checkpointsLeft(w.dir); err != nil || len(left) > 0 {
		t.Errorf("left in the checkpoint directory: %v %v", left, err)
	}
	// Other test packages run beside this one and mount their own
	// sandboxes' disks: only mounts under this suite's directory, where
	// a fork mounts (its snapshot's files, each copy's root), count.
	for _, m := range testutil.MountsAdded(w.mounts, 5*time.Second, forkCgroupParent) {
		if strings.HasPrefix(m, filepath.Dir(w.dir)) {
			t.Errorf("mount left on the host: %s", m)
		}
	}
	for n := range tempEntries() {
		if !w.tmp[n] {
			t.Errorf("left in %s: %s", os.TempDir(), n)
		}
	}
	w.canaries.Check(t)
}

// fork forks s into n copies, each closed at the test's end (Close twice
// is harmless). A fork that fails must return no copy.
func (w *forkWorld) fork(t *testing.T, s *native.Sandbox, n int) ([]*native.Sandbox, error) {
	t.Helper()
	sbxs, err := bounded(t, "Fork", func(ctx context.Context) ([]sandbox.Sandbox, error) {
		return s.Fork(ctx, n, sandbox.ForkOptions{})
	})
	if err != nil {
		if len(sbxs) > 0 {
			t.Errorf("a failed fork returned %d copies", len(sbxs))
		}
		return nil, err
	}
	if len(sbxs) != n {
		t.Fatalf("Fork(%d) made %d copies", n, len(sbxs))
	}
	out := make([]*native.Sandbox, n)
	for i, c := range sbxs {
		t.Cleanup(func() { c.Close() })
		cs, ok := c.(*native.Sandbox)
		if !ok {
			t.Fatalf("a copy is a %T", c)
		}
		out[i] = cs
	}
	return out, nil
}

// source is w.create, the sandbox closed at the test's end.
func (w *forkWorld) source(t *testing.T, limits sandbox.Limits) *native.Sandbox {
	t.Helper()
	s := w.create(t, limits)
	t.Cleanup(func() { s.Close() })
	return s
}

// asRoot runs python3 -c code as the sandbox's root (a command) and
// returns its stdout; stderr is logged.
func (w *forkWorld) asRoot(t *testing.T, s *native.Sandbox, code string) string {
	t.Helper()
	out, errOut, code2 := w.command(t, s, sandbox.UserRoot, code)
	if code2 != 0 {
		t.Fatalf("as root, exit %d: %s\n%s", code2, errOut, code)
	}
	return out
}

func (w *forkWorld) command(t *testing.T, s *native.Sandbox, user, code string) (stdout, stderr string, exit int) {
	t.Helper()
	p, err := bounded(t, "Start", func(ctx context.Context) (sandbox.Process, error) {
		return s.Start(ctx, sandbox.Command{Argv: []string{"python3", "-c", code}, User: user, Dir: "/workspace"})
	})
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	p.Stdin().Close()
	var out, errOut strings.Builder
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); io.Copy(&out, io.LimitReader(p.Stdout(), 1<<20)) }()
	go func() { defer wg.Done(); io.Copy(&errOut, io.LimitReader(p.Stderr(), 1<<20)) }()
	select {
	case <-p.Done():
	case <-time.After(pauseCallLimit):
		p.Signal(unix.SIGKILL)
		t.Fatalf("a command did not end in %v", pauseCallLimit)
	}
	wg.Wait()
	for where, text := range map[string]string{"stdout": out.String(), "stderr": errOut.String()} {
		if w.canaries.LeakedIn(text) {
			t.Errorf("the host's canary token reached the sandbox: it shows in a command's %s", where)
		}
	}
	return out.String(), errOut.String(), p.ExitCode()
}

// hostPids are the host pids of s's processes (its cgroup's).
func hostPids(t *testing.T, s *native.Sandbox) []int {
	t.Helper()
	procs, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", forkCgroupParent, s.ID(), "cgroup.procs"))
	v2, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", forkCgroupParent, s.ID(), "cgroup.procs"))
	seen := map[int]bool{}
	var out []int
	for _, f := range append(procs, v2...) {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, l := range strings.Fields(string(b)) {
			if n, err := strconv.Atoi(l); err == nil && !seen[n] {
				seen[n] = true
				out = append(out, n)
			}
		}
	}
	sort.Ints(out)
	return out
}

// checkHostIDs checks, on the host, that every process of s runs as host
// ids of its own range [root, root+65536) only (Uid, Gid, Groups), and
// that every file of its root tmpfs is owned by them, its ACLs name
// them, and its file capability's root id is one of them.
func checkHostIDs(t *testing.T, name string, s *native.Sandbox, root int) {
	t.Helper()
	in := func(id int) bool { return id >= root && id < root+forkRangeSize }
	pids := hostPids(t, s)
	if len(pids) == 0 {
		t.Errorf("%s: no process found in its cgroup", name)
		return
	}
	for _, pid := range pids {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
		if err != nil {
			continue // exited
		}
		for _, l := range strings.Split(string(b), "\n") {
			k, v, _ := strings.Cut(l, ":")
			if k != "Uid" && k != "Gid" && k != "Groups" {
				continue
			}
			for _, f := range strings.Fields(v) {
				if id, err := strconv.Atoi(f); err != nil || !in(id) {
					t.Errorf("%s: host process %d has %s %s, outside its range %d+65536", name, pid, k, strings.TrimSpace(v), root)
				}
			}
		}
	}
	// Its root tmpfs, through its init's root, on the host.
	top := fmt.Sprintf("/proc/%d/root", sandboxInit(pids))
	var rst unix.Stat_t
	if err := unix.Stat(top+"/", &rst); err != nil {
		t.Errorf("%s: %v", name, err)
		return
	}
	files, setid, withACL, withCap := 0, 0, 0, 0
	err := filepath.WalkDir(top+"/", func(p string, d os.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				return nil
			}
			return err
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return nil
		}
		if st.Dev != rst.Dev {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		rel := strings.TrimPrefix(p, top)
		files++
		if !in(int(st.Uid)) || !in(int(st.Gid)) {
			t.Errorf("%s: %s is owned by %d:%d on the host, outside its range %d+65536", name, rel, st.Uid, st.Gid, root)
		}
		if st.Mode&(unix.S_ISUID|unix.S_ISGID) != 0 && st.Mode&unix.S_IFMT != unix.S_IFDIR {
			setid++
		}
		if st.Mode&unix.S_IFMT == unix.S_IFLNK {
			return nil
		}
		buf := make([]byte, 4096)
		for _, attr := range []string{"system.posix_acl_access", "system.posix_acl_default"} {
			n, err := unix.Lgetxattr(p, attr, buf)
			if err != nil {
				continue
			}
			withACL++
			v := buf[:n]
			for e := v[min(4, len(v)):]; len(e) >= 8; e = e[8:] {
				if tag := binary.LittleEndian.Uint16(e); (tag == 2 || tag == 8) && !in(int(binary.LittleEndian.Uint32(e[4:]))) {
					t.Errorf("%s: %s: %s names host id %d, outside its range", name, rel, attr, binary.LittleEndian.Uint32(e[4:]))
				}
			}
		}
		if n, err := unix.Lgetxattr(p, "security.capability", buf); err == nil {
			withCap++
			v := buf[:n]
			switch {
			case n == 24 && binary.LittleEndian.Uint32(v)&0xFF000000 == 0x03000000:
				if id := int(binary.LittleEndian.Uint32(v[20:])); !in(id) {
					t.Errorf("%s: %s: a file capability for host root id %d, outside its range", name, rel, id)
				}
			default:
				t.Errorf("%s: %s: a file capability of the host's user namespace (%x): it would hold for the host's root", name, rel, v)
			}
		}
		return nil
	})
	if err != nil {
		t.Errorf("%s: walking its root on the host: %v", name, err)
	}
	t.Logf("%s: %d processes, %d files of its root (%d set-id, %d with ACLs, %d with a file capability): host ids in %d+65536",
		name, len(pids), files, setid, withACL, withCap, root)
}

// sandboxInit is the one of pids that is its PID namespace's first (the
// sandbox's init, which lives as long as it does), or the first of pids.
func sandboxInit(pids []int) int {
	for _, pid := range pids {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "NSpid:"); ok {
				if f := strings.Fields(v); len(f) > 1 && f[len(f)-1] == "1" {
					return pid
				}
			}
		}
	}
	return pids[0]
}

// uidMapHost is the host id column of the view's id maps: it differs
// between copies by design, and is checked apart.
var uidMapHost = regexp.MustCompile(`(?m)^((?:uid|gid)_map \d+) \d+ `)

// normView is a view (viewCode) with the maps' host ids taken out.
func normView(v string) string { return uidMapHost.ReplaceAllString(v, "$1 HOST ") }

// checkCopy compares a copy with its source: its view of its confinement
// (capabilities, no_new_privs, seccomp, id maps, mount flags) is the
// source's, its host range is its own, and its host ids are its range's.
func (w *forkWorld) checkCopy(t *testing.T, name string, c *native.Sandbox, sourceView string, ranges map[int]string) {
	t.Helper()
	if v := w.view(t, c); normView(v) != normView(sourceView) {
		t.Errorf("%s: its view of its confinement is not the source's:\n%s\nthe source's:\n%s", name, v, sourceView)
	}
	root := w.hostRoot(t, c)
	if other, ok := ranges[root]; ok {
		t.Errorf("%s: its host root %d is %s's too", name, root, other)
	}
	ranges[root] = name
	if (root-int(forkUIDBase))%forkRangeSize != 0 || root < int(forkUIDBase) || root >= int(forkUIDBase)+forkUIDRanges<<16 {
		t.Errorf("%s: host root %d is not one of the backend's ranges", name, root)
	}
	checkHostIDs(t, name, c, root)
}

// closeAll closes the source and its copies.
func (w *forkWorld) closeAll(t *testing.T, s *native.Sandbox, copies []*native.Sandbox) {
	t.Helper()
	for _, c := range copies {
		w.close(t, c)
	}
	w.close(t, s)
}

// isolationSetup leaves, in the source, kernel objects and files that a
// copy would share with another if the fork shared anything: SysV shared
// memory, a message queue and a semaphore set of a fixed key, a memfd
// mapped shared, a file with two hard links (one in /tmp), a file held
// open, an abstract Unix socket listening, and a sleeping child. (A
// shared anonymous mapping: TestHostileForkSharedAnonymousMapping.)
const isolationSetup = `import ctypes, mmap, os, select, signal, socket, struct, subprocess, sys, time, errno as _errno
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
libc.shmat.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
KEY = 0x5eed
def _ok(r, what):
    if r == -1 or r is None or r == ctypes.c_void_p(-1).value:
        raise OSError(ctypes.get_errno(), what)
    return r
M0 = b'source'.ljust(10, b'-')
shmid = _ok(libc.shmget(KEY, 4096, 0o1000 | 0o600), 'shmget')
shm = _ok(libc.shmat(shmid, None, 0), 'shmat')
ctypes.memmove(shm, M0, 10)
msq = _ok(libc.msgget(KEY, 0o1000 | 0o600), 'msgget')
sem = _ok(libc.semget(KEY, 1, 0o1000 | 0o600), 'semget')
mfd = os.memfd_create('hostile-fork')
os.ftruncate(mfd, 4096)
os.pwrite(mfd, M0, 0)
mm = mmap.mmap(mfd, 4096)
open('/workspace/a.txt', 'w').write(M0.decode())
os.link('/workspace/a.txt', '/workspace/b.txt')
os.link('/workspace/a.txt', '/tmp/c.txt')
held = open('/workspace/held.txt', 'w+')
held.write(M0.decode())
held.flush()
lst = socket.socket(socket.AF_UNIX)
lst.bind('\0hostile-fork')
lst.listen()
lst.setblocking(False)
sleeper = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(3600)'])
time.sleep(0.2)
print('ready')`

// isolationWrite writes MARK (one per sandbox) into every shared-looking
// object, binds an abstract socket named after it, connects to the
// listener made before the fork, and starts a process with MARK in its
// command line; KILL set, it kills the sleeper's pid.
const isolationWrite = `M = os.environ['MARK'].encode().ljust(10, b'-')
ctypes.memmove(shm, M, 10)
shm2 = _ok(libc.shmat(_ok(libc.shmget(KEY, 4096, 0), 'shmget'), None, 0), 'shmat')
ctypes.memmove(shm2 + 100, M, 10)
os.pwrite(mfd, M, 0)
mm[100:110] = M
held.seek(0)
held.write(M.decode())
held.flush()
with open('/workspace/b.txt', 'r+') as f:
    f.seek(20)
    f.write(M.decode())
msg = ctypes.create_string_buffer(struct.pack('l', 1) + M)
_ok(libc.msgsnd(msq, msg, 10, 0), 'msgsnd')
class _sembuf(ctypes.Structure):
    _fields_ = [('num', ctypes.c_ushort), ('op', ctypes.c_short), ('flg', ctypes.c_short)]
_ok(libc.semop(sem, ctypes.byref(_sembuf(0, int(os.environ['SEMOP']), 0)), 1), 'semop')
mine = socket.socket(socket.AF_UNIX)
mine.bind(b'\0hostile-fork-' + os.environ['MARK'].encode())
mine.listen()
dialer = socket.socket(socket.AF_UNIX)
dialer.connect('\0hostile-fork')
marked = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(3600)', 'hostile-fork-mark-' + os.environ['MARK']])
if os.environ.get('KILL'):
    os.kill(sleeper.pid, signal.SIGTERM)
    sleeper.wait()
time.sleep(0.2)
print('written')`

// isolationRead prints, one "label value" line each, what this sandbox
// sees of those objects after every sandbox wrote its MARK.
const isolationRead = `def _c(a, n=10):
    return ctypes.string_at(a, n).decode(errors='replace').rstrip('-')
print('shm', _c(shm))
print('shm-by-key', _c(shm2 + 100))
print('memfd', os.pread(mfd, 10, 0).decode().rstrip('-'))
print('memfd-map', mm[100:110].decode().rstrip('-'))
held.seek(0)
print('held', held.read(10).rstrip('-'))
print('link-a', open('/workspace/a.txt').read()[:10].rstrip('-'), open('/workspace/a.txt').read()[20:30].rstrip('-'))
print('link-c', open('/tmp/c.txt').read()[:10].rstrip('-'), open('/tmp/c.txt').read()[20:30].rstrip('-'))
class _msqid(ctypes.Structure):
    _fields_ = [('perm', ctypes.c_byte * 48), ('stime', ctypes.c_long), ('rtime', ctypes.c_long), ('ctime', ctypes.c_long),
                ('cbytes', ctypes.c_ulong), ('qnum', ctypes.c_ulong), ('qbytes', ctypes.c_ulong), ('lspid', ctypes.c_int), ('lrpid', ctypes.c_int), ('pad', ctypes.c_byte * 16)]
ds = _msqid()
_ok(libc.msgctl(msq, 2, ctypes.byref(ds)), 'msgctl')
rb = ctypes.create_string_buffer(64)
got = []
while libc.msgrcv(msq, rb, 10, 0, 0o4000) >= 0:
    got.append(rb.raw[8:18].decode().rstrip('-'))
print('msgq', ds.qnum, ','.join(got))
print('sem', libc.semctl(sem, 0, 12))
pending = 0
while True:
    try:
        c, _ = lst.accept()
        pending += 1
    except BlockingIOError:
        break
print('listener-connections', pending)
for other in os.environ['OTHERS'].split(','):
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(b'\0hostile-fork-' + other.encode())
        print('abstract-' + other, 'connected')
    except OSError as e:
        print('abstract-' + other, _errno.errorcode.get(e.errno, e.errno))
print('sleeper', sleeper.poll())
marks, pidns = set(), set()
for p in os.listdir('/proc'):
    if not p.isdigit():
        continue
    try:
        for a in open('/proc/%s/cmdline' % p, 'rb').read().split(b'\0'):
            if a.startswith(b'hostile-fork-mark-'):
                marks.add(a[len(b'hostile-fork-mark-'):].decode())
        pidns.add(os.readlink('/proc/%s/ns/pid' % p))
    except OSError:
        pass
print('marks', ','.join(sorted(marks)))
print('pid-namespaces', len(pidns))`

// TestHostileForkIsolation forks a source holding objects that a careless
// copy would share (isolationSetup) into two copies; then each of the
// three writes its own mark into all of them (isolationWrite; copy0 also
// kills the sleeper's pid, which the three share as a number) and reads
// them back (isolationRead): each sees only its own mark, its own
// sleeper's fate, its own listener's connection, none of the others'
// abstract sockets or processes. Each copy's processes and files are its
// own host range's, and its view of its confinement is the source's.
func TestHostileForkIsolation(t *testing.T) {
	w := newForkWorld(t)
	func() {
		s := w.source(t, sandbox.Limits{Pids: 64})
		sourceView := w.view(t, s)
		if out := w.exec(t, s, isolationSetup, nil); !strings.HasSuffix(out, "ready\n") {
			t.Fatalf("setup: %q", out)
		}
		copies, err := w.fork(t, s, 2)
		if err != nil {
			t.Fatalf("Fork(2): %v", err)
		}
		defer w.closeAll(t, s, copies)
		all := map[string]*native.Sandbox{"source": s, "copy0": copies[0], "copy1": copies[1]}
		names := []string{"source", "copy0", "copy1"}
		sem := map[string]string{"source": "1", "copy0": "2", "copy1": "4"}
		for _, n := range names {
			env := map[string]string{"MARK": n, "SEMOP": sem[n]}
			if n == "copy0" {
				env["KILL"] = "1"
			}
			if out := w.exec(t, all[n], isolationWrite, env); out != "written\n" {
				t.Fatalf("%s: write: %q", n, out)
			}
		}
		for _, n := range names {
			var others []string
			for _, o := range names {
				if o != n {
					others = append(others, o)
				}
			}
			out := w.exec(t, all[n], isolationRead, map[string]string{"OTHERS": strings.Join(others, ",")})
			want := map[string]string{
				"shm": n, "shm-by-key": n, "memfd": n, "memfd-map": n, "held": n,
				"link-a": "source " + n, "link-c": "source " + n, "msgq": "1 " + n, "sem": sem[n],
				"listener-connections": "1", "sleeper": "None", "marks": n, "pid-namespaces": "1",
			}
			if n == "copy0" {
				want["sleeper"] = "-15"
			}
			for _, o := range others {
				want["abstract-"+o] = "ECONNREFUSED"
			}
			got := map[string]string{}
			for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
				k, v, _ := strings.Cut(l, " ")
				got[k] = v
			}
			for k, v := range want {
				if got[k] != v {
					t.Errorf("%s: %s is %q, want %q (what another wrote after the fork, or its state, reached it)", n, k, got[k], v)
				}
			}
			t.Logf("%s sees: %s", n, strings.ReplaceAll(strings.TrimSpace(out), "\n", "; "))
		}
		// On the host: pids apart, host users apart and their own.
		pids := map[int]string{}
		for _, n := range names {
			for _, p := range hostPids(t, all[n]) {
				if o, ok := pids[p]; ok {
					t.Errorf("host pid %d is in %s's cgroup and %s's", p, n, o)
				}
				pids[p] = n
			}
		}
		ranges := map[int]string{}
		root := w.hostRoot(t, s)
		ranges[root] = "source"
		checkHostIDs(t, "source", s, root)
		for i, c := range copies {
			w.checkCopy(t, fmt.Sprintf("copy%d", i), c, sourceView, ranges)
		}
	}()
	w.checkLeftovers(t)
}

// forkCase is a source planted to exploit the fork. root runs first, as
// the sandbox's root (a command; "" for none), then setup in the runner;
// check runs in the runner of the source and of each copy after the fork
// and must print the same there.
type forkCase struct {
	name   string
	limits sandbox.Limits
	before string // in the runner, before root
	root   string
	setup  string
	check  string
	// during, if set, runs in the source while the fork is under way.
	during string
	// loose: the check's answer is logged, not compared (see its case).
	loose string
}

// plantDir, before a root case's code, makes /planted: a directory of the
// sandbox's root, which it may write (not the workspace, the user's).
const plantDir = `import errno, os
os.makedirs('/planted', exist_ok=True)
os.chmod('/planted', 0o755)
def attempt(label, f, *a):
    try:
        f(*a)
        print(label, 'ok')
    except OSError as e:
        print(label, errno.errorcode.get(e.errno, e.errno))
`

var forkCases = []forkCase{
	{
		// A set-user-ID and set-group-ID root binary, a copy of python3
		// owned by the sandbox's root, one given a file capability (the
		// sandbox's root has no CAP_SETFCAP: refused) and a set-group-ID
		// directory. The sandbox user must stay itself running them, in a
		// copy as in the source.
		name: "setid_root_binaries",
		root: plantDir + `import shutil, struct
for n in ('suid', 'fcap'):
    shutil.copy('/usr/bin/python3', '/planted/' + n)
os.chmod('/planted/suid', 0o6755)
os.chmod('/planted/fcap', 0o755)
full = 0xffffffff
attempt('file capability', os.setxattr, '/planted/fcap', 'security.capability', struct.pack('<IIIII', 0x02000000 | 1, full, full, 0x3f, 0x3f))
os.mkdir('/planted/sgid-dir')
os.chmod('/planted/sgid-dir', 0o2777)
print('planted')`,
		check: `import os, subprocess
for n in ('suid', 'fcap'):
    st = os.stat('/planted/' + n)
    r = subprocess.run(['/planted/' + n, '-c', 'import os; print(os.getresuid(), os.getresgid(), [l.split()[1] for l in open("/proc/self/status") if l.startswith("CapEff")])'], capture_output=True, text=True)
    print(n, oct(st.st_mode), st.st_uid, st.st_gid, r.stdout.strip(), r.returncode)
print('fcap xattrs', os.listxattr('/planted/fcap'))
open('/planted/sgid-dir/f', 'w').close()
st = os.stat('/planted/sgid-dir/f')
print('sgid-dir', oct(os.stat('/planted/sgid-dir').st_mode), 'new file group', st.st_gid)
os.remove('/planted/sgid-dir/f')`,
	},
	{
		// ACLs naming other users and groups of the sandbox (1234,
		// 4321, the overflow id 65534, its root), a default ACL, user
		// attributes; and what the sandbox's root may not do (chown,
		// trusted.* and security.* attributes).
		name: "xattrs_and_acls",
		root: plantDir + `import errno, struct
def acl(*ents):
    return struct.pack('<I', 2) + b''.join(struct.pack('<HHI', *e) for e in ents)
U = 0xffffffff
open('/planted/acl.txt', 'w').write('acl')
os.setxattr('/planted/acl.txt', 'system.posix_acl_access', acl((1, 6, U), (2, 4, 1234), (2, 6, 65534), (4, 4, U), (8, 4, 4321), (0x10, 6, U), (0x20, 4, U)))
os.mkdir('/planted/acl-dir')
os.chmod('/planted/acl-dir', 0o777)
os.setxattr('/planted/acl-dir', 'system.posix_acl_default', acl((1, 7, U), (2, 7, 0), (4, 5, U), (8, 7, 0), (0x10, 7, U), (0x20, 7, U)))
attempt('chown to 2000:3000', os.chown, '/planted/acl.txt', 2000, 3000)
os.setxattr('/planted/acl.txt', 'user.note', b'x' * 200)
for name in ('trusted.evil', 'security.evil', 'security.selinux'):
    try:
        os.setxattr('/planted/acl.txt', name, b'1')
        print(name, 'set')
    except OSError as e:
        print(name, errno.errorcode[e.errno])`,
		check: `import os, struct
def _acl(p, a):
    v = os.getxattr(p, a)
    return [struct.unpack_from('<HHI', v, 4 + 8 * i) for i in range((len(v) - 4) // 8)]
st = os.stat('/planted/acl.txt')
print('owner', st.st_uid, st.st_gid)
print('access', _acl('/planted/acl.txt', 'system.posix_acl_access'))
print('default', _acl('/planted/acl-dir', 'system.posix_acl_default'))
print('attrs', sorted(os.listxattr('/planted/acl.txt')), len(os.getxattr('/planted/acl.txt', 'user.note')))
open('/planted/acl-dir/new', 'w').close()
print('inherited', _acl('/planted/acl-dir/new', 'system.posix_acl_access'))
os.remove('/planted/acl-dir/new')`,
	},
	{
		// Hard links: a file with 200 names across the workspace and
		// /tmp, and a directory tree of links to it.
		name: "hard_links",
		setup: `import os
open('/workspace/target', 'w').write('t' * 100)
os.makedirs('/workspace/links', exist_ok=True)
for i in range(100):
    os.link('/workspace/target', '/workspace/links/l%d' % i)
    os.link('/workspace/target', '/tmp/l%d' % i)
print('ready')`,
		check: `import os
ino = {os.stat(p).st_ino for p in ['/workspace/target'] + ['/workspace/links/l%d' % i for i in range(100)] + ['/tmp/l%d' % i for i in range(100)]}
print('nlink', os.stat('/workspace/target').st_nlink, 'inodes', len(ino))
with open('/tmp/l7', 'r+') as f:
    f.write('W')
print('through a link', open('/workspace/links/l50').read(2))
with open('/tmp/l7', 'r+') as f:
    f.write('t')`,
	},
	{
		// Huge sparse files (16 of the largest size the sandbox may
		// write, its disk: 1 GiB apparent on a 64 MiB disk) beside one of
		// 40 MiB of data: the copy's tmpfs has the source's size, and a
		// copy that wrote the holes out would not fit.
		name:   "sparse_and_full",
		limits: sandbox.Limits{Disk: 64 << 20},
		setup: `import os, resource
# The largest file the sandbox may write (RLIMIT_FSIZE: its disk).
big = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
for i in range(16):
    with open('/workspace/sparse%d' % i, 'wb') as f:
        f.truncate(big)
        f.seek(big // 2)
        f.write(b'middle')
with open('/workspace/data', 'wb') as f:
    for i in range(40):
        f.write(bytes([i + 1]) * (1 << 20))
print('ready')`,
		check: `import os, resource
big = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
for i in (0, 15):
    st = os.stat('/workspace/sparse%d' % i)
    f = open('/workspace/sparse%d' % i, 'rb')
    f.seek(big // 2)
    print('sparse', i, st.st_size == big, st.st_blocks * 512 <= 64 << 10, f.read(6))
print('apparent MiB', sum(os.stat('/workspace/sparse%d' % i).st_size for i in range(16)) >> 20)
def _data():
    d = open('/workspace/data', 'rb').read()
    return len(d), d[0], d[-1]
print('data', *_data())
sv = os.statvfs('/workspace')
print('disk', sv.f_blocks * sv.f_frsize, 'used MiB', (sv.f_blocks - sv.f_bfree) * sv.f_frsize >> 20)`,
	},
	{
		// Thousands of files (near the disk's inode limit).
		name:   "many_files",
		limits: sandbox.Limits{Disk: 64 << 20},
		setup: `import os
os.makedirs('/workspace/many', exist_ok=True)
for i in range(7000):
    open('/workspace/many/f%05d' % i, 'w').write(str(i))
print('ready')`,
		check: `import os
names = os.listdir('/workspace/many')
print('files', len(names), sum(int(open('/workspace/many/' + n).read()) for n in names))
sv = os.statvfs('/workspace')
print('inodes', sv.f_files)`,
	},
	{
		// Links pointing out: at the host's root through /proc, up the
		// tree, at files the supervisor reads, a loop; the copy is made
		// from them, never through them.
		name: "symlinks_out",
		root: plantDir + `links = {'/planted/proc1root': '/proc/1/root', '/planted/up': '../../../../../../..', '/planted/shadow': '/etc/shadow',
         '/tmp/selfroot': '/proc/self/root/..', '/planted/loop1': 'loop2', '/planted/loop2': 'loop1',
         '/planted/hostsecret': '/root', '/planted/etc': '/proc/1/root/etc', '/planted/dev': '/dev/sda'}
for l, target in links.items():
    os.symlink(target, l)
    os.lchown(l, 0, 0)
print('planted')`,
		check: `import os
for l in ('/planted/proc1root', '/planted/up', '/planted/shadow', '/tmp/selfroot', '/planted/loop1', '/planted/hostsecret', '/planted/etc', '/planted/dev'):
    st = os.lstat(l)
    print(l, os.readlink(l), st.st_uid)
for l in ('/planted/proc1root', '/planted/hostsecret', '/planted/etc'):
    try:
        print(l, 'lists', len(os.listdir(l)))
    except OSError as e:
        print(l, e.strerror)`,
	},
	{
		// The workspace replaced by a link to the host's root through
		// /proc/1/root (the user opens it to the sandbox's root, which
		// renames it): the copy's workspace is opened from its tmpfs
		// without following a link, so the fork fails or the copy's
		// Workspace is its own.
		name: "workspace_replaced",
		before: `import os
os.chmod('/workspace', 0o777)
open('/workspace/mine.txt', 'w').write('mine')`,
		root: `import os
os.rename('/workspace', '/ws-real')
os.symlink('/proc/1/root', '/workspace')
print('replaced')`,
		check: `import os
print(os.readlink('/workspace'), os.getcwd(), open('/ws-real/mine.txt').read())`,
	},
	{
		// FIFOs (one with a reader blocked in open), a socket file, a
		// whiteout (character device 0:0, which anyone may make), and a
		// device node it may not make.
		name: "fifos_and_devices",
		root: plantDir + `import errno, stat
os.mkfifo('/planted/fifo', 0o666)
os.chmod('/planted/fifo', 0o666)
os.mknod('/planted/whiteout', stat.S_IFCHR | 0o600, os.makedev(0, 0))
try:
    os.mknod('/planted/mem', stat.S_IFCHR | 0o666, os.makedev(1, 1))
    print('mknod mem ok')
except OSError as e:
    print('mknod mem', errno.errorcode[e.errno])
print('planted')`,
		setup: `import os, socket, subprocess, sys, time
blocked = subprocess.Popen([sys.executable, '-c', "open('/planted/fifo').read()"])
sockf = socket.socket(socket.AF_UNIX)
sockf.bind('/workspace/sock')
time.sleep(0.2)
print('ready')`,
		check: `import os, stat
for p in ('/planted/fifo', '/planted/whiteout', '/workspace/sock', '/planted/mem'):
    try:
        st = os.lstat(p)
        print(p, stat.filemode(st.st_mode), os.major(st.st_rdev), os.minor(st.st_rdev), st.st_uid)
    except OSError as e:
        print(p, e.strerror)
print('blocked', blocked.poll())`,
	},
	{
		// A file lock held (and a process waiting for it): CRIU may
		// refuse to dump it.
		name: "file_lock",
		setup: `import fcntl, subprocess, sys, time
lockf = open('/workspace/lock', 'w')
fcntl.flock(lockf, fcntl.LOCK_EX)
waiter = subprocess.Popen([sys.executable, '-c', 'import fcntl; fcntl.flock(open("/workspace/lock", "w"), fcntl.LOCK_EX)'])
time.sleep(0.3)
print('ready')`,
		check: `print('waiter', waiter.poll())`,
	},
	{
		// A fork storm, started before the fork and running through it:
		// one process forks children that exit at once, another hops
		// (forks and exits, so that its pid changes all the time and it
		// is always an orphan), as TestHostilePauseExitingProcesses's.
		// (A storm that retries failed forks without end takes the
		// sandbox to its memory limit in some 4 s, fork or not, and
		// the OOM killer ends it: its own doing.) This storm alone runs
		// for 15 s at some 22 MiB of its 128 MiB. It failed, before
		// the fix, in 2 of 10 runs here (others' tests loading the two cores): the
		// fork succeeds, but the source (or a
		// copy) is dead just after ("sandbox closed"; its cgroup holds 1
		// MiB): the memory cgroup's OOM killer, the group at its 128 MiB
		// during the dump or the restore, chose the sandbox's init
		// (dmesg: "Memory cgroup out of memory: Killed process N (exe)",
		// N the sandbox's init, of its host root), the largest task,
		// and the sandbox ends with it. Init's oom_score_adj is the
		// default (0); the supervisor could set it to -1000 so that the
		// OOM killer takes the sandbox's own processes instead. Seen
		// also in the pause suite's groups in the same dmesg.
		name: "fork_storm",
		// Memory enough for 64 Pythons: the storm is to be under way
		// during the fork, not to meet the memory limit, whose killer
		// would take the sandbox's own processes (the runner among them)
		// with or without a fork.
		limits: sandbox.Limits{Pids: 64, Memory: 512 << 20},
		setup: `import subprocess, sys
storm = subprocess.Popen([sys.executable, '-c', 'import os\nwhile True:\n    pid = os.fork()\n    if pid == 0:\n        os._exit(0)\n    os.waitpid(pid, 0)'])
subprocess.run([sys.executable, '-c', 'import os\nwhile True:\n    if os.fork():\n        os._exit(0)', 'hopper'])
print('ready')`,
		check: `print('storm', storm.poll())`,
		// Known: in some runs (3 of 10 here) the storm's Python exits 1
		// after the dump, in the source and so in its copies: the dump
		// (--leave-running) disturbs a process forking and waiting without
		// end; the cause is not found yet. What is checked then is what
		// matters here: the fork succeeds or fails cleanly, the copies are
		// confined as the source, nothing is left.
		loose: "the storm's process may have exited after the dump (cause not found)",
	},
}

// TestHostileForkHostileSource forks sources planted to exploit the fork
// (forkCases) into two copies each: the fork succeeds, and then each copy
// is confined as the source (its view, its host ids, its files' owners,
// ACLs and capabilities on the host) and answers the case's check as the
// source does; or the fork fails, the source goes on, and nothing of a
// copy is left.
func TestHostileForkHostileSource(t *testing.T) {
	w := newForkWorld(t)
	outcomes := map[string]string{}
	for _, c := range forkCases {
		t.Run(c.name, func(t *testing.T) {
			outcomes[c.name] = w.hostileSource(t, c)
		})
	}
	for _, c := range forkCases {
		t.Logf("%s: %s", c.name, outcomes[c.name])
	}
	w.checkLeftovers(t)
}

func (w *forkWorld) hostileSource(t *testing.T, c forkCase) string {
	s := w.source(t, override(sandbox.Limits{Disk: 16 << 20}, c.limits))
	defer w.close(t, s)
	sourceView := w.view(t, s)
	if c.before != "" {
		w.exec(t, s, c.before, nil)
	}
	if c.root != "" {
		t.Logf("planted as root: %s", strings.TrimSpace(w.asRoot(t, s, c.root)))
	}
	if c.setup != "" {
		if out := w.exec(t, s, c.setup, nil); !strings.HasSuffix(out, "ready\n") {
			t.Fatalf("setup: %q", out)
		}
	}
	want := w.exec(t, s, c.check, nil)
	t.Logf("source: %s", strings.ReplaceAll(strings.TrimSpace(want), "\n", "; "))
	before := hostPids(t, s)
	if c.name == "fork_storm" {
		time.Sleep(2 * time.Second) // the storm under way
	}
	start := time.Now()
	copies, err := w.fork(t, s, 2)
	took := time.Since(start).Round(time.Millisecond)
	if err != nil {
		t.Logf("Fork(2) failed after %v: %v", took, err)
		// Nothing of a copy: no cgroup but the source's, no checkpoint
		// directory, no process of another host user.
		if groups := testutil.CgroupsUnder(forkCgroupParent); len(groups) == 0 || !allOf(groups, s.ID()) {
			t.Errorf("cgroups after a failed fork: %v", groups)
		}
		if left, _ := checkpointsLeft(w.dir); len(left) > 0 {
			t.Errorf("checkpoint directories after a failed fork: %v", left)
		}
		root := w.hostRoot(t, s)
		var foreign []string
		for _, p := range w.newProcesses(int(forkUIDBase), int(forkUIDBase)+forkUIDRanges<<16) {
			if !ownedIn(p, root) {
				foreign = append(foreign, p)
			}
		}
		if len(foreign) > 0 {
			t.Errorf("processes of other host users after a failed fork: %v", describeProcs(foreign))
		}
		if got := w.exec(t, s, c.check, nil); got != want && c.name != "fork_storm" {
			t.Errorf("the source after a failed fork: %q, want %q", got, want)
		}
		return "refused: " + err.Error()
	}
	defer func() {
		for _, cp := range copies {
			w.close(t, cp)
		}
	}()
	t.Logf("Fork(2): %v (source's processes before: %d)", took, len(before))
	t.Logf("memory charged: the source %s; copy0 %s; copy1 %s", memoryOf(s), memoryOf(copies[0]), memoryOf(copies[1]))
	ranges := map[int]string{w.hostRoot(t, s): "source"}
	checkHostIDs(t, "source", s, w.hostRoot(t, s))
	for i, cp := range copies {
		name := fmt.Sprintf("copy%d", i)
		w.checkCopy(t, name, cp, sourceView, ranges)
		if got := settled(func() string { return w.exec(t, cp, c.check, nil) }, want); got != want && c.loose == "" {
			t.Errorf("%s: the case's check:\n%s\nthe source's:\n%s", name, got, want)
		} else if got != want {
			t.Logf("%s: the case's check: %q, the source's before %q: %s", name, got, want, c.loose)
		}
		if got, want := workspaceList(cp), workspaceList(s); got != want {
			t.Errorf("%s: its Workspace lists %s; the source's %s", name, got, want)
		}
	}
	if got := settled(func() string { return w.exec(t, s, c.check, nil) }, want); got != want && c.loose == "" {
		t.Errorf("the source after the fork:\n%s\nwant:\n%s", got, want)
	} else if got != want {
		t.Logf("the source after the fork: %q, before %q: %s", got, want, c.loose)
	}
	return "forked"
}

// workspaceList is what s's Workspace (the files API's) lists at its
// top, or its error.
func workspaceList(s *native.Sandbox) string {
	ents, err := s.Workspace().ReadDir(".", 1)
	if err != nil {
		return "error: " + err.Error()
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Path)
	}
	sort.Strings(names)
	return strings.Join(names, " ")
}

// memoryOf is what the memory controller charges s's group (cgroup v1:
// usage, then the shmem (its files), cache and rss of memory.stat).
func memoryOf(s *native.Sandbox) string {
	g := filepath.Join("/sys/fs/cgroup/memory", forkCgroupParent, s.ID())
	b, err := os.ReadFile(filepath.Join(g, "memory.usage_in_bytes"))
	if err != nil {
		return "?"
	}
	n, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	out := fmt.Sprintf("%d MiB", n>>20)
	st, _ := os.ReadFile(filepath.Join(g, "memory.stat"))
	for _, l := range strings.Split(string(st), "\n") {
		k, v, _ := strings.Cut(l, " ")
		if k == "total_shmem" || k == "total_cache" || k == "total_rss" {
			n, _ := strconv.ParseInt(v, 10, 64)
			out += fmt.Sprintf(" %s %d MiB", strings.TrimPrefix(k, "total_"), n>>20)
		}
	}
	return out
}

// allOf: every group is the sandbox id's.
func allOf(groups []string, id string) bool {
	for _, g := range groups {
		if filepath.Base(g) != id {
			return false
		}
	}
	return true
}

// ownedIn: process p (as testutil lists it, "... uid U)") is of host
// users [root, root+65536).
func ownedIn(p string, root int) bool {
	_, rest, ok := strings.Cut(p, "uid ")
	if !ok {
		return false
	}
	u, err := strconv.Atoi(strings.TrimRight(rest, ")"))
	return err == nil && u >= root && u < root+forkRangeSize
}

// rootFSProbe is what the sandbox's root tries against its root file
// systems: their statfs flags and sizes, their mount options, remounts,
// unmounts, mode and owner changes of mount points and of the root, and
// filling the disk. Run as root in the source and in a copy: the outputs
// must be the same.
const rootFSProbe = `import ctypes, errno, os, stat
libc = ctypes.CDLL(None, use_errno=True)
def attempt(label, f):
    try:
        f()
        print(label, 'ok')
    except OSError as e:
        print(label, errno.errorcode.get(e.errno, e.errno))
def _sys(r):
    if r != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
for p in ('/', '/workspace', '/tmp', '/dev/shm'):
    sv = os.statvfs(p)
    print('statvfs', p, 'flags', sv.f_flag, 'bytes', sv.f_blocks * sv.f_frsize, 'inodes', sv.f_files)
for l in open('/proc/self/mountinfo'):
    pre, post = l.split(' - ')
    f, g = pre.split(), post.split()
    if f[4] in ('/', '/workspace', '/tmp', '/dev/shm'):
        print('mount', f[4], f[5], g[0], ','.join(sorted(o for o in g[2].split(',') if not o.startswith(('uid=', 'gid=')))))
st = os.stat('/')
print('root dir', oct(st.st_mode), st.st_uid, st.st_gid)
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND = 1, 2, 4, 32, 4096
attempt('remount / suid,dev', lambda: _sys(libc.mount(b'none', b'/', None, MS_REMOUNT, None)))
attempt('remount / bind', lambda: _sys(libc.mount(b'none', b'/', None, MS_REMOUNT | MS_BIND, None)))
attempt('remount /workspace', lambda: _sys(libc.mount(b'none', b'/workspace', None, MS_REMOUNT, b'size=1g')))
attempt('bind / on /tmp', lambda: _sys(libc.mount(b'/', b'/tmp', None, MS_BIND, None)))
attempt('tmpfs on /tmp', lambda: _sys(libc.mount(b'tmpfs', b'/tmp', b'tmpfs', 0, None)))
for p in ('/usr', '/proc', '/dev', '/'):
    attempt('umount ' + p, lambda: _sys(libc.umount2(p.encode(), 2)))
for p in ('/', '/usr', '/proc', '/dev', '/workspace', '/tmp'):
    mode = stat.S_IMODE(os.stat(p).st_mode)
    attempt('chmod ' + p, lambda: os.chmod(p, 0o777))
    try:
        os.chmod(p, mode)
    except OSError:
        pass
for p in ('/', '/workspace'):
    s0 = os.stat(p)
    attempt('chown ' + p, lambda: os.chown(p, 1000, 1000))
    try:
        os.chown(p, s0.st_uid, s0.st_gid)
    except OSError:
        pass
for p in ('/usr', '/proc', '/dev'):
    attempt('rmdir ' + p, lambda: os.rmdir(p))
    attempt('rename ' + p, lambda: os.rename(p, p + '.x'))
attempt('mknod null', lambda: os.mknod('/tmp/null', stat.S_IFCHR | 0o666, os.makedev(1, 3)))
open('/tmp/x', 'w').close()
attempt('trusted xattr', lambda: os.setxattr('/tmp/x', 'trusted.x', b'1'))
attempt('security xattr', lambda: os.setxattr('/tmp/x', 'security.x', b'1'))
FS_IOC_SETFLAGS = 0x40086602
flags = ctypes.c_int(0x10)  # immutable
fd = os.open('/tmp/x', os.O_RDONLY)
attempt('chattr +i', lambda: _sys(libc.ioctl(fd, FS_IOC_SETFLAGS, ctypes.byref(flags))))
os.close(fd)
os.remove('/tmp/x')
written, err = 0, None
with open('/tmp/fill', 'wb') as f:
    try:
        while True:
            f.write(b'f' * (1 << 20))
            f.flush()
            written += 1 << 20
    except OSError as e:
        err = errno.errorcode[e.errno]
print('fill', err, 'MiB', written >> 20)
os.remove('/tmp/fill')
n = 0
try:
    os.mkdir('/tmp/inodes')
    while True:
        open('/tmp/inodes/%d' % n, 'w').close()
        n += 1
except OSError as e:
    print('inodes', errno.errorcode[e.errno], n // 100 * 100)
for i in range(n):
    os.remove('/tmp/inodes/%d' % i)
os.rmdir('/tmp/inodes')`

// TestHostileForkRootFS runs rootFSProbe as the sandbox's root, and its
// disk-filling part as the sandbox user, in a source and in its copy:
// the copy's root tmpfs is mounted by the supervisor (its superblock the
// host user namespace's), the source's by the sandbox's init (its own
// user namespace's). Whatever that changes, it must not let a copy's
// root do to its file systems what the source's could not, nor change
// their flags (nosuid, nodev), sizes or inode limits.
func TestHostileForkRootFS(t *testing.T) {
	w := newForkWorld(t)
	func() {
		s := w.source(t, sandbox.Limits{Disk: 16 << 20})
		copies, err := w.fork(t, s, 1)
		if err != nil {
			t.Fatalf("Fork(1): %v", err)
		}
		defer w.closeAll(t, s, copies)
		c := copies[0]
		probe := func(sb *native.Sandbox, user string) string {
			out, errOut, code := w.command(t, sb, user, rootFSProbe)
			if code != 0 {
				t.Errorf("the probe as %s: exit %d: %s", user, code, errOut)
			}
			return out
		}
		for _, user := range []string{sandbox.UserRoot, sandbox.UserSandbox} {
			src, cp := probe(s, user), probe(c, user)
			t.Logf("as %s, in the source:\n%s", user, src)
			sl, cl := strings.Split(src, "\n"), strings.Split(cp, "\n")
			if len(sl) != len(cl) {
				t.Errorf("as %s, the copy's probe:\n%s", user, cp)
				continue
			}
			for i := range sl {
				if sl[i] != cl[i] {
					t.Errorf("as %s: the source: %q; the copy: %q", user, sl[i], cl[i])
				}
			}
		}
		// Both still run.
		for _, sb := range []*native.Sandbox{s, c} {
			if got := w.exec(t, sb, "import os\nprint(os.path.exists('/usr/bin/python3'), os.path.isdir('/proc/self'), os.path.exists('/dev/null'))", nil); got != "True True True\n" {
				t.Errorf("%s after the probe: %q", sb.ID(), got)
			}
		}
	}()
	w.checkLeftovers(t)
}

// TestHostileForkSharedAnonymousMapping forks a sandbox whose runner
// shares an anonymous mapping (mmap MAP_SHARED|MAP_ANONYMOUS, as
// Python's mmap.mmap(-1, n, flags=MAP_SHARED)) with a child that mirrors
// it into a file: the fork must succeed and what a copy writes there
// reach its own child only, or the fork be refused as unsupported. Fails
// today: such a mapping is shmem the kernel names "/dev/zero (deleted)"
// in /proc/PID/map_files, and collectFiles
// (internal/backend/native/checkpoint_linux.go; sandboxMemory knows
// memfds and SysV segments only) takes it for a host file held by a
// process other than init ("checkpoint: process N of the sandbox holds
// /dev/zero (deleted), a file outside it"): a sandbox using one can be
// neither forked nor paused, and is told so wrongly.
func TestHostileForkSharedAnonymousMapping(t *testing.T) {
	w := newForkWorld(t)
	func() {
		s := w.source(t, sandbox.Limits{})
		defer w.close(t, s)
		w.exec(t, s, `import mmap, os, time
anon = mmap.mmap(-1, 4096, flags=mmap.MAP_SHARED)
anon[0:10] = b'source----'
mirror = os.fork()
if mirror == 0:
    while True:
        open('/tmp/anon.tmp', 'wb').write(bytes(anon[0:10]))
        os.rename('/tmp/anon.tmp', '/tmp/anon')
        time.sleep(0.02)
time.sleep(0.2)`, nil)
		copies, err := w.fork(t, s, 2)
		if errors.Is(err, sandbox.ErrUnsupported) {
			t.Logf("refused as unsupported: %v", err)
			return
		}
		if err != nil {
			t.Errorf("the fork failed, taking the sandbox's own memory for a host file: %v", err)
			return
		}
		defer func() {
			for _, c := range copies {
				w.close(t, c)
			}
		}()
		all := append([]*native.Sandbox{s}, copies...)
		for i, sb := range all {
			w.exec(t, sb, fmt.Sprintf("anon[0:10] = b'%-10s'.replace(b' ', b'-')", fmt.Sprint("m", i)), nil)
		}
		for i, sb := range all {
			want := fmt.Sprintf("m%d\n", i)
			// The child mirrors the mapping every 20 ms.
			read := func() string { return w.exec(t, sb, "print(open('/tmp/anon', 'rb').read().decode().rstrip('-'))", nil) }
			if got := settled(read, want); got != want {
				t.Errorf("sandbox %d (0 the source): its child sees %q in the shared mapping, want %q", i, got, want)
			}
		}
	}()
	w.checkLeftovers(t)
}
