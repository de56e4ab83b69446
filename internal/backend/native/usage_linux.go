package native

import (
	"errors"

	"github.com/vivarium-sandbox/vivarium/internal/cgroups"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

// Usage implements sandbox.UsageReporter from the sandbox's cgroup.
func (s *Sandbox) Usage() (sandbox.Usage, error) {
	cg := s.group()
	if cg == nil {
		return sandbox.Usage{}, errors.New("no cgroup: the sandbox's usage is not known")
	}
	return cgroups.UsageOf(cg)
}

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
