// Package core is the execution core every backend shares: what happens to
// a piece of code between Sandbox.Execute and its Result is the same
// whatever isolates it. The core owns a sandbox's executions and their
// bookkeeping (one at a time, busy, interrupt, wall-clock and CPU limits,
// restart, state lost), its code contexts, its background processes,
// output capping and the classification of an execution's end into a
// Result.
//
// A backend supplies only what differs, as a Driver: how its isolation
// dies and is killed, how it asks for a new runner, how it interrupts one,
// how it measures what the code used, and how it waits for a dead
// runner's last words. It tells the core about its runners (SetRunner,
// RunnerExited) and feeds it their events (ReadEvents or Event).
//
// Lock order: Core.execMu, then Core.mu; a Driver's own locks come after
// Core.mu, and a Driver never calls the core while holding one.
package core

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/runner"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

// Bounds on what a runner may send back per execution, the same on every
// backend.
const (
	// MaxFrame is the largest event a runner may send.
	MaxFrame        = 16 << 20
	maxResultsBytes = 64 << 20 // all rich results of one execution
	maxResults      = 10000    // rich results of one execution
	// resultOverhead is what a result costs beyond its content: an empty
	// one is not free to receive, parse and keep.
	resultOverhead = 256
	// SetupTimeout bounds how long a new runner may take to be ready,
	// unless Config says otherwise.
	SetupTimeout = 60 * time.Second
	// killTimeout guards a bug: a sandbox that was killed is dead at once.
	killTimeout = 30 * time.Second
)

// Driver is what a backend supplies to the core.
type Driver interface {
	// Prepare is called before each execution: it fails with
	// sandbox.ErrClosed when the sandbox can run no more code, and may
	// bring back a persistent sandbox whose isolation died while idle
	// (a container gets a new one with the same files).
	Prepare(ctx context.Context) error
	// Closed reports whether the sandbox was closed or died for good.
	Closed() bool
	// Dead is closed when the sandbox's current isolation has ended: every
	// process of it is gone (or going). Prepare may replace it.
	Dead() <-chan struct{}
	// Restart asks for a new runner in place of the current one, every
	// other process of the sandbox killed; the backend hands it over with
	// SetRunner. It returns once the request is made.
	Restart(ctx context.Context) error
	// Interrupt raises KeyboardInterrupt in runner r, which runs code.
	// It is called with the core's lock held and must not call the core.
	Interrupt(r *Runner) error
	// Usage reports what the sandbox has used so far; its CPU is
	// cumulative. CPUWatch says whether CPU can be watched while code
	// runs (a CPU-time limit needs it).
	Usage() Usage
	CPUWatch() bool
	// Kill ends every process of the sandbox, without waiting.
	Kill()
	// Finish is called when runner r's execution ended with the runner's
	// process, or with the sandbox: a one-shot's runner exited, or the
	// sandbox died. If why is set (a limit or the caller), the sandbox is
	// killed first. Finish returns how the runner's process ended once
	// every event and every byte of output it wrote has been delivered.
	Finish(r *Runner, why sandbox.Status) Exit
	// SyncOutput delivers output the code wrote that may not have been
	// read yet; where output arrives in order with events, it does
	// nothing.
	SyncOutput()
	// Executed is called after every execution, with its result, when
	// the execution lock is still held: a backend whose isolation died
	// with the execution starts another for the next one.
	Executed(ctx context.Context, res *sandbox.Result)
}

// Usage is what a sandbox has used.
type Usage struct {
	CPU        time.Duration // cumulative
	MemoryPeak int64         // bytes; 0 where unknown
	OOMKills   int64         // cumulative
}

// Exit is how a runner's process ended, where it was seen.
type Exit struct {
	Exited       bool
	Code, Signal int
	// Crash says how it crashed without a signal (a WebAssembly trap);
	// Closed: the sandbox was closed meanwhile.
	Crash  string
	Closed bool
}

