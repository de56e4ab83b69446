package e2b

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"syscall"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/service"
)

// The Process service: commands started in the sandbox and kept track of
// by the service's process registry, so that a command in the background
// can be listed, signalled, fed input and reconnected to.

type processConfig struct {
	Cmd  string            `json:"cmd"`
	Args []string          `json:"args"`
	Envs map[string]string `json:"envs"`
	Cwd  *string           `json:"cwd,omitempty"`
}

type startRequest struct {
	Process processConfig `json:"process"`
	PTY     *ptyConfig    `json:"pty"`
	Tag     *string       `json:"tag"`
	Stdin   *bool         `json:"stdin"`
}

// ptyConfig is process.PTY: a terminal of that size.
type ptyConfig struct {
	Size *ptySize `json:"size"`
}

// ptySize is process.PTY.Size.
type ptySize struct {
	Cols pbUint32 `json:"cols"`
	Rows pbUint32 `json:"rows"`
}

// terminalSize checks a size from the wire: a terminal's sides are 16
// bits, and not 0.
func (p *ptyConfig) terminalSize() (*sandbox.TerminalSize, error) {
	if p.Size == nil {
		return nil, newConnectError(codeInvalidArgument, "pty.size is required: {cols, rows}")
	}
	if p.Size.Rows == 0 || p.Size.Cols == 0 || p.Size.Rows > sandbox.MaxTerminalSide || p.Size.Cols > sandbox.MaxTerminalSide {
		return nil, newConnectError(codeInvalidArgument, fmt.Sprintf("pty.size: a terminal has 1 to %d rows and columns, not %dx%d",
			sandbox.MaxTerminalSide, p.Size.Rows, p.Size.Cols))
	}
	return &sandbox.TerminalSize{Rows: uint16(p.Size.Rows), Cols: uint16(p.Size.Cols)}, nil
}

// processSelector is a oneof: pid or tag.
type processSelector struct {
	Selector struct {
		PID *pbUint32 `json:"pid"`
		Tag *string   `json:"tag"`
	}
}

// UnmarshalJSON reads the oneof's fields, which the JSON mapping puts in
// the message itself.
func (p *processSelector) UnmarshalJSON(data []byte) error {
	return json.Unmarshal(data, &p.Selector)
}

type selectorRequest struct {
	Process processSelector `json:"process"`
}

// Events, as process.ProcessEvent's oneof in the JSON mapping.
type (
	processEvent struct {
		Event any `json:"event"`
	}
	startEvent struct {
		Start struct {
			PID int `json:"pid"`
		} `json:"start"`
	}
	dataEvent struct {
		Data dataOutput `json:"data"`
	}
	dataOutput struct {
		Stdout pbBytes `json:"stdout,omitempty"`
		Stderr pbBytes `json:"stderr,omitempty"`
		PTY    pbBytes `json:"pty,omitempty"`
	}
	endEvent struct {
		End endInfo `json:"end"`
	}
	endInfo struct {
		ExitCode int    `json:"exitCode"`
		Exited   bool   `json:"exited"`
		Status   string `json:"status"`
		Error    string `json:"error,omitempty"`
	}
	keepaliveEvent struct {
		Keepalive struct{} `json:"keepalive"`
	}
)

func (s *Server) startProcess(r *http.Request, t target, msg []byte, st *rpcStream) error {
	user, err := rpcUser(r)
	if err != nil {
		return err
	}
	var req startRequest
	if err := decodeMessage(msg, &req); err != nil {
		return err
	}
	if req.Process.Cmd == "" {
		return newConnectError(codeInvalidArgument, "process.cmd is empty")
	}
	cwd := ""
	if req.Process.Cwd != nil {
		cwd = *req.Process.Cwd
	}
	dir, err := sandboxDir(cwd, user)
	if err != nil {
		return err
	}
	env := map[string]string{}
	for k, v := range req.Process.Envs {
		env[k] = v
	}
	if _, ok := env["PWD"]; !ok {
		// A shell prints the directory by the name it was given
		// (/home/user), not the one the kernel resolves (/workspace).
		env["PWD"] = dir
	}
	pr := service.ProcessRequest{
		Argv: append([]string{req.Process.Cmd}, req.Process.Args...), Env: env, Cwd: dir, User: user,
		Timeout: st.Timeout,
		// Older SDKs leave stdin unset and expect it open.
		Stdin: req.Stdin == nil || *req.Stdin,
	}
	if req.Tag != nil {
		pr.Tag = *req.Tag
	}
	if req.PTY != nil {
		if pr.Terminal, err = req.PTY.terminalSize(); err != nil {
			return err
		}
	}
	p, sub, err := s.svc.StartProcess(r.Context(), t.owner, t.id, pr)
	if err != nil {
		return err
	}
	return s.follow(r.Context(), t, p, sub, st)
}

