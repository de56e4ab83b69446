package native

import (
	"context"
	"os"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/vivarium-sandbox/vivarium/internal/core"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

// Start implements sandbox.Sandbox: init starts the command and passes
// back its pipes (readControl hands them to the core).
func (s *Sandbox) Start(ctx context.Context, c sandbox.Command) (sandbox.Process, error) {
	return s.StartCommand(ctx, c, s.spec.UserEnv(c.User), func(id uint64, env map[string]string) error {
		return s.send(ctlMsg{Op: opSpawn, ID: id, Argv: c.Argv, Env: sandboxEnv(env), Dir: c.Dir, User: c.User})
	})
}

// spawned turns init's answer to a start into the core's.
func (s *Sandbox) spawned(m ctlMsg, fds []int) core.Spawned {
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
		// init signals only the process groups of commands it started.
		Signal: func(sig syscall.Signal) error {
			return s.send(ctlMsg{Op: opSignal, PID: pid, Signal: int(sig)})
		},
	}
}
