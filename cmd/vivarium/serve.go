package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vivarium-sandbox/vivarium/internal/backend/docker"
	"github.com/vivarium-sandbox/vivarium/internal/backend/gvisor"
	"github.com/vivarium-sandbox/vivarium/internal/backend/native"
	"github.com/vivarium-sandbox/vivarium/internal/backend/wasm"
	"github.com/vivarium-sandbox/vivarium/internal/cgroups"
	"github.com/vivarium-sandbox/vivarium/internal/criu"
	"github.com/vivarium-sandbox/vivarium/internal/hostmem"
	"github.com/vivarium-sandbox/vivarium/internal/httpapi"
	"github.com/vivarium-sandbox/vivarium/internal/pool"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/service"
	"github.com/vivarium-sandbox/vivarium/internal/snapshot"
	"github.com/vivarium-sandbox/vivarium/internal/store"
	"github.com/vivarium-sandbox/vivarium/internal/volume"
)

// serveConfig is every setting of `vivarium serve`. Each flag can also be
// set in the environment as VIVARIUM_<FLAG> (--max-sandboxes:
// VIVARIUM_MAX_SANDBOXES); a flag on the command line wins.
type serveConfig struct {
	listen       string
	dataDir      string
	dev          bool
	logFormat    string
	logLevel     string
	cgroupParent string
	uidBase      uint
	uidRanges    int
	kernelLimits native.KernelLimits
	noCgroups    bool
	grace        time.Duration

	maxSandboxes, maxSandboxesPerKey     int
	maxExecutions, maxExecutionsPerKey   int
	idle, maxIdle, lifetime, maxLifetime time.Duration
	maxPaused                            time.Duration
	checkpointDir                        string
	pauseBase                            bool
	cluster                              clusterConfig
	clusterToken                         string
	e2bPausable                          bool
	pauseOnShutdown                      bool
	snapshotKeyFile                      string
	maxSnapshots                         int
	maxSnapshotBytes                     sizeFlag
	memory, disk, maxOutput              sizeFlag
	memoryPerKey, memoryTotal            sizeFlag
	pids                                 int
	timeout                              time.Duration
	cpus                                 float64

	allowOrigins       listFlag
	allowHosts         listFlag
	backend            string
	backends           listFlag
	gvisorPlatform     string
	dockerHost         string
	dockerRuntime      string
	dockerUIDBase      uint
	dockerUIDs         int
	wasmDir            string
	zygote             bool
	zygoteMaxSandboxes int
	zygoteTemplates    int
	zygoteMaxAge       time.Duration
	preload            string
	pool               int
	poolIdle           time.Duration
	poolConfigs        int
	net                netServeFlags
	templates          templateServeFlags
	audit              auditServeFlags
	io                 ioFlags
	tenants            bool
	domain             string
	volumeSize         sizeFlag
	volumeMaxSize      sizeFlag
	volumesPerKey      int
	volumesMounted     int
}

