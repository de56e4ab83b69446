package docker

import "slices"

// A container's /proc is a proc of its own PID namespace, mounted by runc,
// so its processes, mounts and IPC objects are its own. What the rest of
// it tells of the host and of other tenants is hidden as the native
// backend hides it (see rootview.ProcMasked and rootview.ProcFiles),
// through what Docker's API offers, in this order (runc's):
//  1. the mounts: each synthesised file runc lets a mount cover
//     (procBindable) is bound over the kernel's, read-only, from the
//     container's view;
//  2. HostConfig.ReadonlyPaths: /proc/sys, /proc/sysrq-trigger and the
//     others of readonlyPaths are bound read-only over themselves;
//  3. HostConfig.MaskedPaths: every other path to hide is emptied, a file
//     by a bind of the container's own /dev/null, a directory by an empty
//     read-only tmpfs.
//
// Where the native backend synthesises a file that runc lets no mount
// cover, the container's is empty: the boot id (none, rather than one of
// its own), /proc/cgroups, /proc/vmstat, and the kernel's counters in
// /proc/sys/fs and /proc/sys/kernel/pty/nr.
//
// Under gVisor (runsc) /proc is its kernel's own, which shows nothing of
// the host, and runsc ignores MaskedPaths: the container gets neither the
// files nor the masks, and keeps Docker's default masks.

// procBindable reports whether runc lets a mount cover the file p of
// /proc (relative to it): those LXCFS emulates. It refuses any other, and
// the container does not start ("cannot be mounted because it is inside
// /proc").
func procBindable(p string) bool {
	switch p {
	case "cpuinfo", "diskstats", "meminfo", "stat", "swaps", "uptime", "loadavg", "slabinfo":
		return true
	}
	return false
}

// dockerMasked are Docker's default MaskedPaths, which a container's own
// replace.
var dockerMasked = []string{"/proc/asound", "/proc/acpi", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
	"/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi", "/sys/firmware",
	"/sys/devices/virtual/powercap"}

// maskedPaths is the container's HostConfig.MaskedPaths: Docker's and the
// view's, each once (runc mounts over a path as often as it is named), or
// nil (Docker's) under gVisor.
func (v *view) maskedPaths() []string {
	if v.procMasked == nil {
		return nil
	}
	paths := slices.Clone(dockerMasked)
	for _, p := range v.procMasked {
		if p = "/proc/" + p; !slices.Contains(paths, p) {
			paths = append(paths, p)
		}
	}
	return paths
}
