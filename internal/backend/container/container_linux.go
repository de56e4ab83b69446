// Package container runs sandboxes in containers of a container runtime
// (gVisor's runsc, Docker): the runtime makes the isolation, and Vivarium's
// agent (internal/agent), PID 1 of the container, runs the Python runner
// and commands inside, speaking to this package over the container's
// standard input and output.
//
// Every container gets, from this package: a workspace that is a
// size-limited tmpfs of its own on the host (mounted under a directory
// only root can enter, bound into the container at /workspace), so files
// go in and out through the same confined code as the native backend's;
// a cgroup of its own (the runtime puts the container in it) for limits
// and accounting; and the runner's protocol, whose executions, code
// contexts and commands are internal/core's, as every backend's are
// (sandbox_linux.go follows the agent's stream and drives the core).
package container

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vivarium-sandbox/vivarium/internal/agent"
	"github.com/vivarium-sandbox/vivarium/internal/cgroups"
	"github.com/vivarium-sandbox/vivarium/internal/core"
	"github.com/vivarium-sandbox/vivarium/internal/fileutil"
	"github.com/vivarium-sandbox/vivarium/internal/hostuid"
	"github.com/vivarium-sandbox/vivarium/internal/runner"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/workspace"
)

// Runtime starts containers.
type Runtime interface {
	// Name is the backend's name ("gvisor", "docker").
	Name() string
	// Launch starts a container whose process is the agent (agent.Arg0),
	// with the host directories of l.Disk bound at /workspace, /tmp and
	// /dev/shm, in the cgroup l.Cgroup (when the runtime takes one), with
	// no network. A Launch that fails removes what it started, or wraps
	// ErrLeftBehind.
	Launch(ctx context.Context, l Launch) (Container, error)
}

// Launch is one container to start.
type Launch struct {
	ID   string
	Spec sandbox.Spec
	Disk Disk
	// UID and GID are the sandbox user's, as the agent sets them: the
	// host's ids where the runtime has no user namespace of its own
	// (Docker with runc), a sandbox's own when Config.Users is set.
	UID, GID int
	// Cgroup is the container's group (its directory in each hierarchy),
	// for runtimes that place the container themselves; nil otherwise.
	Cgroup cgroups.Group
}

// Disk is a sandbox's one size-limited tmpfs on the host, as in the native
// backend: its directories are the container's /workspace, /tmp and
// /dev/shm, so that one limit holds for all three.
type Disk struct {
	Dir                 string // the tmpfs; the sandbox's state lives beside it
	Workspace, Tmp, Shm string
}

// ErrLeftBehind is wrapped by a Launch that failed and could not remove
// the container it started: processes of it may be left.
var ErrLeftBehind = errors.New("the container may be left behind")

// Container is a started container.
type Container interface {
	// Stdin and Stdout are the agent's.
	Stdin() io.WriteCloser
	Stdout() io.Reader
	// Kill ends every process of the container at once.
	Kill() error
	// Done is closed when the container has ended.
	Done() <-chan struct{}
	// Stats reads CPU time, peak memory and OOM kills, where the runtime
	// can tell; ok is false where it cannot.
	Stats() (st cgroups.Stats, ok bool)
	// Remove frees what the runtime holds for the container; it is called
	// after Done.
	Remove() error
}

// CgroupCleaner is a Container whose runtime makes cgroup directories of
// its own beside the sandbox's group (runsc: the group's path in every
// hierarchy, not only those Vivarium limits with). RemoveCgroups removes
// them; it is called once the group is destroyed, when nothing can be
// left in them.
type CgroupCleaner interface {
	RemoveCgroups()
}

// Checkpointer is a Container whose runtime can save it and bring it back
// (sandbox.Pauser, pause_linux.go): Checkpoint saves the state of every
// process of the container (memory, open files, the agent waiting for its
// next frame) into a directory and ends the container; Restore starts a
// container from that state in its place, on the same mounts and cgroup,
// whose agent is the one that was saved, reached through new standard
// input and output.
type Checkpointer interface {
	// CheckpointSupported returns nil if the container can be
	// checkpointed, or why not (an ErrUnsupported).
	CheckpointSupported() error
	// Checkpoint saves the container into dir, an empty directory of the
	// backend's (0700), and ends it: Done is closed soon after it
	// returns nil. A Checkpoint that fails may have ended the container
	// too (runsc ends a sandbox whose save failed): Done says; one whose
	// error wraps sandbox.ErrUnsupported did nothing to it.
	Checkpoint(ctx context.Context, dir string) error
	// Restore starts a container from the checkpoint in dir, in place of
	// this one (ended and removed). Its Stdin and Stdout are the restored
	// agent's.
	Restore(ctx context.Context, dir string) (Container, error)
	// RestoreOverhead is the memory a restore takes, charged to the
	// container's cgroup, beyond what the container held when it was
	// checkpointed: a pause is refused where the restore would not fit
	// in the sandbox's memory limit, as the sandbox could then never be
	// resumed.
	RestoreOverhead() int64
}

