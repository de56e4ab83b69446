package wasm

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"sort"
	"strings"
	"time"

	experimentalsys "github.com/tetratelabs/wazero/experimental/sys"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

// workspace is the host's view of a sandbox's /workspace (a memFS). The
// file system holds no links, FIFOs or devices, so every entry is a
// regular file or a directory; what the host writes is charged to the disk
// limit like what the guest writes.
type workspace struct {
	fs *memFS
}

var _ sandbox.Workspace = (*workspace)(nil)

// cleanName checks a workspace-relative path, as the native workspace
// does: absolute paths, ".." anywhere, NUL bytes and the empty path are
// refused.
func cleanName(name string) ([]string, error) {
	bad := func(why string) ([]string, error) {
		return nil, fmt.Errorf("%w: %q %s", sandbox.ErrBadPath, name, why)
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
		if len(part) > maxNameLen {
			return bad("has a name longer than 255 bytes")
		}
	}
	parts := split(path.Clean(name))
	if len(parts) == 0 {
		return bad("names the workspace itself")
	}
	if len(parts) > maxDepth {
		return bad("is nested too deep")
	}
	return parts, nil
}

// cleanOrRoot is cleanName that also accepts the workspace itself.
func cleanOrRoot(name string) ([]string, error) {
	if name == "" || name == "." || name == "/" {
		return nil, nil
	}
	return cleanName(name)
}

// WriteFile implements sandbox.Workspace: the content is read whole, then
// put in place at once, replacing any file of that name; a failure leaves
// nothing behind.
func (w *workspace) WriteFile(name string, r io.Reader, limit int64) error {
	parts, err := cleanName(name)
	if err != nil {
		return err
	}
	var buf bytes.Buffer
	n, err := io.Copy(&buf, io.LimitReader(r, limit+1))
	if err != nil {
		return fmt.Errorf("workspace: read %q: %w", name, err)
	}
	if n > limit {
		return fmt.Errorf("%w: %q is larger than %d bytes", sandbox.ErrTooLarge, name, limit)
	}
	m := w.fs
	m.mu.Lock()
	defer m.mu.Unlock()
	dir, err := m.mkdirAll(parts[:len(parts)-1])
	if err != nil {
		return fmt.Errorf("%w: %q: a parent is not a directory, or the workspace is full", sandbox.ErrBadPath, name)
	}
	base := parts[len(parts)-1]
	freed := int64(0)
	if old, ok := dir.children[base]; ok {
		if old.isDir() {
			return fmt.Errorf("%w: %q is a directory", sandbox.ErrBadPath, name)
		}
		if old.nlink == 1 && old.opens == 0 {
			freed = int64(len(old.data))
		}
	}
	if m.used-freed+n > m.limit || m.inodes >= m.maxInodes {
		return fmt.Errorf("%w: %q does not fit in the workspace", sandbox.ErrTooLarge, name)
	}
	nd := m.newNode(0o644)
	nd.data = bytes.Clone(buf.Bytes())
	m.inodes++
	m.used += n
	if _, ok := dir.children[base]; ok {
		m.unlinkName(dir, base)
	}
	m.link(dir, base, nd)
	return nil
}

func (w *workspace) info(rel string, n *node) sandbox.FileInfo {
	typ := "file"
	if n.isDir() {
		typ = "dir"
	}
	return sandbox.FileInfo{Path: rel, Size: int64(len(n.data)), Type: typ, Mode: n.mode.Perm(),
		ModTime: time.Unix(0, n.mtim)}
}

// walk visits the entries below dir in path order, depth first, until
// visit returns false; it descends at most depth levels.
func (w *workspace) walk(dir *node, prefix string, depth int, visit func(rel string, n *node) bool) bool {
	names := make([]string, 0, len(dir.children))
	for name := range dir.children {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		c := dir.children[name]
		rel := path.Join(prefix, name)
		if !visit(rel, c) {
			return false
		}
		if c.isDir() && depth > 1 && !w.walk(c, rel, depth-1, visit) {
			return false
		}
	}
	return true
}

// List implements sandbox.Workspace.
func (w *workspace) List(max int) ([]sandbox.FileInfo, error) {
	w.fs.mu.Lock()
	defer w.fs.mu.Unlock()
	var out []sandbox.FileInfo
	w.walk(w.fs.root, "", maxDepth, func(rel string, n *node) bool {
		if !n.isDir() {
			out = append(out, w.info(rel, n))
		}
		return len(out) < max
	})
	return out, nil
}

// snapshot is a file's content at one moment, for reading outside the lock.
func (w *workspace) snapshot(parts []string) ([]byte, sandbox.FileInfo, error) {
	w.fs.mu.Lock()
	defer w.fs.mu.Unlock()
	rel := strings.Join(parts, "/")
	n, errno := w.fs.lookup(rel)
	if errno != 0 {
		return nil, sandbox.FileInfo{}, wrapErrno(rel, errno)
	}
	if n.isDir() {
		return nil, sandbox.FileInfo{}, fmt.Errorf("%w: %q is not a regular file", sandbox.ErrBadPath, rel)
	}
	return bytes.Clone(n.data), w.info(rel, n), nil
}

