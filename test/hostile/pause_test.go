//go:build linux

package hostile

// Hostile code against pause and resume (sandbox.Pauser, issue 15) on the
// native backend, with CRIU: attacker programs leave their processes in
// states that are hard to dump (undumpable, forking without end, blocked
// on a FIFO, zombies, daemons in sessions of their own, thousands of fds
// and mappings, kernel objects CRIU must know about, file locks), then the
// sandbox is paused and resumed several times. Each pause either succeeds
// and the resume brings everything back, or fails with a clear error and
// leaves the sandbox running; no call hangs, the sandbox's view of its
// confinement is the same before and after, the host's secret stays out
// of reach, the checkpoint images are out of every sandbox's reach and
// readable by the sandbox's own host root group alone, a paused sandbox
// at its memory limit writes about that much and no more, and Close of a
// paused sandbox leaves nothing on the host.
//
// The suite makes its own backend (a cgroup parent, host users and a
// checkpoint directory of its own), apart from TestHostile's: of classic
// sandboxes in the first run, of sandboxes forked from a zygote with the
// server's preloads (the pool's) in the zygote run (ofKind). Every case
// runs on a sandbox and on a copy of it (Fork), both paused and resumed
// again and again: restored trees.

import (
	"bufio"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vivarium-sandbox/vivarium/internal/backend/native"
	"github.com/vivarium-sandbox/vivarium/internal/criu"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/testutil"
)

const (
	pauseCgroupParent = "vivarium-hostile-pause-test"
	pauseUIDBase      = native.DefaultUIDBase + 30<<24
	pauseUIDRanges    = 16
	// pauseCallLimit bounds each Pause, Resume, Execute and Close: a
	// call that has not returned pauseHangGrace after it hangs.
	pauseCallLimit = 2 * time.Minute
	pauseHangGrace = 30 * time.Second
	// pauseRounds: pauses and resumes per case, before the last pause
	// that Close ends.
	pauseRounds = 2
)

// serverPreload is what vivarium serve's zygote imports by default.
var serverPreload = []string{"numpy", "pandas", "matplotlib"}

// ofKind is cfg for the sandboxes of this run (testutil.RunBothModes):
// classic ones, or in the zygote run, forked from a zygote with the
// server's preloads, as vivarium serve makes them (the pool's).
func ofKind(t *testing.T, cfg native.Config) native.Config {
	if testutil.ZygoteMode() {
		testutil.RequirePythonModules(t, serverPreload...)
		cfg.Zygote, cfg.Preload = true, serverPreload
	}
	return cfg
}

// pauseWorld is the backend the pause cases share, and the canaries.
type pauseWorld struct {
	b        *native.Backend
	dir      string // the backend's CheckpointDir
	canaries *testutil.Canaries
	// procs are the suite's host users' processes when the test began:
	// zombies an earlier test's failed resumes left in this process are
	// not this test's.
	procs map[string]bool
	// pausable: sandboxes are made Pausable, and so, with the backend's
	// pause base (newPauseWorldWithBase), from the fixed point, and kept
	// against the base.
	pausable bool
}

// pauseCase is one attack on pause and resume. setup leaves the attack in
// place (processes, kernel objects) and prints "ready" last; check prints
// what must be the same before the first pause and after every resume (or
// refused pause): the attack's state, as it sees it.
type pauseCase struct {
	name   string
	limits sandbox.Limits
	setup  string
	check  string
}

