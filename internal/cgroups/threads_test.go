//go:build linux

package cgroups

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/vivarium-sandbox/vivarium/internal/testutil"
)

// A thread's groups are found under each hierarchy's mount, whose root
// may itself be a group (a container's view without a cgroup namespace).
func TestThreadDirs(t *testing.T) {
	mounts := parseMountinfo(hybridMountinfo +
		"41 30 0:39 /outer /sys/fs/cgroup/blkio rw,relatime - cgroup cgroup rw,blkio\n")
	proc := "9:blkio:/outer/inner\n8:pids:/a/b\n4:memory:/\n3:cpu,cpuacct:/c\n1:name=systemd:/x\n0::/unified\n"
	got, err := threadDirs(proc, mounts, []string{"/sys/fs/cgroup/memory", "/sys/fs/cgroup/pids", "/sys/fs/cgroup/cpu,cpuacct", "/sys/fs/cgroup/blkio"})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"/sys/fs/cgroup/memory", "/sys/fs/cgroup/pids/a/b", "/sys/fs/cgroup/cpu,cpuacct/c", "/sys/fs/cgroup/blkio/inner"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("threadDirs = %v, want %v", got, want)
	}
	// A group outside the mount's root, or a hierarchy the thread is not
	// listed in, is an error, not a guess.
	if _, err := threadDirs("9:blkio:/elsewhere\n", mounts, []string{"/sys/fs/cgroup/blkio"}); err == nil {
		t.Error("a group outside the mount's root was accepted")
	}
	if _, err := threadDirs("8:pids:/\n", mounts, []string{"/sys/fs/cgroup/memory"}); err == nil {
		t.Error("a hierarchy the thread is not listed in was accepted")
	}
}

// On cgroup v1, a thread that enters a group and starts a process there
// gives the group its process, in every hierarchy, and comes back home;
// the rest of this process never left.
func TestEnterThreadStartsAProcessInTheGroup(t *testing.T) {
	testutil.RequireRoot(t)
	m, err := Detect("vivarium-test")
	if err != nil {
		t.Skipf("no usable cgroups: %v", err)
	}
	if m.Version() != 1 {
		t.Skip("cgroup v2: processes are born in their group by clone3")
	}
	g, err := m.New("thread-"+strings.ReplaceAll(t.Name(), "/", "-"), Limits{MemoryBytes: 64 << 20, Pids: 16})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Destroy()
	into, err := g.(ThreadEntry).TaskFiles()
	if err != nil {
		t.Fatal(err)
	}
	defer closeFiles(into)

	before, _ := os.ReadFile("/proc/self/cgroup")
	cmd := exec.Command("sleep", "30")
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		home, err := m.(ThreadHome).ThreadTaskFiles()
		if err != nil {
			done <- err
			return
		}
		defer closeFiles(home)
		if err := EnterThread(FDs(into)); err != nil {
			done <- err
			return
		}
		startErr := cmd.Start()
		if err := EnterThread(FDs(home)); err != nil {
			panic(err) // this thread is in the test's group
		}
		self, _ := os.ReadFile("/proc/thread-self/cgroup")
		if string(self) != string(before) {
			t.Errorf("the thread did not come back: %s, was %s", self, before)
		}
		done <- startErr
	}()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()

	procs, err := g.Procs()
	if err != nil || len(procs) != 1 || procs[0] != cmd.Process.Pid {
		t.Fatalf("group's processes %v (%v), want the child %d alone", procs, err, cmd.Process.Pid)
	}
	child, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(cmd.Process.Pid), "cgroup"))
	for _, line := range strings.Split(strings.TrimSpace(string(child)), "\n") {
		f := strings.SplitN(line, ":", 3)
		for _, c := range []string{"memory", "pids", "cpuacct", "freezer"} {
			if len(f) == 3 && sameControllers(c, strings.Split(f[1], ",")) && !strings.HasSuffix(f[2], g.Path()) {
				t.Errorf("the child's %s group is %s, want %s", f[1], f[2], g.Path())
			}
		}
	}
	for _, d := range g.(*group1).dirs {
		b, _ := os.ReadFile(filepath.Join(d, "tasks"))
		if strings.TrimSpace(string(b)) != strconv.Itoa(cmd.Process.Pid) {
			t.Errorf("%s/tasks = %q, want the child's thread alone", d, b)
		}
	}
	// Destroy kills the child, and never this process, even if listed.
	if err := g.Destroy(); err != nil {
		t.Fatal(err)
	}
}

func closeFiles(files []*os.File) {
	for _, f := range files {
		f.Close()
	}
}
