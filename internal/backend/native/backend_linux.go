// Package native runs sandboxes with the Linux kernel's own isolation:
// user, mount, PID, network, IPC, UTS and cgroup namespaces, a seccomp
// filter, cgroups (v1 or v2) and rlimits, and a read-only root assembled
// from the host's /usr.
//
// The supervisor (this package, in the vivarium process) creates a
// sandbox's cgroup, starts the sandbox's init (this binary again, see
// init_linux.go) in fresh namespaces, and talks to the runner inside over
// pipes. It never trusts what comes back: output is capped and treated as
// bytes, and the outcome of a run (status, exit code, CPU, memory) comes
// from the kernel, not from the sandbox.
package native

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/cgroups"
	"github.com/vivarium-sandbox/vivarium/internal/runner"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/seccomp"
)

// Config configures the native backend.
type Config struct {
	// UIDBase is the host uid (and gid) that uid 0 of every sandbox maps
	// to; the sandbox user, uid 1000 inside, is UIDBase+1000 on the host.
	// The range must belong to nobody on the host.
	UIDBase uint32
	// CgroupParent is the group sandboxes are created under.
	CgroupParent string
	// InsecureNoCgroups accepts sandboxes without cgroups: memory and
	// process limits then come from rlimits only (per process, not per
	// sandbox), and CPU time is not accounted across processes.
	InsecureNoCgroups bool
	// Exe is the binary re-executed as the sandbox's init. Default: this one.
	Exe string
	// Zygote forks every sandbox's runner from a zygote, a Python that has
	// imported the runner and Preload once (see zygote_linux.go): a
	// sandbox then starts in milliseconds and shares the preloaded
	// modules' memory. Without it each sandbox starts its own Python.
	Zygote  bool
	Preload []string
	Logger  *slog.Logger
}

// DefaultUIDBase is far above the ranges distributions hand out to users and
// to rootless containers (subuid ranges start at 100000).
const DefaultUIDBase = 1_000_000_000

// Backend creates native sandboxes.
type Backend struct {
	cfg     Config
	cgroups cgroups.Manager // nil with InsecureNoCgroups
	log     *slog.Logger

	etcOnce sync.Once
	etc     []etcEntry
	etcErr  error
	top     []topLink

	zmu       sync.Mutex
	zygotes   map[string]*zygote       // by interpreter
	zstarting map[string]chan struct{} // closed when a start ends
	closed    bool
}

var (
	_ sandbox.Backend = (*Backend)(nil)
	_ sandbox.Sweeper = (*Backend)(nil)
)

// New checks that the host can run native sandboxes and returns a backend.
// Every error names what is missing and, where one exists, the option that
// accepts a weaker sandbox.
func New(cfg Config) (*Backend, error) {
	if cfg.UIDBase == 0 {
		cfg.UIDBase = DefaultUIDBase
	}
	if cfg.Exe == "" {
		cfg.Exe = "/proc/self/exe"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	b := &Backend{cfg: cfg, log: cfg.Logger, zygotes: map[string]*zygote{}, zstarting: map[string]chan struct{}{}}
	for _, m := range cfg.Preload {
		if !validModule(m) {
			return nil, fmt.Errorf("%w: preload %q is not a module name", sandbox.ErrInvalidSpec, m)
		}
	}
	if err := Check(); err != nil {
		return nil, err
	}
	if !cfg.InsecureNoCgroups {
		m, err := cgroups.Detect(cfg.CgroupParent)
		if err != nil {
			return nil, fmt.Errorf("%w: %v. Sandboxes need cgroups to limit memory and processes; "+
				"to run with rlimits only (weaker: limits per process, not per sandbox), pass --insecure-no-cgroups",
				sandbox.ErrUnsupported, err)
		}
		b.cgroups = m
	}
	return b, nil
}

// Check reports the first host feature that native sandboxes need and this
// host lacks.
func Check() error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("%w: the native backend needs root (it maps sandbox users to unprivileged host "+
			"uids and creates cgroups); run vivarium as root", sandbox.ErrUnsupported)
	}
	if b, err := os.ReadFile("/proc/sys/user/max_user_namespaces"); err != nil {
		return fmt.Errorf("%w: this kernel has no user namespaces (CONFIG_USER_NS)", sandbox.ErrUnsupported)
	} else if strings.TrimSpace(string(b)) == "0" {
		return fmt.Errorf("%w: user namespaces are disabled (user.max_user_namespaces = 0); "+
			"enable them with: sysctl -w user.max_user_namespaces=15000", sandbox.ErrUnsupported)
	}
	if err := seccomp.Supported(); err != nil {
		return fmt.Errorf("%w: %v", sandbox.ErrUnsupported, err)
	}
	return nil
}

