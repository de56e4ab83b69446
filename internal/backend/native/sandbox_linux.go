package native

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vivarium-sandbox/vivarium/internal/cgroups"
	"github.com/vivarium-sandbox/vivarium/internal/core"
	"github.com/vivarium-sandbox/vivarium/internal/hostuid"
	"github.com/vivarium-sandbox/vivarium/internal/runner"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/workspace"
)

// drainTimeout bounds how long to wait for output pipes to close once
// every process of the sandbox is dead. They close at once; this only
// guards a bug.
const drainTimeout = 5 * time.Second

// Sandbox is one running native sandbox. Its executions, code contexts and
// commands are the core's; this file starts and ends its init, and
// follows what init reports.
type Sandbox struct {
	*core.Core
	id   string
	b    *Backend
	spec sandbox.Spec
	init *initProc
	// upper, for a build's step, is the detached tmpfs that holds its
	// writable layer (build_linux.go); unhold lets go of a template's
	// layers (layers.HoldLayers).
	upper    *os.File
	unhold   func()
	pidsMax  atomic.Int64  // the cgroup's pids limit fitPids set last
	z        *zygote       // the zygote that forks runners; nil: init starts them
	cg       cgroups.Group // nil without cgroups
	owner    hostuid.Range // the host user the sandbox is
	hasOwner bool          // owner is held, and released by Close
	ws       *workspace.Dir
	// The sandbox's root, as its user and as its root write it
	// (sandbox.FileSystem).
	rootAsUser, rootAsRoot *workspace.Dir
	// dirMu guards the root's Dirs, which a resume replaces; oldDirs are
	// those replaced, kept open (a file operation may still use one)
	// until Close.
	dirMu   sync.RWMutex
	oldDirs []*workspace.Dir
	// files orders the files API's changes and the checkpoints
	// (pausefiles_linux.go).
	files    filesGate
	ctl      int // control socket to init, under sendMu
	stdout   *pipeReader
	stderr   *pipeReader
	initErr  error         // how init exited; valid once initDone is closed
	initDone chan struct{} // closed when init has exited and been reaped

	// A pause (pause_linux.go) ends init and a resume gives the Sandbox
	// another: init and initDone change then, under lifeMu, and so do
	// the pipe readers, statusDone, ctl and ctlDone (while no execution
	// runs, see Core.Exclusive). pauseMu orders Pause, Resume and Close.
	lifeMu  sync.Mutex
	pauseMu sync.Mutex
	cp      *checkpoint // the paused sandbox's checkpoint, under pauseMu
	// persisted, for a sandbox a later server opened paused from disk
	// (OpenPaused), is what its resume restores; under pauseMu.
	persisted *forkSnapshot
	closing   bool // Close has begun, under pauseMu
	// checkpointed: a pause made the sandbox's checkpoint directory, which
	// Close removes. Under pauseMu.
	checkpointed bool
	// lastCheckpoint is the directory of the checkpoint the sandbox was
	// last resumed from: its /proc masks' copies are bound in the
	// sandbox. Under pauseMu.
	lastCheckpoint string
	// layerMounts are the mounts (by id) of its template's layers as
	// they are that its processes map files of: its zygote's root, or
	// the mount its last restore made. Set at start and by a restore,
	// under Exclusive.
	layerMounts []string
	// tookOver is the zygote's memory the sandbox's restored tree is
	// charged for, by which its memory limit is raised
	// (zygotememory_linux.go). Set by a restore, under Exclusive.
	tookOver int64
	// ownRunners: init starts the sandbox's runners itself from now on
	// (driver.Restart): a restored sandbox forked from a zygote.
	ownRunners atomic.Bool
	startGate  sync.RWMutex // Start holds it read, Pause write: no command starts as the sandbox pauses

	// From init's status pipe.
	statusMu   sync.Mutex
	setupError string        // init's "error" message
	runnerExit *initStatus   // init's "exit" message (one-shot)
	runnerGone chan struct{} // closed when runnerExit is set
	statusDone chan struct{}

	// From init's control socket. mu comes after the core's lock, and is
	// never held while calling the core.
	mu      sync.Mutex
	cfg     *initConfig
	failed  chan struct{} // closed when a zygote could not give a runner
	failErr error         // why; valid once failed is closed
	rp      *runnerProc   // the current runner's process; nil before the first
	// terminals are the terminals of commands, by command ID, until
	// their output ends (terminal_linux.go).
	terminals map[uint64]*terminal
	ctlDone   chan struct{}
	ctlRead   bool // readControl was started: ctlDone will be closed
	sendMu    sync.Mutex
	// interrupted follows init's answers to opInterrupt.
	interrupted core.Answers

	// Closed when the proxy (Spec.Egress), serving on its listener in the
	// sandbox, has returned; nil without one. A pause closes the listener,
	// a resume opens another in the restored network namespace.
	egressDone chan struct{}
	egressL    net.Listener
	// The sandbox's network namespace, for DialPort (dial_linux.go).
	netns netnsRef

	closeOnce sync.Once
	closeErr  error
	// ending: Close has begun (read without a lock, for logs only).
	ending atomic.Bool
}

