package testutil

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"golang.org/x/sys/unix"

	"github.com/vivarium-sandbox/vivarium/internal/hostroot"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

// RootLayer makes, in dir, an image layer of the host's python3, a shell
// and a few programs (hostroot.Layer): a small root a template's sandbox
// can run code and commands in.
func RootLayer(t testing.TB, dir string) {
	t.Helper()
	RequirePython(t)
	if err := hostroot.Layer(dir, "", false); err != nil {
		t.Fatal(err)
	}
}

// TarDir writes the tree at dir as an uncompressed tar (hostroot.Tar).
func TarDir(t testing.TB, dir string) []byte {
	t.Helper()
	b, err := hostroot.Tar(dir)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TemplateRoot makes a template's root of two layers: the host's Python
// and a few programs (RootLayer), and over it a layer as an image's would
// be, hostile where it can be: a file deleted (a whiteout), a file of uid
// 1000, a working directory (/srv/app), and links where init makes its
// directories (/tmp to the host's /var/tmp, /home to /).
func TemplateRoot(t testing.TB) *sandbox.Root {
	t.Helper()
	r := templateRoot(t, func(base, top string) {
		writeOwned(t, base, "etc/gone", "lower\n", 0)
		writeOwned(t, base, "etc/passwd", "root:x:0:0:root:/root:/bin/sh\nimg:x:1000:1000::/home/img:/bin/sh\n", 0)
		writeOwned(t, top, "etc/motd", "from the template\n", 0)
		writeOwned(t, top, "srv/app/owned", "uid 1000's\n", 1000)
		if err := unix.Mknod(filepath.Join(top, "etc/gone"), unix.S_IFCHR, 0); err != nil {
			t.Fatal(err)
		}
	})
	r.Dir = "/srv/app"
	return r
}

// SuiteTemplateRoot is the root of the suites' native-template backend:
// TemplateRoot's links over the host's Python, and its /etc/passwd and
// /etc/group links to the host's.
func SuiteTemplateRoot(t testing.TB) *sandbox.Root {
	t.Helper()
	return templateRoot(t, func(base, top string) {
		if err := os.MkdirAll(filepath.Join(top, "etc"), 0o755); err != nil {
			t.Fatal(err)
		}
		for _, f := range []string{"passwd", "group"} {
			if err := os.Symlink("/etc/"+f, filepath.Join(top, "etc", f)); err != nil {
				t.Fatal(err)
			}
		}
	})
}

// templateRoot makes the two layers, fill adds to them, and the links.
func templateRoot(t testing.TB, fill func(base, top string)) *sandbox.Root {
	t.Helper()
	dir := t.TempDir()
	base, top := filepath.Join(dir, "base"), filepath.Join(dir, "top")
	for _, d := range []string{base, top} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	RootLayer(t, base)
	fill(base, top)
	for _, l := range []struct{ name, target string }{{"tmp", "/var/tmp"}, {"home", "/"}} {
		if err := os.Symlink(l.target, filepath.Join(top, l.name)); err != nil {
			t.Fatal(err)
		}
	}
	return &sandbox.Root{Template: "test", ID: "sha256:test", Layers: []string{base, top}}
}

// writeOwned writes a file of a layer, its directories made, owned by uid.
func writeOwned(t testing.TB, layer, p, data string, uid int) {
	t.Helper()
	full := filepath.Join(layer, p)
	if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(full, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(full, uid, uid); err != nil {
		t.Fatal(err)
	}
}

// UserNamespace is a new user namespace whose ids 0 to 65,535 are the
// host's from first on, as a sandbox's of that host user, held by a
// process that ends with the test.
func UserNamespace(t testing.TB, first int) *os.File {
	t.Helper()
	holder := exec.Command("sleep", "600")
	ids := []syscall.SysProcIDMap{{ContainerID: 0, HostID: first, Size: 65536}}
	holder.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWUSER, UidMappings: ids, GidMappings: ids}
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		holder.Process.Kill()
		holder.Wait()
	})
	userns, err := os.Open(fmt.Sprintf("/proc/%d/ns/user", holder.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { userns.Close() })
	return userns
}

// DirImage is an image of one layer, dir's files as they are (owners
// included), with the configuration cfg.
func DirImage(t testing.TB, dir string, cfg v1.Config) v1.Image {
	t.Helper()
	tarred := TarDir(t, dir)
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(tarred)), nil })
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		t.Fatal(err)
	}
	if img, err = mutate.Config(img, cfg); err != nil {
		t.Fatal(err)
	}
	return img
}
