package wasm

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	experimentalsys "github.com/tetratelabs/wazero/experimental/sys"

	"github.com/vivarium-sandbox/vivarium/internal/runner"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

// Bounds on what the runner may send back per execution, as the native
// backend's.
const (
	maxFrame        = 16 << 20 // one event
	maxResultsBytes = 64 << 20 // all rich results of one execution
	maxResults      = 10000    // rich results of one execution
	resultOverhead  = 256      // what a result costs beyond its content
	setupTimeout    = 120 * time.Second
)

// exitCrash is the exit status of an interpreter that trapped (Python's
// abort() is a wasm "unreachable"): 128+SIGABRT, as a crashed process.
const exitCrash = 128 + 6

// Sandbox is one wasm sandbox: a workspace, and an interpreter instance
// that keeps Python's state between executions (replaced when it dies or
// a limit stops it).
type Sandbox struct {
	id             string
	b              *Backend
	spec           sandbox.Spec
	ws             *memFS
	stdout, stderr *stream
	diskFull       atomic.Bool // a guest write hit the disk limit
	filesFull      atomic.Bool // the guest hit the open-files limit

	mu     sync.Mutex
	inst   *instance
	cur    *execution
	closed bool

	execMu sync.Mutex // one execution (or restart) at a time
	used   bool       // a one-shot sandbox has run its execution
}

var (
	_ sandbox.Sandbox = (*Sandbox)(nil)
	_ sandbox.Prober  = (*Sandbox)(nil)
)

// execution collects the events of one Execute call.
type execution struct {
	results      []sandbox.Output
	resultsBytes int
	dropped      int
	err          *sandbox.Error
	exitCode     *int
	finished     chan struct{} // closed when the runner waits again after "done"
	resultSink   sandbox.ResultSink
}

func newSandbox(b *Backend, spec sandbox.Spec) *Sandbox {
	s := &Sandbox{id: newID(), b: b, spec: spec, stdout: &stream{}, stderr: &stream{}}
	s.ws = newMemFS(spec.Limits.Disk)
	s.ws.onFull = func() {
		if !s.diskFull.Swap(true) {
			s.stderr.note(fmt.Sprintf("vivarium: the workspace is full: the sandbox's disk limit is %s "+
				"(WASI reports this as an I/O error)\n", sizeText(spec.Limits.Disk)))
		}
	}
	return s
}

// tooManyFiles says once per execution why opening a file failed.
func (s *Sandbox) tooManyFiles() {
	if !s.filesFull.Swap(true) {
		s.stderr.note(fmt.Sprintf("vivarium: too many open files: the sandbox's limit is %d "+
			"(WASI reports this as an I/O error)\n", s.spec.Limits.OpenFiles))
	}
}

// startInstance starts an interpreter and waits until its runner is ready.
func (s *Sandbox) startInstance(ctx context.Context) error {
	// The channel's handlers are set before the guest runs: its first
	// frame, "ready", comes soon after.
	ch := newChannel()
	inst := newInstance(ch)
	ch.onEvent = func(ev runner.Event) { s.handle(inst, ev) }
	ch.skip = func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		x := s.cur
		return x != nil && len(x.results)+x.dropped >= maxResults
	}
	ch.onIdle = func() { s.idle(inst) }
	if err := s.launch(ctx, inst); err != nil {
		return err
	}
	var err error
	timer := time.NewTimer(setupTimeout)
	defer timer.Stop()
	select {
	case <-inst.ready:
		s.mu.Lock()
		s.inst = inst
		s.mu.Unlock()
		return nil
	case <-inst.done:
		return s.startFailure(inst)
	case <-timer.C:
		err = fmt.Errorf("the interpreter was not ready within %v", setupTimeout)
	case <-ctx.Done():
		err = ctx.Err()
	}
	inst.stop()
	<-inst.done
	return err
}

// startFailure explains why an interpreter ended before it was ready.
func (s *Sandbox) startFailure(inst *instance) error {
	why := "it trapped: " + fmt.Sprint(inst.trap)
	if inst.exitCode != nil {
		why = fmt.Sprintf("it exited with status %d", *inst.exitCode)
	}
	msg := "the interpreter ended during start-up: " + why
	if out := strings.TrimSpace(s.stderr.setupOutput()); out != "" {
		msg += "; it wrote: " + lastLines(out, 5)
	}
	return errors.New(msg)
}

