package e2b

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/jsonerr"
	"github.com/vivarium-sandbox/vivarium/internal/runner"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

// The code interpreter's API (port 49999 of an E2B code-interpreter
// sandbox): POST /execute streams an execution as JSON lines; /contexts
// manages code contexts.

func (s *Server) routeInterpreter() {
	m := s.interp
	m.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, `"ok"`) })
	m.HandleFunc("POST /execute", s.execute)
	m.HandleFunc("GET /contexts", s.listContexts)
	m.HandleFunc("POST /contexts", s.createContext)
	m.HandleFunc("DELETE /contexts/{id}", s.removeContext)
	m.HandleFunc("POST /contexts/{id}/restart", s.restartContext)
	m.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeText(w, http.StatusNotFound, fmt.Sprintf("%s %s is not part of the code interpreter's API", r.Method, r.URL.Path))
	})
}

// maxCodeBody bounds an execution request (the code).
const maxCodeBody = 32 << 20

type executeRequest struct {
	Code      string            `json:"code"`
	ContextID string            `json:"context_id"`
	Language  string            `json:"language"`
	EnvVars   map[string]string `json:"env_vars"`
}

// languageContext is the default context of a language: its canonical
// name (runner.Languages), made on first use.
func languageContext(language string) (string, error) {
	l, err := runner.CanonicalLanguage(language)
	if err != nil {
		return "", fmt.Errorf("language %q is not available: vivarium runs %s", language, strings.Join(runner.Languages, ", "))
	}
	return l, nil
}

// The SDKs raise only the body of a 404 (as NotFoundError) or 502 (as
// TimeoutError) from these endpoints, as plain text; any other status
// loses its message. Refusals therefore say 404 where the thing asked for
// does not exist here (a context, a language), and other errors of an
// execution come as an error line of it.

// writeText answers with a plain-text message, as E2B's code interpreter
// does.
func writeText(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(status)
	io.WriteString(w, msg)
}

func (s *Server) execute(w http.ResponseWriter, r *http.Request) {
	t := targetOf(r)
	var req executeRequest
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxCodeBody))
	if err == nil {
		err = json.Unmarshal(body, &req)
	}
	var tooBig *http.MaxBytesError
	switch {
	case errors.As(err, &tooBig):
		writeText(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("the execution request is over %d bytes", maxCodeBody))
		return
	case err != nil:
		writeText(w, http.StatusBadRequest, "invalid execution request: "+jsonerr.Message(err))
		return
	}
	ctxID := req.ContextID
	if ctxID == "" {
		if ctxID, err = languageContext(req.Language); err != nil {
			writeText(w, http.StatusNotFound, err.Error())
			return
		}
	} else if !s.contextExists(t, ctxID) {
		writeText(w, http.StatusNotFound, fmt.Sprintf("context %q not found", ctxID))
		return
	}

	// The response starts at once: the SDK's request timeout runs until
	// the first byte, the execution's own timeout after it.
	out := &lineWriter{w: w, rc: http.NewResponseController(w)}
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	out.rc.Flush()

	// E2B's runCode carries no timeout: its timeoutMs (60 s by default)
	// is the client's, which then hangs up. So the execution may run as
	// long as the server lets any (--max-timeout), and a client that
	// hangs up interrupts it, as a notebook's interrupt does: its
	// context's state survives. Code that ignores the interrupt is ended
	// interruptGrace later, and the Python process restarts.
	execCtx, cancelExec := context.WithCancel(context.WithoutCancel(r.Context()))
	defer cancelExec()
	done := make(chan struct{})
	go func() {
		select {
		case <-r.Context().Done():
			select {
			case <-done: // it ended meanwhile: nothing of its to interrupt
			default:
				s.svc.Interrupt(t.owner, t.id)
				stop := time.AfterFunc(interruptGrace, cancelExec)
				<-done
				stop.Stop()
			}
		case <-done:
		}
	}()
	kctx, stop := context.WithCancel(r.Context())
	go out.keepAlive(kctx)
	res, err := s.executeWhenFree(r.Context(), execCtx, t, sandbox.ExecRequest{Code: req.Code, Env: req.EnvVars, Context: ctxID,
		Timeout: s.svc.MaxExecTimeout()}, out)
	close(done)
	stop()
	if s.killedDuring(t) {
		// E2B's SDKs learn that a sandbox was killed (deleted, or at the
		// end of its life) mid-request from the connection dropping: they
		// then ask whether it still runs and raise their TimeoutError
		// ("the sandbox was killed"). An execution's own limit (its
		// timeout, memory) leaves the sandbox alive and ends the stream
		// as usual.
		panic(http.ErrAbortHandler)
	}
	if err != nil {
		_, msg := httpStatus(s.log, err)
		out.line(map[string]any{"type": "error", "name": "SandboxError", "value": msg, "traceback": ""})
		return
	}
	if res.StateLost {
		out.line(map[string]any{"type": "stderr", "text": "[vivarium: the Python process was restarted: " +
			"variables and imports are gone, files are kept]\n", "timestamp": time.Now().UTC()})
	}
	if e := res.Error; e != nil {
		out.line(map[string]any{"type": "error", "name": e.Name, "value": e.Value, "traceback": e.Traceback})
	}
	out.line(map[string]any{"type": "number_of_executions", "execution_count": res.ExecutionCount})
}

