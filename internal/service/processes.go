package service

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/store"
)

// ErrNoProcess: the sandbox runs no process with that pid (it never
// started there, or it has ended).
var ErrNoProcess = errors.New("no such process")

// ProcessRequest is a program to start in a sandbox and keep track of,
// in the foreground or the background.
type ProcessRequest struct {
	Argv []string
	Env  map[string]string
	// User runs it: "" or sandbox.UserSandbox, or sandbox.UserRoot.
	User string
	// Cwd is the working directory inside the sandbox; empty: the
	// workspace.
	Cwd string
	// Timeout ends the process (SIGKILL to its group) when it runs longer;
	// zero: no limit but the sandbox's life.
	Timeout time.Duration
	// Stdin keeps the process's standard input open for WriteStdin;
	// otherwise it reads end-of-file at once.
	Stdin bool
	// Tag is a name of the caller's choosing, reported by Processes.
	Tag string
	// Terminal runs it in a pseudo-terminal of this size (see
	// sandbox.Command): its output is the terminal's, as Stdout events,
	// its input is kept open, and Resize changes its size.
	Terminal *sandbox.TerminalSize
}

// ProcessInfo describes a process of a sandbox.
type ProcessInfo struct {
	PID       int               `json:"pid"`
	Tag       string            `json:"tag,omitempty"`
	Argv      []string          `json:"argv"`
	Env       map[string]string `json:"env"`
	Cwd       string            `json:"cwd"`
	StartedAt time.Time         `json:"started_at"`
	// Terminal is the size the process's terminal started with; nil: it
	// has none.
	Terminal *sandbox.TerminalSize `json:"terminal,omitempty"`
}

// ProcessEnd is how a process ended.
type ProcessEnd struct {
	// Status is ok (exit 0), error (another exit status), timeout (its
	// Timeout ended it) or killed (a signal, or the sandbox closed).
	Status   sandbox.Status `json:"status"`
	ExitCode int            `json:"exit_code"` // 128+n for a signal n
	Error    string         `json:"error,omitempty"`
}

// ProcessEvent is output of a process, or its end (the last event).
type ProcessEvent struct {
	Stdout, Stderr []byte
	End            *ProcessEnd
}

// Process is a program running in a sandbox, started by StartProcess. Its
// output is delivered to subscribers as it comes, and dropped when nobody
// listens: a process never blocks for want of a reader, only, like a
// program writing to a pipe, while a subscriber is slow. Each stream is
// capped at the sandbox's output limit; past it output is dropped and a
// note says so. A terminal's output is not capped.
type Process struct {
	info  ProcessInfo
	p     sandbox.Process
	ended chan struct{} // closed once end is set and subscribers are told
	// owner's followers are counted in follow (Subscribe).
	owner  string
	follow *followers

	mu   sync.Mutex
	subs map[*Subscription]struct{}
	end  *ProcessEnd

	stdinMu     sync.Mutex
	stdinClosed bool
}

// Subscription receives a process's events until its end, which is the
// last event before Events is closed.
type Subscription struct {
	p      *Process
	events chan ProcessEvent
	gone   chan struct{}
	once   sync.Once
	// release gives back the follower's place in its owner's count
	// (Subscribe); nil for the one StartProcess makes. Called once.
	release func()
}

// Events is the subscription's channel.
func (s *Subscription) Events() <-chan ProcessEvent { return s.events }

// Close stops the subscription; the process goes on.
func (s *Subscription) Close() {
	s.once.Do(func() {
		close(s.gone)
		s.p.mu.Lock()
		delete(s.p.subs, s)
		s.p.mu.Unlock()
		s.free()
	})
}

// free gives back the subscription's place among its owner's followers:
// when it is closed, or when its process ends, whichever comes first.
func (s *Subscription) free() {
	if s.release != nil {
		s.release()
	}
}

// maxProcessesPerSandbox bounds the processes a sandbox keeps track of.
const maxProcessesPerSandbox = 64

// Followers of a process's output (Subscribe) hold no execution slot, and
// each may hold up to its channel's 64 events of output: these bound them
// per process, per owner and in all. The subscription StartProcess makes
// counts against its process's bound only: its process holds a slot.
const (
	maxFollowersPerProcess = 16
	maxFollowersPerOwner   = 64
	maxFollowers           = 4096
)

// followers counts the owners' subscriptions to their processes' output.
// The zero value is ready, with the bounds above; tests set smaller ones.
type followers struct {
	mu       sync.Mutex
	byOwner  map[string]int
	total    int
	perOwner int // zero: maxFollowersPerOwner
	max      int // zero: maxFollowers
}

