package native

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/vivarium-sandbox/vivarium/internal/rootview"
	"github.com/vivarium-sandbox/vivarium/internal/runner"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/seccomp"
)

// The sandbox's init is this same binary, re-executed by the supervisor
// with argv[0] set to initArg0 inside new user, mount, PID, network, IPC
// and UTS namespaces (the runc "init" pattern). It is PID 1 of the sandbox:
// it builds the root file system, confines itself, starts the runner as the
// unprivileged sandbox user, and reaps every orphan until the runner exits.
// When it exits, the kernel kills every process left in the PID namespace.
const initArg0 = "vivarium-sandbox-init"

// Descriptors the supervisor passes to init, in order from 3.
const (
	fdCtrl   = 3 // supervisor → init: the initConfig as one JSON line
	fdStatus = 4 // init → supervisor: initStatus JSON lines
	fdStdout = 5 // stdout of the runner and commands
	fdStderr = 6 // stderr of the runner and commands
)

// The output pipes, kept open by init for every runner it starts.
var stdoutFile, stderrFile *os.File

// initConfig is everything init needs; the supervisor sends it as JSON.
type initConfig struct {
	Python      string            `json:"python"`
	RunnerArgs  []string          `json:"runner_args"`
	RunnerFiles map[string][]byte `json:"runner_files"`
	Env         []string          `json:"env"`
	Etc         []rootview.File   `json:"etc"`
	TopLevel    []rootview.TopDir `json:"top_level"`
	DiskBytes   int64             `json:"disk_bytes"`
	DiskInodes  int64             `json:"disk_inodes"`
	OpenFiles   uint64            `json:"open_files"`
	CPUSeconds  uint64            `json:"cpu_seconds"` // RLIMIT_CPU of the runner; 0: none
	MaxProcs    uint64            `json:"max_procs"`   // RLIMIT_NPROC; only without a pids cgroup
	// MemoryBytes is RLIMIT_AS, only set when there is no memory cgroup.
	MemoryBytes uint64 `json:"memory_bytes"`
	// MemTotal is the sandbox's memory limit, which its /proc/meminfo
	// shows as the machine's memory.
	MemTotal int64 `json:"mem_total"`
	// OneShot: init ends when the runner does.
	OneShot bool `json:"one_shot"`
	// Home is the sandbox user's home and where its code starts
	// (sandbox.Spec.Home); UserName is its name.
	Home     string `json:"home"`
	UserName string `json:"user_name"`
	// Role is what this init is: roleClassic builds the root and runs
	// its own Python; roleZygote builds the root and runs the zygote
	// (zygote_linux.go); roleForked is a sandbox's init started by a
	// zygote init, whose runners the zygote forks.
	Role string `json:"role,omitempty"`
	// HashSeed, for a pausable sandbox, is the backend's PYTHONHASHSEED
	// for its runner, and init and its children are started without
	// address-space randomization (spawnWithLayout): two such sandboxes
	// that ran the same code hold mostly the same pages at the same
	// addresses. Empty: a random seed and a random layout.
	HashSeed string `json:"hash_seed,omitempty"`
	// Preload lists the modules the zygote imports (roleZygote), or the
	// runner of a sandbox with a HashSeed before it is ready.
	Preload []string `json:"preload,omitempty"`
	// Sysctls are written in the sandbox's own namespaces once its /proc
	// is mounted; Kernel's budgets become rlimits (budgets_linux.go).
	Sysctls []sysctl     `json:"sysctls,omitempty"`
	Kernel  KernelLimits `json:"kernel"`
	// Devices is the directory of the sandbox's own device nodes, as init
	// sees it (devices_linux.go); for a zygote, the backend's directory of
	// them, which it binds for its forked sandboxes.
	Devices string `json:"devices,omitempty"`
	// ZygoteUID is the host user the Python zygote runs as (roleZygote).
	ZygoteUID uint32 `json:"zygote_uid,omitempty"`
	// Volumes are where the sandbox's volumes go, in the order their
	// mounts come on the control socket (volume_linux.go).
	Volumes []string `json:"volumes,omitempty"`
	// Seccomp is the sandbox's system call filter (seccomp.Encode of
	// sandboxFilter), compiled once by the backend rather than by every
	// init.
	Seccomp []byte `json:"seccomp"`
	// Proc is what init binds over its /proc (procMasks), but the boot
	// id, its own.
	Proc []rootview.ProcMask `json:"proc,omitempty"`
	// Image: the root is a template's, which comes on the control socket
	// (template_linux.go); Python "" is python3 on Env's PATH. Workdir,
	// if set, is where the runner and commands start (the template's
	// WORKDIR) instead of the home.
	Image   bool   `json:"image,omitempty"`
	Workdir string `json:"workdir,omitempty"`
	// User is the sandbox user, a template's USER; nil: uid and gid
	// SandboxUID and SandboxGID (user()).
	User *sandbox.RootUser `json:"user,omitempty"`
	// Build: the sandbox runs a template build's step (a command), and
	// what it writes becomes a layer: init writes nothing of its own in
	// the root that the sandbox would not (no /etc files, no runner),
	// and its runner has no Python.
	Build bool `json:"build,omitempty"`
}