var (
	_ sandbox.Sandbox       = (*Sandbox)(nil)
	_ sandbox.Prober        = (*Sandbox)(nil)
	_ sandbox.MemoryUser    = (*Sandbox)(nil)
	_ sandbox.ContextKeeper = (*Sandbox)(nil)
	_ sandbox.FileSystem    = (*Sandbox)(nil)
)

// Root implements sandbox.FileSystem.
func (s *Sandbox) Root(user string) (sandbox.Workspace, error) {
	s.dirMu.RLock()
	defer s.dirMu.RUnlock()
	if s.rootAsUser == nil {
		return sandbox.DiskOnly{}, nil // opened from disk, paused
	}
	switch user {
	case "", sandbox.UserSandbox:
		return s.gated(s.rootAsUser), nil
	case sandbox.UserRoot:
		return s.gated(s.rootAsRoot), nil
	}
	return nil, fmt.Errorf("%w: user must be %q or %q, got %q", sandbox.ErrInvalidSpec, sandbox.UserSandbox,
		sandbox.UserRoot, user)
}

// userIDs are the sandbox user's uid and gid as the host sees them: what
// files written as the sandbox user (sandbox.Workspace) are owned by.
func (s *Sandbox) userIDs() (uid, gid int) {
	u := s.cfg.user()
	return int(s.owner.ID(u.UID)), int(s.owner.ID(u.GID))
}

// Alive implements sandbox.Prober: init runs and a runner is ready.
func (s *Sandbox) Alive() bool {
	return !isClosed(s.failed) && s.Core.Alive()
}

// MemoryPSS implements sandbox.MemoryUser from the smaps_rollup of every
// process in the sandbox's cgroup.
func (s *Sandbox) MemoryPSS() (int64, error) {
	cg := s.group()
	if cg == nil {
		return 0, errors.New("no cgroup: the sandbox's processes are not known")
	}
	pids, err := cg.Procs()
	if err != nil {
		return 0, err
	}
	var total int64
	for _, pid := range pids {
		total += sandbox.ProcessPSS(pid)
	}
	return total, nil
}

