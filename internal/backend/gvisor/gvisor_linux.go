// Package gvisor runs sandboxes under gVisor (runsc): a user-space kernel
// between the code and the host's, so that a kernel bug reachable through
// the system calls the code makes is gVisor's to contain. Each sandbox is an
// OCI bundle Vivarium writes (the same root file system view as the native
// backend: the host's /usr read-only, a synthetic /etc, the runner), started
// with `runsc run`, no network (a sandbox's proxy is reached through the
// agent), in a cgroup of Vivarium's; Vivarium's agent runs inside (see
// internal/backend/container).
package gvisor

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/agent"
	"github.com/vivarium-sandbox/vivarium/internal/backend/container"
	"github.com/vivarium-sandbox/vivarium/internal/cgroups"
	"github.com/vivarium-sandbox/vivarium/internal/rootview"
	"github.com/vivarium-sandbox/vivarium/internal/runner"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

// Config configures the gVisor backend.
type Config struct {
	// Runsc is the runsc binary; default: runsc in PATH.
	Runsc string
	// Platform is runsc's platform ("systrap", "kvm", "ptrace"); default:
	// the first in PlatformOrder that starts a sandbox here. Either way a
	// sandbox is started with it before New returns.
	Platform string
	// ProbeTimeout bounds the start of the sandbox that tries a platform;
	// default DefaultProbeTimeout.
	ProbeTimeout time.Duration
	// StateDir holds runsc's state, the bundles and the workspaces;
	// default /run/vivarium/gvisor/CGROUP-PARENT (one per server, as the
	// cgroup parent is).
	StateDir string
	// CgroupParent is the group sandboxes are created under.
	CgroupParent string
	// CheckpointDir holds paused sandboxes' checkpoints (runsc's images
	// of their memory), a directory each, removed when the sandbox
	// resumes or closes; default:
	// sandbox.DefaultCheckpointDir(CgroupParent), on disk.
	CheckpointDir string
	// Exe is the program bound into each sandbox as the agent;
	// default: the one vivarium carries for it (sandbox.Program), else
	// this binary.
	Exe    string
	Logger *slog.Logger
}

// Backend is the gvisor backend: container sandboxes whose runtime is
// runsc, on the platform New found to work.
type Backend struct {
	*container.Backend
	platform Choice
}

// Platform is the runsc platform the backend's sandboxes use, and how it
// was chosen.
func (b *Backend) Platform() Choice { return b.platform }

// New checks that the host can run gVisor sandboxes, finds a platform that
// starts one (see PlatformOrder), and returns a backend.
func New(cfg Config) (*Backend, error) {
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("%w: the gvisor backend needs root (runsc makes the sandbox's namespaces and cgroup)", sandbox.ErrUnsupported)
	}
	if cfg.Runsc == "" {
		cfg.Runsc = "runsc"
	}
	p, err := exec.LookPath(cfg.Runsc)
	if err != nil {
		return nil, fmt.Errorf("%w: runsc (gVisor) is not installed: apt install runsc (%v)", sandbox.ErrUnsupported, err)
	}
	cfg.Runsc = p
	if cfg.CgroupParent == "" {
		cfg.CgroupParent = "vivarium-gvisor"
	}
	if cfg.StateDir == "" {
		cfg.StateDir = filepath.Join("/run/vivarium/gvisor", strings.ReplaceAll(cfg.CgroupParent, "/", "_"))
	}
	if cfg.CheckpointDir == "" {
		cfg.CheckpointDir = sandbox.DefaultCheckpointDir(cfg.CgroupParent)
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
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	cg, err := cgroups.Detect(cfg.CgroupParent)
	if err != nil {
		return nil, fmt.Errorf("%w: %v (the gvisor backend limits memory and processes with cgroups)", sandbox.ErrUnsupported, err)
	}
	rt := &Runtime{cfg: cfg, cgroupParent: cfg.CgroupParent, cgroups: cg}
	if err := rt.prepare(); err != nil {
		return nil, fmt.Errorf("%w: gvisor: %v", sandbox.ErrSetup, err)
	}
	choice, err := rt.selectPlatform(context.Background())
	if err != nil {
		rt.Close()
		return nil, err
	}
	rt.cfg.Platform = choice.Platform
	cfg.Logger.Info("gvisor: platform " + choice.String())
	b, err := container.New(container.Config{
		Runtime: rt, StateDir: filepath.Join(cfg.StateDir, "sandboxes"), Cgroups: cg,
		UID: container.SandboxUID, GID: container.SandboxGID, Logger: cfg.Logger,
		HostPids: hostPids, CheckpointDir: cfg.CheckpointDir,
		// The agent carries the proxy's connections; the sandbox's own
		// stack stays --network=none.
		Egress: true,
	})
	if err != nil {
		rt.Close()
		return nil, err
	}
	return &Backend{Backend: b, platform: choice}, nil
}

