package runner

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"maps"
	"path"
	"slices"
	"strings"
	"sync"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

// maxContexts bounds the code contexts of one sandbox: each keeps a
// namespace (or a bash) alive in the runner.
const maxContexts = 32

// Contexts is a sandbox's registry of code contexts. Their state lives
// in the runner (runner.py's PythonContext and BashContext); the registry
// keeps what the runner needs to make a context again (on first use, or
// after the runner restarted) and what it must forget. The runner is told
// between executions only, so that a context's state never changes under
// a running cell.
type Contexts struct {
	mu    sync.Mutex
	list  []sandbox.CodeContext // the default contexts first
	reset map[string]bool       // runner keys whose state must go
	// pending: the runner has not been told of a removal or restart.
	pending bool
}

// Clone returns a registry of its own holding what r holds: a forked
// sandbox's, whose runner is a copy of r's runner, contexts and all.
func (r *Contexts) Clone() *Contexts {
	r.mu.Lock()
	defer r.mu.Unlock()
	c := &Contexts{list: slices.Clone(r.list), reset: maps.Clone(r.reset), pending: r.pending}
	if c.reset == nil {
		c.reset = map[string]bool{}
	}
	return c
}

// ContextsState is what a Contexts holds, as a snapshot saved on disk
// keeps it (State, ContextsFrom).
type ContextsState struct {
	List    []sandbox.CodeContext `json:"list"`
	Reset   []string              `json:"reset,omitempty"`
	Pending bool                  `json:"pending,omitempty"`
}

// State returns what r holds.
func (r *Contexts) State() ContextsState {
	r.mu.Lock()
	defer r.mu.Unlock()
	return ContextsState{List: slices.Clone(r.list), Reset: slices.Sorted(maps.Keys(r.reset)), Pending: r.pending}
}

// ContextsFrom returns a registry holding st, which a snapshot saved: the
// registry of a sandbox made from it. A state that names more contexts
// than a sandbox may have, or one twice, is refused.
func ContextsFrom(st ContextsState) (*Contexts, error) {
	if len(st.List) == 0 || len(st.List) > maxContexts+3 {
		return nil, fmt.Errorf("a snapshot's code contexts: %d of them", len(st.List))
	}
	seen := map[string]bool{}
	for _, c := range st.List {
		if c.ID == "" || seen[c.ID] {
			return nil, fmt.Errorf("a snapshot's code contexts: %q twice or empty", c.ID)
		}
		seen[c.ID] = true
	}
	c := &Contexts{list: slices.Clone(st.List), reset: map[string]bool{}, pending: st.Pending}
	for _, k := range st.Reset {
		c.reset[k] = true
	}
	return c, nil
}

// NewContexts returns the registry of a new sandbox, holding the default
// contexts, whose code starts in workspace: Python, bash and JavaScript
// (the two E2B lists and bash). The default context of another language
// is made when it is first used (see Lookup), as E2B's code interpreter
// makes it.
func NewContexts(workspace string) *Contexts {
	return &Contexts{
		list: []sandbox.CodeContext{
			{ID: sandbox.DefaultContext, Language: "python", Cwd: workspace},
			{ID: sandbox.BashContext, Language: "bash", Cwd: workspace},
			{ID: "javascript", Language: "javascript", Cwd: workspace},
		},
		reset: map[string]bool{},
	}
}

// ContextKey is how the runner names a context: the default Python context
// is its original namespace, "".
func ContextKey(id string) string {
	if id == sandbox.DefaultContext {
		return ""
	}
	return id
}

