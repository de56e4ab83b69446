//go:build linux

package cgroups

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vivarium-sandbox/vivarium/internal/testutil"
)

// fakeV1 builds a directory per v1 hierarchy (cpu and cpuacct apart, as
// on this project's CI host) and a manager over them.
func fakeV1(t *testing.T, controllers ...string) (*v1, string) {
	root := t.TempDir()
	var ms []mount
	for _, c := range controllers {
		p := filepath.Join(root, c)
		if err := os.Mkdir(p, 0o755); err != nil {
			t.Fatal(err)
		}
		ms = append(ms, mount{root: "/", point: p, fstype: "cgroup", options: []string{"rw", c}})
	}
	m, err := newV1(ms, "vivarium")
	if err != nil {
		t.Fatal(err)
	}
	m.devices = func() ([]Device, error) { return []Device{{Major: 254, Minor: 0, Name: "vda"}}, nil }
	return m, root
}

func readString(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Error(err)
	}
	return string(b)
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// On v1, a tenant's sandboxes are groups in the tenant's group in every
// hierarchy; the tenant's group has its CPU share and I/O weight, each
// sandbox its I/O throttle; the tenant's group goes with its last sandbox.
func TestV1TenantTree(t *testing.T) {
	fakeKernel(t, v1Files)
	m, root := fakeV1(t, "cpu", "cpuacct", "memory", "pids", "freezer", "blkio")
	io := IOMax{ReadBPS: 8 << 20, ReadIOPS: 500, WriteIOPS: 100}
	a1, err := m.New("sb1", Limits{Tenant: "key_a", Pids: 9, IO: io})
	if err != nil {
		t.Fatal(err)
	}
	a2, err := m.New("sb2", Limits{Tenant: "key_a", IO: io})
	if err != nil {
		t.Fatal(err)
	}
	b1, err := m.New("sb3", Limits{Tenant: "key_b"})
	if err != nil {
		t.Fatal(err)
	}
	alone, err := m.New("sb4", Limits{})
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range []string{"cpu", "cpuacct", "memory", "pids", "freezer", "blkio"} {
		for _, rel := range []string{"key_a/sb1", "key_a/sb2", "key_b/sb3", "sb4"} {
			if !exists(filepath.Join(root, h, "vivarium", rel)) {
				t.Errorf("%s/%s missing", h, rel)
			}
		}
	}
	p := func(parts ...string) string { return filepath.Join(append([]string{root}, parts...)...) }
	for path, want := range map[string]string{
		p("cpu", "vivarium", "key_a", "cpu.shares"):                                "1024",
		p("blkio", "vivarium", "key_a", "blkio.bfq.weight"):                        "100",
		p("cpu", "vivarium", "key_b", "cpu.shares"):                                "1024",
		p("pids", "vivarium", "key_a", "sb1", "pids.max"):                          "9",
		p("blkio", "vivarium", "key_a", "sb1", "blkio.throttle.read_bps_device"):   "254:0 8388608",
		p("blkio", "vivarium", "key_a", "sb1", "blkio.throttle.read_iops_device"):  "254:0 500",
		p("blkio", "vivarium", "key_a", "sb1", "blkio.throttle.write_iops_device"): "254:0 100",
		p("blkio", "vivarium", "key_a", "sb1", "blkio.throttle.write_bps_device"):  "",
		p("blkio", "vivarium", "key_b", "sb3", "blkio.throttle.read_bps_device"):   "",
	} {
		if got := readString(t, path); got != want {
			t.Errorf("%s = %q, want %q", strings.TrimPrefix(path, root), got, want)
		}
	}
	if a1.Path() != "/vivarium/key_a/sb1" || alone.Path() != "/vivarium/sb4" {
		t.Errorf("paths %q and %q", a1.Path(), alone.Path())
	}
	if err := a1.Destroy(); err != nil {
		t.Fatal(err)
	}
	if !exists(p("memory", "vivarium", "key_a")) || exists(p("memory", "vivarium", "key_a", "sb1")) {
		t.Error("after its first sandbox: the tenant's group must stay, the sandbox's go")
	}
	if err := a1.Destroy(); err != nil {
		t.Fatal(err)
	}
	if err := a2.Destroy(); err != nil {
		t.Fatal(err)
	}
	for _, h := range []string{"cpu", "cpuacct", "memory", "pids", "freezer", "blkio"} {
		if exists(p(h, "vivarium", "key_a")) {
			t.Errorf("%s: the tenant's group outlived its last sandbox", h)
		}
		if !exists(p(h, "vivarium", "key_b", "sb3")) {
			t.Errorf("%s: another tenant's group went with it", h)
		}
	}
	b1.Destroy()
	alone.Destroy()
	for _, h := range []string{"cpu", "blkio"} {
		if entries, _ := os.ReadDir(p(h, "vivarium")); slices.ContainsFunc(entries, func(e os.DirEntry) bool { return e.IsDir() }) {
			t.Errorf("%s: groups left: %v", h, entries)
		}
	}
}

