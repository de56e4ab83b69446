package native

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vivarium-sandbox/vivarium/internal/cgroups"
	"github.com/vivarium-sandbox/vivarium/internal/hostuid"
	"github.com/vivarium-sandbox/vivarium/internal/runner"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/workspace"
)

// Bounds on what the runner may send back per execution.
const (
	maxFrame        = 16 << 20 // one event
	maxResultsBytes = 64 << 20 // all rich results of one execution
	maxResults      = 10000    // rich results of one execution
	// resultOverhead is what a result costs beyond its content: an empty
	// one is not free to receive, parse and keep.
	resultOverhead = 256
	setupTimeout   = 60 * time.Second
	// How long to wait for output pipes to close once every process of
	// the sandbox is dead. They close at once; this only guards a bug.
	drainTimeout = 5 * time.Second
)

// Sandbox is one running native sandbox.
type Sandbox struct {
	id       string
	b        *Backend
	spec     sandbox.Spec
	init     *initProc
	z        *zygote       // the zygote that forks runners; nil: init starts them
	cg       cgroups.Group // nil without cgroups
	owner    hostuid.Range // the host user the sandbox is
	hasOwner bool          // owner is held, and released by Close
	ws       *workspace.Dir
	ctl      int // control socket to init
	stdout   *capture
	stderr   *capture
	initErr  error         // how init exited; valid once initDone is closed
	initDone chan struct{} // closed when init has exited and been reaped

	// From init's status pipe.
	statusMu   sync.Mutex
	setupError string        // init's "error" message
	runnerExit *initStatus   // init's "exit" message (one-shot)
	runnerGone chan struct{} // closed when runnerExit is set
	statusDone chan struct{}

	// From init's control socket.
	mu        sync.Mutex
	cfg       *initConfig
	failed    chan struct{} // closed when a zygote could not give a runner
	failErr   error         // why; valid once failed is closed
	runner    *runnerProc   // the current runner; nil while one starts
	runnerSet chan struct{} // closed and replaced when runner changes
	cur       *execution    // receives the current runner's events
	spawns    map[uint64]chan spawnReply
	procs     map[uint64]*process
	nextID    uint64
	lost      bool // the runner died since the last execution
	ctlDone   chan struct{}
	ctlRead   bool // readControl was started: ctlDone will be closed
	sendMu    sync.Mutex

	execMu sync.Mutex // one execution (or restart) at a time
	used   bool       // a one-shot sandbox has run its execution

	contexts *runner.Contexts

	// Closed when the proxy (Spec.Egress), serving on its listener in the
	// sandbox, has returned; nil without one.
	egressDone chan struct{}

	closeOnce sync.Once
	closeErr  error
}

var (
	_ sandbox.Sandbox    = (*Sandbox)(nil)
	_ sandbox.Prober     = (*Sandbox)(nil)
	_ sandbox.MemoryUser = (*Sandbox)(nil)
)

// Alive implements sandbox.Prober: init runs and a runner is ready.
func (s *Sandbox) Alive() bool {
	if isClosed(s.initDone) || isClosed(s.failed) {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.runner
	return r != nil && isClosed(r.ready) && !isClosed(r.exited)
}

// MemoryPSS implements sandbox.MemoryUser from the smaps_rollup of every
// process in the sandbox's cgroup.
func (s *Sandbox) MemoryPSS() (int64, error) {
	if s.cg == nil {
		return 0, errors.New("no cgroup: the sandbox's processes are not known")
	}
	pids, err := s.cg.Procs()
	if err != nil {
		return 0, err
	}
	var total int64
	for _, pid := range pids {
		total += pss(pid)
	}
	return total, nil
}

// pss reads a process's proportional set size in bytes (0 if it is gone).
func pss(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "Pss:"); ok {
			f := strings.Fields(v)
			if len(f) > 0 {
				kb, _ := strconv.ParseInt(f[0], 10, 64)
				return kb << 10
			}
		}
	}
	return 0
}

// runnerProc is one Python runner process and its pipes.
type runnerProc struct {
	pid    int
	events *eventsReader // its event pipe, as readEvents reads it
	reqW   *os.File
	reqMu  sync.Mutex    // one frame at a time on reqW
	ready  chan struct{} // closed at its "ready" event
	exited chan struct{} // closed when init reports its end
	exit   ctlMsg        // valid once exited is closed
	evDone chan struct{} // its event stream ended
	broken error         // it broke the protocol; under Sandbox.mu
	// A zygote's runner: a pidfd to signal it (-1 when none or gone),
	// under Sandbox.mu.
	pidfd int
}

// request writes one frame to the runner.
func (r *runnerProc) request(v any) error {
	r.reqMu.Lock()
	defer r.reqMu.Unlock()
	return runner.WriteFrame(r.reqW, v)
}

// ack acknowledges a result if the pipe has room, and drops the ack
// otherwise: the runner waits for at most one at a time, and a flood of
// forged results must not block the supervisor (an ack is far below
// PIPE_BUF, so it is written whole or not at all).
func (r *runnerProc) ack() {
	r.reqMu.Lock()
	defer r.reqMu.Unlock()
	rc, err := r.reqW.SyscallConn()
	if err != nil {
		return
	}
	rc.Write(func(fd uintptr) bool {
		unix.Write(int(fd), ackFrame) // EAGAIN: dropped
		return true
	})
}

// ackFrame is the runner.Request{Type: "ack"} frame.
var ackFrame = func() []byte {
	var b bytes.Buffer
	runner.WriteFrame(&b, runner.Request{Type: "ack"})
	return b.Bytes()
}()

// hangUp closes the request pipe: a runner waiting for an ack, or for its
// next request, sees the end of it.
func (r *runnerProc) hangUp() {
	r.reqMu.Lock()
	defer r.reqMu.Unlock()
	r.reqW.Close()
}

