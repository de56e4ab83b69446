// Package sandbox defines what every isolation backend offers: the Spec a
// sandbox is created from, its Limits, the Result of running code in it, and
// the Backend and Sandbox interfaces that transports and the CLI program
// against.
//
// Outcomes of user code (an exception, a timeout, an OOM kill) are values in
// Result.Status, not Go errors. A Go error means the sandbox itself could not
// do its job.
package sandbox

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// Backend creates sandboxes of one isolation kind.
type Backend interface {
	// Name is how users select the backend: "native", "gvisor", ...
	Name() string
	// Create starts a sandbox and returns once it is ready for code.
	Create(ctx context.Context, spec Spec) (Sandbox, error)
}

// Sweeper is a Backend that can find and remove what an earlier process
// left behind when it died without cleaning up (processes, cgroups). A
// server calls it once at start, before it creates any sandbox.
type Sweeper interface {
	// Sweep removes leftovers and describes what it removed.
	Sweep() ([]string, error)
}

// Quiescer is a one-shot Sandbox whose execution may return before its
// tear-down is over (the code is done; what it left is being killed).
// Quiesce waits until none of its processes runs any more, so that its
// workspace holds still.
type Quiescer interface {
	Quiesce()
}

// Prober is a Sandbox that can tell, cheaply, whether it still works (a
// pool checks before it hands out a sandbox that waited).
type Prober interface {
	Alive() bool
}

// MemoryUser is a Sandbox that can tell how much memory it holds: its
// processes' proportional set size (shared pages divided among sharers).
type MemoryUser interface {
	MemoryPSS() (int64, error)
}

// Pauser is a Sandbox that can be paused: the state of its processes
// (memory, open files, working directories, background processes) is
// saved to disk and its processes end, so that it holds no memory; Resume
// brings them back where they were. Between the two every other call
// fails with ErrPaused, and Close discards the saved state. A backend that
// cannot pause a given sandbox answers ErrUnsupported, naming why.
type Pauser interface {
	Pause(ctx context.Context) error
	Resume(ctx context.Context) error
	Paused() bool
	// PauseSupported returns nil if this sandbox can be paused, or an
	// ErrUnsupported that says why not (what it was made with, what the
	// host lacks), so that a caller can refuse early what would fail.
	PauseSupported() error
}

// DefaultCheckpointRoot holds the default checkpoint directories of the
// backends that keep paused sandboxes on disk (native, gvisor): one per
// cgroup parent (DefaultCheckpointDir). It is on disk: a checkpoint under
// /run, often a tmpfs, would keep the memory a pause frees.
const DefaultCheckpointRoot = "/var/lib/vivarium/checkpoints"

// DefaultCheckpointDir is where a backend whose sandboxes are created
// under cgroupParent keeps their checkpoints by default.
func DefaultCheckpointDir(cgroupParent string) string {
	return filepath.Join(DefaultCheckpointRoot, strings.ReplaceAll(cgroupParent, "/", "_"))
}

// Forker is a Sandbox that can be forked: Fork makes n new sandboxes,
// each an exact copy of this one at that moment (its processes' memory,
// so variables and imports, its files, working directories), and each a
// sandbox of its own (namespaces, cgroup, host user, files, limits: the
// source's). The source goes on running unchanged. A backend that cannot
// fork a given sandbox answers ErrUnsupported, naming why.
type Forker interface {
	Fork(ctx context.Context, n int, opts ForkOptions) ([]Sandbox, error)
	// ForkSupported returns nil if this sandbox can be forked, or an
	// ErrUnsupported that says why not.
	ForkSupported() error
}

// ForkOptions are a fork's choices.
type ForkOptions struct {
	// SameRandomState keeps the copies' random generators as the
	// source's (Python's random, numpy's global generator), for a
	// reproducible search. By default each copy reseeds them from the
	// OS, so that copies do not share a random future.
	SameRandomState bool
	// Volumes, for a sandbox that mounts volumes, are each copy's, in
	// the order of the copies: the source's volumes at the same paths,
	// through leases of the copy's own (a copy may outlive its source).
	// Nil: the source's, for copies that do not outlive it.
	Volumes [][]VolumeMount
	// Egress, for a sandbox with network access, are each copy's proxy,
	// in the order of the copies: one of its own, never the source's.
	// The copies own those they are given; where Fork fails, the caller
	// closes them (Close is safe twice).
	Egress []Egress
}

