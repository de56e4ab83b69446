package native

import (
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/vivarium-sandbox/vivarium/internal/rootview"
)

// Init assembles the sandbox's root in its private mount namespace, over
// the host's /tmp, which is only covered there (bubblewrap does the same):
// a scratch tmpfs at scratchDir holds what the assembly needs and the
// sandbox must not see (the overlays' empty layer, the synthesised /proc
// files, the disk tmpfs before its directories are bound into place), and
// the root's own tmpfs is mounted inside it, at newRoot. The scratch tmpfs
// goes with the old root when that is detached after the pivot.
const (
	scratchDir = "/tmp"
	newRoot    = "/tmp/root"
)

// devices are the nodes of every sandbox's /dev. tty is the opener's
// controlling terminal: in a sandbox, one of its own ptys (terminal_linux.go)
// or, without one, nothing (ENXIO).
var devices = []string{"null", "zero", "full", "random", "urandom", "tty"}

// rootInodes are the inodes a sandbox's root has beyond its disk's share,
// for the root's own files.
const rootInodes = 1024

// hostDirs is where a zygote keeps the host's directories for its forked
// sandboxes to overlay (see buildRoot).
const hostDirs = ".host"

// buildRoot assembles the sandbox's root file system and pivots into it.
// Every sandbox builds its own, on a tmpfs of its own, so that nothing it
// can open, / included, is an inode of the host's or of another sandbox's
// (see overlay_linux.go). A classic sandbox and a zygote build it from the
// host's files; a sandbox forked from a zygote starts in a copy of the
// zygote's mount namespace and builds it from the zygote's root, whose
// mounts the kernel has locked (they can be covered, never changed or
// removed, but a root pivoted away from is detached whole). In order:
//  1. make every mount private, so nothing below propagates to the host;
//  2. mount the scratch tmpfs, and in it the new root: for a sandbox, its
//     disk, one size-limited tmpfs that holds whatever it writes anywhere
//     (/workspace, /tmp, /etc, /root ...); for a zygote, a small tmpfs;
//  3. mount read-only overlays of the host's /usr and, on hosts without
//     merged /usr, of /bin, /lib ... (else links into /usr); a zygote also
//     binds these host directories under /.host, the lower layers of its
//     forked sandboxes' overlays (an overlay of its overlay would stack
//     one level deeper than the kernel allows on hosts whose / is an
//     overlay already), which they leave behind with the zygote's root;
//  4. write the synthetic /etc (a forked sandbox copies the zygote's) and
//     the runner (read-only; a forked sandbox overlays the zygote's);
//  5. build /dev from bind-mounted host device nodes (a user namespace
//     cannot mknod), and a sandbox's own devpts instance at /dev/pts;
//  6. make the sandbox's directories (mountDisk: /workspace and the same
//     directory at /home/user, /tmp, /root, /dev/shm; a zygote: a /tmp of
//     its own), attach a sandbox's volumes (attachVolumes), then make /dev
//     read-only;
//  7. mount a fresh /proc and hide what reveals the host (mountProc);
//  8. pivot_root into the new root and detach the old one, and with it
//     the scratch tmpfs;
//  9. a zygote's root is made read-only; a sandbox's stays writable by
//     its owners (root of its user namespace; its user where it owns),
//     within its disk limit, so that it is a small machine of its own.
func buildRoot(cfg *initConfig) error {
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return step("make mounts private", err)
	}
	if err := unix.Mount("tmpfs", scratchDir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "size=1m,nr_inodes=64,mode=700"); err != nil {
		return step("mount scratch tmpfs", err)
	}
	empty := filepath.Join(scratchDir, "empty")
	for _, d := range []string{empty, newRoot} {
		if err := os.Mkdir(d, 0o755); err != nil {
			return step("scratch directory "+d, err)
		}
	}
	rootOpts := "size=16m,nr_inodes=8192,mode=755"
	if cfg.Role != roleZygote {
		// The root's own files (/etc, the links and mount points: some
		// 600 inodes and a megabyte) are on it too: the inodes come on
		// top of the disk's, so that its user keeps all of its share.
		rootOpts = fmt.Sprintf("size=%d,nr_inodes=%d,mode=755", cfg.DiskBytes, cfg.DiskInodes+rootInodes)
	}
	if cfg.Image {
		if err := attachRoot(newRoot); err != nil {
			return err
		}
		dirs := imageDirs
		if cfg.Build {
			dirs = buildDirs
		}
		if err := rootDirs(newRoot, dirs); err != nil {
			return step("the template's directories", err)
		}
	} else if err := unix.Mount("tmpfs", newRoot, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, rootOpts); err != nil {
		return step("mount root tmpfs", err)
	}
	r := func(p string) string { return filepath.Join(newRoot, p) }

	// The host's directories, as this init sees them.
	hostDir := func(name string) string { return "/" + name }
	top := cfg.TopLevel
	if cfg.Role == roleForked {
		hostDir = func(name string) string { return filepath.Join("/", hostDirs, name) }
		top = rootview.HostTopLevel("/") // the zygote's root has the host's layout
	}
	hostNames := append([]string{"usr"}, bindsOf(top)...)
	if cfg.Image {
		hostNames, top = nil, nil // the template's, not the host's
	}
	for _, name := range hostNames {
		if err := mountOverlay(hostDir(name), empty, r(name)); err != nil {
			return step("overlay /"+name, err)
		}
		if cfg.Role == roleZygote {
			if err := bindReadOnly("/"+name, r(filepath.Join(hostDirs, name))); err != nil {
				return step("bind /"+name+" for forked sandboxes", err)
			}
		}
	}
	if cfg.Role == roleZygote && cfg.Devices != "" {
		// A plain bind, not bindReadOnly's: nodev would make the
		// sandboxes' nodes unusable, and the kernel would lock it.
		dst := r(filepath.Join(hostDirs, "devices"))
		if err := os.MkdirAll(dst, 0o755); err != nil {
			return step("/.host/devices", err)
		}
		if err := unix.Mount(cfg.Devices, dst, "", unix.MS_BIND, ""); err != nil {
			return step("bind the device nodes' directory", err)
		}
		if err := remount(dst, unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NOEXEC); err != nil {
			return step("bind the device nodes' directory", err)
		}
		cfg.Devices = "" // the zygote's own /dev: the host's nodes
	}
	for _, t := range top {
		if t.Link != "" {
			if err := os.Symlink(t.Link, r(t.Name)); err != nil {
				return step("/"+t.Name, err)
			}
		}
	}
	if cfg.Role == roleForked {
		if cfg.Image {
			// The template's own /etc, in the sandbox's root.
			if err := imageEtc(r("etc"), cfg.UserName, cfg.home(), cfg.user().UID == SandboxUID); err != nil {
				return step("/etc of the template", err)
			}
		} else if err := etcOfZygote("/etc", r("etc"), empty); err != nil {
			// The zygote's /etc is the host's root's, whose ids the
			// sandbox's user namespace does not map: /etc and its files
			// are the sandbox's own copies, writable by its root; its
			// directories (fonts, alternatives, ssl, a JDK's ...)
			// read-only overlays of the zygote's, whose pages every
			// sandbox shares.
			return step("/etc", err)
		}
		if err := mountOverlay(runnerDir, empty, r(runnerDir)); err != nil {
			return step("overlay "+runnerDir, err)
		}
	} else {
		if cfg.Build {
			// Nothing of init's: what the step writes is the layer.
		} else if cfg.Image {
			// A template's zygote keeps the image's /etc as it is.
			if cfg.Role != roleZygote {
				if err := imageEtc(r("etc"), cfg.UserName, cfg.home(), cfg.user().UID == SandboxUID); err != nil {
					return step("/etc of the template", err)
				}
			}
			// The runner's own small file system: nothing of the
			// image's is in its directory.
			if err := unix.Mount("tmpfs", r(runnerDir), "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "size=8m,nr_inodes=1024,mode=755"); err != nil {
				return step("mount the runner's directory", err)
			}
		} else if err := rootview.WriteFiles(r("etc"), cfg.Etc); err != nil {
			return step("write /etc", err)
		}
		if cfg.Build {
			// No runner's files: its runner has no Python.
		} else if err := rootview.WriteFiles(r(runnerDir), rootview.RunnerTree(cfg.RunnerFiles)); err != nil {
			return step("write runner", err)
		}
		if cfg.Role != roleZygote && !cfg.Build {
			// The runner's files stay as written, whoever the code is.
			if err := bindReadOnly(r(runnerDir), r(runnerDir)); err != nil {
				return step("make the runner read-only", err)
			}
		}
	}
	if cfg.Role == roleZygote && cfg.Image {
		// A template's zygote: the image's own /root, /home and /var/tmp.
	} else if cfg.Role == roleZygote {
		for _, l := range []struct{ name, target string }{{"var/tmp", "../tmp"}, {"root", "workspace"}, {"home/user", "/workspace"}} {
			os.MkdirAll(filepath.Dir(r(l.name)), 0o755)
			if err := os.Symlink(l.target, r(l.name)); err != nil {
				return step("link /"+l.name, err)
			}
		}
	} else if !cfg.Image {
		if err := writeUsers(r("etc"), cfg.UserName, cfg.Home); err != nil {
			return step("write /etc/passwd", err)
		}
	}
	if err := mountDev(r("dev"), cfg.Devices); err != nil {
		return err
	}
	if cfg.Role != roleZygote {
		// The sandbox's own POSIX message queues, where programs look
		// for them; a forked runner's Landlock rules name it too, for
		// mq_open reaches them outside the root (the IPC namespace's
		// own mount of the same file system).
		if err := os.Mkdir(r("dev/mqueue"), 0o755); err != nil {
			return step("/dev/mqueue", err)
		}
		if err := unix.Mount("mqueue", r("dev/mqueue"), "mqueue", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
			return step("mount /dev/mqueue", err)
		}
		if err := mountPTS(r("dev")); err != nil {
			return err
		}
	}
	if cfg.Role == roleZygote {
		if err := mountZygoteDirs(cfg, r); err != nil {
			return err
		}
	} else if err := mountDisk(cfg, r); err != nil {
		return err
	} else if err := attachVolumes(cfg, newRoot); err != nil {
		return err
	}
	// Only the tmpfs of /dev itself becomes read-only, not /dev/shm on it.
	if err := remount(r("dev"), unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NOEXEC); err != nil {
		return step("make /dev read-only", err)
	}
	if err := mountProc(r("proc"), cfg, scratchDir); err != nil {
		return err
	}

	// pivot_root(".", ".") stacks the old root on top of the new one;
	// detaching it leaves the new root alone (runc's approach, which needs
	// no directory for the old root). The overlays and binds keep what they
	// use of the scratch tmpfs.
	if err := unix.Chdir(newRoot); err != nil {
		return step("chdir new root", err)
	}
	if err := unix.PivotRoot(".", "."); err != nil {
		return step("pivot_root", err)
	}
	if err := unix.Unmount(".", unix.MNT_DETACH); err != nil {
		return step("detach old root", err)
	}
	if err := unix.Chdir("/"); err != nil {
		return step("chdir /", err)
	}
	if cfg.Role == roleZygote {
		if err := remount("/", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV); err != nil {
			return step("make root read-only", err)
		}
	}
	return nil
}

