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
	if s.cg == nil {
		return sandbox.Usage{}, errors.New("the runtime's cgroup is not read")
	}
	st, err := s.cg.Stats()
	if err != nil {
		return sandbox.Usage{}, err
	}
	u := sandbox.Usage{CPU: st.CPU}
	if m, ok := s.cg.(cgroups.MemoryReader); ok {
		u.Memory, err = m.MemoryCurrent()
	}
	return u, err
}

var _ sandbox.UsageReporter = (*Sandbox)(nil)
