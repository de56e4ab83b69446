package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/backend/docker"
	"github.com/vivarium-sandbox/vivarium/internal/backend/gvisor"
	"github.com/vivarium-sandbox/vivarium/internal/backend/native"
	"github.com/vivarium-sandbox/vivarium/internal/backend/wasm"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/service"
)

type runOptions struct {
	code, python              string
	template, dataDir         string
	backend, wasmDir          string
	gvisorPlatform            string
	dockerHost, dockerRuntime string
	dockerUIDBase             uint
	asJSON, insecureNoCgroups bool
	kernelLimits              native.KernelLimits
	timeout, cpuTime          time.Duration
	memory, disk, maxOutput   sizeFlag
	pids                      int
	env, files                listFlag
	out                       string
	allowErrors               bool // notebooks: run every cell even after one fails
	allowNet                  ruleList
	io                        ioFlags
}

func runFlags(o *runOptions) *flag.FlagSet {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `Usage: vivarium run [flags] FILE | -c CODE | -

Runs Python code in a fresh sandbox and prints what it printed. The exit
status is the program's own; 124 when a time limit ended it, 137 when the
memory limit did, 125 when the sandbox could not start.

A Jupyter notebook (FILE.ipynb) runs cell by cell in one sandbox:
  vivarium run analysis.ipynb --out executed.ipynb [--allow-errors]

Flags:
`)
		fs.PrintDefaults()
	}
	o.memory, o.disk, o.maxOutput = sandbox.DefaultMemory, sandbox.DefaultDisk, sandbox.DefaultMaxOutput
	fs.StringVar(&o.code, "c", "", "run `CODE` instead of a file")
	fs.BoolVar(&o.asJSON, "json", false, "print the Result as one JSON object, and nothing else on stdout")
	fs.DurationVar(&o.timeout, "timeout", sandbox.DefaultTimeout, "wall-clock limit")
	fs.DurationVar(&o.cpuTime, "cpu-time", 0, "CPU time limit, all processes together (0: only the wall clock)")
	fs.Var(&o.memory, "memory", "memory limit, swap off")
	fs.IntVar(&o.pids, "pids", sandbox.DefaultPids, "limit on processes and threads at once")
	fs.Var(&o.disk, "disk", "size of /workspace, /tmp and /dev/shm together")
	fs.Var(&o.maxOutput, "max-output", "bytes kept per stream; the rest is dropped and flagged")
	fs.Var(&o.env, "env", "`K=V` environment variable for the code (repeatable); nothing else of the host's environment is passed")
	fs.Var(&o.files, "file", "`LOCAL[:NAME]` copy a file into the workspace before the run (repeatable)")
	fs.StringVar(&o.out, "out", "", "after the run, copy the workspace's regular files to `DIR`; for a .ipynb FILE, the executed notebook's path (- for standard output)")
	fs.BoolVar(&o.allowErrors, "allow-errors", false, "for a .ipynb FILE: run every cell even after one fails")
	fs.StringVar(&o.python, "python", sandbox.DefaultPython, "Python interpreter inside the sandbox (must be under /usr)")
	fs.StringVar(&o.template, "template", "", "run in the file system and Python of `NAME`, an image of the store (vivarium image ls; native backend); default: the host's")
	fs.StringVar(&o.dataDir, "data-dir", defaultDataDir(), "with --template: the data `DIR` whose image store holds it")
	fs.StringVar(&o.backend, "backend", "native", "isolation: `native` (Linux namespaces, seccomp, cgroups), gvisor (the same inside gVisor's user-space kernel: runsc), docker (a container of a local Docker daemon) or wasm (CPython compiled to WebAssembly: standard library only)")
	fs.StringVar(&o.gvisorPlatform, "gvisor-platform", "", "for --backend gvisor: runsc's `PLATFORM` (systrap, kvm, ptrace); default: the first that starts a sandbox here")
	fs.StringVar(&o.dockerHost, "docker-host", "", "for --backend docker: the daemon's `ADDRESS` (unix:///PATH); default $DOCKER_HOST, else unix:///var/run/docker.sock")
	fs.StringVar(&o.dockerRuntime, "docker-runtime", "", "for --backend docker: the daemon's OCI `RUNTIME` for the container (runsc: gVisor); default the daemon's")
	fs.UintVar(&o.dockerUIDBase, "docker-uid-base", docker.DefaultUIDBase,
		"for --backend docker: first host `UID` of the pool the sandbox is a host user of its own from (shared with every vivarium on the host; 65536 uids a sandbox, which must belong to nobody)")
	fs.StringVar(&o.wasmDir, "wasm-dir", os.Getenv(wasm.DirEnv), "for --backend wasm: the `DIR` `make wasm` built (python.wasm and lib/); default: build/wasm above the binary or the working directory")
	fs.Var(kernelLimitFlag{&o.kernelLimits}, "kernel-limit", kernelLimitUsage)
	fs.BoolVar(&o.insecureNoCgroups, "insecure-no-cgroups", false,
		"run without cgroups when the host has none: memory and process limits per process (rlimits), not per sandbox")
	o.io.register(fs, "the sandbox")
	fs.Var(&o.allowNet, "allow-net", "`RULE` the code may reach through the sandbox's HTTP(S) proxy (repeatable, or several separated by spaces): "+
		"HOST, *.DOMAIN, CIDR or [IPV6-CIDR], each with :PORTS (80,443 when none); metadata, loopback and this host stay refused. Default: no network")
	return fs
}