// Lookup resolves an execution's context ("" is the default one). A
// language's name (or another name it goes by: "js") is its default
// context, made here on first use.
func (c *Contexts) Lookup(id string) (sandbox.CodeContext, error) {
	if id == "" {
		id = sandbox.DefaultContext
	}
	if l, ok := languageAliases[id]; ok {
		id = l
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, cc := range c.list {
		if cc.ID == id {
			return cc, nil
		}
	}
	if slices.Contains(Languages, id) {
		cc := sandbox.CodeContext{ID: id, Language: id, Cwd: c.list[0].Cwd}
		c.list = append(c.list, cc)
		return cc, nil
	}
	return sandbox.CodeContext{}, fmt.Errorf("%w: %q", sandbox.ErrNoContext, id)
}

// Message returns what the runner must be told, if anything, and clears it.
func (c *Contexts) Message() (Request, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.pending {
		return Request{}, false
	}
	req := Request{Type: "contexts"}
	for _, cc := range c.list {
		req.Live = append(req.Live, ContextKey(cc.ID))
	}
	for k := range c.reset {
		req.Reset = append(req.Reset, k)
	}
	slices.Sort(req.Reset)
	c.pending = false
	c.reset = map[string]bool{}
	return req, true
}

// Languages are those the runner has contexts for, by their canonical
// names; each name is also the ID of the language's default context.
// Python runs in the runner itself, the others in a process of their own
// in the sandbox (kernels.py): bash, Node for JavaScript and TypeScript
// (types stripped), R, and Java through JShell. Whether the host has Node,
// R or a JDK is found when code first runs in the context.
var Languages = []string{"python", "bash", "javascript", "typescript", "r", "java"}

// languageAliases are other names the languages go by (E2B's "js" among
// them).
var languageAliases = map[string]string{
	"": "python", "python3": "python", "py": "python",
	"sh": "bash", "shell": "bash",
	"js": "javascript", "node": "javascript", "nodejs": "javascript",
	"ts": "typescript",
}

// CanonicalLanguage returns a language's canonical name, or an
// ErrInvalidSpec error naming those there are.
func CanonicalLanguage(language string) (string, error) {
	l := strings.ToLower(strings.TrimSpace(language))
	if a, ok := languageAliases[l]; ok {
		l = a
	}
	if !slices.Contains(Languages, l) {
		return "", fmt.Errorf("%w: code contexts run %s, not %q", sandbox.ErrInvalidSpec,
			strings.Join(Languages, ", "), language)
	}
	return l, nil
}

// checkLanguage accepts the languages the runner has contexts for.
func checkLanguage(language string) (string, error) { return CanonicalLanguage(language) }

// checkCwd accepts an absolute, clean path inside the sandbox.
func (c *Contexts) checkCwd(cwd string) (string, error) {
	if cwd == "" {
		return c.list[0].Cwd, nil
	}
	if !strings.HasPrefix(cwd, "/") || strings.ContainsRune(cwd, 0) || len(cwd) > 4096 {
		return "", fmt.Errorf("%w: a context's working directory must be an absolute path, got %q", sandbox.ErrInvalidSpec, cwd)
	}
	return path.Clean(cwd), nil
}

// Create adds a context. The runner makes it when code first runs in it,
// so a missing directory is reported then, as a FileNotFoundError of that
// execution.
func (c *Contexts) Create(language, cwd string) (sandbox.CodeContext, error) {
	lang, err := checkLanguage(language)
	if err != nil {
		return sandbox.CodeContext{}, err
	}
	dir, err := c.checkCwd(cwd)
	if err != nil {
		return sandbox.CodeContext{}, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.list) >= maxContexts {
		return sandbox.CodeContext{}, fmt.Errorf("%w: a sandbox has at most %d code contexts; remove one first",
			sandbox.ErrInvalidSpec, maxContexts)
	}
	cc := sandbox.CodeContext{ID: newContextID(), Language: lang, Cwd: dir}
	c.list = append(c.list, cc)
	return cc, nil
}

// List returns the contexts, the default ones first.
func (c *Contexts) List() []sandbox.CodeContext {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.list)
}

// Restart marks a context's state to be forgotten.
func (c *Contexts) Restart(id string) error {
	if _, err := c.Lookup(id); err != nil {
		return err
	}
	c.mu.Lock()
	c.reset[ContextKey(id)] = true
	c.pending = true
	c.mu.Unlock()
	return nil
}

// Remove deletes a context. The default Python and bash contexts stay; a
// language's other default context (javascript, r ...) comes back, fresh,
// when code next runs in it.
func (c *Contexts) Remove(id string) error {
	if id == sandbox.DefaultContext || id == sandbox.BashContext {
		return fmt.Errorf("%w: the default contexts cannot be removed (restart them instead)", sandbox.ErrInvalidSpec)
	}
	c.mu.Lock()
	i := slices.IndexFunc(c.list, func(cc sandbox.CodeContext) bool { return cc.ID == id })
	if i < 0 {
		c.mu.Unlock()
		return fmt.Errorf("%w: %q", sandbox.ErrNoContext, id)
	}
	c.list = slices.Delete(c.list, i, i+1)
	c.pending = true
	c.mu.Unlock()
	return nil
}

func newContextID() string {
	var b [8]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
