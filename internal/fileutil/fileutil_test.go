package fileutil

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestFiles(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	if err := os.WriteFile(src, []byte("abc"), 0o600); err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(dir, "dst")
	if err := CopyNew(src, dst, 0o640); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(dst); err != nil || string(b) != "abc" {
		t.Fatalf("copy: %q %v", b, err)
	}
	if fi, _ := os.Stat(dst); fi.Mode().Perm() != 0o640 {
		t.Fatalf("mode %v", fi.Mode())
	}
	// Never over an existing file, never from what is not a regular one.
	if CopyNew(src, dst, 0o600) == nil || CopyNew(dir, filepath.Join(dir, "d2"), 0o600) == nil {
		t.Fatal("copied over a file, or a directory")
	}
	if h, err := SHA256(src); err != nil || h != "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad" {
		t.Fatalf("sha256: %s %v", h, err)
	}
	if n := DirSize(dir); n != 6 { // src and dst
		t.Fatalf("dir size %d", n)
	}
}

func TestCachedBuilds(t *testing.T) {
	cache := t.TempDir()
	t.Setenv("XDG_CACHE_HOME", cache)
	for i, key := range []string{"old", "new"} {
		p := filepath.Join(cache, "vivarium", "tool-"+key, "tool")
		os.MkdirAll(filepath.Dir(p), 0o755)
		os.WriteFile(p, nil, 0o755)
		ts := time.Now().Add(time.Duration(i-1) * time.Hour)
		os.Chtimes(p, ts, ts)
	}
	paths, pattern := CachedBuilds("tool", "tool")
	if len(paths) != 2 || filepath.Base(filepath.Dir(paths[0])) != "tool-new" || pattern != filepath.Join(cache, "vivarium", "tool-*", "tool") {
		t.Fatalf("%v %s", paths, pattern)
	}
}

// TestCopyTree copies a tree with cp -a (modes, links, hard links and
// FIFOs kept), placing the copy's process before it copies anything, and
// copies nothing where it cannot be placed.
func TestCopyTree(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	if err := os.MkdirAll(filepath.Join(src, "sub"), 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "sub", "f"), []byte("abc"), 0o640); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(filepath.Join(src, "sub", "f"), filepath.Join(src, "hard")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("sub/f", filepath.Join(src, "link")); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(filepath.Join(src, "fifo"), 0o600); err != nil {
		t.Fatal(err)
	}

	dst := filepath.Join(dir, "dst")
	placed := 0
	err := CopyTree(src, dst, placer(func(pid int) error {
		// Placed before it copies: nothing of dst yet.
		if _, err := os.Lstat(dst); !os.IsNotExist(err) {
			t.Errorf("dst exists when the copy is placed: %v", err)
		}
		if pid <= 0 {
			t.Errorf("placed pid %d", pid)
		}
		placed++
		return nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	if placed != 1 {
		t.Errorf("placed %d times", placed)
	}
	if b, err := os.ReadFile(filepath.Join(dst, "sub", "f")); err != nil || string(b) != "abc" {
		t.Errorf("sub/f: %q %v", b, err)
	}
	if fi, err := os.Stat(filepath.Join(dst, "sub")); err != nil || fi.Mode().Perm() != 0o750 {
		t.Errorf("sub: %v %v, want mode 0750", fi, err)
	}
	if l, err := os.Readlink(filepath.Join(dst, "link")); err != nil || l != "sub/f" {
		t.Errorf("link: %q %v", l, err)
	}
	if fi, err := os.Lstat(filepath.Join(dst, "fifo")); err != nil || fi.Mode()&os.ModeNamedPipe == 0 {
		t.Errorf("fifo: %v %v", fi, err)
	}
	a, _ := os.Stat(filepath.Join(dst, "sub", "f"))
	h, _ := os.Stat(filepath.Join(dst, "hard"))
	if a == nil || h == nil || !os.SameFile(a, h) {
		t.Error("the hard link was not kept")
	}

	// Without a place, and into a dst that exists: cp's own error.
	if err := CopyTree(src, filepath.Join(dir, "dst2"), nil); err != nil {
		t.Fatal(err)
	}
	if err := CopyTree(filepath.Join(dir, "missing"), filepath.Join(dir, "dst3"), nil); err == nil ||
		!strings.Contains(err.Error(), "cp:") {
		t.Errorf("a missing source: %v", err)
	}

	refused := errors.New("no room")
	dst = filepath.Join(dir, "refused")
	if err := CopyTree(src, dst, placer(func(int) error { return refused })); !errors.Is(err, refused) {
		t.Fatalf("a copy that could not be placed: %v", err)
	}
	if _, err := os.Lstat(dst); !os.IsNotExist(err) {
		t.Errorf("a copy that could not be placed copied: %v", err)
	}
}

type placer func(pid int) error

func (p placer) AddProc(pid int) error { return p(pid) }

// TestWriteDir makes a directory whole or not at all.
func TestWriteDir(t *testing.T) {
	base := t.TempDir()
	dir := filepath.Join(base, "a", "snap")
	size, err := WriteDir(dir, func(tmp string) error {
		if tmp != dir+".partial" {
			t.Errorf("written into %s", tmp)
		}
		if err := os.Mkdir(tmp, 0o700); err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(tmp, "f"), []byte("abc"), 0o600)
	})
	if err != nil || size != 3 {
		t.Fatalf("WriteDir: %d bytes, %v", size, err)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "f")); err != nil || string(b) != "abc" {
		t.Fatalf("its file: %q %v", b, err)
	}
	if _, err := WriteDir(dir, func(string) error { t.Error("write called for a dir that exists"); return nil }); err == nil {
		t.Error("a dir that exists was written again")
	}

	// A failed write leaves nothing, a crash's leftover included.
	failed := filepath.Join(base, "failed")
	if err := os.MkdirAll(filepath.Join(failed+".partial", "old"), 0o700); err != nil {
		t.Fatal(err)
	}
	boom := errors.New("boom")
	_, err = WriteDir(failed, func(tmp string) error {
		if _, err := os.Lstat(tmp); !os.IsNotExist(err) {
			t.Errorf("a leftover %s is there for the write: %v", tmp, err)
		}
		os.Mkdir(tmp, 0o700)
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("a failed write: %v", err)
	}
	for _, p := range []string{failed, failed + ".partial"} {
		if _, err := os.Lstat(p); !os.IsNotExist(err) {
			t.Errorf("%s after a failed write: %v", p, err)
		}
	}
}
