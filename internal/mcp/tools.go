package mcp

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/vivarium-sandbox/vivarium/internal/jsonerr"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/service"
)

// Inputs of the tools. Their JSON schemas, descriptions included, are
// derived from these types: they are written for a model to read.
type (
	runPythonInput struct {
		Code      string  `json:"code" jsonschema:"Python 3 source code to run. The value of the last line, if it is an expression, is returned like in a notebook cell; print() anything else you want to see."`
		SandboxID string  `json:"sandbox_id,omitempty" jsonschema:"Run in this sandbox (from create_sandbox), keeping its variables, imports and files. Leave it out to run in a fresh sandbox that is destroyed afterwards."`
		TimeoutS  float64 `json:"timeout_s,omitempty" jsonschema:"Wall-clock limit for this code in seconds. The default is 30."`
	}
	runShellInput struct {
		Command   string  `json:"command" jsonschema:"Shell command, run with /bin/sh -c in the sandbox's working directory."`
		SandboxID string  `json:"sandbox_id,omitempty" jsonschema:"Run in this sandbox (from create_sandbox), beside its Python state and files. Leave it out to run in a fresh sandbox that is destroyed afterwards."`
		TimeoutS  float64 `json:"timeout_s,omitempty" jsonschema:"Wall-clock limit in seconds. The default is 30."`
	}
	createSandboxInput struct {
		IdleTimeoutS float64 `json:"idle_timeout_s,omitempty" jsonschema:"Close the sandbox after this many seconds without use. Without it, the server's default applies (the answer gives it)."`
		FromSnapshot string  `json:"from_snapshot,omitempty" jsonschema:"Start the sandbox from a snapshot_id (from snapshot_sandbox), or a snapshot's name (the newest of that name): its variables, imports and files as they were saved."`
		Template     string  `json:"template,omitempty" jsonschema:"Make the sandbox of a template the server has (for example python:3.12): its file system, Python and packages instead of the server's own. Leave it out for the server's own."`
	}
	snapshotSandboxInput struct {
		SandboxID string `json:"sandbox_id" jsonschema:"The sandbox, from create_sandbox."`
		Name      string `json:"name,omitempty" jsonschema:"A name to find the snapshot by later, for example cleaned-data: lowercase letters, digits, '.', '_' and '-', up to 63. A name used before then finds this newer snapshot."`
	}
	forkSandboxInput struct {
		SandboxID string `json:"sandbox_id" jsonschema:"The sandbox to copy, from create_sandbox."`
		Count     int    `json:"count,omitempty" jsonschema:"How many copies, 1 to 8. The default is 1."`
	}
	sandboxInput struct {
		SandboxID string `json:"sandbox_id" jsonschema:"The sandbox, from create_sandbox."`
	}
	listFilesInput struct {
		SandboxID string `json:"sandbox_id" jsonschema:"The sandbox, from create_sandbox."`
		Path      string `json:"path,omitempty" jsonschema:"Directory relative to the working directory. The default is the working directory itself."`
		Depth     int    `json:"depth,omitempty" jsonschema:"How many levels of subdirectories to list, from 1 to 10. The default is 3."`
	}
	readFileInput struct {
		SandboxID string `json:"sandbox_id" jsonschema:"The sandbox, from create_sandbox."`
		Path      string `json:"path" jsonschema:"File path relative to the working directory, for example results/summary.csv."`
	}
	writeFileInput struct {
		SandboxID string `json:"sandbox_id" jsonschema:"The sandbox, from create_sandbox."`
		Path      string `json:"path" jsonschema:"File path relative to the working directory; missing directories are created and an existing file is replaced."`
		Content   string `json:"content" jsonschema:"The file's content: text, or base64 when encoding is base64."`
		Encoding  string `json:"encoding,omitempty" jsonschema:"text (the default) or base64, for binary files."`
	}
)

// createSandboxOutput is create_sandbox's structured result.
type createSandboxOutput struct {
	SandboxID    string    `json:"sandbox_id" jsonschema:"Pass it to run_python, run_shell and the file tools."`
	ExpiresAt    time.Time `json:"expires_at" jsonschema:"When the sandbox closes unless it is used before."`
	IdleTimeoutS float64   `json:"idle_timeout_s"`
}

