package container

import (
	"github.com/vivarium-sandbox/vivarium/internal/cgroups"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

// Usage implements sandbox.UsageReporter from the sandbox's cgroup, where
// Vivarium made it (a runtime that makes its own, such as dockerd's, is
// not read: cgroups.ErrNoGroup).
func (s *Sandbox) Usage() (sandbox.Usage, error) { return cgroups.UsageOf(s.group()) }

// MemoryPSS implements sandbox.MemoryUser from the processes of the
// sandbox's cgroup: the agent and the code's, and the runtime's own where
// it runs them there (gVisor's kernel and gofer), so that a pool reports
// what its ready sandboxes hold.
func (s *Sandbox) MemoryPSS() (int64, error) {
	cg := s.group()
	if cg == nil {
		return 0, cgroups.ErrNoGroup
	}
	pids, err := cg.Procs()
	if err != nil {
		return 0, err
	}
	return sandbox.ProcessesPSS(pids), nil
}

var (
	_ sandbox.UsageReporter = (*Sandbox)(nil)
	_ sandbox.MemoryUser    = (*Sandbox)(nil)
)
