//go:build linux

package cgroups

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"time"
)

// v1 is the legacy layout: one hierarchy per controller (or per set of
// co-mounted controllers), and a sandbox's group is one directory in each.
type v1 struct {
	parent string
	// Hierarchy mount points by controller. Co-mounted controllers
	// ("cpu,cpuacct") share a point.
	memory, pids, cpuacct, freezer string
	// cpu is optional: with it each sandbox is one entity for the
	// scheduler and can be capped.
	cpu string
	// blkio is optional: without it a group asking for a disk I/O limit
	// cannot be made.
	blkio string
	// devices are the block devices I/O limits apply to (IODevices;
	// tests replace it).
	devices func() ([]Device, error)
	// others are the v1 hierarchies the manager makes no groups in.
	others []string
	// tenantCeiling is Ceilings.Tenant, written to each tenant's group
	// when it is made.
	tenantCeiling atomic.Int64
}

func newV1(mounts []mount, parent string) (*v1, error) {
	m := &v1{parent: parent, devices: IODevices}
	for _, mt := range mounts {
		if mt.fstype != "cgroup" {
			continue
		}
		for _, opt := range mt.options {
			switch opt {
			case "memory":
				m.memory = mt.point
			case "pids":
				m.pids = mt.point
			case "cpuacct":
				m.cpuacct = mt.point
			case "freezer":
				m.freezer = mt.point
			case "cpu":
				m.cpu = mt.point
			case "blkio":
				m.blkio = mt.point
			}
		}
	}
	for _, mt := range mounts {
		if mt.fstype == "cgroup" && !slices.Contains(m.points(), mt.point) {
			m.others = append(m.others, mt.point)
		}
	}
	var missing []string
	for name, point := range map[string]string{"memory": m.memory, "pids": m.pids, "cpuacct": m.cpuacct} {
		if point == "" {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		slices.Sort(missing)
		return nil, fmt.Errorf("%w: no cgroup v2 hierarchy with the memory and pids controllers, and no cgroup v1 hierarchy for %s",
			ErrUnavailable, strings.Join(missing, ", "))
	}
	for _, point := range m.points() {
		dir := filepath.Join(point, parent)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, fmt.Errorf("%w: cannot create %s: %v", ErrUnavailable, dir, err)
		}
	}
	return m, nil
}