// parseInterleaved lets flags come before or after the file name, as users
// type them; "--" ends the flags.
func parseInterleaved(fs *flag.FlagSet, args []string) ([]string, error) {
	var positional []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return positional, nil
		}
		if len(args) > len(rest) && args[len(args)-len(rest)-1] == "--" {
			return append(positional, rest...), nil
		}
		positional = append(positional, rest[0])
		args = rest[1:]
	}
}

func cmdRun(args []string) int {
	var o runOptions
	fs := runFlags(&o)
	positional, err := parseInterleaved(fs, args)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if len(positional) == 1 && o.code == "" && strings.HasSuffix(positional[0], ".ipynb") {
		return cmdNotebook(&o, positional[0])
	}
	job, err := o.job(positional)
	if err != nil {
		fmt.Fprintf(os.Stderr, "vivarium run: %v\n", err)
		return 2
	}
	if job.Spec.Egress != nil {
		defer job.Spec.Egress.Close() // the sandbox closes it too, when one was made
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	if !o.asJSON {
		job.Sink = passThrough{}
	}
	var res *sandbox.Result
	var warn error
	b, err := o.newBackend()
	if err != nil {
		res = sandbox.SetupFailed(err)
	} else {
		res, warn = sandbox.RunOnce(ctx, b, job)
		closeBackend(b)
	}
	if warn != nil {
		fmt.Fprintf(os.Stderr, "vivarium: warning: %v\n", warn)
	}
	if o.asJSON {
		enc := json.NewEncoder(os.Stdout)
		enc.SetEscapeHTML(false)
		if err := enc.Encode(res); err != nil {
			fmt.Fprintf(os.Stderr, "vivarium: %v\n", err)
			return 1
		}
		return res.ExitCode
	}
	reportPlain(res)
	return res.ExitCode
}

// newBackend creates the backend --backend names.
func (o *runOptions) newBackend() (sandbox.Backend, error) {
	switch o.backend {
	case "native":
		return native.New(native.Config{InsecureNoCgroups: o.insecureNoCgroups, KernelLimits: o.kernelLimits})
	case "gvisor":
		return gvisor.New(gvisor.Config{Platform: o.gvisorPlatform, CgroupParent: "vivarium-run-gvisor"})
	case "docker":
		if o.dockerUIDBase > 1<<32-1 {
			return nil, fmt.Errorf("%w: --docker-uid-base %d is no uid", sandbox.ErrInvalidSpec, o.dockerUIDBase)
		}
		return docker.New(docker.Config{Host: o.dockerHost, Runtime: o.dockerRuntime, Name: "vivarium-run-docker",
			UIDBase: uint32(o.dockerUIDBase)})
	case "wasm":
		return wasm.New(wasm.Config{Dir: o.wasmDir})
	}
	return nil, fmt.Errorf("%w: unknown backend %q: native, gvisor, docker or wasm", sandbox.ErrInvalidSpec, o.backend)
}

// closeBackend frees what a backend keeps beyond its sandboxes (wasm's
// compiled module, gVisor's root skeleton).
func closeBackend(b sandbox.Backend) {
	if c, ok := b.(io.Closer); ok {
		if err := c.Close(); err != nil {
			fmt.Fprintf(os.Stderr, "vivarium: warning: %v\n", err)
		}
	}
}

// job turns the flags into a one-shot run.
func (o *runOptions) job(positional []string) (sandbox.OneShot, error) {
	var job sandbox.OneShot
	var code, filename string
	switch {
	case o.code != "" && len(positional) > 0:
		return job, errors.New("give either -c CODE or a file, not both")
	case o.code != "":
		code, filename = o.code, "<string>"
	case len(positional) == 0:
		return job, errors.New("nothing to run: give a FILE, -c CODE, or - for standard input")
	case len(positional) > 1:
		return job, fmt.Errorf("unexpected arguments after %s: %s", positional[0], strings.Join(positional[1:], " "))
	case positional[0] == "-":
		b, err := io.ReadAll(io.LimitReader(os.Stdin, 64<<20))
		if err != nil {
			return job, fmt.Errorf("read standard input: %w", err)
		}
		code, filename = string(b), "<stdin>"
	default:
		b, err := os.ReadFile(positional[0])
		if err != nil {
			return job, err
		}
		code, filename = string(b), filepath.Base(positional[0])
	}
	// Zero means "the default" in a Spec; on the command line it is a
	// mistake worth saying so.
	switch {
	case o.timeout <= 0:
		return job, errors.New("--timeout must be positive")
	case o.cpuTime < 0:
		return job, errors.New("--cpu-time must not be negative")
	case o.pids < 1:
		return job, errors.New("--pids must be at least 1")
	case o.memory <= 0 || o.disk <= 0 || o.maxOutput <= 0:
		return job, errors.New("--memory, --disk and --max-output must be positive")
	}
	env := map[string]string{}
	for _, kv := range o.env {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return job, fmt.Errorf("--env %q: want K=V", kv)
		}
		env[k] = v
	}
	for _, f := range o.files {
		local, name, ok := strings.Cut(f, ":")
		if !ok {
			name = filepath.Base(local)
		}
		if _, err := os.Stat(local); err != nil {
			return job, fmt.Errorf("--file: %w", err)
		}
		job.Files = append(job.Files, sandbox.InputFile{Name: name, Open: func() (io.ReadCloser, error) { return os.Open(local) }})
	}
	job.Spec = sandbox.Spec{
		Limits: sandbox.Limits{
			Timeout: o.timeout, CPUTime: o.cpuTime, Memory: int64(o.memory), Pids: o.pids,
			Disk: int64(o.disk), MaxOutput: int64(o.maxOutput),
		},
		Env:    env,
		Python: o.python,
	}
	if o.template != "" {
		if err := o.withTemplate(&job.Spec); err != nil {
			return job, err
		}
	}
	var err error
	if job.Spec.Limits, err = o.io.apply(job.Spec.Limits); err != nil {
		return job, err
	}
	if err := job.Spec.Validate(); err != nil {
		return job, err
	}
	egress, err := runEgress(o.allowNet)
	if err != nil {
		return job, err
	}
	if egress != nil {
		job.Spec.Egress = egress
	}
	job.Request = sandbox.ExecRequest{Code: code, Filename: filename}
	job.OutDir = o.out
	return job, nil
}

