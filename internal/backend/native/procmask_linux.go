package native

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/vivarium-sandbox/vivarium/internal/rootview"
)

// A sandbox's /proc is a proc of its own PID namespace; what the rest of
// it tells of the host and of other tenants is hidden as rootview lists
// (rootview.ProcMasked, rootview.ProcSynthesised), here by binds from a
// tmpfs of the sandbox's own.

// procReadOnly are bound read-only over themselves: writing them would
// change the host kernel.
var procReadOnly = []string{"sys", "sysrq-trigger"}

// maskProc hides, in the proc mounted at proc, what reveals the host or
// other tenants, as masks say (the backend's procMasks). It runs after the
// read-only binds of procReadOnly: a bind of /proc/sys over itself would
// cover whatever was mounted below it before. In order:
//  1. write the synthesised files under scratch (a tmpfs of the sandbox's
//     own, which the pivot leaves behind);
//  2. make the scratch mount read-only, nosuid, nodev and noexec: every
//     bind of it is, too;
//  3. bind each synthesised file over the kernel's, and the scratch's
//     empty file and empty directory over the masked files and
//     directories.
func maskProc(proc, scratch string, masks []rootview.ProcMask) error {
	dir, nothing := filepath.Join(scratch, "proc"), filepath.Join(scratch, "nothing")
	if err := os.Mkdir(dir, 0o755); err != nil {
		return step("synthesised /proc files", err)
	}
	if err := os.WriteFile(nothing, nil, 0o444); err != nil {
		return step("empty file for /proc", err)
	}
	srcs := make([]string, len(masks))
	for i, m := range masks {
		switch {
		case m.Hidden && m.Dir:
			srcs[i] = filepath.Join(scratch, "empty")
		case m.Hidden:
			srcs[i] = nothing
		default:
			srcs[i] = filepath.Join(dir, strconv.Itoa(i))
			if err := os.WriteFile(srcs[i], []byte(m.Data), 0o444); err != nil {
				return step("synthesise /proc/"+m.Path, err)
			}
		}
	}
	if err := remount(scratch, unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC); err != nil {
		return step("read-only scratch tmpfs", err)
	}
	for i, m := range masks {
		dst := filepath.Join(proc, m.Path)
		if err := unix.Mount(srcs[i], dst, "", unix.MS_BIND, ""); err != nil && !(m.Hidden && err == unix.ENOENT) {
			return step("hide "+dst, err)
		}
	}
	return nil
}

// procMasks is what covers the /proc of a sandbox whose memory limit is
// memTotal (rootview.ProcMasks), with a boot id of its own. Made once per
// memory limit and set of CPUs: the host's files it is made from (their
// layout, the boot time, the controllers) do not change, and every
// number in them that does is shown as 0.
func (b *Backend) procMasks(memTotal int64) ([]rootview.ProcMask, error) {
	v, err := rootview.NewProcView(memTotal)
	if err != nil {
		return nil, err
	}
	key := fmt.Sprint(memTotal, v.CPUs)
	b.procMu.Lock()
	masks, ok := b.procCache[key]
	b.procMu.Unlock()
	if !ok {
		masks = rootview.ProcMasks("/proc", v)
		b.procMu.Lock()
		if b.procCache == nil || len(b.procCache) >= maxProcViews {
			b.procCache = map[string][]rootview.ProcMask{}
		}
		b.procCache[key] = masks
		b.procMu.Unlock()
	}
	return rootview.WithBootID(masks, v.BootID), nil
}

// maxProcViews bounds procMasks' cache: sandboxes of more memory limits
// than this at once make theirs again from time to time.
const maxProcViews = 64
