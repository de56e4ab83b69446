//go:build linux

package hostile

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/vivarium-sandbox/vivarium/internal/backend/native"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

// The kernel's per-user budgets: each case takes all it can of one, holds
// it, and the host (root) and another sandbox must still be served
// meanwhile (neighbours_test.go). On the native backend every sandbox is a
// host user of its own whose user namespace it owns, so what it takes is
// charged to itself, within the small limits set in its own namespaces.
var budgetCases = append([]hostileCase{coreCase}, []hostileCase{
	{
		name: "take_all_inotify_instances",
		code: holdPrelude + `
n = 0
while libc.inotify_init1(0) >= 0:
    n += 1
held("inotify_instances", n, ctypes.get_errno())
`,
		prepare: func(t *testing.T, h *harness, j *job) {
			watchNeighbours(t, h, hostInotifyInstance, `
fd = libc.inotify_init1(0)
ok, why = fd >= 0, errno.errorcode.get(ctypes.get_errno(), "?")
if ok: os.close(fd)
`)
		},
		check: func(t *testing.T, h *harness, o *outcome) {
			wantHeld(t, h, o, "inotify_instances", native.DefaultKernelLimits.InotifyInstances, "EMFILE")
			neighboursServed(t, o)
		},
	},
	{
		name: "take_all_inotify_watches",
		code: holdPrelude + `
fd = libc.inotify_init1(0)
n, err = 0, 0
for root, dirs, files in os.walk("/usr"):
    for name in dirs + files:
        # IN_DONT_FOLLOW | IN_CREATE | IN_DELETE
        if libc.inotify_add_watch(fd, os.path.join(root, name).encode(), 0x02000000 | 0x100 | 0x200) >= 0:
            n += 1
        elif ctypes.get_errno() == errno.ENOSPC:
            err = errno.ENOSPC
            break
    if err:
        break
held("inotify_watches", n, err)
`,
		prepare: func(t *testing.T, h *harness, j *job) {
			watchNeighbours(t, h, hostInotifyWatch, `
fd = libc.inotify_init1(0)
w = libc.inotify_add_watch(fd, b"/tmp", 0x100)
ok, why = w >= 0, errno.errorcode.get(ctypes.get_errno(), "?")
os.close(fd)
`)
		},
		check: func(t *testing.T, h *harness, o *outcome) {
			// Links and hard links watch one inode twice: the count of
			// successful calls may pass the limit a little.
			n, why := heldCount(t, o, "inotify_watches")
			if isNative(h) && (why != "ENOSPC" || n > 2*int(native.DefaultKernelLimits.InotifyWatches)) {
				t.Errorf("watches stopped after %d with %s; want ENOSPC near %d", n, why, native.DefaultKernelLimits.InotifyWatches)
			}
			neighboursServed(t, o)
		},
	},
	{
		name: "queue_signals_until_refused",
		code: holdPrelude + `
import signal
class Sigval(ctypes.Union):
    _fields_ = [("int", ctypes.c_int), ("ptr", ctypes.c_void_p)]
sig = signal.SIGRTMIN
signal.pthread_sigmask(signal.SIG_BLOCK, [sig])
# sigqueue, not kill: past the limit kill drops the signal's data silently,
# sigqueue is refused.
n = 0
while libc.sigqueue(os.getpid(), sig, Sigval(n)) == 0:
    n += 1
held("pending_signals", n, ctypes.get_errno())
`,
		prepare: func(t *testing.T, h *harness, j *job) {
			// A POSIX timer reserves a queued signal when it is made.
			watchNeighbours(t, h, hostTimer, `
tid = ctypes.c_void_p()
ok = libc.timer_create(1, None, ctypes.byref(tid)) == 0
why = errno.errorcode.get(ctypes.get_errno(), "?")
if ok: libc.timer_delete(tid)
`)
		},
		check: func(t *testing.T, h *harness, o *outcome) {
			wantHeld(t, h, o, "pending_signals", native.DefaultKernelLimits.PendingSignals, "EAGAIN")
			neighboursServed(t, o)
		},
	},
	{
		name: "fill_posix_message_queues",
		code: holdPrelude + `
class Attr(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_long), ("maxmsg", ctypes.c_long), ("msgsize", ctypes.c_long),
                ("curmsgs", ctypes.c_long), ("pad", ctypes.c_long * 4)]
n, err = 0, 0
while True:
    a = Attr(0, 10, 8192, 0)
    if libc.mq_open(b"/fill%d" % n, os.O_CREAT | os.O_RDWR, 0o600, ctypes.byref(a)) < 0:
        err = ctypes.get_errno()
        break
    n += 1
held("mqueues", n, err)
`,
		prepare: func(t *testing.T, h *harness, j *job) {
			watchNeighbours(t, h, hostMQueue, `
name = b"/probe%d" % os.getpid()
fd = libc.mq_open(name, os.O_CREAT | os.O_RDWR, 0o600, None)
ok, why = fd >= 0, errno.errorcode.get(ctypes.get_errno(), "?")
if ok:
    os.close(fd)
    libc.mq_unlink(name)
`)
		},
		check: func(t *testing.T, h *harness, o *outcome) {
			n, why := heldCount(t, o, "mqueues")
			// Each queue of 10 messages of 8 KiB reserves 80 KiB of the
			// sandbox's message-queue bytes.
			if isNative(h) && (why != "EMFILE" || int64(n)*80<<10 > native.DefaultKernelLimits.MsgQueueBytes) {
				t.Errorf("%d queues, then %s; want EMFILE within %d bytes", n, why, native.DefaultKernelLimits.MsgQueueBytes)
			}
			neighboursServed(t, o)
		},
	},
	{
		name:   "reserve_all_pipe_buffers",
		limits: sandbox.Limits{OpenFiles: 1024},
		code: holdPrelude + `
import fcntl
n, err, pipes = 0, 0, []
while True:
    try:
        r, w = os.pipe()
        pipes.append((r, w))
        fcntl.fcntl(w, 1031, 1 << 20)  # F_SETPIPE_SZ
    except OSError as e:
        err = e.errno
        break
    n += 1
held("pipe_buffers", n, err)
`,
		prepare: func(t *testing.T, h *harness, j *job) {
			watchNeighbours(t, h, hostPipeBuffer, `
import fcntl
r, w = os.pipe()
fcntl.fcntl(w, 1031, 1 << 20)
ok = True
os.close(r); os.close(w)
`)
		},
		check: func(t *testing.T, h *harness, o *outcome) {
			// Past the per-user soft limit (pipe-user-pages-soft: 16384
			// pages by default) a user's pipes cannot grow.
			if _, why := heldCount(t, o, "pipe_buffers"); isNative(h) && why != "EPERM" {
				t.Errorf("pipes stopped growing with %s, want EPERM (the sandbox's own budget)", why)
			}
			neighboursServed(t, o)
		},
	},
	{
		name:   "park_descriptors_in_flight",
		limits: sandbox.Limits{OpenFiles: 1024},
		code: holdPrelude + `
import socket
n, err, keep = 0, 0, []
while not err:
    a, b = socket.socketpair()
    a.setblocking(False)
    keep.append((a, b))
    while True:
        try:
            socket.send_fds(a, [b"x"], [b.fileno()] * 100)
        except BlockingIOError:
            break
        except OSError as e:
            err = e.errno
            break
        n += 100
held("in_flight", n, err)
`,
		prepare: func(t *testing.T, h *harness, j *job) {
			// The neighbour may have 256 descriptors: a user with more
			// than that in flight could send it none.
			watchNeighbours(t, h, hostInFlight, `
import socket
a, b = socket.socketpair()
socket.send_fds(a, [b"x"], [b.fileno()])
ok = True
a.close(); b.close()
`)
		},
		check: func(t *testing.T, h *harness, o *outcome) {
			if _, why := heldCount(t, o, "in_flight"); isNative(h) && why != "ETOOMANYREFS" {
				t.Errorf("stopped with %s, want ETOOMANYREFS", why)
			}
			neighboursServed(t, o)
		},
	},
	{
		name: "lock_shared_memory",
		code: holdPrelude + `
libc.shmctl.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
n, err = 0, 0
while True:
    shm = libc.shmget(0, 16384, 0o1000 | 0o600)  # IPC_PRIVATE, IPC_CREAT
    if shm < 0 or libc.shmctl(shm, 11, None) != 0:  # SHM_LOCK
        err = ctypes.get_errno()
        break
    n += 1
held("locked_memory", n, err)
`,
		prepare: func(t *testing.T, h *harness, j *job) {
			watchNeighbours(t, h, hostShmLock, `
libc.shmctl.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
shm = libc.shmget(0, 16384, 0o1000 | 0o600)
ok = shm >= 0 and libc.shmctl(shm, 11, None) == 0
why = errno.errorcode.get(ctypes.get_errno(), "?")
if shm >= 0: libc.shmctl(shm, 0, None)  # IPC_RMID
`)
		},
		check: func(t *testing.T, h *harness, o *outcome) {
			wantHeld(t, h, o, "locked_memory", native.DefaultKernelLimits.LockedMemory/16384, "ENOMEM")
			neighboursServed(t, o)
		},
	},
	{
		// Socket buffers count against the host-wide net.ipv4.tcp_mem
		// and udp_mem; a sandbox's must be charged to it, within its
		// memory limit (v1 does only with memory.kmem.tcp set).
		name:   "fill_socket_buffers",
		limits: sandbox.Limits{OpenFiles: 1024},
		code: holdPrelude + `
import socket, struct
def dropped(r):
    # SO_MEMINFO's SK_MEMINFO_DROPS: a datagram that found no room.
    try:
        return struct.unpack("9I", r.getsockopt(socket.SOL_SOCKET, 55, 36))[8]
    except OSError:
        return 0
payload, socks, err = b"x" * 60000, [], 0
try:
    while len(socks) < 400:
        r = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        r.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
        r.bind(("127.0.0.1", 0))
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.setblocking(False)
        for _ in range(200):
            try:
                s.sendto(payload, r.getsockname())
            except BlockingIOError:
                break
            if dropped(r):
                # Full (its buffer, or the memory its sockets may
                # charge): more would be copied only to be dropped,
                # which under load takes longer than the case may.
                break
        socks.append((r, s))
except OSError as e:
    err = e.errno
held("socket_buffers", len(socks), err)
`,
		prepare: func(t *testing.T, h *harness, j *job) {
			w := watchSocketMemory(t)
			watchNeighbours(t, h, w.probe, `
import socket
a = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
a.bind(("127.0.0.1", 0))
a.sendto(b"ping", a.getsockname())
a.settimeout(2)
ok = a.recv(16) == b"ping"
a.close()
`)
		},
		check: func(t *testing.T, h *harness, o *outcome) {
			// Where the buffers are the sandbox's own memory (gVisor's
			// network stack), its memory limit may end the case first.
			heldOrMemoryLimit("socket_buffers")(t, h, o)
			socketMemoryWithin(t, o.limits.Memory)
		},
	},
	{
		name: "take_every_process_slot",
		code: holdPrelude + `
n, err = 0, 0
while True:
    try:
        pid = os.fork()
    except OSError as e:
        err = e.errno
        break
    if pid == 0:
        time.sleep(60)
        os._exit(0)
    n += 1
held("processes", n, err)
`,
		prepare: func(t *testing.T, h *harness, j *job) {
			watchNeighbours(t, h, hostFork, `
pid = os.fork()
if pid == 0:
    os._exit(0)
os.waitpid(pid, 0)
ok = True
`)
		},
		check: func(t *testing.T, h *harness, o *outcome) {
			wantHeld(t, h, o, "processes", int64(o.limits.Pids), "EAGAIN")
			neighboursServed(t, o)
		},
	},
}...)

