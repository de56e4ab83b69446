package template

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/vivarium-sandbox/vivarium/internal/image"
	"github.com/vivarium-sandbox/vivarium/internal/testutil"
	"golang.org/x/sys/unix"
)

// sandboxRoot is the host uid and gid of the test's sandbox root.
const sandboxRoot = 3_800_000_000

// TestUpperLayerOverlay changes a real overlay of a store layer, as a
// sandbox's root does (its lower layers idmapped to a user namespace, by
// the store's RootMount), and checks the layer its upper directory
// makes: changed files, new ones with their ids shifted back, a
// whiteout, an opaque directory, a hard link, a link out kept as a link.
func TestUpperLayerOverlay(t *testing.T) {
	s := newStore(t)
	base, err := s.Get("base:1")
	if err != nil {
		t.Fatal(err)
	}
	id, err := s.AddLayer(bytes.NewReader(tarOf(t,
		tentry{name: "etc/a", body: "a", mode: 0o600},
		tentry{name: "etc/b", body: "b", uid: 1000},
		tentry{name: "gone", body: "x"},
		tentry{name: "dir/keep/x", body: "x"},
		tentry{name: "dir/y", body: "y"},
	)))
	if err != nil {
		t.Fatal(err)
	}
	layers := append(base.Layers, id)

	userns := testutil.UserNamespace(t, int(sandboxRoot))

	rw := t.TempDir()
	upper, work, merged := filepath.Join(rw, "upper"), filepath.Join(rw, "work"), filepath.Join(rw, "merged")
	for _, d := range []string{upper, work, merged} {
		os.Mkdir(d, 0o755)
	}
	root, err := s.RootMount(layers, userns, upper, work)
	if errors.Is(err, image.ErrNoIdmap) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	err = unix.MoveMount(int(root.Fd()), "", unix.AT_FDCWD, merged, unix.MOVE_MOUNT_F_EMPTY_PATH)
	root.Close() // an open descriptor of it would keep the overlay busy
	if err != nil {
		t.Fatal(err)
	}
	mounted := true
	defer func() {
		if mounted {
			unix.Unmount(merged, unix.MNT_DETACH)
		}
	}()

	// The sandbox's changes, made here by host root: what it makes is
	// given the sandbox's ids, as its own processes would have them.
	m := func(p string) string { return filepath.Join(merged, p) }
	do := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	own := func(p string, id int) { do(os.Lchown(m(p), sandboxRoot+id, sandboxRoot+id)) }
	f, err := os.OpenFile(m("etc/a"), os.O_WRONLY|os.O_APPEND, 0)
	do(err)
	f.WriteString("+")
	f.Close()
	do(os.Mkdir(m("new"), 0o755))
	own("new", 0)
	do(os.WriteFile(m("new/file"), []byte("new"), 0o640))
	own("new/file", 1000)
	do(os.Link(m("new/file"), m("new/link")))
	do(os.Symlink("/etc/shadow", m("new/out")))
	own("new/out", 0)
	do(os.Remove(m("gone")))
	do(os.RemoveAll(m("dir")))
	do(os.Mkdir(m("dir"), 0o700))
	own("dir", 1000)
	do(os.WriteFile(m("dir/z"), []byte("z"), 0o644))
	own("dir/z", 1000)
	do(unix.Unmount(merged, 0))
	mounted = false

	var buf bytes.Buffer
	n, err := UpperLayer(upper, sandboxRoot, sandboxRoot, &buf)
	if err != nil {
		t.Fatal(err)
	}
	if n == 0 {
		t.Fatal("no entries")
	}
	changed, err := s.AddLayer(&buf)
	if err != nil {
		t.Fatal(err)
	}
	dir := s.LayerDir(changed)
	owner := func(p string) (int, int) {
		t.Helper()
		fi, err := os.Lstat(filepath.Join(dir, p))
		if err != nil {
			t.Fatal(err)
		}
		return ownerOf(fi)
	}
	for p, want := range map[string]int{"etc": 0, "etc/a": 0, "new": 0, "new/file": 1000, "new/out": 0, "dir": 1000, "dir/z": 1000} {
		if uid, gid := owner(p); uid != want || gid != want {
			t.Errorf("%s in the layer is owned by %d:%d, want %d", p, uid, gid, want)
		}
	}
	var a, l syscall.Stat_t
	syscall.Stat(filepath.Join(dir, "new/file"), &a)
	syscall.Stat(filepath.Join(dir, "new/link"), &l)
	if a.Ino != l.Ino {
		t.Error("new/link is not a hard link of new/file in the layer")
	}
	if target, err := os.Readlink(filepath.Join(dir, "new/out")); err != nil || target != "/etc/shadow" {
		t.Errorf("new/out: %q %v", target, err)
	}
	if fi, err := os.Lstat(filepath.Join(dir, "gone")); err != nil || !isWhiteout(fi) {
		t.Errorf("gone is not a whiteout in the layer: %v", err)
	}
	if opaque, err := isOpaqueDir(filepath.Join(dir, "dir")); err != nil || !opaque {
		t.Errorf("dir is not opaque in the layer (%v)", err)
	}

	view := &rootView{}
	for _, id := range append(layers, changed) {
		view.layers = append(view.layers, s.LayerDir(id))
	}
	for p, want := range map[string]string{"/etc/a": "a+", "/etc/b": "b", "/new/link": "new", "/dir/z": "z"} {
		if got, _, _, err := stat(t, view, p); err != nil || got != want {
			t.Errorf("%s of the stacked layers: %q %v, want %q", p, got, err, want)
		}
	}
	for _, p := range []string{"/gone", "/dir/y", "/dir/keep/x"} {
		if _, _, _, err := stat(t, view, p); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s is seen through the stacked layers: %v", p, err)
		}
	}
	// The image built so is whole: Commit names it.
	if _, err := s.Commit("changed:1", &v1.ConfigFile{OS: "linux", Architecture: runtime.GOARCH}, append(layers, changed)); err != nil {
		t.Fatal(err)
	}
}

