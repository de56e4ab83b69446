package service

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"syscall"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/netpolicy"
	"github.com/vivarium-sandbox/vivarium/internal/netproxy"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/store"
)

// ExecResult is an execution's Result with the sandbox's count, as a
// notebook numbers its cells.
type ExecResult struct {
	*sandbox.Result
	ExecutionCount int `json:"execution_count"`
}

// Execute runs code in an owner's sandbox.
func (s *Service) Execute(ctx context.Context, owner, id string, req sandbox.ExecRequest, sink sandbox.Sink) (*ExecResult, error) {
	b, err := s.Get(owner, id)
	if err != nil {
		return nil, err
	}
	if err := s.boundExec(b, req.Timeout, req.CPUTime); err != nil {
		return nil, err
	}
	if err := checkEnv(req.Env); err != nil {
		return nil, err
	}
	req.Env = b.ownEnv(req.Env)
	// A busy sandbox is the caller's own sequencing problem (409), told
	// before any quota (429) that the busy execution itself may fill.
	b.mu.Lock()
	busy := b.executing
	b.executing = true
	b.mu.Unlock()
	if busy {
		return nil, fmt.Errorf("%w: an execution is running in this sandbox; wait for it or interrupt it", sandbox.ErrBusy)
	}
	defer func() {
		b.mu.Lock()
		b.executing = false
		b.mu.Unlock()
	}()
	release, err := s.acquire(owner)
	if err != nil {
		return nil, err
	}
	defer release()
	done := s.use(b)
	defer done()
	res, err := b.Sandbox().Execute(ctx, req, sink)
	if err != nil {
		return nil, err
	}
	if res.Files == nil {
		res.Files = []sandbox.FileInfo{} // listed by one-shot runs only
	}
	s.metrics.observeExec(res.Status, time.Duration(res.DurationMS*float64(time.Millisecond)))
	s.audit("execute", owner, id, req.Code, res)
	b.mu.Lock()
	b.executions++
	n := b.executions
	b.mu.Unlock()
	return &ExecResult{Result: res, ExecutionCount: n}, nil
}

// audit records an execution's outcome and cost.
func (s *Service) audit(kind, owner, id, code string, res *sandbox.Result) {
	r := store.Record{
		Kind: kind, KeyID: owner, SandboxID: id, CodeSHA256: store.CodeHash(code),
		Status: string(res.Status), ExitCode: res.ExitCode, DurationMS: res.DurationMS, CPUMS: res.CPUMS,
		PeakMemoryBytes: res.PeakMemoryBytes,
	}
	if res.Error != nil {
		r.Detail = res.Error.Name
	}
	s.cfg.Audit(r)
}

func (s *Service) boundExec(b *Box, timeout, cpu time.Duration) error {
	max := s.cfg.MaxLimits.Timeout
	if timeout < 0 || cpu < 0 {
		return fmt.Errorf("%w: negative timeout", sandbox.ErrInvalidSpec)
	}
	if timeout > max || cpu > max {
		return fmt.Errorf("%w: timeout over the server's limit of %v", sandbox.ErrInvalidSpec, max)
	}
	return nil
}

// RunOnce runs code in a fresh sandbox that is destroyed afterwards.
func (s *Service) RunOnce(ctx context.Context, owner string, job sandbox.OneShot) (*sandbox.Result, error) {
	return s.RunOnceWithNetwork(ctx, owner, job, netpolicy.Request{})
}

// RunOnceWithNetwork is RunOnce with the network access network asks for,
// within the server's policy. Its connections are audited under an id of
// the run's own ("run_..."), which its run_once record carries too.
func (s *Service) RunOnceWithNetwork(ctx context.Context, owner string, job sandbox.OneShot, network netpolicy.Request) (*sandbox.Result, error) {
	limits, err := s.bound(job.Spec.Limits)
	if err != nil {
		return nil, err
	}
	job.Spec.Limits = limits
	job.Spec.Tenant = s.tenantOf(owner)
	if err := s.checkBackend(job.Spec.Backend); err != nil {
		return nil, err
	}
	if err := errors.Join(checkEnv(job.Spec.Env), checkEnv(job.Request.Env), checkFileNames(job.Files)); err != nil {
		return nil, err
	}
	if _, err := s.withTemplate(ctx, owner, &job.Spec); err != nil { // a one-shot runs no start command
		return nil, err
	}
	policy, err := s.grantNetwork(network, job.Spec.Backend)
	if err != nil {
		return nil, err
	}
	if err := s.memoryRoom(job.Spec.Backend, owner, 1); err != nil {
		return nil, err
	}
	job.OutDir = "" // never the server's file system
	release, err := s.acquire(owner)
	if err != nil {
		return nil, err
	}
	defer release()
	id := ""
	var egress *netproxy.Proxy
	if policy != nil {
		id = "run_" + randomHex(12)
		if job.Spec, egress, err = s.withNetwork(owner, id, job.Spec, policy); err != nil {
			return nil, err
		}
	}
	res, sb, warn := sandbox.RunOnceOpen(ctx, s.cfg.Backend, job)
	if sb == nil && egress != nil {
		egress.Close() // the sandbox was not made: its proxy is still ours
	}
	if warn != nil {
		s.cfg.Logger.Warn("one-shot run", "owner", owner, "err", warn)
	}
	if sb != nil {
		// The answer does not wait for the tear-down; Close and Shutdown
		// do.
		s.closing.Add(1)
		go func() {
			defer s.closing.Done()
			if err := sb.Close(); err != nil {
				s.cfg.Logger.Warn("one-shot clean-up", "owner", owner, "err", err)
			}
		}()
	}
	s.metrics.observeExec(res.Status, time.Duration(res.DurationMS*float64(time.Millisecond)))
	s.audit("run_once", owner, id, job.Request.Code, res)
	return res, nil
}

