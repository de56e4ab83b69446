//go:build linux

package cgroups

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// External is a group another program made and manages (a container
// runtime's, such as Docker's): Vivarium reads its accounting and nothing
// more; the runtime sets its limits and removes it.
type External struct {
	v2           string // the group's directory on cgroup v2
	cpuacct, mem string // its cpuacct and memory directories on v1
}

// LimitSockets makes a v1 group charge its sockets' buffers to it, within
// bytes (memory.kmem.tcp.limit_in_bytes, which covers UDP too): v1 does so
// only for a group with such a limit, and counts them otherwise against
// the host-wide tcp_mem and udp_mem alone. Sockets made before the call
// are not charged. On v2, where memory.max covers them always, it does
// nothing.
func (e *External) LimitSockets(bytes int64) error {
	if e.mem == "" || bytes <= 0 {
		return nil
	}
	err := writeFile(e.mem, "memory.kmem.tcp.limit_in_bytes", fmt.Sprint(bytes))
	if errors.Is(err, os.ErrNotExist) {
		return nil // a kernel without TCP accounting in v1
	}
	return err
}

// OfProcess finds the group a process is in, from /proc/PID/cgroup and the
// cgroup mounts of this process's mount namespace. The process should be
// one this process holds (a pidfd), so that its pid was not reused.
func OfProcess(pid int) (*External, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return nil, fmt.Errorf("cgroups: %w", err)
	}
	mounts, err := readMounts("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	return ofProcess(string(b), mounts)
}

// groupDir is where path, a group's path in a hierarchy (as
// /proc/PID/cgroup names it), is under m, the mount of that hierarchy
// (whose root may be a group itself); "" if it is not under it.
func groupDir(m mount, path string) string {
	rel, ok := strings.CutPrefix(path, m.root)
	if m.root == "/" {
		rel, ok = path, true
	}
	if !ok || (rel != "" && !strings.HasPrefix(rel, "/")) {
		return ""
	}
	return filepath.Join(m.point, rel)
}

func ofProcess(procCgroup string, mounts []mount) (*External, error) {
	e := &External{}
	var unified string
	for _, line := range strings.Split(strings.TrimSpace(procCgroup), "\n") {
		// hierarchy-ID:controller-list:path; v2 is "0::path"
		f := strings.SplitN(line, ":", 3)
		if len(f) != 3 {
			continue
		}
		if f[0] == "0" && f[1] == "" {
			unified = f[2]
			continue
		}
		for _, m := range mounts {
			if m.fstype != "cgroup" {
				continue
			}
			for _, c := range strings.Split(f[1], ",") {
				for _, opt := range m.options {
					if opt != c {
						continue
					}
					switch c {
					case "cpuacct":
						e.cpuacct = groupDir(m, f[2])
					case "memory":
						e.mem = groupDir(m, f[2])
					}
				}
			}
		}
	}
	if e.cpuacct != "" && e.mem != "" {
		return e, nil
	}
	if unified != "" {
		if p := mounts2(mounts); p != "" {
			for _, m := range mounts {
				if m.fstype == "cgroup2" && m.point == p {
					if d := groupDir(m, unified); d != "" {
						if _, err := os.Stat(filepath.Join(d, "memory.events")); err == nil {
							return &External{v2: d}, nil
						}
					}
				}
			}
		}
	}
	return nil, fmt.Errorf("%w: the process's memory and CPU accounting groups were not found", ErrUnavailable)
}

// Stats reads the group's accounting, as Group.Stats does.
func (e *External) Stats() (Stats, error) {
	if e.v2 != "" {
		return statsV2(byPath{}, e.v2)
	}
	return statsV1(byPath{}, e.cpuacct, e.mem)
}

// RemoveEmpty removes the group name (a path from the top of each
// hierarchy) wherever it exists and is empty: the parent a container
// runtime made, in every hierarchy, for containers that are all gone.
// A group that still has members or children stays.
func RemoveEmpty(name string) error {
	if err := validName(name); err != nil {
		return err
	}
	mounts, err := readMounts("/proc/self/mountinfo")
	if err != nil {
		return err
	}
	var errs []error
	for _, m := range mounts {
		err := os.Remove(filepath.Join(m.point, name))
		if err != nil && !errors.Is(err, os.ErrNotExist) && !errors.Is(err, syscall.EBUSY) &&
			!errors.Is(err, syscall.ENOTEMPTY) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
