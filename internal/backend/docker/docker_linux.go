// Package docker runs sandboxes as containers of a Docker Engine, driven
// through its API on the daemon's unix socket: for hosts where teams
// already run Docker, optionally with gVisor (runsc) as the daemon's OCI
// runtime. Vivarium's agent (internal/agent) is each container's PID 1 and
// runs the Python runner and commands inside (see internal/backend/container).
//
// Each container has no network, a read-only root from a near-empty image
// (see imageTar) and the same file system view as the native backend,
// read-only overlays of the host's mounted for it alone (see view), and a
// /proc that hides what the native backend's hides (see proc_linux.go);
// the sandbox's disk (/workspace, /tmp, /dev/shm) is one size-limited
// tmpfs of Vivarium's; all capabilities dropped but the four the agent
// needs to become the sandbox user, no-new-privileges, Docker's seccomp
// profile and Vivarium's own filter inside; memory (without swap), process
// and CPU limits; small per-user rlimits and IPC namespace limits (see
// request); no log driver. Vivarium owns each container's life, not a `docker` client
// process: it kills the container's PID 1 itself (through a pidfd) and
// removes the container; containers carry labels by which a later start
// sweeps what a crashed one left.
//
// Under runc every sandbox is a host user of its own: a range of a
// hostuid pool per sandbox, whose id 1000 (Config.UIDBase+k*65536+1000)
// the agent becomes. Docker's containers are in the host's user
// namespace, so the kernel's per-user budgets (inotify instances and
// watches, pipe buffers, descriptors in flight, queued signals,
// message-queue bytes, locked memory, processes) are the host's per-user
// limits, each sandbox's alone. Under gVisor (runsc) the users are its
// kernel's own.
//
// The daemon must run on this host, in this mount namespace, with the
// sandbox user's uid being the host's (no userns-remap, not rootless).
package docker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/backend/container"
	"github.com/vivarium-sandbox/vivarium/internal/cgroups"
	"github.com/vivarium-sandbox/vivarium/internal/hostuid"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

// Config configures the docker backend.
type Config struct {
	// Host is the daemon's address, unix:///PATH or a socket's path;
	// default $DOCKER_HOST, else unix:///var/run/docker.sock.
	Host string
	// Runtime is the daemon's OCI runtime for the containers ("runsc" to
	// run them under gVisor); default: the daemon's default (runc).
	Runtime string
	// Name tells this server's containers from others': the prefix of
	// their names, their vivarium.owner label, their cgroup parent (with
	// the cgroupfs driver) and the state directory's name. Default
	// "vivarium-docker".
	Name string
	// StateDir holds the root view and the sandboxes' disks; default
	// /run/vivarium/NAME without its "vivarium-" prefix.
	StateDir string
	// Exe is the program bound into each container as the agent;
	// default: the one vivarium carries for it (sandbox.Program), else
	// this binary.
	Exe string
	// UIDBase is the first host uid of the pool the sandboxes' users come
	// from, a range of hostuid.RangeSize ids per sandbox (of which the
	// sandbox user is id 1000: the pool and its lock file are shared with
	// the native backend, whose sandboxes use whole ranges); UIDRanges is
	// how many sandboxes can exist at once. Defaults DefaultUIDBase and
	// DefaultUIDRanges. Every id must belong to nobody on the host.
	UIDBase   uint32
	UIDRanges int
	Logger    *slog.Logger
}

// DefaultUIDBase is the docker backend's default pool, apart from the
// native backend's (native.DefaultUIDBase, 1e9, and its ranges above it),
// so that the two never wait on each other's ranges and a host uid tells
// which backend it is; and below 2^31, where programs that keep a uid in a
// signed int (or print it) go wrong. DefaultUIDRanges ranges (a server's
// default --max-sandboxes, 1000, with room) end at 2,067,108,863.
const (
	DefaultUIDBase   = 2_000_000_000
	DefaultUIDRanges = 1024
)

// Labels on every container.
const (
	labelSandbox = "vivarium.sandbox" // the sandbox's ID
	labelOwner   = "vivarium.owner"   // Config.Name
)

// agentTasks is room in a container's pids limit for the agent's own
// threads (the Go runtime's, 8 to 10 with GOMAXPROCS=2), which the pids
// cgroup counts with the code's: the code may start a few more than its
// limit, and the agent can still start a thread when the code has taken
// all the rest (a Go runtime that cannot, aborts).
const agentTasks = 12