// Core runs a sandbox's executions. A backend's Sandbox embeds it and
// implements sandbox.Sandbox with it.
type Core struct {
	d            Driver
	oneShot      bool
	limits       sandbox.Limits
	setupTimeout time.Duration
	memErrLimit  bool
	// Stdout and Stderr receive the code's output; the backend writes to
	// them.
	Stdout, Stderr *Output
	contexts       *runner.Contexts // nil: only the default context
	paused         atomic.Bool      // the backend paused the sandbox (sandbox.Pauser)
	cmds           commands

	execMu sync.Mutex // one execution (or restart) at a time
	used   bool       // a one-shot sandbox has run its execution

	mu        sync.Mutex
	runner    *Runner       // the current runner; nil while none
	runnerSet chan struct{} // closed and replaced when runner changes
	cur       *execution
	lost      bool // the runner died since the last execution

	// interrupts is held (read) by each Interrupt from the moment it sees
	// the execution until the runner has its signal; awaitInterrupts
	// takes it (write) before a runner is given a request or replaced.
	interrupts sync.RWMutex
}

// Config configures a Core.
type Config struct {
	Spec sandbox.Spec
	// Contexts are the sandbox's code contexts; nil where the backend has
	// only the default Python context.
	Contexts *runner.Contexts
	// SetupTimeout bounds how long a new runner may take to be ready
	// (0: SetupTimeout).
	SetupTimeout time.Duration
	// MemoryErrorIsLimit: Python's MemoryError means the memory limit
	// (see sandbox.Outcome).
	MemoryErrorIsLimit bool
}

// New makes the core of a sandbox driven by d.
func New(d Driver, cfg Config) *Core {
	if cfg.SetupTimeout <= 0 {
		cfg.SetupTimeout = SetupTimeout
	}
	return &Core{
		d: d, oneShot: cfg.Spec.OneShot, limits: cfg.Spec.Limits, contexts: cfg.Contexts, setupTimeout: cfg.SetupTimeout,
		memErrLimit: cfg.MemoryErrorIsLimit,
		Stdout:      &Output{}, Stderr: &Output{}, runnerSet: make(chan struct{}),
		cmds: commands{starting: map[uint64]chan started{}, live: map[uint64]*Process{}},
	}
}

// Runner is one runner process (or interpreter) of a sandbox, as the core
// sees it.
type Runner struct {
	conn   Conn
	ready  chan struct{} // closed at its "ready" event
	exited chan struct{} // closed when its end is known
	// eventsDone is closed when its event stream has ended and every
	// event on it was handled.
	eventsDone chan struct{}
	readyOnce  sync.Once

	// onSetupError, if set, receives a "setup_error" event: what the
	// runner could not do before it became one.
	onSetupError func(msg string)
	// doneOnIdle: an execution ends when the runner waits for its next
	// request after "done" (Idle), not at "done" itself.
	doneOnIdle bool

	// Under Core.mu.
	exit      Exit
	setupFail error // it failed before it was ready
	broken    error // its event stream was malformed
}

// Conn is how the core reaches a runner.
type Conn interface {
	// Send writes one request frame.
	Send(req runner.Request) error
	// Ack acknowledges a result if it can do so at once, and drops the
	// ack otherwise: a flood of forged results must not block the reader.
	Ack()
	// HangUp ends the requests: a runner waiting for one sees their end.
	HangUp()
}

// RunnerOption configures a Runner.
type RunnerOption func(*Runner)

// OnSetupError passes a runner's "setup_error" event to f.
func OnSetupError(f func(msg string)) RunnerOption {
	return func(r *Runner) { r.onSetupError = f }
}

// DoneOnIdle ends an execution when the runner waits again (Core.Idle)
// after its "done", so that a "done" forged by the code cannot end it
// early.
func DoneOnIdle() RunnerOption { return func(r *Runner) { r.doneOnIdle = true } }

// NewRunner makes a Runner reached through conn.
func NewRunner(conn Conn, opts ...RunnerOption) *Runner {
	r := &Runner{conn: conn, ready: make(chan struct{}), exited: make(chan struct{}), eventsDone: make(chan struct{})}
	for _, o := range opts {
		o(r)
	}
	return r
}

// Ready is closed once the runner is ready for code.
func (r *Runner) Ready() <-chan struct{} { return r.ready }

