package container

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/agent"
	"github.com/vivarium-sandbox/vivarium/internal/cgroups"
	"github.com/vivarium-sandbox/vivarium/internal/core"
	"github.com/vivarium-sandbox/vivarium/internal/hostuid"
	"github.com/vivarium-sandbox/vivarium/internal/runner"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/workspace"
)

// Where things are inside a container, and who the code runs as (unless
// a template's USER names another user).
const (
	RunnerDir  = "/opt/vivarium"
	AgentPath  = "/opt/vivarium/agent"
	SandboxUID = sandbox.DefaultUID
	SandboxGID = sandbox.DefaultGID
)

// Sandbox is one container sandbox. Its executions, code contexts and
// commands are the core's; this file follows the agent's stream, which
// carries the runner's events, output and the commands' streams.
type Sandbox struct {
	*core.Core
	id      string
	b       *Backend
	spec    sandbox.Spec
	dir     string // the sandbox's state directory on the host
	mounted bool   // the disk tmpfs is mounted
	disk    Disk
	// ws and cg, under mu: a paused sandbox released (persist_linux.go)
	// has neither until its resume; provisions counts the cgroups it
	// was given (provision).
	ws         *workspace.Dir
	cg         cgroups.Group
	provisions int
	// uid and gid are the sandbox user's (see Launch); users is the host
	// uid range they come from, nil without Config.Users.
	uid, gid int
	users    *hostuid.Range
	// sess is the running container; a persistent sandbox whose container
	// died (gVisor over its memory limit) gets a new one, with the same
	// disk, on its next execution.
	sess atomic.Pointer[session]
	// closing is set by Close: no new container then.
	closing atomic.Bool
	// leftBehind: a container of the sandbox may not be gone.
	leftBehind atomic.Bool

	// Pause and resume (pause_linux.go). pauseMu orders Pause, Resume
	// and Close; paused is set while the sandbox's container is
	// checkpointed; startGate is held (read) while a command starts, so
	// that a pause finds it. checkpoint is the paused sandbox's
	// checkpoint directory and checkpoints counts them, under pauseMu.
	pauseMu     sync.Mutex
	startGate   sync.RWMutex
	checkpoint  string
	checkpoints int
	// persisted, under pauseMu, is the directory a paused sandbox is
	// kept in once it holds nothing else (ReleasePaused, OpenPaused):
	// its resume restores it from there.
	persisted *persistedDir

	// mu comes after the core's lock, and is never held while calling
	// the core.
	mu       sync.Mutex
	runner   *agentRunner // the current runner
	cmds     map[uint32]*cmdStreams
	setupErr string // the agent's OpError

	closeOnce sync.Once
	closeErr  error
}

var (
	_ sandbox.Sandbox       = (*Sandbox)(nil)
	_ sandbox.ContextKeeper = (*Sandbox)(nil)
)

// session is one container of a sandbox and the agent's stream.
type session struct {
	c     Container
	out   *agent.Writer
	ended chan struct{} // the agent's stream ended: the container is gone
	ready chan struct{} // the agent is set up
	// pongs follows the agent's answers to pings.
	pongs core.Answers
	// runnerKept: the container's end is not its runner's (a checkpoint
	// ended it, or it is a restore not yet adopted): the sandbox's state
	// is not lost with it.
	runnerKept atomic.Bool

	// egress are the sandbox's connections to its network proxy
	// (egress_linux.go).
	egress egressConns

	endOnce sync.Once
	endErr  error
}

func (s *Sandbox) session() *session { return s.sess.Load() }

func newSession(c Container) *session {
	return &session{c: c, out: agent.NewWriter(c.Stdin()), ended: make(chan struct{}), ready: make(chan struct{})}
}

// agentRunner is a runner of a container, reached through the agent's
// stream (core.Conn): requests go on its request stream, events come on
// its event stream into a pipe the core reads.
type agentRunner struct {
	r      *core.Runner
	ss     *session
	gen    uint32
	events *io.PipeWriter
}

var _ core.Conn = (*agentRunner)(nil)

func (a *agentRunner) Send(req runner.Request) error {
	var b bytes.Buffer
	if err := runner.WriteFrame(&b, req); err != nil {
		return err
	}
	if err := a.ss.out.Write(agent.KindData, agent.RequestStream(a.gen), b.Bytes()); err != nil {
		return fmt.Errorf("%w: the agent is gone: %v", sandbox.ErrClosed, err)
	}
	return nil
}