// maxReadFile bounds what read_file loads: images must come whole; text is
// truncated to MaxText afterwards anyway.
const maxReadFile = 8 << 20

func ptr[T any](v T) *T { return &v }

func (s *server) addTools() {
	addTool(s, &sdk.Tool{
		Name:  "run_python",
		Title: "Run Python",
		Description: `Run Python 3 code in an isolated Linux sandbox and get back what it printed, the value of its last expression (as in a notebook cell), charts as PNG images, and, if it failed, the Python traceback.
Packages installed on the server (such as numpy, pandas, matplotlib and scipy) can be imported; there is no network access and packages cannot be installed.
Without sandbox_id the code runs in a fresh sandbox that is destroyed afterwards: nothing is kept between calls. To work in steps, call create_sandbox once and pass its sandbox_id every time: variables, imports and files are then kept.
Print the values you want to see. Save files under the working directory (/workspace, the default) to read them back with read_file. A matplotlib figure comes back as an image when plt.show() is called or the figure is still open at the end. Long output is truncated with a note.`,
		Annotations: &sdk.ToolAnnotations{Title: "Run Python", OpenWorldHint: ptr(false), DestructiveHint: ptr(false)},
	}, s.runPython)
	addTool(s, &sdk.Tool{
		Name:  "run_shell",
		Title: "Run a shell command",
		Description: `Run a shell command (/bin/sh -c) in an isolated Linux sandbox: inspect files, run command-line tools installed on the server, see what Python packages exist (python3 -m pip list). No network access.
With sandbox_id it runs in that sandbox's working directory, beside the Python state of run_python; without it, in a fresh sandbox destroyed afterwards. Returns stdout, stderr and the exit code.`,
		Annotations: &sdk.ToolAnnotations{Title: "Run a shell command", OpenWorldHint: ptr(false), DestructiveHint: ptr(false)},
	}, s.runShell)
	addTool(s, &sdk.Tool{
		Name:  "create_sandbox",
		Title: "Create a sandbox",
		Description: `Create a stateful Python sandbox and return its sandbox_id. Pass the id to run_python, run_shell, list_files, read_file and write_file: variables, imports and files are kept between calls, like a notebook kernel.
The sandbox closes after idle_timeout_s seconds without use, when this conversation's session ends, or with close_sandbox.`,
		Annotations: &sdk.ToolAnnotations{Title: "Create a sandbox", OpenWorldHint: ptr(false), DestructiveHint: ptr(false)},
	}, s.createSandbox)
	addTool(s, &sdk.Tool{
		Name:        "close_sandbox",
		Title:       "Close a sandbox",
		Description: `Close a sandbox created with create_sandbox: its processes end and its variables and files are deleted. Call it when the work in that sandbox is done.`,
		Annotations: &sdk.ToolAnnotations{Title: "Close a sandbox", OpenWorldHint: ptr(false), DestructiveHint: ptr(true), IdempotentHint: true},
	}, s.closeSandbox)
	addTool(s, &sdk.Tool{
		Name:        "pause_sandbox",
		Title:       "Pause a sandbox",
		Description: `Pause a sandbox created with create_sandbox while it is not needed for a while: its variables, imports, files and background processes are saved on the server and its memory freed. Any later call with its sandbox_id (or resume_sandbox) resumes it exactly where it was. Servers whose backend cannot pause answer so.`,
		Annotations: &sdk.ToolAnnotations{Title: "Pause a sandbox", OpenWorldHint: ptr(false), DestructiveHint: ptr(false), IdempotentHint: true},
	}, s.pauseSandbox)
	addTool(s, &sdk.Tool{
		Name:        "resume_sandbox",
		Title:       "Resume a sandbox",
		Description: `Resume a sandbox paused with pause_sandbox: its variables, imports, open files and background processes come back exactly as they were when it was paused. Calling run_python or another tool with its sandbox_id resumes it too.`,
		Annotations: &sdk.ToolAnnotations{Title: "Resume a sandbox", OpenWorldHint: ptr(false), DestructiveHint: ptr(false), IdempotentHint: true},
	}, s.resumeSandbox)
	addTool(s, &sdk.Tool{
		Name:        "fork_sandbox",
		Title:       "Copy a sandbox",
		Description: `Copy a sandbox created with create_sandbox, as it is now, into count new sandboxes: each starts with the same variables, imports and files and then goes its own way (to try several approaches from one point). Returns their sandbox_ids; the original is unchanged. Servers whose backend cannot copy sandboxes answer so.`,
		Annotations: &sdk.ToolAnnotations{Title: "Copy a sandbox", OpenWorldHint: ptr(false), DestructiveHint: ptr(false)},
	}, s.forkSandbox)
	addTool(s, &sdk.Tool{
		Name:        "snapshot_sandbox",
		Title:       "Save a sandbox",
		Description: `Save a sandbox created with create_sandbox, as it is now, on the server: its variables, imports and files. Returns a snapshot_id that create_sandbox's from_snapshot starts new sandboxes from, in this conversation or a later one; give it a name to start them by name instead. The sandbox goes on unchanged.`,
		Annotations: &sdk.ToolAnnotations{Title: "Save a sandbox", OpenWorldHint: ptr(false), DestructiveHint: ptr(false)},
	}, s.snapshotSandbox)
	addTool(s, &sdk.Tool{
		Name:        "list_files",
		Title:       "List files",
		Description: `List the files and directories in a sandbox's working directory (or a directory under it), with their sizes. Directories end with a slash.`,
		Annotations: &sdk.ToolAnnotations{Title: "List files", ReadOnlyHint: true, OpenWorldHint: ptr(false)},
	}, s.listFiles)
	addTool(s, &sdk.Tool{
		Name:        "read_file",
		Title:       "Read a file",
		Description: `Read a file from a sandbox's working directory. Text files come back as text (long ones truncated with a note), PNG, JPEG and GIF files as images; other binary files are described, to be inspected with run_python.`,
		Annotations: &sdk.ToolAnnotations{Title: "Read a file", ReadOnlyHint: true, OpenWorldHint: ptr(false)},
	}, s.readFile)
	addTool(s, &sdk.Tool{
		Name:        "write_file",
		Title:       "Write a file",
		Description: `Write a file into a sandbox's working directory, for code run with run_python or run_shell to use (for example a CSV to analyse). Creates missing directories and replaces an existing file. Use encoding base64 for binary content.`,
		Annotations: &sdk.ToolAnnotations{Title: "Write a file", OpenWorldHint: ptr(false), DestructiveHint: ptr(true), IdempotentHint: true},
	}, s.writeFile)
	s.addLanguageTools()
	s.addPortTools()
}