// withTemplate gives spec the template of --template, from --data-dir's
// image store.
func (o *runOptions) withTemplate(spec *sandbox.Spec) error {
	images, err := openImages(o.dataDir)
	if err != nil {
		return err
	}
	spec.Template, spec.Python = o.template, ""
	return service.ResolveTemplate(images, spec)
}

// passThrough streams the sandbox's output to ours as it arrives.
type passThrough struct{}

func (passThrough) Stdout(p []byte) { os.Stdout.Write(p) }
func (passThrough) Stderr(p []byte) { os.Stderr.Write(p) }

// reportPlain says on stderr what the output alone does not: the traceback
// (as python3 would print it), a limit that ended the run, dropped output.
func reportPlain(res *sandbox.Result) {
	if res.StdoutTruncated || res.StderrTruncated {
		fmt.Fprintln(os.Stderr, "vivarium: output over --max-output was dropped")
	}
	e := res.Error
	switch {
	case e == nil:
	case res.Status == sandbox.StatusError && e.Traceback != "":
		fmt.Fprint(os.Stderr, strings.TrimSuffix(e.Traceback, "\n")+"\n")
	case res.Status == sandbox.StatusError && e.Name == "SystemExit":
		// python3 says nothing for sys.exit(n).
	default:
		fmt.Fprintf(os.Stderr, "vivarium: %s: %s\n", res.Status, e.Value)
	}
}
