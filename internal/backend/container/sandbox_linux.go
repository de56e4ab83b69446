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
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vivarium-sandbox/vivarium/internal/agent"
	"github.com/vivarium-sandbox/vivarium/internal/cgroups"
	"github.com/vivarium-sandbox/vivarium/internal/hostuid"
	"github.com/vivarium-sandbox/vivarium/internal/runner"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/workspace"
)

// Where things are inside a container, and who the code runs as.
const (
	RunnerDir  = "/opt/vivarium"
	AgentPath  = "/opt/vivarium/agent"
	SandboxUID = 1000
	SandboxGID = 1000
)

// Bounds on what the runner may send back per execution, as in the native
// backend.
const (
	maxFrame        = 16 << 20
	maxResultsBytes = 64 << 20
	maxResults      = 10000
	resultOverhead  = 256
)

// Sandbox is one container sandbox.
type Sandbox struct {
	id      string
	b       *Backend
	spec    sandbox.Spec
	dir     string // the sandbox's state directory on the host
	mounted bool   // the disk tmpfs is mounted
	ws      *workspace.Dir
	cg      cgroups.Group
	disk    Disk
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

	stdout, stderr *capture

	mu        sync.Mutex
	runner    *runnerProc
	runnerSet chan struct{} // closed and replaced when the runner changes
	cur       *execution
	contexts  *runner.Contexts
	spawns    map[uint32]chan agent.Ctl
	procs     map[uint32]*process
	nextID    uint32
	lost      bool   // the runner died since the last execution
	setupErr  string // the agent's OpError

	execMu sync.Mutex
	used   bool

	closeOnce sync.Once
	closeErr  error
}

var _ sandbox.Sandbox = (*Sandbox)(nil)

// session is one container of a sandbox and the agent's stream.
type session struct {
	c     Container
	out   *agent.Writer
	ended chan struct{} // the agent's stream ended: the container is gone
	ready chan struct{} // the agent is set up

	endOnce sync.Once
	endErr  error
}

func (s *Sandbox) session() *session { return s.sess.Load() }

type runnerProc struct {
	ss     *session
	gen    uint32
	events *io.PipeWriter
	ready  chan struct{}
	exited chan struct{}
	exit   agent.Ctl
	broken error
	// eventsDone is closed when its event stream has ended and every
	// event on it was handled.
	eventsDone chan struct{}
}

type execution struct {
	runner       *runnerProc
	results      []sandbox.Output
	resultsBytes int
	dropped      int
	err          *sandbox.Error
	exitCode     *int
	done         chan struct{}
	resultSink   sandbox.ResultSink
}

// ID implements sandbox.Sandbox.
func (s *Sandbox) ID() string { return s.id }

// Workspace implements sandbox.Sandbox.
func (s *Sandbox) Workspace() sandbox.Workspace { return s.ws }

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
	defer s.teardownStreams()
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
			s.data(f)
		}
	}
}

// teardownStreams ends everything that waits on the agent.
func (s *Sandbox) teardownStreams() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if r := s.runner; r != nil {
		r.events.Close()
		if !isClosed(r.exited) {
			r.exit = agent.Ctl{Code: 128 + int(syscall.SIGKILL), Signal: int(syscall.SIGKILL)}
			close(r.exited)
		}
	}
	for id, ch := range s.spawns {
		close(ch)
		delete(s.spawns, id)
	}
	for id, p := range s.procs {
		p.finish(128 + int(syscall.SIGKILL))
		// No more output can come: readers must not wait for it.
		p.stdout.Close()
		p.stderr.Close()
		delete(s.procs, id)
	}
}