func TestV2TenantTree(t *testing.T) {
	fakeKernel(t, v2Files)
	root := fakeV2(t)
	m, err := newV2(root, "vivarium")
	if err != nil {
		t.Fatal(err)
	}
	m.devices = func() ([]Device, error) { return []Device{{Major: 254, Minor: 0, Name: "vda"}}, nil }
	a1, err := m.New("sb1", Limits{Tenant: "key_a", IO: IOMax{ReadBPS: 1 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	a2, err := m.New("sb2", Limits{Tenant: "key_a"})
	if err != nil {
		t.Fatal(err)
	}
	tenant := filepath.Join(root, "vivarium", "key_a")
	for path, want := range map[string]string{
		filepath.Join(tenant, "cgroup.subtree_control"): "+memory +pids +cpu +io",
		filepath.Join(tenant, "cpu.weight"):             "100",
		filepath.Join(tenant, "io.weight"):              "default 100",
		filepath.Join(tenant, "sb1", "io.max"):          "254:0 rbps=1048576",
		filepath.Join(tenant, "sb2", "io.max"):          "",
	} {
		if got := readString(t, path); got != want {
			t.Errorf("%s = %q, want %q", strings.TrimPrefix(path, root), got, want)
		}
	}
	if a1.Path() != "/vivarium/key_a/sb1" {
		t.Errorf("path %q", a1.Path())
	}
	if fd := a1.IntoFD(); fd < 0 {
		t.Error("no descriptor for CLONE_INTO_CGROUP")
	}
	a1.Destroy()
	if !exists(tenant) {
		t.Fatal("the tenant's group went with its first sandbox")
	}
	a2.Destroy()
	if exists(tenant) {
		t.Error("the tenant's group outlived its last sandbox")
	}
}

// A tenant's name goes into a path: only an id's characters.
func TestTenantNames(t *testing.T) {
	fakeKernel(t, v2Files)
	m, err := newV2(fakeV2(t), "vivarium")
	if err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"..", ".", "a/b", "key a", "viv_secret\n", strings.Repeat("k", 65), "é"} {
		if g, err := m.New("sb", Limits{Tenant: bad}); err == nil {
			g.Destroy()
			t.Errorf("tenant %q accepted", bad)
		}
	}
	entries, _ := os.ReadDir(filepath.Join(m.root, "vivarium"))
	for _, e := range entries {
		if e.IsDir() {
			t.Errorf("a refused tenant left %s", e.Name())
		}
	}
	g, err := m.New("sb", Limits{Tenant: "key_0123abcdef-X"})
	if err != nil {
		t.Fatal(err)
	}
	g.Destroy()
}

// A group that asks for an I/O limit on a hierarchy without the I/O
// controller is refused with the controller's name and the option that
// accepts no limit; one that asks for none is made.
func TestIOLimitNeedsController(t *testing.T) {
	fakeKernel(t, v1Files)
	m, _ := fakeV1(t, "cpu", "cpuacct", "memory", "pids")
	_, err := m.New("sb", Limits{IO: IOMax{ReadBPS: 1 << 20}})
	if err == nil || !strings.Contains(err.Error(), "blkio") || !strings.Contains(err.Error(), "--insecure-no-io-limit") {
		t.Errorf("want an error naming blkio and --insecure-no-io-limit, got %v", err)
	}
	if m.IOController() {
		t.Error("IOController without blkio")
	}
	g, err := m.New("sb", Limits{Pids: 4})
	if err != nil {
		t.Fatal(err)
	}
	g.Destroy()

	fakeKernel(t, v2Files)
	root := t.TempDir()
	os.WriteFile(filepath.Join(root, "cgroup.controllers"), []byte("cpu memory pids\n"), 0o644)
	os.WriteFile(filepath.Join(root, "cgroup.subtree_control"), nil, 0o644)
	m2, err := newV2(root, "vivarium")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m2.New("sb", Limits{IO: IOMax{WriteIOPS: 10}}); err == nil || !strings.Contains(err.Error(), "io cgroup controller") {
		t.Errorf("want an error naming the io controller, got %v", err)
	}
}

// Sweep finds the groups a crashed process left at every depth, tenants'
// groups and their sandboxes', and removes children first.
func TestSweepNested(t *testing.T) {
	fakeKernel(t, v1Files)
	m, root := fakeV1(t, "cpu", "cpuacct", "memory", "pids", "freezer", "blkio", "cpuset")
	for _, g := range []struct{ name, tenant string }{{"sb1", "key_a"}, {"sb2", "key_a"}, {"sb3", ""}} {
		if _, err := m.New(g.name, Limits{Tenant: g.tenant}); err != nil {
			t.Fatal(err)
		}
	}
	// A hierarchy the manager makes no groups in, where a runtime made
	// one of the sandboxes' (runsc does, given the group's path).
	if err := os.MkdirAll(filepath.Join(root, "cpuset", "vivarium", "key_a", "sb1"), 0o755); err != nil {
		t.Fatal(err)
	}
	names, err := m.Sweep()
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(names)
	if want := []string{"key_a", "key_a/sb1", "key_a/sb2", "sb3"}; !slices.Equal(names, want) {
		t.Errorf("swept %v, want %v", names, want)
	}
	for _, h := range []string{"cpu", "memory", "blkio", "cpuset"} {
		entries, _ := os.ReadDir(filepath.Join(root, h, "vivarium"))
		for _, e := range entries {
			if e.IsDir() {
				t.Errorf("%s: %s left", h, e.Name())
			}
		}
	}
	// The registry still counts the groups the "crash" left: forget them.
	tenants.mu.Lock()
	delete(tenants.n, filepath.Join(m.points()[0], "vivarium", "key_a"))
	tenants.mu.Unlock()
}

// The host's real hierarchy: a tenant's group is made in every hierarchy
// with its weights, its sandboxes' groups in it, and it goes with the
// last of them.
func TestRealTenantGroups(t *testing.T) {
	testutil.RequireRoot(t)
	m, err := Detect("vivarium-test")
	if err != nil {
		t.Skipf("no usable cgroups: %v", err)
	}
	tenant := fmt.Sprintf("key_test%d", os.Getpid())
	var groups []Group
	for i := range 2 {
		g, err := m.New(fmt.Sprintf("tenant-%d", i), Limits{Tenant: tenant, Pids: 8})
		if err != nil {
			t.Fatal(err)
		}
		defer g.Destroy()
		groups = append(groups, g)
	}
	var dirs []string // the tenant's group in each hierarchy
	switch mm := m.(type) {
	case *v1:
		for _, p := range mm.points() {
			dirs = append(dirs, filepath.Join(p, "vivarium-test", tenant))
		}
		if mm.cpu != "" {
			if got := strings.TrimSpace(readString(t, filepath.Join(mm.cpu, "vivarium-test", tenant, "cpu.shares"))); got != "1024" {
				t.Errorf("tenant cpu.shares = %q", got)
			}
		}
		if w := filepath.Join(mm.blkio, "vivarium-test", tenant, "blkio.bfq.weight"); mm.blkio != "" && exists(w) {
			if got := strings.TrimSpace(readString(t, w)); got != "100" && got != "default 100" {
				t.Errorf("tenant blkio.bfq.weight = %q", got)
			}
		}
	case *v2:
		dirs = append(dirs, filepath.Join(mm.root, "vivarium-test", tenant))
		if mm.CPUController() {
			if got := strings.TrimSpace(readString(t, filepath.Join(dirs[0], "cpu.weight"))); got != "100" {
				t.Errorf("tenant cpu.weight = %q", got)
			}
		}
	}
	for _, d := range dirs {
		for i := range groups {
			if !exists(filepath.Join(d, fmt.Sprintf("tenant-%d", i), "cgroup.procs")) {
				t.Errorf("%s holds no group tenant-%d", d, i)
			}
		}
	}
	groups[0].Destroy()
	for _, d := range dirs {
		if !exists(d) {
			t.Errorf("%s went with the tenant's first group", d)
		}
	}
	groups[1].Destroy()
	for _, d := range dirs {
		if exists(d) {
			t.Errorf("%s outlived the tenant's last group", d)
		}
	}
}

// Equal weights per tenant, for real: on one CPU, a tenant with one busy
// process beside a tenant with four busy sandboxes gets about half the
// CPU, not a fifth (what it gets when every sandbox is a group of the
// same parent). The check is on shares of CPU time, which the scheduler
// keeps between sibling groups however loaded the machine is otherwise.
func TestRealTenantShare(t *testing.T) {
	testutil.RequireRoot(t)
	py := testutil.RequirePython(t)
	m, err := Detect("vivarium-test")
	if err != nil {
		t.Skipf("no usable cgroups: %v", err)
	}
	if !m.CPUController() {
		t.Skip("no cpu controller: no CPU shares")
	}
	var cpus unix.CPUSet
	if err := unix.SchedGetaffinity(0, &cpus); err != nil {
		t.Fatal(err)
	}
	cpu := -1
	for i := range 1024 {
		if cpus.IsSet(i) {
			cpu = i
		}
	}
	spin := fmt.Sprintf(`
import os, sys, time
sys.stdin.read(1)
os.sched_setaffinity(0, {%d})
end = time.monotonic() + 2
while time.monotonic() < end:
    pass`, cpu)
	type member struct {
		g     Group
		cmd   *exec.Cmd
		stdin io.WriteCloser
	}
	start := func(name, tenant string) member {
		g, err := m.New(name, Limits{Tenant: tenant, Pids: 4})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { g.Destroy() })
		cmd := exec.Command(py, "-c", spin)
		stdin, _ := cmd.StdinPipe()
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		if err := g.AddProc(cmd.Process.Pid); err != nil {
			t.Fatal(err)
		}
		return member{g, cmd, stdin}
	}
	id := os.Getpid()
	quiet := start("share-quiet", fmt.Sprintf("key_quiet%d", id))
	var busy []member
	for i := range 4 {
		busy = append(busy, start(fmt.Sprintf("share-busy%d", i), fmt.Sprintf("key_busy%d", id)))
	}
	all := append([]member{quiet}, busy...)
	for _, p := range all {
		p.stdin.Write([]byte("x"))
	}
	for _, p := range all {
		p.cmd.Wait()
	}
	cpuOf := func(p member) time.Duration {
		s, err := p.g.Stats()
		if err != nil {
			t.Fatal(err)
		}
		return s.CPU
	}
	q := cpuOf(quiet)
	var b time.Duration
	for _, p := range busy {
		b += cpuOf(p)
	}
	share := float64(q) / float64(q+b)
	t.Logf("on CPU %d: the quiet tenant used %v, the busy tenant's 4 sandboxes %v: a share of %.2f (equal weights: 0.50; one per sandbox: 0.20)",
		cpu, q.Round(time.Millisecond), b.Round(time.Millisecond), share)
	if share < 0.35 {
		t.Errorf("the quiet tenant got %.2f of the CPU beside a tenant of 4 busy sandboxes, want about 0.5", share)
	}
}

// On v1 the ceilings are the parent's and each tenant's memory limit,
// with memory+swap and socket buffers at the same bound; zero writes no
// bound, over what an earlier process set. A parent without hierarchical
// accounting gets it, and one that cannot have it refuses ceilings.
func TestV1Ceilings(t *testing.T) {
	memFiles := []string{"memory.memsw.limit_in_bytes", "memory.kmem.tcp.limit_in_bytes", "memory.use_hierarchy"}
	fakeKernel(t, append(slices.Clone(v1Files), memFiles...))
	m, root := fakeV1(t, "cpu", "cpuacct", "memory", "pids")
	parent := filepath.Join(root, "memory", "vivarium")
	for _, f := range append(memFiles, "memory.limit_in_bytes") {
		os.WriteFile(filepath.Join(parent, f), nil, 0o644) // the kernel's files, which MkdirAll does not make
	}
	if err := m.SetCeilings(Ceilings{Total: 20 << 30, Tenant: 384 << 20}); err != nil {
		t.Fatal(err)
	}
	a, err := m.New("sb1", Limits{Tenant: "key_a", MemoryBytes: 128 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Destroy()
	b, err := m.New("sb2", Limits{Tenant: "key_b"})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Destroy()
	want := map[string]string{"memory.use_hierarchy": "1"}
	for _, f := range []string{"memory.limit_in_bytes", "memory.memsw.limit_in_bytes", "memory.kmem.tcp.limit_in_bytes"} {
		want[f] = "21474836480"
		want["key_a/"+f] = "402653184"
		want["key_b/"+f] = "402653184"
		want["key_a/sb1/"+f] = "134217728"
		want["key_b/sb2/"+f] = ""
	}
	for rel, v := range want {
		if got := readString(t, filepath.Join(parent, rel)); got != v {
			t.Errorf("memory/vivarium/%s = %q, want %q", rel, got, v)
		}
	}
	if err := m.SetCeilings(Ceilings{}); err != nil {
		t.Fatal(err)
	}
	if got := readString(t, filepath.Join(parent, "memory.limit_in_bytes")); got != "-1" {
		t.Errorf("no ceiling wrote %q, want -1", got)
	}
	// A tenant's group made now has no bound (one left with a bound gets
	// none either).
	os.WriteFile(filepath.Join(parent, "memory.use_hierarchy"), []byte("0"), 0o644)
	c, err := m.New("sb3", Limits{Tenant: "key_c"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Destroy()
	if got := readString(t, filepath.Join(parent, "key_c", "memory.limit_in_bytes")); got != "-1" {
		t.Errorf("a tenant's group without a ceiling: %q, want -1", got)
	}
	if got := readString(t, filepath.Join(parent, "memory.use_hierarchy")); got != "0" {
		t.Error("no ceiling asked for, yet hierarchical accounting was changed")
	}
	if err := m.SetCeilings(Ceilings{Tenant: 1 << 30}); err != nil {
		t.Fatal(err)
	}
	if got := readString(t, filepath.Join(parent, "memory.use_hierarchy")); got != "1" {
		t.Errorf("a ceiling without hierarchical accounting: use_hierarchy %q, want it turned on", got)
	}
	// Where it cannot be turned on, no ceiling is pretended.
	os.Remove(filepath.Join(parent, "memory.use_hierarchy"))
	os.Mkdir(filepath.Join(parent, "memory.use_hierarchy"), 0o755)
	if err := m.SetCeilings(Ceilings{Total: 1 << 30}); err == nil || !strings.Contains(err.Error(), "use_hierarchy") {
		t.Errorf("want an error naming memory.use_hierarchy, got %v", err)
	}
}

// On v2 the ceilings are the parent's and each tenant's memory.max; a
// tenant's group is no OOM group (one sandbox dies at its ceiling, not
// all of the tenant's).
func TestV2Ceilings(t *testing.T) {
	fakeKernel(t, append(slices.Clone(v2Files), "memory.current"))
	root := fakeV2(t)
	m, err := newV2(root, "vivarium")
	if err != nil {
		t.Fatal(err)
	}
	if err := m.SetCeilings(Ceilings{Total: 20 << 30, Tenant: 384 << 20}); err != nil {
		t.Fatal(err)
	}
	a, err := m.New("sb1", Limits{Tenant: "key_a", MemoryBytes: 128 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Destroy()
	parent := filepath.Join(root, "vivarium")
	for rel, want := range map[string]string{
		"memory.max":                 "21474836480",
		"key_a/memory.max":           "402653184",
		"key_a/memory.oom.group":     "",
		"key_a/sb1/memory.max":       "134217728",
		"key_a/sb1/memory.oom.group": "1",
	} {
		if got := readString(t, filepath.Join(parent, rel)); got != want {
			t.Errorf("vivarium/%s = %q, want %q", rel, got, want)
		}
	}
	os.WriteFile(filepath.Join(parent, "key_a", "memory.current"), []byte("12345\n"), 0o644)
	if n, err := m.TenantMemory("key_a"); err != nil || n != 12345 {
		t.Errorf("TenantMemory = %d, %v", n, err)
	}
	if err := m.SetCeilings(Ceilings{}); err != nil {
		t.Fatal(err)
	}
	b, err := m.New("sb2", Limits{Tenant: "key_b"})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Destroy()
	for _, rel := range []string{"memory.max", "key_b/memory.max"} {
		if got := readString(t, filepath.Join(parent, rel)); got != "max" {
			t.Errorf("no ceiling: vivarium/%s = %q, want max", rel, got)
		}
	}
}

// A chain of groups, each filling a memfd and handing it to a holder in
// another group before it ends (what two sandboxes of a key do over a
// Unix socket on a volume both mount), leaves its pages charged to its
// ended group, outside every live group's limit. Under a ceiling the
// tenant's group (or, without tenants, the parent) stays within it: the
// kernel OOM-kills a process of the subtree once it is reached.
func TestRealCeilingBoundsEndedGroups(t *testing.T) {
	testutil.RequireRoot(t)
	py := testutil.RequirePython(t)
	const parent, ceiling, fill = "vivarium-ceiling-test", 96 << 20, 32 << 20
	m, err := Detect(parent)
	if err != nil {
		t.Skipf("no usable cgroups: %v", err)
	}
	for _, c := range []struct {
		name, tenant string
		ceilings     Ceilings
	}{
		{"tenant", fmt.Sprintf("key_ceiling%d", os.Getpid()), Ceilings{Tenant: ceiling}},
		{"total", "", Ceilings{Total: ceiling}},
	} {
		t.Run(c.name, func(t *testing.T) {
			if err := m.SetCeilings(c.ceilings); err != nil {
				t.Fatal(err)
			}
			defer m.SetCeilings(Ceilings{})
			usage := func() int64 {
				n, err := m.TenantMemory(c.tenant)
				if err != nil {
					t.Fatal(err)
				}
				return n
			}
			fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
			if err != nil {
				t.Fatal(err)
			}
			holderEnd, senderEnd := os.NewFile(uintptr(fds[0]), "holder"), os.NewFile(uintptr(fds[1]), "sender")
			defer senderEnd.Close()
			// start runs code in a new group; the code waits for a byte on
			// stdin, sent once it is in the group.
			start := func(name, code string, sock *os.File) (Group, *exec.Cmd) {
				g, err := m.New(name, Limits{Tenant: c.tenant, MemoryBytes: 64 << 20, Pids: 8})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { g.Destroy() })
				cmd := exec.Command(py, "-c", "import sys\nsys.stdin.read(1)\n"+code)
				cmd.ExtraFiles = []*os.File{sock}
				stdin, _ := cmd.StdinPipe()
				cmd.Stderr = os.Stderr
				if err := cmd.Start(); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
				if err := g.AddProc(cmd.Process.Pid); err != nil {
					t.Fatal(err)
				}
				stdin.Write([]byte("x"))
				stdin.Close()
				return g, cmd
			}
			holder, _ := start("holder", `
import socket
s = socket.socket(fileno=3)
held = []
while True:
    msg, fds, _, _ = socket.recv_fds(s, 16, 4)
    if not msg:
        break
    held += fds
    s.send(b"k")`, holderEnd)
			holderEnd.Close()
			base := usage()
			oomKills := func(g Group) int64 {
				s, err := g.Stats()
				if err != nil {
					t.Fatal(err)
				}
				return s.OOMKills
			}
			var killed []string
			for i := range 5 {
				g, cmd := start(fmt.Sprintf("sender%d", i), fmt.Sprintf(`
import os, socket
fd = os.memfd_create("pinned")
for _ in range(%d):
    os.write(fd, b"x" * (1 << 20))
s = socket.socket(fileno=3)
socket.send_fds(s, [b"m"], [fd])
s.recv(1)`, fill>>20), senderEnd)
				err := cmd.Wait()
				if oomKills(g) > 0 {
					killed = append(killed, fmt.Sprintf("sender%d", i))
				} else if err != nil {
					t.Logf("sender%d: %v", i, err)
				}
				if err := g.Destroy(); err != nil {
					t.Fatal(err)
				}
				n := usage()
				t.Logf("after sender%d ended: %d MiB charged (%d MiB with the holder alone)", i, n>>20, base>>20)
				if n > ceiling {
					t.Fatalf("%d MiB charged with a ceiling of %d MiB", n>>20, ceiling>>20)
				}
			}
			if oomKills(holder) > 0 {
				killed = append(killed, "holder")
			}
			t.Logf("OOM-killed at the ceiling: %v", killed)
			if len(killed) == 0 {
				t.Errorf("5 memfds of %d MiB kept under a ceiling of %d MiB, and no process was killed", fill>>20, ceiling>>20)
			}
		})
	}
}
