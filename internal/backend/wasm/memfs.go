package wasm

import (
	"io"
	"io/fs"
	"path"
	"sort"
	"strings"
	"sync"
	"time"

	experimentalsys "github.com/tetratelabs/wazero/experimental/sys"
	"github.com/tetratelabs/wazero/sys"
)

// memFS is a file system held in the host's memory: the sandbox's
// /workspace, and the read-only skeleton of its root. It is the only
// writable storage a wasm sandbox has, so it enforces the disk limit
// itself, exactly:
//
//   - a file costs its apparent size, holes included (a sparse file is not
//     cheaper than a full one), from the moment it is extended;
//   - an unlinked file still costs its size while it is open;
//   - the number of inodes (files and directories) is capped as the native
//     backend's tmpfs caps it: one per 8 KiB of disk, at least 1024;
//   - names are at most 255 bytes, paths at most maxDepth directories deep.
//
// A write that would pass the limit fails whole, with nothing written.
// WASI preview 1 as wazero implements it has no ENOSPC, so the guest sees
// EIO; onFull is called so that the sandbox can say why on stderr.
//
// Symbolic links cannot be created (EPERM): nothing in the file system
// ever needs to resolve one, so no path can lead anywhere but where it
// says. Hard links work, within one memFS.
//
// All methods are safe for concurrent use: the guest and the host (the
// Workspace API) use the file system at the same time.
type memFS struct {
	mu        sync.Mutex
	root      *node
	readOnly  bool
	limit     int64 // bytes
	used      int64
	maxInodes int64
	inodes    int64
	nextIno   uint64
	onFull    func()
}

const (
	maxNameLen = 255
	// maxDepth bounds the host's walks of the tree (List, CopyOut), as
	// the native workspace does; deeper files are not listed.
	maxDepth = 64
	// maxComponents bounds a path the guest names: WASI paths are at most
	// PATH_MAX (4096) bytes, so about 2048 components.
	maxComponents = 2048
)

// node is an inode: a regular file or a directory.
type node struct {
	ino      uint64
	mode     fs.FileMode // type bits and permissions
	data     []byte
	children map[string]*node
	nlink    int
	opens    int
	mtim     int64
	atim     int64
	ctim     int64
}

func (n *node) isDir() bool { return n.mode.IsDir() }

func newMemFS(limit int64) *memFS {
	m := &memFS{limit: limit, maxInodes: max(limit/(8<<10), 1024)}
	m.root = m.newNode(fs.ModeDir | 0o755)
	m.root.nlink = 1
	return m
}

func (m *memFS) newNode(mode fs.FileMode) *node {
	m.nextIno++
	now := time.Now().UnixNano()
	n := &node{ino: m.nextIno, mode: mode, mtim: now, atim: now, ctim: now}
	if mode.IsDir() {
		n.children = map[string]*node{}
	}
	return n
}

// charge accounts for delta more bytes, or fails.
func (m *memFS) charge(delta int64) experimentalsys.Errno {
	if delta > 0 && m.used+delta > m.limit {
		if m.onFull != nil {
			m.onFull()
		}
		return experimentalsys.EIO
	}
	m.used += delta
	return 0
}

// release frees a node that has no name and is not open any more.
func (m *memFS) release(n *node) {
	if n.nlink > 0 || n.opens > 0 {
		return
	}
	m.used -= int64(len(n.data))
	m.inodes--
	n.data = nil
}

// split cleans a path given by wazero (already relative and free of "..")
// into its components.
func split(p string) []string {
	p = strings.Trim(p, "/")
	if p == "" || p == "." {
		return nil
	}
	var parts []string
	for _, s := range strings.Split(p, "/") {
		if s != "" && s != "." {
			parts = append(parts, s)
		}
	}
	return parts
}

// lookup finds the node at p.
func (m *memFS) lookup(p string) (*node, experimentalsys.Errno) {
	n := m.root
	parts := split(p)
	if len(parts) > maxComponents {
		return nil, experimentalsys.ENAMETOOLONG
	}
	for _, part := range parts {
		if !n.isDir() {
			return nil, experimentalsys.ENOTDIR
		}
		c, ok := n.children[part]
		if !ok {
			return nil, experimentalsys.ENOENT
		}
		n = c
	}
	return n, 0
}

