//go:build linux

package seccomp

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/vivarium-sandbox/vivarium/internal/testutil"
)

const victimEnv = "VIVARIUM_SECCOMP_VICTIM"

// TestMain lets the test binary act as a victim process that installs a
// filter on itself and reports what each system call returned.
func TestMain(m *testing.M) {
	switch os.Getenv(victimEnv) {
	case "":
		os.Exit(m.Run())
	case "sandbox":
		report(sandboxVictim())
	case "zygote":
		report(zygoteVictim())
	default:
		fmt.Fprintf(os.Stderr, "unknown victim %q\n", os.Getenv(victimEnv))
		os.Exit(2)
	}
}

func report(out map[string]string) {
	json.NewEncoder(os.Stdout).Encode(out)
	os.Exit(0)
}

func install(rules []Rule) {
	prog, err := Compile(rules)
	if err == nil {
		err = Install(prog)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
}

// sc makes a raw system call and names its outcome: "ok" or the errno.
func sc(nr uintptr, args ...uintptr) string {
	var a [6]uintptr
	copy(a[:], args)
	_, _, e := unix.Syscall6(nr, a[0], a[1], a[2], a[3], a[4], a[5])
	if e != 0 {
		return unix.ErrnoName(e)
	}
	return "ok"
}

func ptr[T any](p *T) uintptr { return uintptr(unsafe.Pointer(p)) }

func sandboxVictim() map[string]string {
	// A file of the parent's, cached, for the page-cache calls.
	f, err := os.Open(os.Getenv("VICTIM_FILE"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	fd := f.Fd()
	var pipe [2]int
	unix.Pipe2(pipe[:], unix.O_CLOEXEC)
	install(DefaultRules())

	var rl unix.Rlimit
	unix.Getrlimit(unix.RLIMIT_NOFILE, &rl)
	buf := make([]byte, 4096)
	iov := unix.Iovec{Base: &buf[0], Len: uint64(len(buf))}
	var n int32
	name := []byte("victim\x00")
	out := map[string]string{
		"getpid":                 sc(unix.SYS_GETPID),
		"unshare user":           sc(unix.SYS_UNSHARE, unix.CLONE_NEWUSER),
		"mount":                  sc(unix.SYS_MOUNT),
		"clone3":                 sc(unix.SYS_CLONE3),
		"clone new net":          sc(unix.SYS_CLONE, unix.CLONE_NEWNET|uintptr(unix.SIGCHLD)),
		"io_uring":               sc(unix.SYS_IO_URING_SETUP, 1, 0),
		"io_setup":               sc(unix.SYS_IO_SETUP, 65536, ptr(new(uint64))),
		"memfd_secret":           sc(unix.SYS_MEMFD_SECRET, 0),
		"mbind":                  sc(unix.SYS_MBIND),
		"set_mempolicy":          sc(unix.SYS_SET_MEMPOLICY),
		"cachestat":              sc(unix.SYS_CACHESTAT),
		"keyctl":                 sc(unix.SYS_KEYCTL),
		"acct":                   sc(unix.SYS_ACCT),
		"syscall 1000":           sc(1000),
		"socket vsock":           sc(unix.SYS_SOCKET, unix.AF_VSOCK, unix.SOCK_STREAM),
		"socketpair vsock":       sc(unix.SYS_SOCKETPAIR, unix.AF_VSOCK, unix.SOCK_STREAM, 0, ptr(&pipe)),
		"socketpair packet":      sc(unix.SYS_SOCKETPAIR, unix.AF_PACKET, unix.SOCK_RAW, 0, ptr(&pipe)),
		"socketpair xdp":         sc(unix.SYS_SOCKETPAIR, unix.AF_XDP, unix.SOCK_RAW, 0, ptr(&pipe)),
		"netlink generic":        sc(unix.SYS_SOCKET, unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_GENERIC),
		"personality no aslr":    sc(unix.SYS_PERSONALITY, addrNoRandomize),
		"ioctl TIOCSTI":          sc(unix.SYS_IOCTL, 0, unix.TIOCSTI, ptr(&buf[0])),
		"ioctl FIONREAD pipe":    sc(unix.SYS_IOCTL, uintptr(pipe[0]), ioctlFIONREAD, ptr(&n)),
		"ioctl TCGETS pipe":      sc(unix.SYS_IOCTL, uintptr(pipe[0]), unix.TCGETS, ptr(&buf[0])),
		"prctl set dumpable 1":   sc(unix.SYS_PRCTL, unix.PR_SET_DUMPABLE, 1),
		"prctl set dumpable 0":   sc(unix.SYS_PRCTL, unix.PR_SET_DUMPABLE, 0),
		"prctl set name":         sc(unix.SYS_PRCTL, unix.PR_SET_NAME, ptr(&name[0])),
		"prctl clear ambient":    sc(unix.SYS_PRCTL, unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL),
		"prctl set mm":           sc(unix.SYS_PRCTL, unix.PR_SET_MM, unix.PR_SET_MM_START_CODE, 0),
		"setrlimit core":         sc(unix.SYS_SETRLIMIT, unix.RLIMIT_CORE, ptr(&unix.Rlimit{})),
		"prlimit64 core write":   sc(unix.SYS_PRLIMIT64, 0, unix.RLIMIT_CORE, ptr(&unix.Rlimit{}), 0),
		"prlimit64 core read":    sc(unix.SYS_PRLIMIT64, 0, unix.RLIMIT_CORE, 0, ptr(&unix.Rlimit{})),
		"prlimit64 nofile write": sc(unix.SYS_PRLIMIT64, 0, unix.RLIMIT_NOFILE, ptr(&rl), 0),
		"fadvise dontneed":       sc(unix.SYS_FADVISE64, fd, 0, 0, unix.FADV_DONTNEED),
		"fadvise sequential":     sc(unix.SYS_FADVISE64, fd, 0, 0, unix.FADV_SEQUENTIAL),
		"preadv2 nowait":         sc(unix.SYS_PREADV2, fd, ptr(&iov), 1, 0, 0, unix.RWF_NOWAIT),
		"preadv2":                sc(unix.SYS_PREADV2, fd, ptr(&iov), 1, 0, 0, 0),
		"madvise mergeable":      sc(unix.SYS_MADVISE, ptr(&buf[0])&^4095, 4096, unix.MADV_MERGEABLE),
		"sync":                   sc(unix.SYS_SYNC),
		"seccomp listener":       sc(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, unix.SECCOMP_FILTER_FLAG_NEW_LISTENER, 0),
	}
	if runtime.GOARCH == "amd64" {
		out["x32 getpid"] = sc(x32SyscallBit | unix.SYS_GETPID)
	}
	// The Go runtime keeps working: threads, the network poller, timers,
	// exec (clone with CLONE_PIDFD, then waitid), garbage collection.
	out["go runtime"] = goRuntime()
	// The filter survives execve: a child shell cannot unshare either.
	if err := exec.Command("/bin/sh", "-c", "exec unshare -U true").Run(); err == nil {
		out["child unshare"] = "succeeded"
	} else {
		out["child unshare"] = "failed"
	}
	return out
}

func goRuntime() string {
	var wg sync.WaitGroup
	for i := 0; i < 16; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runtime.LockOSThread() // a thread of its own: clone for a thread
			time.Sleep(time.Millisecond)
		}()
	}
	wg.Wait()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "listen: " + err.Error()
	}
	defer l.Close()
	go func() {
		if c, err := l.Accept(); err == nil {
			c.Write([]byte("x"))
			c.Close()
		}
	}()
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		return "dial: " + err.Error()
	}
	b := make([]byte, 1)
	if _, err := c.Read(b); err != nil {
		return "read: " + err.Error()
	}
	c.Close()
	if err := exec.Command("/bin/true").Run(); err != nil {
		return "exec: " + err.Error()
	}
	runtime.GC()
	return "ok"
}

