package cgroups

import (
	"path/filepath"
	"time"
)

// CPUReader is a Manager that reads the CPU time of everything under its
// parent: every group's processes, living and dead (the accounting is
// hierarchical, and kept by the parent when a group is removed).
type CPUReader interface {
	ParentCPU() (time.Duration, error)
}

var (
	_ CPUReader = (*v1)(nil)
	_ CPUReader = (*v2)(nil)
)

func (m *v1) ParentCPU() (time.Duration, error) {
	ns, err := readInt(filepath.Join(m.cpuacct, m.parent), "cpuacct.usage")
	return time.Duration(ns), err
}

func (m *v2) ParentCPU() (time.Duration, error) {
	us, err := readKeyed(filepath.Join(m.root, m.parent), "cpu.stat", "usage_usec")
	return time.Duration(us) * time.Microsecond, err
}
