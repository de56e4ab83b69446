package container

import (
	"context"
	"fmt"
	"io"
	"sync"
	"syscall"

	"github.com/vivarium-sandbox/vivarium/internal/agent"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

// process is a command the agent started.
type process struct {
	s      *Sandbox
	id     uint32
	pid    int
	stdin  *stdinWriter
	stdout *buffer
	stderr *buffer
	done   chan struct{}
	code   int
	// streamsClosed counts the ends of stdout and stderr the agent sent;
	// guarded by Sandbox.mu.
	streamsClosed int
}

var _ sandbox.Process = (*process)(nil)

// finish records the exit; called with Sandbox.mu held.
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

func (p *process) Signal(sig syscall.Signal) error {
	if isClosed(p.done) {
		return nil
	}
	return p.s.ctl(agent.Ctl{Op: agent.OpSignal, ID: p.id, Signal: int(sig)})
}

// Start implements sandbox.Sandbox.
func (s *Sandbox) Start(ctx context.Context, c sandbox.Command) (sandbox.Process, error) {
	if len(c.Argv) == 0 {
		return nil, fmt.Errorf("%w: empty command", sandbox.ErrInvalidSpec)
	}
	if err := sandbox.ValidateEnv(c.Env); err != nil {
		return nil, err
	}
	if s.closing.Load() || isClosed(s.session().ended) {
		return nil, sandbox.ErrClosed
	}
	env := map[string]string{}
	for k, v := range s.spec.Env {
		env[k] = v
	}
	for k, v := range c.Env {
		env[k] = v
	}
	ch := make(chan agent.Ctl, 1)
	s.mu.Lock()
	s.nextID++
	id := s.nextID
	s.spawns[id] = ch
	// Registered before the agent can answer, so that no output of the
	// command arrives before its buffers exist.
	sin, _, _ := agent.CommandStreams(id)
	p := &process{s: s, id: id, stdin: &stdinWriter{out: s.session().out, stream: sin}, stdout: newBuffer(), stderr: newBuffer(),
		done: make(chan struct{})}
	s.procs[id] = p
	s.mu.Unlock()
	if err := s.ctl(agent.Ctl{Op: agent.OpSpawn, ID: id, Argv: c.Argv, Env: sandbox.Environ(env), Dir: c.Dir}); err != nil {
		s.mu.Lock()
		delete(s.spawns, id)
		delete(s.procs, id)
		s.mu.Unlock()
		return nil, err
	}
	var reply agent.Ctl
	var ok bool
	select {
	case reply, ok = <-ch:
		if !ok {
			return nil, sandbox.ErrClosed
		}
	case <-ctx.Done():
		s.mu.Lock()
		delete(s.spawns, id)
		s.mu.Unlock()
		p.Signal(syscall.SIGKILL)
		return nil, ctx.Err()
	}
	if reply.Error != "" {
		s.mu.Lock()
		delete(s.procs, id)
		s.mu.Unlock()
		return nil, fmt.Errorf("start %s: %s", c.Argv[0], reply.Error)
	}
	p.pid = reply.PID
	return p, nil
}

// stdinWriter sends a command's stdin to the agent.
type stdinWriter struct {
	out    *agent.Writer // the container's the command runs in
	stream uint32
	once   sync.Once
}

func (w *stdinWriter) Write(p []byte) (int, error) {
	if err := w.out.Write(agent.KindData, w.stream, p); err != nil {
		return 0, err
	}
	return len(p), nil
}

func (w *stdinWriter) Close() error {
	w.once.Do(func() { w.out.Write(agent.KindClose, w.stream, nil) })
	return nil
}

// buffer holds a command's output until it is read, up to maxBuffered
// bytes (the rest is dropped): whatever the consumer does, the agent's
// stream is never held up.
type buffer struct {
	mu   sync.Mutex
	cond *sync.Cond
	data []byte
	eof  bool // the writer is done, or the reader gave up
}

const maxBuffered = 16 << 20

func newBuffer() *buffer {
	b := &buffer{}
	b.cond = sync.NewCond(&b.mu)
	return b
}

func (b *buffer) write(p []byte) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.eof {
		return
	}
	room := maxBuffered - len(b.data)
	if room < len(p) {
		p = p[:max(room, 0)]
	}
	b.data = append(b.data, p...)
	b.cond.Broadcast()
}

// Close is both ends: the agent's end of the stream, or the reader giving
// up.
func (b *buffer) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.eof = true
	b.cond.Broadcast()
	return nil
}

func (b *buffer) Read(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for len(b.data) == 0 && !b.eof {
		b.cond.Wait()
	}
	if len(b.data) == 0 {
		return 0, io.EOF
	}
	n := copy(p, b.data)
	b.data = b.data[n:]
	if len(b.data) == 0 {
		b.data = nil
	}
	return n, nil
}
