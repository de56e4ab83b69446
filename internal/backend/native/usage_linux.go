package native

import (
	"errors"

	"github.com/vivarium-sandbox/vivarium/internal/cgroups"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

// Usage implements sandbox.UsageReporter from the sandbox's cgroup.
func (s *Sandbox) Usage() (sandbox.Usage, error) {
	if s.cg == nil {
		return sandbox.Usage{}, errors.New("no cgroup: the sandbox's usage is not known")
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
