// Package workspace gives confined access to a directory whose contents an
// adversary controls: a sandbox's /workspace, seen from the host.
//
// Every path is resolved with openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
// RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV) relative to a directory
// descriptor, so no component of it (not only the last) can be a symbolic
// link, and nothing resolves outside the directory even while sandboxed
// processes rename and replace entries concurrently. Files are opened with
// O_NONBLOCK and checked with fstat before any read, so a FIFO or device
// planted by the sandbox is refused instead of blocking the host.
package workspace

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

const resolveConfined = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS |
	unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV

// Limits on walking a tree the sandbox built: a listing (List, ReadDir)
// of MaxEntries may have been cut short there.
const (
	maxDepth   = 64
	MaxEntries = 100_000
)

// Dir is a confined directory.
type Dir struct {
	// mu is held (read) by every operation while it uses fd, and by
	// Close (write) while it closes it: a descriptor closed under an
	// operation in flight, and its number reused by another open, would
	// point the operation at another file.
	mu       sync.RWMutex
	fd       int
	uid, gid int // owner of what Dir creates; -1 keeps the caller's
}

// Open opens the host directory path as a Dir. Files it creates are owned by
// uid:gid (-1 to keep the caller's).
func Open(dirPath string, uid, gid int) (*Dir, error) {
	fd, err := unix.Open(dirPath, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("workspace: open %s: %w", dirPath, err)
	}
	return &Dir{fd: fd, uid: uid, gid: gid}, nil
}

// Close releases the directory descriptor.
func (d *Dir) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.fd < 0 {
		return nil
	}
	err := unix.Close(d.fd)
	d.fd = -1
	return err
}

var (
	_ sandbox.Workspace       = (*Dir)(nil)
	_ sandbox.WorkspaceEditor = (*Dir)(nil)
	_ sandbox.DirGiver        = (*Dir)(nil)
)

// permission marks what the file's permissions refused (EACCES, EPERM:
// the sandbox's user, or its root, may not) as sandbox.ErrPermission, a
// caller's error rather than the server's.
func permission(err *error) {
	if *err != nil && !errors.Is(*err, sandbox.ErrPermission) &&
		(errors.Is(*err, unix.EACCES) || errors.Is(*err, unix.EPERM)) {
		*err = fmt.Errorf("%w: %w", sandbox.ErrPermission, *err)
	}
}

// Clean checks a workspace-relative path and returns it cleaned. Absolute
// paths, ".." anywhere, NUL bytes, names over 255 bytes and the empty path
// are refused.
func Clean(name string) (string, error) {
	bad := func(why string) (string, error) {
		return "", fmt.Errorf("%w: %q %s", sandbox.ErrBadPath, name, why)
	}
	switch {
	case name == "":
		return bad("is empty")
	case strings.HasPrefix(name, "/"):
		return bad("is absolute; paths are relative to the workspace")
	case strings.ContainsRune(name, 0):
		return bad("contains a NUL byte")
	case len(name) > 4096:
		return bad("is too long")
	}
	for _, part := range strings.Split(name, "/") {
		if part == ".." {
			return bad("leaves the workspace")
		}
		if len(part) > 255 { // NAME_MAX: the kernel's ENAMETOOLONG
			return bad("has a name over 255 bytes")
		}
	}
	c := path.Clean(name)
	if c == "." {
		return bad("names the workspace itself")
	}
	return c, nil
}

func (d *Dir) openat(dirfd int, name string, flags uint64, mode uint32) (int, error) {
	if dirfd < 0 {
		return -1, sandbox.ErrClosed // the Dir was closed
	}
	for {
		fd, err := unix.Openat2(dirfd, name, &unix.OpenHow{
			Flags:   flags | unix.O_CLOEXEC | unix.O_NOFOLLOW,
			Mode:    uint64(mode),
			Resolve: resolveConfined,
		})
		if err == unix.EINTR || err == unix.EAGAIN {
			// EAGAIN: a concurrent rename raced the lookup; try again.
			continue
		}
		if err == unix.ENOSYS {
			return -1, fmt.Errorf("workspace: this kernel lacks openat2 (Linux 5.6): %w", sandbox.ErrUnsupported)
		}
		return fd, err
	}
}

