package native

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vivarium-sandbox/vivarium/internal/cgroups"
	"github.com/vivarium-sandbox/vivarium/internal/hostuid"
	"github.com/vivarium-sandbox/vivarium/internal/rootview"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

// A zygote makes sandboxes fast to start and cheap to keep. It is an init
// of its own (roleZygote: same root file system as every sandbox; a
// template's zygote, the template's layers) running a Python that has
// imported the runner and the preloaded modules once. For each sandbox:
//
//  1. the zygote's init starts the sandbox's init in new user, mount, PID,
//     network, IPC and UTS namespaces (roleForked), the user namespace owned
//     by the sandbox's own host user, as a classic init's is; that init
//     mounts the sandbox's own disk and /proc and confines itself exactly
//     as a classic init does;
//  2. the Python zygote forks a child into the sandbox's PID namespace; the
//     supervisor moves the child into the sandbox's cgroup; the child joins
//     the sandbox's other namespaces, drops every privilege, loads the
//     seccomp filter and becomes the sandbox's runner (zygote.py).
//
// Because each sandbox's user namespace is a child of the host's (it must
// be, for the sandbox to be charged as its own host user), the zygote's
// init and the Python zygote live in the host's user namespace, in mount,
// PID, network, IPC and UTS namespaces of their own: the zygote's init as
// root (it creates namespaces owned by other users and writes their id
// maps), the Python zygote as a host user of its own with one capability,
// CAP_SYS_ADMIN, which setns needs to place children in a sandbox's
// namespaces. Neither runs user code. A template's Python zygote runs the
// image's (its interpreter, site hooks and preloads), as hostile as user
// code: it starts confined (zygoteExec), its cgroup is bounded as a
// sandbox's, and it serves one tenant's sandboxes (zygoteKind).
//
// A fork takes a millisecond or two where starting Python and importing
// pandas take over a second, and the preloaded pages are shared
// copy-on-write by every sandbox. Nothing flows back: a child's writes are
// its own. What sandboxes of one zygote share is its memory layout, so a
// zygote is replaced after a number of sandboxes or an age (Config).
type zygote struct {
	b      *Backend
	python string
	// root is the template whose root and python3 the zygote has (nil:
	// the host's /usr and python), unhold lets go of its layers.
	root   *sandbox.Root
	tenant string // whose sandboxes a template's zygote serves
	unhold func()
	// rootMount is the id of a template's zygote's root, the mount its
	// sandboxes' runners map the template's files from.
	rootMount string
	owner     hostuid.Range // the Python zygote's host user
	started   time.Time
	init      *initProc
	reaped    chan struct{} // closed once init has exited and been reaped
	cg        cgroups.Group
	ctl       int // control socket to the zygote's init
	zs        int // socket to the Python zygote
	dead      chan struct{}

	ctlMu, zsMu sync.Mutex // one sender at a time per socket

	mu      sync.Mutex
	next    uint64
	used    time.Time // when it last started a sandbox
	forked  int       // sandboxes started from this zygote
	live    int       // of them, not yet closed
	retired bool      // replaced: closes when its last sandbox does
	spawns  map[uint64]chan spawnResult
	forks   map[uint64]chan forkResult
	exits   map[uint64]func(code, signal int)
	deadErr error

	// closeOnce: a retired zygote closes from a goroutine of its own, and
	// the backend's Close may close it at the same moment; a second
	// caller returns once the first is done, the zygote's processes gone.
	closeOnce sync.Once
}

type spawnResult struct {
	pidfd int
	err   error
}

type forkResult struct {
	pid, pidfd int
	err        error
}

// zygoteMessage is what the Python zygote says.
type zygoteMessage struct {
	Op     string            `json:"op"`
	Token  uint64            `json:"token"`
	PID    int               `json:"pid"`
	Code   int               `json:"code"`
	Signal int               `json:"signal"`
	Error  string            `json:"error"`
	Errors map[string]string `json:"errors"`
	// Landlock is the kernel's Landlock ABI, which children confine their
	// file access with (0: none).
	Landlock int `json:"landlock"`
}

