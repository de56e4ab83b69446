package wasm_test

import (
	"strings"
	"testing"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

// IPython's cell syntax on the wasm backend: the same runner.py, so an
// indented cell and the magics run; a shell escape cannot, and says why.
func TestCellSyntax(t *testing.T) {
	t.Parallel()
	res := run(t, "\n    %env VV_CELL=on\n    import os\n    print(os.environ['VV_CELL'])\n")
	wantStatus(t, res, sandbox.StatusOK, 0)
	if !strings.Contains(res.Stdout, "env: VV_CELL=on\non\n") {
		t.Errorf("stdout = %q", res.Stdout)
	}
	res = run(t, "x = 1\n!echo hi\n")
	wantStatus(t, res, sandbox.StatusError, 1)
	if e := res.Error; e == nil || !strings.Contains(e.Value, "the wasm backend cannot start processes") ||
		!strings.Contains(e.Traceback, `File "<cell>", line 2`) {
		t.Errorf("error = %+v", res.Error)
	}
}
