package sandbox

import (
	"fmt"
	"io"
)

// DiskOnly is the Workspace of a paused sandbox kept on disk alone (a
// PausedReleaser's after its release, a PausedOpener's): there are no
// files to reach until it resumes, and every call says so (ErrPaused).
type DiskOnly struct{}

var _ Workspace = DiskOnly{}

var errDiskOnly = fmt.Errorf("%w: its files are on disk until it is resumed", ErrPaused)

func (DiskOnly) WriteFile(string, io.Reader, int64) error { return errDiskOnly }
func (DiskOnly) List(int) ([]FileInfo, error)             { return nil, errDiskOnly }
func (DiskOnly) CopyOut(string, int64, int64) ([]FileInfo, error) {
	return nil, errDiskOnly
}
func (DiskOnly) OpenFile(string) (io.ReadCloser, FileInfo, error) {
	return nil, FileInfo{}, errDiskOnly
}
func (DiskOnly) ReadDir(string, int) ([]FileInfo, error) { return nil, errDiskOnly }
func (DiskOnly) Stat(string) (FileInfo, error)           { return FileInfo{}, errDiskOnly }
func (DiskOnly) Remove(string) error                     { return errDiskOnly }
