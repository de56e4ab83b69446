package native

import (
	"io/fs"
	"os"
	"path/filepath"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

// The sandbox's root file system, seen from inside:
//
//	/usr                  the host's /usr, read-only, nosuid, nodev
//	/bin /lib /lib64 ...  the host's merged-/usr links (or read-only binds)
//	/etc                  synthetic (rootview.HostEtc)
//	/opt/vivarium         the runner
//	/proc                 a new proc of the sandbox's PID namespace, with masks
//	/dev                  null zero full random urandom tty, fd links, /dev/shm,
//	                      pts (devpts of its own) and ptmx
//	/                     the sandbox's disk: one size-limited tmpfs, whose
//	                      system directories (/etc, /root, /var ...) its
//	                      root owns; /workspace (also at /home/user), /tmp
//	                      and /dev/shm (from /run/shm) its user's
//
// /usr, the host's directories and the runner are read-only mounts.

// SandboxUID and SandboxGID are the user code's ids inside the sandbox,
// unless its template's USER names another user (initConfig.user).
const (
	SandboxUID = sandbox.DefaultUID
	SandboxGID = sandbox.DefaultGID
)

// writeUsers writes the sandbox's /etc/passwd and /etc/group: root, the
// sandbox user (uid 1000) by the name and home its spec gives, and nobody.
func writeUsers(etc, name, home string) error {
	if name == "" {
		name, home = "sandbox", workspacePath
	}
	passwd := "root:x:0:0:root:/root:/bin/sh\n" +
		name + ":x:1000:1000:" + name + ":" + home + ":/bin/sh\n" +
		"nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
	group := "root:x:0:\n" + name + ":x:1000:\nnogroup:x:65534:\n"
	for _, f := range []struct{ name, data string }{{"passwd", passwd}, {"group", group}} {
		p := filepath.Join(etc, f.name)
		os.Remove(p) // a link or a file of the zygote's copy
		if err := os.WriteFile(p, []byte(f.data), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// etcOfZygote makes a forked sandbox's /etc at dst from the zygote's, src:
// a directory of the sandbox's own, with copies of src's files and links,
// and read-only overlays of its directories (empty is the overlays' empty
// layer).
func etcOfZygote(src, dst, empty string) error {
	if err := os.Mkdir(dst, 0o755); err != nil && !os.IsExist(err) {
		return err
	}
	entries, err := os.ReadDir(src)
	if err != nil {
		return err
	}
	for _, e := range entries {
		from, to := filepath.Join(src, e.Name()), filepath.Join(dst, e.Name())
		if e.IsDir() {
			if err := mountOverlay(from, empty, to); err != nil {
				return err
			}
			continue
		}
		if err := copyTree(from, to); err != nil {
			return err
		}
	}
	return nil
}

// copyTree copies src, a directory, file or link, to dst: directories,
// regular files and symbolic links, with their permission bits, owned by
// the caller. src is
// trusted (the zygote's /etc, which it wrote itself); other kinds of file
// are skipped.
func copyTree(src, dst string) error {
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		to := filepath.Join(dst, rel)
		info, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case d.IsDir():
			if err := os.Mkdir(to, 0o755); err != nil && !os.IsExist(err) {
				return err
			}
			return os.Chmod(to, info.Mode().Perm())
		case d.Type()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			return os.Symlink(target, to)
		case d.Type().IsRegular():
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			return os.WriteFile(to, data, info.Mode().Perm())
		}
		return nil
	})
}
