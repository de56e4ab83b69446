//go:build linux

package cgroups

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/testutil"
)

const hybridMountinfo = `30 22 0:27 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
31 30 0:28 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct
34 30 0:31 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
38 30 0:35 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
36 30 0:33 / /sys/fs/cgroup/free\040zer rw,relatime - cgroup cgroup rw,freezer
40 30 0:37 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
`

func TestParseMountinfo(t *testing.T) {
	ms := parseMountinfo(hybridMountinfo)
	if len(ms) != 5 {
		t.Fatalf("got %d cgroup mounts, want 5: %+v", len(ms), ms)
	}
	if ms[0].point != "/sys/fs/cgroup/cpu,cpuacct" || strings.Join(ms[0].options, ",") != "rw,cpu,cpuacct" {
		t.Errorf("first mount: %+v", ms[0])
	}
	if ms[3].point != "/sys/fs/cgroup/free zer" {
		t.Errorf("escaped mount point not decoded: %q", ms[3].point)
	}
	if got := mounts2(ms); got != "/sys/fs/cgroup/unified" {
		t.Errorf("v2 mount: %q", got)
	}
}

// A hierarchy mounted again elsewhere (CRIU's cgroup yard while it dumps,
// mounted before the system's in mountinfo's order) is not the one used.
func TestSystemHierarchiesFirst(t *testing.T) {
	yard := "90 22 0:31 / /tmp/dump/.criu.cgyard.x/memory rw - cgroup cgroup rw,memory\n" +
		"91 22 0:35 / /tmp/dump/.criu.cgyard.x/pids rw - cgroup cgroup rw,pids\n" +
		"92 22 0:28 / /tmp/dump/.criu.cgyard.x/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n"
	ms := parseMountinfo(yard + hybridMountinfo)
	for _, m := range ms[:5] {
		if !strings.HasPrefix(m.point, "/sys/fs/cgroup/") {
			t.Errorf("a yard mount sorted before the system's: %+v", ms)
		}
	}
	mgr, err := detect(ms, "vivarium-test")
	if err != nil {
		t.Skipf("no v1 hierarchy description to check: %v", err)
	}
	if s := fmt.Sprint(mgr); strings.Contains(s, "cgyard") {
		t.Errorf("the manager uses the yard: %s", s)
	}
}

func TestDetectNamesWhatIsMissing(t *testing.T) {
	ms := parseMountinfo("34 30 0:31 / /x/memory rw - cgroup cgroup rw,memory\n")
	_, err := detect(ms, "vivarium-test")
	if err == nil || !strings.Contains(err.Error(), "cpuacct, pids") {
		t.Fatalf("want an error naming cpuacct and pids, got %v", err)
	}
}

