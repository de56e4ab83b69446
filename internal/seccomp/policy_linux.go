package seccomp

import "golang.org/x/sys/unix"

// The sandbox's policy: an allowlist. Every system call this package
// knows is named below, either in a group a sandbox needs (allowed, some
// with their arguments checked) or in a group it must not have (refused).
// A number named nowhere gets ENOSYS (see Compile), so a call added by a
// newer kernel is refused until it is reviewed and named here.
//
// The allowed groups started from Docker's default profile (moby
// profiles/seccomp/default.json), less what a sandbox must not have, and
// were checked against what the runner, CPython 3.11 with numpy, pandas,
// matplotlib and scipy, multiprocessing, subprocess, threads, sh, dash,
// bash, coreutils, grep, sed, awk, find, tar, gzip, xz, bzip2, zstd, git,
// curl, perl, procps and iproute2 call (strace of the battery that
// internal/backend/native/allowlist_tools_test.go runs in a sandbox), and
// what the Go runtime of the sandbox's init and of the agent calls.

// sys names a system call by its number on this architecture.
type sys struct {
	name string
	nr   uint32
}

// Allowed groups. Calls of the architecture's legacy table (open, stat,
// fork ... on amd64) are in archAllowed.
var (
	// Files and directories: what programs do with the sandbox's own file
	// systems (the read-only root, the writable tmpfs of /workspace and
	// /tmp). inotify stays for tail -f and file watchers; what it may
	// watch is the mount layout's business.
	fileCalls = []sys{
		{"read", unix.SYS_READ}, {"write", unix.SYS_WRITE}, {"readv", unix.SYS_READV},
		{"writev", unix.SYS_WRITEV}, {"pread64", unix.SYS_PREAD64}, {"pwrite64", unix.SYS_PWRITE64},
		{"preadv", unix.SYS_PREADV}, {"pwritev", unix.SYS_PWRITEV}, {"lseek", unix.SYS_LSEEK},
		{"openat", unix.SYS_OPENAT}, {"openat2", unix.SYS_OPENAT2}, {"close", unix.SYS_CLOSE},
		{"close_range", unix.SYS_CLOSE_RANGE}, {"newfstatat", unix.SYS_NEWFSTATAT}, {"fstat", unix.SYS_FSTAT},
		{"statx", unix.SYS_STATX}, {"statfs", unix.SYS_STATFS}, {"fstatfs", unix.SYS_FSTATFS},
		{"getdents64", unix.SYS_GETDENTS64}, {"faccessat", unix.SYS_FACCESSAT}, {"faccessat2", unix.SYS_FACCESSAT2},
		{"readlinkat", unix.SYS_READLINKAT}, {"mkdirat", unix.SYS_MKDIRAT}, {"mknodat", unix.SYS_MKNODAT},
		{"unlinkat", unix.SYS_UNLINKAT}, {"renameat", unix.SYS_RENAMEAT}, {"renameat2", unix.SYS_RENAMEAT2},
		{"linkat", unix.SYS_LINKAT}, {"symlinkat", unix.SYS_SYMLINKAT}, {"fchmod", unix.SYS_FCHMOD},
		{"fchmodat", unix.SYS_FCHMODAT}, {"fchmodat2", unix.SYS_FCHMODAT2}, {"fchown", unix.SYS_FCHOWN},
		{"fchownat", unix.SYS_FCHOWNAT}, {"utimensat", unix.SYS_UTIMENSAT}, {"truncate", unix.SYS_TRUNCATE},
		{"ftruncate", unix.SYS_FTRUNCATE}, {"fallocate", unix.SYS_FALLOCATE}, {"fsync", unix.SYS_FSYNC},
		{"fdatasync", unix.SYS_FDATASYNC}, {"sync_file_range", unix.SYS_SYNC_FILE_RANGE},
		{"readahead", unix.SYS_READAHEAD}, {"getcwd", unix.SYS_GETCWD}, {"chdir", unix.SYS_CHDIR},
		{"fchdir", unix.SYS_FCHDIR}, {"umask", unix.SYS_UMASK}, {"flock", unix.SYS_FLOCK},
		{"fcntl", unix.SYS_FCNTL}, {"dup", unix.SYS_DUP}, {"dup3", unix.SYS_DUP3}, {"pipe2", unix.SYS_PIPE2},
		{"sendfile", unix.SYS_SENDFILE}, {"copy_file_range", unix.SYS_COPY_FILE_RANGE},
		{"splice", unix.SYS_SPLICE}, {"tee", unix.SYS_TEE}, {"vmsplice", unix.SYS_VMSPLICE},
		{"getxattr", unix.SYS_GETXATTR}, {"lgetxattr", unix.SYS_LGETXATTR}, {"fgetxattr", unix.SYS_FGETXATTR},
		{"listxattr", unix.SYS_LISTXATTR}, {"llistxattr", unix.SYS_LLISTXATTR},
		{"flistxattr", unix.SYS_FLISTXATTR}, {"setxattr", unix.SYS_SETXATTR},
		{"lsetxattr", unix.SYS_LSETXATTR}, {"fsetxattr", unix.SYS_FSETXATTR},
		{"removexattr", unix.SYS_REMOVEXATTR}, {"lremovexattr", unix.SYS_LREMOVEXATTR},
		{"fremovexattr", unix.SYS_FREMOVEXATTR}, {"getxattrat", unix.SYS_GETXATTRAT},
		{"listxattrat", unix.SYS_LISTXATTRAT}, {"setxattrat", unix.SYS_SETXATTRAT},
		{"removexattrat", unix.SYS_REMOVEXATTRAT}, {"inotify_init1", unix.SYS_INOTIFY_INIT1},
		{"inotify_add_watch", unix.SYS_INOTIFY_ADD_WATCH}, {"inotify_rm_watch", unix.SYS_INOTIFY_RM_WATCH},
	}

	// Waiting on descriptors, timers and events: event loops (asyncio,
	// the Go runtime's netpoller), select and poll.
	eventCalls = []sys{
		{"epoll_create1", unix.SYS_EPOLL_CREATE1}, {"epoll_ctl", unix.SYS_EPOLL_CTL},
		{"epoll_pwait", unix.SYS_EPOLL_PWAIT}, {"epoll_pwait2", unix.SYS_EPOLL_PWAIT2},
		{"ppoll", unix.SYS_PPOLL}, {"pselect6", unix.SYS_PSELECT6}, {"eventfd2", unix.SYS_EVENTFD2},
		{"signalfd4", unix.SYS_SIGNALFD4}, {"timerfd_create", unix.SYS_TIMERFD_CREATE},
		{"timerfd_settime", unix.SYS_TIMERFD_SETTIME}, {"timerfd_gettime", unix.SYS_TIMERFD_GETTIME},
	}

	// Memory of the process itself. Locked memory is bounded by
	// RLIMIT_MEMLOCK; mseal, protection keys and shadow stacks only
	// harden the process that asks.
	memoryCalls = []sys{
		{"brk", unix.SYS_BRK}, {"munmap", unix.SYS_MUNMAP},
		{"mremap", unix.SYS_MREMAP}, {"mprotect", unix.SYS_MPROTECT}, {"msync", unix.SYS_MSYNC},
		{"mincore", unix.SYS_MINCORE}, {"mlock", unix.SYS_MLOCK}, {"mlock2", unix.SYS_MLOCK2},
		{"munlock", unix.SYS_MUNLOCK}, {"mlockall", unix.SYS_MLOCKALL}, {"munlockall", unix.SYS_MUNLOCKALL},
		{"pkey_alloc", unix.SYS_PKEY_ALLOC}, {"pkey_free", unix.SYS_PKEY_FREE},
		{"pkey_mprotect", unix.SYS_PKEY_MPROTECT}, {"membarrier", unix.SYS_MEMBARRIER},
		{"mseal", unix.SYS_MSEAL}, {"map_shadow_stack", unix.SYS_MAP_SHADOW_STACK},
	}

	// Processes and threads: fork (clone, checked below), exec, wait,
	// futexes, scheduling within what an unprivileged process may set,
	// signals to processes of the sandbox's own PID namespace.
	processCalls = []sys{
		{"execve", unix.SYS_EXECVE}, {"execveat", unix.SYS_EXECVEAT}, {"exit", unix.SYS_EXIT},
		{"exit_group", unix.SYS_EXIT_GROUP}, {"wait4", unix.SYS_WAIT4}, {"waitid", unix.SYS_WAITID},
		{"getpid", unix.SYS_GETPID}, {"getppid", unix.SYS_GETPPID}, {"gettid", unix.SYS_GETTID},
		{"getpgid", unix.SYS_GETPGID}, {"setpgid", unix.SYS_SETPGID}, {"getsid", unix.SYS_GETSID},
		{"setsid", unix.SYS_SETSID}, {"set_tid_address", unix.SYS_SET_TID_ADDRESS},
		{"set_robust_list", unix.SYS_SET_ROBUST_LIST}, {"get_robust_list", unix.SYS_GET_ROBUST_LIST},
		{"rseq", unix.SYS_RSEQ}, {"futex", unix.SYS_FUTEX}, {"futex_waitv", unix.SYS_FUTEX_WAITV},
		{"futex_wake", unix.SYS_FUTEX_WAKE}, {"futex_wait", unix.SYS_FUTEX_WAIT},
		{"futex_requeue", unix.SYS_FUTEX_REQUEUE}, {"sched_yield", unix.SYS_SCHED_YIELD},
		{"sched_getaffinity", unix.SYS_SCHED_GETAFFINITY}, {"sched_setaffinity", unix.SYS_SCHED_SETAFFINITY},
		{"sched_getparam", unix.SYS_SCHED_GETPARAM}, {"sched_setparam", unix.SYS_SCHED_SETPARAM},
		{"sched_getscheduler", unix.SYS_SCHED_GETSCHEDULER},
		{"sched_setscheduler", unix.SYS_SCHED_SETSCHEDULER}, {"sched_getattr", unix.SYS_SCHED_GETATTR},
		{"sched_setattr", unix.SYS_SCHED_SETATTR}, {"sched_get_priority_max", unix.SYS_SCHED_GET_PRIORITY_MAX},
		{"sched_get_priority_min", unix.SYS_SCHED_GET_PRIORITY_MIN},
		{"sched_rr_get_interval", unix.SYS_SCHED_RR_GET_INTERVAL}, {"getpriority", unix.SYS_GETPRIORITY},
		{"setpriority", unix.SYS_SETPRIORITY}, {"ioprio_get", unix.SYS_IOPRIO_GET},
		{"ioprio_set", unix.SYS_IOPRIO_SET}, {"getrusage", unix.SYS_GETRUSAGE}, {"times", unix.SYS_TIMES},
		{"getrlimit", unix.SYS_GETRLIMIT}, {"pidfd_open", unix.SYS_PIDFD_OPEN},
		{"pidfd_send_signal", unix.SYS_PIDFD_SEND_SIGNAL}, {"kill", unix.SYS_KILL}, {"tkill", unix.SYS_TKILL},
		{"tgkill", unix.SYS_TGKILL}, {"uname", unix.SYS_UNAME}, {"sysinfo", unix.SYS_SYSINFO},
		{"getcpu", unix.SYS_GETCPU}, {"getrandom", unix.SYS_GETRANDOM}, {"capget", unix.SYS_CAPGET},
		{"capset", unix.SYS_CAPSET},
	}

	// Signals.
	signalCalls = []sys{
		{"rt_sigaction", unix.SYS_RT_SIGACTION}, {"rt_sigprocmask", unix.SYS_RT_SIGPROCMASK},
		{"rt_sigreturn", unix.SYS_RT_SIGRETURN}, {"rt_sigsuspend", unix.SYS_RT_SIGSUSPEND},
		{"rt_sigpending", unix.SYS_RT_SIGPENDING}, {"rt_sigtimedwait", unix.SYS_RT_SIGTIMEDWAIT},
		{"rt_sigqueueinfo", unix.SYS_RT_SIGQUEUEINFO}, {"rt_tgsigqueueinfo", unix.SYS_RT_TGSIGQUEUEINFO},
		{"sigaltstack", unix.SYS_SIGALTSTACK}, {"restart_syscall", unix.SYS_RESTART_SYSCALL},
	}

	// Clocks and timers, read and armed; never set.
	timeCalls = []sys{
		{"clock_gettime", unix.SYS_CLOCK_GETTIME}, {"clock_getres", unix.SYS_CLOCK_GETRES},
		{"clock_nanosleep", unix.SYS_CLOCK_NANOSLEEP}, {"nanosleep", unix.SYS_NANOSLEEP},
		{"gettimeofday", unix.SYS_GETTIMEOFDAY}, {"getitimer", unix.SYS_GETITIMER},
		{"setitimer", unix.SYS_SETITIMER}, {"timer_create", unix.SYS_TIMER_CREATE},
		{"timer_settime", unix.SYS_TIMER_SETTIME}, {"timer_gettime", unix.SYS_TIMER_GETTIME},
		{"timer_getoverrun", unix.SYS_TIMER_GETOVERRUN}, {"timer_delete", unix.SYS_TIMER_DELETE},
	}

	// Identity: reading it, and the changes su, setpriv and the init's
	// own exec of the runner make. Without capabilities the kernel
	// refuses any change but dropping to ids the process already has.
	identityCalls = []sys{
		{"getuid", unix.SYS_GETUID}, {"geteuid", unix.SYS_GETEUID}, {"getgid", unix.SYS_GETGID},
		{"getegid", unix.SYS_GETEGID}, {"getgroups", unix.SYS_GETGROUPS}, {"getresuid", unix.SYS_GETRESUID},
		{"getresgid", unix.SYS_GETRESGID}, {"setuid", unix.SYS_SETUID}, {"setgid", unix.SYS_SETGID},
		{"setreuid", unix.SYS_SETREUID}, {"setregid", unix.SYS_SETREGID}, {"setresuid", unix.SYS_SETRESUID},
		{"setresgid", unix.SYS_SETRESGID}, {"setgroups", unix.SYS_SETGROUPS}, {"setfsuid", unix.SYS_SETFSUID},
		{"setfsgid", unix.SYS_SETFSGID},
	}

	// Sockets, once made (socket and socketpair are checked below): in
	// the sandbox's own network namespace.
	socketCalls = []sys{
		{"bind", unix.SYS_BIND}, {"connect", unix.SYS_CONNECT}, {"listen", unix.SYS_LISTEN},
		{"accept", unix.SYS_ACCEPT}, {"accept4", unix.SYS_ACCEPT4}, {"getsockname", unix.SYS_GETSOCKNAME},
		{"getpeername", unix.SYS_GETPEERNAME}, {"getsockopt", unix.SYS_GETSOCKOPT},
		{"setsockopt", unix.SYS_SETSOCKOPT}, {"sendto", unix.SYS_SENDTO}, {"recvfrom", unix.SYS_RECVFROM},
		{"sendmsg", unix.SYS_SENDMSG}, {"recvmsg", unix.SYS_RECVMSG}, {"sendmmsg", unix.SYS_SENDMMSG},
		{"recvmmsg", unix.SYS_RECVMMSG}, {"shutdown", unix.SYS_SHUTDOWN},
	}

	// System V IPC and POSIX message queues, in the sandbox's own IPC
	// namespace (its objects go with it); message-queue bytes are bounded
	// by RLIMIT_MSGQUEUE.
	ipcCalls = []sys{
		{"shmat", unix.SYS_SHMAT}, {"shmdt", unix.SYS_SHMDT},
		{"shmctl", unix.SYS_SHMCTL}, {"semget", unix.SYS_SEMGET}, {"semop", unix.SYS_SEMOP},
		{"semtimedop", unix.SYS_SEMTIMEDOP}, {"semctl", unix.SYS_SEMCTL}, {"msgget", unix.SYS_MSGGET},
		{"msgsnd", unix.SYS_MSGSND}, {"msgrcv", unix.SYS_MSGRCV}, {"msgctl", unix.SYS_MSGCTL},
		{"mq_open", unix.SYS_MQ_OPEN}, {"mq_unlink", unix.SYS_MQ_UNLINK}, {"mq_timedsend", unix.SYS_MQ_TIMEDSEND},
		{"mq_timedreceive", unix.SYS_MQ_TIMEDRECEIVE}, {"mq_notify", unix.SYS_MQ_NOTIFY},
		{"mq_getsetattr", unix.SYS_MQ_GETSETATTR},
	}

	// A process restricting itself further: Landlock (seccomp, checked
	// below, stacks a filter under this one).
	selfRestrictionCalls = []sys{
		{"landlock_create_ruleset", unix.SYS_LANDLOCK_CREATE_RULESET},
		{"landlock_add_rule", unix.SYS_LANDLOCK_ADD_RULE},
		{"landlock_restrict_self", unix.SYS_LANDLOCK_RESTRICT_SELF},
	}
)