// handle records an event of instance inst; it runs on the guest's
// goroutine, in the order the runner wrote them.
func (s *Sandbox) handle(inst *instance, ev runner.Event) {
	if ev.Type == "ready" {
		select {
		case <-inst.ready:
		default:
			close(inst.ready)
		}
		return
	}
	if ev.Type == "error" || ev.Type == "done" {
		inst.sampleMemory() // the guest waits in this call: its memory holds still
	}
	s.mu.Lock()
	x := s.cur
	if x == nil || s.inst != inst {
		s.mu.Unlock()
		return
	}
	var emit *sandbox.Output
	switch ev.Type {
	case "skipped":
		x.dropped++
	case "result":
		out, size := runner.Output(ev)
		size += resultOverhead
		if x.resultsBytes+size > maxResultsBytes || len(x.results) >= maxResults {
			x.dropped++
		} else {
			x.resultsBytes += size
			x.results = append(x.results, out)
			emit = &out
		}
	case "error":
		x.err = &sandbox.Error{Name: ev.Name, Value: ev.Value, Traceback: ev.Traceback}
	case "done":
		x.exitCode = ev.ExitCode
	}
	rs := x.resultSink
	s.mu.Unlock()
	if emit != nil && rs != nil {
		rs.Result(*emit)
	}
}

// idle is called when the runner of inst waits for a request: after a
// "done", the execution is over. (A "done" forged by the code does not end
// it early: the runner only waits once the cell has returned.)
func (s *Sandbox) idle(inst *instance) {
	inst.sampleMemory()
	s.mu.Lock()
	defer s.mu.Unlock()
	if x := s.cur; x != nil && s.inst == inst && x.exitCode != nil {
		select {
		case <-x.finished:
		default:
			close(x.finished)
		}
	}
}

// ID implements sandbox.Sandbox.
func (s *Sandbox) ID() string { return s.id }

// Workspace implements sandbox.Sandbox.
func (s *Sandbox) Workspace() sandbox.Workspace { return &workspace{fs: s.ws} }

// Alive implements sandbox.Prober.
func (s *Sandbox) Alive() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return !s.closed && s.inst != nil && s.inst.alive()
}

// Interrupt implements sandbox.Sandbox. WebAssembly has no signals: code
// that runs cannot be interrupted, only stopped by its time limit.
func (s *Sandbox) Interrupt() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return sandbox.ErrClosed
	}
	if s.cur == nil {
		return nil
	}
	return errNoInterrupt
}

// Start implements sandbox.Sandbox: there are no processes to start.
func (s *Sandbox) Start(context.Context, sandbox.Command) (sandbox.Process, error) {
	return nil, errNoCommands
}

// Restart implements sandbox.Sandbox: a fresh interpreter, the same files.
func (s *Sandbox) Restart(ctx context.Context) error {
	if s.spec.OneShot {
		return fmt.Errorf("%w: a one-shot sandbox cannot restart", sandbox.ErrUnsupported)
	}
	if !s.execMu.TryLock() {
		return sandbox.ErrBusy
	}
	defer s.execMu.Unlock()
	return s.restart(ctx)
}

// restart stops the current interpreter, if any, and starts another.
// Callers hold execMu.
func (s *Sandbox) restart(ctx context.Context) error {
	s.mu.Lock()
	old, closed := s.inst, s.closed
	s.inst = nil
	s.mu.Unlock()
	if closed {
		return sandbox.ErrClosed
	}
	if old != nil {
		old.stop()
		<-old.done
	}
	if err := s.startInstance(ctx); err != nil {
		return fmt.Errorf("%w: restart: %w", sandbox.ErrClosed, err)
	}
	return nil
}

// Close implements sandbox.Sandbox.
func (s *Sandbox) Close() error {
	s.mu.Lock()
	inst := s.inst
	s.closed = true
	s.mu.Unlock()
	if inst != nil {
		inst.stop()
		<-inst.done
	}
	return nil
}

