package testutil

import (
	"fmt"
	"os"
	"os/exec"
	"testing"
)

// zygoteEnv selects the zygote mode in a re-executed test binary.
const zygoteEnv = "VIVARIUM_TEST_ZYGOTE"

// ZygoteMode reports whether this test binary tests sandboxes forked from a
// zygote (native.Config.Zygote) rather than started one by one.
func ZygoteMode() bool { return os.Getenv(zygoteEnv) == "1" }

// RunBothModes runs the tests, then runs them again in a re-executed test
// binary with ZygoteMode set, and returns the exit code for both. Packages
// whose tests make sandboxes call it from TestMain, so that `go test`
// proves every case against both ways of starting a sandbox. Under -short,
// which makes no sandboxes, the tests run once.
func RunBothModes(m *testing.M) int {
	code := m.Run()
	if ZygoteMode() || os.Getenv("VIVARIUM_TEST_ONE_MODE") == "1" || testing.Short() {
		return code
	}
	fmt.Fprintln(os.Stderr, "=== the same tests, with sandboxes forked from a zygote")
	cmd := exec.Command(os.Args[0], os.Args[1:]...)
	cmd.Env = append(os.Environ(), zygoteEnv+"=1")
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	if err := cmd.Run(); err != nil {
		if code == 0 {
			code = 1
		}
		if ee, ok := err.(*exec.ExitError); !ok {
			fmt.Fprintln(os.Stderr, "zygote mode:", err)
		} else if ee.ExitCode() != 0 {
			fmt.Fprintln(os.Stderr, "zygote mode: FAIL")
		}
	}
	return code
}
