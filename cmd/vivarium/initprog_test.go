package main

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vivarium-sandbox/vivarium/internal/fileutil"
	"github.com/vivarium-sandbox/vivarium/internal/testutil"
)

func TestWriteInitProg(t *testing.T) {
	testutil.RequireRoot(t, "the program's directory and file must be root's")
	prog := []byte("\x7fELF a stand-in for the init program")
	sum := sha256.Sum256(prog)
	want := hex.EncodeToString(sum[:])
	// Under a directory only root may write: t.TempDir's /tmp is
	// everyone's.
	if err := fileutil.CheckRootOnly("/run"); err != nil {
		t.Skip(err)
	}
	top, err := os.MkdirTemp("/run", "vivarium-initprog-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(top) })
	dir := filepath.Join(top, "data", "bin")

	path, err := writeInitProg(dir, prog, want)
	if err != nil {
		t.Fatal(err)
	}
	if filepath.Base(path) != "vivarium-init-"+want[:16] {
		t.Errorf("written as %s", path)
	}
	st, err := os.Stat(path)
	if err != nil || st.Mode().Perm() != 0o555 {
		t.Fatalf("written file: %v, mode %v", err, st.Mode())
	}
	before, _ := os.Stat(path)
	if again, err := writeInitProg(dir, prog, want); err != nil || again != path {
		t.Fatalf("second write: %q, %v", again, err)
	}
	if after, _ := os.Stat(path); !os.SameFile(before, after) {
		t.Error("a file of the same content was written again")
	}

	// Another content under the name is replaced, not trusted.
	os.Chmod(path, 0o755)
	os.WriteFile(path, []byte("tampered"), 0o755)
	os.Chmod(path, 0o555)
	if _, err := writeInitProg(dir, prog, want); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(path); string(got) != string(prog) {
		t.Errorf("a tampered file was kept: %q", got)
	}
	// So is a symbolic link, which is not followed.
	target := filepath.Join(t.TempDir(), "elsewhere")
	os.WriteFile(target, prog, 0o555)
	os.Remove(path)
	os.Symlink(target, path)
	if _, err := writeInitProg(dir, prog, want); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Lstat(path); err != nil || !st.Mode().IsRegular() {
		t.Errorf("the link was kept: %v %v", st.Mode(), err)
	}
	if left, _ := filepath.Glob(filepath.Join(dir, ".vivarium-init-*")); len(left) > 0 {
		t.Errorf("temporary files left: %v", left)
	}

	// A program other than the one the binary was built with is refused.
	if _, err := writeInitProg(dir, []byte("other"), want); err == nil || !strings.Contains(err.Error(), "rebuild") {
		t.Errorf("a program of another hash: %v", err)
	}
	if st, err := os.Stat(filepath.Dir(dir)); err != nil || st.Mode().Perm() != 0o711 {
		t.Errorf("the data directory made: %v %v", st.Mode(), err)
	}

	// A directory others may write is refused, and so is one below such
	// a directory: a program in it runs as root.
	os.Chmod(dir, 0o777)
	if _, err := writeInitProg(dir, prog, want); err == nil || !strings.Contains(err.Error(), "only root can write") {
		t.Errorf("a directory anyone may write: %v", err)
	}
	os.Chmod(dir, 0o755)
	os.Chmod(filepath.Dir(dir), 0o777)
	if _, err := writeInitProg(dir, prog, want); err == nil || !strings.Contains(err.Error(), filepath.Dir(dir)+" must be") {
		t.Errorf("below a directory anyone may write: %v", err)
	}
}
