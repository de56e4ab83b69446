package template

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"strings"
	"time"
)

// A COPY or ADD step's layer is the archive Files.Archive wrote, its
// entries placed at the step's destination as Docker places them:
//
//   - a single file goes to dest, or into it where dest ends in "/" or
//     is a directory of the image;
//   - a directory's content, or what a pattern matches, goes into dest;
//   - ADD of a single file that is a tar archive (plain or gzip)
//     unpacks it into dest, the archive's owners kept unless the step
//     names a user;
//   - the directories on the way to dest are written with the owners and
//     modes the image gives them (a layer's directory hides the lower
//     one's attributes), or made 0755 and root's, dest itself the step's
//     user's, where the image has none;
//   - entries are owned by the step's user (root if it names none) and
//     take its mode if it gives one.
//
// Names are made relative to the image's root before they are joined to
// dest ("/" + name, cleaned): no ".." leaves it. The layer then passes
// the store's unpacking, as any layer.

// dirLister is a Files that says whether src is a directory (Context
// does); for others, a single file archived under src's own name is
// taken to be src itself.
type dirLister interface {
	IsDir(src string) (bool, error)
}

// copyStep is what a COPY or ADD step places.
type copyStep struct {
	view       *rootView
	src, dest  string // dest absolute
	add        bool
	uid, gid   int
	chown      bool
	mode       int64
	chmod      bool
	srcDir     bool // src is a directory or a pattern
	singleFile bool // the archive is src's one file
}

func hasGlob(s string) bool { return strings.ContainsAny(s, "*?[") }

// scan reads the headers of the archive in f and says whether it holds
// src's one file.
func (c *copyStep) scan(f *os.File) error {
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return err
	}
	tr := tar.NewReader(f)
	var first *tar.Header
	n := 0
	for ; ; n++ {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("%w: the files of %s: %v", ErrInvalid, c.src, err)
		}
		if first == nil {
			first = h
		}
	}
	c.singleFile = !c.srcDir && !hasGlob(c.src) && n == 1 && first.Typeflag == tar.TypeReg &&
		first.Name == path.Base(path.Clean("/"+c.src))
	return nil
}

// isArchive says whether the one file of the archive in f is itself a
// tar archive, plain or gzip.
func isArchive(f *os.File) bool {
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return false
	}
	tr := tar.NewReader(f)
	if _, err := tr.Next(); err != nil {
		return false
	}
	r, err := maybeGzip(tr)
	if err != nil {
		return false
	}
	_, err = tar.NewReader(r).Next()
	return err == nil
}

func maybeGzip(r io.Reader) (io.Reader, error) {
	br := bufio.NewReader(r)
	magic, _ := br.Peek(2)
	if bytes.Equal(magic, []byte{0x1f, 0x8b}) {
		return gzip.NewReader(br)
	}
	return br, nil
}

// write writes the step's layer from the archive in f to w.
func (c *copyStep) write(f *os.File, w io.Writer) error {
	if err := c.scan(f); err != nil {
		return err
	}
	unpack := c.add && c.singleFile && isArchive(f)
	destDir, rename := c.dest, ""
	if c.singleFile && !unpack && !strings.HasSuffix(c.dest, "/") {
		isDir, err := c.view.isDir(c.dest)
		if err != nil {
			return err
		}
		if !isDir {
			destDir, rename = path.Dir(c.dest), path.Base(c.dest)
		}
	}
	dir, err := c.view.resolve(destDir)
	if err != nil {
		return err
	}
	tw := tar.NewWriter(w)
	if err := c.parents(tw, dir, rename == ""); err != nil {
		return err
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return err
	}
	var tr *tar.Reader
	tr = tar.NewReader(f)
	if unpack {
		if _, err := tr.Next(); err != nil {
			return err
		}
		r, err := maybeGzip(tr)
		if err != nil {
			return fmt.Errorf("%w: ADD %s: %v", ErrInvalid, c.src, err)
		}
		tr = tar.NewReader(r)
	}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("%w: the files of %s: %v", ErrInvalid, c.src, err)
		}
		name := h.Name
		if rename != "" {
			name = rename
		}
		if err := c.entry(tw, tr, h, dir, name, unpack); err != nil {
			return err
		}
	}
	return tw.Close()
}