// mkdirAll creates the directories of rel (a cleaned path) and returns a
// descriptor of the last one. made, if not nil, gets a descriptor
// (O_PATH) of each directory this call created, the caller's to close.
func (d *Dir) mkdirAll(rel string, made *[]int) (int, error) {
	if d.fd < 0 {
		return -1, sandbox.ErrClosed
	}
	fd, err := unix.Dup(d.fd)
	if err != nil {
		return -1, err
	}
	if rel == "." {
		return fd, nil
	}
	for _, part := range strings.Split(rel, "/") {
		created := unix.Mkdirat(fd, part, 0o755)
		if created != nil && created != unix.EEXIST {
			unix.Close(fd)
			return -1, created
		}
		next, err := d.openat(fd, part, unix.O_PATH|unix.O_DIRECTORY, 0)
		unix.Close(fd)
		if err != nil {
			return -1, err
		}
		if created == nil && made != nil {
			if err := keep(made, next); err != nil {
				unix.Close(next)
				return -1, err
			}
		}
		fd = next
	}
	return fd, nil
}

// keep adds a duplicate of fd to made.
func keep(made *[]int, fd int) error {
	dup, err := unix.Dup(fd)
	if err == nil {
		*made = append(*made, dup)
	}
	return err
}

// asOwner runs fn on a thread whose filesystem uid and gid are the
// workspace owner's. A sandbox's workspace is a tmpfs that belongs to the
// sandbox's user namespace, where the supervisor's own ids are unmapped:
// the kernel refuses to create inodes for an unmapped owner (EOVERFLOW).
// It also means the host creates files with no more rights than the
// sandbox user has: a non-zero fsuid drops the file-system capabilities.
func (d *Dir) asOwner(fn func() error) error {
	if d.uid < 0 || d.gid < 0 {
		return fn()
	}
	runtime.LockOSThread()
	prevGID, _ := unix.SetfsgidRetGid(d.gid)
	prevUID, _ := unix.SetfsuidRetUid(d.uid)
	err := fn()
	unix.SetfsuidRetUid(prevUID)
	unix.SetfsgidRetGid(prevGID)
	// setfsuid reports the current value when asked for an invalid one.
	if u, _ := unix.SetfsuidRetUid(-1); u != prevUID {
		// Never hand a thread with the wrong identity back to the
		// scheduler: a locked thread exits with its goroutine.
		return errors.Join(err, errors.New("workspace: could not restore the thread's fsuid"))
	}
	if g, _ := unix.SetfsgidRetGid(-1); g != prevGID {
		return errors.Join(err, errors.New("workspace: could not restore the thread's fsgid"))
	}
	runtime.UnlockOSThread()
	return err
}

// WriteFile writes r to name atomically: into a temporary file beside it,
// renamed over name once complete. A failure leaves nothing behind.
func (d *Dir) WriteFile(name string, r io.Reader, limit int64) (err error) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	defer permission(&err)
	return d.asOwner(func() error { return d.writeFile(name, r, limit) })
}

func (d *Dir) writeFile(name string, r io.Reader, limit int64) error {
	rel, err := Clean(name)
	if err != nil {
		return err
	}
	parent, base := path.Split(rel)
	dirfd, err := d.mkdirAll(path.Clean("./"+parent), nil)
	if err != nil {
		return fmt.Errorf("workspace: create directory for %q: %w", name, linkOrNotExist(err))
	}
	defer unix.Close(dirfd)

	tmp := fmt.Sprintf(".vivarium-upload-%d", time.Now().UnixNano())
	fd, err := d.openat(dirfd, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL, 0o644)
	if err != nil {
		return fmt.Errorf("workspace: create %q: %w", name, err)
	}
	f := fdFile{fd}
	ok := false
	defer func() {
		unix.Close(fd)
		if !ok {
			unix.Unlinkat(dirfd, tmp, 0)
		}
	}()
	n, err := io.Copy(f, io.LimitReader(r, limit+1))
	switch {
	case errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.EDQUOT) || errors.Is(err, unix.EFBIG):
		return fmt.Errorf("%w: %q does not fit in the workspace", sandbox.ErrTooLarge, name)
	case err != nil:
		return fmt.Errorf("workspace: write %q: %w", name, err)
	case n > limit:
		return fmt.Errorf("%w: %q is larger than %d bytes", sandbox.ErrTooLarge, name, limit)
	}
	if err := unix.Renameat(dirfd, tmp, dirfd, base); err != nil {
		if err == unix.EISDIR || err == unix.ENOTEMPTY || err == unix.EEXIST {
			return fmt.Errorf("%w: %q is a directory", sandbox.ErrExists, name)
		}
		return fmt.Errorf("workspace: replace %q: %w", name, err)
	}
	ok = true
	return nil
}