// pauseCases are the processes and kernel objects that make a tree hard
// to dump. Each check's output is compared, whole, before and after.
// Processes that fork without end are TestHostilePauseExitingProcesses,
// and memfd and SysV shm are TestHostilePauseSharedMemory too: both fail
// today, on bugs of the native backend.
var pauseCases = []pauseCase{
	{
		// Undumpable processes: the runner itself and a child.
		name: "undumpable",
		setup: `import ctypes, os, subprocess, sys
libc = ctypes.CDLL(None, use_errno=True)
undumpable = subprocess.Popen([sys.executable, '-c', 'import ctypes, time; ctypes.CDLL(None).prctl(4, 0, 0, 0, 0); print("set", flush=True); time.sleep(3600)'], stdout=subprocess.PIPE)
undumpable.stdout.readline()
print('prctl', libc.prctl(4, 0, 0, 0, 0))
print('ready')`,
		// An undumpable process's /proc directory belongs to root.
		check: `print('runner dumpable', libc.prctl(3, 0, 0, 0, 0), 'owner', os.stat('/proc/self').st_uid)
print('child', undumpable.poll(), 'owner', os.stat('/proc/%d' % undumpable.pid).st_uid)`,
	},
	{
		// Blocked on FIFOs: one process in open() (no writer ever comes),
		// one in read() of a FIFO the runner holds open read-write.
		name: "fifo_blocked",
		setup: `import os, subprocess, sys, time
os.mkfifo('/tmp/fifo-open')
opener = subprocess.Popen([sys.executable, '-c', "open('/tmp/fifo-open').read()"])
os.mkfifo('/tmp/fifo-read')
fifo_fd = os.open('/tmp/fifo-read', os.O_RDWR)
reader = subprocess.Popen([sys.executable, '-c', 'import os, sys; os.read(int(sys.argv[1]), 1)', str(fifo_fd)], pass_fds=[fifo_fd])
def _state(pid):
    return open('/proc/%d/stat' % pid).read().rsplit(')', 1)[1].split()[0]
def _wchan(pid):
    return open('/proc/%d/wchan' % pid).read()
for _ in range(100):
    if _wchan(opener.pid) not in ('0', '') and _wchan(reader.pid) not in ('0', ''):
        break
    time.sleep(0.05)
print('ready')`,
		check: `print('opener', opener.poll(), _state(opener.pid), 'reader', reader.poll(), _state(reader.pid))`,
	},
	{
		// A zombie: a child of the runner that exited and is never
		// waited for.
		name: "zombie",
		setup: `import os, time
zpid = os.fork()
if zpid == 0:
    os._exit(7)
time.sleep(0.5)
print('ready')`,
		check: `print('zombie', open('/proc/%d/stat' % zpid).read().rsplit(')', 1)[1].split()[0])`,
	},
	{
		// A daemon: setsid and a double fork, so that the leader of its
		// session is gone and its parent is init.
		name: "setsid_double_fork",
		setup: `import os, subprocess, sys, time
subprocess.run([sys.executable, '-c', 'import os, time\nif os.fork():\n    os._exit(0)\nos.setsid()\nif os.fork():\n    os._exit(0)\nopen("/tmp/daemon.pid.tmp", "w").write(str(os.getpid()))\nos.rename("/tmp/daemon.pid.tmp", "/tmp/daemon.pid")\ntime.sleep(3600)'])
for _ in range(200):
    if os.path.exists('/tmp/daemon.pid'):
        break
    time.sleep(0.05)
daemon = int(open('/tmp/daemon.pid').read())
# Its session's leader, the middle process, once reaped by init.
for _ in range(200):
    if not os.path.exists('/proc/%d' % os.getsid(daemon)):
        break
    time.sleep(0.05)
def _stat(pid):
    return open('/proc/%d/stat' % pid).read().rsplit(')', 1)[1].split()
print('ready')`,
		// state, ppid, session: the daemon is its session's only member,
		// its leader gone.
		check: `st = _stat(daemon)
print('daemon', st[0], 'orphan', st[1] != str(os.getpid()), 'own session', os.getsid(daemon) != os.getsid(0), 'leader gone', not os.path.exists('/proc/%d' % os.getsid(daemon)))`,
	},
	{
		// A process in a session of its own that ignores SIGTERM and
		// SIGHUP (and was sent SIGTERM), as a process that means to
		// outlive its sandbox would.
		name: "sigterm_immune",
		setup: `import os, signal, subprocess, sys, time
immune = subprocess.Popen([sys.executable, '-c', 'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); signal.signal(signal.SIGHUP, signal.SIG_IGN); print("set", flush=True); time.sleep(3600)'], start_new_session=True, stdout=subprocess.PIPE)
immune.stdout.readline()
os.kill(immune.pid, signal.SIGTERM)
time.sleep(0.2)
print('ready')`,
		check: `print('immune', immune.poll(), 'session leader', os.getsid(immune.pid) == immune.pid)`,
	},
	{
		// A stopped process (SIGSTOP).
		name: "stopped",
		setup: `import os, signal, subprocess, time
stopped = subprocess.Popen(['sleep', '3600'])
os.kill(stopped.pid, signal.SIGSTOP)
time.sleep(0.3)
print('ready')`,
		check: `print('stopped', open('/proc/%d/stat' % stopped.pid).read().rsplit(')', 1)[1].split()[0])`,
	},
	{
		// Thousands of mappings (alternate protections so that none
		// merge, the writable ones filled) and over 200 open fds: pipes
		// each holding a byte.
		name:   "many_fds_and_mappings",
		limits: sandbox.Limits{Memory: 256 << 20},
		setup: `import array, ctypes, fcntl, os, termios
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
maps = []
for i in range(16000):
    prot = 3 if i % 2 == 0 else 1
    a = libc.mmap(None, 4096, prot, 0x22, -1, 0)
    if a is None or a == ctypes.c_void_p(-1).value:
        raise OSError(ctypes.get_errno(), 'mmap %d' % i)
    if prot == 3:
        ctypes.memset(a, i % 251 + 1, 4096)
    maps.append(a)
pipes = []
for i in range(110):
    r, w = os.pipe()
    os.write(w, b'x')
    pipes.append((r, w))
def _pending(fd):
    b = array.array('i', [0])
    fcntl.ioctl(fd, termios.FIONREAD, b)
    return b[0]
print('ready')`,
		check: `print('maps', sum(1 for _ in open('/proc/self/maps')) >= 16000, sum(ctypes.c_ubyte.from_address(a).value for a in maps[::2]))
print('fds', len(os.listdir('/proc/self/fd')) >= 220, sum(_pending(r) for r, w in pipes))`,
	},
	{
		// A memfd, written and mapped shared.
		name: "memfd",
		setup: `import mmap, os
mfd = os.memfd_create('hostile-memfd')
os.write(mfd, b'memfd-state ' * 100000)
mm = mmap.mmap(mfd, 0)
mm[0:5] = b'MEMFD'
print('ready')`,
		check: `print(os.pread(mfd, 12, 0), os.fstat(mfd).st_size, mm[0:12], os.readlink('/proc/self/fd/%d' % mfd))`,
	},
	{
		// A SysV shared memory segment, attached.
		name: "sysv_shm",
		setup: `import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
libc.shmat.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
libc.shmdt.argtypes = [ctypes.c_void_p]
shmid = libc.shmget(0, 1 << 20, 0o1000 | 0o600)
if shmid < 0:
    raise OSError(ctypes.get_errno(), 'shmget')
shm = libc.shmat(shmid, None, 0)
if shm is None or shm == ctypes.c_void_p(-1).value:
    raise OSError(ctypes.get_errno(), 'shmat')
ctypes.memmove(shm, b'sysv-state', 10)
print('ready')`,
		check: `a2 = libc.shmat(shmid, None, 0)
print('segment', shmid >= 0, ctypes.string_at(shm, 10), ctypes.string_at(a2, 10) if a2 not in (None, ctypes.c_void_p(-1).value) else 'shmat failed')
libc.shmdt(a2)`,
	},
	{
		// An inotify watch on a directory of the workspace: after each
		// resume a new file there must still raise an event.
		name: "inotify",
		setup: `import ctypes, os, select, struct
libc = ctypes.CDLL(None, use_errno=True)
ino = libc.inotify_init1(0)
if ino < 0:
    raise OSError(ctypes.get_errno(), 'inotify_init1')
os.makedirs('watched', exist_ok=True)
wd = libc.inotify_add_watch(ino, os.path.abspath('watched').encode(), 0x100)
if wd < 0:
    raise OSError(ctypes.get_errno(), 'inotify_add_watch')
ino_round = 0
print('ready')`,
		check: `ino_round += 1
open('watched/f%d' % ino_round, 'w').close()
r, _, _ = select.select([ino], [], [], 5)
buf = os.read(ino, 4096) if r else b''
ewd, emask, _, elen = struct.unpack('iIII', buf[:16]) if buf else (0, 0, 0, 0)
print('event', bool(r), ewd == wd, emask & 0x100 != 0, buf[16:16 + elen].rstrip(b'\0') == b'f%d' % ino_round)`,
	},
	{
		// Pending signals: blocked SIGUSR1 and SIGRTMIN sent to a process
		// and never delivered.
		name: "pending_signal",
		setup: `import os, subprocess, sys
pender = subprocess.Popen([sys.executable, '-c', 'import os, signal, time; signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1, signal.SIGRTMIN}); os.kill(os.getpid(), signal.SIGUSR1); os.kill(os.getpid(), signal.SIGRTMIN); print("set", flush=True); time.sleep(3600)'], stdout=subprocess.PIPE)
pender.stdout.readline()
def _sig(pid):
    st = dict(l.split(':', 1) for l in open('/proc/%d/status' % pid) if ':' in l)
    return {k: st[k].strip() for k in ('ShdPnd', 'SigBlk')}
print('ready')`,
		check: `print('pender', pender.poll(), _sig(pender.pid))`,
	},
	{
		// An eventfd holding a count, and an armed periodic timerfd.
		name: "timerfd_eventfd",
		setup: `import ctypes, os
efd = os.eventfd(41)
libc = ctypes.CDLL(None, use_errno=True)
class _ts(ctypes.Structure):
    _fields_ = [('s', ctypes.c_long), ('ns', ctypes.c_long)]
class _its(ctypes.Structure):
    _fields_ = [('interval', _ts), ('value', _ts)]
tfd = libc.timerfd_create(1, 0)
if tfd < 0 or libc.timerfd_settime(tfd, 0, ctypes.byref(_its(_ts(3600, 0), _ts(3600, 0))), None) != 0:
    raise OSError(ctypes.get_errno(), 'timerfd')
print('ready')`,
		check: `v = os.eventfd_read(efd)
os.eventfd_write(efd, v)
cur = _its()
libc.timerfd_gettime(tfd, ctypes.byref(cur))
print('eventfd', v, 'timer interval', cur.interval.s, 'armed', 0 < cur.value.s <= 3600)`,
	},
	{
		// File locks: an flock and a POSIX lock held, and a process
		// waiting for the flock.
		name: "file_locks",
		setup: `import fcntl, subprocess, sys, time
lockf = open('lock', 'w')
fcntl.flock(lockf, fcntl.LOCK_EX)
posixf = open('posixlock', 'w')
fcntl.lockf(posixf, fcntl.LOCK_EX)
waiter = subprocess.Popen([sys.executable, '-c', 'import fcntl; fcntl.flock(open("lock", "w"), fcntl.LOCK_EX)'])
time.sleep(0.3)
_try = 'import fcntl, sys\ntry:\n    fcntl.flock(open("lock", "w"), fcntl.LOCK_EX | fcntl.LOCK_NB)\nexcept BlockingIOError:\n    sys.exit(1)'
print('ready')`,
		check: `print('waiter', waiter.poll(), 'held', subprocess.run([sys.executable, '-c', _try]).returncode)`,
	},
	{
		// Files open and deleted: CRIU saves their contents (ghost files)
		// with the images, up to its ghost limit (1 MiB by default). One
		// of 512 KiB, one of 4 MiB.
		name: "deleted_open_files",
		setup: `import os
small = open('small.bin', 'w+b')
small.write(b's' * (512 << 10))
small.flush()
os.unlink('small.bin')
big = open('big.bin', 'w+b')
big.write(b'b' * (4 << 20))
big.flush()
os.unlink('big.bin')
print('ready')`,
		check: `print('small', os.pread(small.fileno(), 4, 1000), os.fstat(small.fileno()).st_size, 'big', os.pread(big.fileno(), 4, 1000), os.fstat(big.fileno()).st_size)`,
	},
	{
		// A process whose working directory was removed. It says where
		// its working directory is itself: in a restored sandbox forked
		// from a zygote, each process is in a Landlock domain of its own
		// (landlock_domains), and Landlock lets none read another's
		// /proc/PID/cwd.
		name: "deleted_cwd",
		setup: `import os, subprocess, sys, time
os.makedirs('gone', exist_ok=True)
homeless = subprocess.Popen([sys.executable, '-c', 'import os, sys\nfor _ in sys.stdin:\n    print(os.readlink("/proc/self/cwd"), flush=True)'],
                            cwd='gone', stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
time.sleep(0.2)
os.rmdir('gone')
def _cwd():
    homeless.stdin.write('?\n')
    homeless.stdin.flush()
    return homeless.stdout.readline().strip()
print('ready')`,
		check: `print('homeless', homeless.poll(), _cwd())`,
	},
	{
		// The Landlock domains the sandbox's processes are in, each as
		// it sees itself: the runner, a process it forked, one it
		// started (a new program), and a thread of it. A runner forked
		// from a zygote is confined with Landlock before it runs any
		// code (runner/landlock.py), and so is all it makes; CRIU saves
		// no domain, and a restore must give each one back.
		name: "landlock_domains",
		setup: layersCode + `import os, subprocess, sys, threading
def _pair():
    a, b = os.pipe()
    c, d = os.pipe()
    return (a, d), (c, b)  # theirs (read, write), ours (read, write)
def _ask(ours):
    os.write(ours[1], b'?')
    return os.read(ours[0], 16).decode().strip()
theirs, forked = _pair()
if os.fork() == 0:
    _serve(*theirs)
    os._exit(0)
theirs, started = _pair()
subprocess.Popen([sys.executable, '-c', _layers_src + '_serve(%d, %d)' % theirs], pass_fds=theirs)
theirs, threaded = _pair()
threading.Thread(target=_serve, args=theirs, daemon=True).start()
print('ready')`,
		check: `print('runner', _layers(), 'forked', _ask(forked), 'started', _ask(started), 'thread', _ask(threaded))`,
	},
	{
		// Unix sockets listening, on a path and in the abstract
		// namespace, one connection accepted with data queued each way.
		name: "unix_listeners",
		setup: `import os, socket
lpath = socket.socket(socket.AF_UNIX)
lpath.bind(os.path.abspath('listen.sock'))
lpath.listen()
labs = socket.socket(socket.AF_UNIX)
labs.bind('\0hostile-pause')
labs.listen()
cli = socket.socket(socket.AF_UNIX)
cli.connect('\0hostile-pause')
srv, _ = labs.accept()
cli.sendall(b'to-server')
srv.sendall(b'to-client')
unix_round = 0
print('ready')`,
		check: `unix_round += 1
c1 = socket.socket(socket.AF_UNIX)
c1.connect(os.path.abspath('listen.sock'))
a1, _ = lpath.accept()
c1.sendall(b'round%d' % unix_round)
got1 = a1.recv(16)
c2 = socket.socket(socket.AF_UNIX)
c2.connect('\0hostile-pause')
a2, _ = labs.accept()
c2.sendall(b'round%d' % unix_round)
got2 = a2.recv(16)
for x in (c1, a1, c2, a2):
    x.close()
cli.setblocking(False)
srv.setblocking(False)
print('path', got1 == b'round%d' % unix_round, 'abstract', got2 == b'round%d' % unix_round, 'queued', srv.recv(64, socket.MSG_PEEK), cli.recv(64, socket.MSG_PEEK))`,
	},
	{
		// Threads: twenty in the runner, blocked on an event.
		name: "threads",
		setup: `import threading
stop = threading.Event()
threads = [threading.Thread(target=stop.wait, daemon=True) for _ in range(20)]
for th in threads:
    th.start()
print('ready')`,
		check: `print('threads alive', sum(th.is_alive() for th in threads), 'tasks', len(os.listdir('/proc/self/task')) >= 21)
import os`,
	},
	{
		// A process floods stderr, the supervisor's pipe, without pause.
		name: "stderr_flood",
		setup: `import subprocess, sys
flooder = subprocess.Popen([sys.executable, '-c', 'import sys\nwhile True:\n    sys.stderr.write("flood " * 1000 + "\\n")'])
print('ready')`,
		check: `print('flooder', flooder.poll())`,
	},
	{
		// A process that stacked a seccomp filter of its own on the
		// sandbox's: getppid answers EPERM. What it answers keeps coming
		// to a file; both filters must hold after a resume.
		name: "own_seccomp_filter",
		setup: `import os, subprocess, sys, time
filtered = subprocess.Popen([sys.executable, '-c', """
import ctypes, os, struct, time
libc = ctypes.CDLL(None, use_errno=True)
NR_getppid = 110 if os.uname().machine == 'x86_64' else 173
# load the syscall number; if getppid, ERRNO(EPERM), else ALLOW
prog = [(0x20, 0, 0, 0), (0x15, 0, 1, NR_getppid), (0x06, 0, 0, 0x00050001), (0x06, 0, 0, 0x7fff0000)]
buf = ctypes.create_string_buffer(b''.join(struct.pack('HBBI', *i) for i in prog))
fprog = struct.pack('HxxxxxxQ', len(prog), ctypes.addressof(buf))
fp = ctypes.create_string_buffer(fprog)
if libc.prctl(22, 2, fp, 0, 0) != 0:
    raise OSError(ctypes.get_errno(), 'seccomp')
while True:
    # glibc returns the raw answer: -EPERM is -1
    r = 'denied' if os.getppid() == -1 else 'allowed'
    open('/tmp/ppid.tmp', 'w').write(r)
    os.rename('/tmp/ppid.tmp', '/tmp/ppid')
    time.sleep(0.05)
"""])
for _ in range(100):
    if os.path.exists('/tmp/ppid'):
        break
    time.sleep(0.05)
def _filters(pid):
    return [l.split()[1] for l in open('/proc/%d/status' % pid) if l.startswith('Seccomp_filters')]
print('ready')`,
		check: `os.remove('/tmp/ppid')
for _ in range(100):
    if os.path.exists('/tmp/ppid'):
        break
    time.sleep(0.05)
print('filtered', filtered.poll(), open('/tmp/ppid').read(), 'filters', _filters(filtered.pid))`,
	},
}