func (s *Sandbox) control(ss *session, c agent.Ctl) {
	switch c.Op {
	case agent.OpReady:
		if !isClosed(ss.ready) {
			close(ss.ready)
		}
	case agent.OpError:
		s.mu.Lock()
		s.setupErr = c.Step + ": " + c.Error
		s.mu.Unlock()
	case agent.OpRunner:
		pr, pw := io.Pipe()
		r := &runnerProc{ss: ss, gen: c.Gen, events: pw, ready: make(chan struct{}), exited: make(chan struct{}),
			eventsDone: make(chan struct{})}
		go s.readEvents(r, pr)
		s.mu.Lock()
		if old := s.runner; old != nil {
			old.events.Close()
		}
		s.runner = r
		close(s.runnerSet)
		s.runnerSet = make(chan struct{})
		s.mu.Unlock()
	case agent.OpSpawned:
		s.mu.Lock()
		ch := s.spawns[c.ID]
		delete(s.spawns, c.ID)
		s.mu.Unlock()
		if ch != nil {
			ch <- c
		}
	case agent.OpExited:
		s.mu.Lock()
		defer s.mu.Unlock()
		if c.ID == 0 {
			if r := s.runner; r != nil && r.gen == c.Gen && !isClosed(r.exited) {
				r.exit = c
				close(r.exited)
				s.lost = true
			}
			return
		}
		if p := s.procs[c.ID]; p != nil {
			p.finish(c.Code)
			// The ends of its output streams may come after the exit
			// (a process it started may still write): it is forgotten
			// once both have come.
			if p.streamsClosed == 2 {
				delete(s.procs, c.ID)
			}
		}
	}
}

func (s *Sandbox) data(f agent.Frame) {
	switch f.Stream {
	case agent.StreamStdout:
		s.stdout.deliver(f.Data)
		return
	case agent.StreamStderr:
		s.stderr.deliver(f.Data)
		return
	}
	s.mu.Lock()
	r := s.runner
	var p *process
	var which int
	if f.Stream >= 1<<24 {
		id := (f.Stream - (1 << 24)) / 3
		p = s.procs[id]
		which = int((f.Stream - (1 << 24)) % 3)
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
	if p != nil {
		var b *buffer
		switch which {
		case 1:
			b = p.stdout
		case 2:
			b = p.stderr
		default:
			return
		}
		if f.Kind == agent.KindClose {
			b.Close()
			s.mu.Lock()
			if p.streamsClosed++; p.streamsClosed == 2 && isClosed(p.done) {
				delete(s.procs, p.id)
			}
			s.mu.Unlock()
		} else {
			b.write(f.Data)
		}
	}
}

// readEvents follows one runner's events, as the native backend does. A
// malformed frame means the runner (or code writing to its pipe) broke the
// protocol: parsing stops, the runner's requests are hung up (no result
// can be acknowledged: it ends after the current execution), reading goes
// on so that nothing blocks.
func (s *Sandbox) readEvents(r *runnerProc, events *io.PipeReader) {
	defer close(r.eventsDone)
	defer events.Close()
	fr := runner.NewFrameReader(events, maxFrame)
	readyOnce := sync.OnceFunc(func() { close(r.ready) })
	// Past the results cap, results are counted without being decoded.
	resultPrefix := []byte(`{"type": "result"`)
	skipping := false
	skip := func(body []byte) bool { return skipping && bytes.HasPrefix(body, resultPrefix) }
	for {
		ev, err := fr.NextSkipping(skip)
		if err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrClosedPipe) {
				s.mu.Lock()
				r.broken = err
				s.mu.Unlock()
				r.ss.out.Write(agent.KindClose, agent.RequestStream(r.gen), nil)
				io.Copy(io.Discard, events)
			}
			return
		}
		if ev.Type == "ready" {
			readyOnce()
			continue
		}
		s.mu.Lock()
		var emit *sandbox.Output
		var rs sandbox.ResultSink
		if x := s.cur; x != nil && x.runner == r {
			emit = x.handle(ev)
			rs = x.resultSink
			skipping = len(x.results)+x.dropped >= maxResults
		} else {
			skipping = false
		}
		s.mu.Unlock()
		if emit != nil && rs != nil {
			rs.Result(*emit)
		}
		if ev.Type == "result" || ev.Type == "skipped" {
			// Every result is acknowledged, whoever it was for: the
			// runner (or a thread of the code) waits for it.
			r.ss.out.Write(agent.KindData, agent.RequestStream(r.gen), ackFrame)
		}
	}
}

