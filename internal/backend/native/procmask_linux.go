package native

import (
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
// other tenants. It runs after the read-only binds of procReadOnly: a bind
// of /proc/sys over itself would cover whatever was mounted below it
// before. In order:
//  1. write the synthesised files under scratch (a tmpfs of the sandbox's
//     own, which the pivot leaves behind), from the kernel's own files;
//  2. make the scratch mount read-only, nosuid, nodev and noexec: every
//     bind of it is, too;
//  3. bind the scratch's empty file and empty directory over the masked
//     files and directories, and each synthesised file over the kernel's.
func maskProc(proc, scratch string, v *rootview.ProcView) error {
	dir, nothing := filepath.Join(scratch, "proc"), filepath.Join(scratch, "nothing")
	if err := os.Mkdir(dir, 0o755); err != nil {
		return step("synthesised /proc files", err)
	}
	if err := os.WriteFile(nothing, nil, 0o444); err != nil {
		return step("empty file for /proc", err)
	}
	type bind struct{ src, dst string }
	var binds []bind
	for i, f := range rootview.ProcSynthesised {
		p := filepath.Join(proc, f.Path)
		host, err := os.ReadFile(p)
		if err != nil {
			continue // not in this kernel
		}
		src := filepath.Join(dir, strconv.Itoa(i))
		if err := os.WriteFile(src, []byte(f.Make(v, string(host))), 0o444); err != nil {
			return step("synthesise /proc/"+f.Path, err)
		}
		binds = append(binds, bind{src, p})
	}
	if err := remount(scratch, unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC); err != nil {
		return step("read-only scratch tmpfs", err)
	}
	for _, name := range rootview.ProcMasked {
		p := filepath.Join(proc, name)
		fi, err := os.Stat(p)
		if err != nil {
			continue
		}
		src := nothing
		if fi.IsDir() {
			src = filepath.Join(scratch, "empty")
		}
		binds = append(binds, bind{src, p})
	}
	for _, b := range binds {
		if err := unix.Mount(b.src, b.dst, "", unix.MS_BIND, ""); err != nil {
			return step("hide "+b.dst, err)
		}
	}
	return nil
}