// follow streams a process's events until its end, or until the client
// leaves (the process goes on: it is reconnected to with Connect).
func (s *Server) follow(ctx context.Context, t target, p *service.Process, sub *service.Subscription, st *rpcStream) error {
	defer sub.Close()
	var start startEvent
	start.Start.PID = p.Info().PID
	if err := st.Send(processEvent{Event: start}); err != nil {
		return err
	}
	kctx, stop := context.WithCancel(ctx)
	defer stop()
	st.KeepAlive(kctx, processEvent{Event: keepaliveEvent{}})
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case ev, ok := <-sub.Events():
			if !ok {
				return nil
			}
			switch {
			case ev.End != nil:
				if ev.End.ExitCode > 128 && s.killedDuring(t) {
					// A signal ended it and the sandbox is gone (killed,
					// or at the end of its life): not the command alone.
					st.Drop()
				}
				if ev.End.Status == sandbox.StatusTimeout {
					return newConnectError(codeDeadlineExceeded, ev.End.Error+" and was killed")
				}
				return st.Send(processEvent{Event: endEvent{End: endInfo{
					ExitCode: ev.End.ExitCode, Exited: true, Status: fmt.Sprintf("exit status %d", ev.End.ExitCode), Error: ev.End.Error,
				}}})
			case len(ev.Stdout) > 0 && p.Terminal():
				if err := st.Send(processEvent{Event: dataEvent{Data: dataOutput{PTY: ev.Stdout}}}); err != nil {
					return err
				}
			case len(ev.Stdout) > 0:
				if err := st.Send(processEvent{Event: dataEvent{Data: dataOutput{Stdout: ev.Stdout}}}); err != nil {
					return err
				}
			case len(ev.Stderr) > 0:
				if err := st.Send(processEvent{Event: dataEvent{Data: dataOutput{Stderr: ev.Stderr}}}); err != nil {
					return err
				}
			}
		}
	}
}

// find resolves a process selector.
func (s *Server) find(t target, sel processSelector) (*service.Process, error) {
	switch {
	case sel.Selector.PID != nil:
		return s.svc.FindProcess(t.owner, t.id, int(*sel.Selector.PID))
	case sel.Selector.Tag != nil:
		procs, err := s.svc.Processes(t.owner, t.id)
		if err != nil {
			return nil, err
		}
		for _, p := range procs {
			if p.Tag == *sel.Selector.Tag {
				return s.svc.FindProcess(t.owner, t.id, p.PID)
			}
		}
		return nil, fmt.Errorf("%w: no process has the tag %q", service.ErrNoProcess, *sel.Selector.Tag)
	}
	return nil, newConnectError(codeInvalidArgument, "the process selector names neither a pid nor a tag")
}

func (s *Server) connectProcess(r *http.Request, t target, msg []byte, st *rpcStream) error {
	var req selectorRequest
	if err := decodeMessage(msg, &req); err != nil {
		return err
	}
	p, err := s.find(t, req.Process)
	if err != nil {
		return err
	}
	sub, err := p.Subscribe()
	if err != nil {
		return err
	}
	return s.follow(r.Context(), t, p, sub, st)
}

type processInfo struct {
	Config processConfig `json:"config"`
	PID    int           `json:"pid"`
	Tag    *string       `json:"tag,omitempty"`
}