// ackFrame is the runner.Request{Type: "ack"} frame.
var ackFrame = func() []byte {
	var b bytes.Buffer
	runner.WriteFrame(&b, runner.Request{Type: "ack"})
	return b.Bytes()
}()

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

// request writes one frame to a runner.
func (s *Sandbox) request(r *runnerProc, v any) error {
	var b bytes.Buffer
	if err := runner.WriteFrame(&b, v); err != nil {
		return err
	}
	if err := r.ss.out.Write(agent.KindData, agent.RequestStream(r.gen), b.Bytes()); err != nil {
		return fmt.Errorf("%w: the agent is gone: %v", sandbox.ErrClosed, err)
	}
	return nil
}

func (s *Sandbox) ctl(c agent.Ctl) error {
	if err := s.session().out.Ctl(c); err != nil {
		return fmt.Errorf("%w: the agent is gone: %v", sandbox.ErrClosed, err)
	}
	return nil
}

// readyRunner returns a channel closed once a runner is ready for code.
func (s *Sandbox) readyRunner(ctx context.Context) <-chan struct{} {
	ch := make(chan struct{})
	ended := s.session().ended
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
				case <-ended:
					return
				}
			}
			select {
			case <-set:
			case <-ctx.Done():
				return
			case <-ended:
				return
			}
		}
	}()
	return ch
}

func (s *Sandbox) setupFailure() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.setupErr != "" {
		return errors.New(s.setupErr)
	}
	return errors.New("the container ended during setup")
}

