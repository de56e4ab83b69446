package core

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/runner"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

// fakeRunner is a runner played by a goroutine: it answers each "execute"
// by running the code as a tiny script of its own, writing events on a
// pipe the core reads, as a real runner writes them on its event pipe.
type fakeRunner struct {
	c      *Core
	r      *Runner
	reqs   chan runner.Request
	events *io.PipeWriter
	acks   chan struct{}
	out    *Output
	once   sync.Once
	hung   chan struct{} // closed by HangUp
}

func (f *fakeRunner) Send(req runner.Request) error {
	if req.Type == "ack" {
		return nil
	}
	select {
	case f.reqs <- req:
		return nil
	case <-f.hung:
		return errors.New("hung up")
	case <-f.r.Exited():
		return errors.New("runner gone")
	}
}
func (f *fakeRunner) Ack() {
	select {
	case f.acks <- struct{}{}:
	default:
	}
}
func (f *fakeRunner) HangUp() { f.once.Do(func() { close(f.hung) }) }

func (f *fakeRunner) event(v map[string]any) { runner.WriteFrame(f.events, v) }

// run plays the runner: the code is lines of "print X", "result N",
// "raise", "sleep", "exit N", "garbage".
func (f *fakeRunner) run() {
	f.event(map[string]any{"type": "ready"})
	for {
		var req runner.Request
		select {
		case req = <-f.reqs:
		case <-f.hung:
			return
		}
		if req.Type != "execute" {
			continue
		}
		code := 0
		for _, line := range strings.Split(req.Code, "\n") {
			cmd, arg, _ := strings.Cut(line, " ")
			switch cmd {
			case "print":
				f.out.Write([]byte(arg))
			case "result":
				var n int
				fmt.Sscan(arg, &n)
				for i := 0; i < n; i++ {
					f.event(map[string]any{"type": "result", "data": map[string]any{"text/plain": fmt.Sprint(i)}})
					<-f.acks
				}
			case "raise":
				f.event(map[string]any{"type": "error", "name": "ValueError", "value": arg})
			case "sleep":
				select {} // until killed: the test's limit ends it
			case "exit":
				fmt.Sscan(arg, &code)
				f.c.RunnerExited(f.r, Exit{Exited: true, Code: code})
				f.events.Close()
				return
			case "garbage":
				f.events.Write([]byte{0, 0, 0, 3, '{', 'x', '}'})
			}
		}
		f.event(map[string]any{"type": "done", "exit_code": code})
	}
}

// fakeDriver starts fakeRunners and counts what the core asks of it.
type fakeDriver struct {
	c        *Core
	dead     chan struct{}
	restarts int
	cpu      time.Duration
}

func (d *fakeDriver) newRunner() {
	pr, pw := io.Pipe()
	f := &fakeRunner{c: d.c, reqs: make(chan runner.Request), events: pw, acks: make(chan struct{}, 1), out: d.c.Stdout,
		hung: make(chan struct{})}
	f.r = NewRunner(f)
	go d.c.ReadEvents(f.r, pr)
	d.c.SetRunner(f.r)
	go f.run()
}

func (d *fakeDriver) Prepare(context.Context) error { return nil }
func (d *fakeDriver) Closed() bool                  { return isClosed(d.dead) }
func (d *fakeDriver) Dead() <-chan struct{}         { return d.dead }
func (d *fakeDriver) Restart(context.Context) error {
	d.restarts++
	if r := d.c.Runner(); r != nil {
		d.c.RunnerExited(r, Exit{Exited: true, Signal: int(syscall.SIGKILL), Code: 137})
	}
	d.newRunner()
	return nil
}
func (d *fakeDriver) Interrupt(*Runner) error                   { return nil }
func (d *fakeDriver) Usage() Usage                              { return Usage{CPU: d.cpu} }
func (d *fakeDriver) CPUWatch() bool                            { return false }
func (d *fakeDriver) Kill()                                     {}
func (d *fakeDriver) SyncOutput()                               {}
func (d *fakeDriver) Executed(context.Context, *sandbox.Result) {}
func (d *fakeDriver) Finish(r *Runner, why sandbox.Status) Exit {
	<-r.Exited()
	return d.c.ExitOf(r)
}

