package mcp_test

import (
	"strings"
	"testing"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/mcp"
)

// fetch_port reaches a server the sandbox's code started, and nothing else.
func TestFetchPort(t *testing.T) {
	svc := newService(t)
	cs := connect(t, mcp.Config{Service: svc, MaxText: 2000})
	id := call(t, cs, "create_sandbox", nil).StructuredContent.(map[string]any)["sandbox_id"].(string)
	mustOK(t, call(t, cs, "write_file", map[string]any{"sandbox_id": id, "path": "index.html", "content": "hello from the sandbox"}))
	mustOK(t, call(t, cs, "run_python", map[string]any{"sandbox_id": id,
		"code": "import subprocess\nserver = subprocess.Popen(['python3', '-m', 'http.server', '8000'], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)"}))
	var out string
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		res := call(t, cs, "fetch_port", map[string]any{"sandbox_id": id, "port": 8000, "path": "index.html"})
		if !res.IsError {
			out = texts(res)
			break
		}
		if !strings.Contains(texts(res), "nothing listens on port 8000") || time.Now().After(deadline) {
			t.Fatalf("%q", texts(res))
		}
	}
	if !strings.HasPrefix(out, "HTTP 200 OK\n") || !strings.Contains(out, "\n\nhello from the sandbox") {
		t.Errorf("%q", out)
	}
	if out := mustOK(t, call(t, cs, "fetch_port", map[string]any{"sandbox_id": id, "port": 8000, "path": "/missing?x=1"})); !strings.HasPrefix(out, "HTTP 404") {
		t.Errorf("%q", out)
	}
	for _, bad := range []map[string]any{
		{"sandbox_id": id, "port": 8001},
		{"sandbox_id": id, "port": 0},
		{"sandbox_id": id, "port": 70000},
		{"sandbox_id": "sb_nope", "port": 8000},
	} {
		if res := call(t, cs, "fetch_port", bad); !res.IsError || strings.Contains(texts(res), "internal") {
			t.Errorf("fetch_port %v: %v %q", bad, res.IsError, texts(res))
		}
	}
}
