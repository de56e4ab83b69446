//go:build linux

package cgroups

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// On cgroup v1 no process can be born in a group (clone3's
// CLONE_INTO_CGROUP is v2's), and moving one in by its pid (AddProc)
// write-locks the kernel's threadgroup lock, which first waits for an RCU
// grace period: 6 to 12 ms on the two-core test machine, paid by every
// sandbox that starts alone, on the path of its creation. A thread that
// moves itself (it writes "0" to a group's "tasks" file) takes no such
// lock and is moved in about 20 µs a hierarchy. So a process is started
// in its group by a thread that enters the group, creates it (the child
// is born in its creator thread's groups) and goes back:
//
//	tasks, _ := group.(cgroups.ThreadEntry).TaskFiles()
//	home, _ := manager.(cgroups.ThreadHome).ThreadTaskFiles()
//	runtime.LockOSThread()
//	cgroups.EnterThread(tasks); fork; cgroups.EnterThread(home)
//
// The thread is in the group while it is the group's only member, and
// the group is new: nothing of a sandbox can see or signal it there. Its
// few page faults in that window are charged to the group.

// ThreadEntry is a group a thread can enter by itself (cgroup v1).
type ThreadEntry interface {
	// TaskFiles opens the group's "tasks" file in each hierarchy, for
	// writing: the files EnterThread writes.
	TaskFiles() ([]*os.File, error)
}

// ThreadHome is a manager that says where a thread that entered a group
// goes back to (cgroup v1).
type ThreadHome interface {
	// ThreadTaskFiles opens, for writing, the "tasks" file of the calling
	// thread's own group in each hierarchy the manager makes groups in.
	ThreadTaskFiles() ([]*os.File, error)
}

// EnterThread moves the calling thread, and only it, into the group whose
// "tasks" files are given (ThreadEntry, ThreadHome). Its goroutine must be
// locked to it (runtime.LockOSThread), and stay so until the thread has
// gone back: a thread of the Go runtime that another goroutine took over
// would work, and create threads, in the group.
func EnterThread(tasks []int) error {
	for _, fd := range tasks {
		if _, err := unix.Write(fd, []byte("0")); err != nil {
			return fmt.Errorf("cgroups: move a thread into a group: %w", err)
		}
	}
	return nil
}

func (g *group1) TaskFiles() ([]*os.File, error) {
	return openTasks(g.dirs)
}

func (m *v1) ThreadTaskFiles() ([]*os.File, error) {
	b, err := os.ReadFile("/proc/thread-self/cgroup")
	if err != nil {
		return nil, fmt.Errorf("cgroups: %w", err)
	}
	mounts, err := readMounts("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	dirs, err := threadDirs(string(b), mounts, m.points())
	if err != nil {
		return nil, err
	}
	return openTasks(dirs)
}

// threadDirs finds, for each hierarchy mounted at one of points, the
// directory of the group procCgroup (a /proc/PID/cgroup) names in it.
func threadDirs(procCgroup string, mounts []mount, points []string) ([]string, error) {
	var dirs []string
	for _, point := range points {
		var m *mount
		for i := range mounts {
			if mounts[i].fstype == "cgroup" && mounts[i].point == point {
				m = &mounts[i]
			}
		}
		if m == nil {
			return nil, fmt.Errorf("cgroups: no cgroup mount at %s", point)
		}
		dir := ""
		for _, line := range strings.Split(strings.TrimSpace(procCgroup), "\n") {
			// hierarchy-ID:controller-list:path
			f := strings.SplitN(line, ":", 3)
			if len(f) != 3 || f[1] == "" || !sameControllers(f[1], m.options) {
				continue
			}
			if dir = groupDir(*m, f[2]); dir == "" {
				return nil, fmt.Errorf("cgroups: group %s is outside the mount at %s", f[2], point)
			}
		}
		if dir == "" {
			return nil, fmt.Errorf("cgroups: this thread's group at %s was not found", point)
		}
		dirs = append(dirs, dir)
	}
	return dirs, nil
}

// sameControllers says whether a /proc/PID/cgroup controller list names
// the controllers of a mount with these options: all of them, none other.
func sameControllers(list string, options []string) bool {
	for _, c := range strings.Split(list, ",") {
		if !slices.Contains(options, c) {
			return false
		}
	}
	return true
}

func openTasks(dirs []string) ([]*os.File, error) {
	if len(dirs) == 0 {
		return nil, fmt.Errorf("cgroups: the group was destroyed")
	}
	files := make([]*os.File, 0, len(dirs))
	for _, d := range dirs {
		f, err := os.OpenFile(filepath.Join(d, "tasks"), os.O_WRONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			for _, f := range files {
				f.Close()
			}
			return nil, fmt.Errorf("cgroups: %w", err)
		}
		files = append(files, f)
	}
	return files, nil
}

// FDs are the descriptors of files, for EnterThread.
func FDs(files []*os.File) []int {
	fds := make([]int, len(files))
	for i, f := range files {
		fds[i] = int(f.Fd())
	}
	return fds
}
