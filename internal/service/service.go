// Package service manages the life of stateful sandboxes on behalf of
// owners (API keys): creation within server-wide bounds, idle timeouts and
// maximum lifetimes, executions, commands and files. Transports (HTTP,
// E2B, MCP) are thin adapters over it.
//
// Every lookup is by owner and id: a sandbox of another owner is reported
// as not found, never as forbidden.
package service

import (
	"cmp"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/image"
	"github.com/vivarium-sandbox/vivarium/internal/netpolicy"
	"github.com/vivarium-sandbox/vivarium/internal/netproxy"
	"github.com/vivarium-sandbox/vivarium/internal/pool"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/sandboxid"
	"github.com/vivarium-sandbox/vivarium/internal/store"
	"github.com/vivarium-sandbox/vivarium/internal/volume"
)

// Errors of the service; transports map them to status codes.
var (
	ErrNotFound     = errors.New("sandbox not found")
	ErrQuota        = errors.New("quota reached")
	ErrShuttingDown = errors.New("the server is shutting down")
	// ErrPortTLS: a port set to speak TLS (PortOptions.TLS) did not.
	ErrPortTLS = errors.New("no TLS")
)

// Config bounds what owners may ask for.
type Config struct {
	Backend sandbox.Backend
	// Backends names the backends a request may choose, the default
	// first (see sandbox.Mux); empty: Backend's alone.
	Backends []string
	// Pool, when Backend is one, is reported in the metrics.
	Pool *pool.Pool
	// Node is the name of the cluster's node this service is (vivarium
	// serve --cluster), which its sandboxes' ids carry (sandboxid); "":
	// a server on its own.
	Node string
	// MaxLimits caps every limit an owner asks for; zero fields use the
	// sandbox package's defaults as the cap.
	MaxLimits sandbox.Limits
	// Idle timeout default and cap; maximum lifetime default and cap.
	DefaultIdle, MaxIdle         time.Duration
	DefaultLifetime, MaxLifetime time.Duration
	// MaxPerOwner and MaxTotal bound live sandboxes.
	MaxPerOwner, MaxTotal int
	// MaxExecutionsPerOwner and MaxExecutions bound executions, commands
	// and one-shot runs in progress at once.
	MaxExecutionsPerOwner, MaxExecutions int
	// Quota returns an owner's own quotas; zero values mean the defaults
	// above. Nil: every owner has the defaults.
	Quota func(owner string) (maxSandboxes, maxExecutions int)
	// PauseOnShutdown makes a graceful Shutdown pause every running
	// sandbox that can be paused and keep it on disk (where paused
	// sandboxes are kept: PausedDir), instead of closing it, so that the
	// next server on the data directory (the same node after a rolling
	// update) has them, paused; others are closed as ever.
	PauseOnShutdown bool
	// Elsewhere, for a node of a cluster, counts an owner's sandboxes on
	// the other nodes (as their Leases last said), so that a key's
	// sandbox quota holds across the cluster; nil: none.
	Elsewhere func(owner string) int
	// RunningElsewhere, likewise, counts an owner's executions running
	// on the other nodes, for its execution quota; nil: none.
	RunningElsewhere func(owner string) int
	// Network is what network access sandboxes may be given; the zero
	// value gives none.
	Network NetworkConfig
	// Tenants groups each owner's sandboxes apart (sandbox.Spec.Tenant,
	// see tenantOf): on backends that can, owners then share CPU and disk
	// equally, however many sandboxes each runs.
	Tenants bool
	// Audit receives a record of every execution, command, one-shot run
	// and network connection. An execution's, command's or run's record
	// is given before its result is returned or its end told to anyone:
	// an Audit that returns once readers of the log see the record
	// (store.AuditLog) keeps a record of every answer sent. Nil: nothing
	// is recorded.
	Audit  func(store.Record)
	Logger *slog.Logger
	// Volumes keeps the owners' persistent volumes; nil: sandboxes
	// cannot mount any.
	Volumes *volume.Store
	// Images keeps the templates sandboxes may be made of
	// (sandbox.Spec.Template); nil: none.
	Images *image.Store
	// Registry is where a cluster's nodes share templates (registry.go;
	// its Repo "": none), with Images.
	Registry TemplateRegistry
	// Now is the clock; tests replace it.
	Now func() time.Time
	// MaxPaused is how long a paused sandbox is kept; zero: MaxLifetime.
	MaxPaused time.Duration
	// UsageInterval is how often every sandbox's use is sampled (see
	// Usage); zero: every 5 s.
	UsageInterval time.Duration
	// PausedDir keeps paused sandboxes across restarts (persist.go),
	// signed with SnapshotKey; empty: a paused sandbox ends with the
	// server. One is written down once it has stayed paused
	// PersistDelay (zero: 5 s), or when the server shuts down.
	PausedDir    string
	PersistDelay time.Duration
	// SnapshotDir keeps the owners' snapshots (snapshots.go), signed
	// with SnapshotKey (snapshot.LoadKey); empty: none are kept.
	SnapshotDir string
	SnapshotKey []byte
	// MaxSnapshots and MaxSnapshotBytes bound what one owner keeps;
	// zero: 16 snapshots, 8 GiB.
	MaxSnapshots     int
	MaxSnapshotBytes int64
	// KeyRevoked says whether an owner's key has been revoked, and
	// whether its sandboxes are to be closed with it; it is asked at
	// every use of a token (tokens.go) and, for the owners of live
	// sandboxes, every second. It answers revoked for a key that cannot
	// be looked up. Nil: no key is ever revoked (vivarium serve --dev).
	KeyRevoked func(owner string) (revoked, closeSandboxes bool)
	// MemoryHeld reads, for sandboxes of a backend, what those of a
	// tenant's group ("": all of the server's) hold that the kernel
	// cannot take back, and the group's memory ceiling (0: none; serve
	// --max-memory-total, --max-memory-per-key): a new sandbox that does
	// not fit under a ceiling is refused (room.go). Nil: none is read.
	MemoryHeld func(backend, tenant string) (held, ceiling int64, err error)
	// Builds configures template builds (builds.go).
	Builds BuildConfig
}