func zygoteVictim() map[string]string {
	uts, err := os.Open("/proc/self/ns/uts")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	var core unix.Rlimit
	unix.Getrlimit(unix.RLIMIT_CORE, &core)
	out := map[string]string{}
	probe := func(when string) {
		out[when+" setns"] = sc(unix.SYS_SETNS, uts.Fd(), unix.CLONE_NEWUTS)
		out[when+" set dumpable 1"] = sc(unix.SYS_PRCTL, unix.PR_SET_DUMPABLE, 1)
		out[when+" prlimit64 core write"] = sc(unix.SYS_PRLIMIT64, 0, unix.RLIMIT_CORE, ptr(&core), 0)
		out[when+" clear ambient"] = sc(unix.SYS_PRCTL, unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL)
		out[when+" mount"] = sc(unix.SYS_MOUNT)
		out[when+" unshare"] = sc(unix.SYS_UNSHARE, unix.CLONE_NEWUTS)
		out[when+" getpid"] = sc(unix.SYS_GETPID)
		out[when+" io_setup"] = sc(unix.SYS_IO_SETUP, 1, ptr(new(uint64)))
	}
	install(ZygoteRules())
	probe("zygote")
	install(DefaultRules()) // stacked, as a forked child does
	probe("child")
	return out
}