// points lists each distinct hierarchy once.
func (m *v1) points() []string {
	var out []string
	for _, p := range []string{m.memory, m.pids, m.cpuacct, m.freezer, m.cpu, m.blkio} {
		if p != "" && !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	return out
}

func (m *v1) Version() int { return 1 }

func (m *v1) CPUController() bool { return m.cpu != "" }

func (m *v1) IOController() bool { return m.blkio != "" }

func (m *v1) Sweep() ([]string, error) {
	var parents []string
	// The other hierarchies too: what a runtime that was given a group's
	// path made there (runsc: cpuset, devices ...).
	for _, p := range append(m.points(), m.others...) {
		parents = append(parents, filepath.Join(p, m.parent))
	}
	kill := func(rel string) {
		// Freeze first where possible so that a fork bomb cannot outrun
		// the kills; every hierarchy is visited, since a process may be
		// listed in one only.
		var fz string
		if m.freezer != "" {
			fz = filepath.Join(m.freezer, m.parent, rel)
			writeFile(fz, "freezer.state", "FROZEN")
		}
		for _, p := range parents {
			killProcs(filepath.Join(p, rel))
		}
		if fz != "" {
			writeFile(fz, "freezer.state", "THAWED")
		}
	}
	return sweepDirs(parents, kill)
}

func (m *v1) New(name string, l Limits) (Group, error) {
	if err := validName(name); err != nil {
		return nil, err
	}
	var devs []Device
	if l.IO.any() {
		if m.blkio == "" {
			return nil, errNoIOController("blkio")
		}
		var err error
		if devs, err = m.devices(); err != nil {
			return nil, err
		}
	}
	g := &group1{m: m, rel: name}
	if l.Tenant != "" {
		if err := m.acquireTenant(l.Tenant); err != nil {
			return nil, err
		}
		g.tenant, g.rel = l.Tenant, filepath.Join(l.Tenant, name)
	}
	for _, point := range m.points() {
		dir := g.dir(point)
		if err := mkdirGroup(dir); err != nil {
			g.Destroy()
			return nil, fmt.Errorf("cgroups: create %s: %w", dir, err)
		}
		g.dirs = append(g.dirs, dir)
	}
	if err := g.limit(l, devs); err != nil {
		g.Destroy()
		return nil, err
	}
	return g, nil
}

// acquireTenant makes the tenant's group in every hierarchy, with its
// weights, unless a live group of the tenant has already.
func (m *v1) acquireTenant(tenant string) error {
	if err := validTenant(tenant); err != nil {
		return err
	}
	points := m.points()
	return tenants.acquire(filepath.Join(points[0], m.parent, tenant), func() error {
		var dirs []string
		for _, p := range points {
			dir := filepath.Join(p, m.parent, tenant)
			// It may exist: left by a process that crashed before a Sweep.
			if err := mkdirGroup(dir); err != nil && !errors.Is(err, os.ErrExist) {
				removeTenantDirs(dirs)
				return fmt.Errorf("cgroups: create %s: %w", dir, err)
			}
			dirs = append(dirs, dir)
		}
		if err := m.weighTenant(tenant); err != nil {
			removeTenantDirs(dirs)
			return err
		}
		if err := limitMemoryV1(filepath.Join(m.memory, m.parent, tenant), m.tenantCeiling.Load()); err != nil {
			removeTenantDirs(dirs)
			return err
		}
		return nil
	})
}

// SetCeilings implements Manager: the parent's limit now, each tenant's
// group's when it is made.
func (m *v1) SetCeilings(c Ceilings) error {
	if c.Total > 0 || c.Tenant > 0 {
		if err := m.CheckCeilings(); err != nil {
			return err
		}
	}
	if err := limitMemoryV1(filepath.Join(m.memory, m.parent), c.Total); err != nil {
		return err
	}
	m.tenantCeiling.Store(c.Tenant)
	return nil
}

// CheckCeilings implements Manager. Before Linux 5.16 a v1 group counts
// its children's charges only with memory.use_hierarchy set, which a
// group inherits from its parent when made and which can be changed only
// while it has no children: it is set on the parent here if it is not.
// From 5.16 it is always set.
func (m *v1) CheckCeilings() error {
	dir := filepath.Join(m.memory, m.parent)
	if on, err := readInt(dir, "memory.use_hierarchy"); err == nil && on == 1 {
		return nil
	}
	if err := writeFile(dir, "memory.use_hierarchy", "1"); err != nil {
		return fmt.Errorf("%w: hierarchical memory accounting is off in %s (memory.use_hierarchy 0) and cannot be turned on "+
			"while it holds groups, so a memory ceiling there would not count its sandboxes: %v", ErrUnavailable, dir, err)
	}
	return nil
}

// TenantMemory implements Manager.
func (m *v1) TenantMemory(tenant string) (int64, error) {
	if err := validTenant(tenant); err != nil && tenant != "" {
		return 0, err
	}
	return readInt(filepath.Join(m.memory, m.parent, tenant), "memory.usage_in_bytes")
}

// limitMemoryV1 sets a v1 group's memory limit (0: none) and beside it
// the same limit of memory plus swap, where swap is accounted
// (memory.memsw: swapping out then frees nothing of the bound, so the
// group gets no swap beyond it), and of socket buffers: v1 charges a
// socket's TCP and UDP buffers to its group (and the group's parents)
// only once the group has a TCP limit of its own, and otherwise against
// the host-wide net.ipv4.tcp_mem and udp_mem alone (one sandbox of 128
// MiB held 2.2 GiB of UDP buffers on loopback before it had one).
func limitMemoryV1(dir string, bytes int64) error {
	v := "-1"
	if bytes > 0 {
		v = fmt.Sprint(bytes)
	}
	files := []string{"memory.limit_in_bytes"}
	if _, err := os.Stat(filepath.Join(dir, "memory.memsw.limit_in_bytes")); err == nil {
		// The kernel keeps memory+swap at or above memory: mem+swap is
		// raised first and lowered last.
		if sw, err := readInt(dir, "memory.memsw.limit_in_bytes"); err != nil || bytes <= 0 || bytes > sw {
			files = []string{"memory.memsw.limit_in_bytes", "memory.limit_in_bytes"}
		} else {
			files = append(files, "memory.memsw.limit_in_bytes")
		}
	}
	for _, f := range files {
		if err := writeFile(dir, f, v); err != nil {
			return err
		}
	}
	if err := writeFile(dir, "memory.kmem.tcp.limit_in_bytes", v); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// weighTenant writes a tenant group's CPU share and, where the kernel
// has a weight-based I/O scheduler for groups (BFQ: blkio.bfq.weight),
// its I/O weight. The I/O weight acts only on disks whose scheduler is
// BFQ; with mq-deadline, none or kyber only the throttle (IOMax) holds.
func (m *v1) weighTenant(tenant string) error {
	if m.cpu != "" {
		if err := writeFile(filepath.Join(m.cpu, m.parent, tenant), "cpu.shares", fmt.Sprint(tenantCPUShares)); err != nil {
			return err
		}
	}
	if m.blkio != "" {
		dir := filepath.Join(m.blkio, m.parent, tenant)
		for _, f := range []string{"blkio.bfq.weight", "blkio.weight"} {
			if _, err := os.Stat(filepath.Join(dir, f)); err == nil {
				if err := writeFile(dir, f, fmt.Sprint(tenantIOWeight)); err != nil {
					return err
				}
				break
			}
		}
	}
	return nil
}

// releaseTenant removes the tenant's group after its last group is gone.
func (m *v1) releaseTenant(tenant string) error {
	points := m.points()
	return tenants.release(filepath.Join(points[0], m.parent, tenant), func() error {
		var dirs []string
		for _, p := range points {
			dirs = append(dirs, filepath.Join(p, m.parent, tenant))
		}
		err := removeTenantDirs(dirs)
		// An OCI runtime given a group's path (gVisor's runsc) makes it in
		// every hierarchy it knows, cpuset and devices too, and removes
		// only the group: the tenant's group there is left to us.
		for _, p := range m.others {
			rmdirGroup(filepath.Join(p, m.parent, tenant)) // ENOENT where none was made
		}
		return err
	})
}

type group1 struct {
	m      *v1
	rel    string // the group's path under the parent: NAME or TENANT/NAME
	tenant string
	dirs   []string // the group's directory in each hierarchy; nil once destroyed
	stats  statFiles
	// destroyed: Destroy ran (the tenant's count was given back once).
	destroyed bool
}

func (g *group1) dir(point string) string { return filepath.Join(point, g.m.parent, g.rel) }

func (g *group1) limit(l Limits, devs []Device) error {
	mem := g.dir(g.m.memory)
	if l.MemoryBytes > 0 {
		// No swap: memory+swap at the same limit, and swappiness 0 where
		// swap is not accounted (no memory.memsw), which keeps the group's
		// pages out of swap. Its socket buffers within the same bound.
		if err := limitMemoryV1(mem, l.MemoryBytes); err != nil {
			return err
		}
		if err := writeFile(mem, "memory.swappiness", "0"); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	if l.Pids > 0 {
		if err := writeFile(g.dir(g.m.pids), "pids.max", fmt.Sprint(l.Pids)); err != nil {
			return err
		}
	}
	if l.CPUs > 0 {
		if g.m.cpu == "" {
			return fmt.Errorf("%w: a CPU cap needs the cpu controller", ErrUnavailable)
		}
		quota, period := cfsQuota(l.CPUs)
		if err := writeFile(g.dir(g.m.cpu), "cpu.cfs_period_us", fmt.Sprint(period)); err != nil {
			return err
		}
		if err := writeFile(g.dir(g.m.cpu), "cpu.cfs_quota_us", fmt.Sprint(quota)); err != nil {
			return err
		}
	}
	for file, lines := range ioLinesV1(devs, l.IO) {
		if err := writeIO(g.dir(g.m.blkio), file, lines); err != nil {
			return err
		}
	}
	return nil
}

func (g *group1) AddProc(pid int) error {
	for _, d := range g.dirs {
		if err := writeFile(d, "cgroup.procs", fmt.Sprint(pid)); err != nil {
			return err
		}
	}
	return nil
}

func (g *group1) IntoFD() int { return -1 }

func (g *group1) Path() string { return "/" + filepath.Join(g.m.parent, g.rel) }

func (g *group1) Procs() ([]int, error) { return readProcs(g.dir(g.m.pids)) }

func (g *group1) Stats() (Stats, error) {
	return statsV1(&g.stats, g.dir(g.m.cpuacct), g.dir(g.m.memory))
}

// statsV1 reads a v1 group's accounting from its cpuacct and memory
// directories.
func statsV1(r statReader, cpuacct, mem string) (Stats, error) {
	var s Stats
	ns, err := r.readInt(cpuacct, "cpuacct.usage")
	if err != nil {
		return s, err
	}
	s.CPU = time.Duration(ns)
	if s.MemoryPeak, err = r.readInt(mem, "memory.max_usage_in_bytes"); err != nil {
		return s, err
	}
	// oom_kill appeared in Linux 4.13; before that, a failed charge is the
	// best evidence there is.
	if s.OOMKills, err = r.readKeyed(mem, "memory.oom_control", "oom_kill"); err != nil {
		fail, ferr := r.readInt(mem, "memory.failcnt")
		if ferr != nil {
			return s, err
		}
		s.OOMKills = min(fail, 1)
	}
	return s, nil
}

// Destroy kills what is left (freezing first where the freezer exists, so a
// fork bomb cannot outrun the kills) and removes every directory, and the
// tenant's group after its last sandbox.
func (g *group1) Destroy() error {
	if g.destroyed {
		return nil
	}
	g.destroyed = true
	g.stats.close()
	kill := func() {
		var fz string
		if g.m.freezer != "" {
			fz = g.dir(g.m.freezer)
			writeFile(fz, "freezer.state", "FROZEN")
		}
		for _, d := range g.dirs {
			killProcs(d)
		}
		if fz != "" {
			writeFile(fz, "freezer.state", "THAWED")
		}
	}
	if len(g.dirs) > 0 {
		if n, _ := killProcs(g.dirs[0]); n > 0 {
			kill()
		}
	}
	var errs []error
	for _, d := range g.dirs {
		if err := removeDir(d, kill); err != nil {
			errs = append(errs, err)
		}
	}
	g.dirs = nil
	if g.tenant != "" {
		errs = append(errs, g.m.releaseTenant(g.tenant))
	}
	return errors.Join(errs...)
}
