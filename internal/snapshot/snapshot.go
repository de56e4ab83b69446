// Package snapshot keeps the integrity of snapshot directories that a
// server stores and moves between hosts. A snapshot holds what CRIU, which
// runs as root, reads to restore processes: a restore must only ever read
// a snapshot this server (or one sharing its key) wrote, unchanged. Sign
// records an HMAC-SHA-256, under the server's snapshot key, of everything
// in the directory (every path, its type, mode, owner, extended attributes
// and contents); Verify recomputes it. Export writes a directory as a tar
// stream, Import reads one back into a new directory, refusing anything a
// snapshot does not hold (devices, paths out of the directory, links
// followed on the way) and stopping at a size.
package snapshot

import (
	"bufio"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/vivarium-sandbox/vivarium/internal/fileutil"
)

// SignatureFile is the name of a signed directory's signature.
const SignatureFile = "signature"

// KeySize is the size of a snapshot key.
const KeySize = 32

// ErrTampered: a directory's contents are not those its signature names,
// or it has none; or it was signed with another key.
var ErrTampered = errors.New("the snapshot was not made by this server (nor one sharing its snapshot key), or it was changed since")

// LoadKey reads the snapshot key at path, making one (0600) if there is
// none.
func LoadKey(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		b = make([]byte, KeySize)
		if _, err := rand.Read(b); err != nil {
			return nil, err
		}
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			return nil, err
		}
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if errors.Is(err, fs.ErrExist) {
			return LoadKey(path) // made meanwhile
		}
		if err != nil {
			return nil, err
		}
		_, err = f.Write([]byte(hex.EncodeToString(b) + "\n"))
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		return b, err
	}
	if err != nil {
		return nil, err
	}
	if err := private(path); err != nil {
		return nil, err
	}
	key, err := hex.DecodeString(strings.TrimSpace(string(b)))
	if err != nil || len(key) < KeySize {
		return nil, fmt.Errorf("snapshot key %s: want %d hex-encoded bytes", path, KeySize)
	}
	return key, nil
}

// private checks that the key at path is this user's alone: whoever can
// read it can forge snapshots this server restores, as root, with CRIU;
// whoever can write it can make it take theirs.
func private(path string) error {
	fi, err := os.Stat(path)
	if err != nil {
		return err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	switch {
	case !fi.Mode().IsRegular():
		return fmt.Errorf("snapshot key %s is not a regular file", path)
	case fi.Mode().Perm()&0o077 != 0:
		return fmt.Errorf("snapshot key %s has mode %04o: others may read or change it, and so forge snapshots this "+
			"server restores; make it its owner's alone (chmod 600 %s)", path, fi.Mode().Perm(), path)
	case ok && int(st.Uid) != os.Geteuid():
		return fmt.Errorf("snapshot key %s belongs to uid %d, not to the server's user (%d): make it the server's "+
			"(chown %d %s)", path, st.Uid, os.Geteuid(), os.Geteuid(), path)
	}
	return nil
}

// Sign writes dir's signature under key.
func Sign(dir string, key []byte) error {
	sum, err := digest(dir, key)
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, SignatureFile), []byte(hex.EncodeToString(sum)+"\n"), 0o600)
}

// Verify checks dir against its signature under key (ErrTampered).
func Verify(dir string, key []byte) error {
	b, err := os.ReadFile(filepath.Join(dir, SignatureFile))
	if err != nil {
		return fmt.Errorf("%w (no signature: %v)", ErrTampered, err)
	}
	want, err := hex.DecodeString(strings.TrimSpace(string(b)))
	if err != nil {
		return ErrTampered
	}
	got, err := digest(dir, key)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrTampered, err)
	}
	if !hmac.Equal(got, want) {
		return ErrTampered
	}
	return nil
}

