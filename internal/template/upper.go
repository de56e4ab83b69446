package template

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// A RUN step's changes are the sandbox's writable layer: overlayfs's
// upper directory, on the host, written by code that may be hostile and
// may still run while it is read. UpperLayer turns it into a layer tar,
// which then passes the store's own unpacking (Store.AddLayer), as a
// registry's layer does. Reading it:
//
//  1. every directory is opened relative to its parent's descriptor with
//     O_NOFOLLOW, every file likewise and checked (fstat) to be the
//     regular file that was listed: no link is followed, and an entry
//     swapped while it is read is refused, not read through;
//  2. owners are the sandbox's: a host id is shifted back by the host id
//     of the sandbox's root, and one outside its 65,536 ids is refused;
//  3. a whiteout (a character device 0:0) becomes a ".wh.NAME" entry, a
//     directory with trusted.overlay.opaque=y a ".wh..wh..opq" entry;
//     any other device node, a FIFO or a socket is refused, and so is an
//     overlayfs attribute that would make a file's content live
//     elsewhere (redirect, metacopy) or that this code does not know;
//  4. a file with other hard links in the layer is written as a hard
//     link to the first; one whose other links are elsewhere is copied.

// overlayAttrs are the overlayfs attributes an upper directory holds
// after ordinary changes, which a layer does without: where a file was
// copied up from (origin), that a directory holds such files (impure),
// the file system's id (uuid, on the upper directory itself).
var overlayAttrs = []string{"trusted.overlay.origin", "trusted.overlay.impure", "trusted.overlay.uuid"}

const overlayOpaque = "trusted.overlay.opaque"

// sandboxIDs is how many ids a sandbox has, from its root's.
const sandboxIDs = 65536

// UpperLayer writes the upper directory upper as an uncompressed layer
// tar to w, ids shifted back by uid0 and gid0 (the host ids of the
// sandbox's root), and returns how many entries it wrote: 0 for an
// upper directory that holds nothing (then w has an empty archive).
func UpperLayer(upper string, uid0, gid0 uint32, w io.Writer) (int, error) {
	fd, err := unix.Open(upper, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, fmt.Errorf("open the sandbox's upper directory: %w", err)
	}
	u := &upperWalk{tw: tar.NewWriter(w), uid0: uid0, gid0: gid0, links: map[[2]uint64]string{}}
	err = u.dir(fd, "")
	unix.Close(fd)
	if err != nil {
		return u.n, err
	}
	return u.n, u.tw.Close()
}

type upperWalk struct {
	tw         *tar.Writer
	uid0, gid0 uint32
	links      map[[2]uint64]string // (dev, ino) -> the first name of a file with hard links
	n          int
}

func (u *upperWalk) refuse(name, why string) error {
	return fmt.Errorf("%w: /%s %s", ErrUpperRefused, name, why)
}

// ids are st's owners as the sandbox sees them.
func (u *upperWalk) ids(name string, st *unix.Stat_t) (int, int, error) {
	if st.Uid < u.uid0 || st.Uid-u.uid0 >= sandboxIDs || st.Gid < u.gid0 || st.Gid-u.gid0 >= sandboxIDs {
		return 0, 0, u.refuse(name, fmt.Sprintf("is owned by host ids %d:%d, which are not the sandbox's", st.Uid, st.Gid))
	}
	return int(st.Uid - u.uid0), int(st.Gid - u.gid0), nil
}

func (u *upperWalk) header(name string, typ byte, st *unix.Stat_t) (*tar.Header, error) {
	uid, gid, err := u.ids(name, st)
	if err != nil {
		return nil, err
	}
	return &tar.Header{Typeflag: typ, Name: name, Mode: int64(st.Mode & 0o7777), Uid: uid, Gid: gid,
		ModTime: time.Unix(st.Mtim.Unix()), Format: tar.FormatPAX}, nil
}

func (u *upperWalk) write(h *tar.Header) error {
	u.n++
	return u.tw.WriteHeader(h)
}

// dir writes what the directory fd (the layer's path prefix) holds.
func (u *upperWalk) dir(fd int, prefix string) error {
	names, err := readDirNames(fd)
	if err != nil {
		return fmt.Errorf("read /%s: %w", prefix, err)
	}
	for _, base := range names {
		name := path.Join(prefix, base)
		if strings.HasPrefix(base, ".wh.") {
			return u.refuse(name, "has a name that a layer reserves for whiteouts")
		}
		var st unix.Stat_t
		if err := unix.Fstatat(fd, base, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return fmt.Errorf("stat /%s: %w", name, err)
		}
		if err := u.entry(fd, base, name, &st); err != nil {
			return err
		}
	}
	return nil
}