func serveFlags(c *serveConfig) *flag.FlagSet {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `Usage: vivarium serve [flags]

Serves stateful sandboxes over HTTP (see /openapi.json). Clients
authenticate with API keys made by "vivarium keys create"; --dev serves
without keys, on loopback only. Every flag may also be set in the
environment: --max-sandboxes is VIVARIUM_MAX_SANDBOXES.

Flags:
`)
		fs.PrintDefaults()
	}
	c.memory, c.disk, c.maxOutput = 2<<30, 1<<30, 16<<20
	fs.StringVar(&c.listen, "listen", "127.0.0.1:8080", "`ADDRESS` to listen on")
	fs.StringVar(&c.dataDir, "data-dir", defaultDataDir(), "`DIR` for the database of keys and the audit log")
	c.audit.register(fs)
	fs.BoolVar(&c.dev, "dev", false, "development mode: no API keys, loopback only")
	fs.StringVar(&c.logFormat, "log-format", "text", "log format: text or json")
	fs.StringVar(&c.logLevel, "log-level", "info", "log level: debug, info, warn or error")
	fs.StringVar(&c.cgroupParent, "cgroup-parent", "vivarium-serve",
		"cgroup every sandbox is created under; one server per parent (leftovers in it are removed at start)")
	addUIDFlags(fs, &c.uidBase, &c.uidRanges, &c.kernelLimits)
	fs.BoolVar(&c.noCgroups, "insecure-no-cgroups", false,
		"run without cgroups when the host has none: memory and process limits per process (rlimits), not per sandbox")
	fs.DurationVar(&c.grace, "shutdown-grace", 10*time.Second, "on SIGTERM, how long executions may finish before they are interrupted")
	fs.IntVar(&c.maxSandboxes, "max-sandboxes", 1000, "live sandboxes on this server")
	fs.IntVar(&c.maxSandboxesPerKey, "max-sandboxes-per-key", 50, "live sandboxes per API key (a key's own quota wins)")
	fs.IntVar(&c.maxExecutions, "max-executions", 256, "executions, commands and one-shot runs at once on this server")
	fs.IntVar(&c.maxExecutionsPerKey, "max-executions-per-key", 16, "executions at once per API key (a key's own quota wins)")
	fs.DurationVar(&c.idle, "idle-timeout", 5*time.Minute, "default idle timeout of a sandbox")
	fs.DurationVar(&c.maxIdle, "max-idle-timeout", 24*time.Hour, "largest idle timeout a client may ask for")
	fs.DurationVar(&c.lifetime, "lifetime", time.Hour, "default maximum lifetime of a sandbox")
	fs.DurationVar(&c.maxLifetime, "max-lifetime", 24*time.Hour, "largest maximum lifetime a client may ask for")
	fs.DurationVar(&c.maxPaused, "max-paused", 0, "how long a paused sandbox is kept (0: --max-lifetime)")
	fs.StringVar(&c.checkpointDir, "checkpoint-dir", "", "`DIR` where paused native sandboxes keep their images "+
		"(default /var/lib/vivarium/checkpoints/<cgroup parent>); its parents must let others through (0711)")
	c.cluster.flags(fs, true)
	fs.BoolVar(&c.pauseBase, "pause-base", true, "native: paused sandboxes kept on disk share the pages of a base (<data dir>/pause-bases) and take "+
		"about a fifth of the disk; pausable sandboxes then start with --preload imported, the same memory layout and the same "+
		"string-hash seed (docs/snapshots.md, docs/security.md)")
	fs.BoolVar(&c.pauseOnShutdown, "pause-on-shutdown", false, "on SIGTERM, pause every running sandbox that can be paused "+
		"and keep it on disk for the next server on --data-dir (a rolling update), instead of closing it")
	fs.BoolVar(&c.e2bPausable, "e2b-pausable", true, "E2B's API makes every sandbox pausable, as E2B's are (where CRIU is usable); "+
		"kept for compatibility: a native or gvisor sandbox can be paused whatever it says")
	fs.StringVar(&c.snapshotKeyFile, "snapshot-key-file", "", "`FILE` of the key snapshots are signed with (made if missing; "+
		"default <data dir>/snapshot.key): servers that share it take each other's exported snapshots")
	fs.IntVar(&c.maxSnapshots, "max-snapshots-per-key", 16, "snapshots an API key may keep")
	c.maxSnapshotBytes = 8 << 30
	fs.Var(&c.maxSnapshotBytes, "max-snapshot-bytes-per-key", "disk an API key's snapshots may take (default 8GiB)")
	fs.Var(&c.memory, "max-memory", "largest memory limit a client may ask for (the default is 512MiB)")
	_, hostTotal, _ := hostmem.Read()
	memoryTotal, memoryPerKey := hostmem.DefaultCeilings(hostTotal)
	c.memoryTotal, c.memoryPerKey = sizeFlag(memoryTotal), sizeFlag(memoryPerKey)
	fs.Var(&c.memoryPerKey, "max-memory-per-key", "memory all native sandboxes of an API key may hold together (half the host's "+
		"by default), what ended ones left to the others (a memfd handed over) included, with --tenant-share; 0: no bound")
	fs.Var(&c.memoryTotal, "max-memory-total", "memory all native sandboxes of this server may hold together (by default "+
		"the host's less 5%, at least 256MiB); 0: no bound")
	fs.Var(&c.disk, "max-disk", "largest disk limit a client may ask for (the default is 256MiB)")
	fs.Var(&c.maxOutput, "max-output", "largest output limit per stream a client may ask for (the default is 1MiB)")
	fs.IntVar(&c.pids, "max-pids", 1024, "largest pids limit a client may ask for (the default is 64)")
	fs.DurationVar(&c.timeout, "max-timeout", time.Hour, "longest execution a client may ask for (the default is 30s)")
	fs.Float64Var(&c.cpus, "cpus", 0, "CPU cap of every sandbox in cores (0: none; each sandbox still gets only its fair share)")
	c.io.register(fs, "every sandbox (clients may ask for less)")
	fs.BoolVar(&c.tenants, "tenant-share", true,
		"group each API key's sandboxes in a cgroup of the key's own, with one CPU and I/O weight per key: a key gets its share however many sandboxes it runs")
	c.templates.register(fs)
	fs.Var(&c.allowOrigins, "allow-origin", "`ORIGIN` of web pages allowed to call the API (repeatable; default: none)")
	fs.Var(&c.allowHosts, "allow-host", "`NAME` a request to the server on loopback may give as its Host, besides localhost, "+
		"127.0.0.1, [::1] and --domain's (repeatable; others are refused: DNS rebinding)")
	fs.StringVar(&c.backend, "backend", "native", "default isolation: `native` (Linux namespaces, seccomp, cgroups), gvisor (inside gVisor's user-space kernel: runsc), docker (containers of a local Docker daemon) or wasm (CPython compiled to WebAssembly: standard library only)")
	fs.Var(&c.backends, "offer-backend", "`NAME` of another backend clients may ask for per sandbox (\"backend\" in the API; repeatable or comma-separated)")
	fs.StringVar(&c.gvisorPlatform, "gvisor-platform", "", "for --backend gvisor: runsc's `PLATFORM` (systrap, kvm, ptrace); default: the first that starts a sandbox here")
	fs.StringVar(&c.dockerHost, "docker-host", "", "for the docker backend: the daemon's `ADDRESS` (unix:///PATH); default $DOCKER_HOST, else unix:///var/run/docker.sock")
	fs.StringVar(&c.dockerRuntime, "docker-runtime", "", "for the docker backend: the daemon's OCI `RUNTIME` for containers (runsc: gVisor); default the daemon's")
	fs.UintVar(&c.dockerUIDBase, "docker-uid-base", docker.DefaultUIDBase,
		"for the docker backend: first host `UID` of the pool every sandbox is a host user of its own from (65536 uids a sandbox, which must belong to nobody)")
	fs.IntVar(&c.dockerUIDs, "docker-uid-ranges", docker.DefaultUIDRanges,
		"for the docker backend: `N` ranges of 65536 uids from --docker-uid-base: as many docker sandboxes at once (at least --max-sandboxes)")
	fs.StringVar(&c.wasmDir, "wasm-dir", os.Getenv(wasm.DirEnv), "for --backend wasm: the `DIR` `make wasm` built")
	fs.BoolVar(&c.zygote, "zygote", true,
		"native backend: fork sandboxes from a zygote, a Python with the --preload modules imported: fast starts, shared memory")
	fs.IntVar(&c.zygoteMaxSandboxes, "zygote-max-sandboxes", native.DefaultZygoteMaxSandboxes,
		"replace the zygote after this many sandboxes (sandboxes of one zygote share its memory layout); -1: never")
	fs.DurationVar(&c.zygoteMaxAge, "zygote-max-age", native.DefaultZygoteMaxAge, "replace the zygote after this long; -1s: never")
	fs.IntVar(&c.zygoteTemplates, "zygote-templates", native.DefaultZygoteTemplates,
		"most templates with a zygote of their own at once, each for one key (started by its first sandbox; one more retires "+
			"the least recently used); 0: none, each sandbox of a template starts its own python3")
	fs.StringVar(&c.preload, "preload", "numpy,pandas,matplotlib", "`MODULES` the zygote imports once for every sandbox (comma-separated)")
	fs.IntVar(&c.pool, "pool", 4, "most fresh sandboxes kept ready per configuration (0: none)")
	fs.DurationVar(&c.poolIdle, "pool-idle", 10*time.Minute, "a configuration unused this long is no longer kept ready")
	fs.IntVar(&c.poolConfigs, "pool-configs", pool.DefaultConfigs, "most configurations (templates, limits) an API key keeps ready; "+
		"a new one drops its least recently used")
	c.net.register(fs)
	c.volumeSize, c.volumeMaxSize = volume.DefaultSize, volume.DefaultMaxSize
	fs.Var(&c.volumeSize, "volume-size", "size of a persistent volume whose creator names none (the default is 1GiB)")
	fs.Var(&c.volumeMaxSize, "volume-max-size", "largest persistent volume a client may create (the default is 10GiB); each is an ext4 image of its size under --data-dir")
	fs.IntVar(&c.volumesPerKey, "volumes-per-key", volume.DefaultMaxPerOwner, "persistent volumes an API key may keep")
	fs.IntVar(&c.volumesMounted, "max-mounted-volumes", volume.DefaultMaxMounted,
		"persistent volumes mounted at once on this server (each is a loop device of the host's while a sandbox uses it)")
	fs.StringVar(&c.domain, "domain", "",
		"`DOMAIN` whose subdomains <port>-<sandbox>.DOMAIN serve sandboxes' ports (E2B's getHost; wildcard DNS to this server; add :PORT if not 80 or 443)")
	return fs
}