// seconds converts a timeout the model gave, saturating: one too large
// for a Duration is the largest (refused as over the server's limit).
// addTool adds a tool, and the decoding of its arguments checkArguments
// does.
func addTool[In, Out any](s *server, t *sdk.Tool, h sdk.ToolHandlerFor[In, Out]) {
	s.decoders[t.Name] = func(args json.RawMessage) error {
		var in In
		return json.Unmarshal(args, &in)
	}
	sdk.AddTool(s.sdk, t, h)
}

// checkArguments answers a tool call whose arguments do not decode into
// the tool's input (not an object, a number out of range) with what is
// wrong in JSON's terms, before the SDK does in Go's ("cannot unmarshal
// ... into Go value of type ...").
func (s *server) checkArguments(next sdk.MethodHandler) sdk.MethodHandler {
	return func(ctx context.Context, method string, req sdk.Request) (sdk.Result, error) {
		if call, ok := req.(*sdk.CallToolRequest); ok && method == "tools/call" && call.Params != nil {
			args := call.Params.Arguments
			if decode := s.decoders[call.Params.Name]; decode != nil && len(args) > 0 && string(args) != "null" {
				if err := decode(args); err != nil {
					res := &sdk.CallToolResult{}
					res.SetError(fmt.Errorf("invalid arguments: %s", jsonerr.Message(err)))
					return res, nil
				}
			}
		}
		return next(ctx, method, req)
	}
}

// seconds is a tool's number of seconds as a Duration, a negative one
// (or NaN) refused here: a tool's zero timeout means the default, and a
// negative one must not pass for it.
func seconds(f float64) (time.Duration, error) {
	d := sandbox.Seconds(f)
	if d < 0 {
		return 0, fmt.Errorf("%w: a timeout must not be negative", sandbox.ErrInvalidSpec)
	}
	return d, nil
}

