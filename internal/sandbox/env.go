package sandbox

import (
	"fmt"
	"runtime"
	"sort"
)

// ShimDir holds programs by the names code expects and a Debian host
// may not have: python (python3 under the name most code and E2B's own
// examples use). It is last in PATH: a host's own python comes first.
// Backends that build a root put it there (see rootview.RootSkeleton).
const ShimDir = "/opt/vivarium/shims"

// Shims are ShimDir's links, by name: what each points at.
var Shims = map[string]string{"python": "/usr/bin/python3"}

// Environ is the environment of a sandbox's processes: a fixed base, then
// the user's variables. Nothing comes from the host's environment. Every
// backend starts its processes with it.
func Environ(user map[string]string) []string {
	threads := fmt.Sprint(min(runtime.NumCPU(), 4))
	env := map[string]string{
		"PATH":    "/usr/local/bin:/usr/bin:/bin:" + ShimDir,
		"HOME":    "/workspace",
		"USER":    "sandbox",
		"LOGNAME": "sandbox",
		"SHELL":   "/bin/sh",
		"LANG":    "C.UTF-8",
		"TMPDIR":  "/tmp",
		// Caches (fontconfig, matplotlib) stay out of the workspace.
		"XDG_CACHE_HOME": "/tmp/.cache",
		"TZ":             "UTC",
		// BLAS and OpenMP start a thread per CPU by default; on a large
		// host that alone would exhaust the pids limit.
		"OPENBLAS_NUM_THREADS": threads,
		"OMP_NUM_THREADS":      threads,
		"MKL_NUM_THREADS":      threads,
	}
	for k, v := range user {
		env[k] = v
	}
	out := make([]string, 0, len(env))
	for k, v := range env {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return out
}