// defaultDataDir follows the XDG base directories for users, and /var/lib
// for root, which runs the native backend.
func defaultDataDir() string {
	if os.Geteuid() == 0 {
		return "/var/lib/vivarium"
	}
	if d := os.Getenv("XDG_DATA_HOME"); d != "" {
		return filepath.Join(d, "vivarium")
	}
	if h, err := os.UserHomeDir(); err == nil {
		return filepath.Join(h, ".local", "share", "vivarium")
	}
	return "vivarium-data"
}

// envDefaults sets each flag not given on the command line from
// VIVARIUM_<NAME>, where NAME is the flag's name upper-cased with dashes
// as underscores.
func envDefaults(fs *flag.FlagSet) error {
	var errs []error
	fs.VisitAll(func(f *flag.Flag) {
		name := "VIVARIUM_" + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
		if v, ok := os.LookupEnv(name); ok {
			if err := f.Value.Set(v); err != nil {
				errs = append(errs, fmt.Errorf("%s=%q: %v", name, v, err))
			}
		}
	})
	return errors.Join(errs...)
}

// flagGiven reports whether a flag was set, on the command line or from
// its environment variable.
func flagGiven(fs *flag.FlagSet, name string) bool {
	given := false
	fs.Visit(func(f *flag.Flag) { given = given || f.Name == name })
	_, inEnv := os.LookupEnv("VIVARIUM_" + strings.ToUpper(strings.ReplaceAll(name, "-", "_")))
	return given || inEnv
}

