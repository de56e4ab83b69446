package seccomp

import "golang.org/x/sys/unix"

// Namespace flags that legacy clone must never carry: creating namespaces is
// how most container escapes start (a fresh user namespace grants
// capabilities over new mounts and network stacks, widening kernel attack
// surface).
const cloneNamespaceFlags = unix.CLONE_NEWNS | unix.CLONE_NEWCGROUP | unix.CLONE_NEWUTS |
	unix.CLONE_NEWIPC | unix.CLONE_NEWUSER | unix.CLONE_NEWPID | unix.CLONE_NEWNET

// allowedSocketFamilies are the address families a sandbox may create.
// Everything else (packet, vsock to the hypervisor, bluetooth, alg, key, ...)
// fails with EAFNOSUPPORT. Netlink stays: it only sees the sandbox's own
// network namespace, and glibc's getaddrinfo uses it.
var allowedSocketFamilies = []uint32{unix.AF_UNIX, unix.AF_INET, unix.AF_INET6, unix.AF_NETLINK}

// allowedPersonalities are the execution domains a sandbox may set, the same
// as Docker's default profile: querying (0xffffffff), PER_LINUX, UNAME26 and
// their PER_LINUX32 variants. ADDR_NO_RANDOMIZE and READ_IMPLIES_EXEC are not
// among them.
var allowedPersonalities = []uint32{0x0, 0x8, 0x20000, 0x20008, 0xffffffff}

// deniedAlways lists system calls a sandbox never needs. They return EPERM,
// the answer an unprivileged process would get, so programs fail cleanly.
var deniedAlways = []struct {
	name string
	nr   uint32
}{
	// Mounts, old and new API, and root changes.
	{"mount", unix.SYS_MOUNT}, {"umount2", unix.SYS_UMOUNT2}, {"pivot_root", unix.SYS_PIVOT_ROOT},
	{"chroot", unix.SYS_CHROOT}, {"fsopen", unix.SYS_FSOPEN}, {"fsconfig", unix.SYS_FSCONFIG},
	{"fsmount", unix.SYS_FSMOUNT}, {"fspick", unix.SYS_FSPICK}, {"move_mount", unix.SYS_MOVE_MOUNT},
	{"open_tree", unix.SYS_OPEN_TREE}, {"open_tree_attr", unix.SYS_OPEN_TREE_ATTR},
	{"mount_setattr", unix.SYS_MOUNT_SETATTR},
	// Namespaces.
	{"unshare", unix.SYS_UNSHARE}, {"setns", unix.SYS_SETNS},
	// Reaching into other processes.
	{"ptrace", unix.SYS_PTRACE}, {"process_vm_readv", unix.SYS_PROCESS_VM_READV},
	{"process_vm_writev", unix.SYS_PROCESS_VM_WRITEV}, {"kcmp", unix.SYS_KCMP},
	{"pidfd_getfd", unix.SYS_PIDFD_GETFD}, {"process_madvise", unix.SYS_PROCESS_MADVISE},
	// Large kernel attack surface.
	{"bpf", unix.SYS_BPF}, {"perf_event_open", unix.SYS_PERF_EVENT_OPEN},
	{"userfaultfd", unix.SYS_USERFAULTFD}, {"io_uring_setup", unix.SYS_IO_URING_SETUP},
	{"io_uring_enter", unix.SYS_IO_URING_ENTER}, {"io_uring_register", unix.SYS_IO_URING_REGISTER},
	{"keyctl", unix.SYS_KEYCTL}, {"add_key", unix.SYS_ADD_KEY}, {"request_key", unix.SYS_REQUEST_KEY},
	{"fanotify_init", unix.SYS_FANOTIFY_INIT}, {"lookup_dcookie", unix.SYS_LOOKUP_DCOOKIE},
	// Kernel and machine state.
	{"kexec_load", unix.SYS_KEXEC_LOAD}, {"kexec_file_load", unix.SYS_KEXEC_FILE_LOAD},
	{"init_module", unix.SYS_INIT_MODULE}, {"finit_module", unix.SYS_FINIT_MODULE},
	{"delete_module", unix.SYS_DELETE_MODULE}, {"reboot", unix.SYS_REBOOT},
	{"swapon", unix.SYS_SWAPON}, {"swapoff", unix.SYS_SWAPOFF}, {"syslog", unix.SYS_SYSLOG},
	{"settimeofday", unix.SYS_SETTIMEOFDAY}, {"clock_settime", unix.SYS_CLOCK_SETTIME},
	{"clock_adjtime", unix.SYS_CLOCK_ADJTIME}, {"adjtimex", unix.SYS_ADJTIMEX},
	{"acct", unix.SYS_ACCT}, {"quotactl", unix.SYS_QUOTACTL}, {"quotactl_fd", unix.SYS_QUOTACTL_FD},
	{"nfsservctl", unix.SYS_NFSSERVCTL}, {"vhangup", unix.SYS_VHANGUP},
	// File handles bypass path-based confinement (the "shocker" escape).
	{"open_by_handle_at", unix.SYS_OPEN_BY_HANDLE_AT}, {"name_to_handle_at", unix.SYS_NAME_TO_HANDLE_AT},
}

// DefaultRules is the sandbox policy.
func DefaultRules() []Rule {
	rules := make([]Rule, 0, len(deniedAlways)+len(archDenied)+5)
	for _, d := range deniedAlways {
		rules = append(rules, Rule{Name: d.name, Nr: d.nr, Errno: unix.EPERM})
	}
	for _, d := range archDenied {
		rules = append(rules, Rule{Name: d.name, Nr: d.nr, Errno: unix.EPERM})
	}
	rules = append(rules,
		// clone3 passes its flags in memory, where BPF cannot look. ENOSYS
		// makes glibc and Go fall back to clone, whose flags are checked.
		Rule{Name: "clone3", Nr: unix.SYS_CLONE3, Errno: unix.ENOSYS},
		Rule{Name: "clone", Nr: unix.SYS_CLONE, Errno: unix.EPERM,
			When: &ArgCheck{Arg: 0, Op: OpMaskAny, Value: cloneNamespaceFlags}},
		// TIOCSTI pushes keystrokes into a terminal's input; TIOCLINUX can
		// do the same on a virtual console.
		Rule{Name: "ioctl", Nr: unix.SYS_IOCTL, Errno: unix.EPERM,
			When: &ArgCheck{Arg: 1, Op: OpIn, Values: []uint32{unix.TIOCSTI, unix.TIOCLINUX}}},
		Rule{Name: "socket", Nr: unix.SYS_SOCKET, Errno: unix.EAFNOSUPPORT,
			When: &ArgCheck{Arg: 0, Op: OpNotIn, Values: allowedSocketFamilies}},
		Rule{Name: "personality", Nr: unix.SYS_PERSONALITY, Errno: unix.EPERM,
			When: &ArgCheck{Arg: 0, Op: OpNotIn, Values: allowedPersonalities}},
	)
	return rules
}
