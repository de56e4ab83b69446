// Package voltest opens volume stores for tests, apart from testutil:
// the volume package's own tests use testutil.
package voltest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vivarium-sandbox/vivarium/internal/volume"
)

// OpenVolumes opens a volume store in dir (made if missing) whose volumes
// are 64 MiB at most, skipping the test where this host cannot keep
// volumes (no loop devices, no idmapped ext4). The caller closes it.
func OpenVolumes(t testing.TB, dir string) *volume.Store {
	t.Helper()
	st, err := volume.Open(volume.Config{Dir: dir, MaxSize: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Unavailable(); err != nil {
		st.Close()
		t.Skipf("volumes unavailable: %v", err)
	}
	return st
}

// TempVolumes opens a volume store in a directory of the test's (as
// OpenVolumes), closed when the test ends, and returns it with its
// directory.
func TempVolumes(t testing.TB) (*volume.Store, string) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "volumes")
	st := OpenVolumes(t, dir)
	t.Cleanup(func() { st.Close() })
	return st, dir
}

// LoopsBacking counts the loop devices whose image is under dir: a
// volume's is attached while anything mounts it.
func LoopsBacking(dir string) int {
	n := 0
	files, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, f := range files {
		if b, err := os.ReadFile(f); err == nil && strings.HasPrefix(string(b), dir) {
			n++
		}
	}
	return n
}
