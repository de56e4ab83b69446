package native

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/vivarium-sandbox/vivarium/internal/runner"
	"github.com/vivarium-sandbox/vivarium/internal/seccomp"
)

// Control operations of a zygote's init. Init → supervisor: opZygote (the
// Python zygote's socket) once, then opSpawned for each opSpawnInit.
const (
	opZygote    = "zygote"     // the zygote started: PID, with the supervisor's end of its socket
	opSpawnInit = "spawn-init" // start a forked sandbox's init: ID, with its five descriptors
)

// zygoteInit is the life of a zygote's init (roleZygote), after the root is
// built. A zygote's init is root of the host's user namespace, in mount,
// PID, network, IPC and UTS namespaces of its own: it must create every
// forked sandbox's user namespace, owned by that sandbox's host user, and
// write its id maps (spawn_linux.go). It runs no user code. In order:
//  1. start the Python zygote as its own host user (cfg.ZygoteUID) with one
//     capability, CAP_SYS_ADMIN (ambient), which setns needs to place its
//     children in sandboxes' namespaces, with one end of a socket pair, and
//     pass the other end to the supervisor;
//  2. serve opSpawnInit: start a sandbox's init in new user, mount, PID,
//     network, IPC and UTS namespaces, the user namespace owned by the
//     sandbox's host user, the PID namespace a child of this one (where
//     the Python zygote can fork into it), and pass a pidfd of it back;
//  3. reap every child; end when the Python zygote does.
func zygoteInit(cfg *initConfig, report func(initStatus)) (int, error) {
	if err := buildRoot(cfg); err != nil {
		return 0, err
	}
	if err := os.Chdir("/"); err != nil {
		return 0, step("chdir /", err)
	}
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return 0, step("set non-dumpable", err)
	}
	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return 0, step("zygote socket", err)
	}
	zsock := os.NewFile(uintptr(pair[1]), "zygote")
	env := append(append([]string{}, cfg.Env...), "VIVARIUM_PRELOAD="+strings.Join(cfg.Preload, ","),
		// One BLAS thread: the zygote must stay single-threaded to fork
		// into other namespaces, and its children inherit the setting.
		"OPENBLAS_NUM_THREADS=1", "OMP_NUM_THREADS=1", "MKL_NUM_THREADS=1")
	python := cfg.Python
	if cfg.Image {
		// A template's zygote: its python3, by its PATH.
		p, err := lookPath("python3", cfg.Env)
		if err != nil {
			return 0, step("the template's python3", err)
		}
		python = p
	}
	// Through zygoteExec: the interpreter, and everything it runs before
	// zygote.py (a template's are the image's), starts confined.
	zyg := &exec.Cmd{
		Path: "/proc/self/exe",
		Args: []string{zygoteExecArg0, runnerDir + "/" + zygoteFilter, python, "-s", "-B",
			runnerDir + "/" + runner.ZygoteName},
		Env:        env,
		Dir:        "/",
		Stderr:     stderrFile, // tracebacks reach the supervisor's log
		ExtraFiles: []*os.File{zsock},
		SysProcAttr: &syscall.SysProcAttr{
			Pdeathsig:   syscall.SIGKILL,
			Credential:  &syscall.Credential{Uid: cfg.ZygoteUID, Gid: cfg.ZygoteUID},
			AmbientCaps: []uintptr{unix.CAP_SYS_ADMIN},
		},
	}
	if cfg.ZygoteUID == 0 {
		return 0, step("start the zygote", errors.New("no host user for the zygote"))
	}
	if err := zyg.Start(); err != nil {
		return 0, step("start the zygote", err)
	}
	zpid := zyg.Process.Pid
	zyg.Process.Release() // reaped below with wait4
	zsock.Close()
	report(initStatus{Event: "started"})
	sendCtl(fdControl, ctlMsg{Op: opZygote, PID: zpid}, pair[0])
	unix.Close(pair[0])

	sigchld := make(chan os.Signal, 16)
	signal.Notify(sigchld, syscall.SIGCHLD)
	type request struct {
		m   ctlMsg
		fds []int
	}
	reqs := make(chan request)
	go func() {
		defer close(reqs)
		// Init's five descriptors, and two sets of tasks files.
		buf, oob := make([]byte, maxControlMsg), make([]byte, unix.CmsgSpace(32*4))
		for {
			m, fds, err := recvCtl(fdControl, buf, oob)
			if err != nil {
				return
			}
			reqs <- request{m, fds}
		}
	}()
	for {
		select {
		case r, ok := <-reqs:
			if !ok {
				return 0, nil // the supervisor is gone
			}
			if r.m.Op != opSpawnInit {
				closeAll(r.fds)
				continue
			}
			pid, pidfd, err := spawnForkedInit(r.fds, r.m.Owner, r.m.Tasks)
			reply := ctlMsg{Op: opSpawned, ID: r.m.ID, PID: pid}
			if err != nil {
				reply.Error = err.Error()
				sendCtl(fdControl, reply)
				continue
			}
			sendCtl(fdControl, reply, pidfd)
			unix.Close(pidfd)
		case <-sigchld:
			for pid, ws := range reapAll(false) {
				if pid == zpid {
					st := initStatus{Event: "exit", Code: ws.ExitStatus()}
					if ws.Signaled() {
						st.Signal = int(ws.Signal())
						st.Code = 128 + st.Signal
					}
					report(st)
					return 1, nil
				}
			}
		}
	}
}

