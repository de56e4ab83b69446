// Package mcp_test runs the Node test suite beside it (mcp.test.mjs), which
// uses the official TypeScript MCP SDK against the real vivarium binary:
// `vivarium mcp` over stdio and `vivarium serve` at /mcp over streamable
// HTTP. The SDK's version is pinned in package.json and package-lock.json.
package mcp_test

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/backend/native"
	"github.com/vivarium-sandbox/vivarium/internal/testutil"
	"github.com/vivarium-sandbox/vivarium/test/testserver"
)

// Cgroup parents and a uid range of this package's own, so that other
// packages' leftover checks are not confused.
const (
	serveParent = "vivarium-mcp-e2e-serve"
	stdioParent = "vivarium-mcp-e2e-stdio"
	uidBase     = native.DefaultUIDBase + 6<<24 + 8<<20
)

// requireNode skips without node and npm, and installs the pinned packages
// when they are missing.
func requireNode(t *testing.T) {
	t.Helper()
	testutil.SkipShort(t, "needs Node.js and the MCP TypeScript SDK")
	for _, tool := range []string{"node", "npm"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("needs %s (Node.js 18 or later) to run the TypeScript SDK's client", tool)
		}
	}
	if _, err := os.Stat("node_modules/@modelcontextprotocol/sdk/package.json"); err == nil {
		return
	}
	cmd := exec.Command("npm", "ci", "--no-audit", "--no-fund")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("npm ci: %v\n%s", err, out)
	}
}

func TestTypeScriptSDK(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequirePythonModules(t, "matplotlib")
	requireNode(t)
	bin := testserver.Build(t)
	// No pool: every sandbox under the parent is then the session's.
	srv := testserver.Start(t, bin, testserver.Options{CgroupParent: serveParent, UIDBase: uidBase, Keys: []string{"node-test"},
		Args: []string{"--pool", "0"}})
	url, key := srv.URL, srv.Keys[0]

	stdioArgs, _ := json.Marshal([]string{"--cgroup-parent", stdioParent, "--uid-base", fmt.Sprint(uidBase), "--uid-ranges", fmt.Sprint(testutil.UIDRanges), "--log-level", "warn"})
	cmd := exec.Command("node", "--test", "--test-reporter=tap", "mcp.test.mjs")
	cmd.Env = append(os.Environ(), "VIVARIUM_BIN="+bin, "VIVARIUM_STDIO_ARGS="+string(stdioArgs),
		"VIVARIUM_URL="+url, "VIVARIUM_API_KEY="+key)
	out, err := cmd.CombinedOutput()
	t.Logf("node --test:\n%s", out)
	if err != nil {
		t.Fatalf("node --test: %v", err)
	}
	if !strings.Contains(string(out), "\n# fail 0") || !strings.Contains(string(out), "\n# pass 3") {
		t.Fatal("the Node suite did not run cleanly")
	}
	// `vivarium mcp` exits when its client closes and leaves nothing.
	testutil.WaitFor(t, 10*time.Second, "the stdio server's sandboxes to be gone", func() bool {
		return len(testutil.CgroupsUnder(stdioParent)) == 0
	})
	// The HTTP session's sandbox goes with the session, not with the server:
	// the DELETE is answered first, the session's sandboxes closed after.
	testutil.WaitFor(t, 10*time.Second, "the ended HTTP session's sandboxes to be gone", func() bool {
		return len(testutil.CgroupsUnder(serveParent)) == 0
	})
	if strings.Contains(srv.Log(), "level=ERROR") {
		t.Errorf("the server logged errors:\n%s", srv.Log())
	}
}