func (c *Config) setDefaults() {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&c.DefaultIdle, 5*time.Minute)
	def(&c.MaxIdle, 24*time.Hour)
	def(&c.DefaultLifetime, time.Hour)
	def(&c.MaxLifetime, 24*time.Hour)
	def(&c.UsageInterval, defaultUsageInterval)
	def(&c.MaxPaused, c.MaxLifetime)
	def(&c.PersistDelay, 5*time.Second)
	if c.MaxPerOwner <= 0 {
		c.MaxPerOwner = 50
	}
	if c.MaxSnapshots <= 0 {
		c.MaxSnapshots = 16
	}
	if c.MaxSnapshotBytes <= 0 {
		c.MaxSnapshotBytes = 8 << 30
	}
	if c.MaxTotal <= 0 {
		c.MaxTotal = 1000
	}
	if c.MaxExecutionsPerOwner <= 0 {
		c.MaxExecutionsPerOwner = 16
	}
	if c.MaxExecutions <= 0 {
		c.MaxExecutions = 256
	}
	if c.Quota == nil {
		c.Quota = func(string) (int, int) { return 0, 0 }
	}
	if c.KeyRevoked == nil {
		c.KeyRevoked = func(string) (bool, bool) { return false, false }
	}
	if c.Audit == nil {
		c.Audit = func(store.Record) {}
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	c.MaxLimits = c.MaxLimits.WithDefaults()
}

// Service owns the live sandboxes.
type Service struct {
	cfg     Config
	metrics *Metrics

	snaps      snapOwners     // each owner's snapshots' lock (snapshots.go)
	persisting sync.WaitGroup // paused sandboxes being written down (persist.go)

	mu      sync.Mutex
	boxes   map[string]*Box
	pending map[string]int // owner → sandboxes being created
	running map[string]int // owner → executions in progress
	active  int            // executions in progress, all owners
	idle    *sync.Cond     // signalled when active drops to zero
	// draining: no new sandboxes or executions (Shutdown began); closed:
	// every sandbox is gone or going.
	draining, closed bool

	stop    chan struct{}
	wg      sync.WaitGroup
	closing sync.WaitGroup // one-shot sandboxes being torn down

	pkgService *netproxy.InProcess // the package index, to sandboxes' proxies
	ports      ports               // port tokens and connections (ports.go)
	followers  followers           // subscriptions to processes' output (processes.go)
	usage      usageLogs           // samples of every sandbox's use (usage.go)
	pausedLock io.Closer           // PausedDir's lock, held while paused sandboxes are kept (persist.go)
	tokenKey   []byte              // the secret of the tokens (tokens.go)
	builds     *builds             // template builds (builds.go)
	registry   *registry           // templates shared by a cluster's nodes (registry.go); nil: none
}

// New starts a service; Close ends it and every sandbox.
func New(cfg Config) *Service {
	cfg.setDefaults()
	s := &Service{cfg: cfg, boxes: map[string]*Box{}, pending: map[string]int{}, running: map[string]int{},
		stop: make(chan struct{}), metrics: newMetrics(), tokenKey: make([]byte, 32),
		builds: newBuilds(cfg.Builds, cfg.Logger, cfg.Now)}
	rand.Read(s.tokenKey)
	s.builds.tenantOf = s.tenantOf
	s.registry = newRegistry(cfg.Registry, cfg.Images, cfg.Logger, cfg.Now)
	s.builds.registry, s.builds.node = s.registry, cfg.Node
	s.idle = sync.NewCond(&s.mu)
	if s.snapshotsOn() == nil {
		s.sweepSnapshotLeftovers()
	}
	if s.pausedConfigured() {
		if err := s.lockPaused(); err != nil {
			s.cfg.Logger.Warn("paused sandboxes are not kept across a restart by this server", "err", err)
		} else {
			s.openPaused()
		}
	}
	s.startNetwork()
	s.wg.Add(2)
	go s.reap()
	go s.sampleUsage()
	if s.registry != nil {
		s.wg.Add(1)
		go s.sweepRegistry()
	}
	return s
}

// sweepRegistry removes the templates this node pulled that are no
// longer used (registry.sweep), every tenth of their bound.
func (s *Service) sweepRegistry() {
	defer s.wg.Done()
	t := time.NewTicker(max(s.registry.cfg.Unused/10, time.Second))
	defer t.Stop()
	s.registry.sweep() // what an earlier server pulled counts from now
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
			s.registry.sweep()
		}
	}
}

// Metrics returns the service's counters.
func (s *Service) Metrics() *Metrics { return s.metrics }

// WriteMetrics writes every metric of the service in Prometheus's format.
func (s *Service) WriteMetrics(w io.Writer) {
	s.metrics.Write(w, s.Live())
	if s.cfg.Pool != nil {
		writePoolMetrics(w, s.cfg.Pool.Stats(), s.cfg.Pool.Evicted())
	}
}

// DefaultSpec is the configuration of a sandbox an owner creates with no
// limits asked for: what a server keeps ready in its pool.
func (s *Service) DefaultSpec(owner string, oneShot bool) sandbox.Spec {
	l, _ := s.bound(sandbox.Limits{})
	return sandbox.Spec{Limits: l, OneShot: oneShot, Tenant: s.tenantOf(owner)}
}