// coreCase crashes processes every way it can while the host's
// core_pattern pipes dumps to a handler (systemd-coredump and apport do
// this, as host root): the handler must never run for the sandbox.
var coreCase = hostileCase{
	name: "crash_runs_no_host_core_handler",
	code: `
import ctypes, os, resource, signal, subprocess
libc = ctypes.CDLL(None, use_errno=True)

def crash(label, how):
    pid = os.fork()
    if pid == 0:
        libc.prctl(15, b"vivcrash", 0, 0, 0)  # PR_SET_NAME
        how()
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    print(label, "signal" if os.WIFSIGNALED(status) else "exit", flush=True)

def lower_core_limit():
    try:
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    except (OSError, ValueError):  # EPERM is a ValueError here
        pass
    os.abort()

def dumpable_again():
    libc.prctl(4, 1, 0, 0, 0)  # PR_SET_DUMPABLE
    os.kill(os.getpid(), signal.SIGQUIT)

crash("abort", os.abort)
crash("segv", lambda: ctypes.string_at(0))
crash("core limit lowered", lower_core_limit)
crash("dumpable again", dumpable_again)
r = subprocess.run(["sh", "-c", "kill -SEGV $$"])
print("shell", r.returncode)
`,
	prepare: func(t *testing.T, h *harness, j *job) {
		dir := t.TempDir()
		log := dir + "/handled"
		handler := dir + "/handler"
		script := "#!/bin/sh\necho \"$1 $2\" >> " + log + "\ncat > /dev/null\n"
		if err := os.WriteFile(handler, []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
		setCorePattern(t, "|"+handler+" %u %e")
		j.vars["HANDLED"] = log
	},
	check: func(t *testing.T, h *harness, o *outcome) {
		wantOK(t, o, lines("abort signal", "segv signal", "core limit lowered signal", "dumpable again signal", "shell -11"))
		b, _ := os.ReadFile(o.vars["HANDLED"])
		for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			// Host processes (uid 0) may crash meanwhile; a sandbox's
			// never reach the handler.
			if f := strings.Fields(line); len(f) == 2 && f[0] != "0" {
				t.Errorf("the host's core handler ran for a sandbox's crash: uid %s, %s", f[0], f[1])
			}
		}
	},
}