// closePidfd forgets the runner's pidfd; called with Sandbox.mu held, so
// that no one signals a reused descriptor.
func (r *runnerProc) closePidfd() {
	if r.pidfd >= 0 {
		unix.Close(r.pidfd)
		r.pidfd = -1
	}
}

type spawnReply struct {
	msg ctlMsg
	p   *process // nil when the spawn failed
}

// execution collects the events of one Execute call.
type execution struct {
	runner       *runnerProc
	results      []sandbox.Output
	resultsBytes int
	dropped      int
	err          *sandbox.Error
	exitCode     *int
	done         chan struct{} // closed at the runner's "done"
	resultSink   sandbox.ResultSink
}

// start launches init in new namespaces and waits until the runner inside
// is ready for code. With a zygote, the zygote's init starts this init and
// the zygote forks its runners.
func start(ctx context.Context, b *Backend, spec sandbox.Spec, cfg *initConfig, z *zygote) (_ *Sandbox, err error) {
	s := &Sandbox{
		id: newID(), b: b, spec: spec, ctl: -1, z: z, cfg: cfg, failed: make(chan struct{}),
		initDone: make(chan struct{}), statusDone: make(chan struct{}), runnerGone: make(chan struct{}),
		runnerSet: make(chan struct{}), ctlDone: make(chan struct{}),
		spawns: map[uint64]chan spawnReply{}, procs: map[uint64]*process{}, contexts: runner.NewContexts(workspacePath),
	}
	defer func() {
		if err != nil {
			s.Close()
			err = fmt.Errorf("%w: %w", sandbox.ErrSetup, err)
		}
	}()
	if s.owner, err = b.uids.Acquire(); err != nil {
		return nil, err
	}
	s.hasOwner = true
	if b.cgroups != nil {
		s.cg, err = b.cgroups.New(s.id, cgroups.Of(spec))
		if err != nil {
			return nil, err
		}
	}
	devs, err := makeDevices(b.devices, s.id)
	if err != nil {
		return nil, err
	}
	// Bound by init before its runner starts: not needed once it is ready.
	defer os.RemoveAll(devs)
	cfg.Devices = devs
	if z != nil {
		cfg.Devices = filepath.Join("/", hostDirs, "devices", s.id)
	}
	p, err := newInitPipes()
	if err != nil {
		return nil, err
	}
	defer p.closeChild()
	s.ctl = p.ctl
	defer p.ctrlW.Close()
	if z == nil {
		var cgfd = -1
		if s.cg != nil {
			cgfd = s.cg.IntoFD()
		}
		s.init, err = b.execInit(p.child, cgfd, s.owner.First)
	} else {
		s.init, err = z.spawnInit(ctx, p.child, s.owner.First)
	}
	if err != nil {
		p.closeParent()
		return nil, err
	}
	if spec.Egress != nil {
		// Before init's wait begins: until then its pid is its own.
		if err := s.startEgress(spec.Egress); err != nil {
			s.init.kill()
			s.init.wait()
			close(s.initDone)
			p.closeParent()
			return nil, err
		}
	}
	go func() {
		s.initErr = s.init.wait()
		close(s.initDone)
	}()
	p.closeChild()
	if s.cg != nil && !s.init.inCgroup {
		// Moved in before it receives its config, so before it does
		// anything on the sandbox's behalf.
		if err := s.cg.AddProc(s.init.pid); err != nil {
			p.closeParent()
			return nil, err
		}
	}
	if s.stdout, err = newCapture(p.stdoutR); err != nil {
		return nil, err
	}
	if s.stderr, err = newCapture(p.stderrR); err != nil {
		return nil, err
	}
	go s.readStatus(p.statusR)
	s.ctlRead = true
	go s.readControl()

	if err := json.NewEncoder(p.ctrlW).Encode(cfg); err != nil {
		return nil, fmt.Errorf("send config to init: %w", err)
	}
	p.ctrlW.Close()

	timer := time.NewTimer(setupTimeout)
	defer timer.Stop()
	select {
	case <-s.readyRunner(ctx):
	case <-s.initDone:
		<-s.statusDone
		return nil, s.setupFailure()
	case <-s.runnerFailed():
		return nil, s.setupFailure()
	case <-timer.C:
		return nil, fmt.Errorf("the runner was not ready within %v", setupTimeout)
	case <-ctx.Done():
		return nil, ctx.Err()
	}

	// The workspace, held open from the host: files go in and out through
	// this descriptor, and it outlives the sandbox's mount namespace, so
	// files can be collected after every sandboxed process is dead. No user
	// code has run yet, so the path cannot have been tampered with.
	wsPath := fmt.Sprintf("/proc/%d/root%s", s.init.pid, workspacePath)
	if s.ws, err = workspace.Open(wsPath, int(s.owner.ID(SandboxUID)), int(s.owner.ID(SandboxGID))); err != nil {
		return nil, err
	}
	return s, nil
}

// startEgress binds the proxy's listener in the sandbox's network
// namespace and serves the proxy on it, before any code of the sandbox
// runs.
func (s *Sandbox) startEgress(e sandbox.Egress) error {
	ns, err := openNetns(s.init)
	if err != nil {
		return err
	}
	defer ns.Close()
	l, err := listenIn(ns)
	if err != nil {
		return err
	}
	s.egressDone = make(chan struct{})
	go func() {
		defer close(s.egressDone)
		e.Serve(l)
	}()
	return nil
}

// initPipes are the descriptors between the supervisor and a new init:
// the supervisor's ends, and init's in the order fdCtrl..fdControl.
type initPipes struct {
	ctrlW                     *os.File
	statusR, stdoutR, stderrR *os.File
	ctl                       int
	child                     []*os.File
}

