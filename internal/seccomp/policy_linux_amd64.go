package seccomp

import "golang.org/x/sys/unix"

const (
	nativeArch = unix.AUDIT_ARCH_X86_64
	// x32SyscallBit marks the x32 ABI's system calls, another entry point
	// into the kernel with its own argument conventions. Their numbers are
	// above every native one, so the filter answers them ENOSYS.
	x32SyscallBit = 0x40000000
)

// archAllowed are amd64's legacy calls, which arm64 never had: the same
// operations as the *at, pipe2, dup3, epoll_create1 ... calls allowed for
// both, which old binaries and parts of glibc still use; and arch_prctl,
// with which glibc and the Go runtime set their thread pointer.
var archAllowed = []sys{
	{"open", unix.SYS_OPEN}, {"creat", unix.SYS_CREAT}, {"stat", unix.SYS_STAT}, {"lstat", unix.SYS_LSTAT},
	{"access", unix.SYS_ACCESS}, {"poll", unix.SYS_POLL}, {"select", unix.SYS_SELECT}, {"pipe", unix.SYS_PIPE},
	{"dup2", unix.SYS_DUP2}, {"pause", unix.SYS_PAUSE}, {"alarm", unix.SYS_ALARM}, {"fork", unix.SYS_FORK},
	{"vfork", unix.SYS_VFORK}, {"getdents", unix.SYS_GETDENTS}, {"rename", unix.SYS_RENAME},
	{"mkdir", unix.SYS_MKDIR}, {"rmdir", unix.SYS_RMDIR}, {"link", unix.SYS_LINK}, {"unlink", unix.SYS_UNLINK},
	{"symlink", unix.SYS_SYMLINK}, {"readlink", unix.SYS_READLINK}, {"chmod", unix.SYS_CHMOD},
	{"chown", unix.SYS_CHOWN}, {"lchown", unix.SYS_LCHOWN}, {"getpgrp", unix.SYS_GETPGRP},
	{"utime", unix.SYS_UTIME}, {"utimes", unix.SYS_UTIMES}, {"futimesat", unix.SYS_FUTIMESAT},
	{"mknod", unix.SYS_MKNOD}, {"epoll_create", unix.SYS_EPOLL_CREATE}, {"epoll_wait", unix.SYS_EPOLL_WAIT},
	{"eventfd", unix.SYS_EVENTFD}, {"signalfd", unix.SYS_SIGNALFD}, {"inotify_init", unix.SYS_INOTIFY_INIT},
	{"time", unix.SYS_TIME}, {"arch_prctl", unix.SYS_ARCH_PRCTL},
}

// archDenied are amd64-only calls a sandbox must not have (EPERM): I/O port
// access, 32-bit TLS descriptors in the GDT, uprobes' trampolines (which
// the kernel lets through the filter itself), obsolete and unimplemented
// interfaces.
var archDenied = []sys{
	{"iopl", unix.SYS_IOPL}, {"ioperm", unix.SYS_IOPERM}, {"uselib", unix.SYS_USELIB},
	{"_sysctl", unix.SYS__SYSCTL}, {"ustat", unix.SYS_USTAT}, {"sysfs", unix.SYS_SYSFS},
	{"create_module", unix.SYS_CREATE_MODULE}, {"get_kernel_syms", unix.SYS_GET_KERNEL_SYMS},
	{"query_module", unix.SYS_QUERY_MODULE}, {"get_thread_area", unix.SYS_GET_THREAD_AREA},
	{"set_thread_area", unix.SYS_SET_THREAD_AREA}, {"epoll_ctl_old", unix.SYS_EPOLL_CTL_OLD},
	{"epoll_wait_old", unix.SYS_EPOLL_WAIT_OLD}, {"afs_syscall", unix.SYS_AFS_SYSCALL},
	{"tuxcall", unix.SYS_TUXCALL}, {"security", unix.SYS_SECURITY}, {"getpmsg", unix.SYS_GETPMSG},
	{"putpmsg", unix.SYS_PUTPMSG}, {"vserver", unix.SYS_VSERVER}, {"uretprobe", unix.SYS_URETPROBE},
	{"uprobe", unix.SYS_UPROBE},
}

// archAbsent are amd64-only calls refused with ENOSYS: modify_ldt
// (CONFIG_MODIFY_LDT_SYSCALL), per-process segment descriptors that only
// 16-bit and Wine code need, and a history of kernel bugs.
var archAbsent = []sys{
	{"modify_ldt", unix.SYS_MODIFY_LDT},
}
