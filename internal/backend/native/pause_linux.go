package native

// Pause and resume (sandbox.Pauser, issue 15, docs/snapshots.md). Pause
// dumps the sandbox's process tree with CRIU (checkpoint_linux.go) into a
// directory of the backend's and the tree ends: init's exit is then not
// the sandbox's end (driver.Closed). Resume restores the tree
// (restore_linux.go) and gives the same Sandbox the restored processes:
// init as the supervisor's child, its status and output pipes, its
// control socket, the runner's request and event pipes as a new
// core.Runner, ready and holding the old state. The sandbox keeps its id,
// cgroup, host user and files throughout.
//
// While paused the sandbox's files stay where they were, in its root
// tmpfs, held in memory through its mount namespace (checkpoint.mntns):
// the files API can still read them, but changes nothing until the
// resume (pausefiles_linux.go), since CRIU refuses a resume where a file
// the paused code holds open has changed.
//
// Order of a pause, under pauseMu and the core's Exclusive (no execution
// runs or starts):
//  1. no command starts (startGate), the files API changes no file
//     (files); paused; the terminals are held (terminal_linux.go);
//  2. dump: init takes a control socket CRIU can dump, which the Sandbox
//     reads from then on (so a dump that fails leaves it running); the
//     supervisor holds the sandbox's ends of the commands' pipes
//     (holdPipes), then CRIU dumps the tree and it ends;
//  3. the dumped tree's end is seen by every reader, the runner is
//     forgotten without its state being taken for lost, the network
//     proxy's listener is closed (settle).
//
// A resume, under the same locks: CRIU restores the tree; adopt gives
// the Sandbox its init, pipes, control socket, network namespace and
// runner, and joins the commands' pipes (joinPipe) and, as init answers,
// their terminals (terminal.swap); the proxy listens again; the images
// are removed.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vivarium-sandbox/vivarium/internal/core"
	"github.com/vivarium-sandbox/vivarium/internal/criu"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/workspace"
)

var _ sandbox.Pauser = (*Sandbox)(nil)

// Pause implements sandbox.Pauser. It fails with sandbox.ErrBusy while an
// execution runs, and with
// sandbox.ErrUnsupported, naming why, for a sandbox that cannot be paused. A pause that fails leaves the
// sandbox running, unpaused. Pausing a paused sandbox does nothing.
func (s *Sandbox) Pause(ctx context.Context) error {
	if err := s.pausable(); err != nil {
		return err
	}
	bin, err := s.b.criu()
	if err != nil {
		return err
	}
	if u, err := s.Usage(); err == nil {
		if err := checkpointRoom(s.b.cfg.CheckpointDir, u.Memory); err != nil {
			return err
		}
		if err := s.restoreFits(u.Memory); err != nil {
			return err
		}
	}
	s.pauseMu.Lock()
	defer s.pauseMu.Unlock()
	if s.closing {
		return sandbox.ErrClosed
	}
	if s.Core.Paused() {
		return nil
	}
	return s.Exclusive(func() error {
		if (*driver)(s).Closed() {
			return sandbox.ErrClosed
		}
		// No command starts from here. Those running go on after a
		// resume, in a terminal or not.
		s.startGate.Lock()
		// Nor does the files API change a file from here
		// (pausefiles_linux.go).
		if err := s.files.hold(); err != nil {
			s.startGate.Unlock()
			return err
		}
		s.Core.SetPaused(true)
		s.startGate.Unlock()
		dir, err := s.b.checkpointDir(s.id)
		s.checkpointed = true
		if err != nil {
			s.files.release(false)
			s.Core.SetPaused(false)
			return fmt.Errorf("pause: %w", err)
		}
		// CRIU is not stopped half-way (its parasite code is in the
		// sandbox's processes while it dumps): a caller that gives up
		// does not end it.
		s.eachTerminal((*terminal).hold)
		cp, err := s.dump(context.WithoutCancel(ctx), bin, dir)
		s.files.release(err == nil)
		if err != nil {
			s.eachTerminal((*terminal).release)
			s.Core.SetPaused(false)
			os.RemoveAll(dir)
			if isClosed(s.dead()) {
				// The tree ended all the same: as readControl would
				// have said, had the sandbox not been pausing.
				s.treeGone()
			}
			return fmt.Errorf("pause: %w", err)
		}
		s.cp = cp
		s.settle()
		return nil
	})
}

