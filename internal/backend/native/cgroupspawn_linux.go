package native

import (
	"os"
	"sync"

	"github.com/vivarium-sandbox/vivarium/internal/cgroups"
)

// groupTasks are the "tasks" files through which a sandbox's first
// processes are born in its cgroup on cgroup v1 (cgroups.ThreadEntry):
// its init, by the spawner's thread of the server or of a zygote's init
// (threadCgroup), and a zygote's runner, which moves itself there before
// it does anything else (zygote.py). On cgroup v2, processes are born in
// their group by clone3, and there are none.
type groupTasks struct {
	files []*os.File
}

// openGroupTasks opens g's tasks files, or gives nil where g has none (v2,
// or files that cannot be opened: the processes are then moved in by pid,
// AddProc, as before).
func openGroupTasks(g cgroups.Group) *groupTasks {
	e, ok := g.(cgroups.ThreadEntry)
	if !ok || g.IntoFD() >= 0 {
		return nil
	}
	files, err := e.TaskFiles()
	if err != nil {
		return nil
	}
	return &groupTasks{files: files}
}

func (t *groupTasks) fds() []int {
	if t == nil {
		return nil
	}
	return cgroups.FDs(t.files)
}

func (t *groupTasks) close() {
	if t == nil {
		return
	}
	for _, f := range t.files {
		f.Close()
	}
	t.files = nil
}

// homeTasks are the tasks files of this process's own groups, where the
// spawner's thread goes back to after it started an init in a sandbox's
// group: opened once, from the first backend's hierarchies, and kept for
// the life of the process, as the spawner's thread is (nil where there
// are none).
func (b *Backend) homeTasks() []int {
	homeOnce.Do(func() {
		h, ok := b.cgroups.(cgroups.ThreadHome)
		if !ok || b.cgroups.Version() != 1 {
			return
		}
		if files, err := h.ThreadTaskFiles(); err == nil {
			home = &groupTasks{files: files}
		} else {
			b.log.Warn("cgroups: sandboxes' inits are moved into their groups by pid, which waits for the kernel", "err", err)
		}
	})
	return home.fds()
}

var (
	homeOnce sync.Once
	home     *groupTasks
)

// spawnGroup is what starts a process in t's group from this process's
// spawner, or nil where the process is to be moved in by pid.
func (b *Backend) spawnGroup(t *groupTasks) *threadCgroup {
	if t == nil {
		return nil
	}
	home := b.homeTasks()
	if home == nil {
		return nil
	}
	return &threadCgroup{into: t.fds(), home: home}
}