// sandboxFilter is every sandbox's seccomp filter, encoded.
var sandboxFilter = sync.OnceValues(func() ([]byte, error) {
	prog, err := seccomp.Compile(seccomp.DefaultRules())
	if err != nil {
		return nil, err
	}
	return seccomp.Encode(prog), nil
})

// Roles of init.
const (
	roleClassic = ""
	roleZygote  = "zygote"
	roleForked  = "forked"
)

// initStatus is a message from init to the supervisor.
type initStatus struct {
	Event string `json:"event"` // "started", "error" or "exit"
	// For "error": the step that failed and why.
	Step  string `json:"step,omitempty"`
	Error string `json:"error,omitempty"`
	// For "exit": how the runner ended.
	Code   int `json:"code"`
	Signal int `json:"signal,omitempty"`
}

const (
	runnerDir     = rootview.RunnerDir
	workspacePath = "/workspace"
)

// home is the sandbox user's home, where its code starts.
func (cfg *initConfig) home() string {
	if cfg.Home == "" {
		return workspacePath
	}
	return cfg.Home
}

// user is the sandbox user: who runs the runner, and commands unless as
// root.
func (cfg *initConfig) user() sandbox.RootUser {
	if cfg.User != nil {
		return *cfg.User
	}
	return sandbox.RootUser{UID: SandboxUID, GID: SandboxGID}
}

// startDir is where the runner and commands start: the template's WORKDIR
// or the home.
func (cfg *initConfig) startDir() string {
	if cfg.Workdir != "" {
		return cfg.Workdir
	}
	return cfg.home()
}

// A sandbox's init runs from this package's init function, before main
// and before the packages that sort after this one and that it does not
// need are initialised (Go initialises packages in dependency order, then
// by import path): the server's HTTP, SQLite and MCP packages are never
// initialised in a sandbox's init. It runs on the process's first thread, the thread-group
// leader, where init functions run: what it makes per thread (its cgroup
// namespace) is then what the kernel shows as the process's own, which a
// zygote's child joins through a pidfd.
func init() {
	if IsInit() {
		runtime.LockOSThread()
		RunInit()
	}
	if len(os.Args) > 3 && os.Args[0] == zygoteExecArg0 {
		zygoteExec(os.Args[1], os.Args[2:])
	}
	if len(os.Args) == 1 && os.Args[0] == idmapArg0 {
		// Holds its user namespace (idmapNamespace) until told.
		os.Stdin.Read(make([]byte, 1))
		os.Exit(0)
	}
}