// validate lists everything wrong with the configuration at once.
func (c *serveConfig) validate() error {
	var errs []error
	check := func(bad bool, msg string) {
		if bad {
			errs = append(errs, errors.New(msg))
		}
	}
	host, _, err := net.SplitHostPort(c.listen)
	check(err != nil, fmt.Sprintf("--listen %q: want HOST:PORT", c.listen))
	check(c.dev && err == nil && !isLoopback(host),
		fmt.Sprintf("--dev serves without API keys and listens on loopback only; %q is not a loopback address", c.listen))
	check(c.logFormat != "text" && c.logFormat != "json", "--log-format must be text or json")
	_, lerr := parseLevel(c.logLevel)
	check(lerr != nil, "--log-level must be debug, info, warn or error")
	check(c.maxSandboxes < 1 || c.maxSandboxesPerKey < 1, "--max-sandboxes and --max-sandboxes-per-key must be at least 1")
	check(c.maxExecutions < 1 || c.maxExecutionsPerKey < 1, "--max-executions and --max-executions-per-key must be at least 1")
	check(c.idle <= 0 || c.maxIdle < c.idle, "--idle-timeout must be positive and at most --max-idle-timeout")
	check(c.lifetime <= 0 || c.maxLifetime < c.lifetime, "--lifetime must be positive and at most --max-lifetime")
	check(c.maxPaused < 0, "--max-paused must not be negative")
	check(c.audit.retention < 0 || c.audit.maxRows < 0, "--audit-retention and --audit-max-rows must not be negative (0: no bound)")
	check(c.grace < 0, "--shutdown-grace must not be negative")
	check(c.dataDir == "", "--data-dir must not be empty")
	check(c.volumeMaxSize < volume.MinSize || c.volumeSize < volume.MinSize || c.volumeSize > c.volumeMaxSize,
		"--volume-size and --volume-max-size must be at least 16MiB, --volume-size at most --volume-max-size")
	check(c.volumesPerKey < 1 || c.volumesMounted < 1, "--volumes-per-key and --max-mounted-volumes must be at least 1")
	check(c.uidBase < 100000 || c.uidRanges < 1 || uint64(c.uidBase)+uint64(c.uidRanges)<<16 >= 1<<32-1,
		"--uid-base must be at least 100000, --uid-ranges at least 1, and the ranges must end below 4294967295")
	check(c.zygoteMaxSandboxes == 0 || c.zygoteMaxAge == 0, "--zygote-max-sandboxes and --zygote-max-age must not be 0 (-1: never)")
	check(c.zygoteTemplates < 0, "--zygote-templates must not be negative")
	check(c.pool < 0 || c.pool > 1000, "--pool must be between 0 and 1000")
	check(c.poolIdle <= 0, "--pool-idle must be positive")
	check(c.poolConfigs < 1, "--pool-configs must be at least 1")
	check(c.preload != "" && !c.zygote, "--preload needs --zygote (without a zygote nothing is preloaded)")
	for _, name := range c.backendNames() {
		check(name != "native" && name != "gvisor" && name != "docker" && name != "wasm",
			fmt.Sprintf("unknown backend %q: --backend and --offer-backend take native, gvisor, docker or wasm", name))
		if name == "docker" {
			check(c.dockerUIDBase < 100000 || uint64(c.dockerUIDBase)+uint64(max(c.dockerUIDs, 0))<<16 > 1<<32-1,
				"--docker-uid-base must be at least 100000, and its --docker-uid-ranges end below 4294967295")
			check(c.dockerUIDs < c.maxSandboxes, fmt.Sprintf("--docker-uid-ranges (%d) must be at least --max-sandboxes (%d): "+
				"a docker sandbox is a host user of its own", c.dockerUIDs, c.maxSandboxes))
		}
	}
	if _, err := c.io.apply(sandbox.Limits{}); err != nil {
		errs = append(errs, err)
	}
	max := c.maxLimits()
	if err := max.Validate(); err != nil {
		errs = append(errs, err)
	}
	if _, err := c.net.config(c.listen, nil); err != nil {
		errs = append(errs, err)
	}
	if err := checkDomain(c.domain); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func (c *serveConfig) maxLimits() sandbox.Limits {
	l := sandbox.Limits{Memory: int64(c.memory), Disk: int64(c.disk), MaxOutput: int64(c.maxOutput), Pids: c.pids,
		Timeout: c.timeout, CPUs: c.cpus}
	l, _ = c.io.apply(l) // validate reports the error
	return l
}

// nativeOf returns the native backend among those offered.
func nativeOf(m *sandbox.Mux) (*native.Backend, bool) {
	b, ok := m.Backend("native")
	if !ok {
		return nil, false
	}
	nb, ok := b.(*native.Backend)
	return nb, ok
}

// backendNames lists the backends offered, the default first.
func (c *serveConfig) backendNames() []string {
	names := []string{c.backend}
	for _, l := range c.backends {
		for _, n := range strings.Split(l, ",") {
			if n = strings.TrimSpace(n); n != "" && !slices.Contains(names, n) {
				names = append(names, n)
			}
		}
	}
	return names
}

// newBackend makes the backends --backend and --offer-backend name, as
// one: a sandbox's "backend" chooses among them.
func (c *serveConfig) newBackend(log *slog.Logger) (*sandbox.Mux, error) {
	var open []sandbox.Backend
	closeAll := func() {
		for _, b := range open {
			if cl, ok := b.(io.Closer); ok {
				cl.Close()
			}
		}
	}
	for _, name := range c.backendNames() {
		b, err := c.openBackend(name, log)
		if err != nil {
			closeAll()
			return nil, fmt.Errorf("%s backend: %w", name, err)
		}
		open = append(open, b)
	}
	return sandbox.NewMux(open[0], open[1:]...), nil
}

func (c *serveConfig) openBackend(name string, log *slog.Logger) (sandbox.Backend, error) {
	switch name {
	case "gvisor":
		// A cgroup parent and state of its own, under the server's lock.
		return gvisor.New(gvisor.Config{Platform: c.gvisorPlatform, CgroupParent: c.cgroupParent + "-gvisor", Logger: log})
	case "docker":
		return docker.New(docker.Config{Host: c.dockerHost, Runtime: c.dockerRuntime, Name: c.cgroupParent + "-docker",
			UIDBase: uint32(c.dockerUIDBase), UIDRanges: c.dockerUIDs, Logger: log})
	case "wasm":
		return wasm.New(wasm.Config{Dir: c.wasmDir})
	}
	if !c.io.none && !c.noCgroups {
		// Every sandbox's disk I/O is limited on these disks: where none
		// is found (a pod's overlay /), every sandbox would be refused
		// while the server looked healthy. Said at the start instead.
		if _, err := cgroups.IODevices(); err != nil {
			return nil, err
		}
	}
	perKey := int64(c.memoryPerKey)
	if !c.tenants {
		perKey = 0 // no group per key
	}
	return native.New(native.Config{CgroupParent: c.cgroupParent, UIDBase: uint32(c.uidBase), UIDRanges: c.uidRanges,
		MemoryTotal: int64(c.memoryTotal), MemoryPerTenant: perKey,
		KernelLimits: c.kernelLimits, InsecureNoCgroups: c.noCgroups, Zygote: c.zygote, Preload: c.preloads(),
		ZygoteMaxSandboxes: c.zygoteMaxSandboxes, ZygoteMaxAge: c.zygoteMaxAge, ZygoteTemplates: cmp.Or(c.zygoteTemplates, -1), CheckpointDir: c.checkpointDir,
		PauseBaseDir: c.pauseBaseDir(), Logger: log})
}

// checkpointRoot is the directory paused native sandboxes' checkpoints
// are kept under.
func (c *serveConfig) checkpointRoot() string {
	return cmp.Or(c.checkpointDir, sandbox.DefaultCheckpointRoot)
}

// letThrough gives the data directory o+x (0711) where the checkpoints
// are below it and it has none: made 0700 by an older `vivarium keys
// create`, it would keep every restore, which reads its checkpoint as the
// sandbox's own host user, from reaching it. Others still cannot list it.
func letThrough(dataDir, checkpoints string, log *slog.Logger) {
	rel, err := filepath.Rel(dataDir, checkpoints)
	if err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
		return
	}
	st, err := os.Stat(dataDir)
	if err != nil || st.Mode().Perm()&0o001 != 0 {
		return
	}
	if err := os.Chmod(dataDir, st.Mode().Perm()|0o011); err != nil {
		log.Warn("the data directory does not let restores through to their checkpoints (chmod 0711 it)", "dir", dataDir, "err", err)
		return
	}
	log.Info("the data directory now lets restores through to their checkpoints (o+x)", "dir", dataDir)
}