// setCorePattern sets the host's core_pattern for the rest of the test
// (cases that change it run one at a time), and restores it after.
func setCorePattern(t *testing.T, pattern string) {
	const path = "/proc/sys/kernel/core_pattern"
	corePatternMu.Lock()
	old, err := os.ReadFile(path)
	if err == nil {
		err = os.WriteFile(path, []byte(pattern), 0o644)
	}
	if err != nil {
		corePatternMu.Unlock()
		t.Fatalf("core_pattern: %v", err)
	}
	t.Cleanup(func() {
		defer corePatternMu.Unlock()
		if err := os.WriteFile(path, old, 0o644); err != nil {
			t.Errorf("restore core_pattern: %v", err)
		}
	})
}

var corePatternMu sync.Mutex

func isNative(h *harness) bool { return strings.HasPrefix(h.be.Name, "native") }

// wantHeld: on the native backend, the case stopped at the sandbox's own
// limit (at most max) for the reason the kernel gives there.
func wantHeld(t *testing.T, h *harness, o *outcome, name string, max int64, reason string) {
	t.Helper()
	n, why := heldCount(t, o, name)
	if isNative(h) && (why != reason || int64(n) > max) {
		t.Errorf("%s: took %d, then %s; want at most %d, then %s", name, n, why, max, reason)
	}
}