func start(ctx context.Context, b *Backend, spec sandbox.Spec, cfg *initConfig, z *zygote) (_ *Sandbox, err error) {
	s := &Sandbox{
		id: newID(), b: b, spec: spec, ctl: -1, z: z, cfg: cfg, failed: make(chan struct{}),
		initDone: make(chan struct{}), statusDone: make(chan struct{}), runnerGone: make(chan struct{}),
		ctlDone: make(chan struct{}), terminals: map[uint64]*terminal{},
	}
	s.Core = core.New((*driver)(s), core.Config{Spec: spec, Contexts: runner.NewContexts(spec.HomeDir())})
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
		s.cg, err = b.cgroups.New(s.id, groupLimits(spec))
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
		if z.rootMount != "" {
			s.layerMounts = []string{z.rootMount}
		}
	}
	p, err := newInitPipes()
	if err != nil {
		return nil, err
	}
	defer p.closeChild()
	s.ctl = p.ctl
	defer p.ctrlW.Close()
	var tasks *groupTasks
	if s.cg != nil {
		tasks = openGroupTasks(s.cg)
		defer tasks.close()
	}
	if z == nil {
		var cgfd = -1
		if s.cg != nil {
			cgfd = s.cg.IntoFD()
		}
		s.init, err = b.execInit(p.child, cgfd, tasks, s.owner.First, cfg.HashSeed != "")
	} else {
		s.init, err = z.spawnInit(ctx, p.child, tasks, s.owner.First)
	}
	if err != nil {
		p.closeParent()
		return nil, err
	}
	// Before init's wait begins: until then its pid is its own. The
	// namespace is kept for DialPort and the proxy's listener.
	if err := s.openNetwork(); err != nil {
		s.init.kill()
		s.init.wait()
		close(s.initDone)
		p.closeParent()
		return nil, err
	}
	// Also before the wait: the root's and the volumes' mounts are
	// mapped by the user namespace of this pid.
	if err := s.sendMounts(); err != nil {
		s.init.kill()
		s.init.wait()
		close(s.initDone)
		p.closeParent()
		return nil, err
	}
	if s.cg != nil && !s.init.inCgroup {
		// Moved in before it receives its config, so before it does
		// anything on the sandbox's behalf; and before its wait begins,
		// while its pid is its own (a zygote's init: checked alive after,
		// so the pid written was not another process's).
		err := s.cg.AddProc(s.init.pid)
		if err == nil && !s.init.alive() {
			err = errors.New("the sandbox's init exited before it entered its cgroup")
		}
		if err != nil {
			s.init.kill()
			s.init.wait()
			close(s.initDone)
			p.closeParent()
			return nil, err
		}
	}
	s.waitInit(s.init, s.initDone)
	p.closeChild()
	if s.stdout, err = newPipeReader(p.stdoutR, s.Core.Stdout); err != nil {
		return nil, err
	}
	if s.stderr, err = newPipeReader(p.stderrR, s.Core.Stderr); err != nil {
		return nil, err
	}
	go s.readStatus(p.statusR, s.statusDone)
	s.ctlRead = true
	go s.readControl(s.ctl, s.ctlDone)

	if err := json.NewEncoder(p.ctrlW).Encode(cfg); err != nil {
		return nil, fmt.Errorf("send config to init: %w", err)
	}
	p.ctrlW.Close()

	if err := s.AwaitRunner(ctx); err != nil {
		switch {
		case isClosed(s.initDone):
			<-s.statusDone
			return nil, s.setupFailure()
		case isClosed(s.failed):
			return nil, s.setupFailure()
		}
		return nil, err
	}

	// The workspace, held open from the host: files go in and out through
	// this descriptor, and it outlives the sandbox's mount namespace, so
	// files can be collected after every sandboxed process is dead. No user
	// code has run yet, so the path cannot have been tampered with.
	wsPath := fmt.Sprintf("/proc/%d/root%s", s.init.pid, workspacePath)
	uid, gid := s.userIDs()
	if s.ws, err = workspace.Open(wsPath, uid, gid); err != nil {
		return nil, err
	}
	rootPath := fmt.Sprintf("/proc/%d/root", s.init.pid)
	if s.rootAsUser, err = workspace.Open(rootPath, uid, gid); err != nil {
		return nil, err
	}
	if s.rootAsRoot, err = workspace.Open(rootPath, int(s.owner.ID(0)), int(s.owner.ID(0))); err != nil {
		return nil, err
	}
	// Opened by pid, after init's wait began: still running now, so the
	// pid was init's when they were opened.
	if !s.init.alive() {
		return nil, errors.New("the sandbox's init exited while it was being set up")
	}
	s.fitPids()
	return s, nil
}

// openNetwork opens the sandbox's network namespace, kept until Close
// for DialPort, and starts the proxy (Spec.Egress) in it.
func (s *Sandbox) openNetwork() error {
	ns, err := openNetns(s.init)
	if err != nil {
		return err
	}
	s.netns.f = ns
	if s.spec.Egress != nil {
		return s.startEgress(s.spec.Egress)
	}
	return nil
}

// startEgress binds the proxy's listener in the sandbox's network
// namespace and serves the proxy on it, before any code of the sandbox
// runs.
func (s *Sandbox) startEgress(e sandbox.Egress) error {
	l, err := listenIn(s.netns.f)
	if err != nil {
		return err
	}
	done := make(chan struct{})
	s.egressL, s.egressDone = l, done
	go func() {
		defer close(done)
		e.Serve(l)
	}()
	return nil
}

// initPipes are the descriptors between the supervisor and a new init:

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
		return s.StartFailure(fmt.Sprintf("the runner exited during start-up with status %d", s.runnerExit.Code))
	}
	return fmt.Errorf("init exited during setup: %v", s.initErr)
}

// readStatus follows init's status pipe. Init is trusted code, but it runs