// tenantOf is the tenant an owner's sandboxes are grouped under: the
// owner's id (an API key's id, never the key) when it is a valid tenant
// name, else a digest of it; "" without Config.Tenants.
//
// A pooled sandbox is made in its tenant's group from the start: the
// tenant is part of the spec, and so of the pool's key, and each tenant
// has pools of its own, filled after its first request and kept while it
// is in use. The cost is that first request: a sandbox made on demand (a
// key's first one-shot print(1) took 35 to 104 ms, its next ones 5 to
// 45 ms, on the two-core development machine under load; a stateful
// sandbox, 131 ms against 0.7 ms from a pool) and the ready sandboxes of
// each active key (6.9 MiB each). The alternative, one pool for all and
// the sandbox's processes moved into its tenant's group when handed out,
// was not taken: on cgroup v2 a process's memory charge stays with the
// group it was made in (what a sandbox touched before would escape its
// own limit), a move of several processes races with any one of them
// forking, and a move that fails halfway leaves a sandbox in two groups.
func (s *Service) tenantOf(owner string) string {
	if !s.cfg.Tenants || owner == "" {
		return ""
	}
	if sandbox.ValidTenant(owner) == nil {
		return owner
	}
	sum := sha256.Sum256([]byte(owner))
	return "t-" + hex.EncodeToString(sum[:12])
}

// MaxExecTimeout is the longest an execution or command may be allowed to
// run (Config.MaxLimits.Timeout).
func (s *Service) MaxExecTimeout() time.Duration { return s.cfg.MaxLimits.Timeout }

// CreateRequest describes a sandbox an owner asks for.
type CreateRequest struct {
	Owner       string
	Idle        time.Duration // idle timeout; 0: default
	MaxLifetime time.Duration // 0: default
	Limits      sandbox.Limits
	Env         map[string]string
	Metadata    map[string]string
	// Backend is the isolation backend ("": the server's default).
	Backend string
	// Network asks for network access, within the server's policy;
	// empty: none.
	Network netpolicy.Request
	// Home is the sandbox user's home and where code starts
	// (sandbox.Spec.Home): "" or /workspace, or /home/user.
	Home string
	// IDEnv names environment variables that hold the sandbox's id, for
	// programs that look for it there (E2B's E2B_SANDBOX_ID).
	IDEnv []string
	// Ports say how the server reaches the sandbox's ports.
	Ports PortOptions
	// Volumes are the owner's volumes to mount.
	Volumes []VolumeRequest
	// OnTimeout is what the idle timeout does: OnTimeoutKill ("" too)
	// closes the sandbox, OnTimeoutPause pauses it (see Pause).
	OnTimeout string
	// PauseFilesOnly, with OnTimeoutPause, makes the timeout pause the
	// sandbox without its memory (PauseFiles), which needs no pausable
	// sandbox.
	PauseFilesOnly bool
	// Template names the template the sandbox is made of ("": the
	// server's own Python and packages).
	Template string
	// Pausable asks for a sandbox that can be paused (sandbox.Spec.Pausable);
	// OnTimeoutPause implies it, but with PauseFilesOnly.
	Pausable bool
	// AutoResume: an operation on the paused sandbox (paused by its
	// timeout or by Pause) resumes it first, instead of failing with
	// sandbox.ErrPaused.
	AutoResume bool
	// FromSnapshot makes the sandbox from one of the owner's snapshots
	// (snapshots.go): its processes, files, limits, environment and
	// backend are the snapshot's. Limits, Env, Backend and Home are then
	// not to be given; network access and volumes are not given yet.
	FromSnapshot string
}

// ownEnv is env, an execution's or a command's, with b's own id in the
// variables that hold it (IDEnv), where its backend's environment holds
// another's: a copy's processes were started as its source's.
func (b *Box) ownEnv(env map[string]string) map[string]string {
	if !b.idStale {
		return env
	}
	out := maps.Clone(env)
	if out == nil {
		out = make(map[string]string, len(b.idEnv))
	}
	for _, k := range b.idEnv {
		if _, given := out[k]; !given {
			out[k] = b.id
		}
	}
	return out
}

// Box is a managed sandbox.
type Box struct {
	id, owner string
	// snapTemplate, for a sandbox made of a snapshot (spec nil), is the
	// template the snapshot records.
	snapTemplate snapshotTemplate
	sb           sandbox.Sandbox // under sbMu: a pause without memory replaces it (pausefiles.go)
	sbMu         sync.RWMutex
	// spec is what made sb, for a pause without memory to make it again
	// (pausefiles.go); nil: not known (made from a snapshot).
	spec      *sandbox.Spec
	createdAt time.Time
	deadline  time.Time // end of the maximum lifetime
	idle      time.Duration
	limits    sandbox.Limits
	env       map[string]string
	idEnv     []string // CreateRequest.IDEnv
	// idStale: the backend's environment does not hold this sandbox's
	// id in idEnv (made without it, so that it could come from a pool;
	// or a fork's copy, a sandbox made from a snapshot, which hold
	// another's): executions and commands are given this one's (ownEnv).
	idStale     bool
	metadata    map[string]string
	backend     string
	egress      *netproxy.Proxy // the sandbox's proxy; nil: made without network
	ports       PortOptions
	netMu       sync.Mutex        // serialises UpdateNetwork
	mu          sync.Mutex        // guards the fields below
	network     *netpolicy.Policy // nil: no network (UpdateNetwork changes it)
	expiresAt   time.Time
	executions  int
	running     int  // executions and commands in progress
	executing   bool // an execution is in progress
	closeReason string
	procs       map[int]*Process // by pid, while they run
	volumes     []VolumeMountInfo
	leases      []*volume.Lease // released once sb is closed
	// volumesLost, for a paused sandbox opened from disk whose volumes
	// could not be leased again (reopenVolumes): why it cannot resume.
	volumesLost error
	onTimeout   string
	pauseFiles  bool // its timeout pauses it without its memory (CreateRequest.PauseFilesOnly)
	autoResume  bool
	paused      bool
	pausedAt    time.Time
	pauseMu     sync.Mutex     // serialises Pause and Resume
	pausable    bool           // the sandbox can be paused (PauseSupported)
	persisted   bool           // paused, and kept on disk across a restart (persist.go)
	unverified  bool           // opened from disk; its signature not checked whole yet
	pauseGen    int            // pauses so far: a write-down is of one (persist.go)
	accessGen   uint64         // the access token's generation (tokens.go)
	portGens    map[int]uint64 // the generation of each port's token rotated
}