// layersCode defines _layers(), the Landlock domains the calling thread
// is in (testutil.LandlockLayersPython), and _serve(rfd, wfd), which
// answers each byte read with it; _layers_src is the code of both, for a
// new program.
const layersCode = `_layers_src = r"""
import os
` + testutil.LandlockLayersPython + `
_layers = landlock_layers
def _serve(rfd, wfd):
    while os.read(rfd, 1):
        os.write(wfd, b'%d\n' % _layers())
"""
exec(_layers_src)
`

// viewCode prints what confines the sandbox as its processes see it (the
// runner, and a new process): capabilities, no_new_privs, seccomp, the
// id maps, the Landlock domains the runner is in, the flags of /usr and
// of the /proc masks; then tries the host's secret (its path, the canary
// variable, every environment under /proc).
const viewCode = layersCode + `import os, re, subprocess
def _status(text):
    out = []
    for k in ('CapInh', 'CapPrm', 'CapEff', 'CapBnd', 'CapAmb', 'NoNewPrivs', 'Seccomp', 'Seccomp_filters'):
        m = re.search('^' + k + r':\s*(.*)$', text, re.M)
        out.append(k + '=' + (m.group(1) if m else '-'))
    return out
_v = ['runner ' + x for x in _status(open('/proc/self/status').read())]
_v += ['child ' + x for x in _status(subprocess.run(['cat', '/proc/self/status'], capture_output=True, text=True).stdout)]
_v.append('uid_map ' + ' '.join(open('/proc/self/uid_map').read().split()))
_v.append('gid_map ' + ' '.join(open('/proc/self/gid_map').read().split()))
_v.append('setgroups ' + open('/proc/self/setgroups').read().strip())
_v.append('landlock domains %d' % _layers())
for l in open('/proc/self/mountinfo'):
    f = l.split()
    if f[4] == '/usr' or f[4].startswith('/usr/') or f[4] == '/proc' or f[4].startswith('/proc/'):
        _v.append('mount ' + f[4] + ' ' + f[5])
print('\n'.join(sorted(_v)))
_leak = []
try:
    _leak.append(open(os.environ['SECRET_PATH']).read())
except OSError:
    pass
_leak.append(os.environ.get('VIVARIUM_CANARY_TOKEN', ''))
for p in os.listdir('/proc'):
    if p.isdigit():
        try:
            _leak.append(open('/proc/%s/environ' % p, 'rb').read().decode(errors='replace'))
        except OSError:
            pass
print('probe', ''.join(_leak).encode().hex())
`

func TestHostilePause(t *testing.T) {
	w := newPauseWorld(t)
	mounts := testutil.Mounts()
	t.Run("cases", func(t *testing.T) {
		for _, c := range pauseCases {
			t.Run(c.name, func(t *testing.T) {
				t.Parallel()
				w.runCase(t, c, false)
			})
		}
	})
	// The same on copies (Fork): restored trees from the start.
	t.Run("copies", func(t *testing.T) {
		for _, c := range pauseCases {
			t.Run(c.name, func(t *testing.T) {
				t.Parallel()
				w.runCase(t, c, true)
			})
		}
	})
	// One at a time: they measure the host side.
	t.Run("images_out_of_reach", w.imagesOutOfReach)
	t.Run("memory_limit", w.memoryLimit)
	t.Run("socket_queues", func(t *testing.T) { w.socketQueues(t, 48<<20) })
	w.checkLeftovers(t, mounts)
}

func newPauseWorld(t *testing.T) *pauseWorld {
	return newPauseWorldOf(t, false)
}

// newPauseWorldWithBase is a pause world whose backend keeps paused
// sandboxes against a pause base, as vivarium serve does, and whose
// sandboxes are pausable ones, as a server makes them.
func newPauseWorldWithBase(t *testing.T) *pauseWorld {
	return newPauseWorldOf(t, true)
}

func newPauseWorldOf(t *testing.T, withBase bool) *pauseWorld {
	testutil.RequireRoot(t)
	testutil.RequirePython(t)
	if _, err := criu.Usable(); err != nil {
		t.Skipf("pause and resume need CRIU 4 (internal/criu.Find: %v); make criu builds it", err)
	}
	testutil.RemoveStaleCgroups(pauseCgroupParent)
	parent, err := os.MkdirTemp("", "vivarium-hostile-pause-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(parent) })
	// The backend lets sandboxes' host roots through the directory's
	// parents (o+x), as on a real host (/var/lib).
	if err := os.Chmod(parent, 0o711); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(parent, "checkpoints")
	cfg := ofKind(t, native.Config{CgroupParent: pauseCgroupParent, UIDBase: pauseUIDBase,
		UIDRanges: pauseUIDRanges, CheckpointDir: dir})
	if withBase {
		testutil.RequirePythonModules(t, "numpy", "pandas", "matplotlib")
		cfg.PauseBaseDir, cfg.Preload = filepath.Join(parent, "bases"), []string{"numpy", "pandas", "matplotlib"}
	}
	b, err := native.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	procs := map[string]bool{}
	for _, p := range testutil.ProcessesOwnedBy(int(pauseUIDBase), int(pauseUIDBase)+pauseUIDRanges<<16) {
		procs[p] = true
	}
	return &pauseWorld{b: b, dir: dir, canaries: testutil.SetupCanaries(t), procs: procs, pausable: withBase}
}

// bounded runs f with a context that ends at pauseCallLimit, and fails
// the test if f has not returned pauseHangGrace later: a hung call.
func bounded[T any](t *testing.T, what string, f func(ctx context.Context) (T, error)) (T, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), pauseCallLimit)
	defer cancel()
	type answer struct {
		v   T
		err error
	}
	ch := make(chan answer, 1)
	go func() {
		v, err := f(ctx)
		ch <- answer{v, err}
	}()
	select {
	case a := <-ch:
		return a.v, a.err
	case <-time.After(pauseCallLimit + pauseHangGrace):
		t.Fatalf("%s hung: no answer %v after its context's deadline", what, pauseHangGrace)
		panic("unreachable")
	}
}

func (w *pauseWorld) create(t *testing.T, limits sandbox.Limits) *native.Sandbox {
	t.Helper()
	sbx, err := bounded(t, "Create", func(ctx context.Context) (sandbox.Sandbox, error) {
		return w.b.Create(ctx, sandbox.Spec{Limits: override(baseLimits, limits), Pausable: w.pausable})
	})
	if err != nil {
		t.Fatal(err)
	}
	s, ok := sbx.(*native.Sandbox)
	if !ok {
		sbx.Close()
		t.Fatalf("the native backend made a %T", sbx)
	}
	if err := s.PauseSupported(); err != nil {
		s.Close()
		t.Fatalf("a classic sandbox cannot be paused: %v", err)
	}
	return s
}

// exec runs code in s and returns its stdout; the run must end OK, and
// nothing it returns may hold the host's secret.
func (w *pauseWorld) exec(t *testing.T, s *native.Sandbox, code string, env map[string]string) string {
	t.Helper()
	res := w.run(t, s, code, env)
	if res.Status != sandbox.StatusOK {
		e := ""
		if res.Error != nil {
			e = res.Error.Name + ": " + res.Error.Value + "\n" + res.Error.Traceback
		}
		t.Fatalf("status %s exit %d running:\n%s\nstdout: %s\nstderr: %s\nerror: %s", res.Status, res.ExitCode,
			code, res.Stdout, res.Stderr, e)
	}
	return res.Stdout
}

// run runs code in s, whatever its outcome, and checks that no canary
// shows in what it answers.
func (w *pauseWorld) run(t *testing.T, s *native.Sandbox, code string, env map[string]string) *sandbox.Result {
	t.Helper()
	res, err := bounded(t, "Execute", func(ctx context.Context) (*sandbox.Result, error) {
		return s.Execute(ctx, sandbox.ExecRequest{Code: code, Env: env}, nil)
	})
	if err != nil {
		t.Fatalf("Execute: %v", err)
	}
	for where, text := range resultTexts(res) {
		if w.canaries.LeakedIn(text) {
			t.Errorf("the host's canary token reached the sandbox: it shows in %s", where)
		}
	}
	return res
}

// view is the sandbox's view of its confinement (viewCode), without the
// probe line, which must hold nothing of the host's secret.
func (w *pauseWorld) view(t *testing.T, s *native.Sandbox) string {
	t.Helper()
	out := w.exec(t, s, viewCode, map[string]string{"SECRET_PATH": w.canaries.SecretPath})
	view, probe, ok := strings.Cut(out, "probe ")
	if !ok {
		t.Fatalf("the view has no probe line: %s", out)
	}
	leaked, err := hex.DecodeString(strings.TrimSpace(probe))
	if err != nil {
		t.Fatalf("probe line %q: %v", probe, err)
	}
	if w.canaries.LeakedIn(string(leaked)) {
		t.Errorf("the host's canary token is readable in the sandbox (its file, its variable or an environment under /proc)")
	}
	return view
}

func (w *pauseWorld) pause(t *testing.T, s *native.Sandbox) error {
	t.Helper()
	_, err := bounded(t, "Pause", func(ctx context.Context) (struct{}, error) { return struct{}{}, s.Pause(ctx) })
	return err
}

func (w *pauseWorld) resume(t *testing.T, s *native.Sandbox) error {
	t.Helper()
	_, err := bounded(t, "Resume", func(ctx context.Context) (struct{}, error) { return struct{}{}, s.Resume(ctx) })
	return err
}

// close closes s, paused or not, and checks its checkpoints went with it.
func (w *pauseWorld) close(t *testing.T, s *native.Sandbox) {
	t.Helper()
	if _, err := bounded(t, "Close", func(context.Context) (struct{}, error) { return struct{}{}, s.Close() }); err != nil {
		t.Errorf("Close: %v", err)
	}
	if _, err := os.Stat(filepath.Join(w.dir, s.ID())); !os.IsNotExist(err) {
		t.Errorf("the sandbox's checkpoint directory after Close: %v", err)
	}
}

// imagesSize is the size of the files of s's checkpoints, on the host.
func (w *pauseWorld) imagesSize(t *testing.T, s *native.Sandbox) int64 {
	tree, err := testutil.Tree(filepath.Join(w.dir, s.ID()))
	if err != nil {
		t.Errorf("the checkpoint's files: %v", err)
	}
	return testutil.TreeSize(tree)
}

