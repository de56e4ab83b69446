// Package e2b_test runs the Node test suite beside it (every *.test.mjs): the
// unmodified E2B SDKs, e2b and @e2b/code-interpreter (versions pinned in
// package.json and package-lock.json), against the real vivarium binary's
// `vivarium serve`, configured by nothing but E2B's environment variables.
package e2b_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/vivarium-sandbox/vivarium/internal/backend/native"
	"github.com/vivarium-sandbox/vivarium/internal/criu"
	"github.com/vivarium-sandbox/vivarium/internal/testutil"
	"github.com/vivarium-sandbox/vivarium/test/testserver"
)

// A cgroup parent and a uid range of this package's own, so that other
// packages' leftover checks are not confused.
const (
	cgroupParent = "vivarium-e2b-test"
	uidBase      = native.DefaultUIDBase + 14<<24
	// previewDomain is the server's --domain: sandboxes' ports are
	// served at <port>-<id>.vivarium.test.
	previewDomain = "vivarium.test"
)

// requireNode skips without node and npm, and installs the pinned packages
// of dir (its package-lock.json) when one of pkgs is missing.
func requireNode(t *testing.T, dir string, pkgs ...string) {
	t.Helper()
	testutil.SkipShort(t, "needs Node.js and E2B's JavaScript SDKs")
	for _, tool := range []string{"node", "npm"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("needs %s (Node.js 20.18 or later) to run E2B's JavaScript SDKs", tool)
		}
	}
	missing := false
	for _, p := range pkgs {
		if _, err := os.Stat(filepath.Join(dir, "node_modules", p, "package.json")); err != nil {
			missing = true
		}
	}
	if !missing {
		return
	}
	cmd := exec.Command("npm", "ci", "--no-audit", "--no-fund")
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("npm ci in %s: %v\n%s", dir, err, out)
	}
}

// sdks are the E2B SDKs this directory's tests use.
var sdks = []string{"e2b", "@e2b/code-interpreter"}

func TestE2BSDKs(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequirePythonModules(t, "pandas", "matplotlib")
	requireNode(t, ".", sdks...)
	bin := testserver.Build(t)
	srv := testserver.Start(t, bin, testserver.Options{CgroupParent: cgroupParent, UIDBase: uidBase,
		Keys: []string{"e2b-sdk", "e2b-other"}, Args: []string{"--domain", previewDomain, "--volume-size", "32MiB"}})

	// Every *.test.mjs here (node_modules excluded): one file per surface.
	cmd := exec.Command("node", "--test", "--test-reporter=tap")
	cmd.Env = append(os.Environ(),
		"E2B_API_URL="+srv.URL+"/e2b",
		"E2B_SANDBOX_URL="+srv.URL+"/e2b/sandbox",
		// The volume content API, E2B's api.DOMAIN: the same prefix.
		"E2B_VOLUME_API_URL="+srv.URL+"/e2b",
		"E2B_API_KEY="+srv.Keys[0],
		"VIVARIUM_OTHER_KEY="+srv.Keys[1],
		// ports.test.mjs: the preview hosts <port>-<id>.vivarium.test,
		// sent to the server as a wildcard DNS record would.
		"VIVARIUM_URL="+srv.URL, "VIVARIUM_DOMAIN="+previewDomain,
		// Nothing of a developer's own E2B setup may leak in.
		"E2B_DOMAIN=", "E2B_DEBUG=", "E2B_ACCESS_TOKEN=")
	out, err := cmd.CombinedOutput()
	t.Logf("node --test:\n%s", out)
	if err != nil {
		t.Fatalf("node --test: %v", err)
	}
	pass := regexp.MustCompile(`\n# pass (\d+)`).FindSubmatch(out)
	if !strings.Contains(string(out), "\n# fail 0") || pass == nil || string(pass[1]) == "0" {
		t.Fatal("the Node suite did not run cleanly")
	}
	if strings.Contains(srv.Log(), "level=ERROR") {
		t.Errorf("the server logged errors:\n%s", srv.Log())
	}
}

// E2B's pause, connect and lifecycle onTimeout "pause", on a server whose
// sandboxes can be paused: the native backend without a zygote, with CRIU.
func TestE2BPause(t *testing.T) {
	testutil.RequireRoot(t)
	requireNode(t, ".", sdks...)
	if _, err := criu.Usable(); err != nil {
		t.Skipf("pausing needs CRIU, not built here (make criu): %v", err)
	}
	bin := testserver.Build(t)
	srv := testserver.Start(t, bin, testserver.Options{CgroupParent: cgroupParent + "-pause", UIDBase: uidBase + testutil.UIDSpan,
		Keys: []string{"e2b-pause"}, Args: []string{"--zygote=false"}})
	cmd := exec.Command("node", "--test", "--test-reporter=tap", "pause.e2e.mjs")
	cmd.Env = append(os.Environ(), "E2B_API_URL="+srv.URL+"/e2b", "E2B_SANDBOX_URL="+srv.URL+"/e2b/sandbox",
		"E2B_API_KEY="+srv.Keys[0], "E2B_DOMAIN=", "E2B_DEBUG=", "E2B_ACCESS_TOKEN=")
	out, err := cmd.CombinedOutput()
	t.Logf("node --test:\n%s", out)
	if err != nil || !strings.Contains(string(out), "\n# fail 0") || strings.Contains(string(out), "\n# pass 0") {
		t.Fatalf("node --test pause.e2e.mjs: %v", err)
	}
	if n := strings.Count(srv.Log(), "sandbox paused"); n < 2 {
		t.Errorf("the server paused %d sandboxes, want 2:\n%s", n, srv.Log())
	}
	if strings.Contains(srv.Log(), "level=ERROR") {
		t.Errorf("the server logged errors:\n%s", srv.Log())
	}
}
