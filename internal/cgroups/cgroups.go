//go:build linux

// Package cgroups gives each sandbox a control group of its own, on cgroup v1
// (per-controller hierarchies, still the default on some hosts and on this
// project's CI) and on cgroup v2 (the unified hierarchy of current distros).
//
// A Group limits memory (with swap off), the number of processes, CPU
// bandwidth and disk I/O, and reports CPU time, peak memory and OOM kills.
// All groups live under one parent, "vivarium" by default, at the top of
// each hierarchy: parent/SANDBOX, or parent/TENANT/SANDBOX for a sandbox of
// a tenant (an API key of a server), whose group has one CPU and I/O weight
// however many sandboxes it holds. The parent and each tenant's group may
// have a memory ceiling (Ceilings): the bound on what ended sandboxes
// leave charged.
//
// The package writes control files directly: the handful it needs are stable
// kernel ABI, and a dependency would not make them safer.
package cgroups

import (
	"cmp"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Limits are applied when a group is created. Zero means no limit.
type Limits struct {
	MemoryBytes int64
	Pids        int64
	// CPUs caps CPU bandwidth in cores (1.5: one and a half cores). It
	// needs the cpu controller; zero means no cap.
	CPUs float64
	// IO caps disk I/O on every block device behind the host's / and /usr
	// (IODevices). Any cap needs the blkio (v1) or io (v2) controller: New
	// fails without it, never leaves the group unlimited.
	IO IOMax
	// Tenant, when not empty, puts the group in its tenant's group
	// (parent/TENANT/NAME), which is made with the tenant's first group
	// and removed with its last. It is not a limit of the sandbox but its
	// share: tenants' groups have equal CPU and I/O weights, and one
	// memory ceiling each (Ceilings.Tenant).
	Tenant string
}

// Ceilings bound memory above the sandboxes' own limits. The kernel
// charges a page to the group of the process that first touched it and
// keeps it charged there after that process, and its group, are gone, for
// as long as anything holds the page: a memfd, a tmpfs file or a pipe's
// contents handed to another sandbox (over a Unix socket on a volume both
// mount) outlive the sandbox that filled them, outside every live
// sandbox's limit. An ended group's charges stay counted in its
// ancestors, the tenant's group and the parent (hierarchical accounting:
// always on cgroup v2, and on v1 since Linux 5.16 or where
// memory.use_hierarchy is set), and a limit there bounds them: reaching
// it, the kernel reclaims what it can in the group's subtree, then
// OOM-kills the largest process in it.
//
// Zero is no bound, written as such, so that a bound an earlier process
// set does not stay. Each is one limit of memory (and, on v1, of memory
// plus swap where swap is accounted, and of socket buffers, which v1
// charges apart).
type Ceilings struct {
	// Total bounds every group under the parent together, zygotes'
	// included: the parent's limit.
	Total int64
	// Tenant bounds each tenant's group: all its sandboxes, live and
	// ended, together.
	Tenant int64
}

// Stats are read from a group's accounting files.
type Stats struct {
	CPU        time.Duration // user + system time of every process, living and dead
	MemoryPeak int64         // high-water mark of memory charged, bytes
	OOMKills   int64         // processes the kernel killed for exceeding the memory limit
	// Memory charged now is not here: an execution reads Stats before
	// and after, and has no use for it (MemoryReader reads it).
}

// Group is one sandbox's control group.
type Group interface {
	// AddProc moves a process (with all its threads) into the group.
	AddProc(pid int) error
	// IntoFD returns a directory descriptor for clone3's CLONE_INTO_CGROUP,
	// or -1 where the hierarchy cannot do that (cgroup v1).
	IntoFD() int
	// Path is the group's path from the top of its hierarchy,
	// "/PARENT/NAME" or "/PARENT/TENANT/NAME": what an OCI runtime is
	// given as cgroupsPath to run a container in it.
	Path() string
	// Stats reads the group's accounting.
	Stats() (Stats, error)
	// Procs lists the processes in the group (host pids).
	Procs() ([]int, error)
	// Destroy kills whatever still runs in the group, waits for it to be
	// gone and removes the group. It is safe to call more than once.
	Destroy() error
}

// Manager creates groups.
type Manager interface {
	// Version is 1 or 2.
	Version() int
	// New creates an empty group with the given limits.
	New(name string, l Limits) (Group, error)
	// CPUController reports whether groups get a CPU share of their own:
	// every sandbox then competes for CPU as one entity, however many
	// processes it runs, and CPU caps are possible.
	CPUController() bool
	// IOController reports whether groups can have disk I/O limits.
	IOController() bool
	// SetCeilings bounds the memory of the parent and of the tenants'
	// groups made from then on (Ceilings). Call it before New.
	SetCeilings(c Ceilings) error
	// CheckCeilings says why a ceiling would not bound the groups below
	// it (hierarchical memory accounting off), or nil.
	CheckCeilings() error
	// TenantMemory is the memory charged to a tenant's group now: what
	// its sandboxes hold, and what ended ones left charged to it; with
	// tenant "", the parent's: all groups'.
	TenantMemory(tenant string) (int64, error)
	// Sweep kills every process in every group under the parent and
	// removes the groups, tenants' groups and the sandbox groups in them
	// alike: what an earlier process that crashed left. It returns the
	// groups it removed, as paths under the parent ("key_1/sb", "key_1").
	Sweep() ([]string, error)
}

// DefaultParent is the group every sandbox group is created under.
const DefaultParent = "vivarium"

// Detect finds the cgroup hierarchy this host offers. It prefers a unified
// (v2) hierarchy that has the memory and pids controllers, and otherwise
// looks for v1 memory, pids and cpuacct hierarchies. The error says what is
// missing.
func Detect(parent string) (Manager, error) {
	if parent == "" {
		parent = DefaultParent
	}
	if err := validName(parent); err != nil {
		return nil, err
	}
	mounts, err := readMounts("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	return detect(mounts, parent)
}

func detect(mounts []mount, parent string) (Manager, error) {
	var v2Err error
	if m := mounts2(mounts); m != "" {
		mgr, err := newV2(m, parent)
		if err == nil {
			return mgr, nil
		}
		v2Err = err
	}
	mgr, err := newV1(mounts, parent)
	if err == nil {
		return mgr, nil
	}
	if v2Err != nil {
		return nil, fmt.Errorf("%w; %w", v2Err, err)
	}
	return nil, err
}

// ErrUnavailable says the host's cgroups cannot limit a sandbox.
var ErrUnavailable = errors.New("cgroups unavailable")

func validName(name string) error {
	for _, part := range strings.Split(name, "/") {
		if part == "" || part == "." || part == ".." {
			return fmt.Errorf("cgroups: invalid group name %q", name)
		}
	}
	return nil
}

type mount struct {
	dev     string // the hierarchy's device (major:minor): one per hierarchy
	root    string // the directory of the hierarchy mounted there
	point   string
	fstype  string
	options []string // super options: the v1 controllers
}

// readMounts parses /proc/self/mountinfo for cgroup file systems.
func readMounts(path string) ([]mount, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("cgroups: %w", err)
	}
	return parseMountinfo(string(data)), nil
}

func parseMountinfo(s string) []mount {
	var out []mount
	for _, line := range strings.Split(s, "\n") {
		// 36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue
		pre, post, ok := strings.Cut(line, " - ")
		if !ok {
			continue
		}
		f, g := strings.Fields(pre), strings.Fields(post)
		if len(f) < 5 || len(g) < 3 || (g[0] != "cgroup" && g[0] != "cgroup2") {
			continue
		}
		out = append(out, mount{dev: f[2], root: unescapeMount(f[3]), point: unescapeMount(f[4]), fstype: g[0], options: strings.Split(g[2], ",")})
	}
	// Each hierarchy once, where the system mounts it: a tool may mount
	// one again elsewhere for a while (CRIU's cgroup yard while it
	// dumps), and a sandbox must not be placed through that copy.
	slices.SortStableFunc(out, func(a, b mount) int {
		return cmp.Compare(systemRank(a.point), systemRank(b.point))
	})
	seen := map[string]bool{}
	return slices.DeleteFunc(out, func(m mount) bool {
		dup := seen[m.dev]
		seen[m.dev] = true
		return dup
	})
}

// systemRank is 0 for a mount point under /sys/fs/cgroup, 1 elsewhere.
func systemRank(point string) int {
	if point == "/sys/fs/cgroup" || strings.HasPrefix(point, "/sys/fs/cgroup/") {
		return 0
	}
	return 1
}

// unescapeMount undoes mountinfo's octal escapes of space, tab, newline and backslash.
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func mounts2(ms []mount) string {
	for _, m := range ms {
		if m.fstype == "cgroup2" {
			return m.point
		}
	}
	return ""
}

// mkdirGroup and rmdirGroup make and remove a group's directory. Tests
// replace them with versions that add and remove the control files the
// kernel shows in a group, so that the code runs on a fake hierarchy.
var (
	mkdirGroup = func(dir string) error { return os.Mkdir(dir, 0o755) }
	rmdirGroup = os.Remove
)

// writeFile writes a control file; the error names the file and value.
// It never creates a file: a missing one means the kernel lacks the feature.
func writeFile(dir, file, value string) error {
	f, err := os.OpenFile(filepath.Join(dir, file), os.O_WRONLY|os.O_TRUNC, 0)
	if err == nil {
		_, err = f.WriteString(value)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		return fmt.Errorf("cgroups: write %q to %s: %w", value, file, err)
	}
	return nil
}

// smallFile bounds what readSmall reads without os.ReadFile: a number,
// or the few "key value" lines of cpu.stat, memory.events or
// memory.oom_control.
const smallFile = 512

// readSmall reads a small control file with open, read and close alone.
// os.ReadFile also stats the file and, since control files can be
// polled, registers it with the runtime's poller and removes it again:
// together more than the read itself, on a path that every execution
// takes twice (its usage before and after). A file larger than
// smallFile is read with os.ReadFile.
func readSmall(path string) ([]byte, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	defer unix.Close(fd)
	return readFD(fd, func() string { return path })
}

// readFD reads the control file open as fd from its start, with pread:
// a descriptor held open (statFiles) reads the file as formatted now. A
// file larger than smallFile is read with os.ReadFile(path()).
func readFD(fd int, path func() string) ([]byte, error) {
	buf := make([]byte, smallFile)
	n := 0
	for n < len(buf) {
		m, err := unix.Pread(fd, buf[n:], int64(n))
		switch {
		case err == unix.EINTR:
			continue
		case err != nil:
			return nil, &os.PathError{Op: "read", Path: path(), Err: err}
		case m == 0:
			return buf[:n], nil
		}
		n += m
	}
	return os.ReadFile(path())
}

func readInt(dir, file string) (int64, error) {
	b, err := readSmall(filepath.Join(dir, file))
	return parseInt(b, err, file)
}

// parseInt parses what a read of a one-number file returned (b, err).
func parseInt(b []byte, err error, file string) (int64, error) {
	if err != nil {
		return 0, fmt.Errorf("cgroups: %w", err)
	}
	s := strings.TrimSpace(string(b))
	if s == "max" {
		return -1, nil
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("cgroups: %s: %w", file, err)
	}
	return n, nil
}

// readKeyed reads one value of a "key value" per line file (memory.events, cpu.stat).
func readKeyed(dir, file, key string) (int64, error) {
	b, err := readSmall(filepath.Join(dir, file))
	return parseKeyed(b, err, file, key)
}

// parseKeyed finds key in what a read of a "key value" file returned.
func parseKeyed(b []byte, err error, file, key string) (int64, error) {
	if err != nil {
		return 0, fmt.Errorf("cgroups: %w", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, " ")
		if ok && k == key {
			return strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		}
	}
	return 0, fmt.Errorf("cgroups: %s has no %q", file, key)
}

// removeDir removes an empty group directory, retrying while the kernel
// finishes tearing down exited processes (rmdir fails with EBUSY until then).
// kill is called between attempts to catch processes that appeared since.
func removeDir(dir string, kill func()) error {
	deadline := time.Now().Add(10 * time.Second)
	delay := 200 * time.Microsecond
	for {
		err := rmdirGroup(dir)
		if err == nil || errors.Is(err, os.ErrNotExist) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("cgroups: remove %s: %w", dir, err)
		}
		kill()
		time.Sleep(delay)
		delay = min(2*delay, 50*time.Millisecond)
	}
}

