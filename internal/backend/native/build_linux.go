package native

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

// BuildStep is one step of a template's build (a Dockerfile's RUN) that
// RunBuildStep runs in a sandbox of the backend whose root is the layers
// built so far under a writable layer of its own: the walls of every
// sandbox (its own user namespace and host user, seccomp, cgroup limits,
// no network unless Egress). Its init writes nothing of its own into the
// root (initConfig.Build), and its runner has no Python: what the
// command writes is all the writable layer holds, and Commit makes it the
// step's layer.
type BuildStep struct {
	Layers []string // host directories of the layers (an image store's), the lowest first
	Args   []string // the command
	Env    []string // KEY=VALUE
	Dir    string   // its working directory
	// UID and GID run the command (0 to 65535, the ids the builder
	// resolved through the image); 0 is root, which keeps the
	// capabilities of buildCapabilities in the step's own user namespace.
	UID, GID uint32
	// Groups are its supplementary groups (each 0 to 65535, at most
	// maxBuildGroups).
	Groups []uint32
	Log    io.Writer
	// Limits are the step's; zero fields are DefaultBuildLimits'.
	Limits sandbox.Limits
	// Tenant is the group the step's sandbox is made in (sandbox.Spec's):
	// a key's builds share its CPU and memory with its sandboxes.
	Tenant string
	// Egress, if set, is the step's way out (a proxy of its own); the
	// step closes it.
	Egress sandbox.Egress
	// Commit is called once the command exited 0 and every process of
	// the step ended, with the writable layer (overlayfs's upper
	// directory) and the host uid and gid that are the sandbox's 0.
	Commit func(upper string, uid0, gid0 uint32) error
}

// DefaultBuildLimits bound a build's step: its writable layer is a tmpfs,
// in memory, as large as Disk, and Memory must hold it.
var DefaultBuildLimits = sandbox.Limits{Timeout: 30 * time.Minute, Memory: 4 << 30, Disk: 2 << 30, Pids: 1024}

// BuildExitError: a step's command exited with a status other than 0.
type BuildExitError struct{ Status int }

func (e *BuildExitError) Error() string { return fmt.Sprintf("exit status %d", e.Status) }

// RunBuildStep runs a build's step.
func (b *Backend) RunBuildStep(ctx context.Context, r BuildStep) (err error) {
	if r.Egress != nil {
		defer r.Egress.Close() // the sandbox's Close closes it too
	}
	if len(r.Args) == 0 {
		return errors.New("a RUN step without a command")
	}
	if r.Dir == "" {
		r.Dir = "/" // no WORKDIR: the root, as Docker's RUN
	}
	if r.UID > maxBuildID || r.GID > maxBuildID {
		return fmt.Errorf("%w: a build's step runs as ids 0 to %d, not %d:%d", sandbox.ErrInvalidSpec, maxBuildID, r.UID, r.GID)
	}
	if err := checkBuildGroups(r.Groups); err != nil {
		return fmt.Errorf("%w: %w", sandbox.ErrInvalidSpec, err)
	}
	lim := r.Limits
	def := DefaultBuildLimits
	if lim.Timeout == 0 {
		lim.Timeout = def.Timeout
	}
	if lim.Memory == 0 {
		lim.Memory = def.Memory
	}
	if lim.Disk == 0 {
		lim.Disk = def.Disk
	}
	if lim.Pids == 0 {
		lim.Pids = def.Pids
	}
	env := map[string]string{}
	for _, kv := range r.Env {
		if k, v, ok := strings.Cut(kv, "="); ok && k != "" {
			env[k] = v
		}
	}
	root := &sandbox.Root{Template: "build", ID: "build", Dir: r.Dir, Layers: r.Layers}
	spec := sandbox.Spec{Limits: lim, Env: env, Root: root, Egress: r.Egress, Tenant: r.Tenant}
	if err := spec.Validate(); err != nil {
		return err
	}
	if spec.Egress != nil {
		spec.Env = sandbox.WithEgressEnv(spec.Env)
	}
	spec.Limits = spec.Limits.WithDefaults()
	cfg, err := b.initConfig(spec, nil, nil)
	if err != nil {
		return err
	}
	cfg.Image, cfg.Build, cfg.Workdir, cfg.Python = true, true, r.Dir, ""
	cfg.HashSeed, cfg.Preload = "", nil
	s, err := start(ctx, b, spec, cfg, nil)
	if err != nil {
		return err
	}
	defer s.Close()
	ctx, cancel := context.WithTimeout(ctx, lim.Timeout)
	defer cancel()
	p, err := s.startAs(ctx, r.Args, r.Dir, [2]uint32{r.UID, r.GID}, r.Groups)
	if err != nil {
		return err
	}
	p.Stdin().Close()
	log := &lockedWriter{w: r.Log}
	var copies sync.WaitGroup
	for _, out := range []io.Reader{p.Stdout(), p.Stderr()} {
		copies.Add(1)
		go func() {
			defer copies.Done()
			io.Copy(log, out)
		}()
	}
	select {
	case <-p.Done():
	case <-ctx.Done():
		p.Signal(syscall.SIGKILL)
		<-p.Done()
		copies.Wait()
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return fmt.Errorf("the step ran longer than its limit of %v", lim.Timeout)
		}
		return ctx.Err()
	}
	copies.Wait()
	if code := p.ExitCode(); code != 0 {
		return &BuildExitError{Status: code}
	}
	if s.upper == nil {
		return errors.New("the step's sandbox kept no writable layer")
	}
	// Nothing of the step runs on while its layer is read: a process it
	// left behind could change the files under the build's walk.
	s.kill()
	<-s.dead()
	return r.Commit(fmt.Sprintf("/proc/self/fd/%d/upper", s.upper.Fd()), s.owner.ID(0), s.owner.ID(0))
}

// startAs starts a build step's command as the user of cred, with the
// step's environment over HOME (root's /root, else the root directory:
// the builder gives the image's home of a user it names).
func (s *Sandbox) startAs(ctx context.Context, argv []string, dir string, cred [2]uint32, groups []uint32) (sandbox.Process, error) {
	base := map[string]string{"HOME": "/"}
	if cred[0] == 0 {
		base["HOME"] = "/root"
	}
	maps.Copy(base, s.spec.Env)
	return s.StartCommand(ctx, sandbox.Command{Argv: argv, Dir: dir}, base, func(id uint64, env map[string]string) error {
		return s.send(ctlMsg{Op: opSpawn, ID: id, Argv: argv, Env: sandboxEnv(env), Dir: dir, Cred: &cred, Groups: groups})
	})
}

// maxBuildID is the last id a build step's command may have: a
// sandbox's user namespace maps 0 to 65535.
const maxBuildID = 65535

// maxBuildGroups bounds a build step's supplementary groups.
const maxBuildGroups = 64

// checkBuildGroups refuses supplementary groups a build step's command
// cannot have.
func checkBuildGroups(groups []uint32) error {
	if len(groups) > maxBuildGroups {
		return fmt.Errorf("a build's step has at most %d supplementary groups, not %d", maxBuildGroups, len(groups))
	}
	for _, g := range groups {
		if g > maxBuildID {
			return fmt.Errorf("a build's step's groups are 0 to %d, not %d", maxBuildID, g)
		}
	}
	return nil
}

// lockedWriter serialises the writes of a step's two output streams.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	if l.w == nil {
		return len(p), nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
