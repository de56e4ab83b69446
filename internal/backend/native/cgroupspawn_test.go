package native

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/testutil"
)

// Every process of a sandbox is in its cgroup from its start, in every
// hierarchy, classic or forked from a zygote, one-shot or not; on cgroup
// v1 its init was born there (no move by pid), and no thread of this
// process stays in it.
func TestSandboxProcessesBornInTheirGroup(t *testing.T) {
	if testutil.ZygoteMode() {
		t.Skip("makes its own zygote")
	}
	ctx := context.Background()
	for _, zyg := range []bool{false, true} {
		b := groupTestBackend(t, zyg)
		for _, oneShot := range []bool{false, true} {
			name := map[bool]string{false: "classic", true: "zygote"}[zyg] + map[bool]string{false: "", true: " one-shot"}[oneShot]
			sb, err := b.Create(ctx, sandbox.Spec{OneShot: oneShot})
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			s := sb.(*Sandbox)
			if err := s.AwaitRunner(ctx); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			if b.cgroups.Version() == 1 && !s.init.inCgroup {
				t.Errorf("%s: init was moved into its group by pid, not born there", name)
			}
			pids, err := s.cg.Procs()
			if err != nil {
				t.Fatal(err)
			}
			runners := 0
			for _, pid := range pids {
				comm, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/comm")
				if strings.HasPrefix(string(comm), "python") {
					runners++
				}
				if pid == os.Getpid() {
					t.Errorf("%s: this process is listed in the sandbox's group", name)
				}
				inGroup(t, name, b.cgroups.Version(), pid, s.cg.Path())
				// The tasks files that put it there are nobody's now.
				fds, _ := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/fd")
				for _, fd := range fds {
					if target, _ := os.Readlink("/proc/" + strconv.Itoa(pid) + "/fd/" + fd.Name()); strings.HasPrefix(target, "/sys/fs/cgroup") {
						t.Errorf("%s: process %d holds %s", name, pid, target)
					}
				}
			}
			if runners != 1 || !contains(pids, s.init.pid) {
				t.Errorf("%s: the group holds %v: want init %d and one runner", name, pids, s.init.pid)
			}
			if res, err := s.Execute(ctx, sandbox.ExecRequest{Code: "print(6 * 7)"}, nil); err != nil || strings.TrimSpace(res.Stdout) != "42" {
				t.Errorf("%s: %+v %v", name, res, err)
			}
			if err := s.Close(); err != nil {
				t.Errorf("%s: close: %v", name, err)
			}
		}
		b.Close()
	}
	// Every thread of this process is back in its own groups.
	own, _ := os.ReadFile("/proc/self/cgroup")
	tasks, _ := os.ReadDir("/proc/self/task")
	for _, task := range tasks {
		got, _ := os.ReadFile("/proc/self/task/" + task.Name() + "/cgroup")
		if string(got) != string(own) {
			t.Errorf("thread %s is in %s, the process in %s", task.Name(), got, own)
		}
	}
}

// inGroup checks that pid is in the group at path: in the memory, pids,
// cpuacct and freezer hierarchies on cgroup v1, in the unified one on v2.
func inGroup(t *testing.T, name string, version, pid int, path string) {
	t.Helper()
	inGroupAt(t, name, version, "/proc/"+strconv.Itoa(pid), path)
}

// threadsInGroup is inGroup for each thread of pid: a thread may be in
// another group than its process's on cgroup v1.
func threadsInGroup(t *testing.T, name string, version, pid int, path string) {
	t.Helper()
	dir := "/proc/" + strconv.Itoa(pid) + "/task/"
	tasks, _ := os.ReadDir(dir)
	for _, task := range tasks {
		inGroupAt(t, fmt.Sprintf("%s, thread %s of %d", name, task.Name(), pid), version, dir+task.Name(), path)
	}
}

func inGroupAt(t *testing.T, name string, version int, proc, path string) {
	t.Helper()
	b, err := os.ReadFile(proc + "/cgroup")
	if err != nil {
		return // gone since the list was read
	}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		f := strings.SplitN(line, ":", 3)
		if len(f) != 3 {
			continue
		}
		checked := version == 2 && f[0] == "0" && f[1] == ""
		for _, c := range strings.Split(f[1], ",") {
			checked = checked || (version == 1 && (c == "memory" || c == "pids" || c == "cpuacct" || c == "freezer"))
		}
		if checked && f[2] != path {
			t.Errorf("%s: %s is in %s of %q, want %s", name, proc, f[2], f[1], path)
		}
	}
}

func contains(xs []int, x int) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

// A sandbox that starts its own interpreter loads the runner's bytecode
// the host's compiled (runner.Bytecode), where its interpreter is of that
// version, instead of compiling the runner: the file is the one init
// wrote (the interpreter runs with -B and writes none), and its magic is
// the interpreter's.
func TestRunnerStartsFromBytecode(t *testing.T) {
	b := groupTestBackend(t, false)
	sb, err := b.Create(context.Background(), sandbox.Spec{})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	testutil.RequireRunnerFromBytecode(t, sb)
}

// A spawn whose group cannot be entered fails, starts nothing, and
// leaves the spawner's thread where it was.
func TestSpawnIntoAGroupItCannotEnter(t *testing.T) {
	b := groupTestBackend(t, false)
	home := b.homeTasks()
	if home == nil {
		t.Skip("no cgroup v1 tasks files to go home through")
	}
	full, err := os.OpenFile("/dev/full", os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer full.Close()
	before, _ := os.ReadFile("/proc/self/cgroup")
	cmd := exec.Command("/bin/true")
	err = spawnFrom(cmd, 0, false, &threadCgroup{into: []int{int(full.Fd())}, home: home})
	if err == nil || cmd.Process != nil {
		t.Fatalf("a spawn into a group it could not enter: %v, process %v", err, cmd.Process)
	}
	tasks, _ := os.ReadDir("/proc/self/task")
	for _, task := range tasks {
		if got, _ := os.ReadFile("/proc/self/task/" + task.Name() + "/cgroup"); string(got) != string(before) {
			t.Errorf("thread %s is in %s, the process in %s", task.Name(), got, before)
		}
	}
}

// groupTestBackend is a backend of the tests of this file, with a zygote
// (json preloaded) or without, closed when the test ends.
func groupTestBackend(t *testing.T, zygote bool) *Backend {
	t.Helper()
	testutil.RequireRoot(t)
	b, err := New(Config{CgroupParent: pauseCgroupParent, UIDBase: pauseUIDBase, UIDRanges: 4, Zygote: zygote, Preload: []string{"json"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		b.Close()
		noGroupsLeft(t, pauseCgroupParent)
	})
	return b
}
