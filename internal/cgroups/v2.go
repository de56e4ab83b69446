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

	"golang.org/x/sys/unix"
)

// v2 is the unified hierarchy: one directory per group, controllers enabled
// for children through cgroup.subtree_control.
type v2 struct {
	root, parent string
	// controllers are those enabled for sandbox groups: memory and pids,
	// and cpu and io where the hierarchy can give them.
	controllers []string
	// devices are the block devices I/O limits apply to (IODevices;
	// tests replace it).
	devices func() ([]Device, error)
	// tenantCeiling is Ceilings.Tenant, written to each tenant's group
	// when it is made.
	tenantCeiling atomic.Int64
}

var v2Controllers = []string{"memory", "pids"}

// v2Optional are enabled where the hierarchy has them: cpu gives each
// sandbox (and tenant) a CPU share of its own and makes CPU caps
// possible; io makes disk I/O limits possible. A host that lacks one
// still gets the other limits; a sandbox that asks for what is missing
// cannot be made.
var v2Optional = []string{"cpu", "io"}

func newV2(root, parent string) (*v2, error) {
	b, err := os.ReadFile(filepath.Join(root, "cgroup.controllers"))
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	have := strings.Fields(string(b))
	var missing []string
	for _, c := range v2Controllers {
		if !slices.Contains(have, c) {
			missing = append(missing, c)
		}
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("%w: the cgroup v2 hierarchy at %s lacks the %s controller(s)",
			ErrUnavailable, root, strings.Join(missing, ", "))
	}
	m := &v2{root: root, parent: parent, devices: IODevices}
	want := slices.Clone(v2Controllers)
	for _, c := range v2Optional {
		if slices.Contains(have, c) {
			want = append(want, c)
		}
	}
	// Enable the controllers at every level from the root down to the
	// parent, so that each sandbox group has its own memory and pids files.
	// An optional controller that cannot be enabled is dropped.
	dir := root
	for _, part := range strings.Split(parent, "/") {
		if want, err = enableSome(dir, want); err != nil {
			return nil, err
		}
		dir = filepath.Join(dir, part)
		if err := mkdirGroup(dir); err != nil && !errors.Is(err, os.ErrExist) {
			return nil, fmt.Errorf("%w: cannot create %s: %v", ErrUnavailable, dir, err)
		}
	}
	if want, err = enableSome(dir, want); err != nil {
		return nil, err
	}
	m.controllers = want
	return m, nil
}

// enableSome enables want for dir's children: the required controllers
// or an error, and each optional one that can be; it returns those
// enabled.
func enableSome(dir string, want []string) ([]string, error) {
	if err := enableControllers(dir, want); err == nil {
		return want, nil
	}
	got := slices.Clone(v2Controllers)
	if err := enableControllers(dir, got); err != nil {
		return nil, err
	}
	for _, c := range want {
		if !slices.Contains(got, c) && enableControllers(dir, []string{c}) == nil {
			got = append(got, c)
		}
	}
	return got, nil
}