// OpenFile opens a regular file for reading.
func (d *Dir) OpenFile(name string) (_ io.ReadCloser, _ sandbox.FileInfo, err error) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	defer permission(&err)
	rel, err := Clean(name)
	if err != nil {
		return nil, sandbox.FileInfo{}, err
	}
	return d.openRegular(rel)
}

func (d *Dir) openRegular(rel string) (io.ReadCloser, sandbox.FileInfo, error) {
	var info sandbox.FileInfo
	fd, err := d.openat(d.fd, rel, unix.O_RDONLY|unix.O_NONBLOCK, 0)
	if err != nil {
		if err == unix.ELOOP || err == unix.EXDEV || err == unix.ENXIO {
			return nil, info, fmt.Errorf("%w: %q is a link or leaves the workspace", sandbox.ErrBadPath, rel)
		}
		return nil, info, fmt.Errorf("workspace: open %q: %w", rel, linkOrNotExist(err))
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, info, fmt.Errorf("workspace: stat %q: %w", rel, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		unix.Close(fd)
		return nil, info, fmt.Errorf("%w: %q is not a regular file", sandbox.ErrBadPath, rel)
	}
	info = fileInfo(rel, &st)
	return &fdFile{fd}, info, nil
}

func wrapNotExist(err error) error {
	if err == unix.ENOENT {
		return fmt.Errorf("%w: %w", fs.ErrNotExist, err)
	}
	return err
}

func fileInfo(rel string, st *unix.Stat_t) sandbox.FileInfo {
	typ := "other"
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		typ = "file"
	case unix.S_IFDIR:
		typ = "dir"
	case unix.S_IFLNK:
		typ = "symlink"
	}
	return sandbox.FileInfo{
		Path:       rel,
		Size:       st.Size,
		Type:       typ,
		Mode:       fs.FileMode(st.Mode & 0o777),
		ModTime:    time.Unix(st.Mtim.Unix()),
		UID:        st.Uid,
		GID:        st.Gid,
		AccessTime: time.Unix(st.Atim.Unix()),
		ChangeTime: time.Unix(st.Ctim.Unix()),
	}
}

// cleanOrRoot is Clean that also accepts the workspace itself.
func cleanOrRoot(name string) (string, error) {
	if name == "" || name == "." || name == "/" {
		return ".", nil
	}
	return Clean(name)
}

// ReadDir lists the entries of directory name (links are listed, not
// followed), recursing depth-1 levels below it, sorted by path.
func (d *Dir) ReadDir(name string, depth int) (_ []sandbox.FileInfo, err error) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	defer permission(&err)
	rel, err := cleanOrRoot(name)
	if err != nil {
		return nil, err
	}
	fd, err := d.openat(d.fd, rel, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		if err == unix.ENOTDIR {
			return nil, fmt.Errorf("%w: %q is not a directory", sandbox.ErrBadPath, rel)
		}
		return nil, fmt.Errorf("workspace: open %q: %w", rel, linkOrNotExist(err))
	}
	defer unix.Close(fd)
	sub := &Dir{fd: fd, uid: d.uid, gid: d.gid}
	var out []sandbox.FileInfo
	err = sub.walkDepth(max(depth, 1)-1, func(p string, st *unix.Stat_t) bool {
		out = append(out, fileInfo(path.Join(rel, p), st))
		return len(out) < MaxEntries
	})
	return out, err
}