// bindsOf lists the top-level directories that are the host's own
// directories rather than links into /usr.
func bindsOf(top []rootview.TopDir) []string {
	var out []string
	for _, t := range top {
		if t.Link == "" {
			out = append(out, t.Name)
		}
	}
	return out
}

// mountDisk makes a sandbox's directories in its root, the disk tmpfs, so
// that the disk limit bounds everything it writes: /workspace (its user's,
// also at /home/user, a bind of the same directory, so that code that
// starts there sees that path), /tmp and /dev/shm (bound from /run/shm),
// /root (root's home) and the links of /var/tmp.
func mountDisk(cfg *initConfig, r func(string) string) error {
	dirs := []struct {
		name  string
		mode  os.FileMode
		owned bool
	}{
		{"workspace", 0o755, true},
		{"home/user", 0o755, true},
		{"tmp", 0o777 | os.ModeSticky, false},
		{"run/shm", 0o777 | os.ModeSticky, false},
		{"root", 0o700, false},
		{"var", 0o755, false},
	}
	for _, d := range dirs {
		if err := os.MkdirAll(r(d.name), 0o755); err != nil {
			return step("directory /"+d.name, err)
		}
		// Changed only where it differs: a template's directory is
		// copied into the sandbox's writable layer by any change.
		var st unix.Stat_t
		if err := unix.Lstat(r(d.name), &st); err != nil {
			return step("directory /"+d.name, err)
		}
		if os.FileMode(st.Mode&0o7777) != d.mode.Perm()|sticky(d.mode) {
			if err := os.Chmod(r(d.name), d.mode); err != nil { // Mkdir's mode is masked by umask
				return step("directory /"+d.name, err)
			}
		}
		if u := cfg.user(); d.owned && (st.Uid != u.UID || st.Gid != u.GID) {
			if err := os.Chown(r(d.name), int(u.UID), int(u.GID)); err != nil {
				return step("chown /"+d.name, err)
			}
		}
	}
	if _, err := os.Lstat(r("var/tmp")); err == nil && cfg.Image || cfg.Build {
		// The template's own /var/tmp, in the sandbox's writable layer;
		// a build's step makes its own.
	} else if err := os.Symlink("../tmp", r("var/tmp")); err != nil {
		return step("link /var/tmp", err)
	}
	binds := []struct{ src, dst string }{{"workspace", "home/user"}, {"run/shm", "dev/shm"}}
	if cfg.Image {
		// A template's /home/user is the image's, with what it put
		// there (E2B's templates copy their files into it): /workspace
		// is the same directory, bound from it.
		binds[0].src, binds[0].dst = "home/user", "workspace"
	}
	for _, b := range binds {
		if err := os.MkdirAll(r(b.dst), 0o755); err != nil {
			return step("mount point /"+b.dst, err)
		}
		if err := unix.Mount(r(b.src), r(b.dst), "", unix.MS_BIND, ""); err != nil {
			return step("bind /"+b.dst, err)
		}
	}
	return nil
}

