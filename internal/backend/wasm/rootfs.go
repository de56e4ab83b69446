package wasm

import (
	"io/fs"
	"sort"
	"strings"
	"sync/atomic"

	experimentalsys "github.com/tetratelabs/wazero/experimental/sys"
	"github.com/tetratelabs/wazero/sys"
)

// rootFS is the whole file system a guest sees, mounted at "/" as its only
// preopened directory, so that every path, absolute or relative to the
// working directory, is resolved here, after wazero has cleaned it and
// refused any that climbs above "/":
//
//	/                        read-only skeleton (memFS)
//	/opt/vivarium            the runner, read-only (in the skeleton)
//	/usr/local/lib           the interpreter's standard library, read-only (host directory)
//	/dev                     null, zero and the protocol channel (devFS)
//	/workspace               the sandbox's files, read-write, size-checked (memFS)
//
// A path belongs to the mount with the longest matching prefix; renaming
// or linking across mounts fails with EROFS, as one side is always
// read-only.
//
// rootFS also enforces the open-files limit: wazero's descriptor table
// has none, and every open file is memory of the host, not of the guest.
// Past maxOpen, opening fails with EIO (WASI preview 1 has no EMFILE in
// wazero) and onTooMany is called.
type rootFS struct {
	experimentalsys.UnimplementedFS
	mounts    []mount // longest prefix first
	maxOpen   int64   // 0: no limit
	open      atomic.Int64
	onTooMany func()
}

type mount struct {
	prefix string // cleaned, relative to "/", "" for the skeleton
	fs     experimentalsys.FS
}

func newRootFS(mounts ...mount) *rootFS {
	sort.Slice(mounts, func(i, j int) bool { return len(mounts[i].prefix) > len(mounts[j].prefix) })
	return &rootFS{mounts: mounts}
}

// resolve finds the mount of p and the path within it.
func (r *rootFS) resolve(p string) (experimentalsys.FS, string) {
	clean := strings.Join(split(p), "/")
	for _, m := range r.mounts {
		switch {
		case m.prefix == "":
			return m.fs, clean
		case clean == m.prefix:
			return m.fs, ""
		case strings.HasPrefix(clean, m.prefix+"/"):
			return m.fs, clean[len(m.prefix)+1:]
		}
	}
	return nil, ""
}

func (r *rootFS) OpenFile(p string, flag experimentalsys.Oflag, perm fs.FileMode) (experimentalsys.File, experimentalsys.Errno) {
	if r.maxOpen > 0 && r.open.Load() >= r.maxOpen {
		if r.onTooMany != nil {
			r.onTooMany()
		}
		return nil, experimentalsys.EIO
	}
	fsys, sub := r.resolve(p)
	f, errno := fsys.OpenFile(sub, flag, perm)
	if errno != 0 {
		return nil, errno
	}
	r.open.Add(1)
	return &countedFile{File: f, r: r}, 0
}

// countedFile is an open file counted against rootFS's limit.
type countedFile struct {
	experimentalsys.File
	r      *rootFS
	closed atomic.Bool
}

func (f *countedFile) Close() experimentalsys.Errno {
	if !f.closed.Swap(true) {
		f.r.open.Add(-1)
	}
	return f.File.Close()
}

func (r *rootFS) Lstat(p string) (sys.Stat_t, experimentalsys.Errno) {
	f, sub := r.resolve(p)
	return f.Lstat(sub)
}

func (r *rootFS) Stat(p string) (sys.Stat_t, experimentalsys.Errno) {
	f, sub := r.resolve(p)
	return f.Stat(sub)
}

func (r *rootFS) Mkdir(p string, perm fs.FileMode) experimentalsys.Errno {
	f, sub := r.resolve(p)
	return f.Mkdir(sub, perm)
}

func (r *rootFS) Chmod(p string, perm fs.FileMode) experimentalsys.Errno {
	f, sub := r.resolve(p)
	return f.Chmod(sub, perm)
}

func (r *rootFS) Rename(from, to string) experimentalsys.Errno {
	ff, fsub := r.resolve(from)
	tf, tsub := r.resolve(to)
	if ff != tf {
		return experimentalsys.EROFS
	}
	return ff.Rename(fsub, tsub)
}

func (r *rootFS) Rmdir(p string) experimentalsys.Errno {
	f, sub := r.resolve(p)
	return f.Rmdir(sub)
}