// pauseBaseDir is where the native backend keeps its pause bases ("":
// none, with --pause-base=false or where CRIU cannot pause: pausable
// sandboxes then start as any other, their layout randomized).
func (c *serveConfig) pauseBaseDir() string {
	if _, err := criu.Usable(); !c.pauseBase || err != nil {
		return ""
	}
	return filepath.Join(c.dataDir, "pause-bases")
}

// reportPoolAtRest logs what the pool holds once it has filled (or after a
// minute): what keeping sandboxes ready costs when nothing happens.
func reportPoolAtRest(p *pool.Pool, log *slog.Logger) {
	deadline := time.Now().Add(time.Minute)
	for {
		stats := p.Stats()
		full := true
		ready, memory := 0, int64(0)
		for _, st := range stats {
			full = full && st.Ready >= st.Target
			ready += st.Ready
			memory += st.MemoryBytes
		}
		if full || time.Now().After(deadline) {
			if len(stats) > 0 {
				log.Info("pool ready", "sandboxes", ready, "configurations", len(stats), "memory_at_rest_mib", fmt.Sprintf("%.1f", float64(memory)/(1<<20)))
			}
			return
		}
		time.Sleep(500 * time.Millisecond)
	}
}

func (c *serveConfig) preloads() []string {
	var out []string
	for _, m := range strings.Split(c.preload, ",") {
		if m = strings.TrimSpace(m); m != "" {
			out = append(out, m)
		}
	}
	return out
}