// Explainer is a Container whose runtime says why it ended, in its own
// words (runsc's last line on standard error), for an error that names
// the cause.
type Explainer interface {
	WhyEnded() string
}

// Config configures a Backend.
type Config struct {
	Runtime Runtime
	// StateDir holds every sandbox's workspace mount, under a directory
	// only root can enter.
	StateDir string
	// Cgroups, when set, makes a group per sandbox that Launch gets.
	Cgroups cgroups.Manager
	// UID and GID of the sandbox user as the host sees them (files of the
	// workspace are created as them), unless Users is set.
	UID, GID int
	// Users, when set, makes every sandbox a host user of its own: a
	// range of the pool per sandbox, whose id SandboxUID is the sandbox
	// user's uid and gid on the host, returned once the sandbox's
	// container and every process of it are gone. The kernel keeps many
	// budgets per user (inotify instances, pipe buffers, descriptors in
	// flight, queued signals, message-queue bytes, locked memory,
	// RLIMIT_NPROC); with a user of its own, a sandbox exhausts only its
	// own. For runtimes without a user namespace (Docker with runc).
	Users *hostuid.Pool
	// HostPids is the pids limit of a sandbox's cgroup for a sandbox whose
	// own limit is pids: a runtime whose kernel runs on the host as
	// processes (gVisor's) needs room for its own. Nil: pids.
	HostPids func(pids int) int64
	// CheckpointDir holds paused sandboxes' checkpoints (their memory, on
	// disk), a directory per sandbox (0700) removed when it closes; a
	// checkpoint is removed once resumed. Needed by runtimes whose
	// containers are Checkpointers.
	CheckpointDir string
	// Egress: the runtime's containers can carry a sandbox's network
	// proxy (egress_linux.go): its agent's connections reach the host.
	Egress bool
	Logger *slog.Logger
}

// Backend makes container sandboxes.
type Backend struct {
	cfg Config
}

var _ sandbox.Backend = (*Backend)(nil)

// New returns a backend; the runtime must have been checked.
func New(cfg Config) (*Backend, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		return nil, err
	}
	if err := os.Chmod(cfg.StateDir, 0o700); err != nil {
		return nil, err
	}
	return &Backend{cfg: cfg}, nil
}

// Name implements sandbox.Backend.
func (b *Backend) Name() string { return b.cfg.Runtime.Name() }

// Close frees what the runtime keeps for every sandbox (a root file
// system's skeleton); the sandboxes must be closed first.
func (b *Backend) Close() error {
	if c, ok := b.cfg.Runtime.(io.Closer); ok {
		return c.Close()
	}
	return nil
}

// Sweep removes disk mounts and directories a crashed supervisor left.
func (b *Backend) Sweep() ([]string, error) {
	entries, err := os.ReadDir(b.cfg.StateDir)
	if err != nil {
		return nil, err
	}
	var out []string
	var errs []error
	// Every process of the old sandboxes first, through their cgroups;
	// then what the runtime keeps of their containers; then their disks.
	if b.cfg.Cgroups != nil {
		names, err := b.cfg.Cgroups.Sweep()
		out = append(out, names...)
		errs = append(errs, err)
	}
	if sw, ok := b.cfg.Runtime.(interface{ Sweep() ([]string, error) }); ok {
		names, err := sw.Sweep()
		out = append(out, names...)
		errs = append(errs, err)
	}
	for _, e := range entries {
		dir := filepath.Join(b.cfg.StateDir, e.Name())
		unmountDisk(filepath.Join(dir, "disk"))
		if err := os.RemoveAll(dir); err != nil {
			errs = append(errs, err)
			continue
		}
		out = append(out, e.Name())
	}
	// And the checkpoints of the sandboxes it had paused, which cannot
	// be resumed without it.
	if b.cfg.CheckpointDir != "" {
		cps, _ := os.ReadDir(b.cfg.CheckpointDir)
		for _, e := range cps {
			if err := os.RemoveAll(filepath.Join(b.cfg.CheckpointDir, e.Name())); err != nil {
				errs = append(errs, err)
				continue
			}
			out = append(out, "checkpoint "+e.Name())
		}
	}
	return out, errors.Join(errs...)
}

