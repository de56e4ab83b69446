package image

import (
	"archive/tar"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"path"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Unpacking a layer is a boundary: every byte of a layer is hostile. A
// layer is written into a directory of its own, in the form overlayfs
// stacks (a whiteout is a character device 0:0, an opaque directory has
// the xattr trusted.overlay.opaque), and:
//
//  1. every path is resolved inside that directory (os.Root: a symlink,
//     the layer's own or one met on the way, never leads out of it);
//     a name that is absolute or has a ".." is refused;
//  2. a hard link must name a file of the same layer;
//  3. device nodes are not made (a whiteout is made by the store, not
//     copied), set-user-ID and set-group-ID bits are dropped, and the
//     layer's extended attributes (file capabilities among them) are
//     not applied;
//  4. a whiteout of the root, or an opaque root, is refused;
//  5. what it writes and reads is counted against the image's budget,
//     so a tar bomb, a gzip bomb or a sparse file stops at the bound.
//
// The caller unpacks into a staging directory and renames it once the
// layer's digest is verified: nothing half-written gets a final name.

// Limits bound what one image may take.
type Limits struct {
	// Layers is the most layers an image may have.
	Layers int
	// Bytes bounds an image's uncompressed layers: what they unpack to,
	// and the tar streams read.
	Bytes int64
	// Files bounds the entries of an image's layers.
	Files int64
}

// DefaultLimits are the store's bounds unless its owner sets others.
var DefaultLimits = Limits{Layers: 128, Bytes: 32 << 30, Files: 4_000_000}

// budget is what an image has left of its Limits while it unpacks.
type budget struct {
	lim          Limits
	read, wrote  int64
	files        int64
	devices      int64 // device nodes not made
	setIDDropped int64 // files whose set-ID bits were dropped
}

func (b *budget) tooLarge(what string) error {
	return fmt.Errorf("%w: its layers hold more than %s", ErrTooLarge, what)
}

func (b *budget) addFile() error {
	if b.files++; b.files > b.lim.Files {
		return b.tooLarge(fmt.Sprintf("%d files", b.lim.Files))
	}
	return nil
}

func (b *budget) addWrite(n int64) error {
	if b.wrote += n; b.wrote > b.lim.Bytes {
		return b.tooLarge(FormatBytes(b.lim.Bytes))
	}
	return nil
}

// countedReader counts a layer's uncompressed stream against the budget
// and hashes it (its diff ID).
type countedReader struct {
	r io.Reader
	b *budget
	h hash.Hash
}

func (c *countedReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.h.Write(p[:n])
	if c.b.read += int64(n); c.b.read > c.b.lim.Bytes {
		return n, c.b.tooLarge(FormatBytes(c.b.lim.Bytes) + " of tar streams")
	}
	return n, err
}

// dirMode is a directory's mode and times, set once the layer is
// written: a directory without write permission must still take the
// entries that follow it.
type dirMode struct {
	name  string
	mode  fs.FileMode
	mtime time.Time
}

// unpackLayer writes the uncompressed layer r into the empty directory
// dst and returns the digest of r ("sha256:HEX"), its diff ID.
func unpackLayer(dst string, r io.Reader, b *budget) (string, error) {
	root, err := os.OpenRoot(dst)
	if err != nil {
		return "", err
	}
	defer root.Close()
	cr := &countedReader{r: r, b: b, h: sha256.New()}
	tr := tar.NewReader(cr)
	var dirs []dirMode
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return "", layerError(err)
		}
		if err := b.addFile(); err != nil {
			return "", err
		}
		d, err := unpackEntry(root, tr, hdr, b)
		if err != nil {
			return "", err
		}
		if d != nil {
			dirs = append(dirs, *d)
		}
	}
	// The end of the archive is followed by padding, which the digest
	// covers.
	if _, err := io.Copy(io.Discard, cr); err != nil {
		return "", layerError(err)
	}
	for _, d := range slices.Backward(dirs) {
		fi, err := root.Lstat(d.name)
		if err != nil || !fi.IsDir() {
			continue // replaced by a later entry
		}
		if err := root.Chmod(d.name, d.mode); err != nil {
			return "", err
		}
		root.Chtimes(d.name, d.mtime, d.mtime)
	}
	return "sha256:" + hex.EncodeToString(cr.h.Sum(nil)), nil
}

