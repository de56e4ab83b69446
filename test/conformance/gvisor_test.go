//go:build linux

package conformance

// gvisorDifferences: none. Under gVisor the code's system calls are
// answered by gVisor's kernel (the Sentry), not the host's, but everything
// a user relies on here (processes, signals, files, limits, the runner's
// protocol) behaves as on the native backend; how attacks are refused
// there differs, and test/hostile declares that case by case.
var gvisorDifferences = map[string]difference{}