// The host's probes, as root in this process.

func hostInotifyInstance() error {
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC)
	if err != nil {
		return fmt.Errorf("inotify_init1: %w", err)
	}
	return unix.Close(fd)
}

func hostInotifyWatch() error {
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC)
	if err != nil {
		return fmt.Errorf("inotify_init1: %w", err)
	}
	defer unix.Close(fd)
	if _, err := unix.InotifyAddWatch(fd, os.TempDir(), unix.IN_CREATE); err != nil {
		return fmt.Errorf("inotify_add_watch: %w", err)
	}
	return nil
}

func hostTimer() error {
	var id int32
	if _, _, e := unix.Syscall(unix.SYS_TIMER_CREATE, unix.CLOCK_MONOTONIC, 0, uintptr(unsafe.Pointer(&id))); e != 0 {
		return fmt.Errorf("timer_create: %w", e)
	}
	unix.Syscall(unix.SYS_TIMER_DELETE, uintptr(id), 0, 0)
	return nil
}

var mqSeq atomic.Int64

func hostMQueue() error {
	name, err := unix.BytePtrFromString(fmt.Sprintf("vivarium-probe-%d-%d", os.Getpid(), mqSeq.Add(1)))
	if err != nil {
		return err
	}
	fd, _, e := unix.Syscall6(unix.SYS_MQ_OPEN, uintptr(unsafe.Pointer(name)), unix.O_CREAT|unix.O_EXCL|unix.O_RDWR|unix.O_CLOEXEC, 0o600, 0, 0, 0)
	if e != 0 {
		return fmt.Errorf("mq_open: %w", e)
	}
	unix.Close(int(fd))
	unix.Syscall(unix.SYS_MQ_UNLINK, uintptr(unsafe.Pointer(name)), 0, 0)
	return nil
}

