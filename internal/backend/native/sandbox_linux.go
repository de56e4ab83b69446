package native

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vivarium-sandbox/vivarium/internal/cgroups"
	"github.com/vivarium-sandbox/vivarium/internal/runner"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/workspace"
)

// Bounds on what the runner may send back per execution.
const (
	maxFrame        = 16 << 20 // one event
	maxResultsBytes = 64 << 20 // all rich results of one execution
	setupTimeout    = 60 * time.Second
	// How long to wait for output pipes to close once every process of
	// the sandbox is dead. They close at once; this only guards a bug.
	drainTimeout = 5 * time.Second
)

// Sandbox is one running native sandbox.
type Sandbox struct {
	id       string
	b        *Backend
	spec     sandbox.Spec
	cmd      *exec.Cmd
	cg       cgroups.Group // nil without cgroups
	ws       *workspace.Dir
	reqW     *os.File
	stdout   *capture
	stderr   *capture
	events   *os.File
	initErr  error         // how init exited; valid once initDone is closed
	initDone chan struct{} // closed when init has exited and been reaped

	// From init's status pipe.
	statusMu   sync.Mutex
	setupError string      // init's "error" message
	runnerExit *initStatus // init's "exit" message
	statusDone chan struct{}

	// From the runner's event pipe.
	evMu     sync.Mutex
	cur      *execution // receives events; nil between executions
	ready    chan struct{}
	evDone   chan struct{}
	evBroken error // the runner broke the protocol

	execMu sync.Mutex // one execution at a time
	used   bool       // a one-shot sandbox has run its execution

	closeOnce sync.Once
	closeErr  error
}

var _ sandbox.Sandbox = (*Sandbox)(nil)

// execution collects the events of one Execute call.
type execution struct {
	results      []sandbox.Output
	resultsBytes int
	dropped      int
	err          *sandbox.Error
	exitCode     *int
	done         chan struct{} // closed at the runner's "done"
}