func (s *server) runPython(ctx context.Context, req *sdk.CallToolRequest, in runPythonInput) (*sdk.CallToolResult, any, error) {
	owner, err := s.owner(req)
	if err != nil {
		return nil, nil, toolError(s.log, err)
	}
	timeout, err := seconds(in.TimeoutS)
	if err != nil {
		return nil, nil, toolError(s.log, err)
	}
	if in.SandboxID == "" {
		limits := s.cfg.Limits
		if timeout > 0 {
			limits.Timeout = timeout
		}
		job := sandbox.OneShot{Spec: sandbox.Spec{Limits: limits}, Request: sandbox.ExecRequest{Code: in.Code}}
		res, err := s.svc.RunOnce(ctx, owner, job)
		if err != nil {
			return nil, nil, toolError(s.log, err)
		}
		return execContent(res, 0, s.cfg.MaxText), nil, nil
	}
	res, err := s.svc.Execute(ctx, owner, in.SandboxID, sandbox.ExecRequest{Code: in.Code, Timeout: timeout}, nil)
	if err != nil {
		return nil, nil, toolError(s.log, err)
	}
	return execContent(res.Result, res.ExecutionCount, s.cfg.MaxText), nil, nil
}

func (s *server) runShell(ctx context.Context, req *sdk.CallToolRequest, in runShellInput) (*sdk.CallToolResult, any, error) {
	owner, err := s.owner(req)
	if err != nil {
		return nil, nil, toolError(s.log, err)
	}
	timeout, err := seconds(in.TimeoutS)
	if err != nil {
		return nil, nil, toolError(s.log, err)
	}
	if strings.TrimSpace(in.Command) == "" {
		return nil, nil, toolError(s.log, fmt.Errorf("%w: command is empty", sandbox.ErrInvalidSpec))
	}
	if max := s.svc.MaxExecTimeout(); timeout > max {
		return nil, nil, toolError(s.log, fmt.Errorf("%w: timeout_s is over the server's limit of %v", sandbox.ErrInvalidSpec, max))
	}
	id := in.SandboxID
	if id == "" {
		// A sandbox for this command only, as run_python does without an
		// id. Its idle timeout is a backstop should the delete be missed.
		info, err := s.svc.Create(ctx, service.CreateRequest{Owner: owner, Idle: timeout + time.Minute, Limits: s.cfg.Limits})
		if err != nil {
			return nil, nil, toolError(s.log, err)
		}
		id = info.ID
		defer s.svc.Delete(owner, id)
	}
	res, err := s.svc.Command(ctx, owner, id, service.CommandRequest{Cmd: in.Command, Timeout: timeout}, nil)
	if err != nil {
		return nil, nil, toolError(s.log, err)
	}
	return commandContent(res, s.cfg.MaxText), nil, nil
}

func (s *server) createSandbox(ctx context.Context, req *sdk.CallToolRequest, in createSandboxInput) (*sdk.CallToolResult, createSandboxOutput, error) {
	owner, err := s.owner(req)
	if err != nil {
		return nil, createSandboxOutput{}, toolError(s.log, err)
	}
	idle, err := seconds(in.IdleTimeoutS)
	if err != nil {
		return nil, createSandboxOutput{}, toolError(s.log, err)
	}
	// AutoResume: a model that paused a sandbox goes on with it by
	// using it (pause_sandbox says so). Pausable: made so that it can be
	// (a classic sandbox on the native backend: slower to create, once a
	// conversation).
	create := service.CreateRequest{Owner: owner, Idle: idle, Limits: s.cfg.Limits,
		Metadata: map[string]string{"created_by": "mcp"}, AutoResume: true, Pausable: true, Template: in.Template}
	if in.FromSnapshot != "" {
		// The snapshot's limits and environment.
		create.Limits, create.FromSnapshot = sandbox.Limits{}, in.FromSnapshot
	}
	info, err := s.svc.Create(ctx, create)
	if err != nil {
		return nil, createSandboxOutput{}, toolError(s.log, err)
	}
	s.track(req.Session, owner, info.ID)
	out := createSandboxOutput{SandboxID: info.ID, ExpiresAt: info.ExpiresAt, IdleTimeoutS: info.IdleTimeoutS}
	msg := fmt.Sprintf("sandbox_id: %s\nPass it to run_python, run_shell and the file tools. It closes after %g seconds without use, "+
		"when this session ends, or with close_sandbox.", info.ID, info.IdleTimeoutS)
	return &sdk.CallToolResult{Content: []sdk.Content{text(msg)}}, out, nil
}

