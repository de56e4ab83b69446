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
	"io"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
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
	key, err := hex.DecodeString(strings.TrimSpace(string(b)))
	if err != nil || len(key) < KeySize {
		return nil, fmt.Errorf("snapshot key %s: want %d hex-encoded bytes", path, KeySize)
	}
	return key, nil
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

// digest is the HMAC of dir's listing: one line per entry but the
// signature and sockets (which a snapshot's files may hold, and which
// nothing restores), in lexical order.
func digest(dir string, key []byte) ([]byte, error) {
	mac := hmac.New(sha256.New, key)
	w := bufio.NewWriter(mac)
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if rel == SignatureFile {
			return nil
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		kind, extra := "", ""
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
			kind = "d"
		case unix.S_IFREG:
			kind = "f"
			h, err := fileHash(p)
			if err != nil {
				return err
			}
			extra = fmt.Sprintf("%d %s", st.Size, h)
		case unix.S_IFLNK:
			kind = "l"
			t, err := os.Readlink(p)
			if err != nil {
				return err
			}
			extra = hex.EncodeToString([]byte(t))
		case unix.S_IFIFO:
			kind = "p"
		case unix.S_IFSOCK:
			return nil
		default:
			return fmt.Errorf("%s: a device", rel)
		}
		attrs, err := xattrs(p)
		if err != nil {
			return err
		}
		fmt.Fprintf(w, "%s\x00%s %o %d %d %s", hex.EncodeToString([]byte(rel)), kind, st.Mode&0o7777, st.Uid, st.Gid, extra)
		for _, k := range slices.Sorted(maps.Keys(attrs)) {
			fmt.Fprintf(w, " %s=%s", hex.EncodeToString([]byte(k)), hex.EncodeToString(attrs[k]))
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

func fileHash(p string) (string, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
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
