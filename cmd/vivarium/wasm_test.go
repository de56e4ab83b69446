package main

import (
	"encoding/json"
	"os"
	"strings"
	"testing"

	"github.com/vivarium-sandbox/vivarium/internal/backend/wasm"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/testutil"
)

// needWasm skips without the interpreter `make wasm` builds.
func needWasm(t *testing.T) {
	t.Helper()
	testutil.SkipShort(t, "needs the wasm interpreter")
	if _, err := wasm.Locate(); err != nil {
		t.Skipf("the wasm interpreter is not built (run `make wasm`): %v", err)
	}
}

func TestRunBackendWasm(t *testing.T) {
	needWasm(t)
	t.Parallel()
	got := vivarium(t, "", "run", "--backend", "wasm", "--json", "-c", "import sys; print(sys.platform); 6 * 7")
	var res sandbox.Result
	if err := json.Unmarshal([]byte(got.stdout), &res); err != nil {
		t.Fatalf("%v: %q %q", err, got.stdout, got.stderr)
	}
	if got.code != 0 || res.Status != sandbox.StatusOK || res.Stdout != "wasi\n" || len(res.Results) != 1 || res.Results[0].Text != "42" {
		t.Fatalf("exit %d: %+v", got.code, res)
	}
	// Plain output, and the program's own exit status.
	got = vivarium(t, "", "run", "--backend", "wasm", "-c", "import numpy")
	if got.code != 1 || !strings.Contains(got.stderr, "the wasm backend runs CPython's standard library only") {
		t.Fatalf("exit %d, stderr %q", got.code, got.stderr)
	}
}

func TestRunBackendFlag(t *testing.T) {
	t.Parallel()
	got := vivarium(t, "", "run", "--backend", "nope", "-c", "1")
	if got.code != sandbox.ExitSetupFailed || !strings.Contains(got.stderr, `unknown backend "nope"`) {
		t.Fatalf("exit %d, stderr %q", got.code, got.stderr)
	}
	// Without the interpreter, the error says how to build it.
	got = vivarium(t, "", "run", "--backend", "wasm", "--wasm-dir", t.TempDir(), "-c", "1")
	if got.code != sandbox.ExitSetupFailed || !strings.Contains(got.stderr, "make wasm") {
		t.Fatalf("exit %d, stderr %q", got.code, got.stderr)
	}
}

// The doctor reports the wasm backend, working or not, without failing
// for it.
func TestDoctorWasm(t *testing.T) {
	if testing.Short() && os.Geteuid() == 0 {
		t.Skip("-short: vivarium doctor, as root, starts real sandboxes")
	}
	got := vivarium(t, "", "doctor", "--json")
	var checks []check
	if err := json.Unmarshal([]byte(got.stdout), &checks); err != nil {
		t.Fatalf("%v: %q", err, got.stdout)
	}
	var c *check
	for i := range checks {
		if checks[i].Name == "wasm backend" {
			c = &checks[i]
		}
	}
	if c == nil || !c.Optional {
		t.Fatalf("no optional wasm check: %+v", checks)
	}
	if _, err := wasm.Locate(); err == nil && !c.OK {
		t.Fatalf("the interpreter is built, yet: %+v", c)
	} else if err != nil && (c.OK || !strings.Contains(c.Detail, "make wasm")) {
		t.Fatalf("without the interpreter: %+v", c)
	}
}