// Stat describes name without following a final link.
func (d *Dir) Stat(name string) (_ sandbox.FileInfo, err error) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	defer permission(&err)
	rel, err := cleanOrRoot(name)
	if err != nil {
		return sandbox.FileInfo{}, err
	}
	if rel == "." {
		var st unix.Stat_t
		if err := unix.Fstat(d.fd, &st); err != nil {
			return sandbox.FileInfo{}, err
		}
		return fileInfo(rel, &st), nil
	}
	parent, base := path.Split(rel)
	pfd, err := d.openat(d.fd, path.Clean("./"+parent), unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		return sandbox.FileInfo{}, fmt.Errorf("workspace: %q: %w", rel, linkOrNotExist(err))
	}
	defer unix.Close(pfd)
	var st unix.Stat_t
	if err := unix.Fstatat(pfd, base, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return sandbox.FileInfo{}, fmt.Errorf("workspace: %q: %w", rel, wrapNotExist(err))
	}
	return fileInfo(rel, &st), nil
}

// Remove deletes name: a file, a link (not its target) or a directory with
// everything in it.
func (d *Dir) Remove(name string) (err error) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	defer permission(&err)
	rel, err := Clean(name)
	if err != nil {
		return err
	}
	if rel == "." {
		return fmt.Errorf("%w: cannot remove the workspace itself", sandbox.ErrBadPath)
	}
	parent, base := path.Split(rel)
	pfd, err := d.openat(d.fd, path.Clean("./"+parent), unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return fmt.Errorf("workspace: remove %q: %w", rel, linkOrNotExist(err))
	}
	defer unix.Close(pfd)
	return d.asOwner(func() error { return removeAt(pfd, base, 0) })
}

func removeAt(dirfd int, name string, depth int) error {
	err := unix.Unlinkat(dirfd, name, 0)
	if err != unix.EISDIR {
		return wrapNotExist(err)
	}
	if depth > maxDepth {
		return fmt.Errorf("workspace: directories nested too deep")
	}
	fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	names, err := readDirNames(fd)
	for _, n := range names {
		if err == nil {
			err = removeAt(fd, n, depth+1)
		}
	}
	unix.Close(fd)
	if err != nil {
		return err
	}
	return unix.Unlinkat(dirfd, name, unix.AT_REMOVEDIR)
}

// Mkdir creates directory name and its missing parents, as the
// workspace's owner. An entry already at name is ErrExists.
func (d *Dir) Mkdir(name string) (err error) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	defer permission(&err)
	rel, err := Clean(name)
	if err != nil {
		return err
	}
	return d.asOwner(func() error { return d.mkdir(rel, nil) })
}

// mkdir creates directory rel (a cleaned path) and its missing parents;
// made, if not nil, gets a descriptor of each directory it created.
func (d *Dir) mkdir(rel string, made *[]int) error {
	parent, base := path.Split(rel)
	dirfd, err := d.mkdirAll(path.Clean("./"+parent), made)
	if err != nil {
		return fmt.Errorf("workspace: create directory for %q: %w", rel, linkOrNotExist(err))
	}
	defer unix.Close(dirfd)
	switch err := unix.Mkdirat(dirfd, base, 0o755); err {
	case nil:
	case unix.EEXIST:
		return fmt.Errorf("%w: %q", sandbox.ErrExists, rel)
	default:
		return fmt.Errorf("workspace: mkdir %q: %w", rel, err)
	}
	if made == nil {
		return nil
	}
	fd, err := d.openat(dirfd, base, unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		return fmt.Errorf("workspace: create directory for %q: %w", rel, linkOrNotExist(err))
	}
	*made = append(*made, fd)
	return nil
}

