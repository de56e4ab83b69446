package mcp_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/vivarium-sandbox/vivarium/internal/mcp"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/service"
	"github.com/vivarium-sandbox/vivarium/internal/workspace"
)

// fakeBackend makes sandboxes without isolation, for fuzzing the tools'
// decoding and error mapping without root: a real confined workspace in a
// temporary directory; Execute echoes the code; commands cannot start.
type fakeBackend struct{ dir string }

func (fakeBackend) Name() string { return "fake" }

func (b fakeBackend) Create(ctx context.Context, spec sandbox.Spec) (sandbox.Sandbox, error) {
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	d, err := os.MkdirTemp(b.dir, "ws")
	if err != nil {
		return nil, err
	}
	ws, err := workspace.Open(d, os.Getuid(), os.Getgid())
	if err != nil {
		return nil, err
	}
	return &fakeSandbox{ws: ws}, nil
}

type fakeSandbox struct{ ws *workspace.Dir }

func (s *fakeSandbox) ID() string { return "fake" }
func (s *fakeSandbox) Execute(ctx context.Context, req sandbox.ExecRequest, sink sandbox.Sink) (*sandbox.Result, error) {
	return &sandbox.Result{Status: sandbox.StatusOK, Stdout: req.Code, Results: []sandbox.Output{}}, nil
}
func (s *fakeSandbox) Interrupt() error              { return nil }
func (s *fakeSandbox) Restart(context.Context) error { return nil }
func (s *fakeSandbox) Start(_ context.Context, c sandbox.Command) (sandbox.Process, error) {
	return nil, fmt.Errorf("start %s: chdir /workspace: no such file or directory", c.Argv[0])
}
func (s *fakeSandbox) Workspace() sandbox.Workspace { return s.ws }
func (s *fakeSandbox) Close() error                 { return s.ws.Close() }

var fuzzTools = []string{"run_python", "run_shell", "run_code", "create_sandbox", "close_sandbox", "pause_sandbox", "resume_sandbox", "list_files", "read_file", "write_file"}

// FuzzTools calls every tool with arbitrary arguments: the server never
// panics, a bad argument is the model's error (never "internal error"),
// and no answer shows a Go error chain or a host path.
func FuzzTools(f *testing.F) {
	for i := range fuzzTools {
		for _, args := range []string{`{}`, `null`, `[]`, `{"x":1}`, `{"code":1}`, `{"code":"1","timeout_s":-1}`,
			`{"code":"1","timeout_s":1e300}`, `{"command":"true","timeout_s":1e300}`, `{"command":"a\u0000b"}`, `{"command":""}`,
			`{"idle_timeout_s":1e300}`, `{"idle_timeout_s":-5}`, `{"sandbox_id":"sb_nope"}`, `{"sandbox_id":"ID","path":"../x"}`,
			`{"sandbox_id":"ID","path":"/etc/passwd"}`, `{"sandbox_id":"ID","path":"a\u0000"}`, `{"sandbox_id":"ID","depth":1e9}`,
			`{"sandbox_id":"ID","depth":-1}`, `{"sandbox_id":"ID","path":"x","content":"!!","encoding":"base64"}`,
			`{"sandbox_id":"ID","path":"x","content":"a","encoding":"rot13"}`, `{"sandbox_id":"ID","path":"` + strings.Repeat("a", 5000) + `"}`,
			`{"sandbox_id":"ID","code":"1"}`, `{"sandbox_id":"ID","command":"ls","timeout_s":5}`} {
			f.Add(uint8(i), args)
		}
	}
	svc := service.New(service.Config{Backend: fakeBackend{f.TempDir()}, MaxPerOwner: 1000})
	f.Cleanup(func() { svc.Close() })
	st, ct := sdk.NewInMemoryTransports()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mcp.ServeTransport(ctx, mcp.Config{Service: svc}, "owner", st) }()
	cs, err := sdk.NewClient(&sdk.Implementation{Name: "fuzz", Version: "1"}, nil).Connect(ctx, ct, nil)
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() {
		cs.Close()
		cancel()
		<-done
	})
	info, err := svc.Create(ctx, service.CreateRequest{Owner: "owner"})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, tool uint8, args string) {
		name := fuzzTools[int(tool)%len(fuzzTools)]
		if name == "close_sandbox" && strings.Contains(args, "ID") {
			return // the sandbox the other calls use
		}
		args = strings.ReplaceAll(args, "ID", info.ID)
		var raw json.RawMessage
		if json.Unmarshal([]byte(args), &raw) != nil {
			return // not JSON: the client library refuses to send it
		}
		res, err := cs.CallTool(ctx, &sdk.CallToolParams{Name: name, Arguments: raw})
		var msg string
		switch {
		case err != nil:
			msg = err.Error()
		case res.IsError:
			for _, c := range res.Content {
				if tc, ok := c.(*sdk.TextContent); ok {
					msg += tc.Text
				}
			}
			if strings.Contains(msg, "internal error") {
				t.Errorf("%s %s: %s", name, args, msg)
			}
		}
		msg = strings.ReplaceAll(msg, args, "")
		for _, leak := range []string{"goroutine ", "panic", "/tmp/", ".go:", "json: ", "Go struct", "Go value"} {
			if strings.Contains(msg, leak) {
				t.Errorf("%s %.200s: the answer shows %q: %.300s", name, args, leak, msg)
			}
		}
	})
}
