package seccomp

import "golang.org/x/sys/unix"

const (
	nativeArch = unix.AUDIT_ARCH_X86_64
	// x32SyscallBit marks the x32 ABI's system calls, another entry point
	// into the kernel with its own argument conventions.
	x32SyscallBit = 0x40000000
)

// archDenied are amd64-only calls: I/O port access and obsolete interfaces.
var archDenied = []struct {
	name string
	nr   uint32
}{
	{"iopl", unix.SYS_IOPL}, {"ioperm", unix.SYS_IOPERM}, {"uselib", unix.SYS_USELIB},
	{"_sysctl", unix.SYS__SYSCTL}, {"ustat", unix.SYS_USTAT}, {"sysfs", unix.SYS_SYSFS},
	{"create_module", unix.SYS_CREATE_MODULE}, {"get_kernel_syms", unix.SYS_GET_KERNEL_SYMS},
	{"query_module", unix.SYS_QUERY_MODULE},
}
