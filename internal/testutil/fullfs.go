package testutil

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
)

// SmallFS mounts a tmpfs of size bytes on a new directory, for a test of
// what a full disk does; it is unmounted when the test ends. It needs
// root.
func SmallFS(t testing.TB, size int64) string {
	t.Helper()
	RequireRoot(t)
	dir := t.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", syscall.MS_NOSUID|syscall.MS_NODEV,
		"size="+strconv.FormatInt(size, 10)+",mode=0700"); err != nil {
		t.Skipf("cannot mount a tmpfs: %v", err)
	}
	t.Cleanup(func() { syscall.Unmount(dir, syscall.MNT_DETACH) })
	return dir
}

// FillFS fills the file system dir is on with one file in dir, until it
// has no byte left, and returns a function that removes the file.
func FillFS(t testing.TB, dir string) (free func()) {
	t.Helper()
	path := filepath.Join(dir, "filler")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 64<<10)
	for n := len(buf); n > 0; {
		if _, err := f.Write(buf[:n]); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatal(err)
			}
			n /= 2 // the last blocks, smaller
		}
	}
	return func() {
		if err := os.Remove(path); err != nil {
			t.Error(err)
		}
	}
}