func (s *Sandbox) readStatus(r *os.File, done chan struct{}) {
	defer close(done)
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
		if st.Event == "exit" {
			// A classic one-shot's runner: init reports its end here.
			s.mu.Lock()
			rp := s.rp
			s.mu.Unlock()
			if rp != nil {
				s.RunnerExited(rp.r, core.Exit{Exited: true, Code: st.Code, Signal: st.Signal})
			}
		}
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

// readControl follows init's control socket ctl until it ends, then
// closes done. It is the sandbox's for its life, or until a new socket
// takes its place (rebindControl), and then ends quietly, closing ctl.
func (s *Sandbox) readControl(ctl int, done chan struct{}) {
	defer close(done)
	buf, oob := make([]byte, 64<<10), make([]byte, unix.CmsgSpace(8*4))
	for {
		m, fds, err := recvCtl(ctl, buf, oob)
		if err != nil {
			s.sendMu.Lock()
			replaced := s.ctl != ctl
			s.sendMu.Unlock()
			if replaced {
				// Init took another socket: this one is nobody's.
				unix.Close(ctl)
				return
			}
			if s.Core.Paused() {
				// Dumped: the runner and the commands come back with
				// a resume (or end with the sandbox's Close, or with a
				// dump that failed: Pause tells the core then).
				return
			}
			// Init is gone, and every process of the sandbox with it.
			// (A one-shot sandbox ends with its runner: its init's end
			// is no news.)
			if !s.ending.Load() && !s.spec.OneShot {
				s.b.log.Warn("sandbox: its init is gone; its calls now fail as closed", "id", s.id, "err", err)
			}
			s.treeGone()
			return
		}
		switch m.Op {
		case opRunner:
			forked := s.z != nil && len(fds) == 6
			if (len(fds) != 2 && !forked) || m.Error != "" {
				closeAll(fds)
				s.b.log.Warn("sandbox: its runner could not be restarted; its init exits", "id", s.id, "err", m.Error)
				continue // init exits after a failed restart: initDone follows
			}
			rp := &runnerProc{pid: m.PID, pidfd: -1, reqW: pollable(fds[0], "requests")}
			rp.events = &eventsReader{f: os.NewFile(uintptr(fds[1]), "events"), fd: fds[1]}
			var opts []core.RunnerOption
			if s.z != nil {
				// A zygote's child reports what it could not do before it
				// became the runner (the Go init reports on its status pipe).
				opts = append(opts, core.OnSetupError(func(msg string) { s.runnerSetupFailed(rp, errors.New(msg)) }))
			}
			rp.r = core.NewRunner(rp, opts...)
			go s.ReadEvents(rp.r, rp.events)
			s.mu.Lock()
			s.rp = rp
			s.mu.Unlock()
			s.SetRunner(rp.r)
			if forked {
				go s.forkRunner(rp, fds[2:])
			}
		case opExited:
			closeAll(fds)
			if m.ID != 0 {
				s.CommandExited(m.ID, m.Code)
				continue
			}
			s.mu.Lock()
			rp := s.rp
			isRunner := rp != nil && rp.pid == m.PID
			if isRunner {
				rp.closePidfd() // an adopted runner's
			}
			s.mu.Unlock()
			if isRunner {
				s.RunnerExited(rp.r, core.Exit{Exited: true, Code: m.Code, Signal: m.Signal})
			}
		case opSpawned:
			s.Started(m.ID, s.spawned(m, fds))
		case opTerminal:
			// A restored terminal's master (askTerminals).
			s.mu.Lock()
			t := s.terminals[m.ID]
			s.mu.Unlock()
			if t == nil || len(fds) != 1 {
				closeAll(fds)
				continue
			}
			if err := t.swap(fds[0]); err != nil {
				s.b.log.Warn("sandbox: a terminal could not be given back after a restore; it ends", "id", s.id, "err", err)
			}
		case opInterrupt:
			closeAll(fds)
			s.interrupted.Answered(m.ID)
		case opTerminals:
			// The end of init's answer: a terminal it did not send is
			// gone (an init restored from an older server's images),
			// and ends.
			closeAll(fds)
			s.eachTerminal((*terminal).release)
		default:
			closeAll(fds)
		}
	}
}

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
	// A lasting sandbox's runner becomes init's child: the sandbox is one
	// tree, which can be paused, forked and snapshotted. A one-shot's
	// stays the zygote's, one fork cheaper (zygote.py's _fork_adopted).
	adopt := !s.spec.OneShot
	u := s.cfg.user()
	req := forkRequest{Mode: mode, Env: s.cfg.Env, UID: int(u.UID), GID: int(u.GID), Groups: u.Groups, Dir: s.cfg.startDir(),
		Rlimits: s.cfg.runnerRlimits(), Adopt: adopt}
	ns, err := s.init.namespaces()
	if err != nil {
		s.runnerSetupFailed(r, err)
		return
	}
	defer closeAll(ns)
	sent := append(append(ns, fds...), gate[0])
	// cgroup v1: the runner moves itself into the sandbox's group, as its
	// first step (zygote.py), where a move by its pid would wait for the
	// kernel (threadCgroup).
	var tasks *groupTasks
	if s.cg != nil {
		tasks = openGroupTasks(s.cg)
		defer tasks.close()
		sent = append(sent, tasks.fds()...)
	}
	onExit := func(code, signal int) { s.runnerExited(r, code, signal) }
	if adopt {
		onExit = nil // init says
	}
	res, err := s.z.fork(context.Background(), req, sent, onExit)
	unix.Close(gate[0])
	if err != nil {
		s.runnerSetupFailed(r, err)
		return
	}
	hostPID, err := pidfdPID(res.pidfd)
	if err == nil {
		// The zygote names its child by a pidfd of any process it sees:
		// one of this sandbox's alone is taken (a template's zygote runs
		// the image's code).
		err = s.init.samePIDNamespace(hostPID)
	}
	if err == nil && s.cg != nil && tasks == nil {
		err = s.cg.AddProc(hostPID)
	}
	if err != nil {
		unix.PidfdSendSignal(res.pidfd, unix.SIGKILL, nil, 0)
		unix.Close(res.pidfd)
		s.runnerSetupFailed(r, fmt.Errorf("runner into its cgroup: %w", err))
		return
	}
	s.mu.Lock()
	if isClosed(r.r.Exited()) {
		s.mu.Unlock()
		unix.Close(res.pidfd)
		return
	}
	r.pidfd = res.pidfd
	s.mu.Unlock()
	if adopt {
		pid, err := nsPID(hostPID)
		if err == nil {
			s.mu.Lock()
			r.pid = pid
			s.mu.Unlock()
			err = s.send(ctlMsg{Op: opAdopt, PID: pid})
		}
		if err != nil {
			// The runner is not given its start: it sees the gate's end
			// and exits, and init, which has it, reaps it.
			s.runnerSetupFailed(r, fmt.Errorf("hand the runner to init: %w", err))
			return
		}
	}
	unix.Write(gate[1], []byte("g"))
}