func newInitPipes() (_ *initPipes, err error) {
	p := &initPipes{ctl: -1}
	defer func() {
		if err != nil {
			p.closeChild()
			p.closeParent()
			if p.ctl >= 0 {
				unix.Close(p.ctl)
			}
		}
	}()
	pipe := func(parentReads bool) (*os.File, error) {
		r, w, err := os.Pipe()
		if err != nil {
			return nil, err
		}
		if parentReads {
			p.child = append(p.child, w)
			return r, nil
		}
		p.child = append(p.child, r)
		return w, nil
	}
	if p.ctrlW, err = pipe(false); err != nil {
		return p, err
	}
	if p.statusR, err = pipe(true); err != nil {
		return p, err
	}
	if p.stdoutR, err = pipe(true); err != nil {
		return p, err
	}
	if p.stderrR, err = pipe(true); err != nil {
		return p, err
	}
	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return p, err
	}
	p.ctl = pair[0]
	p.child = append(p.child, os.NewFile(uintptr(pair[1]), "control"))
	return p, nil
}

func (p *initPipes) closeChild() {
	for _, f := range p.child {
		f.Close()
	}
	p.child = nil
}

// closeParent closes the supervisor's pipe ends (not the control socket,
// which the Sandbox owns).
func (p *initPipes) closeParent() {
	for _, f := range []*os.File{p.ctrlW, p.statusR, p.stdoutR, p.stderrR} {
		if f != nil {
			f.Close()
		}
	}
}

// initProc is a running init, started by the supervisor (cmd) or by a
// zygote's init (a pidfd).
type initProc struct {
	pid      int // on the host
	cmd      *exec.Cmd
	pidfd    int
	inCgroup bool // born in its cgroup (clone3 CLONE_INTO_CGROUP)
}

// wait returns when init has exited.
func (p *initProc) wait() error {
	if p.cmd != nil {
		return p.cmd.Wait()
	}
	return waitPidfd(p.pidfd)
}

// nsKinds are the namespaces a zygote's child joins, in the order
// zygote.py takes them: user first, then the ones it owns.
var nsKinds = []string{"user", "pid", "mnt", "net", "ipc", "uts", "cgroup"}

// namespaces opens init's namespaces (nsKinds). The pidfd tells that the
// files are init's: it is checked alive after they are opened, so its pid
// was not reused for another process in between.
func (p *initProc) namespaces() ([]int, error) {
	fds := make([]int, 0, len(nsKinds))
	for _, kind := range nsKinds {
		fd, err := unix.Open(fmt.Sprintf("/proc/%d/ns/%s", p.pid, kind), unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			closeAll(fds)
			return nil, fmt.Errorf("open the sandbox's %s namespace: %w", kind, err)
		}
		fds = append(fds, fd)
	}
	if p.pidfd >= 0 {
		if err := unix.PidfdSendSignal(p.pidfd, 0, nil, 0); err != nil {
			closeAll(fds)
			return nil, fmt.Errorf("the sandbox's init is gone: %w", err)
		}
	}
	return fds, nil
}

// kill sends SIGKILL: init is PID 1 of the sandbox's PID namespace, so
// every process of the sandbox dies with it.
func (p *initProc) kill() {
	if p.cmd != nil {
		p.cmd.Process.Signal(syscall.SIGKILL)
		return
	}
	unix.PidfdSendSignal(p.pidfd, unix.SIGKILL, nil, 0)
}

// awaitReaped waits (briefly) until the zygote's init has reaped an init
// that exited: until then it lingers as a zombie.
func (p *initProc) awaitReaped() {
	for delay, waited := 20*time.Microsecond, time.Duration(0); waited < time.Second; delay = min(2*delay, 10*time.Millisecond) {
		if unix.PidfdSendSignal(p.pidfd, 0, nil, 0) == unix.ESRCH {
			return
		}
		time.Sleep(delay)
		waited += delay
	}
}

// execInit starts a classic init from the supervisor: in new user, mount,
// PID, network, IPC and UTS namespaces, the user namespace owned by the
// sandbox's host user (spawn_linux.go).
func (b *Backend) execInit(child []*os.File, cgroupFD int, owner uint32) (*initProc, error) {
	cmd := initCommand(b.cfg.Exe, child)
	cmd.SysProcAttr = &syscall.SysProcAttr{}
	p := &initProc{cmd: cmd, pidfd: -1}
	if cgroupFD >= 0 {
		// cgroup v2: born inside its group (clone3 CLONE_INTO_CGROUP).
		cmd.SysProcAttr.UseCgroupFD = true
		cmd.SysProcAttr.CgroupFD = cgroupFD
		p.inCgroup = true
	}
	if err := startOwned(cmd, owner); err != nil {
		return nil, fmt.Errorf("start init (user namespaces: %w)", err)
	}
	p.pid = cmd.Process.Pid
	return p, nil
}

// runnerFailed is closed when a zygote could not give the sandbox a runner.
func (s *Sandbox) runnerFailed() <-chan struct{} { return s.failed }

func (s *Sandbox) setupFailure() error {
	if isClosed(s.failed) {
		return s.failErr
	}
	s.statusMu.Lock()
	defer s.statusMu.Unlock()
	if s.setupError != "" {
		return errors.New(s.setupError)
	}
	if s.runnerExit != nil {
		return fmt.Errorf("the runner exited during start-up with status %d", s.runnerExit.Code)
	}
	return fmt.Errorf("init exited during setup: %v", s.initErr)
}

// readStatus follows init's status pipe. Init is trusted code, but it runs
// among untrusted processes, so its lines are still bounded.
func (s *Sandbox) readStatus(r *os.File) {
	defer close(s.statusDone)
	defer r.Close()
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 4096), 64<<10)
	for sc.Scan() {
		var st initStatus
		if json.Unmarshal(sc.Bytes(), &st) != nil {
			continue
		}
		s.statusMu.Lock()
		switch st.Event {
		case "error":
			s.setupError = st.Step + ": " + st.Error
		case "exit":
			s.setRunnerExit(&st)
		}
		s.statusMu.Unlock()
	}
	io.Copy(io.Discard, r)
}