// pausable says why the sandbox cannot be paused, if it cannot.
func (s *Sandbox) pausable() error {
	if s.spec.OneShot {
		return fmt.Errorf("%w: a one-shot sandbox cannot be paused", sandbox.ErrUnsupported)
	}
	return nil
}

// settle waits until the dumped tree's end has been seen by every reader
// of it (init's wait, its status, control and output pipes, the runner's
// events), bounded by drainTimeout, and lets go of the supervisor's ends.
// The runner is forgotten, its state not lost: a resume brings it back.
func (s *Sandbox) settle() {
	timeout := time.After(drainTimeout)
	wait := func(ch <-chan struct{}) {
		select {
		case <-ch:
		case <-timeout:
		}
	}
	wait(s.dead())
	wait(s.statusDone)
	wait(s.ctlDone)
	for _, c := range []*pipeReader{s.stdout, s.stderr} {
		wait(c.done)
		c.close()
	}
	s.mu.Lock()
	rp := s.rp
	s.mu.Unlock()
	if rp != nil {
		wait(rp.r.EventsDone())
		rp.hangUp()
	}
	s.sendMu.Lock()
	unix.Close(s.ctl)
	s.ctl = -1
	s.sendMu.Unlock()
	s.ResetRunner(false)
	if s.egressL != nil {
		// The proxy's listener, in a network namespace no process is
		// left in: a resume opens another in the restored one.
		s.egressL.Close()
		wait(s.egressDone)
		s.egressL = nil
	}
}

// Resume implements sandbox.Pauser: the sandbox's processes are restored
// where they were. A resume that fails leaves the sandbox paused.
// Resuming a sandbox that is not paused does nothing.
func (s *Sandbox) Resume(ctx context.Context) error {
	s.pauseMu.Lock()
	defer s.pauseMu.Unlock()
	if s.closing {
		return sandbox.ErrClosed
	}
	if !s.Core.Paused() {
		return nil
	}
	bin, err := s.b.criu()
	if err != nil {
		return err
	}
	if s.persisted != nil {
		return s.resumePersisted(ctx, bin)
	}
	return s.resumeTree(ctx, bin)
}

// resumeTree restores the tree of the sandbox's checkpoint (s.cp).
func (s *Sandbox) resumeTree(ctx context.Context, bin string) error {
	return s.Exclusive(func() error {
		if s.cg != nil {
			s.cp.group = s.cg.Path()
		}
		s.cp.volumes = s.spec.Volumes
		s.cp.layers = s.spec.RootLayers()
		if err := s.memoryTookOver(s.cp.tookOver); err != nil {
			return fmt.Errorf("resume: %w", err)
		}
		undo := restoreRoom(s.cg, groupLimits(s.spec).Pids)
		r, err := restoreTree(context.WithoutCancel(ctx), bin, s.cp)
		undo()
		if err != nil {
			return fmt.Errorf("resume: %w", err)
		}
		s.tookOver = s.cp.tookOver
		s.layerMounts = nil
		if r.layerMount != "" {
			s.layerMounts = []string{r.layerMount}
		}
		if err := s.adopt(r, s.cp); err != nil {
			r.kill()
			return fmt.Errorf("resume: %w", err)
		}
		s.pidsMax.Store(0) // undo set the group's
		s.fitPids()
		settleStops(s.cg)
		if err := s.reopenRoot(); err != nil {
			s.Core.SetPaused(false)
			s.kill()
			return fmt.Errorf("resume: %w", err)
		}
		if s.spec.Egress != nil {
			// The proxy, at its address in the restored namespace. Its
			// processes run already: one may have taken the port (only
			// its own sandbox's network is then broken). The sandbox
			// ends rather than go on without its proxy.
			if err := s.startEgress(s.spec.Egress); err != nil {
				s.Core.SetPaused(false)
				s.kill()
				return fmt.Errorf("resume: the network proxy in the restored sandbox: %w", err)
			}
		}
		cp := s.cp
		s.cp = nil
		s.Core.SetPaused(false)
		s.files.resumed()
		// The images: the restored tree's memory is its own again. The
		// directory keeps the /proc masks' copies, bound in the sandbox,
		// until it closes.
		cp.close()
		s.b.removeLater(cp.images())
		// The previous checkpoint's masks are bound nowhere any more.
		if s.lastCheckpoint != "" {
			os.RemoveAll(s.lastCheckpoint)
		}
		s.lastCheckpoint = cp.dir
		return nil
	})
}

