// Package mcp_test runs the Node test suite beside it (mcp.test.mjs), which
// uses the official TypeScript MCP SDK against the real vivarium binary:
// `vivarium mcp` over stdio and `vivarium serve` at /mcp over streamable
// HTTP. The SDK's version is pinned in package.json and package-lock.json.
package mcp_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/backend/native"
	"github.com/vivarium-sandbox/vivarium/internal/testutil"
)

// Cgroup parents and a uid range of this package's own, so that other
// packages' leftover checks are not confused.
const (
	serveParent = "vivarium-mcp-e2e-serve"
	stdioParent = "vivarium-mcp-e2e-stdio"
	uidBase     = native.DefaultUIDBase + 6<<24 + 1<<20
)

// requireNode skips without node and npm, and installs the pinned packages
// when they are missing.
func requireNode(t *testing.T) {
	t.Helper()
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

// build compiles the vivarium binary into a temporary directory.
func build(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "vivarium")
	cmd := exec.Command("go", "build", "-o", bin, "github.com/vivarium-sandbox/vivarium/cmd/vivarium")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// lockedBuffer collects a process's output while the test may read it.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// startServe creates a key and runs `vivarium serve` with it.
func startServe(t *testing.T, bin string) (url, key string) {
	t.Helper()
	data := t.TempDir()
	out, err := exec.Command(bin, "keys", "create", "--data-dir", data, "--json", "node-test").Output()
	if err != nil {
		t.Fatalf("keys create: %v", err)
	}
	var k struct{ Token string }
	if err := json.Unmarshal(out, &k); err != nil || k.Token == "" {
		t.Fatalf("keys create: %q %v", out, err)
	}
	addr := freeAddr(t)
	cmd := exec.Command(bin, "serve", "--listen", addr, "--data-dir", data, "--cgroup-parent", serveParent,
		"--uid-base", fmt.Sprint(uidBase))
	log := &lockedBuffer{}
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("server log:\n%s", log)
		}
	})
	url = "http://" + addr
	testutil.WaitFor(t, 20*time.Second, "the server to answer", func() bool {
		select {
		case <-exited:
			t.Fatalf("the server exited: %s", log)
		default:
		}
		resp, err := http.Get(url + "/healthz")
		if err == nil {
			resp.Body.Close()
		}
		return err == nil && resp.StatusCode == 200
	})
	return url, k.Token
}

func TestTypeScriptSDK(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequirePythonModules(t, "matplotlib")
	requireNode(t)
	bin := build(t)
	url, key := startServe(t, bin)

	stdioArgs, _ := json.Marshal([]string{"--cgroup-parent", stdioParent, "--uid-base", fmt.Sprint(uidBase), "--log-level", "warn"})
	cmd := exec.Command("node", "--test", "--test-reporter=tap", "mcp.test.mjs")
	cmd.Env = append(os.Environ(), "VIVARIUM_BIN="+bin, "VIVARIUM_STDIO_ARGS="+string(stdioArgs),
		"VIVARIUM_URL="+url, "VIVARIUM_API_KEY="+key)
	out, err := cmd.CombinedOutput()
	t.Logf("node --test:\n%s", out)
	if err != nil {
		t.Fatalf("node --test: %v", err)
	}
	if !strings.Contains(string(out), "\n# fail 0") || !strings.Contains(string(out), "\n# pass 2") {
		t.Fatal("the Node suite did not run cleanly")
	}
	// `vivarium mcp` exits when its client closes and leaves nothing.
	testutil.WaitFor(t, 10*time.Second, "the stdio server's sandboxes to be gone", func() bool {
		return len(testutil.CgroupsUnder(stdioParent)) == 0
	})
	// The HTTP session's sandbox went with the session, not with the server.
	if left := testutil.CgroupsUnder(serveParent); len(left) > 0 {
		t.Errorf("sandboxes of the ended HTTP session are still there: %v", left)
	}
}
