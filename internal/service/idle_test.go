package service

import (
	"context"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

// idleBackend makes sandboxes that do nothing: for tests of what the
// service keeps about a sandbox (timeouts, metrics), not of what runs in
// it. Calling anything else of theirs panics.
type idleBackend struct{}

func newFakeBackend() idleBackend { return idleBackend{} }

func (idleBackend) Name() string { return "idle" }

func (idleBackend) Create(context.Context, sandbox.Spec) (sandbox.Sandbox, error) {
	return idleSandbox{}, nil
}

type idleSandbox struct{ sandbox.Sandbox }

func (idleSandbox) ID() string   { return "idle" }
func (idleSandbox) Close() error { return nil }
