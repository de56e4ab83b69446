package native

import (
	"fmt"

	"github.com/vivarium-sandbox/vivarium/internal/cgroups"
	"github.com/vivarium-sandbox/vivarium/internal/hostdisk"
	"github.com/vivarium-sandbox/vivarium/internal/hostmem"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

// A pause writes the sandbox's memory to the checkpoint directory's disk:
// up to its memory limit per sandbox, and every tenant may pause as many
// sandboxes as it may keep. Without a bound, paused sandboxes would fill
// the host's disk, which the host and every other tenant draw on. A pause
// is refused while the disk would keep less than its reserve
// (internal/hostdisk) free once the images are written, their size taken
// as the sandbox's memory now.
func checkpointRoom(dir string, memory int64) error {
	return hostdisk.Fits(dir, memory, "saving the sandbox's memory")
}

// restoreFits refuses a pause whose resume, or a fork whose copies, would
// not fit in the sandbox's memory limit (with what its restores took over
// of a zygote's: zygotememory_linux.go), so that a paused sandbox is
// never one that cannot come back and a fork never dies halfway: a restore holds what the kernel kept for the sandbox (data queued
// in its sockets, above all) twice while it writes it back, once read
// from the images and once queued again, and the limit kills it there
// (seen with 72 of 128 MiB queued in Unix sockets).
func (s *Sandbox) restoreFits(memory int64) error {
	km, ok := s.cg.(cgroups.KernelMemory)
	limit := s.spec.Limits.Memory + s.tookOver
	if s.cg == nil || !ok || s.spec.Limits.Memory <= 0 {
		return nil
	}
	kernel, err := km.MemoryKernel()
	if err != nil || memory+kernel <= limit {
		return nil
	}
	return fmt.Errorf("%w: %d MiB of the sandbox's %d MiB are kernel buffers (data queued in its sockets), which a "+
		"resume holds twice, over its %d MiB memory limit: read or close them first, or give the sandbox more memory",
		sandbox.ErrNoRoom, kernel>>20, memory>>20, limit>>20)
}

// restoreRoom lets a restore into group g make more tasks than the
// sandbox's pids limit while it runs, and undo sets the limit back: CRIU
// makes helper tasks beside the restored ones (for process groups and
// sessions whose leaders are gone, and zombies), and a tree near its
// limit (a fork storm) made the restore fail ("Unable to create a
// thread: -11"). The limit is raised to twice it and a few, not lifted:
// the restored processes run for the moment before undo.
func restoreRoom(g cgroups.Group, pids int64) (undo func()) {
	ps, ok := g.(cgroups.PidsSetter)
	if !ok || pids <= 0 {
		return func() {}
	}
	if ps.SetPidsMax(int(2*pids+32)) != nil {
		return func() {}
	}
	return func() { ps.SetPidsMax(int(pids)) }
}

// hostMemory reads the host's available and total memory for a fork's
// hostmem.Room; tests replace it.
var hostMemory = hostmem.Read