// initEnv is init's whole environment. One P from the start: every thread
// the runtime would start costs page-table work (much of a sandbox's start
// on a paravirtualised host) and counts against the sandbox's pids limit.
// No garbage collection until init has set the sandbox up (gcOn): what it
// allocates until then is little and mostly kept, and the collector's
// cycles during the packages' initialisation and the setup were a tenth of
// a sandbox init's CPU time. No cgroup-aware GOMAXPROCS
// (containermaxprocs=0): the runtime would keep the cgroup's CPU quota file
// open, on a mount the sandbox does not have, which a checkpoint of a
// zygote's sandbox cannot reopen by its path.
var initEnv = []string{"GOMAXPROCS=1", "GOGC=off", "GODEBUG=containermaxprocs=0"}

// gcOn gives init the runtime's default collection back, once it is set up.
func gcOn() { debug.SetGCPercent(100) }

// IsInit reports whether this process was started as a sandbox's init.
// main (and TestMain of packages that create sandboxes) must call RunInit
// first thing when it is.
func IsInit() bool { return len(os.Args) > 0 && os.Args[0] == initArg0 }

// RunInit runs the sandbox side and never returns.
func RunInit() {
	// Keep init small: one P means fewer runtime threads, each of which
	// counts against the sandbox's pids limit.
	runtime.GOMAXPROCS(1)
	// The sandbox's root is uid 0 of init's own user namespace, so it may
	// signal init, and Go's default for most signals is to exit (or dump
	// and exit): one kill(1, SIGHUP) would end the sandbox. Signals init
	// handles and nobody reads are dropped. The kernel keeps SIGKILL and
	// SIGSTOP sent from inside away from a PID namespace's init, and the
	// host stops init with SIGKILL from outside. Notify, not Ignore: an
	// ignored signal stays ignored across exec, in the runner and in
	// commands, which need SIGINT and SIGPIPE as they are. (A server
	// started with SIGHUP or SIGINT ignored, by nohup or a shell's "&",
	// passes that on; caught here, both are back to their defaults at
	// each exec, and a terminal's Ctrl-C and hangup work.)
	signal.Notify(make(chan os.Signal, 1), droppedSignals...)
	status := os.NewFile(fdStatus, "status")
	report := func(s initStatus) {
		b, _ := json.Marshal(s)
		status.Write(append(b, '\n'))
	}
	code, err := initMain(report)
	if err != nil {
		step, msg := "init", err.Error()
		if se, ok := err.(*stepError); ok {
			step, msg = se.step, se.err.Error()
		}
		report(initStatus{Event: "error", Step: step, Error: msg})
		os.Exit(1)
	}
	os.Exit(code)
}

// droppedSignals are every signal that can be caught but SIGCHLD, which
// init reaps on, and SIGURG, the Go runtime's own.
var droppedSignals = []os.Signal{syscall.SIGHUP, syscall.SIGINT, syscall.SIGQUIT, syscall.SIGILL, syscall.SIGTRAP,
	syscall.SIGABRT, syscall.SIGBUS, syscall.SIGFPE, syscall.SIGUSR1, syscall.SIGSEGV, syscall.SIGUSR2, syscall.SIGPIPE,
	syscall.SIGALRM, syscall.SIGTERM, syscall.SIGSTKFLT, syscall.SIGCONT, syscall.SIGTSTP, syscall.SIGTTIN,
	syscall.SIGTTOU, syscall.SIGXCPU, syscall.SIGXFSZ, syscall.SIGVTALRM, syscall.SIGPROF, syscall.SIGWINCH,
	syscall.SIGIO, syscall.SIGPWR, syscall.SIGSYS}

// stepError names the setup step that failed, so that "setup_failed" tells
// the user (and us) exactly what the host refused.
type stepError struct {
	step string
	err  error
}

func (e *stepError) Error() string { return e.step + ": " + e.err.Error() }

func step(name string, err error) error {
	if err == nil {
		return nil
	}
	return &stepError{name, err}
}