// Refused groups: EPERM, the answer of a kernel that refuses an
// unprivileged process, so that programs fail cleanly.
var (
	// Mounts, old and new API, and root changes.
	mountCalls = []sys{
		{"mount", unix.SYS_MOUNT}, {"umount2", unix.SYS_UMOUNT2}, {"pivot_root", unix.SYS_PIVOT_ROOT},
		{"chroot", unix.SYS_CHROOT}, {"fsopen", unix.SYS_FSOPEN}, {"fsconfig", unix.SYS_FSCONFIG},
		{"fsmount", unix.SYS_FSMOUNT}, {"fspick", unix.SYS_FSPICK}, {"move_mount", unix.SYS_MOVE_MOUNT},
		{"open_tree", unix.SYS_OPEN_TREE}, {"open_tree_attr", unix.SYS_OPEN_TREE_ATTR},
		{"mount_setattr", unix.SYS_MOUNT_SETATTR}, {"statmount", unix.SYS_STATMOUNT},
		{"listmount", unix.SYS_LISTMOUNT},
	}

	// Namespaces: creating or entering one is how most container escapes
	// start.
	namespaceCalls = []sys{
		{"unshare", unix.SYS_UNSHARE}, {"setns", unix.SYS_SETNS}, {"listns", unix.SYS_LISTNS},
	}

	// Reaching into other processes.
	otherProcessCalls = []sys{
		{"ptrace", unix.SYS_PTRACE}, {"process_vm_readv", unix.SYS_PROCESS_VM_READV},
		{"process_vm_writev", unix.SYS_PROCESS_VM_WRITEV}, {"kcmp", unix.SYS_KCMP},
		{"pidfd_getfd", unix.SYS_PIDFD_GETFD}, {"process_madvise", unix.SYS_PROCESS_MADVISE},
		{"process_mrelease", unix.SYS_PROCESS_MRELEASE},
	}

	// Large kernel attack surface that no sandboxed program needs.
	// io_uring gets EPERM, the answer of a kernel with io_uring_disabled
	// set, which liburing users fall back from.
	attackSurfaceCalls = []sys{
		{"bpf", unix.SYS_BPF}, {"perf_event_open", unix.SYS_PERF_EVENT_OPEN},
		{"userfaultfd", unix.SYS_USERFAULTFD}, {"io_uring_setup", unix.SYS_IO_URING_SETUP},
		{"io_uring_enter", unix.SYS_IO_URING_ENTER}, {"io_uring_register", unix.SYS_IO_URING_REGISTER},
		{"keyctl", unix.SYS_KEYCTL}, {"add_key", unix.SYS_ADD_KEY}, {"request_key", unix.SYS_REQUEST_KEY},
		{"fanotify_init", unix.SYS_FANOTIFY_INIT}, {"fanotify_mark", unix.SYS_FANOTIFY_MARK},
		{"lookup_dcookie", unix.SYS_LOOKUP_DCOOKIE}, {"lsm_get_self_attr", unix.SYS_LSM_GET_SELF_ATTR},
		{"lsm_set_self_attr", unix.SYS_LSM_SET_SELF_ATTR}, {"lsm_list_modules", unix.SYS_LSM_LIST_MODULES},
		{"file_getattr", unix.SYS_FILE_GETATTR}, {"file_setattr", unix.SYS_FILE_SETATTR},
		{"remap_file_pages", unix.SYS_REMAP_FILE_PAGES}, {"rseq_slice_yield", unix.SYS_RSEQ_SLICE_YIELD},
	}

	// The kernel and the machine.
	machineCalls = []sys{
		{"kexec_load", unix.SYS_KEXEC_LOAD}, {"kexec_file_load", unix.SYS_KEXEC_FILE_LOAD},
		{"init_module", unix.SYS_INIT_MODULE}, {"finit_module", unix.SYS_FINIT_MODULE},
		{"delete_module", unix.SYS_DELETE_MODULE}, {"reboot", unix.SYS_REBOOT},
		{"swapon", unix.SYS_SWAPON}, {"swapoff", unix.SYS_SWAPOFF}, {"syslog", unix.SYS_SYSLOG},
		{"settimeofday", unix.SYS_SETTIMEOFDAY}, {"clock_settime", unix.SYS_CLOCK_SETTIME},
		{"clock_adjtime", unix.SYS_CLOCK_ADJTIME}, {"adjtimex", unix.SYS_ADJTIMEX},
		{"acct", unix.SYS_ACCT}, {"quotactl", unix.SYS_QUOTACTL}, {"quotactl_fd", unix.SYS_QUOTACTL_FD},
		{"nfsservctl", unix.SYS_NFSSERVCTL}, {"vhangup", unix.SYS_VHANGUP},
		{"sethostname", unix.SYS_SETHOSTNAME}, {"setdomainname", unix.SYS_SETDOMAINNAME},
	}

	// File handles bypass path-based confinement (the "shocker" escape).
	handleCalls = []sys{
		{"open_by_handle_at", unix.SYS_OPEN_BY_HANDLE_AT}, {"name_to_handle_at", unix.SYS_NAME_TO_HANDLE_AT},
	}
)

