// Package testutil holds helpers shared by tests: skips for what a machine
// cannot do, and waits that poll instead of sleeping blindly.
package testutil

import (
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// SkipShort skips the test under go test -short, the fast tier
// (docs/testing.md), saying what it needs that the fast tier goes
// without: root, runsc, dockerd, CRIU, a kube-apiserver, the wasm
// interpreter, Node.js, or minutes. Helpers that require such a thing
// call it, so that -short runs the same tests as root as without.
func SkipShort(t testing.TB, needs string) {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: " + needs)
	}
}

// RequireRoot skips the test unless it runs as root, and under -short;
// why, if given, says what root is needed for. CI runs as root without
// -short, so these tests run there.
func RequireRoot(t testing.TB, why ...string) {
	t.Helper()
	msg := strings.Join(append([]string{"needs root"}, why...), ": ")
	SkipShort(t, msg)
	if os.Geteuid() != 0 {
		t.Skip(msg)
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

// RequirePythonModules skips the test unless the host Python has mods.
// They are looked for, not imported: importing pandas, matplotlib and
// scipy takes a second, which tests that then skip for want of root
// would spend for nothing.
func RequirePythonModules(t testing.TB, mods ...string) {
	t.Helper()
	py := RequirePython(t)
	for _, m := range mods {
		find := "import importlib.util, sys; sys.exit(importlib.util.find_spec(sys.argv[1]) is None)"
		if err := exec.Command(py, "-c", find, m).Run(); err != nil {
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
