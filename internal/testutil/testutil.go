// Package testutil holds helpers shared by tests: skips for what a machine
// cannot do, and waits that poll instead of sleeping blindly.
package testutil

import (
	"os"
	"os/exec"
	"testing"
	"time"
)

// RequireRoot skips the test unless it runs as root. CI runs as root, so
// these tests run there.
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
}

// RequirePython skips the test when the sandbox's Python is missing.
func RequirePython(t testing.TB) string {
	t.Helper()
	const py = "/usr/bin/python3"
	if _, err := os.Stat(py); err != nil {
		t.Skipf("needs %s", py)
	}
	return py
}

// RequirePythonModules skips the test unless the host Python imports mods.
func RequirePythonModules(t testing.TB, mods ...string) {
	t.Helper()
	py := RequirePython(t)
	for _, m := range mods {
		if err := exec.Command(py, "-c", "import "+m).Run(); err != nil {
			t.Skipf("needs Python module %s (apt install python3-%s)", m, m)
		}
	}
}

// WaitFor polls cond until it returns true or timeout passes.
func WaitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// UIDRanges is the size of each test package's pool of host users (one
// range of 65536 ids per sandbox): packages' pools start 1<<24 ids apart,
// and a package's leftover checks look at its own ids only, UIDSpan of
// them from its base.
const (
	UIDRanges = 64
	UIDSpan   = UIDRanges * 65536
)
