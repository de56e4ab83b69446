// Package native runs sandboxes with the Linux kernel's own isolation:
// user, mount, PID, network, IPC, UTS and cgroup namespaces, a seccomp
// filter, cgroups (v1 or v2) and rlimits, and a read-only root assembled
// from the host's /usr.
//
// The supervisor (this package, in the vivarium process) creates a
// sandbox's cgroup, starts the sandbox's init (this binary again, see
// init_linux.go) in fresh namespaces, and talks to the runner inside over
// pipes (runner_linux.go, capture_linux.go). Executions, code contexts and
// commands are internal/core's, which this package drives (driver_linux.go):
// output is capped and treated as bytes, and the outcome of a run (status,
// exit code, CPU, memory) comes from the kernel, not from the sandbox.
//
// Where to look: the backend and its configuration (backend_linux.go), a
// sandbox's life (sandbox_linux.go), init and its control socket
// (init_linux.go, control_linux.go, initproc_linux.go), the file system it
// sees (mount_linux.go, rootfs_linux.go, overlay_linux.go, procmask_linux.go,
// devices_linux.go), its host user and kernel budgets (spawn_linux.go,
// budgets_linux.go), the zygote (zygote_linux.go, zygote_init_linux.go),
// and its network (egress_linux.go).
package native

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/cgroups"
	"github.com/vivarium-sandbox/vivarium/internal/hostuid"
	"github.com/vivarium-sandbox/vivarium/internal/rootview"
	"github.com/vivarium-sandbox/vivarium/internal/runner"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/seccomp"
)

// Config configures the native backend.
type Config struct {
	// UIDBase and UIDRanges are the pool of host ids sandboxes are made
	// of: every sandbox (and every zygote) is a host user of its own, a
	// range of 65536 ids from UIDBase+k*65536 whose first id is its root
	// and owns its user namespace (spawn_linux.go); the sandbox user, uid
	// 1000 inside, is that id+1000 on the host. The ids must belong to
	// nobody on the host. Pools of every process on a host exclude each
	// other (internal/hostuid).
	UIDBase   uint32
	UIDRanges int
	// KernelLimits bound what a sandbox may hold of the kernel's per-user
	// and per-namespace budgets; zero fields take DefaultKernelLimits.
	KernelLimits KernelLimits
	// CgroupParent is the group sandboxes are created under.
	CgroupParent string
	// MemoryTotal bounds the memory of every sandbox (and zygote) of the
	// backend together, the cgroup parent's limit; MemoryPerTenant that
	// of each tenant's sandboxes together (sandbox.Spec.Tenant), their
	// group's. Memory a sandbox leaves charged after it ended (a memfd, a
	// tmpfs file or a pipe's contents it handed to another sandbox, over
	// a socket on a volume both mount) stays within them, as within no
	// sandbox's own limit (cgroups.Ceilings). Zero: no bound.
	MemoryTotal, MemoryPerTenant int64
	// InsecureNoCgroups accepts sandboxes without cgroups: memory and
	// process limits then come from rlimits only (per process, not per
	// sandbox), and CPU time is not accounted across processes; nothing
	// bounds memory sandboxes leave behind (MemoryTotal, MemoryPerTenant).
	InsecureNoCgroups bool
	// Exe is the program started as the sandbox's init. Default: the one
	// vivarium carries for it (sandbox.Program), else this binary again.
	Exe string
	// Zygote forks every sandbox's runner from a zygote, a Python that has
	// imported the runner and Preload once (see zygote_linux.go): a
	// sandbox then starts in milliseconds and shares the preloaded
	// modules' memory. Without it each sandbox starts its own Python.
	Zygote  bool
	Preload []string
	// A zygote is replaced by a fresh one after ZygoteMaxSandboxes
	// sandboxes or ZygoteMaxAge, whichever comes first: sandboxes forked
	// from one zygote share its memory layout (library and heap addresses,
	// the stack canary, Python's string-hash secret), and a tenant that
	// learnt it should find it worth little. Zero: the defaults; negative:
	// never.
	ZygoteMaxSandboxes int
	ZygoteMaxAge       time.Duration
	// ZygoteTemplates bounds the templates (each for one tenant) that have
	// a zygote of their own at once, each started by its first sandbox:
	// one more retires the least recently used. Zero:
	// DefaultZygoteTemplates; negative: none, every sandbox of a template
	// starts its own python3.
	ZygoteTemplates int
	// RunnerCache is where the runner's bytecode, compiled once per
	// interpreter by the host's (runner.Bytecode), is kept between
	// processes: a directory only root can write. Default:
	// sandbox.ProgramDir.
	RunnerCache string
	// CheckpointDir is where paused sandboxes keep their checkpoints (the
	// images of their processes' memory, on disk), a directory each,
	// removed when the sandbox resumes or closes. Default:
	// sandbox.DefaultCheckpointDir(<cgroup parent>).
	CheckpointDir string
	// PauseBaseDir, if set, keeps the base that pausable sandboxes' kept
	// copies are written against (pausebase_linux.go): they then start
	// with the Preload modules imported, without address-space
	// randomization and with the base's hash seed, and a kept copy takes
	// about half the disk. Empty: kept copies are whole, and pausable
	// sandboxes start as others do.
	PauseBaseDir string
	Logger       *slog.Logger
}