// add takes a place for one more follower of owner's, or fails with
// ErrQuota; release gives it back, once.
func (f *followers) add(owner string) (release func(), err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	perOwner, most := cmp.Or(f.perOwner, maxFollowersPerOwner), cmp.Or(f.max, maxFollowers)
	if f.byOwner[owner] >= perOwner {
		return nil, fmt.Errorf("%w: this key has %d streams of process output open, the most it may; close one first",
			ErrQuota, perOwner)
	}
	if f.total >= most {
		return nil, fmt.Errorf("%w: the server has its maximum of %d streams of process output open; try again shortly",
			ErrQuota, most)
	}
	if f.byOwner == nil {
		f.byOwner = map[string]int{}
	}
	f.byOwner[owner]++
	f.total++
	return sync.OnceFunc(func() {
		f.mu.Lock()
		defer f.mu.Unlock()
		if f.byOwner[owner]--; f.byOwner[owner] == 0 {
			delete(f.byOwner, owner)
		}
		f.total--
	}), nil
}

// StartProcess starts a program in an owner's sandbox and returns it with a
// subscription made before it could print anything. The process holds one
// of the owner's execution slots until it ends, and the sandbox does not
// expire while it runs.
func (s *Service) StartProcess(ctx context.Context, owner, id string, req ProcessRequest) (*Process, *Subscription, error) {
	b, err := s.Get(owner, id)
	if err != nil {
		return nil, nil, err
	}
	if err := checkArgv(req.Argv); err != nil {
		return nil, nil, err
	}
	if req.Timeout < 0 {
		return nil, nil, fmt.Errorf("%w: negative timeout", sandbox.ErrInvalidSpec)
	}
	if err := checkEnv(req.Env); err != nil {
		return nil, nil, err
	}
	if req.Cwd, err = checkCwd(req.Cwd); err != nil {
		return nil, nil, err
	}
	b.mu.Lock()
	n := len(b.procs)
	b.mu.Unlock()
	if n >= maxProcessesPerSandbox {
		return nil, nil, fmt.Errorf("%w: a sandbox runs at most %d tracked processes; end one first", ErrQuota, maxProcessesPerSandbox)
	}
	release, err := s.acquire(owner)
	if err != nil {
		return nil, nil, err
	}
	done := s.use(b)
	cmd := sandbox.Command{Argv: req.Argv, Env: b.ownEnv(req.Env), Dir: req.Cwd, User: req.User, Terminal: req.Terminal}
	sp, err := b.Sandbox().Start(ctx, cmd)
	if err != nil {
		err = startError(err, cmd)
		done()
		release()
		return nil, nil, err
	}
	p := &Process{
		info: ProcessInfo{PID: sp.PID(), Tag: req.Tag, Argv: slices.Clone(req.Argv), Env: req.Env, Cwd: req.Cwd,
			StartedAt: s.cfg.Now(), Terminal: req.Terminal},
		p: sp, ended: make(chan struct{}), subs: map[*Subscription]struct{}{}, owner: owner, follow: &s.followers,
	}
	if p.info.Env == nil {
		p.info.Env = map[string]string{}
	}
	sub, _ := p.subscribe(nil) // the first: under any bound
	if !req.Stdin && req.Terminal == nil {
		p.CloseStdin()
	}
	b.mu.Lock()
	if b.procs == nil {
		b.procs = map[int]*Process{}
	}
	b.procs[p.info.PID] = p
	b.mu.Unlock()
	maxOutput := b.limits.MaxOutput
	if req.Terminal != nil {
		// A terminal is a session, not a result: its output is not capped
		// in total (a shell would go silent after a megabyte). Nothing of
		// it is kept: it reaches subscribers as fast as they take it, or
		// is dropped when nobody listens.
		maxOutput = -1
	}
	go func() {
		// The end is recorded before anyone is told of it.
		p.run(maxOutput, req.Timeout, func(end ProcessEnd) {
			s.metrics.observeCommand(end.Status)
			s.cfg.Audit(store.Record{Kind: "command", KeyID: owner, SandboxID: id, CodeSHA256: store.CodeHash(fmt.Sprint(req.Argv)),
				Status: string(end.Status), ExitCode: end.ExitCode,
				DurationMS: float64(s.cfg.Now().Sub(p.info.StartedAt).Microseconds()) / 1000, Detail: end.Error})
		})
		b.mu.Lock()
		if b.procs[p.info.PID] == p {
			delete(b.procs, p.info.PID)
		}
		b.mu.Unlock()
		done()
		release()
	}()
	return p, sub, nil
}

