package template

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"path"
	"strings"
)

// Build files sent as an archive: E2B's Template SDK uploads, for each
// COPY, a tar (gzipped, or not) of what the step's source matches, its
// entries named as in the build's directory. CheckArchive reads such an
// archive as the hostile input it is; ArchiveFrom gives a COPY's tar from
// it, as Context.Archive does from a directory.

// ErrTooLarge: an archive of build files past its bounds.
var ErrTooLarge = errors.New("build files too large")

// ArchiveLimits bound an archive of build files.
type ArchiveLimits struct {
	// MaxBytes bounds the tar stream, uncompressed: a gzip bomb, or a
	// header that claims a huge file, is refused as it passes the bound.
	MaxBytes int64
	// MaxEntries bounds the entries.
	MaxEntries int
}

// maxArchiveName bounds an entry's name and a link's target.
const maxArchiveName = 4096

// CheckArchive reads the archive r whole and says what is wrong with it:
// not a tar (or a gzipped one), an entry outside the build's files (an
// absolute name, a ".." in it), a hard link, a device, a FIFO, or past
// lim. Symbolic links are taken as links, whatever they point to: they
// are written as links, never followed, by what unpacks them.
func CheckArchive(r io.Reader, lim ArchiveLimits) error {
	return walkArchive(r, lim, func(string, *tar.Header, io.Reader) error { return nil })
}

// ArchiveFrom writes, as a tar to w, what a COPY of src (a path or a
// pattern of the build's files) takes from the archive r, as
// Context.Archive does from a directory, and returns the digest of that
// tar. The archive is checked again as it is read.
func ArchiveFrom(r io.Reader, lim ArchiveLimits, src string, w io.Writer) (string, error) {
	src, re, err := copyPattern(src)
	if err != nil {
		return "", err
	}
	h := sha256.New()
	tw := tar.NewWriter(io.MultiWriter(w, h))
	found := false
	err = walkArchive(r, lim, func(p string, hdr *tar.Header, content io.Reader) error {
		name, ok := copyName(src, re, p, hdr.Typeflag == tar.TypeDir)
		if !ok {
			return nil
		}
		found = true
		// Owners and times left out, set-ID and sticky bits dropped, as
		// Context.Archive writes.
		out := &tar.Header{Typeflag: hdr.Typeflag, Name: name, Mode: hdr.Mode & 0o777}
		switch hdr.Typeflag {
		case tar.TypeDir:
			out.Name += "/"
		case tar.TypeSymlink:
			out.Linkname, out.Mode = hdr.Linkname, 0o777
		default:
			out.Size = hdr.Size
		}
		if err := tw.WriteHeader(out); err != nil {
			return err
		}
		_, err := io.Copy(tw, content)
		return err
	})
	if err != nil {
		return "", err
	}
	if !found {
		return "", fmt.Errorf("%w: COPY %s: no such file in the files uploaded for it", ErrInvalid, src)
	}
	if err := tw.Close(); err != nil {
		return "", err
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil)), nil
}

// walkArchive reads the archive r and calls fn with each entry's name
// (cleaned, relative), header and content; it refuses what CheckArchive
// says.
func walkArchive(r io.Reader, lim ArchiveLimits, fn func(name string, hdr *tar.Header, content io.Reader) error) error {
	stream, err := openArchive(r)
	if err != nil {
		return err
	}
	defer stream.Close()
	counted := &boundedReader{r: stream, left: lim.MaxBytes}
	tr := tar.NewReader(counted)
	for n := 0; ; n++ {
		hdr, err := tr.Next()
		switch {
		case err == io.EOF:
			return nil
		case counted.over:
			return fmt.Errorf("%w: more than %d bytes uncompressed", ErrTooLarge, lim.MaxBytes)
		case err != nil:
			return fmt.Errorf("%w: the build files are not a valid tar archive: %v", ErrInvalid, err)
		case n >= lim.MaxEntries:
			return fmt.Errorf("%w: more than %d files", ErrTooLarge, lim.MaxEntries)
		}
		if hdr.Typeflag == tar.TypeXGlobalHeader {
			continue
		}
		name, err := archiveName(hdr)
		if err != nil {
			return err
		}
		if err := fn(name, hdr, tr); err != nil {
			if counted.over {
				return fmt.Errorf("%w: more than %d bytes uncompressed", ErrTooLarge, lim.MaxBytes)
			}
			return err
		}
	}
}

// archiveName is an entry's name, cleaned, once its name and type are
// seen to be those of build files.
func archiveName(hdr *tar.Header) (string, error) {
	bad := func(why string) (string, error) {
		return "", fmt.Errorf("%w: build files: %q: %s", ErrInvalid, truncate(hdr.Name), why)
	}
	if len(hdr.Name) > maxArchiveName || len(hdr.Linkname) > maxArchiveName {
		return bad("a name longer than 4096 bytes")
	}
	switch hdr.Typeflag {
	case tar.TypeReg, tar.TypeRegA, tar.TypeDir, tar.TypeSymlink:
	case tar.TypeLink:
		return bad("a hard link: send the file itself")
	default:
		return bad("not a file, a directory or a symbolic link")
	}
	name := strings.TrimSuffix(hdr.Name, "/")
	if strings.HasPrefix(name, "/") {
		return bad("an absolute path")
	}
	for _, el := range strings.Split(name, "/") {
		if el == ".." {
			return bad("a path outside the build's files")
		}
	}
	name = path.Clean(name)
	if name == "." || strings.ContainsRune(name, 0) {
		return bad("not a file's name")
	}
	return name, nil
}

func truncate(s string) string {
	if len(s) > 200 {
		return s[:200] + "..."
	}
	return s
}

// openArchive is the tar stream of an archive: gunzipped if it is gzip
// (by its magic number), else as it is.
func openArchive(r io.Reader) (io.ReadCloser, error) {
	br := bufio.NewReader(r)
	if magic, _ := br.Peek(2); bytes.Equal(magic, []byte{0x1f, 0x8b}) {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, fmt.Errorf("%w: the build files are not valid gzip: %v", ErrInvalid, err)
		}
		return zr, nil
	}
	return io.NopCloser(br), nil
}

// boundedReader reads at most left bytes of r, then fails, marking over.
type boundedReader struct {
	r    io.Reader
	left int64
	over bool
}

var errOverBound = errors.New("over the bound")

func (b *boundedReader) Read(p []byte) (int, error) {
	if b.left <= 0 {
		// One byte more tells a stream of exactly the bound from a
		// longer one.
		var one [1]byte
		if n, _ := b.r.Read(one[:]); n > 0 {
			b.over = true
			return 0, errOverBound
		}
		return 0, io.EOF
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.r.Read(p)
	b.left -= int64(n)
	return n, err
}
