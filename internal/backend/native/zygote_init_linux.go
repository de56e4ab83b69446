package native

import (
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/vivarium-sandbox/vivarium/internal/runner"
)

// Control operations of a zygote's init. Init → supervisor: opZygote (the
// Python zygote's socket) once, then opSpawned for each opSpawnInit.
const (
	opZygote    = "zygote"     // the zygote started: PID, with the supervisor's end of its socket
	opSpawnInit = "spawn-init" // start a forked sandbox's init: ID, with its five descriptors
)

// zygoteInit is the life of a zygote's init (roleZygote), after the root is
// built. A zygote's init keeps root's capabilities in its user namespace:
// it must create every forked sandbox's namespaces, and its Python zygote
// must place children in them. Neither runs user code. In order:
//  1. start the Python zygote as root of this user namespace, with one end
//     of a socket pair, and pass the other end to the supervisor;
//  2. serve opSpawnInit: start a sandbox's init in new user, mount, PID,
//     network, IPC and UTS namespaces, nested in this one, and pass a pidfd
//     of it back;
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
	zyg := &exec.Cmd{
		Path:        cfg.Python,
		Args:        []string{cfg.Python, "-s", "-B", runnerDir + "/" + runner.ZygoteName},
		Env:         env,
		Dir:         "/",
		Stderr:      stderrFile, // tracebacks reach the supervisor's log
		ExtraFiles:  []*os.File{zsock},
		SysProcAttr: &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL},
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
		buf, oob := make([]byte, maxControlMsg), make([]byte, unix.CmsgSpace(8*4))
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
			pid, pidfd, err := spawnForkedInit(r.fds)
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

// spawnForkedInit starts a forked sandbox's init (this binary again) with
// the five descriptors the supervisor sent, in order fdCtrl..fdControl,
// and closes them.
// Its user namespace maps the same ids as this one: root of the sandbox is
// root here, which the kernel still confines to the sandbox's namespaces.
func spawnForkedInit(fds []int) (pid, pidfd int, err error) {
	if len(fds) != fdControl-fdCtrl+1 {
		closeAll(fds)
		return 0, -1, unix.EINVAL
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
	ids := []syscall.SysProcIDMap{{ContainerID: 0, HostID: 0, Size: 65536}}
	cmd := &exec.Cmd{
		Path:       "/proc/self/exe",
		Args:       []string{initArg0},
		Env:        initEnv,
		ExtraFiles: files,
		SysProcAttr: &syscall.SysProcAttr{
			Cloneflags: syscall.CLONE_NEWUSER | syscall.CLONE_NEWNS | syscall.CLONE_NEWPID |
				syscall.CLONE_NEWNET | syscall.CLONE_NEWIPC | syscall.CLONE_NEWUTS,
			UidMappings:                ids,
			GidMappings:                ids,
			GidMappingsEnableSetgroups: true,
			Credential:                 &syscall.Credential{Uid: 0, Gid: 0},
			Pdeathsig:                  syscall.SIGKILL,
		},
	}
	if err := cmd.Start(); err != nil {
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