// runCase sets the attack up, then pauses and resumes pauseRounds times,
// comparing the attack's state and the sandbox's view after each; a last
// pause is ended by Close. With copy, the sandbox paused is a copy of the
// one the attack was set up in (Fork, the source then closed): a restored
// tree from the start, whose state and view (but for its host ids) must
// be its source's.
func (w *pauseWorld) runCase(t *testing.T, c pauseCase, copy bool) {
	s := w.create(t, c.limits)
	closed := false
	t.Cleanup(func() {
		if !closed {
			s.Close()
		}
	})
	before := w.view(t, s)
	if out := w.exec(t, s, c.setup, nil); !strings.HasSuffix(out, "ready\n") {
		t.Fatalf("the attack was not set up: %q", out)
	}
	want := w.exec(t, s, c.check, nil)
	t.Logf("state: %s", strings.TrimSpace(want))
	same := func(a, b string) bool { return a == b }
	if copy {
		copies, err := bounded(t, "Fork", func(ctx context.Context) ([]sandbox.Sandbox, error) {
			return s.Fork(ctx, 1, sandbox.ForkOptions{})
		})
		if err != nil {
			// Refused: said, and the source goes on.
			t.Logf("%s: fork refused: %v", c.name, err)
			if got := w.exec(t, s, c.check, nil); got != want {
				t.Errorf("the source after a refused fork: %s, want %s", got, want)
			}
			return
		}
		w.close(t, s)
		s = copies[0].(*native.Sandbox)
		same = func(a, b string) bool { return normView(a) == normView(b) }
		if got := settled(func() string { return w.exec(t, s, c.check, nil) }, want); got != want {
			t.Errorf("the copy: the attack's state is not its source's:\n%s\nwant:\n%s", got, want)
		}
		if got := w.view(t, s); !same(got, before) {
			t.Errorf("the copy's view of its confinement is not its source's:\n%s\nthe source's:\n%s", got, before)
		}
	}
	var outcomes []string
	for round := 1; round <= pauseRounds; round++ {
		start := time.Now()
		if err := w.pause(t, s); err != nil {
			// Refused: said clearly, and the sandbox goes on.
			outcomes = append(outcomes, "refused")
			t.Logf("round %d: pause refused after %v: %v", round, time.Since(start).Round(time.Millisecond), err)
			if s.Paused() {
				t.Fatalf("a pause that failed left the sandbox paused")
			}
			if !strings.HasPrefix(err.Error(), "pause: ") || errors.Is(err, sandbox.ErrBusy) || errors.Is(err, sandbox.ErrUnsupported) {
				t.Errorf("the refusal does not say the dump failed: %v", err)
			}
		} else {
			if !s.Paused() {
				t.Fatalf("Paused() is false after a pause")
			}
			size := w.imagesSize(t, s)
			took := time.Since(start)
			start = time.Now()
			if err := w.resume(t, s); err != nil {
				t.Fatalf("round %d: the resume failed (the sandbox stays paused): %v", round, err)
			}
			outcomes = append(outcomes, "resumed")
			t.Logf("round %d: pause %v (checkpoint %d KiB), resume %v", round, took.Round(time.Millisecond),
				size>>10, time.Since(start).Round(time.Millisecond))
		}
		if got := settled(func() string { return w.exec(t, s, c.check, nil) }, want); got != want {
			t.Errorf("round %d: the attack's state changed:\n%s\nwant:\n%s", round, got, want)
		}
		if got := w.view(t, s); !same(got, before) {
			t.Errorf("round %d: the sandbox's view of its confinement changed:\n%s\nbefore:\n%s", round, got, before)
		}
	}
	// Close while paused (or, where pausing is refused, running).
	if err := w.pause(t, s); err != nil {
		outcomes = append(outcomes, "refused")
	} else {
		outcomes = append(outcomes, "closed paused")
	}
	t.Logf("%s: %s", c.name, strings.Join(outcomes, ", "))
	closed = true
	w.close(t, s)
}

// hostRoot is the host uid the sandbox's root maps to, from its uid_map.
func (w *pauseWorld) hostRoot(t *testing.T, s *native.Sandbox) int {
	t.Helper()
	out := w.exec(t, s, "print(open('/proc/self/uid_map').read())", nil)
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) == 3 && f[0] == "0" {
			if n, err := strconv.Atoi(f[1]); err == nil {
				return n
			}
		}
	}
	t.Fatalf("no host root in the uid_map %q", out)
	return 0
}

// reachCode is what a sandbox tries against another's checkpoint, which
// it is told everything about: the host paths of its directory and of
// its memory image, and a file handle of that image made on the host.
// Every attempt prints its outcome; none may be "ok".
const reachCode = `import ctypes, glob, os, struct
victim, pages = os.environ['VICTIM_DIR'], os.environ['VICTIM_PAGES']
htype, hbytes = int(os.environ['HANDLE_TYPE']), bytes.fromhex(os.environ['HANDLE_HEX'])
attempt('open pages', lambda: open(pages, 'rb').read(16))
attempt('list victim', lambda: os.listdir(victim))
attempt('open own checkpoint', lambda: os.listdir(os.environ['OWN_DIR']))
def _via_proc():
    found = [p for p in glob.glob('/proc/*/root' + pages) + glob.glob('/proc/*/cwd' + pages) if os.path.exists(p)]
    if found:
        open(found[0], 'rb').read(16)
    else:
        raise FileNotFoundError(2, 'no such path')
attempt('via /proc/*/root', _via_proc)
# The masks over /proc are binds of files of the host's checkpoint
# directory (since this sandbox was resumed): their mountinfo root names
# a host path. Every mount is tried as open_by_handle_at's mount fd,
# with the host's handle of the victim's memory image.
fh = ctypes.create_string_buffer(struct.pack('Ii', len(hbytes), htype) + hbytes)
outcomes = set()
for l in open('/proc/self/mountinfo'):
    f = l.split()
    try:
        mfd = os.open(f[4], os.O_RDONLY | os.O_PATH)
    except OSError:
        continue
    ctypes.set_errno(0)
    r = _libc.syscall(ctypes.c_long(NR['open_by_handle_at']), ctypes.c_long(mfd), fh, ctypes.c_long(os.O_RDONLY))
    outcomes.add('ok' if r >= 0 else _errno.errorcode.get(ctypes.get_errno(), '?'))
    if r >= 0:
        print('opened', os.read(r, 16))
    os.close(mfd)
print('open_by_handle_at', ' '.join(sorted(outcomes)))
# The masks bound from the host's checkpoint directory (ext/): their
# mountinfo root is a host path.
masks = [(f[4], f[3]) for f in (l.split() for l in open('/proc/self/mountinfo')) if f[4].startswith('/proc/') and '/ext/' in f[3]]
print('masks from the checkpoint directory', len(masks) > 0)
# Writing through them into the host's checkpoint directory.
for point, _ in masks:
    if os.path.isdir(point):
        attempt('mkdir in ' + point, os.mkdir, point + '/x')
    else:
        attempt('write ' + point, lambda: open(point, 'a').write('x'))
print('host paths shown', sorted(set(os.path.dirname(os.path.dirname(r)) for _, r in masks)))
# What of the host's checkpoint directory the sandbox's mountinfo names:
# the masks' roots, the /usr overlay's lower layers.
own = os.path.dirname(os.environ['OWN_DIR'])
named = [l.split() for l in open('/proc/self/mountinfo') if own in l]
print('mounts naming the checkpoint directory', len(named), 'by their root', sum(own in f[3] for f in named),
      'by their options', [f[4] for f in named if own in ' '.join(f[5:])])
`

// imagesOutOfReach pauses a victim holding a secret in memory and lets
// an attacker, itself paused and resumed before (so that its /proc masks
// are bound from the checkpoint directory), try every way at the
// victim's images; then checks the images' owners and modes on the host.
func (w *pauseWorld) imagesOutOfReach(t *testing.T) {
	victim := w.create(t, sandbox.Limits{})
	defer w.close(t, victim)
	attacker := w.create(t, sandbox.Limits{})
	defer w.close(t, attacker)
	secret := "victim-secret-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	w.exec(t, victim, fmt.Sprintf("secret = %q * 1000", secret), nil)
	if err := w.pause(t, attacker); err != nil {
		t.Fatal(err)
	}
	if err := w.resume(t, attacker); err != nil {
		t.Fatal(err)
	}
	victimRoot := w.hostRoot(t, victim)
	attackerRoot := w.hostRoot(t, attacker)
	if err := w.pause(t, victim); err != nil {
		t.Fatal(err)
	}
	vdir := filepath.Join(w.dir, victim.ID())
	pages, _ := filepath.Glob(filepath.Join(vdir, "*", "images", "pages-*.img"))
	if len(pages) == 0 {
		t.Fatalf("no memory image under %s", vdir)
	}
	h, _, err := unix.NameToHandleAt(unix.AT_FDCWD, pages[0], 0)
	if err != nil {
		t.Fatalf("a handle of %s: %v", pages[0], err)
	}
	out := w.exec(t, attacker, withProbes(reachCode), map[string]string{
		"VICTIM_DIR": vdir, "VICTIM_PAGES": pages[0], "OWN_DIR": filepath.Join(w.dir, attacker.ID()),
		"HANDLE_TYPE": strconv.Itoa(int(h.Type())), "HANDLE_HEX": hex.EncodeToString(h.Bytes()),
	})
	t.Logf("the attacker:\n%s", out)
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if strings.HasSuffix(l, " ok") || strings.HasPrefix(l, "opened") || strings.Contains(l, " ok ") {
			t.Errorf("the attacker reached the host's checkpoint directory: %s", l)
		}
	}
	if strings.Contains(out, secret) {
		t.Errorf("the victim's secret shows in the attacker's output")
	}
	w.checkModes(t, vdir, victimRoot, attackerRoot)
	if err := w.resume(t, victim); err != nil {
		t.Fatal(err)
	}
	if got := w.exec(t, victim, "print(secret == "+strconv.Quote(secret)+" * 1000)", nil); got != "True\n" {
		t.Errorf("the victim's secret after resume: %q", got)
	}
}