func isOpaqueDir(dir string) (bool, error) {
	v := make([]byte, 4)
	n, err := unix.Lgetxattr(dir, overlayOpaque, v)
	if errors.Is(err, unix.ENODATA) {
		return false, nil
	}
	return err == nil && string(v[:n]) == "y", err
}

// tarEntries lists an archive: "name" for a file with its content,
// "name -> target" for a link, "name => target" for a hard link.
func tarEntries(t *testing.T, b []byte) []string {
	t.Helper()
	var out []string
	tr := tar.NewReader(bytes.NewReader(b))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		switch h.Typeflag {
		case tar.TypeSymlink:
			out = append(out, h.Name+" -> "+h.Linkname)
		case tar.TypeLink:
			out = append(out, h.Name+" => "+h.Linkname)
		case tar.TypeReg:
			body, _ := io.ReadAll(tr)
			out = append(out, h.Name+"="+string(body))
		default:
			out = append(out, h.Name)
		}
	}
}

// TestUpperLayerHostile: what a sandbox may leave in its upper
// directory that a layer must not take, or must take without following.
func TestUpperLayerHostile(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: files of the sandbox's ids, device nodes")
	}
	const root = 100_000 // the sandbox's root on the host, for these cases
	file := func(p string, uid int) func(string) error {
		return func(upper string) error {
			if err := os.WriteFile(filepath.Join(upper, p), []byte("x"), 0o644); err != nil {
				return err
			}
			return os.Chown(filepath.Join(upper, p), uid, uid)
		}
	}
	for _, c := range []struct {
		name  string
		setup func(upper string) error
		says  string // the refusal, or "" for an upper directory taken
		want  string // then its entries
	}{
		{"host root's file", file("f", 0), "/f is owned by host ids 0:0", ""},
		{"an id past the sandbox's", file("f", root+70_000), "/f is owned by host ids 170000:170000", ""},
		{"a FIFO", func(u string) error { return syscall.Mkfifo(filepath.Join(u, "p"), 0o644) }, "/p is a FIFO", ""},
		{"a device node", func(u string) error {
			return syscall.Mknod(filepath.Join(u, "mem"), syscall.S_IFCHR|0o600, int(unix.Mkdev(1, 1)))
		}, "/mem is a device node", ""},
		{"a block device", func(u string) error {
			return syscall.Mknod(filepath.Join(u, "disk"), syscall.S_IFBLK|0o600, int(unix.Mkdev(7, 0)))
		}, "/disk is a device node", ""},
		{"a whiteout's name", file(".wh.x", root), "reserves for whiteouts", ""},
		{"an overlayfs redirect", func(u string) error {
			d := filepath.Join(u, "moved")
			if err := os.Mkdir(d, 0o755); err != nil {
				return err
			}
			os.Chown(d, root, root)
			return unix.Setxattr(d, "trusted.overlay.redirect", []byte("/etc"), 0)
		}, "trusted.overlay.redirect", ""},
		{"links out, kept as links", func(u string) error {
			if err := os.Symlink("/etc", filepath.Join(u, "etc")); err != nil {
				return err
			}
			if err := os.Symlink("../../../../etc/shadow", filepath.Join(u, "shadow")); err != nil {
				return err
			}
			os.Lchown(filepath.Join(u, "etc"), root, root)
			return os.Lchown(filepath.Join(u, "shadow"), root, root)
		}, "", "etc -> /etc shadow -> ../../../../etc/shadow"},
		{"hard links", func(u string) error {
			if err := file("a", root)(u); err != nil {
				return err
			}
			if err := os.Link(filepath.Join(u, "a"), filepath.Join(u, "b")); err != nil {
				return err
			}
			// A link to a file outside the upper directory is copied.
			outside := filepath.Join(filepath.Dir(u), "outside")
			if err := os.WriteFile(outside, []byte("host"), 0o644); err != nil {
				return err
			}
			os.Chown(outside, root, root)
			return os.Link(outside, filepath.Join(u, "c"))
		}, "", "a=x b => a c=host"},
	} {
		t.Run(c.name, func(t *testing.T) {
			upper := filepath.Join(t.TempDir(), "upper")
			os.Mkdir(upper, 0o755)
			if err := c.setup(upper); err != nil {
				t.Fatal(err)
			}
			var buf bytes.Buffer
			_, err := UpperLayer(upper, root, root, &buf)
			if c.says != "" {
				if !errors.Is(err, ErrUpperRefused) || !strings.Contains(err.Error(), c.says) {
					t.Errorf("err = %v, want a refusal saying %q", err, c.says)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := strings.Join(tarEntries(t, buf.Bytes()), " "); got != c.want {
				t.Errorf("entries %q, want %q", got, c.want)
			}
		})
	}
}