// Exited is closed once the runner's end is known.
func (r *Runner) Exited() <-chan struct{} { return r.exited }

// EventsDone is closed once its event stream has ended and was handled.
func (r *Runner) EventsDone() <-chan struct{} { return r.eventsDone }

// MarkReady records that the runner is ready, for a backend that learns
// it otherwise than by a "ready" event.
func (r *Runner) MarkReady() { r.readyOnce.Do(func() { close(r.ready) }) }

// Conn returns how the runner is reached.
func (r *Runner) Conn() Conn { return r.conn }

// SetRunner makes r the sandbox's runner.
func (c *Core) SetRunner(r *Runner) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.runner = r
	close(c.runnerSet)
	c.runnerSet = make(chan struct{})
}

// ResetRunner forgets the runner, for a backend whose isolation was
// replaced (a new container): the next one comes with SetRunner. lost says
// whether the next execution reports its state lost.
func (c *Core) ResetRunner(lost bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.runner, c.lost = nil, lost
}

// Runner returns the current runner, or nil.
func (c *Core) Runner() *Runner {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.runner
}

// RunnerExited records how r ended, the first time it is told; the state
// of the sandbox is then lost if r was its runner.
func (c *Core) RunnerExited(r *Runner, e Exit) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.runnerExited(r, e)
}

func (c *Core) runnerExited(r *Runner, e Exit) {
	if isClosed(r.exited) {
		return
	}
	r.exit = e
	close(r.exited)
	if c.runner == r {
		c.lost = true
	}
}

// RunnerFailed records that r could not become a runner: it has exited,
// and a restart waiting for it fails with err.
func (c *Core) RunnerFailed(r *Runner, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if r.setupFail == nil {
		r.setupFail = err
	}
	c.runnerExited(r, Exit{Exited: true, Code: sandbox.ExitSetupFailed})
}

// RunnerBroken records that r's events were malformed, for a backend that
// parses them itself.
func (c *Core) RunnerBroken(r *Runner, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if r.broken == nil {
		r.broken = err
	}
}

// ExitOf returns how r ended, once Exited is closed.
func (c *Core) ExitOf(r *Runner) Exit {
	c.mu.Lock()
	defer c.mu.Unlock()
	return r.exit
}

// Busy reports whether an execution runs.
func (c *Core) Busy() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cur != nil
}

// Alive reports whether the sandbox has a runner ready for code.
func (c *Core) Alive() bool {
	if c.d.Closed() || isClosed(c.d.Dead()) {
		return false
	}
	c.mu.Lock()
	r := c.runner
	c.mu.Unlock()
	return r != nil && isClosed(r.ready) && !isClosed(r.exited)
}