// New checks that the daemon can run sandboxes, builds the image if the
// daemon lacks it, and returns a backend.
func New(cfg Config) (*container.Backend, error) {
	if cfg.Name == "" {
		cfg.Name = "vivarium-docker"
	}
	if err := validName(cfg.Name); err != nil {
		return nil, err
	}
	if cfg.StateDir == "" {
		cfg.StateDir = filepath.Join("/run/vivarium", strings.TrimPrefix(cfg.Name, "vivarium-"))
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("%w: the docker backend needs root (it mounts each sandbox's disk and its root view)", sandbox.ErrUnsupported)
	}
	if cfg.Exe == "" {
		cfg.Exe = sandbox.Program()
	}
	if cfg.Exe == "" {
		exe, err := os.Executable()
		if err != nil {
			return nil, err
		}
		cfg.Exe = exe
	}
	// The agent is taken from an overlay of its directory (see view): the
	// file itself, not a link.
	exe, err := filepath.EvalSymlinks(cfg.Exe)
	if err != nil {
		return nil, fmt.Errorf("%w: docker: the agent: %v", sandbox.ErrSetup, err)
	}
	cfg.Exe = exe
	for _, p := range []string{cfg.StateDir, filepath.Dir(cfg.Exe)} {
		if err := overlayable(p); err != nil {
			return nil, fmt.Errorf("%w: docker: %v", sandbox.ErrSetup, err)
		}
	}
	if cfg.UIDBase == 0 {
		cfg.UIDBase = DefaultUIDBase
	}
	if cfg.UIDRanges == 0 {
		cfg.UIDRanges = DefaultUIDRanges
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, info, err := connect(ctx, cfg)
	if err != nil {
		return nil, err
	}
	rt := &Runtime{cfg: cfg, c: c, info: info, gvisor: info.isGVisor(cfg.Runtime)}
	if info.CgroupDriver == "cgroupfs" {
		rt.cgroupParent = "/" + cfg.Name
	}
	for _, d := range []string{cfg.StateDir, filepath.Join(cfg.StateDir, viewsDir)} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("%w: docker: %v", sandbox.ErrSetup, err)
		}
	}
	ccfg := container.Config{
		Runtime: rt, StateDir: filepath.Join(cfg.StateDir, "sandboxes"),
		UID: container.SandboxUID, GID: container.SandboxGID, Logger: cfg.Logger,
	}
	// Under runc every sandbox is a host user of its own; under gVisor
	// the sandbox user is its kernel's, uid 1000 in every sandbox.
	if !rt.gvisor {
		pool, err := hostuid.New(hostuid.Config{Base: cfg.UIDBase, Ranges: cfg.UIDRanges})
		if err != nil {
			return nil, fmt.Errorf("%w: docker: %v", sandbox.ErrSetup, err)
		}
		rt.users, ccfg.Users = pool, pool
	}
	root, content, err := newRoot(cfg.StateDir)
	if err != nil {
		rt.closeUsers()
		return nil, fmt.Errorf("%w: docker: the root skeleton: %v", sandbox.ErrSetup, err)
	}
	rt.root, rt.image = root, imageName(content)
	built, err := c.ensureImage(ctx, rt.image, content, nil)
	if built {
		cfg.Logger.Info("built the sandbox image: the daemon did not have it", "image", rt.image)
	}
	if err != nil {
		rt.Close()
		return nil, fmt.Errorf("%w: docker: %v", sandbox.ErrSetup, err)
	}
	b, err := container.New(ccfg)
	if err != nil {
		rt.Close()
		return nil, err
	}
	return b, nil
}

// validName: a name usable in container names, labels and cgroup paths.
func validName(name string) error {
	for _, r := range name {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
			return fmt.Errorf("%w: docker backend name %q: use lower-case letters, digits, - and _", sandbox.ErrInvalidSpec, name)
		}
	}
	if name == "" || name[0] == '-' || name[0] == '_' {
		return fmt.Errorf("%w: docker backend name %q must start with a letter or digit", sandbox.ErrInvalidSpec, name)
	}
	return nil
}

// daemonInfo is what the backend reads of GET /info.
type daemonInfo struct {
	ServerVersion   string
	CgroupDriver    string
	CgroupVersion   string
	SecurityOptions []string
	Runtimes        map[string]struct{ Path string }
	DefaultRuntime  string
	OSType          string
}