// MAC is the HMAC-SHA-256 of data under key, in hex: for a small record
// that must be trusted before its directory is verified whole (Verify
// reads every byte).
func MAC(data, key []byte) string {
	m := hmac.New(sha256.New, key)
	m.Write(data)
	return hex.EncodeToString(m.Sum(nil))
}

// CheckMAC checks a MAC of data under key (ErrTampered).
func CheckMAC(data, key []byte, mac string) error {
	if !hmac.Equal([]byte(MAC(data, key)), []byte(strings.TrimSpace(mac))) {
		return ErrTampered
	}
	return nil
}

// digest is the HMAC of dir's listing (walk): one line per entry but the
// signature, in lexical order.
func digest(dir string, key []byte) ([]byte, error) {
	mac := hmac.New(sha256.New, key)
	w := bufio.NewWriter(mac)
	err := walk(dir, func(e *entry) error {
		if e.rel == SignatureFile {
			return nil
		}
		kind, extra := "", ""
		switch e.st.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
			kind = "d"
		case unix.S_IFREG:
			kind = "f"
			h, err := fileutil.SHA256(e.path)
			if err != nil {
				return err
			}
			extra = fmt.Sprintf("%d %s", e.st.Size, h)
		case unix.S_IFLNK:
			kind, extra = "l", hex.EncodeToString([]byte(e.link))
		case unix.S_IFIFO:
			kind = "p"
		}
		fmt.Fprintf(w, "%s\x00%s %o %d %d %s", hex.EncodeToString([]byte(e.rel)), kind, e.st.Mode&0o7777, e.st.Uid,
			e.st.Gid, extra)
		for _, k := range slices.Sorted(maps.Keys(e.attrs)) {
			fmt.Fprintf(w, " %s=%s", hex.EncodeToString([]byte(k)), hex.EncodeToString(e.attrs[k]))
		}
		w.WriteByte('\n')
		return nil
	})
	if err != nil {
		return nil, err
	}
	if err := w.Flush(); err != nil {
		return nil, err
	}
	return mac.Sum(nil), nil
}

// entry is one thing in a snapshot's directory, as Sign and Export see
// it.
type entry struct {
	path, rel string // rel: "." for the directory itself
	st        unix.Stat_t
	link      string // a symbolic link's target
	attrs     map[string][]byte
}

// walk calls fn for dir and everything in it, in lexical order, never
// following a link. Sockets (a snapshot's files may hold them; nothing
// restores them) are left out, and a device fails it: Sign and Export
// see the same entries, so that an export verifies once imported.
func walk(dir string, fn func(*entry) error) error {
	return filepath.WalkDir(dir, func(p string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		e := &entry{path: p}
		e.rel, _ = filepath.Rel(dir, p)
		if err := unix.Lstat(p, &e.st); err != nil {
			return err
		}
		switch e.st.Mode & unix.S_IFMT {
		case unix.S_IFDIR, unix.S_IFREG, unix.S_IFIFO:
		case unix.S_IFLNK:
			if e.link, err = os.Readlink(p); err != nil {
				return err
			}
		case unix.S_IFSOCK:
			return nil
		default:
			return fmt.Errorf("%s: a device", e.rel)
		}
		if e.attrs, err = xattrs(p); err != nil {
			return err
		}
		return fn(e)
	})
}

// xattrs reads p's extended attributes (not following a link).
func xattrs(p string) (map[string][]byte, error) {
	buf := make([]byte, 4096)
	n, err := unix.Llistxattr(p, buf)
	if errors.Is(err, unix.ENOTSUP) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("%s: list its attributes: %w", p, err)
	}
	out := map[string][]byte{}
	for _, name := range strings.Split(string(buf[:n]), "\x00") {
		if name == "" {
			continue
		}
		v := make([]byte, 64<<10)
		m, err := unix.Lgetxattr(p, name, v)
		if errors.Is(err, unix.ENODATA) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %s: %w", p, name, err)
		}
		out[name] = v[:m]
	}
	return out, nil
}
