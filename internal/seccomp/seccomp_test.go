//go:build linux

package seccomp

import (
	"encoding/binary"
	"encoding/json"
	"os"
	"os/exec"
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
// emits. An instruction it does not know fails the test: the compiler must
// not emit anything this interpreter has not been taught.
func interpret(t *testing.T, prog []unix.SockFilter, c call) uint32 {
	t.Helper()
	data := c.bytes()
	var acc uint32
	for pc := 0; pc < len(prog); pc++ {
		in := prog[pc]
		switch in.Code {
		case bpfLdWAbs:
			if int(in.K)+4 > len(data) || in.K%4 != 0 {
				t.Fatalf("pc %d: load at bad offset %d", pc, in.K)
			}
			acc = binary.LittleEndian.Uint32(data[in.K:])
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
			return in.K
		default:
			t.Fatalf("pc %d: opcode %#x not understood by the test interpreter", pc, in.Code)
		}
	}
	t.Fatalf("program fell off its end")
	return 0
}

func mustCompile(t *testing.T) []unix.SockFilter {
	t.Helper()
	prog, err := Compile(DefaultRules())
	if err != nil {
		t.Fatal(err)
	}
	return prog
}

func TestPolicyDecisions(t *testing.T) {
	prog := mustCompile(t)
	const threadFlags = unix.CLONE_VM | unix.CLONE_FS | unix.CLONE_FILES | unix.CLONE_SIGHAND |
		unix.CLONE_THREAD | unix.CLONE_SYSVSEM | unix.CLONE_SETTLS | unix.CLONE_PARENT_SETTID |
		unix.CLONE_CHILD_CLEARTID
	cases := []struct {
		name string
		c    call
		want uint32
	}{
		{"read allowed", call{nr: unix.SYS_READ}, retAllow},
		{"foreign architecture killed", call{nr: unix.SYS_READ, arch: 0x40000003 /* i386 */}, retKill},
		{"mount", call{nr: unix.SYS_MOUNT}, retErrno(unix.EPERM)},
		{"unshare", call{nr: unix.SYS_UNSHARE}, retErrno(unix.EPERM)},
		{"setns", call{nr: unix.SYS_SETNS}, retErrno(unix.EPERM)},
		{"ptrace", call{nr: unix.SYS_PTRACE}, retErrno(unix.EPERM)},
		{"bpf", call{nr: unix.SYS_BPF}, retErrno(unix.EPERM)},
		{"io_uring_setup", call{nr: unix.SYS_IO_URING_SETUP}, retErrno(unix.EPERM)},
		{"open_by_handle_at", call{nr: unix.SYS_OPEN_BY_HANDLE_AT}, retErrno(unix.EPERM)},
		{"clone3 falls back", call{nr: unix.SYS_CLONE3}, retErrno(unix.ENOSYS)},
		{"clone for a thread", call{nr: unix.SYS_CLONE, args: [6]uint64{threadFlags}}, retAllow},
		{"clone for fork", call{nr: unix.SYS_CLONE, args: [6]uint64{uint64(unix.SIGCHLD)}}, retAllow},
		{"clone new user ns", call{nr: unix.SYS_CLONE, args: [6]uint64{unix.CLONE_NEWUSER | uint64(unix.SIGCHLD)}}, retErrno(unix.EPERM)},
		{"clone new net ns", call{nr: unix.SYS_CLONE, args: [6]uint64{unix.CLONE_NEWNET}}, retErrno(unix.EPERM)},
		{"clone ns flag with high garbage", call{nr: unix.SYS_CLONE, args: [6]uint64{1<<40 | unix.CLONE_NEWPID}}, retErrno(unix.EPERM)},
		{"ioctl TIOCSTI", call{nr: unix.SYS_IOCTL, args: [6]uint64{0, unix.TIOCSTI}}, retErrno(unix.EPERM)},
		{"ioctl TIOCSTI high garbage", call{nr: unix.SYS_IOCTL, args: [6]uint64{0, 1<<33 | unix.TIOCSTI}}, retErrno(unix.EPERM)},
		{"ioctl TIOCLINUX", call{nr: unix.SYS_IOCTL, args: [6]uint64{0, unix.TIOCLINUX}}, retErrno(unix.EPERM)},
		{"ioctl FIONREAD", call{nr: unix.SYS_IOCTL, args: [6]uint64{0, 0x541B /* FIONREAD */}}, retAllow},
		{"socket inet", call{nr: unix.SYS_SOCKET, args: [6]uint64{unix.AF_INET}}, retAllow},
		{"socket unix", call{nr: unix.SYS_SOCKET, args: [6]uint64{unix.AF_UNIX}}, retAllow},
		{"socket packet", call{nr: unix.SYS_SOCKET, args: [6]uint64{unix.AF_PACKET}}, retErrno(unix.EAFNOSUPPORT)},
		{"socket vsock", call{nr: unix.SYS_SOCKET, args: [6]uint64{unix.AF_VSOCK}}, retErrno(unix.EAFNOSUPPORT)},
		{"socket alg", call{nr: unix.SYS_SOCKET, args: [6]uint64{unix.AF_ALG}}, retErrno(unix.EAFNOSUPPORT)},
		{"personality query", call{nr: unix.SYS_PERSONALITY, args: [6]uint64{0xffffffff}}, retAllow},
		{"personality linux", call{nr: unix.SYS_PERSONALITY, args: [6]uint64{0}}, retAllow},
		{"personality no aslr", call{nr: unix.SYS_PERSONALITY, args: [6]uint64{addrNoRandomize}}, retErrno(unix.EPERM)},
	}
	if x32SyscallBit != 0 {
		cases = append(cases, struct {
			name string
			c    call
			want uint32
		}{"x32 read", call{nr: x32SyscallBit | unix.SYS_READ}, retErrno(unix.ENOSYS)})
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if tc.c.arch == 0 {
				tc.c.arch = nativeArch
			}
			if got := interpret(t, prog, tc.c); got != tc.want {
				t.Fatalf("got %#x, want %#x", got, tc.want)
			}
		})
	}
}

