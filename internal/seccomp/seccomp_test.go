//go:build linux

package seccomp

import (
	"bufio"
	"encoding/binary"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// call is one system call as the filter sees it (struct seccomp_data).
type call struct {
	nr   uint32
	arch uint32
	args [6]uint64
}

func (c call) bytes() []byte {
	b := make([]byte, 64)
	binary.LittleEndian.PutUint32(b[0:], c.nr)
	binary.LittleEndian.PutUint32(b[4:], c.arch)
	for i, a := range c.args {
		binary.LittleEndian.PutUint64(b[16+8*i:], a)
	}
	return b
}

// interpret runs prog the way the kernel would, for the instructions Compile
// emits, and returns the action and how many instructions ran. An
// instruction it does not know fails the test: the compiler must not emit
// anything this interpreter has not been taught.
func interpret(t testing.TB, prog []unix.SockFilter, c call) (Action, int) {
	t.Helper()
	data := c.bytes()
	var acc uint32
	steps := 0
	for pc := 0; pc < len(prog); pc++ {
		steps++
		in := prog[pc]
		switch in.Code {
		case bpfLdWAbs:
			if int(in.K)+4 > len(data) || in.K%4 != 0 {
				t.Fatalf("pc %d: load at bad offset %d", pc, in.K)
			}
			acc = binary.LittleEndian.Uint32(data[in.K:])
		case bpfJa:
			pc += int(in.K)
		case bpfJeqK, bpfJgeK, bpfJsetK:
			var taken bool
			switch in.Code {
			case bpfJeqK:
				taken = acc == in.K
			case bpfJgeK:
				taken = acc >= in.K
			case bpfJsetK:
				taken = acc&in.K != 0
			}
			if taken {
				pc += int(in.Jt)
			} else {
				pc += int(in.Jf)
			}
		case bpfRetK:
			return Action(in.K), steps
		default:
			t.Fatalf("pc %d: opcode %#x not understood by the test interpreter", pc, in.Code)
		}
	}
	t.Fatalf("program fell off its end")
	return 0, 0
}

func mustCompile(t testing.TB, rules []Rule) []unix.SockFilter {
	t.Helper()
	prog, err := Compile(rules)
	if err != nil {
		t.Fatal(err)
	}
	return prog
}

var (
	eperm  = Errno(unix.EPERM)
	enosys = Errno(unix.ENOSYS)
)

const threadFlags = unix.CLONE_VM | unix.CLONE_FS | unix.CLONE_FILES | unix.CLONE_SIGHAND |
	unix.CLONE_THREAD | unix.CLONE_SYSVSEM | unix.CLONE_SETTLS | unix.CLONE_PARENT_SETTID |
	unix.CLONE_CHILD_CLEARTID

// addrNoRandomize is the personality flag that turns off ASLR.
const addrNoRandomize = 0x0040000

type decision struct {
	name string
	c    call
	want Action
}

// sandboxDecisions are the answers docs/security.md promises, one
// by one.
func sandboxDecisions() []decision {
	nrOnly := func(name string, nr uint32, want Action) decision {
		return decision{name, call{nr: nr}, want}
	}
	with := func(name string, nr uint32, want Action, args ...uint64) decision {
		d := decision{name: name, c: call{nr: nr}, want: want}
		copy(d.c.args[:], args)
		return d
	}
	ds := []decision{
		nrOnly("read", unix.SYS_READ, Allow),
		{"foreign architecture killed", call{nr: unix.SYS_READ, arch: 0x40000003 /* i386 */}, killProcess},
		nrOnly("mount", unix.SYS_MOUNT, eperm),
		nrOnly("unshare", unix.SYS_UNSHARE, eperm),
		nrOnly("setns", unix.SYS_SETNS, eperm),
		nrOnly("ptrace", unix.SYS_PTRACE, eperm),
		nrOnly("bpf", unix.SYS_BPF, eperm),
		nrOnly("io_uring_setup", unix.SYS_IO_URING_SETUP, eperm),
		nrOnly("open_by_handle_at", unix.SYS_OPEN_BY_HANDLE_AT, eperm),
		nrOnly("acct, known and refused", unix.SYS_ACCT, eperm),
		nrOnly("memfd_secret", unix.SYS_MEMFD_SECRET, enosys),
		nrOnly("set_mempolicy", unix.SYS_SET_MEMPOLICY, enosys),
		nrOnly("set_mempolicy_home_node", unix.SYS_SET_MEMPOLICY_HOME_NODE, enosys),
		nrOnly("mbind", unix.SYS_MBIND, enosys),
		nrOnly("migrate_pages", unix.SYS_MIGRATE_PAGES, enosys),
		nrOnly("move_pages", unix.SYS_MOVE_PAGES, enosys),
		nrOnly("io_setup", unix.SYS_IO_SETUP, enosys),
		nrOnly("io_submit", unix.SYS_IO_SUBMIT, enosys),
		nrOnly("io_getevents", unix.SYS_IO_GETEVENTS, enosys),
		nrOnly("io_pgetevents", unix.SYS_IO_PGETEVENTS, enosys),
		nrOnly("io_cancel", unix.SYS_IO_CANCEL, enosys),
		nrOnly("io_destroy", unix.SYS_IO_DESTROY, enosys),
		nrOnly("cachestat", unix.SYS_CACHESTAT, enosys),
		nrOnly("unknown number 1000", 1000, enosys),
		nrOnly("number past the table", unix.SYS_RSEQ_SLICE_YIELD+1, enosys),
		nrOnly("highest number", ^uint32(0), enosys),
		nrOnly("clone3 falls back", unix.SYS_CLONE3, enosys),
		nrOnly("sync fakes success", unix.SYS_SYNC, FakeSuccess),
		nrOnly("syncfs fakes success", unix.SYS_SYNCFS, FakeSuccess),
		nrOnly("getpid", unix.SYS_GETPID, Allow),
		with("clone for a thread", unix.SYS_CLONE, Allow, threadFlags),
		with("clone for fork", unix.SYS_CLONE, Allow, uint64(unix.SIGCHLD)),
		with("clone for Go's exec", unix.SYS_CLONE, Allow, unix.CLONE_VM|unix.CLONE_VFORK|unix.CLONE_PIDFD|uint64(unix.SIGCHLD)),
		with("clone new user ns", unix.SYS_CLONE, eperm, unix.CLONE_NEWUSER|uint64(unix.SIGCHLD)),
		with("clone new net ns", unix.SYS_CLONE, eperm, unix.CLONE_NEWNET),
		with("clone new cgroup ns", unix.SYS_CLONE, eperm, unix.CLONE_NEWCGROUP),
		with("clone ns flag with high garbage", unix.SYS_CLONE, eperm, 1<<40|unix.CLONE_NEWPID),
		with("clone high garbage only", unix.SYS_CLONE, Allow, 1<<40|uint64(unix.SIGCHLD)),
		with("ioctl TIOCSTI", unix.SYS_IOCTL, eperm, 0, unix.TIOCSTI),
		with("ioctl TIOCSTI high garbage", unix.SYS_IOCTL, eperm, 0, 1<<33|unix.TIOCSTI),
		with("ioctl TIOCLINUX", unix.SYS_IOCTL, eperm, 0, unix.TIOCLINUX),
		with("ioctl TIOCSETD", unix.SYS_IOCTL, eperm, 0, unix.TIOCSETD),
		with("ioctl TIOCCONS", unix.SYS_IOCTL, eperm, 0, unix.TIOCCONS),
		with("ioctl SIOCETHTOOL", unix.SYS_IOCTL, eperm, 0, unix.SIOCETHTOOL),
		with("ioctl SIOCSIFFLAGS", unix.SYS_IOCTL, eperm, 0, unix.SIOCSIFFLAGS),
		with("ioctl FICLONE", unix.SYS_IOCTL, eperm, 0, unix.FICLONE),
		with("ioctl FIONREAD", unix.SYS_IOCTL, Allow, 0, ioctlFIONREAD),
		with("ioctl FIOCLEX", unix.SYS_IOCTL, Allow, 0, ioctlFIOCLEX),
		with("ioctl TCGETS", unix.SYS_IOCTL, Allow, 0, unix.TCGETS),
		with("ioctl TCGETS high garbage", unix.SYS_IOCTL, Allow, 0, 1<<40|unix.TCGETS),
		with("ioctl SIOCGIFHWADDR", unix.SYS_IOCTL, Allow, 0, unix.SIOCGIFHWADDR),
		with("socket inet", unix.SYS_SOCKET, Allow, unix.AF_INET),
		with("socket inet6", unix.SYS_SOCKET, Allow, unix.AF_INET6),
		with("socket unix", unix.SYS_SOCKET, Allow, unix.AF_UNIX),
		with("socket netlink route", unix.SYS_SOCKET, Allow, unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_ROUTE),
		with("socket netlink generic", unix.SYS_SOCKET, Errno(unix.EPROTONOSUPPORT), unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_GENERIC),
		with("socket netlink audit", unix.SYS_SOCKET, Errno(unix.EPROTONOSUPPORT), unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_AUDIT),
		with("socket netlink uevent", unix.SYS_SOCKET, Errno(unix.EPROTONOSUPPORT), unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_KOBJECT_UEVENT),
		with("socket packet", unix.SYS_SOCKET, Errno(unix.EAFNOSUPPORT), unix.AF_PACKET),
		with("socket vsock", unix.SYS_SOCKET, Errno(unix.EAFNOSUPPORT), unix.AF_VSOCK),
		with("socket alg", unix.SYS_SOCKET, Errno(unix.EAFNOSUPPORT), unix.AF_ALG),
		with("socket xdp", unix.SYS_SOCKET, Errno(unix.EAFNOSUPPORT), unix.AF_XDP),
		with("socketpair unix", unix.SYS_SOCKETPAIR, Allow, unix.AF_UNIX),
		with("socketpair vsock", unix.SYS_SOCKETPAIR, Errno(unix.EAFNOSUPPORT), unix.AF_VSOCK),
		with("socketpair packet", unix.SYS_SOCKETPAIR, Errno(unix.EAFNOSUPPORT), unix.AF_PACKET),
		with("socketpair xdp", unix.SYS_SOCKETPAIR, Errno(unix.EAFNOSUPPORT), unix.AF_XDP),
		with("socketpair netlink generic", unix.SYS_SOCKETPAIR, Errno(unix.EPROTONOSUPPORT), unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_GENERIC),
		with("personality query", unix.SYS_PERSONALITY, Allow, 0xffffffff),
		with("personality linux", unix.SYS_PERSONALITY, Allow, 0),
		with("personality no aslr", unix.SYS_PERSONALITY, eperm, addrNoRandomize),
		with("prctl PR_SET_NAME", unix.SYS_PRCTL, Allow, unix.PR_SET_NAME),
		with("prctl PR_SET_VMA", unix.SYS_PRCTL, Allow, unix.PR_SET_VMA),
		with("prctl PR_GET_DUMPABLE", unix.SYS_PRCTL, Allow, unix.PR_GET_DUMPABLE),
		with("prctl PR_SET_DUMPABLE 0", unix.SYS_PRCTL, Allow, unix.PR_SET_DUMPABLE, 0),
		with("prctl PR_SET_DUMPABLE 1", unix.SYS_PRCTL, eperm, unix.PR_SET_DUMPABLE, 1),
		with("prctl PR_SET_DUMPABLE 1<<32", unix.SYS_PRCTL, eperm, unix.PR_SET_DUMPABLE, 1<<32),
		with("prctl PR_SET_NO_NEW_PRIVS", unix.SYS_PRCTL, Allow, unix.PR_SET_NO_NEW_PRIVS, 1),
		with("prctl PR_SET_SECCOMP", unix.SYS_PRCTL, Allow, unix.PR_SET_SECCOMP, 2),
		with("prctl PR_CAPBSET_READ", unix.SYS_PRCTL, Allow, unix.PR_CAPBSET_READ),
		with("prctl PR_CAPBSET_DROP", unix.SYS_PRCTL, eperm, unix.PR_CAPBSET_DROP),
		with("prctl PR_SET_SECUREBITS", unix.SYS_PRCTL, eperm, unix.PR_SET_SECUREBITS),
		with("prctl PR_CAP_AMBIENT_IS_SET", unix.SYS_PRCTL, Allow, unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_IS_SET),
		with("prctl PR_CAP_AMBIENT_RAISE", unix.SYS_PRCTL, eperm, unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_RAISE),
		with("prctl PR_CAP_AMBIENT_CLEAR_ALL", unix.SYS_PRCTL, eperm, unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL),
		with("prctl PR_SET_MM", unix.SYS_PRCTL, eperm, unix.PR_SET_MM),
		with("prctl PR_SET_MEMORY_MERGE", unix.SYS_PRCTL, eperm, unix.PR_SET_MEMORY_MERGE, 1),
		with("prctl PR_SET_PTRACER", unix.SYS_PRCTL, eperm, unix.PR_SET_PTRACER),
		with("prctl PR_SET_NAME high garbage", unix.SYS_PRCTL, Allow, 1<<32|unix.PR_SET_NAME),
		with("setrlimit nofile", unix.SYS_SETRLIMIT, Allow, unix.RLIMIT_NOFILE, 0x7fff0000),
		with("setrlimit core", unix.SYS_SETRLIMIT, eperm, unix.RLIMIT_CORE, 0x7fff0000),
		with("prlimit64 core read", unix.SYS_PRLIMIT64, Allow, 0, unix.RLIMIT_CORE, 0, 0x7fff0000),
		with("prlimit64 core write", unix.SYS_PRLIMIT64, eperm, 0, unix.RLIMIT_CORE, 0x7fff0000, 0),
		with("prlimit64 core write, pointer above 4 GiB", unix.SYS_PRLIMIT64, eperm, 0, unix.RLIMIT_CORE, 0x7f0000000000, 0),
		with("prlimit64 nofile write", unix.SYS_PRLIMIT64, Allow, 0, unix.RLIMIT_NOFILE, 0x7fff0000, 0),
		with("fadvise DONTNEED", unix.SYS_FADVISE64, FakeSuccess, 3, 0, 0, unix.FADV_DONTNEED),
		with("fadvise SEQUENTIAL", unix.SYS_FADVISE64, Allow, 3, 0, 0, unix.FADV_SEQUENTIAL),
		with("fadvise WILLNEED", unix.SYS_FADVISE64, Allow, 3, 0, 0, unix.FADV_WILLNEED),
		with("preadv2 RWF_NOWAIT", unix.SYS_PREADV2, Errno(unix.EOPNOTSUPP), 3, 0, 1, 0, 0, unix.RWF_NOWAIT),
		with("preadv2 RWF_NOWAIT|RWF_HIPRI", unix.SYS_PREADV2, Errno(unix.EOPNOTSUPP), 3, 0, 1, 0, 0, unix.RWF_NOWAIT|unix.RWF_HIPRI),
		with("preadv2 no flags", unix.SYS_PREADV2, Allow, 3, 0, 1, 0, 0, 0),
		with("pwritev2 RWF_NOWAIT", unix.SYS_PWRITEV2, Errno(unix.EOPNOTSUPP), 3, 0, 1, 0, 0, unix.RWF_NOWAIT),
		with("pwritev2 RWF_APPEND", unix.SYS_PWRITEV2, Allow, 3, 0, 1, 0, 0, unix.RWF_APPEND),
		with("madvise MADV_MERGEABLE", unix.SYS_MADVISE, Errno(unix.EINVAL), 0, 4096, unix.MADV_MERGEABLE),
		with("madvise MADV_DONTNEED", unix.SYS_MADVISE, Allow, 0, 4096, unix.MADV_DONTNEED),
		with("mmap anonymous", unix.SYS_MMAP, Allow, 0, 4096, unix.PROT_READ, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS),
		with("mmap MAP_HUGETLB", unix.SYS_MMAP, Errno(unix.ENOMEM), 0, 2<<20, unix.PROT_READ, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_HUGETLB),
		with("shmget", unix.SYS_SHMGET, Allow, 0, 4096, unix.IPC_CREAT|0o600),
		with("shmget SHM_HUGETLB", unix.SYS_SHMGET, eperm, 0, 2<<20, unix.IPC_CREAT|0o600|shmHugeTLB),
		with("memfd_create", unix.SYS_MEMFD_CREATE, Allow, 0, unix.MFD_CLOEXEC),
		with("memfd_create MFD_HUGETLB", unix.SYS_MEMFD_CREATE, Errno(unix.EINVAL), 0, unix.MFD_CLOEXEC|unix.MFD_HUGETLB),
		with("seccomp filter", unix.SYS_SECCOMP, Allow, unix.SECCOMP_SET_MODE_FILTER, unix.SECCOMP_FILTER_FLAG_TSYNC),
		with("seccomp listener", unix.SYS_SECCOMP, eperm, unix.SECCOMP_SET_MODE_FILTER, unix.SECCOMP_FILTER_FLAG_NEW_LISTENER),
	}
	if x32SyscallBit != 0 {
		ds = append(ds, nrOnly("x32 read", x32SyscallBit|unix.SYS_READ, enosys))
	}
	return append(ds, archDecisions()...)
}

func TestPolicyDecisions(t *testing.T) {
	rules := DefaultRules()
	prog := mustCompile(t, rules)
	for _, tc := range sandboxDecisions() {
		t.Run(tc.name, func(t *testing.T) {
			if tc.c.arch == 0 {
				tc.c.arch = nativeArch
			}
			if got, _ := interpret(t, prog, tc.c); got != tc.want {
				t.Errorf("compiled: got %v, want %v", got, tc.want)
			}
			if tc.c.arch == nativeArch {
				if got := evaluate(rules, tc.c.nr, tc.c.args); got != tc.want {
					t.Errorf("policy: got %v, want %v", got, tc.want)
				}
			}
		})
	}
}

func TestZygoteDecisions(t *testing.T) {
	prog := mustCompile(t, ZygoteRules())
	for _, tc := range []decision{
		{"setns", call{nr: unix.SYS_SETNS}, Allow},
		{"prctl PR_SET_DUMPABLE 1", call{nr: unix.SYS_PRCTL, args: [6]uint64{unix.PR_SET_DUMPABLE, 1}}, Allow},
		{"prctl PR_CAPBSET_DROP", call{nr: unix.SYS_PRCTL, args: [6]uint64{unix.PR_CAPBSET_DROP, 5}}, Allow},
		{"prctl PR_SET_SECUREBITS", call{nr: unix.SYS_PRCTL, args: [6]uint64{unix.PR_SET_SECUREBITS, 0xe3}}, Allow},
		{"prctl PR_CAP_AMBIENT_CLEAR_ALL", call{nr: unix.SYS_PRCTL, args: [6]uint64{unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL}}, Allow},
		{"prctl PR_CAP_AMBIENT_RAISE", call{nr: unix.SYS_PRCTL, args: [6]uint64{unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_RAISE}}, eperm},
		{"prctl PR_SET_MM", call{nr: unix.SYS_PRCTL, args: [6]uint64{unix.PR_SET_MM}}, eperm},
		{"prlimit64 core write", call{nr: unix.SYS_PRLIMIT64, args: [6]uint64{0, unix.RLIMIT_CORE, 0x7fff0000}}, Allow},
		{"setrlimit core", call{nr: unix.SYS_SETRLIMIT, args: [6]uint64{unix.RLIMIT_CORE, 0x7fff0000}}, Allow},
		{"mount", call{nr: unix.SYS_MOUNT}, eperm},
		{"unshare", call{nr: unix.SYS_UNSHARE}, eperm},
		{"pivot_root", call{nr: unix.SYS_PIVOT_ROOT}, eperm},
		{"bpf", call{nr: unix.SYS_BPF}, eperm},
		{"clone new user ns", call{nr: unix.SYS_CLONE, args: [6]uint64{unix.CLONE_NEWUSER}}, eperm},
		{"io_setup", call{nr: unix.SYS_IO_SETUP}, enosys},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.c.arch = nativeArch
			if got, _ := interpret(t, prog, tc.c); got != tc.want {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}

// knownSyscalls reads golang.org/x/sys's table of this architecture's
// system calls: the kernel's list, as far as this module's version knows it.
func knownSyscalls(t *testing.T) map[string]uint32 {
	t.Helper()
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "golang.org/x/sys").Output()
	if err != nil {
		t.Fatalf("find golang.org/x/sys: %v", err)
	}
	path := filepath.Join(strings.TrimSpace(string(out)), "unix", "zsysnum_linux_"+runtime.GOARCH+".go")
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	re := regexp.MustCompile(`^\s+SYS_(\w+)\s+=\s+(\d+)$`)
	known := map[string]uint32{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		m := re.FindStringSubmatch(sc.Text())
		if m == nil || m[1] == "ARCH_SPECIFIC_SYSCALL" { // arm64: the base of a range, no call
			continue
		}
		n, _ := strconv.Atoi(m[2])
		known[strings.ToLower(m[1])] = uint32(n)
	}
	if len(known) < 300 {
		t.Fatalf("%s: only %d system calls", path, len(known))
	}
	return known
}

// Every system call the kernel has (as golang.org/x/sys knows it) is named
// by the policy, so that each was decided on rather than refused by
// default; and the policy names nothing else.
func TestPolicyNamesEveryKnownSyscall(t *testing.T) {
	known := knownSyscalls(t)
	named := map[uint32]string{}
	for _, r := range DefaultRules() {
		named[r.Nr] = r.Name
		if nr, ok := known[r.Name]; !ok || nr != r.Nr {
			t.Errorf("rule %q (%d): golang.org/x/sys knows no such system call", r.Name, r.Nr)
		}
	}
	for name, nr := range known {
		if _, ok := named[nr]; !ok {
			t.Errorf("%s (%d) is not named by the policy: allow it in a group or refuse it", name, nr)
		}
	}
}

// The compiled program answers every call as the policy says: every known
// number, and random ones, with arguments drawn from the values the rules
// compare against, their neighbours, and random bits above and below.
func TestCompiledAgreesWithPolicy(t *testing.T) {
	known := knownSyscalls(t)
	for name, rules := range map[string][]Rule{"sandbox": DefaultRules(), "zygote": ZygoteRules()} {
		t.Run(name, func(t *testing.T) {
			prog := mustCompile(t, rules)
			r := rand.New(rand.NewSource(1))
			gen := newArgGen(rules, r)
			check := func(nr uint32, args [6]uint64) {
				got, _ := interpret(t, prog, call{nr: nr, arch: nativeArch, args: args})
				if want := evaluate(rules, nr, args); got != want {
					t.Fatalf("nr %d args %#x: compiled %v, policy %v", nr, args, got, want)
				}
			}
			for _, nr := range known {
				for i := 0; i < 200; i++ {
					check(nr, gen.args())
				}
			}
			for i := 0; i < 20000; i++ {
				check(r.Uint32()>>uint(r.Intn(32)), gen.args())
			}
		})
	}
}

// argGen draws arguments that exercise the rules' comparisons.
type argGen struct {
	r      *rand.Rand
	values []uint64
}

func newArgGen(rules []Rule, r *rand.Rand) *argGen {
	g := &argGen{r: r, values: []uint64{0, 1, 0xffffffff, 1 << 32, ^uint64(0)}}
	for _, rule := range rules {
		for _, c := range rule.Cases {
			for _, cond := range c.When {
				for _, v := range cond.Values {
					g.values = append(g.values, v, v+1, v-1, v|1<<32, v|0xffffffff<<32, ^v)
				}
			}
		}
	}
	return g
}

func (g *argGen) args() [6]uint64 {
	var a [6]uint64
	for i := range a {
		switch g.r.Intn(4) {
		case 0:
			a[i] = g.r.Uint64()
		case 1:
			a[i] = uint64(g.r.Uint32())
		default:
			a[i] = g.values[g.r.Intn(len(g.values))]
		}
	}
	return a
}

// stacked is what the kernel answers with two filters: the action of
// highest precedence (lowest value), the newer filter's on a tie.
func stacked(newer, older Action) Action {
	if int32(older&unix.SECCOMP_RET_ACTION_FULL) < int32(newer&unix.SECCOMP_RET_ACTION_FULL) {
		return older
	}
	return newer
}

// The zygote's policy only loosens the sandbox's, and a child that stacks
// the sandbox's filter on the zygote's gets exactly the sandbox's answers.
func TestZygoteOnlyLoosens(t *testing.T) {
	sandbox, zygote := DefaultRules(), ZygoteRules()
	sp, zp := mustCompile(t, sandbox), mustCompile(t, zygote)
	r := rand.New(rand.NewSource(2))
	gen := newArgGen(zygote, r)
	for _, nr := range knownSyscalls(t) {
		for i := 0; i < 200; i++ {
			c := call{nr: nr, arch: nativeArch, args: gen.args()}
			s, _ := interpret(t, sp, c)
			z, _ := interpret(t, zp, c)
			if z != Allow && z != s {
				t.Fatalf("nr %d args %#x: the zygote answers %v, the sandbox %v", nr, c.args, z, s)
			}
			if got := stacked(s, z); got != s {
				t.Fatalf("nr %d args %#x: stacked %v, the sandbox alone %v", nr, c.args, got, s)
			}
		}
	}
}

// The search keeps every call cheap: a call decided by its number alone
// runs a handful of instructions, whatever its place in the table, where
// a chain of comparisons would make the last of ~350 rules pay ~350.
func TestFilterCost(t *testing.T) {
	rules := DefaultRules()
	prog := mustCompile(t, rules)
	byNumber, checked := 0, 0
	for _, r := range rules {
		_, steps := interpret(t, prog, call{nr: r.Nr, arch: nativeArch})
		if len(r.Cases) == 0 {
			byNumber = max(byNumber, steps)
		} else {
			checked = max(checked, steps)
		}
	}
	_, unknown := interpret(t, prog, call{nr: 1000, arch: nativeArch})
	t.Logf("%d rules, %d instructions; a call decided by its number runs at most %d, "+
		"one whose arguments are checked %d, an unknown number %d", len(rules), len(prog), byNumber, checked, unknown)
	// Three for the architecture and the number, one comparison per
	// level of a balanced tree over the spans (fewer than 2^8 of them),
	// the return; a trampoline or two where a subtree is long.
	if byNumber > 3+8+2+1 || unknown > 3+8+2+1 {
		t.Errorf("a call decided by its number runs up to %d instructions (an unknown one %d)", byNumber, unknown)
	}
	// ioctl's chain of requests is the longest check.
	if checked > 3+8+2+1+len(ioctlRequests)+2 {
		t.Errorf("a checked call runs up to %d instructions", checked)
	}
	if len(prog) > 1024 {
		t.Errorf("the program has %d instructions", len(prog))
	}
}

func TestCompileRejectsBadRules(t *testing.T) {
	bad := map[string][]Rule{
		"duplicate":      {{Name: "a", Nr: 1, Action: eperm}, {Name: "b", Nr: 1, Action: eperm}},
		"argument 6":     {{Name: "arg", Nr: 1, Cases: []Case{{When: []Cond{argIn(6, 1)}, Action: eperm}}}},
		"no values":      {{Name: "empty", Nr: 1, Cases: []Case{{When: []Cond{argIn(0)}, Action: eperm}}}},
		"no conditions":  {{Name: "none", Nr: 1, Cases: []Case{{Action: eperm}}}},
		"zero mask":      {{Name: "mask", Nr: 1, Cases: []Case{{When: []Cond{argAny(0, 0)}, Action: eperm}}}},
		"64-bit value":   {{Name: "narrow", Nr: 1, Cases: []Case{{When: []Cond{argIn(0, 1<<32)}, Action: eperm}}}},
		"kill action":    {{Name: "kill", Nr: 1, Action: killProcess}},
		"huge errno":     {{Name: "errno", Nr: 1, Action: Action(unix.SECCOMP_RET_ERRNO | 5000)}},
		"x32 number":     {{Name: "x32", Nr: 0x40000001, Action: Allow}},
		"no rules":       nil,
		"unknown op":     {{Name: "op", Nr: 1, Cases: []Case{{When: []Cond{{Arg: 0, Op: 7, Values: []uint64{1}}}, Action: eperm}}}},
		"too many value": {{Name: "many", Nr: 1, Cases: []Case{{When: []Cond{argIn(0, make([]uint64, 65)...)}, Action: eperm}}}},
	}
	for name, rules := range bad {
		if _, err := Compile(rules); err == nil {
			t.Errorf("%s: Compile accepted %+v", name, rules)
		}
	}
}

// Jumps farther than a conditional jump reaches go through trampolines:
// rules whose checks are long, spread over many numbers, compile to a
// program the interpreter runs as the policy says.
func TestLongJumps(t *testing.T) {
	var rules []Rule
	many := make([]uint64, 64)
	for i := range many {
		many[i] = uint64(i*7+3) | uint64(i%3)<<32
	}
	narrow := make([]uint64, 64)
	for i := range narrow {
		narrow[i] = uint64(i * 5)
	}
	// Each rule is longer than a conditional jump reaches, and so is each
	// of its first conditions: jumps over them need trampolines, in the
	// search tree and inside the rule.
	for nr := uint32(10); nr < 130; nr += 20 {
		rules = append(rules, Rule{Name: "r" + strconv.Itoa(int(nr)), Nr: nr, Action: Allow, Cases: []Case{
			{When: []Cond{argIn(0, many...).wide(), argNotIn(1, many...).wide()}, Action: eperm},
			{When: []Cond{argAny(2, 1<<40|1).wide()}, Action: Errno(unix.EINVAL)},
			{When: []Cond{argNotIn(3, narrow...)}, Action: FakeSuccess},
		}})
	}
	prog := mustCompile(t, rules)
	jas := 0
	for _, in := range prog {
		if in.Code == bpfJa {
			jas++
		}
	}
	if jas == 0 {
		t.Fatalf("%d instructions and no trampoline: the test does not test long jumps", len(prog))
	}
	r := rand.New(rand.NewSource(3))
	gen := newArgGen(rules, r)
	for i := 0; i < 50000; i++ {
		nr := uint32(r.Intn(140))
		args := gen.args()
		got, _ := interpret(t, prog, call{nr: nr, arch: nativeArch, args: args})
		if want := evaluate(rules, nr, args); got != want {
			t.Fatalf("nr %d args %#x: compiled %v, policy %v", nr, args, got, want)
		}
	}
}

// BenchmarkCompile: every sandbox's init compiles the policy as it starts.
func BenchmarkCompile(b *testing.B) {
	for i := 0; i < b.N; i++ {
		if _, err := Compile(DefaultRules()); err != nil {
			b.Fatal(err)
		}
	}
}

// A program goes through Encode and Decode unchanged; Decode refuses what
// is no program.
func TestEncodeDecode(t *testing.T) {
	prog, err := Compile(DefaultRules())
	if err != nil {
		t.Fatal(err)
	}
	got, err := Decode(Encode(prog))
	if err != nil || !slices.Equal(got, prog) {
		t.Fatalf("round trip: %v (%d of %d instructions)", err, len(got), len(prog))
	}
	for _, bad := range [][]byte{nil, make([]byte, 7), make([]byte, 8*(unix.BPF_MAXINSNS+1))} {
		if _, err := Decode(bad); err == nil {
			t.Errorf("a program of %d bytes decoded", len(bad))
		}
	}
}