// forkRequest asks the Python zygote for a runner.
type forkRequest struct {
	Op      string      `json:"op"`
	Token   uint64      `json:"token"`
	Mode    string      `json:"mode"`
	Env     []string    `json:"env"`
	UID     int         `json:"uid"`
	GID     int         `json:"gid"`
	Groups  []uint32    `json:"groups,omitempty"` // supplementary
	Dir     string      `json:"dir"`
	Rlimits [][3]uint64 `json:"rlimits"`
	// Adopt: the runner is handed to the sandbox's init, its parent from
	// then on (zygote.py's _fork_adopted), which reports its end.
	Adopt bool `json:"adopt,omitempty"`
}

// templateZygoteMemory is the memory limit of a template's zygote: its
// interpreter with the preloads imported (numpy, pandas and matplotlib
// take about 150 MiB).
const templateZygoteMemory = 1 << 30

// zygoteStartTimeout bounds the zygote's start-up: importing pandas and
// matplotlib takes a few seconds on a busy machine.
const zygoteStartTimeout = 3 * time.Minute

// startZygote starts a zygote of a kind, with the backend's preloads.
func (b *Backend) startZygote(ctx context.Context, kind zygoteKind, etc []rootview.File, top []rootview.TopDir) (_ *zygote, err error) {
	python, root := kind.python, kind.root
	files, err := zygoteRunnerFiles()
	if err != nil {
		return nil, err
	}
	cfg := &initConfig{
		Python:      python,
		RunnerFiles: files,
		Env:         sandboxEnv(rootEnv(root)),
		Etc:         etc,
		TopLevel:    top,
		DiskBytes:   64 << 20, // the zygote's own /tmp
		OpenFiles:   4096,
		Role:        roleZygote,
		Preload:     b.cfg.Preload,
		Devices:     b.devices,
	}
	if root != nil {
		cfg.Image, cfg.Python = true, ""
	}
	z := &zygote{
		b: b, python: python, root: root, tenant: kind.tenant, ctl: -1, zs: -1, dead: make(chan struct{}), started: time.Now(), used: time.Now(),
		spawns: map[uint64]chan spawnResult{}, forks: map[uint64]chan forkResult{},
		exits: map[uint64]func(int, int){},
	}
	defer func() {
		if err != nil {
			z.close()
			err = fmt.Errorf("%w: zygote: %w", sandbox.ErrSetup, err)
		}
	}()
	if z.owner, err = b.uids.Acquire(); err != nil {
		z.owner = hostuid.Range{}
		return nil, err
	}
	cfg.ZygoteUID = z.owner.First
	if b.cgroups != nil {
		// No memory limit for the host's interpreter: the zygote's pages
		// are shared by every sandbox forked from it, and an OOM kill
		// would take them all down. A template's runs the image's code:
		// bounded as a sandbox is, in its tenant's group.
		limits := cgroups.Limits{Pids: 256}
		if root != nil {
			limits = cgroups.Limits{Pids: 256, MemoryBytes: templateZygoteMemory, Tenant: kind.tenant}
			if b.cgroups.CPUController() {
				// Without the controller no sandbox has a CPU cap
				// either (--cpus is refused): memory and processes
				// bound it there.
				limits.CPUs = 1
			}
		}
		if z.cg, err = b.cgroups.New("zygote-"+newID(), limits); err != nil {
			return nil, err
		}
	}
	p, err := newInitPipes()
	if err != nil {
		return nil, err
	}
	defer p.closeChild()
	defer p.closeParent()
	z.ctl = p.ctl
	cgfd := -1
	if z.cg != nil {
		cgfd = z.cg.IntoFD()
	}
	if z.init, err = startZygoteInit(b.cfg.Exe, p.child, cgfd); err != nil {
		return nil, err
	}
	initDone := make(chan struct{})
	z.reaped = initDone
	go func() {
		z.init.wait()
		close(initDone)
		z.die(errors.New("the zygote's init exited"))
	}()
	p.closeChild()
	if z.cg != nil && !z.init.inCgroup {
		if err := z.cg.AddProc(z.init.pid); err != nil {
			return nil, err
		}
	}
	if root != nil {
		if err := z.sendRoot(); err != nil {
			return nil, err
		}
	}
	go b.logLines("zygote", p.stderrR)
	p.stderrR = nil
	go discard(p.stdoutR)
	p.stdoutR = nil
	status := make(chan initStatus, 4)
	go func(r *os.File) {
		defer r.Close()
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			var st initStatus
			if json.Unmarshal(sc.Bytes(), &st) == nil {
				select {
				case status <- st:
				default:
				}
			}
		}
	}(p.statusR)
	p.statusR = nil
	if err := json.NewEncoder(p.ctrlW).Encode(cfg); err != nil {
		return nil, fmt.Errorf("send config: %w", err)
	}
	p.ctrlW.Close()
	p.ctrlW = nil

	// The zygote's init passes the Python zygote's socket first.
	zsSet := make(chan struct{})
	go z.readControl(zsSet)
	timer := time.NewTimer(zygoteStartTimeout)
	defer timer.Stop()
