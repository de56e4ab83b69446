package testutil

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// Registry starts Debian's docker-registry (the CNCF distribution) on a
// free port and returns its address.
func Registry(t testing.TB) string {
	t.Helper()
	bin, err := exec.LookPath("docker-registry")
	if err != nil {
		t.Skip("docker-registry is not installed (apt install docker-registry)")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	dir := t.TempDir()
	conf := filepath.Join(dir, "config.yml")
	os.WriteFile(conf, fmt.Appendf(nil, "version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: %s\nhttp:\n  addr: %s\n",
		filepath.Join(dir, "data"), addr), 0o600)
	cmd := exec.Command(bin, "serve", conf)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
			return addr
		}
		if time.Now().After(deadline) {
			t.Fatalf("docker-registry did not listen on %s: %s", addr, out.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}