// allowHostNames lists --allow-host's names, lower-cased.
func (c *serveConfig) allowHostNames() []string {
	var out []string
	for _, l := range c.allowHosts {
		for _, n := range strings.Split(l, ",") {
			if n = strings.ToLower(strings.TrimSpace(n)); n != "" {
				out = append(out, n)
			}
		}
	}
	return out
}

func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func parseLevel(s string) (slog.Level, error) {
	var l slog.Level
	return l, l.UnmarshalText([]byte(s))
}

func (c *serveConfig) logger() *slog.Logger {
	level, _ := parseLevel(c.logLevel)
	opts := &slog.HandlerOptions{Level: level}
	if c.logFormat == "json" {
		return slog.New(slog.NewJSONHandler(os.Stderr, opts))
	}
	return slog.New(slog.NewTextHandler(os.Stderr, opts))
}

func cmdServe(args []string) int {
	var c serveConfig
	fs := serveFlags(&c)
	if err := envDefaults(fs); err != nil {
		fmt.Fprintf(os.Stderr, "vivarium serve: %v\n", err)
		return 2
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "vivarium serve: unexpected arguments: %s\n", strings.Join(fs.Args(), " "))
		return 2
	}
	// --zygote=false alone drops the default preload (there is nothing to
	// preload into); a --preload given too is refused by validate.
	if !c.zygote && !flagGiven(fs, "preload") {
		c.preload = ""
	}
	if err := c.validate(); err != nil {
		fmt.Fprintf(os.Stderr, "vivarium serve: %v\n", err)
		return 2
	}
	if c.cluster.enabled {
		var err error
		if c.clusterToken, err = c.cluster.resolve(true); err != nil {
			fmt.Fprintf(os.Stderr, "vivarium serve: %v\n", err)
			return 2
		}
	}
	log := c.logger()
	if err := serve(&c, log); err != nil {
		log.Error("vivarium serve stopped", "err", err)
		return 1
	}
	return 0
}