// Name implements sandbox.Backend.
func (b *Backend) Name() string { return "native" }

// CgroupVersion is 1 or 2, or 0 when running without cgroups.
func (b *Backend) CgroupVersion() int {
	if b.cgroups == nil {
		return 0
	}
	return b.cgroups.Version()
}

// CPUShares reports whether each sandbox competes for CPU as one entity
// (the cpu cgroup controller), so that one running many processes cannot
// starve the others or the supervisor.
func (b *Backend) CPUShares() bool { return b.cgroups != nil && b.cgroups.CPUController() }

// Sweep implements sandbox.Sweeper: it kills whatever still runs in the
// cgroups under this backend's parent and removes them. Sandboxes die with
// their supervisor (PR_SET_PDEATHSIG), but a supervisor killed with
// SIGKILL leaves their cgroups behind. Only one supervisor may use a
// cgroup parent at a time.
func (b *Backend) Sweep() ([]string, error) {
	if b.cgroups == nil {
		return nil, nil
	}
	return b.cgroups.Sweep()
}

func (b *Backend) hostFiles() ([]etcEntry, []topLink, error) {
	b.etcOnce.Do(func() {
		b.etc, b.etcErr = buildEtc("/etc")
		b.top = hostTopLevel("/")
	})
	return b.etc, b.top, b.etcErr
}

// Create implements sandbox.Backend.
func (b *Backend) Create(ctx context.Context, spec sandbox.Spec) (sandbox.Sandbox, error) {
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	if spec.Python == "" {
		spec.Python = sandbox.DefaultPython
	}
	if err := checkPython(spec.Python); err != nil {
		return nil, err
	}
	etc, top, err := b.hostFiles()
	if err != nil {
		return nil, fmt.Errorf("build /etc: %w", err)
	}
	spec.Limits = spec.Limits.WithDefaults()
	if spec.Egress != nil {
		spec.Env = sandbox.WithEgressEnv(spec.Env)
	}
	if b.cfg.Zygote {
		z, err := b.zygoteFor(ctx, spec.Python)
		if err != nil {
			return nil, err
		}
		cfg := b.initConfig(spec, nil, nil)
		cfg.Role = roleForked
		cfg.RunnerFiles, cfg.RunnerArgs = nil, nil
		return start(ctx, b, spec, cfg, z)
	}
	cfg := b.initConfig(spec, etc, top)
	return start(ctx, b, spec, cfg, nil)
}

// Warm starts the zygote of the default interpreter now, so that the
// first sandbox does not wait for it. It does nothing without Zygote.
func (b *Backend) Warm(ctx context.Context) error {
	if !b.cfg.Zygote {
		return nil
	}
	_, err := b.zygoteFor(ctx, sandbox.DefaultPython)
	return err
}