func initMain(report func(initStatus)) (int, error) {
	// Descriptors inherited from the supervisor, and whatever its own
	// parent leaked to it, must reach no process init starts, except
	// where handed over explicitly.
	if err := unix.CloseRange(fdCtrl, ^uint(0), unix.CLOSE_RANGE_CLOEXEC); err != nil {
		return 0, step("close-on-exec inherited descriptors (close_range, Linux 5.11)", err)
	}
	stdoutFile, stderrFile = os.NewFile(fdStdout, "stdout"), os.NewFile(fdStderr, "stderr")
	var cfg initConfig
	ctrl := os.NewFile(fdCtrl, "ctrl")
	if err := json.NewDecoder(ctrl).Decode(&cfg); err != nil {
		return 0, step("read config", err)
	}
	ctrl.Close()
	// Namespaces and capability sets below are per thread: everything from
	// here runs on this one (the leader, locked since init()), and the
	// runner is forked from it.
	runtime.LockOSThread()
	// The supervisor has put this process into the sandbox's cgroup before
	// sending the config; a cgroup namespace now makes that group the root
	// of what the sandbox sees in /proc/self/cgroup.
	if err := unix.Unshare(unix.CLONE_NEWCGROUP); err != nil {
		return 0, step("cgroup namespace", err)
	}
	// Supplementary groups of the supervisor (root's group among them)
	// must not reach the sandbox. Its spawner and a zygote's init start
	// inits without any; dropping them takes stopping every thread
	// (a tenth of a millisecond and more), so it is done only if some
	// are there, which all threads share, having been cloned from this
	// one since exec.
	if groups, err := unix.Getgroups(); err != nil || len(groups) > 0 {
		if err := syscall.Setgroups(nil); err != nil {
			return 0, step("setgroups", err)
		}
	}
	if cfg.Role == roleZygote {
		gcOn()
		return zygoteInit(&cfg, report)
	}
	if cfg.Role == roleForked {
		// The zygote's init built the root; this sandbox's own mount
		// namespace, a copy of it, only needs its disk and /proc.
		if err := mountForked(&cfg); err != nil {
			return 0, err
		}
	} else if err := buildRoot(&cfg); err != nil {
		return 0, err
	}
	if err := unix.Sethostname([]byte(rootview.Hostname)); err != nil {
		return 0, step("sethostname", err)
	}
	if err := loopbackUp(); err != nil {
		return 0, step("loopback up", err)
	}
	if cfg.Workdir != "" {
		// A template's WORKDIR, made if the image lacks it, as a
		// Dockerfile's WORKDIR is (inside the root: after the pivot,
		// the image's links lead nowhere else).
		if err := os.MkdirAll(cfg.Workdir, 0o755); err != nil {
			return 0, step("the template's working directory", err)
		}
	}
	if err := os.Chdir(cfg.startDir()); err != nil {
		return 0, step("chdir", err)
	}
	// Init's own data must not be readable by the sandbox user through
	// /proc/1 (its environment, memory, descriptors).
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return 0, step("set non-dumpable", err)
	}

	if err := setRlimits(&cfg); err != nil {
		return 0, err
	}
	var keep []uintptr
	if cfg.Build {
		keep = buildCapabilities
	}
	if err := dropCapabilities(keep); err != nil {
		return 0, step("drop capabilities", err)
	}
	prog, err := seccomp.Decode(cfg.Seccomp)
	if err != nil {
		return 0, step("seccomp", err)
	}
	if err := seccomp.Install(prog); err != nil {
		return 0, step("seccomp", err)
	}
	// The runner's files, /etc and /proc's files are written and the
	// filter loaded: a lasting sandbox's init gives their memory back
	// (1.2 MB of every sandbox's, and of every paused sandbox's images);
	// a one-shot's ends soon, and does not spend a collection on it.
	cfg.RunnerFiles, cfg.Etc, cfg.Proc, cfg.Seccomp = nil, nil, nil, nil
	gcOn()
	if !cfg.OneShot {
		debug.FreeOSMemory()
	}
	return supervise(&cfg, report), nil
}