// parent finds the directory that holds p's last component, and that name.
func (m *memFS) parent(p string) (*node, string, experimentalsys.Errno) {
	parts := split(p)
	if len(parts) == 0 {
		return nil, "", experimentalsys.EINVAL // the root itself
	}
	if len(parts) > maxComponents {
		return nil, "", experimentalsys.ENAMETOOLONG
	}
	name := parts[len(parts)-1]
	if len(name) > maxNameLen {
		return nil, "", experimentalsys.ENAMETOOLONG
	}
	dir, errno := m.lookup(strings.Join(parts[:len(parts)-1], "/"))
	if errno != 0 {
		return nil, "", errno
	}
	if !dir.isDir() {
		return nil, "", experimentalsys.ENOTDIR
	}
	return dir, name, 0
}

func (m *memFS) link(dir *node, name string, n *node) {
	dir.children[name] = n
	n.nlink++
	if n.isDir() {
		dir.nlink++
	}
	dir.mtim = time.Now().UnixNano()
}

func (m *memFS) unlinkName(dir *node, name string) {
	n := dir.children[name]
	delete(dir.children, name)
	n.nlink--
	if n.isDir() {
		dir.nlink--
		n.nlink = 0
	}
	dir.mtim = time.Now().UnixNano()
	m.release(n)
}

func (m *memFS) stat(n *node) sys.Stat_t {
	nlink := n.nlink
	if n.isDir() {
		nlink++ // its "." entry
	}
	return sys.Stat_t{Dev: 1, Ino: n.ino, Mode: n.mode, Nlink: uint64(max(nlink, 0)),
		Size: int64(len(n.data)), Atim: n.atim, Mtim: n.mtim, Ctim: n.ctim}
}

// OpenFile implements experimentalsys.FS.
func (m *memFS) OpenFile(p string, flag experimentalsys.Oflag, perm fs.FileMode) (experimentalsys.File, experimentalsys.Errno) {
	m.mu.Lock()
	defer m.mu.Unlock()
	access := flag & (experimentalsys.O_RDONLY | experimentalsys.O_WRONLY | experimentalsys.O_RDWR)
	writes := access != experimentalsys.O_RDONLY || flag&(experimentalsys.O_TRUNC|experimentalsys.O_APPEND) != 0
	n, errno := m.lookup(p)
	switch {
	case errno == experimentalsys.ENOENT && flag&experimentalsys.O_CREAT != 0:
		if flag&experimentalsys.O_DIRECTORY != 0 {
			return nil, experimentalsys.EINVAL
		}
		// As a kernel does: the path is resolved before the file
		// system's being read-only matters.
		dir, name, errno := m.parent(p)
		if errno != 0 {
			return nil, errno
		}
		if m.readOnly {
			return nil, experimentalsys.EROFS
		}
		if m.inodes >= m.maxInodes {
			if m.onFull != nil {
				m.onFull()
			}
			return nil, experimentalsys.EIO
		}
		n = m.newNode(perm.Perm() &^ 0o022)
		m.inodes++
		m.link(dir, name, n)
	case errno != 0:
		return nil, errno
	case flag&experimentalsys.O_CREAT != 0 && flag&experimentalsys.O_EXCL != 0:
		return nil, experimentalsys.EEXIST
	case n.isDir() && writes:
		return nil, experimentalsys.EISDIR
	case !n.isDir() && flag&experimentalsys.O_DIRECTORY != 0:
		return nil, experimentalsys.ENOTDIR
	case writes && m.readOnly:
		return nil, experimentalsys.EROFS
	}
	if flag&experimentalsys.O_TRUNC != 0 && !n.isDir() && len(n.data) > 0 {
		m.used -= int64(len(n.data))
		n.data = nil
		n.mtim = time.Now().UnixNano()
	}
	n.opens++
	return &memFile{fs: m, n: n,
		read:   access != experimentalsys.O_WRONLY,
		write:  access != experimentalsys.O_RDONLY,
		append: flag&experimentalsys.O_APPEND != 0}, 0
}

// Lstat implements experimentalsys.FS.
func (m *memFS) Lstat(p string) (sys.Stat_t, experimentalsys.Errno) { return m.Stat(p) }

// Stat implements experimentalsys.FS.
func (m *memFS) Stat(p string) (sys.Stat_t, experimentalsys.Errno) {
	m.mu.Lock()
	defer m.mu.Unlock()
	n, errno := m.lookup(p)
	if errno != 0 {
		return sys.Stat_t{}, errno
	}
	return m.stat(n), 0
}

