package rootview

import (
	"crypto/rand"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// A sandbox's /proc is a proc of its own PID namespace, so its processes,
// mounts, network and IPC objects are its own. The rest of /proc describes the
// kernel as a whole: the host's hardware and configuration, and counters
// that every tenant moves. What reveals the host or other tenants is
// hidden (ProcMasked); where programs read a file (ps, top, free, uptime,
// glibc's CPU count, psutil), the sandbox gets a synthesised one of its
// own instead (ProcSynthesised), as LXCFS does for containers, written at
// the sandbox's start and bound read-only over the kernel's file. The
// native backend does both itself; the docker backend through what
// Docker's API offers (ProcFiles).
//
// Not hidden: cpuinfo, version, filesystems, crypto, kallsyms (addresses
// zeroed for every unprivileged reader), modules and the sysctls' values
// (the kernel's configuration, the same on every machine of a kind, and
// needed by programs that tune themselves); uptime and stat's btime, which
// stay consistent with the start times of /proc/PID/stat (a time namespace
// would hide them: see docs/security.md).

// ProcMasked are emptied: a file shows as an empty file, a directory as an
// empty directory, both read-only and the sandbox's own (not /dev/null, an
// inode of the host's). Paths are relative to /proc; those a kernel lacks
// are skipped.
var ProcMasked = []string{
	// runc's masks: the host kernel's memory, keys and timers.
	"kcore", "keys", "timer_list", "sched_debug", "latency_stats", "acpi", "scsi",
	// The host's hardware, configuration and disks.
	"config.gz", "cmdline", "bus", "fs", "irq", "iomem", "ioports", "devices", "misc", "consoles", "dma",
	"mtrr", "partitions", "sys/fs/quota",
	// Activity of the host and of other tenants: interrupts, disk I/O,
	// memory fragmentation, pressure stall, scheduler statistics.
	"interrupts", "softirqs", "diskstats", "buddyinfo", "zoneinfo", "pagetypeinfo", "slabinfo",
	"vmallocinfo", "schedstat", "pressure", "kpagecount", "kpageflags", "kpagecgroup",
	// Every OFD lock on the host, with its file's device and inode: only
	// POSIX locks and leases are filtered by PID namespace.
	"locks",
}

// ProcView is what a sandbox's synthesised /proc files say.
type ProcView struct {
	// MemTotal is the sandbox's memory limit, in bytes.
	MemTotal int64
	// CPUs are the CPUs the sandbox may run on.
	CPUs []int
	// BootID is the sandbox's own random boot id.
	BootID string
}

// ProcFile is a file of /proc a sandbox gets instead of the kernel's.
type ProcFile struct {
	// Path is relative to /proc.
	Path string
	// Make makes the file's content from the view and the kernel's own
	// file (host), read through the sandbox's proc.
	Make func(v *ProcView, host string) string
}

// ProcSynthesised are the files a sandbox gets instead of the kernel's.
var ProcSynthesised = []ProcFile{
	{"loadavg", func(*ProcView, string) string { return "0.00 0.00 0.00 1/1 1\n" }},
	{"stat", (*ProcView).stat},
	{"meminfo", (*ProcView).meminfo},
	// num_cgroups counts every cgroup on the host: other tenants' sandboxes.
	{"cgroups", func(_ *ProcView, host string) string { return cgroupsOne(host) }},
	{"swaps", func(*ProcView, string) string { return "Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n" }},
	{"vmstat", func(_ *ProcView, host string) string { return zeroNumbers(host) }},
	{bootIDPath, func(v *ProcView, _ string) string { return v.BootID + "\n" }},
	// Counters of the whole kernel: open files, inodes, dentries, aio
	// contexts and terminals of every process on the host.
	{"sys/fs/file-nr", func(_ *ProcView, host string) string { return zeroNumbers(host) }},
	{"sys/fs/inode-nr", func(_ *ProcView, host string) string { return zeroNumbers(host) }},
	{"sys/fs/inode-state", func(_ *ProcView, host string) string { return zeroNumbers(host) }},
	{"sys/fs/dentry-state", func(_ *ProcView, host string) string { return zeroNumbers(host) }},
	{"sys/fs/dentry-negative", func(_ *ProcView, host string) string { return zeroNumbers(host) }},
	{"sys/fs/aio-nr", func(_ *ProcView, host string) string { return zeroNumbers(host) }},
	{"sys/kernel/pty/nr", func(_ *ProcView, host string) string { return zeroNumbers(host) }},
}

// NewProcView describes a sandbox whose memory limit is memTotal bytes and
// which may run on the CPUs this thread may.
func NewProcView(memTotal int64) (*ProcView, error) {
	v := &ProcView{MemTotal: memTotal}
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		return nil, fmt.Errorf("sched_getaffinity: %w", err)
	}
	for c := 0; c < len(set)*64; c++ {
		if set.IsSet(c) {
			v.CPUs = append(v.CPUs, c)
		}
	}
	v.BootID = NewBootID()
	return v, nil
}