// hostPids is the pids limit of a sandbox's cgroup: gVisor's kernel is
// host threads, and with the ptrace platform a host process per address
// space of the sandbox; the host's limit leaves it room, the code's own is
// RLIMIT_NPROC inside.
func hostPids(pids int) int64 { return int64(512 + 4*pids) }

// Runtime starts sandboxes with runsc.
type Runtime struct {
	cfg          Config
	cgroupParent string
	cgroups      cgroups.Manager
	root         string // the shared root skeleton
	// lingering counts the removals of sandboxes' cgroup directories
	// that are tried again later (RemoveCgroups).
	lingering sync.WaitGroup
	// cpMu guards whether checkpoints were probed (checkpointWorks) and
	// the probe's failure.
	cpMu     sync.Mutex
	cpProbed time.Time
	cpErr    error
	// templates are the templates' roots its sandboxes use
	// (template_linux.go).
	templates templateRoots
	// kind is ImageKind's answer, once found (under cpMu).
	kind string
}

// Name implements container.Runtime.
func (r *Runtime) Name() string { return "gvisor" }

// prepare writes the root skeleton every bundle shares.
func (r *Runtime) prepare() error {
	if err := os.MkdirAll(r.cfg.StateDir, 0o700); err != nil {
		return err
	}
	root, err := os.MkdirTemp(r.cfg.StateDir, "root-")
	if err != nil {
		return err
	}
	// The sandbox user must traverse its root; host users cannot reach it
	// (the state directory is root's alone).
	if err := os.Chmod(root, 0o755); err != nil {
		return err
	}
	// A new skeleton per process: the host's /etc may have changed, and
	// an old one may belong to a server still running.
	// With the runner's bytecode the host's python3 compiled
	// (runner.Bytecode): a sandbox's interpreter is the host's, and loads
	// it instead of compiling the runner at its start.
	files := runner.Files()
	if pycs, err := runner.Bytecode(context.Background(), sandbox.DefaultPython, rootview.RunnerDir, sandbox.ProgramDir); err == nil {
		maps.Copy(files, pycs)
	} else {
		r.cfg.Logger.Warn("gvisor: no compiled runner; each sandbox compiles it at its start", "err", err)
	}
	if err := rootview.RootSkeleton(root, files); err != nil {
		os.RemoveAll(root)
		return err
	}
	r.root = root
	return nil
}

// Sweep ends and deletes the containers a crashed supervisor left in
// runsc's state (its sandboxes' processes are gone with their cgroups,
// which the backend sweeps too).
func (r *Runtime) Sweep() ([]string, error) {
	out, err := exec.Command(r.cfg.Runsc, append(r.globalArgs(), "list", "-quiet")...).Output()
	if err != nil {
		return nil, fmt.Errorf("runsc list: %w", err)
	}
	var ids []string
	var errs []error
	for _, id := range strings.Fields(string(out)) {
		if !strings.HasPrefix(id, "vivarium-") {
			continue
		}
		c := &sandboxContainer{r: r, id: id}
		if err := c.Remove(); err != nil {
			errs = append(errs, err)
			continue
		}
		ids = append(ids, id)
	}
	// And its root skeleton, and what a platform probe it did not see
	// to the end left (the probe's processes were in a cgroup of the
	// parent, which the backend has swept).
	templates, _ := filepath.Glob(filepath.Join(r.cfg.StateDir, "template-*"))
	for _, dir := range templates {
		errs = append(errs, unmountTemplateRoot(dir))
	}
	roots, _ := filepath.Glob(filepath.Join(r.cfg.StateDir, "root-*"))
	probes, _ := filepath.Glob(filepath.Join(r.cfg.StateDir, "probe-*"))
	for _, dir := range append(roots, probes...) {
		if dir != r.root {
			errs = append(errs, os.RemoveAll(dir))
		}
	}
	for _, dir := range probes {
		removeCgroupDirs(filepath.Join(r.cgroupParent, filepath.Base(dir)))
	}
	return ids, errors.Join(errs...)
}

// Close removes the root skeleton.
func (r *Runtime) Close() error {
	r.lingering.Wait()
	return errors.Join(r.closeTemplates(), os.RemoveAll(r.root))
}

type mount struct {
	Destination string   `json:"destination"`
	Type        string   `json:"type"`
	Source      string   `json:"source"`
	Options     []string `json:"options,omitempty"`
}