// MkdirAllFor makes directory name and its missing parents with d's
// permissions (the sandbox's root, say) and gives each directory it made
// to owner's owner (the sandbox's user), as a privileged file server
// (E2B's envd, which runs as root) makes a user's directories anywhere.
// An existing directory keeps its owner; an entry already at name is
// ErrExists. The directories are made as d's owner and given away by the
// host, through descriptors this confined walk opened: whatever the
// sandbox renames meanwhile, only directories of this file system change
// owner, and only to owner's.
func (d *Dir) MkdirAllFor(name string, owner sandbox.Workspace) (err error) {
	to, ok := owner.(*Dir)
	if !ok || to.uid < 0 || to.gid < 0 {
		return fmt.Errorf("workspace: directories are given only to a confined directory's owner, not a %T's", owner)
	}
	d.mu.RLock()
	defer d.mu.RUnlock()
	defer permission(&err)
	rel, err := Clean(name)
	if err != nil {
		return err
	}
	var made []int
	err = d.asOwner(func() error { return d.mkdir(rel, &made) })
	// Given away outside asOwner: the host's own file-system
	// capabilities (CAP_CHOWN), which a non-zero fsuid drops.
	for _, fd := range made {
		if cerr := unix.Fchownat(fd, "", to.uid, to.gid, unix.AT_EMPTY_PATH|unix.AT_SYMLINK_NOFOLLOW); cerr != nil {
			err = errors.Join(err, fmt.Errorf("workspace: give a directory of %q to its user: %w", rel, cerr))
		}
		unix.Close(fd)
	}
	return err
}

// Rename moves from to to, both inside the workspace, creating the missing
// parents of to. Only the parent directories are resolved (confined, no
// links); rename(2) itself never follows the last component, so a link is
// moved, not its target.
func (d *Dir) Rename(from, to string) (err error) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	defer permission(&err)
	src, err := Clean(from)
	if err != nil {
		return err
	}
	dst, err := Clean(to)
	if err != nil {
		return err
	}
	srcParent, srcBase := path.Split(src)
	dstParent, dstBase := path.Split(dst)
	return d.asOwner(func() error {
		sfd, err := d.openat(d.fd, path.Clean("./"+srcParent), unix.O_PATH|unix.O_DIRECTORY, 0)
		if err != nil {
			return fmt.Errorf("workspace: rename %q: %w", src, linkOrNotExist(err))
		}
		defer unix.Close(sfd)
		dfd, err := d.mkdirAll(path.Clean("./"+dstParent), nil)
		if err != nil {
			return fmt.Errorf("workspace: create directory for %q: %w", dst, linkOrNotExist(err))
		}
		defer unix.Close(dfd)
		switch err := unix.Renameat(sfd, srcBase, dfd, dstBase); err {
		case nil:
			return nil
		case unix.ENOENT:
			return fmt.Errorf("workspace: rename %q: %w", src, wrapNotExist(err))
		case unix.EINVAL:
			return fmt.Errorf("%w: cannot move %q into itself", sandbox.ErrBadPath, src)
		case unix.EISDIR, unix.ENOTDIR, unix.ENOTEMPTY, unix.EEXIST:
			return fmt.Errorf("%w: cannot replace %q with %q (%v)", sandbox.ErrExists, dst, src, err)
		default:
			return fmt.Errorf("workspace: rename %q: %w", src, err)
		}
	})
}

// linkOrNotExist names the errors of a confined lookup for a caller: a
// link (or a way out) in the path is a bad path, a missing part is
// fs.ErrNotExist.
func linkOrNotExist(err error) error {
	switch err {
	case unix.ELOOP, unix.EXDEV:
		return fmt.Errorf("%w: a part of the path is a link or leaves the workspace", sandbox.ErrBadPath)
	case unix.ENOTDIR:
		return fmt.Errorf("%w: a part of the path is not a directory", sandbox.ErrBadPath)
	}
	return wrapNotExist(err)
}

// List walks the workspace and returns its regular files, sorted by path.
// Links, FIFOs, sockets and devices are not followed and not listed.
func (d *Dir) List(max int) ([]sandbox.FileInfo, error) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	return d.list(max)
}

func (d *Dir) list(max int) ([]sandbox.FileInfo, error) {
	var out []sandbox.FileInfo
	err := d.walk(func(rel string, st *unix.Stat_t) bool {
		if st.Mode&unix.S_IFMT == unix.S_IFREG {
			out = append(out, fileInfo(rel, st))
		}
		return len(out) < max
	})
	return out, err
}