type rlimit struct {
	name     string
	resource int
	cur, max uint64
}

// rlimits are init's resource limits, and so those of every process of the
// sandbox.
func (cfg *initConfig) rlimits() []rlimit {
	limits := []rlimit{
		// 1, not 0: with 0 the kernel still runs a core_pattern pipe
		// handler (systemd-coredump, apport: as host root) when a
		// process crashes; with 1 it refuses every dump, to a pipe or a
		// file. The seccomp filter keeps sandboxes from changing it.
		{"core", unix.RLIMIT_CORE, coreLimit(), coreLimit()},
		{"nofile", unix.RLIMIT_NOFILE, cfg.OpenFiles, cfg.OpenFiles},
		{"fsize", unix.RLIMIT_FSIZE, uint64(cfg.DiskBytes), uint64(cfg.DiskBytes)},
	}
	if cfg.CPUSeconds > 0 {
		// SIGXCPU at the soft limit, SIGKILL one second later for code
		// that catches SIGXCPU.
		limits = append(limits, rlimit{"cpu", unix.RLIMIT_CPU, cfg.CPUSeconds, cfg.CPUSeconds + 1})
	}
	if cfg.MaxProcs > 0 {
		limits = append(limits, rlimit{"nproc", unix.RLIMIT_NPROC, cfg.MaxProcs, cfg.MaxProcs})
	}
	if cfg.MemoryBytes > 0 {
		limits = append(limits, rlimit{"as", unix.RLIMIT_AS, cfg.MemoryBytes, cfg.MemoryBytes})
	}
	return append(limits, cfg.Kernel.rlimits()...)
}

// coreLimit is 1 unless this process's hard limit is already 0, which it
// cannot raise (no CAP_SYS_RESOURCE in the host's user namespace): 0 stops
// file dumps too, and the backend refuses to start when the host pipes
// core dumps to a handler (checkCoreDumps).
func coreLimit() uint64 {
	var l unix.Rlimit
	if unix.Getrlimit(unix.RLIMIT_CORE, &l) == nil && l.Max == 0 {
		return 0
	}
	return 1
}

// checkCoreDumps fails when sandboxes could make the host run its core
// dump handler: a core_pattern that pipes to a program (which the kernel
// runs as host root, whatever RLIMIT_CORE is, except 1) while this
// process's hard RLIMIT_CORE is 0 and so cannot be set to 1 for them.
func checkCoreDumps() error {
	var l unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_CORE, &l); err != nil || l.Max != 0 {
		return err
	}
	pattern, err := os.ReadFile("/proc/sys/kernel/core_pattern")
	if err != nil || !strings.HasPrefix(string(pattern), "|") {
		return nil
	}
	return fmt.Errorf("the host pipes core dumps to %q, and this process's hard RLIMIT_CORE is 0, so sandboxes "+
		"cannot get the limit of 1 that stops the kernel from running that handler as root for their crashes; "+
		"start vivarium with a hard core limit of at least 1 (ulimit -Hc unlimited, or LimitCORE= in its unit)",
		strings.TrimSpace(string(pattern)))
}

// runnerRlimits are the same limits for a zygote's runner, which is not
// init's child and sets them itself.
func (cfg *initConfig) runnerRlimits() [][3]uint64 {
	var out [][3]uint64
	for _, l := range cfg.rlimits() {
		out = append(out, [3]uint64{uint64(l.resource), l.cur, l.max})
	}
	return out
}

func setRlimits(cfg *initConfig) error {
	for _, l := range cfg.rlimits() {
		// syscall.Setrlimit, not unix.Setrlimit: the runtime then passes
		// our RLIMIT_NOFILE to children instead of restoring its own.
		if err := syscall.Setrlimit(l.resource, &syscall.Rlimit{Cur: l.cur, Max: l.max}); err != nil {
			return step("rlimit "+l.name, err)
		}
	}
	return nil
}

