package container

import (
	"errors"

	"github.com/vivarium-sandbox/vivarium/internal/cgroups"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

// Usage implements sandbox.UsageReporter from the sandbox's cgroup, where
// Vivarium made it (a runtime that makes its own, such as dockerd's, is
// not read).
func (s *Sandbox) Usage() (sandbox.Usage, error) {
	cg := s.group()
	if cg == nil {
		return sandbox.Usage{}, errors.New("the runtime's cgroup is not read")
	}
	return cgroups.UsageOf(cg)
}

var _ sandbox.UsageReporter = (*Sandbox)(nil)