// Interrupt raises KeyboardInterrupt in the running execution.
func (s *Service) Interrupt(owner, id string) error {
	b, err := s.Get(owner, id)
	if err != nil {
		return err
	}
	return b.Sandbox().Interrupt()
}

// Restart gives a sandbox a fresh Python process; files are kept.
func (s *Service) Restart(ctx context.Context, owner, id string) error {
	b, err := s.Get(owner, id)
	if err != nil {
		return err
	}
	done := s.use(b)
	defer done()
	return b.Sandbox().Restart(ctx)
}

// CommandRequest is a shell command to run in a sandbox.
type CommandRequest struct {
	Cmd     string
	Cwd     string
	Env     map[string]string
	Timeout time.Duration
	// User runs it: "" or sandbox.UserSandbox, or sandbox.UserRoot.
	User string
}

// CommandResult is how a command ended and what it printed.
type CommandResult struct {
	Status          sandbox.Status `json:"status"`
	ExitCode        int            `json:"exit_code"`
	Stdout          string         `json:"stdout"`
	Stderr          string         `json:"stderr"`
	StdoutTruncated bool           `json:"stdout_truncated"`
	StderrTruncated bool           `json:"stderr_truncated"`
	DurationMS      float64        `json:"duration_ms"`
	Error           string         `json:"error,omitempty"`
}

// Command runs cmd with /bin/sh in an owner's sandbox, beside its Python
// state and in the same file system.
func (s *Service) Command(ctx context.Context, owner, id string, req CommandRequest, sink sandbox.Sink) (*CommandResult, error) {
	b, err := s.Get(owner, id)
	if err != nil {
		return nil, err
	}
	if req.Cmd == "" {
		return nil, fmt.Errorf("%w: empty command", sandbox.ErrInvalidSpec)
	}
	if err := s.boundExec(b, req.Timeout, 0); err != nil {
		return nil, err
	}
	if err := checkEnv(req.Env); err != nil {
		return nil, err
	}
	cwd, err := checkCwd(req.Cwd)
	if err != nil {
		return nil, err
	}
	timeout := req.Timeout
	if timeout == 0 {
		timeout = b.limits.Timeout
	}
	cmd := sandbox.Command{Argv: []string{"/bin/sh", "-c", req.Cmd}, Env: b.ownEnv(req.Env), Dir: cwd, User: req.User}
	if err := checkArgv(cmd.Argv); err != nil {
		return nil, err
	}
	return s.run(ctx, owner, id, b, cmd, timeout, sink, "command", req.Cmd)
}

// run runs a program in a sandbox, within the owner's execution quota,
// and records it in the audit log as kind, identified by what.
func (s *Service) run(ctx context.Context, owner, id string, b *Box, cmd sandbox.Command, timeout time.Duration,
	sink sandbox.Sink, kind, what string) (*CommandResult, error) {
	release, err := s.acquire(owner)
	if err != nil {
		return nil, err
	}
	defer release()
	done := s.use(b)
	defer done()
	start := time.Now()
	p, err := b.Sandbox().Start(ctx, cmd)
	if err != nil {
		return nil, startError(err, cmd)
	}
	p.Stdin().Close()
	res := &CommandResult{Status: sandbox.StatusOK}
	var outSink, errSink func([]byte)
	if sink != nil {
		outSink, errSink = sink.Stdout, sink.Stderr
	}
	var wg sync.WaitGroup
	var stdout, stderr cappedBuffer
	stdout.limit, stderr.limit = b.limits.MaxOutput, b.limits.MaxOutput
	stdout.sink, stderr.sink = outSink, errSink
	wg.Add(2)
	go func() { defer wg.Done(); stdout.readFrom(p.Stdout()) }()
	go func() { defer wg.Done(); stderr.readFrom(p.Stderr()) }()

	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case <-p.Done():
	case <-timer.C:
		p.Signal(syscall.SIGKILL)
		res.Status, res.Error = sandbox.StatusTimeout, fmt.Sprintf("%s exceeded its %v timeout", kind, timeout)
	case <-ctx.Done():
		p.Signal(syscall.SIGKILL)
		res.Status, res.Error = sandbox.StatusKilled, kind+" cancelled: "+ctx.Err().Error()
	}
	<-p.Done()
	// Background children may hold the pipes open: what they wrote by
	// now is kept, the rest is theirs.
	grace := time.AfterFunc(100*time.Millisecond, func() {
		p.Stdout().Close()
		p.Stderr().Close()
	})
	wg.Wait()
	grace.Stop()
	p.Stdout().Close()
	p.Stderr().Close()
	res.ExitCode = p.ExitCode()
	switch {
	case res.Status == sandbox.StatusTimeout:
		res.ExitCode = sandbox.ExitTimeout
	case res.Status != sandbox.StatusOK:
	case res.ExitCode != 0:
		res.Status = sandbox.StatusError
	}
	res.Stdout, res.StdoutTruncated = stdout.result()
	res.Stderr, res.StderrTruncated = stderr.result()
	res.DurationMS = float64(time.Since(start).Microseconds()) / 1000
	s.metrics.observeCommand(res.Status)
	s.cfg.Audit(store.Record{Kind: kind, KeyID: owner, SandboxID: id, CodeSHA256: store.CodeHash(what),
		Status: string(res.Status), ExitCode: res.ExitCode, DurationMS: res.DurationMS, Detail: res.Error})
	return res, nil
}