// setRunnerExit records how a one-shot sandbox's runner ended, the first
// time it is told. Called with statusMu held.
func (s *Sandbox) setRunnerExit(st *initStatus) {
	if s.runnerExit == nil {
		s.runnerExit = st
		close(s.runnerGone)
	}
}

// readControl follows init's control socket for the sandbox's life.
func (s *Sandbox) readControl() {
	defer close(s.ctlDone)
	buf, oob := make([]byte, 64<<10), make([]byte, unix.CmsgSpace(8*4))
	for {
		m, fds, err := recvCtl(s.ctl, buf, oob)
		if err != nil {
			s.mu.Lock()
			for id, ch := range s.spawns {
				close(ch)
				delete(s.spawns, id)
			}
			for _, p := range s.procs {
				p.finish(128 + int(syscall.SIGKILL))
			}
			s.procs = map[uint64]*process{}
			if r := s.runner; r != nil && !isClosed(r.exited) {
				r.exit = ctlMsg{Code: 128 + int(syscall.SIGKILL), Signal: int(syscall.SIGKILL)}
				close(r.exited)
			}
			s.mu.Unlock()
			return
		}
		switch m.Op {
		case opRunner:
			forked := s.z != nil && len(fds) == 6
			if (len(fds) != 2 && !forked) || m.Error != "" {
				closeAll(fds)
				continue // init exits after a failed restart: initDone follows
			}
			r := &runnerProc{
				pid:    m.PID,
				pidfd:  -1,
				reqW:   pollable(fds[0], "requests"),
				ready:  make(chan struct{}),
				exited: make(chan struct{}),
				evDone: make(chan struct{}),
			}
			r.events = &eventsReader{f: os.NewFile(uintptr(fds[1]), "events"), fd: fds[1]}
			go s.readEvents(r, r.events)
			s.mu.Lock()
			s.runner = r
			close(s.runnerSet)
			s.runnerSet = make(chan struct{})
			s.mu.Unlock()
			if forked {
				go s.forkRunner(r, fds[2:])
			}
		case opExited:
			closeAll(fds)
			s.mu.Lock()
			if m.ID == 0 {
				if r := s.runner; r != nil && r.pid == m.PID && !isClosed(r.exited) {
					r.exit = m
					close(r.exited)
					s.lost = true
				}
			} else if p := s.procs[m.ID]; p != nil {
				delete(s.procs, m.ID)
				p.finish(m.Code)
			}
			s.mu.Unlock()
		case opSpawned:
			var p *process
			if m.Error == "" && len(fds) == 3 {
				// Non-blocking descriptors make pollable files, whose
				// Close interrupts a pending Read.
				for _, fd := range fds {
					unix.SetNonblock(fd, true)
				}
				p = &process{
					s: s, id: m.ID, pid: m.PID,
					stdin:  os.NewFile(uintptr(fds[0]), "stdin"),
					stdout: os.NewFile(uintptr(fds[1]), "stdout"),
					stderr: os.NewFile(uintptr(fds[2]), "stderr"),
					done:   make(chan struct{}),
				}
			} else {
				closeAll(fds)
			}
			s.mu.Lock()
			ch := s.spawns[m.ID]
			delete(s.spawns, m.ID)
			if p != nil {
				// Registered before anyone sees it, so that its exit,
				// which may follow at once, is not missed.
				s.procs[m.ID] = p
			}
			s.mu.Unlock()
			if ch == nil { // the caller gave up waiting
				if p != nil {
					p.Signal(syscall.SIGKILL)
					p.closePipes()
				}
				continue
			}
			ch <- spawnReply{m, p}
		default:
			closeAll(fds)
		}
	}
}

// forkRunner has the zygote fork a runner into this sandbox, with the four
// descriptors init made for it (request reader, event writer, stdout,
// stderr), and lets it go once it is in the sandbox's cgroup.
func (s *Sandbox) forkRunner(r *runnerProc, fds []int) {
	defer closeAll(fds)
	var gate [2]int // the child starts when it reads "g"; EOF makes it give up
	if err := unix.Pipe2(gate[:], unix.O_CLOEXEC); err != nil {
		s.runnerSetupFailed(r, err)
		return
	}
	defer unix.Close(gate[1])
	mode := "--persistent"
	if s.spec.OneShot {
		mode = "--oneshot"
	}
	req := forkRequest{Mode: mode, Env: s.cfg.Env, UID: SandboxUID, GID: SandboxGID, Dir: workspacePath,
		Rlimits: s.cfg.runnerRlimits()}
	ns, err := s.init.namespaces()
	if err != nil {
		s.runnerSetupFailed(r, err)
		return
	}
	defer closeAll(ns)
	sent := append(append(ns, fds...), gate[0])
	res, err := s.z.fork(context.Background(), req, sent,
		func(code, signal int) { s.runnerExited(r, code, signal) })
	unix.Close(gate[0])
	if err != nil {
		s.runnerSetupFailed(r, err)
		return
	}
	hostPID, err := pidfdPID(res.pidfd)
	if err == nil && s.cg != nil {
		err = s.cg.AddProc(hostPID)
	}
	if err != nil {
		unix.PidfdSendSignal(res.pidfd, unix.SIGKILL, nil, 0)
		unix.Close(res.pidfd)
		s.runnerSetupFailed(r, fmt.Errorf("runner into its cgroup: %w", err))
		return
	}
	s.mu.Lock()
	if isClosed(r.exited) {
		s.mu.Unlock()
		unix.Close(res.pidfd)
		return
	}
	r.pidfd = res.pidfd
	s.mu.Unlock()
	unix.Write(gate[1], []byte("g"))
}

