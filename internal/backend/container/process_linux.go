package container

import (
	"context"
	"fmt"
	"io"
	"sync"
	"syscall"

	"github.com/vivarium-sandbox/vivarium/internal/agent"
	"github.com/vivarium-sandbox/vivarium/internal/core"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

// cmdStreams are a command's streams through the agent: its stdin, and
// its output, buffered as it arrives.
type cmdStreams struct {
	id             uint32
	stdin          *stdinWriter
	stdout, stderr *buffer
	terminal       bool // started in a terminal: stdout is the terminal's
	// Under Sandbox.mu: it exited, and how many of its two output
	// streams have ended.
	exited bool
	closed int
}

// Start implements sandbox.Sandbox: the agent starts the command.
func (s *Sandbox) Start(ctx context.Context, c sandbox.Command) (sandbox.Process, error) {
	if c.User == sandbox.UserRoot {
		// The container's uid 0 is the host's (docker) or gVisor's
		// kernel's: not offered until it can be shown to be harmless.
		return nil, fmt.Errorf("%w: the %s backend runs commands as the sandbox user only", sandbox.ErrUnsupported,
			s.b.Name())
	}
	// Held until the command has started (or not): a pause waits, and
	// finds it running.
	s.startGate.RLock()
	defer s.startGate.RUnlock()
	if s.Core.Paused() {
		return nil, sandbox.ErrPaused
	}
	return s.StartCommand(ctx, c, s.spec.Env, func(id uint64, env map[string]string) error {
		// Its streams exist before the agent can answer, so that no
		// output of the command arrives before them.
		cid := uint32(id)
		sin, _, _ := agent.CommandStreams(cid)
		cs := &cmdStreams{id: cid, stdin: &stdinWriter{out: s.session().out, stream: sin}, stdout: newBuffer(),
			stderr: newBuffer(), terminal: c.Terminal != nil}
		s.mu.Lock()
		s.cmds[cid] = cs
		s.mu.Unlock()
		spawn := agent.Ctl{Op: agent.OpSpawn, ID: cid, Argv: c.Argv, Env: sandbox.Environ(env), Dir: c.Dir}
		if c.Terminal != nil {
			// In a terminal of the container's devpts (the agent's
			// terminal_linux.go).
			spawn.Rows, spawn.Cols = c.Terminal.Rows, c.Terminal.Cols
		}
		err := s.ctl(spawn)
		if err != nil {
			s.forgetCmd(cid)
		}
		return err
	})
}

// spawned turns the agent's answer to a start into the core's.
func (s *Sandbox) spawned(c agent.Ctl) core.Spawned {
	s.mu.Lock()
	cs := s.cmds[c.ID]
	s.mu.Unlock()
	if c.Error != "" || cs == nil {
		s.forgetCmd(c.ID)
		msg := c.Error
		if msg == "" {
			msg = "the agent started an unknown command"
		}
		return core.Spawned{Err: msg}
	}
	id := c.ID
	sp := core.Spawned{PID: c.PID, Stdin: cs.stdin, Stdout: cs.stdout, Stderr: cs.stderr,
		Signal: func(sig syscall.Signal) error {
			return s.ctl(agent.Ctl{Op: agent.OpSignal, ID: id, Signal: int(sig)})
		}}
	if cs.terminal {
		// No round trip: the agent resizes it when the frame comes.
		sp.Resize = func(size sandbox.TerminalSize) error {
			return s.ctl(agent.Ctl{Op: agent.OpResize, ID: id, Rows: size.Rows, Cols: size.Cols})
		}
	}
	return sp
}

func (s *Sandbox) forgetCmd(id uint32) {
	s.mu.Lock()
	delete(s.cmds, id)
	s.mu.Unlock()
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