// checkModes checks the checkpoint directory of a paused sandbox: the
// checkpoint root and the sandbox's directory 0711 root:root, the rest
// root's and the sandbox's host root group's, directories 0750, files
// 0640, except the /proc masks' copies (ext/ and the masks/ they are
// links to, 0444 and 0555: bound in the sandbox, readable by all there);
// no file another sandbox's host root or
// any other host user may read.
func (w *pauseWorld) checkModes(t *testing.T, vdir string, group, otherRoot int) {
	t.Helper()
	for _, d := range []string{w.dir, vdir} {
		var st unix.Stat_t
		if err := unix.Lstat(d, &st); err != nil {
			t.Fatal(err)
		}
		if st.Mode&0o7777 != 0o711 || st.Uid != 0 || st.Gid != 0 {
			t.Errorf("%s: mode %o, owner %d:%d; want 0711 root:root", d, st.Mode&0o7777, st.Uid, st.Gid)
		}
	}
	files := 0
	err := filepath.Walk(vdir, func(p string, fi os.FileInfo, err error) error {
		if err != nil || p == vdir {
			return err
		}
		st := fi.Sys().(*syscall.Stat_t)
		perm := st.Mode & 0o7777
		rel, _ := filepath.Rel(vdir, p)
		// masks/ holds the files ext/'s are links to (maskStore).
		inExt := strings.Contains(rel, string(filepath.Separator)+"ext"+string(filepath.Separator)) ||
			strings.HasPrefix(rel, "masks"+string(filepath.Separator))
		switch {
		case fi.Mode()&os.ModeSymlink != 0:
			t.Errorf("%s: a symbolic link in a checkpoint", rel)
		case st.Uid != 0:
			t.Errorf("%s: owner %d, want root", rel, st.Uid)
		case inExt && (perm == 0o444 || perm == 0o555):
		case int(st.Gid) != group:
			t.Errorf("%s: group %d, want the sandbox's host root %d", rel, st.Gid, group)
		case fi.IsDir() && perm != 0o750:
			t.Errorf("%s: directory mode %o, want 0750", rel, perm)
		case !fi.IsDir() && perm != 0o640:
			t.Errorf("%s: file mode %o, want 0640", rel, perm)
		}
		if int(st.Gid) == otherRoot {
			t.Errorf("%s: group %d is another sandbox's host root", rel, st.Gid)
		}
		if !fi.IsDir() {
			files++
		}
		return nil
	})
	if err != nil {
		t.Error(err)
	}
	t.Logf("%d files under the paused sandbox's checkpoint, modes as set", files)
}

// memoryLimit fills a sandbox's memory to near its limit, pauses it, and
// measures what the pause wrote to the host's disk: about the limit at
// most, and for a sandbox forked from a zygote, the zygote's memory it
// shared besides, which the restored sandbox is charged for and its limit
// raised by (never by more than its runner mapped when it was new).
// Nothing in the native backend bounds the checkpoint directory as a
// whole (see docs/security.md): every paused sandbox adds its own.
func (w *pauseWorld) memoryLimit(t *testing.T) {
	const limit = 256 << 20
	s := w.create(t, sandbox.Limits{Memory: limit, Timeout: 2 * time.Minute})
	defer w.close(t, s)
	var idle int64 // KiB
	fmt.Sscan(w.exec(t, s, "print([l for l in open('/proc/self/status') if l.startswith('RssAnon')][0].split()[1])", nil), &idle)
	// 8 MiB chunks, each byte written, distinct per chunk, until the
	// sandbox holds about 230 MiB (the runner takes some 15 MiB).
	out := w.exec(t, s, `chunks = [bytes([i % 250 + 1]) * (8 << 20) for i in range(27)]
rss = [l for l in open('/proc/self/status') if l.startswith('VmRSS')][0].split()[1]
print(int(rss) >> 10)`, nil)
	t.Logf("the runner's resident memory: %s MiB", strings.TrimSpace(out))
	start := time.Now()
	if err := w.pause(t, s); err != nil {
		t.Fatalf("pause of a sandbox at its memory limit: %v", err)
	}
	took := time.Since(start)
	size := w.imagesSize(t, s)
	t.Logf("a sandbox limited to %d MiB, holding about 230 MiB: its checkpoint takes %.1f MiB on disk (pause %v)",
		limit>>20, float64(size)/(1<<20), took.Round(time.Millisecond))
	if size < 200<<20 {
		t.Errorf("the checkpoint takes %d MiB: the memory the sandbox filled is not in it", size>>20)
	}
	if err := w.resume(t, s); err != nil {
		t.Fatal(err)
	}
	raised := w.cgroupValue("memory.limit_in_bytes", "memory.max") - limit
	t.Logf("the resumed sandbox's memory limit is raised by %.1f MiB (its runner mapped %d MiB of anonymous memory new)",
		float64(raised)/(1<<20), idle>>10)
	if raised < 0 || raised > idle<<10 || raised > 0 && !testutil.ZygoteMode() {
		t.Errorf("the resumed sandbox's memory limit is raised by %d MiB: by more than what it took over of a zygote", raised>>20)
	}
	if size > limit+raised+16<<20 {
		t.Errorf("the checkpoint takes %d MiB, over the sandbox's %d MiB memory limit and the %d MiB of a zygote's it shared",
			size>>20, limit>>20, raised>>20)
	}
	if got := w.exec(t, s, "print(sum(c[0] + c[-1] for c in chunks), len(chunks))", nil); got != "756 27\n" {
		t.Errorf("the filled memory after resume: %q", got)
	}
	// Closed paused.
	if err := w.pause(t, s); err != nil {
		t.Errorf("the second pause: %v", err)
	}
}

// socketQueues fills the queues of Unix socket pairs with fill bytes
// (buffers of 64 MiB asked for): kernel memory, which CRIU saves with the
// sockets. It is charged to the sandbox's memory (a fill to the limit
// ends in the sandbox's MemoryError), so the checkpoint stays within the
// limit too. The sandbox's limit is 128 MiB; the resume must bring the
// queues back.
func (w *pauseWorld) socketQueues(t *testing.T, fill int) {
	const limit = 128 << 20
	s := w.create(t, sandbox.Limits{Memory: limit, OpenFiles: 256, Timeout: 2 * time.Minute})
	defer w.close(t, s)
	out := w.exec(t, s, `import os, socket
fill = int(os.environ['FILL'])
total, pairs, err = 0, [], None
chunk = b'q' * 65536
try:
    while len(pairs) < 100 and total < fill:
        a, b = socket.socketpair()
        a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 << 20)
        a.setblocking(False)
        while total < fill:
            try:
                total += a.send(chunk)
            except BlockingIOError:
                break
        pairs.append((a, b))
except OSError as e:
    err = e.errno
print(total >> 20, len(pairs), err)`, map[string]string{"FILL": strconv.Itoa(fill)})
	var queued, pairs int
	fmt.Sscan(out, &queued, &pairs)
	usage := w.cgroupValue("memory.usage_in_bytes", "memory.current")
	t.Logf("queued %d MiB in %d Unix socket pairs (%q); the sandbox's cgroup charges %d MiB of its %d MiB limit",
		queued, pairs, strings.TrimSpace(out), usage>>20, limit>>20)
	start := time.Now()
	if err := w.pause(t, s); err != nil {
		t.Logf("pause refused: %v", err)
		return
	}
	size := w.imagesSize(t, s)
	t.Logf("the checkpoint takes %.1f MiB on disk (pause %v)", float64(size)/(1<<20), time.Since(start).Round(time.Millisecond))
	if size > limit+16<<20 {
		t.Errorf("the checkpoint takes %d MiB, over the sandbox's %d MiB memory limit: queued socket data is not charged to it", size>>20, limit>>20)
	}
	if err := w.resume(t, s); err != nil {
		t.Fatalf("the resume failed (the sandbox stays paused, its state out of reach): %v", err)
	}
	if got := w.exec(t, s, "print(sum(len(b.recv(1 << 20)) > 0 for a, b in pairs))", nil); got != fmt.Sprintf("%d\n", pairs) {
		t.Errorf("the queues after resume: %q", got)
	}
}

// cgroupValue is the number in the first of files (the cgroup v1 and v2
// names of a memory controller's file) of the one sandbox of the suite's
// cgroup parent, or -1.
func (w *pauseWorld) cgroupValue(files ...string) int64 {
	for _, g := range testutil.CgroupsUnder(pauseCgroupParent) {
		for _, f := range files {
			if b, err := os.ReadFile(filepath.Join(g, f)); err == nil {
				n, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
				return n
			}
		}
	}
	return -1
}

// newProcesses are the processes of host users [lo, hi) that were not
// there when the test began.
func (w *pauseWorld) newProcesses(lo, hi int) []string {
	var out []string
	for _, p := range testutil.ProcessesOwnedBy(lo, hi) {
		if !w.procs[p] {
			out = append(out, p)
		}
	}
	return out
}

// checkLeftovers: nothing of the suite's sandboxes left on the host.
func (w *pauseWorld) checkLeftovers(t *testing.T, mounts []string) {
	t.Helper()
	if left := w.newProcesses(int(pauseUIDBase), int(pauseUIDBase)+pauseUIDRanges<<16); len(left) > 0 {
		t.Errorf("processes left: %v", describeProcs(left))
	}
	if left := testutil.CgroupsUnder(pauseCgroupParent); len(left) > 0 {
		t.Errorf("cgroups left: %v", left)
	}
	if left, err := checkpointsLeft(w.dir); err != nil || len(left) > 0 {
		t.Errorf("left in the checkpoint directory: %v %v", left, err)
	}
	for _, m := range testutil.MountsAdded(mounts, 5*time.Second, pauseCgroupParent) {
		t.Errorf("mount left on the host: %s", m)
	}
	w.canaries.Check(t)
}

// checkpointsLeft lists what is left in a backend's checkpoint directory
// but its copy of a zygote's files (zygote-files-*, which snapshots of
// its sandboxes name, kept as long as the directory).
func checkpointsLeft(dir string) ([]string, error) {
	tree, err := testutil.Tree(dir)
	var left []string
	for p := range tree {
		if !strings.HasPrefix(p, "zygote-files-") {
			left = append(left, p)
		}
	}
	sort.Strings(left)
	return left, err
}

