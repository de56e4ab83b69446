package native

import (
	"fmt"
	"io"
	"sync"
	"sync/atomic"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/workspace"
)

// A checkpoint's files are those CRIU saw. CRIU reopens the files the
// dumped processes hold by their path and refuses a restore where one is
// missing or not the size it was: a file the files API replaced, removed
// or renamed while its sandbox was paused (an upload over a file the code
// held open, say) made every resume fail, and the sandbox could then only
// be deleted. So the files API changes a sandbox's files through a gate
// (gatedDir, filesGate): each change holds it open while it runs, and a
// checkpoint (a pause's dump, a fork's or a snapshot's, with its copy of
// the files) closes it for its duration, refused (ErrBusy) while a change
// is under way. A pause leaves it closed until the sandbox is resumed:
// changes answer ErrPaused meanwhile (a sandbox made with auto_resume is
// resumed by the service first). Reads are never held.

// filesGate orders the files API's changes of a sandbox's files and its
// checkpoints.
type filesGate struct {
	// mu is held for reading by each change while it runs, and for
	// writing by a checkpoint, which never waits for one (TryLock): a
	// client's upload may take as long as the client does.
	mu     sync.RWMutex
	paused atomic.Bool // the sandbox is paused: changes are refused
}

// errPausedFiles: a change of a paused sandbox's files.
var errPausedFiles = fmt.Errorf("%w: its files can be read but not changed until it is resumed "+
	"(its processes' open files must be as they left them)", sandbox.ErrPaused)

// change runs fn, a change of the sandbox's files, unless the sandbox is
// paused; a checkpoint under way is waited for.
func (g *filesGate) change(fn func() error) error {
	g.mu.RLock()
	defer g.mu.RUnlock()
	if g.paused.Load() {
		return errPausedFiles
	}
	return fn()
}

// hold closes the gate for a checkpoint, or says that a change is under
// way (ErrBusy). The caller calls release.
func (g *filesGate) hold() error {
	if !g.mu.TryLock() {
		return fmt.Errorf("%w: a file of the sandbox is being changed through the API; try again once that ends",
			sandbox.ErrBusy)
	}
	return nil
}

// release ends a checkpoint; paused says that the sandbox is now paused
// (a pause's dump succeeded), and changes stay refused until resumed.
func (g *filesGate) release(paused bool) {
	g.paused.Store(paused)
	g.mu.Unlock()
}

// resumed lets changes through again.
func (g *filesGate) resumed() { g.paused.Store(false) }

// gatedDir is a Dir of the sandbox's files as the files API is given it:
// every method that changes the sandbox's files goes through the gate
// (any added to workspace.Dir must be here too); reads are the Dir's.
type gatedDir struct {
	*workspace.Dir
	gate *filesGate
}

var (
	_ sandbox.Workspace         = gatedDir{}
	_ sandbox.WorkspaceEditor   = gatedDir{}
	_ sandbox.WorkspaceLinker   = gatedDir{}
	_ sandbox.WorkspaceMetadata = gatedDir{}
	_ sandbox.DirGiver          = gatedDir{}
	_ sandbox.DiskUser          = gatedDir{}
)

func (d gatedDir) WriteFile(name string, r io.Reader, limit int64) error {
	return d.gate.change(func() error { return d.Dir.WriteFile(name, r, limit) })
}

func (d gatedDir) Remove(name string) error {
	return d.gate.change(func() error { return d.Dir.Remove(name) })
}

func (d gatedDir) Mkdir(name string) error {
	return d.gate.change(func() error { return d.Dir.Mkdir(name) })
}

func (d gatedDir) MkdirAllFor(name string, owner sandbox.Workspace) error {
	if o, ok := owner.(gatedDir); ok {
		owner = o.Dir
	}
	return d.gate.change(func() error { return d.Dir.MkdirAllFor(name, owner) })
}

func (d gatedDir) Rename(from, to string) error {
	return d.gate.change(func() error { return d.Dir.Rename(from, to) })
}

func (d gatedDir) SetFileMetadata(name string, md map[string]string) error {
	return d.gate.change(func() error { return d.Dir.SetFileMetadata(name, md) })
}

func (d gatedDir) Chmod(name string, mode uint32) error {
	return d.gate.change(func() error { return d.Dir.Chmod(name, mode) })
}

func (d gatedDir) Symlink(target, name string) error {
	return d.gate.change(func() error { return d.Dir.Symlink(target, name) })
}

// gated is d as the files API is given it.
func (s *Sandbox) gated(d *workspace.Dir) sandbox.Workspace { return gatedDir{Dir: d, gate: &s.files} }