func serve(c *serveConfig, log *slog.Logger) error {
	// One server per cgroup parent: the sweep below would otherwise kill
	// another server's sandboxes.
	unlock, err := lockParent(c.cgroupParent)
	if err != nil {
		return err
	}
	defer unlock()

	st, err := store.Open(c.dataDir)
	if err != nil {
		return err
	}
	defer st.Close()
	letThrough(c.dataDir, c.checkpointRoot(), log)
	// Closed last: every sandbox, and with it every lease, is gone by then.
	volCfg := volume.Config{Dir: filepath.Join(c.dataDir, "volumes"), MaxSize: int64(c.volumeMaxSize),
		DefaultSize: int64(c.volumeSize), MaxPerOwner: c.volumesPerKey, MaxMounted: c.volumesMounted, Logger: log}
	if c.cluster.enabled {
		volCfg.Node = c.cluster.node
	}
	vols, err := volume.Open(volCfg)
	if err != nil {
		return err
	}
	defer func() {
		if err := vols.Close(); err != nil {
			log.Warn("volumes at shutdown", "err", err)
		}
	}()

	b, err := c.newBackend(log)
	if err != nil {
		return err
	}
	defer b.Close()
	// What a crashed predecessor left: its sandboxes died with it, their
	// cgroups and mounts did not.
	if swept, err := b.Sweep(); err != nil {
		return fmt.Errorf("remove what an earlier server left: %w", err)
	} else if len(swept) > 0 {
		log.Warn("removed sandboxes an earlier server left behind", "count", len(swept), "ids", swept)
	}
	if nb, ok := nativeOf(b); ok {
		if !nb.CPUShares() {
			log.Warn("no cpu cgroup controller: a sandbox running many processes gets more CPU than its share, " +
				"and a key running many sandboxes more than its share")
		}
		c.warnMemoryCeilings(nb, log)
		if c.zygote {
			log.Info("starting the zygote", "preload", c.preload)
			if err := nb.Warm(context.Background()); err != nil {
				return err
			}
		}
	}
	warm := pool.New(pool.Config{Backend: b, Max: c.pool, Min: 1, Idle: c.poolIdle, Configs: c.poolConfigs, Logger: log})
	defer warm.Close()

	var auth httpapi.Authenticator
	var keyring *store.Keyring
	// A node of a cluster: the cluster's view of its nodes (their
	// sandboxes count against a key's quota) and, without --dev, its keys.
	clusterCtx, leave := context.WithCancel(context.Background())
	defer leave()
	var node *clusterNode
	if c.cluster.enabled {
		if node, err = c.cluster.join(clusterCtx, log, !c.dev); err != nil {
			return err
		}
	}
	if c.dev {
		log.Warn("DEVELOPMENT MODE: no API keys; anyone who can reach " + c.listen + " can run code. Never expose this port.")
	} else if node != nil {
		auth = node.keys
		log.Info("cluster: API keys are the cluster's (Secrets of its namespace)", "keys", len(node.keys.List()))
	} else {
		keyring = store.NewKeyring(st, 2*time.Second)
		auth = keyring
		if n, err := st.CountKeys(context.Background()); err != nil {
			return err
		} else if n == 0 {
			log.Warn("no API keys yet: every request will be refused; create one with: vivarium keys create NAME",
				"data_dir", c.dataDir)
		}
	}
	audit := store.NewAuditLog(st, log, c.audit.options())
	defer audit.Close()
	network, err := c.net.config(c.listen, log)
	if err != nil {
		return err
	}
	if network.Policy != nil {
		for _, name := range b.Names() {
			if sandbox.EgressSupportedBy(b, name) != nil {
				log.Warn("sandboxes of this backend cannot have network access: asking for it is refused", "backend", name)
			}
		}
		log.Info("network policy", "allow", c.net.allow.String(), "packages", c.net.packages.String())
	}

	images, err := openImages(c.dataDir)
	if err != nil {
		return err
	}
	builds, err := c.templates.buildConfig(c.dataDir, images, b, c.maxLimits())
	if err != nil {
		return err
	}
	shared, err := c.templates.registry()
	if err != nil {
		return err
	}
	svcCfg := service.Config{
		Images:                images,
		Registry:              shared,
		Builds:                builds,
		Backend:               warm,
		Backends:              b.Names(),
		Pool:                  warm,
		MaxLimits:             c.maxLimits(),
		DefaultIdle:           c.idle,
		MaxIdle:               c.maxIdle,
		DefaultLifetime:       c.lifetime,
		MaxLifetime:           c.maxLifetime,
		MaxPaused:             c.maxPaused,
		MaxPerOwner:           c.maxSandboxesPerKey,
		MaxTotal:              c.maxSandboxes,
		MaxExecutionsPerOwner: c.maxExecutionsPerKey,
		MaxExecutions:         c.maxExecutions,
		Audit:                 audit.Record,
		Logger:                log,
		Network:               network,
		Tenants:               c.tenants,
		Volumes:               vols,
	}
	if nb, ok := nativeOf(b); ok && !c.noCgroups {
		// The native sandboxes' ceilings, read from their cgroup parent:
		// a new sandbox that does not fit is refused, not made to push
		// running ones into the OOM killer.
		if cg, err := cgroups.Detect(c.cgroupParent); err == nil {
			svcCfg.MemoryHeld = func(backend, tenant string) (int64, int64, error) {
				if backend != nb.Name() {
					return 0, 0, nil
				}
				return cgroups.MemoryHeld(cg, tenant)
			}
		}
	}
	if keyring != nil {
		svcCfg.Quota, svcCfg.KeyRevoked = keyring.Quota, keyring.Revoked
	}
	if node != nil {
		svcCfg.Node = c.cluster.node
		svcCfg.Elsewhere = node.elsewhere
		svcCfg.RunningElsewhere = node.runningElsewhere
		svcCfg.Audit = auditToLog(log, c.cluster.node, audit)
		if node.keys != nil {
			svcCfg.Quota, svcCfg.KeyRevoked = node.keys.Quota, node.keys.Revoked
		}
	}
	svcCfg.PauseOnShutdown = c.pauseOnShutdown
	svcCfg.SnapshotDir = filepath.Join(c.dataDir, "snapshots")
	svcCfg.PausedDir = filepath.Join(c.dataDir, "paused")
	svcCfg.MaxSnapshots, svcCfg.MaxSnapshotBytes = c.maxSnapshots, int64(c.maxSnapshotBytes)
	if svcCfg.SnapshotKey, err = snapshot.LoadKey(cmp.Or(c.snapshotKeyFile, filepath.Join(c.dataDir, "snapshot.key"))); err != nil {
		return fmt.Errorf("the snapshot key: %w", err)
	}
	svc := service.New(svcCfg)
	svc.Metrics().SetAuditStats(audit.Stats)
	api := httpapi.New(svc, auth, log)
	api.SetPortDomain(c.domain)
	// What most requests ask for: sandboxes with the default limits. With
	// --tenant-share a key's sandboxes are made in its own group, so its
	// pools fill on its first request; only the one owner of --dev is
	// known now.
	if c.dev || !c.tenants {
		owner := ""
		if c.dev {
			owner = httpapi.DevOwner
		}
		warm.Prewarm(svc.DefaultSpec(owner, true), 2)
		warm.Prewarm(svc.DefaultSpec(owner, false), 2)
	}
	go reportPoolAtRest(warm, log)

	ln, err := net.Listen("tcp", c.listen)
	if err != nil {
		svc.Close()
		return err
	}
	handler, closeMCP := withMCP(api, svc, auth, log, svcCfg.Node)
	_, criuErr := criu.Usable()
	handler, e2bServer := withE2B(handler, svc, auth, log, c.domain, c.e2bPausable && criuErr == nil, c.cluster.enabled)
	// Sandboxes' own hosts first: each is an origin of its own.
	handler = withPorts(httpapi.RefuseBrowsers(handler, c.allowOrigins), svc, e2bServer, c.domain, log)
	handler = httpapi.CheckHost(handler, c.allowHostNames(), c.domain)
	if c.cluster.enabled {
		handler = requireToken(handler, c.clusterToken)
	}
	handler = httpapi.IdleBodies(handler, httpapi.BodyIdleTimeout)
	srv := &http.Server{
		Handler:           handler,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelDebug),
	}
	srv.RegisterOnShutdown(closeMCP)
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(ln) }()
	attrs := []any{"addr", ln.Addr().String(), "data_dir", c.dataDir, "dev", c.dev, "backends", strings.Join(b.Names(), ","),
		"tenant_share", c.tenants, "io_limit", c.io.String(), "max_memory_total", c.memoryTotal.String(),
		"max_memory_per_key", c.memoryPerKey.String()}
	if nb, ok := nativeOf(b); ok {
		attrs = append(attrs, "cgroup_version", nb.CgroupVersion())
	}
	log.Info("vivarium serving", attrs...)
	if node != nil {
		if err := node.announce(clusterCtx, log, ln, svc); err != nil {
			srv.Close()
			svc.Close()
			return err
		}
	}

	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGTERM, os.Interrupt)
	defer signal.Stop(sigs)
	select {
	case err := <-serveErr:
		svc.Close()
		return err
	case sig := <-sigs:
		log.Info("shutting down", "signal", sig.String(), "grace", c.grace)
	}

	// A node leaves routing first: its Lease is removed.
	leave()
	// Stop accepting; let executions finish within the grace period, then
	// interrupt them; destroy every sandbox. A second signal cuts the wait.
	ctx, cancel := context.WithTimeout(context.Background(), c.grace)
	defer cancel()
	go func() {
		select {
		case <-sigs:
			log.Warn("second signal: not waiting any longer")
			cancel()
		case <-ctx.Done():
		}
	}()
	httpDone := make(chan struct{})
	go func() {
		// Requests in flight (streams included) end when their executions
		// do, which Shutdown below brings about.
		srv.Shutdown(context.Background())
		close(httpDone)
	}()
	err = svc.Shutdown(ctx)
	select {
	case <-httpDone:
	case <-time.After(5 * time.Second):
		srv.Close()
	}
	log.Info("stopped", "sandboxes_left", svc.Live())
	return err
}