// Refused with ENOSYS: features a kernel may be built without, which
// programs probe for and fall back from when the kernel says it lacks
// them.
var (
	// Linux AIO (CONFIG_AIO): io_setup reserves from fs.aio-max-nr, one
	// pool for the whole host; one io_setup(65536) leaves none to anyone.
	aioCalls = []sys{
		{"io_setup", unix.SYS_IO_SETUP}, {"io_destroy", unix.SYS_IO_DESTROY},
		{"io_submit", unix.SYS_IO_SUBMIT}, {"io_cancel", unix.SYS_IO_CANCEL},
		{"io_getevents", unix.SYS_IO_GETEVENTS}, {"io_pgetevents", unix.SYS_IO_PGETEVENTS},
	}

	// NUMA memory policy (CONFIG_NUMA): placing and moving pages across
	// the host's nodes is the host's business. OpenBLAS and libnuma take
	// ENOSYS as "no NUMA".
	numaCalls = []sys{
		{"mbind", unix.SYS_MBIND}, {"set_mempolicy", unix.SYS_SET_MEMPOLICY},
		{"get_mempolicy", unix.SYS_GET_MEMPOLICY}, {"set_mempolicy_home_node", unix.SYS_SET_MEMPOLICY_HOME_NODE},
		{"migrate_pages", unix.SYS_MIGRATE_PAGES}, {"move_pages", unix.SYS_MOVE_PAGES},
	}

	// memfd_secret (CONFIG_SECRETMEM) takes memory out of the kernel's
	// direct map; cachestat (CONFIG_CACHESTAT_SYSCALL) tells which pages
	// of a file are cached, the host's and other tenants' reads of /usr
	// among them.
	optionalCalls = []sys{
		{"memfd_secret", unix.SYS_MEMFD_SECRET}, {"cachestat", unix.SYS_CACHESTAT},
	}
)

