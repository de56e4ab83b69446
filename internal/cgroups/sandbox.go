//go:build linux

package cgroups

import (
	"errors"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

// Of is what a sandbox's group limits, from its spec (with its limits'
// defaults applied): memory, processes, CPU bandwidth and disk I/O, in
// its tenant's group. An I/O rate of sandbox.NoIOLimit is no cap.
func Of(spec sandbox.Spec) Limits {
	l := spec.Limits
	return Limits{
		MemoryBytes: l.Memory, Pids: int64(l.Pids), CPUs: l.CPUs,
		IO: IOMax{
			ReadBPS: max(l.IOReadBPS, 0), WriteBPS: max(l.IOWriteBPS, 0),
			ReadIOPS: max(l.IOReadIOPS, 0), WriteIOPS: max(l.IOWriteIOPS, 0),
		},
		Tenant: spec.Tenant,
	}
}

// ErrNoGroup is UsageOf's error for a sandbox without a group of
// Vivarium's (a backend run without cgroups, a runtime that makes its
// own, a paused sandbox released to disk): its usage is not known.
var ErrNoGroup = errors.New("the sandbox has no cgroup of Vivarium's (a runtime that makes its own is not read): its usage is not known")

// UsageOf is what a sandbox's group says it uses now (sandbox.Usage): its
// CPU time so far, and its memory where the group can tell it apart from
// what Stats reads. Every backend whose sandboxes have a group of
// Vivarium's reports usage with it; g is nil where a sandbox has none
// (ErrNoGroup).
func UsageOf(g Group) (sandbox.Usage, error) {
	if g == nil {
		return sandbox.Usage{}, ErrNoGroup
	}
	st, err := g.Stats()
	if err != nil {
		return sandbox.Usage{}, err
	}
	u := sandbox.Usage{CPU: st.CPU}
	if m, ok := g.(MemoryReader); ok {
		u.Memory, err = m.MemoryCurrent()
	}
	return u, err
}
