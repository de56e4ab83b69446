//go:build linux

package cgroups

import "testing"

// A container runtime's group is found in each hierarchy from the
// process's /proc/PID/cgroup, under mounts whose root may be a group.
func TestOfProcess(t *testing.T) {
	ms := parseMountinfo(hybridMountinfo +
		"41 30 0:38 /outer /sys/fs/cgroup/blkio rw,relatime - cgroup cgroup rw,blkio\n")
	e, err := ofProcess("12:blkio:/outer/x\n4:memory:/vivarium-docker/abc\n2:cpu,cpuacct:/vivarium-docker/abc\n0::/\n", ms)
	if err != nil {
		t.Fatal(err)
	}
	if e.mem != "/sys/fs/cgroup/memory/vivarium-docker/abc" || e.cpuacct != "/sys/fs/cgroup/cpu,cpuacct/vivarium-docker/abc" {
		t.Errorf("got memory %q, cpuacct %q", e.mem, e.cpuacct)
	}
	if _, err := ofProcess("0::/x\n", parseMountinfo("34 30 0:31 / /x/memory rw - cgroup cgroup rw,memory\n")); err == nil {
		t.Error("a process without accounting groups: want an error")
	}
}