// layerError says what was wrong with a layer's stream: a read error of
// the tar reader or the decompressor, or a bound, which is kept.
func layerError(err error) error {
	if errors.Is(err, ErrTooLarge) || errors.Is(err, ErrRefused) {
		return err
	}
	return fmt.Errorf("%w: a layer is not a valid tar archive: %v", ErrRefused, err)
}

// entryName is hdr's name as a path inside the layer, "." for its root.
func entryName(name string) (string, error) {
	if strings.HasPrefix(name, "/") {
		return "", fmt.Errorf("%w: a layer has an absolute path (%.200q)", ErrRefused, name)
	}
	for _, part := range strings.Split(name, "/") {
		if part == ".." {
			return "", fmt.Errorf("%w: a layer has a path that leads out of its root (%.200q)", ErrRefused, name)
		}
	}
	return path.Clean(name), nil
}

// unpackEntry writes one entry; for a directory it returns the mode and
// times to set at the end.
func unpackEntry(root *os.Root, tr *tar.Reader, hdr *tar.Header, b *budget) (*dirMode, error) {
	name, err := entryName(hdr.Name)
	if err != nil {
		return nil, err
	}
	base := path.Base(name)
	if name == "." {
		return nil, nil // the root's own entry: the store's directory stays as it is
	}
	parent := path.Dir(name)
	if strings.HasPrefix(base, ".wh.") {
		return nil, whiteout(root, parent, strings.TrimPrefix(base, ".wh."))
	}
	if err := root.MkdirAll(parent, 0o755); err != nil {
		return nil, pathError(err, name)
	}
	// Permissions and the sticky bit; never set-user-ID or set-group-ID.
	mode := fs.FileMode(hdr.Mode) & fs.ModePerm
	if hdr.Mode&unix.S_ISVTX != 0 {
		mode |= fs.ModeSticky
	}
	if hdr.Mode&(unix.S_ISUID|unix.S_ISGID) != 0 {
		b.setIDDropped++
	}
	if hdr.Uid < 0 || hdr.Gid < 0 {
		return nil, fmt.Errorf("%w: a layer has a negative owner (%.200q)", ErrRefused, hdr.Name)
	}
	switch hdr.Typeflag {
	case tar.TypeDir:
		if fi, err := root.Lstat(name); err == nil && fi.IsDir() {
			// Kept; its mode is this entry's.
		} else {
			if err := removeEntry(root, name); err != nil {
				return nil, err
			}
			if err := root.Mkdir(name, 0o700); err != nil {
				return nil, pathError(err, name)
			}
		}
		if err := root.Lchown(name, hdr.Uid, hdr.Gid); err != nil {
			return nil, pathError(err, name)
		}
		return &dirMode{name: name, mode: mode, mtime: hdr.ModTime}, nil
	case tar.TypeReg, tar.TypeRegA, tar.TypeGNUSparse:
		if err := removeEntry(root, name); err != nil {
			return nil, err
		}
		f, err := root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return nil, pathError(err, name)
		}
		err = writeFile(f, tr, b)
		if err == nil {
			err = f.Chown(hdr.Uid, hdr.Gid)
		}
		if err == nil {
			err = f.Chmod(mode)
		}
		if err == nil {
			ts := []unix.Timeval{unix.NsecToTimeval(hdr.ModTime.UnixNano()), unix.NsecToTimeval(hdr.ModTime.UnixNano())}
			unix.Futimes(int(f.Fd()), ts)
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return nil, layerError(err)
		}
	case tar.TypeSymlink:
		if err := removeEntry(root, name); err != nil {
			return nil, err
		}
		if err := root.Symlink(hdr.Linkname, name); err != nil {
			return nil, pathError(err, name)
		}
		if err := root.Lchown(name, hdr.Uid, hdr.Gid); err != nil {
			return nil, pathError(err, name)
		}
	case tar.TypeLink:
		target, err := entryName(hdr.Linkname)
		if err != nil {
			return nil, err
		}
		fi, err := root.Lstat(target)
		if err != nil || fi.IsDir() {
			return nil, fmt.Errorf("%w: a layer has a hard link (%.200q) to %.200q, which is not a file of the same layer",
				ErrRefused, hdr.Name, hdr.Linkname)
		}
		if err := removeEntry(root, name); err != nil {
			return nil, err
		}
		if err := root.Link(target, name); err != nil {
			return nil, pathError(err, name)
		}
	case tar.TypeFifo:
		if err := removeEntry(root, name); err != nil {
			return nil, err
		}
		err := atParent(root, parent, func(fd int) error {
			if err := unix.Mkfifoat(fd, base, uint32(mode.Perm())); err != nil {
				return err
			}
			return unix.Fchownat(fd, base, hdr.Uid, hdr.Gid, unix.AT_SYMLINK_NOFOLLOW)
		})
		if err != nil {
			return nil, pathError(err, name)
		}
	case tar.TypeChar, tar.TypeBlock:
		b.devices++ // not made: a sandbox gets the devices it may use from Vivarium
	default:
		// Other types (tar's own extensions are read by archive/tar)
		// carry nothing a root needs.
	}
	return nil, nil
}