// Execute implements sandbox.Sandbox.
func (s *Sandbox) Execute(ctx context.Context, req sandbox.ExecRequest, sink sandbox.Sink) (*sandbox.Result, error) {
	if !s.execMu.TryLock() {
		return nil, sandbox.ErrBusy
	}
	defer s.execMu.Unlock()
	s.mu.Lock()
	closed, inst := s.closed, s.inst
	s.mu.Unlock()
	if closed {
		return nil, sandbox.ErrClosed
	}
	if s.spec.OneShot && s.used {
		return nil, fmt.Errorf("%w: a one-shot sandbox runs one execution", sandbox.ErrClosed)
	}
	s.used = true
	if err := sandbox.ValidateEnv(req.Env); err != nil {
		return nil, err
	}
	if req.Context != "" && req.Context != sandbox.DefaultContext {
		return nil, fmt.Errorf("%w: %q: a wasm sandbox has one Python context and no bash", sandbox.ErrNoContext, req.Context)
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
	// An interpreter that died since the last execution, and could not be
	// replaced then, is replaced first; the result says so.
	lost := false
	if inst == nil || !inst.alive() {
		if s.spec.OneShot {
			return nil, fmt.Errorf("%w: the interpreter has ended", sandbox.ErrClosed)
		}
		if err := s.restart(ctx); err != nil {
			return nil, err
		}
		s.mu.Lock()
		inst = s.inst
		s.mu.Unlock()
		lost = true
	}

	x := &execution{finished: make(chan struct{})}
	x.resultSink, _ = sink.(sandbox.ResultSink)
	var outSink, errSink func([]byte)
	if sink != nil {
		outSink, errSink = sink.Stdout, sink.Stderr
	}
	s.stdout.begin(limits.MaxOutput, outSink)
	s.stderr.begin(limits.MaxOutput, errSink)
	s.diskFull.Store(false)
	s.filesFull.Store(false)
	s.mu.Lock()
	s.cur = x
	s.mu.Unlock()

	slept0 := inst.sleptNow()
	start := time.Now()
	cpu := func() time.Duration { return time.Since(start) - (inst.sleptNow() - slept0) }
	if err := inst.ch.send(runner.Request{Type: "execute", Code: req.Code, Filename: filename, Env: req.Env}); err != nil {
		// It died between the check and now; what it left is reported below.
		_ = err
	}

	var why sandbox.Status // set when a limit or the caller ended it
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
		case <-x.finished:
			break wait
		case <-inst.done:
			break wait
		case <-wall.C:
			why, whyMsg = sandbox.StatusTimeout, fmt.Sprintf("execution exceeded the %v wall-clock limit", limits.Timeout)
			break wait
		case <-tick:
			if cpu() > limits.CPUTime {
				why, whyMsg = sandbox.StatusTimeout, fmt.Sprintf("execution exceeded the %v CPU time limit", limits.CPUTime)
				break wait
			}
		case <-ctx.Done():
			why, whyMsg = sandbox.StatusKilled, "execution cancelled: "+ctx.Err().Error()
			break wait
		}
	}
	duration := time.Since(start)
	cpuTime := cpu()
	if why != "" {
		inst.stop()
	}
	dead := why != "" || !inst.alive()
	if s.spec.OneShot || dead {
		// The one-shot runner exits after its execution: its exit status
		// is the program's.
		<-inst.done
	}
	dead = !inst.alive()

	s.mu.Lock()
	s.cur = nil
	s.mu.Unlock()
	stdout, outTrunc := s.stdout.end()
	stderr, errTrunc := s.stderr.end()
	res := &sandbox.Result{
		Stdout:          string(stdout),
		Stderr:          string(stderr),
		StdoutTruncated: outTrunc,
		StderrTruncated: errTrunc,
		Results:         x.results,
		Error:           x.err,
		DurationMS:      float64(duration.Microseconds()) / 1000,
		CPUMS:           float64(min(cpuTime, duration).Microseconds()) / 1000,
		PeakMemoryBytes: inst.memBytes.Load(),
		StateLost:       lost && !s.spec.OneShot,
	}
	if res.Results == nil {
		res.Results = []sandbox.Output{}
	}
	if x.dropped > 0 {
		res.Results = append(res.Results, sandbox.Output{
			Text: fmt.Sprintf("[vivarium: %d more results dropped: over the limit of %d results or %d MiB]",
				x.dropped, maxResults, maxResultsBytes>>20)})
	}
	s.classify(res, why, whyMsg, dead, inst, x.exitCode, limits, inst.ch.brokenErr())

	if dead && !s.spec.OneShot {
		// A limit stopped it or it died: a fresh interpreter replaces it
		// now, so that the sandbox is ready again; files stay.
		res.StateLost = true
		if err := s.restart(context.WithoutCancel(ctx)); err != nil {
			s.b.log.Warn("wasm: could not restart the interpreter", "sandbox", s.id, "err", err)
		}
	}
	return res, nil
}

