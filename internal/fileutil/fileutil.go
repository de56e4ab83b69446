// Package fileutil holds the few file operations several packages need
// alike: a regular file copied to a new one, a tree copied whole (cp -a),
// a directory written whole or not at all, a file's sha256, a tree's
// size, whether only root can change a directory, and the builds the
// project's scripts cache.
package fileutil

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
)

// CopyNew copies the regular file src to dst, which it creates (it must
// not exist) with mode.
func CopyNew(src, dst string, mode os.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	if fi, err := in.Stat(); err != nil || !fi.Mode().IsRegular() {
		return fmt.Errorf("%s is not a regular file", src)
	}
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// A Placer takes a process in before it runs on: a cgroup
// (cgroups.Group), whose limits and accounting then cover it.
type Placer interface {
	AddProc(pid int) error
}

// CopyTree copies the directory src to dst, which it makes, with cp -a:
// owners, modes, times, symbolic and hard links, FIFOs and extended
// attributes kept (a sandbox's files, saved or given to a new sandbox).
// The copying process is first given to into, unless it is nil (into a
// sandbox's cgroup: the memory of the tmpfs the copy fills is charged
// there), before it reads or writes anything; where into refuses it,
// nothing is copied.
func CopyTree(src, dst string, into Placer) error {
	// The shell waits for a line before it becomes cp: by then it is
	// placed. No environment: nothing of the caller's reaches cp.
	cmd := exec.Command("/bin/sh", "-c", `read -r _ && exec /bin/cp -a --no-target-directory -- "$0" "$1"`, src, dst)
	cmd.Env = []string{}
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	gate, err := cmd.StdinPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	if into != nil {
		if err := into.AddProc(cmd.Process.Pid); err != nil {
			gate.Close() // the read fails: the shell exits without copying
			cmd.Wait()
			return fmt.Errorf("cp, placed before it copies: %w", err)
		}
	}
	gate.Write([]byte("\n"))
	gate.Close()
	if err := cmd.Wait(); err != nil {
		return fmt.Errorf("cp: %w: %s", err, strings.TrimSpace(out.String()))
	}
	return nil
}

// WriteDir makes the directory dir whole or not at all: write makes
// dir.partial and fills it, and it is renamed dir once write returns nil,
// so that nothing half-written is ever seen by dir's name; on any failure
// nothing is left (a dir.partial an earlier crash left is removed
// first). dir must not exist; its parents are made (0700). It returns
// dir's size (DirSize).
func WriteDir(dir string, write func(tmp string) error) (int64, error) {
	if _, err := os.Lstat(dir); err == nil {
		return 0, fmt.Errorf("%s exists", filepath.Base(dir))
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o700); err != nil {
		return 0, err
	}
	tmp := dir + ".partial"
	os.RemoveAll(tmp)
	err := write(tmp)
	if err == nil {
		err = os.Rename(tmp, dir)
	}
	if err != nil {
		os.RemoveAll(tmp)
		return 0, err
	}
	return DirSize(dir), nil
}

// SHA256 is the hex sha256 of the file at path.
func SHA256(path string) (string, error) {
	f, err := os.Open(path)
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

// DirSize adds up the sizes of the regular files under dir.
func DirSize(dir string) int64 {
	var n int64
	filepath.Walk(dir, func(_ string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode().IsRegular() {
			n += fi.Size()
		}
		return nil
	})
	return n
}

// CachedBuilds lists the builds a script of the project left in its
// cache, ${XDG_CACHE_HOME:-$HOME/.cache}/vivarium/<name>-<key>/<file>,
// the most recent first, and returns the pattern it looked for.
func CachedBuilds(name, file string) (paths []string, pattern string) {
	base := os.Getenv("XDG_CACHE_HOME")
	if base == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return nil, ""
		}
		base = filepath.Join(home, ".cache")
	}
	pattern = filepath.Join(base, "vivarium", name+"-*", file)
	paths, _ = filepath.Glob(pattern)
	mtime := func(p string) int64 {
		st, err := os.Stat(p)
		if err != nil {
			return 0
		}
		return st.ModTime().UnixNano()
	}
	sort.Slice(paths, func(i, j int) bool { return mtime(paths[i]) > mtime(paths[j]) })
	return paths, pattern
}

// CheckRootOnly refuses a directory that anyone but root could change,
// or whose path anyone but root could: what root starts or sandboxes
// load from it is trusted.
func CheckRootOnly(dir string) error {
	for d := dir; ; d = filepath.Dir(d) {
		var st syscall.Stat_t
		if err := syscall.Lstat(d, &st); err != nil {
			return err
		}
		if st.Mode&syscall.S_IFMT != syscall.S_IFDIR || st.Uid != 0 || st.Mode&0o022 != 0 {
			return fmt.Errorf("%s must be a directory of root's that only root can write", d)
		}
		if d == "/" || d == "." {
			return nil
		}
	}
}