func enableControllers(dir string, controllers []string) error {
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.subtree_control"))
	if err != nil {
		return fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	enabled := strings.Fields(string(b))
	var add []string
	for _, c := range controllers {
		if !slices.Contains(enabled, c) {
			add = append(add, "+"+c)
		}
	}
	if len(add) == 0 {
		return nil
	}
	if err := writeFile(dir, "cgroup.subtree_control", strings.Join(add, " ")); err != nil {
		// EBUSY: the group holds processes itself ("no internal processes").
		return fmt.Errorf("%w: cannot enable %s for sub-groups of %s (run vivarium in a cgroup of its own, or under a delegated subtree): %v",
			ErrUnavailable, strings.Join(add, " "), dir, err)
	}
	return nil
}

func (m *v2) Version() int { return 2 }

func (m *v2) CPUController() bool { return slices.Contains(m.controllers, "cpu") }

func (m *v2) IOController() bool { return slices.Contains(m.controllers, "io") }

func (m *v2) Sweep() ([]string, error) {
	return sweepDirs([]string{filepath.Join(m.root, m.parent)}, func(rel string) {
		dir := filepath.Join(m.root, m.parent, rel)
		if writeFile(dir, "cgroup.kill", "1") == nil {
			return
		}
		writeFile(dir, "cgroup.freeze", "1")
		killProcs(dir)
		writeFile(dir, "cgroup.freeze", "0")
	})
}

func (m *v2) New(name string, l Limits) (Group, error) {
	if err := validName(name); err != nil {
		return nil, err
	}
	var devs []Device
	if l.IO.any() {
		if !m.IOController() {
			return nil, errNoIOController("io")
		}
		var err error
		if devs, err = m.devices(); err != nil {
			return nil, err
		}
	}
	dir := filepath.Join(m.root, m.parent, name)
	g := &group2{m: m, name: name, fd: -1}
	if l.Tenant != "" {
		if err := m.acquireTenant(l.Tenant); err != nil {
			return nil, err
		}
		g.tenant = l.Tenant
		dir = filepath.Join(m.root, m.parent, l.Tenant, name)
	}
	if err := mkdirGroup(dir); err != nil {
		g.Destroy()
		return nil, fmt.Errorf("cgroups: create %s: %w", dir, err)
	}
	g.dir = dir
	if err := g.limit(l, devs); err != nil {
		g.Destroy()
		return nil, err
	}
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		g.Destroy()
		return nil, fmt.Errorf("cgroups: open %s: %w", dir, err)
	}
	g.fd = fd
	return g, nil
}

// acquireTenant makes the tenant's group, with the controllers enabled for
// its sandboxes' groups and its weights, unless a live group of the tenant
// has already.
func (m *v2) acquireTenant(tenant string) error {
	if err := validTenant(tenant); err != nil {
		return err
	}
	dir := filepath.Join(m.root, m.parent, tenant)
	return tenants.acquire(dir, func() error {
		// It may exist: left by a process that crashed before a Sweep.
		if err := mkdirGroup(dir); err != nil && !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("cgroups: create %s: %w", dir, err)
		}
		if err := m.setUpTenant(dir); err != nil {
			removeTenantDirs([]string{dir})
			return err
		}
		return nil
	})
}