// pollable wraps a pipe end in a non-blocking *os.File: writes wait in the
// runtime's poller, and ack can try one without waiting.
func pollable(fd int, name string) *os.File {
	unix.SetNonblock(fd, true)
	return os.NewFile(uintptr(fd), name)
}

// runnerExited records the end of a zygote's runner, as the zygote saw it.
func (s *Sandbox) runnerExited(r *runnerProc, code, signal int) {
	s.mu.Lock()
	if !isClosed(r.exited) {
		r.exit = ctlMsg{Op: opExited, Code: code, Signal: signal}
		close(r.exited)
		if s.runner == r {
			s.lost = true
		}
	}
	r.closePidfd()
	last := s.spec.OneShot && s.runner == r
	s.mu.Unlock()
	if last {
		// A one-shot sandbox ends with its runner, as with a classic
		// init, which is the runner's parent and exits with it.
		s.statusMu.Lock()
		s.setRunnerExit(&initStatus{Event: "exit", Code: code, Signal: signal})
		s.statusMu.Unlock()
		s.kill()
	}
}

// runnerSetupFailed records that a zygote could not give a runner.
func (s *Sandbox) runnerSetupFailed(r *runnerProc, err error) {
	s.mu.Lock()
	if !isClosed(r.exited) {
		r.exit = ctlMsg{Op: opExited, Code: sandbox.ExitSetupFailed}
		close(r.exited)
	}
	if !isClosed(s.failed) {
		s.failErr = fmt.Errorf("runner: %w", err)
		close(s.failed)
	}
	s.mu.Unlock()
}

// send writes one control message to init.
func (s *Sandbox) send(m ctlMsg) error {
	s.sendMu.Lock()
	defer s.sendMu.Unlock()
	if err := sendCtl(s.ctl, m); err != nil {
		return fmt.Errorf("%w: control socket: %v", sandbox.ErrClosed, err)
	}
	return nil
}

// readyRunner returns a channel closed once a runner is ready for code.
func (s *Sandbox) readyRunner(ctx context.Context) <-chan struct{} {
	ch := make(chan struct{})
	go func() {
		for {
			s.mu.Lock()
			r, set := s.runner, s.runnerSet
			s.mu.Unlock()
			if r != nil {
				select {
				case <-r.ready:
					close(ch)
					return
				case <-r.exited:
				case <-ctx.Done():
					return
				case <-s.initDone:
					return
				}
			}
			select {
			case <-set:
			case <-ctx.Done():
				return
			case <-s.initDone:
				return
			}
		}
	}()
	return ch
}

// readEvents follows one runner's event pipe. A malformed frame means the
// runner (or user code writing to its pipe) broke the protocol: parsing
// stops, reading continues so nothing blocks.
func (s *Sandbox) readEvents(r *runnerProc, events *eventsReader) {
	defer close(r.evDone)
	defer events.Close()
	fr := runner.NewFrameReader(events, maxFrame)
	readyOnce := sync.OnceFunc(func() { close(r.ready) })
	// Past the results cap, results are counted without being parsed; the
	// runner's own frames start exactly so (json.dumps of a dict whose
	// first key is "type").
	resultPrefix := []byte(`{"type": "result"`)
	var skipping atomic.Bool
	skip := func(body []byte) bool { return skipping.Load() && bytes.HasPrefix(body, resultPrefix) }
	for {
		ev, err := fr.NextSkipping(skip)
		if err != nil {
			if !errors.Is(err, io.EOF) {
				s.mu.Lock()
				r.broken = err
				s.mu.Unlock()
				// No result can be acknowledged from here on: the runner
				// is let go, and ends after the current execution.
				r.hangUp()
				io.Copy(io.Discard, events)
			}
			return
		}
		if ev.Type == "ready" {
			readyOnce()
			continue
		}
		if ev.Type == "setup_error" && s.z != nil {
			// A zygote's child reports what it could not do before it
			// became the runner (the Go init reports on its status pipe).
			s.runnerSetupFailed(r, errors.New(ev.Value))
			continue
		}
		if ev.Type == "result" || ev.Type == "error" {
			// The runner flushed what the code printed before this event
			// into the output pipes; deliver it first, so that streams see
			// output and results in the order they happened. For a result
			// the runner waits for the ack below, so the pipes hold
			// nothing printed after it.
			s.stdout.sync()
			s.stderr.sync()
		}
		s.mu.Lock()
		var emit *sandbox.Output
		var rs sandbox.ResultSink
		if x := s.cur; x != nil && x.runner == r {
			emit = x.handle(ev)
			rs = x.resultSink
			skipping.Store(len(x.results)+x.dropped >= maxResults)
		} else {
			skipping.Store(false)
		}
		s.mu.Unlock()
		if emit != nil && rs != nil {
			rs.Result(*emit)
		}
		if ev.Type == "result" || ev.Type == "skipped" {
			// Every result is acknowledged, whoever it was for: the runner
			// (or a thread of the code) waits for it.
			r.ack()
		}
	}
}

// handle records an event; it returns a result to pass on to a sink.
func (x *execution) handle(ev runner.Event) *sandbox.Output {
	switch ev.Type {
	case "skipped":
		x.dropped++
	case "result":
		out, size := runner.Output(ev)
		size += resultOverhead
		if x.resultsBytes+size > maxResultsBytes || len(x.results) >= maxResults {
			x.dropped++
			return nil
		}
		x.resultsBytes += size
		x.results = append(x.results, out)
		return &out
	case "error":
		x.err = &sandbox.Error{Name: ev.Name, Value: ev.Value, Traceback: ev.Traceback}
	case "done":
		if x.done != nil {
			x.exitCode = ev.ExitCode
			close(x.done)
			x.done = nil
		}
	}
	return nil
}