// MaxFork bounds the copies one Fork makes.
const MaxFork = 64

// Snapshotter is a Sandbox that can be saved while it runs: SaveSnapshot
// writes into dir (made by it; it must not exist) what a new sandbox is
// made from (SnapshotRestorer): its processes' memory, its files, its
// code contexts. The sandbox goes on running unchanged. It returns the
// snapshot's size on disk. A backend that cannot save a given sandbox
// answers ErrUnsupported, naming why.
type Snapshotter interface {
	SaveSnapshot(ctx context.Context, dir string) (int64, error)
	// SnapshotSupported returns nil if this sandbox can be saved, or an
	// ErrUnsupported that says why not.
	SnapshotSupported() error
}

// SnapshotRestorer is a Backend that makes sandboxes from the snapshots
// its sandboxes saved (Snapshotter). The directory is trusted: the
// caller has checked it is one of its own, unchanged (internal/snapshot).
type SnapshotRestorer interface {
	CreateFromSnapshot(ctx context.Context, dir string, opts FromSnapshot) (Sandbox, error)
}

// PausePersister is a paused Sandbox (Pauser) that can be written down
// so that a later server brings it back (PausedOpener): PersistPaused
// writes into dir (made by it; it must not exist) what its resume needs
// and returns the bytes written. The sandbox stays paused as it was.
type PausePersister interface {
	PersistPaused(ctx context.Context, dir string) (int64, error)
}

// PausedReleaser is a PausePersister that, once what it wrote is where
// it will stay (dir), lets go of everything else it holds while paused
// (its images, the memory of its files, its host user and cgroup), as a
// sandbox PausedOpener made holds nothing: its resume reads dir, which
// the caller keeps until then, and checks as it checks what it gives
// PausedOpener. It fails, and the sandbox stays as it was, where it
// cannot (ErrUnsupported, saying why).
type PausedReleaser interface {
	ReleasePaused(dir string) error
}

// PausedOpener is a Backend that makes, of what a PausePersister wrote, a
// sandbox that is paused (Pauser) and holds nothing until it is resumed.
// The directory is trusted, as for SnapshotRestorer, and read again by
// the resume.
type PausedOpener interface {
	OpenPaused(ctx context.Context, dir string, opts FromSnapshot) (Sandbox, error)
}

// BasePruner is a backend whose kept paused sandboxes may refer to files
// of its own (native's pause bases, made once per upgrade): PruneBases
// removes those that none of keptDirs (the directories PersistPaused
// wrote that are on disk, opened or not) refers to and that it does not
// use itself. An unreadable directory among them prunes nothing.
type BasePruner interface {
	PruneBases(keptDirs []string) error
}

// FromSnapshot are the choices of a sandbox made from a snapshot; its
// spec (limits, environment) is the snapshot's.
type FromSnapshot struct {
	// Tenant is whom the new sandbox works for (Spec.Tenant).
	Tenant string
	// SameRandomState keeps the random generators as they were saved
	// (see ForkOptions).
	SameRandomState bool
	// Egress, for a paused sandbox that had network access
	// (PausedOpener): its proxy from now on, which it owns once opened;
	// nil, none.
	Egress Egress
	// Volumes, for a paused sandbox that mounted volumes (PausedOpener):
	// the same volumes at the same paths, mounted again at its resume.
	Volumes []VolumeMount
}

// ContextKeeper is a Sandbox that runs code in separate code contexts, as a
// notebook server runs separate kernels: each has its own variables (or,
// for bash and the other languages, its own process) and working directory. Every sandbox has the
// default contexts DefaultContext and BashContext; more are created with
// CreateContext. Contexts separate state, not privileges: they share the
// sandbox's user, files and limits.
type ContextKeeper interface {
	// CreateContext makes a context for language (runner.Languages:
	// python, bash, javascript, typescript, r, java)
	// whose code starts in cwd, an absolute path inside the sandbox
	// (empty: the workspace).
	CreateContext(language, cwd string) (CodeContext, error)
	// Contexts lists the contexts, default ones first.
	Contexts() []CodeContext
	// RestartContext forgets a context's state (variables, imports of its
	// namespace, its shell); the context keeps its ID. Other contexts
	// keep theirs.
	RestartContext(id string) error
	// RemoveContext deletes a context that CreateContext made.
	RemoveContext(id string) error
}