// dropCapabilities empties the bounding set but for keep, empties the
// ambient set and locks the securebits so that nothing the sandbox
// executes can ever gain more. With keep empty (every sandbox but a
// build's step) uid 0 gets no capability from an exec either
// (SECBIT_NOROOT): the runner's setuid to the sandbox user then clears
// the permitted and effective sets, and root's commands have none.
func dropCapabilities(keep []uintptr) error {
	for c := uintptr(0); ; c++ {
		if slices.Contains(keep, c) {
			continue
		}
		if err := unix.Prctl(unix.PR_CAPBSET_DROP, c, 0, 0, 0); err != nil {
			if err == unix.EINVAL && c > 0 { // past the last capability
				break
			}
			return fmt.Errorf("bounding set, capability %d: %w", c, err)
		}
	}
	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil {
		return fmt.Errorf("ambient set: %w", err)
	}
	// linux/securebits.h
	const (
		noRoot                  = 1 << 0
		noRootLocked            = 1 << 1
		keepCapsLocked          = 1 << 5
		noCapAmbientRaise       = 1 << 6
		noCapAmbientRaiseLocked = 1 << 7
	)
	bits := keepCapsLocked | noCapAmbientRaise | noCapAmbientRaiseLocked
	if len(keep) == 0 {
		bits |= noRoot | noRootLocked
	}
	if err := unix.Prctl(unix.PR_SET_SECUREBITS, uintptr(bits), 0, 0, 0); err != nil {
		return fmt.Errorf("securebits: %w", err)
	}
	return nil
}

// buildCapabilities are what the root of a build's step keeps, so that
// a Dockerfile's RUN as root works as it does under Docker (apt-get
// dropping to its user _apt, useradd giving /etc/shadow to group shadow,
// chown in package scripts): Docker's default set for a container less
// what touches devices, raw sockets, file capabilities, chroot and the
// audit log. They are capabilities of the step's own user namespace,
// which maps only the sandbox's host range: they act on its own ids and
// files (an inode whose owner the namespace does not map, the host's
// /proc/sys or device nodes, stays out of their reach), never on the
// host's or another sandbox's. docs/security.md, "Templates".
var buildCapabilities = []uintptr{unix.CAP_CHOWN, unix.CAP_DAC_OVERRIDE, unix.CAP_FOWNER, unix.CAP_FSETID,
	unix.CAP_KILL, unix.CAP_SETGID, unix.CAP_SETUID, unix.CAP_NET_BIND_SERVICE}