// mountZygoteDirs gives the zygote's root the directories of a sandbox's,
// and the zygote a small /tmp of its own (for caches the preloaded modules
// write at import).
func mountZygoteDirs(cfg *initConfig, r func(string) string) error {
	for _, d := range []string{"workspace", "tmp", "dev/shm"} {
		if err := os.MkdirAll(r(d), 0o755); err != nil {
			return step("mount point /"+d, err)
		}
	}
	opts := fmt.Sprintf("size=%d,nr_inodes=4096,mode=1777", cfg.DiskBytes)
	return step("mount the zygote's /tmp", unix.Mount("tmpfs", r("tmp"), "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, opts))
}

// mountForked builds the root of a sandbox forked from a zygote, in its
// own mount namespace, a copy of the zygote's: from the zygote's root, as
// buildRoot says.
func mountForked(cfg *initConfig) error { return buildRoot(cfg) }

// mountDev makes /dev a small tmpfs with the device nodes of src (the
// sandbox's own, devices_linux.go; a zygote's are the host's: it runs no
// user code) bound in, and the links to /proc/self/fd.
func mountDev(dev, src string) error {
	if src == "" {
		src = "/dev"
	}
	if err := os.MkdirAll(dev, 0o755); err != nil {
		return step("/dev", err)
	}
	if err := unix.Mount("tmpfs", dev, "tmpfs", unix.MS_NOSUID|unix.MS_NOEXEC, "size=64k,nr_inodes=64,mode=755"); err != nil {
		return step("mount /dev", err)
	}
	for _, name := range devices {
		p := filepath.Join(dev, name)
		f, err := os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o666)
		if err != nil {
			return step("/dev/"+name, err)
		}
		f.Close()
		if err := unix.Mount(filepath.Join(src, name), p, "", unix.MS_BIND, ""); err != nil {
			return step("bind /dev/"+name, err)
		}
		if err := remount(p, unix.MS_NOSUID|unix.MS_NOEXEC); err != nil {
			return step("remount /dev/"+name, err)
		}
	}
	for name, target := range map[string]string{
		"fd": "/proc/self/fd", "stdin": "/proc/self/fd/0", "stdout": "/proc/self/fd/1",
		"stderr": "/proc/self/fd/2",
	} {
		if err := os.Symlink(target, filepath.Join(dev, name)); err != nil {
			return step("/dev/"+name, err)
		}
	}
	return nil
}

// mountProc mounts a proc of this PID namespace at proc. In order:
//  1. mount it, and write the sandbox's namespace sysctls through it
//     (never the zygote's: its init lives in the host's user namespace, and
//     they would be the host's);
//  2. bind procReadOnly read-only over themselves;
//  3. hide what reveals the host or other tenants (maskProc), with the
//     synthesised files written under scratch.
//
// The zygote's own /proc stays as mounted: the kernel lets a sandbox's init
// mount a new proc only where a fully visible one exists, and the zygote
// runs no user code.
func mountProc(proc string, cfg *initConfig, scratch string) error {
	if err := os.Mkdir(proc, 0o555); err != nil && !os.IsExist(err) {
		return step("/proc", err)
	}
	if err := unix.Mount("proc", proc, "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return step("mount /proc", err)
	}
	if cfg.Role == roleZygote {
		return nil
	}
	if err := writeSysctls(proc, cfg.Sysctls); err != nil {
		return err
	}
	for _, name := range procReadOnly {
		p := filepath.Join(proc, name)
		if _, err := os.Stat(p); err != nil {
			continue
		}
		if err := bindReadOnly(p, p); err != nil {
			return step("read-only /proc/"+name, err)
		}
	}
	return maskProc(proc, scratch, cfg.Proc)
}

// bindReadOnly bind-mounts src (not its submounts) at dst, read-only,
// nosuid and nodev, creating dst.
func bindReadOnly(src, dst string) error {
	if src != dst {
		fi, err := os.Stat(src)
		if err != nil {
			return err
		}
		if fi.IsDir() {
			err = os.MkdirAll(dst, 0o755)
		} else {
			err = os.WriteFile(dst, nil, 0o644)
		}
		if err != nil {
			return err
		}
	}
	if err := unix.Mount(src, dst, "", unix.MS_BIND, ""); err != nil {
		return err
	}
	return remount(dst, unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV)
}

// remount changes the flags of the bind mount at p, keeping the flags the
// kernel locked when the mount came from a more privileged namespace
// (dropping one of those fails with EPERM).
func remount(p string, flags uintptr) error {
	var st unix.Statfs_t
	if err := unix.Statfs(p, &st); err != nil {
		return err
	}
	locked := map[int64]uintptr{
		unix.ST_RDONLY: unix.MS_RDONLY, unix.ST_NOSUID: unix.MS_NOSUID, unix.ST_NODEV: unix.MS_NODEV,
		unix.ST_NOEXEC: unix.MS_NOEXEC, unix.ST_NOATIME: unix.MS_NOATIME,
		unix.ST_NODIRATIME: unix.MS_NODIRATIME, unix.ST_RELATIME: unix.MS_RELATIME,
	}
	for st_, ms := range locked {
		if st.Flags&st_ != 0 {
			flags |= ms
		}
	}
	return unix.Mount("", p, "", unix.MS_BIND|unix.MS_REMOUNT|flags, "")
}