// Info is what owners see of a sandbox.
type Info struct {
	ID             string            `json:"id"`
	CreatedAt      time.Time         `json:"created_at"`
	ExpiresAt      time.Time         `json:"expires_at"`
	Deadline       time.Time         `json:"max_lifetime_at"`
	IdleTimeoutS   float64           `json:"timeout_s"`
	Limits         LimitsInfo        `json:"limits"`
	Metadata       map[string]string `json:"metadata"`
	Backend        string            `json:"backend"`
	Network        *NetworkInfo      `json:"network" doc:"the sandbox's network access; null: none"`
	Ports          PortOptions       `json:"ports" doc:"how the server reaches the sandbox's ports"`
	State          string            `json:"state" doc:"idle, running or paused"`
	OnTimeout      string            `json:"on_timeout" doc:"what the idle timeout does: kill or pause"`
	AutoResume     bool              `json:"auto_resume" doc:"an operation on the paused sandbox resumes it"`
	PausedAt       *time.Time        `json:"paused_at,omitempty"`
	Pausable       bool              `json:"pausable" doc:"the sandbox can be paused (POST .../pause)"`
	ExecutionCount int               `json:"execution_count"`
	Volumes        []VolumeMountInfo `json:"volumes"`
	Template       string            `json:"template,omitempty" doc:"the template the sandbox is made of; absent: the server's own"`
}

// LimitsInfo is Limits in API units.
type LimitsInfo struct {
	Memory      int64   `json:"memory"`
	CPUTimeS    float64 `json:"cpu_time_s"`
	TimeoutS    float64 `json:"timeout_s"`
	Pids        int     `json:"pids"`
	Disk        int64   `json:"disk"`
	MaxOutput   int64   `json:"max_output"`
	OpenFiles   int     `json:"open_files"`
	IOReadBPS   int64   `json:"io_read_bps" doc:"disk reads, bytes a second; -1: none"`
	IOWriteBPS  int64   `json:"io_write_bps" doc:"disk writes, bytes a second; -1: none"`
	IOReadIOPS  int64   `json:"io_read_iops" doc:"disk reads a second; -1: none"`
	IOWriteIOPS int64   `json:"io_write_iops" doc:"disk writes a second; -1: none"`
}

func limitsInfo(l sandbox.Limits) LimitsInfo {
	return LimitsInfo{Memory: l.Memory, CPUTimeS: l.CPUTime.Seconds(), TimeoutS: l.Timeout.Seconds(), Pids: l.Pids,
		Disk: l.Disk, MaxOutput: l.MaxOutput, OpenFiles: l.OpenFiles,
		IOReadBPS: l.IOReadBPS, IOWriteBPS: l.IOWriteBPS, IOReadIOPS: l.IOReadIOPS, IOWriteIOPS: l.IOWriteIOPS}
}

func (b *Box) info() Info {
	b.mu.Lock()
	defer b.mu.Unlock()
	state := "idle"
	var pausedAt *time.Time
	switch {
	case b.paused:
		state, pausedAt = "paused", &b.pausedAt
	case b.running > 0:
		state = "running"
	}
	md := b.metadata
	if md == nil {
		md = map[string]string{}
	}
	return Info{
		ID: b.id, CreatedAt: b.createdAt, ExpiresAt: b.expiresAt, Deadline: b.deadline,
		IdleTimeoutS: b.idle.Seconds(), Limits: limitsInfo(b.limits), Metadata: md, Backend: b.backend,
		Network: networkInfo(b.network), Ports: b.ports, State: state, ExecutionCount: b.executions, Volumes: b.volumes,
		OnTimeout: cmp.Or(b.onTimeout, OnTimeoutKill), AutoResume: b.autoResume, PausedAt: pausedAt, Pausable: b.pausable,
		Template: b.template(),
	}
}

// Sandbox returns the underlying sandbox (for its workspace).
func (b *Box) Sandbox() sandbox.Sandbox {
	b.sbMu.RLock()
	defer b.sbMu.RUnlock()
	return b.sb
}

// Paused reports whether the sandbox is paused now.
func (b *Box) Paused() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.paused
}