// NewBootID is a random boot id, as the kernel makes one (a version 4
// UUID).
func NewBootID() string {
	var id [16]byte
	rand.Read(id[:])          // crypto/rand does not fail on Linux
	id[6] = id[6]&0x0f | 0x40 // version 4: random
	id[8] = id[8]&0x3f | 0x80 // RFC 4122 variant
	return fmt.Sprintf("%x-%x-%x-%x-%x", id[0:4], id[4:6], id[6:8], id[8:10], id[10:16])
}

// ProcMask is a file or directory of a sandbox's /proc that a bind
// covers: with a synthesised file (Data), or, Hidden, with an empty file
// or directory (Dir).
type ProcMask struct {
	Path   string `json:"path"` // relative to /proc
	Data   string `json:"data,omitempty"`
	Hidden bool   `json:"hidden,omitempty"`
	Dir    bool   `json:"dir,omitempty"`
}

// bootIDPath is the synthesised file that is each sandbox's own.
const bootIDPath = "sys/kernel/random/boot_id"

// ProcMasks is what covers a sandbox's /proc, made from the kernel's files
// under proc for the view v: the synthesised files this kernel has
// (ProcSynthesised), then the masked paths it has (ProcMasked), in that
// order. Only the boot id is of one sandbox: a list made once serves every
// sandbox of the same memory limit and CPUs, each with its own boot id
// (WithBootID).
func ProcMasks(proc string, v *ProcView) []ProcMask {
	var out []ProcMask
	for _, f := range ProcSynthesised {
		host, err := os.ReadFile(filepath.Join(proc, f.Path))
		if err != nil {
			continue // not in this kernel
		}
		out = append(out, ProcMask{Path: f.Path, Data: f.Make(v, string(host))})
	}
	for _, name := range ProcMasked {
		fi, err := os.Stat(filepath.Join(proc, name))
		if err != nil {
			continue
		}
		out = append(out, ProcMask{Path: name, Hidden: true, Dir: fi.IsDir()})
	}
	return out
}

// WithBootID is masks with the boot id's file saying id.
func WithBootID(masks []ProcMask, id string) []ProcMask {
	out := slices.Clone(masks)
	for i := range out {
		if out[i].Path == bootIDPath {
			out[i].Data = id + "\n"
		}
	}
	return out
}

