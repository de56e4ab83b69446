package workspace

import (
	"fmt"
	"path"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

// metadataPrefix names the extended attributes that hold a file's
// metadata: E2B's, so that what a program in the sandbox sets with
// setfattr -n user.e2b.KEY is metadata KEY, as in an E2B sandbox.
const metadataPrefix = "user.e2b."

// Readlink returns the target of the symbolic link name, as written.
func (d *Dir) Readlink(name string) (target string, err error) {
	err = d.inParent(name, func(pfd int, rel, base string) error {
		buf := make([]byte, unix.PathMax)
		n, err := unix.Readlinkat(pfd, base, buf)
		if err == unix.EINVAL {
			return fmt.Errorf("%w: %q is not a symbolic link", sandbox.ErrBadPath, rel)
		}
		if err != nil {
			return fmt.Errorf("workspace: readlink %q: %w", rel, wrapNotExist(err))
		}
		target = string(buf[:n])
		return nil
	})
	return target, err
}

// Symlink makes name a symbolic link to target, as the workspace's owner,
// in a directory that exists. target is written as it is and never
// resolved here; an entry already at name is ErrExists.
func (d *Dir) Symlink(target, name string) error {
	if target == "" || strings.ContainsRune(target, 0) || len(target) >= unix.PathMax {
		return fmt.Errorf("%w: a link's target is 1 to %d bytes, without NUL", sandbox.ErrBadPath, unix.PathMax-1)
	}
	return d.inParent(name, func(pfd int, rel, base string) error {
		return d.asOwner(func() error {
			switch err := unix.Symlinkat(target, pfd, base); err {
			case nil:
				return nil
			case unix.EEXIST:
				return fmt.Errorf("%w: %q", sandbox.ErrExists, rel)
			default:
				return fmt.Errorf("workspace: symlink %q: %w", rel, err)
			}
		})
	})
}

// inParent runs fn with a descriptor of the directory name is in, opened
// confined, name cleaned (rel) and its last component (base).
func (d *Dir) inParent(name string, fn func(pfd int, rel, base string) error) (err error) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	defer permission(&err)
	rel, err := Clean(name)
	if err != nil {
		return err
	}
	parent, base := path.Split(rel)
	pfd, err := d.openat(d.fd, path.Clean("./"+parent), unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		return fmt.Errorf("workspace: %q: %w", rel, linkOrNotExist(err))
	}
	defer unix.Close(pfd)
	return fn(pfd, rel, base)
}

// withInode runs fn with a path that names name's inode itself
// (/proc/self/fd/N of an O_PATH descriptor, which no rename or link
// planted afterwards can redirect), if it is a regular file or a
// directory; ok is false for anything else (a link, a FIFO, a device).
// The extended-attribute calls take paths, not O_PATH descriptors.
func (d *Dir) withInode(name string, fn func(p string) error) (ok bool, err error) {
	rel, err := cleanOrRoot(name)
	if err != nil {
		return false, err
	}
	fd, err := d.openat(d.fd, rel, unix.O_PATH, 0)
	if err != nil {
		return false, fmt.Errorf("workspace: %q: %w", rel, linkOrNotExist(err))
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return false, err
	}
	if t := st.Mode & unix.S_IFMT; t != unix.S_IFREG && t != unix.S_IFDIR {
		return false, nil
	}
	return true, fn("/proc/self/fd/" + strconv.Itoa(fd))
}

// FileMetadata reads name's metadata: at most MaxMetadataEntries entries,
// by key order; keys and values over their bounds (the sandbox may set
// anything) are left out.
func (d *Dir) FileMetadata(name string) (_ map[string]string, err error) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	defer permission(&err)
	out := map[string]string{}
	_, err = d.withInode(name, func(p string) error {
		buf := make([]byte, 64<<10)
		n, err := unix.Listxattr(p, buf)
		if err == unix.ERANGE || err == unix.ENOTSUP {
			return nil // more names than anyone sets, or none possible
		}
		if err != nil {
			return err
		}
		var keys []string
		for attr := range strings.SplitSeq(string(buf[:n]), "\x00") {
			if k, ok := strings.CutPrefix(attr, metadataPrefix); ok && k != "" && len(k) <= sandbox.MaxMetadataKeyLen {
				keys = append(keys, k)
			}
		}
		slices.Sort(keys)
		val := make([]byte, sandbox.MaxMetadataValueLen)
		for _, k := range keys {
			if len(out) == sandbox.MaxMetadataEntries {
				break
			}
			n, err := unix.Getxattr(p, metadataPrefix+k, val)
			if err != nil {
				continue // gone meanwhile, or too long (ERANGE)
			}
			out[k] = string(val[:n])
		}
		return nil
	})
	return out, err
}

// SetFileMetadata sets md on name (a regular file or a directory), with
// the sandbox user's rights.
func (d *Dir) SetFileMetadata(name string, md map[string]string) (err error) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	defer permission(&err)
	if err := sandbox.CheckMetadata(md); err != nil {
		return err
	}
	if len(md) == 0 {
		return nil
	}
	ok, err := d.withInode(name, func(p string) error {
		return d.asOwner(func() error {
			for k, v := range md {
				if err := unix.Setxattr(p, metadataPrefix+k, []byte(v), 0); err != nil {
					if err == unix.ENOTSUP {
						return fmt.Errorf("workspace: this file system keeps no metadata: %w", sandbox.ErrUnsupported)
					}
					return fmt.Errorf("workspace: metadata %q: %w", k, err)
				}
			}
			return nil
		})
	})
	if err == nil && !ok {
		err = fmt.Errorf("%w: only files and directories carry metadata", sandbox.ErrBadPath)
	}
	return err
}

var (
	_ sandbox.WorkspaceLinker   = (*Dir)(nil)
	_ sandbox.WorkspaceMetadata = (*Dir)(nil)
	_ sandbox.DiskUser          = (*Dir)(nil)
)

// DiskUsed is the space used on the workspace's file system: a sandbox's
// disk of its own (see sandbox.DiskUser), on the backends that give it one.
func (d *Dir) DiskUsed() (int64, error) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	var st unix.Statfs_t
	if err := unix.Fstatfs(d.fd, &st); err != nil {
		return 0, err
	}
	if st.Type != unix.TMPFS_MAGIC {
		// A directory of the host's own disk: its use is the host's.
		return 0, fmt.Errorf("workspace: not on a disk of the sandbox's own: %w", sandbox.ErrUnsupported)
	}
	return int64(st.Blocks-st.Bfree) * st.Bsize, nil
}

// Chmod sets the permission bits of name (a regular file or directory,
// never a link's target) as the workspace's owner: only what the owner
// owns can be changed.
func (d *Dir) Chmod(name string, mode uint32) (err error) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	defer permission(&err)
	if mode&^0o777 != 0 {
		// No set-id or sticky bits: they mean nothing in a volume
		// (nosuid), and a host file should never carry them.
		return fmt.Errorf("%w: mode %o: only the permission bits 0-777 may be set", sandbox.ErrBadPath, mode)
	}
	ok, err := d.withInode(name, func(p string) error {
		return d.asOwner(func() error { return unix.Chmod(p, mode) })
	})
	if err == nil && !ok {
		return fmt.Errorf("%w: %q is not a regular file or directory", sandbox.ErrBadPath, name)
	}
	return err
}