// Defaults of the pool and of zygote replacement.
const (
	DefaultUIDRanges          = 4096
	DefaultZygoteMaxSandboxes = 256
	DefaultZygoteMaxAge       = 15 * time.Minute
	DefaultZygoteTemplates    = 4
)

// DefaultUIDBase is far above the ranges distributions hand out to users and
// to rootless containers (subuid ranges start at 100000).
const DefaultUIDBase = 1_000_000_000

// Backend creates native sandboxes.
type Backend struct {
	cfg      Config
	removing sync.WaitGroup  // removeLater's
	cgroups  cgroups.Manager // nil with InsecureNoCgroups
	uids     *hostuid.Pool
	devices  string // where sandboxes' device nodes are made (devices_linux.go)
	log      *slog.Logger

	etcOnce sync.Once
	etc     []rootview.File
	etcErr  error
	top     []rootview.TopDir

	bytecodeWarn sync.Once

	procMu    sync.Mutex // procCache
	procCache map[string][]rootview.ProcMask

	zfilesOnce   sync.Once // zygoteFiles
	zfiles       string
	zfilesLayers map[string][]rootview.File
	zfilesErr    error
	zfilesMu     sync.Mutex // held while they are written

	zmu            sync.Mutex
	zygotes        map[string]*zygote       // by interpreter
	zstarting      map[string]chan struct{} // closed when a start ends
	zreplacing     map[string]bool          // a replacement is starting
	zreplaceFailed map[string]time.Time     // when a replacement last failed
	zfailed        map[string]time.Time     // when a template's zygote last failed to start
	retired        []*zygote                // replaced, serving their last sandboxes
	closed         bool
	// zstarts counts the zygotes starting (zstarting, zreplacing): Close
	// waits for them, each of which, started, sees closed and closes.
	// Added to under zmu while not closed only.
	zstarts sync.WaitGroup
	// zsweep starts sweepTemplates once; zdone ends it (Close).
	zsweep sync.Once
	zdone  chan struct{}

	pauseState
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
	if cfg.UIDRanges == 0 {
		cfg.UIDRanges = DefaultUIDRanges
	}
	if cfg.ZygoteMaxSandboxes == 0 {
		cfg.ZygoteMaxSandboxes = DefaultZygoteMaxSandboxes
	}
	if cfg.ZygoteMaxAge == 0 {
		cfg.ZygoteMaxAge = DefaultZygoteMaxAge
	}
	if cfg.ZygoteTemplates == 0 {
		cfg.ZygoteTemplates = DefaultZygoteTemplates
	}
	cfg.KernelLimits = cfg.KernelLimits.withDefaults()
	if cfg.Exe == "" {
		cfg.Exe = cmp.Or(sandbox.Program(), "/proc/self/exe")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	cfg.RunnerCache = cmp.Or(cfg.RunnerCache, sandbox.ProgramDir)
	if cfg.CheckpointDir == "" {
		cfg.CheckpointDir = sandbox.DefaultCheckpointDir(cmp.Or(cfg.CgroupParent, "native"))
	}
	b := &Backend{cfg: cfg, log: cfg.Logger, zdone: make(chan struct{}), zygotes: map[string]*zygote{}, zstarting: map[string]chan struct{}{},
		zreplacing: map[string]bool{}, zreplaceFailed: map[string]time.Time{}, zfailed: map[string]time.Time{}}
	for _, m := range cfg.Preload {
		if !validModule(m) {
			return nil, fmt.Errorf("%w: preload %q is not a module name", sandbox.ErrInvalidSpec, m)
		}
	}
	if err := Check(); err != nil {
		return nil, err
	}
	b.devices = devicesDir(cmp.Or(cfg.CgroupParent, cgroups.DefaultParent))
	if err := prepareDevicesDir(b.devices); err != nil {
		return nil, fmt.Errorf("%w: device nodes: %v", sandbox.ErrUnsupported, err)
	}
	uids, err := hostuid.New(hostuid.Config{Base: cfg.UIDBase, Ranges: cfg.UIDRanges})
	if err != nil {
		return nil, fmt.Errorf("%w: %v", sandbox.ErrUnsupported, err)
	}
	b.uids = uids
	if !cfg.InsecureNoCgroups {
		m, err := cgroups.Detect(cfg.CgroupParent)
		if err != nil {
			uids.Close()
			return nil, fmt.Errorf("%w: %v. Sandboxes need cgroups to limit memory and processes; "+
				"to run with rlimits only (weaker: limits per process, not per sandbox), pass --insecure-no-cgroups",
				sandbox.ErrUnsupported, err)
		}
		if err := m.SetCeilings(cgroups.Ceilings{Total: cfg.MemoryTotal, Tenant: cfg.MemoryPerTenant}); err != nil {
			uids.Close()
			return nil, fmt.Errorf("%w: memory ceilings: %v. To run without them (weaker: memory a sandbox hands "+
				"to another before it ends is bounded by the host's alone), pass --max-memory-per-key 0 --max-memory-total 0",
				sandbox.ErrUnsupported, err)
		}
		b.cgroups = m
	}
	b.initBases()
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
	if err := checkCoreDumps(); err != nil {
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

// MemoryCeilings reports the bounds on the memory of all sandboxes
// together and of each tenant's (Config.MemoryTotal, MemoryPerTenant),
// and false where none can hold: without cgroups.
func (b *Backend) MemoryCeilings() (total, perTenant int64, ok bool) {
	return b.cfg.MemoryTotal, b.cfg.MemoryPerTenant, b.cgroups != nil
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
//
// It also removes the checkpoints of sandboxes a killed supervisor left
// paused: their files were in memory, held by that supervisor (a mount
// namespace), so they cannot be resumed.
func (b *Backend) Sweep() ([]string, error) {
	if err := b.sweepCheckpoints(); err != nil {
		return nil, err
	}
	if b.cgroups == nil {
		return nil, nil
	}
	return b.cgroups.Sweep()
}

func (b *Backend) hostFiles() ([]rootview.File, []rootview.TopDir, error) {
	b.etcOnce.Do(func() {
		b.etc, b.etcErr = rootview.HostEtc("/etc")
		b.top = rootview.HostTopLevel("/")
	})
	return b.etc, b.top, b.etcErr
}

// Create implements sandbox.Backend.
func (b *Backend) Create(ctx context.Context, spec sandbox.Spec) (sandbox.Sandbox, error) {
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	if spec.Root != nil {
		return b.createFromTemplate(ctx, spec)
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
	// Every lasting sandbox of a zygote is one process tree, its runner
	// init's child, which can be paused, forked and snapshotted
	// (spec.Pausable asks nothing more of it).
	if b.cfg.Zygote {
		z, err := b.zygoteFor(ctx, zygoteKind{python: spec.Python}, true)
		if err != nil {
			return nil, err
		}
		cfg, err := b.initConfig(spec, nil, nil)
		if err != nil {
			return nil, err
		}
		cfg.Role = roleForked
		// Its memory layout and hash seed are the zygote's, not the
		// pause base's (pausebase_linux.go): its kept copies are whole.
		// Its runners come from the zygote (no RunnerArgs), until a
		// restore, after which init starts them (Restart's Argv).
		cfg.RunnerArgs, cfg.HashSeed, cfg.Preload = nil, "", nil
		return start(ctx, b, spec, cfg, z)
	}
	cfg, err := b.initConfig(spec, etc, top)
	if err != nil {
		return nil, err
	}
	cfg.RunnerFiles = b.runnerFiles(spec.Python)
	return start(ctx, b, spec, cfg, nil)
}

// Warm starts the zygote of the default interpreter now, so that the
// first sandbox does not wait for it. It does nothing without Zygote.
func (b *Backend) Warm(ctx context.Context) error {
	if !b.cfg.Zygote {
		return nil
	}
	_, err := b.zygoteFor(ctx, zygoteKind{python: sandbox.DefaultPython}, false)
	return err
}

// zygoteKind is what a zygote is of: an interpreter of the host's, or a
// template's root and its python3 for one tenant. A template's zygote runs
// the image's code (its interpreter, site hooks and preloads), which the
// sandboxes forked from it share: a hostile image could pass data between
// them, so they are one tenant's alone.
type zygoteKind struct {
	python string
	root   *sandbox.Root
	tenant string
}

// key names the zygote of k among the backend's.
func (k zygoteKind) key() string {
	if k.root != nil {
		return "template\x00" + k.tenant + "\x00" + k.root.ID + "\x00" + strings.Join(k.root.Layers, "\x00")
	}
	return k.python
}

// zygoteFor returns the live zygote of a kind, starting one if needed
// (once, however many callers wait for it); with take, the caller is a
// new sandbox of it, which releases it when it closes. A zygote that has
// served its sandboxes or its time keeps serving until a replacement,
// started in the background, is ready.
func (b *Backend) zygoteFor(ctx context.Context, kind zygoteKind, take bool) (*zygote, error) {
	key := kind.key()
	b.zmu.Lock()
	for {
		if b.closed {
			b.zmu.Unlock()
			return nil, sandbox.ErrClosed
		}
		if z := b.zygotes[key]; z != nil && z.alive() {
			if z.expired() {
				b.replaceZygoteLocked(key, kind)
			}
			if take {
				z.acquire()
			}
			b.zmu.Unlock()
			return z, nil
		}
		ch := b.zstarting[key]
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
	b.zstarting[key] = ch
	b.zstarts.Add(1)
	defer b.zstarts.Done()
	old := b.zygotes[key]
	if old == nil && kind.root != nil {
		b.retireColdTemplateLocked()
	}
	b.zmu.Unlock()
	if old != nil {
		b.log.Warn("zygote died; starting a new one", "python", kind.python, "template", templateName(kind.root), "err", old.deadErr)
		old.close()
	}
	z, err := b.newZygote(kind)
	b.zmu.Lock()
	delete(b.zstarting, key)
	close(ch)
	if err == nil {
		if b.closed {
			b.zmu.Unlock()
			z.close()
			return nil, sandbox.ErrClosed
		}
		b.zygotes[key] = z
		if take {
			z.acquire()
		}
	} else if old != nil {
		delete(b.zygotes, key)
	}
	b.zmu.Unlock()
	return z, err
}

// retireColdTemplateLocked makes room for one more template's zygote:
// with ZygoteTemplates of them already, the one that started a sandbox
// least recently retires (it closes with its last sandbox). Callers
// hold zmu.
func (b *Backend) retireColdTemplateLocked() {
	var cold *zygote
	var coldKey string
	var coldUsed time.Time
	n := 0
	for key, z := range b.zygotes {
		if z.root == nil {
			continue
		}
		n++
		if used := z.lastUsed(); cold == nil || used.Before(coldUsed) {
			cold, coldKey, coldUsed = z, key, used
		}
	}
	if n < b.cfg.ZygoteTemplates || cold == nil {
		return
	}
	b.log.Info("zygote: a template's retires to make room for another's", "template", cold.root.Template,
		"warm_templates", b.cfg.ZygoteTemplates)
	b.retireLocked(coldKey)
}

// retireLocked takes the zygote of key out of service: it closes with its
// last sandbox. Callers hold zmu.
func (b *Backend) retireLocked(key string) {
	z := b.zygotes[key]
	delete(b.zygotes, key)
	b.retired = append(b.retired, z)
	go z.retire()
}

// templateName is a template's name for logs ("" for none).
func templateName(root *sandbox.Root) string {
	if root == nil {
		return ""
	}
	return root.Template
}

// newZygote starts a zygote, with a deadline of its own: others may wait
// for it too, so not the caller's context.
func (b *Backend) newZygote(kind zygoteKind) (*zygote, error) {
	etc, top, err := b.hostFiles()
	if err != nil {
		return nil, err
	}
	sctx, cancel := context.WithTimeout(context.Background(), zygoteStartTimeout)
	defer cancel()
	start := time.Now()
	z, err := b.startZygote(sctx, kind, etc, top)
	if err == nil {
		b.log.Info("zygote ready", "python", kind.python, "template", templateName(kind.root), "preload", b.cfg.Preload,
			"uid", z.owner.First, "ms", time.Since(start).Milliseconds())
	}
	return z, err
}

// replaceZygoteLocked starts a replacement for the zygote of key in the
// background, once; when it is ready it takes the old one's place and
// the old one retires. A replacement that fails to start is retried no
// sooner than a minute later. Callers hold zmu.
func (b *Backend) replaceZygoteLocked(key string, kind zygoteKind) {
	if b.zreplacing[key] || time.Since(b.zreplaceFailed[key]) < time.Minute {
		return
	}
	b.zreplacing[key] = true
	b.zstarts.Add(1)
	go func() {
		defer b.zstarts.Done()
		z, err := b.newZygote(kind)
		b.zmu.Lock()
		delete(b.zreplacing, key)
		if err != nil {
			b.zreplaceFailed[key] = time.Now()
			b.zmu.Unlock()
			b.log.Warn("zygote: the replacement did not start; the old one goes on serving", "python", kind.python,
				"template", templateName(kind.root), "err", err)
			return
		}
		if b.closed {
			b.zmu.Unlock()
			z.close()
			return
		}
		old := b.zygotes[key]
		b.zygotes[key] = z
		if old != nil {
			b.retired = append(b.retired, old)
		}
		b.zmu.Unlock()
		if old != nil {
			b.log.Info("zygote replaced", "python", kind.python, "template", templateName(kind.root),
				"old_uid", old.owner.First, "new_uid", z.owner.First)
			old.retire()
		}
	}()
}

// ZygoteStatus describes one zygote, for logs and the doctor.
type ZygoteStatus struct {
	Python   string // "" for a template's
	Template string // the template's name, for a template's
	UID      uint32 // the Python zygote's host user
	PID      int    // its init's host pid
	Started  time.Time
	Forked   int  // sandboxes started from it
	Live     int  // of them, still open
	Retired  bool // replaced: serving its last sandboxes
	Starting bool // ... and its replacement is starting
}

// Zygotes lists the backend's zygotes: the current one of each
// interpreter, then the retired ones.
func (b *Backend) Zygotes() []ZygoteStatus {
	b.zmu.Lock()
	zs := make([]*zygote, 0, len(b.zygotes)+len(b.retired))
	for _, z := range b.zygotes {
		zs = append(zs, z)
	}
	zs = append(zs, b.retired...)
	replacing := maps.Clone(b.zreplacing)
	b.zmu.Unlock()
	out := make([]ZygoteStatus, 0, len(zs))
	for _, z := range zs {
		z.mu.Lock()
		kind := zygoteKind{python: z.python, root: z.root, tenant: z.tenant}
		st := ZygoteStatus{Python: z.python, Template: templateName(z.root), UID: z.owner.First, Started: z.started,
			Forked: z.forked, Live: z.live, Retired: z.retired, Starting: !z.retired && replacing[kind.key()]}
		z.mu.Unlock()
		if z.init != nil {
			st.PID = z.init.pid
		}
		out = append(out, st)
	}
	return out
}

// dropRetired forgets a retired zygote that has closed.
func (b *Backend) dropRetired(z *zygote) {
	b.zmu.Lock()
	defer b.zmu.Unlock()
	for i, r := range b.retired {
		if r == z {
			b.retired = append(b.retired[:i], b.retired[i+1:]...)
			return
		}
	}
}

// Close stops the backend's zygotes; every sandbox forked from them dies
// with them. Sandboxes should be closed first.
func (b *Backend) Close() error {
	b.zmu.Lock()
	if !b.closed {
		close(b.zdone)
	}
	b.closed = true
	zs := b.zygotes
	b.zygotes = map[string]*zygote{}
	zs2 := b.retired
	b.retired = nil
	b.zmu.Unlock()
	for _, z := range zs {
		z.close()
	}
	for _, z := range zs2 {
		z.close()
	}
	// A zygote still starting (a replacement in the background, most
	// likely) is closed by its starter, which sees closed: Close returned
	// before that once, and the hostile suite found its Python alive.
	b.zstarts.Wait()
	b.maybeClosePool()
	b.removing.Wait()
	return nil
}

// removeLater removes the directory dir in the background (a resumed
// tree's images: tens of megabytes whose removal a resume need not wait
// for). It is renamed first, so that its name is free at once; Close
// waits for every removal.
func (b *Backend) removeLater(dir string) {
	gone := dir + ".gone"
	if err := os.Rename(dir, gone); err != nil {
		if !os.IsNotExist(err) {
			b.log.Warn("remove a directory", "dir", dir, "err", err)
		}
		return
	}
	b.removing.Add(1)
	go func() {
		defer b.removing.Done()
		if err := os.RemoveAll(gone); err != nil {
			b.log.Warn("remove a directory", "dir", gone, "err", err)
		}
	}()
}

// releaseOwner returns a sandbox's (or a zygote's) host user to the pool.
func (b *Backend) releaseOwner(r hostuid.Range) {
	b.uids.Release(r)
	b.maybeClosePool()
}

// maybeClosePool closes the pool once the backend is closed and no
// sandbox holds a range: closing its lock file releases every range, so
// it must outlive the last sandbox of a backend closed first.
func (b *Backend) maybeClosePool() {
	b.zmu.Lock()
	closed := b.closed
	b.zmu.Unlock()
	if closed && b.uids.Held() == 0 {
		b.uids.Close()
	}
}

// UIDPool describes the pool of host users: its first and last ids, how
// many sandboxes it holds at most, and how many ranges of it are in use
// on this host now (by any process).
func (b *Backend) UIDPool() (first, last uint32, ranges, inUse int, err error) {
	first, last = b.uids.Bounds()
	inUse, err = b.uids.InUse()
	return first, last, b.uids.Ranges(), inUse, err
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

func (b *Backend) initConfig(spec sandbox.Spec, etc []rootview.File, top []rootview.TopDir) (*initConfig, error) {
	l := spec.Limits
	filter, err := sandboxFilter()
	if err != nil {
		return nil, fmt.Errorf("seccomp filter: %w", err)
	}
	proc, err := b.procMasks(l.Memory)
	if err != nil {
		return nil, fmt.Errorf("/proc: %w", err)
	}
	cfg := &initConfig{
		Seccomp:    filter,
		Proc:       proc,
		Sysctls:    b.cfg.KernelLimits.namespaceSysctls(l.Memory),
		Kernel:     b.cfg.KernelLimits,
		Python:     spec.Python,
		RunnerArgs: runnerArgs(spec.OneShot),
		Env:        sandboxEnv(spec.UserEnv(sandbox.UserSandbox)),
		Etc:        etc,
		TopLevel:   top,
		DiskBytes:  l.Disk,
		// One inode per 8 KiB of disk: enough for source trees, not
		// enough for an inode-exhaustion attack to cost much kernel memory.
		DiskInodes: max(l.Disk/(8<<10), 1024),
		OpenFiles:  uint64(l.OpenFiles),
		OneShot:    spec.OneShot,
		MemTotal:   l.Memory,
		Home:       spec.HomeDir(),
		UserName:   spec.UserName(),
		Volumes:    volumePaths(spec.Volumes),
	}
	// A pausable sandbox of a backend with a pause base starts from the
	// fixed point (pausebase_linux.go), unless it sets its own seed or
	// runs another interpreter than the base's.
	ownSeed := slices.ContainsFunc(cfg.Env, func(kv string) bool { return strings.HasPrefix(kv, "PYTHONHASHSEED=") })
	if spec.Pausable && !spec.OneShot && b.cfg.PauseBaseDir != "" && !ownSeed && spec.Python == sandbox.DefaultPython {
		cfg.HashSeed, cfg.Preload = b.hashSeed, b.cfg.Preload
	}
	if spec.OneShot && l.CPUTime > 0 {
		// Per-process backstop; the cgroup's CPU accounting is the limit.
		cfg.CPUSeconds = uint64((l.CPUTime + 999_999_999) / 1_000_000_000)
	}
	if b.cgroups == nil {
		cfg.MaxProcs = uint64(l.Pids)
		cfg.MemoryBytes = uint64(l.Memory)
	}
	return cfg, nil
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

// runnerFiles are the runner's files, and its bytecode compiled by python
// (the sandbox's interpreter; for a template's sandbox, the host's
// default), which an interpreter of the same version loads instead of
// compiling the runner at its start (runner.Bytecode). Without it the
// runner is compiled in the sandbox, as it always can be.
func (b *Backend) runnerFiles(python string) map[string][]byte {
	files := runner.Files()
	pycs, err := runner.Bytecode(context.Background(), cmp.Or(python, sandbox.DefaultPython), runnerDir, b.cfg.RunnerCache)
	if err != nil {
		b.bytecodeWarn.Do(func() {
			b.log.Warn("runner: no compiled bytecode; each sandbox compiles the runner at its start", "err", err)
		})
		return files
	}
	maps.Copy(files, pycs)
	return files
}