// pollable wraps a pipe end in a non-blocking *os.File: writes wait in the

func pollable(fd int, name string) *os.File {
	unix.SetNonblock(fd, true)
	return os.NewFile(uintptr(fd), name)
}

// runnerExited records the end of a zygote's runner, as the zygote saw it.
func (s *Sandbox) runnerExited(r *runnerProc, code, signal int) {
	s.mu.Lock()
	r.closePidfd()
	last := s.spec.OneShot && s.rp == r
	s.mu.Unlock()
	if last {
		// A one-shot sandbox ends with its runner, as with a classic
		// init, which is the runner's parent and exits with it.
		s.statusMu.Lock()
		s.setRunnerExit(&initStatus{Event: "exit", Code: code, Signal: signal})
		s.statusMu.Unlock()
	}
	s.RunnerExited(r.r, core.Exit{Exited: true, Code: code, Signal: signal})
	if last {
		s.kill()
	}
}

// runnerSetupFailed records that a zygote could not give a runner.
func (s *Sandbox) runnerSetupFailed(r *runnerProc, err error) {
	err = fmt.Errorf("runner: %w", err)
	s.mu.Lock()
	if !isClosed(s.failed) {
		s.failErr = err
		close(s.failed)
	}
	s.mu.Unlock()
	s.RunnerFailed(r.r, err)
}

func (s *Sandbox) send(m ctlMsg) error {
	if s.Core.Paused() {
		return sandbox.ErrPaused // init is gone until a resume
	}
	s.sendMu.Lock()
	defer s.sendMu.Unlock()
	if err := sendCtl(s.ctl, m); err != nil {
		return fmt.Errorf("%w: control socket: %v", sandbox.ErrClosed, err)
	}
	return nil
}

// interrupt has init send the runner SIGINT, and waits until it has:
// the core holds the execution while it waits (Core.Interrupt), so the
// signal is the runner's before the next execution's request is written,
// and a runner drops a signal that came before a request (runner.py's
// _Interrupts): an interrupt never reaches the next cell. An init that
// does not answer (one restored from an older server's images) is waited
// for at most core.InterruptWait.
func (s *Sandbox) interrupt() error {
	id := interruptID.Add(1)
	if err := s.send(ctlMsg{Op: opInterrupt, ID: id}); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), core.InterruptWait)
	defer cancel()
	s.interrupted.Wait(ctx, id, s.dead()) // sent either way; the wait only orders it
	return nil
}

