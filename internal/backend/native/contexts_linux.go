package native

import (
	"fmt"
	"path"
	"slices"
	"strings"
	"sync"

	"github.com/vivarium-sandbox/vivarium/internal/runner"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

// maxContexts bounds the code contexts of one sandbox: each keeps a
// namespace (or a bash) alive in the runner.
const maxContexts = 32

// codeContexts is a sandbox's registry of code contexts. Their state lives
// in the runner (runner.py's PythonContext and BashContext); the registry
// keeps what the runner needs to make a context again (on first use, or
// after the runner restarted) and what it must forget. The runner is told
// between executions only, so that a context's state never changes under
// a running cell.
type codeContexts struct {
	mu    sync.Mutex
	list  []sandbox.CodeContext // the default contexts first
	reset map[string]bool       // runner keys whose state must go
	// pending: the runner has not been told of a removal or restart.
	pending bool
}

func newCodeContexts() *codeContexts {
	return &codeContexts{
		list: []sandbox.CodeContext{
			{ID: sandbox.DefaultContext, Language: "python", Cwd: workspacePath},
			{ID: sandbox.BashContext, Language: "bash", Cwd: workspacePath},
		},
		reset: map[string]bool{},
	}
}

// runnerKey is how the runner names a context: the default Python context
// is its original namespace, "".
func runnerKey(id string) string {
	if id == sandbox.DefaultContext {
		return ""
	}
	return id
}

// lookup resolves an execution's context ("" is the default one).
func (c *codeContexts) lookup(id string) (sandbox.CodeContext, error) {
	if id == "" {
		id = sandbox.DefaultContext
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, cc := range c.list {
		if cc.ID == id {
			return cc, nil
		}
	}
	return sandbox.CodeContext{}, fmt.Errorf("%w: %q", sandbox.ErrNoContext, id)
}

// message returns what the runner must be told, if anything, and clears it.
func (c *codeContexts) message() (runner.Request, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.pending {
		return runner.Request{}, false
	}
	req := runner.Request{Type: "contexts"}
	for _, cc := range c.list {
		req.Live = append(req.Live, runnerKey(cc.ID))
	}
	for k := range c.reset {
		req.Reset = append(req.Reset, k)
	}
	slices.Sort(req.Reset)
	c.pending = false
	c.reset = map[string]bool{}
	return req, true
}

// checkLanguage accepts the languages the runner has contexts for.
func checkLanguage(language string) (string, error) {
	switch l := strings.ToLower(strings.TrimSpace(language)); l {
	case "", "python", "python3":
		return "python", nil
	case "bash", "sh", "shell":
		return "bash", nil
	default:
		return "", fmt.Errorf("%w: code contexts run python or bash, not %q", sandbox.ErrInvalidSpec, language)
	}
}

// checkCwd accepts an absolute, clean path inside the sandbox.
func checkCwd(cwd string) (string, error) {
	if cwd == "" {
		return workspacePath, nil
	}
	if !strings.HasPrefix(cwd, "/") || strings.ContainsRune(cwd, 0) || len(cwd) > 4096 {
		return "", fmt.Errorf("%w: a context's working directory must be an absolute path, got %q", sandbox.ErrInvalidSpec, cwd)
	}
	return path.Clean(cwd), nil
}

var _ sandbox.ContextKeeper = (*Sandbox)(nil)

// CreateContext implements sandbox.ContextKeeper. The runner makes the
// context when code first runs in it, so a missing directory is reported
// then, as a FileNotFoundError of that execution.
func (s *Sandbox) CreateContext(language, cwd string) (sandbox.CodeContext, error) {
	if s.spec.OneShot {
		return sandbox.CodeContext{}, fmt.Errorf("%w: a one-shot sandbox has no code contexts", sandbox.ErrUnsupported)
	}
	lang, err := checkLanguage(language)
	if err != nil {
		return sandbox.CodeContext{}, err
	}
	dir, err := checkCwd(cwd)
	if err != nil {
		return sandbox.CodeContext{}, err
	}
	c := s.contexts
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.list) >= maxContexts {
		return sandbox.CodeContext{}, fmt.Errorf("%w: a sandbox has at most %d code contexts; remove one first",
			sandbox.ErrInvalidSpec, maxContexts)
	}
	cc := sandbox.CodeContext{ID: newID(), Language: lang, Cwd: dir}
	c.list = append(c.list, cc)
	return cc, nil
}

// Contexts implements sandbox.ContextKeeper.
func (s *Sandbox) Contexts() []sandbox.CodeContext {
	s.contexts.mu.Lock()
	defer s.contexts.mu.Unlock()
	return slices.Clone(s.contexts.list)
}

// RestartContext implements sandbox.ContextKeeper.
func (s *Sandbox) RestartContext(id string) error {
	if _, err := s.contexts.lookup(id); err != nil {
		return err
	}
	c := s.contexts
	c.mu.Lock()
	c.reset[runnerKey(id)] = true
	c.pending = true
	c.mu.Unlock()
	s.tellContextsIfIdle()
	return nil
}

// RemoveContext implements sandbox.ContextKeeper.
func (s *Sandbox) RemoveContext(id string) error {
	if id == sandbox.DefaultContext || id == sandbox.BashContext {
		return fmt.Errorf("%w: the default contexts cannot be removed (restart them instead)", sandbox.ErrInvalidSpec)
	}
	c := s.contexts
	c.mu.Lock()
	i := slices.IndexFunc(c.list, func(cc sandbox.CodeContext) bool { return cc.ID == id })
	if i < 0 {
		c.mu.Unlock()
		return fmt.Errorf("%w: %q", sandbox.ErrNoContext, id)
	}
	c.list = slices.Delete(c.list, i, i+1)
	c.pending = true
	c.mu.Unlock()
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
	req, ok := s.contexts.message()
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