func hostPipeBuffer() error {
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		return err
	}
	defer unix.Close(p[0])
	defer unix.Close(p[1])
	if _, err := unix.FcntlInt(uintptr(p[1]), unix.F_SETPIPE_SZ, 1<<20); err != nil {
		return fmt.Errorf("F_SETPIPE_SZ: %w", err)
	}
	return nil
}

func hostInFlight() error {
	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(pair[0])
	defer unix.Close(pair[1])
	if err := unix.Sendmsg(pair[0], []byte("x"), unix.UnixRights(pair[1]), nil, 0); err != nil {
		return fmt.Errorf("SCM_RIGHTS: %w", err)
	}
	return nil
}

func hostShmLock() error {
	id, err := unix.SysvShmGet(unix.IPC_PRIVATE, 16384, unix.IPC_CREAT|0o600)
	if err != nil {
		return fmt.Errorf("shmget: %w", err)
	}
	defer unix.SysvShmCtl(id, unix.IPC_RMID, nil)
	if _, err := unix.SysvShmCtl(id, shmLock, nil); err != nil {
		return fmt.Errorf("SHM_LOCK: %w", err)
	}
	return nil
}

func hostFork() error {
	if err := exec.Command("/bin/true").Run(); err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return nil
		}
		return fmt.Errorf("fork and exec: %w", err)
	}
	return nil
}

// shmLock is SHM_LOCK (linux/shm.h), which x/sys/unix does not name.
const shmLock = 11

// socketMemory follows the host's socket buffer memory (TCP and UDP, every
// namespace's: /proc/net/sockstat's counters are the kernel's global ones)
// while a case runs, and checks that a round trip on the host's loopback
// still works.
type socketMemory struct {
	baseline int64
	max      atomic.Int64
}

var (
	socketMemoryMu  sync.Mutex
	socketMemorySet = map[string]*socketMemory{}
)

func watchSocketMemory(t *testing.T) *socketMemory {
	w := &socketMemory{baseline: hostSocketPages(t)}
	socketMemoryMu.Lock()
	socketMemorySet[t.Name()] = w
	socketMemoryMu.Unlock()
	return w
}

func (w *socketMemory) probe() error {
	pages := hostSocketPages(nil)
	for {
		old := w.max.Load()
		if pages <= old || w.max.CompareAndSwap(old, pages) {
			break
		}
	}
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("socket: %w", err)
	}
	defer unix.Close(fd)
	if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		return fmt.Errorf("bind: %w", err)
	}
	sa, err := unix.Getsockname(fd)
	if err != nil {
		return err
	}
	if err := unix.Sendto(fd, []byte("ping"), 0, sa); err != nil {
		return fmt.Errorf("sendto: %w", err)
	}
	unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Sec: 2})
	buf := make([]byte, 16)
	if n, _, err := unix.Recvfrom(fd, buf, 0); err != nil || string(buf[:n]) != "ping" {
		return fmt.Errorf("loopback round trip: %v", err)
	}
	return nil
}

// socketMemoryWithin: at its highest, the host's socket memory grew by no
// more than the sandbox's memory limit (and a little for everyone else).
func socketMemoryWithin(t *testing.T, limit int64) {
	t.Helper()
	socketMemoryMu.Lock()
	w := socketMemorySet[t.Name()]
	delete(socketMemorySet, t.Name())
	socketMemoryMu.Unlock()
	if w == nil {
		t.Fatal("no socket memory watch")
	}
	grew := (w.max.Load() - w.baseline) * 4096
	if grew > limit+limit/4 {
		t.Errorf("the host's socket buffers grew by %d MiB while the case held them; its memory limit is %d MiB",
			grew>>20, limit>>20)
	}
}

// hostSocketPages sums the TCP and UDP "mem" counters of /proc/net/sockstat.
func hostSocketPages(t *testing.T) int64 {
	b, err := os.ReadFile("/proc/net/sockstat")
	if err != nil {
		if t != nil {
			t.Fatal(err)
		}
		return 0
	}
	var total int64
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || (f[0] != "TCP:" && f[0] != "UDP:") {
			continue
		}
		for i := 1; i+1 < len(f); i++ {
			if f[i] == "mem" {
				n, _ := strconv.ParseInt(f[i+1], 10, 64)
				total += n
			}
		}
	}
	return total
}