// Namespace flags that legacy clone must never carry: creating namespaces is
// how most container escapes start (a fresh user namespace grants
// capabilities over new mounts and network stacks, widening kernel attack
// surface). CLONE_NEWTIME (0x80) is not among them: legacy clone reads that
// bit as part of the exit signal (CSIGNAL), never as a flag; only clone3
// and unshare, both refused, can make a time namespace.
const cloneNamespaceFlags = unix.CLONE_NEWNS | unix.CLONE_NEWCGROUP | unix.CLONE_NEWUTS |
	unix.CLONE_NEWIPC | unix.CLONE_NEWUSER | unix.CLONE_NEWPID | unix.CLONE_NEWNET

// socketFamilies are the address families a sandbox may create sockets
// of, with socket or socketpair. Everything else (packet, vsock to the
// hypervisor, XDP, bluetooth, alg, key, ...) fails with EAFNOSUPPORT before
// the kernel runs any of the family's code.
var socketFamilies = []uint64{unix.AF_UNIX, unix.AF_INET, unix.AF_INET6, unix.AF_NETLINK}

// netlinkProtocols: of netlink, only routing (what getaddrinfo,
// if_nameindex and ip(8) read, for the sandbox's own network namespace).
// Other protocols (generic netlink, netfilter, xfrm, sock_diag, audit,
// uevents ...) fail with EPROTONOSUPPORT, the kernel's answer for a
// protocol it lacks; ss(8) falls back to /proc/net.
var netlinkProtocols = []uint64{unix.NETLINK_ROUTE}

