package testutil

import (
	"context"
	"strings"
	"testing"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

// RequireRunnerFromBytecode fails t unless sb's runner was loaded from
// the bytecode the host's interpreter compiled (runner.Bytecode): the
// file is the one the backend wrote beside the runner (its interpreter
// runs with -B and writes none), with this interpreter's magic.
func RequireRunnerFromBytecode(t testing.TB, sb sandbox.Sandbox) {
	t.Helper()
	res, err := sb.Execute(context.Background(), sandbox.ExecRequest{Code: `import importlib.util, sys
spec = sys.modules["runner"].__spec__
print(spec.cached, open(spec.cached, "rb").read()[:4] == importlib.util.MAGIC_NUMBER)`}, nil)
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Fields(res.Stdout)
	if len(got) != 2 || !strings.HasPrefix(got[0], "/opt/vivarium/__pycache__/runner.cpython-") || got[1] != "True" {
		t.Fatalf("the runner's bytecode: %q %s", res.Stdout, res.Stderr)
	}
}
