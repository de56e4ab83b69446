//go:build linux

package cgroups

import "github.com/vivarium-sandbox/vivarium/internal/sandbox"

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