// cappedBuffer keeps the first limit bytes of a stream and drains the rest.
type cappedBuffer struct {
	limit     int64
	sink      func([]byte)
	buf       bytes.Buffer
	truncated bool
}

func (c *cappedBuffer) readFrom(r io.Reader) {
	p := make([]byte, 32<<10)
	for {
		n, err := r.Read(p)
		if n > 0 {
			keep := min(int64(n), c.limit-int64(c.buf.Len()))
			if keep < int64(n) {
				c.truncated = true
			}
			if keep > 0 {
				c.buf.Write(p[:keep])
				if c.sink != nil {
					c.sink(p[:keep])
				}
			}
		}
		if err != nil {
			return
		}
	}
}

func (c *cappedBuffer) result() (string, bool) { return c.buf.String(), c.truncated }

// Workspace returns an owner's sandbox's files, marking the sandbox used.
func (s *Service) Workspace(owner, id string) (sandbox.Workspace, func(), error) {
	b, err := s.Get(owner, id)
	if err != nil {
		return nil, nil, err
	}
	ws, closeVolumes, err := b.withVolumes(b.Sandbox().Workspace(), true, sandbox.UserSandbox)
	if err != nil {
		return nil, nil, err
	}
	done := s.use(b)
	return ws, func() { closeVolumes(); done() }, nil
}

// FileSystem returns an owner's sandbox's whole file system as user writes
// it (sandbox.FileSystem), marking the sandbox used. A backend that cannot
// reach more than the workspace answers ErrUnsupported.
func (s *Service) FileSystem(owner, id, user string) (sandbox.Workspace, func(), error) {
	b, err := s.Get(owner, id)
	if err != nil {
		return nil, nil, err
	}
	fs, ok := b.Sandbox().(sandbox.FileSystem)
	if !ok {
		return nil, nil, fmt.Errorf("%w: this sandbox's files outside its workspace cannot be reached (its backend keeps "+
			"them apart)", sandbox.ErrUnsupported)
	}
	root, err := fs.Root(user)
	if err != nil {
		return nil, nil, err
	}
	ws, closeVolumes, err := b.withVolumes(root, false, user)
	if err != nil {
		return nil, nil, err
	}
	done := s.use(b)
	return ws, func() { closeVolumes(); done() }, nil
}

// MakeDirsFor makes directory name (a path of the sandbox's file system,
// as FileSystem names it) and its missing parents as the sandbox's root,
// and gives those it made to user, as E2B's envd (root) makes a user's
// directories anywhere. Backends whose sandboxes have no root to act as
// answer sandbox.ErrUnsupported.
func (s *Service) MakeDirsFor(owner, id, name, user string) error {
	b, err := s.Get(owner, id)
	if err != nil {
		return err
	}
	fs, ok := b.Sandbox().(sandbox.FileSystem)
	if !ok {
		return fmt.Errorf("%w: this sandbox's files outside its workspace cannot be reached", sandbox.ErrUnsupported)
	}
	done := s.use(b)
	defer done()
	root, err := fs.Root(sandbox.UserRoot)
	if err != nil {
		return err
	}
	theirs, err := fs.Root(user)
	if err != nil {
		return err
	}
	g, ok := root.(sandbox.DirGiver)
	if !ok {
		return fmt.Errorf("%w: this sandbox's root cannot make its user's directories", sandbox.ErrUnsupported)
	}
	return g.MkdirAllFor(name, theirs)
}

// Limits returns a sandbox's limits.
func (b *Box) Limits() sandbox.Limits { return b.limits }
