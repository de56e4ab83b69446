package e2b_test

import (
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"

	"github.com/vivarium-sandbox/vivarium/internal/testutil"
	"github.com/vivarium-sandbox/vivarium/test/testserver"
)

// TestE2BNetwork runs network.test.mjs against a server whose operator
// allows two hosts of the test's own (each an HTTP server in a network
// namespace of its own, on a private address), and not a third: E2B's
// network settings can narrow that allowlist, never widen it. The main
// run (TestE2BSDKs) skips network.test.mjs, which needs these hosts.
func TestE2BNetwork(t *testing.T) {
	testutil.RequireRoot(t)
	requireNode(t, ".", sdks...)
	a, b, outside := testutil.NewNetHost(t), testutil.NewNetHost(t), testutil.NewNetHost(t)
	bin := testserver.Build(t)
	// A cgroup parent and host users of its own: TestE2BSDKs, here or in
	// another checkout, may run at the same time.
	srv := testserver.Start(t, bin, testserver.Options{CgroupParent: cgroupParent + "-net", UIDBase: uidBase + 8<<20,
		Keys: []string{"e2b-sdk", "e2b-other"},
		Args: []string{"--allow-net", fmt.Sprintf("%s:%d %s:%d", a.Addr, a.Port, b.Addr, b.Port)}})

	cmd := exec.Command("node", "--test", "--test-reporter=tap", "network.test.mjs")
	cmd.Env = append(os.Environ(),
		"E2B_API_URL="+srv.URL+"/e2b",
		"E2B_SANDBOX_URL="+srv.URL+"/e2b/sandbox",
		"E2B_API_KEY="+srv.Keys[0],
		"VIVARIUM_OTHER_KEY="+srv.Keys[1],
		"VIVARIUM_NET_A="+a.Addr.String()+":"+fmt.Sprint(a.Port),
		"VIVARIUM_NET_B="+b.Addr.String()+":"+fmt.Sprint(b.Port),
		"VIVARIUM_NET_OUTSIDE="+outside.Addr.String()+":"+fmt.Sprint(outside.Port),
		"E2B_DOMAIN=", "E2B_DEBUG=", "E2B_ACCESS_TOKEN=")
	out, err := cmd.CombinedOutput()
	t.Logf("node --test network.test.mjs:\n%s", out)
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
