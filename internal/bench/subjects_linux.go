package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/backend/docker"
	"github.com/vivarium-sandbox/vivarium/internal/backend/gvisor"
	"github.com/vivarium-sandbox/vivarium/internal/backend/wasm"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

// Config says where Vivarium and its peers are.
type Config struct {
	// Vivarium is the binary timed as `vivarium run -c CODE`.
	Vivarium string
	// Backend runs the in-process rows. When nil, BackendErr says why, and
	// every Vivarium row is skipped with it.
	Backend    sandbox.Backend
	BackendErr error
	// Python is the interpreter every subject runs; default /usr/bin/python3.
	Python string
	// DockerImage is the image `docker run` uses; built from the host's
	// Python when missing. Default DefaultDockerImage.
	DockerImage string
	// IdleSandboxes is how many live stateful sandboxes the memory row
	// holds at once (default 20); W5's projection of how many this host
	// holds is taken from them.
	IdleSandboxes int
	// Fill, when > 0, adds a W5 row that makes that many idle sandboxes
	// at once, to check the projection.
	Fill int
	// Wasm runs the wasm backend's rows; when nil, one is made from the
	// interpreter `make wasm` built, and the rows are skipped without it.
	Wasm sandbox.Backend
	// Gvisor runs the gvisor backend's rows; when nil, one is made where
	// runsc is installed, and the rows are skipped without it.
	Gvisor sandbox.Backend
	// Docker runs the docker backend's rows; when nil, one is made where a
	// Docker daemon answers ($DOCKER_HOST, else the usual socket), and the
	// rows are skipped without one. The bench never starts a daemon.
	Docker sandbox.Backend
	// Pausing is the native backend whose sandboxes W7 pauses (the
	// zygote's, as vivarium serve makes them); when nil, PausingErr says
	// why and W7 is skipped.
	Pausing    sandbox.Backend
	PausingErr error
}

// DefaultDockerImage is the image the docker row runs, made by `docker
// import` from the host's own Python and libraries (no registry needed).
const DefaultDockerImage = "vivarium-bench-python"