// Ack: the agent's stream never blocks on a runner that does not read.
func (a *agentRunner) Ack() { a.ss.out.Write(agent.KindData, agent.RequestStream(a.gen), ackFrame) }

func (a *agentRunner) HangUp() { a.ss.out.Write(agent.KindClose, agent.RequestStream(a.gen), nil) }

// ackFrame is the runner.Request{Type: "ack"} frame.
var ackFrame = func() []byte {
	var b bytes.Buffer
	runner.WriteFrame(&b, runner.Request{Type: "ack"})
	return b.Bytes()
}()

// ID implements sandbox.Sandbox.
func (s *Sandbox) ID() string { return s.id }

// Workspace implements sandbox.Sandbox. A paused sandbox kept on disk
// alone has no files to reach until it resumes.
func (s *Sandbox) Workspace() sandbox.Workspace {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ws == nil {
		return sandbox.DiskOnly{}
	}
	return s.ws
}

func (s *Sandbox) setWorkspace(ws *workspace.Dir) {
	s.mu.Lock()
	s.ws = ws
	s.mu.Unlock()
}

// group is the sandbox's cgroup, nil where it has none (now).
func (s *Sandbox) group() cgroups.Group {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cg
}

func (s *Sandbox) setGroup(g cgroups.Group) {
	s.mu.Lock()
	s.cg = g
	s.mu.Unlock()
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

// read follows the agent's stream for the container's life.
func (s *Sandbox) read(ss *session) {
	defer close(ss.ended)
	defer s.teardownStreams(ss)
	fr := agent.NewReader(ss.c.Stdout())
	for {
		f, err := fr.Next()
		if err != nil {
			return
		}
		switch f.Kind {
		case agent.KindCtl:
			var c agent.Ctl
			if json.Unmarshal(f.Data, &c) == nil {
				s.control(ss, c)
			}
		case agent.KindData, agent.KindClose:
			if agent.IsEgressStream(f.Stream) {
				ss.egressData(f)
				continue
			}
			s.data(f)
		}
	}
}

// teardownStreams ends everything that waits on the agent: the container
// ss is gone, and every process in it (unless it was checkpointed: its
// runner then comes back with a restore).
func (s *Sandbox) teardownStreams(ss *session) {
	ss.endEgress(true)
	s.mu.Lock()
	r := s.runner
	cmds := s.cmds
	s.cmds = map[uint32]*cmdStreams{}
	s.mu.Unlock()
	if r != nil {
		r.events.Close()
		if !ss.runnerKept.Load() {
			s.RunnerExited(r.r, core.Exit{})
		}
	}
	s.CommandsGone()
	for _, c := range cmds {
		// No more output can come: readers must not wait for it.
		c.stdout.Close()
		c.stderr.Close()
	}
}

func (s *Sandbox) control(ss *session, c agent.Ctl) {
	switch c.Op {
	case agent.OpReady:
		if !isClosed(ss.ready) {
			close(ss.ready)
		}
	case agent.OpPing:
		ss.pongs.Answered(uint64(c.ID))
	case agent.OpError:
		s.mu.Lock()
		s.setupErr = c.Step + ": " + c.Error
		s.mu.Unlock()
	case agent.OpRunner:
		pr, pw := io.Pipe()
		r := &agentRunner{ss: ss, gen: c.Gen, events: pw}
		r.r = core.NewRunner(r)
		go s.ReadEvents(r.r, pr)
		s.mu.Lock()
		if old := s.runner; old != nil {
			old.events.Close()
		}
		s.runner = r
		s.mu.Unlock()
		s.SetRunner(r.r)
	case agent.OpConnect:
		s.connect(ss, c.ID)
	case agent.OpSpawned:
		s.Started(uint64(c.ID), s.spawned(c))
	case agent.OpExited:
		if c.ID == 0 {
			s.mu.Lock()
			r := s.runner
			s.mu.Unlock()
			if r == nil || r.gen != c.Gen {
				return
			}
			select {
			case <-r.r.Ready():
				s.RunnerExited(r.r, core.Exit{Exited: true, Code: c.Code, Signal: c.Signal})
			default:
				// It never got ready (a template's python3 that
				// fails to start, say): its start-up failed, and
				// whoever waits for it hears so now.
				s.RunnerFailed(r.r, s.StartFailure(fmt.Sprintf("the runner exited during start-up with status %d", c.Code)))
			}
			return
		}
		// Marked exited before its waiters hear of it: a pause or
		// snapshot that follows the wait must not count it as running.
		s.mu.Lock()
		if cs := s.cmds[c.ID]; cs != nil {
			// The ends of its output streams may come after the exit
			// (a process it started may still write): it is forgotten
			// once both have come.
			if cs.exited = true; cs.closed == 2 {
				delete(s.cmds, c.ID)
			}
		}
		s.mu.Unlock()
		s.CommandExited(uint64(c.ID), c.Code)
	}
}

func (s *Sandbox) data(f agent.Frame) {
	switch f.Stream {
	case agent.StreamStdout:
		s.Core.Stdout.Write(f.Data)
		return
	case agent.StreamStderr:
		s.Core.Stderr.Write(f.Data)
		return
	}
	s.mu.Lock()
	r := s.runner
	var cs *cmdStreams
	var which uint32
	if f.Stream >= 1<<24 {
		cs = s.cmds[(f.Stream-(1<<24))/3]
		which = (f.Stream - (1 << 24)) % 3
	}
	s.mu.Unlock()
	if r != nil && f.Stream == agent.EventStream(r.gen) {
		if f.Kind == agent.KindClose {
			r.events.Close()
		} else {
			r.events.Write(f.Data)
		}
		return
	}
	if cs == nil {
		return
	}
	var b *buffer
	switch which {
	case 1:
		b = cs.stdout
	case 2:
		b = cs.stderr
	default:
		return
	}
	if f.Kind != agent.KindClose {
		b.write(f.Data)
		return
	}
	b.Close()
	s.mu.Lock()
	if cs.closed++; cs.closed == 2 && cs.exited {
		delete(s.cmds, cs.id)
	}
	s.mu.Unlock()
}

func (s *Sandbox) ctl(c agent.Ctl) error {
	if err := s.session().out.Ctl(c); err != nil {
		return fmt.Errorf("%w: the agent is gone: %v", sandbox.ErrClosed, err)
	}
	return nil
}

func (s *Sandbox) setupFailure() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.setupErr != "" {
		return errors.New(s.setupErr)
	}
	return errors.New("the container ended during setup")
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// Close implements sandbox.Sandbox: every process of the container is
// killed, the container removed, the workspace unmounted, the cgroup
// destroyed, a paused sandbox's checkpoint removed; then the sandbox's
// host user goes back to the pool, unless something of the container may
// be left.
func (s *Sandbox) Close() error {
	// A pause or resume under way ends first: what it made is removed
	// below.
	s.pauseMu.Lock()
	s.closing.Store(true)
	s.pauseMu.Unlock()
	s.closeOnce.Do(func() {
		var errs []error
		gone := true
		if ss := s.session(); ss != nil {
			if err := ss.end(); err != nil {
				errs = append(errs, err)
				gone = false
			}
		}
		if cg := s.group(); cg != nil {
			if err := cg.Destroy(); err != nil {
				errs = append(errs, err)
				gone = false
			}
		}
		if ss := s.session(); ss != nil && gone {
			if c, ok := ss.c.(CgroupCleaner); ok {
				c.RemoveCgroups()
			}
		}
		if s.users != nil {
			if gone && !s.leftBehind.Load() {
				s.b.cfg.Users.Release(*s.users)
			} else {
				// A process of the user may be left: the range stays
				// held (until the backend closes) rather than be given
				// to another sandbox.
				s.b.cfg.Logger.Warn("a sandbox's host uid range is kept: its container may not be gone",
					"id", s.id, "uid", s.uid)
			}
		}
		if ws := s.Workspace(); ws != nil {
			if d, ok := ws.(*workspace.Dir); ok {
				d.Close()
			}
		}
		if s.mounted {
			if err := unmountDisk(s.dir + "/disk"); err != nil {
				errs = append(errs, fmt.Errorf("unmount the disk: %w", err))
			}
		}
		if s.dir != "" {
			if err := os.RemoveAll(s.dir); err != nil {
				errs = append(errs, err)
			}
		}
		if err := s.removeCheckpoints(); err != nil {
			errs = append(errs, err)
		}
		if s.spec.Egress != nil {
			s.spec.Egress.Close() // the sandbox's own once made
		}
		s.closeErr = errors.Join(errs...)
	})
	return s.closeErr
}

// end kills the container and frees what the runtime holds for it, once.
func (ss *session) end() error {
	ss.endOnce.Do(func() {
		var errs []error
		ss.c.Kill()
		select {
		case <-ss.c.Done():
		case <-time.After(30 * time.Second):
			errs = append(errs, errors.New("the container did not end within 30s of a kill"))
		}
		ss.c.Stdin().Close()
		errs = append(errs, ss.c.Remove())
		ss.endErr = errors.Join(errs...)
	})
	return ss.endErr
}

// driver is a Sandbox as the core drives it (core.Driver).
type driver Sandbox

var _ core.Driver = (*driver)(nil)

func (d *driver) s() *Sandbox { return (*Sandbox)(d) }

// Prepare gives a persistent sandbox whose container died while idle (a
// command over the memory limit) a new one.
func (d *driver) Prepare(ctx context.Context) error {
	s := d.s()
	if s.closing.Load() {
		return sandbox.ErrClosed
	}
	if s.Core.Paused() {
		return sandbox.ErrPaused
	}
	if !isClosed(s.session().ended) {
		return nil
	}
	if s.spec.OneShot {
		return sandbox.ErrClosed
	}
	return s.relaunch(ctx, true)
}

func (d *driver) Closed() bool { return d.closing.Load() }

func (d *driver) Dead() <-chan struct{} { return d.s().session().ended }

// Restart has the agent kill every process of the container but itself and
// start a runner; a paused sandbox has no agent to ask.
func (d *driver) Restart(context.Context) error {
	if d.Core.Paused() {
		return sandbox.ErrPaused
	}
	return d.s().ctl(agent.Ctl{Op: agent.OpRestart})
}

// Interrupt has the agent send the runner SIGINT, and waits until it has
// (the agent answers a ping once it has acted on every frame before it):
// the core holds the execution meanwhile (Core.Interrupt), so the signal
// is the runner's before the next execution's request is written, and a
// runner drops a signal that came before a request (runner.py's
// _Interrupts): an interrupt never reaches the next cell. The wait is
// at most core.InterruptWait; the signal is sent either way.
func (d *driver) Interrupt(*core.Runner) error {
	s := d.s()
	if err := s.ctl(agent.Ctl{Op: agent.OpInterrupt}); err != nil {
		return err
	}
	s.ping(context.Background(), s.session(), core.InterruptWait)
	return nil
}

func (d *driver) Usage() core.Usage {
	var st cgroups.Stats
	if cg := d.s().group(); cg != nil {
		st, _ = cg.Stats()
	} else {
		st, _ = d.s().session().c.Stats()
	}
	return core.Usage{CPU: st.CPU, MemoryPeak: st.MemoryPeak, OOMKills: st.OOMKills}
}

func (d *driver) CPUWatch() bool { return true }

func (d *driver) Kill() { d.s().session().c.Kill() }

// SyncOutput: the agent sends what the code printed before each event, on
// the same stream.
func (d *driver) SyncOutput() {}

// Finish: the agent reports the runner's exit once its output is
// forwarded, but its last events (the error, the result) may still be on
// their way: they are handled first. A process the code forked may hold
// the event stream open, hence the bound.
func (d *driver) Finish(r *core.Runner, why sandbox.Status) core.Exit {
	ss := r.Conn().(*agentRunner).ss
	if why != "" {
		ss.c.Kill()
	}
	select {
	case <-r.Exited():
	case <-ss.ended:
	}
	select {
	case <-r.EventsDone():
	case <-ss.ended:
	case <-time.After(time.Second):
	}
	return d.ExitOf(r)
}

// Executed: a container that died with the execution is replaced, with the
// same files, for the next one.
func (d *driver) Executed(ctx context.Context, res *sandbox.Result) {
	s := d.s()
	if s.spec.OneShot || !isClosed(s.session().ended) || s.closing.Load() {
		return
	}
	res.StateLost = true
	if err := s.relaunch(context.WithoutCancel(ctx), false); err != nil {
		s.b.cfg.Logger.Warn("a new container for the sandbox", "id", s.id, "err", err)
	}
}