// within is name (of an archive) as a path under dir, or "" for dir
// itself.
func within(dir, name string) string {
	rel := path.Clean("/" + name)[1:]
	if rel == "" {
		return ""
	}
	return path.Join(dir, rel)
}

func (c *copyStep) entry(tw *tar.Writer, tr *tar.Reader, h *tar.Header, dir, name string, unpack bool) error {
	full := within(dir, name)
	if full == "" {
		return nil // dest itself: written with its parents
	}
	if strings.HasPrefix(path.Base(full), ".wh.") {
		return fmt.Errorf("%w: %s holds %s: a name that an image layer reserves for whiteouts", ErrInvalid, c.src, path.Base(full))
	}
	out := &tar.Header{Name: full, Typeflag: h.Typeflag, Mode: h.Mode & 0o7777, ModTime: h.ModTime, Format: tar.FormatPAX}
	if unpack {
		out.Uid, out.Gid = h.Uid, h.Gid
	}
	if c.chown {
		out.Uid, out.Gid = c.uid, c.gid
	}
	switch h.Typeflag {
	case tar.TypeDir:
		out.Name += "/"
	case tar.TypeReg, tar.TypeRegA:
		out.Typeflag, out.Size = tar.TypeReg, h.Size
	case tar.TypeSymlink:
		out.Linkname = h.Linkname
	case tar.TypeLink:
		if out.Linkname = within(dir, h.Linkname); out.Linkname == "" {
			return fmt.Errorf("%w: %s holds a hard link to its root", ErrInvalid, c.src)
		}
	case tar.TypeFifo, tar.TypeChar, tar.TypeBlock:
		// An archive's (a root file system's /dev): the store makes FIFOs
		// and no device node.
		out.Devmajor, out.Devminor = h.Devmajor, h.Devminor
	default:
		return fmt.Errorf("%w: %s holds %s, which is not a file, a directory or a link", ErrInvalid, c.src, h.Name)
	}
	if c.chmod && out.Typeflag != tar.TypeSymlink {
		out.Mode = c.mode
	}
	if err := tw.WriteHeader(out); err != nil {
		return err
	}
	if out.Typeflag == tar.TypeReg {
		if _, err := io.Copy(tw, tr); err != nil {
			return err
		}
	}
	return nil
}

// parents writes the directories down to dir (relative to the root,
// "." for it) and dir; withDir says that dir is the step's destination
// (made the step's user's where the image has none), not a file's
// parent.
func (c *copyStep) parents(tw *tar.Writer, dir string, withDir bool) error {
	if dir == "." {
		return nil
	}
	parts := strings.Split(dir, "/")
	now := time.Now()
	for i := range parts {
		p := strings.Join(parts[:i+1], "/")
		h := &tar.Header{Typeflag: tar.TypeDir, Name: p + "/", Mode: 0o755, ModTime: now, Format: tar.FormatPAX}
		f, err := c.view.lstat(p)
		switch {
		case err == nil && f.fi.IsDir():
			h.Mode, h.ModTime = int64(f.fi.Mode().Perm()), f.fi.ModTime()
			if f.fi.Mode()&fs.ModeSticky != 0 {
				h.Mode |= 0o1000
			}
			h.Uid, h.Gid = ownerOf(f.fi)
		case err == nil:
			return fmt.Errorf("%w: COPY to /%s: /%s is not a directory in the image", ErrInvalid, dir, p)
		case !errors.Is(err, fs.ErrNotExist):
			return err
		case i == len(parts)-1 && withDir && c.chown:
			h.Uid, h.Gid = c.uid, c.gid
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
	}
	return nil
}
