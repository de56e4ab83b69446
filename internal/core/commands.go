package core

import (
	"context"
	"fmt"
	"io"
	"maps"
	"sync"
	"syscall"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

// Process is a command running in a sandbox beside its runner: what every
// backend's background processes have in common. The backend supplies its
// pipes and how to signal it (Started).
type Process struct {
	id     uint64
	pid    int
	stdin  io.WriteCloser
	stdout io.ReadCloser
	stderr io.ReadCloser
	signal func(syscall.Signal) error
	resize func(sandbox.TerminalSize) error // nil: no terminal
	done   chan struct{}
	once   sync.Once
	code   int
}

var _ sandbox.Process = (*Process)(nil)

func (p *Process) PID() int              { return p.pid }
func (p *Process) Stdin() io.WriteCloser { return p.stdin }
func (p *Process) Stdout() io.ReadCloser { return p.stdout }
func (p *Process) Stderr() io.ReadCloser { return p.stderr }
func (p *Process) Done() <-chan struct{} { return p.done }
func (p *Process) ExitCode() int         { <-p.done; return p.code }

// Signal implements sandbox.Process; a process that has exited is not
// signalled (its pid may be another's by now).
func (p *Process) Signal(sig syscall.Signal) error {
	if isClosed(p.done) {
		return nil
	}
	return p.signal(sig)
}

// Resize implements sandbox.Resizer. A process that has exited is not
// resized.
func (p *Process) Resize(size sandbox.TerminalSize) error {
	if p.resize == nil {
		return fmt.Errorf("%w: pid %d", sandbox.ErrNoTerminal, p.pid)
	}
	if err := size.Validate(); err != nil {
		return err
	}
	if isClosed(p.done) {
		return nil
	}
	return p.resize(size)
}

// finish records the exit, once.
func (p *Process) finish(code int) {
	p.once.Do(func() {
		p.code = code
		close(p.done)
	})
}

// closePipes closes the host's ends of its pipes.
func (p *Process) closePipes() {
	p.stdin.Close()
	p.stdout.Close()
	p.stderr.Close()
}

// Spawned is a backend's answer to a start request: the process's pid and
// pipes, or why it could not start. A command started with a terminal has
// Resize, its Stdin and Stdout are the terminal's, and its Stderr reads
// end-of-file.
type Spawned struct {
	PID            int
	Stdin          io.WriteCloser
	Stdout, Stderr io.ReadCloser
	Signal         func(syscall.Signal) error
	Resize         func(sandbox.TerminalSize) error
	Err            string // non-empty: it did not start
}

// DefaultTerm is TERM in a terminal's environment unless the command sets
// it: what xterm.js, E2B's and most terminals in a browser emulate.
const DefaultTerm = "xterm-256color"

type started struct {
	p   *Process
	err string
}

// commands keeps a sandbox's background processes: those starting (a
// request is out) and those running.
type commands struct {
	mu       sync.Mutex
	next     uint64
	starting map[uint64]chan started
	live     map[uint64]*Process
}

// StartCommand implements sandbox.Sandbox's Start. It checks the command,
// merges its environment over base, and has send ask the backend to start
// it as command id; the backend answers with Started. send's error ends the
// start.
func (c *Core) StartCommand(ctx context.Context, cmd sandbox.Command, base map[string]string,
	send func(id uint64, env map[string]string) error) (sandbox.Process, error) {
	if len(cmd.Argv) == 0 {
		return nil, fmt.Errorf("%w: empty command", sandbox.ErrInvalidSpec)
	}
	if err := sandbox.ValidateEnv(cmd.Env); err != nil {
		return nil, err
	}
	if cmd.User != "" && cmd.User != sandbox.UserSandbox && cmd.User != sandbox.UserRoot {
		return nil, fmt.Errorf("%w: user must be %q or %q, got %q", sandbox.ErrInvalidSpec, sandbox.UserSandbox,
			sandbox.UserRoot, cmd.User)
	}
	if cmd.Terminal != nil {
		if err := cmd.Terminal.Validate(); err != nil {
			return nil, err
		}
	}
	if c.d.Closed() || isClosed(c.d.Dead()) {
		return nil, sandbox.ErrClosed
	}
	env := maps.Clone(base)
	if env == nil {
		env = map[string]string{}
	}
	maps.Copy(env, cmd.Env)
	if _, ok := cmd.Env["TERM"]; cmd.Terminal != nil && !ok {
		env["TERM"] = DefaultTerm
	}
	cs := &c.cmds
	ch := make(chan started, 1)
	cs.mu.Lock()
	cs.next++
	id := cs.next
	cs.starting[id] = ch
	cs.mu.Unlock()
	forget := func() {
		cs.mu.Lock()
		delete(cs.starting, id)
		cs.mu.Unlock()
	}
	if err := send(id, env); err != nil {
		forget()
		return nil, err
	}
	select {
	case st, ok := <-ch:
		if !ok {
			return nil, sandbox.ErrClosed
		}
		if st.p == nil {
			msg := st.err
			if msg == "" {
				msg = "the sandbox sent no pipes"
			}
			return nil, fmt.Errorf("start %s: %s", cmd.Argv[0], msg)
		}
		return st.p, nil
	case <-ctx.Done():
		// The answer may still come: Started then kills what started,
		// as nobody waits for it.
		forget()
		return nil, ctx.Err()
	}
}

// Started delivers the backend's answer to command id's start. A process
// nobody waits for any more (the caller gave up) is killed and its pipes
// closed.
func (c *Core) Started(id uint64, s Spawned) {
	cs := &c.cmds
	var p *Process
	if s.Err == "" {
		p = &Process{id: id, pid: s.PID, stdin: s.Stdin, stdout: s.Stdout, stderr: s.Stderr, signal: s.Signal,
			resize: s.Resize, done: make(chan struct{})}
	}
	cs.mu.Lock()
	ch := cs.starting[id]
	delete(cs.starting, id)
	if p != nil && ch != nil {
		// Known before anyone sees it, so that its exit, which may be
		// told at once, is not missed.
		cs.live[id] = p
	}
	cs.mu.Unlock()
	if p != nil && ch == nil {
		p.Signal(syscall.SIGKILL)
		p.finish(128 + int(syscall.SIGKILL))
		p.closePipes()
	}
	if ch != nil {
		ch <- started{p: p, err: s.Err}
	}
}

// CommandExited records that command id exited with code.
func (c *Core) CommandExited(id uint64, code int) {
	cs := &c.cmds
	cs.mu.Lock()
	p := cs.live[id]
	delete(cs.live, id)
	cs.mu.Unlock()
	if p != nil {
		p.finish(code)
	}
}

// LiveCommands is how many commands started and not known to have
// exited.
func (c *Core) LiveCommands() int {
	cs := &c.cmds
	cs.mu.Lock()
	defer cs.mu.Unlock()
	return len(cs.live) + len(cs.starting)
}

// CommandsGone records that the sandbox's processes are all gone (its
// isolation ended): every command has exited, killed as far as anyone can
// tell, and every start waiting for an answer fails.
func (c *Core) CommandsGone() {
	cs := &c.cmds
	cs.mu.Lock()
	starting, live := cs.starting, cs.live
	cs.starting, cs.live = map[uint64]chan started{}, map[uint64]*Process{}
	cs.mu.Unlock()
	for _, ch := range starting {
		close(ch)
	}
	for _, p := range live {
		p.finish(128 + int(syscall.SIGKILL))
	}
}