wait:
	for {
		select {
		case st := <-status:
			if st.Event == "error" {
				return nil, fmt.Errorf("%s: %s", st.Step, st.Error)
			}
		case <-zsSet:
			break wait
		case <-initDone:
			return nil, errors.New("the zygote's init exited during setup")
		case <-timer.C:
			return nil, errors.New("the zygote's init did not start in time")
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	zsReady := make(chan zygoteMessage, 1)
	go z.readZygote(zsReady)
	select {
	case m := <-zsReady:
		for mod, e := range m.Errors {
			if root != nil {
				// A template has what it has: a module it lacks is
				// imported by no sandbox of it either.
				b.log.Debug("zygote: a module of the template's was not preloaded", "template", root.Template, "module", mod, "err", e)
				continue
			}
			b.log.Warn("zygote: a module could not be preloaded", "module", mod, "err", e)
		}
		if m.Landlock == 0 {
			b.log.Warn("zygote: this kernel has no Landlock (CONFIG_SECURITY_LANDLOCK, lsm=landlock): the sandboxes " +
				"forked from a zygote can open its interpreter's file through /proc/self/exe, one file they share " +
				"(a lock on it is seen by all of them); run without --zygote to avoid it")
		}
	case <-z.dead:
		return nil, z.deadErr
	case <-timer.C:
		return nil, fmt.Errorf("the zygote did not import its modules within %v", zygoteStartTimeout)
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if root != nil {
		// Its init lives (z.dead is open): the pid is its.
		var stx unix.Statx_t
		err := unix.Statx(unix.AT_FDCWD, fmt.Sprintf("/proc/%d/root", z.init.pid), 0, unix.STATX_MNT_ID, &stx)
		if err != nil || stx.Mask&unix.STATX_MNT_ID == 0 || !z.alive() {
			return nil, fmt.Errorf("the id of its root's mount (statx, Linux 5.8): %v", err)
		}
		z.rootMount = strconv.FormatUint(stx.Mnt_id, 10)
	}
	return z, nil
}

// startZygoteInit starts a zygote's init as root of the host's user
// namespace, in new mount, PID, network, IPC and UTS namespaces.
func startZygoteInit(exe string, child []*os.File, cgroupFD int) (*initProc, error) {
	cmd := initCommand(exe, child)
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags: syscall.CLONE_NEWNS | syscall.CLONE_NEWPID | syscall.CLONE_NEWNET |
			syscall.CLONE_NEWIPC | syscall.CLONE_NEWUTS,
	}
	p := &initProc{cmd: cmd, pidfd: -1}
	if cgroupFD >= 0 {
		cmd.SysProcAttr.UseCgroupFD = true
		cmd.SysProcAttr.CgroupFD = cgroupFD
		p.inCgroup = true
	}
	if err := spawnCmd(cmd, 0); err != nil {
		return nil, fmt.Errorf("start the zygote's init: %w", err)
	}
	p.pid = cmd.Process.Pid
	return p, nil
}

// acquire counts a sandbox started from the zygote; release, its end.
func (z *zygote) acquire() {
	z.mu.Lock()
	z.used = time.Now()
	z.forked++
	z.live++
	z.mu.Unlock()
}

// lastUsed is when the zygote last started a sandbox (or itself).
func (z *zygote) lastUsed() time.Time {
	z.mu.Lock()
	defer z.mu.Unlock()
	return z.used
}

func (z *zygote) release() {
	z.mu.Lock()
	z.live--
	last := z.retired && z.live == 0
	z.mu.Unlock()
	if last {
		go z.closeRetired()
	}
}

func (z *zygote) closeRetired() {
	z.close()
	z.b.dropRetired(z)
}

// expired reports whether the zygote has served its number of sandboxes
// or its time.
func (z *zygote) expired() bool {
	cfg := z.b.cfg
	z.mu.Lock()
	defer z.mu.Unlock()
	return (cfg.ZygoteMaxSandboxes > 0 && z.forked >= cfg.ZygoteMaxSandboxes) ||
		(cfg.ZygoteMaxAge > 0 && time.Since(z.started) >= cfg.ZygoteMaxAge)
}

// retire marks a replaced zygote: it serves its sandboxes' restarts (their
// PID namespaces are under its own) and closes with the last of them.
func (z *zygote) retire() {
	z.mu.Lock()
	z.retired = true
	last := z.live == 0
	z.mu.Unlock()
	if last {
		go z.closeRetired()
	}
}

// readControl follows the zygote's init: first the Python zygote's socket,
// then replies to spawns.
func (z *zygote) readControl(zsSet chan<- struct{}) {
	buf, oob := make([]byte, 64<<10), make([]byte, unix.CmsgSpace(4*4))
	for {
		m, fds, err := recvCtl(z.ctl, buf, oob)
		if err != nil {
			z.die(fmt.Errorf("the zygote's init: %w", err))
			return
		}
		switch m.Op {
		case opZygote:
			if len(fds) != 1 {
				closeAll(fds)
				continue
			}
			z.mu.Lock()
			set := z.zs < 0
			if set {
				z.zs = fds[0]
				fds = nil
			}
			z.mu.Unlock()
			closeAll(fds)
			if set {
				close(zsSet)
			}
		case opSpawned:
			res := spawnResult{pidfd: -1}
			switch {
			case m.Error != "":
				res.err = errors.New(m.Error)
				closeAll(fds)
			case len(fds) != 1:
				res.err = errors.New("no pidfd for the new init")
				closeAll(fds)
			default:
				res.pidfd = fds[0]
			}
			z.mu.Lock()
			ch := z.spawns[m.ID]
			delete(z.spawns, m.ID)
			z.mu.Unlock()
			if ch == nil {
				if res.pidfd >= 0 {
					unix.PidfdSendSignal(res.pidfd, unix.SIGKILL, nil, 0)
					unix.Close(res.pidfd)
				}
				continue
			}
			ch <- res
		default:
			closeAll(fds)
		}
	}
}

// readZygote follows the Python zygote: its readiness, forks and exits.
func (z *zygote) readZygote(ready chan<- zygoteMessage) {
	buf, oob := make([]byte, 64<<10), make([]byte, unix.CmsgSpace(4*4))
	for {
		n, oobn, flags, _, err := unix.Recvmsg(z.zs, buf, oob, unix.MSG_CMSG_CLOEXEC)
		if err == unix.EINTR {
			continue
		}
		var fds []int
		if err == nil && oobn > 0 {
			cmsgs, _ := unix.ParseSocketControlMessage(oob[:oobn])
			for _, c := range cmsgs {
				if got, err := unix.ParseUnixRights(&c); err == nil {
					fds = append(fds, got...)
				}
			}
		}
		if err != nil || n == 0 || flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0 {
			closeAll(fds)
			z.die(errors.New("the zygote exited"))
			return
		}
		var m zygoteMessage
		if json.Unmarshal(buf[:n], &m) != nil {
			closeAll(fds)
			continue
		}
		switch m.Op {
		case "ready":
			select {
			case ready <- m:
			default:
			}
			closeAll(fds)
		case "forked", "fork_failed":
			res := forkResult{pid: m.PID, pidfd: -1}
			if m.Op == "fork_failed" || len(fds) != 1 {
				res.err = fmt.Errorf("fork: %s", m.Error)
				closeAll(fds)
			} else {
				res.pidfd = fds[0]
			}
			z.mu.Lock()
			ch := z.forks[m.Token]
			delete(z.forks, m.Token)
			z.mu.Unlock()
			if ch == nil {
				if res.pidfd >= 0 {
					unix.PidfdSendSignal(res.pidfd, unix.SIGKILL, nil, 0)
					unix.Close(res.pidfd)
				}
				continue
			}
			ch <- res
		case "exited":
			closeAll(fds)
			z.mu.Lock()
			fn := z.exits[m.Token]
			delete(z.exits, m.Token)
			z.mu.Unlock()
			if fn != nil {
				fn(m.Code, m.Signal)
			}
		default:
			closeAll(fds)
		}
	}
}

// die marks the zygote unusable and fails whatever waits on it.
func (z *zygote) die(err error) {
	z.mu.Lock()
	defer z.mu.Unlock()
	if isClosed(z.dead) {
		return
	}
	z.deadErr = err
	close(z.dead)
	for id, ch := range z.spawns {
		ch <- spawnResult{pidfd: -1, err: err}
		delete(z.spawns, id)
	}
	for id, ch := range z.forks {
		ch <- forkResult{pidfd: -1, err: err}
		delete(z.forks, id)
	}
	exits := z.exits
	z.exits = map[uint64]func(int, int){}
	go func() {
		// Runners of a dead zygote are orphans whose end nobody reports:
		// their sandboxes must not wait for it.
		for _, fn := range exits {
			fn(128+int(syscall.SIGKILL), int(syscall.SIGKILL))
		}
	}()
}

func (z *zygote) alive() bool { return !isClosed(z.dead) }

// token reserves an id for a request.
func (z *zygote) token() uint64 {
	z.mu.Lock()
	defer z.mu.Unlock()
	z.next++
	return z.next
}

// spawnInit asks the zygote's init to start a forked sandbox's init with
// the given descriptors (in order fdCtrl..fdControl).
func (z *zygote) spawnInit(ctx context.Context, child []*os.File, tasks *groupTasks, owner uint32) (*initProc, error) {
	id := z.token()
	ch := make(chan spawnResult, 1)
	z.mu.Lock()
	if isClosed(z.dead) {
		z.mu.Unlock()
		return nil, z.deadErr
	}
	z.spawns[id] = ch
	z.mu.Unlock()
	fds := make([]int, len(child))
	for i, f := range child {
		fds[i] = int(f.Fd())
	}
	m := ctlMsg{Op: opSpawnInit, ID: id, Owner: owner}
	if tasks != nil {
		// cgroup v1: the zygote's init starts it in its group, and goes
		// back to the zygote's (threadCgroup).
		if home := openGroupTasks(z.cg); home != nil && len(home.files) == len(tasks.files) {
			defer home.close()
			m.Tasks = len(tasks.files)
			fds = append(append(fds, tasks.fds()...), home.fds()...)
		} else {
			home.close()
		}
	}
	z.ctlMu.Lock()
	err := sendCtl(z.ctl, m, fds...)
	z.ctlMu.Unlock()
	if err != nil {
		z.mu.Lock()
		delete(z.spawns, id)
		z.mu.Unlock()
		return nil, fmt.Errorf("zygote: %w", err)
	}
	var res spawnResult
	select {
	case res = <-ch:
	case <-ctx.Done():
		z.mu.Lock()
		delete(z.spawns, id)
		z.mu.Unlock()
		return nil, ctx.Err()
	}
	if res.err != nil {
		return nil, fmt.Errorf("start init: %w", res.err)
	}
	pid, err := pidfdPID(res.pidfd)
	if err != nil {
		unix.PidfdSendSignal(res.pidfd, unix.SIGKILL, nil, 0)
		unix.Close(res.pidfd)
		return nil, err
	}
	return &initProc{pid: pid, pidfd: res.pidfd, inCgroup: m.Tasks > 0}, nil
}

// fork asks the Python zygote for a runner. fds are the sandbox init's
// namespaces (nsKinds), the runner's request reader, event writer, stdout
// and stderr, and the read end of the "go" pipe; they are sent, not
// closed. onExit is called once when the runner has exited, unless the
// runner is adopted by the sandbox's init (req.Adopt; onExit nil).
func (z *zygote) fork(ctx context.Context, req forkRequest, fds []int, onExit func(code, signal int)) (forkResult, error) {
	req.Op = "fork"
	req.Token = z.token()
	ch := make(chan forkResult, 1)
	z.mu.Lock()
	if isClosed(z.dead) {
		z.mu.Unlock()
		return forkResult{}, z.deadErr
	}
	z.forks[req.Token] = ch
	if onExit != nil {
		z.exits[req.Token] = onExit
	}
	z.mu.Unlock()
	body, err := json.Marshal(req)
	if err == nil {
		z.zsMu.Lock()
		err = unix.Sendmsg(z.zs, body, unix.UnixRights(fds...), nil, 0)
		z.zsMu.Unlock()
	}
	if err != nil {
		z.mu.Lock()
		delete(z.forks, req.Token)
		delete(z.exits, req.Token)
		z.mu.Unlock()
		return forkResult{}, fmt.Errorf("zygote: %w", err)
	}
	select {
	case res := <-ch:
		if res.err != nil {
			z.mu.Lock()
			delete(z.exits, req.Token)
			z.mu.Unlock()
		}
		return res, res.err
	case <-ctx.Done():
		// The fork may still come: readZygote kills what nobody awaits.
		z.mu.Lock()
		delete(z.forks, req.Token)
		delete(z.exits, req.Token)
		z.mu.Unlock()
		return forkResult{}, ctx.Err()
	}
}

// close kills the zygote, its init, and with it every sandbox it started.
func (z *zygote) close() { z.closeOnce.Do(z.doClose) }

func (z *zygote) doClose() {
	if z.init != nil {
		z.init.kill()
	}
	z.die(errors.New("zygote closed"))
	if z.ctl >= 0 {
		unix.Shutdown(z.ctl, unix.SHUT_RDWR)
	}
	z.mu.Lock()
	if z.zs >= 0 {
		unix.Shutdown(z.zs, unix.SHUT_RDWR)
	}
	z.mu.Unlock()
	if z.cg != nil {
		z.cg.Destroy()
	}
	if z.reaped != nil {
		// Not a zombie of ours once close returns.
		select {
		case <-z.reaped:
		case <-time.After(10 * time.Second):
		}
	}
	if z.owner.First != 0 {
		z.b.releaseOwner(z.owner)
	}
	if z.unhold != nil {
		z.unhold()
	}
}

// pidfdPID reads the host pid a pidfd refers to.
func pidfdPID(pidfd int) (int, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/self/fdinfo/%d", pidfd))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "Pid:"); ok {
			pid, err := strconv.Atoi(strings.TrimSpace(v))
			if err != nil || pid <= 0 {
				return 0, fmt.Errorf("pidfd %d: the process is gone", pidfd)
			}
			return pid, nil
		}
	}
	return 0, fmt.Errorf("pidfd %d: no pid in fdinfo (Linux 5.3 or later needed)", pidfd)
}

