package native

import (
	"context"
	"fmt"
	"io"
	"os"
	"syscall"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

// process is a command started in a sandbox by init, with the pipes init
// passed back.
type process struct {
	s              *Sandbox
	id             uint64
	pid            int
	stdin          *os.File
	stdout, stderr *os.File
	done           chan struct{}
	code           int
}

var _ sandbox.Process = (*process)(nil)

// finish records the exit; called with Sandbox.mu held, once.
func (p *process) finish(code int) {
	if !isClosed(p.done) {
		p.code = code
		close(p.done)
	}
}

func (p *process) PID() int              { return p.pid }
func (p *process) Stdin() io.WriteCloser { return p.stdin }
func (p *process) Stdout() io.ReadCloser { return p.stdout }
func (p *process) Stderr() io.ReadCloser { return p.stderr }
func (p *process) Done() <-chan struct{} { return p.done }
func (p *process) ExitCode() int         { <-p.done; return p.code }

// Signal implements sandbox.Process.
func (p *process) closePipes() {
	p.stdin.Close()
	p.stdout.Close()
	p.stderr.Close()
}

func (p *process) Signal(sig syscall.Signal) error {
	if isClosed(p.done) {
		return nil
	}
	return p.s.send(ctlMsg{Op: opSignal, PID: p.pid, Signal: int(sig)})
}

// Start implements sandbox.Sandbox.
func (s *Sandbox) Start(ctx context.Context, c sandbox.Command) (sandbox.Process, error) {
	if len(c.Argv) == 0 {
		return nil, fmt.Errorf("%w: empty command", sandbox.ErrInvalidSpec)
	}
	if err := sandbox.ValidateEnv(c.Env); err != nil {
		return nil, err
	}
	if isClosed(s.initDone) {
		return nil, sandbox.ErrClosed
	}
	env := map[string]string{}
	for k, v := range s.spec.Env {
		env[k] = v
	}
	for k, v := range c.Env {
		env[k] = v
	}
	ch := make(chan spawnReply, 1)
	s.mu.Lock()
	s.nextID++
	id := s.nextID
	s.spawns[id] = ch
	s.mu.Unlock()
	msg := ctlMsg{Op: opSpawn, ID: id, Argv: c.Argv, Env: sandboxEnv(env), Dir: c.Dir}
	if err := s.send(msg); err != nil {
		s.mu.Lock()
		delete(s.spawns, id)
		s.mu.Unlock()
		return nil, err
	}
	var reply spawnReply
	var ok bool
	select {
	case reply, ok = <-ch:
		if !ok {
			return nil, sandbox.ErrClosed
		}
	case <-ctx.Done():
		// The reply may still come: readControl closes its descriptors
		// once nobody waits (the entry is gone).
		s.mu.Lock()
		delete(s.spawns, id)
		s.mu.Unlock()
		return nil, ctx.Err()
	}
	if reply.p == nil {
		msg := reply.msg.Error
		if msg == "" {
			msg = "init sent no pipes"
		}
		return nil, fmt.Errorf("start %s: %s", c.Argv[0], msg)
	}
	return reply.p, nil
}
