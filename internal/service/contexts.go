package service

import (
	"fmt"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

// keeper returns an owner's sandbox as a ContextKeeper, marking it used.
func (s *Service) keeper(owner, id string) (sandbox.ContextKeeper, error) {
	b, err := s.Get(owner, id)
	if err != nil {
		return nil, err
	}
	k, ok := b.Sandbox().(sandbox.ContextKeeper)
	if !ok {
		return nil, fmt.Errorf("%w: this backend's sandboxes have no code contexts", sandbox.ErrUnsupported)
	}
	s.use(b)()
	return k, nil
}

// CreateContext makes a code context in an owner's sandbox: a namespace
// (language "python"), or a shell ("bash") or other language's process
// (runner.Languages) of its own, whose code starts in cwd. Executions select it with ExecRequest.Context.
func (s *Service) CreateContext(owner, id, language, cwd string) (sandbox.CodeContext, error) {
	k, err := s.keeper(owner, id)
	if err != nil {
		return sandbox.CodeContext{}, err
	}
	return k.CreateContext(language, cwd)
}

// Contexts lists the code contexts of an owner's sandbox.
func (s *Service) Contexts(owner, id string) ([]sandbox.CodeContext, error) {
	k, err := s.keeper(owner, id)
	if err != nil {
		return nil, err
	}
	return k.Contexts(), nil
}

// RestartContext forgets the state of one code context.
func (s *Service) RestartContext(owner, id, contextID string) error {
	k, err := s.keeper(owner, id)
	if err != nil {
		return err
	}
	return k.RestartContext(contextID)
}

// RemoveContext deletes a code context.
func (s *Service) RemoveContext(owner, id, contextID string) error {
	k, err := s.keeper(owner, id)
	if err != nil {
		return err
	}
	return k.RemoveContext(contextID)
}