// ProcFiles is the /proc view for a runtime that mounts a sandbox's /proc
// itself (the docker backend), and may bind files over only some of it: it
// writes the synthesised file of each path bindable accepts into dir, at
// its path relative to /proc (dir/meminfo), for a sandbox whose memory
// limit is memTotal bytes, from the kernel's files under proc. It returns
// the paths (relative to /proc) of the files written and of those to
// empty: ProcMasked, and the synthesised files bindable refuses. A file
// this kernel lacks is not written.
func ProcFiles(dir, proc string, memTotal int64, bindable func(path string) bool) (written, masked []string, err error) {
	v, err := NewProcView(memTotal)
	if err != nil {
		return nil, nil, err
	}
	masked = slices.Clone(ProcMasked)
	for _, f := range ProcSynthesised {
		if !bindable(f.Path) {
			masked = append(masked, f.Path)
			continue
		}
		host, err := os.ReadFile(filepath.Join(proc, f.Path))
		if err != nil {
			continue // not in this kernel
		}
		dst := filepath.Join(dir, f.Path)
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return nil, nil, err
		}
		if err := os.WriteFile(dst, []byte(f.Make(v, string(host))), 0o444); err != nil {
			return nil, nil, err
		}
		written = append(written, f.Path)
	}
	return written, masked, nil
}

// stat is /proc/stat for the sandbox: a line per CPU it may use, as glibc
// counts them for sysconf(_SC_NPROCESSORS_ONLN) when there is no /sys;
// zero for every counter of the host (CPU times, interrupts, context
// switches, forks); the host's boot time, which the start times of
// /proc/PID/stat count from.
func (v *ProcView) stat(host string) string {
	const zeros = " 0 0 0 0 0 0 0 0 0 0\n"
	var b strings.Builder
	b.WriteString("cpu " + zeros)
	for _, c := range v.CPUs {
		fmt.Fprintf(&b, "cpu%d%s", c, zeros)
	}
	b.WriteString("intr 0\nctxt 0\n")
	for _, l := range strings.Split(host, "\n") {
		if strings.HasPrefix(l, "btime ") {
			b.WriteString(l + "\n")
		}
	}
	b.WriteString("processes 0\nprocs_running 1\nprocs_blocked 0\nsoftirq 0 0 0 0 0 0 0 0 0 0 0\n")
	return b.String()
}

// meminfo is /proc/meminfo for the sandbox: the host's fields, in the
// host's order, the memory limit (or the host's memory, if less) as the
// total, all of it free and available, and zero for every other amount:
// the host's use of memory tells of other tenants. Constants of the
// architecture stay.
func (v *ProcView) meminfo(host string) string {
	lines := strings.Split(strings.TrimRight(host, "\n"), "\n")
	total := v.MemTotal >> 10
	for _, l := range lines {
		if rest, ok := strings.CutPrefix(l, "MemTotal:"); ok {
			n, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err == nil && (total <= 0 || n < total) {
				total = n
			}
		}
	}
	var b strings.Builder
	for _, l := range lines {
		key, rest, ok := strings.Cut(l, ":")
		if !ok {
			continue
		}
		val, unit := strings.TrimSpace(rest), ""
		if v, ok := strings.CutSuffix(val, " kB"); ok {
			val, unit = v, " kB"
		}
		switch key {
		case "MemTotal", "MemFree", "MemAvailable", "CommitLimit":
			val = strconv.FormatInt(total, 10)
		case "Hugepagesize", "VmallocTotal":
		default:
			val = "0"
		}
		fmt.Fprintf(&b, "%-16s%8s%s\n", key+":", val, unit)
	}
	return b.String()
}

// cgroupsOne is /proc/cgroups with every controller's num_cgroups set to
// one: the sandbox's own group.
func cgroupsOne(host string) string {
	var b strings.Builder
	for _, l := range strings.Split(strings.TrimRight(host, "\n"), "\n") {
		f := strings.Split(l, "\t")
		if !strings.HasPrefix(l, "#") && len(f) >= 3 {
			f[2] = "1"
		}
		b.WriteString(strings.Join(f, "\t") + "\n")
	}
	return b.String()
}

// number is a whole number, not the digits in a name (pgalloc_dma32).
var number = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`\b[0-9]+\b`) })

// zeroNumbers keeps a file's layout and names and makes every number 0.
func zeroNumbers(host string) string { return number().ReplaceAllString(host, "0") }
