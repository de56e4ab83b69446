//go:build linux

package seccomp

func archDecisions() []decision {
	return []decision{
		{"unassigned number in the arch-specific range", call{nr: 244}, enosys},
	}
}
