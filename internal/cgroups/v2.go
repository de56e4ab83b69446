//go:build linux

package cgroups

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// v2 is the unified hierarchy: one directory per group, controllers enabled
// for children through cgroup.subtree_control.
type v2 struct {
	root, parent string
	cpu          bool // the cpu controller is enabled for sandbox groups
}

var v2Controllers = []string{"memory", "pids"}

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
	m := &v2{root: root, parent: parent}
	want := v2Controllers
	if slices.Contains(have, "cpu") {
		want = append(slices.Clip(want), "cpu")
	}
	// Enable the controllers at every level from the root down to the
	// parent, so that each sandbox group has its own memory and pids files.
	// The cpu controller is a bonus: a host that cannot enable it still
	// gets every limit, without per-sandbox CPU shares.
	enable := func(dir string) error {
		if err := enableControllers(dir, want); err != nil {
			if len(want) == len(v2Controllers) {
				return err
			}
			want = v2Controllers
			return enableControllers(dir, want)
		}
		return nil
	}
	dir := root
	for _, part := range strings.Split(parent, "/") {
		if err := enable(dir); err != nil {
			return nil, err
		}
		dir = filepath.Join(dir, part)
		if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return nil, fmt.Errorf("%w: cannot create %s: %v", ErrUnavailable, dir, err)
		}
	}
	if err := enable(dir); err != nil {
		return nil, err
	}
	m.cpu = slices.Contains(want, "cpu")
	return m, nil
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

func (m *v2) CPUController() bool { return m.cpu }

func (m *v2) Sweep() ([]string, error) {
	return sweepDirs([]string{filepath.Join(m.root, m.parent)}, func(dir string) {
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
	dir := filepath.Join(m.root, m.parent, name)
	if err := os.Mkdir(dir, 0o755); err != nil {
		return nil, fmt.Errorf("cgroups: create %s: %w", dir, err)
	}
	g := &group2{dir: dir, fd: -1, cpu: m.cpu}
	if err := g.limit(l); err != nil {
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

type group2 struct {
	dir string // "" once destroyed
	fd  int
	cpu bool
}

func (g *group2) limit(l Limits) error {
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
		if !g.cpu {
			return fmt.Errorf("%w: a CPU cap needs the cpu controller", ErrUnavailable)
		}
		quota, period := cfsQuota(l.CPUs)
		if err := writeFile(g.dir, "cpu.max", fmt.Sprintf("%d %d", quota, period)); err != nil {
			return err
		}
	}
	return nil
}

func (g *group2) AddProc(pid int) error { return writeFile(g.dir, "cgroup.procs", fmt.Sprint(pid)) }

func (g *group2) IntoFD() int { return g.fd }

func (g *group2) Procs() ([]int, error) { return readProcs(g.dir) }

func (g *group2) Stats() (Stats, error) { return statsV2(g.dir) }

// statsV2 reads a v2 group's accounting.
func statsV2(dir string) (Stats, error) {
	var s Stats
	us, err := readKeyed(dir, "cpu.stat", "usage_usec")
	if err != nil {
		return s, err
	}
	s.CPU = time.Duration(us) * time.Microsecond
	// memory.peak arrived in Linux 5.19; older kernels report no peak.
	if p, err := readInt(dir, "memory.peak"); err == nil {
		s.MemoryPeak = p
	}
	if s.OOMKills, err = readKeyed(dir, "memory.events", "oom_kill"); err != nil {
		return s, err
	}
	return s, nil
}

func (g *group2) Destroy() error {
	if g.dir == "" {
		return nil
	}
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
	err := removeDir(g.dir, kill)
	if g.fd >= 0 {
		unix.Close(g.fd)
		g.fd = -1
	}
	g.dir = ""
	return err
}