// TestHostilePauseExitingProcesses pauses a sandbox whose processes fork
// and exit without end: one forks children that exit at once, another
// hops (forks and exits, so that its pid changes all the time and it is
// always an orphan). Six rounds: each pause must succeed and its resume
// too, or the pause fail with the sandbox going on. It failed, before
// the fixes, in two ways:
//   - before CRIU runs, the supervisor walks the tree in /proc
//     (processTree and collectFiles in
//     internal/backend/native/checkpoint_linux.go) and fails the pause on
//     the ENOENT of a process that exited meanwhile ("pause: open
//     /proc/N/task: no such file or directory", "readdirent
//     /proc/N/task", "open /proc/N/fd"): a process gone is no longer part
//     of the tree, and CRIU freezes the rest itself. 2 to 5 pauses of 6
//     fail so.
//   - a pause that succeeds may not resume: CRIU's restorer fails to
//     create a thread of the restored init ("Unable to create a thread:
//     -11", EAGAIN: the sandbox's pids limit, 64 here, reached during
//     the restore), in about one run of two; the sandbox then stays
//     paused, and the failed restore's init a zombie of the supervisor
//     (native's TestPauseFailedRestoreReaped).
func TestHostilePauseExitingProcesses(t *testing.T) {
	w := newPauseWorld(t)
	mounts := testutil.Mounts()
	func() {
		// Two minutes an execution: the storm and the hopper fork without
		// pause, which on cgroup v1 under a loaded machine (the whole
		// suite on two cores) once kept the runner from answering a
		// print within 30 s after a resume (docs/security.md: a fork bomb
		// can stall a cgroup v1 host). Slow is not hung.
		s := w.create(t, sandbox.Limits{Pids: 64, Timeout: 2 * time.Minute})
		defer w.close(t, s)
		const start = `import subprocess, sys
storm = subprocess.Popen([sys.executable, '-c', 'import os\nwhile True:\n    pid = os.fork()\n    if pid == 0:\n        os._exit(0)\n    os.waitpid(pid, 0)'])
subprocess.run([sys.executable, '-c', 'import os\nwhile True:\n    if os.fork():\n        os._exit(0)', 'hopper'])
x = 41`
		w.exec(t, s, start, nil)
		var vanished []string
		paused := 0
		kills0 := memoryKills(t)
		for i := 0; i < 6; i++ {
			err := w.pause(t, s)
			switch {
			case err == nil:
				paused++
				if err := w.resume(t, s); err != nil {
					t.Errorf("resume %d failed, the sandbox stays paused: %v", i+1, err)
					return
				}
			case errors.Is(err, os.ErrNotExist):
				vanished = append(vanished, err.Error())
			default:
				t.Logf("pause refused: %v", err)
			}
			// The storm forks and reaps in a loop; seen twice in many
			// runs (here and in a fork's dump): it ended with status 1
			// (an exception) across a dump, its cause not found yet
			// (docs/snapshots.md, known gaps). The sandbox must go on.
			res := w.run(t, s, "print(x + 1, storm.poll())", nil)
			if res.StateLost && memoryKills(t) > kills0 {
				// The storm's kernel memory (its tasks' slabs) brings
				// the group to its limit now and then, as the pause's
				// dump and restore add theirs, and the OOM killer may
				// take the runner: the sandbox's own limit at work, its
				// state lost and said so (seen once in CI, 112 of its
				// 128 MiB kernel memory). It must still go on.
				t.Logf("after pause %d: the sandbox's memory limit killed processes (%d kills in all); its runner's state was lost, and said so",
					i+1, memoryKills(t)-kills0)
				w.exec(t, s, start, nil) // the storm and the hopper again
				continue
			}
			if res.Status != sandbox.StatusOK {
				t.Fatalf("after pause %d: %s (state lost: %v, memory kills %d): %s %+v", i+1, res.Status, res.StateLost,
					memoryKills(t)-kills0, res.Stderr, res.Error)
			}
			got := res.Stdout
			if got == "42 1\n" {
				t.Logf("after pause %d: the fork storm ended with status 1", i+1)
			} else if got != "42 None\n" {
				t.Fatalf("after pause %d: %q", i+1, got)
			}
		}
		t.Logf("%d of 6 pauses succeeded", paused)
		if len(vanished) > 0 {
			t.Errorf("%d of 6 pauses failed on a process that exited while the supervisor read /proc "+
				"(checkpoint_linux.go: processTree, collectFiles): %q", len(vanished), vanished)
		}
	}()
	w.checkLeftovers(t, mounts)
}

// memoryKills counts the processes the memory limits of the pause
// suite's sandboxes killed so far (memory.oom_control's oom_kill of each
// group on cgroup v1, memory.events' of the parent on v2).
func memoryKills(t *testing.T) int64 {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup/memory", pauseCgroupParent, "*", "memory.oom_control"))
	if len(files) == 0 {
		files = []string{filepath.Join("/sys/fs/cgroup", pauseCgroupParent, "memory.events")}
	}
	var n int64
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "oom_kill "); ok {
				k, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
				n += k
			}
		}
	}
	return n
}

// TestHostilePauseSharedMemory pauses sandboxes holding a memfd and a
// SysV shared memory segment: memory of the sandbox's own, in the
// kernel's internal shmem mount, which CRIU dumps (memfd since CRIU 3.x,
// SysV segments with the IPC namespace). The pause must succeed, or be
// refused as unsupported for what it is. It failed before the fix:
// collectFiles
// (internal/backend/native/checkpoint_linux.go) finds a file whose mount
// is not in the sandbox's mount namespace, held by a process other than
// init, and refuses it as a host file ("process N of the sandbox holds
// /memfd:x (deleted), a file outside it"), so that a sandbox using
// either cannot be paused, and says so wrongly.
func TestHostilePauseSharedMemory(t *testing.T) {
	w := newPauseWorld(t)
	mounts := testutil.Mounts()
	for _, c := range pauseCases {
		if c.name != "memfd" && c.name != "sysv_shm" {
			continue
		}
		t.Run(c.name, func(t *testing.T) {
			s := w.create(t, c.limits)
			defer w.close(t, s)
			w.exec(t, s, c.setup, nil)
			want := w.exec(t, s, c.check, nil)
			err := w.pause(t, s)
			switch {
			case err == nil:
				if err := w.resume(t, s); err != nil {
					t.Fatalf("resume: %v", err)
				}
			case errors.Is(err, sandbox.ErrUnsupported):
				t.Logf("refused as unsupported: %v", err)
			default:
				t.Errorf("the pause failed, taking the sandbox's own memory for a host file: %v", err)
			}
			if got := settled(func() string { return w.exec(t, s, c.check, nil) }, want); got != want {
				t.Errorf("after the pause: %s, want %s", got, want)
			}
		})
	}
	w.checkLeftovers(t, mounts)
}

// TestHostilePauseChangedFile tries to make every resume fail, as a
// tenant could: the paused code holds a file open, and the file is
// replaced through the files API while the sandbox is paused, which CRIU
// refuses to restore ("File ... has bad size"). Every change is refused
// while paused (ErrPaused), as the sandbox's user and as its root, and
// the resume brings the code back with its file as it left it. (A resume
// that fails all the same leaves nothing running, not even a zombie:
// native's TestPauseFailedRestoreReaped.)
func TestHostilePauseChangedFile(t *testing.T) {
	w := newPauseWorld(t)
	mounts := testutil.Mounts()
	func() {
		s := w.create(t, sandbox.Limits{})
		defer w.close(t, s)
		w.exec(t, s, "held = open('held.txt', 'w+')\nheld.write('abc')\nheld.flush()\nx = 41", nil)
		if err := w.pause(t, s); err != nil {
			t.Fatal(err)
		}
		user, err := s.Root(sandbox.UserSandbox)
		if err != nil {
			t.Fatal(err)
		}
		root, err := s.Root(sandbox.UserRoot)
		if err != nil {
			t.Fatal(err)
		}
		for what, change := range map[string]func() error{
			"replace it":           func() error { return s.Workspace().WriteFile("held.txt", strings.NewReader("longer"), 1<<20) },
			"replace it as user":   func() error { return user.WriteFile("workspace/held.txt", strings.NewReader("longer"), 1<<20) },
			"remove it as root":    func() error { return root.Remove("workspace/held.txt") },
			"move its directory":   func() error { return root.(sandbox.WorkspaceEditor).Rename("workspace", "elsewhere") },
			"remove its directory": func() error { return root.Remove("workspace") },
		} {
			if err := change(); !errors.Is(err, sandbox.ErrPaused) {
				t.Errorf("%s while paused: %v, want ErrPaused", what, err)
			}
		}
		if err := w.resume(t, s); err != nil {
			t.Fatalf("resume: %v", err)
		}
		if got := w.exec(t, s, "held.seek(0)\nprint(held.read(), x + 1)", nil); got != "abc 42\n" {
			t.Errorf("after the resume: %q", got)
		}
	}()
	w.checkLeftovers(t, mounts)
}

// describeProcs adds, to processes as testutil lists them ("name (pid
// N, uid U)"), their state and parent: a zombie of this process is one
// the supervisor did not reap.
func describeProcs(procs []string) []string {
	out := make([]string, 0, len(procs))
	for _, p := range procs {
		_, rest, _ := strings.Cut(p, "(pid ")
		pid, _, _ := strings.Cut(rest, ",")
		b, err := os.ReadFile("/proc/" + pid + "/stat")
		if err != nil {
			out = append(out, p)
			continue
		}
		f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
		switch {
		case len(f) > 1 && f[1] == strconv.Itoa(os.Getpid()):
			p += fmt.Sprintf(" state %s, a child of the supervisor", f[0])
		case len(f) > 1:
			p += fmt.Sprintf(" state %s, parent %s", f[0], f[1])
		}
		out = append(out, p)
	}
	return out
}

// TestHostilePauseQueuesNearLimit pauses a sandbox whose memory is mostly
// data queued in Unix sockets (96 MiB queued, some 112 MiB of its 128 MiB
// charged): the pause succeeds and writes 110 MiB, and the resume must
// succeed too. It failed before the fix: CRIU's restore of the queues is killed by the
// sandbox's memory limit ("killed by signal 9") whenever the queued data
// is more than about what the limit leaves free beside it (48 MiB queued
// resumes, 72 MiB does not: the restore appears to hold each queue twice,
// read from the image and written into the socket). The sandbox then
// stays paused for good, every resume failing; nothing in
// internal/backend/native/pause_linux.go refuses such a pause, nor gives
// the restore room (the limit could be raised for the restore by what
// was dumped, and set back before the tree runs).
func TestHostilePauseQueuesNearLimit(t *testing.T) {
	w := newPauseWorld(t)
	mounts := testutil.Mounts()
	t.Run("socket_queues", func(t *testing.T) { w.socketQueues(t, 96<<20) })
	w.checkLeftovers(t, mounts)
}

// orphanEnv, set, makes TestHostilePauseSupervisorKilled the supervisor
// to kill: its checkpoint directory.
const orphanEnv = "VIVARIUM_HOSTILE_PAUSE_ORPHAN"

// TestHostilePauseSupervisorKilled kills a supervisor (this test binary,
// re-executed) with SIGKILL while it runs two sandboxes, one paused and
// resumed before, one never paused: the processes of both must die with
// it (PR_SET_PDEATHSIG), the restored tree's as the other's. Each runs a
// process in a session of its own that ignores SIGTERM and SIGHUP.
func TestHostilePauseSupervisorKilled(t *testing.T) {
	if dir := os.Getenv(orphanEnv); dir != "" {
		killedSupervisor(t, dir)
		return
	}
	testutil.RequireRoot(t)
	testutil.RequirePython(t)
	if _, err := criu.Usable(); err != nil {
		t.Skipf("pause and resume need CRIU 4 (internal/criu.Find: %v); make criu builds it", err)
	}
	parent, err := os.MkdirTemp("", "vivarium-hostile-pause-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(parent)
	if err := os.Chmod(parent, 0o711); err != nil {
		t.Fatal(err)
	}
	mounts := testutil.Mounts()
	w := &pauseWorld{procs: map[string]bool{}}
	for _, p := range testutil.ProcessesOwnedBy(int(pauseUIDBase), int(pauseUIDBase)+pauseUIDRanges<<16) {
		w.procs[p] = true
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestHostilePauseSupervisorKilled$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), orphanEnv+"="+filepath.Join(parent, "checkpoints"), "VIVARIUM_TEST_ONE_MODE=1")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	var resumed, control string
	deadline := time.After(3 * time.Minute)
	for resumed == "" || control == "" {
		select {
		case l, ok := <-lines:
			if !ok {
				cmd.Wait()
				t.Fatal("the supervisor ended before its sandboxes were ready")
			}
			if v, ok := strings.CutPrefix(l, "RESUMED "); ok {
				resumed = v
			}
			if v, ok := strings.CutPrefix(l, "CONTROL "); ok {
				control = v
			}
		case <-deadline:
			cmd.Process.Kill()
			cmd.Wait()
			t.Fatal("the supervisor's sandboxes were not ready in 3 minutes")
		}
	}
	go func() {
		for range lines {
		}
	}()
	for _, root := range []string{resumed, control} {
		if r, err := strconv.Atoi(root); err != nil || len(w.newProcesses(r, r+1<<16)) == 0 {
			cmd.Process.Kill()
			cmd.Wait()
			t.Fatalf("no process of host root %q runs before the supervisor is killed: nothing to test", root)
		}
	}
	cmd.Process.Kill()
	cmd.Wait()
	for name, root := range map[string]string{"the resumed sandbox": resumed, "the sandbox never paused": control} {
		r, err := strconv.Atoi(root)
		if err != nil {
			t.Fatalf("%s: host root %q", name, root)
		}
		var left []string
		for end := time.Now().Add(15 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
			if left = w.newProcesses(r, r+1<<16); len(left) == 0 {
				break
			}
		}
		if len(left) > 0 {
			t.Errorf("%s: processes alive 15 s after its supervisor was killed: %v", name, describeProcs(left))
			killLeft(left)
		}
	}
	// What a killed supervisor leaves by design (docs/security.md): its
	// sandboxes' empty cgroups, removed by the next one.
	testutil.RemoveStaleCgroups(pauseCgroupParent)
	for _, m := range testutil.MountsAdded(mounts, 5*time.Second, pauseCgroupParent) {
		t.Errorf("mount left on the host: %s", m)
	}
}