// isGVisor reports whether the OCI runtime name (default: the daemon's
// default) is gVisor's runsc.
func (i *daemonInfo) isGVisor(name string) bool {
	if name == "" {
		name = i.DefaultRuntime
	}
	return strings.HasPrefix(filepath.Base(i.Runtimes[name].Path), "runsc")
}

// connect dials the daemon and checks that it can run the backend's
// containers.
func connect(ctx context.Context, cfg Config) (*client, *daemonInfo, error) {
	c, err := dial(ctx, cfg.Host)
	if err != nil {
		return nil, nil, err
	}
	var info daemonInfo
	if err := c.call(ctx, "GET", "/info", nil, nil, &info); err != nil {
		return nil, nil, fmt.Errorf("%w: %v", ErrNoDaemon, err)
	}
	if info.OSType != "" && info.OSType != "linux" {
		return nil, nil, fmt.Errorf("%w: the daemon runs %s containers; the docker backend needs linux", ErrDaemonConfig, info.OSType)
	}
	for _, o := range info.SecurityOptions {
		switch {
		case strings.Contains(o, "name=userns"):
			return nil, nil, fmt.Errorf("%w: the daemon remaps user namespaces (userns-remap): the sandbox's files would not belong to its user; run a daemon without it", ErrDaemonConfig)
		case strings.Contains(o, "name=rootless"):
			return nil, nil, fmt.Errorf("%w: the daemon is rootless: it cannot bind Vivarium's mounts; run a root daemon", ErrDaemonConfig)
		}
	}
	if cfg.Runtime != "" {
		if _, ok := info.Runtimes[cfg.Runtime]; !ok {
			var have []string
			for name := range info.Runtimes {
				have = append(have, name)
			}
			slices.Sort(have)
			return nil, nil, fmt.Errorf("%w: the daemon has no runtime %q (it has %s); register it, e.g. dockerd --add-runtime %s=/usr/bin/%s",
				ErrNoRuntime, cfg.Runtime, strings.Join(have, ", "), cfg.Runtime, cfg.Runtime)
		}
	}
	return c, &info, nil
}

// Runtime starts sandboxes as Docker containers.
type Runtime struct {
	cfg          Config
	c            *client
	info         *daemonInfo
	root         *root
	image        string
	cgroupParent string        // "" with the systemd driver: Docker's default
	gvisor       bool          // the runtime is runsc
	users        *hostuid.Pool // nil under gVisor
}

var _ container.Runtime = (*Runtime)(nil)

// Name implements container.Runtime.
func (r *Runtime) Name() string { return "docker" }

// Image is the image the containers run.
func (r *Runtime) Image() string { return r.image }

// Launch implements container.Runtime: create the container, attach to
// its standard streams and wait for its exit (before it starts, so that
// nothing it writes or does is missed), start it, then hold its PID 1 by a
// pidfd and find its cgroup.
func (r *Runtime) Launch(ctx context.Context, l container.Launch) (_ container.Container, err error) {
	name := r.cfg.Name + "-" + l.ID
	v, err := r.newView(l.ID, l.UID, l.GID, l.Spec.Limits.Memory)
	if err != nil {
		return nil, fmt.Errorf("the container's file system: %w", err)
	}
	var created struct {
		ID       string `json:"Id"`
		Warnings []string
	}
	q := url.Values{"name": {name}}
	if err := r.c.call(ctx, "POST", "/containers/create", q, r.request(l, v), &created); err != nil {
		// Were it created all the same (an answer lost), it never
		// starts: the next Sweep removes it.
		v.close()
		return nil, fmt.Errorf("create the container: %w", err)
	}
	for _, w := range created.Warnings {
		r.cfg.Logger.Warn("docker", "warning", w, "sandbox", l.ID)
	}
	c := &sandboxContainer{r: r, id: created.ID, sandbox: l.ID, view: v, done: make(chan struct{}), pidfd: -1,
		memory: l.Spec.Limits.Memory}
	defer func() {
		if err != nil {
			c.Kill()
			if rerr := c.Remove(); rerr != nil {
				err = fmt.Errorf("%w (%w: %v)", err, container.ErrLeftBehind, rerr)
			}
		}
	}()
	conn, out, err := r.c.hijack(ctx, "/containers/"+c.id+"/attach",
		url.Values{"stream": {"1"}, "stdin": {"1"}, "stdout": {"1"}, "stderr": {"1"}})
	if err != nil {
		return nil, fmt.Errorf("attach to the container: %w", err)
	}
	c.conn, c.out = conn, &demux{r: out}
	wait, err := r.c.send(context.WithoutCancel(ctx), "POST", "/containers/"+c.id+"/wait",
		url.Values{"condition": {"next-exit"}}, nil)
	if err != nil {
		return nil, fmt.Errorf("wait for the container: %w", err)
	}
	go c.waitExit(wait.Body)
	if err := r.c.call(ctx, "POST", "/containers/"+c.id+"/start", nil, nil, nil); err != nil {
		return nil, fmt.Errorf("start the container: %w", err)
	}
	if err := c.hold(ctx); err != nil {
		return nil, err
	}
	return c, nil
}

