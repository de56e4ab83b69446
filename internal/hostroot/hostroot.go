// Package hostroot makes image layers of the host's own files: its
// python3 and standard library, a shell and a few programs, and the
// libraries they load. Tests and the bench make templates of them where
// no registry or image is at hand.
package hostroot

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
)

// programs are the host's programs a layer's root has, those the host
// has: a shell, coreutils a program expects, and what the hostile suite's
// cases run.
var programs = []string{"/bin/sh", "/bin/bash", "/bin/cat", "/bin/ls", "/bin/id", "/bin/touch", "/bin/rm", "/bin/mkdir",
	"/usr/bin/env", "/bin/stat", "/bin/echo", "/bin/sleep", "/usr/bin/nohup", "/usr/bin/nsenter", "/usr/bin/unshare",
	"/usr/bin/setarch", "/bin/true", "/bin/false", "/usr/bin/md5sum", "/bin/cp", "/bin/mv", "/bin/ln", "/bin/chmod",
	"/bin/kill", "/usr/bin/head", "/usr/bin/tail", "/bin/grep", "/usr/bin/wc", "/usr/bin/yes", "/bin/su", "/usr/bin/sudo",
	"/usr/bin/node", "/usr/bin/timeout", "/bin/dd", "/usr/bin/tty", "/usr/bin/strace", "/usr/bin/gdb"}

// files are the host's other files a layer's root has, those the host has.
var files = []string{"/usr/share/common-licenses/GPL-3"}

// Layer makes, in dir, an image layer in overlayfs's form (as the image
// store keeps them) with the host's python3 (python the path it has,
// /usr/bin/python3 when empty) and its standard library, a shell and a
// few programs, and their libraries. Files are hard links to the host's
// where dir is on the same file system, copies elsewhere. With bytecode,
// the standard library's compiled modules (__pycache__) come too, as an
// image that ships them has: its Python then starts as the host's does,
// instead of compiling every module it imports.
func Layer(dir, python string, bytecode bool) error {
	if python == "" {
		python = "/usr/bin/python3"
	}
	real, err := filepath.EvalSymlinks(python)
	if err != nil {
		return err
	}
	var have []string
	for _, p := range append(append([]string{real}, programs...), files...) {
		if _, err := os.Lstat(p); err == nil {
			have = append(have, p)
		}
	}
	stdlib := filepath.Join("/usr/lib", filepath.Base(real))
	dynload, _ := filepath.Glob(filepath.Join(stdlib, "lib-dynload", "*.so"))
	var libs []string
	for _, f := range append(append([]string{}, have...), dynload...) {
		libs = append(libs, sharedLibraries(f)...)
	}
	for _, l := range []struct{ name, target string }{
		{"bin", "usr/bin"}, {"lib", "usr/lib"}, {"lib64", "usr/lib64"}, {"sbin", "usr/sbin"},
	} {
		if _, err := os.Lstat("/" + l.name); err == nil {
			if err := os.Symlink(l.target, filepath.Join(dir, l.name)); err != nil {
				return err
			}
		}
	}
	for _, f := range append(have, libs...) {
		if err := linkInto(dir, f); err != nil {
			return err
		}
	}
	if err := os.Symlink(filepath.Base(real), filepath.Join(dir, "usr/bin/python3")); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	err = filepath.WalkDir(stdlib, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "test" || (d.Name() == "__pycache__" && !bytecode) || d.Name() == "idlelib") {
			return filepath.SkipDir
		}
		if !d.IsDir() {
			return linkInto(dir, p)
		}
		return nil
	})
	if err != nil {
		return err
	}
	return os.Chmod(dir, 0o755)
}

var lddPath = regexp.MustCompile(`(/[^ ]+) \(0x`)

// sharedLibraries lists the libraries file loads, by their paths and real
// paths (ldd).
func sharedLibraries(file string) []string {
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
// directories made on the way, with links as links (and their targets):
// a hard link where it can, a copy elsewhere.
func linkInto(dir, src string) error {
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
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	fi, err := os.Lstat(src)
	if err != nil {
		return err
	}
	if fi.Mode()&fs.ModeSymlink != 0 {
		target, err := os.Readlink(src)
		if err != nil {
			return err
		}
		if err := os.Symlink(target, dst); err != nil {
			return err
		}
		if real, err := filepath.EvalSymlinks(src); err == nil {
			return linkInto(dir, real)
		}
		return nil
	}
	if err := os.Link(src, dst); err == nil || !errors.Is(err, syscall.EXDEV) {
		return err
	}
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	return os.WriteFile(dst, b, fi.Mode().Perm())
}

// Tar writes the tree at dir as an uncompressed tar (an image layer's
// form), with its owners, modes and links.
func Tar(dir string) ([]byte, error) {
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
		if !fi.Mode().IsRegular() {
			return nil
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		_, err = io.Copy(tw, f)
		return err
	})
	if err == nil {
		err = tw.Close()
	}
	if err != nil {
		return nil, fmt.Errorf("tar %s: %w", dir, err)
	}
	return buf.Bytes(), nil
}
