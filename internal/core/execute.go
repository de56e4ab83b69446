package core

import (
	"context"
	"fmt"
	"syscall"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/runner"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

// execution collects the events of one Execute call.
type execution struct {
	runner       *Runner
	results      []sandbox.Output
	resultsBytes int
	dropped      int
	err          *sandbox.Error
	errSignal    int // what ended the context's process (runner.Event.Signal)
	exitCode     *int
	sawDone      bool          // the runner reported the end
	done         chan struct{} // closed at the end the runner reports
	resultSink   sandbox.ResultSink
}

// Execute implements sandbox.Sandbox.
func (c *Core) Execute(ctx context.Context, req sandbox.ExecRequest, sink sandbox.Sink) (*sandbox.Result, error) {
	if !c.execMu.TryLock() {
		return nil, sandbox.ErrBusy
	}
	defer c.execMu.Unlock()
	if c.d.Closed() {
		return nil, sandbox.ErrClosed
	}
	if c.oneShot && c.used {
		return nil, fmt.Errorf("%w: a one-shot sandbox runs one execution", sandbox.ErrClosed)
	}
	c.used = true
	if err := sandbox.ValidateEnv(req.Env); err != nil {
		return nil, err
	}
	limits := c.limits
	if req.Timeout > 0 {
		limits.Timeout = req.Timeout
	}
	if req.CPUTime > 0 {
		limits.CPUTime = req.CPUTime
	}
	filename := req.Filename
	if filename == "" {
		filename = "<cell>"
	}
	cc, err := c.lookupContext(req.Context)
	if err != nil {
		return nil, err
	}
	if err := c.d.Prepare(ctx); err != nil {
		return nil, err
	}

	// A runner that died since the last execution (os._exit from a
	// thread, an OOM kill) is replaced first; the result says so.
	c.mu.Lock()
	r, lost := c.runner, c.lost
	c.mu.Unlock()
	if !c.oneShot && (r == nil || isClosed(r.exited)) {
		if err := c.restart(ctx); err != nil {
			return nil, err
		}
		r = c.Runner()
	}
	if r == nil || !isClosed(r.ready) {
		return nil, fmt.Errorf("%w: the runner is not ready", sandbox.ErrClosed)
	}
	// Removed and restarted contexts are forgotten before any code runs.
	c.tellContexts(r)

	x := &execution{runner: r, done: make(chan struct{})}
	x.resultSink, _ = sink.(sandbox.ResultSink)
	doneCh := x.done
	var outSink, errSink func([]byte)
	if sink != nil {
		outSink, errSink = sink.Stdout, sink.Stderr
	}
	c.Stdout.Begin(limits.MaxOutput, outSink)
	c.Stderr.Begin(limits.MaxOutput, errSink)
	c.mu.Lock()
	c.cur = x
	c.lost = false
	c.mu.Unlock()

	u0 := c.d.Usage()
	start := time.Now()
	// Sent aside: a runner that does not read its requests must not hold
	// up the limits. A runner that cannot be reached is dead, which the
	// wait below sees.
	sent := make(chan error, 1)
	c.awaitInterrupts()
	go func() {
		sent <- r.conn.Send(runner.Request{Type: "execute", Code: req.Code, Filename: filename, Env: req.Env,
			Context: runner.ContextKey(cc.ID), Language: cc.Language, Cwd: cc.Cwd})
	}()

	// A one-shot execution ends when the runner's process exits (its exit
	// status is the program's); a persistent one at the runner's report.
	finished := doneCh
	if c.oneShot {
		finished = r.exited
	}
	dead := c.d.Dead()
	why, whyMsg := c.wait(ctx, finished, r.exited, dead, limits, u0.CPU)
	duration := time.Since(start)
	// What the code used is measured before anything is torn down or
	// replaced.
	u := c.d.Usage()

	o := sandbox.Outcome{Why: why, WhyMsg: whyMsg, Limits: limits, MemoryErrorIsLimit: c.memErrLimit}
	ended := func(e Exit) {
		o.Exited, o.Code, o.Signal, o.Crash, o.Closed, o.Dead = e.Exited, e.Code, e.Signal, e.Crash, e.Closed, true
	}
	stateLost := lost
	switch {
	case c.oneShot || isClosed(dead):
		ended(c.d.Finish(r, why))
	default:
		if why != "" || isClosed(r.exited) {
			// A limit fired or the runner died: a fresh runner replaces
			// it (and kills whatever else ran), files stay.
			if why == "" {
				ended(c.ExitOf(r))
			}
			stateLost = true
			if err := c.restart(context.WithoutCancel(ctx)); err != nil {
				c.d.Kill()
				select {
				case <-dead:
				case <-time.After(killTimeout):
				}
			}
		}
		c.d.SyncOutput()
	}
	<-sent

	c.mu.Lock()
	c.cur = nil
	o.Broken = r.broken
	o.RunnerCode = x.exitCode
	o.ContextSignal = x.errSignal
	c.lost = false
	c.mu.Unlock()
	stdout, outTrunc := c.Stdout.End()
	stderr, errTrunc := c.Stderr.End()
	res := &sandbox.Result{
		Stdout: string(stdout), Stderr: string(stderr), StdoutTruncated: outTrunc, StderrTruncated: errTrunc,
		Results: x.results, Error: x.err,
		DurationMS:      float64(duration.Microseconds()) / 1000,
		CPUMS:           float64((u.CPU - u0.CPU).Microseconds()) / 1000,
		PeakMemoryBytes: u.MemoryPeak,
		StateLost:       stateLost && !c.oneShot,
	}
	if res.Results == nil {
		res.Results = []sandbox.Output{}
	}
	if x.dropped > 0 {
		res.Results = append(res.Results, sandbox.Output{
			Text: fmt.Sprintf("[vivarium: %d more results dropped: over the limit of %d results or %d MiB]",
				x.dropped, maxResults, maxResultsBytes>>20)})
	}
	killed := o.Dead && (!o.Exited || o.Signal == int(syscall.SIGKILL)) || o.ContextSignal == int(syscall.SIGKILL)
	if o.Why == "" && killed && u.OOMKills == u0.OOMKills {
		// Killed, and no OOM kill counted when the end was seen: the
		// kernel counts one only after it has sent its SIGKILL, and a
		// victim (the runner, or a kernel the runner reaped) may be
		// reaped before that. Counted by now, if it was.
		u.OOMKills = c.d.Usage().OOMKills
	}
	o.OOM = u.OOMKills > u0.OOMKills
	o.Classify(res)
	c.d.Executed(ctx, res)
	return res, nil
}

// wait waits for the end of an execution, or for a limit or the caller to
// end it; why says which of those did, if one did.
func (c *Core) wait(ctx context.Context, finished, exited, dead <-chan struct{}, limits sandbox.Limits,
	cpu0 time.Duration) (why sandbox.Status, whyMsg string) {
	wall := time.NewTimer(limits.Timeout)
	defer wall.Stop()
	var tick <-chan time.Time
	if limits.CPUTime > 0 && c.d.CPUWatch() {
		t := time.NewTicker(cpuPollInterval(limits.CPUTime))
		defer t.Stop()
		tick = t.C
	}
	if c.oneShot {
		exited = nil // finished is the runner's exit
	}
	for {
		select {
		case <-finished:
			return "", ""
		case <-exited:
			return "", ""
		case <-dead:
			return "", ""
		case <-wall.C:
			return sandbox.StatusTimeout, fmt.Sprintf("execution exceeded the %v wall-clock limit", limits.Timeout)
		case <-tick:
			if c.d.Usage().CPU-cpu0 > limits.CPUTime {
				return sandbox.StatusTimeout, fmt.Sprintf("execution exceeded the %v CPU time limit", limits.CPUTime)
			}
		case <-ctx.Done():
			return sandbox.StatusKilled, "execution cancelled: " + ctx.Err().Error()
		}
	}
}

// cpuPollInterval checks often enough to stop close to the limit without
// measurable overhead.
func cpuPollInterval(limit time.Duration) time.Duration {
	return min(max(limit/20, 10*time.Millisecond), 250*time.Millisecond)
}
