// Package hostdisk says whether the host's disk has room for a large
// write: what pauses, snapshots and their imports ask before they write.
// The disk under the data directory is shared by every tenant and by the
// server's own database (keys, the audit log), so a large write is refused
// while it would leave less than a reserve free, whoever asks.
package hostdisk

import (
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

// What a large write must leave free: ReserveBytes or ReserveShare of the
// file system's size, whichever is larger.
const (
	ReserveBytes = 1 << 30
	ReserveShare = 0.05
)

// Free returns the bytes free to the server on the file system of dir, and
// the reserve a large write must leave there. A dir not made yet is judged
// by its nearest parent that exists.
func Free(dir string) (free, reserve int64, err error) {
	for d := filepath.Clean(dir); ; d = filepath.Dir(d) {
		var st unix.Statfs_t
		err := unix.Statfs(d, &st)
		if err == nil {
			size := int64(st.Blocks) * st.Bsize
			return int64(st.Bavail) * st.Bsize, max(int64(ReserveBytes), int64(float64(size)*ReserveShare)), nil
		}
		if !os.IsNotExist(err) || d == "/" {
			return 0, 0, err
		}
	}
}

// Fits fails with sandbox.ErrNoRoom when need bytes more on dir's file
// system would leave it less than its reserve free. what names the write
// for the client ("the sandbox's images"); the message names no path.
func Fits(dir string, need int64, what string) error {
	free, reserve, err := Free(dir)
	if err != nil {
		return fmt.Errorf("the server's disk: %w", err)
	}
	if free-need < reserve {
		return fmt.Errorf("%w: %s would take about %d MiB of the server's disk, which has %d MiB free "+
			"and keeps at least %d MiB free", sandbox.ErrNoRoom, what, need>>20, max(free, 0)>>20, reserve>>20)
	}
	return nil
}