// ID implements sandbox.Sandbox.
func (s *Sandbox) ID() string { return s.id }

// Workspace implements sandbox.Sandbox.
func (s *Sandbox) Workspace() sandbox.Workspace { return s.ws }

// kill ends every process of the sandbox: init is PID 1 of the sandbox's
// PID namespace, and when it dies the kernel kills all the rest, however
// they forked, setsid or ignored signals. The cgroup is the second net.
func (s *Sandbox) kill() {
	if s.init != nil {
		s.init.kill()
	}
}

// Quiesce implements sandbox.Quiescer: it kills every process of the
// sandbox and waits until they are gone.
func (s *Sandbox) Quiesce() {
	s.kill()
	if s.init != nil {
		<-s.initDone
	}
}

// Close implements sandbox.Sandbox.
func (s *Sandbox) Close() error {
	s.closeOnce.Do(func() {
		var errs []error
		s.kill()
		if s.init != nil {
			<-s.initDone
			if s.init.pidfd >= 0 {
				s.init.awaitReaped()
				unix.Close(s.init.pidfd)
			}
		}
		if s.ctl >= 0 {
			// Shut down, not close: readControl may still be in recvmsg.
			unix.Shutdown(s.ctl, unix.SHUT_RDWR)
			if s.ctlRead {
				<-s.ctlDone
			}
			unix.Close(s.ctl)
		}
		s.mu.Lock()
		if r := s.runner; r != nil {
			r.closePidfd()
		}
		s.mu.Unlock()
		s.mu.Lock()
		if r := s.runner; r != nil {
			r.reqW.Close()
		}
		s.mu.Unlock()
		timeout := time.After(drainTimeout)
		for _, c := range []*capture{s.stdout, s.stderr} {
			if c == nil {
				continue
			}
			select {
			case <-c.done:
			case <-timeout:
				errs = append(errs, errors.New("output pipe still open after the sandbox died"))
			}
			c.close()
		}
		if s.spec.Egress != nil {
			// Every process of the sandbox is dead: the proxy's
			// connections and its listener go too.
			s.spec.Egress.Close()
			if s.egressDone != nil {
				<-s.egressDone
			}
		}
		if s.cg != nil {
			if err := s.cg.Destroy(); err != nil {
				errs = append(errs, err)
			}
		}
		if s.ws != nil {
			// The last reference to the disk tmpfs: its memory is freed.
			s.ws.Close()
		}
		if s.z != nil {
			s.z.release()
		}
		if s.hasOwner {
			// Every process of the sandbox is gone (the cgroup is
			// empty, or init and its PID namespace have ended): the
			// host user can be another sandbox.
			s.b.releaseOwner(s.owner)
		}
		s.closeErr = errors.Join(errs...)
	})
	return s.closeErr
}

