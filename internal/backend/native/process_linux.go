package native

import (
	"context"
	"maps"
	"os"
	"slices"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/vivarium-sandbox/vivarium/internal/core"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

// Start implements sandbox.Sandbox: init starts the command and passes
// back its pipes (readControl hands them to the core).
func (s *Sandbox) Start(ctx context.Context, c sandbox.Command) (sandbox.Process, error) {
	// Held until the command has started (or not): a pause waits, and
	// finds it running.
	s.startGate.RLock()
	defer s.startGate.RUnlock()
	if s.Core.Paused() {
		return nil, sandbox.ErrPaused
	}
	return s.StartCommand(ctx, c, s.spec.UserEnv(c.User), func(id uint64, env map[string]string) error {
		return s.send(ctlMsg{Op: opSpawn, ID: id, Argv: c.Argv, Env: sandboxEnv(env), Dir: c.Dir, User: c.User,
			Term: c.Terminal})
	})
}

// spawned turns init's answer to a start into the core's: three pipes,
// or a terminal's master.
func (s *Sandbox) spawned(m ctlMsg, fds []int) core.Spawned {
	if m.Error == "" && len(fds) == 1 {
		return s.spawnedTerminal(m.ID, m.PID, fds[0])
	}
	if m.Error != "" || len(fds) != 3 {
		closeAll(fds)
		msg := m.Error
		if msg == "" {
			msg = "init sent no pipes"
		}
		return core.Spawned{Err: msg}
	}
	// Non-blocking descriptors make pollable files, whose Close
	// interrupts a pending Read.
	for _, fd := range fds {
		unix.SetNonblock(fd, true)
	}
	pid := m.PID
	return core.Spawned{
		PID:    pid,
		Stdin:  os.NewFile(uintptr(fds[0]), "stdin"),
		Stdout: os.NewFile(uintptr(fds[1]), "stdout"),
		Stderr: os.NewFile(uintptr(fds[2]), "stderr"),
		Signal: s.signaller(pid),
	}
}

// spawnedTerminal is command id, started in a terminal: its master is
// its Stdin and Stdout, and resizes it. The sandbox knows the terminal
// until its output ends, the command's exit and a pause notwithstanding.
func (s *Sandbox) spawnedTerminal(id uint64, pid, master int) core.Spawned {
	t, err := newTerminal(id, master, s.terminalEnded)
	if err != nil {
		return core.Spawned{Err: "terminal: " + err.Error()}
	}
	s.mu.Lock()
	s.terminals[id] = t
	s.mu.Unlock()
	return core.Spawned{PID: pid, Stdin: terminalIn{t}, Stdout: terminalOut{t}, Stderr: noOutput{},
		Signal: s.signaller(pid), Resize: t.resize}
}

// terminalEnded forgets terminal id, whose output ended, and has init let
// go of its copy of the master.
func (s *Sandbox) terminalEnded(id uint64) {
	s.mu.Lock()
	delete(s.terminals, id)
	s.mu.Unlock()
	s.send(ctlMsg{Op: opTerminalEnd, ID: id}) // a sandbox gone, or paused, has let go already
}

// eachTerminal calls f with each of the sandbox's terminals.
func (s *Sandbox) eachTerminal(f func(*terminal)) {
	s.mu.Lock()
	ts := slices.Collect(maps.Values(s.terminals))
	s.mu.Unlock()
	for _, t := range ts {
		f(t)
	}
}

// askTerminals asks the restored init for the masters of the sandbox's
// terminals (readControl swaps them in: terminal).
func (s *Sandbox) askTerminals() {
	s.mu.Lock()
	ids := slices.Collect(maps.Keys(s.terminals))
	s.mu.Unlock()
	// Not send: the sandbox is still paused, as far as the core knows,
	// until the resume is done.
	s.sendMu.Lock()
	err := sendCtl(s.ctl, ctlMsg{Op: opTerminals, IDs: ids})
	s.sendMu.Unlock()
	if err != nil {
		s.eachTerminal((*terminal).release)
	}
}

// signaller signals a command: init signals only the process groups of
// commands it started.
func (s *Sandbox) signaller(pid int) func(syscall.Signal) error {
	return func(sig syscall.Signal) error {
		return s.send(ctlMsg{Op: opSignal, PID: pid, Signal: int(sig)})
	}
}