// spec is the OCI runtime specification of one sandbox; root is its
// root (r.root, or a template's: bundleRoot).
func (r *Runtime) spec(l container.Launch, root string) map[string]any {
	ro := func(src, dst string) mount {
		return mount{Destination: dst, Type: "bind", Source: src, Options: []string{"rbind", "ro", "nosuid", "nodev"}}
	}
	rw := func(src, dst string) mount {
		return mount{Destination: dst, Type: "bind", Source: src, Options: []string{"rbind", "rw", "nosuid", "nodev"}}
	}
	var mounts []mount
	if l.Spec.Root == nil {
		mounts = append(mounts, ro("/usr", "/usr"), ro(filepath.Join(r.root, "etc"), "/etc"))
		for _, d := range rootview.TopLevelBinds() {
			mounts = append(mounts, ro(d, d))
		}
	} else {
		for _, f := range templateMountFiles {
			mounts = append(mounts, ro(filepath.Join(r.root, f), "/"+f))
		}
	}
	mounts = append(mounts,
		ro(filepath.Join(r.root, "opt/vivarium"), container.RunnerDir),
		ro(r.cfg.Exe, container.RunnerDir+"/bin/"+agent.Arg0),
		rw(l.Disk.Workspace, "/workspace"),
		rw(l.Disk.Tmp, "/tmp"),
		rw(l.Disk.Shm, "/dev/shm"),
		mount{Destination: "/proc", Type: "proc", Source: "proc"},
		// gVisor's /sys is its own, but the code has no use for it: an
		// empty read-only directory, as in the native backend.
		mount{Destination: "/sys", Type: "tmpfs", Source: "none", Options: []string{"ro", "nosuid", "nodev", "noexec", "size=4k", "mode=0555"}},
	)
	none := []string{}
	spec := map[string]any{
		"ociVersion": "1.0.2",
		"process": map[string]any{
			"terminal": false,
			"user":     map[string]any{"uid": 0, "gid": 0},
			"args":     []string{agent.Arg0},
			"env":      []string{"PATH=" + container.RunnerDir + "/bin"},
			"cwd":      "/",
			// The agent needs to become the sandbox user and to signal it.
			"capabilities": map[string]any{
				"bounding":    []string{"CAP_SETUID", "CAP_SETGID", "CAP_SETPCAP", "CAP_KILL"},
				"effective":   []string{"CAP_SETUID", "CAP_SETGID", "CAP_SETPCAP", "CAP_KILL"},
				"permitted":   []string{"CAP_SETUID", "CAP_SETGID", "CAP_SETPCAP", "CAP_KILL"},
				"inheritable": none, "ambient": none,
			},
			"noNewPrivileges": true,
			"rlimits":         []map[string]any{{"type": "RLIMIT_NOFILE", "hard": l.Spec.Limits.OpenFiles, "soft": l.Spec.Limits.OpenFiles}},
		},
		"root":     map[string]any{"path": root, "readonly": true},
		"hostname": rootview.Hostname,
		"mounts":   mounts,
		"linux": map[string]any{
			"namespaces": []map[string]string{{"type": "pid"}, {"type": "network"}, {"type": "ipc"},
				{"type": "uts"}, {"type": "mount"}},
		},
	}
	if l.Cgroup != nil {
		spec["linux"].(map[string]any)["cgroupsPath"] = l.Cgroup.Path()
	}
	return spec
}

// Launch implements container.Runtime.
func (r *Runtime) Launch(ctx context.Context, l container.Launch) (container.Container, error) {
	bundle, err := r.writeBundle(l)
	if err != nil {
		return nil, err
	}
	c := &sandboxContainer{r: r, id: "vivarium-" + l.ID, bundle: bundle, done: make(chan struct{}), cg: l.Cgroup}
	if err := c.start("run", "--bundle", bundle, c.id); err != nil {
		return nil, err
	}
	return c, nil
}

// writeBundle writes the sandbox's OCI bundle beside its disk, and
// returns its directory.
func (r *Runtime) writeBundle(l container.Launch) (string, error) {
	bundle := filepath.Join(filepath.Dir(l.Disk.Dir), "bundle")
	// A sandbox whose container died gets a new one: a new bundle too.
	if err := os.RemoveAll(bundle); err != nil {
		return "", err
	}
	if err := os.Mkdir(bundle, 0o700); err != nil {
		return "", err
	}
	root, err := r.bundleRoot(l)
	if err != nil {
		return "", err
	}
	b, err := json.Marshal(r.spec(l, root))
	if err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), b, 0o600); err != nil {
		return "", err
	}
	return bundle, nil
}

// bundleRoot is the root of l's bundle: the skeleton, or its template's.
func (r *Runtime) bundleRoot(l container.Launch) (string, error) {
	if l.Spec.Root == nil {
		return r.root, nil
	}
	return r.templateRoot(l.Spec.Root)
}