// adopt makes the restored tree r the sandbox's: init, the supervisor's
// ends of its pipes and control socket, the runner.
func (s *Sandbox) adopt(r *restoredTree, cp *checkpoint) error {
	var status, stdout, stderr, req, events *os.File
	var others []extPipe // the commands' pipes, and any other
	for _, p := range cp.pipes {
		f := r.pipes[p.ino]
		switch {
		case p.init && p.fd == fdStatus:
			status = f
		case p.init && p.fd == fdStdout:
			stdout = f
		case p.init && p.fd == fdStderr:
			stderr = f
		case p.pid == cp.runnerPID && p.reader:
			req = f
		case p.pid == cp.runnerPID && p.fd > 2:
			events = f
		default:
			others = append(others, p)
		}
	}
	if status == nil || stdout == nil || stderr == nil || req == nil || events == nil || r.ctl == nil {
		return fmt.Errorf("the restored tree lacks init's or the runner's pipes (%+v)", cp.pipes)
	}
	if s.cg != nil {
		pids, err := s.cg.Procs()
		if err != nil || !slices.Contains(pids, r.pid) {
			return fmt.Errorf("restored init %d is not in the sandbox's cgroup (%v)", r.pid, err)
		}
	}
	// r.pid is this process's child, not reaped: its own.
	netns, err := os.Open(fmt.Sprintf("/proc/%d/ns/net", r.pid))
	if err != nil {
		return fmt.Errorf("the restored network namespace: %w", err)
	}
	ctl, err := unix.FcntlInt(r.ctl.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		netns.Close()
		return fmt.Errorf("the restored control socket: %w", err)
	}
	outR, err := newPipeReader(stdout, s.Core.Stdout)
	var errR *pipeReader
	if err == nil {
		errR, err = newPipeReader(stderr, s.Core.Stderr)
	}
	if err != nil {
		if outR != nil {
			outR.close()
		}
		netns.Close()
		unix.Close(ctl)
		return err
	}
	// Nothing fails from here: r is the sandbox's.
	r.ctl.Close()
	r.ctl = nil
	for _, p := range others {
		f := r.pipes[p.ino]
		delete(r.pipes, p.ino)
		if held := cp.held[p.ino]; held != nil {
			joinPipe(held, f, p.reader)
			delete(cp.held, p.ino)
			continue
		}
		// Not held (the dump found it, but its process let it go
		// before holdPipes): it ends as it would have (EOF, EPIPE).
		f.Close()
	}
	ip := &initProc{pid: r.pid, proc: r.proc, pidfd: -1, inCgroup: true}
	s.ownRunners.Store(s.cfg.Role == roleForked)
	done := make(chan struct{})
	s.lifeMu.Lock()
	s.init, s.initDone = ip, done
	s.lifeMu.Unlock()
	s.waitInit(ip, done)
	s.statusDone = make(chan struct{})
	go s.readStatus(status, s.statusDone)
	s.stdout, s.stderr = outR, errR
	s.netns.mu.Lock()
	if s.netns.f != nil {
		s.netns.f.Close()
	}
	s.netns.f = netns
	s.netns.mu.Unlock()

	s.mu.Lock()
	old := s.rp
	s.mu.Unlock()
	rp := &runnerProc{pidfd: -1, reqW: req, events: &eventsReader{f: events, fd: rawFD(events)}}
	if old != nil {
		rp.pid = old.pid // CRIU restores pids in the sandbox's PID namespace
	}
	rp.r = core.NewRunner(rp)
	rp.r.MarkReady() // it said so before the pause
	go s.ReadEvents(rp.r, rp.events)
	s.mu.Lock()
	s.rp = rp
	s.mu.Unlock()
	s.SetRunner(rp.r)

	s.sendMu.Lock()
	s.ctl = ctl
	s.ctlDone = make(chan struct{})
	go s.readControl(s.ctl, s.ctlDone)
	s.sendMu.Unlock()
	// The terminals' masters, held by the restored init; a copy's init
	// lets go of those of the source's.
	s.askTerminals()
	return nil
}