// Create starts a sandbox for an owner.
func (s *Service) Create(ctx context.Context, req CreateRequest) (Info, error) {
	if req.Owner == "" {
		return Info{}, fmt.Errorf("%w: no owner", sandbox.ErrInvalidSpec)
	}
	var snap snapshotMeta
	var snapDir string
	if req.FromSnapshot != "" {
		if req.Limits != (sandbox.Limits{}) || len(req.Env) > 0 || req.Backend != "" || req.Home != "" ||
			len(req.Volumes) > 0 || !req.Network.Empty() || req.Template != "" {
			return Info{}, fmt.Errorf("%w: a sandbox made from a snapshot has the snapshot's limits, environment, "+
				"backend, template and home, and no network or volumes yet", sandbox.ErrInvalidSpec)
		}
		var err error
		if snap, snapDir, err = s.fromSnapshot(req.Owner, req.FromSnapshot); err != nil {
			return Info{}, err
		}
		req.Limits, req.Env, req.Backend, req.IDEnv = snap.Limits, snap.Env, snap.Backend, snap.IDEnv
		if req.Metadata == nil {
			req.Metadata = snap.Metadata
		}
	}
	limits, err := s.bound(req.Limits)
	if err != nil {
		return Info{}, err
	}
	idle, err := bounded("timeout", req.Idle, s.cfg.DefaultIdle, s.cfg.MaxIdle)
	if err != nil {
		return Info{}, err
	}
	life, err := bounded("max lifetime", req.MaxLifetime, s.cfg.DefaultLifetime, s.cfg.MaxLifetime)
	if err != nil {
		return Info{}, err
	}
	if err := checkEnv(req.Env); err != nil {
		return Info{}, err
	}
	if err := s.checkBackend(req.Backend); err != nil {
		return Info{}, err
	}
	if len(req.Metadata) > 64 {
		return Info{}, fmt.Errorf("%w: at most 64 metadata entries", sandbox.ErrInvalidSpec)
	}
	for k, v := range req.Metadata {
		if len(k) > 256 || len(v) > 4096 {
			return Info{}, fmt.Errorf("%w: metadata entry %.40q too long", sandbox.ErrInvalidSpec, k)
		}
	}
	if err := req.Ports.check(); err != nil {
		return Info{}, err
	}
	switch req.OnTimeout {
	case "", OnTimeoutKill, OnTimeoutPause:
	default:
		return Info{}, fmt.Errorf("%w: on_timeout is %q or %q, not %q", sandbox.ErrInvalidSpec, OnTimeoutKill,
			OnTimeoutPause, req.OnTimeout)
	}
	policy, err := s.grantNetwork(req.Network, req.Backend)
	if err != nil {
		return Info{}, err
	}
	if err := s.memoryRoom(req.Backend, req.Owner, 1); err != nil {
		return Info{}, err
	}

	// Reserve a slot first, so that concurrent creations cannot exceed
	// the quotas while sandboxes start.
	id := sandboxid.New(s.cfg.Node)
	env, err := withID(req.Env, req.IDEnv, id)
	if err != nil {
		return Info{}, err
	}
	s.mu.Lock()
	if s.closed || s.draining {
		s.mu.Unlock()
		return Info{}, ErrShuttingDown
	}
	if len(s.boxes) >= s.cfg.MaxTotal {
		s.mu.Unlock()
		return Info{}, fmt.Errorf("%w: the server runs its maximum of %d sandboxes; close one or try later", ErrQuota, s.cfg.MaxTotal)
	}
	maxOwn, _ := s.cfg.Quota(req.Owner)
	if maxOwn <= 0 {
		maxOwn = s.cfg.MaxPerOwner
	}
	if n := s.owned(req.Owner); n >= maxOwn {
		s.mu.Unlock()
		return Info{}, fmt.Errorf("%w: this key may have %d live sandboxes; close one (DELETE /v1/sandboxes/{id}) first", ErrQuota, maxOwn)
	}
	s.boxes[id] = nil // reserved
	s.pending[req.Owner]++
	s.mu.Unlock()
	unreserve := func() {
		s.pending[req.Owner]--
		if s.pending[req.Owner] == 0 {
			delete(s.pending, req.Owner)
		}
	}

	start := time.Now()
	mounts, leases, err := s.leaseVolumes(req.Owner, req.Volumes)
	var sb sandbox.Sandbox
	var spec *sandbox.Spec
	var tstart templateStart
	var egress *netproxy.Proxy
	switch {
	case err == nil && snapDir != "":
		sb, err = s.restoreSnapshot(ctx, req.Owner, snap, snapDir)
	case err == nil:
		// Made without its id in its environment, which executions and
		// commands are given (ownEnv): sandboxes of one spec are alike,
		// and a pool keeps some ready.
		spec = &sandbox.Spec{Limits: limits, Env: withoutID(env, req.IDEnv), Backend: req.Backend,
			Tenant: s.tenantOf(req.Owner), Home: req.Home, Volumes: mounts,
			Pausable: req.Pausable || req.OnTimeout == OnTimeoutPause && !req.PauseFilesOnly, Template: req.Template}
		if tstart, err = s.withTemplate(ctx, req.Owner, spec); err == nil {
			sb, egress, err = s.makeSandbox(ctx, req.Owner, id, *spec, policy)
		}
	}
	if err == nil && req.OnTimeout == OnTimeoutPause {
		// Refused now rather than closed when its timeout comes.
		if err = s.timeoutPauseSupported(sb, spec, req); err != nil {
			sb.Close()
			err = fmt.Errorf("on_timeout %q: %w", OnTimeoutPause, err)
		}
	}
	if err != nil {
		releaseVolumes(leases)
	}
	if err != nil {
		s.mu.Lock()
		delete(s.boxes, id)
		unreserve()
		s.mu.Unlock()
		return Info{}, err
	}
	s.metrics.observeCreate(time.Since(start))
	now := s.cfg.Now()
	b := &Box{
		id: id, owner: req.Owner, sb: sb, createdAt: now, deadline: now.Add(life), idle: idle,
		limits: limits, env: env, idEnv: req.IDEnv, idStale: len(req.IDEnv) > 0,
		metadata: maps.Clone(req.Metadata), expiresAt: minTime(now.Add(idle), now.Add(life)),
		backend: cmp.Or(req.Backend, s.cfg.Backend.Name()), network: policy, egress: egress,
		ports: req.Ports, volumes: volumeInfos(mounts, leases), leases: leases,
		onTimeout: req.OnTimeout, autoResume: req.AutoResume, spec: spec, pauseFiles: req.PauseFilesOnly,
		pausable:     pauseSupported(sb, cmp.Or(req.Backend, s.cfg.Backend.Name())) == nil,
		snapTemplate: snapshotTemplate{snap.Template, snap.TemplateDigest},
	}
	s.mu.Lock()
	unreserve()
	if s.closed {
		delete(s.boxes, id)
		s.mu.Unlock()
		sb.Close()
		releaseVolumes(leases)
		return Info{}, ErrShuttingDown
	}
	s.boxes[id] = b
	s.mu.Unlock()
	// backend_id: the name the backend's own log lines give it.
	if err := s.startTemplate(ctx, req.Owner, b, tstart); err != nil {
		s.Delete(req.Owner, id)
		return Info{}, err
	}
	s.cfg.Logger.Info("sandbox created", "id", id, "backend_id", sb.ID(), "owner", req.Owner, "ms", time.Since(start).Milliseconds())
	return b.info(), nil
}

