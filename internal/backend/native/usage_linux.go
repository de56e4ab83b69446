package native

import (
	"github.com/vivarium-sandbox/vivarium/internal/cgroups"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

// Usage implements sandbox.UsageReporter from the sandbox's cgroup
// (cgroups.ErrNoGroup without one).
func (s *Sandbox) Usage() (sandbox.Usage, error) { return cgroups.UsageOf(s.group()) }

var _ sandbox.UsageReporter = (*Sandbox)(nil)

// group is the sandbox's cgroup, for readers that may run while a sandbox
// opened paused from disk resumes (and gets one: restoreFrom).
func (s *Sandbox) group() cgroups.Group {
	s.lifeMu.Lock()
	defer s.lifeMu.Unlock()
	return s.cg
}

// setGroup sets the sandbox's cgroup (restoreFrom).
func (s *Sandbox) setGroup(g cgroups.Group) {
	s.lifeMu.Lock()
	s.cg = g
	s.lifeMu.Unlock()
}