func (s *server) closeSandbox(ctx context.Context, req *sdk.CallToolRequest, in sandboxInput) (*sdk.CallToolResult, any, error) {
	owner, err := s.owner(req)
	if err != nil {
		return nil, nil, toolError(s.log, err)
	}
	if err := s.svc.Delete(owner, in.SandboxID); err != nil {
		return nil, nil, toolError(s.log, err)
	}
	s.untrack(req.Session, in.SandboxID)
	return &sdk.CallToolResult{Content: []sdk.Content{text("closed " + in.SandboxID)}}, nil, nil
}

func (s *server) pauseSandbox(ctx context.Context, req *sdk.CallToolRequest, in sandboxInput) (*sdk.CallToolResult, any, error) {
	owner, err := s.owner(req)
	if err != nil {
		return nil, nil, toolError(s.log, err)
	}
	if _, err := s.svc.Pause(ctx, owner, in.SandboxID); err != nil && !errors.Is(err, service.ErrAlreadyPaused) {
		return nil, nil, toolError(s.log, err)
	}
	return &sdk.CallToolResult{Content: []sdk.Content{text("paused " + in.SandboxID)}}, nil, nil
}

func (s *server) forkSandbox(ctx context.Context, req *sdk.CallToolRequest, in forkSandboxInput) (*sdk.CallToolResult, any, error) {
	owner, err := s.owner(req)
	if err != nil {
		return nil, nil, toolError(s.log, err)
	}
	n := in.Count
	if n == 0 {
		n = 1
	}
	if n < 1 || n > 8 {
		return nil, nil, toolError(s.log, fmt.Errorf("%w: count is 1 to 8, not %d", sandbox.ErrInvalidSpec, in.Count))
	}
	copies, err := s.svc.Fork(ctx, owner, in.SandboxID, n, sandbox.ForkOptions{})
	if err != nil {
		return nil, nil, toolError(s.log, err)
	}
	ids := make([]string, len(copies))
	for i, c := range copies {
		s.track(req.Session, owner, c.ID)
		ids[i] = c.ID
	}
	msg := fmt.Sprintf("copies of %s (sandbox_ids): %s\nEach has its variables, imports and files as they are now.",
		in.SandboxID, strings.Join(ids, ", "))
	return &sdk.CallToolResult{Content: []sdk.Content{text(msg)}}, map[string]any{"sandbox_ids": ids}, nil
}

func (s *server) snapshotSandbox(ctx context.Context, req *sdk.CallToolRequest, in snapshotSandboxInput) (*sdk.CallToolResult, any, error) {
	owner, err := s.owner(req)
	if err != nil {
		return nil, nil, toolError(s.log, err)
	}
	snap, err := s.svc.Snapshot(ctx, owner, in.SandboxID, in.Name)
	if err != nil {
		return nil, nil, toolError(s.log, err)
	}
	msg := fmt.Sprintf("snapshot_id: %s\nPass it as from_snapshot to create_sandbox to start a sandbox from this point.", snap.ID)
	out := map[string]any{"snapshot_id": snap.ID}
	if snap.Name != "" {
		msg += fmt.Sprintf("\nIts name, %s, does too (the newest snapshot of that name).", snap.Name)
		out["name"] = snap.Name
	}
	return &sdk.CallToolResult{Content: []sdk.Content{text(msg)}}, out, nil
}

func (s *server) resumeSandbox(ctx context.Context, req *sdk.CallToolRequest, in sandboxInput) (*sdk.CallToolResult, any, error) {
	owner, err := s.owner(req)
	if err != nil {
		return nil, nil, toolError(s.log, err)
	}
	if _, err := s.svc.Resume(ctx, owner, in.SandboxID); err != nil && !errors.Is(err, service.ErrNotPaused) {
		return nil, nil, toolError(s.log, err)
	}
	return &sdk.CallToolResult{Content: []sdk.Content{text("resumed " + in.SandboxID)}}, nil, nil
}