// owned counts what an owner holds against its sandbox quota: its live
// sandboxes, those being made, and those on the cluster's other nodes.
// Callers hold mu.
func (s *Service) owned(owner string) int {
	n := s.countOwner(owner) + s.pending[owner]
	if s.cfg.Elsewhere != nil {
		n += s.cfg.Elsewhere(owner)
	}
	return n
}

func (s *Service) countOwner(owner string) int {
	n := 0
	for _, b := range s.boxes {
		if b != nil && b.owner == owner {
			n++
		}
	}
	return n
}

// checkBackend refuses a backend the server does not offer.
func (s *Service) checkBackend(name string) error {
	offered := s.cfg.Backends
	if len(offered) == 0 {
		offered = []string{s.cfg.Backend.Name()}
	}
	if name == "" || slices.Contains(offered, name) {
		return nil
	}
	return fmt.Errorf("%w: backend %q is not offered here; this server offers %s", sandbox.ErrInvalidSpec,
		name, strings.Join(offered, ", "))
}

// bound applies server-wide caps to requested limits.
func (s *Service) bound(l sandbox.Limits) (sandbox.Limits, error) {
	max := s.cfg.MaxLimits
	if err := l.Validate(); err != nil {
		return l, err
	}
	check := func(name string, got, cap int64) error {
		if got > cap {
			return fmt.Errorf("%w: %s %d is over the server's limit of %d", sandbox.ErrInvalidSpec, name, got, cap)
		}
		return nil
	}
	// The I/O rates a client leaves out get the server's, not the
	// sandbox package's defaults.
	asked := l
	l = l.WithDefaults()
	l.IOReadBPS, l.IOWriteBPS, l.IOReadIOPS, l.IOWriteIOPS = asked.IOReadBPS, asked.IOWriteBPS, asked.IOReadIOPS, asked.IOWriteIOPS
	// A server-wide CPU cap is also every sandbox's default.
	if max.CPUs > 0 && l.CPUs == 0 {
		l.CPUs = max.CPUs
	}
	capCPUs := func() error {
		if max.CPUs > 0 && l.CPUs > max.CPUs {
			return fmt.Errorf("%w: cpus %g is over the server's limit of %g", sandbox.ErrInvalidSpec, l.CPUs, max.CPUs)
		}
		return nil
	}
	// Disk I/O rates: the server's are every sandbox's default and the
	// most a client may ask for; no limit only where the server has none.
	capIO := func(name string, got *int64, cap int64) error {
		switch {
		case *got == 0:
			*got = cap
		case cap > 0 && *got < 0:
			return fmt.Errorf("%w: %s: this server has a limit of %d a second", sandbox.ErrInvalidSpec, name, cap)
		case cap > 0 && *got > cap:
			return fmt.Errorf("%w: %s %d is over the server's limit of %d a second", sandbox.ErrInvalidSpec, name, *got, cap)
		}
		return nil
	}
	// The checks first: capIO sets l's rates.
	err := errors.Join(capCPUs(),
		capIO("io_read_bps", &l.IOReadBPS, max.IOReadBPS),
		capIO("io_write_bps", &l.IOWriteBPS, max.IOWriteBPS),
		capIO("io_read_iops", &l.IOReadIOPS, max.IOReadIOPS),
		capIO("io_write_iops", &l.IOWriteIOPS, max.IOWriteIOPS),
		check("memory", l.Memory, max.Memory),
		check("pids", int64(l.Pids), int64(max.Pids)),
		check("disk", l.Disk, max.Disk),
		check("max_output", l.MaxOutput, max.MaxOutput),
		check("timeout (ms)", l.Timeout.Milliseconds(), max.Timeout.Milliseconds()),
		check("cpu_time (ms)", l.CPUTime.Milliseconds(), max.Timeout.Milliseconds()),
	)
	return l, err
}

func bounded(name string, d, def, cap time.Duration) (time.Duration, error) {
	switch {
	case d < 0:
		return 0, fmt.Errorf("%w: negative %s", sandbox.ErrInvalidSpec, name)
	case d == 0:
		return min(def, cap), nil
	case d > cap:
		return 0, fmt.Errorf("%w: %s %v is over the server's limit of %v", sandbox.ErrInvalidSpec, name, d, cap)
	}
	return d, nil
}

