package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vivarium-sandbox/vivarium/internal/criu"
)

// doctorCheck runs `vivarium doctor --json` and returns the named check.
func doctorCheck(t *testing.T, name string) check {
	t.Helper()
	got := vivarium(t, "", "doctor", "--json")
	var checks []check
	if err := json.Unmarshal([]byte(got.stdout), &checks); err != nil {
		t.Fatalf("%v: %s", err, got.stdout)
	}
	for _, c := range checks {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("no %q check in %s", name, got.stdout)
	return check{}
}

// The doctor says checkpoint/restore works where criu is built and
// `criu check` passes here, and names the binary.
func TestDoctorCheckpointAvailable(t *testing.T) {
	needSandbox(t)
	bin, err := criu.Find()
	if err != nil {
		t.Skipf("criu is not built here: %v", err)
	}
	c := doctorCheck(t, "checkpoint/restore")
	if !c.OK || !strings.Contains(c.Detail, bin) || !strings.Contains(c.Detail, "Looks good") {
		t.Fatalf("%+v", c)
	}
	// It says whether criu is built to be fast, and where it keeps what
	// it probed of the kernel.
	if len(criu.MissingPatches(bin, criu.SpeedPatches)) == 0 && !strings.Contains(c.Detail, "kernel probes") {
		t.Errorf("the doctor does not say where criu keeps its kernel probes: %s", c.Detail)
	}
}

// Where the only criu is too old (Debian 12's 3.17 fails `criu check` on
// current kernels), the doctor says so and how to build one, and does
// not fail for it: checkpoint/restore is optional.
func TestDoctorCheckpointMissing(t *testing.T) {
	needSandbox(t)
	dir := t.TempDir()
	old := filepath.Join(dir, "criu")
	if err := os.WriteFile(old, []byte("#!/bin/sh\necho 'Version: 3.17.1'\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("VIVARIUM_CRIU", old)
	t.Setenv("VIVARIUM_CRIU_DIR", "")
	t.Setenv("XDG_CACHE_HOME", dir)
	t.Setenv("PATH", "/usr/bin:/bin")
	c := doctorCheck(t, "checkpoint/restore")
	if c.OK || !c.Optional || !strings.Contains(c.Detail, "make criu") || !strings.Contains(c.Detail, "version 3.17.1, need 4.x") {
		t.Fatalf("%+v", c)
	}
}