// Subjects returns the rows `vivarium bench` measures, in the order
// printed: for the one-shot workloads W1 and W2, a `vivarium serve`'s
// one-shot endpoint (the reference), Vivarium's CLI and in-process
// RunOnce (and for W1 a gvisor server's one-shot and the gvisor backend's
// RunOnce from a pool and without one, the docker and wasm backends'
// RunOnce), then python3 alone, bubblewrap, gVisor, Docker and a Jupyter
// kernel per request; for the warm workload W3, a running sandbox over HTTP
// (the reference), in-process and in gvisor, docker and wasm sandboxes, and a running
// Jupyter kernel; W4, the
// creation of a stateful sandbox; W5, the memory of an idle one; W6, a
// quiet API key's one-shots beside a busy key's sandboxes, with and
// without --tenant-share. Subjects
// that this host cannot run carry the reason in Skip. Looking runs a few
// short programs (python3 imports, docker version). The returned function
// stops what the rows share (the server); call it after Run.
func Subjects(ctx context.Context, cfg Config) ([]Subject, func()) {
	if cfg.Python == "" {
		cfg.Python = sandbox.DefaultPython
	}
	if cfg.DockerImage == "" {
		cfg.DockerImage = DefaultDockerImage
	}
	py := cfg.Python

	vivSkip := ""
	switch {
	case cfg.Backend == nil && cfg.BackendErr != nil:
		vivSkip = cfg.BackendErr.Error()
	case cfg.Backend == nil:
		vivSkip = "no sandbox backend"
	}
	cliSkip := vivSkip
	if cliSkip == "" && cfg.Vivarium == "" {
		cliSkip = "no vivarium binary"
	}
	pySkip := ""
	if _, err := os.Stat(py); err != nil {
		pySkip = fmt.Sprintf("%s missing (apt install python3)", py)
	}
	bwrapSkip := missing("bwrap", "apt install bubblewrap")
	runscSkip := missing("runsc", "apt install runsc")
	if runscSkip == "" && os.Geteuid() != 0 {
		runscSkip = "runsc do runs as root here"
	}
	dockerSkip := dockerAvailable(ctx)
	jupyterSkip := firstOf(pySkip, pythonImports(ctx, py, "jupyter_client", "ipykernel",
		"apt install python3-jupyter-client python3-ipykernel"))
	pandasSkip := firstOf(pySkip, pythonImports(ctx, py, "pandas", "", "apt install python3-pandas"))

	if cfg.IdleSandboxes <= 0 {
		cfg.IdleSandboxes = 20
	}
	srv := newServer(cfg.Vivarium)
	srv.holds = max(cfg.IdleSandboxes, cfg.Fill)
	serverSetup := func(ctx context.Context) error { return srv.acquire(ctx) }
	wasmSkip := ""
	if cfg.Wasm == nil {
		if b, err := wasm.New(wasm.Config{}); err != nil {
			wasmSkip = err.Error()
		} else {
			cfg.Wasm = b
		}
	}
	// Compiling the interpreter (or loading it from the cache) is not what
	// a row times.
	wasmWarm := func(ctx context.Context) error {
		if w, ok := cfg.Wasm.(interface{ Warm(context.Context) error }); ok {
			return w.Warm(ctx)
		}
		return nil
	}
	gvisorSkip := ""
	if cfg.Gvisor == nil {
		if err := gvisor.Check(); err != nil {
			gvisorSkip = err.Error()
		} else if b, err := gvisor.New(gvisor.Config{CgroupParent: "vivarium-bench-gvisor"}); err != nil {
			gvisorSkip = err.Error()
		} else {
			cfg.Gvisor = b
		}
	}
	// The runsc peer runs on the platform the gvisor rows use, the one a
	// sandbox was seen to start with (runsc's own default may hang here).
	runscDo := []string{"runsc", "--network=none"}
	if g, ok := cfg.Gvisor.(*gvisor.Backend); ok {
		runscDo = append(runscDo, "--platform="+g.Platform().Platform)
	}
	dockerBackendSkip := ""
	if cfg.Docker == nil {
		if _, err := docker.Check("", ""); err != nil {
			dockerBackendSkip = err.Error()
		} else if b, err := docker.New(docker.Config{Name: "vivarium-bench-docker"}); err != nil {
			dockerBackendSkip = err.Error()
		} else {
			cfg.Docker = b
		}
	}
	var out []Subject
	for _, w := range []Workload{W1, W2} {
		wSkip := ""
		if w.ID == W2.ID {
			wSkip = pandasSkip
		}
		cmd := func(argv ...string) func(context.Context) error {
			return command{argv: argv, env: peerEnv(), want: w.Want}.run
		}
		jp := &jupyter{python: py, w: w}
		d := &dockerRun{image: cfg.DockerImage, python: py, w: w}
		out = append(out,
			Subject{
				Workload: w.Label(), Name: "vivarium serve, HTTP one-shot", Reference: true,
				Skip:  firstOf(cliSkip, wSkip),
				Setup: serverSetup, Run: srv.oneShot(w),
			},
			Subject{
				Workload: w.Label(), Name: "vivarium run -c (CLI)",
				Skip: firstOf(cliSkip, wSkip),
				Run:  cmd(cfg.Vivarium, "run", "-c", w.Code),
			},
			Subject{
				Workload: w.Label(), Name: "vivarium RunOnce (in-process)",
				Skip: firstOf(vivSkip, wSkip),
				Run:  oneShot(cfg.Backend, w),
			},
		)
		if w.ID == W1.ID {
			gvisorPooled := Subject{Workload: w.Label(), Name: "vivarium gvisor RunOnce from a pool (in-process)",
				Optional: true, Skip: gvisorSkip}
			if cfg.Gvisor != nil {
				po := newPooledOneShots(cfg.Gvisor, w)
				gvisorPooled.Setup, gvisorPooled.Ready, gvisorPooled.Run, gvisorPooled.Teardown = po.setup, po.ready, po.run, po.teardown
			}
			// A server whose default backend is gvisor, apart from the
			// reference's: its pool holds gvisor sandboxes.
			gvisorSrv := newServer(cfg.Vivarium)
			gvisorSrv.parent, gvisorSrv.uidBase = serverParent+"-gvisor", 1_000_000_000+15<<24
			gvisorSrv.extra = []string{"--backend", "gvisor"}
			out = append(out, Subject{
				Workload: w.Label(), Name: "vivarium serve --backend gvisor, HTTP one-shot from a pool",
				Optional: true, Skip: firstOf(cliSkip, gvisorSkip),
				Setup: gvisorSrv.acquire, Ready: gvisorSrv.poolSettled, Run: gvisorSrv.oneShot(w),
				Teardown: gvisorSrv.release,
			}, gvisorPooled, Subject{
				Workload: w.Label(), Name: "vivarium gvisor RunOnce (in-process, no pool)",
				Optional: true, Skip: gvisorSkip, Run: oneShot(cfg.Gvisor, w),
			}, Subject{
				Workload: w.Label(), Name: "vivarium docker RunOnce (in-process)",
				Optional: true, Skip: dockerBackendSkip, Run: oneShot(cfg.Docker, w),
			}, Subject{
				Workload: w.Label(), Name: "vivarium wasm RunOnce (in-process)",
				Optional: true, Skip: wasmSkip, Setup: wasmWarm, Run: oneShot(cfg.Wasm, w),
			})
		}
		out = append(out,
			Subject{
				Workload: w.Label(), Name: "python3 -c (no isolation)", Peer: true,
				Skip: firstOf(pySkip, wSkip),
				Run:  cmd(py, "-c", w.Code),
			},
			Subject{
				Workload: w.Label(), Name: "bwrap python3 -c (bubblewrap)", Peer: true,
				Skip: firstOf(bwrapSkip, pySkip, wSkip),
				Run:  cmd(append(bwrapArgs(), py, "-c", w.Code)...),
			},
			Subject{
				Workload: w.Label(), Name: "runsc do python3 -c (gVisor)", Peer: true,
				Skip: firstOf(runscSkip, pySkip, wSkip),
				Run:  cmd(append(slices.Clip(runscDo), "do", py, "-c", w.Code)...),
			},
			Subject{
				Workload: w.Label(), Name: "docker run python3 -c", Peer: true,
				Skip:  firstOf(dockerSkip, pySkip, wSkip),
				Setup: d.setup, Run: d.run,
			},
			Subject{
				Workload: w.Label(), Name: "jupyter kernel per request", Peer: true,
				Skip:  firstOf(jupyterSkip, wSkip),
				Setup: jp.setup, Run: jp.run, Teardown: jp.teardown,
			},
		)
	}

	w := W3
	var ws *warmSandboxes
	warm := Subject{Workload: w.Label(), Name: "vivarium sandbox, warm (in-process Execute)", Skip: vivSkip}
	if cfg.Backend != nil {
		ws = newWarmSandboxes(cfg.Backend, w)
		warm.Setup, warm.Run, warm.Teardown = ws.setup, ws.run, ws.teardown
	}
	httpWarm := Subject{Workload: w.Label(), Name: "vivarium serve, HTTP execute (warm)", Reference: true, Skip: cliSkip}
	httpWarm.Setup, httpWarm.Run, httpWarm.Teardown = srv.warm(w)
	wasmWarmRow := Subject{Workload: w.Label(), Name: "vivarium wasm sandbox, warm (in-process Execute)", Optional: true, Skip: wasmSkip}
	if cfg.Wasm != nil {
		wws := newWarmSandboxes(cfg.Wasm, w)
		wasmWarmRow.Run, wasmWarmRow.Teardown = wws.run, wws.teardown
		wasmWarmRow.Setup = func(ctx context.Context) error {
			if err := wasmWarm(ctx); err != nil {
				return err
			}
			return wws.setup(ctx)
		}
	}
	gvisorWarmRow := Subject{Workload: w.Label(), Name: "vivarium gvisor sandbox, warm (in-process Execute)", Optional: true, Skip: gvisorSkip}
	if cfg.Gvisor != nil {
		gws := newWarmSandboxes(cfg.Gvisor, w)
		gvisorWarmRow.Setup, gvisorWarmRow.Run, gvisorWarmRow.Teardown = gws.setup, gws.run, gws.teardown
	}
	dockerWarmRow := Subject{Workload: w.Label(), Name: "vivarium docker sandbox, warm (in-process Execute)", Optional: true, Skip: dockerBackendSkip}
	if cfg.Docker != nil {
		dws := newWarmSandboxes(cfg.Docker, w)
		dockerWarmRow.Setup, dockerWarmRow.Run, dockerWarmRow.Teardown = dws.setup, dws.run, dws.teardown
	}
	jp := &jupyter{python: py, w: w, warm: true}
	out = append(out, httpWarm, warm, gvisorWarmRow, dockerWarmRow, wasmWarmRow, Subject{
		Workload: w.Label(), Name: "jupyter kernel, warm (execute)", Peer: true,
		Skip:  jupyterSkip,
		Setup: jp.setup, Run: jp.run, Teardown: jp.teardown,
	})

	w = W4
	out = append(out,
		Subject{Workload: w.Label(), Name: "vivarium serve, POST /v1/sandboxes", Reference: true,
			Skip: cliSkip, Setup: serverSetup, Run: srv.create},
		Subject{Workload: w.Label(), Name: "vivarium serve, E2B's Sandbox.create (POST /e2b/sandboxes)",
			Skip: cliSkip, Setup: serverSetup, Run: srv.e2bCreate},
		Subject{Workload: w.Label(), Name: "vivarium Create (in-process, no pool)", Skip: vivSkip,
			Run: func(ctx context.Context) error {
				sb, err := cfg.Backend.Create(ctx, sandbox.Spec{})
				if err != nil {
					return err
				}
				go sb.Close()
				return nil
			}},
	)

	pauseSkip := vivSkip
	if pauseSkip == "" && cfg.Pausing == nil {
		pauseSkip = "no native backend that pauses"
		if cfg.PausingErr != nil {
			pauseSkip = cfg.PausingErr.Error()
		}
	}
	out = append(out, idleSubjects(srv, cfg.IdleSandboxes, cfg.Fill, firstOf(cliSkip, pandasSkip), pandasSkip, pauseSkip, py)...)

	out = append(out, cpuSubjects(srv, serverSetup, cliSkip, pySkip, py)...)

	out = append(out, pauseSubjects(cfg.Pausing, pauseSkip)...)

	out = append(out, templateSubjects(srv, firstOf(cliSkip, pySkip), py)...)

	fair, stopFair := fairnessSubjects(cfg.Vivarium, cliSkip)
	out = append(out, fair...)
	return out, func() {
		stopFair()
		srv.mu.Lock()
		users := srv.users
		srv.users = 1
		srv.mu.Unlock()
		if users > 0 {
			srv.release()
		}
		for _, b := range []sandbox.Backend{cfg.Gvisor, cfg.Docker, cfg.Wasm} {
			if c, ok := b.(io.Closer); ok {
				c.Close()
			}
		}
	}
}