// zygoteExecArg0 is argv[0] of this binary re-executed by a zygote's init
// to start the Python zygote: zygoteExec.
const zygoteExecArg0 = "vivarium-zygote-exec"

// zygoteFilter is the zygote's seccomp filter, in its runner directory
// (zygoteRunnerFiles).
const zygoteFilter = "zygote.bpf"

// zygoteExec is the start of the Python zygote: as its host user, with
// CAP_SYS_ADMIN, it sets no_new_privs and loads the zygote's filter
// (filter, a file of the zygote's runner directory), then executes argv.
// A template's interpreter, its libraries, its site hooks and the modules
// it preloads are the image's: none of them runs before the filter
// (which refuses mount, unshare, bpf and the rest to what setns places
// in a sandbox), nor can gain a privilege by executing. It never returns.
func zygoteExec(filter string, argv []string) {
	fail := func(step string, err error) {
		fmt.Fprintf(os.Stderr, "zygote: %s: %v\n", step, err)
		os.Exit(125)
	}
	b, err := os.ReadFile(filter)
	if err != nil {
		fail("read its seccomp filter", err)
	}
	prog, err := seccomp.Decode(b)
	if err != nil {
		fail("its seccomp filter", err)
	}
	if err := seccomp.Install(prog); err != nil {
		fail("load its seccomp filter", err)
	}
	fail("execute "+argv[0], unix.Exec(argv[0], argv, os.Environ()))
}

// spawnForkedInit starts a forked sandbox's init (this binary again) with
// the five descriptors the supervisor sent, in order fdCtrl..fdControl,
// and closes them. Its user namespace is owned by, and maps 0 to, owner.
// With tasks, the five are followed by the tasks files of the sandbox's
// cgroup and of this init's own, tasks of each: init is born in its group
// (threadCgroup).
func spawnForkedInit(fds []int, owner uint32, tasks int) (pid, pidfd int, err error) {
	n := fdControl - fdCtrl + 1
	if tasks < 0 || len(fds) != n+2*tasks || owner == 0 {
		closeAll(fds)
		return 0, -1, unix.EINVAL
	}
	var cg *threadCgroup
	if tasks > 0 {
		defer closeAll(fds[n:])
		cg = &threadCgroup{into: fds[n : n+tasks], home: fds[n+tasks:]}
		fds = fds[:n]
	}
	files := make([]*os.File, len(fds))
	for i, fd := range fds {
		files[i] = os.NewFile(uintptr(fd), "init")
	}
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	cmd := initCommand("/proc/self/exe", files)
	// A session of its own, as a classic init's (initproc_linux.go):
	// CRIU dumps no tree whose session leader is outside it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := startOwned(cmd, owner, false, cg); err != nil {
		return 0, -1, err
	}
	pid = cmd.Process.Pid
	cmd.Process.Release()
	pidfd, err = unix.PidfdOpen(pid, 0)
	if err != nil {
		unix.Kill(pid, unix.SIGKILL)
		return 0, -1, err
	}
	return pid, pidfd, nil
}
