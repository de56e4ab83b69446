package snapshot

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// xattrPrefix is how a tar stream's PAX records carry extended
// attributes (GNU tar's and Go's SCHILY form).
const xattrPrefix = "SCHILY.xattr."

// Export writes dir (its signature too) to w as a tar stream: owners as
// numbers, modes, extended attributes. Sockets are left out, as Sign
// leaves them out.
func Export(w io.Writer, dir string) error {
	tw := tar.NewWriter(w)
	err := walk(dir, func(e *entry) error {
		if e.rel == "." {
			return nil
		}
		h := &tar.Header{Name: filepath.ToSlash(e.rel), Mode: int64(e.st.Mode & 0o7777), Uid: int(e.st.Uid),
			Gid: int(e.st.Gid), Format: tar.FormatPAX}
		switch e.st.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
			h.Typeflag, h.Name = tar.TypeDir, h.Name+"/"
		case unix.S_IFREG:
			h.Typeflag, h.Size = tar.TypeReg, e.st.Size
		case unix.S_IFLNK:
			h.Typeflag, h.Linkname = tar.TypeSymlink, e.link
		case unix.S_IFIFO:
			h.Typeflag = tar.TypeFifo
		}
		for k, v := range e.attrs {
			if h.PAXRecords == nil {
				h.PAXRecords = map[string]string{}
			}
			h.PAXRecords[xattrPrefix+k] = string(v)
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if h.Typeflag != tar.TypeReg {
			return nil
		}
		f, err := os.Open(e.path)
		if err != nil {
			return err
		}
		defer f.Close()
		if _, err := io.CopyN(tw, f, h.Size); err != nil {
			return fmt.Errorf("%s: %w", e.rel, err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	return tw.Close()
}

// Errors of Import.
var (
	// ErrTooLarge: an imported stream holds more than its limit.
	ErrTooLarge = errors.New("the snapshot is larger than allowed")
	// ErrNotSnapshot: an imported stream is not an archive as Export
	// writes one.
	ErrNotSnapshot = errors.New("not a snapshot's archive")
)

// maxEntries bounds the entries of an imported stream.
const maxEntries = 1 << 20

// sparsePrefix starts the PAX records of GNU's sparse files. A sparse
// entry's holes are not in the stream, and tar.Reader reads them back as
// zeros: a few KiB could write gigabytes before the signature is checked.
// Export never writes one, so Import refuses them.
const sparsePrefix = "GNU.sparse."

// Import reads a tar stream that Export wrote into dir, which must not
// exist (it is made 0700), and returns the bytes it counted: the files'
// contents, and 512 for each entry. Every byte it writes was in the
// stream: sparse entries are refused.
// Only directories, regular files, symbolic links and FIFOs are made,
// each beneath dir and through no symbolic link (openat2 RESOLVE_BENEATH
// and RESOLVE_NO_SYMLINKS); more than limit bytes counted fail it with
// ErrTooLarge, and what is not such an archive with ErrNotSnapshot.
// room, if not nil, is asked before each file's contents are written
// (the host's disk: internal/hostdisk), and its error ends the import.
// On failure dir is removed. The caller then checks the signature
// (Verify) before trusting anything in it. Errors name paths of the
// archive, never of the host.
func Import(r io.Reader, dir string, limit int64, room func(need int64) error) (n int64, err error) {
	if err := os.Mkdir(dir, 0o700); err != nil {
		return 0, errors.Unwrap(err) // a *PathError names the host's path
	}
	defer func() {
		if err != nil {
			os.RemoveAll(dir)
		}
	}()
	root, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, err
	}
	defer unix.Close(root)
	tr := tar.NewReader(r)
	for entries := 0; ; entries++ {
		h, err := tr.Next()
		if err == io.EOF {
			return n, nil
		}
		if err != nil {
			return n, fmt.Errorf("%w: %w", ErrNotSnapshot, err)
		}
		if entries >= maxEntries {
			return n, fmt.Errorf("%w: more than %d entries", ErrTooLarge, maxEntries)
		}
		name := strings.TrimSuffix(h.Name, "/")
		if name == "" || name == "." || path.IsAbs(name) || path.Clean(name) != name || strings.HasPrefix(name, "../") || name == ".." {
			return n, fmt.Errorf("%w: the path %q", ErrNotSnapshot, h.Name)
		}
		if sparse(h) {
			return n, fmt.Errorf("%w: %s is a sparse file, which a snapshot never holds", ErrNotSnapshot, h.Name)
		}
		parent, base := path.Split(name)
		pfd := root
		if parent != "" {
			pfd, err = unix.Openat2(root, strings.TrimSuffix(parent, "/"), &unix.OpenHow{
				Flags:   unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC,
				Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
			})
			if err != nil {
				return n, fmt.Errorf("%w: %s: %w", ErrNotSnapshot, h.Name, err)
			}
		}
		// Every entry counts a header's 512 bytes against the limit, an
		// inode on the host's disk: many empty files cannot pass where
		// their bytes would not.
		n += 512
		if n > limit {
			if pfd != root {
				unix.Close(pfd)
			}
			return n, fmt.Errorf("%w: more entries than its room", ErrTooLarge)
		}
		if h.Typeflag == tar.TypeReg && h.Size > 0 && room != nil {
			err = room(h.Size)
		}
		if err == nil {
			err = makeEntry(tr, h, pfd, base, limit-n)
		}
		if h.Typeflag == tar.TypeReg {
			n += h.Size
		}
		if pfd != root {
			unix.Close(pfd)
		}
		if err != nil {
			return n, fmt.Errorf("%s: %w", h.Name, err)
		}
	}
}

// sparse reports whether h is a sparse file, in GNU's old form or PAX's.
func sparse(h *tar.Header) bool {
	if h.Typeflag == tar.TypeGNUSparse {
		return true
	}
	for k := range h.PAXRecords {
		if strings.HasPrefix(k, sparsePrefix) {
			return true
		}
	}
	return false
}

// makeEntry makes one entry, base, in the directory pfd.
func makeEntry(tr *tar.Reader, h *tar.Header, pfd int, base string, room int64) error {
	mode := uint32(h.Mode & 0o7777)
	switch h.Typeflag {
	case tar.TypeDir:
		if err := unix.Mkdirat(pfd, base, 0o700); err != nil {
			return err
		}
	case tar.TypeReg:
		if h.Size > room {
			return ErrTooLarge
		}
		fd, err := unix.Openat(pfd, base, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		if err != nil {
			return err
		}
		f := os.NewFile(uintptr(fd), base)
		_, err = io.CopyN(f, streamErrs{tr}, h.Size)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
	case tar.TypeSymlink:
		if err := unix.Symlinkat(h.Linkname, pfd, base); err != nil {
			return err
		}
	case tar.TypeFifo:
		if err := unix.Mkfifoat(pfd, base, 0o600); err != nil {
			return err
		}
	default:
		return fmt.Errorf("%w: entry type %q", ErrNotSnapshot, h.Typeflag)
	}
	// Owner, mode and attributes, on the entry itself (never through a
	// link): through a descriptor of it, opened beneath pfd.
	fd, err := unix.Openat(pfd, base, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	self := fmt.Sprintf("/proc/self/fd/%d", fd)
	if err := unix.Fchownat(fd, "", h.Uid, h.Gid, unix.AT_EMPTY_PATH|unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return err
	}
	if h.Typeflag == tar.TypeSymlink {
		return nil // a link's mode and attributes are not its own to set
	}
	if err := unix.Chmod(self, mode); err != nil {
		return err
	}
	for k, v := range h.PAXRecords {
		if name, ok := strings.CutPrefix(k, xattrPrefix); ok {
			if err := unix.Setxattr(self, name, []byte(v), 0); err != nil {
				return fmt.Errorf("set %s: %w", name, err)
			}
		}
	}
	return nil
}

// streamErrs tells the stream's errors (one that ends early, or whose
// sender stopped) from the host's while a file is copied out of it.
type streamErrs struct{ r io.Reader }

func (s streamErrs) Read(p []byte) (int, error) {
	n, err := s.r.Read(p)
	if err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF // CopyN stops at the size: EOF before it is short
		}
		err = fmt.Errorf("%w: the stream: %w", ErrNotSnapshot, err)
	}
	return n, err
}