// Create implements sandbox.Backend.
func (b *Backend) Create(ctx context.Context, spec sandbox.Spec) (sandbox.Sandbox, error) {
	// It mounts no volume, and has a way out only where its runtime
	// carries the proxy (Config.Egress): a spec that asks for more is
	// refused.
	if err := sandbox.CheckSpec(b, spec); err != nil {
		return nil, err
	}
	if u := spec.SandboxUser(); u.UID == 0 {
		// uid 0 of the container is the host's (docker) or gVisor's
		// kernel's: not given to code (process_linux.go).
		return nil, fmt.Errorf("%w: template %q runs as root (its USER); the %s backend runs code as a user only",
			sandbox.ErrUnsupported, spec.Root.Template, b.Name())
	}
	if spec.Python == "" && spec.Root == nil { // a template's: python3 on its PATH (the agent finds it)
		spec.Python = sandbox.DefaultPython
	}
	if spec.Egress != nil {
		spec.Env = sandbox.WithEgressEnv(spec.Env)
	}
	spec.Limits = spec.Limits.WithDefaults()
	s, err := b.start(ctx, spec)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", sandbox.ErrSetup, b.Name(), err)
	}
	return s, nil
}

// RootsSupported implements sandbox.RootBackend: a runtime that gives a
// bundle a template's root (gvisor's) runs templates; others do not.
func (b *Backend) RootsSupported() error {
	if rr, ok := b.cfg.Runtime.(interface{ RootsSupported() error }); ok {
		return rr.RootsSupported()
	}
	return errors.New("its containers run the host's Python; templates need the native or gvisor backend")
}