// AwaitRunner waits until a runner is ready for code, as a sandbox's
// start-up does. It fails with the runner's setup failure, or when the
// sandbox dies, ctx ends or the setup timeout passes.
func (c *Core) AwaitRunner(ctx context.Context) error {
	timer := time.NewTimer(c.setupTimeout)
	defer timer.Stop()
	for {
		c.mu.Lock()
		r, set := c.runner, c.runnerSet
		c.mu.Unlock()
		var ready, exited <-chan struct{}
		if r != nil {
			ready, exited = r.ready, r.exited
		}
		select {
		case <-ready:
			return nil
		case <-exited:
			c.mu.Lock()
			err := r.setupFail
			c.mu.Unlock()
			if err != nil {
				return err
			}
			// Another runner may follow (a restart): wait for it.
			select {
			case <-set:
			case <-c.d.Dead():
				return errDied
			case <-timer.C:
				return fmt.Errorf("no runner was ready within %v", c.setupTimeout)
			case <-ctx.Done():
				return ctx.Err()
			}
		case <-set:
		case <-c.d.Dead():
			return errDied
		case <-timer.C:
			return fmt.Errorf("no runner was ready within %v", c.setupTimeout)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

var errDied = errors.New("the sandbox died")

// Interrupt implements sandbox.Sandbox.
func (c *Core) Interrupt() error {
	if c.paused.Load() {
		return sandbox.ErrPaused
	}
	if c.d.Closed() {
		return sandbox.ErrClosed
	}
	c.mu.Lock()
	x := c.cur
	if x == nil {
		c.mu.Unlock()
		return nil
	}
	c.interrupts.RLock()
	c.mu.Unlock()
	defer c.interrupts.RUnlock()
	// The backend returns once the runner has the signal (or gives up
	// waiting): till then no request is written and no runner replaced
	// (awaitInterrupts), so an interrupt of this execution never reaches
	// the next, whose request the runner reads after the signal (and a
	// runner drops a signal that came before a request). Not under mu:
	// the backend may deliver the execution's events meanwhile.
	return c.d.Interrupt(x.runner)
}

// awaitInterrupts waits until every interrupt sent has reached its runner:
// a barrier, nothing is done under the lock.
func (c *Core) awaitInterrupts() {
	c.interrupts.Lock()
	c.interrupts.Unlock()
}

// Restart implements sandbox.Sandbox.
func (c *Core) Restart(ctx context.Context) error {
	if c.oneShot {
		return fmt.Errorf("%w: a one-shot sandbox cannot restart", sandbox.ErrUnsupported)
	}
	if !c.execMu.TryLock() {
		return sandbox.ErrBusy
	}
	defer c.execMu.Unlock()
	if c.d.Closed() {
		return sandbox.ErrClosed
	}
	if err := c.restart(ctx); err != nil {
		return err
	}
	c.mu.Lock()
	c.lost = false // the caller asked for it
	c.mu.Unlock()
	return nil
}

// Exclusive runs f while no execution or restart runs, and keeps any
// from starting until it returns: for a backend that takes the sandbox's
// processes away and brings them back under the core (a pause, a
// resume). It fails with sandbox.ErrBusy while one runs, without waiting.
func (c *Core) Exclusive(f func() error) error {
	if !c.execMu.TryLock() {
		return sandbox.ErrBusy
	}
	defer c.execMu.Unlock()
	return f()
}

// restart replaces the runner and waits until the new one is ready. When
// it returns, every process that could write output is dead. Callers hold
// execMu.
func (c *Core) restart(ctx context.Context) error {
	c.awaitInterrupts()
	dead := c.d.Dead()
	c.mu.Lock()
	old, set := c.runner, c.runnerSet
	c.mu.Unlock()
	if err := c.d.Restart(ctx); err != nil {
		return err
	}
	for {
		select {
		case <-set:
		case <-dead:
			return fmt.Errorf("%w: the sandbox died while restarting", sandbox.ErrClosed)
		case <-ctx.Done():
			return ctx.Err()
		}
		c.mu.Lock()
		r := c.runner
		set = c.runnerSet
		c.mu.Unlock()
		if r != old {
			break
		}
	}
	if old != nil {
		old.conn.HangUp()
	}
	if err := c.AwaitRunner(ctx); err != nil {
		if errors.Is(err, errDied) {
			return fmt.Errorf("%w: the sandbox died while restarting", sandbox.ErrClosed)
		}
		if ctx.Err() == nil {
			return fmt.Errorf("%w: restart: %v", sandbox.ErrClosed, err)
		}
		return err
	}
	return nil
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// Paused implements sandbox.Pauser's Paused for a backend that pauses
// its sandboxes: what it last told SetPaused.
func (c *Core) Paused() bool { return c.paused.Load() }

// SetPaused records that the backend has paused (or resumed) the
// sandbox: meanwhile Interrupt and the code contexts' changes answer
// sandbox.ErrPaused, as the backend's own calls do.
func (c *Core) SetPaused(p bool) { c.paused.Store(p) }

// StartFailure is why a runner ended before it was ready: why, and the
// last lines its standard error had by then (what the interpreter said),
// on one line.
func (c *Core) StartFailure(why string) error {
	out := strings.TrimSpace(c.Stderr.Setup())
	if out == "" {
		return errors.New(why)
	}
	lines := strings.Split(out, "\n")
	if len(lines) > 5 {
		lines = lines[len(lines)-5:]
	}
	return fmt.Errorf("%s; it wrote: %s", why, strings.Join(lines, " | "))
}
