//go:build linux

package conformance

// dockerDifferences: none. A docker sandbox is a container of a Docker
// daemon, with no user namespace: its sandbox user is a host uid of its
// own (named "sandbox", as everywhere; the cases ask for the name, not the
// number), so RLIMIT_NPROC, which the kernel counts per host user, is the
// sandbox's alone, and its process limit holds as the native backend's.
var dockerDifferences = map[string]difference{}
