package service

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

// idleBackend makes sandboxes that do nothing: for tests of what the
// service keeps about a sandbox (timeouts, metrics), not of what runs in
// it. Calling anything else of theirs panics.
type idleBackend struct{}

func newFakeBackend() idleBackend { return idleBackend{} }

func (idleBackend) Name() string { return "idle" }

func (idleBackend) Create(context.Context, sandbox.Spec) (sandbox.Sandbox, error) {
	return &idleSandbox{}, nil
}

// idleSandbox reports the use its test sets.
type idleSandbox struct {
	sandbox.Sandbox
	cpu, mem atomic.Int64
	closed   atomic.Bool
}

func (*idleSandbox) ID() string { return "idle" }

func (s *idleSandbox) Close() error {
	s.closed.Store(true)
	return nil
}

func (s *idleSandbox) Usage() (sandbox.Usage, error) {
	if s.closed.Load() {
		panic("Usage called on a closed sandbox")
	}
	return sandbox.Usage{CPU: time.Duration(s.cpu.Load()), Memory: s.mem.Load()}, nil
}

func (*idleSandbox) Workspace() sandbox.Workspace { return nil }