// killedDuring reports whether the request's sandbox is gone.
func (s *Server) killedDuring(t target) bool {
	return !s.svc.Exists(t.owner, t.id)
}

// A kernel queues the cells sent to it, where Vivarium answers busy: the
// adapter waits its turn.
// interruptGrace is how long code may ignore the interrupt its client's
// leaving sent before it is ended.
const interruptGrace = 5 * time.Second

// executeWhenFree runs the execution (under execCtx) once the sandbox is
// free, waiting while ctx (the request's) lasts.
func (s *Server) executeWhenFree(ctx, execCtx context.Context, t target, req sandbox.ExecRequest, sink sandbox.Sink) (*executed, error) {
	wait := 5 * time.Millisecond
	var release func()
	defer func() {
		if release != nil {
			release()
		}
	}()
	for {
		res, err := s.svc.Execute(execCtx, t.owner, t.id, req, sink)
		if !errors.Is(err, sandbox.ErrBusy) {
			if err != nil {
				return nil, err
			}
			return &executed{Result: res.Result, ExecutionCount: res.ExecutionCount}, nil
		}
		if release == nil {
			var ok bool
			if release, ok = s.hold("queue", t.id, maxQueuedPerSandbox); !ok {
				return nil, fmt.Errorf("%w: %d executions already wait for this sandbox", sandbox.ErrBusy, maxQueuedPerSandbox)
			}
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(wait):
		}
		wait = min(2*wait, 200*time.Millisecond)
	}
}

type executed struct {
	*sandbox.Result
	ExecutionCount int
}

// lineWriter writes an execution's events as JSON lines, as they come.
type lineWriter struct {
	mu   sync.Mutex
	w    http.ResponseWriter
	rc   *http.ResponseController
	last time.Time
}

func (l *lineWriter) line(v any) {
	b, _ := json.Marshal(v)
	l.mu.Lock()
	defer l.mu.Unlock()
	l.w.Write(append(b, '\n'))
	l.rc.Flush()
	l.last = time.Now()
}

func (l *lineWriter) Stdout(p []byte) {
	l.line(map[string]any{"type": "stdout", "text": string(p), "timestamp": time.Now().UTC()})
}

func (l *lineWriter) Stderr(p []byte) {
	l.line(map[string]any{"type": "stderr", "text": string(p), "timestamp": time.Now().UTC()})
}

func (l *lineWriter) Result(o sandbox.Output) { l.line(resultLine(o)) }