// nsPID reads the pid a host process has in its innermost PID namespace.
func nsPID(hostPID int) (int, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", hostPID))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "NSpid:"); ok {
			f := strings.Fields(v)
			if len(f) > 0 {
				return strconv.Atoi(f[len(f)-1])
			}
		}
	}
	return 0, errors.New("no NSpid")
}

// waitPidfd returns when the process a pidfd refers to has exited. It
// waits in the runtime's poller, not on a thread of its own.
func waitPidfd(pidfd int) error {
	fd, err := unix.FcntlInt(uintptr(pidfd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return err
	}
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return err
	}
	f := os.NewFile(uintptr(fd), "pidfd")
	defer f.Close()
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	return rc.Read(func(fd uintptr) bool {
		pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, _ := unix.Poll(pfd, 0)
		return n > 0
	})
}

// logLines logs what a zygote writes on stderr (tracebacks), bounded: a
// template's zygote runs the image's code, which could write without end.
func (b *Backend) logLines(who string, r *os.File) {
	defer r.Close()
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 4096), 64<<10)
	for n := 0; sc.Scan(); n++ {
		if n == maxLoggedLines {
			b.log.Warn(who+" says more; the rest is not logged", "lines", n)
			break
		}
		b.log.Warn(who+" says", "line", sc.Text())
	}
	discard(r)
}

// maxLoggedLines bounds the lines logged of a zygote's stderr.
const maxLoggedLines = 200

func discard(r *os.File) {
	buf := make([]byte, 32<<10)
	for {
		if _, err := r.Read(buf); err != nil {
			r.Close()
			return
		}
	}
}