// walk visits every entry below the directory, depth first in name order,
// until visit returns false.
func (d *Dir) walk(visit func(rel string, st *unix.Stat_t) bool) error {
	return d.walkDepth(maxDepth, visit)
}

func (d *Dir) walkDepth(maxDepth int, visit func(rel string, st *unix.Stat_t) bool) error {
	seen := 0
	var rec func(fd int, prefix string, depth int) (bool, error)
	rec = func(fd int, prefix string, depth int) (bool, error) {
		names, err := readDirNames(fd)
		if err != nil {
			return false, err
		}
		for _, name := range names {
			if seen++; seen > MaxEntries {
				return false, nil
			}
			var st unix.Stat_t
			if err := unix.Fstatat(fd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
				continue // removed meanwhile
			}
			rel := path.Join(prefix, name)
			if !visit(rel, &st) {
				return false, nil
			}
			if st.Mode&unix.S_IFMT != unix.S_IFDIR || depth >= maxDepth {
				continue
			}
			sub, err := d.openat(fd, name, unix.O_RDONLY|unix.O_DIRECTORY, 0)
			if err != nil {
				continue // replaced by a link meanwhile, or unreadable
			}
			more, err := rec(sub, rel, depth+1)
			unix.Close(sub)
			if err != nil || !more {
				return more, err
			}
		}
		return true, nil
	}
	fd, err := d.openat(d.fd, ".", unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return fmt.Errorf("workspace: %w", err)
	}
	defer unix.Close(fd)
	_, err = rec(fd, "", 0)
	return err
}

// CopyOut copies regular files into the host directory dir (created if
// needed). Files over maxFile, or past maxTotal altogether, are skipped.
func (d *Dir) CopyOut(dir string, maxFile, maxTotal int64) ([]sandbox.FileInfo, error) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	if err := unix.Mkdir(dir, 0o755); err != nil && err != unix.EEXIST {
		return nil, fmt.Errorf("workspace: create %s: %w", dir, err)
	}
	dst, err := Open(dir, -1, -1)
	if err != nil {
		return nil, err
	}
	defer dst.Close()
	files, err := d.list(MaxEntries)
	if err != nil {
		return nil, err
	}
	var copied []sandbox.FileInfo
	var total int64
	var errs []error
	for _, f := range files {
		if f.Size > maxFile || total+f.Size > maxTotal {
			continue
		}
		r, info, err := d.openRegular(f.Path)
		if err != nil {
			continue // changed since listed
		}
		err = dst.WriteFile(f.Path, r, min(maxFile, maxTotal-total))
		r.Close()
		if err != nil {
			errs = append(errs, err)
			continue
		}
		total += info.Size
		copied = append(copied, info)
	}
	return copied, errors.Join(errs...)
}

// fdFile adapts a raw descriptor to io.Reader, io.Writer and io.Closer.
type fdFile struct{ fd int }

func (f fdFile) Read(p []byte) (int, error) {
	for {
		n, err := unix.Read(f.fd, p)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return 0, err
		}
		if n == 0 && len(p) > 0 {
			return 0, io.EOF
		}
		return n, nil
	}
}

func (f fdFile) Write(p []byte) (int, error) {
	written := 0
	for written < len(p) {
		n, err := unix.Write(f.fd, p[written:])
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return written, err
		}
		written += n
	}
	return written, nil
}

func (f *fdFile) Close() error { return unix.Close(f.fd) }

// readDirNames lists a directory's entries, sorted, without "." and "..".
func readDirNames(fd int) ([]string, error) {
	buf := make([]byte, 32<<10)
	var names []string
	// Each descriptor is read once from its start: callers pass fresh ones.
	for {
		n, err := unix.Getdents(fd, buf)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, err
		}
		if n <= 0 {
			break
		}
		_, _, names = unix.ParseDirent(buf[:n], -1, names)
		if len(names) > MaxEntries {
			break
		}
	}
	slices.Sort(names)
	return names, nil
}
