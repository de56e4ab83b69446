package volume

import (
	"errors"
	"fmt"
	"io"
	"runtime"

	"golang.org/x/sys/unix"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/workspace"
)

// Dir is a volume's root as the server reaches it for a client (the
// content API, a sandbox's file API): a workspace.Dir whose every
// operation, reads included, runs with the sandbox user's file-system
// identity (asUser). A volume is the one kind of file several sandboxes
// and the content API share, and a sandbox's root in it has no
// capability: the server reads and writes there with no more rights than
// a sandbox's user has, so what a sandbox's root keeps to itself (a 0600
// file, a 0700 directory) is refused (sandbox.ErrPermission), as it is to
// that user in a sandbox.
type Dir struct{ d *workspace.Dir }

var (
	_ sandbox.Workspace         = (*Dir)(nil)
	_ sandbox.WorkspaceEditor   = (*Dir)(nil)
	_ sandbox.WorkspaceLinker   = (*Dir)(nil)
	_ sandbox.WorkspaceMetadata = (*Dir)(nil)
)

// errIdentity: a thread's file-system identity could not be put back.
var errIdentity = errors.New("volume: could not restore the thread's file-system identity")

// asUser runs fn on a thread whose file-system identity is the sandbox
// user's as the volume's disk names it: fsuid OwnerUID, fsgid OwnerGID and
// no supplementary groups (the server's, root's, would open what a
// sandbox's root shares with its group). A non-zero fsuid also takes the
// file-system capabilities (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH,
// CAP_FOWNER ...) out of the thread's effective set, so the kernel checks
// permissions as it does for that user. Credentials are per thread in
// Linux, and these calls (raw syscalls, unlike package syscall's) change
// this thread's only; a thread whose identity cannot be put back is never
// handed back to the scheduler (it ends with the goroutine that locked
// it).
func asUser(fn func() error) error {
	runtime.LockOSThread()
	groups, err := unix.Getgroups()
	if err == nil {
		err = unix.Setgroups(nil)
	}
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("volume: drop the server's groups: %w", err)
	}
	prevGID, _ := unix.SetfsgidRetGid(OwnerGID)
	prevUID, _ := unix.SetfsuidRetUid(OwnerUID)
	err = fn()
	unix.SetfsuidRetUid(prevUID)
	unix.SetfsgidRetGid(prevGID)
	// setfsuid and setfsgid answer the current value when asked for an
	// invalid one.
	u, _ := unix.SetfsuidRetUid(-1)
	g, _ := unix.SetfsgidRetGid(-1)
	if u != prevUID || g != prevGID || unix.Setgroups(groups) != nil {
		return errors.Join(err, errIdentity)
	}
	runtime.UnlockOSThread()
	return err
}

// Close lets go of the volume's root (a Dir keeps its file system open).
func (d *Dir) Close() error { return d.d.Close() }

func (d *Dir) WriteFile(name string, r io.Reader, limit int64) error {
	return asUser(func() error { return d.d.WriteFile(name, r, limit) })
}

func (d *Dir) List(max int) (out []sandbox.FileInfo, err error) {
	err = asUser(func() (err error) {
		out, err = d.d.List(max)
		return err
	})
	return out, err
}

// CopyOut is not offered: it writes to the host's disk, which the
// sandbox user's identity may not.
func (d *Dir) CopyOut(string, int64, int64) ([]sandbox.FileInfo, error) {
	return nil, fmt.Errorf("%w: a volume's files are not copied out", sandbox.ErrUnsupported)
}

func (d *Dir) OpenFile(name string) (f io.ReadCloser, fi sandbox.FileInfo, err error) {
	err = asUser(func() (err error) {
		f, fi, err = d.d.OpenFile(name)
		return err
	})
	return f, fi, err
}

func (d *Dir) ReadDir(name string, depth int) (out []sandbox.FileInfo, err error) {
	err = asUser(func() (err error) {
		out, err = d.d.ReadDir(name, depth)
		return err
	})
	return out, err
}

func (d *Dir) Stat(name string) (fi sandbox.FileInfo, err error) {
	err = asUser(func() (err error) {
		fi, err = d.d.Stat(name)
		return err
	})
	return fi, err
}

func (d *Dir) Remove(name string) error { return asUser(func() error { return d.d.Remove(name) }) }

func (d *Dir) Mkdir(name string) error { return asUser(func() error { return d.d.Mkdir(name) }) }

func (d *Dir) Rename(from, to string) error {
	return asUser(func() error { return d.d.Rename(from, to) })
}

// Chmod sets the permission bits of name (workspace.Dir.Chmod).
func (d *Dir) Chmod(name string, mode uint32) error {
	return asUser(func() error { return d.d.Chmod(name, mode) })
}

func (d *Dir) Readlink(name string) (target string, err error) {
	err = asUser(func() (err error) {
		target, err = d.d.Readlink(name)
		return err
	})
	return target, err
}

func (d *Dir) FileMetadata(name string) (md map[string]string, err error) {
	err = asUser(func() (err error) {
		md, err = d.d.FileMetadata(name)
		return err
	})
	return md, err
}

func (d *Dir) SetFileMetadata(name string, md map[string]string) error {
	return asUser(func() error { return d.d.SetFileMetadata(name, md) })
}
