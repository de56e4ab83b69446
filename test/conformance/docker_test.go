//go:build linux

package conformance

import (
	"strings"
	"testing"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

// dockerDifferences: a docker sandbox is a container of a Docker daemon,
// with no user namespace: its sandbox user is a host uid of its own (named
// "sandbox", as everywhere; the cases ask for the name, not the number),
// so RLIMIT_NPROC, which the kernel counts per host user, is the sandbox's
// alone, and its process limit holds as the native backend's. The one
// difference is what the daemon keeps to itself.
var dockerDifferences = map[string]difference{
	"usage": {why: "dockerd makes and owns the container's cgroup: the sandbox's CPU and memory over time are not read, " +
		"and the sandbox says so rather than report zeros", run: func(t *testing.T, be *backend) {
		sb := be.create(t, sandbox.Spec{})
		r, ok := sb.(sandbox.UsageReporter)
		if !ok {
			return
		}
		if _, err := r.Usage(); err == nil || !strings.Contains(err.Error(), "not read") {
			t.Fatalf("usage: %v, want an error saying it is not read", err)
		}
	}},
}
