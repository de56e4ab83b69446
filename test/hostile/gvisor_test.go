//go:build linux

package hostile

import (
	"strings"
	"testing"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

// gvisorDifferences are the cases whose safe outcome differs under gVisor,
// and why. There the code's system calls are answered by gVisor's kernel
// (the Sentry), a user-space program that itself runs under a seccomp
// filter on the host: /proc, /sys, /dev, the network stack and the memory
// manager are gVisor's own, files reach the host only through its gofer,
// and errno values sometimes differ from Linux's. The attack still fails in
// every case; what differs is how it is refused.
var gvisorDifferences = withReadOnlyRoot(map[string]difference{
	"volume_escape":           {why: noVolumes},
	"volume_pass_descriptors": {why: noVolumes},
	"park_descriptors_in_flight": {why: "the Sentry keeps a sandbox's sockets and the descriptors queued on them in " +
		"its own memory, charged to the sandbox: the memory limit may come before the descriptor limit; the host's " +
		"budgets are never touched", check: heldOrMemoryLimit("in_flight")},
	"take_every_process_slot": {why: "each task costs the Sentry memory charged to the sandbox: the memory limit " +
		"may come before the pids limit", check: heldOrMemoryLimit("processes")},
	// Files: the host's files come through the gofer, which checks
	// permissions before the read-only mount (EACCES, EPERM) where Linux
	// says EROFS first.
	"write_read_only_root": {why: gofer, check: func(t *testing.T, h *harness, o *outcome) {
		wantOK(t, o, lines("append /etc/passwd EACCES", "create /etc/cron.d/evil ENOENT",
			"create /usr/bin/evil EACCES", "create /usr/lib/python3/dist-packages/evil.pth EACCES",
			"overwrite the runner EACCES", "overwrite python EACCES", "mkdir /evil EROFS",
			"unlink /etc/hosts EACCES", "rename /etc/passwd EROFS", "symlink in / EROFS",
			"write /var/evil EACCES"))
		for _, p := range []string{"/usr/bin/evil", "/usr/lib/python3/dist-packages/evil.pth", "/evil", "/var/evil"} {
			hostFileAbsent(t, p)
		}
	}},
	"change_host_file_metadata": {why: gofer, check: want("chmod su EPERM", "chown passwd EPERM",
		"utime python EPERM", "truncate os.py EACCES", "setxattr EACCES", "chmod workspace root EPERM")},
	"setuid_binaries_and_sudo": {why: "gVisor's statvfs does not report nosuid; no program gains a privilege " +
		"(no_new_privs, and every setuid program fails)", check: want("usr nosuid False",
		"sudo None doas None pkexec None", "su failed", "mount failed", "newgrp failed", "passwd failed",
		"chsh failed", "root seen False")},

	// /proc, /sys and /dev are gVisor's, not the host's.
	"write_proc_sys": {why: sentryProc + "; its /proc/sys is read-only to the sandbox user (EACCES)",
		check: want("kernel/core_pattern EACCES", "kernel/modprobe EACCES", "kernel/hostname EACCES",
			"vm/drop_caches EACCES", "vm/overcommit_memory EACCES", "kernel/sysrq EACCES",
			"net/ipv4/ip_forward EACCES", "fs/protected_symlinks ENOENT", "sysrq-trigger refused True")},
	"seccomp_kernel_modules": {why: sentryProc, check: want("init_module EPERM", "finit_module EPERM",
		"delete_module EPERM", "kexec_load EPERM", "kexec_file_load EPERM", "write /proc/sys/kernel/modprobe EACCES")},
	"proc_1_tricks": {why: sentryProc + "; PID 1 is Vivarium's agent, inside gVisor's boundary. gVisor's procfs " +
		"lets any process read another's environ, maps and auxv and list its descriptors " +
		"(google/gvisor#160, #13982): the agent's environment is PATH and HOME, its memory holds no " +
		"secret, and its descriptors, memory and root cannot be opened",
		check: want("environ ok", "mem EACCES", "maps ok", "stack ENOENT", "syscall ENOENT", "auxv ok",
			"pagemap ENOENT", "timers ENOENT", "root EACCES", "cwd EACCES", "exe EACCES", "fd ok",
			"map_files ENOENT", "root/etc EACCES", "write mem EACCES", "oom_score_adj EACCES", "ns/mnt ENOENT")},
	"read_host_environment": {why: "the agent's environment (PATH, HOME) is readable, see proc_1_tricks; no " +
		"process has the host's", check: want("canary var None", "home /workspace user sandbox",
		"own environ has canary False", "init environ ok", "processes with the canary []")},
	"raise_oom_protection": {why: sentryProc + ": oom_score_adj is a number the Sentry keeps, which the host's " +
		"OOM killer never reads; the sandbox's memory is its cgroup's on the host",
		check: want("oom_score_adj -1000 ok", "oom_adj -17 EACCES", "now -1000")},
	"cgroup_escape": {why: sentryProc + ": the Sentry shows no cgroup", check: want("cgroup paths []",
		"cgroup mounts 0", "mount cgroup EPERM", "release_agent ENOENT")},
	"lock_host_files": {why: "gVisor has no OFD locks (EINVAL), no locks on its devices (ENOLCK) and no " +
		"/proc/locks; its flock locks are the Sentry's own, never the host's", check: want("flock /usr/bin/env ok", "flock LIBDIR/libc.so.6 ok", "flock /etc/passwd ok",
		"flock / ok", "flock /opt/vivarium ok", "flock /dev/null ENOLCK", "lock seen on /usr/bin/env EINVAL", "lock seen on /etc/passwd EINVAL",
		"/proc/locks absent", "hold md5sum ok")},
	"proc_reveals_host": {why: sentryProc + ": it has no boot_id and no fs/file-nr, the cmdline of gVisor's own " +
		"kernel, a /proc/cgroups without controllers, and counters of the sandbox alone", check: func(t *testing.T, h *harness, o *outcome) {
		want := []string{"boot_id absent", "cmdline own"}
		for _, p := range []string{"config.gz", "interrupts", "softirqs", "diskstats", "partitions", "iomem", "ioports",
			"devices", "buddyinfo", "zoneinfo", "locks", "bus", "fs", "irq", "pressure"} {
			want = append(want, p+" hidden")
		}
		want = append(want, "loadavg ['0.00', '0.00', '0.00']", "stat cpus True", "stat counters ['0']",
			"cgroups []", "MemTotal ['131072']", "file-nr absent")
		wantOK(t, o, lines(want...))
	}},
	"capabilities_and_no_new_privs": {why: sentryProc + ": its status has no CapAmb line (none can be raised " +
		"without CapInh and CapPrm) and no NoNewPrivs line, which prctl tells instead",
		edit: func(code string) string {
			return strings.Replace(code, "status[k]", `status.get(k, " absent")`, 1) +
				"import ctypes\nprint(\"PR_GET_NO_NEW_PRIVS\", ctypes.CDLL(None).prctl(39, 0, 0, 0, 0))\n"
		},
		check: want("CapInh 0000000000000000", "CapPrm 0000000000000000", "CapEff 0000000000000000",
			"CapBnd 0000000000000000", "CapAmb absent", "NoNewPrivs absent", "Seccomp 2", "PR_GET_NO_NEW_PRIVS 1")},
	"enter_other_namespaces": {why: sentryProc + ": only some namespaces have files in /proc/self/ns",
		edit: func(code string) string {
			return strings.Replace(code, `    fd = os.open("/proc/self/ns/" + ns, os.O_RDONLY)`,
				`    if not os.path.exists("/proc/self/ns/" + ns):
        print("no file for", ns)
        continue
    fd = os.open("/proc/self/ns/" + ns, os.O_RDONLY)`, 1)
		},
		check: want("setns net EPERM", "no file for mnt", "setns pid EPERM", "setns user EPERM", "no file for uts",
			"no file for ipc", "no file for cgroup", "open init's mnt ns ENOENT", "nsenter failed")},
	"host_directories_not_visible": {why: "gVisor always mounts a /sys: the sandbox's is an empty read-only tmpfs",
		check: want("host dirs ['sys']", "run None", "root is /workspace", "var ['tmp']", "home ['user'] /workspace",
			"/sys/fs/cgroup ENOENT", "/sys/kernel ENOENT", "/run/user ENOENT", "/var/lib ENOENT", "/var/log ENOENT",
			"/boot ENOENT")},
	"host_devices": {why: "gVisor's /dev is its own: ptmx, pts, tty, fuse and net/tun are the Sentry's devices " +
		"(no host device is reachable); /dev is not writable (EACCES); a device node made in /tmp is " +
		"refused by the gofer",
		check: func(t *testing.T, h *harness, o *outcome) {
			want := []string{"['fd', 'full', 'fuse', 'net', 'null', 'ptmx', 'pts', 'random', 'shm', 'stderr', " +
				"'stdin', 'stdout', 'tty', 'urandom', 'zero']"}
			for _, d := range []string{"mem", "kmem", "port", "kmsg", "sda", "vda", "nvme0n1"} {
				want = append(want, "/dev/"+d+" ENOENT")
			}
			want = append(want, "/dev/ptmx ok", "/dev/tty EIO", "/dev/console ENOENT", "/dev/net/tun ok",
				"/dev/fuse ok")
			for _, d := range []string{"kvm", "loop0", "dri/card0"} {
				want = append(want, "/dev/"+d+" ENOENT")
			}
			want = append(want, "mknod char device EPERM", "mknod block device EPERM", "create in /dev EACCES")
			wantOK(t, o, lines(want...))
		}},
	"host_ptys_bounded": {why: "gVisor's ptys are the Sentry's, not the host kernel's: none of the host's pool " +
		"(kernel.pty.max) is spent, and they are bounded by the sandbox's memory",
		check: want("unbounded", "listed 64", "after closing one True", "TIOCSTI on a pty EPERM")},
	"seccomp_tiocsti": {why: "/dev/tty is the Sentry's: without a controlling terminal it says EIO",
		check: want("TIOCSTI fd 0 EPERM", "TIOCSTI fd 1 EPERM", "TIOCSTI fd 2 EPERM", "TIOCLINUX EPERM",
			"TIOCGWINSZ ENOTTY", "open /dev/tty EIO")},

	// System calls gVisor answers its own way.
	"seccomp_personality": {why: "gVisor answers personality(0xffffffff) and personality(0) with EINVAL, so " +
		"the probe's ASLR test reads -1; the filter still refuses the flags that weaken ASLR",
		check: want("query EINVAL", "PER_LINUX EINVAL", "ADDR_NO_RANDOMIZE EPERM", "READ_IMPLIES_EXEC EPERM",
			"MMAP_PAGE_ZERO EPERM", "aslr still on False", "setarch -R failed")},
	"ptrace": {why: "gVisor has no pidfd_open (ENOSYS)", check: want("traceme EPERM", "attach init EPERM",
		"attach own child EPERM", "seize own child EPERM", "process_vm_readv EPERM", "process_vm_writev EPERM",
		"kcmp EPERM", "pidfd_open child ENOSYS", "pidfd_getfd EPERM", "child mem EIO", "strace failed",
		"gdb attached False")},
	"seccomp_prctl_options": {why: "gVisor's prctl does not know PR_CAP_AMBIENT (EINVAL) where the filter lets " +
		"a read through; raising and clearing are refused by the filter before gVisor sees them",
		check: want("set dumpable 1 EPERM", "set dumpable 0 ok", "dumpable 0", "set dumpable 1 again EPERM",
			"set name ok", "pdeathsig ok", "capbset read ok", "capbset drop EPERM", "set securebits EPERM",
			"ambient is_set EINVAL", "ambient raise EPERM", "ambient clear EPERM", "set mm EPERM",
			"memory merge EPERM", "set ptracer EPERM", "io flusher EPERM")},
	"become_root": {why: "gVisor's setfsuid returns -1 where it changes nothing", check: want(
		"uid 1000 1000 gid 1000 groups []", "setuid 0 EPERM", "seteuid 0 EPERM", "setresuid 0 EPERM",
		"setgid 0 EPERM", "setgroups [0] EPERM", "fsuid after setfsuid(0) -1")},

	// The network: gVisor's stack, with loopback only.
	"reach_internet": {why: netstack, check: want("tcp 1.1.1.1 EHOSTUNREACH", "tcp 8.8.8.8 EHOSTUNREACH",
		"tcp 2606:4700:4700::1111 EHOSTUNREACH", "udp 8.8.8.8 EHOSTUNREACH", "broadcast ENETUNREACH", "routes []")},
	"cloud_metadata": {why: netstack, check: want("169.254.169.254 EHOSTUNREACH", "169.254.170.2 EHOSTUNREACH",
		"100.100.100.200 EHOSTUNREACH", "168.63.129.16 EHOSTUNREACH", "fd00:ec2::254 EHOSTUNREACH", "urllib URLError")},
	"reach_host_addresses": {why: netstack, check: func(t *testing.T, h *harness, o *outcome) {
		// The host's addresses as the case saw them (tests of the
		// network policy add and remove some while it runs).
		var ls []string
		for _, ip := range strings.Fields(o.vars["HOST_IPS"]) {
			ls = append(ls, ip+" EHOSTUNREACH")
		}
		wantOK(t, o, lines(ls...))
	}},
	"dns": {why: netstack, check: want("example.com gaierror", "metadata.google.internal gaierror",
		"kubernetes.default.svc gaierror", "host.docker.internal gaierror", "localhost 127.0.0.1",
		"resolv.conf ''", "query 8.8.8.8 directly EHOSTUNREACH")},
	"egress_around_the_proxy": {why: netstack + "; the proxy is reached through the agent, and around it " +
		"nothing is", check: func(t *testing.T, h *harness, o *outcome) {
		wantOK(t, o, lines("direct EHOSTUNREACH", "direct peer EHOSTUNREACH", "udp dns EHOSTUNREACH",
			"resolve gaierror", "raw EPERM", "no proxy env refused"))
		wantSeen(t, h.egress)
	}},
	"netlink_reconfigure_network": {why: netstack + "; it refuses changes with EACCES (the ioctl is refused by " +
		"the seccomp allowlist before the Sentry sees it, as on native)",
		check: want("interfaces [(1, 'lo')]", "add address EACCES", "add link EACCES", "add route EACCES",
			"lo down EPERM", "interfaces after [(1, 'lo')]")},
	"raw_and_packet_sockets": {why: netstack + "; its ICMP echo sockets are open to every user, and reach " +
		"only loopback", check: want("raw icmp EPERM", "raw tcp EPERM", "raw ipv6 EPERM", "packet EAFNOSUPPORT",
		"vsock EAFNOSUPPORT", "bluetooth EAFNOSUPPORT", "alg EAFNOSUPPORT", "pf_key EAFNOSUPPORT",
		"can EAFNOSUPPORT", "ping ok")},

	// Limits: memory is the Sentry's, charged to the sandbox's cgroup on
	// the host, which has no processes of the code to choose among.
	"memory_bomb": {why: forcedCharge,
		check: func(t *testing.T, h *harness, o *outcome) {
			wantStatus(t, o, sandbox.StatusMemoryLimit, sandbox.ExitMemoryLimit)
			wantPeakNear(t, o)
		}},
	"sysv_shared_memory_bomb": {why: forcedCharge + "; the segments live in the Sentry's memory, gone with it",
		check: func(t *testing.T, h *harness, o *outcome) {
			wantStatus(t, o, sandbox.StatusMemoryLimit, sandbox.ExitMemoryLimit)
			wantPeakNear(t, o)
		}},
	"memory_bomb_in_children": {why: wholeOOM + "; " + forcedCharge, check: func(t *testing.T, h *harness, o *outcome) {
		wantStatus(t, o, sandbox.StatusMemoryLimit, sandbox.ExitMemoryLimit)
		wantPeakNear(t, o)
	}},
	"fork_bomb": {why: "RLIMIT_NPROC stops the forks, but the Sentry copies the pages of 32 interpreters " +
		"more eagerly than Linux: the memory limit ends the sandbox first; " + wholeOOM + "; " + forcedCharge,
		check: func(t *testing.T, h *harness, o *outcome) {
			if o.Status != sandbox.StatusTimeout && o.Status != sandbox.StatusMemoryLimit {
				t.Fatalf("want the timeout or the memory limit; %s", describe(o))
			}
			wantPeakNear(t, o)
		}},
	"shell_fork_bomb": {why: "forks through gVisor's ptrace platform are slow: on a busy machine the bomb " +
		"reaches the limit later than 2 s; the case waits for the refusal up to 25 s",
		edit: func(code string) string {
			return strings.Replace(code, "time.sleep(2)\n", `for _ in range(250):
    time.sleep(0.1)
    if "Cannot fork" in open("/tmp/bomb.err").read():
        break
`, 1)
		}},
	"thread_bomb": {why: "gVisor's RLIMIT_NPROC counts the threads the code starts, not those it had",
		edit: func(code string) string { return strings.Replace(code, "n < 32", "n <= 32", 1) }},
})

// Why cases differ under gVisor.
const (
	gofer      = "the host's files come through gVisor's gofer, which checks permissions before the read-only mount"
	sentryProc = "/proc is gVisor's"
	netstack   = "the network is gVisor's own stack (netstack) with loopback only: it says EHOSTUNREACH where " +
		"Linux says ENETUNREACH"
	forcedCharge = "when the kernel kills gVisor at the limit, its threads, dying, may still charge a last " +
		"page or two (a cgroup's forced charges): the peak stays within a few pages of the limit"
	wholeOOM = "the host's OOM killer sees gVisor, not the code's processes: over its memory limit the " +
		"sandbox ends as a whole (memory_limit), and the limit holds"
)

// wantPeakNear: the sandbox's peak memory stayed within a few pages of
// its limit (see forcedCharge).
func wantPeakNear(t *testing.T, o *outcome) {
	t.Helper()
	if o.PeakMemoryBytes > o.limits.Memory+64<<10 {
		t.Errorf("peak memory %d bytes, over the %d limit and 64 KiB", o.PeakMemoryBytes, o.limits.Memory)
	}
}

// want: the code ran to its end and printed these lines.
func want(ls ...string) func(t *testing.T, h *harness, o *outcome) {
	return func(t *testing.T, h *harness, o *outcome) {
		t.Helper()
		wantOK(t, o, lines(ls...))
	}
}