func isClosed(ch chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

var _ sandbox.ContextKeeper = (*Sandbox)(nil)

// CreateContext implements sandbox.ContextKeeper.
func (s *Sandbox) CreateContext(language, cwd string) (sandbox.CodeContext, error) {
	if s.spec.OneShot {
		return sandbox.CodeContext{}, fmt.Errorf("%w: a one-shot sandbox has no code contexts", sandbox.ErrUnsupported)
	}
	return s.contexts.Create(language, cwd)
}

// Contexts implements sandbox.ContextKeeper.
func (s *Sandbox) Contexts() []sandbox.CodeContext { return s.contexts.List() }

// RestartContext implements sandbox.ContextKeeper.
func (s *Sandbox) RestartContext(id string) error {
	if err := s.contexts.Restart(id); err != nil {
		return err
	}
	s.tellContextsIfIdle()
	return nil
}

// RemoveContext implements sandbox.ContextKeeper.
func (s *Sandbox) RemoveContext(id string) error {
	if err := s.contexts.Remove(id); err != nil {
		return err
	}
	s.tellContextsIfIdle()
	return nil
}

// tellContextsIfIdle frees what a removed or restarted context held at
// once when no execution runs; otherwise the next execution does it first.
func (s *Sandbox) tellContextsIfIdle() {
	if !s.execMu.TryLock() {
		return
	}
	defer s.execMu.Unlock()
	s.mu.Lock()
	r := s.runner
	s.mu.Unlock()
	s.tellContexts(r)
}

// tellContexts sends the runner the contexts' changes; callers hold execMu.
// A runner that is not ready has no state to forget (a new one starts
// empty), so the message is then dropped.
func (s *Sandbox) tellContexts(r *runnerProc) {
	req, ok := s.contexts.Message()
	if !ok || r == nil || !isClosed(r.ready) || isClosed(r.exited) {
		return
	}
	s.request(r, req)
}

// Interrupt implements sandbox.Sandbox.
func (s *Sandbox) Interrupt() error {
	if s.closing.Load() {
		return sandbox.ErrClosed
	}
	s.mu.Lock()
	running := s.cur != nil
	s.mu.Unlock()
	if !running {
		return nil
	}
	return s.ctl(agent.Ctl{Op: agent.OpInterrupt})
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
	s.lost = false
	s.mu.Unlock()
	return nil
}

// restart kills every process of the container but the agent and waits for
// a new runner.
func (s *Sandbox) restart(ctx context.Context) error {
	ended := s.session().ended
	s.mu.Lock()
	old, set := s.runner, s.runnerSet
	s.mu.Unlock()
	if err := s.ctl(agent.Ctl{Op: agent.OpRestart}); err != nil {
		return err
	}
	for {
		select {
		case <-set:
		case <-ended:
			return fmt.Errorf("%w: the sandbox died while restarting", sandbox.ErrClosed)
		case <-ctx.Done():
			return ctx.Err()
		}
		s.mu.Lock()
		r := s.runner
		set = s.runnerSet
		s.mu.Unlock()
		if r != old {
			break
		}
	}
	timer := time.NewTimer(setupTimeout)
	defer timer.Stop()
	select {
	case <-s.readyRunner(ctx):
		return nil
	case <-ended:
		return fmt.Errorf("%w: the sandbox died while restarting", sandbox.ErrClosed)
	case <-timer.C:
		return fmt.Errorf("the new runner was not ready within %v", setupTimeout)
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (s *Sandbox) stats() cgroups.Stats {
	if s.cg != nil {
		st, _ := s.cg.Stats()
		return st
	}
	st, _ := s.session().c.Stats()
	return st
}

// Execute implements sandbox.Sandbox; its logic is the native backend's.
func (s *Sandbox) Execute(ctx context.Context, req sandbox.ExecRequest, sink sandbox.Sink) (*sandbox.Result, error) {
	if !s.execMu.TryLock() {
		return nil, sandbox.ErrBusy
	}
	defer s.execMu.Unlock()
	if s.closing.Load() {
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
	if isClosed(s.session().ended) {
		// The container died while idle (a command over the memory
		// limit): a persistent sandbox gets a new one.
		if s.spec.OneShot {
			return nil, sandbox.ErrClosed
		}
		if err := s.relaunch(ctx); err != nil {
			return nil, err
		}
	}
	ss := s.session()
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
	s.tellContexts(r)

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
	start := time.Now()
	if err := s.request(r, runner.Request{Type: "execute", Code: req.Code, Filename: filename, Env: req.Env,
		Context: runner.ContextKey(cc.ID), Language: cc.Language, Cwd: cc.Cwd}); err != nil {
		s.mu.Lock()
		s.cur = nil
		s.mu.Unlock()
		s.stdout.end()
		s.stderr.end()
		return nil, err
	}
	// A one-shot execution ends when the runner exits (its status is the
	// program's); a persistent one at the runner's "done".
	finished := doneCh
	if s.spec.OneShot {
		finished = r.exited
	}
	var why sandbox.Status
	var whyMsg string
	wall := time.NewTimer(limits.Timeout)
	defer wall.Stop()
	var tick <-chan time.Time
	if limits.CPUTime > 0 {
		t := time.NewTicker(min(max(limits.CPUTime/20, 10*time.Millisecond), 250*time.Millisecond))
		defer t.Stop()
		tick = t.C
	}
wait:
	for {
		select {
		case <-finished:
			break wait
		case <-r.exited:
			break wait
		case <-ss.ended:
			break wait
		case <-wall.C:
			why, whyMsg = sandbox.StatusTimeout, fmt.Sprintf("execution exceeded the %v wall-clock limit", limits.Timeout)
			break wait
		case <-tick:
			if s.stats().CPU-st0.CPU > limits.CPUTime {
				why, whyMsg = sandbox.StatusTimeout, fmt.Sprintf("execution exceeded the %v CPU time limit", limits.CPUTime)
				break wait
			}
		case <-ctx.Done():
			why, whyMsg = sandbox.StatusKilled, "execution cancelled: "+ctx.Err().Error()
			break wait
		}
	}
	duration := time.Since(start)
	o := sandbox.Outcome{Why: why, WhyMsg: whyMsg, Limits: limits}
	stateLost := lost
	switch {
	case s.spec.OneShot || isClosed(ss.ended):
		if why != "" {
			ss.c.Kill()
		}
		select {
		case <-r.exited:
		case <-ss.ended:
		}
		// The agent reports the runner's exit once its output is
		// forwarded, but its last events (the error, the result) may
		// still be on their way: they are handled before the outcome
		// is read. A process the code forked may hold the stream open,
		// hence the bound.
		select {
		case <-r.eventsDone:
		case <-ss.ended:
		case <-time.After(time.Second):
		}
		s.mu.Lock()
		if isClosed(r.exited) && r.exit.Op == agent.OpExited {
			o.Exited, o.Code, o.Signal = true, r.exit.Code, r.exit.Signal
		}
		s.mu.Unlock()
		o.Dead = true
	default:
		if why != "" || isClosed(r.exited) {
			if why == "" {
				s.mu.Lock()
				o.Exited, o.Code, o.Signal, o.Dead = true, r.exit.Code, r.exit.Signal, true
				s.mu.Unlock()
			}
			stateLost = true
			if err := s.restart(context.WithoutCancel(ctx)); err != nil {
				ss.c.Kill()
			}
		}
	}
	s.mu.Lock()
	s.cur = nil
	o.Broken = r.broken
	o.RunnerCode = x.exitCode
	s.lost = false
	s.mu.Unlock()
	stdout, outTrunc := s.stdout.end()
	stderr, errTrunc := s.stderr.end()
	st := s.stats()
	res := &sandbox.Result{
		Stdout: string(stdout), Stderr: string(stderr), StdoutTruncated: outTrunc, StderrTruncated: errTrunc,
		Results: x.results, Error: x.err,
		DurationMS:      float64(duration.Microseconds()) / 1000,
		CPUMS:           float64((st.CPU - st0.CPU).Microseconds()) / 1000,
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
	o.OOM = st.OOMKills > st0.OOMKills
	o.Classify(res)
	if !s.spec.OneShot && isClosed(ss.ended) && !s.closing.Load() {
		// The container died with the execution: the next one starts in
		// a new container, with the same files.
		res.StateLost = true
		if err := s.relaunch(context.WithoutCancel(ctx)); err != nil {
			s.b.cfg.Logger.Warn("a new container for the sandbox", "id", s.id, "err", err)
		}
	}
	return res, nil
}

// Close implements sandbox.Sandbox: every process of the container is
// killed, the container removed, the workspace unmounted, the cgroup
// destroyed; then the sandbox's host user goes back to the pool, unless
// something of the container may be left.
func (s *Sandbox) Close() error {
	s.closing.Store(true)
	s.closeOnce.Do(func() {
		var errs []error
		gone := true
		if ss := s.session(); ss != nil {
			if err := ss.end(); err != nil {
				errs = append(errs, err)
				gone = false
			}
		}
		if s.cg != nil {
			if err := s.cg.Destroy(); err != nil {
				errs = append(errs, err)
				gone = false
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
		if s.ws != nil {
			s.ws.Close()
		}
		if s.mounted {
			if err := unix.Unmount(s.dir+"/disk", unix.MNT_DETACH); err != nil {
				errs = append(errs, fmt.Errorf("unmount the disk: %w", err))
			}
		}
		if s.dir != "" {
			if err := os.RemoveAll(s.dir); err != nil {
				errs = append(errs, err)
			}
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

// capture keeps the first limit bytes of an output stream for the current
// execution and passes them to its sink; the rest is counted and dropped.
type capture struct {
	mu      sync.Mutex
	buf     []byte
	limit   int64
	dropped int64
	sink    func([]byte)
}

func newCapture() *capture { return &capture{} }

func (c *capture) deliver(p []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	room := c.limit - int64(len(c.buf))
	keep := min(int64(len(p)), max(room, 0))
	c.dropped += int64(len(p)) - keep
	if keep > 0 {
		c.buf = append(c.buf, p[:keep]...)
		if c.sink != nil {
			c.sink(p[:keep])
		}
	}
}

func (c *capture) begin(limit int64, sink func([]byte)) {
	c.mu.Lock()
	c.buf, c.dropped, c.limit, c.sink = nil, 0, limit, sink
	c.mu.Unlock()
}

func (c *capture) end() ([]byte, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	data, trunc := c.buf, c.dropped > 0
	c.buf, c.dropped, c.limit, c.sink = nil, 0, 0, nil
	return data, trunc
}
