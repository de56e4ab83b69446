package seccomp

import (
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Install sets no_new_privs and loads prog into every thread of the calling
// process (SECCOMP_FILTER_FLAG_TSYNC: a Go program has many threads, and a
// filter on one of them alone would leave the others unconfined). The filter
// is inherited across fork and execve and can never be removed.
func Install(prog []unix.SockFilter) error {
	if len(prog) == 0 {
		return fmt.Errorf("seccomp: empty program")
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("seccomp: set no_new_privs: %w", err)
	}
	fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
	r, _, errno := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER,
		unix.SECCOMP_FILTER_FLAG_TSYNC, uintptr(unsafe.Pointer(&fprog)))
	if errno != 0 {
		return fmt.Errorf("seccomp: load filter: %w", errno)
	}
	if r != 0 {
		return fmt.Errorf("seccomp: thread %d could not be synchronised to the filter", r)
	}
	return nil
}

// Supported reports whether the kernel can filter system calls with BPF.
func Supported() error {
	// With a NULL program the call fails with EFAULT when filters are
	// supported and EINVAL when they are not.
	_, _, errno := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, 0, 0)
	switch errno {
	case unix.EFAULT:
		return nil
	case 0:
		return fmt.Errorf("seccomp: kernel accepted a NULL filter")
	default:
		return fmt.Errorf("seccomp filters are not available in this kernel (CONFIG_SECCOMP_FILTER): %w", errno)
	}
}