func TestEveryUnconditionalRuleDenies(t *testing.T) {
	prog := mustCompile(t)
	for _, r := range DefaultRules() {
		if r.When != nil {
			continue
		}
		if got := interpret(t, prog, call{nr: r.Nr, arch: nativeArch}); got != retErrno(r.Errno) {
			t.Errorf("%s: got %#x, want errno %v", r.Name, got, r.Errno)
		}
	}
}

func TestCompileRejectsBadRules(t *testing.T) {
	bad := [][]Rule{
		{{Name: "a", Nr: 1, Errno: unix.EPERM}, {Name: "b", Nr: 1, Errno: unix.EPERM}},
		{{Name: "arg", Nr: 1, Errno: unix.EPERM, When: &ArgCheck{Arg: 6}}},
		{{Name: "empty", Nr: 1, Errno: unix.EPERM, When: &ArgCheck{Op: OpIn}}},
	}
	for i, rules := range bad {
		if _, err := Compile(rules); err == nil {
			t.Errorf("case %d: Compile accepted %+v", i, rules)
		}
	}
}

const victimEnv = "VIVARIUM_SECCOMP_VICTIM"

// TestMain lets the test binary act as a victim process that installs the
// filter on itself and reports what each system call returned.
func TestMain(m *testing.M) {
	if os.Getenv(victimEnv) == "1" {
		victim()
		return
	}
	os.Exit(m.Run())
}

func victim() {
	prog, err := Compile(DefaultRules())
	if err == nil {
		err = Install(prog)
	}
	if err != nil {
		os.Stderr.WriteString(err.Error())
		os.Exit(2)
	}
	errnoOf := func(_, _ uintptr, e unix.Errno) string { return e.Error() }
	out := map[string]string{
		"getpid":       errnoOf(unix.Syscall(unix.SYS_GETPID, 0, 0, 0)),
		"unshare_user": errnoOf(unix.Syscall(unix.SYS_UNSHARE, unix.CLONE_NEWUSER, 0, 0)),
		"mount":        errnoOf(unix.Syscall6(unix.SYS_MOUNT, 0, 0, 0, 0, 0, 0)),
		"clone3":       errnoOf(unix.Syscall(unix.SYS_CLONE3, 0, 0, 0)),
		"io_uring":     errnoOf(unix.Syscall(unix.SYS_IO_URING_SETUP, 1, 0, 0)),
		"vsock":        errnoOf(unix.Syscall(unix.SYS_SOCKET, unix.AF_VSOCK, unix.SOCK_STREAM, 0)),
		"keyctl":       errnoOf(unix.Syscall(unix.SYS_KEYCTL, 0, 0, 0)),
		"no_aslr":      errnoOf(unix.Syscall(unix.SYS_PERSONALITY, addrNoRandomize, 0, 0)),
	}
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM, 0)
	out["inet"] = "ok"
	if err != nil {
		out["inet"] = err.Error()
	} else {
		unix.Close(fd)
	}
	// The filter must survive execve: a child shell cannot unshare either.
	if err := exec.Command("/bin/sh", "-c", "exec unshare -U true").Run(); err == nil {
		out["child_unshare"] = "succeeded"
	} else {
		out["child_unshare"] = "failed"
	}
	json.NewEncoder(os.Stdout).Encode(out)
}

func TestRealVictim(t *testing.T) {
	if _, err := exec.LookPath("unshare"); err != nil {
		t.Skip("needs util-linux unshare")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), victimEnv+"=1")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("victim: %v (%s)", err, out)
	}
	var got map[string]string
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("victim output %q: %v", out, err)
	}
	want := map[string]string{
		"getpid":        unix.Errno(0).Error(),
		"unshare_user":  unix.EPERM.Error(),
		"mount":         unix.EPERM.Error(),
		"clone3":        unix.ENOSYS.Error(),
		"io_uring":      unix.EPERM.Error(),
		"vsock":         unix.EAFNOSUPPORT.Error(),
		"keyctl":        unix.EPERM.Error(),
		"no_aslr":       unix.EPERM.Error(),
		"inet":          "ok",
		"child_unshare": "failed",
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: got %q, want %q", k, got[k], v)
		}
	}
}

// addrNoRandomize is the personality flag that turns off ASLR.
const addrNoRandomize = 0x0040000
