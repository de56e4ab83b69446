package container

import (
	"github.com/vivarium-sandbox/vivarium/internal/cgroups"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

// Usage implements sandbox.UsageReporter from the sandbox's cgroup, where
// Vivarium made it (a runtime that makes its own, such as dockerd's, is
// not read: cgroups.ErrNoGroup).
func (s *Sandbox) Usage() (sandbox.Usage, error) { return cgroups.UsageOf(s.group()) }

var _ sandbox.UsageReporter = (*Sandbox)(nil)
