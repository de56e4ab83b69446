//go:build linux

package hostile

import (
	"fmt"
	"runtime"
	"testing"

	"golang.org/x/sys/unix"
)

// Escalating to root, and the namespace, mount and ptrace escapes that
// start from privileges a sandbox does not have.
var privilegeCases = []hostileCase{
	{
		name: "become_root",
		code: withProbes(`
print("uid", os.getuid(), os.geteuid(), "gid", os.getgid(), "groups", os.getgroups())
attempt("setuid 0", os.setuid, 0)
attempt("seteuid 0", os.seteuid, 0)
attempt("setresuid 0", os.setresuid, 0, 0, 0)
attempt("setgid 0", os.setgid, 0)
attempt("setgroups [0]", os.setgroups, [0])
_libc.setfsuid(0)  # reports nothing but the previous value
print("fsuid after setfsuid(0)", _libc.setfsuid(-1))
`),
		check: func(t *testing.T, h *harness, o *outcome) {
			wantOK(t, o, lines("uid 1000 1000 gid 1000 groups []", "setuid 0 EPERM", "seteuid 0 EPERM",
				"setresuid 0 EPERM", "setgid 0 EPERM", "setgroups [0] EPERM", "fsuid after setfsuid(0) 1000"))
		},
	},
	{
		name: "capabilities_and_no_new_privs",
		code: `
status = dict(l.split(":", 1) for l in open("/proc/self/status"))
for k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs", "Seccomp"):
    print(k, status[k].strip())
`,
		check: func(t *testing.T, h *harness, o *outcome) {
			wantOK(t, o, lines("CapInh 0000000000000000", "CapPrm 0000000000000000", "CapEff 0000000000000000",
				"CapBnd 0000000000000000", "CapAmb 0000000000000000", "NoNewPrivs 1", "Seccomp 2"))
		},
	},
	{
		name: "setuid_binaries_and_sudo",
		code: `
import os, shutil, subprocess
print("usr nosuid", bool(os.statvfs("/usr").f_flag & os.ST_NOSUID))
print("sudo", shutil.which("sudo"), "doas", shutil.which("doas"), "pkexec", shutil.which("pkexec"))
seen_root = False
for argv in (["su", "-c", "id -u", "root"], ["mount", "-t", "tmpfs", "none", "/tmp"], ["newgrp", "root"],
             ["passwd", "-d", "root"], ["chsh", "-s", "/bin/sh", "root"]):
    if shutil.which(argv[0]) is None:
        print(argv[0], "absent")
        continue
    p = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=5)
    seen_root = seen_root or p.stdout.strip() == "0" or "uid=0" in p.stdout
    print(argv[0], "failed" if p.returncode != 0 else "succeeded")
print("root seen", seen_root)
`,
		check: func(t *testing.T, h *harness, o *outcome) {
			wantOK(t, o, lines("usr nosuid True", "sudo None doas None pkexec None", "su failed",
				"mount failed", "newgrp failed", "passwd failed", "chsh failed", "root seen False"))
		},
	},
	{
		name: "new_user_namespace",
		code: withProbes(`
import subprocess
CLONE_NEWUSER, CLONE_NEWNS, CLONE_NEWNET, CLONE_NEWPID = 0x10000000, 0x00020000, 0x40000000, 0x20000000
syscall("unshare user", "unshare", CLONE_NEWUSER)
syscall("unshare user+mount", "unshare", CLONE_NEWUSER | CLONE_NEWNS)
syscall("unshare net", "unshare", CLONE_NEWNET)
syscall("clone user", "clone", CLONE_NEWUSER | 17, 0, 0, 0, 0)
syscall("clone pid", "clone", CLONE_NEWPID | 17, 0, 0, 0, 0)
syscall("clone3", "clone3", 0, 0)
p = subprocess.run(["unshare", "-r", "id", "-u"], capture_output=True, text=True)
print("unshare -r", "failed" if p.returncode else "succeeded: " + p.stdout.strip())
print("max_user_namespaces read-only", not os.access("/proc/sys/user/max_user_namespaces", os.W_OK))
pid = os.fork()
if pid == 0:
    os._exit(0)
print("fork still works", os.waitpid(pid, 0)[1] == 0)
`),
		check: func(t *testing.T, h *harness, o *outcome) {
			// clone3 answers ENOSYS so that libc falls back to clone, whose
			// flags the filter can see.
			wantOK(t, o, lines("unshare user EPERM", "unshare user+mount EPERM", "unshare net EPERM",
				"clone user EPERM", "clone pid EPERM", "clone3 ENOSYS", "unshare -r failed",
				"max_user_namespaces read-only True", "fork still works True"))
		},
	},
	{
		name: "enter_other_namespaces",
		code: withProbes(`
for ns in ("net", "mnt", "pid", "user", "uts", "ipc", "cgroup"):
    fd = os.open("/proc/self/ns/" + ns, os.O_RDONLY)
    syscall("setns " + ns, "setns", fd, 0)
    os.close(fd)
attempt("open init's mnt ns", os.open, "/proc/1/ns/mnt", os.O_RDONLY)
p = __import__("subprocess").run(["nsenter", "-t", "1", "-m", "true"], capture_output=True)
print("nsenter", "failed" if p.returncode else "succeeded")
`),
		check: func(t *testing.T, h *harness, o *outcome) {
			wantOK(t, o, lines("setns net EPERM", "setns mnt EPERM", "setns pid EPERM", "setns user EPERM",
				"setns uts EPERM", "setns ipc EPERM", "setns cgroup EPERM", "open init's mnt ns EACCES",
				"nsenter failed"))
		},
	},
	{
		name: "mount_and_chroot",
		code: withProbes(`
before = len(open("/proc/self/mountinfo").readlines())
os.makedirs("/tmp/m")
syscall("mount tmpfs", "mount", "tmpfs", "/tmp/m", "tmpfs", 0, 0)
syscall("bind /", "mount", "/", "/tmp/m", 0, 0x1000, 0)
syscall("remount / rw", "mount", 0, "/", 0, 0x20 | 0x1000, 0)
syscall("umount /proc", "umount2", "/proc", 2)
syscall("umount /usr", "umount2", "/usr", 0)
syscall("pivot_root", "pivot_root", "/tmp", "/tmp/m")
syscall("chroot", "chroot", "/tmp")
syscall("fsopen", "fsopen", "tmpfs", 0)
syscall("open_tree", "open_tree", -100, "/usr", 1)
syscall("move_mount", "move_mount", -100, "/usr", -100, "/tmp/m", 0)
syscall("mount_setattr", "mount_setattr", -100, "/", 0, 0, 0)
print("mounts unchanged", len(open("/proc/self/mountinfo").readlines()) == before)
`),
		check: func(t *testing.T, h *harness, o *outcome) {
			wantOK(t, o, lines("mount tmpfs EPERM", "bind / EPERM", "remount / rw EPERM", "umount /proc EPERM",
				"umount /usr EPERM", "pivot_root EPERM", "chroot EPERM", "fsopen EPERM", "open_tree EPERM",
				"move_mount EPERM", "mount_setattr EPERM", "mounts unchanged True"))
		},
	},
	{
		name: "ptrace",
		code: withProbes(`
import signal, subprocess
PTRACE_TRACEME, PTRACE_ATTACH, PTRACE_SEIZE = 0, 16, 0x4206
child = subprocess.Popen(["sleep", "30"])
syscall("traceme", "ptrace", PTRACE_TRACEME, 0, 0, 0)
syscall("attach init", "ptrace", PTRACE_ATTACH, 1, 0, 0)
syscall("attach own child", "ptrace", PTRACE_ATTACH, child.pid, 0, 0)
syscall("seize own child", "ptrace", PTRACE_SEIZE, child.pid, 0, 0)
buf = _ctypes.create_string_buffer(16)
iov = (_ctypes.c_void_p * 2)(_ctypes.addressof(buf), 16)
syscall("process_vm_readv", "process_vm_readv", child.pid, iov, 1, iov, 1, 0)
syscall("process_vm_writev", "process_vm_writev", child.pid, iov, 1, iov, 1, 0)
syscall("kcmp", "kcmp", os.getpid(), child.pid, 0, 0, 0)
pidfd = syscall("pidfd_open child", "pidfd_open", child.pid, 0)
syscall("pidfd_getfd", "pidfd_getfd", pidfd, 0, 0)
attempt("child mem", lambda: open("/proc/%d/mem" % child.pid, "rb").read(1))
p = subprocess.run(["strace", "-f", "true"], capture_output=True)
print("strace", "failed" if p.returncode else "succeeded")
p = subprocess.run(["gdb", "-batch", "-p", "1"], capture_output=True, text=True)
print("gdb attached", "Attaching to process 1" in p.stdout and "ptrace: Operation not permitted" not in p.stdout + p.stderr)
child.kill()
`),
		check: func(t *testing.T, h *harness, o *outcome) {
			// Even its own child: the filter denies ptrace outright.
			// /proc/<child>/mem needs ptrace access, which the kernel
			// grants a parent of the same uid.
			wantOK(t, o, lines("traceme EPERM", "attach init EPERM", "attach own child EPERM",
				"seize own child EPERM", "process_vm_readv EPERM", "process_vm_writev EPERM", "kcmp EPERM",
				"pidfd_open child ok", "pidfd_getfd EPERM", "child mem EIO", "strace failed", "gdb attached False"))
		},
	},
}