// Mkdir implements experimentalsys.FS.
func (m *memFS) Mkdir(p string, perm fs.FileMode) experimentalsys.Errno {
	m.mu.Lock()
	defer m.mu.Unlock()
	_, errno := m.mkdir(p, perm)
	return errno
}

func (m *memFS) mkdir(p string, perm fs.FileMode) (*node, experimentalsys.Errno) {
	dir, name, errno := m.parent(p)
	if errno != 0 {
		return nil, errno
	}
	if _, ok := dir.children[name]; ok {
		return nil, experimentalsys.EEXIST
	}
	if m.readOnly {
		return nil, experimentalsys.EROFS
	}
	if m.inodes >= m.maxInodes {
		if m.onFull != nil {
			m.onFull()
		}
		return nil, experimentalsys.EIO
	}
	n := m.newNode(fs.ModeDir | perm.Perm())
	m.inodes++
	m.link(dir, name, n)
	return n, 0
}

// Chmod implements experimentalsys.FS. Modes are recorded, not enforced:
// the sandbox has one user, who owns everything in its workspace.
func (m *memFS) Chmod(p string, perm fs.FileMode) experimentalsys.Errno {
	m.mu.Lock()
	defer m.mu.Unlock()
	n, errno := m.lookup(p)
	if errno != 0 {
		return errno
	}
	if m.readOnly {
		return experimentalsys.EROFS
	}
	n.mode = n.mode.Type() | perm.Perm()
	n.ctim = time.Now().UnixNano()
	return 0
}

// Rename implements experimentalsys.FS.
func (m *memFS) Rename(from, to string) experimentalsys.Errno {
	m.mu.Lock()
	defer m.mu.Unlock()
	fdir, fname, errno := m.parent(from)
	if errno != 0 {
		return errno
	}
	n, ok := fdir.children[fname]
	if !ok {
		return experimentalsys.ENOENT
	}
	tdir, tname, errno := m.parent(to)
	if errno != 0 {
		return errno
	}
	if m.readOnly {
		return experimentalsys.EROFS
	}
	if n.isDir() {
		// A directory cannot move into itself.
		fp, tp := strings.Join(split(from), "/"), strings.Join(split(to), "/")
		if tp == fp || strings.HasPrefix(tp, fp+"/") {
			if tp == fp {
				return 0
			}
			return experimentalsys.EINVAL
		}
	}
	if old, ok := tdir.children[tname]; ok {
		if old == n {
			return 0
		}
		switch {
		case n.isDir() && !old.isDir():
			return experimentalsys.ENOTDIR
		case !n.isDir() && old.isDir():
			return experimentalsys.EISDIR
		case old.isDir() && len(old.children) > 0:
			return experimentalsys.ENOTEMPTY
		}
		m.unlinkName(tdir, tname)
	}
	delete(fdir.children, fname)
	n.nlink--
	if n.isDir() {
		fdir.nlink--
	}
	m.link(tdir, tname, n)
	n.ctim = time.Now().UnixNano()
	return 0
}

// Rmdir implements experimentalsys.FS.
func (m *memFS) Rmdir(p string) experimentalsys.Errno {
	m.mu.Lock()
	defer m.mu.Unlock()
	dir, name, errno := m.parent(p)
	if errno != 0 {
		return errno
	}
	n, ok := dir.children[name]
	switch {
	case !ok:
		return experimentalsys.ENOENT
	case !n.isDir():
		return experimentalsys.ENOTDIR
	case m.readOnly:
		return experimentalsys.EROFS
	case len(n.children) > 0:
		return experimentalsys.ENOTEMPTY
	}
	m.unlinkName(dir, name)
	return 0
}

// Unlink implements experimentalsys.FS.
func (m *memFS) Unlink(p string) experimentalsys.Errno {
	m.mu.Lock()
	defer m.mu.Unlock()
	dir, name, errno := m.parent(p)
	if errno != 0 {
		return errno
	}
	n, ok := dir.children[name]
	switch {
	case !ok:
		return experimentalsys.ENOENT
	case m.readOnly:
		return experimentalsys.EROFS
	case n.isDir():
		return experimentalsys.EISDIR
	}
	m.unlinkName(dir, name)
	return 0
}