// sweepDirs kills and removes every group under each parent directory,
// at any depth, children before their parents (a tenant's sandboxes
// before the tenant's group). kill gets the group's path relative to the
// parent, as do the names returned. On v1 a group has a directory in
// each hierarchy, and one that exists in only some is removed from those.
func sweepDirs(parents []string, kill func(rel string)) ([]string, error) {
	var rels []string
	var errs []error
	var walk func(parent, rel string)
	walk = func(parent, rel string) {
		entries, err := os.ReadDir(filepath.Join(parent, rel))
		if err != nil {
			if !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, err)
			}
			return
		}
		for _, e := range entries {
			if !e.IsDir() {
				continue
			}
			sub := filepath.Join(rel, e.Name())
			walk(parent, sub)
			if !slices.Contains(rels, sub) {
				rels = append(rels, sub)
			}
		}
	}
	for _, parent := range parents {
		walk(parent, "")
	}
	// Deepest first.
	slices.SortStableFunc(rels, func(a, b string) int { return strings.Count(b, "/") - strings.Count(a, "/") })
	var names []string
	for _, rel := range rels {
		kill(rel)
		ok := true
		for _, parent := range parents {
			dir := filepath.Join(parent, rel)
			if err := removeDir(dir, func() { kill(rel) }); err != nil {
				errs = append(errs, err)
				ok = false
			}
		}
		if ok {
			names = append(names, rel)
		}
	}
	return names, errors.Join(errs...)
}

