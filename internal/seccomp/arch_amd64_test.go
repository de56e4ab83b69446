//go:build linux

package seccomp

import "golang.org/x/sys/unix"

func archDecisions() []decision {
	return []decision{
		{"modify_ldt", call{nr: unix.SYS_MODIFY_LDT}, enosys},
		{"iopl", call{nr: unix.SYS_IOPL}, eperm},
		{"set_thread_area", call{nr: unix.SYS_SET_THREAD_AREA}, eperm},
		{"arch_prctl", call{nr: unix.SYS_ARCH_PRCTL}, Allow},
		{"vfork", call{nr: unix.SYS_VFORK}, Allow},
		{"open", call{nr: unix.SYS_OPEN}, Allow},
	}
}