// personalities are the execution domains a sandbox may set, the same
// as Docker's default profile: querying (0xffffffff), PER_LINUX, UNAME26
// and their PER_LINUX32 variants. ADDR_NO_RANDOMIZE and READ_IMPLIES_EXEC
// are not among them.
var personalities = []uint64{0x0, 0x8, 0x20000, 0x20008, 0xffffffff}

// ioctl requests from asm-generic/ioctls.h, which amd64 and arm64 share,
// that golang.org/x/sys does not name.
const (
	ioctlFIONREAD        = 0x541B
	ioctlFIONBIO         = 0x5421
	ioctlFIONCLEX        = 0x5450
	ioctlFIOCLEX         = 0x5451
	ioctlFIOASYNC        = 0x5452
	ioctlSIOCGSTAMPOld   = 0x8906 // SIOCGSTAMP_OLD
	ioctlSIOCGSTAMPNSOld = 0x8907 // SIOCGSTAMPNS_OLD
)

// ioctlRequests are the ioctls a sandbox may make; any other gets EPERM.
// ioctl is a multiplexer into every driver the process holds a descriptor
// of; a sandbox holds few (pipes, sockets, its tmpfs files, null and
// friends, perhaps a pseudo-terminal it opened), and needs of them only:
//   - terminals: the termios reads and writes (isatty is TCGETS), window
//     size, job control, and what openpty and the pty module call. Not
//     TIOCSTI and TIOCLINUX (both push input into a terminal), TIOCSETD
//     (line disciplines, old and buggy kernel code), TIOCCONS, serial and
//     modem controls, console and keyboard ioctls;
//   - descriptors: FIONREAD, FIONBIO (CPython's socket.setblocking),
//     FIOCLEX and FIONCLEX (CPython's os.set_inheritable fails on any
//     error but ENOTTY and EACCES), FIOASYNC;
//   - sockets: the SIOCG* reads of the sandbox's own interfaces
//     (uuid.getnode, ifconfig), the out-of-band mark, queue sizes and
//     timestamps. Not SIOCETHTOOL or any SIOCS* (interface changes).
//
// Not cloning (FICLONE: cp --reflink=auto copies instead), file flags or
// extents, block devices, random-pool or tty-driver internals. The request
// is an unsigned int in the kernel: comparing 32 bits is sound.
var ioctlRequests = []uint64{
	// The most frequent first: the list is a chain of comparisons.
	unix.TCGETS, ioctlFIONBIO, ioctlFIOCLEX, ioctlFIONCLEX, unix.TIOCGWINSZ, ioctlFIONREAD,
	unix.TCSETS, unix.TCSETSW, unix.TCSETSF, unix.TCGETS2, unix.TCSETS2, unix.TCSETSW2, unix.TCSETSF2,
	unix.TCSBRK, unix.TCXONC, unix.TCFLSH, unix.TIOCSWINSZ, unix.TIOCGPGRP, unix.TIOCSPGRP,
	unix.TIOCGSID, unix.TIOCSCTTY, unix.TIOCNOTTY, unix.TIOCOUTQ, unix.TIOCGPTN, unix.TIOCSPTLCK,
	unix.TIOCGPTPEER, ioctlFIOASYNC,
	unix.SIOCGIFCONF, unix.SIOCGIFFLAGS, unix.SIOCGIFADDR, unix.SIOCGIFDSTADDR, unix.SIOCGIFBRDADDR,
	unix.SIOCGIFNETMASK, unix.SIOCGIFMETRIC, unix.SIOCGIFMTU, unix.SIOCGIFHWADDR, unix.SIOCGIFINDEX,
	unix.SIOCGIFNAME, unix.SIOCGIFTXQLEN, unix.SIOCATMARK, unix.SIOCOUTQNSD, ioctlSIOCGSTAMPOld,
	ioctlSIOCGSTAMPNSOld, unix.SIOCGSTAMP_NEW, unix.SIOCGSTAMPNS_NEW,
}

