package seccomp

import "golang.org/x/sys/unix"

const (
	nativeArch    = unix.AUDIT_ARCH_AARCH64
	x32SyscallBit = 0 // arm64 has no second ABI to refuse
)

// arm64 has only the generic system call table: nothing of its own to
// allow or refuse.
var (
	archAllowed = []sys{}
	archDenied  = []sys{}
	archAbsent  = []sys{}
)