// start launches init in new namespaces and waits until the runner inside
// is ready for code.
func start(ctx context.Context, b *Backend, spec sandbox.Spec, cfg *initConfig) (_ *Sandbox, err error) {
	s := &Sandbox{
		id: newID(), b: b, spec: spec,
		initDone: make(chan struct{}), statusDone: make(chan struct{}),
		ready: make(chan struct{}), evDone: make(chan struct{}),
	}
	defer func() {
		if err != nil {
			s.Close()
			err = fmt.Errorf("%w: %w", sandbox.ErrSetup, err)
		}
	}()
	if b.cgroups != nil {
		s.cg, err = b.cgroups.New(s.id, cgroups.Limits{MemoryBytes: spec.Limits.Memory, Pids: int64(spec.Limits.Pids)})
		if err != nil {
			return nil, err
		}
	}

	// Pipes, parent end first. The child ends are closed here once init
	// has them.
	var childEnds []*os.File
	defer func() {
		for _, f := range childEnds {
			f.Close()
		}
	}()
	pipe := func(parentReads bool) (parent *os.File, err error) {
		r, w, err := os.Pipe()
		if err != nil {
			return nil, err
		}
		if parentReads {
			childEnds = append(childEnds, w)
			return r, nil
		}
		childEnds = append(childEnds, r)
		return w, nil
	}
	ctrlW, err := pipe(false)
	if err != nil {
		return nil, err
	}
	defer ctrlW.Close()
	statusR, err := pipe(true)
	if err != nil {
		return nil, err
	}
	stdoutR, err := pipe(true)
	if err != nil {
		return nil, err
	}
	stderrR, err := pipe(true)
	if err != nil {
		return nil, err
	}
	if s.reqW, err = pipe(false); err != nil {
		return nil, err
	}
	if s.events, err = pipe(true); err != nil {
		return nil, err
	}
	// childEnds are now, in order: ctrl, status, stdout, stderr, req, events,
	// matching fdCtrl..fdEvents.
	uidMap := []syscall.SysProcIDMap{{ContainerID: 0, HostID: int(b.cfg.UIDBase), Size: 65536}}
	s.cmd = &exec.Cmd{
		Path:       b.cfg.Exe,
		Args:       []string{initArg0},
		Env:        []string{},
		ExtraFiles: childEnds,
		SysProcAttr: &syscall.SysProcAttr{
			Cloneflags: syscall.CLONE_NEWUSER | syscall.CLONE_NEWNS | syscall.CLONE_NEWPID |
				syscall.CLONE_NEWNET | syscall.CLONE_NEWIPC | syscall.CLONE_NEWUTS,
			UidMappings:                uidMap,
			GidMappings:                uidMap,
			GidMappingsEnableSetgroups: true, // init drops supplementary groups with setgroups
			// Become root of the new user namespace before exec: the host's
			// root is not mapped into it, and an unmapped uid keeps no
			// capabilities across execve.
			Credential: &syscall.Credential{Uid: 0, Gid: 0},
			// If the supervisor dies, so does the sandbox.
			Pdeathsig: syscall.SIGKILL,
		},
	}
	if s.cg != nil && s.cg.IntoFD() >= 0 {
		// cgroup v2: born inside its group (clone3 CLONE_INTO_CGROUP).
		s.cmd.SysProcAttr.UseCgroupFD = true
		s.cmd.SysProcAttr.CgroupFD = s.cg.IntoFD()
	}
	if err := s.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start init (user namespaces: %w)", err)
	}
	go func() {
		s.initErr = s.cmd.Wait()
		close(s.initDone)
	}()
	for _, f := range childEnds {
		f.Close()
	}
	childEnds = nil
	if s.cg != nil && s.cg.IntoFD() < 0 {
		// cgroup v1: moved in before it receives its config, so before it
		// does anything on the sandbox's behalf.
		if err := s.cg.AddProc(s.cmd.Process.Pid); err != nil {
			return nil, err
		}
	}
	if s.stdout, err = newCapture(stdoutR); err != nil {
		return nil, err
	}
	if s.stderr, err = newCapture(stderrR); err != nil {
		return nil, err
	}
	go s.readStatus(statusR)
	go s.readEvents()

	if err := json.NewEncoder(ctrlW).Encode(cfg); err != nil {
		return nil, fmt.Errorf("send config to init: %w", err)
	}
	ctrlW.Close()

	timer := time.NewTimer(setupTimeout)
	defer timer.Stop()
	select {
	case <-s.ready:
	case <-s.initDone:
		<-s.statusDone
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
	wsPath := fmt.Sprintf("/proc/%d/root%s", s.cmd.Process.Pid, workspacePath)
	hostUID := int(b.cfg.UIDBase) + SandboxUID
	if s.ws, err = workspace.Open(wsPath, hostUID, int(b.cfg.UIDBase)+SandboxGID); err != nil {
		return nil, err
	}
	return s, nil
}

func (s *Sandbox) setupFailure() error {
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
			s.runnerExit = &st
		}
		s.statusMu.Unlock()
	}
	io.Copy(io.Discard, r)
}

// readEvents follows the runner's event pipe for the sandbox's life. A
// malformed frame means the runner (or user code writing to its pipe) broke
// the protocol: parsing stops, reading continues so nothing blocks.
func (s *Sandbox) readEvents() {
	defer close(s.evDone)
	defer s.events.Close()
	fr := runner.NewFrameReader(s.events, maxFrame)
	readyOnce := sync.OnceFunc(func() { close(s.ready) })
	for {
		ev, err := fr.Next()
		if err != nil {
			if !errors.Is(err, io.EOF) {
				s.evMu.Lock()
				s.evBroken = err
				s.evMu.Unlock()
				io.Copy(io.Discard, s.events)
			}
			return
		}
		if ev.Type == "ready" {
			readyOnce()
			continue
		}
		s.evMu.Lock()
		if x := s.cur; x != nil {
			x.handle(ev)
		}
		s.evMu.Unlock()
	}
}

func (x *execution) handle(ev runner.Event) {
	switch ev.Type {
	case "result":
		out, size := runner.Output(ev)
		if x.resultsBytes+size > maxResultsBytes {
			x.dropped++
			return
		}
		x.resultsBytes += size
		x.results = append(x.results, out)
	case "error":
		x.err = &sandbox.Error{Name: ev.Name, Value: ev.Value, Traceback: ev.Traceback}
	case "done":
		if x.done != nil {
			x.exitCode = ev.ExitCode
			close(x.done)
			x.done = nil
		}
	}
}