func (s *Server) listProcesses(r *http.Request, t target, msg []byte) (any, error) {
	procs, err := s.svc.Processes(t.owner, t.id)
	if err != nil {
		return nil, err
	}
	out := struct {
		Processes []processInfo `json:"processes"`
	}{Processes: make([]processInfo, 0, len(procs))}
	for _, p := range procs {
		cwd := p.Cwd
		pi := processInfo{PID: p.PID, Config: processConfig{Cmd: p.Argv[0], Args: p.Argv[1:], Envs: p.Env, Cwd: &cwd}}
		if p.Tag != "" {
			tag := p.Tag
			pi.Tag = &tag
		}
		out.Processes = append(out.Processes, pi)
	}
	return out, nil
}

type sendInputRequest struct {
	Process processSelector `json:"process"`
	Input   struct {
		Stdin *pbBytes `json:"stdin"`
		PTY   *pbBytes `json:"pty"`
	} `json:"input"`
}

func (s *Server) sendInput(r *http.Request, t target, msg []byte) (any, error) {
	var req sendInputRequest
	if err := decodeMessage(msg, &req); err != nil {
		return nil, err
	}
	p, err := s.find(t, req.Process)
	if err != nil {
		return nil, err
	}
	// envd takes either for either: a terminal's input is its stdin.
	input := req.Input.Stdin
	if req.Input.PTY != nil {
		input = req.Input.PTY
	}
	if input != nil {
		if err := p.WriteStdin(r.Context(), *input); err != nil {
			return nil, err
		}
	}
	return struct{}{}, nil
}

type sendSignalRequest struct {
	Process processSelector `json:"process"`
	Signal  json.RawMessage `json:"signal"`
}

// signalOf reads process.Signal: its name or number.
func signalOf(raw json.RawMessage) (syscall.Signal, error) {
	var name string
	if json.Unmarshal(raw, &name) != nil {
		var n int
		if json.Unmarshal(raw, &n) != nil {
			return 0, newConnectError(codeInvalidArgument, "invalid signal")
		}
		name = fmt.Sprint(n)
	}
	switch name {
	case "SIGNAL_SIGKILL", "SIGKILL", "9":
		return syscall.SIGKILL, nil
	case "SIGNAL_SIGTERM", "SIGTERM", "15":
		return syscall.SIGTERM, nil
	}
	return 0, newConnectError(codeInvalidArgument, fmt.Sprintf("signal %s: SIGKILL or SIGTERM only", raw))
}

func (s *Server) sendSignal(r *http.Request, t target, msg []byte) (any, error) {
	var req sendSignalRequest
	if err := decodeMessage(msg, &req); err != nil {
		return nil, err
	}
	sig, err := signalOf(req.Signal)
	if err != nil {
		return nil, err
	}
	p, err := s.find(t, req.Process)
	if err != nil {
		return nil, err
	}
	if err := p.Signal(sig); err != nil {
		return nil, err
	}
	if sig == syscall.SIGKILL {
		// Answered once the process is gone, as envd's kill is: a
		// caller's next command (kill -0 PID) must not find it still
		// there, a zombie not yet reaped.
		select {
		case <-p.Done():
		case <-r.Context().Done():
		case <-time.After(killWait):
		}
	}
	return struct{}{}, nil
}

// killWait bounds how long a SIGKILL's answer waits for the process's end.
const killWait = 2 * time.Second

func (s *Server) closeStdin(r *http.Request, t target, msg []byte) (any, error) {
	var req selectorRequest
	if err := decodeMessage(msg, &req); err != nil {
		return nil, err
	}
	p, err := s.find(t, req.Process)
	if err != nil {
		return nil, err
	}
	if err := p.CloseStdin(); err != nil {
		return nil, err
	}
	return struct{}{}, nil
}

type updateRequest struct {
	Process processSelector `json:"process"`
	PTY     *ptyConfig      `json:"pty"`
}

// updateProcess resizes a process's terminal, the one thing
// process.Process/Update changes.
func (s *Server) updateProcess(r *http.Request, t target, msg []byte) (any, error) {
	var req updateRequest
	err := decodeMessage(msg, &req)
	if err != nil {
		return nil, err
	}
	var size *sandbox.TerminalSize
	if req.PTY != nil {
		if size, err = req.PTY.terminalSize(); err != nil {
			return nil, err
		}
	}
	p, err := s.find(t, req.Process)
	if err != nil {
		return nil, err
	}
	if size != nil {
		if err := p.Resize(*size); err != nil {
			return nil, err
		}
	}
	return struct{}{}, nil
}