// writeFile copies a regular file's content, counted against the budget.
func writeFile(f *os.File, r io.Reader, b *budget) error {
	buf := make([]byte, 256<<10)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			if err := b.addWrite(int64(n)); err != nil {
				return err
			}
			if _, werr := f.Write(buf[:n]); werr != nil {
				return werr
			}
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// removeEntry removes what the layer already has at name, a directory with all
// it holds: an entry replaces an earlier one of the same name.
func removeEntry(root *os.Root, name string) error {
	fi, err := root.Lstat(name)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return pathError(err, name)
	}
	if fi.IsDir() {
		err = root.RemoveAll(name)
	} else {
		err = root.Remove(name)
	}
	return pathError(err, name)
}

// whiteout records that the layer deletes parent/name of the layers
// below it: a character device 0:0 in its place, or, for ".wh..opq"
// (the entry ".wh..wh..opq"), an opaque parent.
func whiteout(root *os.Root, parent, name string) error {
	if name == "" || name == "." || name == ".." || strings.Contains(name, "/") {
		return fmt.Errorf("%w: a layer has a malformed whiteout (%.200q)", ErrRefused, path.Join(parent, ".wh."+name))
	}
	if err := root.MkdirAll(parent, 0o755); err != nil {
		return pathError(err, parent)
	}
	if name == ".wh..opq" {
		if parent == "." {
			return fmt.Errorf("%w: a layer makes its root opaque (it would hide every layer below it)", ErrRefused)
		}
		return atParent(root, parent, func(fd int) error {
			return unix.Fsetxattr(fd, "trusted.overlay.opaque", []byte("y"), 0)
		})
	}
	full := path.Join(parent, name)
	if err := removeEntry(root, full); err != nil {
		return err
	}
	return atParent(root, parent, func(fd int) error {
		return unix.Mknodat(fd, name, unix.S_IFCHR|0o600, 0)
	})
}

// atParent calls fn with a descriptor of the directory dir of the layer.
func atParent(root *os.Root, dir string, fn func(fd int) error) error {
	d, err := root.Open(dir)
	if err != nil {
		return pathError(err, dir)
	}
	defer d.Close()
	fi, err := d.Stat()
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return fmt.Errorf("%w: %.200q is not a directory in the layer", ErrRefused, dir)
	}
	return fn(int(d.Fd()))
}

// pathError names a failure to write an entry; an escape from the root
// (os.Root's refusal) is the layer's fault.
func pathError(err error, name string) error {
	if err == nil {
		return nil
	}
	if strings.Contains(err.Error(), "path escapes from parent") {
		return fmt.Errorf("%w: a layer has a path that leads out of its root through a link (%.200q)", ErrRefused, name)
	}
	return fmt.Errorf("unpack %.200q: %w", name, err)
}

// FormatBytes is n in the largest binary unit that keeps it whole-ish.
func FormatBytes(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}
