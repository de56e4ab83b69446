package mcp

import (
	"context"
	"fmt"
	"strings"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/vivarium-sandbox/vivarium/internal/runner"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

// runCodeInput is run_code's: code in another language than Python, run
// in that language's default code context (internal/runner/kernels.py).
type runCodeInput struct {
	Code      string  `json:"code" jsonschema:"Source code to run. The value of the last expression, if any, is returned like in a notebook cell; print anything else you want to see (console.log, print, cat, System.out.println)."`
	Language  string  `json:"language" jsonschema:"javascript (Node), typescript (types are stripped, not checked), r, java (JShell) or bash."`
	SandboxID string  `json:"sandbox_id,omitempty" jsonschema:"Run in this sandbox (from create_sandbox), keeping this language's variables and the files. Leave it out to run in a fresh sandbox that is destroyed afterwards."`
	TimeoutS  float64 `json:"timeout_s,omitempty" jsonschema:"Wall-clock limit for this code in seconds. The default is 30; a Java sandbox's first call takes a few seconds to start the JVM."`
}

func (s *server) addLanguageTools() {
	addTool(s, &sdk.Tool{
		Name:  "run_code",
		Title: "Run JavaScript, TypeScript, R, Java or bash",
		Description: `Run code in another language than Python in an isolated Linux sandbox: javascript (Node), typescript, r, java (JShell) or bash, as far as the server has them installed. Returns what it printed, the value of its last expression (as in a notebook cell), R's plots as PNG images, and the error if it failed. No network access.
Without sandbox_id the code runs in a fresh sandbox that is destroyed afterwards. With the sandbox_id of create_sandbox, each language keeps its own variables between calls (beside run_python's Python state), and all share the files.`,
		Annotations: &sdk.ToolAnnotations{Title: "Run code", OpenWorldHint: ptr(false), DestructiveHint: ptr(false)},
	}, s.runCode)
}

func (s *server) runCode(ctx context.Context, req *sdk.CallToolRequest, in runCodeInput) (*sdk.CallToolResult, any, error) {
	owner, err := s.owner(req)
	if err != nil {
		return nil, nil, toolError(s.log, err)
	}
	timeout, err := seconds(in.TimeoutS)
	if err != nil {
		return nil, nil, toolError(s.log, err)
	}
	lang, err := runner.CanonicalLanguage(in.Language)
	if err != nil || lang == "python" {
		return nil, nil, toolError(s.log, fmt.Errorf("%w: language must be one of %s (use run_python for Python)",
			sandbox.ErrInvalidSpec, strings.Join(runner.Languages[1:], ", ")))
	}
	if in.SandboxID == "" {
		limits := s.cfg.Limits
		if timeout > 0 {
			limits.Timeout = timeout
		}
		job := sandbox.OneShot{Spec: sandbox.Spec{Limits: limits}, Request: sandbox.ExecRequest{Code: in.Code, Context: lang}}
		res, err := s.svc.RunOnce(ctx, owner, job)
		if err != nil {
			return nil, nil, toolError(s.log, err)
		}
		return execContent(res, 0, s.cfg.MaxText), nil, nil
	}
	res, err := s.svc.Execute(ctx, owner, in.SandboxID, sandbox.ExecRequest{Code: in.Code, Context: lang, Timeout: timeout}, nil)
	if err != nil {
		return nil, nil, toolError(s.log, err)
	}
	return execContent(res.Result, res.ExecutionCount, s.cfg.MaxText), nil, nil
}