func wrapErrno(rel string, errno experimentalsys.Errno) error {
	if errno == experimentalsys.ENOENT {
		return fmt.Errorf("workspace: %q: %w", rel, fs.ErrNotExist)
	}
	if errno == experimentalsys.ENOTDIR {
		return fmt.Errorf("%w: %q: a parent is not a directory", sandbox.ErrBadPath, rel)
	}
	return fmt.Errorf("workspace: %q: %w", rel, errno)
}

// OpenFile implements sandbox.Workspace.
func (w *workspace) OpenFile(name string) (io.ReadCloser, sandbox.FileInfo, error) {
	parts, err := cleanName(name)
	if err != nil {
		return nil, sandbox.FileInfo{}, err
	}
	data, info, err := w.snapshot(parts)
	if err != nil {
		return nil, info, err
	}
	return io.NopCloser(bytes.NewReader(data)), info, nil
}

// ReadDir implements sandbox.Workspace.
func (w *workspace) ReadDir(name string, depth int) ([]sandbox.FileInfo, error) {
	parts, err := cleanOrRoot(name)
	if err != nil {
		return nil, err
	}
	w.fs.mu.Lock()
	defer w.fs.mu.Unlock()
	rel := strings.Join(parts, "/")
	n, errno := w.fs.lookup(rel)
	if errno != 0 {
		return nil, wrapErrno(rel, errno)
	}
	if !n.isDir() {
		return nil, fmt.Errorf("%w: %q is not a directory", sandbox.ErrBadPath, rel)
	}
	var out []sandbox.FileInfo
	w.walk(n, rel, max(depth, 1), func(p string, c *node) bool {
		out = append(out, w.info(p, c))
		return len(out) < 100_000
	})
	return out, nil
}

// Stat implements sandbox.Workspace.
func (w *workspace) Stat(name string) (sandbox.FileInfo, error) {
	parts, err := cleanOrRoot(name)
	if err != nil {
		return sandbox.FileInfo{}, err
	}
	w.fs.mu.Lock()
	defer w.fs.mu.Unlock()
	rel := strings.Join(parts, "/")
	n, errno := w.fs.lookup(rel)
	if errno != 0 {
		return sandbox.FileInfo{}, wrapErrno(rel, errno)
	}
	if rel == "" {
		rel = "."
	}
	return w.info(rel, n), nil
}

// Remove implements sandbox.Workspace.
func (w *workspace) Remove(name string) error {
	parts, err := cleanName(name)
	if err != nil {
		return err
	}
	m := w.fs
	m.mu.Lock()
	defer m.mu.Unlock()
	rel := strings.Join(parts, "/")
	dir, base, errno := m.parent(rel)
	if errno != 0 {
		return wrapErrno(rel, errno)
	}
	if _, ok := dir.children[base]; !ok {
		return wrapErrno(rel, experimentalsys.ENOENT)
	}
	m.removeTree(dir, base)
	return nil
}

// removeTree unlinks name from dir, and everything below it.
func (m *memFS) removeTree(dir *node, name string) {
	n := dir.children[name]
	if n.isDir() {
		for c := range n.children {
			m.removeTree(n, c)
		}
	}
	m.unlinkName(dir, name)
}

// CopyOut implements sandbox.Workspace. The host directory is opened as an
// os.Root, so nothing is written outside it, whatever links it holds; each
// file is written beside its final name and renamed over it, so a link of
// that name is replaced, never written through.
func (w *workspace) CopyOut(dir string, maxFile, maxTotal int64) ([]sandbox.FileInfo, error) {
	if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		return nil, fmt.Errorf("workspace: create %s: %w", dir, err)
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, fmt.Errorf("workspace: open %s: %w", dir, err)
	}
	defer root.Close()
	files, err := w.List(100_000)
	if err != nil {
		return nil, err
	}
	var copied []sandbox.FileInfo
	var total int64
	var errs []error
	for i, f := range files {
		if f.Size > maxFile || total+f.Size > maxTotal {
			continue
		}
		data, info, err := w.snapshot(split(f.Path))
		if err != nil || int64(len(data)) > maxFile || total+int64(len(data)) > maxTotal {
			continue // changed since listed
		}
		if err := writeInto(root, f.Path, data, i); err != nil {
			errs = append(errs, err)
			continue
		}
		total += info.Size
		copied = append(copied, info)
	}
	return copied, errors.Join(errs...)
}

func writeInto(root *os.Root, rel string, data []byte, seq int) error {
	if parent := path.Dir(rel); parent != "." {
		if err := root.MkdirAll(parent, 0o755); err != nil {
			return fmt.Errorf("copy out %q: %w", rel, err)
		}
	}
	tmp := path.Join(path.Dir(rel), fmt.Sprintf(".vivarium-copy-%d-%d", time.Now().UnixNano(), seq))
	f, err := root.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return fmt.Errorf("copy out %q: %w", rel, err)
	}
	_, err = f.Write(data)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = root.Rename(tmp, rel)
	}
	if err != nil {
		root.Remove(tmp)
		return fmt.Errorf("copy out %q: %w", rel, err)
	}
	return nil
}