// CodeContext describes one code context.
type CodeContext struct {
	ID       string `json:"id"`
	Language string `json:"language"`
	Cwd      string `json:"cwd"`
}

// The IDs of the default contexts. An ExecRequest with an empty Context
// runs in DefaultContext.
const (
	DefaultContext = "python"
	BashContext    = "bash"
)

// Sandbox is one isolated environment with a Python runner inside.
type Sandbox interface {
	ID() string
	// Execute runs code and reports its outcome. Output is passed to sink
	// (if not nil) while the code runs, and collected in the Result too.
	Execute(ctx context.Context, req ExecRequest, sink Sink) (*Result, error)
	// Interrupt raises KeyboardInterrupt in the running execution, if any.
	Interrupt() error
	// Restart replaces the Python runner by a fresh one (all processes of
	// the sandbox are killed, state is lost); files are kept. It fails
	// with ErrBusy while an execution runs.
	Restart(ctx context.Context) error
	// Start runs a command in the sandbox beside the runner, as the same
	// user, in the same file system and limits.
	Start(ctx context.Context, cmd Command) (Process, error)
	// Workspace gives access to the sandbox's writable files.
	Workspace() Workspace
	// Close ends every process of the sandbox and frees everything it held.
	// It is safe to call more than once.
	Close() error
}

// ExecRequest is one piece of code to run.
type ExecRequest struct {
	Code string
	// Filename is what tracebacks show for the code ("<cell>" if empty).
	Filename string
	// Env is added to the sandbox's environment for this execution only.
	Env map[string]string
	// Timeout and CPUTime override the sandbox's limits when non-zero.
	Timeout, CPUTime time.Duration
	// Context is the code context to run in (see ContextKeeper); empty
	// means the default Python context, the one every execution of a
	// sandbox without contexts shares.
	Context string
}

// Command is a program to start in a sandbox.
type Command struct {
	Argv []string
	// Env is added to the sandbox's environment.
	Env map[string]string
	// Dir is the working directory; default the sandbox user's home.
	Dir string
	// User is who runs it: "" or UserSandbox, the sandbox user, or
	// UserRoot, uid 0 of the sandbox's own user namespace, which owns the
	// sandbox's system directories and has no capability: never the
	// host's root, never more of the kernel than the sandbox user.
	User string
	// Terminal, if set, runs the command in a pseudo-terminal of this
	// size, as its controlling terminal: the Process's Stdout carries what
	// the terminal shows (output and echo, escape sequences as bytes),
	// Stdin is what is typed (Ctrl-C is "\x03"), Stderr is empty, and the
	// Process is a Resizer. TERM is xterm-256color unless Env sets it. A
	// backend that has no terminals fails with an error wrapping
	// ErrUnsupported that names it.
	Terminal *TerminalSize
}

// TerminalSize is a terminal's size in character cells.
type TerminalSize struct {
	Rows uint16 `json:"rows"`
	Cols uint16 `json:"cols"`
}

// MaxTerminalSide bounds a terminal's rows and columns.
const MaxTerminalSide = 4096

// Validate checks that the size is one a terminal can have.
func (t TerminalSize) Validate() error {
	if t.Rows == 0 || t.Cols == 0 || t.Rows > MaxTerminalSide || t.Cols > MaxTerminalSide {
		return fmt.Errorf("%w: a terminal has 1 to %d rows and columns, not %dx%d", ErrInvalidSpec, MaxTerminalSide,
			t.Rows, t.Cols)
	}
	return nil
}

// Resizer is a Process that can be resized: one started with a terminal.
// The program in it is told with SIGWINCH, as by any terminal.
type Resizer interface {
	// Resize sets the terminal's size; it fails with ErrNoTerminal for a
	// process started without one.
	Resize(size TerminalSize) error
}

// Who a command runs as (Command.User).
const (
	UserSandbox = "user"
	UserRoot    = "root"
)

