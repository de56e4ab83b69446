package e2b

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/service"
	"github.com/vivarium-sandbox/vivarium/internal/workspace"
)

// A fake backend, so that the adapter's decoding, framing and mapping are
// tested without root: its sandboxes keep files in a temporary directory
// (through the real confined workspace), answer executions from a script,
// and "run" commands by printing their argv.

type fakeBackend struct {
	dir string // each sandbox's workspace is a directory in it
}

func (fakeBackend) Name() string { return "fake" }

func (b fakeBackend) Create(ctx context.Context, spec sandbox.Spec) (sandbox.Sandbox, error) {
	dir, err := os.MkdirTemp(b.dir, "ws")
	if err != nil {
		return nil, err
	}
	ws, err := workspace.Open(dir, -1, -1)
	if err != nil {
		return nil, err
	}
	return &fakeSandbox{ws: ws, dir: dir, env: spec.Env}, nil
}

type fakeSandbox struct {
	ws  *workspace.Dir
	dir string // the workspace on the host
	env map[string]string

	mu     sync.Mutex
	closed bool
}

func (s *fakeSandbox) ID() string { return "fake" }

// Execute plays a script: the code's lines are commands.
//
//	out TEXT      prints TEXT on stdout
//	err TEXT      prints TEXT on stderr
//	result TEXT   a main result with TEXT and HTML
//	raise NAME    an exception
//	env NAME      prints the variable of this execution
//	sleep MS      waits
func (s *fakeSandbox) Execute(ctx context.Context, req sandbox.ExecRequest, sink sandbox.Sink) (*sandbox.Result, error) {
	res := &sandbox.Result{Status: sandbox.StatusOK, Results: []sandbox.Output{}}
	for _, line := range strings.Split(req.Code, "\n") {
		verb, arg, _ := strings.Cut(line, " ")
		switch verb {
		case "out", "env":
			if verb == "env" {
				arg = req.Env[arg]
			}
			res.Stdout += arg + "\n"
			if sink != nil {
				sink.Stdout([]byte(arg + "\n"))
			}
		case "err":
			res.Stderr += arg + "\n"
			if sink != nil {
				sink.Stderr([]byte(arg + "\n"))
			}
		case "result":
			o := sandbox.Output{Text: arg, HTML: "<b>" + arg + "</b>", JSON: []byte(`{"a":1}`), IsMainResult: true}
			res.Results = append(res.Results, o)
			if rs, ok := sink.(sandbox.ResultSink); ok {
				rs.Result(o)
			}
		case "sleep":
			var ms int
			fmt.Sscan(arg, &ms)
			select { // at most a second: fuzzed code asks for anything
			case <-time.After(min(time.Duration(ms)*time.Millisecond, time.Second)):
			case <-ctx.Done():
			}
		case "raise":
			res.Status, res.ExitCode = sandbox.StatusError, 1
			res.Error = &sandbox.Error{Name: arg, Value: "raised", Traceback: "Traceback ...\n" + arg + ": raised\n"}
		}
	}
	return res, nil
}

func (s *fakeSandbox) Interrupt() error                  { return nil }
func (s *fakeSandbox) Restart(ctx context.Context) error { return nil }
func (s *fakeSandbox) Workspace() sandbox.Workspace      { return s.ws }

func (s *fakeSandbox) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.closed {
		s.closed = true
		s.ws.Close()
	}
	return nil
}

// Start prints the command's argv and its environment's FOO, and exits
// with the status its first argument after -c names ("exit N").
func (s *fakeSandbox) Start(ctx context.Context, c sandbox.Command) (sandbox.Process, error) {
	if c.Dir == "/missing" {
		return nil, fmt.Errorf("start %s: chdir %s: no such file or directory", c.Argv[0], c.Dir)
	}
	if c.Terminal != nil {
		return nil, fmt.Errorf("%w: the fake backend has no terminals (asked for %dx%d)", sandbox.ErrUnsupported,
			c.Terminal.Rows, c.Terminal.Cols)
	}
	p := newFakeProcess()
	go func() {
		foo := s.env["FOO"] // the sandbox's environment, then the command's
		if v, ok := c.Env["FOO"]; ok {
			foo = v
		}
		fmt.Fprintf(p.outW, "argv=%q FOO=%s dir=%s\n", c.Argv, foo, c.Dir)
		code := 0
		if last := c.Argv[len(c.Argv)-1]; strings.HasPrefix(last, "exit ") {
			fmt.Sscan(strings.TrimPrefix(last, "exit "), &code)
			fmt.Fprintln(p.errW, "exiting", code)
		}
		if strings.HasSuffix(c.Argv[len(c.Argv)-1], "sleep") {
			select {
			case <-p.killed:
				code = 128 + int(syscall.SIGKILL)
			case <-time.After(10 * time.Second):
			}
		}
		p.outW.Close()
		p.errW.Close()
		p.code = code
		close(p.done)
	}()
	return p, nil
}

type fakeProcess struct {
	outR, errR *os.File
	outW, errW *os.File
	in         io.WriteCloser
	done       chan struct{}
	killed     chan struct{}
	killOnce   sync.Once
	code       int
}

func newFakeProcess() *fakeProcess {
	p := &fakeProcess{done: make(chan struct{}), killed: make(chan struct{})}
	p.outR, p.outW, _ = os.Pipe()
	p.errR, p.errW, _ = os.Pipe()
	_, w, _ := os.Pipe()
	p.in = w
	return p
}

func (p *fakeProcess) PID() int              { return 42 }
func (p *fakeProcess) Stdin() io.WriteCloser { return p.in }
func (p *fakeProcess) Stdout() io.ReadCloser { return p.outR }
func (p *fakeProcess) Stderr() io.ReadCloser { return p.errR }
func (p *fakeProcess) Done() <-chan struct{} { return p.done }
func (p *fakeProcess) ExitCode() int         { <-p.done; return p.code }
func (p *fakeProcess) Signal(sig syscall.Signal) error {
	p.killOnce.Do(func() { close(p.killed) })
	return nil
}

// keys is an Authenticator of two keys.
type keys map[string]string

func (k keys) Owner(token string) (string, error) {
	if o, ok := k[token]; ok {
		return o, nil
	}
	return "", errors.New("unknown key")
}

// newTestServer serves the adapter over a fake backend at /e2b, with the
// keys "key-a" (owner a) and "key-b" (owner b).
func newTestServer(t testing.TB) (*httptest.Server, *service.Service) {
	t.Helper()
	svc := service.New(service.Config{Backend: fakeBackend{t.TempDir()}})
	t.Cleanup(func() { svc.Close() })
	h := New(Config{Service: svc, Auth: keys{"key-a": "a", "key-b": "b"}, Prefix: "/e2b"})
	ts := httptest.NewServer(h)
	t.Cleanup(ts.Close)
	return ts, svc
}