// cfsQuota converts a CPU cap in cores to a CFS quota for a 100 ms period.
func cfsQuota(cpus float64) (quota, period int64) {
	period = 100_000
	return max(int64(cpus*float64(period)), 1000), period
}

// readProcs lists the pids in dir's cgroup.procs.
func readProcs(dir string) ([]int, error) {
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, f := range strings.Fields(string(b)) {
		if pid, err := strconv.Atoi(f); err == nil && pid > 0 {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}

// killProcs sends SIGKILL to every process listed in dir's cgroup.procs.
func killProcs(dir string) (int, error) {
	n, err := killListed(func() ([]int, error) { return readProcs(dir) })
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	return n, err
}

// killListed kills the processes list names, and only those: a pid read
// from cgroup.procs may belong to a process that has since been reaped,
// and with pids recycled as fast as a fork bomb turns them over, the
// number may by now name anyone's process, the server's own included. So
// each pid is pinned with a pidfd first, then the list is read again: a
// pid still listed after its pidfd was opened is that pidfd's process (a
// pid is not reused before its process is reaped, which the pidfd would
// then see), and the signal goes through the pidfd. A process that
// entered under a recycled pid in between is left to the next round,
// which every caller has.
func killListed(list func() ([]int, error)) (int, error) {
	pids, err := list()
	if err != nil || len(pids) == 0 {
		return 0, err
	}
	fds := make(map[int]int, len(pids))
	defer func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}()
	for _, pid := range pids {
		if _, ok := fds[pid]; ok || pid == os.Getpid() {
			// This process, never: it is in a sandbox's group only
			// while one of its threads starts the sandbox's first
			// process there (EnterThread), before the group is used.
			continue
		}
		fd, err := unix.PidfdOpen(pid, 0)
		if err == nil {
			fds[pid] = fd
		} else if err == unix.EMFILE || err == unix.ENFILE {
			break // the rest are for the next round
		}
	}
	if len(fds) == 0 {
		return 0, nil
	}
	still, err := list()
	if err != nil {
		return 0, err
	}
	n := 0
	for _, pid := range still {
		if fd, ok := fds[pid]; ok && unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0) == nil {
			n++
		}
	}
	return n, nil
}