func newFake(t *testing.T, spec sandbox.Spec) (*Core, *fakeDriver) {
	t.Helper()
	spec.Limits = spec.Limits.WithDefaults()
	d := &fakeDriver{dead: make(chan struct{})}
	d.c = New(d, Config{Spec: spec, Contexts: runner.NewContexts("/workspace")})
	d.newRunner()
	if err := d.c.AwaitRunner(context.Background()); err != nil {
		t.Fatal(err)
	}
	return d.c, d
}

func TestExecuteCollectsOutputResultsAndErrors(t *testing.T) {
	c, _ := newFake(t, sandbox.Spec{})
	res, err := c.Execute(context.Background(), sandbox.ExecRequest{Code: "print hi\nresult 2\nraise bad"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.Stdout != "hi" || len(res.Results) != 2 || res.Error == nil || res.Error.Value != "bad" ||
		res.Status != sandbox.StatusError {
		t.Fatalf("result: %+v", res)
	}
	res, err = c.Execute(context.Background(), sandbox.ExecRequest{Code: "print ok"}, nil)
	if err != nil || res.Status != sandbox.StatusOK || res.Stdout != "ok" || res.StateLost {
		t.Fatalf("second execution: %+v, %v", res, err)
	}
}

func TestOutputIsCappedAndResultsDroppedPastTheirLimit(t *testing.T) {
	c, _ := newFake(t, sandbox.Spec{Limits: sandbox.Limits{MaxOutput: 4}})
	res, err := c.Execute(context.Background(), sandbox.ExecRequest{Code: "print 123456789"}, nil)
	if err != nil || res.Stdout != "1234" || !res.StdoutTruncated {
		t.Fatalf("capped output: %+v, %v", res, err)
	}
	res, err = c.Execute(context.Background(), sandbox.ExecRequest{Code: fmt.Sprintf("result %d", maxResults+5)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	last := res.Results[len(res.Results)-1]
	if len(res.Results) != maxResults+1 || !strings.Contains(last.Text, "5 more results dropped") {
		t.Fatalf("%d results, last %q", len(res.Results), last.Text)
	}
}

func TestTimeoutRestartsAndSaysStateLost(t *testing.T) {
	c, d := newFake(t, sandbox.Spec{})
	res, err := c.Execute(context.Background(), sandbox.ExecRequest{Code: "sleep", Timeout: 50 * time.Millisecond}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != sandbox.StatusTimeout || res.ExitCode != sandbox.ExitTimeout || !res.StateLost || d.restarts != 1 {
		t.Fatalf("timeout: %+v, %d restarts", res, d.restarts)
	}
	res, err = c.Execute(context.Background(), sandbox.ExecRequest{Code: "print after"}, nil)
	if err != nil || res.Status != sandbox.StatusOK || res.Stdout != "after" || res.StateLost {
		t.Fatalf("after the timeout: %+v, %v", res, err)
	}
}

func TestBusyWhileAnExecutionRuns(t *testing.T) {
	c, _ := newFake(t, sandbox.Spec{})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan *sandbox.Result)
	go func() {
		res, _ := c.Execute(ctx, sandbox.ExecRequest{Code: "sleep"}, nil)
		done <- res
	}()
	for !c.Busy() {
		time.Sleep(time.Millisecond)
	}
	if _, err := c.Execute(context.Background(), sandbox.ExecRequest{Code: "print x"}, nil); !errors.Is(err, sandbox.ErrBusy) {
		t.Fatalf("second execution: %v, want ErrBusy", err)
	}
	if err := c.Restart(context.Background()); !errors.Is(err, sandbox.ErrBusy) {
		t.Fatalf("restart: %v, want ErrBusy", err)
	}
	cancel()
	if res := <-done; res.Status != sandbox.StatusKilled {
		t.Fatalf("cancelled: %+v", res)
	}
}

func TestRunnerThatDiesIsReplacedAndTheResultSaysSo(t *testing.T) {
	c, _ := newFake(t, sandbox.Spec{})
	res, err := c.Execute(context.Background(), sandbox.ExecRequest{Code: "exit 3"}, nil)
	if err != nil || res.Status != sandbox.StatusError || res.ExitCode != 3 || !res.StateLost {
		t.Fatalf("runner exit: %+v, %v", res, err)
	}
	res, err = c.Execute(context.Background(), sandbox.ExecRequest{Code: "print back"}, nil)
	if err != nil || res.Stdout != "back" {
		t.Fatalf("after: %+v, %v", res, err)
	}
}

func TestMalformedEventsAreAProtocolError(t *testing.T) {
	c, _ := newFake(t, sandbox.Spec{})
	res, err := c.Execute(context.Background(), sandbox.ExecRequest{Code: "garbage", Timeout: time.Second}, nil)
	if err != nil {
		t.Fatal(err)
	}
	// The runner's "done" is never parsed: the limit ends it, and the
	// result says results were lost.
	if res.Status != sandbox.StatusTimeout || !res.StateLost {
		t.Fatalf("broken stream: %+v", res)
	}
}

func TestOneShotRunsOneExecution(t *testing.T) {
	c, _ := newFake(t, sandbox.Spec{OneShot: true})
	res, err := c.Execute(context.Background(), sandbox.ExecRequest{Code: "print once\nexit 0"}, nil)
	if err != nil || res.Status != sandbox.StatusOK || res.Stdout != "once" {
		t.Fatalf("one-shot: %+v, %v", res, err)
	}
	if _, err := c.Execute(context.Background(), sandbox.ExecRequest{Code: "print twice"}, nil); !errors.Is(err, sandbox.ErrClosed) {
		t.Fatalf("second one-shot execution: %v", err)
	}
	if err := c.Restart(context.Background()); !errors.Is(err, sandbox.ErrUnsupported) {
		t.Fatalf("one-shot restart: %v", err)
	}
}

func TestCommandsStartExitAndGo(t *testing.T) {
	c, _ := newFake(t, sandbox.Spec{})
	pr, pw := io.Pipe()
	start := func(ctx context.Context, answer bool) (sandbox.Process, error) {
		return c.StartCommand(ctx, sandbox.Command{Argv: []string{"x"}}, map[string]string{"A": "1"},
			func(id uint64, env map[string]string) error {
				if env["A"] != "1" {
					t.Errorf("env %v", env)
				}
				if answer {
					go c.Started(id, Spawned{PID: 42, Stdin: pw, Stdout: pr, Stderr: io.NopCloser(strings.NewReader("")),
						Signal: func(syscall.Signal) error { return nil }})
				}
				return nil
			})
	}
	p, err := start(context.Background(), true)
	if err != nil || p.PID() != 42 {
		t.Fatalf("start: %v, %v", p, err)
	}
	c.CommandExited(1, 7)
	if p.ExitCode() != 7 {
		t.Fatalf("exit code %d", p.ExitCode())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := start(ctx, false); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("unanswered start: %v", err)
	}
	// A start waiting when the sandbox's processes go fails at once.
	errc := make(chan error)
	go func() { _, err := start(context.Background(), false); errc <- err }()
	for waiting := 0; waiting == 0; time.Sleep(time.Millisecond) {
		c.cmds.mu.Lock()
		waiting = len(c.cmds.starting)
		c.cmds.mu.Unlock()
	}
	c.CommandsGone()
	if err := <-errc; !errors.Is(err, sandbox.ErrClosed) {
		t.Fatalf("start when the processes went: %v", err)
	}
	if _, err := c.StartCommand(context.Background(), sandbox.Command{}, nil, nil); !errors.Is(err, sandbox.ErrInvalidSpec) {
		t.Fatalf("empty command: %v", err)
	}
}