// setUpTenant enables the sandboxes' controllers below a tenant's group
// and writes its CPU weight and, where the kernel weighs groups' I/O
// (io.weight with the io.cost controller configured for a disk;
// io.bfq.weight on disks whose scheduler is BFQ), its I/O weight.
func (m *v2) setUpTenant(dir string) error {
	if err := enableControllers(dir, m.controllers); err != nil {
		return err
	}
	if err := writeFile(dir, "memory.max", memoryMax(m.tenantCeiling.Load())); err != nil {
		return err
	}
	if m.CPUController() {
		if err := writeFile(dir, "cpu.weight", fmt.Sprint(tenantCPUWeight)); err != nil {
			return err
		}
	}
	if m.IOController() {
		for _, w := range []struct{ file, value string }{
			{"io.weight", fmt.Sprintf("default %d", tenantIOWeight)},
			{"io.bfq.weight", fmt.Sprintf("default %d", tenantIOWeight)},
		} {
			if _, err := os.Stat(filepath.Join(dir, w.file)); err == nil {
				if err := writeFile(dir, w.file, w.value); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// SetCeilings implements Manager: the parent's memory.max now, each
// tenant's group's when it is made. A tenant's group has no
// memory.oom.group: reaching its ceiling, the kernel kills the largest
// process of the tenant's, and with it that sandbox alone (each
// sandbox's group has memory.oom.group), not all of the tenant's.
func (m *v2) SetCeilings(c Ceilings) error {
	if err := writeFile(filepath.Join(m.root, m.parent), "memory.max", memoryMax(c.Total)); err != nil {
		return err
	}
	m.tenantCeiling.Store(c.Tenant)
	return nil
}

// CheckCeilings implements Manager: v2 accounts hierarchically always.
func (m *v2) CheckCeilings() error { return nil }

// TenantMemory implements Manager.
func (m *v2) TenantMemory(tenant string) (int64, error) {
	if err := validTenant(tenant); err != nil && tenant != "" {
		return 0, err
	}
	return readInt(filepath.Join(m.root, m.parent, tenant), "memory.current")
}

// memoryMax is memory.max's value for a limit in bytes (0: none).
func memoryMax(bytes int64) string {
	if bytes <= 0 {
		return "max"
	}
	return fmt.Sprint(bytes)
}

// releaseTenant removes the tenant's group after its last group is gone.
func (m *v2) releaseTenant(tenant string) error {
	dir := filepath.Join(m.root, m.parent, tenant)
	return tenants.release(dir, func() error { return removeTenantDirs([]string{dir}) })
}

type group2 struct {
	m      *v2
	name   string
	dir    string // "" before it is made and once destroyed
	fd     int
	tenant string
	stats  statFiles
	// destroyed: Destroy ran (the tenant's count was given back once).
	destroyed bool
}

func (g *group2) limit(l Limits, devs []Device) error {
	if l.MemoryBytes > 0 {
		if err := writeFile(g.dir, "memory.max", fmt.Sprint(l.MemoryBytes)); err != nil {
			return err
		}
		// No swap. The file is missing when the kernel has no swap support.
		if err := writeFile(g.dir, "memory.swap.max", "0"); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	// One OOM kill ends the whole sandbox instead of leaving it half alive.
	if err := writeFile(g.dir, "memory.oom.group", "1"); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	if l.Pids > 0 {
		if err := writeFile(g.dir, "pids.max", fmt.Sprint(l.Pids)); err != nil {
			return err
		}
	}
	if l.CPUs > 0 {
		if !g.m.CPUController() {
			return fmt.Errorf("%w: a CPU cap needs the cpu controller", ErrUnavailable)
		}
		quota, period := cfsQuota(l.CPUs)
		if err := writeFile(g.dir, "cpu.max", fmt.Sprintf("%d %d", quota, period)); err != nil {
			return err
		}
	}
	return writeIO(g.dir, "io.max", ioLinesV2(devs, l.IO))
}

func (g *group2) AddProc(pid int) error { return writeFile(g.dir, "cgroup.procs", fmt.Sprint(pid)) }

func (g *group2) IntoFD() int { return g.fd }

func (g *group2) Path() string {
	rel := g.name
	if g.tenant != "" {
		rel = filepath.Join(g.tenant, g.name)
	}
	return "/" + filepath.Join(g.m.parent, rel)
}

func (g *group2) Procs() ([]int, error) { return readProcs(g.dir) }

func (g *group2) Stats() (Stats, error) { return statsV2(&g.stats, g.dir) }

// statsV2 reads a v2 group's accounting.
func statsV2(r statReader, dir string) (Stats, error) {
	var s Stats
	us, err := r.readKeyed(dir, "cpu.stat", "usage_usec")
	if err != nil {
		return s, err
	}
	s.CPU = time.Duration(us) * time.Microsecond
	// memory.peak arrived in Linux 5.19; older kernels report no peak.
	if p, err := r.readInt(dir, "memory.peak"); err == nil {
		s.MemoryPeak = p
	}
	if s.OOMKills, err = r.readKeyed(dir, "memory.events", "oom_kill"); err != nil {
		return s, err
	}
	return s, nil
}

func (g *group2) Destroy() error {
	if g.destroyed {
		return nil
	}
	g.destroyed = true
	g.stats.close()
	var errs []error
	if g.dir != "" {
		kill := func() {
			// cgroup.kill (Linux 5.14) kills atomically, forks in flight included.
			if writeFile(g.dir, "cgroup.kill", "1") == nil {
				return
			}
			writeFile(g.dir, "cgroup.freeze", "1")
			killProcs(g.dir)
			writeFile(g.dir, "cgroup.freeze", "0")
		}
		if n, _ := killProcs(g.dir); n > 0 {
			kill()
		}
		errs = append(errs, removeDir(g.dir, kill))
	}
	if g.fd >= 0 {
		unix.Close(g.fd)
		g.fd = -1
	}
	g.dir = ""
	if g.tenant != "" {
		errs = append(errs, g.m.releaseTenant(g.tenant))
	}
	return errors.Join(errs...)
}