// prctlOptions are the prctl options a sandbox may use; any other gets
// EPERM. Reads of its own state, names (threads, and anonymous mappings,
// which glibc and the Go runtime name with PR_SET_VMA), the parent-death
// signal, timer slack, the child-subreaper flag, and the settings that
// only restrict the process itself (no_new_privs, seccomp, speculation
// control, MDWE, transparent huge pages, arm64 tagged addresses and shadow
// stacks). PR_SET_DUMPABLE and PR_CAP_AMBIENT are allowed only as
// prctlRule says. Refused, among others: PR_SET_MM (rewrite the process's
// memory map description), PR_SET_MEMORY_MERGE (KSM: merged pages tell one
// tenant what another holds), PR_SET_PTRACER, PR_SET_IO_FLUSHER,
// PR_CAPBSET_DROP, PR_SET_SECUREBITS, PR_SET_KEEPCAPS, PR_SCHED_CORE,
// perf event control. The option is an int in the kernel: comparing 32
// bits is sound.
var prctlOptions = []uint64{
	unix.PR_SET_VMA, unix.PR_SET_NAME, unix.PR_GET_NAME, unix.PR_SET_PDEATHSIG, unix.PR_GET_PDEATHSIG,
	unix.PR_GET_DUMPABLE, unix.PR_SET_DUMPABLE, unix.PR_GET_KEEPCAPS, unix.PR_GET_SECCOMP,
	unix.PR_SET_SECCOMP, unix.PR_CAPBSET_READ, unix.PR_GET_SECUREBITS, unix.PR_CAP_AMBIENT,
	unix.PR_SET_TIMERSLACK, unix.PR_GET_TIMERSLACK, unix.PR_SET_CHILD_SUBREAPER,
	unix.PR_GET_CHILD_SUBREAPER, unix.PR_SET_NO_NEW_PRIVS, unix.PR_GET_NO_NEW_PRIVS,
	unix.PR_GET_TID_ADDRESS, unix.PR_SET_THP_DISABLE, unix.PR_GET_THP_DISABLE,
	unix.PR_GET_SPECULATION_CTRL, unix.PR_SET_SPECULATION_CTRL, unix.PR_SET_MDWE, unix.PR_GET_MDWE,
	unix.PR_SVE_GET_VL, unix.PR_SME_GET_VL, unix.PR_GET_TAGGED_ADDR_CTRL, unix.PR_SET_TAGGED_ADDR_CTRL,
	unix.PR_GET_SHADOW_STACK_STATUS, unix.PR_SET_SHADOW_STACK_STATUS, unix.PR_LOCK_SHADOW_STACK_STATUS,
}