func (r *rootFS) Unlink(p string) experimentalsys.Errno {
	f, sub := r.resolve(p)
	return f.Unlink(sub)
}

func (r *rootFS) Link(oldPath, newPath string) experimentalsys.Errno {
	of, osub := r.resolve(oldPath)
	nf, nsub := r.resolve(newPath)
	if of != nf {
		return experimentalsys.EROFS
	}
	return of.Link(osub, nsub)
}

func (r *rootFS) Symlink(oldPath, linkName string) experimentalsys.Errno {
	f, sub := r.resolve(linkName)
	return f.Symlink(oldPath, sub)
}

func (r *rootFS) Readlink(p string) (string, experimentalsys.Errno) {
	f, sub := r.resolve(p)
	return f.Readlink(sub)
}

func (r *rootFS) Utimens(p string, atim, mtim int64) experimentalsys.Errno {
	f, sub := r.resolve(p)
	return f.Utimens(sub, atim, mtim)
}

// readOnlyFS refuses every change to the file system it wraps (a host
// directory) with EROFS, as a read-only mount does.
type readOnlyFS struct {
	experimentalsys.FS
}

func (r readOnlyFS) OpenFile(p string, flag experimentalsys.Oflag, perm fs.FileMode) (experimentalsys.File, experimentalsys.Errno) {
	access := flag & (experimentalsys.O_RDONLY | experimentalsys.O_WRONLY | experimentalsys.O_RDWR)
	if access != experimentalsys.O_RDONLY || flag&(experimentalsys.O_CREAT|experimentalsys.O_TRUNC|experimentalsys.O_APPEND) != 0 {
		if _, errno := r.FS.Stat(p); errno == experimentalsys.ENOENT && flag&experimentalsys.O_CREAT == 0 {
			return nil, errno
		}
		return nil, experimentalsys.EROFS
	}
	return r.FS.OpenFile(p, flag, perm)
}

func (readOnlyFS) Mkdir(string, fs.FileMode) experimentalsys.Errno    { return experimentalsys.EROFS }
func (readOnlyFS) Chmod(string, fs.FileMode) experimentalsys.Errno    { return experimentalsys.EROFS }
func (readOnlyFS) Rename(string, string) experimentalsys.Errno        { return experimentalsys.EROFS }
func (readOnlyFS) Rmdir(string) experimentalsys.Errno                 { return experimentalsys.EROFS }
func (readOnlyFS) Unlink(string) experimentalsys.Errno                { return experimentalsys.EROFS }
func (readOnlyFS) Link(string, string) experimentalsys.Errno          { return experimentalsys.EROFS }
func (readOnlyFS) Symlink(string, string) experimentalsys.Errno       { return experimentalsys.EROFS }
func (readOnlyFS) Utimens(string, int64, int64) experimentalsys.Errno { return experimentalsys.EROFS }

// devFS is /dev: null, zero, and the runner's protocol channel, which can
// be opened once (by the runner, before any user code runs).
type devFS struct {
	experimentalsys.UnimplementedFS
	channel *channel
}

var devNames = []string{"null", "vivarium", "zero"}

func (d *devFS) node(p string) (sys.Stat_t, experimentalsys.Errno) {
	switch p {
	case "":
		return sys.Stat_t{Dev: 2, Ino: 1, Mode: fs.ModeDir | 0o755, Nlink: 2}, 0
	case "null", "zero":
		return sys.Stat_t{Dev: 2, Ino: 2, Mode: fs.ModeDevice | fs.ModeCharDevice | 0o666, Nlink: 1}, 0
	case "vivarium":
		return sys.Stat_t{Dev: 2, Ino: 3, Mode: fs.ModeNamedPipe | 0o600, Nlink: 1}, 0
	}
	return sys.Stat_t{}, experimentalsys.ENOENT
}

func (d *devFS) Stat(p string) (sys.Stat_t, experimentalsys.Errno)  { return d.node(p) }
func (d *devFS) Lstat(p string) (sys.Stat_t, experimentalsys.Errno) { return d.node(p) }

func (d *devFS) OpenFile(p string, flag experimentalsys.Oflag, _ fs.FileMode) (experimentalsys.File, experimentalsys.Errno) {
	st, errno := d.node(p)
	if errno != 0 {
		// /dev is flat: a name in it cannot be created, one under it
		// has no directory.
		if flag&experimentalsys.O_CREAT != 0 && !strings.Contains(p, "/") {
			return nil, experimentalsys.EROFS
		}
		return nil, errno
	}
	switch p {
	case "":
		return &devDir{}, 0
	case "vivarium":
		return d.channel.open()
	}
	return &devFile{st: st, zero: p == "zero"}, 0
}