// start runs the runsc command that is the container (run, restore): the
// container's standard input and output are its, its end the container's.
func (c *sandboxContainer) start(args ...string) error {
	cmd := exec.Command(c.r.cfg.Runsc, append(c.r.globalArgs(), args...)...)
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	cmd.Stderr = &c.log
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("runsc %s: %w", args[0], err)
	}
	c.cmd, c.stdin, c.stdout = cmd, stdin, stdout
	go func() {
		cmd.Wait()
		close(c.done)
	}()
	return nil
}

func (r *Runtime) globalArgs() []string {
	return runscArgs(filepath.Join(r.cfg.StateDir, "runsc"), r.cfg.Platform)
}

// runscArgs are the flags of every runsc command on a sandbox: its state
// directory, no network, the platform.
func runscArgs(root, platform string) []string {
	return []string{"--root", root, "--network=none", "--platform=" + platform}
}

// sandboxContainer is one `runsc run` (or `runsc restore`).
type sandboxContainer struct {
	r      *Runtime
	id     string
	bundle string
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stdout io.Reader
	done   chan struct{}
	cg     cgroups.Group
	log    lockedBuffer
	// restoredAs: started from a checkpoint of another container id
	// (RestoreAs), or restored in place from such a container (Restore).
	restoredAs bool
}

func (c *sandboxContainer) Stdin() io.WriteCloser { return c.stdin }
func (c *sandboxContainer) Stdout() io.Reader     { return c.stdout }
func (c *sandboxContainer) Done() <-chan struct{} { return c.done }

// Stats: the container's cgroup is the backend's, which it reads itself.
func (c *sandboxContainer) Stats() (cgroups.Stats, bool) { return cgroups.Stats{}, false }

// Kill ends the sandbox: runsc kills every process of the container; the
// cgroup, which holds gVisor's own processes, is the second net (its
// Destroy kills whatever is left).
func (c *sandboxContainer) Kill() error {
	select {
	case <-c.done:
		return nil
	default:
	}
	cmd := exec.Command(c.r.cfg.Runsc, append(c.r.globalArgs(), "kill", "--all", c.id, "KILL")...)
	err := cmd.Run()
	if c.restoredAs {
		// Restored under an id of its own (RestoreAs), its processes are
		// still the saved container's to gVisor's kernel, and kill --all
		// finds none of them (measured: the sandbox ran on). The end of
		// its init, the root container's, ends the sandbox.
		err = errors.Join(err, exec.Command(c.r.cfg.Runsc, append(c.r.globalArgs(), "kill", c.id, "KILL")...).Run())
	}
	select {
	case <-c.done:
		return nil
	case <-time.After(5 * time.Second):
	}
	// runsc could not: its processes are in the sandbox's cgroup.
	if c.cg != nil {
		c.cg.Destroy()
	}
	c.cmd.Process.Kill()
	return err
}

// RemoveCgroups implements container.CgroupCleaner: runsc makes the
// container's cgroup path in every hierarchy mounted (cpuset, devices and
// systemd's too on cgroup v1), and a delete that ran while gVisor's last
// processes were going leaves them behind.
func (c *sandboxContainer) RemoveCgroups() {
	if c.cg != nil {
		c.r.removeCgroups(c.cg.Path())
	}
}

// removeCgroups removes the group rel's directories in every hierarchy
// now, and again in the background for a few seconds: seen with Debian
// 12's runsc on cgroup v1 under load (two cores, a load average of 3 to
// 4), an empty cpuset, devices and systemd directory of the group is made
// again up to half a second after it was removed, once every process of
// the sandbox is gone (a never-paused sandbox's too, and a platform
// probe's); which process makes it was not found. The runtime's Close
// waits for these.
func (r *Runtime) removeCgroups(rel string) {
	removeCgroupDirs(rel)
	r.lingering.Add(1)
	go func() {
		defer r.lingering.Done()
		for _, d := range []time.Duration{500 * time.Millisecond, time.Second, 2 * time.Second} {
			time.Sleep(d)
			removeCgroupDirs(rel)
		}
	}()
}

// Remove deletes runsc's state of the container.
func (c *sandboxContainer) Remove() error {
	out, err := exec.Command(c.r.cfg.Runsc, append(c.r.globalArgs(), "delete", "--force", c.id)...).CombinedOutput()
	if err != nil && !bytes.Contains(out, []byte("does not exist")) && !bytes.Contains(out, []byte("not exist")) {
		return fmt.Errorf("runsc delete: %v: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.b.Len() < 64<<10 {
		l.b.Write(p)
	}
	return len(p), nil
}

// Check reports whether this host can run gVisor sandboxes.
func Check() error {
	if _, err := exec.LookPath("runsc"); err != nil {
		return errors.New("runsc is not installed (apt install runsc)")
	}
	if os.Geteuid() != 0 {
		return errors.New("the gvisor backend needs root")
	}
	return nil
}