// zygoteFor returns the live zygote for an interpreter, starting one if
// needed (once, however many callers wait for it).
func (b *Backend) zygoteFor(ctx context.Context, python string) (*zygote, error) {
	b.zmu.Lock()
	for {
		if b.closed {
			b.zmu.Unlock()
			return nil, sandbox.ErrClosed
		}
		if z := b.zygotes[python]; z != nil && z.alive() {
			b.zmu.Unlock()
			return z, nil
		}
		ch := b.zstarting[python]
		if ch == nil {
			break
		}
		b.zmu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		b.zmu.Lock()
	}
	ch := make(chan struct{})
	b.zstarting[python] = ch
	old := b.zygotes[python]
	b.zmu.Unlock()
	if old != nil {
		b.log.Warn("zygote died; starting a new one", "python", python, "err", old.deadErr)
		old.close()
	}

	etc, top, err := b.hostFiles()
	var z *zygote
	if err == nil {
		// Not the caller's context: others wait for this zygote too.
		sctx, cancel := context.WithTimeout(context.Background(), zygoteStartTimeout)
		start := time.Now()
		z, err = b.startZygote(sctx, python, etc, top)
		cancel()
		if err == nil {
			b.log.Info("zygote ready", "python", python, "preload", b.cfg.Preload, "ms", time.Since(start).Milliseconds())
		}
	}
	b.zmu.Lock()
	delete(b.zstarting, python)
	close(ch)
	if err == nil {
		if b.closed {
			b.zmu.Unlock()
			z.close()
			return nil, sandbox.ErrClosed
		}
		b.zygotes[python] = z
	}
	b.zmu.Unlock()
	return z, err
}

// Close stops the backend's zygotes; every sandbox forked from them dies
// with them. Sandboxes should be closed first.
func (b *Backend) Close() error {
	b.zmu.Lock()
	b.closed = true
	zs := b.zygotes
	b.zygotes = map[string]*zygote{}
	b.zmu.Unlock()
	for _, z := range zs {
		z.close()
	}
	return nil
}

// validModule accepts dotted Python module names.
func validModule(m string) bool {
	if m == "" || len(m) > 200 {
		return false
	}
	for _, part := range strings.Split(m, ".") {
		if part == "" || !(part[0] == '_' || part[0] >= 'a' && part[0] <= 'z' || part[0] >= 'A' && part[0] <= 'Z') {
			return false
		}
		for _, c := range part {
			if !(c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
				return false
			}
		}
	}
	return true
}

// checkPython refuses interpreters the sandbox cannot see: only the host's
// /usr is mounted.
func checkPython(p string) error {
	real, err := filepath.EvalSymlinks(p)
	if err != nil {
		return fmt.Errorf("%w: python %s: %v", sandbox.ErrInvalidSpec, p, err)
	}
	if !strings.HasPrefix(real, "/usr/") {
		return fmt.Errorf("%w: python %s resolves to %s, outside /usr, the only part of the host a sandbox sees",
			sandbox.ErrInvalidSpec, p, real)
	}
	return nil
}

func (b *Backend) initConfig(spec sandbox.Spec, etc []etcEntry, top []topLink) *initConfig {
	l := spec.Limits
	mode := "--persistent"
	if spec.OneShot {
		mode = "--oneshot"
	}
	cfg := &initConfig{
		Python:      spec.Python,
		RunnerArgs:  []string{"-s", "-B", runnerDir + "/" + runner.ScriptName, mode},
		RunnerFiles: runner.Files(),
		Env:         sandboxEnv(spec.Env),
		Etc:         etc,
		TopLevel:    top,
		DiskBytes:   l.Disk,
		// One inode per 8 KiB of disk: enough for source trees, not
		// enough for an inode-exhaustion attack to cost much kernel memory.
		DiskInodes: max(l.Disk/(8<<10), 1024),
		OpenFiles:  uint64(l.OpenFiles),
		OneShot:    spec.OneShot,
		MemTotal:   l.Memory,
	}
	if spec.OneShot && l.CPUTime > 0 {
		// Per-process backstop; the cgroup's CPU accounting is the limit.
		cfg.CPUSeconds = uint64((l.CPUTime + 999_999_999) / 1_000_000_000)
	}
	if b.cgroups == nil {
		cfg.MaxProcs = uint64(l.Pids)
		cfg.MemoryBytes = uint64(l.Memory)
	}
	return cfg
}

// sandboxEnv is the runner's environment: a fixed base, then the user's.
// Nothing comes from the host's environment.
func sandboxEnv(user map[string]string) []string { return sandbox.Environ(user) }

func newID() string {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	return hex.EncodeToString(b[:])
}