// runVictim re-executes the test binary as a victim and returns its report.
func runVictim(t *testing.T, kind string, env ...string) map[string]string {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(append(os.Environ(), victimEnv+"="+kind), env...)
	out, err := cmd.Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("victim: %v (%s %s)", err, out, stderr)
	}
	var got map[string]string
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("victim output %q: %v", out, err)
	}
	return got
}

func wantReport(t *testing.T, got, want map[string]string) {
	t.Helper()
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: got %q, want %q", k, got[k], v)
		}
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			t.Errorf("%s: %q reported, not checked", k, got[k])
		}
	}
}

// resident is how many pages of the file at path are in the page cache
// (mincore on a fresh mapping: for the file's owner, it reports the page
// cache, not only this process's page tables).
func resident(t *testing.T, path string, size int) int {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	m, err := unix.Mmap(int(f.Fd()), 0, size, unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(m)
	vec := make([]byte, (size+4095)/4096)
	if _, _, e := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&m[0])), uintptr(size), uintptr(unsafe.Pointer(&vec[0]))); e != 0 {
		t.Fatal(e)
	}
	n := 0
	for _, v := range vec {
		n += int(v & 1)
	}
	return n
}

func TestRealVictim(t *testing.T) {
	if _, err := exec.LookPath("unshare"); err != nil {
		t.Skip("needs util-linux unshare")
	}
	testutil.RequireRoot(t, "mincore reports the page cache only of files its caller owns or may write")
	// A cached file: DONTNEED from the victim must leave it cached.
	const size = 1 << 20
	path := filepath.Join(t.TempDir(), "cached")
	if err := os.WriteFile(path, make([]byte, size), 0o644); err != nil {
		t.Fatal(err)
	}
	if f, err := os.Open(path); err == nil {
		f.Sync() // clean pages: DONTNEED could evict them
		f.Close()
	}
	if n := resident(t, path, size); n != size/4096 {
		t.Fatalf("%d of %d pages cached before the victim ran", n, size/4096)
	}
	got := runVictim(t, "sandbox", "VICTIM_FILE="+path)
	want := map[string]string{
		"getpid":                 "ok",
		"unshare user":           "EPERM",
		"mount":                  "EPERM",
		"clone3":                 "ENOSYS",
		"clone new net":          "EPERM",
		"io_uring":               "EPERM",
		"io_setup":               "ENOSYS",
		"memfd_secret":           "ENOSYS",
		"mbind":                  "ENOSYS",
		"set_mempolicy":          "ENOSYS",
		"cachestat":              "ENOSYS",
		"keyctl":                 "EPERM",
		"acct":                   "EPERM",
		"syscall 1000":           "ENOSYS",
		"socket vsock":           "EAFNOSUPPORT",
		"socketpair vsock":       "EAFNOSUPPORT",
		"socketpair packet":      "EAFNOSUPPORT",
		"socketpair xdp":         "EAFNOSUPPORT",
		"netlink generic":        "EPROTONOSUPPORT",
		"personality no aslr":    "EPERM",
		"ioctl TIOCSTI":          "EPERM",
		"ioctl FIONREAD pipe":    "ok",
		"ioctl TCGETS pipe":      "ENOTTY", // the kernel's answer: isatty works
		"prctl set dumpable 1":   "EPERM",
		"prctl set dumpable 0":   "ok",
		"prctl set name":         "ok",
		"prctl clear ambient":    "EPERM",
		"prctl set mm":           "EPERM",
		"setrlimit core":         "EPERM",
		"prlimit64 core write":   "EPERM",
		"prlimit64 core read":    "ok",
		"prlimit64 nofile write": "ok",
		"fadvise dontneed":       "ok",
		"fadvise sequential":     "ok",
		"preadv2 nowait":         unix.ErrnoName(unix.EOPNOTSUPP), // ENOTSUP, the same number
		"preadv2":                "ok",
		"madvise mergeable":      "EINVAL",
		"sync":                   "ok",
		"seccomp listener":       "EPERM",
		"go runtime":             "ok",
		"child unshare":          "failed",
	}
	if runtime.GOARCH == "amd64" {
		want["x32 getpid"] = "ENOSYS"
	}
	wantReport(t, got, want)
	if n := resident(t, path, size); n != size/4096 {
		t.Errorf("the victim's POSIX_FADV_DONTNEED evicted %d of %d pages", size/4096-n, size/4096)
	}
	// Without the filter the same call evicts them: the check above can
	// fail.
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
		t.Fatal(err)
	}
	if n := resident(t, path, size); n == size/4096 {
		t.Errorf("an unfiltered POSIX_FADV_DONTNEED left every page cached: the check proves nothing here")
	}
}