// Get returns an owner's sandbox for an operation on it: a paused sandbox
// made with AutoResume is resumed first.
func (s *Service) Get(owner, id string) (*Box, error) { return s.live(owner, id) }

// lookup returns an owner's sandbox as it is.
func (s *Service) lookup(owner, id string) (*Box, error) {
	s.mu.Lock()
	b := s.boxes[id]
	s.mu.Unlock()
	if b == nil || b.owner != owner {
		return nil, ErrNotFound
	}
	return b, nil
}

// Info describes an owner's sandbox.
func (s *Service) Info(owner, id string) (Info, error) {
	b, err := s.lookup(owner, id)
	if err != nil {
		return Info{}, err
	}
	return b.info(), nil
}

// boxesOf lists owner's live sandboxes, or every owner's for "".
func (s *Service) boxesOf(owner string) []*Box {
	s.mu.Lock()
	defer s.mu.Unlock()
	var boxes []*Box
	for _, b := range s.boxes {
		if b != nil && (owner == "" || b.owner == owner) {
			boxes = append(boxes, b)
		}
	}
	return boxes
}

// List returns an owner's sandboxes, oldest first.
func (s *Service) List(owner string) []Info {
	boxes := s.boxesOf(owner)
	out := make([]Info, 0, len(boxes))
	for _, b := range boxes {
		out = append(out, b.info())
	}
	slices.SortFunc(out, func(a, b Info) int { return a.CreatedAt.Compare(b.CreatedAt) })
	return out
}

// Live is the number of live sandboxes.
func (s *Service) Live() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.boxes)
}

// Owners counts the live sandboxes of each owner.
func (s *Service) Owners() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := map[string]int{}
	for _, b := range s.boxes {
		if b != nil {
			m[b.owner]++
		}
	}
	return m
}

// Running counts the executions (and commands) running now, per owner.
func (s *Service) Running() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.running)
}

// Delete closes an owner's sandbox.
func (s *Service) Delete(owner, id string) error {
	b, err := s.lookup(owner, id)
	if err != nil {
		return err
	}
	s.remove(b, "deleted")
	return nil
}

func (s *Service) remove(b *Box, why string) {
	s.removeIf(b, why, nil)
}

// removeIf is remove if cond holds (nil: always). cond is called with b.mu
// held, under the server's lock, which b is taken out of the server under.
// It reports whether b was closed.
func (s *Service) removeIf(b *Box, why string, cond func() bool) bool {
	s.mu.Lock()
	if s.boxes[b.id] != b {
		s.mu.Unlock()
		return false
	}
	if cond != nil {
		b.mu.Lock()
		ok := cond()
		b.mu.Unlock()
		if !ok {
			s.mu.Unlock()
			return false
		}
	}
	delete(s.boxes, b.id)
	s.mu.Unlock()
	s.usage.closing(b.id) // no sample is taken from here on
	if err := b.Sandbox().Close(); err != nil {
		s.cfg.Logger.Warn("sandbox clean-up", "id", b.id, "err", err)
	}
	releaseVolumes(b.leases) // every process that could reach them is gone
	if why != whyShutdown {
		s.forgetPaused(b) // a shutdown keeps it for the next server
	}
	s.closePorts(b.id)
	s.cfg.Logger.Info("sandbox closed", "id", b.id, "why", why)
	return true
}

// SetTimeout sets a sandbox's idle timeout to d from now, within its
// maximum lifetime.
func (s *Service) SetTimeout(owner, id string, d time.Duration) (Info, error) {
	b, err := s.lookup(owner, id)
	if err != nil {
		return Info{}, err
	}
	d, err = bounded("timeout", d, s.cfg.DefaultIdle, s.cfg.MaxIdle)
	if err != nil {
		return Info{}, err
	}
	b.mu.Lock()
	b.idle = d
	b.expiresAt = minTime(s.cfg.Now().Add(d), b.deadline)
	b.mu.Unlock()
	return b.info(), nil
}

// use marks the start of an operation: the sandbox does not expire while
// one runs, and its idle clock restarts when it ends.
func (s *Service) use(b *Box) func() {
	b.mu.Lock()
	b.running++
	b.mu.Unlock()
	return func() {
		b.mu.Lock()
		b.running--
		b.expiresAt = minTime(s.cfg.Now().Add(b.idle), b.deadline)
		b.mu.Unlock()
	}
}

// acquire takes an execution slot for owner within the per-owner and
// server-wide quotas; release gives it back.
func (s *Service) acquire(owner string) (release func(), err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || s.draining {
		return nil, ErrShuttingDown
	}
	_, maxOwn := s.cfg.Quota(owner)
	if maxOwn <= 0 {
		maxOwn = s.cfg.MaxExecutionsPerOwner
	}
	running := s.running[owner]
	if s.cfg.RunningElsewhere != nil {
		running += s.cfg.RunningElsewhere(owner)
	}
	if running >= maxOwn {
		return nil, fmt.Errorf("%w: this key may run %d executions at once; wait for one to finish", ErrQuota, maxOwn)
	}
	if s.active >= s.cfg.MaxExecutions {
		return nil, fmt.Errorf("%w: the server runs its maximum of %d executions at once; try again shortly", ErrQuota, s.cfg.MaxExecutions)
	}
	s.running[owner]++
	s.active++
	return sync.OnceFunc(func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.running[owner]--; s.running[owner] == 0 {
			delete(s.running, owner)
		}
		if s.active--; s.active == 0 {
			s.idle.Broadcast()
		}
	}), nil
}

