package native

import (
	"fmt"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

var _ sandbox.ContextKeeper = (*Sandbox)(nil)

// CreateContext implements sandbox.ContextKeeper.
func (s *Sandbox) CreateContext(language, cwd string) (sandbox.CodeContext, error) {
	if s.spec.OneShot {
		return sandbox.CodeContext{}, fmt.Errorf("%w: a one-shot sandbox has no code contexts", sandbox.ErrUnsupported)
	}
	return s.contexts.Create(language, cwd)
}

// Contexts implements sandbox.ContextKeeper.
func (s *Sandbox) Contexts() []sandbox.CodeContext { return s.contexts.List() }

// RestartContext implements sandbox.ContextKeeper.
func (s *Sandbox) RestartContext(id string) error {
	if err := s.contexts.Restart(id); err != nil {
		return err
	}
	s.tellContextsIfIdle()
	return nil
}

// RemoveContext implements sandbox.ContextKeeper.
func (s *Sandbox) RemoveContext(id string) error {
	if err := s.contexts.Remove(id); err != nil {
		return err
	}
	s.tellContextsIfIdle()
	return nil
}

// tellContextsIfIdle frees what a removed or restarted context held at
// once when no execution runs; otherwise the next execution does it first.
func (s *Sandbox) tellContextsIfIdle() {
	if !s.execMu.TryLock() {
		return
	}
	defer s.execMu.Unlock()
	s.tellContexts()
}

// tellContexts sends the runner the contexts' changes; callers hold execMu.
// A runner that is not ready has no state to forget (a new one starts
// empty), so the message is then simply dropped.
func (s *Sandbox) tellContexts() {
	req, ok := s.contexts.Message()
	if !ok || isClosed(s.initDone) {
		return
	}
	s.mu.Lock()
	r := s.runner
	s.mu.Unlock()
	if r == nil || !isClosed(r.ready) || isClosed(r.exited) {
		return
	}
	r.request(req) // a broken pipe means a dead runner, whose successor starts empty
}