// A zygote under its own filter can do what placing a child takes; the
// child, once it has stacked the sandbox's filter, no longer can.
func TestRealZygoteVictim(t *testing.T) {
	testutil.RequireRoot(t, "setns and the core limit are privileged")
	got := runVictim(t, "zygote")
	wantReport(t, got, map[string]string{
		"zygote setns": "ok", "zygote set dumpable 1": "ok", "zygote prlimit64 core write": "ok",
		"zygote clear ambient": "ok", "zygote mount": "EPERM", "zygote unshare": "EPERM",
		"zygote getpid": "ok", "zygote io_setup": "ENOSYS",
		"child setns": "EPERM", "child set dumpable 1": "EPERM", "child prlimit64 core write": "EPERM",
		"child clear ambient": "EPERM", "child mount": "EPERM", "child unshare": "EPERM",
		"child getpid": "ok", "child io_setup": "ENOSYS",
	})
}

// installThread loads prog on the calling thread only (no TSYNC), which
// must be locked to its goroutine and end with it: a benchmark can then
// measure calls under the filter without confining the test process.
func installThread(prog []unix.SockFilter) error {
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return err
	}
	fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
	_, _, errno := unix.RawSyscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, 0, uintptr(unsafe.Pointer(&fprog)))
	if errno != 0 {
		return errno
	}
	return nil
}

// BenchmarkSyscall measures a call's cost without a filter, under a
// filter that allows everything at once (what any filter costs: the
// kernel's slower entry path), and under the sandbox's: getpid, which the
// kernel's action cache lets through without running the filter; ioctl,
// whose request the filter checks, early in its list (FIONREAD) and at its
// end (SIOCGSTAMPNS_NEW); prctl, whose option it checks.
func BenchmarkSyscall(b *testing.B) {
	sandbox, err := Compile(DefaultRules())
	if err != nil {
		b.Fatal(err)
	}
	allowAll := []unix.SockFilter{{Code: bpfRetK, K: uint32(Allow)}}
	filters := []struct {
		name string
		prog []unix.SockFilter
	}{{"unfiltered", nil}, {"allow-all", allowAll}, {"sandbox", sandbox}}
	var pipe [2]int
	if err := unix.Pipe2(pipe[:], unix.O_CLOEXEC); err != nil {
		b.Fatal(err)
	}
	defer unix.Close(pipe[0])
	defer unix.Close(pipe[1])
	var n int32
	calls := []struct {
		name string
		nr   uintptr
		args [3]uintptr
	}{
		{"getpid", unix.SYS_GETPID, [3]uintptr{}},
		{"ioctl-FIONREAD", unix.SYS_IOCTL, [3]uintptr{uintptr(pipe[0]), ioctlFIONREAD, ptr(&n)}},
		{"ioctl-last", unix.SYS_IOCTL, [3]uintptr{uintptr(pipe[0]), unix.SIOCGSTAMPNS_NEW, ptr(&n)}},
		{"prctl-GET_DUMPABLE", unix.SYS_PRCTL, [3]uintptr{unix.PR_GET_DUMPABLE}},
	}
	for _, c := range calls {
		for _, f := range filters {
			b.Run(c.name+"/"+f.name, func(b *testing.B) {
				done := make(chan error)
				go func() {
					// Never unlocked: the thread ends with the goroutine,
					// its filter with it.
					runtime.LockOSThread()
					if f.prog != nil {
						if err := installThread(f.prog); err != nil {
							done <- err
							return
						}
					}
					b.ResetTimer()
					for i := 0; i < b.N; i++ {
						unix.RawSyscall(c.nr, c.args[0], c.args[1], c.args[2])
					}
					b.StopTimer()
					done <- nil
				}()
				if err := <-done; err != nil {
					b.Fatal(err)
				}
			})
		}
	}
}