func (d *devFS) Mkdir(p string, _ fs.FileMode) experimentalsys.Errno {
	if _, errno := d.node(p); errno == 0 {
		return experimentalsys.EEXIST
	}
	return experimentalsys.EROFS
}
func (d *devFS) Chmod(string, fs.FileMode) experimentalsys.Errno    { return experimentalsys.EROFS }
func (d *devFS) Rename(string, string) experimentalsys.Errno        { return experimentalsys.EROFS }
func (d *devFS) Rmdir(string) experimentalsys.Errno                 { return experimentalsys.EROFS }
func (d *devFS) Unlink(string) experimentalsys.Errno                { return experimentalsys.EROFS }
func (d *devFS) Link(string, string) experimentalsys.Errno          { return experimentalsys.EROFS }
func (d *devFS) Symlink(string, string) experimentalsys.Errno       { return experimentalsys.EROFS }
func (d *devFS) Utimens(string, int64, int64) experimentalsys.Errno { return experimentalsys.EROFS }
func (d *devFS) Readlink(string) (string, experimentalsys.Errno)    { return "", experimentalsys.EINVAL }

type devDir struct {
	experimentalsys.DirFile
	read bool
}

func (d *devDir) Stat() (sys.Stat_t, experimentalsys.Errno) {
	return sys.Stat_t{Dev: 2, Ino: 1, Mode: fs.ModeDir | 0o755, Nlink: 2}, 0
}

func (d *devDir) Dev() (uint64, experimentalsys.Errno)    { return 2, 0 }
func (d *devDir) Ino() (sys.Inode, experimentalsys.Errno) { return 1, 0 }
func (d *devDir) Seek(offset fileOffset, whence int) (int64, experimentalsys.Errno) {
	if offset != 0 || whence != 0 {
		return 0, experimentalsys.EINVAL
	}
	d.read = false
	return 0, 0
}
func (d *devDir) Readdir(int) ([]experimentalsys.Dirent, experimentalsys.Errno) {
	if d.read {
		return nil, 0
	}
	d.read = true
	out := make([]experimentalsys.Dirent, 0, len(devNames))
	for i, n := range devNames {
		out = append(out, experimentalsys.Dirent{Ino: uint64(i + 2), Name: n, Type: fs.ModeDevice | fs.ModeCharDevice})
	}
	return out, 0
}
func (d *devDir) Sync() experimentalsys.Errno                { return 0 }
func (d *devDir) Datasync() experimentalsys.Errno            { return 0 }
func (d *devDir) Utimens(int64, int64) experimentalsys.Errno { return experimentalsys.EROFS }
func (d *devDir) Close() experimentalsys.Errno               { return 0 }

// devFile is /dev/null or /dev/zero.
type devFile struct {
	experimentalsys.UnimplementedFile
	st   sys.Stat_t
	zero bool
}

func (f *devFile) Dev() (uint64, experimentalsys.Errno)                { return 2, 0 }
func (f *devFile) Ino() (sys.Inode, experimentalsys.Errno)             { return f.st.Ino, 0 }
func (f *devFile) Stat() (sys.Stat_t, experimentalsys.Errno)           { return f.st, 0 }
func (f *devFile) Seek(fileOffset, int) (int64, experimentalsys.Errno) { return 0, 0 }
func (f *devFile) Read(buf []byte) (int, experimentalsys.Errno) {
	if !f.zero {
		return 0, 0
	}
	clear(buf)
	return len(buf), 0
}
func (f *devFile) Pread(buf []byte, _ int64) (int, experimentalsys.Errno) { return f.Read(buf) }
func (f *devFile) Write(buf []byte) (int, experimentalsys.Errno)          { return len(buf), 0 }
func (f *devFile) Pwrite(buf []byte, _ int64) (int, experimentalsys.Errno) {
	return len(buf), 0
}
func (f *devFile) Truncate(int64) experimentalsys.Errno { return 0 }
func (f *devFile) Sync() experimentalsys.Errno          { return 0 }
func (f *devFile) Datasync() experimentalsys.Errno      { return 0 }
func (f *devFile) Close() experimentalsys.Errno         { return 0 }
