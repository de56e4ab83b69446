package core

import (
	"fmt"

	"github.com/vivarium-sandbox/vivarium/internal/runner"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

var _ sandbox.ContextKeeper = (*Core)(nil)

// errOneContext: a backend whose sandboxes have the default Python context
// only (Config.Contexts nil).
var errOneContext = fmt.Errorf("%w: this backend's sandboxes have one Python context and no bash", sandbox.ErrUnsupported)

// CreateContext implements sandbox.ContextKeeper.
func (c *Core) CreateContext(language, cwd string) (sandbox.CodeContext, error) {
	if c.paused.Load() {
		return sandbox.CodeContext{}, sandbox.ErrPaused
	}
	if c.contexts == nil {
		return sandbox.CodeContext{}, errOneContext
	}
	if c.oneShot {
		return sandbox.CodeContext{}, fmt.Errorf("%w: a one-shot sandbox has no code contexts", sandbox.ErrUnsupported)
	}
	return c.contexts.Create(language, cwd)
}

// Contexts implements sandbox.ContextKeeper.
func (c *Core) Contexts() []sandbox.CodeContext {
	if c.contexts == nil {
		return []sandbox.CodeContext{{ID: sandbox.DefaultContext, Language: "python"}}
	}
	return c.contexts.List()
}

// RestartContext implements sandbox.ContextKeeper.
func (c *Core) RestartContext(id string) error {
	if c.paused.Load() {
		return sandbox.ErrPaused
	}
	if c.contexts == nil {
		return errOneContext
	}
	if err := c.contexts.Restart(id); err != nil {
		return err
	}
	c.tellContextsIfIdle()
	return nil
}

// RemoveContext implements sandbox.ContextKeeper.
func (c *Core) RemoveContext(id string) error {
	if c.paused.Load() {
		return sandbox.ErrPaused
	}
	if c.contexts == nil {
		return errOneContext
	}
	if err := c.contexts.Remove(id); err != nil {
		return err
	}
	c.tellContextsIfIdle()
	return nil
}

// lookupContext finds the context an execution runs in.
func (c *Core) lookupContext(id string) (sandbox.CodeContext, error) {
	if c.contexts == nil {
		if id != "" && id != sandbox.DefaultContext {
			return sandbox.CodeContext{}, fmt.Errorf("%w: %q: this backend's sandboxes have one Python context and no bash",
				sandbox.ErrNoContext, id)
		}
		return sandbox.CodeContext{ID: sandbox.DefaultContext, Language: "python"}, nil
	}
	return c.contexts.Lookup(id)
}

// tellContextsIfIdle frees what a removed or restarted context held at
// once when no execution runs; otherwise the next execution does it first.
func (c *Core) tellContextsIfIdle() {
	if !c.execMu.TryLock() {
		return
	}
	defer c.execMu.Unlock()
	c.tellContexts(c.Runner())
}

// tellContexts sends runner r the contexts' changes; callers hold execMu.
// A runner that is not ready has no state to forget (a new one starts
// empty), so the message is then dropped; so is one to a runner that
// cannot be reached, whose successor starts empty too.
func (c *Core) tellContexts(r *Runner) {
	if c.contexts == nil {
		return
	}
	req, ok := c.contexts.Message()
	if !ok || r == nil || !isClosed(r.ready) || isClosed(r.exited) || isClosed(c.d.Dead()) {
		return
	}
	r.conn.Send(req)
}

// CloneContexts returns a copy of the sandbox's code contexts, for a copy
// of the sandbox whose runner is a copy of this one's (a fork); nil
// where it has none.
func (c *Core) CloneContexts() *runner.Contexts {
	if c.contexts == nil {
		return nil
	}
	return c.contexts.Clone()
}
