//go:build linux

package hostile

import (
	"fmt"
	"os"
	"runtime"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The seccomp allowlist (internal/seccomp): the calls and arguments it
// refuses, each with its exact answer, and the host-wide state those calls
// would have reached, checked from the host while or after the sandbox
// tried. The cases of cases_privilege_test.go (seccompCases) cover the
// calls the filter refused as a deny list already.
var allowlistCases = []hostileCase{
	{
		// socket() refused these families already; socketpair() reached
		// their kernel code (a socket is made before the family says it
		// has no pairs).
		name: "seccomp_socket_families",
		code: withAllowlistProbes(`
sv = _ctypes.create_string_buffer(8)
AF_UNIX, AF_NETLINK, AF_PACKET, AF_VSOCK, AF_XDP, AF_BLUETOOTH = 1, 16, 17, 40, 44, 31
SOCK_STREAM, SOCK_DGRAM, SOCK_RAW = 1, 2, 3
NETLINK_ROUTE, NETLINK_SOCK_DIAG, NETLINK_GENERIC, NETLINK_KOBJECT_UEVENT = 0, 4, 16, 15
syscall("socketpair unix", "socketpair", AF_UNIX, SOCK_STREAM, 0, sv)
syscall("socketpair vsock", "socketpair", AF_VSOCK, SOCK_STREAM, 0, sv)
syscall("socketpair packet", "socketpair", AF_PACKET, SOCK_RAW, 0, sv)
syscall("socketpair xdp", "socketpair", AF_XDP, SOCK_RAW, 0, sv)
syscall("socketpair bluetooth", "socketpair", AF_BLUETOOTH, SOCK_STREAM, 0, sv)
syscall("socketpair netlink generic", "socketpair", AF_NETLINK, SOCK_RAW, NETLINK_GENERIC, sv)
syscall("socket xdp", "socket", AF_XDP, SOCK_RAW, 0)
syscall("netlink route", "socket", AF_NETLINK, SOCK_RAW, NETLINK_ROUTE)
syscall("netlink sock_diag", "socket", AF_NETLINK, SOCK_RAW, NETLINK_SOCK_DIAG)
syscall("netlink generic", "socket", AF_NETLINK, SOCK_RAW, NETLINK_GENERIC)
syscall("netlink uevent", "socket", AF_NETLINK, SOCK_RAW, NETLINK_KOBJECT_UEVENT)
import socket
print("getaddrinfo localhost", socket.getaddrinfo("localhost", 80)[0][4][0] in ("127.0.0.1", "::1"))
`),
		check: func(t *testing.T, h *harness, o *outcome) {
			wantOK(t, o, lines("socketpair unix ok", "socketpair vsock EAFNOSUPPORT", "socketpair packet EAFNOSUPPORT",
				"socketpair xdp EAFNOSUPPORT", "socketpair bluetooth EAFNOSUPPORT",
				"socketpair netlink generic EPROTONOSUPPORT", "socket xdp EAFNOSUPPORT", "netlink route ok",
				"netlink sock_diag EPROTONOSUPPORT", "netlink generic EPROTONOSUPPORT",
				"netlink uevent EPROTONOSUPPORT", "getaddrinfo localhost True"))
		},
	},
	{
		// Calls a kernel may be built without: ENOSYS, as such a kernel
		// answers, which programs fall back from. Calls the policy knows
		// and refuses: EPERM, where the kernel would have run them.
		name: "seccomp_refused_calls",
		code: withAllowlistProbes(`
buf = _ctypes.create_string_buffer(4096)
syscall("memfd_secret", "memfd_secret", 0)
syscall("set_mempolicy", "set_mempolicy", 0, 0, 0)
syscall("set_mempolicy_home_node", "set_mempolicy_home_node", 0, 4096, 0, 0)
syscall("get_mempolicy", "get_mempolicy", 0, 0, 0, 0, 0)
syscall("mbind", "mbind", buf, 4096, 0, 0, 0, 0)
syscall("migrate_pages", "migrate_pages", 0, 0, 0, 0)
syscall("move_pages", "move_pages", 0, 0, 0, 0, 0, 0)
if "modify_ldt" in NR:
    syscall("modify_ldt", "modify_ldt", 0, buf, 16)
else:
    print("modify_ldt ENOSYS")  # arm64 has no such call: the kernel's answer
NR[1000] = 1000  # a number no system call has
syscall("unknown number 1000", 1000)
syscall("lsm_list_modules", "lsm_list_modules", buf, _ctypes.byref(_ctypes.c_uint32(4096)), 0)
syscall("listmount", "listmount", buf, buf, 1, 0)
syscall("process_mrelease", "process_mrelease", 0, 0)
syscall("fanotify_mark", "fanotify_mark", 0, 0, 0, 0, 0)
`),
		check: func(t *testing.T, h *harness, o *outcome) {
			wantOK(t, o, lines("memfd_secret ENOSYS", "set_mempolicy ENOSYS", "set_mempolicy_home_node ENOSYS",
				"get_mempolicy ENOSYS", "mbind ENOSYS", "migrate_pages ENOSYS", "move_pages ENOSYS",
				"modify_ldt ENOSYS", "unknown number 1000 ENOSYS", "lsm_list_modules EPERM", "listmount EPERM",
				"process_mrelease EPERM", "fanotify_mark EPERM"))
		},
	},
	{
		// One io_setup(65536) took all of fs.aio-max-nr, a pool for the
		// whole host. The sandbox tries, then holds what it got while the
		// host keeps setting up contexts of its own.
		name: "seccomp_aio_pool",
		code: withAllowlistProbes(`
import time
ctx = _ctypes.c_ulong(0)
syscall("io_setup 65536", "io_setup", 65536, _ctypes.byref(ctx))
syscall("io_setup 1", "io_setup", 1, _ctypes.byref(ctx))
syscall("io_submit", "io_submit", 0, 0, 0)
syscall("io_getevents", "io_getevents", 0, 0, 0, 0, 0)
syscall("io_pgetevents", "io_pgetevents", 0, 0, 0, 0, 0, 0)
syscall("io_cancel", "io_cancel", 0, 0, 0)
syscall("io_destroy", "io_destroy", 0)
time.sleep(1.5)
`),
		prepare: func(t *testing.T, h *harness, j *job) { startAIOProbe(t) },
		check: func(t *testing.T, h *harness, o *outcome) {
			runs, err := stopAIOProbe(t)
			if err != nil {
				t.Errorf("the host's io_setup(1) failed while the sandbox ran: %v", err)
			}
			if runs == 0 {
				t.Errorf("the host's io_setup(1) never ran while the sandbox did")
			}
			wantOK(t, o, lines("io_setup 65536 ENOSYS", "io_setup 1 ENOSYS", "io_submit ENOSYS",
				"io_getevents ENOSYS", "io_pgetevents ENOSYS", "io_cancel ENOSYS", "io_destroy ENOSYS"))
		},
	},
	{
		// posix_fadvise(DONTNEED) on a /usr file evicted the host's page
		// cache of it; RWF_NOWAIT reads and cachestat then told whether
		// anyone had read it since. The host caches the file, the sandbox
		// tries, the host finds every page still cached.
		name: "seccomp_page_cache",
		code: withAllowlistProbes(`
path = os.environ["CACHED_FILE"]
fd = os.open(path, os.O_RDONLY)
print("read", len(os.read(fd, 1 << 20)) == os.fstat(fd).st_size)
attempt("preadv2", os.preadv, fd, [bytearray(4096)], 0, 0)
attempt("fadvise WILLNEED", os.posix_fadvise, fd, 0, 0, os.POSIX_FADV_WILLNEED)
attempt("preadv2 RWF_NOWAIT", os.preadv, fd, [bytearray(4096)], 0, os.RWF_NOWAIT)
w = os.open("/tmp/w", os.O_WRONLY | os.O_CREAT)
attempt("pwritev2 RWF_NOWAIT", os.pwritev, w, [b"x"], 0, os.RWF_NOWAIT)
cstat = _ctypes.create_string_buffer(64)
crange = _ctypes.create_string_buffer(16)
syscall("cachestat", "cachestat", fd, crange, cstat, 0)
# Last: nothing may read the file after, which would cache it again.
attempt("fadvise DONTNEED", os.posix_fadvise, fd, 0, 0, os.POSIX_FADV_DONTNEED)
syscall("fadvise64 DONTNEED", "fadvise64", fd, 0, 0, 4)
`),
		prepare: func(t *testing.T, h *harness, j *job) {
			path := cachedUsrFile(t)
			j.vars["CACHED_FILE"] = path
		},
		check: func(t *testing.T, h *harness, o *outcome) {
			// ENOTSUP is Python's name for EOPNOTSUPP, the same number.
			wantOK(t, o, lines("read True", "preadv2 ok", "fadvise WILLNEED ok", "preadv2 RWF_NOWAIT ENOTSUP",
				"pwritev2 RWF_NOWAIT ENOTSUP", "cachestat ENOSYS", "fadvise DONTNEED ok", "fadvise64 DONTNEED ok"))
			// The sandbox's DONTNEED of the whole file would leave no page
			// cached. A page or two may go meanwhile on their own: a host
			// with proactive reclaim (DAMON's pageout, a balloon) pages out
			// what it finds cold at any time.
			path := o.vars["CACHED_FILE"]
			if cached, total := cachedPages(t, path); cached*2 < total {
				t.Errorf("%s: %d of %d pages left in the host's page cache after the sandbox's DONTNEED", path, cached, total)
			} else if cached < total {
				t.Logf("%s: %d of %d pages left in the host's page cache (the host's own reclaim)", path, cached, total)
			}
		},
	},
	{
		// RLIMIT_CORE stays as the sandbox's init set it: lowering it to 0
		// would let a crash run the host's core_pattern pipe as host root.
		name: "seccomp_core_limit",
		code: withAllowlistProbes(`
import resource
RLIMIT_CORE, RLIMIT_NOFILE = 4, 7
zero = (_ctypes.c_uint64 * 2)(0, 0)
old = (_ctypes.c_uint64 * 2)()
syscall("setrlimit core 0", "setrlimit", RLIMIT_CORE, zero)
syscall("prlimit64 core 0", "prlimit64", 0, RLIMIT_CORE, zero, 0)
syscall("prlimit64 core read", "prlimit64", 0, RLIMIT_CORE, 0, old)
attempt("resource.setrlimit core", resource.setrlimit, resource.RLIMIT_CORE, (0, 0))
before = resource.getrlimit(resource.RLIMIT_CORE)
print("getrlimit core unchanged", before == (old[0], old[1]))
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
attempt("lower nofile", resource.setrlimit, resource.RLIMIT_NOFILE, (soft // 2, hard))
print("nofile lowered", resource.getrlimit(resource.RLIMIT_NOFILE)[0] == soft // 2)
`),
		check: func(t *testing.T, h *harness, o *outcome) {
			wantOK(t, o, lines("setrlimit core 0 EPERM", "prlimit64 core 0 EPERM", "prlimit64 core read ok",
				"resource.setrlimit core ValueError", "getrlimit core unchanged True", "lower nofile ok",
				"nofile lowered True"))
		},
	},
	{
		name: "seccomp_prctl_options",
		code: withAllowlistProbes(`
PR_SET_PDEATHSIG, PR_GET_DUMPABLE, PR_SET_DUMPABLE, PR_SET_NAME = 1, 3, 4, 15
PR_CAPBSET_READ, PR_CAPBSET_DROP, PR_SET_SECUREBITS, PR_SET_MM = 23, 24, 28, 35
PR_CAP_AMBIENT, PR_CAP_AMBIENT_IS_SET, PR_CAP_AMBIENT_RAISE, PR_CAP_AMBIENT_CLEAR_ALL = 47, 1, 2, 4
PR_SET_MEMORY_MERGE, PR_SET_PTRACER, PR_SET_IO_FLUSHER = 67, 0x59616d61, 57
syscall("set dumpable 1", "prctl", PR_SET_DUMPABLE, 1, 0, 0, 0)
syscall("set dumpable 0", "prctl", PR_SET_DUMPABLE, 0, 0, 0, 0)
print("dumpable", _libc.prctl(PR_GET_DUMPABLE, 0, 0, 0, 0))
syscall("set dumpable 1 again", "prctl", PR_SET_DUMPABLE, 1, 0, 0, 0)
syscall("set name", "prctl", PR_SET_NAME, "hostile", 0, 0, 0)
syscall("pdeathsig", "prctl", PR_SET_PDEATHSIG, 9, 0, 0, 0)
syscall("capbset read", "prctl", PR_CAPBSET_READ, 0, 0, 0, 0)
syscall("capbset drop", "prctl", PR_CAPBSET_DROP, 0, 0, 0, 0)
syscall("set securebits", "prctl", PR_SET_SECUREBITS, 0, 0, 0, 0)
syscall("ambient is_set", "prctl", PR_CAP_AMBIENT, PR_CAP_AMBIENT_IS_SET, 0, 0, 0)
syscall("ambient raise", "prctl", PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE, 0, 0, 0)
syscall("ambient clear", "prctl", PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
syscall("set mm", "prctl", PR_SET_MM, 1, 0, 0, 0)
syscall("memory merge", "prctl", PR_SET_MEMORY_MERGE, 1, 0, 0, 0)
syscall("set ptracer", "prctl", PR_SET_PTRACER, -1, 0, 0, 0)
syscall("io flusher", "prctl", PR_SET_IO_FLUSHER, 1, 0, 0, 0)
`),
		check: func(t *testing.T, h *harness, o *outcome) {
			// PR_CAPBSET_READ of capability 0 is 0: the bounding set is
			// empty.
			wantOK(t, o, lines("set dumpable 1 EPERM", "set dumpable 0 ok", "dumpable 0",
				"set dumpable 1 again EPERM", "set name ok", "pdeathsig ok", "capbset read ok",
				"capbset drop EPERM", "set securebits EPERM", "ambient is_set ok", "ambient raise EPERM",
				"ambient clear EPERM", "set mm EPERM", "memory merge EPERM", "set ptracer EPERM",
				"io flusher EPERM"))
		},
	},
	{
		// ioctl is an allowlist of requests: what terminals, descriptors
		// and the sandbox's own interfaces need, nothing else.
		name: "seccomp_ioctl_requests",
		code: withAllowlistProbes(`
import fcntl, socket, struct
r, w = os.pipe()
n = _ctypes.c_int()
buf = _ctypes.create_string_buffer(64)
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
ifr = _ctypes.create_string_buffer(b"lo", 40)
syscall("FIONREAD pipe", "ioctl", r, 0x541B, _ctypes.byref(n))
syscall("FIOCLEX", "ioctl", r, 0x5451, 0)
syscall("FIONBIO", "ioctl", r, 0x5421, _ctypes.byref(n))
syscall("TCGETS pipe", "ioctl", r, ` + fmt.Sprint(unix.TCGETS) + `, buf)
syscall("SIOCGIFFLAGS lo", "ioctl", s.fileno(), ` + fmt.Sprint(unix.SIOCGIFFLAGS) + `, ifr)
syscall("SIOCSIFFLAGS lo", "ioctl", s.fileno(), ` + fmt.Sprint(unix.SIOCSIFFLAGS) + `, ifr)
syscall("SIOCETHTOOL lo", "ioctl", s.fileno(), ` + fmt.Sprint(unix.SIOCETHTOOL) + `, ifr)
syscall("TIOCSETD", "ioctl", r, ` + fmt.Sprint(unix.TIOCSETD) + `, _ctypes.byref(n))
syscall("TIOCCONS", "ioctl", r, ` + fmt.Sprint(unix.TIOCCONS) + `, 0)
syscall("FICLONE", "ioctl", w, ` + fmt.Sprint(unix.FICLONE) + `, r)
syscall("FS_IOC_GETFLAGS", "ioctl", r, ` + fmt.Sprint(unix.FS_IOC_GETFLAGS) + `, buf)
print("isatty", os.isatty(r))
`),
		check: func(t *testing.T, h *harness, o *outcome) {
			// TCGETS on a pipe is the kernel's ENOTTY: the request passed.
			wantOK(t, o, lines("FIONREAD pipe ok", "FIOCLEX ok", "FIONBIO ok", "TCGETS pipe ENOTTY",
				"SIOCGIFFLAGS lo ok", "SIOCSIFFLAGS lo EPERM", "SIOCETHTOOL lo EPERM", "TIOCSETD EPERM",
				"TIOCCONS EPERM", "FICLONE EPERM", "FS_IOC_GETFLAGS EPERM", "isatty False"))
		},
	},
	{
		// KSM merging tells one tenant, by timing a write, whether another
		// holds the same page; sync writes back the host's dirty pages and
		// its duration tells how much the host wrote.
		name: "seccomp_ksm_and_sync",
		code: withAllowlistProbes(`
import mmap
m = mmap.mmap(-1, 1 << 16)
addr = _ctypes.addressof(_ctypes.c_char.from_buffer(m))
MADV_MERGEABLE, MADV_DONTNEED = 12, 4
syscall("madvise MERGEABLE", "madvise", addr, 1 << 16, MADV_MERGEABLE)
syscall("madvise DONTNEED", "madvise", addr, 1 << 16, MADV_DONTNEED)
syscall("sync", "sync")
syscall("syncfs", "syncfs", os.open("/usr", os.O_RDONLY))
os.sync()
print("os.sync ok")
`),
		check: func(t *testing.T, h *harness, o *outcome) {
			wantOK(t, o, lines("madvise MERGEABLE EINVAL", "madvise DONTNEED ok", "sync ok", "syncfs ok", "os.sync ok"))
		},
	},
}

// allowlistSyscalls are the numbers these cases call by name, beyond
// syscallNumbers.
func allowlistSyscalls() map[string]uintptr {
	nrs := map[string]uintptr{
		"socket": unix.SYS_SOCKET, "socketpair": unix.SYS_SOCKETPAIR, "memfd_secret": unix.SYS_MEMFD_SECRET,
		"set_mempolicy": unix.SYS_SET_MEMPOLICY, "set_mempolicy_home_node": unix.SYS_SET_MEMPOLICY_HOME_NODE,
		"get_mempolicy": unix.SYS_GET_MEMPOLICY, "mbind": unix.SYS_MBIND, "migrate_pages": unix.SYS_MIGRATE_PAGES,
		"move_pages": unix.SYS_MOVE_PAGES, "lsm_list_modules": unix.SYS_LSM_LIST_MODULES,
		"listmount": unix.SYS_LISTMOUNT, "process_mrelease": unix.SYS_PROCESS_MRELEASE,
		"fanotify_mark": unix.SYS_FANOTIFY_MARK, "io_setup": unix.SYS_IO_SETUP, "io_submit": unix.SYS_IO_SUBMIT,
		"io_getevents": unix.SYS_IO_GETEVENTS, "io_pgetevents": unix.SYS_IO_PGETEVENTS,
		"io_cancel": unix.SYS_IO_CANCEL, "io_destroy": unix.SYS_IO_DESTROY, "fadvise64": unix.SYS_FADVISE64,
		"cachestat": unix.SYS_CACHESTAT, "setrlimit": unix.SYS_SETRLIMIT, "prlimit64": unix.SYS_PRLIMIT64,
		"prctl": unix.SYS_PRCTL, "madvise": unix.SYS_MADVISE, "sync": unix.SYS_SYNC, "syncfs": unix.SYS_SYNCFS,
	}
	if runtime.GOARCH == "amd64" {
		nrs["modify_ldt"] = 154 // SYS_MODIFY_LDT; arm64 has no such call
	}
	return nrs
}

// withAllowlistProbes is withProbes, with allowlistSyscalls in NR.
func withAllowlistProbes(code string) string {
	nrs := allowlistSyscalls()
	names := make([]string, 0, len(nrs))
	for n := range nrs {
		names = append(names, n)
	}
	sort.Strings(names)
	var b strings.Builder
	b.WriteString("NR.update({\n")
	for _, n := range names {
		fmt.Fprintf(&b, "    %q: %d,\n", n, nrs[n])
	}
	b.WriteString("})\n\n")
	return withProbes(b.String() + code)
}

// aioProbes are the host's io_setup probes running, by test.
var aioProbes sync.Map

type aioProbe struct {
	stop chan struct{}
	done chan struct{}
	runs int
	err  error
}

// startAIOProbe sets up and destroys a one-event AIO context on the host,
// again and again, until stopAIOProbe: what a database on the host does,
// which a sandbox holding fs.aio-max-nr would make fail with EAGAIN.
func startAIOProbe(t *testing.T) {
	p := &aioProbe{stop: make(chan struct{}), done: make(chan struct{})}
	aioProbes.Store(t.Name(), p)
	t.Cleanup(func() { stopAIOProbe(t) })
	go func() {
		defer close(p.done)
		for {
			var ctx uint64
			if _, _, e := unix.Syscall(unix.SYS_IO_SETUP, 1, uintptr(unsafe.Pointer(&ctx)), 0); e != 0 {
				if p.err == nil {
					p.err = e
				}
			} else {
				unix.Syscall(unix.SYS_IO_DESTROY, uintptr(ctx), 0, 0)
			}
			p.runs++
			select {
			case <-p.stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
}

// stopAIOProbe stops the test's probe and says how many times it ran and
// its first error.
func stopAIOProbe(t *testing.T) (int, error) {
	v, ok := aioProbes.LoadAndDelete(t.Name())
	if !ok {
		return 0, nil
	}
	p := v.(*aioProbe)
	close(p.stop)
	<-p.done
	return p.runs, p.err
}

// cachedUsrFile is a file of the host's /usr, of several pages, that no
// process maps (a mapped page survives DONTNEED anyway), read into the
// host's page cache.
func cachedUsrFile(t *testing.T) string {
	t.Helper()
	for _, p := range []string{"/usr/share/common-licenses/GPL-3", "/usr/share/common-licenses/GPL-2",
		"/usr/share/common-licenses/Apache-2.0", "/usr/lib/python3.11/os.py", "/usr/lib/python3/dist-packages/README.txt"} {
		st, err := os.Stat(p)
		if err != nil || !st.Mode().IsRegular() || st.Size() < 4*4096 {
			continue
		}
		if _, err := os.ReadFile(p); err != nil {
			t.Fatal(err)
		}
		if cached, total := cachedPages(t, p); cached != total {
			t.Fatalf("%s: only %d of %d pages cached right after reading it", p, cached, total)
		}
		return p
	}
	t.Skip("no unmapped file of several pages found under /usr")
	return ""
}

// cachedPages counts the pages of path in the page cache: mincore on a
// mapping of the file, which reports the page cache for a file its caller
// owns or may write (root, here), not only its own page tables.
func cachedPages(t *testing.T, path string) (cached, total int) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	size := int(st.Size())
	m, err := unix.Mmap(int(f.Fd()), 0, size, unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(m)
	vec := make([]byte, (size+4095)/4096)
	if _, _, e := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&m[0])), uintptr(size), uintptr(unsafe.Pointer(&vec[0]))); e != 0 {
		t.Fatal(e)
	}
	for _, v := range vec {
		cached += int(v & 1)
	}
	return cached, len(vec)
}