var interruptID atomic.Uint64

// ID implements sandbox.Sandbox.
func (s *Sandbox) ID() string { return s.id }

// Workspace implements sandbox.Sandbox.
func (s *Sandbox) Workspace() sandbox.Workspace {
	s.dirMu.RLock()
	defer s.dirMu.RUnlock()
	if s.ws == nil {
		return sandbox.DiskOnly{} // opened from disk, paused
	}
	return s.gated(s.ws)
}

// kill ends every process of the sandbox: init is PID 1 of the sandbox's
// PID namespace, and when it dies the kernel kills all the rest, however
// they forked, setsid or ignored signals. The cgroup is the second net.
func (s *Sandbox) kill() {
	s.lifeMu.Lock()
	p := s.init
	s.lifeMu.Unlock()
	if p != nil {
		p.kill()
	}
}

// waitInit reaps init p and closes done when it has exited.
func (s *Sandbox) waitInit(p *initProc, done chan struct{}) {
	go func() {
		s.initErr = p.wait()
		close(done)
	}()
}

// dead returns the current init's initDone (a resume replaces it).
func (s *Sandbox) dead() chan struct{} {
	s.lifeMu.Lock()
	defer s.lifeMu.Unlock()
	return s.initDone
}

// Quiesce implements sandbox.Quiescer: it kills every process of the
// sandbox and waits until they are gone.
func (s *Sandbox) Quiesce() {
	s.kill()
	if s.init != nil {
		<-s.dead()
	}
}

// Close implements sandbox.Sandbox.
func (s *Sandbox) Close() error {
	s.closeOnce.Do(func() {
		s.ending.Store(true)
		var errs []error
		// After a Pause or Resume under way; none starts from here.
		s.pauseMu.Lock()
		s.closing = true
		cp := s.cp
		s.cp = nil
		s.pauseMu.Unlock()
		s.kill()
		if s.init != nil {
			<-s.dead()
			if s.init.pidfd >= 0 {
				s.init.awaitReaped()
				unix.Close(s.init.pidfd)
			}
		}
		if s.upper != nil {
			s.upper.Close()
		}
		if s.unhold != nil {
			s.unhold()
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
		if r := s.rp; r != nil {
			r.closePidfd()
			r.hangUp()
		}
		s.mu.Unlock()
		timeout := time.After(drainTimeout)
		for _, c := range []*pipeReader{s.stdout, s.stderr} {
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
		s.netns.close()
		if s.spec.Egress != nil {
			// Every process of the sandbox is dead: the proxy's
			// connections and its listener go too.
			s.spec.Egress.Close()
			if s.egressDone != nil {
				<-s.egressDone
			}
		}
		if cp != nil {
			// A paused sandbox's files, held by its mount namespace,
			// and its commands and terminals, which end now.
			cp.close()
			s.CommandsGone()
			s.eachTerminal((*terminal).release)
		}
		// The last references to the disk tmpfs: its memory is freed.
		s.dirMu.Lock()
		for _, d := range append([]*workspace.Dir{s.ws, s.rootAsUser, s.rootAsRoot}, s.oldDirs...) {
			if d != nil {
				d.Close()
			}
		}
		s.oldDirs = nil
		s.dirMu.Unlock()
		if s.z != nil {
			s.z.release()
		}
		errs = append(errs, s.giveBack())
		s.closeErr = errors.Join(errs...)
	})
	return s.closeErr
}

// giveBack returns to the host what a sandbox none of whose processes is
// left holds of it: its checkpoints (a paused one's memory, the /proc
// masks' copies a resumed one had bound), its cgroup (destroyed; s.cg
// still names it, as code running beside a Close reads it unlocked), and
// its host user, which can then be another sandbox's. For Close, and for
// a paused sandbox's release (ReleasePaused).
func (s *Sandbox) giveBack() error {
	var errs []error
	if s.checkpointed {
		errs = append(errs, s.b.removeCheckpoints(s.id))
		s.checkpointed, s.lastCheckpoint = false, ""
	}
	if g := s.group(); g != nil {
		errs = append(errs, g.Destroy())
	}
	if s.hasOwner {
		s.b.releaseOwner(s.owner)
		s.hasOwner = false
	}
	return errors.Join(errs...)
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