// Interrupt implements sandbox.Sandbox: SIGINT to the runner, which Python
// turns into KeyboardInterrupt.
func (s *Sandbox) Interrupt() error {
	if isClosed(s.initDone) {
		return sandbox.ErrClosed
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cur == nil {
		return nil
	}
	if s.z != nil {
		// A zygote's runner is not init's child: signal it directly.
		if r := s.runner; r != nil && r.pidfd >= 0 {
			return unix.PidfdSendSignal(r.pidfd, unix.SIGINT, nil, 0)
		}
		return nil
	}
	return s.send(ctlMsg{Op: opInterrupt})
}

// Restart implements sandbox.Sandbox.
func (s *Sandbox) Restart(ctx context.Context) error {
	if s.spec.OneShot {
		return fmt.Errorf("%w: a one-shot sandbox cannot restart", sandbox.ErrUnsupported)
	}
	if !s.execMu.TryLock() {
		return sandbox.ErrBusy
	}
	defer s.execMu.Unlock()
	if err := s.restart(ctx); err != nil {
		return err
	}
	s.mu.Lock()
	s.lost = false // the caller asked for it
	s.mu.Unlock()
	return nil
}

// restart kills every process of the sandbox but init and waits for a new
// runner to be ready. When it returns, every process that could write to
// the output pipes is dead. Callers hold execMu.
func (s *Sandbox) restart(ctx context.Context) error {
	s.mu.Lock()
	old, set := s.runner, s.runnerSet
	s.mu.Unlock()
	if err := s.send(ctlMsg{Op: opRestart}); err != nil {
		return err
	}
	for {
		select {
		case <-set:
		case <-s.initDone:
			return fmt.Errorf("%w: the sandbox died while restarting", sandbox.ErrClosed)
		case <-ctx.Done():
			return ctx.Err()
		}
		s.mu.Lock()
		r := s.runner
		set = s.runnerSet
		s.mu.Unlock()
		if r != old {
			if old != nil {
				old.reqW.Close()
			}
			break
		}
	}
	timer := time.NewTimer(setupTimeout)
	defer timer.Stop()
	select {
	case <-s.readyRunner(ctx):
		return nil
	case <-s.runnerFailed():
		return fmt.Errorf("%w: restart: %v", sandbox.ErrClosed, s.failErr)
	case <-s.initDone:
		return fmt.Errorf("%w: the sandbox died while restarting", sandbox.ErrClosed)
	case <-timer.C:
		return fmt.Errorf("the new runner was not ready within %v", setupTimeout)
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Execute implements sandbox.Sandbox.
func (s *Sandbox) Execute(ctx context.Context, req sandbox.ExecRequest, sink sandbox.Sink) (*sandbox.Result, error) {
	if !s.execMu.TryLock() {
		return nil, sandbox.ErrBusy
	}
	defer s.execMu.Unlock()
	if isClosed(s.initDone) {
		return nil, sandbox.ErrClosed
	}
	if s.spec.OneShot && s.used {
		return nil, fmt.Errorf("%w: a one-shot sandbox runs one execution", sandbox.ErrClosed)
	}
	s.used = true
	if err := sandbox.ValidateEnv(req.Env); err != nil {
		return nil, err
	}
	limits := s.spec.Limits
	if req.Timeout > 0 {
		limits.Timeout = req.Timeout
	}
	if req.CPUTime > 0 {
		limits.CPUTime = req.CPUTime
	}
	filename := req.Filename
	if filename == "" {
		filename = "<cell>"
	}
	cc, err := s.contexts.Lookup(req.Context)
	if err != nil {
		return nil, err
	}

	// A runner that died since the last execution (os._exit from a
	// thread, an OOM kill) is replaced first; the result says so.
	s.mu.Lock()
	r, lost := s.runner, s.lost
	s.mu.Unlock()
	if !s.spec.OneShot && (r == nil || isClosed(r.exited)) {
		if err := s.restart(ctx); err != nil {
			return nil, err
		}
		s.mu.Lock()
		r = s.runner
		s.mu.Unlock()
	}
	select {
	case <-r.ready:
	default:
		return nil, fmt.Errorf("%w: the runner is not ready", sandbox.ErrClosed)
	}
	// Removed and restarted contexts are forgotten before any code runs.
	s.tellContexts()

	x := &execution{runner: r, done: make(chan struct{})}
	x.resultSink, _ = sink.(sandbox.ResultSink)
	doneCh := x.done
	var outSink, errSink func([]byte)
	if sink != nil {
		outSink, errSink = sink.Stdout, sink.Stderr
	}
	s.stdout.begin(limits.MaxOutput, outSink)
	s.stderr.begin(limits.MaxOutput, errSink)
	s.mu.Lock()
	s.cur = x
	s.lost = false
	s.mu.Unlock()

	st0 := s.stats()
	cpu0 := st0.CPU
	start := time.Now()
	sent := make(chan error, 1)
	go func() {
		sent <- r.request(runner.Request{Type: "execute", Code: req.Code, Filename: filename, Env: req.Env,
			Context: runner.ContextKey(cc.ID), Language: cc.Language, Cwd: cc.Cwd})
	}()

	// A one-shot execution ends when the runner process exits (its exit
	// status is the program's); a persistent one at the runner's "done".
	finished := doneCh
	if s.spec.OneShot {
		finished = s.runnerGone
	}
	var why sandbox.Status // set when a limit or the caller ended it
	var whyMsg string
	wall := time.NewTimer(limits.Timeout)
	defer wall.Stop()
	var tick <-chan time.Time
	if limits.CPUTime > 0 && s.cg != nil {
		t := time.NewTicker(cpuPollInterval(limits.CPUTime))
		defer t.Stop()
		tick = t.C
	}
	runnerExited := r.exited
	if s.spec.OneShot {
		runnerExited = nil // init's exit status says more
	}
wait:
	for {
		select {
		case <-finished:
			break wait
		case <-runnerExited:
			break wait
		case <-s.initDone:
			break wait
		case <-wall.C:
			why, whyMsg = sandbox.StatusTimeout, fmt.Sprintf("execution exceeded the %v wall-clock limit", limits.Timeout)
			break wait
		case <-tick:
			if s.stats().CPU-cpu0 > limits.CPUTime {
				why, whyMsg = sandbox.StatusTimeout, fmt.Sprintf("execution exceeded the %v CPU time limit", limits.CPUTime)
				break wait
			}
		case <-ctx.Done():
			why, whyMsg = sandbox.StatusKilled, "execution cancelled: "+ctx.Err().Error()
			break wait
		}
	}
	duration := time.Since(start)

	var exit *initStatus // how the code's process ended, if it did
	dead := false        // the code's process died before "done"
	stateLost := lost
	switch {
	case s.spec.OneShot && why == "" && isClosed(s.runnerGone) && !isClosed(s.initDone):
		// The runner process has exited, having written all it wrote:
		// its status is the program's and its output is in the pipes.
		// What is left is the tear-down, which the answer does not wait
		// for (Close does); processes the code left behind are killed
		// now, and what they write from here on is not the code's.
		s.kill()
		r.events.drained(r.evDone)
		s.stdout.sync()
		s.stderr.sync()
		s.statusMu.Lock()
		exit = s.runnerExit
		s.statusMu.Unlock()
		dead = true
	case s.spec.OneShot || isClosed(s.initDone):
		if why != "" {
			s.kill()
		}
		// Every process is gone once init is reaped; then the pipes hit
		// EOF and everything written has been delivered.
		<-s.initDone
		<-s.statusDone
		s.waitDrained()
		s.statusMu.Lock()
		exit = s.runnerExit
		s.statusMu.Unlock()
		dead = true
	default:
		if why != "" || isClosed(r.exited) {
			// A limit fired or the runner died: a fresh runner replaces it
			// (and kills whatever else ran), files stay.
			if why == "" {
				exit = &initStatus{Event: "exit", Code: r.exit.Code, Signal: r.exit.Signal}
				dead = true
			}
			stateLost = true
			if err := s.restart(context.WithoutCancel(ctx)); err != nil {
				s.kill()
				<-s.initDone
			}
		}
		s.stdout.sync()
		s.stderr.sync()
	}
	<-sent

	s.mu.Lock()
	s.cur = nil
	broken := r.broken
	s.lost = false
	s.mu.Unlock()
	stdout, outTrunc := s.stdout.end()
	stderr, errTrunc := s.stderr.end()
	st := s.stats()
	res := &sandbox.Result{
		Stdout:          string(stdout),
		Stderr:          string(stderr),
		StdoutTruncated: outTrunc,
		StderrTruncated: errTrunc,
		Results:         x.results,
		Error:           x.err,
		DurationMS:      float64(duration.Microseconds()) / 1000,
		CPUMS:           float64((st.CPU - cpu0).Microseconds()) / 1000,
		PeakMemoryBytes: st.MemoryPeak,
		StateLost:       stateLost && !s.spec.OneShot,
	}
	if res.Results == nil {
		res.Results = []sandbox.Output{}
	}
	if x.dropped > 0 {
		res.Results = append(res.Results, sandbox.Output{
			Text: fmt.Sprintf("[vivarium: %d more results dropped: over the limit of %d results or %d MiB]",
				x.dropped, maxResults, maxResultsBytes>>20)})
	}
	classify(res, why, whyMsg, dead, exit, x.exitCode, st.OOMKills > st0.OOMKills, limits, broken)
	return res, nil
}

// classify sets Status, ExitCode and Error from what the kernel and init
// observed; the runner's own report counts only where the process itself
// finished normally.
func classify(res *sandbox.Result, why sandbox.Status, whyMsg string, dead bool, exit *initStatus,
	runnerCode *int, oom bool, limits sandbox.Limits, broken error) {
	limitErr := func(status sandbox.Status, code int, name, msg string) {
		res.Status, res.ExitCode = status, code
		res.Error = &sandbox.Error{Name: name, Value: msg}
	}
	switch {
	case why == sandbox.StatusTimeout:
		limitErr(why, sandbox.ExitTimeout, "TimeoutError", whyMsg)
	case why != "":
		limitErr(why, 128+int(syscall.SIGKILL), "Killed", whyMsg)
	case exit != nil && exit.Signal != 0 || (dead && exit == nil):
		// The runner was killed, or init was (cgroup v2 kills the whole
		// group on OOM).
		sig := syscall.SIGKILL
		if exit != nil {
			sig = syscall.Signal(exit.Signal)
		}
		switch {
		case oom:
			limitErr(sandbox.StatusMemoryLimit, sandbox.ExitMemoryLimit, "MemoryError",
				fmt.Sprintf("the sandbox exceeded its %d MiB memory limit", limits.Memory>>20))
		case sig == syscall.SIGXCPU || (limits.CPUTime > 0 && res.CPUMS >= float64(limits.CPUTime.Milliseconds())):
			limitErr(sandbox.StatusTimeout, sandbox.ExitTimeout, "TimeoutError",
				fmt.Sprintf("execution exceeded the %v CPU time limit", limits.CPUTime))
		default:
			limitErr(sandbox.StatusKilled, 128+int(sig), "Killed", "the program was killed by signal "+unix.SignalName(sig))
		}
	default:
		code := 0
		switch {
		case exit != nil: // one-shot: the process's own status
			code = exit.Code
		case runnerCode != nil:
			code = *runnerCode
		}
		res.ExitCode = code
		switch {
		case res.Error != nil:
			res.Status = sandbox.StatusError
		case code != 0:
			res.Status = sandbox.StatusError
			res.Error = &sandbox.Error{Name: "SystemExit", Value: fmt.Sprint(code)}
		default:
			res.Status = sandbox.StatusOK
		}
	}
	if broken != nil && res.Error == nil {
		res.Error = &sandbox.Error{Name: "ProtocolError", Value: "the sandbox sent malformed results; some were lost"}
	}
}

// cpuPollInterval checks often enough to stop close to the limit without
// measurable overhead.
func cpuPollInterval(limit time.Duration) time.Duration {
	return min(max(limit/20, 10*time.Millisecond), 250*time.Millisecond)
}

func (s *Sandbox) stats() cgroups.Stats {
	if s.cg == nil {
		return cgroups.Stats{}
	}
	st, _ := s.cg.Stats()
	return st
}

// eventsReader is a runner's event pipe as readEvents reads it, which
// tells when the reader is idle: waiting in a read with nothing left in the
// pipe, so that every frame written so far has been handled.
type eventsReader struct {
	f       *os.File
	fd      int
	waiting atomic.Bool
	reads   atomic.Uint64
}

func (e *eventsReader) Read(p []byte) (int, error) {
	e.waiting.Store(true)
	n, err := e.f.Read(p)
	e.reads.Add(1)
	e.waiting.Store(false)
	return n, err
}

func (e *eventsReader) Close() error { return e.f.Close() }

// drained returns once the reader has handled every frame of a runner that
// has exited (so wrote its last), or its stream ended (done), or after
// drainTimeout. Its last frames may still be in the pipe when its exit is
// seen; its children may hold the pipe open, so EOF alone cannot tell.
func (e *eventsReader) drained(done chan struct{}) {
	idle := func() bool {
		seq := e.reads.Load()
		if !e.waiting.Load() {
			return false
		}
		n, err := unix.IoctlGetInt(e.fd, unix.TIOCINQ) // FIONREAD
		return (err != nil || n == 0) && e.waiting.Load() && e.reads.Load() == seq
	}
	deadline := time.Now().Add(drainTimeout)
	for calm := 0; time.Now().Before(deadline); {
		if isClosed(done) {
			return
		}
		if idle() {
			// Twice, apart: a read that returned in between is seen.
			if calm++; calm == 2 {
				return
			}
		} else {
			calm = 0
		}
		time.Sleep(200 * time.Microsecond)
	}
}

func (s *Sandbox) waitDrained() {
	timeout := time.After(drainTimeout)
	for _, c := range []*capture{s.stdout, s.stderr} {
		select {
		case <-c.done:
		case <-timeout:
			return
		}
	}
	s.mu.Lock()
	r := s.runner
	s.mu.Unlock()
	if r != nil {
		select {
		case <-r.evDone:
		case <-timeout:
		}
	}
}

func isClosed(ch chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