// startRunner starts a runner as the sandbox user with fresh request and
// event pipes, and returns its pid and the supervisor's ends of the pipes
// (request writer, event reader). Fresh pipes per runner mean a runner
// killed in the middle of a frame cannot garble its successor's.
//
// A forked sandbox's runner comes from the zygote instead: init returns pid
// 0 and, after the supervisor's two ends, the runner's four descriptors
// (request reader, event writer, stdout, stderr) for the supervisor to hand
// to the zygote.
func startRunner(cfg *initConfig) (int, []int, error) {
	if cfg.Role == roleForked && len(cfg.RunnerArgs) == 0 {
		return runnerPipes()
	}
	path, args := cfg.Python, append([]string{cfg.Python}, cfg.RunnerArgs...)
	env := cfg.runnerEnv()
	if cfg.Image && cfg.Python == "" {
		// The template's python3, else a runner without Python
		// (runner.ServeNoPython), this binary again: /proc/self/exe is
		// init's own executable, wherever its root is.
		if p, err := lookPath("python3", cfg.Env); err == nil && !cfg.Build {
			path, args[0] = p, p
		} else {
			mode := runnerArgs(cfg.OneShot)
			path, args = "/proc/self/exe", []string{runner.NoPythonArg0, mode[len(mode)-1]}
			env = append(slices.Clip(env), initEnv...) // a Go program's, small
		}
	} else if _, err := os.Stat(cfg.Python); err != nil {
		return 0, nil, fmt.Errorf("python %s is not in the sandbox (only the host's /usr is visible): %w", cfg.Python, err)
	}
	reqR, reqW, err := os.Pipe()
	if err != nil {
		return 0, nil, err
	}
	defer reqR.Close()
	defer reqW.Close()
	evR, evW, err := os.Pipe()
	if err != nil {
		return 0, nil, err
	}
	defer evR.Close()
	defer evW.Close()
	if cfg.Role == roleForked {
		// A restored forked sandbox's runner, which init starts itself
		// (driver.Restart): confined as the zygote's are (runner.py).
		env = append(slices.Clip(env), "VIVARIUM_LANDLOCK=1")
	}
	cmd := &exec.Cmd{
		Path:        path,
		Args:        args,
		Env:         env,
		Dir:         cfg.startDir(),
		Stdout:      stdoutFile,
		Stderr:      stderrFile,
		ExtraFiles:  []*os.File{reqR, evW},
		SysProcAttr: userAttr(cfg),
	}
	if err := cmd.Start(); err != nil {
		return 0, nil, err
	}
	pid := cmd.Process.Pid
	cmd.Process.Release() // init reaps with wait4; drop Go's pidfd
	fds := make([]int, 0, 2)
	for _, f := range []*os.File{reqW, evR} {
		fd, err := unix.Dup(int(f.Fd()))
		if err != nil {
			closeAll(fds)
			return pid, nil, err
		}
		unix.CloseOnExec(fd)
		fds = append(fds, fd)
	}
	return pid, fds, nil
}

// runnerArgs are the interpreter's arguments that start a runner in the
// sandbox, a one-shot's or a lasting one's.
func runnerArgs(oneShot bool) []string { return scriptArgs(runner.ScriptName, oneShot) }

// scriptArgs are runnerArgs with script, a file of the runner's
// directory, as the entry point.
func scriptArgs(script string, oneShot bool) []string {
	mode := "--persistent"
	if oneShot {
		mode = "--oneshot"
	}
	return []string{"-s", "-B", runnerDir + "/" + script, mode}
}

// runnerEnv is the runner's environment: the sandbox's, and the fixed
// hash seed and preloads if any. The runner takes them out of os.environ
// at its start (runner.py), so that the sandbox's own programs get
// random seeds.
func (cfg *initConfig) runnerEnv() []string {
	if cfg.HashSeed == "" {
		return cfg.Env
	}
	return append(slices.Clip(cfg.Env), "PYTHONHASHSEED="+cfg.HashSeed, "VIVARIUM_FIXED_HASHSEED=1",
		"VIVARIUM_PRELOAD="+strings.Join(cfg.Preload, ","))
}

func runnerPipes() (int, []int, error) {
	var fds [4]int
	if err := unix.Pipe2(fds[:2], unix.O_CLOEXEC); err != nil { // request: r, w
		return 0, nil, err
	}
	if err := unix.Pipe2(fds[2:], unix.O_CLOEXEC); err != nil { // events: r, w
		closeAll(fds[:2])
		return 0, nil, err
	}
	out, err := unix.FcntlInt(uintptr(stdoutFile.Fd()), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		closeAll(fds[:])
		return 0, nil, err
	}
	errFD, err := unix.FcntlInt(uintptr(stderrFile.Fd()), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		closeAll(append(fds[:], out))
		return 0, nil, err
	}
	// Supervisor's: request writer, event reader; the runner's: request
	// reader, event writer, stdout, stderr.
	return 0, []int{fds[1], fds[2], fds[0], fds[3], out, errFD}, nil
}

// loopbackUp brings up lo, the only interface of the sandbox's network
// namespace, so that programs can talk to themselves over 127.0.0.1.
func loopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return err
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP | unix.IFF_RUNNING)
	return unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr)
}
