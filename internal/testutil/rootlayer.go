package testutil

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
)

// rootLayerPrograms are the host's programs a test image's root has.
var rootLayerPrograms = []string{"/bin/sh", "/bin/cat", "/bin/ls", "/bin/id", "/bin/touch", "/bin/rm", "/bin/mkdir",
	"/usr/bin/env", "/bin/stat", "/bin/echo"}

// RootLayer makes, in dir, an image layer in overlayfs's form (as the image
// store keeps them) with the host's python3 and its standard library, a
// shell and a few programs, and their libraries: a small root a template's
// sandbox can run code and commands in. Files are hard links to the
// host's where dir is on the same file system, copies elsewhere.
func RootLayer(t testing.TB, dir string) {
	t.Helper()
	RequirePython(t)
	python, err := filepath.EvalSymlinks("/usr/bin/python3")
	if err != nil {
		t.Fatal(err)
	}
	files := append([]string{python}, rootLayerPrograms...)
	stdlib := filepath.Join("/usr/lib", filepath.Base(python))
	dynload, _ := filepath.Glob(filepath.Join(stdlib, "lib-dynload", "*.so"))
	var libs []string
	for _, f := range append(append([]string{}, files...), dynload...) {
		libs = append(libs, sharedLibraries(t, f)...)
	}
	for _, l := range []struct{ name, target string }{
		{"bin", "usr/bin"}, {"lib", "usr/lib"}, {"lib64", "usr/lib64"}, {"sbin", "usr/sbin"},
	} {
		if _, err := os.Lstat("/" + l.name); err == nil {
			if err := os.Symlink(l.target, filepath.Join(dir, l.name)); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, f := range append(files, libs...) {
		linkInto(t, dir, f)
	}
	if err := os.Symlink(filepath.Base(python), filepath.Join(dir, "usr/bin/python3")); err != nil {
		t.Fatal(err)
	}
	err = filepath.WalkDir(stdlib, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "test" || d.Name() == "__pycache__" || d.Name() == "idlelib") {
			return filepath.SkipDir
		}
		if !d.IsDir() {
			linkInto(t, dir, p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
}

var lddPath = regexp.MustCompile(`(/[^ ]+) \(0x`)

// sharedLibraries lists the libraries file loads, by their real paths
// (ldd).
func sharedLibraries(t testing.TB, file string) []string {
	out, err := exec.Command("ldd", file).Output()
	if err != nil {
		return nil // not dynamic
	}
	var libs []string
	for _, m := range lddPath.FindAllStringSubmatch(string(out), -1) {
		libs = append(libs, m[1])
		if real, err := filepath.EvalSymlinks(m[1]); err == nil && real != m[1] {
			libs = append(libs, real)
		}
	}
	return libs
}

// linkInto puts the host's file src at the same path under dir, its
// directories made on the way, with links as links: a hard link where it
// can, a copy elsewhere.
func linkInto(t testing.TB, dir, src string) {
	t.Helper()
	// The path as the layer has it: under /usr, where merged /usr puts
	// /bin, /lib ...
	rel := strings.TrimPrefix(src, "/")
	for _, top := range []string{"bin/", "lib/", "lib64/", "sbin/"} {
		if strings.HasPrefix(rel, top) {
			if fi, err := os.Lstat("/" + strings.TrimSuffix(top, "/")); err == nil && fi.Mode()&fs.ModeSymlink != 0 {
				rel = "usr/" + rel
			}
		}
	}
	dst := filepath.Join(dir, rel)
	if _, err := os.Lstat(dst); err == nil {
		return
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Lstat(src)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode()&fs.ModeSymlink != 0 {
		target, err := os.Readlink(src)
		if err == nil {
			err = os.Symlink(target, dst)
		}
		if err != nil {
			t.Fatal(err)
		}
		if real, err := filepath.EvalSymlinks(src); err == nil {
			linkInto(t, dir, real)
		}
		return
	}
	if err := os.Link(src, dst); err == nil {
		return
	} else if !errors.Is(err, syscall.EXDEV) {
		t.Fatal(err)
	}
	b, err := os.ReadFile(src)
	if err == nil {
		err = os.WriteFile(dst, b, fi.Mode().Perm())
	}
	if err != nil {
		t.Fatal(err)
	}
}

// TarDir writes the tree at dir as an uncompressed tar (an image layer's
// form), with its owners, modes and links.
func TarDir(t testing.TB, dir string) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		link := ""
		if fi.Mode()&fs.ModeSymlink != 0 {
			if link, err = os.Readlink(p); err != nil {
				return err
			}
		}
		hdr, err := tar.FileInfoHeader(fi, link)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		hdr.Name, hdr.Uname, hdr.Gname = filepath.ToSlash(rel), "", ""
		if fi.IsDir() {
			hdr.Name += "/"
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if fi.Mode().IsRegular() {
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			defer f.Close()
			if _, err := io.Copy(tw, f); err != nil {
				return err
			}
		}
		return nil
	})
	if err == nil {
		err = tw.Close()
	}
	if err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}