// joinPipe joins a restored pipe to the sandbox's end of the one it
// replaces, which the supervisor held while the sandbox was paused
// (holdPipes): what the sandbox writes on the new pipe goes on to the old
// one's reader on the host, what the host writes on the old one to the
// sandbox. Each copy ends at its source's end, closing its destination.
func joinPipe(old, restored *os.File, sandboxReads bool) {
	src, dst := restored, old
	if sandboxReads {
		src, dst = old, restored
	}
	go func() {
		io.Copy(dst, src)
		dst.Close()
		src.Close()
	}()
}

// rawFD is f's descriptor, without making it blocking (as Fd does).
func rawFD(f *os.File) int {
	fd := -1
	if rc, err := f.SyscallConn(); err == nil {
		rc.Control(func(u uintptr) { fd = int(u) })
	}
	return fd
}

// runnerHostPID finds, in the tree of init (host pid initPID), the host
// pid of the process whose pid in the sandbox is nsPID.
func runnerHostPID(tree []int, nsPID int) (int, error) {
	want := strconv.Itoa(nsPID)
	for _, pid := range tree[1:] {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
		if err != nil {
			continue
		}
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "NSpid:"); ok {
				if f := strings.Fields(v); len(f) > 0 && f[len(f)-1] == want {
					return pid, nil
				}
			}
		}
	}
	return 0, fmt.Errorf("the runner (pid %d in the sandbox) is not in init's tree", nsPID)
}

// treeGone tells the core that the sandbox's processes are all gone:
// every command has ended, and the runner.
func (s *Sandbox) treeGone() {
	s.CommandsGone()
	s.mu.Lock()
	rp := s.rp
	s.mu.Unlock()
	// Their ends are the commands' now: each reads its end of output.
	s.eachTerminal((*terminal).release)
	if rp != nil {
		s.RunnerExited(rp.r, core.Exit{Exited: true, Code: 128 + int(syscall.SIGKILL), Signal: int(syscall.SIGKILL)})
	}
}

// criu returns the CRIU binary the backend pauses with, found once it is
// there (internal/criu.Find), or an ErrUnsupported that says how to get
// one.
func (b *Backend) criu() (string, error) {
	b.criuMu.Lock()
	defer b.criuMu.Unlock()
	if b.criuBin != "" {
		return b.criuBin, nil
	}
	bin, err := criu.Usable()
	if err != nil {
		return "", fmt.Errorf("%w: pausing a sandbox needs CRIU 4: %v", sandbox.ErrUnsupported, err)
	}
	if missing := criu.MissingPatches(bin, criuPatches); len(missing) > 0 {
		return "", fmt.Errorf("%w: the CRIU at %s was built without %s (scripts/criu): build it again with `make criu`",
			sandbox.ErrUnsupported, bin, strings.Join(missing, ", "))
	}
	if _, err := nsenter(); err != nil {
		return "", fmt.Errorf("%w: %v", sandbox.ErrUnsupported, err)
	}
	b.criuBin = bin
	return bin, nil
}