func (s *server) listFiles(ctx context.Context, req *sdk.CallToolRequest, in listFilesInput) (*sdk.CallToolResult, any, error) {
	owner, err := s.owner(req)
	if err != nil {
		return nil, nil, toolError(s.log, err)
	}
	dir, depth := in.Path, in.Depth
	if dir == "" {
		dir = "."
	}
	if depth == 0 {
		depth = 3
	}
	if depth < 1 || depth > 10 {
		return nil, nil, toolError(s.log, fmt.Errorf("%w: depth must be from 1 to 10", sandbox.ErrInvalidSpec))
	}
	ws, done, err := s.svc.Workspace(owner, in.SandboxID)
	if err != nil {
		return nil, nil, toolError(s.log, err)
	}
	defer done()
	entries, err := ws.ReadDir(dir, depth)
	if err != nil {
		return nil, nil, toolError(s.log, err)
	}
	if len(entries) == 0 {
		return &sdk.CallToolResult{Content: []sdk.Content{text("(empty directory)")}}, nil, nil
	}
	var b strings.Builder
	for _, e := range entries {
		switch e.Type {
		case "dir":
			fmt.Fprintf(&b, "%s/\n", e.Path)
		case "file":
			fmt.Fprintf(&b, "%s  (%d bytes)\n", e.Path, e.Size)
		default:
			fmt.Fprintf(&b, "%s  (%s)\n", e.Path, e.Type)
		}
	}
	return &sdk.CallToolResult{Content: []sdk.Content{text(truncate(b.String(), s.cfg.MaxText, "the listing"))}}, nil, nil
}

func (s *server) readFile(ctx context.Context, req *sdk.CallToolRequest, in readFileInput) (*sdk.CallToolResult, any, error) {
	owner, err := s.owner(req)
	if err != nil {
		return nil, nil, toolError(s.log, err)
	}
	ws, done, err := s.svc.Workspace(owner, in.SandboxID)
	if err != nil {
		return nil, nil, toolError(s.log, err)
	}
	defer done()
	f, fi, err := ws.OpenFile(in.Path)
	if err != nil {
		return nil, nil, toolError(s.log, err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, min(fi.Size, maxReadFile)))
	if err != nil {
		return nil, nil, toolError(s.log, err)
	}
	return fileContent(in.Path, data, fi.Size, s.cfg.MaxText), nil, nil
}

func (s *server) writeFile(ctx context.Context, req *sdk.CallToolRequest, in writeFileInput) (*sdk.CallToolResult, any, error) {
	owner, err := s.owner(req)
	if err != nil {
		return nil, nil, toolError(s.log, err)
	}
	var r io.Reader = strings.NewReader(in.Content)
	switch in.Encoding {
	case "", "text":
	case "base64":
		data, err := base64.StdEncoding.DecodeString(strings.TrimSpace(in.Content))
		if err != nil {
			return nil, nil, toolError(s.log, fmt.Errorf("%w: content is not valid base64: %v", sandbox.ErrInvalidSpec, err))
		}
		r = bytes.NewReader(data)
	default:
		return nil, nil, toolError(s.log, fmt.Errorf("%w: encoding must be text or base64", sandbox.ErrInvalidSpec))
	}
	b, err := s.svc.Get(owner, in.SandboxID)
	if err != nil {
		return nil, nil, toolError(s.log, err)
	}
	ws, done, err := s.svc.Workspace(owner, in.SandboxID)
	if err != nil {
		return nil, nil, toolError(s.log, err)
	}
	defer done()
	if err := ws.WriteFile(in.Path, r, b.Limits().Disk); err != nil {
		return nil, nil, toolError(s.log, err)
	}
	fi, err := ws.Stat(in.Path)
	if err != nil {
		return nil, nil, toolError(s.log, err)
	}
	return &sdk.CallToolResult{Content: []sdk.Content{text(fmt.Sprintf("wrote %s (%d bytes)", fi.Path, fi.Size))}}, nil, nil
}