// System calls the seccomp filter denies, made directly through libc's
// syscall(): the filter, not a missing privilege, must answer, which the
// errno shows where the kernel would answer differently.
var seccompCases = []hostileCase{
	{
		name: "seccomp_bpf_perf_userfaultfd",
		code: withProbes(`
syscall("bpf prog load", "bpf", 5, 0, 0)
syscall("bpf map create", "bpf", 0, 0, 0)
syscall("perf_event_open", "perf_event_open", 0, 0, -1, -1, 0)
syscall("userfaultfd", "userfaultfd", 0)
syscall("fanotify_init", "fanotify_init", 0, 0)
`),
		check: func(t *testing.T, h *harness, o *outcome) {
			wantOK(t, o, lines("bpf prog load EPERM", "bpf map create EPERM", "perf_event_open EPERM",
				"userfaultfd EPERM", "fanotify_init EPERM"))
		},
	},
	{
		name: "seccomp_keyrings",
		code: withProbes(`
syscall("keyctl get keyring", "keyctl", 0, -3, 0)
syscall("add_key", "add_key", "user", "evil", "x", 1, -3)
syscall("request_key", "request_key", "user", "evil", 0, 0)
`),
		check: func(t *testing.T, h *harness, o *outcome) {
			wantOK(t, o, lines("keyctl get keyring EPERM", "add_key EPERM", "request_key EPERM"))
		},
	},
	{
		name: "seccomp_io_uring",
		code: withProbes(`
params = _ctypes.create_string_buffer(120)
syscall("io_uring_setup", "io_uring_setup", 8, params)
syscall("io_uring_enter", "io_uring_enter", 0, 1, 0, 0, 0, 0)
syscall("io_uring_register", "io_uring_register", 0, 0, 0, 0)
`),
		check: func(t *testing.T, h *harness, o *outcome) {
			wantOK(t, o, lines("io_uring_setup EPERM", "io_uring_enter EPERM", "io_uring_register EPERM"))
		},
	},
	{
		name: "seccomp_personality",
		code: withProbes(`
import subprocess
syscall("query", "personality", 0xffffffff)
syscall("PER_LINUX", "personality", 0)
syscall("ADDR_NO_RANDOMIZE", "personality", 0x0040000)
syscall("READ_IMPLIES_EXEC", "personality", 0x0400000)
syscall("MMAP_PAGE_ZERO", "personality", 0x0100000)
print("aslr still on", _libc.personality(0xffffffff) & 0x0040000 == 0)
p = subprocess.run(["setarch", "-R", "true"], capture_output=True)
print("setarch -R", "failed" if p.returncode else "succeeded")
`),
		check: func(t *testing.T, h *harness, o *outcome) {
			wantOK(t, o, lines("query ok", "PER_LINUX ok", "ADDR_NO_RANDOMIZE EPERM", "READ_IMPLIES_EXEC EPERM",
				"MMAP_PAGE_ZERO EPERM", "aslr still on True", "setarch -R failed"))
		},
	},
	{
		name: "seccomp_tiocsti",
		code: withProbes(`
c = _ctypes.create_string_buffer(b"x")
for fd in (0, 1, 2):
    syscall("TIOCSTI fd %d" % fd, "ioctl", fd, ` + fmt.Sprint(unix.TIOCSTI) + `, c)
syscall("TIOCLINUX", "ioctl", 0, ` + fmt.Sprint(unix.TIOCLINUX) + `, c)
syscall("TIOCGWINSZ", "ioctl", 0, ` + fmt.Sprint(unix.TIOCGWINSZ) + `, _ctypes.create_string_buffer(8))
attempt("open /dev/tty", lambda: open("/dev/tty", "rb"))
`),
		check: func(t *testing.T, h *harness, o *outcome) {
			// On these non-terminals the kernel would say ENOTTY, as it
			// does for TIOCGWINSZ: EPERM is the filter's answer. /dev/tty
			// is there, and without a controlling terminal says ENXIO.
			wantOK(t, o, lines("TIOCSTI fd 0 EPERM", "TIOCSTI fd 1 EPERM", "TIOCSTI fd 2 EPERM",
				"TIOCLINUX EPERM", "TIOCGWINSZ ENOTTY", "open /dev/tty ENXIO"))
		},
	},
	{
		name: "seccomp_kernel_modules",
		code: withProbes(`
fd = os.open("/usr/bin/true", os.O_RDONLY)
syscall("init_module", "init_module", 0, 0, "")
syscall("finit_module", "finit_module", fd, "", 0)
syscall("delete_module", "delete_module", "ext4", 0)
syscall("kexec_load", "kexec_load", 0, 0, 0, 0)
syscall("kexec_file_load", "kexec_file_load", fd, fd, 0, "", 0)
attempt("write /proc/sys/kernel/modprobe", write, "/proc/sys/kernel/modprobe", "/tmp/evil")
`),
		check: func(t *testing.T, h *harness, o *outcome) {
			wantOK(t, o, lines("init_module EPERM", "finit_module EPERM", "delete_module EPERM", "kexec_load EPERM",
				"kexec_file_load EPERM", "write /proc/sys/kernel/modprobe "+procSysAnswer("kernel/modprobe")))
		},
	},
	{
		name: "seccomp_machine_state",
		code: withProbes(`
tv = _ctypes.create_string_buffer(16)
syscall("reboot", "reboot", 0xfee1dead, 672274793, 0x4321fedc, 0)
syscall("swapon", "swapon", "/tmp/swap", 0)
syscall("swapoff", "swapoff", "/tmp/swap")
syscall("settimeofday", "settimeofday", tv, 0)
syscall("clock_settime", "clock_settime", 0, tv)
syscall("adjtimex", "adjtimex", _ctypes.create_string_buffer(256))
syscall("acct", "acct", "/tmp/acct")
syscall("quotactl", "quotactl", 0x800002, "/", 0, 0)
syscall("vhangup", "vhangup")
`),
		check: func(t *testing.T, h *harness, o *outcome) {
			wantOK(t, o, lines("reboot EPERM", "swapon EPERM", "swapoff EPERM", "settimeofday EPERM",
				"clock_settime EPERM", "adjtimex EPERM", "acct EPERM", "quotactl EPERM", "vhangup EPERM"))
		},
	},
	{
		// The "shocker" escape opened host files by handle.
		name: "seccomp_file_handles",
		code: withProbes(`
handle = _ctypes.create_string_buffer(128)
_ctypes.memmove(handle, (128).to_bytes(4, "little"), 4)
mount_id = _ctypes.c_int()
syscall("name_to_handle_at", "name_to_handle_at", -100, "/etc/hostname", handle, _ctypes.byref(mount_id), 0)
syscall("open_by_handle_at", "open_by_handle_at", os.open("/", os.O_RDONLY), handle, 0)
`),
		check: func(t *testing.T, h *harness, o *outcome) {
			wantOK(t, o, lines("name_to_handle_at EPERM", "open_by_handle_at EPERM"))
		},
	},
	{
		name: "seccomp_x32_entry_points",
		code: withProbes(`
syscall("getpid", "getpid")
syscall("x32 getpid", "x32_getpid")
`),
		prepare: func(t *testing.T, h *harness, j *job) {
			if runtime.GOARCH != "amd64" {
				t.Skip("the x32 ABI exists on amd64 only")
			}
		},
		check: func(t *testing.T, h *harness, o *outcome) {
			wantOK(t, o, lines("getpid ok", "x32 getpid ENOSYS"))
		},
	},
	{
		name: "raise_rlimits",
		code: withProbes(`
import resource
for name in ("RLIMIT_NOFILE", "RLIMIT_FSIZE", "RLIMIT_CORE"):
    r = getattr(resource, name)
    soft, hard = resource.getrlimit(r)
    attempt(name, resource.setrlimit, r, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
attempt("prlimit init", resource.prlimit, 1, resource.RLIMIT_NOFILE, (16, 16))
`),
		check: func(t *testing.T, h *harness, o *outcome) {
			wantOK(t, o, lines("RLIMIT_NOFILE ValueError", "RLIMIT_FSIZE ValueError", "RLIMIT_CORE ValueError",
				"prlimit init EPERM"))
		},
	},
}
