package httpapi

import (
	"fmt"
	"io"
	"net/http"
	"strconv"
	"syscall"

	"github.com/vivarium-sandbox/vivarium/internal/apierr"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/service"
)

// Code contexts and tracked processes: thin handlers over the service.

type (
	contextList struct {
		Contexts []sandbox.CodeContext `json:"contexts"`
	}
	contextRequest struct {
		Language string `json:"language" doc:"python (default), bash, javascript (js), typescript (ts), r or java"`
		Cwd      string `json:"cwd" doc:"absolute working directory inside the sandbox (default /workspace)"`
	}
	processList struct {
		Processes []service.ProcessInfo `json:"processes"`
	}
	processRequest struct {
		Cmd      string                `json:"cmd" doc:"shell command, run with /bin/sh -c"`
		Cwd      string                `json:"cwd" doc:"working directory inside the sandbox, absolute or relative to /workspace (default /workspace); one that is not there is a 400"`
		Env      map[string]string     `json:"env"`
		TimeoutS float64               `json:"timeout_s" doc:"ends the process after this many seconds (default: no limit but the sandbox's life)"`
		Stdin    bool                  `json:"stdin" doc:"keep stdin open for .../stdin (default: closed)"`
		Tag      string                `json:"tag" doc:"a name of the caller's choosing"`
		User     string                `json:"user" doc:"who runs it: user (default) or root, uid 0 of the sandbox's own user namespace, with no capability (native backend)"`
		Terminal *sandbox.TerminalSize `json:"terminal" doc:"run it in a pseudo-terminal of {rows, cols} (native backend): its output comes as terminal events, stdin stays open for typing, .../resize resizes it"`
	}
	signalRequest struct {
		Signal string `json:"signal" doc:"SIGTERM or SIGKILL"`
	}
)

func (s *Server) contextHandler(name string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		o, id := owner(r), r.PathValue("id")
		switch name {
		case "listContexts":
			list, err := s.svc.Contexts(o, id)
			s.respond(w, contextList{Contexts: list}, err)
		case "createContext":
			var req contextRequest
			if !decode(w, r, &req) {
				return
			}
			c, err := s.svc.CreateContext(o, id, req.Language, req.Cwd)
			if err != nil {
				s.fail(w, err)
				return
			}
			writeJSON(w, http.StatusCreated, c)
		case "deleteContext":
			if err := s.svc.RemoveContext(o, id, r.PathValue("ctx")); err != nil {
				s.fail(w, err)
				return
			}
			w.WriteHeader(http.StatusNoContent)
		case "restartContext":
			s.respond(w, okResponse{OK: true}, s.svc.RestartContext(o, id, r.PathValue("ctx")))
		}
	}
}

func (s *Server) processHandler(name string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		o, id := owner(r), r.PathValue("id")
		switch name {
		case "listProcesses":
			list, err := s.svc.Processes(o, id)
			s.respond(w, processList{Processes: list}, err)
		case "startProcess":
			var req processRequest
			if !decode(w, r, &req) {
				return
			}
			if req.Cmd == "" {
				writeError(w, apierr.InvalidRequest, "cmd is required")
				return
			}
			p, sub, err := s.svc.StartProcess(r.Context(), o, id, service.ProcessRequest{
				Argv: []string{"/bin/sh", "-c", req.Cmd}, Env: req.Env, Cwd: req.Cwd, Timeout: sandbox.Seconds(req.TimeoutS),
				Stdin: req.Stdin, Tag: req.Tag, User: req.User, Terminal: req.Terminal})
			if err != nil {
				s.fail(w, err)
				return
			}
			sub.Close() // nobody follows it yet: its output goes to .../output
			writeJSON(w, http.StatusCreated, p.Info())
		case "processOutput":
			p, err := s.process(r)
			if err != nil {
				s.fail(w, err)
				return
			}
			sub, err := p.Subscribe()
			if err != nil {
				s.fail(w, err)
				return
			}
			defer sub.Close()
			st := s.newStream(w)
			st.event(map[string]any{"type": "start", "summary": p.Info()})
			for {
				select {
				case <-r.Context().Done():
					return
				case ev, ok := <-sub.Events():
					switch {
					case !ok:
						return
					case ev.End != nil:
						st.event(map[string]any{"type": "end", "summary": ev.End})
					case len(ev.Stdout) > 0 && p.Terminal():
						// A terminal's bytes, exactly: escape sequences and
						// all, valid UTF-8 or not.
						st.event(map[string]any{"type": "terminal", "data": ev.Stdout})
					case len(ev.Stdout) > 0:
						st.Stdout(ev.Stdout)
					case len(ev.Stderr) > 0:
						st.Stderr(ev.Stderr)
					}
				}
			}
		case "processStdin":
			p, err := s.process(r)
			if err != nil {
				s.fail(w, err)
				return
			}
			data, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
			if err != nil {
				writeError(w, apierr.TooLarge, fmt.Sprintf("request body over %d bytes", maxBody))
				return
			}
			if len(data) > 0 {
				if err := p.WriteStdin(r.Context(), data); err != nil {
					s.fail(w, err)
					return
				}
			}
			if r.URL.Query().Get("close") == "1" {
				if err := p.CloseStdin(); err != nil {
					s.fail(w, err)
					return
				}
			}
			writeJSON(w, 200, okResponse{OK: true})
		case "signalProcess":
			var req signalRequest
			if !decode(w, r, &req) {
				return
			}
			var sig syscall.Signal
			switch req.Signal {
			case "SIGTERM", "TERM":
				sig = syscall.SIGTERM
			case "SIGKILL", "KILL":
				sig = syscall.SIGKILL
			default:
				writeError(w, apierr.InvalidRequest, "signal must be SIGTERM or SIGKILL")
				return
			}
			p, err := s.process(r)
			if err != nil {
				s.fail(w, err)
				return
			}
			s.respond(w, okResponse{OK: true}, p.Signal(sig))
		case "resizeProcess":
			var size sandbox.TerminalSize
			if !decode(w, r, &size) {
				return
			}
			p, err := s.process(r)
			if err != nil {
				s.fail(w, err)
				return
			}
			s.respond(w, okResponse{OK: true}, p.Resize(size))
		}
	}
}

func (s *Server) process(r *http.Request) (*service.Process, error) {
	pid, err := strconv.Atoi(r.PathValue("pid"))
	if err != nil {
		// Unknown sandboxes are reported first, as for every route.
		if _, err := s.svc.Get(owner(r), r.PathValue("id")); err != nil {
			return nil, err
		}
		return nil, fmt.Errorf("%w: %q is not a pid", service.ErrNoProcess, r.PathValue("pid"))
	}
	return s.svc.FindProcess(owner(r), r.PathValue("id"), pid)
}