// criuPatches are the patches of scripts/criu that pausing needs (see
// docs/snapshots.md): a CRIU that make criu built names those it has in
// its BUILD-INFO.
var criuPatches = []string{"rlimits-from-proc.patch", "external-deleted-mount.patch", "socket-pass-opts.patch",
	"userns-check-fds.patch", "landlock-restore.patch"}

// checkpointDir returns a new directory's path for a checkpoint of
// sandbox id (prepareDump makes it): CheckpointDir/id/N. CheckpointDir and
// CheckpointDir/id let the sandbox's host root through (0711, handOver);
// CheckpointDir/id goes with the sandbox.
func (b *Backend) checkpointDir(id string) (string, error) {
	root := b.cfg.CheckpointDir
	if err := os.MkdirAll(root, 0o711); err != nil {
		return "", err
	}
	for d := root; d != "/"; d = filepath.Dir(d) {
		st, err := os.Stat(d)
		if err != nil {
			return "", err
		}
		if st.Mode().Perm()&0o001 == 0 {
			if d != root {
				return "", fmt.Errorf("checkpoints: %s must let others through (o+x) for a restore to read its checkpoints", d)
			}
			if err := os.Chmod(d, st.Mode().Perm()|0o011); err != nil {
				return "", err
			}
		}
	}
	dir := filepath.Join(root, id)
	if err := os.Mkdir(dir, 0o711); err != nil && !errors.Is(err, os.ErrExist) {
		return "", err
	}
	b.criuMu.Lock()
	b.checkpoints++
	n := b.checkpoints
	b.criuMu.Unlock()
	return filepath.Join(dir, strconv.FormatUint(n, 10)), nil
}

// removeCheckpoints removes what the pauses of sandbox id left.
func (b *Backend) removeCheckpoints(id string) error {
	return os.RemoveAll(filepath.Join(b.cfg.CheckpointDir, id))
}

// sweepCheckpoints removes every sandbox's directory under CheckpointDir
// (see Sweep).
func (b *Backend) sweepCheckpoints() error {
	entries, err := os.ReadDir(b.cfg.CheckpointDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	// Mounts a crashed server left there: a fork's files, a restore's
	// root, a killed criu's cgroup yard.
	unmountUnder(b.cfg.CheckpointDir)
	var errs []error
	for _, e := range entries {
		errs = append(errs, os.RemoveAll(filepath.Join(b.cfg.CheckpointDir, e.Name())))
	}
	return errors.Join(errs...)
}

// pauseState is the Backend's part of pausing: the CRIU binary and a
// counter naming checkpoints.
type pauseState struct {
	criuMu      sync.Mutex
	criuBin     string
	checkpoints uint64
	// hashSeed is the PYTHONHASHSEED of pausable sandboxes' runners
	// (initConfig.HashSeed), the current base's (pausebase_linux.go).
	hashSeed   string
	baseMu     sync.Mutex // bases
	baseMakeMu sync.Mutex // held while a base is made
	bases      baseState
}

// reopenRoot gives the files API the restored mount namespace's root: the
// Dirs opened at creation hold the paused namespace's, whose mounts are
// gone (through them /usr, /proc and /dev are bare directories of the
// root tmpfs, which a removal would take from the running sandbox).
// Only init's root itself is opened, no path in it: nothing the sandbox
// changed is followed. The workspace's Dir is kept: it is the same file
// system, reached the same way.
func (s *Sandbox) reopenRoot() error {
	rootPath := fmt.Sprintf("/proc/%d/root", s.init.pid)
	uid, gid := s.userIDs()
	asUser, err := workspace.Open(rootPath, uid, gid)
	if err != nil {
		return err
	}
	asRoot, err := workspace.Open(rootPath, int(s.owner.ID(0)), int(s.owner.ID(0)))
	if err != nil {
		asUser.Close()
		return err
	}
	s.dirMu.Lock()
	defer s.dirMu.Unlock()
	s.oldDirs = append(s.oldDirs, s.rootAsUser, s.rootAsRoot)
	s.rootAsUser, s.rootAsRoot = asUser, asRoot
	return nil
}
