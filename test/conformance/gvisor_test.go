//go:build linux

package conformance

import "testing"

// gvisorDifferences: under gVisor the code's system calls are answered by
// gVisor's kernel (the Sentry), not the host's, but nearly everything a
// user relies on here (processes, signals, files, limits, the runner's
// protocol) behaves as on the native backend; how attacks are refused
// there differs, and test/hostile declares that case by case. The one
// difference is a terminal's line discipline.
var gvisorDifferences = map[string]difference{
	"terminal": {why: "the Sentry's line discipline (runsc 2022-12, Debian's) has no ISIG: Ctrl-C (\\x03) reaches " +
		"the program as a byte and signals nothing; a terminal's program is interrupted with a signal " +
		"(Process.Signal) instead", run: func(t *testing.T, be *backend) { terminalCase(t, be, false) }},
}