// Process is a command running in a sandbox. Its output must be read (or
// its pipes closed) for it to make progress.
type Process interface {
	PID() int
	Stdin() io.WriteCloser
	Stdout() io.ReadCloser
	Stderr() io.ReadCloser
	// Signal sends sig to the command's process group; for a command in a
	// terminal, to every process of its session (a shell's jobs are
	// process groups of their own).
	Signal(sig syscall.Signal) error
	// Done is closed when the command has exited; ExitCode is then valid
	// (128+n for a signal n).
	Done() <-chan struct{}
	ExitCode() int
}

// Sink receives output while code runs. Calls come from one goroutine at a
// time per stream; implementations must not retain p.
type Sink interface {
	Stdout(p []byte)
	Stderr(p []byte)
}

// ResultSink is a Sink that also receives rich results (display() calls,
// figures, the main result) as they are produced.
type ResultSink interface {
	Sink
	Result(Output)
}

// Workspace is the sandbox's writable directory. Every path is relative to
// it; no operation follows a symbolic link, reaches outside it, or blocks on
// a FIFO or device.
type Workspace interface {
	// WriteFile creates or replaces name with the content of r, creating
	// parent directories. At most limit bytes are written; more is an error
	// wrapping ErrTooLarge and leaves no file behind.
	WriteFile(name string, r io.Reader, limit int64) error
	// List returns the regular files under the workspace, recursively, up
	// to max entries.
	List(max int) ([]FileInfo, error)
	// CopyOut copies the regular files of the workspace into the host
	// directory dir, skipping symbolic links, FIFOs, devices and sockets,
	// and files bigger than maxFile. It returns what it copied.
	CopyOut(dir string, maxFile, maxTotal int64) ([]FileInfo, error)
	// OpenFile opens a regular file for reading; never blocks on a FIFO.
	OpenFile(name string) (io.ReadCloser, FileInfo, error)
	// ReadDir lists a directory, depth levels deep (1: its entries only).
	ReadDir(name string, depth int) ([]FileInfo, error)
	// Stat describes name without following a final link.
	Stat(name string) (FileInfo, error)
	// Remove deletes a file, a link or a directory tree.
	Remove(name string) error
}

// FileSystem is a Sandbox whose whole file system can be reached from the
// host, not only its workspace. Root gives it as user (UserSandbox or
// UserRoot) writes it, owning what it creates; names are relative to the
// sandbox's "/". The Workspace's confinement holds: no link is followed and
// no mount crossed, so only the sandbox's own disk is reached (/tmp, /etc,
// /root, /workspace ...), never /proc, /dev, /usr or another mount.
//
// A Workspace Root returns reaches the sandbox's mounts as they are; after
// a Resume (Pauser) the sandbox has new ones: ask Root again.
type FileSystem interface {
	Root(user string) (Workspace, error)
}

// WorkspaceEditor is a Workspace that also makes directories and moves
// entries, with the same confinement. Transports that need it (E2B's
// filesystem API) report a workspace without it as unsupported.
type WorkspaceEditor interface {
	// Mkdir creates a directory and its missing parents; it fails with
	// ErrExists when name is already there.
	Mkdir(name string) error
	// Rename moves a file or directory, replacing a file at to, and
	// creates the missing parents of to.
	Rename(from, to string) error
}

// DirGiver is a view of a sandbox's file system (its root's, say) that
// makes directories for another of its users, as E2B's envd (root) makes
// a user's directories anywhere.
type DirGiver interface {
	// MkdirAllFor makes name and its missing parents with this view's
	// permissions, and gives each directory it made to the owner of the
	// view owner (the same file system, as another user sees it). It
	// fails with ErrExists when name is already there.
	MkdirAllFor(name string, owner Workspace) error
}

// FileInfo describes one file of a workspace.
type FileInfo struct {
	Path    string      `json:"path"` // slash-separated, relative to the workspace
	Size    int64       `json:"size"`
	Type    string      `json:"-"` // "file", "dir", "symlink" or "other"
	Mode    fs.FileMode `json:"-"`
	ModTime time.Time   `json:"-"`
	// Owner and the other times, where the workspace knows them (a
	// volume's content API reports them).
	UID, GID               uint32    `json:"-"`
	AccessTime, ChangeTime time.Time `json:"-"`
}
