// Package testserver builds the real vivarium binary and runs `vivarium
// serve` for end-to-end tests of its clients (the MCP SDK's, the Python
// client). Each caller gives its own cgroup parent and uid range, so that
// packages testing in parallel do not confuse each other's leftover checks.
package testserver

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/testutil"
)

// Build compiles the vivarium binary into a temporary directory, as make
// build does (scripts/build.sh: statically linked, the program sandboxes
// start embedded). It skips the test where there is no go tool.
func Build(t *testing.T) string {
	t.Helper()
	goTool, err := exec.LookPath("go")
	if err != nil {
		goTool = filepath.Join(runtime.GOROOT(), "bin", "go")
		if _, err := os.Stat(goTool); err != nil {
			t.Skip("needs the go tool to build vivarium")
		}
	}
	gomod, err := exec.Command(goTool, "env", "GOMOD").Output()
	if err != nil {
		t.Fatalf("go env GOMOD: %v", err)
	}
	bin := filepath.Join(t.TempDir(), "vivarium")
	cmd := exec.Command(filepath.Join(filepath.Dir(strings.TrimSpace(string(gomod))), "scripts", "build.sh"), bin)
	cmd.Env = append(os.Environ(), "GO="+goTool)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("scripts/build.sh: %v\n%s", err, out)
	}
	return bin
}

// Server is a running `vivarium serve`.
type Server struct {
	URL  string
	Keys []string // API keys, in the order of Options.Keys
	log  *testutil.Buffer
}

// Log is what the server printed so far.
func (s *Server) Log() string { return s.log.String() }

// Options of a test server.
type Options struct {
	CgroupParent string
	UIDBase      uint32
	Keys         []string // names of API keys to create first
	Args         []string // more flags for serve
}

// Start creates the keys and runs `vivarium serve` until the test ends
// (SIGTERM, then the test checks what it wants). It returns once the
// server answers.
func Start(t *testing.T, bin string, o Options) *Server {
	t.Helper()
	data := t.TempDir()
	s := &Server{log: &testutil.Buffer{}}
	for _, name := range o.Keys {
		out, err := exec.Command(bin, "keys", "create", "--data-dir", data, "--json", name).Output()
		if err != nil {
			t.Fatalf("keys create: %v", err)
		}
		var k struct{ Token string }
		if err := json.Unmarshal(out, &k); err != nil || k.Token == "" {
			t.Fatalf("keys create: %q %v", out, err)
		}
		s.Keys = append(s.Keys, k.Token)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	args := append([]string{"serve", "--listen", addr, "--data-dir", data, "--cgroup-parent", o.CgroupParent,
		"--uid-base", fmt.Sprint(o.UIDBase), "--uid-ranges", fmt.Sprint(testutil.UIDRanges)}, o.Args...)
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = s.log, s.log
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
			t.Logf("server log:\n%s", s.log)
		}
		if left := testutil.CgroupsUnder(o.CgroupParent); len(left) > 0 {
			t.Errorf("the server left cgroups: %v", left)
		}
	})
	s.URL = "http://" + addr
	testutil.WaitFor(t, 20*time.Second, "the server to answer", func() bool {
		select {
		case <-exited:
			t.Fatalf("the server exited: %s", s.log)
		default:
		}
		resp, err := http.Get(s.URL + "/healthz")
		if err == nil {
			resp.Body.Close()
		}
		return err == nil && resp.StatusCode == 200
	})
	return s
}
