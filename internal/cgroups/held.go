package cgroups

import (
	"errors"
	"os"
	"path/filepath"
)

// MemoryHeld reads what the group of tenant ("": the parent, every
// sandbox and zygote under it) holds that the kernel cannot take back
// without killing, and the group's memory limit (0: none): the room
// under a ceiling (Ceilings) that one more sandbox would draw on. Held is
// the group's charge less its files' page cache, which the kernel drops
// or writes back before it kills anything; anonymous memory, tmpfs files
// (a sandbox's root and /dev/shm) and kernel memory stay. A tenant with
// no group yet holds nothing.
func MemoryHeld(m Manager, tenant string) (held, limit int64, err error) {
	if err := validTenant(tenant); err != nil && tenant != "" {
		return 0, 0, err
	}
	var dir, usage, maxFile, active, inactive string
	switch m := m.(type) {
	case *v1:
		dir = filepath.Join(m.memory, m.parent, tenant)
		usage, maxFile, active, inactive = "memory.usage_in_bytes", "memory.limit_in_bytes", "total_active_file", "total_inactive_file"
	case *v2:
		dir = filepath.Join(m.root, m.parent, tenant)
		usage, maxFile, active, inactive = "memory.current", "memory.max", "active_file", "inactive_file"
	default:
		return 0, 0, errors.ErrUnsupported
	}
	charge, err := readInt(dir, usage)
	if errors.Is(err, os.ErrNotExist) && tenant != "" {
		return 0, 0, nil
	}
	if err != nil {
		return 0, 0, err
	}
	st, err := readStat(dir, "memory.stat")
	if err != nil {
		return 0, 0, err
	}
	if limit, err = readInt(dir, maxFile); err != nil {
		return 0, 0, err
	}
	if limit < 0 || limit >= 1<<60 { // "max" on v2; v1's "none" is a page-rounded int64 max
		limit = 0
	}
	return max(0, charge-st[active]-st[inactive]), limit, nil
}
