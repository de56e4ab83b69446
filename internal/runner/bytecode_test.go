package runner

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vivarium-sandbox/vivarium/internal/fileutil"
	"github.com/vivarium-sandbox/vivarium/internal/testutil"
)

// The host's interpreter compiles the runner's files into the names its
// import system looks for, as unchecked-hash bytecode of its own version,
// each recorded as the file a sandbox sees; a cache only root can write
// keeps them, any other is ignored.
func TestBytecode(t *testing.T) {
	py := testutil.RequirePython(t)
	pycs, err := Bytecode(context.Background(), py, "/opt/vivarium", "")
	if err != nil {
		t.Fatal(err)
	}
	tag, err := exec.Command(py, "-I", "-S", "-c", "import sys; print(sys.implementation.cache_tag)").Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"runner", "cells", "start", "zygote", "landlock"} {
		pyc := pycs["__pycache__/"+name+"."+strings.TrimSpace(string(tag))+".pyc"]
		if len(pyc) < 16 {
			t.Fatalf("%s: no bytecode among %d files", name, len(pycs))
		}
		// What python itself makes of it: its own magic, the
		// unchecked-hash flags (hash-based, source not checked), and the
		// sandbox's path as the code's file name.
		dir := t.TempDir()
		path := filepath.Join(dir, name+".pyc")
		if err := os.WriteFile(path, pyc, 0o600); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command(py, "-I", "-S", "-c", `
import importlib.util, marshal, sys
b = open(sys.argv[1], "rb").read()
print(b[:4] == importlib.util.MAGIC_NUMBER, int.from_bytes(b[4:8], "little"), marshal.loads(b[16:]).co_filename)
`, path).CombinedOutput()
		if got, want := strings.TrimSpace(string(out)), "True 1 /opt/vivarium/"+name+".py"; got != want || err != nil {
			t.Errorf("%s: %s (%v), want %q", name, got, err, want)
		}
	}

	testutil.RequireRoot(t)
	// Under a directory only root may write: t.TempDir's /tmp is
	// everyone's.
	if err := fileutil.CheckRootOnly("/run"); err != nil {
		t.Skip(err)
	}
	top, err := os.MkdirTemp("/run", "vivarium-bytecode-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(top) })
	if got, err := cachedBytecode(filepath.Join(t.TempDir(), "cache"), "k"); got != nil || err != nil {
		t.Errorf("a cache under /tmp was read: %d files, %v", len(got), err)
	}
	if err := keepBytecode(filepath.Join(t.TempDir(), "cache"), "k", pycs); err == nil {
		t.Error("a cache was kept under /tmp, which anyone can change")
	}
	cache := filepath.Join(top, "cache")
	if err := keepBytecode(cache, "k", pycs); err != nil {
		t.Fatal(err)
	}
	got, err := cachedBytecode(cache, "k")
	if err != nil || len(got) != len(pycs) {
		t.Fatalf("cached: %d files, %v; want %d", len(got), err, len(pycs))
	}
	for name, b := range pycs {
		if string(got[name]) != string(b) {
			t.Errorf("%s differs in the cache", name)
		}
	}
	// A cache another user could have written is not read.
	if err := os.Chmod(filepath.Join(cache, "runner-k"), 0o777); err != nil {
		t.Fatal(err)
	}
	if got, err := cachedBytecode(cache, "k"); got != nil || err != nil {
		t.Errorf("a cache writable by others was read: %d files, %v", len(got), err)
	}
}
