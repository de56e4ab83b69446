package httpapi_test

import (
	"strings"
	"testing"

	"github.com/vivarium-sandbox/vivarium/internal/testutil"
)

// %pip install in a cell installs from the server's index, as the packages
// endpoint does, where the sandbox may install packages; the package is
// importable in the same session. Elsewhere it says there is no index.
func TestPipMagic(t *testing.T) {
	w := newNetWorld(t, false)
	testutil.RequirePythonModules(t, "pip")
	c := client{t, w.url, "alice-key"}
	id := c.json("POST", "/v1/sandboxes", map[string]any{"network": map[string]any{"packages": true}}, 201)["id"].(string)
	out := c.json("POST", "/v1/sandboxes/"+id+"/execute", map[string]any{"code": "%pip install vivtestpkg\nimport vivtestpkg\nprint(vivtestpkg.ANSWER)"}, 200)
	if out["status"] != "ok" || !strings.Contains(out["stdout"].(string), "Successfully installed vivtestpkg-1.0") ||
		!strings.HasSuffix(out["stdout"].(string), "42\n") {
		t.Errorf("%%pip install: %v", out)
	}
	out = c.json("POST", "/v1/sandboxes/"+id+"/execute", map[string]any{"code": "%pip install forbidden"}, 200)
	if out["status"] != "ok" || !strings.Contains(out["stdout"].(string), "No matching distribution found for forbidden") {
		t.Errorf("%%pip install of a package not allowed: %v", out)
	}

	plain := c.json("POST", "/v1/sandboxes", nil, 201)["id"].(string)
	out = c.json("POST", "/v1/sandboxes/"+plain+"/execute", map[string]any{"code": "%pip install vivtestpkg"}, 200)
	if e, _ := out["error"].(map[string]any); e == nil || e["name"] != "UsageError" || !strings.Contains(e["value"].(string), "no package index") {
		t.Errorf("%%pip install without an index: %v", out)
	}
}
