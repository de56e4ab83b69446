//go:build linux

package conformance

import (
	"testing"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

// dockerDifferences: a docker sandbox is a container of a Docker daemon,
// with no user namespace, so its sandbox user is the host's uid 1000 in
// every container. The kernel counts RLIMIT_NPROC per host user, across
// all of them, so the process limit is the container's pids cgroup alone,
// which also counts the agent's own threads (see docker.agentTasks).
var dockerDifferences = map[string]difference{
	"limit_pids": {why: "the container's pids cgroup counts the agent's threads (8 to 10) with the code's, and " +
		"holds 12 more than the sandbox's limit for them: the code's processes stop within a few of its limit, " +
		"never beyond the container's", run: func(t *testing.T, be *backend) {
		res := be.oneShot(t, `
import os, time
n = 0
try:
    while True:
        if os.fork() == 0:
            time.sleep(30); os._exit(0)
        n += 1
except OSError as e:
    print("stopped", e.errno, n <= 16 + 12)
`, limited(sandbox.Limits{Pids: 16}))
		wantStdout(t, res, "stopped 11 True\n")
	}},
}
