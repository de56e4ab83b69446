package seccomp

import "golang.org/x/sys/unix"

const (
	nativeArch    = unix.AUDIT_ARCH_AARCH64
	x32SyscallBit = 0 // arm64 has no second ABI to refuse
)

var archDenied = []struct {
	name string
	nr   uint32
}{}