// ID implements sandbox.Sandbox.
func (s *Sandbox) ID() string { return s.id }

// Workspace implements sandbox.Sandbox.
func (s *Sandbox) Workspace() sandbox.Workspace { return s.ws }

// kill ends every process of the sandbox: init is PID 1 of the sandbox's
// PID namespace, and when it dies the kernel kills all the rest, however
// they forked, setsid or ignored signals. The cgroup is the second net.
func (s *Sandbox) kill() {
	if s.cmd != nil && s.cmd.Process != nil {
		s.cmd.Process.Signal(syscall.SIGKILL)
	}
}

// Close implements sandbox.Sandbox.
func (s *Sandbox) Close() error {
	s.closeOnce.Do(func() {
		var errs []error
		s.kill()
		if s.cmd != nil && s.cmd.Process != nil {
			<-s.initDone
		}
		if s.reqW != nil {
			s.reqW.Close()
		}
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
		if s.cg != nil {
			if err := s.cg.Destroy(); err != nil {
				errs = append(errs, err)
			}
		}
		if s.ws != nil {
			// The last reference to the disk tmpfs: its memory is freed.
			s.ws.Close()
		}
		s.closeErr = errors.Join(errs...)
	})
	return s.closeErr
}

// Execute implements sandbox.Sandbox.
func (s *Sandbox) Execute(ctx context.Context, req sandbox.ExecRequest, sink sandbox.Sink) (*sandbox.Result, error) {
	if !s.execMu.TryLock() {
		return nil, sandbox.ErrBusy
	}
	defer s.execMu.Unlock()
	select {
	case <-s.initDone:
		return nil, sandbox.ErrClosed
	default:
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

	x := &execution{done: make(chan struct{})}
	doneCh := x.done
	s.evMu.Lock()
	s.cur = x
	s.evMu.Unlock()
	var outSink, errSink func([]byte)
	if sink != nil {
		outSink, errSink = sink.Stdout, sink.Stderr
	}
	s.stdout.begin(limits.MaxOutput, outSink)
	s.stderr.begin(limits.MaxOutput, errSink)

	cpu0 := s.stats().CPU
	start := time.Now()
	sent := make(chan error, 1)
	go func() {
		err := runner.WriteFrame(s.reqW, runner.Request{Type: "execute", Code: req.Code, Filename: filename, Env: req.Env})
		if s.spec.OneShot {
			s.reqW.Close()
		}
		sent <- err
	}()

	// A one-shot execution ends when the runner process exits (its exit
	// status is the program's); a persistent one at the runner's "done".
	finished := doneCh
	if s.spec.OneShot {
		finished = s.initDone
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
wait:
	for {
		select {
		case <-finished:
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
	if why != "" {
		s.kill()
	}
	dead := why != "" || s.spec.OneShot || isClosed(s.initDone)
	if dead {
		// Every process is gone once init is reaped; then the pipes hit
		// EOF and everything written has been delivered.
		<-s.initDone
		<-s.statusDone
		s.waitDrained()
	} else {
		s.stdout.sync()
		s.stderr.sync()
	}
	<-sent

	s.evMu.Lock()
	s.cur = nil
	broken := s.evBroken
	s.evMu.Unlock()
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
	}
	if res.Results == nil {
		res.Results = []sandbox.Output{}
	}
	if x.dropped > 0 {
		res.Results = append(res.Results, sandbox.Output{
			Text: fmt.Sprintf("[vivarium: %d more results dropped: over the %d MiB limit]", x.dropped, maxResultsBytes>>20)})
	}
	s.statusMu.Lock()
	exit := s.runnerExit
	s.statusMu.Unlock()
	classify(res, why, whyMsg, dead, exit, x.exitCode, st.OOMKills > 0, limits, broken)
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

func (s *Sandbox) waitDrained() {
	timeout := time.After(drainTimeout)
	for _, c := range []*capture{s.stdout, s.stderr} {
		select {
		case <-c.done:
		case <-timeout:
			return
		}
	}
	select {
	case <-s.evDone:
	case <-timeout:
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
