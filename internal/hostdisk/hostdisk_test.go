package hostdisk

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/testutil"
)

// A write is refused where it would leave the disk without its reserve,
// saying how much room there is and naming no path; a directory not made
// yet is judged by its parent's file system.
func TestFits(t *testing.T) {
	testutil.RequireRoot(t)
	small := t.TempDir()
	if err := unix.Mount("tmpfs", small, "tmpfs", 0, "size=64m"); err != nil {
		t.Fatal(err)
	}
	defer unix.Unmount(small, unix.MNT_DETACH)
	dir := filepath.Join(small, "not", "made", "yet")
	err := Fits(dir, 1<<20, "the test's file")
	if !errors.Is(err, sandbox.ErrNoRoom) {
		t.Fatalf("64 MiB of disk: %v", err)
	}
	if strings.Contains(err.Error(), small) {
		t.Errorf("the message names a host path: %v", err)
	}
	free, reserve, err := Free(dir)
	if err != nil || free <= 0 || free > 64<<20 || reserve != ReserveBytes {
		t.Errorf("Free of a 64 MiB tmpfs: %d, %d, %v", free, reserve, err)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(t.TempDir(), &st); err != nil {
		t.Fatal(err)
	}
	if free := int64(st.Bavail) * st.Bsize; free < 3<<30 || float64(st.Bavail) < 0.1*float64(st.Blocks) {
		t.Skipf("the test's disk has only %d MiB free", free>>20)
	}
	if err := Fits(t.TempDir(), 16<<20, "16 MiB"); err != nil {
		t.Fatalf("16 MiB on a disk with room: %v", err)
	}
	if err := Fits(t.TempDir(), 1<<50, "a petabyte"); !errors.Is(err, sandbox.ErrNoRoom) {
		t.Fatalf("a petabyte: %v", err)
	}
}