// killedSupervisor is the supervisor TestHostilePauseSupervisorKilled
// kills: it prints the host roots of its two sandboxes once the first is
// paused and resumed, then waits.
func killedSupervisor(t *testing.T, dir string) {
	b, err := native.New(ofKind(t, native.Config{CgroupParent: pauseCgroupParent, UIDBase: pauseUIDBase,
		UIDRanges: pauseUIDRanges, CheckpointDir: dir}))
	if err != nil {
		t.Fatal(err)
	}
	w := &pauseWorld{b: b, dir: dir, canaries: &testutil.Canaries{}}
	const immune = `import subprocess, sys
immune = subprocess.Popen([sys.executable, '-c', 'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); signal.signal(signal.SIGHUP, signal.SIG_IGN); print("set", flush=True); time.sleep(3600)'], start_new_session=True, stdout=subprocess.PIPE)
immune.stdout.readline()`
	resumed := w.create(t, sandbox.Limits{})
	w.exec(t, resumed, immune, nil)
	if err := w.pause(t, resumed); err != nil {
		t.Fatal(err)
	}
	if err := w.resume(t, resumed); err != nil {
		t.Fatal(err)
	}
	control := w.create(t, sandbox.Limits{})
	w.exec(t, control, immune, nil)
	fmt.Printf("RESUMED %d\nCONTROL %d\n", w.hostRoot(t, resumed), w.hostRoot(t, control))
	time.Sleep(10 * time.Minute)
}

// killLeft kills what a failed check found left (processes a test made),
// by pid.
func killLeft(procs []string) {
	for _, p := range procs {
		_, rest, _ := strings.Cut(p, "(pid ")
		pid, _, _ := strings.Cut(rest, ",")
		if n, err := strconv.Atoi(pid); err == nil {
			unix.Kill(n, unix.SIGKILL)
		}
	}
}

// TestHostilePauseRunnerEnds ends the runner of a resumed sandbox, and of
// a copy of it, every way code can: past its memory limit, an interrupt
// of a loop without end, a restart asked for. Each time the execution
// answers as in a sandbox never paused (memory_limit, KeyboardInterrupt),
// the sandbox goes on with a new runner, its files kept, its view of its
// confinement as before. It failed before the fix on sandboxes forked
// from a zygote: a restored sandbox's PID namespace is no descendant of
// the zygote's, which cannot enter it to fork a runner (setns: EINVAL),
// so the first restart closed the sandbox ("restart: runner: fork: enter
// the sandbox's PID namespace: Invalid argument"); and an interrupt was
// sent to no process (the runner, restored, has no pidfd of the
// zygote's), the loop running to its time limit.
func TestHostilePauseRunnerEnds(t *testing.T) {
	w := newPauseWorld(t)
	mounts := testutil.Mounts()
	func() {
		s := w.create(t, sandbox.Limits{Memory: 128 << 20, Timeout: time.Minute})
		defer w.close(t, s)
		before := w.view(t, s)
		w.exec(t, s, "open('kept.txt', 'w').write('kept')", nil)
		if err := w.pause(t, s); err != nil {
			t.Fatal(err)
		}
		if err := w.resume(t, s); err != nil {
			t.Fatal(err)
		}
		copies, err := bounded(t, "Fork", func(ctx context.Context) ([]sandbox.Sandbox, error) {
			return s.Fork(ctx, 1, sandbox.ForkOptions{})
		})
		if err != nil {
			t.Fatal(err)
		}
		c := copies[0].(*native.Sandbox)
		defer w.close(t, c)
		for name, sb := range map[string]*native.Sandbox{"the resumed sandbox": s, "its copy": c} {
			goesOn := func(after string) {
				t.Helper()
				if got := w.exec(t, sb, "print(open('kept.txt').read())", nil); got != "kept\n" {
					t.Errorf("%s, after %s: %q", name, after, got)
				}
				if got := w.view(t, sb); normView(got) != restartedView(normView(before)) {
					t.Errorf("%s, after %s: its view of its confinement changed:\n%s\nbefore:\n%s", name, after, got, before)
				}
			}
			res := w.run(t, sb, "b = bytearray(300 << 20)", nil)
			if res.Status != sandbox.StatusMemoryLimit {
				t.Errorf("%s: an allocation past its memory limit: %s %+v", name, res.Status, res.Error)
			}
			goesOn("its memory limit")
			looping := make(chan struct{})
			var once sync.Once
			done := make(chan *sandbox.Result, 1)
			go func() {
				res, _ := sb.Execute(context.Background(), sandbox.ExecRequest{Code: "print('looping', flush=True)\nwhile True:\n    pass"},
					stdoutSink(func([]byte) { once.Do(func() { close(looping) }) }))
				done <- res
			}()
			select {
			case <-looping:
			case res := <-done:
				t.Fatalf("%s: the loop ended before it was interrupted: %+v", name, res)
			}
			if err := sb.Interrupt(); err != nil {
				t.Errorf("%s: interrupt: %v", name, err)
			}
			if res := <-done; res == nil || res.Error == nil || res.Error.Name != "KeyboardInterrupt" {
				t.Errorf("%s: the interrupted loop: %+v", name, res)
			}
			goesOn("an interrupt")
			if _, err := bounded(t, "Restart", func(ctx context.Context) (struct{}, error) { return struct{}{}, sb.Restart(ctx) }); err != nil {
				t.Errorf("%s: restart: %v", name, err)
			}
			goesOn("a restart")
		}
	}()
	w.checkLeftovers(t, mounts)
}

// restartedView is the view (viewCode) of a sandbox's first runner as a
// runner started anew in it has it: in a sandbox forked from a zygote, in
// one filter (the sandbox's, which init loaded) where the zygote's had
// two, the zygote's own first (the sandbox's and what the zygote needs
// beside: never stricter), as in a classic sandbox.
func restartedView(v string) string {
	if !testutil.ZygoteMode() {
		return v
	}
	return strings.ReplaceAll(v, "Seccomp_filters=2", "Seccomp_filters=1")
}

// TestHostilePauseConcurrentCalls calls Pause, Resume, Execute, Start
// and the workspace at once on one sandbox, as clients racing each other
// would, then Close while a pause may be under way: every call answers
// (within its bound), with a result or ErrPaused, ErrBusy or ErrClosed,
// an execution that runs sees the state as it was, and nothing is left.
func TestHostilePauseConcurrentCalls(t *testing.T) {
	w := newPauseWorld(t)
	mounts := testutil.Mounts()
	s := w.create(t, sandbox.Limits{})
	w.exec(t, s, "x = 41\nopen('kept.txt', 'w').write('kept')", nil)
	expected := func(err error) bool {
		return err == nil || errors.Is(err, sandbox.ErrPaused) || errors.Is(err, sandbox.ErrBusy) || errors.Is(err, sandbox.ErrClosed)
	}
	var mu sync.Mutex
	counts := map[string]int{}
	count := func(what string, err error) {
		mu.Lock()
		defer mu.Unlock()
		switch {
		case err == nil:
			counts[what+" ok"]++
		case errors.Is(err, sandbox.ErrPaused):
			counts[what+" paused"]++
		case errors.Is(err, sandbox.ErrBusy):
			counts[what+" busy"]++
		case errors.Is(err, sandbox.ErrClosed):
			counts[what+" closed"]++
		default:
			counts[what+" failed"]++
		}
	}
	stop := make(chan struct{})
	var closing atomic.Bool
	var wg sync.WaitGroup
	loop := func(what string, f func() error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				err := f()
				count(what, err)
				if !expected(err) {
					t.Errorf("%s: %v", what, err)
				}
				time.Sleep(time.Duration(time.Now().UnixNano()%50) * time.Millisecond)
			}
		}()
	}
	loop("pause", func() error { return w.pause(t, s) })
	loop("resume", func() error { return w.resume(t, s) })
	loop("execute", func() error {
		res, err := bounded(t, "Execute", func(ctx context.Context) (*sandbox.Result, error) {
			return s.Execute(ctx, sandbox.ExecRequest{Code: "print(x + 1)"}, nil)
		})
		if err == nil && res.Status == sandbox.StatusKilled && closing.Load() {
			return sandbox.ErrClosed // Close ended it
		}
		if err == nil && (res.Status != sandbox.StatusOK || res.Stdout != "42\n") {
			return fmt.Errorf("the state after a pause: status %s, stdout %q, stderr %q", res.Status, res.Stdout, res.Stderr)
		}
		return err
	})
	loop("start", func() error {
		p, err := bounded(t, "Start", func(ctx context.Context) (sandbox.Process, error) {
			return s.Start(ctx, sandbox.Command{Argv: []string{"true"}})
		})
		if err == nil {
			select {
			case <-p.Done():
			case <-time.After(pauseCallLimit):
				return errors.New("a command of true did not end")
			}
		}
		return err
	})
	loop("read", func() error {
		r, _, err := s.Workspace().OpenFile("kept.txt")
		if err != nil {
			return err
		}
		defer r.Close()
		b, err := io.ReadAll(r)
		if err == nil && string(b) != "kept" {
			return fmt.Errorf("kept.txt: %q", b)
		}
		return err
	})
	time.Sleep(8 * time.Second)
	// Close while the others go on.
	closing.Store(true)
	w.close(t, s)
	close(stop)
	wg.Wait()
	t.Logf("%v", counts)
	// Executions may all have met a pause under way (busy) on a loaded
	// machine: back-to-back pauses starve their own sandbox's code, which
	// is its caller's doing. Those that ran found the state (above).
	if counts["pause ok"] == 0 || counts["resume ok"] == 0 {
		t.Errorf("no pause or no resume went through: %v", counts)
	}
	w.checkLeftovers(t, mounts)
}