// Processes lists the processes an owner's sandbox runs, by pid.
func (s *Service) Processes(owner, id string) ([]ProcessInfo, error) {
	b, err := s.Get(owner, id)
	if err != nil {
		return nil, err
	}
	b.mu.Lock()
	out := make([]ProcessInfo, 0, len(b.procs))
	for _, p := range b.procs {
		out = append(out, p.Info())
	}
	b.mu.Unlock()
	slices.SortFunc(out, func(a, b ProcessInfo) int { return a.PID - b.PID })
	return out, nil
}

// FindProcess returns a running process of an owner's sandbox.
func (s *Service) FindProcess(owner, id string, pid int) (*Process, error) {
	b, err := s.Get(owner, id)
	if err != nil {
		return nil, err
	}
	b.mu.Lock()
	p := b.procs[pid]
	b.mu.Unlock()
	if p == nil || p.hasEnded() {
		return nil, fmt.Errorf("%w: pid %d", ErrNoProcess, pid)
	}
	return p, nil
}

// hasEnded reports whether the process's end is known (it may still be
// being delivered).
func (p *Process) hasEnded() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.end != nil
}

// Info describes the process.
func (p *Process) Info() ProcessInfo { return p.info }

// Done is closed when the process has ended and its last output and end
// have been delivered.
func (p *Process) Done() <-chan struct{} { return p.ended }

// End is how the process ended; valid once Done is closed.
func (p *Process) End() ProcessEnd {
	<-p.ended
	return *p.end
}

// Subscribe follows the process's output from now on; ErrNoProcess once it
// has ended, ErrQuota where the process, its owner or the server has as
// many followers as it may (maxFollowersPerProcess and the others). The
// subscription's place is given back when it is closed or the process
// ends.
func (p *Process) Subscribe() (*Subscription, error) {
	if p.hasEnded() {
		return nil, fmt.Errorf("%w: pid %d has ended", ErrNoProcess, p.info.PID)
	}
	release, err := p.follow.add(p.owner)
	if err != nil {
		return nil, err
	}
	sub, err := p.subscribe(release)
	if err != nil {
		release()
		return nil, err
	}
	return sub, nil
}

func (p *Process) subscribe(release func()) (*Subscription, error) {
	sub := &Subscription{p: p, events: make(chan ProcessEvent, 64), gone: make(chan struct{}), release: release}
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case p.end != nil:
		return nil, fmt.Errorf("%w: pid %d has ended", ErrNoProcess, p.info.PID)
	case len(p.subs) >= maxFollowersPerProcess:
		return nil, fmt.Errorf("%w: pid %d has %d streams of its output open, the most it may; close one first",
			ErrQuota, p.info.PID, maxFollowersPerProcess)
	}
	p.subs[sub] = struct{}{}
	return sub, nil
}

// Signal sends sig to the process's group.
func (p *Process) Signal(sig syscall.Signal) error {
	if p.hasEnded() {
		return fmt.Errorf("%w: pid %d has ended", ErrNoProcess, p.info.PID)
	}
	return p.p.Signal(sig)
}

// Resize sets the size of the process's terminal; sandbox.ErrNoTerminal
// for a process started without one.
func (p *Process) Resize(size sandbox.TerminalSize) error {
	if p.hasEnded() {
		return fmt.Errorf("%w: pid %d has ended", ErrNoProcess, p.info.PID)
	}
	r, ok := p.p.(sandbox.Resizer)
	if !ok || p.info.Terminal == nil {
		return fmt.Errorf("%w: pid %d was started without one", sandbox.ErrNoTerminal, p.info.PID)
	}
	return r.Resize(size)
}

// Terminal reports whether the process runs in a terminal: its output
// is the terminal's, in Stdout events.
func (p *Process) Terminal() bool { return p.info.Terminal != nil }

// WriteStdin writes data to the process's standard input, waiting (until
// ctx is done) while the pipe is full.
func (p *Process) WriteStdin(ctx context.Context, data []byte) error {
	p.stdinMu.Lock()
	defer p.stdinMu.Unlock()
	if p.stdinClosed {
		return fmt.Errorf("%w: the standard input of pid %d is closed (start it with stdin kept open)", sandbox.ErrInvalidSpec, p.info.PID)
	}
	w := p.p.Stdin()
	// A pipe's *os.File, or a terminal's input, which takes deadlines too.
	if f, ok := w.(interface{ SetWriteDeadline(time.Time) error }); ok {
		deadline, ok := ctx.Deadline()
		if !ok {
			deadline = time.Now().Add(30 * time.Second)
		}
		f.SetWriteDeadline(deadline)
		// A write waiting for a process that does not read ends when the
		// caller leaves or the process ends, not only at the deadline: a
		// terminal's input is not closed when its program exits, and
		// the end of the process waits for this lock (CloseStdin).
		wctx, cancel := context.WithCancel(ctx)
		stopped := make(chan struct{})
		go func() {
			defer close(stopped)
			select {
			case <-p.p.Done():
			case <-wctx.Done():
				if ctx.Err() == nil {
					return // the write is over
				}
			}
			f.SetWriteDeadline(time.Unix(1, 0))
		}()
		defer func() {
			cancel()
			<-stopped
			f.SetWriteDeadline(time.Time{})
		}()
	}
	if _, err := w.Write(data); err != nil {
		switch {
		case isClosed(p.p.Done()):
			return fmt.Errorf("%w: pid %d has ended", ErrNoProcess, p.info.PID)
		case ctx.Err() != nil:
			return ctx.Err()
		case errors.Is(err, os.ErrDeadlineExceeded):
			return fmt.Errorf("%w: pid %d does not read its input", context.DeadlineExceeded, p.info.PID)
		}
		return fmt.Errorf("%w: pid %d: stdin: %v", ErrNoProcess, p.info.PID, err)
	}
	return nil
}

