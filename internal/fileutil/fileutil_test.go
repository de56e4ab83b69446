package fileutil

import (
	"os"
	"path/filepath"
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