// fakeV2 builds a directory that looks like a cgroup v2 root, with the
// control files a group needs, so the v2 code runs on a v1 machine too.
func fakeV2(t *testing.T) string {
	root := t.TempDir()
	write := func(p, s string) {
		if err := os.WriteFile(filepath.Join(root, p), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("cgroup.controllers", "cpuset cpu io memory hugetlb pids rdma misc\n")
	write("cgroup.subtree_control", "")
	return root
}

// The control files a group directory shows, those the package writes.
var (
	v2Files = []string{"cgroup.procs", "cgroup.subtree_control", "cgroup.kill", "memory.max", "memory.swap.max",
		"memory.oom.group", "pids.max", "cpu.max", "cpu.weight", "io.max", "io.weight"}
	v1Files = []string{"cgroup.procs", "memory.limit_in_bytes", "memory.swappiness", "pids.max", "cpu.shares",
		"cpu.cfs_period_us", "cpu.cfs_quota_us", "freezer.state", "blkio.bfq.weight", "blkio.throttle.read_bps_device",
		"blkio.throttle.write_bps_device", "blkio.throttle.read_iops_device", "blkio.throttle.write_iops_device"}
)

// fakeKernel makes group directories behave as the kernel's for the rest
// of the test: a new one holds (empty) control files, and one that holds
// groups cannot be removed (EBUSY), while its files go with it.
func fakeKernel(t *testing.T, files []string) {
	mk, rm := mkdirGroup, rmdirGroup
	t.Cleanup(func() { mkdirGroup, rmdirGroup = mk, rm })
	mkdirGroup = func(dir string) error {
		if err := os.Mkdir(dir, 0o755); err != nil {
			return err
		}
		for _, f := range files {
			if err := os.WriteFile(filepath.Join(dir, f), nil, 0o644); err != nil {
				return err
			}
		}
		return nil
	}
	rmdirGroup = func(dir string) error {
		entries, err := os.ReadDir(dir)
		if err != nil {
			return err
		}
		for _, e := range entries {
			if e.IsDir() {
				return &os.PathError{Op: "rmdir", Path: dir, Err: syscall.EBUSY}
			}
		}
		return os.RemoveAll(dir)
	}
}

func TestV2WritesLimits(t *testing.T) {
	fakeKernel(t, v2Files)
	root := fakeV2(t)
	m, err := newV2(root, "vivarium")
	if err != nil {
		t.Fatal(err)
	}
	m.devices = func() ([]Device, error) { return []Device{{Major: 254, Minor: 0, Name: "vda"}}, nil }
	if !m.CPUController() || !m.IOController() {
		t.Error("the cpu and io controllers were not enabled")
	}
	b, _ := os.ReadFile(filepath.Join(root, "cgroup.subtree_control"))
	if string(b) != "+memory +pids +cpu +io" {
		t.Errorf("root subtree_control = %q", b)
	}
	parent := filepath.Join(root, "vivarium")
	if b, _ := os.ReadFile(filepath.Join(parent, "cgroup.subtree_control")); string(b) != "+memory +pids +cpu +io" {
		t.Errorf("parent subtree_control = %q", b)
	}
	g, err := m.New("sb1", Limits{MemoryBytes: 1 << 20, Pids: 7, CPUs: 1.5, IO: IOMax{ReadBPS: 8 << 20, ReadIOPS: 500, WriteBPS: 4 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(parent, "sb1")
	for f, want := range map[string]string{"memory.max": "1048576", "memory.swap.max": "0", "memory.oom.group": "1",
		"pids.max": "7", "cpu.max": "150000 100000", "io.max": "254:0 rbps=8388608 wbps=4194304 riops=500"} {
		if b, _ := os.ReadFile(filepath.Join(dir, f)); string(b) != want {
			t.Errorf("%s = %q, want %q", f, b, want)
		}
	}
	os.WriteFile(filepath.Join(dir, "cpu.stat"), []byte("usage_usec 1500\nuser_usec 1000\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "memory.peak"), []byte("4096\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "memory.events"), []byte("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n"), 0o644)
	s, err := g.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if s.CPU != 1500*time.Microsecond || s.MemoryPeak != 4096 || s.OOMKills != 1 {
		t.Errorf("stats = %+v", s)
	}
	if err := g.Destroy(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("the group is still there: %v", err)
	}
}

func TestV2MissingController(t *testing.T) {
	root := t.TempDir()
	os.WriteFile(filepath.Join(root, "cgroup.controllers"), []byte("hugetlb\n"), 0o644)
	_, err := newV2(root, "vivarium")
	if err == nil || !strings.Contains(err.Error(), "memory, pids") {
		t.Fatalf("want an error naming memory and pids, got %v", err)
	}
}

// TestRealGroup uses the host's real hierarchy: limits hold, stats count,
// and Destroy leaves no process and no directory behind.
func TestRealGroup(t *testing.T) {
	testutil.RequireRoot(t)
	m, err := Detect("vivarium-test")
	if err != nil {
		t.Skipf("no usable cgroups: %v", err)
	}
	t.Logf("cgroup v%d", m.Version())
	g, err := m.New("real-"+strings.ReplaceAll(t.Name(), "/", "-"), Limits{MemoryBytes: 64 << 20, Pids: 16})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Destroy()

	// A process in the group forks more than the pids limit allows, then
	// burns some CPU: the forks past the limit fail.
	py := testutil.RequirePython(t)
	cmd := exec.Command(py, "-c", `
import os, sys, time
sys.stdin.read(1)
ok = 0
for i in range(40):
    try:
        if os.fork() == 0:
            time.sleep(30); os._exit(0)
        ok += 1
    except OSError:
        pass
sum(range(3000000))
print("started", ok, flush=True)
time.sleep(30)`)
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if err := g.AddProc(cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	stdin.Write([]byte("x"))
	line, err := bufio.NewReader(stdout).ReadString('\n')
	var procs int
	if _, err := fmt.Sscanf(line, "started %d", &procs); err != nil || procs >= 16 || procs < 5 {
		t.Errorf("pids limit 16: %q %v", line, err)
	}
	s, err := g.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if s.CPU <= 0 || s.MemoryPeak <= 0 {
		t.Errorf("stats did not count: %+v", s)
	}
	if err := g.Destroy(); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err == nil {
		t.Error("the shell survived Destroy")
	}
	// Nothing of the group is left in any hierarchy.
	ms, _ := readMounts("/proc/self/mountinfo")
	for _, mt := range ms {
		matches, _ := filepath.Glob(filepath.Join(mt.point, "vivarium-test", "real-*"))
		if len(matches) > 0 {
			t.Errorf("left behind: %v", matches)
		}
	}
}

func TestRealGroupOOM(t *testing.T) {
	testutil.RequireRoot(t)
	py := testutil.RequirePython(t)
	m, err := Detect("vivarium-test")
	if err != nil {
		t.Skipf("no usable cgroups: %v", err)
	}
	g, err := m.New("oom", Limits{MemoryBytes: 32 << 20, Pids: 8})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Destroy()
	cmd := exec.Command(py, "-c", "import sys; sys.stdin.read(1); b = bytearray(256 << 20); print('survived')")
	stdin, _ := cmd.StdinPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if err := g.AddProc(cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	stdin.Write([]byte("x"))
	stdin.Close()
	err = cmd.Wait()
	if err == nil {
		t.Fatal("256 MiB allocation succeeded under a 32 MiB limit")
	}
	s, err := g.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if s.OOMKills < 1 {
		t.Errorf("no OOM kill counted: %+v", s)
	}
	if s.MemoryPeak > 33<<20 {
		t.Errorf("peak %d above the limit", s.MemoryPeak)
	}
}

// A group left by a crashed process (with a live process in it) is found
// and removed by Sweep, and the process is killed.
func TestSweepRemovesLeftovers(t *testing.T) {
	testutil.RequireRoot(t)
	m, err := Detect("vivarium-sweep-test")
	if err != nil {
		t.Skipf("no usable cgroups: %v", err)
	}
	g, err := m.New("left-behind", Limits{Pids: 8})
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if err := g.AddProc(cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	names, err := m.Sweep()
	if err != nil {
		t.Fatal(err)
	}
	if len(names) != 1 || names[0] != "left-behind" {
		t.Errorf("swept %v", names)
	}
	if err := cmd.Wait(); err == nil {
		t.Error("the process in the group survived the sweep")
	}
	ms, _ := readMounts("/proc/self/mountinfo")
	for _, mt := range ms {
		if matches, _ := filepath.Glob(filepath.Join(mt.point, "vivarium-sweep-test", "*")); len(matches) > 0 {
			for _, p := range matches {
				if fi, err := os.Stat(p); err == nil && fi.IsDir() {
					t.Errorf("left behind: %s", p)
				}
			}
		}
	}
}

// A CPU cap holds a process that would use every core to about its share.
func TestRealGroupCPUCap(t *testing.T) {
	testutil.RequireRoot(t)
	py := testutil.RequirePython(t)
	m, err := Detect("vivarium-test")
	if err != nil {
		t.Skipf("no usable cgroups: %v", err)
	}
	if !m.CPUController() {
		t.Skip("no cpu controller on this host")
	}
	g, err := m.New("cpucap", Limits{CPUs: 0.2})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Destroy()
	cmd := exec.Command(py, "-c", "import sys, time\nsys.stdin.read(1)\nend = time.time() + 1\nwhile time.time() < end: pass")
	stdin, _ := cmd.StdinPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if err := g.AddProc(cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	stdin.Write([]byte("x"))
	stdin.Close()
	cmd.Wait()
	s, err := g.Stats()
	if err != nil {
		t.Fatal(err)
	}
	// One second of wall clock at 0.2 cores: about 200 ms of CPU. Well
	// under the 1 s it would use uncapped.
	if s.CPU > 500*time.Millisecond {
		t.Errorf("used %v of CPU in 1 s under a 0.2-core cap", s.CPU)
	}
}

// TestKillListed: a pid listed once, then gone from the list by the time it
// is pinned, is someone else's now (recycled) and must survive; a pid
// still listed is killed.
func TestKillListed(t *testing.T) {
	start := func() *exec.Cmd {
		cmd := exec.Command("sleep", "60")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		return cmd
	}
	alive := func(cmd *exec.Cmd) bool { return cmd.Process.Signal(syscall.Signal(0)) == nil }

	bystander := start()
	reads := 0
	n, err := killListed(func() ([]int, error) {
		reads++
		if reads == 1 {
			return []int{bystander.Process.Pid}, nil
		}
		return nil, nil // it left the group (and its pid went to a bystander)
	})
	if err != nil || n != 0 {
		t.Fatalf("killListed = %d, %v; want 0 kills", n, err)
	}
	if !alive(bystander) {
		t.Fatal("a process no longer listed at the second read was killed")
	}

	// This process is never killed, even listed (a thread of it is in a
	// new group while it starts the group's first process).
	if n, err := killListed(func() ([]int, error) { return []int{os.Getpid()}, nil }); err != nil || n != 0 {
		t.Fatalf("killListed of this process = %d, %v; want 0 kills", n, err)
	}

	member := start()
	n, err = killListed(func() ([]int, error) { return []int{member.Process.Pid, 1 << 30}, nil })
	if err != nil || n != 1 {
		t.Fatalf("killListed = %d, %v; want 1 kill", n, err)
	}
	if err := member.Wait(); err == nil || member.ProcessState.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("listed process: %v, want killed by SIGKILL", err)
	}
}

// Control files are read without os.ReadFile while they fit in
// smallFile, and whole when they do not: a key past the first smallFile
// bytes is found, and a file that is not there is os.ErrNotExist.
func TestReadSmallAndLargeControlFiles(t *testing.T) {
	dir := t.TempDir()
	var long strings.Builder
	for i := 0; long.Len() <= 2*smallFile; i++ {
		fmt.Fprintf(&long, "filler_%d %d\n", i, i)
	}
	long.WriteString("oom_kill 7\n")
	for name, body := range map[string]string{"memory.events": long.String(), "memory.peak": "4096\n", "memory.max": "max\n"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := readKeyed(dir, "memory.events", "oom_kill"); err != nil || n != 7 {
		t.Errorf("readKeyed of a %d-byte file: %d, %v; want 7", long.Len(), n, err)
	}
	if n, err := readInt(dir, "memory.peak"); err != nil || n != 4096 {
		t.Errorf("readInt: %d, %v; want 4096", n, err)
	}
	if n, err := readInt(dir, "memory.max"); err != nil || n != -1 {
		t.Errorf("readInt of max: %d, %v; want -1", n, err)
	}
	if _, err := readInt(dir, "memory.current"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("readInt of a missing file: %v, want os.ErrNotExist", err)
	}
}