// reap closes sandboxes past their idle timeout or maximum lifetime.
func (s *Service) reap() {
	defer s.wg.Done()
	t := time.NewTicker(250 * time.Millisecond)
	defer t.Stop()
	for tick := 0; ; tick++ {
		select {
		case <-s.stop:
			return
		case <-t.C:
		}
		if tick%4 == 0 {
			s.closeRevoked()
		}
		now := s.cfg.Now()
		s.mu.Lock()
		var ended, idle []*Box
		for _, b := range s.boxes {
			if b == nil {
				continue
			}
			b.mu.Lock()
			switch {
			case b.paused:
				if now.After(b.pausedAt.Add(s.cfg.MaxPaused)) {
					ended = append(ended, b)
				}
			case now.After(b.deadline):
				ended = append(ended, b)
			case b.running == 0 && now.After(b.expiresAt):
				idle = append(idle, b)
			}
			b.mu.Unlock()
		}
		s.mu.Unlock()
		for _, b := range ended {
			s.remove(b, "expired")
			s.metrics.expired.Add(1)
		}
		for _, b := range idle {
			s.wg.Add(1)
			go func() { // a pause takes a while: the others are not kept waiting
				defer s.wg.Done()
				s.timedOut(b)
			}()
		}
	}
}

// closeRevoked closes the sandboxes of owners whose key was revoked with
// its sandboxes (vivarium keys revoke --close-sandboxes): by another
// process, the CLI, as well as by this one.
func (s *Service) closeRevoked() {
	owners := map[string][]*Box{}
	for _, b := range s.boxesOf("") {
		owners[b.owner] = append(owners[b.owner], b)
	}
	for owner, boxes := range owners {
		if revoked, closeThem := s.cfg.KeyRevoked(owner); revoked && closeThem {
			s.cfg.Logger.Info("key revoked with its sandboxes: closing them", "owner", owner, "sandboxes", len(boxes))
			for _, b := range boxes {
				s.remove(b, "key revoked")
			}
		}
	}
	// A revoked key's templates are never built on or used again.
	for _, owner := range s.builds.ownersNow() {
		if revoked, _ := s.cfg.KeyRevoked(owner); revoked {
			s.builds.closeOwner(owner)
		}
	}
}

// CloseOwner closes every sandbox of owner (its key revoked) and returns
// how many it closed.
func (s *Service) CloseOwner(owner string) int {
	boxes := s.boxesOf(owner)
	for _, b := range boxes {
		s.remove(b, "key revoked")
	}
	s.builds.closeOwner(owner)
	return len(boxes)
}

// Shutdown stops taking work, lets executions in progress finish until
// ctx is done, then interrupts those still running (and kills them a few
// seconds later if they ignore it), and closes every sandbox.
func (s *Service) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	s.draining = true
	s.mu.Unlock()
	finished := make(chan struct{})
	go func() {
		s.mu.Lock()
		for s.active > 0 {
			s.idle.Wait()
		}
		s.mu.Unlock()
		close(finished)
	}()
	select {
	case <-finished:
	case <-ctx.Done():
		s.mu.Lock()
		n := s.active
		var boxes []*Box
		for _, b := range s.boxes {
			if b != nil {
				boxes = append(boxes, b)
			}
		}
		s.mu.Unlock()
		s.cfg.Logger.Warn("grace period over: interrupting executions", "running", n)
		for _, b := range boxes {
			b.Sandbox().Interrupt()
		}
		select {
		case <-finished:
		case <-time.After(3 * time.Second):
		}
	}
	if s.cfg.PauseOnShutdown && s.keepsPaused() {
		s.pauseAll(ctx)
	}
	return s.Close()
}

// pauseAll pauses every live sandbox that can be paused, two at a time
// (a pause is mostly disk and one CRIU), for a shutdown: Close then keeps
// them on disk. What cannot be paused (or fails to) is closed by Close.
func (s *Service) pauseAll(ctx context.Context) {
	s.mu.Lock()
	var boxes []*Box
	for _, b := range s.boxes {
		if b != nil {
			boxes = append(boxes, b)
		}
	}
	s.mu.Unlock()
	ctx = context.WithoutCancel(ctx) // the grace period may be over: the pauses are what is kept
	sem := make(chan struct{}, 2)
	var wg sync.WaitGroup
	paused := 0
	var mu sync.Mutex
	for _, b := range boxes {
		b.mu.Lock()
		skip := b.paused || !b.pausable
		b.mu.Unlock()
		if skip {
			continue
		}
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			if err := s.pause(ctx, b); err != nil {
				s.cfg.Logger.Warn("shutdown: not paused, closed", "id", b.id, "err", err)
				return
			}
			mu.Lock()
			paused++
			mu.Unlock()
		})
	}
	wg.Wait()
	s.cfg.Logger.Info("shutdown: sandboxes paused to be kept", "paused", paused)
}

// Close ends every sandbox at once.
func (s *Service) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	var boxes []*Box
	for _, b := range s.boxes {
		if b != nil {
			boxes = append(boxes, b)
		}
	}
	s.mu.Unlock()
	close(s.stop)
	s.wg.Wait()
	s.closing.Wait()
	s.persisting.Wait()
	s.builds.close()
	defer s.stopNetwork()
	var wg sync.WaitGroup
	for _, b := range boxes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.remove(b, whyShutdown)
		}()
	}
	wg.Wait()
	if s.pausedLock != nil {
		s.pausedLock.Close() // and its lock with it
	}
	return nil
}

// whyShutdown is why a server's Close closes its sandboxes.
const whyShutdown = "server shutting down"

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}