func newID() string {
	var b [8]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// setupTimeout bounds a container's start: gVisor and Docker take a second
// or more, several on a busy machine.
const setupTimeout = 2 * time.Minute

func (b *Backend) start(ctx context.Context, spec sandbox.Spec) (_ *Sandbox, err error) {
	s := b.newSandbox(spec, runner.NewContexts("/workspace"))
	defer func() {
		if err != nil {
			s.Close()
		}
	}()
	if err := s.provision(""); err != nil {
		return nil, err
	}
	if err := s.launch(ctx); err != nil {
		return nil, err
	}
	return s, nil
}

// newSandbox is a Sandbox of spec with nothing yet (provision, then launch
// or a restore, give it its container).
func (b *Backend) newSandbox(spec sandbox.Spec, contexts *runner.Contexts) *Sandbox {
	s := &Sandbox{id: newID(), b: b, spec: spec, cmds: map[uint32]*cmdStreams{}}
	s.Core = core.New((*driver)(s), core.Config{Spec: spec, Contexts: contexts, SetupTimeout: setupTimeout})
	return s
}

// provision gives s what its container runs on: a host user (with
// Config.Users), its state directory, a cgroup, and its disk, empty or
// (files not "") filled with a copy of the disk files holds (a snapshot's,
// snapshot_linux.go), copied in the sandbox's cgroup so that their memory
// is charged to it. A sandbox released while paused is provisioned again
// by its resume (persist_linux.go), with a cgroup of another name: the
// runtime may still be removing its old group's directories.
func (s *Sandbox) provision(files string) error {
	b, spec := s.b, s.spec
	// The disk: a tmpfs of the disk limit's size, in a directory only
	// root can enter, so that no host user reaches it by path.
	s.uid, s.gid = b.cfg.UID, b.cfg.GID
	if u := spec.Root; u != nil && u.User != nil {
		// A template's USER: the runtime's kernel maps ids one to one.
		s.uid, s.gid = int(u.User.UID), int(u.User.GID)
	}
	if b.cfg.Users != nil && s.users == nil {
		r, err := b.cfg.Users.Acquire()
		if err != nil {
			return err
		}
		s.users = &r
		u := spec.SandboxUser()
		s.uid, s.gid = int(r.ID(u.UID)), int(r.ID(u.GID))
	}
	s.dir = filepath.Join(b.cfg.StateDir, s.id)
	if err := os.Mkdir(s.dir, 0o700); err != nil {
		return err
	}
	if b.cfg.Cgroups != nil {
		pids := int64(spec.Limits.Pids)
		if b.cfg.HostPids != nil {
			pids = b.cfg.HostPids(spec.Limits.Pids)
		}
		l := cgroups.Of(spec)
		l.Pids = pids
		name := s.id
		if s.provisions > 0 {
			name = fmt.Sprintf("%s-%d", s.id, s.provisions)
		}
		cg, err := b.cfg.Cgroups.New(name, l)
		if err != nil {
			return err
		}
		s.setGroup(cg)
	}
	s.provisions++
	disk := Disk{Dir: filepath.Join(s.dir, "disk")}
	if err := os.Mkdir(disk.Dir, 0o700); err != nil {
		return err
	}
	opts := fmt.Sprintf("size=%d,nr_inodes=%d,mode=0755", spec.Limits.Disk, max(spec.Limits.Disk/(8<<10), 1024))
	if err := mountDisk(disk.Dir, opts); err != nil {
		return fmt.Errorf("disk tmpfs: %w", err)
	}
	s.mounted = true
	disk.Workspace, disk.Tmp, disk.Shm = filepath.Join(disk.Dir, "workspace"), filepath.Join(disk.Dir, "tmp"), filepath.Join(disk.Dir, "shm")
	if files != "" {
		// cp -a in the sandbox's cgroup: the tmpfs's memory is charged
		// to it, as the source's was to the source's.
		if err := fileutil.CopyTree(files, disk.Dir, s.group()); err != nil {
			return fmt.Errorf("the snapshot's files: %w", err)
		}
		// The runtime binds these into the container, and the workspace
		// is opened by path: directories, never links.
		for _, d := range []string{disk.Workspace, disk.Tmp, disk.Shm} {
			if fi, err := os.Lstat(d); err != nil || !fi.IsDir() {
				return fmt.Errorf("the snapshot's files: %s is not a directory", filepath.Base(d))
			}
		}
	} else {
		for _, d := range []string{disk.Workspace, disk.Tmp, disk.Shm} {
			if err := os.Mkdir(d, 0o755); err != nil {
				return err
			}
		}
		if err := os.Chown(disk.Workspace, s.uid, s.gid); err != nil {
			return err
		}
		for _, d := range []string{disk.Tmp, disk.Shm} {
			if err := os.Chmod(d, 0o777|os.ModeSticky); err != nil {
				return err
			}
		}
	}
	ws, err := workspace.Open(disk.Workspace, s.uid, s.gid)
	if err != nil {
		return err
	}
	s.setWorkspace(ws)
	s.disk = disk
	return nil
}

// launch starts the sandbox's container and waits for its runner.
func (s *Sandbox) launch(ctx context.Context) error {
	b, spec := s.b, s.spec
	c, err := b.cfg.Runtime.Launch(ctx, Launch{ID: s.id, Spec: spec, Disk: s.disk, Cgroup: s.group(), UID: s.uid, GID: s.gid})
	if err != nil {
		if errors.Is(err, ErrLeftBehind) {
			s.leftBehind.Store(true)
		}
		return err
	}
	ss := newSession(c)
	s.sess.Store(ss)
	go s.read(ss)
	if s.closing.Load() {
		// Close ran meanwhile, and may have ended the session before.
		ss.end()
		return sandbox.ErrClosed
	}

	cfg := agent.Config{
		Python:     spec.Python,
		RunnerArgs: []string{"-s", "-B", RunnerDir + "/" + runner.ScriptName, runnerMode(spec)},
		Env:        sandbox.Environ(spec.Env),
		Workspace:  "/workspace",
		UID:        s.uid, GID: s.gid, Groups: spec.SandboxUser().Groups,
		OpenFiles: uint64(spec.Limits.OpenFiles),
		FileSize:  uint64(spec.Limits.Disk),
		// The kernel counts RLIMIT_NPROC per user: the sandbox user's
		// processes are the sandbox's alone (a user of its own, or a
		// runtime's kernel of its own).
		MaxProcs: uint64(spec.Limits.Pids),
	}
	if spec.Egress != nil {
		cfg.Egress = sandbox.EgressAddr
	}
	if spec.OneShot && spec.Limits.CPUTime > 0 {
		cfg.CPUSeconds = uint64((spec.Limits.CPUTime + time.Second - 1) / time.Second)
	}
	if err := ss.out.Write(agent.KindConfig, 0, mustJSON(cfg)); err != nil {
		return fmt.Errorf("send the agent its configuration: %w", err)
	}
	if err := s.AwaitRunner(ctx); err != nil {
		if isClosed(ss.ended) {
			return s.setupFailure()
		}
		return err
	}
	return nil
}

// relaunch replaces a persistent sandbox's dead container by a new one on
// the same disk and cgroup: files are kept, state is not (lost says
// whether the next execution is told). Called during an execution.
func (s *Sandbox) relaunch(ctx context.Context, lost bool) error {
	if s.closing.Load() {
		return sandbox.ErrClosed
	}
	if err := s.session().end(); err != nil {
		return fmt.Errorf("%w: remove the dead container: %v", sandbox.ErrClosed, err)
	}
	s.mu.Lock()
	s.runner, s.setupErr = nil, ""
	s.mu.Unlock()
	s.ResetRunner(lost)
	if err := s.launch(ctx); err != nil {
		return fmt.Errorf("%w: a new container: %v", sandbox.ErrClosed, err)
	}
	return nil
}

// mountDisk mounts a sandbox's disk, a tmpfs of opts, on dir, and
// unmountDisk unmounts it. Tests that run without root replace them
// (the disk is then dir itself, with no limit of its own).
var (
	mountDisk = func(dir, opts string) error {
		return unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, opts)
	}
	unmountDisk = func(dir string) error { return unix.Unmount(dir, unix.MNT_DETACH) }
)

func runnerMode(spec sandbox.Spec) string {
	if spec.OneShot {
		return "--oneshot"
	}
	return "--persistent"
}
