//go:build linux

package cgroups

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// IOMax caps a group's disk I/O on each block device a sandbox reads from
// (IODevices). Zero fields mean no cap.
//
// The throttle is the kernel's blk-throttle (v1 blkio.throttle.*, v2
// io.max): a token bucket per device, so that a first burst of a slice's
// worth may pass before the rate holds. It counts the I/O a process issues
// itself: reads (page-cache misses, readahead, O_DIRECT) and direct
// writes. Buffered writes that the kernel's flusher threads write back are
// charged to the group on v2 only (cgroup writeback); a native sandbox
// writes to tmpfs alone, which is memory, not disk.
type IOMax struct {
	ReadBPS, WriteBPS   int64 // bytes a second
	ReadIOPS, WriteIOPS int64 // operations a second
}

func (l IOMax) any() bool {
	return l.ReadBPS > 0 || l.WriteBPS > 0 || l.ReadIOPS > 0 || l.WriteIOPS > 0
}

// Device is a block device, by its numbers.
type Device struct {
	Major, Minor uint32
	Name         string // the kernel's name ("vda", "dm-0"), for messages
}

func (d Device) String() string { return fmt.Sprintf("%d:%d", d.Major, d.Minor) }

// errNoIOController is returned by New when a group asks for an I/O cap
// and the hierarchy has no controller to enforce it.
func errNoIOController(controller string) error {
	return fmt.Errorf("%w: a disk I/O limit needs the %s cgroup controller, which this host does not offer; "+
		"--insecure-no-io-limit runs sandboxes without a disk I/O limit", ErrUnavailable, controller)
}

// ioRoots are the paths whose file systems a sandbox reads the host's disk
// through: the host's /usr (bound read-only into native sandboxes, the
// gofer's and the Sentry's reads for gvisor ones) and the root file
// system, which holds /usr and the top-level /bin, /lib ... on hosts
// without merged /usr. File systems mounted below /usr count too. The
// workspace is a tmpfs: memory, limited as such.
var ioRoots = []string{"/", "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"}

// IODevices lists the block devices behind the host's / and /usr, each as
// the whole disk that the kernel throttles (a partition's I/O is counted
// on its disk; both cgroup versions refuse a partition's numbers with
// ENODEV). Device-mapper and md devices are whole disks of their own and
// are throttled where the file system submits its I/O. It is computed
// once per process.
var IODevices = sync.OnceValues(func() ([]Device, error) {
	extraIO.Lock()
	extraIO.computed = true
	extra := extraIO.devs
	extraIO.Unlock()
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("cgroups: %w", err)
	}
	devs, err := ioDevices(string(data), "/sys", blockRdev)
	if len(extra) == 0 {
		return devs, err
	}
	for _, d := range extra {
		if !slices.Contains(devs, d) {
			devs = append(devs, d)
		}
	}
	sortDevices(devs)
	return devs, nil
})

// extraIO are the disks AddIODisksOf named.
var extraIO struct {
	sync.Mutex
	devs     []Device
	computed bool // IODevices has run: too late to add
}

// AddIODisksOf adds to IODevices the disks that hold paths: for a
// container, whose / is an overlay of the host's paths that it cannot see
// (no disk is found behind it), the disk of a directory the host gives it
// (a data directory on the node's disk). It is called before IODevices
// first runs; a path on no block device (a tmpfs) is an error.
func AddIODisksOf(paths ...string) error {
	extraIO.Lock()
	defer extraIO.Unlock()
	if extraIO.computed {
		return errors.New("cgroups: the disks to limit I/O on are already known")
	}
	for _, p := range paths {
		d, err := diskOf(p, "/sys")
		if err != nil {
			return err
		}
		if !slices.Contains(extraIO.devs, d) {
			extraIO.devs = append(extraIO.devs, d)
		}
	}
	return nil
}

// diskOf is the whole disk that holds path, by the sysfs at sys.
func diskOf(path, sys string) (Device, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return Device{}, fmt.Errorf("cgroups: the disk of %s: %w", path, err)
	}
	d, ok := wholeDisk(sys, unix.Major(st.Dev), unix.Minor(st.Dev))
	if !ok {
		return Device{}, fmt.Errorf("cgroups: %s is on no block device (%d:%d): name a directory on a disk",
			path, unix.Major(st.Dev), unix.Minor(st.Dev))
	}
	return d, nil
}