// Sweep removes the containers of this backend's name that a crashed
// supervisor left, running or not, then their views and the root
// skeletons it left, and the images of an older layout that no container
// uses.
func (r *Runtime) Sweep() ([]string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var list []struct {
		ID    string `json:"Id"`
		Names []string
	}
	q := url.Values{"all": {"1"}, "filters": {`{"label":["` + labelOwner + `=` + r.cfg.Name + `"]}`}}
	if err := r.c.call(ctx, "GET", "/containers/json", q, nil, &list); err != nil {
		return nil, fmt.Errorf("list the containers: %w", err)
	}
	var names []string
	var errs []error
	for _, ct := range list {
		err := r.c.call(ctx, "DELETE", "/containers/"+ct.ID, url.Values{"force": {"1"}, "v": {"1"}}, nil, nil)
		if err != nil && statusOf(err) != 404 {
			errs = append(errs, err)
			continue
		}
		names = append(names, strings.TrimPrefix(strings.Join(ct.Names, ","), "/"))
	}
	errs = append(errs, sweepViews(r.cfg.StateDir), sweepRoots(r.cfg.StateDir, r.root.dir))
	if old, err := r.c.oldImages(ctx, r.image); err == nil {
		for _, img := range old {
			// In use by another server's containers: 409, and it stays.
			if err := r.c.call(ctx, "DELETE", "/images/"+img, nil, nil, nil); err == nil {
				names = append(names, img)
			}
		}
	}
	return names, errors.Join(errs...)
}

// Close removes the root skeleton and the cgroup parent Docker made for
// the containers, and closes the host uid pool (the sandboxes must be
// closed first).
func (r *Runtime) Close() error {
	var err error
	if r.root != nil {
		err = r.root.close()
	}
	if r.cgroupParent != "" {
		err = errors.Join(err, cgroups.RemoveEmpty(r.cfg.Name))
	}
	r.closeUsers()
	r.c.http.CloseIdleConnections()
	return err
}

func (r *Runtime) closeUsers() {
	if r.users != nil {
		r.users.Close()
	}
}

// Containers lists the IDs of the containers of the daemon at host whose
// owner is name (Config.Name), running or not: what a backend of that
// name left, for tests and tools to check.
func Containers(host, name string) ([]string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := dial(ctx, host)
	if err != nil {
		return nil, err
	}
	defer c.http.CloseIdleConnections()
	var list []struct {
		ID string `json:"Id"`
	}
	q := url.Values{"all": {"1"}, "filters": {`{"label":["` + labelOwner + `=` + name + `"]}`}}
	if err := c.call(ctx, "GET", "/containers/json", q, nil, &list); err != nil {
		return nil, err
	}
	var ids []string
	for _, ct := range list {
		ids = append(ids, ct.ID)
	}
	return ids, nil
}

// Check reports whether this host can run docker sandboxes: a daemon
// answers at host (see Config.Host) and suits the backend, with the OCI
// runtime named, if any. It describes the daemon.
func Check(host, runtime string) (string, error) {
	if os.Geteuid() != 0 {
		return "", errors.New("the docker backend needs root")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, info, err := connect(ctx, Config{Host: host, Runtime: runtime})
	if err != nil {
		if _, lerr := exec.LookPath("dockerd"); lerr != nil && errors.Is(err, ErrNoDaemon) {
			return "", fmt.Errorf("Docker is not installed (apt install docker.io): %w", err)
		}
		return "", err
	}
	c.http.CloseIdleConnections()
	return fmt.Sprintf("Docker %s at %s, API %s, %s cgroup driver", info.ServerVersion, c.socket, c.version, info.CgroupDriver), nil
}
