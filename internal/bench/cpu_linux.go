package bench

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/cgroups"
)

// W8 is the CPU a one-shot costs, which bounds how many a host runs in a
// second: the server's, the sandbox's (its init and runner) and the
// zygote's (its forks), whether spent before, during or after the answer
// (a pooled sandbox made in advance, a sandbox torn down after it).
var W8 = Workload{ID: "W8", Title: "CPU time (user + system) of one print(1) one-shot, every process's",
	Code: W1.Code, Want: W1.Want}

// cpuBatch is how many one-shots one iteration of a W8 row runs.
const cpuBatch = 5

// cpuPart says what of a server's CPU a W8 row counts.
type cpuPart int

const (
	cpuAll       cpuPart = iota // the server, its sandboxes and zygote
	cpuServer                   // the server process alone
	cpuSandboxes                // its sandboxes' and zygote's groups
)

// cpuMeter reads what a bench server spent: its own process's CPU (in a
// group of its own, which the bench makes) and its sandboxes' and zygote's
// (the groups under its cgroup parent).
type cpuMeter struct {
	self    cgroups.Group
	parent  cgroups.CPUReader
	selfErr error
}

// meterServer puts the server process pid in a group of its own.
func meterServer(parent string, pid int) (*cpuMeter, error) {
	m, err := cgroups.Detect(parent + "-self")
	if err != nil {
		return nil, err
	}
	g, err := m.New("serve", cgroups.Limits{})
	if err != nil {
		return nil, err
	}
	if err := g.AddProc(pid); err != nil {
		g.Destroy()
		return nil, err
	}
	sm, err := cgroups.Detect(parent)
	if err != nil {
		return nil, err
	}
	r, ok := sm.(cgroups.CPUReader)
	if !ok {
		return nil, errors.New("the cgroup manager reads no parent's CPU")
	}
	return &cpuMeter{self: g, parent: r}, nil
}

// read returns the server's CPU and its sandboxes' so far.
func (c *cpuMeter) read() (server, sandboxes time.Duration, err error) {
	st, err := c.self.Stats()
	if err != nil {
		return 0, 0, err
	}
	sb, err := c.parent.ParentCPU()
	return st.CPU, sb, err
}

// settle waits until neither the server nor its sandboxes spend CPU any
// more (the pool refilled, the last sandbox torn down): two reads 100 ms
// apart that differ by less than a millisecond, for at most 10 s.
func (c *cpuMeter) settle(ctx context.Context) (server, sandboxes time.Duration, err error) {
	server, sandboxes, err = c.read()
	for deadline := time.Now().Add(10 * time.Second); err == nil && time.Now().Before(deadline); {
		select {
		case <-ctx.Done():
			return 0, 0, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
		s2, b2, rerr := c.read()
		if rerr != nil {
			return 0, 0, rerr
		}
		quiet := s2+b2-server-sandboxes < time.Millisecond
		server, sandboxes = s2, b2
		if quiet {
			break
		}
	}
	return server, sandboxes, err
}

// oneShotCPU is a W8 row: cpuBatch one-shots of W8's code, one after the
// other, and the CPU the part counted spent for them, per one-shot, in
// milliseconds.
func (s *server) oneShotCPU(part cpuPart) func(context.Context) (float64, error) {
	run := s.oneShot(W8)
	return func(ctx context.Context) (float64, error) {
		m, err := s.meter()
		if err != nil {
			return 0, err
		}
		s0, b0, err := m.settle(ctx)
		if err != nil {
			return 0, err
		}
		for range cpuBatch {
			if err := run(ctx); err != nil {
				return 0, err
			}
		}
		s1, b1, err := m.settle(ctx)
		if err != nil {
			return 0, err
		}
		d := map[cpuPart]time.Duration{cpuAll: s1 - s0 + b1 - b0, cpuServer: s1 - s0, cpuSandboxes: b1 - b0}[part]
		return ms(d) / cpuBatch, nil
	}
}

// meter is the server's cpuMeter, made once it runs.
func (s *server) meter() (*cpuMeter, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cpu == nil && s.cpuErr == nil {
		if s.cmd == nil {
			return nil, errors.New("the server is not running")
		}
		s.cpu, s.cpuErr = meterServer(s.parent, s.cmd.Process.Pid)
	}
	return s.cpu, s.cpuErr
}

// pythonCPU is W8's peer: the CPU time of python3 -c CODE, the process
// and what it started.
func pythonCPU(python string) func(context.Context) (float64, error) {
	return func(ctx context.Context) (float64, error) {
		var total time.Duration
		for range cpuBatch {
			cmd := exec.CommandContext(ctx, python, "-c", W8.Code)
			cmd.Env = peerEnv()
			out, err := cmd.Output()
			if err != nil {
				return 0, fmt.Errorf("python3 -c: %w", err)
			}
			if string(out) != W8.Want {
				return 0, fmt.Errorf("python3 -c printed %q", out)
			}
			total += cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
		}
		return ms(total) / cpuBatch, nil
	}
}

// cpuSubjects are W8's rows.
func cpuSubjects(srv *server, serverSetup func(context.Context) error, skip, pySkip, python string) []Subject {
	w := W8.Label()
	return []Subject{
		{Workload: w, Name: "vivarium serve, HTTP one-shot: server, sandbox and zygote", Reference: true, Unit: "ms",
			Skip: skip, Setup: serverSetup, Measure: srv.oneShotCPU(cpuAll)},
		{Workload: w, Name: "of it, the server (HTTP, service, pool, cgroups, audit)", Unit: "ms",
			Skip: skip, Setup: serverSetup, Measure: srv.oneShotCPU(cpuServer)},
		{Workload: w, Name: "of it, the sandbox (init, runner) and the zygote (its forks)", Unit: "ms",
			Skip: skip, Setup: serverSetup, Measure: srv.oneShotCPU(cpuSandboxes)},
		{Workload: w, Name: "python3 -c (no isolation)", Peer: true, Unit: "ms", Skip: pySkip, Measure: pythonCPU(python)},
	}
}