// classify sets Status, ExitCode and Error. What the host observed (its
// own stop, how the instance ended) decides; the runner's report counts
// only where the interpreter itself finished normally.
func (s *Sandbox) classify(res *sandbox.Result, why sandbox.Status, whyMsg string, dead bool,
	inst *instance, runnerCode *int, limits sandbox.Limits, broken error) {
	limitErr := func(status sandbox.Status, code int, name, msg string) {
		res.Status, res.ExitCode = status, code
		res.Error = &sandbox.Error{Name: name, Value: msg}
	}
	memoryMsg := fmt.Sprintf("the sandbox exceeded its %d MiB memory limit", limits.Memory>>20)
	switch {
	case why == sandbox.StatusTimeout:
		limitErr(why, sandbox.ExitTimeout, "TimeoutError", whyMsg)
	case why != "":
		limitErr(why, 128+9, "Killed", whyMsg)
	case dead && inst.killed.Load():
		limitErr(sandbox.StatusKilled, 128+9, "Killed", "the sandbox was closed during the execution")
	case dead && inst.exitCode == nil:
		// A trap: the interpreter crashed (or ran out of stack).
		if inst.memBytes.Load() >= limits.Memory-(1<<20) {
			limitErr(sandbox.StatusMemoryLimit, sandbox.ExitMemoryLimit, "MemoryError", memoryMsg)
			return
		}
		// The trap's first line says what happened ("wasm error: out
		// of bounds memory access"); a stack of wasm functions follows.
		why, _, _ := strings.Cut(fmt.Sprint(inst.trap), "\n")
		if _, after, ok := strings.Cut(why, "wasm error: "); ok {
			why = after
		}
		limitErr(sandbox.StatusKilled, exitCrash, "Killed", "the interpreter crashed ("+why+
			"): its C stack overflowed, or it hit a fatal error")
	default:
		code := 0
		switch {
		case dead: // it exited: its own status
			code = int(*inst.exitCode & 0xff)
		case runnerCode != nil:
			code = *runnerCode
		}
		res.ExitCode = code
		switch {
		case res.Error != nil && res.Error.Name == "MemoryError":
			// Python raises MemoryError when the linear memory cannot
			// grow past the limit: the same outcome as the native
			// backend's OOM kill, with the traceback kept.
			res.Status, res.ExitCode = sandbox.StatusMemoryLimit, sandbox.ExitMemoryLimit
			res.Error.Value = memoryMsg
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

// skeleton is the read-only root every sandbox of b shares: the mount
// points, and the runner in /opt/vivarium.
func (b *Backend) skeleton() *memFS {
	b.skelOnce.Do(func() {
		m := newMemFS(64 << 20)
		for _, d := range []string{"usr/local/lib", "usr/local/bin", runnerDir, "dev", "workspace"} {
			if _, err := m.mkdirAll(split(d)); err != nil {
				panic(err) // a fresh memFS: cannot fail
			}
		}
		for name, data := range b.runnerFiles {
			f, errno := m.OpenFile(runnerDir+"/"+name, experimentalsys.O_CREAT|experimentalsys.O_WRONLY, 0o644)
			if errno != 0 {
				panic(errno)
			}
			f.Write(data)
			f.Close()
		}
		m.readOnly = true
		b.skel = m
	})
	return b.skel
}

func (b *Backend) stdlibPath() string { return filepath.Join(b.cfg.Dir, stdlibDir) }

func sizeText(n int64) string {
	if n%(1<<20) == 0 {
		return fmt.Sprintf("%d MiB", n>>20)
	}
	return fmt.Sprintf("%d bytes", n)
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}