// Link implements experimentalsys.FS.
func (m *memFS) Link(oldPath, newPath string) experimentalsys.Errno {
	m.mu.Lock()
	defer m.mu.Unlock()
	n, errno := m.lookup(oldPath)
	if errno != 0 {
		return errno
	}
	if m.readOnly {
		return experimentalsys.EROFS
	}
	if n.isDir() {
		return experimentalsys.EPERM
	}
	dir, name, errno := m.parent(newPath)
	if errno != 0 {
		return errno
	}
	if _, ok := dir.children[name]; ok {
		return experimentalsys.EEXIST
	}
	m.link(dir, name, n)
	n.ctim = time.Now().UnixNano()
	return 0
}

// Symlink implements experimentalsys.FS: refused, see memFS.
func (m *memFS) Symlink(_, _ string) experimentalsys.Errno {
	if m.readOnly {
		return experimentalsys.EROFS
	}
	return experimentalsys.EPERM
}

// Readlink implements experimentalsys.FS: there are no links to read.
func (m *memFS) Readlink(p string) (string, experimentalsys.Errno) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, errno := m.lookup(p); errno != 0 {
		return "", errno
	}
	return "", experimentalsys.EINVAL
}

// Utimens implements experimentalsys.FS.
func (m *memFS) Utimens(p string, atim, mtim int64) experimentalsys.Errno {
	m.mu.Lock()
	defer m.mu.Unlock()
	n, errno := m.lookup(p)
	if errno != 0 {
		return errno
	}
	if m.readOnly {
		return experimentalsys.EROFS
	}
	setTimes(n, atim, mtim)
	return 0
}

func setTimes(n *node, atim, mtim int64) {
	now := time.Now().UnixNano()
	if atim != experimentalsys.UTIME_OMIT {
		n.atim = atim
	}
	if mtim != experimentalsys.UTIME_OMIT {
		n.mtim = mtim
	}
	n.ctim = now
}

// fileOffset is int64 under another name, only so that go vet's check of
// io.Seeker's signature does not take wazero's File.Seek, which returns an
// Errno rather than an error, for a mistake.
type fileOffset = int64

// memFile is an open file or directory of a memFS.
type memFile struct {
	experimentalsys.UnimplementedFile
	fs                  *memFS
	n                   *node
	pos                 int64
	read, write, append bool
	closed              bool
	dirents             []experimentalsys.Dirent // nil until listed
}

var _ experimentalsys.File = (*memFile)(nil)

func (f *memFile) Dev() (uint64, experimentalsys.Errno) { return 1, 0 }
func (f *memFile) Ino() (sys.Inode, experimentalsys.Errno) {
	return f.n.ino, 0
}
func (f *memFile) IsDir() (bool, experimentalsys.Errno) { return f.n.isDir(), 0 }
func (f *memFile) IsAppend() bool                       { return f.append }
func (f *memFile) SetAppend(enable bool) experimentalsys.Errno {
	f.append = enable
	return 0
}

func (f *memFile) Stat() (sys.Stat_t, experimentalsys.Errno) {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if f.closed {
		return sys.Stat_t{}, experimentalsys.EBADF
	}
	return f.fs.stat(f.n), 0
}

func (f *memFile) Read(buf []byte) (int, experimentalsys.Errno) {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	n, errno := f.pread(buf, f.pos)
	f.pos += int64(n)
	return n, errno
}

func (f *memFile) Pread(buf []byte, off int64) (int, experimentalsys.Errno) {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	return f.pread(buf, off)
}

func (f *memFile) pread(buf []byte, off int64) (int, experimentalsys.Errno) {
	switch {
	case f.closed || !f.read:
		return 0, experimentalsys.EBADF
	case f.n.isDir():
		return 0, experimentalsys.EISDIR
	case off < 0:
		return 0, experimentalsys.EINVAL
	case off >= int64(len(f.n.data)):
		return 0, 0
	}
	return copy(buf, f.n.data[off:]), 0
}

func (f *memFile) Seek(offset fileOffset, whence int) (int64, experimentalsys.Errno) {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if f.closed {
		return 0, experimentalsys.EBADF
	}
	var pos int64
	switch whence {
	case io.SeekStart:
		pos = offset
	case io.SeekCurrent:
		pos = f.pos + offset
	case io.SeekEnd:
		pos = int64(len(f.n.data)) + offset
	default:
		return 0, experimentalsys.EINVAL
	}
	if pos < 0 {
		return 0, experimentalsys.EINVAL
	}
	if f.n.isDir() {
		if pos != 0 {
			return 0, experimentalsys.EINVAL
		}
		f.dirents = nil
	}
	f.pos = pos
	return pos, 0
}

