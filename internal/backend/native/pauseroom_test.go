package native

import (
	"errors"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/testutil"
)

// A pause is refused where its images would leave the checkpoints' disk
// without its reserve, and says how much room there is; a directory not
// made yet is judged by its parent's file system.
func TestCheckpointRoom(t *testing.T) {
	testutil.RequireRoot(t)
	small := t.TempDir()
	if err := unix.Mount("tmpfs", small, "tmpfs", 0, "size=64m"); err != nil {
		t.Fatal(err)
	}
	defer unix.Unmount(small, unix.MNT_DETACH)
	err := checkpointRoom(filepath.Join(small, "not", "made", "yet"), 1<<20)
	if !errors.Is(err, sandbox.ErrNoRoom) {
		t.Fatalf("64 MiB of disk: %v", err)
	}
	t.Log(err)
	var st unix.Statfs_t
	if err := unix.Statfs(t.TempDir(), &st); err != nil {
		t.Fatal(err)
	}
	if free := int64(st.Bavail) * st.Bsize; free < 3<<30 || float64(st.Bavail) < 0.1*float64(st.Blocks) {
		t.Skipf("the test's disk has only %d MiB free", free>>20)
	}
	if err := checkpointRoom(t.TempDir(), 16<<20); err != nil {
		t.Fatalf("16 MiB on a disk with room: %v", err)
	}
	if err := checkpointRoom(t.TempDir(), 1<<50); !errors.Is(err, sandbox.ErrNoRoom) {
		t.Fatalf("a petabyte: %v", err)
	}
}
