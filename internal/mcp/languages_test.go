package mcp_test

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/vivarium-sandbox/vivarium/internal/mcp"
)

func TestRunCode(t *testing.T) {
	if _, err := exec.LookPath("node"); err != nil {
		t.Skip("needs node (Node.js) on the host")
	}
	svc := newService(t)
	cs := connect(t, mcp.Config{Service: svc})
	// One-shot: a fresh sandbox, gone afterwards.
	out := mustOK(t, call(t, cs, "run_code", map[string]any{"language": "js", "code": "console.log('hi')\n6 * 7"}))
	if !strings.Contains(out, "stdout:\nhi\n") || !strings.Contains(out, "42") {
		t.Fatalf("one-shot: %q", out)
	}
	res := call(t, cs, "run_code", map[string]any{"language": "python", "code": "1"})
	if !res.IsError || !strings.Contains(texts(res), "run_python") {
		t.Fatalf("python through run_code: %q", texts(res))
	}
	res = call(t, cs, "run_code", map[string]any{"language": "cobol", "code": "1"})
	if !res.IsError || !strings.Contains(texts(res), "javascript") {
		t.Fatalf("cobol: %q", texts(res))
	}
	// In a sandbox: the language keeps its variables beside Python's.
	res = call(t, cs, "create_sandbox", map[string]any{})
	id := res.StructuredContent.(map[string]any)["sandbox_id"].(string)
	mustOK(t, call(t, cs, "run_code", map[string]any{"language": "typescript", "code": "const n: number = 41", "sandbox_id": id}))
	mustOK(t, call(t, cs, "run_python", map[string]any{"code": "n = 1", "sandbox_id": id}))
	if out := mustOK(t, call(t, cs, "run_code", map[string]any{"language": "ts", "code": "n + 1", "sandbox_id": id})); !strings.Contains(out, "42") {
		t.Fatalf("state: %q", out)
	}
	res = call(t, cs, "run_code", map[string]any{"language": "javascript", "code": "null.x", "sandbox_id": id})
	if !res.IsError || !strings.Contains(texts(res), "TypeError") {
		t.Fatalf("an error: %q", texts(res))
	}
	mustOK(t, call(t, cs, "close_sandbox", map[string]any{"sandbox_id": id}))
	if svc.Live() != 0 {
		t.Fatalf("%d sandboxes live", svc.Live())
	}
}