// bwrapArgs give bubblewrap about what a Vivarium sandbox has: every
// namespace unshared (network included), the host's /usr read-only with the
// merged-usr links, the /etc files numpy's BLAS needs, its own /proc, a
// minimal /dev and a private /tmp. Vivarium adds seccomp, cgroups, a
// size-limited workspace and a synthetic /etc, which bwrap alone does not.
func bwrapArgs() []string {
	args := []string{"bwrap", "--unshare-all", "--die-with-parent", "--new-session",
		"--ro-bind", "/usr", "/usr",
		"--symlink", "usr/bin", "/bin", "--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64",
	}
	for _, p := range []string{"/etc/alternatives", "/etc/ld.so.cache"} {
		if _, err := os.Stat(p); err == nil {
			args = append(args, "--ro-bind", p, p)
		}
	}
	return append(args, "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--chdir", "/tmp")
}

// dockerRun times `docker run --rm --network none IMAGE python3 -c CODE`.
type dockerRun struct {
	image, python string
	w             Workload
}

// setup builds the image when it is missing.
func (d *dockerRun) setup(ctx context.Context) error {
	if exec.CommandContext(ctx, "docker", "image", "inspect", d.image).Run() == nil {
		return nil
	}
	return buildDockerImage(ctx, d.image)
}