// warnMemoryCeilings says where the bounds on sandboxes' memory together
// (--max-memory-total, --max-memory-per-key) do not hold, or hold less
// than a sandbox may ask for.
func (c *serveConfig) warnMemoryCeilings(nb *native.Backend, log *slog.Logger) {
	total, perKey, ok := nb.MemoryCeilings()
	switch {
	case !ok:
		log.Warn("no cgroups: no memory bound on all sandboxes together or per key; memory a sandbox hands to another " +
			"before it ends (a memfd, over a socket on a shared volume) is bounded by nothing but the host's")
		return
	case c.tenants && perKey == 0:
		log.Warn("--max-memory-per-key 0: no memory bound per key; a key's sandboxes may together hold up to --max-memory-total")
	case !c.tenants && c.memoryPerKey > 0:
		log.Warn("--tenant-share=false: --max-memory-per-key does not apply (a key's sandboxes have no group of their own); " +
			"one key's sandboxes may together hold up to --max-memory-total")
	}
	if total == 0 {
		log.Warn("--max-memory-total 0: no memory bound on all sandboxes together; they may take the host's memory")
	}
	for _, l := range []struct {
		name  string
		bytes int64
	}{{"--max-memory-total", total}, {"--max-memory-per-key", perKey}} {
		if l.bytes > 0 && l.bytes < int64(c.memory) {
			log.Warn(l.name+" is below --max-memory: a sandbox given the largest memory limit is stopped at the smaller bound first",
				"bound", formatSize(l.bytes), "max_memory", c.memory.String())
		}
	}
}

// lockParent takes an exclusive lock that names the cgroup parent, held
// for the life of the process; the kernel releases it however the process
// ends.
func lockParent(parent string) (func(), error) {
	dir := "/run/vivarium"
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	name := filepath.Join(dir, strings.ReplaceAll(parent, "/", "_")+".lock")
	f, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		return nil, fmt.Errorf("another vivarium server uses the cgroup parent %q (lock %s); give this one its own with --cgroup-parent", parent, name)
	}
	return func() { f.Close() }, nil
}