// blockRdev returns the numbers of a block device node.
func blockRdev(path string) (major, minor uint32, ok bool) {
	var st unix.Stat_t
	if unix.Stat(path, &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFBLK {
		return 0, 0, false
	}
	return unix.Major(st.Rdev), unix.Minor(st.Rdev), true
}

// fsMount is one line of mountinfo, what ioDevices needs of it.
type fsMount struct {
	major, minor uint32
	point        string
	fstype       string
	source       string
	options      []string // super options
}

func parseFSMounts(s string) []fsMount {
	var out []fsMount
	for _, line := range strings.Split(s, "\n") {
		pre, post, ok := strings.Cut(line, " - ")
		if !ok {
			continue
		}
		f, g := strings.Fields(pre), strings.Fields(post)
		if len(f) < 5 || len(g) < 2 {
			continue
		}
		maj, min, ok := strings.Cut(f[2], ":")
		if !ok {
			continue
		}
		ma, err1 := strconv.ParseUint(maj, 10, 32)
		mi, err2 := strconv.ParseUint(min, 10, 32)
		if err1 != nil || err2 != nil {
			continue
		}
		m := fsMount{major: uint32(ma), minor: uint32(mi), point: unescapeMount(f[4]), fstype: g[0], source: unescapeMount(g[1])}
		if len(g) > 2 {
			m.options = strings.Split(g[2], ",")
		}
		out = append(out, m)
	}
	return out
}

// ioDevices finds the whole disks behind the mounts at ioRoots and below
// /usr, from mountinfo and the sysfs at sys. rdev reads a device node's
// numbers (for file systems whose own numbers are anonymous, as btrfs's).
func ioDevices(mountinfo, sys string, rdev func(string) (uint32, uint32, bool)) ([]Device, error) {
	mounts := parseFSMounts(mountinfo)
	var out []Device
	add := func(major, minor uint32) {
		if d, ok := wholeDisk(sys, major, minor); ok && !slices.Contains(out, d) {
			out = append(out, d)
		}
	}
	var visit func(m fsMount, depth int)
	visit = func(m fsMount, depth int) {
		if m.major != 0 {
			add(m.major, m.minor)
			return
		}
		// Anonymous numbers: btrfs (and the like) name their device as
		// the source; overlayfs has its layers in its options.
		if strings.HasPrefix(m.source, "/dev/") {
			if ma, mi, ok := rdev(m.source); ok {
				add(ma, mi)
			}
		}
		if m.fstype != "overlay" || depth > 2 {
			return
		}
		for _, opt := range m.options {
			k, v, _ := strings.Cut(opt, "=")
			if k != "lowerdir" && k != "upperdir" {
				continue
			}
			for _, dir := range strings.Split(v, ":") {
				if under, ok := mountOf(mounts, dir); ok {
					visit(under, depth+1)
				}
			}
		}
	}
	for _, m := range mounts {
		if slices.Contains(ioRoots, m.point) || strings.HasPrefix(m.point, "/usr/") {
			visit(m, 0)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%w: no block device found behind / and /usr to limit disk I/O on (in a container: "+
			"--io-disk-of names a directory on the disk to limit); --insecure-no-io-limit runs sandboxes without a disk I/O limit", ErrUnavailable)
	}
	sortDevices(out)
	return out, nil
}

func sortDevices(ds []Device) {
	slices.SortFunc(ds, func(a, b Device) int {
		if a.Major != b.Major {
			return int(a.Major) - int(b.Major)
		}
		return int(a.Minor) - int(b.Minor)
	})
}

// mountOf is the mount that holds path: the last of the longest matching
// mount points (the one mounted on top).
func mountOf(mounts []fsMount, path string) (fsMount, bool) {
	var best fsMount
	found := false
	for _, m := range mounts {
		if path == m.point || strings.HasPrefix(path, strings.TrimSuffix(m.point, "/")+"/") {
			if !found || len(m.point) >= len(best.point) {
				best, found = m, true
			}
		}
	}
	return best, found
}

// wholeDisk maps a block device's numbers to its disk's: a partition's
// sysfs directory has a "partition" file and sits in its disk's.
func wholeDisk(sys string, major, minor uint32) (Device, bool) {
	dir, err := filepath.EvalSymlinks(filepath.Join(sys, "dev", "block", fmt.Sprintf("%d:%d", major, minor)))
	if err != nil {
		return Device{}, false
	}
	if _, err := os.Stat(filepath.Join(dir, "partition")); err == nil {
		dir = filepath.Dir(dir)
	}
	b, err := os.ReadFile(filepath.Join(dir, "dev"))
	if err != nil {
		return Device{}, false
	}
	ma, mi, ok := strings.Cut(strings.TrimSpace(string(b)), ":")
	if !ok {
		return Device{}, false
	}
	a, err1 := strconv.ParseUint(ma, 10, 32)
	i, err2 := strconv.ParseUint(mi, 10, 32)
	if err1 != nil || err2 != nil {
		return Device{}, false
	}
	return Device{Major: uint32(a), Minor: uint32(i), Name: filepath.Base(dir)}, true
}

// ioLinesV1 are the blkio.throttle files and the lines written to them.
func ioLinesV1(devs []Device, l IOMax) map[string][]string {
	out := map[string][]string{}
	for _, f := range []struct {
		file string
		v    int64
	}{
		{"blkio.throttle.read_bps_device", l.ReadBPS}, {"blkio.throttle.write_bps_device", l.WriteBPS},
		{"blkio.throttle.read_iops_device", l.ReadIOPS}, {"blkio.throttle.write_iops_device", l.WriteIOPS},
	} {
		if f.v <= 0 {
			continue
		}
		for _, d := range devs {
			out[f.file] = append(out[f.file], fmt.Sprintf("%s %d", d, f.v))
		}
	}
	return out
}

// ioLinesV2 are the lines written to io.max, one per device.
func ioLinesV2(devs []Device, l IOMax) []string {
	var keys []string
	for _, k := range []struct {
		key string
		v   int64
	}{{"rbps", l.ReadBPS}, {"wbps", l.WriteBPS}, {"riops", l.ReadIOPS}, {"wiops", l.WriteIOPS}} {
		if k.v > 0 {
			keys = append(keys, fmt.Sprintf("%s=%d", k.key, k.v))
		}
	}
	if len(keys) == 0 {
		return nil
	}
	var out []string
	for _, d := range devs {
		out = append(out, d.String()+" "+strings.Join(keys, " "))
	}
	return out
}

// writeIO writes each line to a control file of dir, one write per line
// (the kernel parses one device per write).
func writeIO(dir, file string, lines []string) error {
	var errs []error
	for _, line := range lines {
		if err := writeFile(dir, file, line); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("%w (the disk I/O limit could not be set)", err)
	}
	return nil
}