func (d *dockerRun) run(ctx context.Context) error {
	argv := []string{"docker", "run", "--rm", "--network", "none"}
	for _, kv := range peerEnv() {
		argv = append(argv, "--env", kv)
	}
	argv = append(argv, d.image, d.python, "-c", d.w.Code)
	// The docker client keeps the host's environment: DOCKER_HOST and its
	// configuration say which daemon to talk to. The container gets only
	// the variables above.
	return command{argv: argv, env: os.Environ(), want: d.w.Want}.run(ctx)
}

// buildDockerImage makes an image of the host's Python, its packages and
// the libraries they load, with `tar | docker import`: no registry and no
// base image needed, and the container runs the very same Python as every
// other row.
func buildDockerImage(ctx context.Context, image string) error {
	ctx, cancel := context.WithTimeout(ctx, 15*time.Minute)
	defer cancel()
	var paths []string
	for _, pattern := range []string{
		"bin", "lib", "lib64", "usr/bin/python3*", "usr/lib/python3*", "usr/local/lib/python3*",
		"usr/lib/*-linux-gnu", "usr/lib64", "usr/share/zoneinfo", "etc/alternatives", "etc/ld.so.cache",
	} {
		m, _ := filepath.Glob("/" + pattern)
		for _, p := range m {
			paths = append(paths, strings.TrimPrefix(p, "/"))
		}
	}
	tar := exec.CommandContext(ctx, "tar", append([]string{"-C", "/", "-cf", "-"}, paths...)...)
	imp := exec.CommandContext(ctx, "docker", "import",
		"--change", "ENV PATH=/usr/bin:/bin", "--change", "ENV LANG=C.UTF-8", "-", image)
	pipe, err := tar.StdoutPipe()
	if err != nil {
		return err
	}
	imp.Stdin = pipe
	var tarErr, impErr capBuffer
	tar.Stderr, imp.Stderr = &tarErr, &impErr
	if err := imp.Start(); err != nil {
		return fmt.Errorf("docker import: %w", err)
	}
	if err := tar.Run(); err != nil {
		imp.Wait()
		return fmt.Errorf("build image %s: tar: %v: %s", image, err, lastLine(tarErr.String()))
	}
	if err := imp.Wait(); err != nil {
		return fmt.Errorf("build image %s: docker import: %v: %s", image, err, lastLine(impErr.String()))
	}
	return nil
}

// dockerAvailable is empty when a docker daemon answers, else why not.
// The bench never starts a daemon itself.
func dockerAvailable(ctx context.Context) string {
	if s := missing("docker", "apt install docker.io"); s != "" {
		return s
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if exec.CommandContext(ctx, "docker", "version", "--format", "{{.Server.Version}}").Run() != nil {
		return "no docker daemon (start dockerd; see docs/benchmarks.md)"
	}
	return ""
}

func missing(program, install string) string {
	if _, err := exec.LookPath(program); err != nil {
		return fmt.Sprintf("%s not installed (%s)", program, install)
	}
	return ""
}

// pythonImports is empty when python imports the modules, else the reason
// and how to install them.
func pythonImports(ctx context.Context, python, mod1, mod2, install string) string {
	code := "import " + mod1
	mods := mod1
	if mod2 != "" {
		code += ", " + mod2
		mods += " and " + mod2
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, python, "-c", code)
	cmd.Env = peerEnv()
	if err := cmd.Run(); err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return fmt.Sprintf("python3 lacks %s (%s)", mods, install)
		}
		return err.Error()
	}
	return ""
}

func firstOf(reasons ...string) string {
	for _, r := range reasons {
		if r != "" {
			return r
		}
	}
	return ""
}