func (f *memFile) Readdir(n int) ([]experimentalsys.Dirent, experimentalsys.Errno) {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if f.closed || !f.n.isDir() {
		return nil, experimentalsys.EBADF
	}
	if f.dirents == nil {
		names := make([]string, 0, len(f.n.children))
		for name := range f.n.children {
			names = append(names, name)
		}
		sort.Strings(names)
		f.dirents = make([]experimentalsys.Dirent, 0, len(names))
		for _, name := range names {
			c := f.n.children[name]
			f.dirents = append(f.dirents, experimentalsys.Dirent{Ino: c.ino, Name: name, Type: c.mode.Type()})
		}
		f.pos = 0
	}
	rest := f.dirents[min(int(f.pos), len(f.dirents)):]
	if n > 0 && n < len(rest) {
		rest = rest[:n]
	}
	f.pos += int64(len(rest))
	return rest, 0
}

func (f *memFile) Write(buf []byte) (int, experimentalsys.Errno) {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	off := f.pos
	if f.append {
		off = int64(len(f.n.data))
	}
	n, errno := f.pwrite(buf, off)
	if errno == 0 {
		f.pos = off + int64(n)
	}
	return n, errno
}

func (f *memFile) Pwrite(buf []byte, off int64) (int, experimentalsys.Errno) {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	return f.pwrite(buf, off)
}

func (f *memFile) pwrite(buf []byte, off int64) (int, experimentalsys.Errno) {
	switch {
	case f.closed || !f.write:
		return 0, experimentalsys.EBADF
	case f.n.isDir():
		return 0, experimentalsys.EISDIR
	case off < 0:
		return 0, experimentalsys.EINVAL
	case len(buf) == 0:
		return 0, 0
	}
	end := off + int64(len(buf))
	if end < off { // overflow
		return 0, experimentalsys.EINVAL
	}
	if grow := end - int64(len(f.n.data)); grow > 0 {
		if errno := f.fs.charge(grow); errno != 0 {
			return 0, errno
		}
		f.n.data = extend(f.n.data, end)
	}
	copy(f.n.data[off:], buf)
	f.n.mtim = time.Now().UnixNano()
	return len(buf), 0
}

// extend grows b to n bytes, zero-filled, with room to grow further so
// that a file written in small pieces is not copied at every write.
func extend(b []byte, n int64) []byte {
	if n <= int64(cap(b)) {
		return b[:n]
	}
	c := max(n, int64(cap(b))*2)
	nb := make([]byte, n, c)
	copy(nb, b)
	return nb
}

func (f *memFile) Truncate(size int64) experimentalsys.Errno {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	switch {
	case f.closed || !f.write:
		return experimentalsys.EBADF
	case f.n.isDir():
		return experimentalsys.EISDIR
	case size < 0:
		return experimentalsys.EINVAL
	}
	old := int64(len(f.n.data))
	if errno := f.fs.charge(size - old); errno != 0 {
		return errno
	}
	if size > old {
		f.n.data = extend(f.n.data, size)
	} else {
		clear(f.n.data[size:])
		f.n.data = f.n.data[:size]
	}
	f.n.mtim = time.Now().UnixNano()
	return 0
}

func (f *memFile) Sync() experimentalsys.Errno     { return 0 }
func (f *memFile) Datasync() experimentalsys.Errno { return 0 }

func (f *memFile) Utimens(atim, mtim int64) experimentalsys.Errno {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if f.fs.readOnly {
		return experimentalsys.EROFS
	}
	setTimes(f.n, atim, mtim)
	return 0
}

func (f *memFile) Close() experimentalsys.Errno {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if !f.closed {
		f.closed = true
		f.n.opens--
		f.fs.release(f.n)
	}
	return 0
}

// mkdirAll creates the directories of p (components already checked).
func (m *memFS) mkdirAll(parts []string) (*node, error) {
	n := m.root
	for i, part := range parts {
		c, ok := n.children[part]
		if !ok {
			var errno experimentalsys.Errno
			if c, errno = m.mkdir(path.Join(parts[:i+1]...), 0o755); errno != 0 {
				return nil, errno
			}
		}
		if !c.isDir() {
			return nil, experimentalsys.ENOTDIR
		}
		n = c
	}
	return n, nil
}