// TestHostilePauseRootView works on the sandbox's whole file system from
// the host (Root, as the files API does) before a pause and after the
// resume: the same answers, and what the sandbox's root may remove
// there never takes a mount away from the running sandbox. A resume
// restores the tree in a new mount namespace and the old one goes: the
// descriptors Root had opened on the old root would see the root tmpfs
// bare, the mount points as empty directories, and the rmdir of one from
// the host is not refused there (it is no mount point in the host's
// namespace), which detaches what is mounted on it in every namespace.
// A resume opens the new root for Root (reopenRoot, pause_linux.go).
func TestHostilePauseRootView(t *testing.T) {
	w := newPauseWorld(t)
	mounts := testutil.Mounts()
	defer w.checkLeftovers(t, mounts)
	s := w.create(t, sandbox.Limits{})
	defer w.close(t, s)
	user, err := s.Root(sandbox.UserSandbox)
	if err != nil {
		t.Fatal(err)
	}
	root, err := s.Root(sandbox.UserRoot)
	if err != nil {
		t.Fatal(err)
	}
	view := func() string {
		var out []string
		for _, p := range []string{"usr/bin/python3", "workspace", "proc/self", "dev/null"} {
			_, err := user.Stat(p)
			out = append(out, fmt.Sprintf("%s: %v", p, err))
		}
		return strings.Join(out, "\n")
	}
	const mounted = "import os\nprint(os.path.exists('/usr/bin/python3'), os.path.exists('/proc/self/status'), os.path.exists('/dev/null'))"
	removeMountPoints := func(when string) {
		for _, p := range []string{"usr", "proc", "dev"} {
			if err := root.Remove(p); err == nil {
				t.Errorf("%s: Root(root).Remove(%q) succeeded", when, p)
			}
		}
		if got := w.exec(t, s, mounted, nil); got != "True True True\n" {
			t.Errorf("%s: the sandbox's /usr, /proc, /dev after Root(root).Remove of them: %q", when, got)
		}
	}
	before := view()
	removeMountPoints("before a pause")
	if err := w.pause(t, s); err != nil {
		t.Fatal(err)
	}
	if err := w.resume(t, s); err != nil {
		t.Fatal(err)
	}
	// As the service does, the root is asked for at each file operation
	// (a Workspace from Root is the sandbox's until its next resume).
	if user, err = s.Root(sandbox.UserSandbox); err != nil {
		t.Fatal(err)
	}
	if root, err = s.Root(sandbox.UserRoot); err != nil {
		t.Fatal(err)
	}
	if after := view(); after != before {
		t.Errorf("the host's view of the sandbox's files after a resume:\n%s\nbefore:\n%s", after, before)
	}
	removeMountPoints("after a resume")
}

// TestHostilePauseForeignCgroups pauses a sandbox while groups that are
// not its own exist in a cgroup v1 hierarchy where its processes sit at
// the root (devices: native sandboxes do not use it; gVisor's runsc and
// other programs make their groups there), then removes two of them and
// changes another's settings before the resume. CRIU saves the whole
// subtree beneath each of a task's groups, so every other group of such
// a hierarchy is named in the images. The resume must succeed, make no
// group of another program again, and leave the other group's settings
// alone. It failed before the fix: the restore makes the removed groups again, as the
// host's root, in another program's tree (under a gVisor backend's
// parent, groups of sandboxes that have ended); and where a group goes
// while the restore runs, the resume fails ("cg: bad cgroup path:
// devices/vivarium-gvisor-pause-test/ID/cgroup.clone_children: No such
// file or directory", seen in this suite's runs beside the gVisor
// tests), so that any program's groups coming and going can keep a
// native sandbox from resuming. The dump and the restore pass no
// --manage-cgroups mode nor --cgroup-root
// (internal/backend/native/checkpoint_linux.go dump, restore_linux.go
// restoreTree): CRIU's default, soft, recreates what is missing.
func TestHostilePauseForeignCgroups(t *testing.T) {
	const hier = "/sys/fs/cgroup/devices"
	if _, err := os.Stat(filepath.Join(hier, "devices.list")); err != nil {
		t.Skip("no cgroup v1 devices hierarchy here")
	}
	w := newPauseWorld(t)
	mounts := testutil.Mounts()
	foreign := filepath.Join(hier, pauseCgroupParent+"-foreign")
	gone, kept := filepath.Join(foreign, "gone"), filepath.Join(foreign, "kept")
	inner := filepath.Join(gone, "inner")
	for _, d := range []string{foreign, gone, inner, kept} {
		if err := os.Mkdir(d, 0o755); err != nil && !os.IsExist(err) {
			t.Fatal(err)
		}
	}
	defer func() {
		os.Remove(inner)
		os.Remove(gone)
		os.Remove(kept)
		os.Remove(foreign)
	}()
	devices := func(d, file, v string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(d, file), []byte(v), 0); err != nil {
			t.Fatalf("%s %s %q: %v", d, file, v, err)
		}
	}
	list := func(d string) string {
		b, _ := os.ReadFile(filepath.Join(d, "devices.list"))
		return strings.TrimSpace(string(b))
	}
	devices(kept, "devices.deny", "a")
	devices(kept, "devices.allow", "c 1:3 rwm")
	func() {
		s := w.create(t, sandbox.Limits{})
		defer w.close(t, s)
		w.exec(t, s, "x = 41", nil)
		if err := w.pause(t, s); err != nil {
			t.Fatal(err)
		}
		imgs, _ := filepath.Glob(filepath.Join(w.dir, s.ID(), "*", "images", "cgroup.img"))
		for _, img := range imgs {
			if b, err := os.ReadFile(img); err == nil && strings.Contains(string(b), pauseCgroupParent+"-foreign") {
				t.Logf("the images name the foreign groups (%s)", img)
			}
		}
		for _, d := range []string{inner, gone} {
			if err := os.Remove(d); err != nil {
				t.Fatal(err)
			}
		}
		devices(kept, "devices.allow", "a *:* rwm")
		if err := w.resume(t, s); err != nil {
			t.Errorf("the resume, once a group of another program was removed: %v", err)
			return
		}
		if got := w.exec(t, s, "print(x + 1)", nil); got != "42\n" {
			t.Errorf("after the resume: %q", got)
		}
		if _, err := os.Stat(gone); err == nil {
			t.Errorf("the resume made %s again", gone)
		}
		if got := list(kept); got != "a *:* rwm" {
			t.Errorf("the resume changed another group's settings: %s devices.list %q, want \"a *:* rwm\"", kept, got)
		}
	}()
	w.checkLeftovers(t, mounts)
}

// TestHostilePausePersisted runs the pause cases through a paused
// sandbox written down and released, then resumed from disk by the same
// server (PersistPaused, ReleasePaused: what a server does 5 s after a
// pause), and written down again and opened from disk (what a restarted
// server does: OpenPaused): each time the sandbox it resumes as has
// the attack's state, and its view of its confinement is the original's
// but for its host range; nothing is left behind. A case whose pause, or
// writing down, is refused says so. The sandboxes are pausable ones of a
// backend with a pause base, as vivarium serve makes them: they start
// from the fixed point and their kept copies refer to the base; in the
// zygote run, forks of the zygote, kept whole.
func TestHostilePausePersisted(t *testing.T) {
	w := newPauseWorldWithBase(t)
	mounts := testutil.Mounts()
	for _, c := range pauseCases {
		t.Run(c.name, func(t *testing.T) {
			s := w.create(t, c.limits)
			defer s.Close()
			before := w.view(t, s)
			if out := w.exec(t, s, c.setup, nil); !strings.HasSuffix(out, "ready\n") {
				t.Fatalf("the attack was not set up: %q", out)
			}
			want := w.exec(t, s, c.check, nil)
			// resumed checks a sandbox resumed from disk (how): the
			// attack's state and its view of its confinement as before.
			resumed := func(r *native.Sandbox, how string) {
				if err := w.resume(t, r); err != nil {
					t.Fatalf("the resume %s failed: %v", how, err)
				}
				if got := settled(func() string { return w.exec(t, r, c.check, nil) }, want); got != want {
					t.Errorf("the attack's state changed %s:\n%s\nwant:\n%s", how, got, want)
				}
				if got := w.view(t, r); normView(got) != normView(before) {
					t.Errorf("the sandbox's view of its confinement changed %s:\n%s\nbefore:\n%s", how, got, before)
				}
			}
			if err := w.pause(t, s); err != nil {
				t.Logf("pause refused: %v", err)
				return
			}
			dir := filepath.Join(t.TempDir(), "kept")
			if _, err := bounded(t, "PersistPaused", func(ctx context.Context) (int64, error) { return s.PersistPaused(ctx, dir) }); err != nil {
				t.Logf("not written down: %v", err)
				return
			}
			// A zygote's sandbox shares the zygote's memory layout, not
			// the base's: it is kept whole.
			m, err := os.ReadFile(filepath.Join(dir, "manifest.json"))
			if based := strings.Contains(string(m), `"base": {`); err != nil || based == testutil.ZygoteMode() {
				t.Errorf("kept against the pause base: %v, want %v (%v)", based, !testutil.ZygoteMode(), err)
			}
			// The same server lets go of it (as 5 s after a pause: its
			// host user, cgroup and memory) and resumes it from disk.
			if err := s.ReleasePaused(dir); err != nil {
				t.Logf("not released: %v", err)
			} else {
				resumed(s, "after its release")
				if err := w.pause(t, s); err != nil {
					t.Logf("the second pause refused: %v", err)
					return
				}
				dir = filepath.Join(t.TempDir(), "kept-again")
				if _, err := bounded(t, "PersistPaused", func(ctx context.Context) (int64, error) { return s.PersistPaused(ctx, dir) }); err != nil {
					t.Logf("not written down again: %v", err)
					return
				}
			}
			w.close(t, s) // the server that paused it is gone
			sbx, err := w.b.OpenPaused(context.Background(), dir, sandbox.FromSnapshot{})
			if err != nil {
				t.Fatal(err)
			}
			o := sbx.(*native.Sandbox)
			defer o.Close()
			resumed(o, "after a restart")
			w.close(t, o)
		})
	}
	w.checkLeftovers(t, mounts)
}

// settleWait bounds settled.
const settleWait = 3 * time.Second

// settled runs check until it prints want, or settleWait has passed, and
// returns what it printed last: a restored process goes back into the
// system call it was blocked in, and is R for that moment (seen on CI: a
// FIFO's blocked opener and reader were R right after a resume, S a
// moment later).
func settled(check func() string, want string) string {
	got := check()
	for deadline := time.Now().Add(settleWait); got != want && time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond)
		got = check()
	}
	return got
}