// keepAlive writes a line the SDKs ignore whenever the execution has been
// quiet for a while, so that a long silent computation does not look like
// a dead connection to the client's HTTP stack.
func (l *lineWriter) keepAlive(ctx context.Context) {
	const quiet = 30 * time.Second
	t := time.NewTicker(quiet / 3)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			l.mu.Lock()
			idle := time.Since(l.last) >= quiet
			l.mu.Unlock()
			if idle {
				l.line(map[string]any{"type": "keepalive"})
			}
		}
	}
}

// resultLine is a rich result as the code interpreter sends it.
func resultLine(o sandbox.Output) map[string]any {
	m := map[string]any{"type": "result", "is_main_result": o.IsMainResult}
	text := o.Text
	// Like E2B's server: a string's repr comes without its quotes.
	if len(text) >= 2 && strings.HasPrefix(text, "'") && strings.HasSuffix(text, "'") {
		text = text[1 : len(text)-1]
	}
	for k, v := range map[string]string{"text": text, "html": o.HTML, "markdown": o.Markdown, "svg": o.SVG, "png": o.PNG,
		"jpeg": o.JPEG, "latex": o.LaTeX, "javascript": o.JavaScript} {
		if v != "" {
			m[k] = v
		}
	}
	for k, v := range map[string]json.RawMessage{"json": o.JSON, "chart": o.Chart, "data": o.Data} {
		if len(v) > 0 {
			m[k] = v
		}
	}
	return m
}

// Contexts.

type createContextRequest struct {
	Language string `json:"language"`
	Cwd      string `json:"cwd"`
}

func (s *Server) contextExists(t target, id string) bool {
	list, err := s.svc.Contexts(t.owner, t.id)
	if err != nil {
		return false
	}
	for _, c := range list {
		if c.ID == id {
			return true
		}
	}
	return false
}

// failContext answers a context error, with 404 for what is missing.
func (s *Server) failContext(w http.ResponseWriter, err error) {
	if errors.Is(err, sandbox.ErrNoContext) {
		writeText(w, http.StatusNotFound, err.Error())
		return
	}
	code, msg := httpStatus(s.log, err)
	writeText(w, code, msg)
}

func (s *Server) createContext(w http.ResponseWriter, r *http.Request) {
	t := targetOf(r)
	var req createContextRequest
	if !decodeBody(w, r, &req) {
		return
	}
	if _, err := languageContext(req.Language); err != nil {
		writeText(w, http.StatusNotFound, err.Error())
		return
	}
	dir, err := sandboxDir(req.Cwd, sandbox.UserSandbox) // code contexts run as the user
	if err != nil {
		s.failContext(w, err)
		return
	}
	c, err := s.svc.CreateContext(t.owner, t.id, req.Language, dir)
	if err != nil {
		s.failContext(w, err)
		return
	}
	writeJSON(w, http.StatusOK, homeContext(c))
}

// homeContext names a context's directory as E2B's users know it: the
// workspace is their home.
func homeContext(c sandbox.CodeContext) sandbox.CodeContext {
	if rel, ok := strings.CutPrefix(c.Cwd, workspaceDir); ok && (rel == "" || strings.HasPrefix(rel, "/")) {
		c.Cwd = homeDir + rel
	}
	return c
}

func (s *Server) listContexts(w http.ResponseWriter, r *http.Request) {
	t := targetOf(r)
	list, err := s.svc.Contexts(t.owner, t.id)
	if err != nil {
		s.failContext(w, err)
		return
	}
	for i := range list {
		list[i] = homeContext(list[i])
	}
	writeJSON(w, http.StatusOK, list)
}

func (s *Server) removeContext(w http.ResponseWriter, r *http.Request) {
	t := targetOf(r)
	if err := s.svc.RemoveContext(t.owner, t.id, r.PathValue("id")); err != nil {
		s.failContext(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) restartContext(w http.ResponseWriter, r *http.Request) {
	t := targetOf(r)
	if err := s.svc.RestartContext(t.owner, t.id, r.PathValue("id")); err != nil {
		s.failContext(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