func isClosed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// CloseStdin closes the process's standard input: it reads end-of-file.
func (p *Process) CloseStdin() error {
	p.stdinMu.Lock()
	defer p.stdinMu.Unlock()
	if !p.stdinClosed {
		p.stdinClosed = true
		return p.p.Stdin().Close()
	}
	return nil
}

// publish delivers an event to every subscriber, waiting for slow ones
// (backpressure, as a pipe gives) but not for those that left.
func (p *Process) publish(ev ProcessEvent) {
	p.mu.Lock()
	subs := make([]*Subscription, 0, len(p.subs))
	for s := range p.subs {
		subs = append(subs, s)
	}
	p.mu.Unlock()
	for _, s := range subs {
		select {
		case s.events <- ev:
		case <-s.gone:
		}
	}
}

// run follows the process to its end and returns how it ended; record is
// given the end before the subscribers are. Each output stream is capped
// at maxOutput bytes; a negative maxOutput caps nothing.
func (p *Process) run(maxOutput int64, timeout time.Duration, record func(ProcessEnd)) ProcessEnd {
	var wg sync.WaitGroup
	pump := func(r io.Reader, name string, event func([]byte) ProcessEvent) {
		defer wg.Done()
		buf := make([]byte, 32<<10)
		left := maxOutput
		for {
			n, err := r.Read(buf)
			if n > 0 && maxOutput < 0 {
				p.publish(event(slices.Clone(buf[:n])))
			} else if n > 0 && left > 0 {
				keep := min(int64(n), left)
				left -= keep
				p.publish(event(slices.Clone(buf[:keep])))
				if left == 0 {
					p.publish(ProcessEvent{Stderr: fmt.Appendf(nil,
						"\n[vivarium: %s over %d bytes; the rest is dropped]\n", name, maxOutput)})
				}
			}
			if err != nil {
				return
			}
		}
	}
	wg.Add(2)
	go pump(p.p.Stdout(), "stdout", func(b []byte) ProcessEvent { return ProcessEvent{Stdout: b} })
	go pump(p.p.Stderr(), "stderr", func(b []byte) ProcessEvent { return ProcessEvent{Stderr: b} })

	end := ProcessEnd{Status: sandbox.StatusOK}
	var timer <-chan time.Time
	if timeout > 0 {
		t := time.NewTimer(timeout)
		defer t.Stop()
		timer = t.C
	}
	select {
	case <-p.p.Done():
	case <-timer:
		p.p.Signal(syscall.SIGKILL)
		end.Status, end.Error = sandbox.StatusTimeout, fmt.Sprintf("the process exceeded its %v timeout", timeout)
	}
	<-p.p.Done()
	// Children in the background may hold the pipes open: what they wrote
	// by now is delivered, the rest is theirs.
	grace := time.AfterFunc(100*time.Millisecond, func() {
		p.p.Stdout().Close()
		p.p.Stderr().Close()
	})
	wg.Wait()
	grace.Stop()
	p.p.Stdout().Close()
	p.p.Stderr().Close()
	p.CloseStdin()
	end.ExitCode = p.p.ExitCode()
	switch {
	case end.Status == sandbox.StatusTimeout:
		end.ExitCode = 128 + int(syscall.SIGKILL)
	case end.ExitCode != 0:
		end.Status = sandbox.StatusError
	}
	record(end)
	p.mu.Lock()
	p.end = &end
	subs := p.subs
	p.subs = map[*Subscription]struct{}{}
	p.mu.Unlock()
	for s := range subs {
		select {
		case s.events <- ProcessEvent{End: &end}:
		case <-s.gone:
		}
		close(s.events)
		s.free() // it follows nothing now, closed or not
	}
	close(p.ended)
	return end
}