// prctlRule: options outside prctlOptions (with extra) get EPERM;
// PR_SET_DUMPABLE, unless dumpableAny, only with 0 (a sandbox may make
// itself undumpable, never dumpable again); PR_CAP_AMBIENT only with
// ambientOps. Both take their second argument as an unsigned long: it is
// compared whole.
func prctlRule(extra []uint64, dumpableAny bool, ambientOps []uint64) Rule {
	eperm := Errno(unix.EPERM)
	var cases []Case
	if !dumpableAny {
		cases = append(cases, Case{When: []Cond{argIn(0, unix.PR_SET_DUMPABLE), argNotIn(1, 0).wide()}, Action: eperm})
	}
	cases = append(cases,
		Case{When: []Cond{argIn(0, unix.PR_CAP_AMBIENT), argNotIn(1, ambientOps...).wide()}, Action: eperm},
		Case{When: []Cond{argNotIn(0, append(append([]uint64(nil), prctlOptions...), extra...)...)}, Action: eperm},
	)
	return Rule{Name: "prctl", Nr: unix.SYS_PRCTL, Cases: cases, Action: Allow}
}

// socketRule checks socket's and socketpair's family, and netlink's
// protocol. Both are ints in the kernel.
func socketRule(name string, nr uint32) Rule {
	return Rule{Name: name, Nr: nr, Action: Allow, Cases: []Case{
		{When: []Cond{argNotIn(0, socketFamilies...)}, Action: Errno(unix.EAFNOSUPPORT)},
		{When: []Cond{argIn(0, unix.AF_NETLINK), argNotIn(2, netlinkProtocols...)}, Action: Errno(unix.EPROTONOSUPPORT)},
	}}
}

// Page-cache observation. posix_fadvise(POSIX_FADV_DONTNEED) evicts a
// file's cached pages whoever else uses them: on the host's /usr, a
// sandbox could evict what the host and other tenants read, then time its
// own reads (or RWF_NOWAIT ones) to learn whether anyone read it since.
// DONTNEED gets a fake success (cp, dd and tar call it and carry on); the
// other advice passes. RWF_NOWAIT (a read that fails rather than wait for
// the disk) tells directly whether a page is cached: EOPNOTSUPP, what a
// file that cannot do it answers, and programs retry without it. Both are
// ints in the kernel.
func pageCacheRules() []Rule {
	nowait := Case{When: []Cond{argAny(5, unix.RWF_NOWAIT)}, Action: Errno(unix.EOPNOTSUPP)}
	return []Rule{
		{Name: "fadvise64", Nr: unix.SYS_FADVISE64, Action: Allow, Cases: []Case{
			{When: []Cond{argIn(3, unix.FADV_DONTNEED)}, Action: FakeSuccess},
		}},
		{Name: "preadv2", Nr: unix.SYS_PREADV2, Action: Allow, Cases: []Case{nowait}},
		{Name: "pwritev2", Nr: unix.SYS_PWRITEV2, Action: Allow, Cases: []Case{nowait}},
	}
}

// checkedRules are the sandbox's calls allowed with their arguments
// checked, and those answered without running.
func checkedRules() []Rule {
	eperm := Errno(unix.EPERM)
	rules := []Rule{
		// clone3 passes its flags in memory, where BPF cannot look: ENOSYS
		// makes glibc and Go fall back to clone, whose flags are checked.
		{Name: "clone3", Nr: unix.SYS_CLONE3, Action: Errno(unix.ENOSYS)},
		// Legacy clone takes its flags as lower_32_bits(flags).
		{Name: "clone", Nr: unix.SYS_CLONE, Action: Allow, Cases: []Case{
			{When: []Cond{argAny(0, cloneNamespaceFlags)}, Action: eperm},
		}},
		{Name: "ioctl", Nr: unix.SYS_IOCTL, Action: Allow, Cases: []Case{
			{When: []Cond{argNotIn(1, ioctlRequests...)}, Action: eperm},
		}},
		socketRule("socket", unix.SYS_SOCKET),
		socketRule("socketpair", unix.SYS_SOCKETPAIR),
		prctlRule(nil, false, []uint64{unix.PR_CAP_AMBIENT_IS_SET}),
		{Name: "personality", Nr: unix.SYS_PERSONALITY, Action: Allow, Cases: []Case{
			{When: []Cond{argNotIn(0, personalities...)}, Action: eperm},
		}},
		// A filter stacked under this one only restricts more; but no
		// user-space notifier (a listener descriptor that answers the
		// calls of the filtered process): nobody needs one, and its
		// kernel code has had bugs.
		{Name: "seccomp", Nr: unix.SYS_SECCOMP, Action: Allow, Cases: []Case{
			{When: []Cond{argAny(1, unix.SECCOMP_FILTER_FLAG_NEW_LISTENER)}, Action: eperm},
		}},
		// The core-size limit must stay as the sandbox's init set it:
		// with 1 the kernel refuses every core dump, even to a host
		// core_pattern pipe, whose handler would run as host root on a
		// sandbox's crash if the limit were 0 or more than a page.
		// getrlimit is prlimit64 with a NULL new limit, a read.
		{Name: "setrlimit", Nr: unix.SYS_SETRLIMIT, Action: Allow, Cases: []Case{
			{When: []Cond{argIn(0, unix.RLIMIT_CORE)}, Action: eperm},
		}},
		{Name: "prlimit64", Nr: unix.SYS_PRLIMIT64, Action: Allow, Cases: []Case{
			{When: []Cond{argIn(1, unix.RLIMIT_CORE), argNotIn(2, 0).wide()}, Action: eperm},
		}},
		// KSM (MADV_MERGEABLE): merging identical pages across processes
		// lets one tenant learn, by timing a write, whether another holds
		// the same page. EINVAL, the answer of a kernel without KSM.
		{Name: "madvise", Nr: unix.SYS_MADVISE, Action: Allow, Cases: []Case{
			{When: []Cond{argIn(2, unix.MADV_MERGEABLE)}, Action: Errno(unix.EINVAL)},
		}},
		// sync and syncfs write back every dirty page of a file system,
		// the host's among them: I/O a sandbox would impose on everyone,
		// and their duration tells how much the host has written. The
		// sandbox's own writable file systems are tmpfs, where there is
		// nothing to write back: a fake success loses nothing.
		{Name: "sync", Nr: unix.SYS_SYNC, Action: FakeSuccess},
		{Name: "syncfs", Nr: unix.SYS_SYNCFS, Action: FakeSuccess},
	}
	rules = append(rules, hugePageRules()...)
	return append(rules, pageCacheRules()...)
}