func (u *upperWalk) entry(parent int, base, name string, st *unix.Stat_t) error {
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFCHR:
		if st.Rdev != 0 {
			return u.refuse(name, "is a device node")
		}
		// A whiteout: overlayfs makes it as the mounter, so its owner is
		// not the sandbox's and says nothing.
		return u.write(&tar.Header{Typeflag: tar.TypeReg, Name: path.Join(path.Dir(name), ".wh."+base), Mode: 0o600,
			ModTime: time.Unix(st.Mtim.Unix()), Format: tar.FormatPAX})
	case unix.S_IFDIR:
		fd, err := unix.Openat(parent, base, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("open /%s: %w", name, err)
		}
		defer unix.Close(fd)
		if err := unix.Fstat(fd, st); err != nil {
			return err
		}
		opaque, err := u.attrs(fd, name)
		if err != nil {
			return err
		}
		h, err := u.header(name+"/", tar.TypeDir, st)
		if err != nil {
			return err
		}
		if err := u.write(h); err != nil {
			return err
		}
		if opaque {
			if err := u.write(&tar.Header{Typeflag: tar.TypeReg, Name: name + "/.wh..wh..opq", Mode: 0o600,
				ModTime: h.ModTime, Format: tar.FormatPAX}); err != nil {
				return err
			}
		}
		return u.dir(fd, name)
	case unix.S_IFREG:
		return u.file(parent, base, name, st)
	case unix.S_IFLNK:
		target, err := readlinkat(parent, base)
		if err != nil {
			return fmt.Errorf("readlink /%s: %w", name, err)
		}
		h, err := u.header(name, tar.TypeSymlink, st)
		if err != nil {
			return err
		}
		h.Linkname = target
		return u.write(h)
	case unix.S_IFIFO:
		return u.refuse(name, "is a FIFO")
	case unix.S_IFSOCK:
		return u.refuse(name, "is a socket")
	}
	return u.refuse(name, "is a device node")
}

// file writes a regular file, opened without following a link and seen
// to be the file that was listed.
func (u *upperWalk) file(parent int, base, name string, listed *unix.Stat_t) error {
	fd, err := unix.Openat(parent, base, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open /%s: %w", name, err)
	}
	f := os.NewFile(uintptr(fd), name)
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Ino != listed.Ino || st.Dev != listed.Dev {
		return u.refuse(name, "was replaced while it was read")
	}
	if _, err := u.attrs(fd, name); err != nil {
		return err
	}
	h, err := u.header(name, tar.TypeReg, &st)
	if err != nil {
		return err
	}
	if st.Nlink > 1 {
		key := [2]uint64{st.Dev, st.Ino}
		if first, ok := u.links[key]; ok {
			h.Typeflag, h.Linkname = tar.TypeLink, first
			return u.write(h)
		}
		u.links[key] = name
	}
	h.Size = st.Size
	if err := u.write(h); err != nil {
		return err
	}
	if _, err := io.CopyN(u.tw, f, st.Size); err != nil {
		if errors.Is(err, io.EOF) {
			return u.refuse(name, "shrank while it was read")
		}
		return fmt.Errorf("read /%s: %w", name, err)
	}
	return nil
}

// attrs checks the overlayfs attributes of fd and says whether it is an
// opaque directory.
func (u *upperWalk) attrs(fd int, name string) (opaque bool, err error) {
	names, err := listxattr(fd)
	if err != nil {
		return false, fmt.Errorf("list the attributes of /%s: %w", name, err)
	}
	for _, a := range names {
		switch {
		case !strings.HasPrefix(a, "trusted.overlay."), slices.Contains(overlayAttrs, a):
		case a == overlayOpaque:
			v := make([]byte, 8)
			n, err := unix.Fgetxattr(fd, a, v)
			if err != nil {
				return false, fmt.Errorf("read %s of /%s: %w", a, name, err)
			}
			opaque = string(v[:n]) == "y"
		default:
			return false, u.refuse(name, "has the overlayfs attribute "+a+", which a layer cannot hold")
		}
	}
	return opaque, nil
}

func listxattr(fd int) ([]string, error) {
	buf := make([]byte, 4096)
	for {
		n, err := unix.Flistxattr(fd, buf)
		if errors.Is(err, unix.ERANGE) && len(buf) < 1<<20 {
			buf = make([]byte, 4*len(buf))
			continue
		}
		if err != nil {
			return nil, err
		}
		var out []string
		for _, a := range strings.Split(string(buf[:n]), "\x00") {
			if a != "" {
				out = append(out, a)
			}
		}
		return out, nil
	}
}

func readlinkat(dirfd int, name string) (string, error) {
	buf := make([]byte, unix.PathMax)
	n, err := unix.Readlinkat(dirfd, name, buf)
	if err != nil {
		return "", err
	}
	return string(buf[:n]), nil
}

// readDirNames lists the directory fd, sorted, leaving fd as it was.
func readDirNames(fd int) ([]string, error) {
	dup, err := unix.Openat(fd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(dup), "dir")
	defer f.Close()
	names, err := f.Readdirnames(-1)
	slices.Sort(names)
	return names, err
}