// shmHugeTLB is SHM_HUGETLB (linux/shm.h), which x/sys/unix does not name.
const shmHugeTLB = 0o4000

// hugePageRules keep sandboxes out of the host's pool of huge pages
// (vm.nr_hugepages), reserved by the host for its own databases and
// virtual machines and shared by every process: a sandbox could take them
// all. Each call answers what a kernel with no huge page to give answers:
// mmap ENOMEM, SysV shared memory EPERM (a user outside
// vm.hugetlb_shm_group), memfd EINVAL. Transparent huge pages are ordinary
// memory, charged to the sandbox, and stay.
func hugePageRules() []Rule {
	return []Rule{
		{Name: "mmap", Nr: unix.SYS_MMAP, Action: Allow, Cases: []Case{
			{When: []Cond{argAny(3, unix.MAP_HUGETLB)}, Action: Errno(unix.ENOMEM)},
		}},
		{Name: "shmget", Nr: unix.SYS_SHMGET, Action: Allow, Cases: []Case{
			{When: []Cond{argAny(2, shmHugeTLB)}, Action: Errno(unix.EPERM)},
		}},
		{Name: "memfd_create", Nr: unix.SYS_MEMFD_CREATE, Action: Allow, Cases: []Case{
			{When: []Cond{argAny(1, unix.MFD_HUGETLB)}, Action: Errno(unix.EINVAL)},
		}},
	}
}

// DefaultRules is the sandbox policy.
func DefaultRules() []Rule {
	rules := make([]Rule, 0, 400)
	add := func(action Action, groups ...[]sys) {
		for _, g := range groups {
			for _, s := range g {
				rules = append(rules, Rule{Name: s.name, Nr: s.nr, Action: action})
			}
		}
	}
	add(Allow, fileCalls, eventCalls, memoryCalls, processCalls, signalCalls, timeCalls, identityCalls,
		socketCalls, ipcCalls, selfRestrictionCalls, archAllowed)
	add(Errno(unix.EPERM), mountCalls, namespaceCalls, otherProcessCalls, attackSurfaceCalls, machineCalls,
		handleCalls, archDenied)
	add(Errno(unix.ENOSYS), aioCalls, numaCalls, optionalCalls, archAbsent)
	return append(rules, checkedRules()...)
}

// ZygoteRules is the policy of the zygote (internal/runner/zygote.py) and
// of a child it forks until the child loads DefaultRules: the sandbox's,
// plus what placing the child in a sandbox takes. setns (joining the
// sandbox's namespaces); setrlimit and prlimit64 without restriction (the
// child sets the sandbox's limits, the core size among them); prctl's
// PR_CAPBSET_DROP, PR_SET_SECUREBITS, PR_CAP_AMBIENT's lowering operations
// and PR_SET_DUMPABLE with any value. Mount, unshare, pivot_root, bpf and
// the rest stay refused. It only ever allows more than DefaultRules, and
// refuses the rest with the same answers, so that the sandbox's filter
// stacked on it gives the sandbox's answers exactly.
func ZygoteRules() []Rule {
	rules := DefaultRules()
	for i, r := range rules {
		switch r.Nr {
		case unix.SYS_SETNS, unix.SYS_SETRLIMIT, unix.SYS_PRLIMIT64:
			rules[i] = Rule{Name: r.Name, Nr: r.Nr, Action: Allow}
		case unix.SYS_PRCTL:
			rules[i] = prctlRule([]uint64{unix.PR_CAPBSET_DROP, unix.PR_SET_SECUREBITS}, true,
				[]uint64{unix.PR_CAP_AMBIENT_IS_SET, unix.PR_CAP_AMBIENT_LOWER, unix.PR_CAP_AMBIENT_CLEAR_ALL})
		}
	}
	return rules
}
